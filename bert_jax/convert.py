"""Checkpoint interop: Hugging Face BERT directories (and the TF1 names) ↔ our parameters.

The whole correspondence is `NAME_TABLE`: one row per tensor, with our path, the original TF1
variable name and the Hugging Face (PyTorch) name, plus how the array is laid out in each
(`T` = transposed: PyTorch `Linear.weight` is (out, in), our and TF1 kernels are (in, out)).
Everything else here only reads and writes files and applies that table.

Our parameter tree is the pre-training model's: `{'bert': {...}, 'cls': {...}}`; a bare encoder
is `params['bert']`. Layers are in the unrolled layout (`layer_{i}`); scanned models are
converted with `modeling.stack_layers` / `unstack_layers`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

import numpy as np

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

  def summary(self) -> str:
    parts = [f"{self.source}:"]
    parts.append(f"{len(self.missing)} parameters not in the checkpoint" +
                 (f" ({', '.join(sorted(self.missing)[:6])}{' ...' if len(self.missing) > 6 else ''})"
                  if self.missing else ""))
    parts.append(f"{len(self.unexpected)} checkpoint tensors unused" +
                 (f" ({', '.join(sorted(self.unexpected)[:6])}{' ...' if len(self.unexpected) > 6 else ''})"
                  if self.unexpected else ""))
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


def hf_state_to_params(state: Mapping[str, np.ndarray], config: BertConfig,
                       source: str = "<state dict>") -> tuple[dict, LoadReport]:
  """Hugging Face tensors (numpy) → our parameter tree (unrolled layers), plus what was missing.

  Shapes are checked against `config`; every mismatch is listed in one error.
  """
  from bert_jax.modeling import stack_layers
  state = _normalise_hf_names(state)
  expected = expected_shapes(config)
  report = LoadReport(source)
  flat, errors, used = {}, [], set()
  for row in name_table(config.num_hidden_layers):
    if row.hf not in state:
      report.missing.append(row.ours)
      continue
    value = _to_layout(np.asarray(state[row.hf]), row.hf_layout)
    used.add(row.hf)
    if tuple(value.shape) != expected[row.ours]:
      errors.append(f"  {row.hf}: checkpoint {tuple(value.shape)} (as ours) vs model "
                    f"{expected[row.ours]}")
      continue
    flat[row.ours] = value.astype(np.float32)
  if errors:
    raise ValueError(f"{source}: tensor shapes disagree with the config:\n" + "\n".join(errors))
  for key in state:
    if key in used:
      continue
    if key in HF_DERIVED:
      twin = HF_DERIVED[key]
      if twin is not None and twin in state and not np.array_equal(state[key], state[twin]):
        report.unexpected.append(f"{key} (differs from {twin}; untied decoders are not supported)")
      continue
    report.unexpected.append(key)
  params = unflatten_params(flat)
  if config.scan_layers and "bert" in params and "encoder" in params["bert"]:
    params = stack_layers(params, config.num_hidden_layers)
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
def params_to_hf_state(params: Mapping, config: BertConfig) -> dict[str, np.ndarray]:
  """Our tree (scanned or not) → Hugging Face tensor names and layouts, numpy float32."""
  from bert_jax.modeling import unstack_layers
  params = _to_numpy(params)
  if "bert" in params and "layer" in params["bert"].get("encoder", {}):
    params = unstack_layers(params, config.num_hidden_layers)
  flat = flatten_params(params)
  state = {}
  for row in name_table(config.num_hidden_layers):
    if row.ours in flat:
      state[row.hf] = _to_layout(np.asarray(flat[row.ours], np.float32), row.hf_layout)
  unknown = sorted(set(flat) - {r.ours for r in name_table(config.num_hidden_layers)})
  if unknown:
    raise ValueError(f"No Hugging Face name for parameters: {', '.join(unknown)}")
  return state


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
# Our pre-training workdir (bert_config.json + checkpoints/), an Orbax checkpoint directory, or a
# Hugging Face directory: the commands accept all of them through these two functions.
def _is_hf_dir(path: str) -> bool:
  return file_io.exists(file_io.join(path, "model.safetensors")) or file_io.exists(
      file_io.join(path, "model.safetensors.index.json"))


def _load_orbax(path: str, subtree: str) -> tuple[BertConfig, Any, str]:
  """A subtree of a workdir's (or checkpoint directory's) latest checkpoint, with its config."""
  workdir_config = file_io.join(path, "bert_config.json")
  ckpt_dir = (file_io.join(path, "checkpoints")
              if file_io.exists(file_io.join(path, "checkpoints")) else path)
  tree, meta = checkpointing.load_params(ckpt_dir, subtree=subtree)
  config = (BertConfig.from_json_file(workdir_config) if file_io.exists(workdir_config)
            else BertConfig.from_dict(meta["bert_config"], source=ckpt_dir))
  return config, _to_numpy(tree), ckpt_dir


def load_pretraining_model(path: str) -> tuple[BertConfig, Any]:
  """`(config, params)` of a pre-training model (encoder + cls heads) from any checkpoint."""
  if _is_hf_dir(path):
    config, params, report = load_hf_checkpoint(path)
    if any(m.startswith("cls/") for m in report.missing):
      raise ValueError(f"{path}: the checkpoint has no pre-training heads (cls.*); fill-mask "
                       "needs a BertForPreTraining / BertForMaskedLM checkpoint.")
    return config, params
  config, params, _ = _load_orbax(path, "params")
  return config.replace(scan_layers="layer" in params["bert"]["encoder"]), params


def load_encoder(init_checkpoint: str | None, bert_config_file: str | None = None
                 ) -> tuple[BertConfig, Any | None, str]:
  """`(config, encoder params in the unrolled layout or None, where they came from)`.

  `bert_config_file`, when given, is the config (and must fit the checkpoint).
  """
  config = BertConfig.from_json_file(bert_config_file) if bert_config_file else None
  if not init_checkpoint:
    if config is None:
      raise ValueError("Give --init_checkpoint or --bert_config_file.")
    return config, None, "encoder initialised from scratch (no --init_checkpoint)"
  if _is_hf_dir(init_checkpoint):
    hf_config, params, _ = load_hf_checkpoint(init_checkpoint)
    return config or hf_config, params["bert"], f"Hugging Face checkpoint {init_checkpoint}"
  ckpt_config, encoder, ckpt_dir = _load_orbax(init_checkpoint, "params/bert")
  config = config or ckpt_config
  if "layer" in encoder.get("encoder", {}):  # scanned layout → the unrolled layout
    from bert_jax import modeling  # pylint: disable=g-import-not-at-top
    encoder = modeling.unstack_layers(encoder, config.num_hidden_layers)
  return config, encoder, f"checkpoint {ckpt_dir}"
