"""Google's TF1 checkpoints (`bert_model.ckpt.{index,data-*}` + `bert_config.json`) ↔ ours.

Read with TensorFlow's own checkpoint reader (optimizer slots and the step are counted, never
loaded); written with TensorFlow's saver under the original variable names, so the original
`modeling.py`, `tf.train.init_from_checkpoint` and our loaders all read them.
"""

from __future__ import annotations

import json
import os
from typing import Mapping

import numpy as np
from absl import logging

from bert_jax import file_io
from bert_jax.interop import kinds
from bert_jax.interop.names import LoadReport, apply_table, params_to_state
from bert_jax.model.configuration import BertConfig

# Released BERT checkpoints are a directory with `bert_model.ckpt.{index,data-*}`,
# `bert_config.json` and `vocab.txt`; variables carry the names of the table's `tf1` column.
TF1_PREFIX_NAME = "bert_model.ckpt"
TF1_CONFIG_NAME = "bert_config.json"

# What training leaves in a checkpoint besides the weights: the moments of the original
# optimization.py (`adam_m`, `adam_v`), tf.train.AdamOptimizer's slots and powers, the step.
_TF1_OPTIMIZER_SUFFIXES = ("/adam_m", "/adam_v", "/Adam", "/Adam_1")
_TF1_OPTIMIZER_NAMES = ("global_step", "beta1_power", "beta2_power")



_tf = file_io.tensorflow  # only where a TF1 checkpoint is read or written


def is_tf1_optimizer_variable(name: str) -> bool:
  """True for optimizer state and the step counter, which are skipped (and counted) on load."""
  return name in _TF1_OPTIMIZER_NAMES or name.endswith(_TF1_OPTIMIZER_SUFFIXES)


def dirname(path: str) -> str:
  return path.rsplit("/", 1)[0] if file_io.is_remote(path) else os.path.dirname(path)


def read_tf1_checkpoint(path: str, include_optimizer_variables: bool = False
                        ) -> dict[str, np.ndarray]:
  """Every variable of a TF1 checkpoint as numpy arrays, by its TF1 name.

  `path` is the checkpoint prefix (`.../bert_model.ckpt`) or a directory holding one; local or
  gs://. Optimizer moments and `global_step` are left out unless asked for: they are two thirds
  of a released checkpoint and nothing here reads them.
  """
  _, reader = _open_tf1(path)
  return {name: np.asarray(reader.get_tensor(name))
          for name in sorted(reader.get_variable_to_shape_map())
          if include_optimizer_variables or not is_tf1_optimizer_variable(name)}


def _open_tf1(path: str):
  """`(prefix, CheckpointReader)` for a TF1 checkpoint prefix or a directory holding one."""
  kind, prefix = kinds.checkpoint_kind(path)
  if kind != "tf1":
    raise ValueError(f"{path}: expected a TF1 checkpoint, found {kinds.KIND_NAMES[kind]} "
                     f"({prefix}).")
  # The reader itself, not tf.train.load_checkpoint: the prefix is resolved already, and some
  # filesystems (ram://) call a prefix a directory, which load_checkpoint then searches.
  return prefix, _tf().compat.v1.train.NewCheckpointReader(prefix)


def tf1_state_to_params(state: Mapping[str, np.ndarray], config: BertConfig,
                        source: str = "<TF1 variables>") -> tuple[dict, LoadReport]:
  """TF1 variables (numpy, by TF1 name) → our parameter tree (unrolled unless `config` scans),
  plus a report: our parameters the checkpoint lacks (`missing`), variables nothing here reads
  such as a fine-tuned classifier's `output_weights` (`unexpected`), and optimizer variables
  (`skipped`). Shapes are checked against `config`; every mismatch is listed in one error.
  """
  weights = {k: v for k, v in state.items() if not is_tf1_optimizer_variable(k)}
  params, report, used = apply_table(weights, config, "tf1", source)
  report.unexpected = sorted(set(weights) - used)
  report.skipped = sorted(set(state) - set(weights))
  return params, report


