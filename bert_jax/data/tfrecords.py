"""Pre-training records as bytes: `tf.train.Example` protos and the TFRecord framing around
them, written with numpy, and a reader that says where a file is damaged and can skip the damage.

The record format is implemented here once, for every writer (data_prep's shards through
`data_prep/records.py`, the tests' files) and every reader that checks files itself.

A record is a `tf.train.Example` of the features of a schema (`bert_jax/text/features.py`).
`encode_examples` serialises a whole batch without TensorFlow: the data-prep workers stay small
and start fast, and the bytes are what TensorFlow itself parses (packed int64 varints and
little-endian float32, the proto wire format).

A TFRecord file is records back to back, each `uint64 length, uint32 masked_crc32c(length),
data, uint32 masked_crc32c(data)`, little-endian. `encode_examples_flat` lays a batch out with
that framing in place (`frame_header` before each record, room after it that `fill_checksums`
fills), so that a writer sends the batch out in one write, and tf.data reads it. tf.data's
reader is fast but says little when a file is damaged: a file cut inside a record header reads
as a clean, shorter file (no error at all), and a cut or a flipped byte inside a record stops
with "corrupted record at 592" — an offset, no file name. `iter_records` reads the same records
in the same order, checks every checksum, and reports each damage by file, record number and
byte offset; it can go on after a damaged record (the next record is found by its header
checksum), which is what `data.skip_corrupt_records` uses. `scan` counts a file's readable
records.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from bert_jax import file_io
from bert_jax.text.features import Feature, check_batch

try:
  import google_crc32c  # pylint: disable=g-import-not-at-top
except ImportError:  # pragma: no cover - a declared dependency; only odd installs lack it
  google_crc32c = None

# Whether CRC32C is computed in C: without it, writers leave the framing to TensorFlow's own.
FAST_CRC32C = google_crc32c is not None
MASK_DELTA = 0xA282EAD8
FRAME_BEFORE = 12  # uint64 length, uint32 masked_crc32c(length)
FRAME_AFTER = 4    # uint32 masked_crc32c(data)
_READ_BYTES = 1 << 22


def _crc32c_python(data: bytes) -> int:  # pragma: no cover - only without google-crc32c
  crc = 0xFFFFFFFF
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
  return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
  """TFRecord's checksum: CRC32C, rotated and offset so that checksums of checksums differ."""
  crc = google_crc32c.value(data) if google_crc32c is not None else _crc32c_python(data)
  return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
  """One record in its TFRecord frame (length, its checksum, the data, its checksum)."""
  length = struct.pack("<Q", len(data))
  return (length + struct.pack("<I", masked_crc32c(length)) + data +
          struct.pack("<I", masked_crc32c(data)))


def frame_header(lengths: np.ndarray) -> np.ndarray:
  """The (records, 12) bytes before each record: its length and the masked checksum of that."""
  lengths = np.asarray(lengths).astype("<u8").reshape(-1)
  distinct, which = np.unique(lengths, return_inverse=True)
  header = np.empty((lengths.size, FRAME_BEFORE), np.uint8)
  header[:, :8] = lengths.view(np.uint8).reshape(-1, 8)
  crcs = np.array([masked_crc32c(struct.pack("<Q", int(n))) for n in distinct], "<u4")
  header[:, 8:] = crcs[which].view(np.uint8).reshape(-1, 4)
  return header


