"""Hugging Face `config.json` (every family, DistilBERT's own field names included) ↔ our
`BertConfig`.

Our config keeps the field names of the original `bert_config.json`, which Hugging Face's BERT,
ALBERT, RoBERTa and ELECTRA configs share for the encoder's shape. What differs is said here, in
one place: the families' own fields (ALBERT's layer groups, RoBERTa's padding index, ELECTRA's
embedding width), DistilBERT's renamed fields, the variants this encoder does not implement
(refused by file and key rather than read as a different model), and the architecture class a
written tree is loaded as. Any config file a user hands us (the original's, ours, Hugging
Face's) is read through `config_from_json_file`.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from bert_jax import file_io
from bert_jax.model.configuration import MODEL_TYPES, BertConfig, read_config_json

# The Hugging Face classes our trees are written as: (with pre-training heads, with the
# masked-LM head only, encoder only). A config written without a class names the first.
ARCHITECTURES = {
    "bert": ("BertForPreTraining", "BertForMaskedLM", "BertModel"),
    "albert": ("AlbertForPreTraining", "AlbertForMaskedLM", "AlbertModel"),
    "roberta": ("RobertaForMaskedLM", "RobertaForMaskedLM", "RobertaModel"),
    "electra": ("ElectraForPreTraining", "ElectraForPreTraining", "ElectraModel"),
    "distilbert": ("DistilBertForMaskedLM", "DistilBertForMaskedLM", "DistilBertModel"),
}


def config_from_dict(values: Mapping[str, Any], source: str = "<dict>") -> BertConfig:
  """A config from an original `bert_config.json`, ours, or a Hugging Face `config.json`.

  Unknown keys (Hugging Face bookkeeping such as `architectures`, `torch_dtype`) are ignored;
  keys that would change the architecture into something this model does not implement are
  rejected with the file and the key named, rather than silently producing a different model.
  """
  values = dict(values)
  model_type = values.get("model_type", "bert")
  if model_type == "distilbert":
    values = _from_distilbert(values, source)
  if model_type not in MODEL_TYPES:
    raise ValueError(f"{source}: model_type={model_type!r}; supported families: "
                     f"{', '.join(MODEL_TYPES)}.")
  values.update(_family_fields(model_type, values, source))
  position_type = values.get("position_embedding_type", "absolute")
  if position_type != "absolute":
    raise ValueError(f"{source}: position_embedding_type={position_type!r}; only 'absolute' "
                     "position embeddings (the original BERT) are supported.")
  if values.get("is_decoder") or values.get("add_cross_attention"):
    raise ValueError(f"{source}: decoder / cross-attention BERT variants are not supported.")
  return BertConfig.from_dict(values, source=source)


def config_from_json_file(path: str) -> BertConfig:
  """Reads `bert_config.json` (original, or ours) or `config.json` (Hugging Face); local or
  gs://."""
  return config_from_dict(read_config_json(path), source=path)


def to_hf_dict(config: BertConfig, architectures=None) -> dict[str, Any]:
  """A Hugging Face `config.json` for the same model, in its family's terms.

  ALBERT: `embedding_size` and one hidden group of one inner layer (`share_parameters='all'`;
  other sharing has no Hugging Face form, so only our own loaders read it back from
  `share_parameters`). RoBERTa: `pad_token_id` is the offset less one (padding_idx).
  """
  if architectures is None:
    architectures = ARCHITECTURES[config.model_type][:1]
  out = (_to_distilbert(config, architectures) if config.model_type == "distilbert"
         else _to_family_dict(config, architectures))
  if config.pruned_heads is not None:
    # Read back by our loaders (and by transformers 4, in this form). Exports for
    # transformers 5, which has no pruned BERT, put the heads back first (`model/pruning.py`).
    out["pruned_heads"] = {str(layer): list(heads)
                           for layer, heads in enumerate(config.pruned_heads) if heads}
  return out


def _to_family_dict(config: BertConfig, architectures) -> dict[str, Any]:
  out = {name: getattr(config, name) for name in config.SHAPE_FIELDS}
  out.update(model_type=config.model_type, position_embedding_type="absolute",
             torch_dtype="float32")
  out["architectures"] = list(architectures)
  if config.model_type == "bert":
    out.update(pad_token_id=0)
  elif config.model_type == "albert":
    out.update(embedding_size=config.embedding_width, pad_token_id=0, bos_token_id=2,
               eos_token_id=3)
    if config.share_parameters == "all":
      out.update(num_hidden_groups=1, inner_group_num=1)
  elif config.model_type == "electra":
    out.update(embedding_size=config.embedding_width, pad_token_id=0)
  else:
    out.update(pad_token_id=max(config.position_offset - 1, 0), bos_token_id=0, eos_token_id=2)
  if config.model_type not in ("albert", "electra") and config.embedding_size is not None:
    out["embedding_size"] = config.embedding_width
  if config.share_parameters != ("all" if config.model_type == "albert" else "none"):
    out["share_parameters"] = config.share_parameters
  if config.model_type != "roberta" and config.position_offset:
    out["position_offset"] = config.position_offset
  return out


