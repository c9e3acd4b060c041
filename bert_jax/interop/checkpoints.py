"""Checkpoint resolution, in one room: which kind a path is, where its weights are, loading
the encoder or the whole model from any kind, merging, and writing weights as a run directory.

Kinds: our run directories (a workdir or fine-tuning output dir holding `checkpoints/`, or an
Orbax checkpoint directory itself), Hugging Face directories and Google's TF1 checkpoints. The
format readers are `interop/hf.py`, `interop/tf1.py` and `interop/checkpoint_store.py` (Orbax).
The init order of a run (`training/init_order.py`) reads every kind through this module.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

import numpy as np
from absl import logging

from bert_jax import file_io
from bert_jax.interop import checkpoint_store, hf, hf_config, kinds, tf1
from bert_jax.interop.names import LoadReport, flatten_params, to_numpy, unflatten_params
from bert_jax.model import electra, heads, modeling
from bert_jax.model.configuration import BertConfig

CHECKPOINTS = kinds.CHECKPOINTS
KIND_NAMES = kinds.KIND_NAMES
checkpoint_kind = kinds.checkpoint_kind


def orbax_directory(path: str) -> str:
  """The Orbax checkpoint directory of `path`: its `checkpoints/` when `path` is a run
  directory (workdir, fine-tuning output dir), else `path` itself."""
  nested = file_io.join(path, CHECKPOINTS)
  return nested if file_io.isdir(nested) else path


def run_metadata(path: str) -> dict[str, Any]:
  """The metadata item of an Orbax checkpoint's latest step (the task a fine-tuned model
  records, its input settings); raises FileNotFoundError when no step was saved."""
  ckpt_dir = orbax_directory(path)
  manager = checkpoint_store.CheckpointStore(ckpt_dir, max_to_keep=None, async_save=False)
  try:
    if manager.latest_step() is None:
      raise FileNotFoundError(f"{path}: no saved checkpoint in {ckpt_dir} (did the run save "
                              "one?).")
    return manager.restore_metadata()
  finally:
    manager.close()


# ------------------------------------------------------------------------ loading any kind
@dataclasses.dataclass
class Loaded:
  """A checkpoint's config and weights (layers in `config.scan_layers`'s layout)."""
  config: BertConfig
  params: dict
  report: LoadReport | None   # what the table found (HF, TF1); None for Orbax trees
  kind: str
  location: str               # the TF1 prefix, HF directory or Orbax checkpoint directory
  step: int | None = None     # the Orbax step that was read

  @property
  def origin(self) -> str:
    names = {"tf1": "TF1 checkpoint", "hf": "Hugging Face checkpoint", "orbax": "checkpoint"}
    return f"{names[self.kind]} {self.location}"


def _orbax_config(path: str, meta: Mapping[str, Any] | None = None) -> BertConfig:
  """A run directory's `bert_config.json`, else the config its checkpoint metadata records
  (read only then)."""
  workdir_config = file_io.join(path, tf1.TF1_CONFIG_NAME)
  if file_io.exists(workdir_config):
    return hf_config.config_from_json_file(workdir_config)
  meta = run_metadata(path) if meta is None else meta
  return hf_config.config_from_dict(meta["bert_config"], source=orbax_directory(path))


def load_any(path: str, bert_config_file: str | None = None, subtree: str = "params") -> Loaded:
  """Config and weights of any checkpoint kind, layers as stored. `subtree` limits what an
  Orbax checkpoint reads (`params/bert`: the encoder only, no head or optimizer state)."""
  kind, where = checkpoint_kind(path)
  if kind in ("tf1", "hf"):
    reader = tf1.load_tf1_checkpoint if kind == "tf1" else hf.load_hf_checkpoint
    config, params, report = reader(where, bert_config_file)
    logging.info("%s", report.summary())
    return Loaded(config, params, report, kind, where)
  ckpt_dir = orbax_directory(where)
  tree, meta = checkpoint_store.load_params(ckpt_dir, subtree=subtree)
  config = (tf1.read_config_file(bert_config_file) if bert_config_file
            else _orbax_config(where, meta))
  for key in reversed(subtree.split("/")[1:]):
    tree = {key: tree}
  params = to_numpy(tree)
  encoder = params.get("bert", {}).get("encoder", {})
  return Loaded(config.replace(scan_layers="layer" in encoder), params, None, kind, ckpt_dir,
                step=meta.get("step"))


def in_layout(params: dict, config: BertConfig, scan_layers: bool) -> dict:
  """`params` in the scanned or the unrolled layout, whichever they are stored in."""
  encoder = params.get("bert", {}).get("encoder", {})
  scanned = "layer" in encoder
  if scan_layers and not scanned and encoder:
    return to_numpy(modeling.stack_layers(params, config.num_hidden_layers))
  if scanned and not scan_layers:
    return modeling.unstack_layers(params, config.num_hidden_layers)
  return params


def _no_heads_message(path: str, kind: str, params: Mapping) -> str:
  names = "cls.*" if kind == "hf" else "cls/*"
  head = "cls.predictions.*" if kind == "hf" else "cls/predictions/*"
  return (f"{path}: the checkpoint has no pre-training heads ({names}: no masked-LM head "
          f"{head}; it has {sorted(params)}); fill-mask needs a BertForPreTraining / "
          "BertForMaskedLM checkpoint, Google's original release or one of our pre-training "
          "workdirs.")


def load_masked_lm(path: str, scan_layers: bool | None = None) -> tuple[BertConfig, dict]:
  """`(config, params)` of the encoder and its masked-LM head (`cls/predictions`) from any
  checkpoint: what fill-in-the-[MASK] needs. A next-sentence head and a pooler are not needed
  (a Hugging Face `BertForMaskedLM` has neither) and are left out."""
  config, params = load_pretraining_model(path, require_heads=True, scan_layers=scan_layers)
  return config, heads.masked_lm_params(params)


def load_pretraining_model(path: str, require_heads: bool = True,
                           scan_layers: bool | None = None) -> tuple[BertConfig, Any]:
  """`(config, params)` of a pre-training model (encoder + the `cls` heads it has) from any
  checkpoint. `require_heads` asks for the masked-LM head (the next-sentence head is optional:
  MLM-only checkpoints have none); of an ELECTRA model that is its generator. `scan_layers`
  converts the layers to that layout; None keeps the stored one."""
  loaded = load_any(path)
  config, params = loaded.config, loaded.params
  if require_heads and config.has_generator and "generator" in params:
    config, params = electra.generator_as_masked_lm(config, params)  # ELECTRA's masked LM
  if require_heads and "predictions" not in params.get("cls", {}):
    raise ValueError(_no_heads_message(path, loaded.kind, params))
  if scan_layers is not None:
    params = in_layout(params, config, scan_layers)
    config = config.replace(scan_layers=scan_layers)
  return config, params


def read_config(path: str | None, bert_config_file: str | None = None) -> BertConfig:
  """The model config of a checkpoint without reading its weights: `bert_config_file` when
  given, else the checkpoint's own (`config.json`, `bert_config.json` or the run metadata)."""
  if bert_config_file:
    return tf1.read_config_file(bert_config_file)
  if not path:
    raise ValueError("Give --init_checkpoint or --bert_config_file.")
  kind, where = checkpoint_kind(path)
  if kind == "tf1":
    return tf1.read_config(where)
  if kind == "hf":
    return hf_config.config_from_json_file(file_io.join(where, "config.json"))
  return _orbax_config(where)


