"""SQuAD v1.1 / v2.0 answer spans as a plug-in of the training core.

The data side — reading the official JSON or tfds, sliding windows, answer maps, n-best
post-processing, prediction files — is `tasks/squad.py`, the official scores
`tasks/squad_eval.py`; this module adds the model (a start and an end logit per token, as `run_squad.py`), the features
of a batch and the original's span loss. Batches keep their full length: the original's softmax
runs over every position, padding included.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import numpy as np

from bert_jax.model import heads
from bert_jax.model.configuration import BertConfig
from bert_jax.text import features
from bert_jax.training import perf
from bert_jax.training.objective import Objective, per_example_averages

@dataclasses.dataclass(frozen=True)
class SquadSpans(Objective):
  """Start and end of the answer span in each window (`[CLS]` for no answer)."""
  max_seq_length: int = 384
  version_2_with_negative: bool = False
  head_scopes = ("qa_outputs",)
  init_scopes = ("bert",)
  trim_batches = False

  @property
  def name(self) -> str:
    return f"squad {'v2.0' if self.version_2_with_negative else 'v1.1'}"

  def model(self, bert_config: BertConfig) -> heads.BertForQuestionAnswering:
    return heads.BertForQuestionAnswering(bert_config)

  @property
  def input_names(self) -> tuple[str, ...]:
    return features.ENCODER_INPUTS

  def batch_spec(self, batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
    tokens = jax.ShapeDtypeStruct((batch_size, self.max_seq_length), np.int32)
    position = jax.ShapeDtypeStruct((batch_size,), np.int32)
    return {**{k: tokens for k in features.ENCODER_INPUTS}, "start_positions": position,
            "end_positions": position,
            "weight": jax.ShapeDtypeStruct((batch_size,), np.float32)}

  def loss(self, outputs, batch, denominators):
    start_logits, end_logits = outputs
    out = heads.span_loss(start_logits, end_logits, batch["start_positions"],
                          batch["end_positions"], batch["weight"])
    sums = {k: v for k, v in out.items() if k != "loss"}
    return out["loss_sum"] / denominators["examples"], sums

  def summarize(self, sums: Mapping[str, Any]) -> dict[str, float]:
    return per_example_averages(sums)

  def flops_per_step(self, bert_config: BertConfig, batch_size: int) -> float:
    forward = perf.encoder_forward_flops(bert_config, batch_size, self.max_seq_length)
    forward += batch_size * self.max_seq_length * 2 * bert_config.hidden_size * 2
    return perf.training_flops(forward)
