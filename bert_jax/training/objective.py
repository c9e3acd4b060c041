"""What the training core needs of an objective: the one interface pre-training objectives
and fine-tuning tasks both implement.

The step builder and the loop (`training/step.py`, `training/loop.py`) know nothing of masks,
labels or spans. An objective says which model to build on the encoder, which batch features
that model reads, and how the model's outputs and a batch become a loss and metric *sums*;
everything else — accumulation, clipping, shardings, logging, checkpoints, preemption — is the
core's. A new objective (sentence order, span boundary, replaced tokens, distillation) or task
(tagging, multiple choice) is a new subclass, never a change to the step or the loop.

Losses are written against whole-batch `denominators` (computed once per step, before any split
into micro-batches): with them the loss is a plain sum over micro-batches, so `k` accumulated
micro-batches give exactly the gradient of one `k`-times-larger batch.
"""

from __future__ import annotations

import abc
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Batch = Mapping[str, jax.Array]
Sums = dict[str, jax.Array]


class Objective(abc.ABC):
  """A training objective (pre-training) or task (fine-tuning), as the core sees it."""

  #: Short name, used in messages and recorded in checkpoints.
  name: str = "objective"

  #: The top-level parameter scopes of this objective's heads (beside the encoder's "bert").
  head_scopes: tuple[str, ...] = ()

  #: Top-level parameter scopes that an `init_checkpoint`'s weights are loaded into; None loads
  #: every scope of this model that the checkpoint has (continuing pre-training, heads
  #: included). Fine-tuning loads only the encoder ("bert",): its head starts from its init.
  init_scopes: tuple[str, ...] | None = None

  #: In-memory batches (fine-tuning) may cut padding columns no row uses: true where the loss
  #: ignores padded positions (not for SQuAD spans, whose softmax runs over every position).
  trim_batches: bool = False

  #: Top-level parameter scopes the optimizer must never change (a distillation teacher kept
  #: in the same tree): runs add them to `optimizer.frozen_scopes` (no update, no state).
  frozen_scopes: tuple[str, ...] = ()

  # ------------------------------------------------- other checkpoints and the starting weights
  def with_checkpoints(self, reader) -> "Objective":
    """This objective, ready to read the checkpoints it names besides the run's own (a
    distillation teacher). A run calls it once, before building the model, with the checkpoint
    reader (`interop.checkpoints`: `read_config`, `load_any`, `in_layout`). Default: `self`,
    nothing to read."""
    del reader
    return self

  def initialize_params(self, params: dict) -> dict:
    """The parameters a run *starts* from (host arrays): called by the init order
    (`training.init_order.initial_state`) after a fresh initialisation or an `init_checkpoint`
    was merged in — never on a resumed or continued state, which already holds them. Returns a
    tree of the same structure and shapes (a distillation teacher's weights loaded into its
    scope). Default: unchanged (and the core skips the host round trip)."""
    return params

  # ------------------------------------------------------------------------------ the model
  @abc.abstractmethod
  def model(self, bert_config) -> nn.Module:
    """The encoder with this objective's heads; `__call__(*inputs, deterministic=...)`."""

  @property
  @abc.abstractmethod
  def input_names(self) -> tuple[str, ...]:
    """The batch features the model's `__call__` takes, in order."""

  @abc.abstractmethod
  def batch_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """Every feature of a batch (model inputs and targets): name → shape and dtype."""

  def example_batch(self, batch_size: int) -> dict[str, np.ndarray]:
    """Zeros in the batch layout: traces initialisation and ahead-of-time compilation."""
    return {name: np.zeros(s.shape, s.dtype) for name, s in self.batch_spec(batch_size).items()}

  # ------------------------------------------------------------------------- loss and metrics
  def denominators(self, batch: Batch) -> dict[str, jax.Array]:
    """Whole-batch normalisers of the loss. Default: the examples of weight 1 (padding rows
    of a partial batch carry weight 0), at least 1."""
    return {"examples": jnp.maximum(jnp.sum(batch["weight"].astype(jnp.float32)), 1.0)}

  @abc.abstractmethod
  def loss(self, outputs: Any, batch: Batch, denominators: Mapping[str, jax.Array]
           ) -> tuple[jax.Array, Sums]:
    """`(loss, sums)`: the scalar to minimise, normalised by `denominators`, and float32 sums
    from which `summarize` makes exact averages over any number of batches."""

  @abc.abstractmethod
  def summarize(self, sums: Mapping[str, Any]) -> dict[str, float]:
    """Metric sums (of one batch or added over many) → the reported values, e.g.
    `{"loss": ..., "accuracy": ...}`."""

  def flops_per_step(self, bert_config, batch_size: int) -> float | None:
    """Analytic matmul FLOPs of one training step, for MFU; None: not reported."""
    return None


def per_example_averages(sums: Mapping[str, Any]) -> dict[str, float]:
  """`loss` (and `accuracy`, where there is a `correct_sum`) per example of weight 1, from the
  sums of a head's loss (`loss_sum`, `correct_sum`, `weight_sum`)."""
  n = max(float(sums.get("weight_sum", 0.0)), 1.0)
  out = {"loss": float(sums["loss_sum"]) / n}
  if "correct_sum" in sums:
    out["accuracy"] = float(sums["correct_sum"]) / n
  return out
