"""Hugging Face directories (`config.json` + safetensors) ↔ our parameters, for BERT, ALBERT
and RoBERTa; `config.json`'s `model_type` picks the family and so the name table.

Read: the bare encoder (`BertModel`, `AlbertModel`, `RobertaModel`: keys without prefix) and
the models with heads (`BertForPreTraining` / `BertForMaskedLM`: `bert.`, `cls.*`;
`AlbertForPreTraining` / `AlbertForMaskedLM`: `albert.`, `predictions.*`, `sop_classifier.*`;
`RobertaForMaskedLM`: `roberta.`, `lm_head.*`), with or without pooler, single or sharded
safetensors. Written: `config.json` + `model.safetensors` that `transformers` loads. Never a
pickle (`pytorch_model.bin` is refused with the command that converts it).
"""

from __future__ import annotations

import json
from typing import Mapping

import numpy as np

from bert_jax import file_io
from bert_jax.interop.names import FAMILIES, LoadReport, apply_table, params_to_state
from bert_jax.model.configuration import BertConfig

# The Hugging Face classes our trees are written as: (with pre-training heads, with the
# masked-LM head only, encoder only).
_ARCHITECTURES = {
    "bert": ("BertForPreTraining", "BertForPreTraining", "BertModel"),
    "albert": ("AlbertForPreTraining", "AlbertForMaskedLM", "AlbertModel"),
    "roberta": ("RobertaForMaskedLM", "RobertaForMaskedLM", "RobertaModel"),
}


def _normalise_hf_names(state: Mapping[str, np.ndarray],
                        model_type: str = "bert") -> dict[str, np.ndarray]:
  """Adds the family's prefix (`bert.`, `albert.`, `roberta.`) where a bare encoder was saved
  and renames the pre-2020 `LayerNorm.gamma/beta` to `weight/bias`, as transformers itself
  does when loading."""
  family = FAMILIES[model_type]
  bare = not any(k.startswith(family.hf_prefix) for k in state)
  out = {}
  for key, value in state.items():
    if bare and not key.startswith(family.hf_head_prefixes):
      key = family.hf_prefix + key
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
  state = _normalise_hf_names(state, config.model_type)
  params, report, used = apply_table(state, config, "hf", source)
  derived = FAMILIES[config.model_type].hf_derived
  for key in state:
    if key in used:
      continue
    if key in derived:
      twin = derived[key]
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


def load_hf_checkpoint(directory: str, bert_config_file: str | None = None, **config_overrides
                       ) -> tuple[BertConfig, dict, LoadReport]:
  """A Hugging Face BERT, ALBERT or RoBERTa directory → `(config, params, report)`.

  The family is `config.json`'s `model_type`; the encoder may be saved bare or under its
  prefix, with or without pooler and heads (module docstring). Parameters the checkpoint lacks
  are listed in `report.missing`; `merge_params` fills them from an initialised tree. The config is
  `bert_config_file` when given (it must fit the tensors), else the directory's `config.json`.
  """
  config = BertConfig.from_json_file(bert_config_file or file_io.join(directory, "config.json"))
  if config_overrides:
    config = config.replace(**config_overrides)
  params, report = hf_state_to_params(read_hf_state(directory), config, source=directory)
  return config, params, report


def params_to_hf_state(params: Mapping, config: BertConfig) -> dict[str, np.ndarray]:
  """Our tree (scanned or not) → Hugging Face tensor names and layouts, numpy float32."""
  return params_to_state(params, config, "hf", "Hugging Face")


def save_hf_checkpoint(params: Mapping, config: BertConfig, directory: str) -> str:
  """Writes `config.json` + `model.safetensors` that `transformers` loads.

  With heads present the architecture is the family's pre-training class (`BertForPreTraining`,
  `AlbertForPreTraining`, or `AlbertForMaskedLM` without a sentence-order head;
  `RobertaForMaskedLM`), keys under the family prefix; an encoder-only tree is written as a
  bare `BertModel` / `AlbertModel` / `RobertaModel`, like most checkpoints on the hub.
  Files are written under temporary names and renamed when complete.
  """
  from safetensors.numpy import save as save_bytes
  state = params_to_hf_state(params, config)
  family = FAMILIES[config.model_type]
  full, masked_lm, bare = _ARCHITECTURES[config.model_type]
  has_heads = any(k.startswith(family.hf_head_prefixes) for k in state)
  has_sentence_head = "cls" in params and any(
      k in params["cls"] for k in ("seq_relationship", "sop_classifier"))
  if not has_heads:
    state = {k[len(family.hf_prefix):]: v for k, v in state.items()}
  arch = ((full if has_sentence_head else masked_lm),) if has_heads else (bare,)
  file_io.makedirs(directory)
  file_io.write_bytes_atomic(file_io.join(directory, "model.safetensors"),
                             save_bytes(state, metadata={"format": "pt"}))
  file_io.write_text_atomic(file_io.join(directory, "config.json"),
                            json.dumps(config.to_hf_dict(arch), indent=2, sort_keys=True) + "\n")
  return directory
