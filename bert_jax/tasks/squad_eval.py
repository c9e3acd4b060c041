"""`python -m bert_jax.tasks.squad_eval DATA_FILE PRED_FILE [--na_prob_file ...]`: the official
SQuAD v1.1 / v2.0 scores of a prediction file. The scorer is the SQuAD task's metric,
`bert_jax.tasks.squad.metrics`; this module keeps the command's name."""

import sys

from bert_jax.tasks.squad.metrics import main

if __name__ == "__main__":
  sys.exit(main())
