"""SQuAD v1.1 / v2.0 answer spans as a plug-in of the training core.

The data side — reading the official JSON or tfds, sliding windows, answer maps, n-best
post-processing, prediction files — is `data.py` beside it, the official scores `metrics.py`;
this module adds the model (a start and an end logit per token, as `run_squad.py`), the
features of a batch and the original's span loss. Unpacked batches keep their full length: the
original's softmax runs over every position, padding included. Packed batches (`packing`) give
each window a softmax over its own tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import heads, modeling
from bert_jax.model.configuration import BertConfig
from bert_jax.text import features
from bert_jax.training import perf
from bert_jax.training.objective import Objective, per_example_averages

def window_logits(logits: jax.Array, sequence_ids: jax.Array, num_slots: int) -> jax.Array:
  """(rows, S) logits of packed rows → (rows, k, S): slot j's copy keeps only the positions of
  the j-th window in the row, the others (other windows, padding) set to a large negative, so
  a softmax over it runs over that window's own tokens."""
  slots = jnp.arange(1, num_slots + 1, dtype=sequence_ids.dtype)
  own = sequence_ids[:, None, :] == slots[None, :, None]
  return jnp.where(own, logits[:, None, :], modeling.MASKED_LOGIT)


@dataclasses.dataclass(frozen=True)
class SquadSpans(Objective):
  """Start and end of the answer span in each window (`[CLS]` for no answer).

  With `max_sequences_per_row` (fine-tuning's `packing`), several windows share a row
  (`data/packed_examples.py`); `start_positions` / `end_positions` and `weight` are then
  (rows, k), positions in the row. Each window's softmax then runs over its own tokens only —
  the original's also ran over the window's padding, which a packed row no longer has, so
  packed and unpacked SQuAD losses differ by that padding's share of the softmax.
  """
  max_seq_length: int = 384
  version_2_with_negative: bool = False
  max_sequences_per_row: int | None = None  # None: one window per row
  head_scopes = ("qa_outputs",)
  init_scopes = ("bert",)
  #: Answer positions in the packed layout, moved to positions in the row.
  position_columns = ("start_positions", "end_positions")

  @property
  def trim_batches(self) -> bool:
    """Packed rows mask padding out of the softmax, so unused columns may be cut; unpacked
    rows keep them (the original's softmax runs over every position)."""
    return bool(self.max_sequences_per_row)

  @property
  def name(self) -> str:
    return f"squad {'v2.0' if self.version_2_with_negative else 'v1.1'}"

  def model(self, bert_config: BertConfig) -> heads.BertForQuestionAnswering:
    return heads.BertForQuestionAnswering(bert_config)

  @property
  def input_names(self) -> tuple[str, ...]:
    if self.max_sequences_per_row:
      return features.ENCODER_INPUTS + (features.POSITION_IDS, features.SEQUENCE_IDS)
    return features.ENCODER_INPUTS

  def batch_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    tokens = jax.ShapeDtypeStruct((batch_size, self.max_seq_length), np.int32)
    per_example = (batch_size,)
    spec = {k: tokens for k in features.ENCODER_INPUTS}
    if self.max_sequences_per_row:
      per_example = (batch_size, self.max_sequences_per_row)
      spec.update({features.POSITION_IDS: tokens, features.SEQUENCE_IDS: tokens})
    position = jax.ShapeDtypeStruct(per_example, np.int32)
    return {**spec, "start_positions": position, "end_positions": position,
            "weight": jax.ShapeDtypeStruct(per_example, np.float32)}

  def loss(self, outputs, batch, denominators):
    start_logits, end_logits = outputs
    starts, ends, weights = batch["start_positions"], batch["end_positions"], batch["weight"]
    if self.max_sequences_per_row:  # one softmax per window, over its own tokens
      k = self.max_sequences_per_row
      length = start_logits.shape[-1]
      start_logits, end_logits = (
          window_logits(logits, batch[features.SEQUENCE_IDS], k).reshape(-1, length)
          for logits in (start_logits, end_logits))
      starts, ends, weights = starts.reshape(-1), ends.reshape(-1), weights.reshape(-1)
    out = span_loss(start_logits, end_logits, starts, ends, weights)
    sums = {k: v for k, v in out.items() if k != "loss"}
    return out["loss_sum"] / denominators["examples"], sums

  def summarize(self, sums: Mapping[str, Any]) -> dict[str, float]:
    return per_example_averages(sums)

  def flops_per_step(self, bert_config: BertConfig, batch_size: int) -> float:
    forward = perf.encoder_forward_flops(bert_config, batch_size, self.max_seq_length)
    forward += batch_size * self.max_seq_length * 2 * bert_config.hidden_size * 2
    return perf.training_flops(forward)


# --------------------------------------------------------------------------------------- the loss
def span_loss(start_logits: jax.Array, end_logits: jax.Array, start_positions: jax.Array,
              end_positions: jax.Array, weights: jax.Array) -> dict[str, jax.Array]:
  """The original's SQuAD loss: (start cross-entropy + end cross-entropy) / 2 over positions,
  averaged over the examples of weight 1 (weight 0 marks padding rows of a partial batch)."""
  def cross_entropy(logits, positions):
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(log_probs, positions.astype(jnp.int32)[:, None], axis=-1)[:, 0]
  weights = weights.astype(jnp.float32)
  per_example = 0.5 * (cross_entropy(start_logits, start_positions)
                       + cross_entropy(end_logits, end_positions))
  weight_sum = jnp.sum(weights)
  loss_sum = jnp.sum(weights * per_example)
  both = ((jnp.argmax(start_logits, axis=-1) == start_positions)
          & (jnp.argmax(end_logits, axis=-1) == end_positions)).astype(jnp.float32)
  return {"loss": loss_sum / jnp.maximum(weight_sum, 1.0), "loss_sum": loss_sum,
          "correct_sum": jnp.sum(weights * both), "weight_sum": weight_sum}
