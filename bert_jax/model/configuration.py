"""`BertConfig`: the model's shape, with the field names of the original `bert_config.json`.

The legacy names are kept so that a released `bert_config.json` (Google's TF1 checkpoints) and a
Hugging Face `config.json` both load without translation tables for the shape fields. Fields that
only say *how* to compute (compute dtype, layer scan, rematerialisation, attention kernel) are
ours; they never change the parameter values, so they are not written into exported configs.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

# Activation names accepted in `hidden_act`, as spelled by the original code and by Hugging Face.
# The original BERT used the exact (erf) GELU; "gelu_new"/"gelu_pytorch_tanh" are the tanh
# approximation that some later checkpoints were trained with.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_approximate", "relu",
               "silu", "swish", "tanh")

REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")

# Attention kernels (`modeling.dot_product_attention`): None lets JAX pick, "xla" and "cudnn" go
# to `jax.nn.dot_product_attention`, "pallas" is the Pallas TPU flash-attention kernel.
ATTENTION_IMPLEMENTATIONS = (None, "xla", "cudnn", "pallas")


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Shape of a BERT encoder plus how to compute it.

  Shape fields (legacy names, exported): everything from `vocab_size` to `layer_norm_eps`.
  Compute fields (ours, not exported): `dtype`, `param_dtype`, `scan_layers`, `remat_policy`,
  `attention_implementation`.
  """
  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu"
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  initializer_range: float = 0.02
  layer_norm_eps: float = 1e-12  # the original hard-codes 1e-12 in layer_norm()

  # How to compute. bfloat16 on TPU; parameters stay float32 (`param_dtype`), and LayerNorm,
  # softmax and losses are always computed in float32.
  dtype: str = "float32"
  param_dtype: str = "float32"
  scan_layers: bool = False  # nn.scan over layers: one compiled layer, stacked parameters
  remat_policy: str = "none"  # none | full | dots | dots_no_batch (see modeling._remat_policy)
  # The kernel used when attention dropout is off: None lets JAX pick, "xla" forces the
  # reference path, "cudnn" the fused GPU kernel (both via jax.nn.dot_product_attention),
  # "pallas" the Pallas TPU flash-attention kernel (sequence length a multiple of 128).
  attention_implementation: str | None = None

  SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "hidden_act", "hidden_dropout_prob",
                  "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
                  "initializer_range", "layer_norm_eps")

  def __post_init__(self):
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(
          f"BertConfig: hidden_size={self.hidden_size} is not divisible by "
          f"num_attention_heads={self.num_attention_heads}.")
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f"BertConfig: hidden_act={self.hidden_act!r}; expected one of "
                       f"{', '.join(ACTIVATIONS)}.")
    if self.attention_implementation not in ATTENTION_IMPLEMENTATIONS:
      raise ValueError(f"BertConfig: attention_implementation={self.attention_implementation!r}; "
                       f"expected one of {ATTENTION_IMPLEMENTATIONS}.")
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"BertConfig: remat_policy={self.remat_policy!r}; expected one of "
                       f"{', '.join(REMAT_POLICIES)}.")
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "max_position_embeddings", "type_vocab_size"):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f"BertConfig: {name}={getattr(self, name)} must be positive.")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  def check_sequence_length(self, length: int, name: str = "max_seq_length") -> None:
    """Refuses inputs longer than the position table (the one place this rule is written)."""
    if length > self.max_position_embeddings:
      raise ValueError(f"{name}={length} exceeds the model's "
                       f"max_position_embeddings={self.max_position_embeddings}.")

  def replace(self, **changes) -> "BertConfig":
    return dataclasses.replace(self, **changes)

  # ----------------------------------------------------------------------------- reading
  @classmethod
  def from_dict(cls, values: Mapping[str, Any], source: str = "<dict>") -> "BertConfig":
    """Builds a config from an original `bert_config.json` or a Hugging Face `config.json`.

    Unknown keys (Hugging Face bookkeeping such as `architectures`, `torch_dtype`) are ignored;
    keys that would change the architecture into something this model does not implement are
    rejected with the file and the key named, rather than silently producing a different model.
    """
    values = dict(values)
    model_type = values.get("model_type", "bert")
    if model_type not in ("bert",):
      raise ValueError(f"{source}: model_type={model_type!r}; only 'bert' checkpoints are "
                       "supported.")
    position_type = values.get("position_embedding_type", "absolute")
    if position_type != "absolute":
      raise ValueError(f"{source}: position_embedding_type={position_type!r}; only 'absolute' "
                       "position embeddings (the original BERT) are supported.")
    if values.get("is_decoder") or values.get("add_cross_attention"):
      raise ValueError(f"{source}: decoder / cross-attention BERT variants are not supported.")
    kwargs = {}
    for field in dataclasses.fields(cls):
      if field.name in values and values[field.name] is not None:
        kwargs[field.name] = values[field.name]
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "max_position_embeddings", "type_vocab_size"):
      if name not in kwargs:
        if name in ("max_position_embeddings", "type_vocab_size"):
          continue  # defaults (512, 2) are those of every released BERT
        raise ValueError(f"{source}: missing required field {name!r}.")
    try:
      return cls(**kwargs)
    except (TypeError, ValueError) as e:
      raise ValueError(f"{source}: {e}") from e

  @classmethod
  def from_json_file(cls, path: str) -> "BertConfig":
    """Reads `bert_config.json` (original) or `config.json` (Hugging Face); local or gs://."""
    from bert_jax import file_io
    text = file_io.read_text(path)
    try:
      values = json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}: line {e.lineno}: not valid JSON ({e.msg}).") from e
    if not isinstance(values, dict):
      raise ValueError(f"{path}: expected a JSON object with BERT config fields.")
    return cls.from_dict(values, source=path)

  # ----------------------------------------------------------------------------- writing
  def to_original_dict(self) -> dict[str, Any]:
    """The original `bert_config.json` fields (no compute fields)."""
    out = {name: getattr(self, name) for name in self.SHAPE_FIELDS if name != "layer_norm_eps"}
    return out

  def to_hf_dict(self, architectures=("BertForPreTraining",)) -> dict[str, Any]:
    """A Hugging Face `config.json` for the same model."""
    out = {name: getattr(self, name) for name in self.SHAPE_FIELDS}
    out.update(model_type="bert", architectures=list(architectures),
               position_embedding_type="absolute", pad_token_id=0, torch_dtype="float32")
    return out

  def to_json_file(self, path: str, flavour: str = "original") -> None:
    from bert_jax import file_io
    values = self.to_original_dict() if flavour == "original" else self.to_hf_dict()
    file_io.write_text_atomic(path, json.dumps(values, indent=2, sort_keys=True) + "\n")


