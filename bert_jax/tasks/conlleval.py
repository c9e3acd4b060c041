"""`python -m bert_jax.tasks.conlleval [-r] [FILE]`: entity-level precision, recall and F1 of a
tagging as CoNLL's conlleval counts them. The scorer is the tagging task's metric,
`bert_jax.tasks.tagging.metrics`; this module keeps the command's name."""

import sys

from bert_jax.tasks.tagging.metrics import main

if __name__ == "__main__":
  sys.exit(main())
