"""Google's TF1 checkpoints (`bert_model.ckpt.{index,data-*}` + `bert_config.json`) ↔ ours.

ELECTRA's (google-research/electra: `electra/...` discriminator and `generator/...` variables,
no config file of its own; see `electra_config`) too. ALBERT's release
(google-research/albert) is read and written the same way, with
`albert_config.json` beside the checkpoint: its variables follow the ALBERT rows of the name
table, and its `hidden_act: "gelu"` means the tanh approximation (ALBERT's `modeling.gelu`),
which is `gelu_new` here.

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
from bert_jax.interop import hf_config, kinds, task_heads
from bert_jax.interop.names import LoadReport, apply_table, params_to_state
from bert_jax.model.configuration import BertConfig

# Released BERT checkpoints are a directory with `bert_model.ckpt.{index,data-*}`,
# `bert_config.json` and `vocab.txt`; variables carry the names of the table's `tf1` column.
TF1_PREFIX_NAME = "bert_model.ckpt"
TF1_CONFIG_NAME = "bert_config.json"
ALBERT_CONFIG_NAME = "albert_config.json"
# The activation names of ALBERT's config file ↔ ours: its "gelu" is the tanh form; the exact
# form, which its code does not know, is written as "gelu_exact" so that we read it back.
_ALBERT_ACT_TO_OURS = {"gelu": "gelu_new", "gelu_exact": "gelu"}
_TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_approximate")
# Variables that only an ALBERT checkpoint has; those of an ELECTRA one.
_ALBERT_MARKER = "bert/encoder/transformer/group_0/"
_ELECTRA_MARKER = "electra/"
_ELECTRA_GENERATOR_LAYER = "generator/encoder/layer_"

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


def read_albert_config(path: str) -> BertConfig:
  """An ALBERT release's `albert_config.json` (its field names, its meaning of "gelu")."""
  values = json.loads(file_io.read_text(path))
  if not isinstance(values, dict):
    raise ValueError(f"{path}: expected a JSON object with ALBERT config fields.")
  values["model_type"] = "albert"
  act = values.get("hidden_act")
  values["hidden_act"] = _ALBERT_ACT_TO_OURS.get(act, act)
  return hf_config.config_from_dict(values, source=path)


def read_config_file(path: str) -> BertConfig:
  """A config file by its kind: ALBERT's `albert_config.json`, else a BERT-style one
  (`bert_config.json`, Hugging Face `config.json`, ours, which carry `model_type`)."""
  if path.rstrip("/").rsplit("/", 1)[-1] == ALBERT_CONFIG_NAME:
    return read_albert_config(path)
  return hf_config.config_from_json_file(path)


def read_config(prefix: str, bert_config_file: str | None = None) -> BertConfig:
  """The config of the checkpoint at `prefix`: `bert_config_file`, else the `bert_config.json`
  (Google's BERT release) or `albert_config.json` (ALBERT's) beside it; the original code
  needed one too."""
  if bert_config_file:
    return read_config_file(bert_config_file)
  directory = dirname(prefix) or "."
  for name in (TF1_CONFIG_NAME, ALBERT_CONFIG_NAME):
    config_file = file_io.join(directory, name)
    if file_io.exists(config_file):
      return read_config_file(config_file)
  raise FileNotFoundError(f"{prefix}: no {TF1_CONFIG_NAME} beside the checkpoint (nor "
                          f"{ALBERT_CONFIG_NAME}; in {directory}); give the model's config file "
                          "(--bert_config_file).")


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
  if any(n.startswith(_ELECTRA_MARKER) for n in names):
    config = electra_config(config, reader.get_variable_to_shape_map(), prefix)
  albert_names = any(n.startswith(_ALBERT_MARKER) for n in names)
  if albert_names != (config.model_type == "albert"):
    family = "ALBERT" if albert_names else "BERT"
    raise ValueError(f"{prefix}: the checkpoint's variables are {family}'s but its config "
                     f"says model_type={config.model_type!r}; give the matching config file "
                     f"({ALBERT_CONFIG_NAME} for ALBERT).")
  state = {n: reader.get_tensor(n) for n in names if not is_tf1_optimizer_variable(n)}
  params, report = tf1_state_to_params(state, config, source=prefix)
  report.skipped = [n for n in names if is_tf1_optimizer_variable(n)]
  return config, params, report


