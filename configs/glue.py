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

Expected dev results with BERT-base (the paper's Table 1 reports the test set; these are the
usual dev numbers of the released checkpoint, learning rate picked per task): MNLI-m ~84%,
QQP ~91% accuracy / ~88 F1, QNLI ~91%, SST-2 ~92-93%, CoLA ~52-58 Matthews, STS-B ~88-89
Pearson/Spearman, MRPC ~86-88% accuracy / ~89-90 F1, RTE ~66-70%. Runtime: MRPC or RTE take a
few minutes on one TPU v3-8 or a modern GPU; MNLI and QQP about an hour; on a CPU only the
small tasks are practical (see `make finetune-example` for a measured CPU run).
"""

from bert_jax.runs import finetune_config

# variant → (GLUE task name, learning rate). Rates from the paper's grid that work well on dev.
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
