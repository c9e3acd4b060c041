"""TensorBoard event files, written without TensorFlow.

An event file is TFRecord-framed `Event` protocol buffers: a first event naming the format
(`file_version: "brain.Event:2"`), then one event per report holding a `Summary` of scalars
(`tag`, `simple_value`), which TensorBoard's scalar dashboard reads as TensorFlow's own writer's.
Why not `tf.summary`: importing TensorFlow costs seconds at the start of every run, and a
fine-tuning run reads nothing else through it.

The fields written (tensorflow/core/util/event.proto, summary.proto):
    Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
    Summary { repeated Value value = 1; }
    Value   { string tag = 1; float simple_value = 2; }
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from typing import Mapping

from bert_jax import file_io
from bert_jax.data import tfrecords

FILE_VERSION = "brain.Event:2"


def _length_delimited(field: int, data: bytes) -> bytes:
  return tfrecords.varint(field << 3 | 2) + tfrecords.varint(len(data)) + data


def _event(wall_time: float, step: int, body: bytes) -> bytes:
  return (struct.pack("<Bd", 1 << 3 | 1, wall_time) + tfrecords.varint(2 << 3) +
          tfrecords.varint(step & (2**64 - 1)) + body)


def version_event(wall_time: float) -> bytes:
  return _event(wall_time, 0, _length_delimited(3, FILE_VERSION.encode()))


def scalars_event(wall_time: float, step: int, scalars: Mapping[str, float]) -> bytes:
  """One event holding `scalars` (finite values only: TensorBoard plots nothing for the rest)."""
  values = b"".join(
      _length_delimited(1, _length_delimited(1, tag.encode("utf-8")) +
                        struct.pack("<Bf", 2 << 3 | 5, value))
      for tag, value in scalars.items() if math.isfinite(value))
  return _event(wall_time, step, _length_delimited(5, values))


class EventWriter:
  """Appends scalar events to a new event file in `logdir` (a bucket path too: buckets cannot
  append, so there the whole file is rewritten at each flush)."""

  def __init__(self, logdir: str):
    file_io.makedirs(logdir)
    self.path = file_io.join(logdir, f"events.out.tfevents.{int(time.time())}."
                                     f"{socket.gethostname()}.{os.getpid()}.v2")
    self._remote = file_io.is_remote(self.path)
    self._written = b""
    self._pending = [tfrecords.frame(version_event(time.time()))]
    self.flush()

  def scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    self._pending.append(tfrecords.frame(scalars_event(time.time(), int(step), scalars)))

  def flush(self) -> None:
    if not self._pending:
      return
    data = b"".join(self._pending)
    self._pending.clear()
    if self._remote:
      self._written += data
      file_io.write_bytes_atomic(self.path, self._written)
    else:
      with open(self.path, "ab") as f:
        f.write(data)

  def close(self) -> None:
    self.flush()