def electra_config(config: BertConfig, shapes: Mapping[str, list[int]], source: str
                   ) -> BertConfig:
  """The config of an ELECTRA checkpoint (google-research/electra), from the given config and
  the variables' shapes. ELECTRA's releases have no config file of their own (their sizes come
  from its code's hyperparameters), so a BERT-style config of the discriminator is read as
  ELECTRA's, the embedding width is the table's, and the generator's width, depth and
  feed-forward size are its variables' (heads: max(1, width/64), ELECTRA's rule)."""
  table = shapes.get("electra/embeddings/word_embeddings")
  changes: dict = {"model_type": "electra"}
  if table is not None and table[1] != config.hidden_size:
    changes["embedding_size"] = int(table[1])
  layers = {int(n[len(_ELECTRA_GENERATOR_LAYER):].split("/", 1)[0]) for n in shapes
            if n.startswith(_ELECTRA_GENERATOR_LAYER)}
  if layers and not config.has_generator:
    query = shapes.get("generator/encoder/layer_0/attention/self/query/kernel")
    ffn = shapes.get("generator/encoder/layer_0/intermediate/dense/kernel")
    if query is None or ffn is None:
      raise ValueError(f"{source}: the generator's layer 0 lacks its query or intermediate "
                       "kernel; cannot tell the generator's shape.")
    changes.update(generator_hidden_size=int(query[1]), generator_num_hidden_layers=len(layers),
                   generator_intermediate_size=int(ffn[1]))
  if config.model_type not in ("bert", "electra"):
    raise ValueError(f"{source}: the checkpoint's variables are ELECTRA's but its config says "
                     f"model_type={config.model_type!r}.")
  return config.replace(**changes)


def params_to_tf1_state(params: Mapping, config: BertConfig,
                        head: task_heads.Head | None = None) -> dict[str, np.ndarray]:
  """Our tree (scanned or not) → TF1 variable names and layouts, numpy float32; a fine-tuned
  tree's `head` as Google's fine-tuning scripts name it (`task_heads.tf1_rows`)."""
  rows = task_heads.tf1_rows(head, config) if head else None
  return params_to_state(params, config, "tf1", "TF1", rows)


def original_config_json(config: BertConfig) -> str:
  """`bert_config.json` as the original code writes it. `layer_norm_eps` is added only when it
  is not the original's hard-coded 1e-12, so that our loaders keep a model that differs."""
  values = config.to_original_dict()
  if config.layer_norm_eps != 1e-12:
    values["layer_norm_eps"] = config.layer_norm_eps
  return json.dumps(values, indent=2, sort_keys=True) + "\n"


def albert_config_json(config: BertConfig) -> str:
  """`albert_config.json` as ALBERT's release has it: the BERT fields plus `embedding_size`
  and one group of one inner layer, "gelu" meaning its tanh form."""
  values = {k: v for k, v in config.to_original_dict().items() if k not in
            ("model_type", "embedding_size", "share_parameters")}
  values.update(embedding_size=config.embedding_width, num_hidden_groups=1, inner_group_num=1,
                net_structure_type=0, gap_size=0, num_memory_blocks=0, down_scale_factor=1)
  act = config.hidden_act
  values["hidden_act"] = "gelu" if act in _TANH_GELUS else ("gelu_exact" if act == "gelu" else act)
  if config.layer_norm_eps != 1e-12:
    values["layer_norm_eps"] = config.layer_norm_eps
  return json.dumps(values, indent=2, sort_keys=True) + "\n"


def save_tf1_checkpoint(params: Mapping, config: BertConfig, path: str,
                        head: task_heads.Head | None = None) -> str:
  """Writes a TF1 checkpoint with the original variable names and layouts, plus
  `bert_config.json` beside it; returns the checkpoint prefix.

  `path` is a directory (the checkpoint is `path/bert_model.ckpt`, as in Google's release) or,
  when its last component contains `.ckpt`, the prefix itself. The files are written by
  TensorFlow's own saver (SaveV2), so TF's reader, `tf.train.init_from_checkpoint` and the
  original `modeling.py` load them. Only weights are written: no optimizer variables, no step.
  A fine-tuned tree's `head` is named as `run_classifier.py` / `run_squad.py` name it.
  """
  state = params_to_tf1_state(params, config, head)
  name = path.rstrip("/").rsplit("/", 1)[-1]
  prefix = path.rstrip("/") if ".ckpt" in name else file_io.join(path, TF1_PREFIX_NAME)
  albert = config.model_type == "albert"
  known = ("gelu_new", "relu", "tanh") if albert else ("gelu", "relu", "tanh")
  if config.hidden_act not in known or config.layer_norm_eps != 1e-12:
    logging.warning("hidden_act=%s, layer_norm_eps=%g: the original modeling.py knows only "
                    "gelu/relu/tanh and hard-codes 1e-12; our loaders read the values from %s.",
                    config.hidden_act, config.layer_norm_eps,
                    ALBERT_CONFIG_NAME if albert else TF1_CONFIG_NAME)
  tf = _tf()
  file_io.makedirs(dirname(prefix) or ".")
  names = sorted(state)
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=[tf.constant(state[n]) for n in names])
  if albert:
    file_io.write_text_atomic(file_io.join(dirname(prefix) or ".", ALBERT_CONFIG_NAME),
                              albert_config_json(config))
  else:
    file_io.write_text_atomic(file_io.join(dirname(prefix) or ".", TF1_CONFIG_NAME),
                              original_config_json(config))
  return prefix
