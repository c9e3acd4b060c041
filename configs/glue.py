r"""Fine-tuning configs for the nine GLUE tasks, with the paper's settings (Devlin et al. 2019,
Section 4.1: batch 32, 3 epochs, learning rate chosen from {5e-5, 4e-5, 3e-5, 2e-5} on dev;
length 128, warmup 10%).

    python -m bert_jax.finetune --config=configs/glue.py:mrpc --data_dir=glue_data/MRPC \
        --init_checkpoint=uncased_L-12_H-768_A-12/bert_model.ckpt \
        --vocab_file=uncased_L-12_H-768_A-12/vocab.txt --output_dir=out/mrpc

Variants (after the colon): cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli. The original flags
override any field (`--learning_rate=3e-5`), as does `--config.<field>=<value>`; `--do_train
--do_eval --do_predict` are on. `--data_dir` holds the official GLUE TSV files (or a prepared
tensorflow-datasets directory).

What to expect with BERT-base: the paper's test-set scores (Table 1) are MNLI 84.6/83.4, QQP F1
71.2, QNLI 90.5, SST-2 93.5, CoLA 52.1 (Matthews), STS-B 85.8 (Spearman), MRPC F1 88.9, RTE 66.4.
Public re-runs on the dev sets land around MNLI 81-84, QQP 88-91 accuracy, QNLI 88-91, SST-2
92-93, CoLA 49-59, STS-B 84-89, MRPC F1 88-91, RTE 62-70; the small tasks (CoLA, MRPC, STS-B,
RTE) move by several points with the seed, which is why the paper picked the best of several
runs. Runtime: MRPC or RTE take minutes on one TPU v3-8 or a modern GPU, MNLI and QQP about an
hour; on a CPU only small tasks are practical (`make finetune-example` is a measured CPU run).
"""

from bert_jax.runs import finetune_config

# variant → (GLUE task name, learning rate): a starting point from the paper's grid; the paper
# picked the rate per task on dev, so sweep {5e-5, 4e-5, 3e-5, 2e-5} for the best result.
TASKS = {
    "cola": ("CoLA", 2e-5), "sst2": ("SST-2", 2e-5), "mrpc": ("MRPC", 2e-5),
    "stsb": ("STS-B", 3e-5), "qqp": ("QQP", 2e-5), "mnli": ("MNLI", 2e-5),
    "qnli": ("QNLI", 2e-5), "rte": ("RTE", 3e-5), "wnli": ("WNLI", 2e-5),
}


def get_config(variant: str = "mrpc"):
  key = variant.lower().replace("-", "")
  if key not in TASKS:
    raise ValueError(f"Unknown GLUE variant {variant!r}; known: {', '.join(TASKS)}.")
  task_name, learning_rate = TASKS[key]
  config = finetune_config.get_config()
  config.task_name = task_name
  config.max_seq_length = 128
  config.train_batch_size = 32
  config.learning_rate = learning_rate
  config.num_train_epochs = 3.0
  config.warmup_proportion = 0.1
  config.do_train = config.do_eval = config.do_predict = True
  return config