def data_bounds(ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Where each record's data starts and ends in a framed buffer whose records' room ends at
  `ends` (as `encode_examples_flat(..., prefix=frame_header, reserve_after=FRAME_AFTER)` lays
  them out)."""
  ends = np.asarray(ends, np.int64)
  return np.concatenate([[0], ends[:-1]]) + FRAME_BEFORE, ends - FRAME_AFTER


def fill_checksums(buffer: np.ndarray, ends: np.ndarray) -> None:
  """Writes each record's data checksum into the `FRAME_AFTER` bytes left for it in `buffer`
  (uint8, framed as `data_bounds` says), in place: one checksum call per record is the only
  work done per record."""
  data_starts, data_ends = data_bounds(ends)
  data = buffer.tobytes()
  value = google_crc32c.value if google_crc32c is not None else _crc32c_python
  crcs = np.fromiter(map(value, map(data.__getitem__, map(slice, data_starts.tolist(),
                                                            data_ends.tolist()))),
                     np.uint32, count=data_ends.size)
  masked = (((crcs >> 15) | (crcs << 17)) + np.uint32(MASK_DELTA)).astype("<u4")
  buffer[data_ends[:, None] + np.arange(4)] = masked.view(np.uint8).reshape(-1, 4)


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


def varint(n: int) -> bytes:
  """A non-negative integer as protobuf's base-128 varint."""
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
      self.constant(varint(int(values.flat[0])))
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
    key = b"\x0a" + varint(len(f.name)) + f.name.encode() + b"\x12"
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


# ---------------------------------------------------------------------------------------------
# Reading, every checksum checked.


@dataclasses.dataclass(frozen=True)
class Damage:
  """One damaged stretch of a file: where it starts, the record it hit (0-based), and what."""
  path: str
  offset: int
  record: int
  reason: str

  def __str__(self) -> str:
    return (f"{self.path}: record {self.record + 1:,} at byte offset {self.offset:,}: "
            f"{self.reason}")


def _open(path: str):
  if file_io.is_remote(path):
    return file_io.tensorflow().io.gfile.GFile(path, "rb")
  return open(path, "rb")  # pylint: disable=consider-using-with


def file_size(path: str) -> int:
  if file_io.is_remote(path):
    return file_io.tensorflow().io.gfile.stat(path).length
  return os.path.getsize(path)


class _Window:
  """Buffered reading with look-ahead: `need(n)` makes n bytes from the cursor available."""

  def __init__(self, f):
    self.f = f
    self.buffer = b""
    self.cursor = 0    # index into buffer
    self.base = 0      # file offset of buffer[0]
    self.eof = False

  @property
  def offset(self) -> int:
    return self.base + self.cursor

  def need(self, n: int) -> int:
    """Bytes available from the cursor, up to n (fewer only at the end of the file)."""
    if len(self.buffer) - self.cursor < n and not self.eof:
      parts = [self.buffer[self.cursor:]]
      have = len(parts[0])
      while have < n:
        chunk = self.f.read(max(_READ_BYTES, n - have))
        if not chunk:
          self.eof = True
          break
        parts.append(chunk)
        have += len(chunk)
      self.base += self.cursor
      self.buffer, self.cursor = b"".join(parts), 0
    return min(n, len(self.buffer) - self.cursor)

  def peek(self, n: int, at: int = 0) -> bytes:
    return self.buffer[self.cursor + at:self.cursor + at + n]


def _valid_header(header: bytes) -> bool:
  return (len(header) == FRAME_BEFORE and
          masked_crc32c(header[:8]) == struct.unpack("<I", header[8:])[0])


def iter_records(path: str, on_damage: Callable[[Damage], None] | None = None
                 ) -> Iterator[bytes]:
  """The records of `path`, in order, each checked against both of its checksums.

  Without `on_damage`, the first damage raises ValueError naming the file, the record and the
  byte offset. With it, each damage is passed to it and reading goes on: after a record whose
  data checksum fails, at the next record (its header was sound, so its end is known); after a
  broken header, at the next place where a sound header starts; a file cut short ends there.
  """
  size = file_size(path)
  with _open(path) as f:
    window = _Window(f)
    record = 0

    def damaged(offset: int, reason: str) -> None:
      damage = Damage(path, offset, record, reason)
      if on_damage is None:
        raise ValueError(f"Corrupt TFRecord file {damage}.")
      on_damage(damage)

    while True:
      have = window.need(FRAME_BEFORE)
      if have == 0:
        return
      start = window.offset
      if have < FRAME_BEFORE:
        damaged(start, f"the file ends inside a record header ({have} of {FRAME_BEFORE} bytes; "
                       "the file is cut short)")
        return
      header = window.peek(FRAME_BEFORE)
      if not _valid_header(header):
        damaged(start, "the record header's checksum does not match (damaged bytes)")
        if not _resync(window, size):
          return
        record += 1
        continue
      length = struct.unpack("<Q", header[:8])[0]
      total = FRAME_BEFORE + length + FRAME_AFTER
      if window.need(total) < total:
        damaged(start, f"the file ends inside the record ({size - start:,} of {total:,} bytes; "
                       "the file is cut short)")
        return
      data = window.peek(length, FRAME_BEFORE)
      stored = struct.unpack("<I", window.peek(FRAME_AFTER, FRAME_BEFORE + length))[0]
      window.cursor += total
      if masked_crc32c(data) != stored:
        damaged(start, "the record's data checksum does not match (damaged bytes)")
      else:
        yield data
      record += 1


def _resync(window: _Window, size: int) -> bool:
  """Moves the cursor to the next sound record header (checksum right, length fitting in the
  file) after the current position; False when there is none."""
  while True:
    window.cursor += 1
    if window.need(FRAME_BEFORE) < FRAME_BEFORE:
      return False
    header = window.peek(FRAME_BEFORE)
    if _valid_header(header):
      length = struct.unpack("<Q", header[:8])[0]
      if window.offset + FRAME_BEFORE + length + FRAME_AFTER <= size:
        return True


@dataclasses.dataclass
class Scan:
  """What a full read of a file found: sound records, and every damage."""
  path: str
  records: int
  damages: list[Damage]


def scan(path: str) -> Scan:
  """Reads all of `path` (every checksum checked) and counts its sound records."""
  damages: list[Damage] = []
  records = sum(1 for _ in iter_records(path, damages.append))
  return Scan(path, records, damages)
