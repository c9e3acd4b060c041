"""Token tagging (CoNLL-2003 named entities, or any tag set in that layout) as a plug-in of the
training core.

The data side — the CoNLL files, tfds, IOB schemes, word pieces and windows, predictions back
to words, the prediction file — is `data.py` beside it; the score is `metrics.py`. This
module adds what training needs: the model, the features of a batch, and the loss over each
word's first piece (the paper's rule: other pieces, context, special tokens and padding weigh
0, through `label_weights`).

Two models, one objective:
- fine-tuning (the default): the encoder and a dense layer per token, all trained;
- `feature_based` (the paper's Table 7): the encoder frozen (no update, no optimizer state:
  `frozen_scopes`), the concatenated `feature_layers` read into a two-layer BiLSTM and a
  linear classifier, which are all that train.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import heads
from bert_jax.model.configuration import BertConfig
from bert_jax.tasks.classification import objective as sequence_classification
from bert_jax.text import features
from bert_jax.training import perf
from bert_jax.training.objective import Objective



@dataclasses.dataclass(frozen=True)
class TokenClassification(Objective):
  """One tag per word, read at the word's first piece."""
  num_labels: int
  max_seq_length: int = 128
  task_name: str = "conll2003"
  feature_based: bool = False
  feature_layers: tuple[int, ...] = (-1, -2, -3, -4)
  lstm_size: int = 768
  init_scopes = ("bert",)
  trim_batches = True  # padding columns no row uses are cut (they weigh 0 anyway)
  # No packing: windows already fill their rows with document context.
  max_sequences_per_row = None

  @property
  def name(self) -> str:
    return self.task_name

  @property
  def head_scopes(self) -> tuple[str, ...]:
    return ("tagger",) if self.feature_based else ("classifier",)

  @property
  def frozen_scopes(self) -> tuple[str, ...]:
    return ("bert",) if self.feature_based else ()

  def head_settings(self) -> dict[str, Any]:
    """What builds the head beside the tag count: a run records it in its checkpoint, so that
    evaluation without training and `predict` build the model the checkpoint holds."""
    return {"feature_based": self.feature_based, "feature_layers": list(self.feature_layers),
            "lstm_size": self.lstm_size}

  @classmethod
  def with_head_of(cls, settings: Mapping[str, Any], **fields) -> "TokenClassification":
    """The objective with the head `settings` describe (`head_settings()` as a run recorded
    them, or a fine-tuning config's fields); defaults where they name none."""
    head = {name: settings.get(name) for name in ("feature_based", "lstm_size")
            if settings.get(name) is not None}
    if settings.get("feature_layers"):
      head["feature_layers"] = tuple(int(i) for i in settings.get("feature_layers"))
    return cls(**fields, **head)

  def model(self, bert_config: BertConfig):
    if self.feature_based:
      return heads.BertFeatureBasedTagger(
          bert_config, self.num_labels,
          heads.check_feature_layers(bert_config, self.feature_layers), self.lstm_size)
    return heads.BertForTokenClassification(bert_config, self.num_labels)

  @property
  def input_names(self) -> tuple[str, ...]:
    return features.ENCODER_INPUTS

  def batch_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    tokens = jax.ShapeDtypeStruct((batch_size, self.max_seq_length), np.int32)
    return {**{k: tokens for k in features.ENCODER_INPUTS}, "label_ids": tokens,
            "label_weights": jax.ShapeDtypeStruct((batch_size, self.max_seq_length), np.float32),
            "weight": jax.ShapeDtypeStruct((batch_size,), np.float32)}

  def denominators(self, batch) -> dict[str, jax.Array]:
    """The loss is a mean over the batch's labelled words (not windows: a long window counts
    for as many words as it predicts)."""
    weights = batch["label_weights"] * batch["weight"][:, None]
    return {"words": jnp.maximum(jnp.sum(weights.astype(jnp.float32)), 1.0)}

  def loss(self, outputs, batch, denominators):
    weights = batch["label_weights"] * batch["weight"][:, None].astype(jnp.float32)
    out = token_classification_loss(outputs, batch["label_ids"], weights)
    return out["loss_sum"] / denominators["words"], {k: v for k, v in out.items() if k != "loss"}

  def summarize(self, sums: Mapping[str, Any]) -> dict[str, float]:
    n = max(float(sums.get("weight_sum", 0.0)), 1.0)
    return {"loss": float(sums["loss_sum"]) / n, "word_accuracy": float(sums["correct_sum"]) / n}

  def flops_per_step(self, bert_config: BertConfig, batch_size: int) -> float:
    tokens = batch_size * self.max_seq_length
    forward = perf.encoder_forward_flops(bert_config, batch_size, self.max_seq_length)
    if not self.feature_based:
      return perf.training_flops(forward + tokens * 2 * bert_config.hidden_size * self.num_labels)
    # The frozen encoder runs forward only; the BiLSTMs (4 gate matmuls on input and state per
    # direction) and the classifier train.
    width = bert_config.hidden_size * len(self.feature_layers)
    lstm = 0
    for _ in range(2):
      lstm += 2 * tokens * 2 * 4 * self.lstm_size * (width + self.lstm_size)
      width = 2 * self.lstm_size
    head = tokens * 2 * width * self.num_labels
    return forward + perf.training_flops(lstm + head)


# --------------------------------------------------------------------------------------- the loss
def token_classification_loss(logits: jax.Array, label_ids: jax.Array,
                              label_weights: jax.Array) -> dict[str, jax.Array]:
  """Softmax cross-entropy at the positions of weight 1 (each word's first piece); the other
  pieces, context, special tokens and padding weigh 0. Sums over words, for exact averages:
  the classifier's weighted loss, per token."""
  return sequence_classification.classification_loss(logits, label_ids, label_weights)
