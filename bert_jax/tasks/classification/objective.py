"""GLUE classification / regression (and custom TSV tasks) as a plug-in of the training core.

The data side — files, labels, metrics, prediction files — is `data.py` beside it; this module
adds what training needs: the model (encoder + a dense layer on the pooled [CLS] vector, as
`run_classifier.py`), the features of a batch, and the loss and accuracy sums.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import heads
from bert_jax.model.configuration import BertConfig
from bert_jax.tasks.classification import data as glue
from bert_jax.text import pairs, unknown_tokens
from bert_jax.text import features
from bert_jax.training import perf
from bert_jax.training.objective import Objective, per_example_averages

def _labels_array(task: glue.Task, examples: Sequence[glue.Example]) -> np.ndarray:
  """Targets; unlabelled examples (prediction splits) get 0, never scored."""
  if task.is_regression:
    return np.asarray([float(e.label) if e.label is not None else 0.0 for e in examples],
                      np.float32)
  index = {name: i for i, name in enumerate(task.label_list)}
  return np.asarray([index[str(e.label)] if e.label is not None else 0 for e in examples],
                    np.int32)


def featurize(task: glue.Task, examples: Sequence[glue.Example], tokenizer,
              max_seq_length: int) -> dict[str, np.ndarray]:
  """Examples → `input_ids`, `input_mask`, `segment_ids`, `label`, `weight` arrays."""
  feats = pairs.encode_examples(tokenizer, [e.text_a for e in examples],
                                [e.text_b for e in examples], max_seq_length)
  # A vocabulary that does not fit the text turns it into [UNK]s: said, not trained on.
  unknown_tokens.check_unknown_rate(tokenizer, *unknown_tokens.count_unknown(
      tokenizer, feats["input_ids"]), f"{task.name} examples")
  feats["label"] = _labels_array(task, examples)
  feats["weight"] = np.ones(len(examples), np.float32)
  return feats


def to_predictions(task: glue.Task, logits: np.ndarray) -> np.ndarray:
  """Logits → label indices, or the scores of a regression task."""
  return logits.reshape(-1) if task.is_regression else np.argmax(logits, axis=-1)


@dataclasses.dataclass(frozen=True)
class SequenceClassification(Objective):
  """One label (or one score) per sentence or sentence pair.

  With `max_sequences_per_row` (fine-tuning's `packing`), batches are packed rows
  (`data/packed_examples.py`): the model reads each example's [CLS] at `cls_positions`, and
  `label` / `weight` are (rows, k), weight 0 in unused slots, so the loss is still the mean over
  examples.
  """
  task: glue.Task
  max_seq_length: int = 128
  max_sequences_per_row: int | None = None  # None: one example per row
  head_scopes = ("classifier",)
  init_scopes = ("bert",)
  trim_batches = True  # padding columns no row uses are cut (results unchanged)

  @property
  def name(self) -> str:
    return self.task.name

  @property
  def num_labels(self) -> int:
    return self.task.num_labels

  def model(self, bert_config: BertConfig) -> heads.BertForSequenceClassification:
    return heads.BertForSequenceClassification(bert_config, self.num_labels)

  @property
  def input_names(self) -> tuple[str, ...]:
    if self.max_sequences_per_row:
      return features.ENCODER_INPUTS + (features.POSITION_IDS, features.SEQUENCE_IDS,
                                        features.CLS_POSITIONS)
    return features.ENCODER_INPUTS

  def batch_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    tokens = jax.ShapeDtypeStruct((batch_size, self.max_seq_length), np.int32)
    label = np.float32 if self.task.is_regression else np.int32
    per_example = (batch_size,)
    spec = {k: tokens for k in features.ENCODER_INPUTS}
    if self.max_sequences_per_row:
      per_example = (batch_size, self.max_sequences_per_row)
      spec.update({features.POSITION_IDS: tokens, features.SEQUENCE_IDS: tokens,
                   features.CLS_POSITIONS: jax.ShapeDtypeStruct(per_example, np.int32)})
    return {**spec, "label": jax.ShapeDtypeStruct(per_example, label),
            "weight": jax.ShapeDtypeStruct(per_example, np.float32)}

  def featurize(self, examples: Sequence[glue.Example], tokenizer) -> dict[str, np.ndarray]:
    return featurize(self.task, examples, tokenizer, self.max_seq_length)

  def loss(self, outputs, batch, denominators):
    labels, weights = batch["label"], batch["weight"]
    if self.max_sequences_per_row:  # (rows, k, outputs): one example per slot
      outputs = outputs.reshape(-1, outputs.shape[-1])
      labels, weights = labels.reshape(-1), weights.reshape(-1)
    if self.task.is_regression:
      out = regression_loss(outputs, labels, weights)
    else:
      out = classification_loss(outputs, labels, weights)
    sums = {k: v for k, v in out.items() if k != "loss"}
    return out["loss_sum"] / denominators["examples"], sums

  def summarize(self, sums: Mapping[str, Any]) -> dict[str, float]:
    return per_example_averages(sums)

  def flops_per_step(self, bert_config: BertConfig, batch_size: int) -> float:
    h = bert_config.hidden_size
    forward = perf.encoder_forward_flops(bert_config, batch_size, self.max_seq_length)
    forward += batch_size * (2 * h * h + 2 * h * self.num_labels)
    return perf.training_flops(forward)


# --------------------------------------------------------------------------------------- the loss
def classification_loss(logits: jax.Array, labels: jax.Array,
                        weights: jax.Array) -> dict[str, jax.Array]:
  """Weighted softmax cross-entropy over the last axis, for labels of any shape (one per
  example, one per choice set, one per token); weight 0 marks what is not scored: padding
  examples of a partial batch, the tokens a tagger does not label."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  labels = labels.astype(jnp.int32)
  per_example = -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
  weights = weights.astype(jnp.float32)
  weight_sum = jnp.sum(weights)
  loss_sum = jnp.sum(weights * per_example)
  correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
  return {"loss": loss_sum / jnp.maximum(weight_sum, 1.0), "loss_sum": loss_sum,
          "correct_sum": jnp.sum(weights * correct), "weight_sum": weight_sum}


def regression_loss(predictions: jax.Array, targets: jax.Array,
                    weights: jax.Array) -> dict[str, jax.Array]:
  """Weighted mean squared error of a one-output head (as transformers does for STS-B)."""
  predictions = predictions.reshape(-1).astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  loss_sum = jnp.sum(weights * jnp.square(predictions - targets.astype(jnp.float32)))
  weight_sum = jnp.sum(weights)
  return {"loss": loss_sum / jnp.maximum(weight_sum, 1.0), "loss_sum": loss_sum,
          "weight_sum": weight_sum}
