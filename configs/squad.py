r"""Fine-tuning configs for SQuAD v1.1 and v2.0, with the settings of the original
`run_squad.py` README (length 384, stride 128, batch 32 (v1.1: 24 in the README for one GPU),
learning rate 3e-5 for 2 epochs, warmup 10%).

    python -m bert_jax.finetune --config=configs/squad.py:v1 \
        --train_file=squad/train-v1.1.json --predict_file=squad/dev-v1.1.json \
        --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \
        --vocab_file=uncased_L-12_H-768_A-12/vocab.txt --output_dir=out/squad11

    python -m bert_jax.finetune --config=configs/squad.py:v2 \
        --train_file=squad/train-v2.0.json --predict_file=squad/dev-v2.0.json ... \
        --output_dir=out/squad20

Expected dev results: BERT-base v1.1 about 88.5 F1 / 80.8 exact match (the paper's Table 2;
the original README reports 88.4 / 81.2), BERT-large about 90.9 F1 / 84.1 EM; v2.0 with
BERT-large about 81.9 F1 / 78.7 EM (Table 3), after choosing `--null_score_diff_threshold` on
dev (the `best_f1_thresh` that `eval_results.json` reports). Runtime: the original README gives
about 30 minutes on a Cloud TPU for BERT-large on v1.1; on a CPU only toy sets are practical.
The original flags override
any field (`--learning_rate=5e-5`), as does `--config.<field>=<value>`.
"""

from bert_jax.runs import finetune_config


def get_config(variant: str = "v1"):
  if variant not in ("v1", "v2"):
    raise ValueError(f"Unknown SQuAD variant {variant!r}; known: v1, v2.")
  config = finetune_config.get_config()
  config.task_name = "squad" if variant == "v1" else "squad_v2"
  config.version_2_with_negative = variant == "v2"
  config.max_seq_length = 384
  config.doc_stride = 128
  config.max_query_length = 64
  config.train_batch_size = 32
  config.learning_rate = 3e-5
  config.num_train_epochs = 2.0
  config.warmup_proportion = 0.1
  config.do_train = config.do_predict = True
  return config
