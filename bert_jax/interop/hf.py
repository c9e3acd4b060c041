"""Hugging Face directories (`config.json` + safetensors) ↔ our parameters, for BERT, ALBERT,
RoBERTa, ELECTRA and DistilBERT; `config.json`'s `model_type` picks the family and so the name table.

ELECTRA is two models: the discriminator (`ElectraForPreTraining`, or a bare `ElectraModel`) in
the directory itself and, when there is one, the generator (`ElectraForMaskedLM`) in its
`generator/` subdirectory; fine-tuning reads the discriminator alone.

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
from bert_jax.interop import hf_config, task_heads
from bert_jax.interop.names import (FAMILIES, HF_GENERATOR as GENERATOR_PREFIX, LoadReport,
                                    apply_table, params_to_state)
from bert_jax.model.configuration import BertConfig

# ELECTRA's generator is a directory of its own: `generator/` inside the discriminator's.
GENERATOR_DIRECTORY = "generator"


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
  config = hf_config.config_from_json_file(
      bert_config_file or file_io.join(directory, "config.json"))
  state = read_hf_state(directory)
  if config.model_type == "electra" and _is_lone_generator(directory, state):
    config, state = _as_generator(config, state)
  elif config.model_type == "electra":
    config, state = _with_electra_generator(directory, config, state)
  if config_overrides:
    config = config.replace(**config_overrides)
  params, report = hf_state_to_params(state, config, source=directory)
  return config, params, report


def _is_lone_generator(directory: str, state: Mapping[str, np.ndarray]) -> bool:
  """An `ElectraForMaskedLM` directory of its own (how ELECTRA's generators are published):
  the generator's head, no discriminator's."""
  try:
    architectures = json.loads(file_io.read_text(file_io.join(directory, "config.json"))).get(
        "architectures") or []
  except (ValueError, AttributeError):
    architectures = []
  heads_ = {k.split(".")[0] for k in state}
  return "ElectraForMaskedLM" in architectures or (
      "generator_predictions" in heads_ and "discriminator_predictions" not in heads_)


def _as_generator(config: BertConfig, state: dict) -> tuple[BertConfig, dict]:
  """A lone generator read as the generator of an ELECTRA model (its tensors named
  `generator/<name>`, the embedding tables as the shared ones), so that it serves as ELECTRA's
  masked LM (`electra.generator_as_masked_lm`); the discriminator's weights are missing."""
  config = config.replace(generator_hidden_size=config.hidden_size,
                          generator_num_hidden_layers=config.num_hidden_layers,
                          generator_num_attention_heads=config.num_attention_heads,
                          generator_intermediate_size=config.intermediate_size)
  state = _normalise_hf_names(state, "electra")
  return config, {(k if k.startswith("electra.embeddings.") else GENERATOR_PREFIX + k): v
                  for k, v in state.items()}


def _with_electra_generator(directory: str, config: BertConfig, state: dict
                            ) -> tuple[BertConfig, dict]:
  """An ELECTRA discriminator's directory with its generator in `generator/` (as `save_hf_
  checkpoint` writes it; Google's two hub directories can be arranged so): the generator's
  shape joins the config and its tensors the state, named `generator/<name>`. Its copies of
  the shared embedding tables must equal the discriminator's (they are one table in training)."""
  gen_dir = file_io.join(directory, GENERATOR_DIRECTORY)
  if not file_io.exists(file_io.join(gen_dir, "config.json")):
    return config, state
  gen = hf_config.config_from_json_file(file_io.join(gen_dir, "config.json"))
  if gen.model_type != "electra" or gen.embedding_width != config.embedding_width:
    raise ValueError(f"{gen_dir}: the generator must be an ELECTRA model with the "
                     f"discriminator's embedding width {config.embedding_width}; found "
                     f"model_type={gen.model_type!r}, embedding width {gen.embedding_width}.")
  config = config.replace(generator_hidden_size=gen.hidden_size,
                          generator_num_hidden_layers=gen.num_hidden_layers,
                          generator_num_attention_heads=gen.num_attention_heads,
                          generator_intermediate_size=gen.intermediate_size)
  state = dict(state)
  state.update({GENERATOR_PREFIX + k: v for k, v in
                _normalise_hf_names(read_hf_state(gen_dir), "electra").items()})
  return config, state


def params_to_hf_state(params: Mapping, config: BertConfig,
                       head: task_heads.Head | None = None) -> dict[str, np.ndarray]:
  """Our tree (scanned or not) → Hugging Face tensor names and layouts, numpy float32; a
  fine-tuned tree's `head` as its transformers class names it (`task_heads.hf_rows`)."""
  rows = task_heads.hf_rows(head, config) if head else None
  return params_to_state(params, config, "hf", "Hugging Face", rows)


def save_hf_checkpoint(params: Mapping, config: BertConfig, directory: str,
                       head: task_heads.Head | None = None) -> str:
  """Writes `config.json` + `model.safetensors` that `transformers` loads.

  With heads present the architecture is the family's pre-training class (`BertForPreTraining`,
  `AlbertForPreTraining`, or the masked-LM class without a sentence head;
  `RobertaForMaskedLM`), keys under the family prefix; an encoder-only tree is written as a
  bare `BertModel` / `AlbertModel` / `RobertaModel`, like most checkpoints on the hub. A
  fine-tuned tree (`head`) is written as its task class (`BertForSequenceClassification`, ...)
  with its outputs' names in the config.
  Files are written under temporary names and renamed when complete.
  """
  from safetensors.numpy import save as save_bytes
  if head is not None:
    return _save_task_model(params, config, directory, head)
  state = params_to_hf_state(params, config)
  generator = {k[len(GENERATOR_PREFIX):]: v for k, v in state.items()
               if k.startswith(GENERATOR_PREFIX)}
  if generator:
    state = {k: v for k, v in state.items() if not k.startswith(GENERATOR_PREFIX)}
    _save_electra_generator(state, generator, config,
                            file_io.join(directory, GENERATOR_DIRECTORY))
  family = FAMILIES[config.model_type]
  full, masked_lm, bare = hf_config.ARCHITECTURES[config.model_type]
  has_heads = any(k.startswith(family.hf_head_prefixes) for k in state)
  has_sentence_head = ("cls" in params and any(
      k in params["cls"] for k in ("seq_relationship", "sop_classifier"))
                       ) or "discriminator_predictions" in params
  if not has_heads:
    state = {k[len(family.hf_prefix):]: v for k, v in state.items()}
  arch = ((full if has_sentence_head else masked_lm),) if has_heads else (bare,)
  file_io.makedirs(directory)
  file_io.write_bytes_atomic(file_io.join(directory, "model.safetensors"),
                             save_bytes(state, metadata={"format": "pt"}))
  hf_config.write_hf_config(config, file_io.join(directory, "config.json"), arch)
  return directory


def _save_electra_generator(state: Mapping[str, np.ndarray], generator: dict, config: BertConfig,
                            directory: str) -> None:
  """ELECTRA's generator as the `ElectraForMaskedLM` directory transformers loads: its own
  tensors, the shared embedding tables copied from the discriminator's, its config."""
  from safetensors.numpy import save as save_bytes
  generator = dict(generator)
  for name in FAMILIES["electra"].hf_derived:
    twin = FAMILIES["electra"].hf_derived[name]
    if name.startswith(GENERATOR_PREFIX) and twin in state and "lm_head" not in name:
      generator[name[len(GENERATOR_PREFIX):]] = state[twin]
  gen = config.generator_config()
  file_io.makedirs(directory)
  file_io.write_bytes_atomic(file_io.join(directory, "model.safetensors"),
                             save_bytes(generator, metadata={"format": "pt"}))
  hf_config.write_hf_config(gen, file_io.join(directory, "config.json"), ("ElectraForMaskedLM",))


def _save_task_model(params: Mapping, config: BertConfig, directory: str,
                     head: task_heads.Head) -> str:
  """A fine-tuned model as its transformers task class: the encoder under the family prefix,
  the head's tensors, `architectures` and the outputs' names in `config.json`."""
  from safetensors.numpy import save as save_bytes
  state = params_to_hf_state(params, config, head)
  scope = task_heads.HEAD_SCOPES[head.name]
  num_outputs = int(np.shape(params[scope]["kernel"])[-1])
  file_io.makedirs(directory)
  file_io.write_bytes_atomic(file_io.join(directory, "model.safetensors"),
                             save_bytes(state, metadata={"format": "pt"}))
  hf_config.write_hf_config(config, file_io.join(directory, "config.json"),
                            (task_heads.hf_class(head, config),),
                            task_heads.hf_config_fields(head, num_outputs))
  return directory
