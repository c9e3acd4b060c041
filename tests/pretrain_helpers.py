"""Shared pieces of the pre-training tests: record files and a small run config."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from bert_jax.data import tfrecords
from bert_jax.text import features
from tests import helpers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ, PRED, VOCAB = 32, 5, 512


def write_records(directory: str, num_files: int = 4, per_file: int = 48, seed: int = 0,
                  masking: str = "static") -> str:
  """TFRecord shards in the pre-training schema (token ids drawn at random); returns a glob."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  os.makedirs(directory, exist_ok=True)
  for shard in range(num_files):
    batch = helpers.random_pretraining_batch(rng, per_file, SEQ, PRED, VOCAB)
    if masking == "dynamic":
      batch = {k: batch[k] for k in ("input_ids", "input_mask", "segment_ids",
                                     "next_sentence_labels")}
      batch["input_ids"][:, 0] = 2  # [CLS]
      batch["word_starts"] = (rng.rand(per_file, SEQ) < 0.7).astype(np.int64)
    records = tfrecords.encode_examples(batch,
                                        features.pretraining_features(SEQ, PRED, masking))
    with tf.io.TFRecordWriter(os.path.join(directory, f"train-{shard:05d}.tfrecord")) as w:
      for r in records:
        w.write(r)
  return os.path.join(directory, "train-*.tfrecord")


def recipe(variant: str):
  """`configs/pretrain.py:<variant>`, as the command line loads it."""
  sys.path.insert(0, os.path.join(REPO, "configs"))
  try:
    import pretrain as pretrain_configs  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)
  return pretrain_configs.get_config(variant)


def run_config(train_files: str, **overrides):
  """The `tiny` variant shrunk to the `test` model, data parallel over every device the test
  process has (one in the second pass of `make test`, the 8 fake ones in a `mesh` test)."""
  config = recipe("tiny")
  config.model.preset = "test"
  config.model.vocab_size = VOCAB
  config.data.train_files = train_files
  config.data.max_seq_length = SEQ
  config.data.max_predictions_per_seq = PRED
  config.data.shuffle_buffer_size = 64
  config.global_batch_size = 16
  config.total_steps = 40
  config.train_until_step = 8
  config.optimizer.warmup_steps = 3
  config.optimizer.learning_rate = 1e-3
  config.log_every_steps = 1
  config.eval_every_steps = 1000
  config.eval_steps = 2
  config.checkpoint_every_steps = 4
  config.mesh_shape = (-1, 1, 1)
  config.tensorboard = False
  return set_fields(config, overrides)


def set_fields(config, overrides: dict):
  """`config` with each dotted field of `overrides` ("model.dtype") set; lists become tuples,
  as the command line gives them."""
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = tuple(value) if isinstance(value, list) else value
  return config


def script_result(script: str, *args: str, timeout: int = 1200, **env_vars: str) -> dict:
  """Runs `script` in a fresh process on the CPU (so that what it loads, libtpu or JAX's CUDA
  plugin, stays out of the test session's JAX), with `env_vars` set, and returns the JSON it
  printed after "RESULT "."""
  env = dict(helpers.command_env(), JAX_PLATFORMS="cpu", **env_vars)
  env.pop("XLA_FLAGS", None)
  proc = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                        text=True, timeout=timeout)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
  return json.loads(line[len("RESULT "):])
