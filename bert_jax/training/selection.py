"""Model selection while training: the best evaluation so far by one metric, and early stopping.

A run that evaluates every `eval_every_steps` steps gives the loop a `Selection`: after each
evaluation the loop calls `update`, which remembers the best step (and hands a new best to
`on_best`, which keeps that model: fine-tuning writes it to `<output_dir>/best`) and counts the
evaluations since; with a `patience`, training stops once that many evaluations in a row brought
no improvement. A metric named `...loss` is better lower; every other (accuracy, F1, Matthews
and Pearson correlations, exact match) is better higher. A value that is not a number never
improves.

The state (`record`) is saved with every checkpoint, in its metadata, and `restored` from the
checkpoint a run resumes: a resumed run keeps the best it had found and its count of evaluations
without improvement, so it stops where an uninterrupted run stops, and a run that had already
stopped for lack of improvement does not train again.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

# The key of the selection state in a checkpoint's metadata.
METADATA_KEY = "selection"


@dataclasses.dataclass
class Selection:
  """The best evaluation of `metric` (a scalar the loop's evaluation returns) so far."""
  metric: str
  patience: int | None = None   # evaluations without improvement before stopping; None: never
  on_best: Callable[[int, Any, dict[str, float]], None] | None = None  # (step, state, scalars)
  best_step: int | None = None
  best_value: float | None = None
  evaluations_since_best: int = 0
  last_step: int | None = None   # the step of the last evaluation counted

  def __post_init__(self):
    if self.patience is not None and self.patience < 1:
      raise ValueError(f"early stopping patience {self.patience}: must be at least 1 "
                       "evaluation (leave it unset to train every step).")

  @property
  def higher_is_better(self) -> bool:
    return not self.metric.rsplit("/", 1)[-1].endswith("loss")

  def _better(self, value: float) -> bool:
    if not math.isfinite(value):
      return False
    if self.best_value is None:
      return True
    return value > self.best_value if self.higher_is_better else value < self.best_value

  def update(self, step: int, state: Any, scalars: dict[str, float]) -> bool:
    """Counts the evaluation of `state` at `step` (its `scalars`); returns whether it is the
    best so far. A step already counted (a resumed run evaluating its checkpoint's step again)
    changes nothing."""
    if self.metric not in scalars:
      names = ", ".join(k.rsplit("/", 1)[-1] for k in sorted(scalars))
      raise ValueError(f"eval_metric {self.metric.rsplit('/', 1)[-1]!r} is not among the "
                       f"evaluation's scores ({names}): set --eval_metric to one of them.")
    if self.last_step is not None and step <= self.last_step:
      return False
    self.last_step = step
    value = float(scalars[self.metric])
    if not self._better(value):
      self.evaluations_since_best += 1
      return False
    self.best_step, self.best_value, self.evaluations_since_best = step, value, 0
    if self.on_best is not None:
      self.on_best(step, state, scalars)
    return True

  @property
  def exhausted(self) -> bool:
    """Whether `patience` evaluations in a row brought no improvement."""
    return self.patience is not None and self.evaluations_since_best >= self.patience

  def describe(self) -> str:
    name = self.metric.rsplit("/", 1)[-1]
    if self.best_step is None:
      return f"no evaluation of {name} yet"
    return f"best {name} {self.best_value:.4f} at step {self.best_step}"

  def record(self) -> dict[str, Any]:
    """What a checkpoint keeps of this selection (JSON)."""
    return {"metric": self.metric, "best_step": self.best_step, "best_value": self.best_value,
            "evaluations_since_best": self.evaluations_since_best, "last_step": self.last_step}

  def restored(self, metadata: dict[str, Any] | None) -> "Selection":
    """This selection continued from a checkpoint's metadata (as `record` wrote it); unchanged
    when the checkpoint has none, or one about another metric."""
    found = (metadata or {}).get(METADATA_KEY)
    if not found or found.get("metric") != self.metric:
      return self
    return dataclasses.replace(
        self, best_step=found.get("best_step"), best_value=found.get("best_value"),
        evaluations_since_best=int(found.get("evaluations_since_best") or 0),
        last_step=found.get("last_step"))
