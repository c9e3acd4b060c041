"""A fine-tuned classifier applied to new texts (`predict --mode=classify`): each text or pair
encoded as fine-tuning encodes its examples, its label with probabilities (or a regression
score), label names from what the run recorded."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from absl import logging

from bert_jax import inference
from bert_jax.model import heads
from bert_jax.tasks.finetuned import (CheckpointInfo, FinetunedModel, PredictError, check_length,
                                      run_model)
from bert_jax.tasks.classification import data as glue
from bert_jax.tasks.classification import objective as sequence_classification
from bert_jax.text import pairs, tokenization

PAIR_SEPARATOR = inference.PAIR_SEPARATOR


def head(info: CheckpointInfo) -> str:
  del info  # every classifier's head is the same scope
  return sequence_classification.SequenceClassification.head_scopes[0]


def model(info: CheckpointInfo, config, params) -> heads.BertForSequenceClassification:
  """As many outputs as the stored head has."""
  num_labels = int(np.shape(params[head(info)]["kernel"])[-1])
  return heads.BertForSequenceClassification(config, num_labels)


def split_pair(text: str, text_b: str | None = None) -> tuple[str, str | None]:
  """`"premise ||| hypothesis"` → the two texts; a lone text stays single unless `text_b`."""
  if text_b is not None:
    return text, text_b
  if PAIR_SEPARATOR in text:
    a, b = text.split(PAIR_SEPARATOR, 1)
    return a.strip(), b.strip()
  return text, None


def read_classify_tsv(path: str, has_header: str = "auto", info: CheckpointInfo | None = None
                      ) -> list[tuple[str, str | None]]:
  """`text` or `text<TAB>text_b` per line; a header line by fine-tuning's rule
  (`glue.decide_header`: detected, or `--has_header`). With the checkpoint's `info`, a file in
  the training layout (a label column last) is read as the model reads: `glue.read_text_tsv`."""
  pairs, labels, regression = None, None, False
  if info is not None:
    labels = info.metadata.get("label_list")
    regression = info.metadata.get("num_labels") == 1 and not labels
    pairs = info.metadata.get("sentence_pairs")
    if pairs is None and info.task and info.task.lower() != "custom":
      try:  # a GLUE task says what it reads
        pairs = glue.get_task(info.task).labelled_layout.text_b is not None
      except ValueError:
        pass
  try:
    return glue.read_text_tsv(path, has_header, pairs, labels, regression)
  except ValueError as e:
    raise PredictError(str(e)) from None


def resolve_labels(model: FinetunedModel, task_name: str | None = None,
                   label_list: Sequence[str] | None = None) -> list[str] | None:
  """The label names in the head's order (None for regression): `--label_list`, else those of
  `--task_name`, else the ones the checkpoint records, else those of its recorded GLUE task,
  else class indices with a warning."""
  num_labels = model.num_labels
  if label_list:
    labels = list(label_list)
  else:
    labels = None if task_name else model.info.metadata.get("label_list")
  if labels is None:
    name = task_name or model.info.task
    if name and name.lower() != "custom":
      try:
        task = glue.get_task(name)
      except ValueError as e:
        raise PredictError(f"{model.info.path}: task {name!r}: {e} Pass --label_list.") from e
      labels = task.label_list
      if (1 if labels is None else len(labels)) != num_labels:
        raise PredictError(f"{model.info.path}: task {name} has "
                           f"{'one output' if labels is None else f'{len(labels)} labels'} but "
                           f"the model {num_labels} outputs; pass --task_name or --label_list.")
      return labels
    if num_labels == 1:
      return None
    logging.warning("%s does not record its label names (task %r): showing class indices; "
                    "pass --label_list=a,b,... for names.", model.info.path, name)
    return [str(i) for i in range(num_labels)]
  if num_labels == 1:
    raise PredictError(f"{model.info.path} is a regression model (one output); drop "
                       "--label_list.")
  if len(labels) != num_labels:
    raise PredictError(f"--label_list has {len(labels)} labels ({','.join(labels)}) but the "
                       f"model {model.info.path} has {num_labels} outputs.")
  return [str(label) for label in labels]


def classify(model: FinetunedModel, tokenizer: tokenization.Tokenizer,
             inputs: Sequence[tuple[str, str | None]], labels: list[str] | None,
             max_seq_length: int = 128, batch_size: int = 32) -> list[dict[str, Any]]:
  """Per input: `label`, `probability` and `probabilities` (label → probability), or `score`
  for a regression model; encoded exactly as fine-tuning encodes its examples."""
  check_length(max_seq_length, model.config)
  feats = pairs.encode_examples(tokenizer, [a for a, _ in inputs],
                                        [b for _, b in inputs], max_seq_length)
  feats["weight"] = np.ones(len(inputs), np.float32)
  logits = run_model(model.module, model.params, feats, batch_size, trim=True,
                     desc="classify")
  results = []
  for (a, b), row, probs in zip(inputs, np.asarray(logits, np.float64),
                                inference.softmax(logits)):
    out: dict[str, Any] = {"text": a}
    if b is not None:
      out["text_b"] = b
    if labels is None:
      out["score"] = float(row[0])
    else:
      best = int(np.argmax(probs))
      out.update(label=labels[best], probability=float(probs[best]),
                 probabilities={name: float(p) for name, p in zip(labels, probs)})
    results.append(out)
  return results


def format_classification(result: dict[str, Any]) -> str:
  text = result["text"] + (f" {PAIR_SEPARATOR} {result['text_b']}" if "text_b" in result else "")
  if "score" in result:
    return f"{text}\n  score: {result['score']:.4f}"
  shown = ", ".join(f"{name} {p:.1%}" for name, p in result["probabilities"].items())
  return f"{text}\n  {result['label']} ({result['probability']:.1%})   [{shown}]"
