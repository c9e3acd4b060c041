"""Writing TFRecord files without TensorFlow, under a temporary name until complete.

The record format (Example protos, the TFRecord framing and its checksums) is
`bert_jax/data/tfrecords.py`'s, which also reads it; this module owns the files. Writing them
here instead of through `tf.io.TFRecordWriter` keeps data-prep workers free of TensorFlow (~3 s
and ~400 MB each to import). CRC32C comes from `google-crc32c` (C, and already on every Cloud TPU
VM with the GCS client); if that is missing, TensorFlow's writer is used. A shard is written as
`NAME.tmp-<pid>` and renamed to `NAME` only once it is complete, so a crash never leaves a
half-written file under a name that a rerun or a reader would trust.

`write_framed` takes a whole batch at once, as `tfrecords.encode_examples_flat` lays it out
with the framing in place (`tfrecords.frame_header` before each record, room for the checksum
after it, filled by `tfrecords.fill_checksums`): the batch goes out in one write.
"""

from __future__ import annotations

import os
import struct

import numpy as np

from bert_jax import file_io
from bert_jax.data import tfrecords
from bert_jax.data.tfrecords import FRAME_AFTER, FRAME_BEFORE, masked_crc32c


def temporary_name(path: str) -> str:
  return f"{path}.tmp-{os.getpid()}"


def is_temporary_name(path: str) -> bool:
  return ".tmp-" in os.path.basename(path)


class TFRecordWriter:
  """`with TFRecordWriter(path) as w: w.write(record)`; the file appears at `path` on success."""

  def __init__(self, path: str):
    self.path = path
    self.tmp_path = temporary_name(path)
    self._tf_writer = None
    if not tfrecords.FAST_CRC32C:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      self._tf_writer = tf.io.TFRecordWriter(self.tmp_path)
    elif file_io.is_remote(path):
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      self._file = tf.io.gfile.GFile(self.tmp_path, "wb")
    else:
      self._file = open(self.tmp_path, "wb")  # pylint: disable=consider-using-with
    self._pending: list[bytes] = []
    self._pending_bytes = 0
    # What the finished file holds: data_prep's summary lists both per shard, and the input
    # pipeline checks each shard against them (a shard cut short is found before training).
    self.records_written = 0
    self.bytes_written = 0

  def write(self, record: bytes) -> None:
    self.records_written += 1
    self.bytes_written += len(record) + FRAME_BEFORE + FRAME_AFTER
    if self._tf_writer is not None:
      self._tf_writer.write(record)
      return
    header = struct.pack("<Q", len(record))
    self._pending += [header, struct.pack("<I", masked_crc32c(header)), record,
                      struct.pack("<I", masked_crc32c(record))]
    self._pending_bytes += len(record) + 16
    if self._pending_bytes > 1 << 22:
      self._flush()

  def write_framed(self, buffer: np.ndarray, ends: np.ndarray) -> None:
    """Writes records laid out back to back in `buffer` (uint8), each with its header made by
    `tfrecords.frame_header` before it and `FRAME_AFTER` bytes of room after it (`ends`: where
    each one's room ends), as `tfrecords.encode_examples_flat(..., prefix=frame_header,
    reserve_after=FRAME_AFTER)` lays them out. Fills in the checksums in place."""
    ends = np.asarray(ends, np.int64)
    if not ends.size:
      return
    self.records_written += int(ends.size)
    self.bytes_written += int(ends[-1])
    if self._tf_writer is not None:
      data_starts, data_ends = tfrecords.data_bounds(ends)
      for s, e in zip(data_starts.tolist(), data_ends.tolist()):
        self._tf_writer.write(buffer[s:e].tobytes())
      return
    tfrecords.fill_checksums(buffer, ends)
    self._flush()
    self._file.write(buffer.tobytes() if file_io.is_remote(self.path) else buffer)

  def _flush(self) -> None:
    if self._pending:
      self._file.write(b"".join(self._pending))
      self._pending, self._pending_bytes = [], 0

  def close(self, complete: bool = True) -> None:
    """Finishes the file; renames it into place only if `complete`, else deletes it."""
    if self._tf_writer is not None:
      self._tf_writer.close()
    else:
      if complete:
        self._flush()
      if not file_io.is_remote(self.path) and complete:
        self._file.flush()
        os.fsync(self._file.fileno())
      self._file.close()
    if complete:
      _rename(self.tmp_path, self.path)
    else:
      _remove(self.tmp_path)

  def __enter__(self) -> "TFRecordWriter":
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    self.close(complete=exc_type is None)


_rename = file_io.rename


def _remove(path: str) -> None:
  """Best effort: a leftover temporary file is harmless, a failure to clean it up is not news."""
  try:
    file_io.remove(path)
  except (OSError, IOError):
    pass
