r"""Fine-tuning config for multiple choice: SWAG as the paper ran it (Section 4.4: the given
sentence paired with each of the four continuations, one score per pair from the pooled [CLS],
softmax over the four; 3 epochs, learning rate 2e-5, batch 16), and HellaSwag's files with
`:hellaswag`.

    python -m bert_jax.finetune --config=configs/swag.py --data_dir=swagaf/data \
        --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt --output_dir=out/swag

`--data_dir` holds the official `train.csv`, `val.csv` and `test.csv` (or HellaSwag's
`hellaswag_train.jsonl`, `hellaswag_val.jsonl`, `hellaswag_test.jsonl`). Expected dev
accuracy (the paper's Table 4): BERT-base 81.6, BERT-large 86.6 (ESIM+ELMo 59.1). A BERT-base
run takes on the order of an hour on a Cloud TPU; on a CPU only toy sets are practical. The
original flags override any field, as does `--config.<field>=<value>`.
"""

from bert_jax.runs import finetune_config


def get_config(variant: str = "swag"):
  if variant not in ("swag", "hellaswag"):
    raise ValueError(f"Unknown multiple-choice variant {variant!r}; known: swag, hellaswag.")
  config = finetune_config.get_config()
  config.task_name = variant
  config.max_seq_length = 128
  config.train_batch_size = 16
  config.learning_rate = 2e-5
  config.num_train_epochs = 3.0
  config.warmup_proportion = 0.1
  config.do_train = config.do_eval = True
  return config
