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

`encode_examples` serialises `tf.train.Example` protos without TensorFlow: the data-prep workers
stay small and start fast, and the bytes are what TensorFlow itself parses (packed int64 varints
and little-endian float32, the proto wire format).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

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


# ---------------------------------------------------------------------------------------------
# tf.train.Example wire format, written with numpy.
#
# A record is a concatenation of pieces, each either the same bytes in every row (tags, feature
# names, lengths that do not vary) or a (rows, width) byte matrix (values, varying lengths),
# where a varint value has a fixed number of slots of which only the first `size` are used. All
# pieces are laid side by side in one (rows, total width) matrix, and one `np.compress` with the
# matrix of used slots squeezes it into the records, back to back. So the cost is a handful of
# whole-batch array operations per feature and about one pass over the output bytes — no work
# per record or per value in Python.

_MAX_VALUE = 1 << 35  # token ids, positions, flags: far below; keeps every varint ≤ 5 bytes


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


def _varint_size(n: np.ndarray) -> np.ndarray:
  size = np.ones(np.shape(n), np.int64)
  for k in range(1, 5):
    size += np.asarray(n) >= (1 << (7 * k))
  return size


def _varint_slots(values: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
  """Varint bytes of each value in `width` slots, and its size (slots actually used)."""
  v = np.asarray(values).astype(np.uint64)
  sizes = np.ones(v.shape, np.int8)
  for k in range(1, width):
    sizes += v >= (1 << (7 * k))
  out = np.empty(v.shape + (width,), np.uint8)
  for k in range(width):
    out[..., k] = ((v >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8) | (
        (sizes > k + 1).view(np.uint8) << 7)
  return out, sizes


_TABLES: dict = {}


def _varint_table(high: int) -> np.ndarray:
  """For each of 0..n (n > high, high < 2**21), one uint64 whose little-endian bytes are: the
  varint in bytes 0-2, its size in byte 3 (a slot never used), and in bytes 4-6 a 1 for each
  slot used. One gather per value then gives a value's bytes, which of them count, and the
  size."""
  table = _TABLES.get("varint")
  if table is None or len(table) <= high:
    n = 1 << max(15, int(high).bit_length())
    v = np.arange(n, dtype=np.uint64)
    sizes = 1 + (v >= 1 << 7).astype(np.uint64) + (v >= 1 << 14).astype(np.uint64)
    table = sizes << np.uint64(24)
    for k in range(3):
      more = (sizes > k + 1).astype(np.uint64)
      group = ((v >> np.uint64(7 * k)) & np.uint64(0x7F)) | (more << np.uint64(7))
      table |= group << np.uint64(8 * k)
      table |= (sizes > k).astype(np.uint64) << np.uint64(32 + 8 * k)
    table = _TABLES["varint"] = table.astype("<u8")
  return table


class _RecordLayout:
  """The pieces of a batch of records, left to right; `assemble` lays them out and squeezes."""

  def __init__(self, rows: int):
    self.rows = rows
    self.pieces: list = []  # bytes (same in every row) or (matrix, used matrix or None)

  def constant(self, data: bytes) -> None:
    if self.pieces and isinstance(self.pieces[-1], bytes):
      self.pieces[-1] += data
    else:
      self.pieces.append(data)

  def matrix(self, data: np.ndarray, used: np.ndarray | None = None) -> None:
    """(rows, n) values of any fixed-size dtype (their bytes, little-endian), and for each of
    those bytes whether it counts (`used`, same shape and dtype, bytes of 0 or 1)."""
    self.pieces.append((data, used))

  def varint(self, values) -> None:
    """A per-row length (or one length for all rows)."""
    values = np.asarray(values)
    if values.ndim == 0 or values.min() == values.max():
      self.constant(_varint(int(values.flat[0])))
      return
    width = int(_varint_size(values.max()))
    data, sizes = _varint_slots(values, width)
    if sizes.min() == width:
      self.matrix(data)
    else:
      self.matrix(data, (np.arange(width) < sizes[:, None]).view(np.uint8))

  def assemble(self) -> np.ndarray:
    widths = [len(p) if isinstance(p, bytes) else p[0].shape[1] * p[0].itemsize
              for p in self.pieces]
    # Every constant piece at once: one row of them (zeros elsewhere), copied to every row.
    template = b"".join(p if isinstance(p, bytes) else bytes(w)
                        for p, w in zip(self.pieces, widths))
    out = np.empty((self.rows, len(template)), np.uint8)
    out[:] = np.frombuffer(template, np.uint8)
    used = None
    column = 0
    for piece, width in zip(self.pieces, widths):
      if not isinstance(piece, bytes):
        data, piece_used = piece
        out[:, column:column + width].view(data.dtype)[...] = data
        if piece_used is not None:
          if used is None:
            used = np.ones(out.shape, np.uint8)
          used[:, column:column + width].view(piece_used.dtype)[...] = piece_used
      column += width
    if used is None:
      return out.reshape(-1)
    return np.compress(used.reshape(-1).view(bool), out.reshape(-1))


def _int_payload(values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | int]:
  """Packed varints of each row: (value bytes, which bytes count or None, bytes per row)."""
  v = np.asarray(values)
  rows, length = v.shape
  if v.dtype == bool:  # masks, segment ids, labels: one byte each
    return v.view(np.uint8), None, length
  if not v.size:
    return np.zeros((rows, 0), np.uint8), None, 0
  low, high = int(v.min()), int(v.max())
  if low < 0 or high >= _MAX_VALUE:
    raise ValueError("int64 features must lie in [0, 2**35) here (token ids, positions, flags).")
  if high < 0x80:  # flags, short positions: one byte each
    return v.astype(np.uint8, copy=False), None, length
  if high < 1 << 21:  # token ids and positions: look the bytes up, four slots a value
    looked_up = _varint_table(high)[v]
    halves = looked_up.view("<u4").reshape(rows, length, 2)
    sizes = looked_up.view(np.uint8).reshape(rows, length, 8)[:, :, 3]
    return halves[:, :, 0], halves[:, :, 1], sizes.sum(axis=1, dtype=np.int64)
  data, sizes = _varint_slots(v, 5)
  slots = (np.arange(5) < sizes[..., None]).view(np.uint8)
  return (data.reshape(rows, 5 * length), slots.reshape(rows, 5 * length),
          sizes.sum(axis=1, dtype=np.int64))


def encode_examples_flat(batch: Mapping[str, np.ndarray], features: Sequence[Feature], *,
                         prefix: Callable[[np.ndarray], np.ndarray] | None = None,
                         reserve_after: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Serialised `tf.train.Example`s back to back in one buffer, and each one's end offset.

  For a container format that frames each record (TFRecord: its length and a checksum of that
  before it, a checksum of the record after it), the framing can be made in the same pass
  instead of copying every record once more: `prefix(lengths)` gives the (rows, k) bytes to put
  before each record from the records' lengths, and `reserve_after` leaves that many zero bytes
  after each (for what can only be computed from the finished record). Offsets include both.
  """
  rows = check_batch(batch, features)
  if not rows:
    return np.zeros(0, np.uint8), np.zeros(0, np.int64)
  # The proto nests: Example{features: Features{feature: map entry{key, value: Feature{
  # int64_list|float_list: {value: packed}}}}}; every level is a tag, a varint length, the body.
  layout = _RecordLayout(rows)
  body = np.zeros(rows, np.int64)
  entries = []
  for f in features:
    values = batch[f.name]
    if f.dtype == "float32":
      data = np.ascontiguousarray(values, dtype="<f4").reshape(rows, f.length).view(np.uint8)
      payload, used, payload_len = data, None, 4 * f.length
    else:
      payload, used, payload_len = _int_payload(np.asarray(values).reshape(rows, f.length))
    values_len = 1 + _varint_size(payload_len) + payload_len
    feature_len = 1 + _varint_size(values_len) + values_len
    key = b"\x0a" + _varint(len(f.name)) + f.name.encode() + b"\x12"
    entry_len = len(key) + _varint_size(feature_len) + feature_len
    body = body + 1 + _varint_size(entry_len) + entry_len
    entries.append((f, key, entry_len, feature_len, values_len, payload_len, payload, used))
  record_len = 1 + _varint_size(body) + body
  if prefix is not None:
    before = np.ascontiguousarray(prefix(record_len), np.uint8)
    layout.matrix(before)
  layout.constant(b"\x0a")
  layout.varint(body)
  for f, key, entry_len, feature_len, values_len, payload_len, payload, used in entries:
    kind = b"\x12" if f.dtype == "float32" else b"\x1a"  # Feature oneof: float_list 2, int64_list 3
    layout.constant(b"\x0a")
    layout.varint(entry_len)
    layout.constant(key)
    layout.varint(feature_len)
    layout.constant(kind)
    layout.varint(values_len)
    layout.constant(b"\x0a")
    layout.varint(payload_len)
    layout.matrix(payload, used)
  layout.constant(b"\x00" * reserve_after)
  row_bytes = (before.shape[1] if prefix is not None else 0) + record_len + reserve_after
  flat = layout.assemble()
  ends = np.cumsum(np.broadcast_to(row_bytes, (rows,)))
  assert flat.size == ends[-1], (flat.size, ends[-1])
  return flat, ends


def encode_examples(batch: Mapping[str, np.ndarray], features: Sequence[Feature]) -> list[bytes]:
  """Serialised `tf.train.Example`s, one per row of the (rows, length) arrays in `batch`."""
  flat, ends = encode_examples_flat(batch, features)
  data = flat.tobytes()
  starts = [0] + ends[:-1].tolist()
  return [data[s:e] for s, e in zip(starts, ends.tolist())]
