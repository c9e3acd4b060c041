"""Pre-training objectives: plug-ins of the training core (`training/objective.py`).

Each declares its model (encoder + heads), the batch features it reads and its metrics, and
returns loss and metric sums; the core's one step and one loop do the rest. A run config names
its objective (`config.objective`).
"""

from __future__ import annotations

from bert_jax.objectives.mlm_nsp import MaskedLmNextSentence

OBJECTIVES = {"mlm_nsp": MaskedLmNextSentence}


def get_objective(name: str, **settings):
  """The objective called `name`, built with `settings` (sequence lengths, ...)."""
  if name not in OBJECTIVES:
    raise ValueError(f"Unknown objective {name!r}; known: {', '.join(sorted(OBJECTIVES))}.")
  return OBJECTIVES[name](**settings)
