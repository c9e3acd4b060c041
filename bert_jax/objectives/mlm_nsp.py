"""BERT's pre-training objective: masked-LM + next-sentence prediction (Devlin et al. 2019).

The loss is the original's: the masked-LM cross-entropy weighted by `masked_lm_weights` and
divided by `sum(weights) + 1e-5`, plus the mean next-sentence cross-entropy. Both divisors are
taken over the whole batch (`denominators`), so accumulated micro-batches add up to the loss of
the whole batch. This is the one pre-training loss: training, evaluation, the tests and the
benchmarks all call it.

With `packed=True` a batch row holds several instances (Krell et al. 2021, "Efficient Sequence
Packing without Cross-contamination"): the model reads `position_ids`, `sequence_ids` and
`cls_positions` besides the usual inputs, next-sentence labels come per instance
(`max_sequences_per_row` slots per row, `next_sentence_weights` 1 for a real instance, 0 for an
unused slot), and the next-sentence mean is over real instances. The same instances packed or
not give the same loss and gradients.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

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


@dataclasses.dataclass(frozen=True)
class MaskedLmNextSentence(Objective):
  """Masked-LM at `masked_lm_positions` + next-sentence prediction on the pooled [CLS].

  `packed`: rows of several instances (see the module docstring); `max_predictions_per_seq` is
  then the prediction budget of a whole row, and `max_sequences_per_row` its instance slots.
  """
  max_seq_length: int = 128
  max_predictions_per_seq: int = 20
  name: str = "mlm_nsp"
  packed: bool = False
  max_sequences_per_row: int = 1
  head_scopes = ("cls",)

  def __post_init__(self):
    if self.packed and self.max_sequences_per_row < 1:
      raise ValueError(f"max_sequences_per_row={self.max_sequences_per_row}: a packed row "
                       "holds at least one instance.")

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
    # Static records carry the masks; dynamic ones get them drawn by the pipeline, so a batch
    # always has the static layout.
    spec = batch_spec_from_schema(features.pretraining_features(
        self.max_seq_length, self.max_predictions_per_seq, features.STATIC), batch_size)
    if self.packed:
      per_token = jax.ShapeDtypeStruct((batch_size, self.max_seq_length), np.int32)
      per_instance = jax.ShapeDtypeStruct((batch_size, self.max_sequences_per_row), np.int32)
      spec.update({
          features.POSITION_IDS: per_token,
          features.SEQUENCE_IDS: per_token,
          features.CLS_POSITIONS: per_instance,
          features.NEXT_SENTENCE_LABELS: per_instance,
          features.NEXT_SENTENCE_WEIGHTS: jax.ShapeDtypeStruct(
              (batch_size, self.max_sequences_per_row), np.float32)})
    return spec

  def _next_sentence_weights(self, batch):
    """1 per real instance: every row's one instance unpacked, the marked slots packed."""
    if not self.packed:
      return None
    return batch[features.NEXT_SENTENCE_WEIGHTS].astype(jnp.float32)

  def denominators(self, batch) -> dict[str, jax.Array]:
    weights = self._next_sentence_weights(batch)
    nsp = (jnp.asarray(batch[features.NEXT_SENTENCE_LABELS].shape[0], jnp.float32)
           if weights is None else jnp.maximum(jnp.sum(weights), 1.0))
    return {"mlm": jnp.sum(batch[features.MASKED_LM_WEIGHTS].astype(jnp.float32)) + 1e-5,
            "nsp": nsp}

  def loss(self, outputs, batch, denominators):
    mlm_logits, nsp_logits = outputs
    mlm = heads.masked_lm_loss(mlm_logits, batch[features.MASKED_LM_IDS],
                               batch[features.MASKED_LM_WEIGHTS])
    weights = self._next_sentence_weights(batch)
    nsp = heads.next_sentence_loss(nsp_logits, batch[features.NEXT_SENTENCE_LABELS], weights)
    loss = mlm["loss_sum"] / denominators["mlm"] + nsp["loss_sum"] / denominators["nsp"]
    random_next = batch[features.NEXT_SENTENCE_LABELS].astype(jnp.float32)
    if weights is not None:
      random_next = weights * random_next
    sums = {"mlm_loss_sum": mlm["loss_sum"], "mlm_correct_sum": mlm["correct_sum"],
            "mlm_weight_sum": mlm["weight_sum"], "nsp_loss_sum": nsp["loss_sum"],
            "nsp_correct_sum": nsp["correct_sum"], "nsp_count": nsp["weight_sum"],
            # For the majority-label baseline beside the accuracy.
            "nsp_random_next_sum": jnp.sum(random_next)}
    return loss, sums

  def summarize(self, sums: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    if "mlm_weight_sum" in sums:
      w = max(float(sums["mlm_weight_sum"]), 1e-5)
      out["mlm_loss"] = float(sums["mlm_loss_sum"]) / w
      out["mlm_accuracy"] = float(sums["mlm_correct_sum"]) / w
    if "nsp_count" in sums:
      n = max(float(sums["nsp_count"]), 1.0)
      out["nsp_loss"] = float(sums["nsp_loss_sum"]) / n
      out["nsp_accuracy"] = float(sums["nsp_correct_sum"]) / n
      if "nsp_random_next_sum" in sums:  # what always guessing the majority label scores
        random_next = float(sums["nsp_random_next_sum"]) / n
        out["nsp_majority_baseline"] = max(random_next, 1.0 - random_next)
    if "mlm_loss" in out and "nsp_loss" in out:
      out["loss"] = out["mlm_loss"] + out["nsp_loss"]
    return out

  def flops_per_step(self, bert_config: BertConfig, batch_size: int) -> float:
    """Encoder, plus the heads: pooler 2H² and NSP 4H per instance slot (one per row, or
    `max_sequences_per_row` packed), MLM transform 2H² and decoder 2HV at the masked positions
    only. Packed attention still computes every (query, key) pair of the row."""
    h, v = bert_config.hidden_size, bert_config.vocab_size
    instances = batch_size * (self.max_sequences_per_row if self.packed else 1)
    forward = perf.encoder_forward_flops(bert_config, batch_size, self.max_seq_length)
    forward += instances * (2 * h * h + 4 * h)
    forward += batch_size * self.max_predictions_per_seq * (2 * h * h + 2 * h * v)
    return perf.training_flops(forward)


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
