"""Masked-LM alone (RoBERTa, Liu et al. 2019; SpanBERT without its boundary objective), and the
masked-LM part every pre-training objective here shares.

`MaskedLm` owns the masked-LM rule once: the batch layout (unpacked rows, or packed rows of
several instances, Krell et al. 2021), the original's loss — cross-entropy weighted by
`masked_lm_weights` over `sum(weights) + 1e-5` of the whole batch — its metric sums and
summaries, and its FLOPs. The objectives that add a head (next-sentence, sentence-order, span
boundary) subclass it and add their term, sums and metrics.

The masked-LM-only model has no pooler and no sentence head, and reads no label: records that
carry `next_sentence_labels` (every record does; the schema keeps it) are fine, it is ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from bert_jax.model import heads, modeling
from bert_jax.model.configuration import BertConfig
from bert_jax.text import features
from bert_jax.training import perf
from bert_jax.training.objective import Objective

# int64 in the records, int32 in a batch (the pipeline casts); float32 stays float32.
_BATCH_DTYPES = {"int64": np.int32, "float32": np.float32}


def batch_spec_from_schema(schema: tuple[features.Feature, ...], batch_size: int
                           ) -> dict[str, jax.ShapeDtypeStruct]:
  """The batch layout of records of `schema` (`text/features.py`), as the pipeline yields it."""
  return {f.name: jax.ShapeDtypeStruct((batch_size, f.length), _BATCH_DTYPES[f.dtype])
          for f in schema}


class MaskedLmModel(nn.Module):
  """`BertModel` (no pooler) + the masked-LM head: `heads.BertForMaskedLM`'s parameter paths
  (`bert/...`, `cls/predictions/...`), and packed rows besides (`position_ids`,
  `sequence_ids`). Returns the MLM logits (batch, max_predictions, vocab), float32; with
  `return_hidden`, `(logits, last hidden states)` (what distillation compares)."""
  config: BertConfig
  return_hidden: bool = False

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions,
               position_ids=None, sequence_ids=None, deterministic: bool = True):
    bert = modeling.BertModel(self.config, add_pooling_layer=False, name="bert")
    out = bert(input_ids, input_mask, segment_ids, position_ids, deterministic=deterministic,
               sequence_ids=sequence_ids)
    hidden = out["sequence_output"].astype(jnp.dtype(self.config.dtype))
    logits = _MaskedLmScope(self.config, name="cls")(hidden, masked_lm_positions, bert.attend)
    return (logits, hidden) if self.return_hidden else logits


class _MaskedLmScope(nn.Module):
  """The `cls` scope of the original checkpoint, with `predictions` alone."""
  config: BertConfig

  @nn.compact
  def __call__(self, sequence_output, masked_lm_positions, attend):
    return heads.MaskedLMHead(self.config, name="predictions")(
        sequence_output, masked_lm_positions, attend)


@dataclasses.dataclass(frozen=True)
class MaskedLm(Objective):
  """Masked-LM at `masked_lm_positions`, and nothing else.

  `packed`: rows of several instances; `max_predictions_per_seq` is then the prediction budget
  of a whole row, and `max_sequences_per_row` its instance slots.
  """
  max_seq_length: int = 128
  max_predictions_per_seq: int = 20
  name: str = "mlm"
  packed: bool = False
  max_sequences_per_row: int = 1
  head_scopes = ("cls",)

  #: What `next_sentence_labels` must mean in the records this objective trains on (the
  #: `sentence_objective` of data_prep's summary.json: "nsp" or "sop"); None: not read.
  sentence_objective: ClassVar[str | None] = None
  #: Whether the loss reads `next_sentence_labels` (else a batch need not carry them).
  reads_sentence_labels: ClassVar[bool] = False
  #: The loss terms, each reported as `<part>_loss`; their sum is the reported `loss`.
  loss_parts = ("mlm",)

  def __post_init__(self):
    if self.packed and self.max_sequences_per_row < 1:
      raise ValueError(f"max_sequences_per_row={self.max_sequences_per_row}: a packed row "
                       "holds at least one instance.")

  def model(self, bert_config: BertConfig) -> nn.Module:
    logging.info("%s", modeling.attention_kernel_description(bert_config))
    return MaskedLmModel(bert_config)

  @property
  def input_names(self) -> tuple[str, ...]:
    names = features.ENCODER_INPUTS + (features.MASKED_LM_POSITIONS,)
    if self.packed:
      names += (features.POSITION_IDS, features.SEQUENCE_IDS)
    return names

  def batch_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    # Static records carry the masks; dynamic ones get them drawn by the pipeline, so a batch
    # always has the static layout.
    spec = batch_spec_from_schema(features.pretraining_features(
        self.max_seq_length, self.max_predictions_per_seq, features.STATIC), batch_size)
    if not self.reads_sentence_labels:
      del spec[features.NEXT_SENTENCE_LABELS]
    if self.packed:
      per_token = jax.ShapeDtypeStruct((batch_size, self.max_seq_length), np.int32)
      spec.update({features.POSITION_IDS: per_token, features.SEQUENCE_IDS: per_token})
    return spec

  # ------------------------------------------------------------------------ loss and metrics
  def denominators(self, batch) -> dict[str, jax.Array]:
    return {"mlm": jnp.sum(batch[features.MASKED_LM_WEIGHTS].astype(jnp.float32)) + 1e-5}

  def masked_lm_terms(self, mlm_logits, batch, denominators
                      ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The masked-LM term of the loss and its sums (`mlm_loss_sum`, `mlm_correct_sum`,
    `mlm_weight_sum`)."""
    mlm = masked_lm_loss(mlm_logits, batch[features.MASKED_LM_IDS],
                               batch[features.MASKED_LM_WEIGHTS])
    return mlm["loss_sum"] / denominators["mlm"], {
        "mlm_loss_sum": mlm["loss_sum"], "mlm_correct_sum": mlm["correct_sum"],
        "mlm_weight_sum": mlm["weight_sum"]}

  def loss(self, outputs, batch, denominators):
    return self.masked_lm_terms(outputs, batch, denominators)

  def summarize(self, sums: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    if "mlm_weight_sum" in sums:
      w = max(float(sums["mlm_weight_sum"]), 1e-5)
      out["mlm_loss"] = float(sums["mlm_loss_sum"]) / w
      out["mlm_accuracy"] = float(sums["mlm_correct_sum"]) / w
    out.update(self.summarize_heads(sums))
    parts = [f"{part}_loss" for part in self.loss_parts]
    if all(p in out for p in parts):
      out["loss"] = sum(out[p] for p in parts)
    return out

  def summarize_heads(self, sums: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of the heads beside the masked-LM one (none here)."""
    del sums
    return {}

  # ------------------------------------------------------------------------------- cost
  def flops_per_step(self, bert_config: BertConfig, batch_size: int) -> float:
    """Encoder, the masked-LM head at the masked positions only (transform 2HE, decoder 2EV;
    E = H but for ALBERT), plus `head_flops`. Packed attention still computes every
    (query, key) pair of the row."""
    h, e, v = bert_config.hidden_size, bert_config.embedding_width, bert_config.vocab_size
    forward = perf.encoder_forward_flops(bert_config, batch_size, self.max_seq_length)
    forward += batch_size * self.max_predictions_per_seq * (2 * h * e + 2 * e * v)
    return perf.training_flops(forward + self.head_flops(bert_config, batch_size))

  def head_flops(self, bert_config: BertConfig, batch_size: int) -> float:
    """Forward FLOPs of the heads beside the masked-LM one."""
    del bert_config, batch_size
    return 0.0


# --------------------------------------------------------------------------------------- the loss
def masked_lm_loss(logits: jax.Array, masked_lm_ids: jax.Array,
                   masked_lm_weights: jax.Array) -> dict[str, jax.Array]:
  """The original's weighted cross-entropy: sum(w · loss) / (sum(w) + 1e-5).

  Padding predictions (weight 0) contribute nothing. Returns the loss plus the sums that make
  exact averages over many batches (`*_sum` and `weight_sum`).
  """
  labels = masked_lm_ids.astype(jnp.int32)
  per_position, top = cross_entropy(logits, labels)
  weights = masked_lm_weights.astype(jnp.float32)
  loss_sum = jnp.sum(weights * per_position)
  weight_sum = jnp.sum(weights)
  correct = (top == labels).astype(jnp.float32)
  return {
      "loss": loss_sum / (weight_sum + 1e-5),
      "loss_sum": loss_sum,
      "correct_sum": jnp.sum(weights * correct),
      "weight_sum": weight_sum,
  }


def cross_entropy(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(-log softmax(logits)[label], argmax(logits)) over the last axis: the loss in float32
  with its gradient softmax(logits) - one_hot(label) written out, and the prediction the
  accuracy counts (the first index of the largest logit, as `jnp.argmax`).

  Why not log_softmax and take_along_axis, differentiated as they are: over a 30k vocabulary at
  every masked position the loss is the largest elementwise work of the step after the
  encoder's. In the GPU program of BERT-base/128, reading and writing arrays of the logits'
  size in float32 took 6.9 GB per step: the forward read them four times (maximum, sum of
  exponentials, the label's entry, the accuracy's argmax), and the gather's gradient was a
  scatter-add into a zeroed array. Here the forward reads the logits once, in one reduction of
  four results (largest logit, sum of exponentials rescaled online to it, the largest's index,
  the label's logit: `_online_softmax`), and the backward once, in one kernel that writes the
  gradient. In the H200 program of BERT-base/128 the one reduction moves 0.6 GB less per step
  than the two it replaces.
  """
  return _cross_entropy(logits, labels.astype(jnp.int32))


def _vocab_index(x: jax.Array) -> jax.Array:
  """Each entry's index along the last (vocabulary) axis."""
  return jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)


def _online_softmax(a, b):
  """Combines two partial reductions of a row, each (largest logit, sum of exp(logit - that
  largest), its first index, the label's logit): softmax's normaliser taken online, as flash
  attention takes it, so one pass over the logits gives all four."""
  peak = jnp.maximum(a[0], b[0])
  exps = a[1] * jnp.exp(a[0] - peak) + b[1] * jnp.exp(b[0] - peak)
  take_a = (a[0] > b[0]) | ((a[0] == b[0]) & (a[2] < b[2]))  # the first index among equals
  return peak, exps, jnp.where(take_a, a[2], b[2]), a[3] + b[3]


def _forward(logits, labels):
  x = logits.astype(jnp.float32)
  index = _vocab_index(x)
  # The identity's largest logit is float32's lowest finite value, not -inf: exp(-inf - -inf)
  # would make the sum of two empty partials NaN.
  peak, exps, top, picked = jax.lax.reduce(
      (x, jnp.ones_like(x), index, jnp.where(index == labels[..., None], x, 0.0)),
      (jnp.array(jnp.finfo(jnp.float32).min, jnp.float32), jnp.array(0, jnp.float32),
       jnp.array(0, jnp.int32), jnp.array(0, jnp.float32)),
      _online_softmax, (x.ndim - 1,))
  lse = jnp.log(exps) + peak
  return (lse - picked, top), lse


@jax.custom_vjp
def _cross_entropy(logits, labels):
  return _forward(logits, labels)[0]


def _cross_entropy_fwd(logits, labels):
  out, lse = _forward(logits, labels)
  return out, (logits, labels, lse)


def _cross_entropy_bwd(saved, grads):
  logits, labels, lse = saved
  grad = grads[0]  # the argmax has no gradient
  x = logits.astype(jnp.float32)
  d = (jnp.exp(x - lse[..., None]) - (_vocab_index(x) == labels[..., None])) * grad[..., None]
  return d.astype(logits.dtype), np.zeros(labels.shape, jax.dtypes.float0)


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)