def vocabulary_directories(path: str) -> list[str]:
  """Where the vocabulary of the checkpoint at `path` lies: beside a TF1 prefix (Google's
  release), in a Hugging Face directory, or in the run directory of an Orbax checkpoint (the
  directory itself, and the run directory above its `checkpoints/` or one of its steps)."""
  kind, where = checkpoint_kind(path)
  if kind == "tf1":
    return [tf1.dirname(where) or "."]
  if kind == "hf":
    return [where]
  out = [where.rstrip("/") or where]
  parent = os.path.dirname(out[0])
  if os.path.basename(out[0]).isdigit():  # a step directory: .../checkpoints/1000
    out.append(parent)
    parent = os.path.dirname(parent)
  if os.path.basename(out[-1]) == CHECKPOINTS:
    out.append(parent or ".")
  return out


def unused_note(report: LoadReport | None) -> str:
  """What a conversion read but nothing takes (a fine-tuned classifier's `output_weights` in a
  TF1 checkpoint, say), for the line that says where a run's weights came from."""
  if report is None:
    return ""
  unused = report.unexpected
  if not unused:
    return ""
  return (f" ({len(unused)} tensors unused: {', '.join(unused[:4])}"
          f"{' ...' if len(unused) > 4 else ''})")


def load_encoder(init_checkpoint: str | None, bert_config_file: str | None = None
                 ) -> tuple[BertConfig, Any | None, str]:
  """`(config, encoder params in the unrolled layout or None, where they came from)`.

  `bert_config_file`, when given, is the config (and must fit the checkpoint); a TF1
  checkpoint without `bert_config.json` beside it needs one, as the original code did.
  """
  if not init_checkpoint:
    config = read_config(None, bert_config_file)
    return config, None, "encoder initialised from scratch (no --init_checkpoint)"
  loaded = load_any(init_checkpoint, bert_config_file, subtree="params/bert")
  origin = loaded.origin + unused_note(loaded.report)
  params = in_layout(loaded.params, loaded.config, False)
  return loaded.config.replace(scan_layers=False), params["bert"], origin


