"""A fine-tuned multiple-choice model choosing among new endings (`predict --mode=choose`):
each (context, ending) pair built as fine-tuning builds it, the most probable ending and every
ending's probability."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from bert_jax import inference
from bert_jax.tasks.finetuned import (CheckpointInfo, FinetunedModel, PredictError, check_length,
                                      run_model)
from bert_jax.tasks.multiple_choice import data as swag
from bert_jax.tasks.multiple_choice import objective as multiple_choice
from bert_jax.text import tokenization


def plugin(info: CheckpointInfo) -> multiple_choice.MultipleChoice:
  """The plug-in the model was trained as: its recorded number of endings (SWAG's 4 if none)."""
  return multiple_choice.MultipleChoice(int(info.metadata.get("num_choices") or 4))


def head(info: CheckpointInfo) -> str:
  return plugin(info).head_scopes[0]


def model(info: CheckpointInfo, config, params):
  del params
  return plugin(info).model(config)


def choose(model: FinetunedModel, tokenizer: tokenization.Tokenizer, examples: Sequence[Any],
           max_seq_length: int = 128, batch_size: int = 32) -> list[dict[str, Any]]:
  """Per example: the `choice` (index of the most probable ending), its `ending` and every
  ending's `probabilities`, paired as fine-tuning pairs them (`swag.featurize`)."""
  check_length(max_seq_length, model.config)
  wanted = int(model.info.metadata.get("num_choices") or 0)
  for example in examples:
    if wanted and len(example.endings) != wanted:
      raise PredictError(f"{example.source}: {len(example.endings)} endings, but the model "
                         f"{model.info.path} chooses among {wanted}.")
  feats = swag.featurize(examples, tokenizer, max_seq_length)
  logits = run_model(model.module, model.params, feats, batch_size, trim=True,
                     desc="choose")
  results = []
  for example, probs in zip(examples, inference.softmax(logits)):
    best = int(np.argmax(probs))
    out = {"id": example.example_id, "context": example.context,
           "endings": [" ".join(p for p in (example.start, e) if p) for e in example.endings],
           "choice": best, "probabilities": [float(p) for p in probs]}
    out["ending"] = out["endings"][best]
    if example.label is not None:
      out["label"] = int(example.label)
    results.append(out)
  return results


def format_choice(result: dict[str, Any]) -> str:
  lines = [f"[{result['id']}] {result['context']}"]
  for i, (ending, p) in enumerate(zip(result["endings"], result["probabilities"])):
    mark = "*" if i == result["choice"] else " "
    lines.append(f" {mark}{i}. {ending}  {p:.1%}")
  return "\n".join(lines)
