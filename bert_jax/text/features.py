"""The pre-training TFRecord schema: feature names, dtypes and shapes, defined once.

The writer (`data_prep/create_pretraining_data.py`) and the reader (`input_pipeline.py`) both
take the schema from here, so they cannot drift apart. Static records carry the same seven
features as the original `create_pretraining_data.py`, so records written by either tool are read
by the other:

    input_ids, input_mask, segment_ids    int64  [max_seq_length]
    masked_lm_positions, masked_lm_ids    int64  [max_predictions_per_seq]
    masked_lm_weights                     float32[max_predictions_per_seq]
    next_sentence_labels                  int64  [1]   (1: segment B is a random segment)

Dynamic-masking records carry the unmasked `input_ids`, `input_mask`, `segment_ids`,
`next_sentence_labels` and `word_starts` (int64 [max_seq_length], 1 where a token begins a word,
which is all that whole-word masking needs), and the input pipeline draws fresh masks each time it
reads them (`masking.py`).

Packed records (`max_sequences_per_row=K`, written by `data_prep --packing`; see
`bert_jax/data/packing.py`) lay several instances back to back in a row and add what keeps them
apart; `input_ids`, `input_mask`, `segment_ids` keep their meaning, and:

    position_ids, sequence_ids            int64  [max_seq_length]  (restart at 0 per instance;
                                                                    1..k per instance, 0 padding)
    masked_lm_positions, masked_lm_ids    int64  [max_predictions_per_seq]  (static: positions
    masked_lm_weights                     float32[max_predictions_per_seq]   in the row)
    cls_positions, next_sentence_labels   int64  [K]  (each instance's [CLS] and label)
    next_sentence_weights                 float32[K]  (1 for an instance, 0 for an unused slot)

For packed data `max_predictions_per_seq` is the budget of a whole row (e.g. 80 at 512): each
instance gets its own min(max_predictions_per_seq, max(1, round(length * masked_lm_prob)))
predictions, as unpacked, and rows are packed so that their instances' predictions fit. Dynamic
packed records carry the unmasked features, `word_starts` and the packing features.

Records of this schema are written as bytes by `bert_jax/data/tfrecords.py`
(`encode_examples`: `tf.train.Example` protos and their TFRecord framing, without TensorFlow).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

INPUT_IDS = "input_ids"
INPUT_MASK = "input_mask"
SEGMENT_IDS = "segment_ids"
MASKED_LM_POSITIONS = "masked_lm_positions"
MASKED_LM_IDS = "masked_lm_ids"
MASKED_LM_WEIGHTS = "masked_lm_weights"
NEXT_SENTENCE_LABELS = "next_sentence_labels"
WORD_STARTS = "word_starts"
# Packed rows (several `[CLS] A [SEP] B [SEP]` instances per row; see `pretraining_features`):
POSITION_IDS = "position_ids"            # [max_seq_length]: restart at 0 for each instance
SEQUENCE_IDS = "sequence_ids"            # [max_seq_length]: 1..k per instance, 0 on padding
CLS_POSITIONS = "cls_positions"          # [max_sequences_per_row]: each instance's [CLS]
NEXT_SENTENCE_WEIGHTS = "next_sentence_weights"  # [max_sequences_per_row]: 1 real, 0 unused

# What every encoder-based model reads, in its `__call__` order.
ENCODER_INPUTS = (INPUT_IDS, INPUT_MASK, SEGMENT_IDS)

STATIC, DYNAMIC = "static", "dynamic"
MASKING_MODES = (STATIC, DYNAMIC)


@dataclasses.dataclass(frozen=True)
class Feature:
  name: str
  dtype: str  # "int64" or "float32", as stored in the record
  length: int


def pretraining_features(max_seq_length: int, max_predictions_per_seq: int,
                         masking: str = STATIC, max_sequences_per_row: int | None = None
                         ) -> tuple[Feature, ...]:
  """The features of one pre-training record, in the order the original wrote them; packed
  rows (`max_sequences_per_row` given) with the features that keep their instances apart."""
  if masking not in MASKING_MODES:
    raise ValueError(f"masking must be one of {MASKING_MODES}, not {masking!r}.")
  if max_sequences_per_row is not None:
    return packed_pretraining_features(max_seq_length, max_predictions_per_seq,
                                       max_sequences_per_row, masking)
  sequence = (Feature(INPUT_IDS, "int64", max_seq_length),
              Feature(INPUT_MASK, "int64", max_seq_length),
              Feature(SEGMENT_IDS, "int64", max_seq_length))
  if masking == STATIC:
    return sequence + (Feature(MASKED_LM_POSITIONS, "int64", max_predictions_per_seq),
                       Feature(MASKED_LM_IDS, "int64", max_predictions_per_seq),
                       Feature(MASKED_LM_WEIGHTS, "float32", max_predictions_per_seq),
                       Feature(NEXT_SENTENCE_LABELS, "int64", 1))
  return sequence + (Feature(NEXT_SENTENCE_LABELS, "int64", 1),
                     Feature(WORD_STARTS, "int64", max_seq_length))


def packed_pretraining_features(max_seq_length: int, max_predictions_per_seq: int,
                                max_sequences_per_row: int, masking: str = STATIC
                                ) -> tuple[Feature, ...]:
  """The features of one packed row of up to `max_sequences_per_row` instances."""
  if masking not in MASKING_MODES:
    raise ValueError(f"masking must be one of {MASKING_MODES}, not {masking!r}.")
  if max_sequences_per_row < 1:
    raise ValueError(f"max_sequences_per_row={max_sequences_per_row}: must be at least 1.")
  k = max_sequences_per_row
  sequence = (Feature(INPUT_IDS, "int64", max_seq_length),
              Feature(INPUT_MASK, "int64", max_seq_length),
              Feature(SEGMENT_IDS, "int64", max_seq_length),
              Feature(POSITION_IDS, "int64", max_seq_length),
              Feature(SEQUENCE_IDS, "int64", max_seq_length))
  per_sequence = (Feature(CLS_POSITIONS, "int64", k),
                  Feature(NEXT_SENTENCE_LABELS, "int64", k),
                  Feature(NEXT_SENTENCE_WEIGHTS, "float32", k))
  if masking == STATIC:
    return sequence + (Feature(MASKED_LM_POSITIONS, "int64", max_predictions_per_seq),
                       Feature(MASKED_LM_IDS, "int64", max_predictions_per_seq),
                       Feature(MASKED_LM_WEIGHTS, "float32", max_predictions_per_seq)
                       ) + per_sequence
  return sequence + per_sequence + (Feature(WORD_STARTS, "int64", max_seq_length),)


def tf_feature_spec(max_seq_length: int, max_predictions_per_seq: int,
                    masking: str = STATIC, max_sequences_per_row: int | None = None) -> dict:
  """`{name: tf.io.FixedLenFeature}` for `tf.io.parse_example` (imports TensorFlow)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  dtypes = {"int64": tf.int64, "float32": tf.float32}
  return {f.name: tf.io.FixedLenFeature([f.length], dtypes[f.dtype])
          for f in pretraining_features(max_seq_length, max_predictions_per_seq, masking,
                                        max_sequences_per_row)}


def check_batch(batch: Mapping[str, np.ndarray], features: Sequence[Feature]) -> int:
  """Number of rows; raises naming the feature when a shape disagrees with the schema."""
  rows = None
  for f in features:
    if f.name not in batch:
      raise KeyError(f"feature {f.name!r} is missing (have {sorted(batch)}).")
    shape = np.shape(batch[f.name])
    if len(shape) != 2 or shape[1] != f.length:
      raise ValueError(f"feature {f.name!r}: expected shape (rows, {f.length}), got {shape}.")
    if rows is None:
      rows = shape[0]
    elif shape[0] != rows:
      raise ValueError(f"feature {f.name!r}: {shape[0]} rows, other features have {rows}.")
  return rows or 0
