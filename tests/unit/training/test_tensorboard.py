"""TensorBoard event files written without TensorFlow, read back by TensorBoard's own reader and
by TensorFlow's record reader (which checks every frame's checksums)."""

import subprocess
import sys

import numpy as np
import pytest

from bert_jax.training import metrics, tensorboard
from tests import helpers


def _read_with_tensorboard(logdir):
  from tensorboard.backend.event_processing import event_accumulator
  accumulator = event_accumulator.EventAccumulator(logdir, size_guidance={"scalars": 0})
  accumulator.Reload()
  return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
          for tag in accumulator.Tags()["scalars"]}


def test_scalars_read_back_in_tensorboard(tmp_path):
  writer = tensorboard.EventWriter(str(tmp_path))
  writer.scalars(1, {"train/loss": 7.25, "perf/tokens_per_sec": 123456.5})
  writer.scalars(2, {"train/loss": 6.5, "eval/accuracy": 0.125, "train/nan": float("nan")})
  writer.scalars(3_000_000_000, {"train/loss": -1e-7, "naïve/tag": 1e30})
  writer.close()
  assert _read_with_tensorboard(str(tmp_path)) == {
      "train/loss": [(1, 7.25), (2, 6.5), (3_000_000_000, pytest.approx(-1e-7, rel=1e-6))],
      "perf/tokens_per_sec": [(1, 123456.5)],
      "eval/accuracy": [(2, 0.125)],
      "naïve/tag": [(3_000_000_000, pytest.approx(1e30, rel=1e-6))]}  # float32, as TF writes


def test_every_frame_passes_tensorflows_checksums(tmp_path):
  import tensorflow as tf
  writer = tensorboard.EventWriter(str(tmp_path))
  for step in range(5):
    writer.scalars(step, {"train/loss": 1.0 / (step + 1)})
  writer.close()
  events = list(tf.compat.v1.train.summary_iterator(writer.path))
  assert events[0].file_version == tensorboard.FILE_VERSION
  assert [e.step for e in events[1:]] == list(range(5))
  np.testing.assert_allclose([e.summary.value[0].simple_value for e in events[1:]],
                             [1.0 / (s + 1) for s in range(5)], rtol=1e-7)
  assert all(e.summary.value[0].tag == "train/loss" for e in events[1:])
  assert events[1].wall_time > 1.6e9


def test_metric_writer_reports_without_importing_tensorflow(tmp_path):
  """What a fine-tuning run writes its scalars with: no TensorFlow in the process."""
  script = ("import sys; from bert_jax.training import metrics; "
            f"w = metrics.MetricWriter({str(tmp_path)!r}); w.write(3, {{'train/loss': 2.5}}); "
            "w.close(); print('tensorflow' in sys.modules)")
  env = helpers.command_env()
  out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == "False"
  assert _read_with_tensorboard(str(tmp_path / "tensorboard")) == {"train/loss": [(3, 2.5)]}
  assert metrics.read_jsonl(str(tmp_path / "metrics.jsonl"))[0]["train/loss"] == 2.5
