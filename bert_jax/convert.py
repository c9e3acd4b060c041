"""Checkpoint interop: Google's TF1 checkpoints, Hugging Face directories ↔ our parameters.

The whole correspondence is the name table (`name_table()`): one row per tensor, with our path,
the original TF1 variable name and the Hugging Face (PyTorch) name, plus how the array is laid
out in each (`T` = transposed: PyTorch `Linear.weight` is (out, in), our and TF1 kernels are
(in, out); the TF1 NSP head `cls/seq_relationship/output_weights` is stored (2, hidden)).
Everything else here only reads and writes files and applies that table.

Our parameter tree is the pre-training model's: `{'bert': {...}, 'cls': {...}}`; a bare encoder
is `params['bert']`. Layers are in the unrolled layout (`layer_{i}`); scanned models are
converted with `modeling.stack_layers` / `unstack_layers`.

Every command takes a checkpoint through one path argument, whatever its kind; `checkpoint_kind`
decides which kind a path is. Conversion between kinds from the command line:

    python -m bert_jax.convert --from=uncased_L-12_H-768_A-12/bert_model.ckpt --to=hf_dir \
        --format=hf
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
from typing import Any, Mapping

import numpy as np
from absl import logging

from bert_jax import checkpointing, file_io
from bert_jax.configuration import BertConfig

# --------------------------------------------------------------------------------- the table
# (ours, tf1, tf1 layout, hugging face, hf layout); "{i}" is the layer index.
_SAME, _T = "", "T"

EMBEDDING_ROWS = (
    ("bert/embeddings/word_embeddings", "bert/embeddings/word_embeddings", _SAME,
     "bert.embeddings.word_embeddings.weight", _SAME),
    ("bert/embeddings/position_embeddings", "bert/embeddings/position_embeddings", _SAME,
     "bert.embeddings.position_embeddings.weight", _SAME),
    ("bert/embeddings/token_type_embeddings", "bert/embeddings/token_type_embeddings", _SAME,
     "bert.embeddings.token_type_embeddings.weight", _SAME),
    ("bert/embeddings/LayerNorm/scale", "bert/embeddings/LayerNorm/gamma", _SAME,
     "bert.embeddings.LayerNorm.weight", _SAME),
    ("bert/embeddings/LayerNorm/bias", "bert/embeddings/LayerNorm/beta", _SAME,
     "bert.embeddings.LayerNorm.bias", _SAME),
)

LAYER_ROWS = (
    ("bert/encoder/layer_{i}/attention/self/query/kernel",
     "bert/encoder/layer_{i}/attention/self/query/kernel", _SAME,
     "bert.encoder.layer.{i}.attention.self.query.weight", _T),
    ("bert/encoder/layer_{i}/attention/self/query/bias",
     "bert/encoder/layer_{i}/attention/self/query/bias", _SAME,
     "bert.encoder.layer.{i}.attention.self.query.bias", _SAME),
    ("bert/encoder/layer_{i}/attention/self/key/kernel",
     "bert/encoder/layer_{i}/attention/self/key/kernel", _SAME,
     "bert.encoder.layer.{i}.attention.self.key.weight", _T),
    ("bert/encoder/layer_{i}/attention/self/key/bias",
     "bert/encoder/layer_{i}/attention/self/key/bias", _SAME,
     "bert.encoder.layer.{i}.attention.self.key.bias", _SAME),
    ("bert/encoder/layer_{i}/attention/self/value/kernel",
     "bert/encoder/layer_{i}/attention/self/value/kernel", _SAME,
     "bert.encoder.layer.{i}.attention.self.value.weight", _T),
    ("bert/encoder/layer_{i}/attention/self/value/bias",
     "bert/encoder/layer_{i}/attention/self/value/bias", _SAME,
     "bert.encoder.layer.{i}.attention.self.value.bias", _SAME),
    ("bert/encoder/layer_{i}/attention/output/dense/kernel",
     "bert/encoder/layer_{i}/attention/output/dense/kernel", _SAME,
     "bert.encoder.layer.{i}.attention.output.dense.weight", _T),
    ("bert/encoder/layer_{i}/attention/output/dense/bias",
     "bert/encoder/layer_{i}/attention/output/dense/bias", _SAME,
     "bert.encoder.layer.{i}.attention.output.dense.bias", _SAME),
    ("bert/encoder/layer_{i}/attention/output/LayerNorm/scale",
     "bert/encoder/layer_{i}/attention/output/LayerNorm/gamma", _SAME,
     "bert.encoder.layer.{i}.attention.output.LayerNorm.weight", _SAME),
    ("bert/encoder/layer_{i}/attention/output/LayerNorm/bias",
     "bert/encoder/layer_{i}/attention/output/LayerNorm/beta", _SAME,
     "bert.encoder.layer.{i}.attention.output.LayerNorm.bias", _SAME),
    ("bert/encoder/layer_{i}/intermediate/dense/kernel",
     "bert/encoder/layer_{i}/intermediate/dense/kernel", _SAME,
     "bert.encoder.layer.{i}.intermediate.dense.weight", _T),
    ("bert/encoder/layer_{i}/intermediate/dense/bias",
     "bert/encoder/layer_{i}/intermediate/dense/bias", _SAME,
     "bert.encoder.layer.{i}.intermediate.dense.bias", _SAME),
    ("bert/encoder/layer_{i}/output/dense/kernel",
     "bert/encoder/layer_{i}/output/dense/kernel", _SAME,
     "bert.encoder.layer.{i}.output.dense.weight", _T),
    ("bert/encoder/layer_{i}/output/dense/bias",
     "bert/encoder/layer_{i}/output/dense/bias", _SAME,
     "bert.encoder.layer.{i}.output.dense.bias", _SAME),
    ("bert/encoder/layer_{i}/output/LayerNorm/scale",
     "bert/encoder/layer_{i}/output/LayerNorm/gamma", _SAME,
     "bert.encoder.layer.{i}.output.LayerNorm.weight", _SAME),
    ("bert/encoder/layer_{i}/output/LayerNorm/bias",
     "bert/encoder/layer_{i}/output/LayerNorm/beta", _SAME,
     "bert.encoder.layer.{i}.output.LayerNorm.bias", _SAME),
)

POOLER_ROWS = (
    ("bert/pooler/dense/kernel", "bert/pooler/dense/kernel", _SAME,
     "bert.pooler.dense.weight", _T),
    ("bert/pooler/dense/bias", "bert/pooler/dense/bias", _SAME, "bert.pooler.dense.bias", _SAME),
)

PRETRAINING_HEAD_ROWS = (
    ("cls/predictions/transform/dense/kernel", "cls/predictions/transform/dense/kernel", _SAME,
     "cls.predictions.transform.dense.weight", _T),
    ("cls/predictions/transform/dense/bias", "cls/predictions/transform/dense/bias", _SAME,
     "cls.predictions.transform.dense.bias", _SAME),
    ("cls/predictions/transform/LayerNorm/scale", "cls/predictions/transform/LayerNorm/gamma",
     _SAME, "cls.predictions.transform.LayerNorm.weight", _SAME),
    ("cls/predictions/transform/LayerNorm/bias", "cls/predictions/transform/LayerNorm/beta",
     _SAME, "cls.predictions.transform.LayerNorm.bias", _SAME),
    ("cls/predictions/output_bias", "cls/predictions/output_bias", _SAME,
     "cls.predictions.bias", _SAME),
    ("cls/seq_relationship/kernel", "cls/seq_relationship/output_weights", _T,
     "cls.seq_relationship.weight", _T),
    ("cls/seq_relationship/bias", "cls/seq_relationship/output_bias", _SAME,
     "cls.seq_relationship.bias", _SAME),
)

# Hugging Face tensors that carry no information of their own: buffers and the tied decoder.
HF_DERIVED = {
    "bert.embeddings.position_ids": None,
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}


@dataclasses.dataclass(frozen=True)
class Row:
  ours: str
  tf1: str
  tf1_layout: str
  hf: str
  hf_layout: str


def name_table(num_layers: int, pooler: bool = True, pretraining_heads: bool = True) -> list[Row]:
  """The table expanded for a model with `num_layers` layers."""
  rows = [Row(*r) for r in EMBEDDING_ROWS]
  for i in range(num_layers):
    rows += [Row(*(c.format(i=i) for c in r)) for r in LAYER_ROWS]
  if pooler:
    rows += [Row(*r) for r in POOLER_ROWS]
  if pretraining_heads:
    rows += [Row(*r) for r in PRETRAINING_HEAD_ROWS]
  return rows


def _to_layout(array: np.ndarray, layout: str) -> np.ndarray:
  return np.ascontiguousarray(array.T) if layout == _T else array


# ------------------------------------------------------------------------- tree <-> flat paths
def flatten_params(params: Mapping) -> dict[str, np.ndarray]:
  """{'bert': {'embeddings': {...}}} → {'bert/embeddings/...': array}."""
  flat = {}

  def visit(prefix, tree):
    for key, value in tree.items():
      path = f"{prefix}/{key}" if prefix else str(key)
      if isinstance(value, Mapping):
        visit(path, value)
      else:
        flat[path] = value
  visit("", params)
  return flat


def unflatten_params(flat: Mapping[str, np.ndarray]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree


# ----------------------------------------------------------------------- Hugging Face reading
@dataclasses.dataclass
class LoadReport:
  """What a conversion found. `missing` are our parameters the checkpoint lacks (left to the
  caller's initialisation); `unexpected` are checkpoint tensors nothing here reads."""
  source: str
  missing: list[str] = dataclasses.field(default_factory=list)
  unexpected: list[str] = dataclasses.field(default_factory=list)
  # Training state stored beside the weights (TF1 optimizer moments, global_step): not weights,
  # so not `unexpected`, but counted so that a summary accounts for every stored tensor.
  skipped: list[str] = dataclasses.field(default_factory=list)

  def summary(self) -> str:
    parts = [f"{self.source}:"]
    parts.append(f"{len(self.missing)} parameters not in the checkpoint" +
                 (f" ({', '.join(sorted(self.missing)[:6])}{' ...' if len(self.missing) > 6 else ''})"
                  if self.missing else ""))
    parts.append(f"{len(self.unexpected)} checkpoint tensors unused" +
                 (f" ({', '.join(sorted(self.unexpected)[:6])}{' ...' if len(self.unexpected) > 6 else ''})"
                  if self.unexpected else ""))
    if self.skipped:
      parts.append(f"{len(self.skipped)} optimizer variables skipped")
    return " ".join(parts)


def _normalise_hf_names(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Adds the `bert.` prefix where a bare `BertModel` was saved and renames the pre-2020
  `LayerNorm.gamma/beta` to `weight/bias`, as transformers itself does when loading."""
  bare = not any(k.startswith("bert.") for k in state)
  out = {}
  for key, value in state.items():
    if bare and not key.startswith("cls."):
      key = "bert." + key
    if ".LayerNorm.gamma" in key or ".LayerNorm.beta" in key:
      key = key.replace(".LayerNorm.gamma", ".LayerNorm.weight").replace(
          ".LayerNorm.beta", ".LayerNorm.bias")
    out[key] = value
  return out


def _apply_table(state: Mapping[str, np.ndarray], config: BertConfig, column: str,
                 source: str) -> tuple[dict, LoadReport, set[str]]:
  """Stored tensors named by the table's `column` ("hf" or "tf1") → our tree, plus what was
  missing and which stored names were read. The one place where the table is applied to a
  checkpoint, so the two formats cannot diverge in what they check.

  Shapes are checked against `config` (in the checkpoint's own layout, so that the message
  shows the shapes as they are stored); every mismatch is listed in one error.
  """
  from bert_jax.modeling import stack_layers
  expected = expected_shapes(config)
  report = LoadReport(source)
  flat, errors, used = {}, [], set()
  for row in name_table(config.num_hidden_layers):
    name, layout = getattr(row, column), getattr(row, column + "_layout")
    if name not in state:
      report.missing.append(row.ours)
      continue
    stored = np.asarray(state[name])
    used.add(name)
    want = expected[row.ours][::-1] if layout == _T else expected[row.ours]
    if tuple(stored.shape) != want:
      errors.append(f"  {name}: checkpoint {tuple(stored.shape)} vs model {want}")
      continue
    flat[row.ours] = _to_layout(stored, layout).astype(np.float32)
  if errors:
    raise ValueError(f"{source}: tensor shapes disagree with the config:\n" + "\n".join(errors))
  params = unflatten_params(flat)
  if config.scan_layers and "bert" in params and "encoder" in params["bert"]:
    params = stack_layers(params, config.num_hidden_layers)
  return params, report, used


def hf_state_to_params(state: Mapping[str, np.ndarray], config: BertConfig,
                       source: str = "<state dict>") -> tuple[dict, LoadReport]:
  """Hugging Face tensors (numpy) → our parameter tree (unrolled layers), plus what was missing.

  Shapes are checked against `config`; every mismatch is listed in one error.
  """
  state = _normalise_hf_names(state)
  params, report, used = _apply_table(state, config, "hf", source)
  for key in state:
    if key in used:
      continue
    if key in HF_DERIVED:
      twin = HF_DERIVED[key]
      if twin is not None and twin in state and not np.array_equal(state[key], state[twin]):
        report.unexpected.append(f"{key} (differs from {twin}; untied decoders are not supported)")
      continue
    report.unexpected.append(key)
  return params, report


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  from safetensors.numpy import load as load_bytes
  return load_bytes(file_io.read_bytes(path))


def read_hf_state(directory: str) -> dict[str, np.ndarray]:
  """All tensors of a Hugging Face checkpoint directory (single or sharded safetensors)."""
  single = file_io.join(directory, "model.safetensors")
  index = file_io.join(directory, "model.safetensors.index.json")
  if file_io.exists(single):
    return _read_safetensors(single)
  if file_io.exists(index):
    weight_map = json.loads(file_io.read_text(index))["weight_map"]
    state = {}
    for shard in sorted(set(weight_map.values())):
      state.update(_read_safetensors(file_io.join(directory, shard)))
    return state
  if file_io.exists(file_io.join(directory, "pytorch_model.bin")):
    raise ValueError(f"{directory}: only pytorch_model.bin found; convert it to safetensors "
                     "first (transformers: model.save_pretrained(dir, safe_serialization=True)).")
  raise FileNotFoundError(f"{directory}: no model.safetensors or model.safetensors.index.json.")


def load_hf_checkpoint(directory: str, **config_overrides) -> tuple[BertConfig, dict, LoadReport]:
  """A Hugging Face BERT directory → `(config, params, report)`.

  Works for `BertModel` (keys without prefix), `BertForPreTraining` / `BertForMaskedLM` (with
  `bert.` and `cls.*`), with or without pooler. Parameters the checkpoint lacks are listed in
  `report.missing`; `merge_params` fills them from an initialised tree.
  """
  config = BertConfig.from_json_file(file_io.join(directory, "config.json"))
  if config_overrides:
    config = config.replace(**config_overrides)
  params, report = hf_state_to_params(read_hf_state(directory), config, source=directory)
  return config, params, report


# ----------------------------------------------------------------------- Hugging Face writing
def _params_to_state(params: Mapping, config: BertConfig, column: str,
                     format_name: str) -> dict[str, np.ndarray]:
  """Our tree (scanned or not) → the table's `column` names and layouts, numpy float32.
  Parameters without a row are an error rather than left out, so an export is never silently
  partial."""
  from bert_jax.modeling import unstack_layers
  params = _to_numpy(params)
  if "bert" in params and "layer" in params["bert"].get("encoder", {}):
    params = unstack_layers(params, config.num_hidden_layers)
  flat = flatten_params(params)
  rows = name_table(config.num_hidden_layers)
  state = {}
  for row in rows:
    if row.ours in flat:
      state[getattr(row, column)] = _to_layout(np.asarray(flat[row.ours], np.float32),
                                               getattr(row, column + "_layout"))
  unknown = sorted(set(flat) - {r.ours for r in rows})
  if unknown:
    raise ValueError(f"No {format_name} name for parameters: {', '.join(unknown)}")
  return state


def params_to_hf_state(params: Mapping, config: BertConfig) -> dict[str, np.ndarray]:
  """Our tree (scanned or not) → Hugging Face tensor names and layouts, numpy float32."""
  return _params_to_state(params, config, "hf", "Hugging Face")


def save_hf_checkpoint(params: Mapping, config: BertConfig, directory: str) -> str:
  """Writes `config.json` + `model.safetensors` that `transformers` loads.

  With `cls/*` heads present the architecture is `BertForPreTraining` (keys prefixed `bert.`);
  an encoder-only tree is written as a bare `BertModel`, like most checkpoints on the hub.
  Files are written under temporary names and renamed when complete.
  """
  from safetensors.numpy import save as save_bytes
  state = params_to_hf_state(params, config)
  has_heads = any(k.startswith("cls.") for k in state)
  if not has_heads:
    state = {k[len("bert."):]: v for k, v in state.items()}
  arch = ("BertForPreTraining",) if has_heads else ("BertModel",)
  file_io.makedirs(directory)
  file_io.write_bytes_atomic(file_io.join(directory, "model.safetensors"),
                             save_bytes(state, metadata={"format": "pt"}))
  file_io.write_text_atomic(file_io.join(directory, "config.json"),
                            json.dumps(config.to_hf_dict(arch), indent=2, sort_keys=True) + "\n")
  return directory


# ------------------------------------------------------------------ TF1 (Google's release)
# Released BERT checkpoints are a directory with `bert_model.ckpt.{index,data-*}`,
# `bert_config.json` and `vocab.txt`; variables carry the names of the table's `tf1` column.
TF1_PREFIX_NAME = "bert_model.ckpt"
TF1_CONFIG_NAME = "bert_config.json"

# What training leaves in a checkpoint besides the weights: the moments of the original
# optimization.py (`adam_m`, `adam_v`), tf.train.AdamOptimizer's slots and powers, the step.
_TF1_OPTIMIZER_SUFFIXES = ("/adam_m", "/adam_v", "/Adam", "/Adam_1")
_TF1_OPTIMIZER_NAMES = ("global_step", "beta1_power", "beta2_power")

# A checkpoint's own files: `prefix.index` and `prefix.data-00000-of-00001`.
_TF1_FILE_SUFFIX = re.compile(r"\.(index|data-\d+-of-\d+)$")


_tf = file_io.tensorflow  # only where a TF1 checkpoint is read or written


def is_tf1_optimizer_variable(name: str) -> bool:
  """True for optimizer state and the step counter, which are skipped (and counted) on load."""
  return name in _TF1_OPTIMIZER_NAMES or name.endswith(_TF1_OPTIMIZER_SUFFIXES)


def _dirname(path: str) -> str:
  return path.rsplit("/", 1)[0] if file_io.is_remote(path) else os.path.dirname(path)


def _glob(pattern_dir: str, pattern: str) -> list[str]:
  if file_io.is_remote(pattern_dir):
    return file_io.glob(file_io.join(pattern_dir, pattern))
  return file_io.glob(os.path.join(glob.escape(pattern_dir), pattern))


def _tf1_prefix(path: str) -> str | None:
  """The checkpoint prefix that `path` names (the prefix itself, or its `.index` / `.data-*`
  file, a common slip when pasting a path), else None."""
  for candidate in dict.fromkeys((path, _TF1_FILE_SUFFIX.sub("", path))):
    if file_io.exists(candidate + ".index"):
      return candidate
  return None


def _tf1_prefixes_in(directory: str) -> list[str]:
  """Prefixes of the TF1 checkpoints directly in `directory`: the one that a `checkpoint` state
  file names (TF1 training output), else every `*.index` (Google's release has no state file)."""
  if file_io.exists(file_io.join(directory, "checkpoint")):
    try:
      latest = _tf().train.latest_checkpoint(directory)
    except Exception:  # pylint: disable=broad-except  # not a state file: fall back to *.index
      latest = None
    if latest:
      return [latest]
  return sorted(p[:-len(".index")] for p in _glob(directory, "*.index"))


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
  kind, where = checkpoint_kind(path)
  if kind != "tf1":
    raise ValueError(f"{path}: expected a TF1 checkpoint, found {KIND_NAMES[kind]} ({where}).")
  # The reader itself, not tf.train.load_checkpoint: the prefix is resolved already, and some
  # filesystems (ram://) call a prefix a directory, which load_checkpoint then searches.
  return where, _tf().compat.v1.train.NewCheckpointReader(where)


def tf1_state_to_params(state: Mapping[str, np.ndarray], config: BertConfig,
                        source: str = "<TF1 variables>") -> tuple[dict, LoadReport]:
  """TF1 variables (numpy, by TF1 name) → our parameter tree (unrolled unless `config` scans),
  plus a report: our parameters the checkpoint lacks (`missing`), variables nothing here reads
  such as a fine-tuned classifier's `output_weights` (`unexpected`), and optimizer variables
  (`skipped`). Shapes are checked against `config`; every mismatch is listed in one error.
  """
  weights = {k: v for k, v in state.items() if not is_tf1_optimizer_variable(k)}
  params, report, used = _apply_table(weights, config, "tf1", source)
  report.unexpected = sorted(set(weights) - used)
  report.skipped = sorted(set(state) - set(weights))
  return params, report


def load_tf1_checkpoint(path: str, bert_config_file: str | None = None, **config_overrides
                        ) -> tuple[BertConfig, dict, LoadReport]:
  """A TF1 checkpoint (Google's release or the original code's training output) →
  `(config, params, report)`.

  `path` is the prefix (`.../bert_model.ckpt`) or its directory. The config is
  `bert_config_file`, else the `bert_config.json` beside the checkpoint. Optimizer variables are
  never read from disk, only counted in `report.skipped`.
  """
  prefix, reader = _open_tf1(path)
  config_file = bert_config_file or file_io.join(_dirname(prefix) or ".", TF1_CONFIG_NAME)
  if not file_io.exists(config_file):
    raise FileNotFoundError(f"{prefix}: no {TF1_CONFIG_NAME} beside the checkpoint "
                            f"({config_file}); give the model's config file "
                            "(--bert_config_file).")
  config = BertConfig.from_json_file(config_file)
  if config_overrides:
    config = config.replace(**config_overrides)
  names = sorted(reader.get_variable_to_shape_map())
  state = {n: reader.get_tensor(n) for n in names if not is_tf1_optimizer_variable(n)}
  params, report = tf1_state_to_params(state, config, source=prefix)
  report.skipped = [n for n in names if is_tf1_optimizer_variable(n)]
  return config, params, report


def params_to_tf1_state(params: Mapping, config: BertConfig) -> dict[str, np.ndarray]:
  """Our tree (scanned or not) → TF1 variable names and layouts, numpy float32."""
  return _params_to_state(params, config, "tf1", "TF1")


def _original_config_json(config: BertConfig) -> str:
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
  file_io.makedirs(_dirname(prefix) or ".")
  names = sorted(state)
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=[tf.constant(state[n]) for n in names])
  file_io.write_text_atomic(file_io.join(_dirname(prefix) or ".", TF1_CONFIG_NAME),
                            _original_config_json(config))
  return prefix


# ------------------------------------------------------------------------------------ helpers
def _to_numpy(tree):
  if isinstance(tree, Mapping):
    return {k: _to_numpy(v) for k, v in tree.items()}
  return np.asarray(tree)


def expected_shapes(config: BertConfig) -> dict[str, tuple[int, ...]]:
  """Shape of every parameter of the pre-training model in the unrolled layout, from the model
  itself (eval_shape), so the table and the modules cannot drift apart unnoticed."""
  import jax
  import jax.numpy as jnp
  import flax.linen as nn
  from bert_jax.heads import BertForPreTraining
  cfg = config.replace(scan_layers=False, remat_policy="none")
  ids = jnp.zeros((1, 8), jnp.int32)
  abstract = jax.eval_shape(
      lambda: nn.unbox(BertForPreTraining(cfg).init(
          jax.random.PRNGKey(0), ids, ids, ids, jnp.zeros((1, 2), jnp.int32))["params"]))
  return {k: tuple(v.shape) for k, v in flatten_params(abstract).items()}


def merge_params(base: Mapping, loaded: Mapping, where: str = "checkpoint") -> dict:
  """`base` with every leaf that `loaded` has replaced; shapes must agree (all listed if not)."""
  base_flat, loaded_flat = flatten_params(base), flatten_params(loaded)
  unknown = sorted(set(loaded_flat) - set(base_flat))
  mismatched = [f"  {k}: {where} {tuple(np.shape(v))} vs model {tuple(np.shape(base_flat[k]))}"
                for k, v in loaded_flat.items()
                if k in base_flat and tuple(np.shape(v)) != tuple(np.shape(base_flat[k]))]
  if unknown or mismatched:
    msg = [f"{where} does not fit the model:"]
    if mismatched:
      msg += ["shape mismatches:"] + mismatched
    if unknown:
      msg += ["parameters the model does not have: " + ", ".join(unknown)]
    raise ValueError("\n".join(msg))
  merged = dict(base_flat)
  merged.update(loaded_flat)
  return unflatten_params(merged)


# ------------------------------------------------------------------- any checkpoint, one call
# A TF1 checkpoint (Google's release), a Hugging Face directory, our pre-training workdir
# (bert_config.json + checkpoints/) or an Orbax checkpoint directory: the commands accept all of
# them through `load_encoder` and `load_pretraining_model`, and `checkpoint_kind` tells them
# apart.
KIND_NAMES = {"tf1": "a TF1 checkpoint", "hf": "a Hugging Face directory",
              "orbax": "an Orbax checkpoint (our workdir or checkpoint directory)"}

_HF_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")

_LOOKED_FOR = (
    "  TF1 (Google's release): PATH.index, i.e. PATH is a checkpoint prefix such as "
    ".../bert_model.ckpt; or a directory with one *.index file (or a 'checkpoint' file)\n"
    "  Hugging Face: a directory with " + ", ".join(_HF_FILES) + "\n"
    "  Orbax (our runs): a directory with checkpoints/ (a workdir) or numbered step directories")


def _is_hf_dir(path: str) -> bool:
  return any(file_io.exists(file_io.join(path, f)) for f in _HF_FILES)


def _is_orbax_dir(path: str) -> bool:
  """A workdir (checkpoints/) or a CheckpointManager directory (step directories 0, 100, ...)."""
  if file_io.isdir(file_io.join(path, "checkpoints")):
    return True
  return any(n.isdigit() and file_io.isdir(file_io.join(path, n))
             for n in file_io.listdir(path))


def checkpoint_kind(path: str) -> tuple[str, str]:
  """Which kind of checkpoint `path` is, and where it is exactly: `("tf1", prefix)`,
  `("hf", directory)` or `("orbax", directory)`.

  Only what lies directly at `path` counts, nothing is searched for below it:
    tf1    `path.index` exists (`path` is the prefix; its `.index`/`.data-*` file also works), or
           `path` is a directory with exactly one `*.index`, or a `checkpoint` state file;
    hf     a directory with model.safetensors, its sharded index, or pytorch_model.bin;
    orbax  a directory with `checkpoints/` or numbered step directories.
  A directory matching two kinds, several TF1 checkpoints or none of the kinds is an error that
  says what was found and what was looked for, rather than a guess.
  """
  path = str(path)
  if len(path) > 1 and path.endswith("/") and not path.endswith("://"):
    path = path.rstrip("/")
  prefix = _tf1_prefix(path)
  if prefix is not None:
    return "tf1", prefix
  if not file_io.exists(path):
    raise FileNotFoundError(f"{path} does not exist (nor does {path}.index). Looked for:\n"
                            + _LOOKED_FOR)
  if not file_io.isdir(path):
    raise ValueError(f"{path} is a file, not a checkpoint this package reads. Looked for:\n"
                     + _LOOKED_FOR)
  found = []
  tf1 = _tf1_prefixes_in(path)
  if len(tf1) > 1:
    raise ValueError(f"{path} holds several TF1 checkpoints ({', '.join(tf1)}); pass the prefix "
                     f"of one, e.g. {tf1[-1]}.")
  if tf1:
    found.append(("tf1", tf1[0]))
  if _is_hf_dir(path):
    found.append(("hf", path))
  if _is_orbax_dir(path):
    found.append(("orbax", path))
  if len(found) == 1:
    return found[0]
  if not found:
    raise ValueError(f"{path} is not a checkpoint this package reads. Looked for:\n"
                     + _LOOKED_FOR)
  raise ValueError(f"{path} holds more than one kind of checkpoint ("
                   + "; ".join(f"{KIND_NAMES[k]}: {w}" for k, w in found)
                   + "). Pass a TF1 checkpoint by its prefix, or keep the kinds in separate "
                   "directories.")


def _load_orbax(path: str, subtree: str) -> tuple[BertConfig, Any, str]:
  """A subtree of a workdir's (or checkpoint directory's) latest checkpoint, with its config."""
  workdir_config = file_io.join(path, "bert_config.json")
  ckpt_dir = (file_io.join(path, "checkpoints")
              if file_io.exists(file_io.join(path, "checkpoints")) else path)
  tree, meta = checkpointing.load_params(ckpt_dir, subtree=subtree)
  config = (BertConfig.from_json_file(workdir_config) if file_io.exists(workdir_config)
            else BertConfig.from_dict(meta["bert_config"], source=ckpt_dir))
  return config, _to_numpy(tree), ckpt_dir


def _load_any(path: str, bert_config_file: str | None = None
              ) -> tuple[BertConfig, dict, LoadReport | None, str, str]:
  """`(config, params, report or None, kind, location)` of any checkpoint, layers as stored
  (`config.scan_layers` says which)."""
  kind, where = checkpoint_kind(path)
  if kind == "tf1":
    config, params, report = load_tf1_checkpoint(where, bert_config_file)
    return config, params, report, kind, where
  if kind == "hf":
    config, params, report = load_hf_checkpoint(where)
    return config, params, report, kind, where
  config, params, ckpt_dir = _load_orbax(where, "params")
  return (config.replace(scan_layers="layer" in params["bert"]["encoder"]), params, None, kind,
          ckpt_dir)


def _in_layout(params: dict, config: BertConfig, scan_layers: bool) -> dict:
  """`params` in the scanned or the unrolled layout, whichever they are stored in."""
  from bert_jax import modeling  # pylint: disable=g-import-not-at-top
  scanned = "layer" in params["bert"]["encoder"]
  if scan_layers and not scanned:
    return _to_numpy(modeling.stack_layers(params, config.num_hidden_layers))
  if scanned and not scan_layers:
    return modeling.unstack_layers(params, config.num_hidden_layers)
  return params


def load_pretraining_model(path: str, require_heads: bool = True,
                           scan_layers: bool | None = None) -> tuple[BertConfig, Any]:
  """`(config, params)` of a pre-training model (encoder + cls heads) from any checkpoint.

  `require_heads=False` accepts an encoder-only checkpoint (the heads are then absent from
  `params`, for `merge_params` to fill). `scan_layers` converts the layers to that layout;
  None keeps the stored one.
  """
  config, params, report, kind, where = _load_any(path)
  if report is not None:
    logging.info("%s", report.summary())
    heads = sorted(m for m in report.missing if m.startswith("cls/"))
    if require_heads and heads:
      names = "cls.*" if kind == "hf" else "cls/*"
      raise ValueError(f"{path}: the checkpoint has no pre-training heads ({names}: "
                       f"{len(heads)} missing); fill-mask needs a BertForPreTraining / "
                       "BertForMaskedLM checkpoint or Google's original release.")
  if scan_layers is not None:
    params = _in_layout(params, config, scan_layers)
    config = config.replace(scan_layers=scan_layers)
  return config, params


def load_encoder(init_checkpoint: str | None, bert_config_file: str | None = None
                 ) -> tuple[BertConfig, Any | None, str]:
  """`(config, encoder params in the unrolled layout or None, where they came from)`.

  `bert_config_file`, when given, is the config (and must fit the checkpoint); a TF1
  checkpoint without `bert_config.json` beside it needs one, as the original code did.
  """
  config = BertConfig.from_json_file(bert_config_file) if bert_config_file else None
  if not init_checkpoint:
    if config is None:
      raise ValueError("Give --init_checkpoint or --bert_config_file.")
    return config, None, "encoder initialised from scratch (no --init_checkpoint)"
  kind, where = checkpoint_kind(init_checkpoint)
  if kind == "tf1":
    tf1_config, params, report = load_tf1_checkpoint(where, bert_config_file)
    logging.info("%s", report.summary())
    unused = (f" ({len(report.unexpected)} variables unused: "
              f"{', '.join(report.unexpected[:4])}{' ...' if len(report.unexpected) > 4 else ''})"
              if report.unexpected else "")
    return tf1_config, params["bert"], f"TF1 checkpoint {where}{unused}"
  if kind == "hf":
    hf_config, params, _ = load_hf_checkpoint(where)
    return config or hf_config, params["bert"], f"Hugging Face checkpoint {where}"
  ckpt_config, encoder, ckpt_dir = _load_orbax(where, "params/bert")
  config = config or ckpt_config
  if "layer" in encoder.get("encoder", {}):  # scanned layout → the unrolled layout
    from bert_jax import modeling  # pylint: disable=g-import-not-at-top
    encoder = modeling.unstack_layers(encoder, config.num_hidden_layers)
  return config, encoder, f"checkpoint {ckpt_dir}"


# ---------------------------------------------------------------------------- command line
def save_orbax_params(params: Mapping, config: BertConfig, directory: str) -> str:
  """Writes `params` as a workdir that `load_encoder`, `load_pretraining_model` and pre-training
  with `init_mode="params"` read: `bert_config.json` + `checkpoints/0` (weights only, so not a
  run that `init_mode="continue"` could resume)."""
  manager = checkpointing.CheckpointManager(file_io.join(directory, "checkpoints"),
                                            max_to_keep=None, async_save=False)
  manager.save(0, {"params": _to_numpy(params)}, {}, {"bert_config": config.to_hf_dict()})
  manager.close()
  file_io.write_text_atomic(file_io.join(directory, TF1_CONFIG_NAME),
                            _original_config_json(config))
  return directory


def main(argv: list[str] | None = None) -> None:
  """python -m bert_jax.convert --from=PATH --to=DIR --format=hf|tf1|orbax"""
  parser = argparse.ArgumentParser(
      prog="python -m bert_jax.convert",
      description="Convert a BERT checkpoint of any kind this package reads (TF1 prefix or "
                  "directory, Hugging Face directory, our workdir / Orbax directory).")
  parser.add_argument("--from", dest="source", required=True, help="checkpoint to read")
  parser.add_argument("--to", dest="target", required=True,
                      help="output directory (for tf1 also a prefix such as DIR/bert_model.ckpt)")
  parser.add_argument("--format", required=True, choices=("hf", "tf1", "orbax"))
  parser.add_argument("--bert_config_file", default=None,
                      help="config of a TF1 checkpoint that has no bert_config.json beside it")
  args = parser.parse_args(argv)
  config, params, report, kind, where = _load_any(args.source, args.bert_config_file)
  print(f"read {KIND_NAMES[kind]}: {report.summary() if report else where}")
  if config.scan_layers:
    params = _in_layout(params, config, False)
    config = config.replace(scan_layers=False)
  if args.format == "hf":
    written = save_hf_checkpoint(params, config, args.target)
  elif args.format == "tf1":
    written = save_tf1_checkpoint(params, config, args.target)
  else:
    written = save_orbax_params(params, config, args.target)
  # The vocabulary travels with the weights: every consumer of a checkpoint needs both.
  source_dir = _dirname(where) if kind == "tf1" else args.source
  vocab = file_io.join(source_dir or ".", "vocab.txt")
  target_dir = _dirname(written) if args.format == "tf1" else written
  if file_io.exists(vocab):
    file_io.write_bytes_atomic(file_io.join(target_dir or ".", "vocab.txt"),
                               file_io.read_bytes(vocab))
  print(f"wrote {args.format}: {written}")


if __name__ == "__main__":
  main()
