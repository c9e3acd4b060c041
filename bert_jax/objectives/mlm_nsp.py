"""BERT's pre-training objective: masked-LM + next-sentence prediction (Devlin et al. 2019),
and the sentence-pair part it shares with ALBERT's sentence-order prediction (`mlm_sop`).

The loss is the original's: the masked-LM cross-entropy weighted by `masked_lm_weights` and
divided by `sum(weights) + 1e-5`, plus the mean next-sentence cross-entropy. Both divisors are
taken over the whole batch (`denominators`), so accumulated micro-batches add up to the loss of
the whole batch. Training, evaluation, the tests and the benchmarks all call this loss; its
masked-LM part is `mlm.MaskedLm`'s, which every objective here shares.

With `packed=True` a batch row holds several instances (Krell et al. 2021, "Efficient Sequence
Packing without Cross-contamination"): the model reads `position_ids`, `sequence_ids` and
`cls_positions` besides the usual inputs, next-sentence labels come per instance
(`max_sequences_per_row` slots per row, `next_sentence_weights` 1 for a real instance, 0 for an
unused slot), and the next-sentence mean is over real instances. The same instances packed or
not give the same loss and gradients.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from bert_jax.model import heads, modeling
from bert_jax.model.configuration import BertConfig
from bert_jax.objectives.mlm import MaskedLm, batch_spec_from_schema
from bert_jax.text import features

__all__ = ["MaskedLmNextSentence", "MaskedLmSentencePair", "batch_spec_from_schema",
           "pretraining_loss"]


@dataclasses.dataclass(frozen=True)
class MaskedLmSentencePair(MaskedLm):
  """Masked-LM + a 2-way classifier of the segment pair on the pooled [CLS] (per instance in
  packed rows), against `next_sentence_labels`. What the label means (and so the metrics'
  prefix and the records it trains on) is the subclass's: next sentence or sentence order."""

  #: Prefix of the sentence head's metrics (`<prefix>_loss`, `_accuracy`, `_count`, ...).
  prefix: ClassVar[str] = "nsp"
  #: The sum of the labels, for the majority-label baseline beside the accuracy.
  positive_sum: ClassVar[str] = "nsp_random_next_sum"
  reads_sentence_labels: ClassVar[bool] = True

  @property
  def loss_parts(self):
    return ("mlm", self.prefix)

  def model(self, bert_config: BertConfig) -> heads.BertForPreTraining:
    logging.info("%s", modeling.attention_kernel_description(bert_config))
    return heads.BertForPreTraining(bert_config)

  @property
  def input_names(self) -> tuple[str, ...]:
    names = features.ENCODER_INPUTS + (features.MASKED_LM_POSITIONS,)
    if self.packed:  # in `BertForPreTraining.__call__` order
      names += (features.POSITION_IDS, features.SEQUENCE_IDS, features.CLS_POSITIONS)
    return names

  def batch_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    spec = super().batch_spec(batch_size)
    if self.packed:
      per_instance = jax.ShapeDtypeStruct((batch_size, self.max_sequences_per_row), np.int32)
      spec.update({
          features.CLS_POSITIONS: per_instance,
          features.NEXT_SENTENCE_LABELS: per_instance,
          features.NEXT_SENTENCE_WEIGHTS: jax.ShapeDtypeStruct(
              (batch_size, self.max_sequences_per_row), np.float32)})
    return spec

  def _sentence_weights(self, batch):
    """1 per real instance: every row's one instance unpacked, the marked slots packed."""
    if not self.packed:
      return None
    return batch[features.NEXT_SENTENCE_WEIGHTS].astype(jnp.float32)

  def denominators(self, batch) -> dict[str, jax.Array]:
    weights = self._sentence_weights(batch)
    count = (jnp.asarray(batch[features.NEXT_SENTENCE_LABELS].shape[0], jnp.float32)
             if weights is None else jnp.maximum(jnp.sum(weights), 1.0))
    return dict(super().denominators(batch), **{self.prefix: count})

  def loss(self, outputs, batch, denominators):
    mlm_logits, sentence_logits = outputs
    loss, sums = self.masked_lm_terms(mlm_logits, batch, denominators)
    weights = self._sentence_weights(batch)
    labels = batch[features.NEXT_SENTENCE_LABELS]
    sentence = next_sentence_loss(sentence_logits, labels, weights)
    loss = loss + sentence["loss_sum"] / denominators[self.prefix]
    positives = labels.astype(jnp.float32)
    if weights is not None:
      positives = weights * positives
    sums.update({f"{self.prefix}_loss_sum": sentence["loss_sum"],
                 f"{self.prefix}_correct_sum": sentence["correct_sum"],
                 f"{self.prefix}_count": sentence["weight_sum"],
                 self.positive_sum: jnp.sum(positives)})
    return loss, sums

  def summarize_heads(self, sums: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    p = self.prefix
    if f"{p}_count" in sums:
      n = max(float(sums[f"{p}_count"]), 1.0)
      out[f"{p}_loss"] = float(sums[f"{p}_loss_sum"]) / n
      out[f"{p}_accuracy"] = float(sums[f"{p}_correct_sum"]) / n
      if self.positive_sum in sums:  # what always guessing the majority label scores
        positive = float(sums[self.positive_sum]) / n
        out[f"{p}_majority_baseline"] = max(positive, 1.0 - positive)
    return out

  def head_flops(self, bert_config: BertConfig, batch_size: int) -> float:
    """Pooler 2H² and the 2-way classifier 4H per instance slot (one per row, or
    `max_sequences_per_row` packed)."""
    h = bert_config.hidden_size
    instances = batch_size * (self.max_sequences_per_row if self.packed else 1)
    return float(instances * (2 * h * h + 4 * h))


@dataclasses.dataclass(frozen=True)
class MaskedLmNextSentence(MaskedLmSentencePair):
  """Masked-LM at `masked_lm_positions` + next-sentence prediction on the pooled [CLS]
  (label 1: B is a random segment).

  `packed`: rows of several instances (see the module docstring); `max_predictions_per_seq` is
  then the prediction budget of a whole row, and `max_sequences_per_row` its instance slots.
  """
  name: str = "mlm_nsp"
  sentence_objective: ClassVar[str] = "nsp"


def pretraining_loss(mlm_logits: jax.Array, nsp_logits: jax.Array, batch: Mapping[str, Any]
                     ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The objective's loss on one whole batch, with its parts: `mlm_loss`, `nsp_loss` and the
  sums (traceable, for `jax.grad` in tests and benchmarks). A batch with
  `next_sentence_weights` is read as packed."""
  objective = MaskedLmNextSentence(packed=features.NEXT_SENTENCE_WEIGHTS in batch)
  denominators = objective.denominators(batch)
  loss, sums = objective.loss((mlm_logits, nsp_logits), batch, denominators)
  metrics = dict(sums, loss=loss, mlm_loss=sums["mlm_loss_sum"] / denominators["mlm"],
                 nsp_loss=sums["nsp_loss_sum"] / denominators["nsp"])
  return loss, metrics


# --------------------------------------------------------------------------------------- the loss
def next_sentence_loss(logits: jax.Array, labels: jax.Array,
                       weights: jax.Array | None = None) -> dict[str, jax.Array]:
  """Mean 2-way cross-entropy; label 1 means "B is a random segment", as in the original.

  Packed rows give logits (batch, k, 2) and labels (batch, k) with `weights` (batch, k): 1 for
  a real instance, 0 for an unused slot; the mean is then over the real instances.
  """
  labels = labels.reshape(-1).astype(jnp.int32)
  logits = logits.reshape(-1, logits.shape[-1])
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  per_example = -jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  if weights is None:
    count = jnp.asarray(labels.shape[0], jnp.float32)
    return {
        "loss": jnp.mean(per_example),
        "loss_sum": jnp.sum(per_example),
        "correct_sum": jnp.sum(correct),
        "weight_sum": count,
    }
  weights = weights.reshape(-1).astype(jnp.float32)
  loss_sum = jnp.sum(weights * per_example)
  weight_sum = jnp.sum(weights)
  return {
      "loss": loss_sum / jnp.maximum(weight_sum, 1.0),
      "loss_sum": loss_sum,
      "correct_sum": jnp.sum(weights * correct),
      "weight_sum": weight_sum,
  }
