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

`encode_examples` serialises `tf.train.Example` protos without TensorFlow: the data-prep workers
stay small and start fast, and the bytes are what TensorFlow itself parses (packed int64 varints
and little-endian float32, the proto wire format).
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

STATIC, DYNAMIC = "static", "dynamic"
MASKING_MODES = (STATIC, DYNAMIC)


@dataclasses.dataclass(frozen=True)
class Feature:
  name: str
  dtype: str  # "int64" or "float32", as stored in the record
  length: int


def pretraining_features(max_seq_length: int, max_predictions_per_seq: int,
                         masking: str = STATIC) -> tuple[Feature, ...]:
  """The features of one pre-training record, in the order the original wrote them."""
  if masking not in MASKING_MODES:
    raise ValueError(f"masking must be one of {MASKING_MODES}, not {masking!r}.")
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


def tf_feature_spec(max_seq_length: int, max_predictions_per_seq: int,
                    masking: str = STATIC) -> dict:
  """`{name: tf.io.FixedLenFeature}` for `tf.io.parse_example` (imports TensorFlow)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  dtypes = {"int64": tf.int64, "float32": tf.float32}
  return {f.name: tf.io.FixedLenFeature([f.length], dtypes[f.dtype])
          for f in pretraining_features(max_seq_length, max_predictions_per_seq, masking)}


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


# ---------------------------------------------------------------------------------------------
# tf.train.Example wire format, written with numpy.


def _varint(n: int) -> bytes:
  out = bytearray()
  while True:
    byte = n & 0x7F
    n >>= 7
    if n:
      out.append(byte | 0x80)
    else:
      out.append(byte)
      return bytes(out)



_SMALL_VARINTS: list = [None, None]


def _small_varint_table(high: int) -> tuple[np.ndarray, np.ndarray]:
  """Varint bytes (padded to 3) and sizes of 0..n, n ≥ high, built once per size class."""
  table, sizes = _SMALL_VARINTS
  if table is None or len(table) <= high:
    n = 1 << max(16, int(high).bit_length())
    v = np.arange(n, dtype=np.uint32)
    sizes = (1 + (v >= 1 << 7) + (v >= 1 << 14)).astype(np.int8)
    table = np.empty((n, 3), np.uint8)
    for k in range(3):
      table[:, k] = ((v >> (7 * k)) & 0x7F) | ((sizes > k + 1).astype(np.uint8) << 7)
    _SMALL_VARINTS[:] = [table, sizes]
  return table, sizes


def _varint_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Packed varints of each row of a non-negative int array: (all bytes, row end offsets)."""
  v = np.asarray(values)
  rows, length = v.shape
  if not v.size:
    return np.zeros(0, np.uint8), np.zeros(rows, np.int64)
  low, high = int(v.min()), int(v.max())
  if low < 0 or high >= 1 << 35:
    raise ValueError("int64 features must lie in [0, 2**35) here (token ids, positions, flags).")
  if high < 0x80:  # masks, segment ids, labels: one byte each
    return v.astype(np.uint8).reshape(-1), np.arange(1, rows + 1, dtype=np.int64) * length
  if high < 1 << 21:  # token ids and positions: look the bytes up
    table, sizes = _small_varint_table(high)
    nbytes = sizes[v]
    keep = np.arange(3, dtype=np.int8) < nbytes[..., None]
    return table[v][keep], np.cumsum(nbytes.sum(axis=1, dtype=np.int64))
  width = 4 if high < 1 << 28 else 5
  v = v.astype(np.uint32 if width == 4 else np.uint64)
  nbytes = np.ones(v.shape, np.int8)
  for k in range(1, width):
    nbytes += v >= (1 << (7 * k))
  out = np.empty(v.shape + (width,), np.uint8)
  for k in range(width):
    low7 = ((v >> (7 * k)) & 0x7F).astype(np.uint8)
    out[..., k] = low7 | ((nbytes > k + 1).view(np.uint8) << 7)
  keep = np.arange(width, dtype=np.int8) < nbytes[..., None]
  return out[keep], np.cumsum(nbytes.sum(axis=1, dtype=np.int64))


