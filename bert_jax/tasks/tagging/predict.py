"""A fine-tuned tagger applied to raw text (`predict --mode=tag`): text split into words as
CoNLL splits them, each word tagged at its first piece with the document context the tagger was
trained with, the entities its tags make, and each tag's probability."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from bert_jax import inference
from bert_jax.tasks.finetuned import (CheckpointInfo, FinetunedModel, PredictError, check_length,
                                      run_model)
from bert_jax.tasks.tagging import data as conll
from bert_jax.tasks.tagging import metrics as conlleval
from bert_jax.tasks.tagging import objective as token_classification
from bert_jax.text import tokenization


def plugin(info: CheckpointInfo) -> token_classification.TokenClassification:
  """The tagging plug-in a fine-tuned tagger was trained as (its tags and head settings)."""
  meta = info.metadata
  labels = meta.get("label_list")
  if not labels:
    raise PredictError(f"{info.path}: a tagger that records no tag list (task "
                                 f"{info.task!r}).")
  return token_classification.TokenClassification.with_head_of(
      meta, num_labels=len(labels), task_name=str(info.task))


def head(info: CheckpointInfo) -> str:
  return plugin(info).head_scopes[0]


def model(info: CheckpointInfo, config, params):
  del params
  return plugin(info).model(config)


def sentences_from_text(texts: Sequence[str], source: str = "--text") -> list[Any]:
  """Raw text → sentences of words (`conll.split_words`, CoNLL-style: punctuation apart), one
  per non-empty line; a blank line starts a new document (what document context reads)."""
  sentences, document, line_number = [], 0, 0
  for text in texts:
    for line in text.split("\n"):
      line_number += 1
      words = conll.split_words(line)
      if not words:
        document += bool(sentences)
        continue
      sentences.append(conll.Sentence(words=tuple(words), labels=None, document=document,
                                      source=f"{source}:{line_number}", original_labels=None))
  return sentences


def tag(model: FinetunedModel, tokenizer: tokenization.Tokenizer, sentences: Sequence[Any],
        max_seq_length: int = 128, batch_size: int = 32) -> list[dict[str, Any]]:
  """Per sentence: its `words`, one `tags` entry per word (IOB2), each tag's `probability`,
  and the `entities` (type, text, first and last word) as conlleval reads the tags. Windows and
  document context are fine-tuning's own, so the tags equal its prediction files'."""
  check_length(max_seq_length, model.config)
  if not sentences:
    raise PredictError("No words to tag.")
  labels = list(model.info.metadata["label_list"])
  features = conll.convert_to_features(
      sentences, tokenizer, labels, max_seq_length,
      document_context=bool(model.info.metadata.get("document_context", False)), progress=False)
  logits = run_model(model.module, model.params, features.arrays, batch_size,
                     trim=False, desc="tag")
  predicted = np.argmax(logits, axis=-1)
  tags = conll.words_from_predictions(features, predicted, labels)
  probs = inference.softmax(logits).max(-1)
  word_probability = [[0.0] * n for n in features.num_words]
  for row, sentence in enumerate(features.sentence_index):
    for position in np.flatnonzero(features.word_index[row] >= 0):
      word_probability[sentence][features.word_index[row, position]] = float(probs[row, position])
  results = []
  for i, sentence in enumerate(sentences):
    entities = [{"type": kind, "text": " ".join(sentence.words[first:last + 1]),
                 "first_word": first, "last_word": last}
                for kind, first, last in conlleval.chunks(tags[i])]
    results.append({"words": list(sentence.words), "tags": tags[i],
                    "probabilities": word_probability[i], "entities": entities})
  return results


def format_tags(result: dict[str, Any]) -> str:
  lines = [" ".join(f"{w}/{t}" if t != "O" else w for w, t in zip(result["words"], result["tags"]))]
  for entity in result["entities"]:
    lines.append(f"  {entity['type']}: {entity['text']}")
  return "\n".join(lines)