# -------------------------------------------------------------------------------- merging
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


def extend_positions(loaded: dict, fresh: dict) -> dict:
  """A longer position table than the checkpoint has (phase 2 at length 512 after phase 1 at
  128, or a longer fine-tuning length): keep the trained rows, take the rest from `fresh`."""
  old = loaded.get("bert", {}).get("embeddings", {}).get("position_embeddings")
  if old is None:
    return loaded
  old = np.asarray(old)
  new = np.asarray(fresh["bert"]["embeddings"]["position_embeddings"])
  if old.shape[0] < new.shape[0]:
    logging.warning("Extending position embeddings from %d to %d rows.", old.shape[0],
                    new.shape[0])
    merged = new.copy()
    merged[:old.shape[0]] = old
    loaded["bert"]["embeddings"]["position_embeddings"] = merged
  return loaded


def select_scopes(loaded: Mapping, fresh: Mapping, scopes: Sequence[str] | None,
                  where: str) -> dict:
  """What of `loaded` a model takes: the top-level `scopes` (None: every scope the model has),
  and of the encoder no pooler when the model has none (span heads do not read it)."""
  wanted = [s for s in (scopes if scopes is not None else fresh) if s in fresh]
  taken = {s: loaded[s] for s in wanted if s in loaded}
  if "bert" not in taken:
    raise ValueError(f"{where} holds no encoder weights (bert/...; it has {sorted(loaded)}).")
  if "pooler" not in fresh["bert"] and "pooler" in taken["bert"]:
    taken["bert"] = {k: v for k, v in taken["bert"].items() if k != "pooler"}
  left = sorted(set(loaded) - set(taken))
  if left:
    logging.info("%s: not loaded into this model: %s", where, ", ".join(left))
  return taken


# ----------------------------------------------------------------------------------- writing
def save_orbax_params(params: Mapping, config: BertConfig, directory: str,
                      metadata: Mapping[str, Any] | None = None) -> str:
  """Writes `params` as a run directory that every loader here and pre-training with
  `init_mode="params"` read: `bert_config.json` + `checkpoints/0` (weights only, so not a run
  that `init_mode="continue"` could resume). `metadata`: recorded beside the config (a
  fine-tuned model's task, labels and settings, which `predict` reads). An int8 model's config
  records `quantization` in both places, since its parameters are int8 (`model/int8.py`)."""
  manager = checkpoint_store.CheckpointStore(file_io.join(directory, CHECKPOINTS),
                                             max_to_keep=None, async_save=False)
  bert_config = hf_config.to_hf_dict(config)
  if config.quantization == "int8":
    bert_config["quantization"] = config.quantization
  manager.save(0, {"params": to_numpy(params)}, {},
               {**(metadata or {}), "bert_config": bert_config})
  manager.close()
  file_io.write_text_atomic(file_io.join(directory, tf1.TF1_CONFIG_NAME),
                            tf1.original_config_json(config))
  return directory
