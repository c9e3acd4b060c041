"""Where metrics go: the console, TensorBoard and a JSONL file — written by process 0 only.

Metrics arrive as flat `{name: float}` dicts grouped by prefix (`train/loss`, `eval/mlm_accuracy`,
`perf/tokens_per_sec`). The JSONL file is the machine-readable record (one object per line with
the step); TensorBoard gets the same scalars (`training/tensorboard.py`, without TensorFlow); the
console gets one readable line per report.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any, Mapping

import jax
from absl import logging

from bert_jax import file_io
from bert_jax.training import tensorboard as tensorboard_events


class MetricWriter:
  """Console + TensorBoard + JSONL. Does nothing on processes other than 0."""

  def __init__(self, workdir: str | None, tensorboard: bool = True):
    self.active = jax.process_index() == 0 and workdir is not None
    self._tb = None
    self._jsonl = None
    if not self.active:
      return
    file_io.makedirs(workdir)
    self.jsonl_path = file_io.join(workdir, "metrics.jsonl")
    self.tensorboard_dir = file_io.join(workdir, "tensorboard")
    if tensorboard:
      self._tb = tensorboard_events.EventWriter(self.tensorboard_dir)
    if file_io.is_remote(self.jsonl_path):
      # Buckets cannot append: keep the file's text and rewrite it whole at each report.
      self._remote_text = (file_io.read_text(self.jsonl_path)
                           if file_io.exists(self.jsonl_path) else "")
    else:
      self._jsonl = open(self.jsonl_path, "a", encoding="utf-8")

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self.active:
      return
    clean = {k: float(v) for k, v in scalars.items() if v is not None}
    line = json.dumps({"step": int(step), "time": time.time(), **clean}) + "\n"
    if self._jsonl is None:
      self._remote_text += line
      file_io.write_text_atomic(self.jsonl_path, self._remote_text)
    else:
      self._jsonl.write(line)
      self._jsonl.flush()
    if self._tb is not None:
      self._tb.scalars(int(step), clean)
      self._tb.flush()

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
      self._jsonl = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None


def format_duration(seconds: float) -> str:
  if not math.isfinite(seconds) or seconds < 0:
    return "?"
  seconds = int(round(seconds))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


# Console labels of the scalars that most runs report; any other `train/<name>` an objective
# reports is shown under its own name.
_CONSOLE = (("train/loss", "loss", ".4f"), ("train/mlm_accuracy", "mlm_acc", ".3f"),
            ("train/nsp_accuracy", "nsp_acc", ".3f"), ("train/accuracy", "acc", ".3f"))
_PERF = (("train/learning_rate", "lr", ".2e"), ("train/grad_norm", "|g|", ".3f"),
         ("perf/steps_per_sec", "steps/s", ".2f"), ("perf/sequences_per_sec", "seq/s", ".1f"),
         ("perf/rows_per_sec", "rows/s", ".1f"), ("perf/tokens_per_sec", "tok/s", ",.0f"),
         ("perf/useful_tokens_per_sec", "useful tok/s", ",.0f"), ("perf/mfu", "mfu", ".1%"))


def console_line(step: int, total_steps: int, scalars: Mapping[str, Any]) -> str:
  """One human-readable progress line from the grouped scalars."""
  width = len(str(total_steps))
  parts = [f"step {step:>{width}}/{total_steps}"]
  shown = {name for name, _, _ in _CONSOLE + _PERF}
  extra = [(name, name.split("/", 1)[1], ".4f") for name in scalars
           if name.startswith("train/") and name not in shown and "loss" not in name]
  for name, label, fmt in _CONSOLE + tuple(extra) + _PERF:
    value = scalars.get(name)
    if value is not None:
      parts.append(f"{label} {format(value, fmt)}")
  if "perf/eta_seconds" in scalars:
    parts.append(f"eta {format_duration(scalars['perf/eta_seconds'])}")
  return " | ".join(parts)


def log(message: str) -> None:
  """Progress for people: printed (flushed) by process 0, and kept in the absl log."""
  if jax.process_index() == 0:
    print(message, flush=True)
  logging.info(message)


def read_jsonl(path: str) -> list[dict[str, Any]]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]



