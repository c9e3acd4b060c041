"""What guessing alone scores on pre-training records: the floor that a masked-LM or
next-sentence accuracy is read against (the demo's summary, the notebooks, the benchmarks)."""

from __future__ import annotations

import collections

import numpy as np

from bert_jax import file_io
from bert_jax.data import input_pipeline
from bert_jax.text import features


def guessing(files: list[str], max_seq_length: int, max_predictions: int) -> dict[str, float]:
  """What guessing alone scores on these records (packed or not): always the most frequent
  masked token (`mlm`), always the more frequent second-sentence label (`nsp`; for an objective
  that has one)."""
  tf = file_io.tensorflow()
  per_row = input_pipeline.detect_packing(files[0])
  spec = features.tf_feature_spec(max_seq_length, max_predictions, features.STATIC, per_row)
  tokens: collections.Counter = collections.Counter()
  labels: collections.Counter = collections.Counter()
  for batch in tf.data.TFRecordDataset(files).batch(1024).map(
      lambda s: tf.io.parse_example(s, spec)).as_numpy_iterator():
    tokens.update(np.asarray(batch["masked_lm_ids"][batch["masked_lm_weights"] > 0]).tolist())
    nsp = np.asarray(batch["next_sentence_labels"])
    if per_row:  # the instances' labels, not the empty slots'
      nsp = nsp[np.asarray(batch["next_sentence_weights"]) > 0]
    labels.update(nsp.ravel().tolist())

  def majority(counts):
    total = sum(counts.values())
    return counts.most_common(1)[0][1] / total if total else 0.0
  return {"mlm": majority(tokens), "nsp": majority(labels)}