def read_config(prefix: str, bert_config_file: str | None = None) -> BertConfig:
  """The config of the checkpoint at `prefix`: `bert_config_file`, else the `bert_config.json`
  beside it (as in Google's release); the original code needed one too."""
  config_file = bert_config_file or file_io.join(dirname(prefix) or ".", TF1_CONFIG_NAME)
  if not file_io.exists(config_file):
    raise FileNotFoundError(f"{prefix}: no {TF1_CONFIG_NAME} beside the checkpoint "
                            f"({config_file}); give the model's config file "
                            "(--bert_config_file).")
  return BertConfig.from_json_file(config_file)


def load_tf1_checkpoint(path: str, bert_config_file: str | None = None, **config_overrides
                        ) -> tuple[BertConfig, dict, LoadReport]:
  """A TF1 checkpoint (Google's release or the original code's training output) →
  `(config, params, report)`.

  `path` is the prefix (`.../bert_model.ckpt`) or its directory. The config is
  `bert_config_file`, else the `bert_config.json` beside the checkpoint. Optimizer variables are
  never read from disk, only counted in `report.skipped`.
  """
  prefix, reader = _open_tf1(path)
  config = read_config(prefix, bert_config_file)
  if config_overrides:
    config = config.replace(**config_overrides)
  names = sorted(reader.get_variable_to_shape_map())
  state = {n: reader.get_tensor(n) for n in names if not is_tf1_optimizer_variable(n)}
  params, report = tf1_state_to_params(state, config, source=prefix)
  report.skipped = [n for n in names if is_tf1_optimizer_variable(n)]
  return config, params, report


def params_to_tf1_state(params: Mapping, config: BertConfig) -> dict[str, np.ndarray]:
  """Our tree (scanned or not) → TF1 variable names and layouts, numpy float32."""
  return params_to_state(params, config, "tf1", "TF1")


def original_config_json(config: BertConfig) -> str:
  """`bert_config.json` as the original code writes it. `layer_norm_eps` is added only when it
  is not the original's hard-coded 1e-12, so that our loaders keep a model that differs."""
  values = config.to_original_dict()
  if config.layer_norm_eps != 1e-12:
    values["layer_norm_eps"] = config.layer_norm_eps
  return json.dumps(values, indent=2, sort_keys=True) + "\n"


def save_tf1_checkpoint(params: Mapping, config: BertConfig, path: str) -> str:
  """Writes a TF1 checkpoint with the original variable names and layouts, plus
  `bert_config.json` beside it; returns the checkpoint prefix.

  `path` is a directory (the checkpoint is `path/bert_model.ckpt`, as in Google's release) or,
  when its last component contains `.ckpt`, the prefix itself. The files are written by
  TensorFlow's own saver (SaveV2), so TF's reader, `tf.train.init_from_checkpoint` and the
  original `modeling.py` load them. Only weights are written: no optimizer variables, no step.
  """
  state = params_to_tf1_state(params, config)
  name = path.rstrip("/").rsplit("/", 1)[-1]
  prefix = path.rstrip("/") if ".ckpt" in name else file_io.join(path, TF1_PREFIX_NAME)
  if config.hidden_act not in ("gelu", "relu", "tanh") or config.layer_norm_eps != 1e-12:
    logging.warning("hidden_act=%s, layer_norm_eps=%g: the original modeling.py knows only "
                    "gelu/relu/tanh and hard-codes 1e-12; our loaders read the values from %s.",
                    config.hidden_act, config.layer_norm_eps, TF1_CONFIG_NAME)
  tf = _tf()
  file_io.makedirs(dirname(prefix) or ".")
  names = sorted(state)
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=[tf.constant(state[n]) for n in names])
  file_io.write_text_atomic(file_io.join(dirname(prefix) or ".", TF1_CONFIG_NAME),
                            original_config_json(config))
  return prefix