# --------------------------------------------------------------------------------- presets
def _compact(layers: int, hidden: int) -> BertConfig:
  return BertConfig(hidden_size=hidden, num_hidden_layers=layers,
                    num_attention_heads=hidden // 64, intermediate_size=4 * hidden)


def _presets() -> dict[str, BertConfig]:
  presets = {
      # Devlin et al. 2019, Table/Section 3.
      "base": BertConfig(),
      "large": BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                          intermediate_size=4096),
      # For unit tests: small enough to compile in a second, still multi-head and multi-layer.
      "test": BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=8, intermediate_size=128,
                         max_position_embeddings=128),
  }
  # The 24 compact models of Turc et al. 2019 ("Well-Read Students Learn Better"), named as in
  # their release: uncased_L-{L}_H-{H}_A-{H/64}.
  for layers in (2, 4, 6, 8, 10, 12):
    for hidden in (128, 256, 512, 768):
      presets[f"L-{layers}_H-{hidden}_A-{hidden // 64}"] = _compact(layers, hidden)
  # The names the compact-model release gives to five of them.
  presets["tiny"] = presets["L-2_H-128_A-2"]
  presets["mini"] = presets["L-4_H-256_A-4"]
  presets["small"] = presets["L-4_H-512_A-8"]
  presets["medium"] = presets["L-8_H-512_A-8"]
  return presets


PRESETS: dict[str, BertConfig] = _presets()


def get_preset(name: str, **overrides) -> BertConfig:
  """A named size (`base`, `large`, `tiny`, `L-4_H-256_A-4`, ...), optionally edited."""
  if name not in PRESETS:
    raise KeyError(f"Unknown BERT preset {name!r}; known: {', '.join(sorted(PRESETS))}.")
  return PRESETS[name].replace(**overrides)
