"""SpanBERT's pre-training objective: masked-LM + the span boundary objective (Joshi et al.
2020, "SpanBERT: Improving Pre-training by Representing and Predicting Spans").

Every masked token is predicted twice: by the masked-LM head from its own output, and by the
span boundary head (`heads.SpanBoundaryHead`) from the outputs at the two tokens around its
span and its offset in the span. Loss = masked-LM loss + SBO loss, both the weighted mean over
the batch's masked positions (the same `sum(weights) + 1e-5` denominator). SpanBERT trains on
single segments without a sentence objective, so the sentence label is not read.

The boundaries come from the batch's own `masked_lm_positions` and `masked_lm_weights`, inside
the jitted step (`span_boundaries`: the array port of `text.masking.span_boundaries`, where a
span is a maximal run of consecutive masked positions), so records need no extra feature and
static and dynamic masking both serve. A boundary never leaves its instance: it is clamped into
the instance's tokens (`sequence_ids` in packed rows, the real tokens of an unpacked row). With
[CLS] and [SEP] never masked this changes nothing on data_prep's records; it keeps a packed
row's instances apart whatever the masks are.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging

from bert_jax.model import heads, modeling
from bert_jax.model.configuration import BertConfig
from bert_jax.objectives.mlm import MaskedLm, masked_lm_loss
from bert_jax.text import features


def span_boundaries(masked_lm_positions: jax.Array, masked_lm_weights: jax.Array
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`text.masking.span_boundaries` in jnp, for use under `jit`: per masked position, the
  position just before its span, the one just after, and its offset within the span; (0, 0, 0)
  for slots of weight 0. Any leading shape: (..., max_predictions_per_seq)."""
  positions = masked_lm_positions.astype(jnp.int32)
  real = masked_lm_weights > 0
  axis = positions.ndim - 1
  slots = positions.shape[-1]
  follows = jnp.zeros_like(real).at[..., 1:].set(  # slot j continues the run of slot j - 1
      real[..., 1:] & real[..., :-1] & (positions[..., 1:] == positions[..., :-1] + 1))
  column = jnp.broadcast_to(jnp.arange(slots, dtype=jnp.int32), positions.shape)
  first_slot = jax.lax.cummax(jnp.where(follows, 0, column), axis=axis)
  precedes = jnp.zeros_like(real).at[..., :-1].set(follows[..., 1:])  # the run goes on
  last_slot = jax.lax.cummin(jnp.where(precedes, slots, column), axis=axis, reverse=True)
  start = jnp.take_along_axis(positions, first_slot, axis=axis)
  end = jnp.take_along_axis(positions, last_slot, axis=axis)
  return (jnp.where(real, start - 1, 0), jnp.where(real, end + 1, 0),
          jnp.where(real, positions - start, 0))


def within_sequences(left: jax.Array, right: jax.Array, masked_lm_positions: jax.Array,
                     sequence_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`left`, `right` (batch, P) clamped into the tokens of the instance each masked position
  belongs to: `sequence_ids` (batch, length) numbers the instances of a row (an unpacked row
  passes its `input_mask`: one instance)."""
  length = sequence_ids.shape[-1]
  own = jnp.take_along_axis(sequence_ids, masked_lm_positions.astype(jnp.int32), axis=1)
  same = sequence_ids[:, None, :] == own[:, :, None]  # (batch, P, length)
  first = jnp.argmax(same, axis=-1)
  last = length - 1 - jnp.argmax(same[..., ::-1], axis=-1)
  return jnp.clip(left, first, last), jnp.clip(right, first, last)


class SpanBoundaryModel(nn.Module):
  """`BertModel` (no pooler) + the masked-LM head (`cls/predictions`) + the span boundary head
  (`cls/pair_target_predictions`). Returns `(mlm_logits, sbo_logits)`, both
  (batch, max_predictions, vocab) float32, one pair per masked slot."""
  config: BertConfig
  max_targets: int = 15

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_weights,
               position_ids=None, sequence_ids=None, deterministic: bool = True):
    bert = modeling.BertModel(self.config, add_pooling_layer=False, name="bert")
    out = bert(input_ids, input_mask, segment_ids, position_ids, deterministic=deterministic,
               sequence_ids=sequence_ids)
    left, right, offset = span_boundaries(masked_lm_positions, masked_lm_weights)
    left, right = within_sequences(left, right, masked_lm_positions,
                                   input_mask if sequence_ids is None else sequence_ids)
    return _SpanBoundaryScope(self.config, self.max_targets, name="cls")(
        out["sequence_output"].astype(jnp.dtype(self.config.dtype)), masked_lm_positions,
        left, right, offset, bert.attend)


class _SpanBoundaryScope(nn.Module):
  """The `cls` scope: `predictions` and `pair_target_predictions`."""
  config: BertConfig
  max_targets: int

  @nn.compact
  def __call__(self, sequence_output, masked_lm_positions, left, right, offset, attend):
    mlm_logits = heads.MaskedLMHead(self.config, name="predictions")(
        sequence_output, masked_lm_positions, attend)
    sbo_logits = heads.SpanBoundaryHead(self.config, self.max_targets,
                                        name="pair_target_predictions")(
        sequence_output, left, right, offset, attend)
    return mlm_logits, sbo_logits


@dataclasses.dataclass(frozen=True)
class MaskedLmSpanBoundary(MaskedLm):
  """Masked-LM + span boundary objective (SpanBERT). `max_targets`: rows of the head's
  offset table (SpanBERT's 15)."""
  name: str = "mlm_sbo"
  max_targets: int = 15
  loss_parts = ("mlm", "sbo")

  def model(self, bert_config: BertConfig) -> SpanBoundaryModel:
    logging.info("%s", modeling.attention_kernel_description(bert_config))
    return SpanBoundaryModel(bert_config, self.max_targets)

  @property
  def input_names(self) -> tuple[str, ...]:
    names = features.ENCODER_INPUTS + (features.MASKED_LM_POSITIONS,
                                       features.MASKED_LM_WEIGHTS)
    if self.packed:
      names += (features.POSITION_IDS, features.SEQUENCE_IDS)
    return names

  def loss(self, outputs, batch, denominators):
    mlm_logits, sbo_logits = outputs
    loss, sums = self.masked_lm_terms(mlm_logits, batch, denominators)
    # The same weighted cross-entropy against the same targets, from the boundaries.
    sbo = masked_lm_loss(sbo_logits, batch[features.MASKED_LM_IDS],
                               batch[features.MASKED_LM_WEIGHTS])
    sums.update(sbo_loss_sum=sbo["loss_sum"], sbo_correct_sum=sbo["correct_sum"])
    return loss + sbo["loss_sum"] / denominators["mlm"], sums

  def summarize_heads(self, sums: Mapping[str, Any]) -> dict[str, float]:
    if "sbo_loss_sum" not in sums:
      return {}
    w = max(float(sums["mlm_weight_sum"]), 1e-5)
    return {"sbo_loss": float(sums["sbo_loss_sum"]) / w,
            "sbo_accuracy": float(sums["sbo_correct_sum"]) / w}

  def head_flops(self, bert_config: BertConfig, batch_size: int) -> float:
    """Per masked slot: linear1 2(2H + 200)H, linear2 2HE, decoder 2EV."""
    h, e, v = bert_config.hidden_size, bert_config.embedding_width, bert_config.vocab_size
    width = heads.SpanBoundaryHead.position_embedding_size
    per_slot = 2 * (2 * h + width) * h + 2 * h * e + 2 * e * v
    return float(batch_size * self.max_predictions_per_seq * per_slot)
