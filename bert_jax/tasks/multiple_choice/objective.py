"""Multiple choice (SWAG, HellaSwag) as a plug-in of the training core.

The data side — the SWAG CSV and HellaSwag JSONL readers, the (context, ending) pairs, the
prediction file — is `data.py` beside it. This module adds what training needs: the model (one
score per pair from the pooled [CLS], the paper's Section 4.4), the features of a batch
(batch, choices, length), and the softmax cross-entropy over the choices.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import numpy as np

from bert_jax.model import heads
from bert_jax.model.configuration import BertConfig
from bert_jax.tasks.classification import objective as sequence_classification
from bert_jax.text import features
from bert_jax.training import perf
from bert_jax.training.objective import Objective, per_example_averages



@dataclasses.dataclass(frozen=True)
class MultipleChoice(Objective):
  """The right ending among `num_choices`."""
  num_choices: int = 4
  max_seq_length: int = 128
  task_name: str = "swag"
  head_scopes = ("classifier",)
  init_scopes = ("bert",)
  trim_batches = True  # padding columns no pair of the batch uses are cut (results unchanged)
  max_sequences_per_row = None

  def __post_init__(self):
    if self.num_choices < 2:
      raise ValueError(f"num_choices={self.num_choices}: a choice needs at least 2 endings.")

  @property
  def name(self) -> str:
    return self.task_name

  def model(self, bert_config: BertConfig) -> heads.BertForMultipleChoice:
    return heads.BertForMultipleChoice(bert_config)

  @property
  def input_names(self) -> tuple[str, ...]:
    return features.ENCODER_INPUTS

  def batch_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    pairs = jax.ShapeDtypeStruct((batch_size, self.num_choices, self.max_seq_length), np.int32)
    return {**{k: pairs for k in features.ENCODER_INPUTS},
            "label": jax.ShapeDtypeStruct((batch_size,), np.int32),
            "weight": jax.ShapeDtypeStruct((batch_size,), np.float32)}

  def loss(self, outputs, batch, denominators):
    out = sequence_classification.classification_loss(outputs, batch["label"], batch["weight"])
    return out["loss_sum"] / denominators["examples"], {k: v for k, v in out.items()
                                                        if k != "loss"}

  def summarize(self, sums: Mapping[str, Any]) -> dict[str, float]:
    return per_example_averages(sums)

  def flops_per_step(self, bert_config: BertConfig, batch_size: int) -> float:
    rows = batch_size * self.num_choices
    h = bert_config.hidden_size
    forward = perf.encoder_forward_flops(bert_config, rows, self.max_seq_length)
    return perf.training_flops(forward + rows * (2 * h * h + 2 * h))
