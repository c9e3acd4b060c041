"""The TFRecord framing, and a reader that says where a file is damaged and can skip the damage.

A TFRecord file is records back to back, each `uint64 length, uint32 masked_crc32c(length),
data, uint32 masked_crc32c(data)`, little-endian. data_prep writes it (`data_prep/records.py`,
with the constants and checksum here) and tf.data reads it. tf.data's reader is fast but says
little when a file is damaged: a file cut inside a record header reads as a clean, shorter
file (no error at all), and a cut or a flipped byte inside a record stops with "corrupted
record at 592" — an offset, no file name. `iter_records` reads the same records in the same
order, checks every checksum, and reports each damage by file, record number and byte offset;
it can go on after a damaged record (the next record is found by its header checksum), which
is what `data.skip_corrupt_records` uses. `scan` counts a file's readable records.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from typing import Callable, Iterator

from bert_jax import file_io

try:
  import google_crc32c  # pylint: disable=g-import-not-at-top
except ImportError:  # pragma: no cover - a declared dependency; only odd installs lack it
  google_crc32c = None

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