def write_hf_config(config: BertConfig, path: str, architectures=None,
                    extra: Mapping[str, Any] | None = None) -> None:
  """Writes `to_hf_dict` (and `extra` fields: a task model's labels) as a `config.json`
  (sorted keys, indented), atomically."""
  values = {**to_hf_dict(config, architectures), **(extra or {})}
  file_io.write_text_atomic(path, json.dumps(values, indent=2, sort_keys=True) + "\n")


# DistilBERT's config.json names ↔ ours (transformers' DistilBertConfig).
_DISTILBERT_NAMES = {"dim": "hidden_size", "n_layers": "num_hidden_layers",
                     "n_heads": "num_attention_heads", "hidden_dim": "intermediate_size",
                     "dropout": "hidden_dropout_prob",
                     "attention_dropout": "attention_probs_dropout_prob",
                     "activation": "hidden_act"}


def _from_distilbert(values: dict, source: str) -> dict:
  """A DistilBERT `config.json` in BERT's field names: no token types, LayerNorm ε 1e-12 (its
  hard-coded value); sinusoidal position tables are refused (none of the released models has
  them, and this encoder learns its positions)."""
  if values.get("sinusoidal_pos_embds"):
    raise ValueError(f"{source}: DistilBERT with sinusoidal_pos_embds=true is not supported "
                     "(only learned position embeddings, as in the released models).")
  out = {ours: values[theirs] for theirs, ours in _DISTILBERT_NAMES.items() if theirs in values}
  out.update({k: v for k, v in values.items() if k not in _DISTILBERT_NAMES})
  out.update(type_vocab_size=0, layer_norm_eps=1e-12)
  return out


def _to_distilbert(config: BertConfig, architectures) -> dict[str, Any]:
  """Our config as transformers' `DistilBertConfig` writes it."""
  if config.layer_norm_eps != 1e-12 or config.type_vocab_size != 0:
    raise ValueError(f"DistilBERT has no token types and LayerNorm ε 1e-12; this model has "
                     f"type_vocab_size={config.type_vocab_size}, "
                     f"layer_norm_eps={config.layer_norm_eps}.")
  out = {theirs: getattr(config, ours) for theirs, ours in _DISTILBERT_NAMES.items()}
  out.update(vocab_size=config.vocab_size, max_position_embeddings=config.max_position_embeddings,
             initializer_range=config.initializer_range, sinusoidal_pos_embds=False,
             model_type="distilbert", pad_token_id=0, torch_dtype="float32",
             architectures=list(architectures))
  return out


def _family_fields(model_type: str, values: Mapping[str, Any], source: str) -> dict[str, Any]:
  """The family fields implied by a Hugging Face (or ALBERT/RoBERTa release) config.

  ALBERT: its layer groups must be one group of one inner layer, which is sharing "all";
  other groupings are refused by name. RoBERTa: positions start after `pad_token_id`.
  Values that our own writers put in (`share_parameters`, `position_offset`) win.
  """
  out: dict[str, Any] = {"model_type": model_type}
  if model_type == "albert":
    groups = values.get("num_hidden_groups", 1)
    inner = values.get("inner_group_num", 1)
    if "share_parameters" not in values and (groups != 1 or inner != 1):
      raise ValueError(f"{source}: ALBERT with num_hidden_groups={groups}, inner_group_num="
                       f"{inner}; only num_hidden_groups=1 and inner_group_num=1 (every layer "
                       "shares one set of weights, as in every released ALBERT) are supported.")
    out["share_parameters"] = values.get("share_parameters", "all")
    out["embedding_size"] = values.get("embedding_size", 128)
  elif model_type == "electra":
    # Hugging Face writes embedding_size always (= hidden_size when not factorized).
    embedding = values.get("embedding_size")
    if embedding is not None and embedding != values.get("hidden_size"):
      out["embedding_size"] = embedding
  elif model_type == "roberta":
    pad = values.get("pad_token_id", 1)
    out["position_offset"] = values.get("position_offset", (1 if pad is None else pad) + 1)
  return out