def _assemble(parts: Sequence[tuple[np.ndarray, np.ndarray]],
              rows: int) -> tuple[np.ndarray, np.ndarray]:
  """Concatenates, row by row, byte parts given as (flat bytes in row order, per-row lengths).

  Returns one buffer with all rows back to back and the row end offsets. Every byte is placed by
  one vectorised scatter per part, so the cost per row is a few array operations, not a Python
  loop over fields.
  """
  lengths = np.stack([length for _, length in parts])            # (parts, rows)
  row_lengths = lengths.sum(axis=0)
  row_ends = np.cumsum(row_lengths)
  row_starts = row_ends - row_lengths
  part_starts = row_starts + np.cumsum(lengths, axis=0) - lengths  # (parts, rows)
  out = np.empty(int(row_ends[-1]) if rows else 0, np.uint8)
  for (flat, length), dest_start in zip(parts, part_starts):
    if not flat.size:
      continue
    src_starts = np.cumsum(length) - length
    dest = np.repeat(dest_start - src_starts, length) + np.arange(flat.size)
    out[dest] = flat
  return out, row_ends


def _varint_column(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  flat, ends = _varint_rows(np.asarray(values).reshape(-1, 1))
  return flat, np.diff(ends, prepend=0)


def _constant(data: bytes, rows: int) -> tuple[np.ndarray, np.ndarray]:
  return np.tile(np.frombuffer(data, np.uint8), rows), np.full(rows, len(data), np.int64)


def _varint_size(n: np.ndarray) -> np.ndarray:
  size = np.ones(n.shape, np.int64)
  for k in range(1, 5):
    size += n >= (1 << (7 * k))
  return size


def encode_examples_flat(batch: Mapping[str, np.ndarray],
                         features: Sequence[Feature]) -> tuple[np.ndarray, np.ndarray]:
  """Serialised `tf.train.Example`s back to back in one buffer, and each one's end offset."""
  rows = check_batch(batch, features)
  # The proto nests: Example{features: Features{feature: map entry{key, value: Feature{
  # int64_list|float_list: {value: packed}}}}}; every level is a tag, a varint length, the body.
  parts, body = [], np.zeros(rows, np.int64)
  for f in features:
    if f.dtype == "float32":
      data = np.ascontiguousarray(batch[f.name], dtype="<f4").reshape(-1).view(np.uint8)
      payload = (data, np.full(rows, 4 * f.length, np.int64))
    else:
      flat, ends = _varint_rows(batch[f.name])
      payload = (flat, np.diff(ends, prepend=0))
    values_len = 1 + _varint_size(payload[1]) + payload[1]
    feature_len = 1 + _varint_size(values_len) + values_len
    key = b"\x0a" + _varint(len(f.name)) + f.name.encode() + b"\x12"
    entry_len = len(key) + _varint_size(feature_len) + feature_len
    body += 1 + _varint_size(entry_len) + entry_len
    kind = b"\x12" if f.dtype == "float32" else b"\x1a"  # Feature oneof: float_list 2, int64_list 3
    parts += [_constant(b"\x0a", rows), _varint_column(entry_len), _constant(key, rows),
              _varint_column(feature_len), _constant(kind, rows), _varint_column(values_len),
              _constant(b"\x0a", rows), _varint_column(payload[1]), payload]
  parts = [_constant(b"\x0a", rows), _varint_column(body)] + parts
  return _assemble(parts, rows)


def encode_examples(batch: Mapping[str, np.ndarray], features: Sequence[Feature]) -> list[bytes]:
  """Serialised `tf.train.Example`s, one per row of the (rows, length) arrays in `batch`."""
  flat, ends = encode_examples_flat(batch, features)
  data = flat.tobytes()
  starts = [0] + ends[:-1].tolist()
  return [data[s:e] for s, e in zip(starts, ends.tolist())]
