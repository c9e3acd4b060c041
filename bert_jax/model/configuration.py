"""`BertConfig`: the model's shape, with the field names of the original `bert_config.json`.

The legacy names are kept so that a released `bert_config.json` (Google's TF1 checkpoints) loads
as it is, and a Hugging Face `config.json` needs no translation table for the shape fields (what
it does need, per family, is `interop/hf_config.py`). Fields that only say *how* to compute
(compute dtype, layer scan, rematerialisation, attention kernel) are ours; they never change the
parameter values, so they are not written into exported configs.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

# Activation names accepted in `hidden_act`, as spelled by the original code and by Hugging Face.
# Google's BERT code computed the exact (erf) GELU when its checkpoints were released (Hugging
# Face's "gelu", the default); since February 2019 its `gelu` is the tanh approximation
# ("gelu_new"/"gelu_pytorch_tanh"), which some later checkpoints were trained with and which
# cuBLASLt computes inside the feed-forward GEMM's epilogue on GPUs.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_approximate", "relu",
               "silu", "swish", "tanh")

REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")

# Attention kernels (`modeling.dot_product_attention`): None lets JAX pick, "xla" is
# `jax.nn.dot_product_attention`'s XLA path, "cudnn" cuDNN's flash attention, "pallas" our Pallas
# kernels (Triton's on GPUs, the TPU's elsewhere); the last two keep attention-probability
# dropout inside the kernel.
ATTENTION_IMPLEMENTATIONS = (None, "xla", "cudnn", "pallas")
# How a block's dropout + residual add + LayerNorm runs (`modeling.BertResidualOutput`): "xla"
# lets the compiler fuse it (four kernels each way on GPUs), "pallas" is one GPU kernel each
# way (`model/pallas_layer_norm.py`; interpreted off GPUs, refused on TPUs).
LAYER_NORM_IMPLEMENTATIONS = ("xla", "pallas")

# Model families: one encoder, configured. "albert" adds factorized embeddings, shared layers and
# a sentence-order head; "roberta" one token type and positions counted after the padding index;
# "electra" a discriminator (no pooler: its sentence vector is the [CLS] output itself) trained
# beside a small generator, whose shape the `generator_*` fields give; "distilbert" BERT without
# token-type embeddings (type_vocab_size 0), as Sanh et al. 2019 distilled it.
MODEL_TYPES = ("bert", "albert", "roberta", "electra", "distilbert")

# Which parts of a layer are shared across layers (Lan et al. 2020, Table 4): none, all (ALBERT),
# only the attention block, or only the feed-forward block.
SHARE_PARAMETERS = ("none", "all", "attention", "ffn")

# How the dense layers multiply (`modeling.dense`): in the compute dtype, or in FP8 with delayed
# scaling (Hopper GPUs), whose scales travel in the train state beside the parameters, or in
# int8 for inference (`model/int8.py`: int8 kernels with a scale per output and int8 embedding
# tables with a scale per row in the parameters, activations quantized per token at run time;
# refused in training).
QUANTIZATIONS = ("none", "fp8", "int8")


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Shape of a BERT encoder plus how to compute it.

  Shape fields (legacy names, exported): everything from `vocab_size` to `layer_norm_eps`.
  Compute fields (ours, not exported): `dtype`, `param_dtype`, `scan_layers`, `stack_unrolled`,
  `remat_policy`,
  `attention_implementation`, `dropout_bits`, `low_precision_layer_norm`,
  `layer_norm_implementation`, `quantization` (written only as "int8", whose parameters are
  int8).
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
  # The family (written to Hugging Face `config.json` as `model_type`): which heads the
  # pre-training model has and which name table converts its checkpoints.
  model_type: str = "bert"
  # Width E of the embedding tables when factorized (ALBERT: 128, projected to hidden_size by
  # `embedding_hidden_mapping_in`); None means E = hidden_size and no projection (BERT).
  embedding_size: int | None = None
  # Cross-layer parameter sharing: "all" is one set of layer weights applied
  # num_hidden_layers times (ALBERT's num_hidden_groups = inner_group_num = 1).
  share_parameters: str = "none"
  # Added to every position id before the lookup. RoBERTa counts positions after its padding
  # index (padding_idx + 1 = 2), so its tables have 514 rows for 512 tokens; a per-instance
  # position id of packed rows gets the same offset, so packing needs nothing else.
  position_offset: int = 0
  # ELECTRA's generator (Clark et al. 2020): a narrower masked LM trained beside this model (the
  # discriminator), sharing its embedding tables. None where there is no generator (every other
  # family; an ELECTRA discriminator read alone). Its heads are max(1, hidden/64) and its
  # feed-forward 4x its width unless given, as in ELECTRA's `get_generator_config`.
  generator_hidden_size: int | None = None
  generator_num_hidden_layers: int | None = None
  generator_num_attention_heads: int | None = None
  generator_intermediate_size: int | None = None
  # Heads removed after training (Michel et al. 2019; `analysis/heads.py`): per layer, the
  # original indices of the heads that are gone, so layer l keeps num_attention_heads −
  # len(pruned_heads[l]) heads of head_dim each, and its query/key/value and attention-output
  # matrices are that much smaller. None: every head of every layer. Read from a list of lists
  # (ours) or from {"layer": [heads]} (transformers 4's `pruned_heads`).
  pruned_heads: tuple[tuple[int, ...], ...] | None = None

  # How to compute. bfloat16 on TPU; parameters stay float32 (`param_dtype`), and LayerNorm,
  # softmax and losses are always computed in float32.
  dtype: str = "float32"
  param_dtype: str = "float32"
  scan_layers: bool = False  # nn.scan over layers: one compiled layer, stacked parameters
  # With scan_layers: keep the stacked parameters (the scanned layout, its checkpoints and
  # optimizer state) but run the layers unrolled, each its own code as with scan_layers=False.
  # The optimizer then updates each stacked leaf in one kernel instead of one per layer: XLA
  # fuses no independent kernels side by side on GPUs, where every kernel is launched.
  stack_unrolled: bool = False
  remat_policy: str = "none"  # none | full | dots | dots_no_batch (see modeling._remat_policy)
  # The attention kernel: "cudnn" (GPU) and "pallas" (ours: Triton's on a GPU, any length;
  # the TPU's elsewhere, sequence length a multiple of 128) are fused with attention-probability
  # dropout inside the kernel; None lets JAX pick and
  # "xla" forces its reference path when dropout is off, and both run the explicit softmax
  # with dropout in training (`modeling.dot_product_attention`).
  attention_implementation: str | None = None
  # Bits per dropout keep/drop decision (`model/dropout.py`): 16 draws two decisions per random
  # word (rate quantised to 1/65536, the scaling exact), 8 four, 32 one (as flax's Dropout).
  dropout_bits: int = 16
  # With a compute dtype narrower than float32: the residual stream and LayerNorm inputs and
  # outputs in that dtype, LayerNorm statistics in float32, and one fused residual-add +
  # LayerNorm per block with its own backward (`modeling.residual_layer_norm`). False keeps the
  # float32 LayerNorm of flax's module at every site (the reference for A/B measurements).
  low_precision_layer_norm: bool = True
  # "pallas": each block's dropout + residual add + LayerNorm is one GPU kernel forward and one
  # backward, its dropout mask drawn in the kernel from a hash of the element's position
  # (`model/pallas_layer_norm.py`); needs `low_precision_layer_norm`. "xla": the compiler's.
  layer_norm_implementation: str = "xla"
  # "fp8": the dense layers' matmuls in FP8 (`modeling.dense`), for Hopper GPUs. The parameters
  # are those of "none"; the scales and amax histories are the train state's `model_state`.
  # "int8": inference with int8 kernels (`model/int8.py`). Unlike FP8 it changes the parameters
  # (int8 `kernel` + `kernel_scale`, int8 tables + `<table>_scale`), so a config of such
  # parameters records it when written.
  quantization: str = "none"

  SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "hidden_act", "hidden_dropout_prob",
                  "attention_probs_dropout_prob", "max_position_embeddings", "type_vocab_size",
                  "initializer_range", "layer_norm_eps")
  # Fields of the successors, written only where they differ from BERT, so that a BERT config
  # is written exactly as the original wrote it.
  GENERATOR_FIELDS = ("generator_hidden_size", "generator_num_hidden_layers",
                      "generator_num_attention_heads", "generator_intermediate_size")
  FAMILY_FIELDS = ("model_type", "embedding_size", "share_parameters",
                   "position_offset") + GENERATOR_FIELDS + ("pruned_heads",)
  FAMILY_DEFAULTS = {"model_type": "bert", "embedding_size": None, "share_parameters": "none",
                     "position_offset": 0, **{name: None for name in GENERATOR_FIELDS},
                     "pruned_heads": None}

  def __post_init__(self):
    if self.pruned_heads is not None:
      object.__setattr__(self, "pruned_heads", self._read_pruned_heads(self.pruned_heads))
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
    if self.layer_norm_implementation not in LAYER_NORM_IMPLEMENTATIONS:
      raise ValueError(f"BertConfig: layer_norm_implementation="
                       f"{self.layer_norm_implementation!r}; expected one of "
                       f"{', '.join(LAYER_NORM_IMPLEMENTATIONS)}.")
    if self.layer_norm_implementation == "pallas" and not self.low_precision_layer_norm:
      raise ValueError("BertConfig: layer_norm_implementation='pallas' is the fused form of "
                       "the low-precision LayerNorm; it needs low_precision_layer_norm=True.")
    if self.dropout_bits not in (8, 16, 32):
      raise ValueError(f"BertConfig: dropout_bits={self.dropout_bits}; expected 8, 16 or 32.")
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f"BertConfig: remat_policy={self.remat_policy!r}; expected one of "
                       f"{', '.join(REMAT_POLICIES)}.")
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "max_position_embeddings"):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f"BertConfig: {name}={getattr(self, name)} must be positive.")
    if int(self.type_vocab_size) < 0 or (self.type_vocab_size == 0
                                         and self.model_type != "distilbert"):
      raise ValueError(f"BertConfig: type_vocab_size={self.type_vocab_size} must be positive "
                       "(0, no token types, is DistilBERT's: model_type='distilbert').")
    if self.model_type not in MODEL_TYPES:
      raise ValueError(f"BertConfig: model_type={self.model_type!r}; expected one of "
                       f"{', '.join(MODEL_TYPES)}.")
    if self.share_parameters not in SHARE_PARAMETERS:
      raise ValueError(f"BertConfig: share_parameters={self.share_parameters!r}; expected one "
                       f"of {', '.join(SHARE_PARAMETERS)}.")
    if self.embedding_size is not None and int(self.embedding_size) <= 0:
      raise ValueError(f"BertConfig: embedding_size={self.embedding_size} must be positive.")
    if not 0 <= self.position_offset < self.max_position_embeddings:
      raise ValueError(f"BertConfig: position_offset={self.position_offset} must be in "
                       f"[0, max_position_embeddings={self.max_position_embeddings}).")
    generator = [getattr(self, name) for name in self.GENERATOR_FIELDS]
    if any(v is not None for v in generator):
      if self.model_type != "electra":
        raise ValueError(f"BertConfig: generator fields are for model_type='electra', not "
                         f"{self.model_type!r}.")
      if self.generator_hidden_size is None:
        raise ValueError("BertConfig: generator_hidden_size is required with the other "
                         "generator fields.")
      for name, value in zip(self.GENERATOR_FIELDS, generator):
        if value is not None and int(value) <= 0:
          raise ValueError(f"BertConfig: {name}={value} must be positive.")
      self.generator_config()  # its own checks (head count divides the width)
    if self.stack_unrolled and not self.scan_layers:
      raise ValueError("BertConfig: stack_unrolled=True runs the scanned layout's stacked "
                       "layers unrolled; it needs scan_layers=True.")
    if (self.attention_implementation == "cudnn" and self.attention_probs_dropout_prob > 0
        and (self.scanned_loop or self.share_parameters != "none")):
      # cuDNN's dropout counter advances per execution of a kernel call site: a scanned or
      # shared layer runs one site for several layers, forwards then backwards in reverse, so
      # its backward masks would not be its forward's (modeling._cudnn_attention).
      raise ValueError(
          f"BertConfig: attention_implementation='cudnn' with attention_probs_dropout_prob="
          f"{self.attention_probs_dropout_prob:g} needs unrolled, unshared layers (got "
          f"scan_layers={self.scan_layers}, share_parameters={self.share_parameters!r}): set "
          "scan_layers=False (or stack_unrolled=True), or attention_implementation=None (the "
          "explicit path), or attention_probs_dropout_prob=0.")
    if self.quantization not in QUANTIZATIONS:
      raise ValueError(f"BertConfig: quantization={self.quantization!r}; expected one of "
                       f"{', '.join(QUANTIZATIONS)}.")
    if self.quantization == "fp8" and (self.scanned_loop or self.share_parameters != "none"):
      # Each FP8 dot's backward pass returns its scales' next values as their gradient, which
      # autodiff sums over every use of a variable: a layer applied several times (shared) would
      # get the sum of its new scales, and a scan would need the scales stacked per layer.
      raise ValueError(
          f"BertConfig: quantization='fp8' needs unrolled, unshared layers (got scan_layers="
          f"{self.scan_layers}, share_parameters={self.share_parameters!r}): set "
          "scan_layers=False (or stack_unrolled=True) and share_parameters='none', or "
          "quantization='none'.")
    if self.scan_layers and self.share_parameters in ("attention", "ffn"):
      # A scan stacks each layer's parameters; a part shared by every step would have to be
      # broadcast into the loop while the rest is stacked, which the layer does not support.
      raise ValueError(f"BertConfig: scan_layers=True with share_parameters="
                       f"{self.share_parameters!r} is not supported; use scan_layers=False "
                       "(share_parameters='all' and 'none' scan).")

  def _read_pruned_heads(self, value) -> tuple[tuple[int, ...], ...] | None:
    """`pruned_heads` as a tuple per layer of sorted original head indices (None when no head
    is pruned), from either form; refused naming the layer when it cannot be this model's."""
    layers = int(self.num_hidden_layers)
    if isinstance(value, Mapping):  # transformers 4: {"3": [0, 5]}, only the pruned layers
      rows: list[Any] = [()] * layers
      for key, heads in value.items():
        if not str(key).lstrip("-").isdigit() or not 0 <= int(key) < layers:
          raise ValueError(f"BertConfig: pruned_heads names layer {key!r}; the model has "
                           f"layers 0..{layers - 1}.")
        rows[int(key)] = heads
    elif isinstance(value, (list, tuple)):
      if len(value) != layers:
        raise ValueError(f"BertConfig: pruned_heads has {len(value)} rows for "
                         f"num_hidden_layers={layers}: one list of removed heads per layer.")
      rows = list(value)
    else:
      raise ValueError(f"BertConfig: pruned_heads={value!r}; expected a list per layer of the "
                       "removed heads' indices.")
    out = []
    for layer, heads in enumerate(rows):
      heads = tuple(sorted(int(h) for h in heads))
      if len(set(heads)) != len(heads) or any(not 0 <= h < self.num_attention_heads
                                              for h in heads):
        raise ValueError(f"BertConfig: pruned_heads of layer {layer} = {list(heads)}: expected "
                         f"distinct heads in 0..{self.num_attention_heads - 1}.")
      out.append(heads)
    if not any(out):
      return None
    if self.scan_layers or self.share_parameters != "none":
      raise ValueError(
          f"BertConfig: pruned heads need unrolled, unshared layers (got scan_layers="
          f"{self.scan_layers}, share_parameters={self.share_parameters!r}): each layer keeps "
          "its own number of heads.")
    return tuple(out)

  @property
  def scanned_loop(self) -> bool:
    """The layers run as one scanned layer (`scan_layers` without `stack_unrolled`)."""
    return self.scan_layers and not self.stack_unrolled

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  def heads_in_layer(self, layer: int) -> int:
    """How many attention heads layer `layer` computes (fewer than num_attention_heads where
    heads were pruned)."""
    if self.pruned_heads is None:
      return self.num_attention_heads
    return self.num_attention_heads - len(self.pruned_heads[layer])

  def kept_heads(self, layer: int) -> tuple[int, ...]:
    """The original indices of the heads layer `layer` still has, in the order its matrices
    hold them."""
    gone = set(self.pruned_heads[layer]) if self.pruned_heads is not None else set()
    return tuple(h for h in range(self.num_attention_heads) if h not in gone)

  @property
  def num_heads_kept(self) -> int:
    """Heads over all layers."""
    return sum(self.heads_in_layer(i) for i in range(self.num_hidden_layers))

  @property
  def embedding_width(self) -> int:
    """E: the width of the embedding tables and of the MLM decoder (hidden_size unless
    factorized)."""
    return self.hidden_size if self.embedding_size is None else int(self.embedding_size)

  @property
  def factorized_embeddings(self) -> bool:
    return self.embedding_width != self.hidden_size

  @property
  def has_pooler(self) -> bool:
    """Whether the sentence vector is BERT's tanh(dense([CLS])) (`pooler`), or, for ELECTRA,
    the [CLS] output itself (its `get_pooled_output`; no parameters)."""
    return self.model_type != "electra"

  @property
  def has_generator(self) -> bool:
    return self.generator_hidden_size is not None

  def generator_config(self) -> "BertConfig":
    """ELECTRA's generator as a config of its own: this model's vocabulary, positions, token
    types, embedding width (the tables are shared) and compute fields, its own width and depth."""
    if not self.has_generator:
      raise ValueError(f"BertConfig (model_type={self.model_type!r}) has no generator "
                       "(generator_hidden_size is not set).")
    hidden = int(self.generator_hidden_size)
    return self.replace(
        hidden_size=hidden,
        num_hidden_layers=int(self.generator_num_hidden_layers or self.num_hidden_layers),
        num_attention_heads=int(self.generator_num_attention_heads or max(1, hidden // 64)),
        intermediate_size=int(self.generator_intermediate_size or 4 * hidden),
        embedding_size=self.embedding_width, pruned_heads=None,
        **{name: None for name in self.GENERATOR_FIELDS})

  @property
  def max_sequence_length(self) -> int:
    """The longest input the position table serves (514 rows less RoBERTa's offset of 2)."""
    return self.max_position_embeddings - self.position_offset

  def check_sequence_length(self, length: int, name: str = "max_seq_length") -> None:
    """Refuses inputs longer than the position table (the one place this rule is written)."""
    if length > self.max_sequence_length:
      offset = (f" less position_offset={self.position_offset}" if self.position_offset else "")
      raise ValueError(f"{name}={length} exceeds the model's "
                       f"max_position_embeddings={self.max_position_embeddings}{offset}.")

  def replace(self, **changes) -> "BertConfig":
    return dataclasses.replace(self, **changes)

  # ----------------------------------------------------------------------------- reading
  @classmethod
  def from_dict(cls, values: Mapping[str, Any], source: str = "<dict>") -> "BertConfig":
    """Builds a config from the fields of `bert_config.json`: the original's, and the family
    fields ours adds (`to_original_dict`). Other keys are ignored; a missing shape field is
    refused naming `source`. (Foreign configs, Hugging Face's among them, are translated in
    `interop/hf_config.py`.)
    """
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
    """Reads `bert_config.json` (the original's, or ours); local or gs://."""
    return cls.from_dict(read_config_json(path), source=path)

  # ----------------------------------------------------------------------------- writing
  def _family_values(self) -> dict[str, Any]:
    return {name: getattr(self, name) for name in self.FAMILY_FIELDS
            if getattr(self, name) != self.FAMILY_DEFAULTS[name]}

  def to_original_dict(self) -> dict[str, Any]:
    """The original `bert_config.json` fields (no compute fields), plus the family fields
    where they differ from BERT (so a BERT config is written as the original wrote it)."""
    out = {name: getattr(self, name) for name in self.SHAPE_FIELDS if name != "layer_norm_eps"}
    out.update(self._family_values())
    if self.quantization == "int8":  # the parameters are int8: who reads them must know
      out["quantization"] = self.quantization
    return out

  def to_json_file(self, path: str) -> None:
    """Writes `bert_config.json` as `to_original_dict` gives it."""
    from bert_jax import file_io
    file_io.write_text_atomic(path, json.dumps(self.to_original_dict(), indent=2,
                                               sort_keys=True) + "\n")


def read_config_json(path: str) -> dict[str, Any]:
  """The JSON object of a config file, refused naming the file (and line) when it is not one."""
  from bert_jax import file_io
  text = file_io.read_text(path)
  try:
    values = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: line {e.lineno}: not valid JSON ({e.msg}).") from e
  if not isinstance(values, dict):
    raise ValueError(f"{path}: expected a JSON object with BERT config fields.")
  return values


# --------------------------------------------------------------------------------- presets
def _albert(layers: int, hidden: int, heads: int, ffn: int) -> BertConfig:
  """ALBERT (Lan et al. 2020, Table 1): E = 128, all layers shared, tanh-approximated GELU
  (transformers' AlbertConfig default `gelu_new`), 30k SentencePiece vocabulary, no dropout."""
  return BertConfig(model_type="albert", vocab_size=30000, embedding_size=128,
                    share_parameters="all", hidden_size=hidden, num_hidden_layers=layers,
                    num_attention_heads=heads, intermediate_size=ffn, hidden_act="gelu_new",
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _roberta(layers: int, hidden: int, heads: int) -> BertConfig:
  """RoBERTa (Liu et al. 2019): BERT's shape, 50k byte-level BPE vocabulary, one token type,
  positions after padding_idx=1 (514 rows), LayerNorm epsilon 1e-5 as released."""
  return BertConfig(model_type="roberta", vocab_size=50265, hidden_size=hidden,
                    num_hidden_layers=layers, num_attention_heads=heads,
                    intermediate_size=4 * hidden, max_position_embeddings=514,
                    type_vocab_size=1, position_offset=2, layer_norm_eps=1e-5)
def _electra(layers: int, hidden: int, heads: int, embedding: int, generator_hidden: int
             ) -> BertConfig:
  """ELECTRA (Clark et al. 2020, Table 6): BERT's WordPiece vocabulary and encoder; the
  generator as wide as `generator_hidden` (1/4 of the discriminator for Small and Large, 1/3
  for Base), as deep as the discriminator, heads of width 64."""
  return BertConfig(model_type="electra", hidden_size=hidden, num_hidden_layers=layers,
                    num_attention_heads=heads, intermediate_size=4 * hidden,
                    embedding_size=None if embedding == hidden else embedding,
                    generator_hidden_size=generator_hidden)


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
      "albert_base": _albert(12, 768, 12, 3072),
      "albert_large": _albert(24, 1024, 16, 4096),
      "albert_xlarge": _albert(24, 2048, 16, 8192),
      "albert_xxlarge": _albert(12, 4096, 64, 16384),
      "roberta_base": _roberta(12, 768, 12),
      "roberta_large": _roberta(24, 1024, 16),
      # Sanh et al. 2019: BERT-base halved in depth, without token-type embeddings.
      "distilbert_base": BertConfig(model_type="distilbert", num_hidden_layers=6,
                                    type_vocab_size=0),
      "electra_small": _electra(12, 256, 4, 128, 64),
      "electra_base": _electra(12, 768, 12, 768, 256),
      "electra_large": _electra(24, 1024, 16, 1024, 256),
      # ELECTRA for unit tests: factorized embeddings, a generator of half the width.
      "electra_test": _electra(2, 64, 4, 32, 32).replace(vocab_size=512,
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
