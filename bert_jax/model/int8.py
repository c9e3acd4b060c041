"""Int8 inference: post-training quantization of the dense layers and the embedding tables
(Q8BERT-style int8 weights and activations, Zafrir et al. 2019), `BertConfig.quantization="int8"`.

The scheme, symmetric (no zero points: the value 0 stays exactly 0 and the integer product needs
no correction terms):

- Weights, once, offline (`quantize_params`): per output channel j, s_w[j] = max_i |W[i, j]| / 127
  and W_q = round(W / s_w), in [-127, 127]. The parameters then hold `kernel` as int8 and
  `kernel_scale` (float32, one per output) beside the float `bias`: a model's dense kernels take
  a quarter of their float32 bytes, in memory and in a checkpoint (`convert --int8`). Per
  channel, because the columns of BERT's matrices differ in range by an order of magnitude; one
  scale per matrix would spend most of the 8 bits of the narrow columns on the wide ones' range.
- Activations, at run time (`quantize_rows`): per token, s_x = max |x| / 127 of that row of the
  layer's input. Dynamic scales need no calibration data and follow each token, so a token with
  BERT's outlier activations coarsens only its own row, not every row of a static per-tensor
  range (Q8BERT calibrated static ranges during quantization-aware training; here nothing is
  trained).
- The product: `lax.dot_general` of the two int8 operands with int32 accumulation
  (`preferred_element_type=jnp.int32`; exact: |sum| <= 127² · width < 2³¹ up to a width of
  133,000), then y = acc · s_x · s_w + bias in float32.
- Embedding tables (word, position, token type; `quantize_table`): per row, s[r] = max |row r|
  / 127, stored as the int8 table under the float table's name (`word_embeddings`) and
  `word_embeddings_scale` (one float32 per row) beside it; a float model's paths are unchanged.
  They are half a small model's bytes (MiniLM's tables, the word table 30522 × 384 first, are
  47.7 of its 90.9 MB), and per row because a row is what a lookup reads: `take_rows` gathers
  the int8 rows and their scales and dequantizes only those, so a lookup costs what it did. A
  row's values are then within s[r]/2 of the float ones, a rounding the sum of three rows and
  the LayerNorm after it absorb as the dense layers absorb theirs.
- The tied masked-LM decoder (`int8_attend`, for fill-mask and the pre-training heads): scores
  against every word row, an int8 matmul as the dense layers', the hidden states quantized per
  token and the table's rows as the output channels (its per-row scale is the per-output scale
  of a kernel (hidden, vocab)). Dequantizing the table instead would write a float32 copy of it
  (V × E × 4 bytes, 47 MB for MiniLM) at every call to read it once, in the model's largest
  matmul; the int8 product reads a quarter of those bytes and needs no copy, and its error is
  the dense layers' bound (`error_bound`), small against the spread of the vocabulary's scores.

What stays float, and why:
- LayerNorm, biases, softmax and GELU: cheap elementwise work, where rounding buys nothing;
- attention's QKᵀ and PV products (two activations, no weights: their cost is a small share at
  BERT's lengths, and each would need scales on both sides);
- dense layers with fewer than `MIN_FEATURES` outputs: the logit layers (a classifier's labels,
  SQuAD's start/end, NSP, ELECTRA's one score) cost next to nothing (hidden × k) and their
  outputs are the decisions themselves, as `modeling.dense` keeps them out of FP8 too;
- layers that `modeling.dense` does not build (`FLOAT_SCOPES`: the feature-based tagger's
  BiLSTM and classifier are flax's own modules).

int8 is for inference: integer weights have no gradient, and training is refused
(`training/step.py`). Fine-tune the float model, then quantize it.

Why not Google's AQT (`aqtp`): AQT injects a quantized `dot_general` into Flax layers and is
built for quantized *training* (what is served is what was trained), with its own configs and a
freezing step for serving. Post-training int8 as here is the few lines below, on
`lax.dot_general` alone, and needs no dependency pinned against this project's jax and flax
versions. Flax's `nn.Dense(dot_general_cls=...)` (the FP8 route) does not fit either: the layer
always creates a float kernel and hands it to the op, which could then only quantize it again
at every call, and the checkpoint would stay float.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# Largest magnitude of a quantized value: symmetric, so -128 is never used.
QMAX = 127
# Dense layers narrower than this stay float (the logit layers; see the module docstring).
MIN_FEATURES = 16
# Top-level scopes whose layers are flax's own modules, not `modeling.dense`: left float.
FLOAT_SCOPES = ("tagger",)
SCALE = "kernel_scale"
# `modeling.BertEmbeddings`' tables: int8 under int8, each with `<name>` + TABLE_SCALE beside it.
TABLES = ("word_embeddings", "position_embeddings", "token_type_embeddings")
TABLE_SCALE = "_scale"

TRAINING_ERROR = (
    "BertConfig.quantization='int8' is for inference only (int8 weights have no gradient): "
    "train or fine-tune the float model (quantization='none'), then quantize it with "
    "`predict --int8` or `convert --format=orbax --int8`.")


def quantized_width(features: int) -> bool:
  """Whether a dense layer with `features` outputs computes in int8 (the one rule that
  `modeling.dense` and `quantize_params` share)."""
  return features >= MIN_FEATURES


# ------------------------------------------------------------------------------ the numerics
def quantize_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`(x_q int8, s_x float32)` with one scale per row of the last axis (per token):
  x ≈ x_q · s_x, |x − x_q · s_x| <= s_x / 2. An all-zero row gets scale 1 (its values are 0)."""
  x = x.astype(jnp.float32)
  amax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
  scale = jnp.where(amax > 0, amax / QMAX, 1.0)
  q = jnp.clip(jnp.round(x / scale), -QMAX, QMAX).astype(jnp.int8)
  return q, scale


def _int8_dot(x: jax.Array, q: jax.Array, scale: jax.Array, axis: int) -> jax.Array:
  """x (..., k) quantized per token, times int8 `q` contracted on its `axis` (of size k), in
  int32, rescaled to float32 by the token's scale and the other axis' `scale`."""
  qx, sx = quantize_rows(x)
  acc = jax.lax.dot_general(qx, q, (((qx.ndim - 1,), (axis,)), ((), ())),
                            preferred_element_type=jnp.int32)
  return acc.astype(jnp.float32) * sx * scale.astype(jnp.float32)


def int8_matmul(x: jax.Array, kernel: jax.Array, kernel_scale: jax.Array,
                bias: jax.Array | None = None) -> jax.Array:
  """x (..., k) float times an int8 `kernel` (k, n) with per-column `kernel_scale` (n,): the
  rows of x quantized per token, the product in int8 with int32 accumulation, rescaled to
  float32, plus `bias`."""
  if kernel.dtype != jnp.int8:
    raise ValueError(f"int8_matmul: the kernel is {kernel.dtype}, expected int8 (quantize the "
                     "parameters with int8.quantize_params).")
  y = _int8_dot(x, kernel, kernel_scale, 0)
  if bias is not None:
    y = y + bias.astype(jnp.float32)
  return y


def int8_attend(x: jax.Array, table: jax.Array, row_scale: jax.Array) -> jax.Array:
  """x (..., e) float scored against every row of an int8 `table` (v, e) with per-row
  `row_scale` (v,): x · tableᵀ as `int8_matmul` computes x · kernel (the rows are the output
  channels), float32 (..., v). The tied masked-LM decoder of an int8 model."""
  if table.dtype != jnp.int8:
    raise ValueError(f"int8_attend: the table is {table.dtype}, expected int8 (quantize the "
                     "parameters with int8.quantize_params).")
  return _int8_dot(x, table, row_scale, 1)


def take_rows(table: jax.Array, row_scale: jax.Array, ids: jax.Array) -> jax.Array:
  """The float32 rows `ids` of an int8 `table` with per-row `row_scale`: only the gathered rows
  are dequantized, so a lookup costs what a float one does."""
  rows = jnp.take(table, ids, axis=0).astype(jnp.float32)
  return rows * jnp.take(row_scale, ids, axis=0).astype(jnp.float32)[..., None]


def error_bound(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
  """The largest |int8 − float| each output of `x @ kernel` can have, from the scales alone.

  With x̂ = x + e (|e_i| <= s_x/2) and ŵ = w + d (|d_ij| <= s_w[j]/2):
  x̂ŵ − xw = e·w + x·d + e·d, so |error_j| <= s_x/2 Σ_i|w_ij| + s_w[j]/2 Σ_i|x_i|
  + k · s_x s_w[j] / 4 (k: the input width). The float32 rescaling adds rounding far below it.
  """
  x = np.asarray(x, np.float64)
  w = np.asarray(kernel, np.float64)
  sx = np.max(np.abs(x), axis=-1, keepdims=True) / QMAX
  sw = np.max(np.abs(w), axis=0) / QMAX
  return (sx / 2 * np.sum(np.abs(w), axis=0) + sw / 2 * np.sum(np.abs(x), axis=-1, keepdims=True)
          + x.shape[-1] * sx * sw / 4)


# ------------------------------------------------------------------------------- the layer
def _quantized_init(init: Callable[..., jax.Array], step: float) -> Callable[..., jax.Array]:
  """An int8 initializer: a draw of the float `init`, quantized with `step` as every scale
  (the parameters' shapes, and tests; real ones come from `quantize_params`)."""
  def quantized(key, shape, dtype=jnp.int8):
    w = init(key, shape, jnp.float32)
    return jnp.clip(jnp.round(w / step), -QMAX, QMAX).astype(dtype)
  return quantized


class Int8Dense(nn.Module):
  """A dense layer whose kernel is int8 with a float scale per output (`kernel`,
  `kernel_scale`, `bias`: the paths of `nn.Dense` plus one), computed by `int8_matmul`.

  Built by `modeling.dense` under `quantization="int8"`; its parameters come from a float
  model's through `quantize_params`. Its own initialisation (for shapes, and tests) quantizes a
  draw of `kernel_init`, whose values lie within ±`init_range`, with that range as the scale.
  """
  features: int
  axes: tuple[str, str]
  kernel_init: Callable[..., jax.Array]
  init_range: float
  dtype: Any = jnp.float32        # of the output
  param_dtype: Any = jnp.float32  # of the bias

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    step = self.init_range / QMAX
    kernel = self.param("kernel", nn.with_logical_partitioning(
        _quantized_init(self.kernel_init, step), self.axes), (x.shape[-1], self.features),
                        jnp.int8)
    scale = self.param(SCALE, nn.with_logical_partitioning(nn.initializers.constant(step),
                                                           self.axes[1:]),
                       (self.features,), jnp.float32)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           self.axes[1:]),
                      (self.features,), self.param_dtype)
    return int8_matmul(x, kernel, scale, bias).astype(self.dtype)


def table_param(module: nn.Module, name: str, shape: tuple[int, int], axes: tuple[str, str],
                init: Callable[..., jax.Array], init_range: float) -> tuple[jax.Array, jax.Array]:
  """An int8 embedding table `name` and its per-row scales `name` + TABLE_SCALE, declared on
  `module` (in its `setup`): the parameters `quantize_params` writes for a float table. Their
  own initialisation quantizes a draw of `init` (within ±`init_range`) with that range as every
  row's scale, as `Int8Dense` does."""
  step = init_range / QMAX
  table = module.param(name, nn.with_logical_partitioning(_quantized_init(init, step), axes),
                       shape, jnp.int8)
  scale = module.param(name + TABLE_SCALE, nn.with_logical_partitioning(
      nn.initializers.constant(step), axes[:1]), shape[:1], jnp.float32)
  return table, scale


# ------------------------------------------------------------------------- the parameters
def _quantize(values: Any, axis: int) -> tuple[np.ndarray, np.ndarray]:
  """`(int8 values, float32 scales)`, symmetric with one scale per slice along `axis` removed:
  max|v| / 127 (an all-zero slice gets scale 1)."""
  v = np.asarray(values, np.float32)
  amax = np.max(np.abs(v), axis=axis)
  scale = np.where(amax > 0, amax / QMAX, 1.0).astype(np.float32)
  return np.clip(np.rint(v / np.expand_dims(scale, axis)), -QMAX, QMAX).astype(np.int8), scale


def _dequantize(values: Any, scale: Any, axis: int) -> np.ndarray:
  return np.asarray(values, np.float32) * np.expand_dims(np.asarray(scale, np.float32), axis)


def quantize_kernel(kernel: Any) -> tuple[np.ndarray, np.ndarray]:
  """`(int8 kernel, float32 scales)` of a float kernel (in, out), or of a stack of them (a
  scanned layout: (layers, in, out) → scales (layers, out)): per output channel, max|w| / 127."""
  return _quantize(kernel, -2)


def dequantize_kernel(kernel: Any, scale: Any) -> np.ndarray:
  """The float32 kernel that an int8 kernel and its scales stand for."""
  return _dequantize(kernel, scale, -2)


def quantize_table(table: Any) -> tuple[np.ndarray, np.ndarray]:
  """`(int8 table, float32 scales)` of a float embedding table (rows, width): per row,
  max|row| / 127."""
  return _quantize(table, -1)


def dequantize_table(table: Any, scale: Any) -> np.ndarray:
  """The float32 table that an int8 table and its per-row scales stand for."""
  return _dequantize(table, scale, -1)


def _is_embeddings(node: Mapping) -> bool:
  """`modeling.BertEmbeddings`' scope: the one that holds the word table."""
  return np.ndim(node.get(TABLES[0])) == 2


def _is_dense(node: Mapping) -> bool:
  kernel = node.get("kernel")
  return (kernel is not None and "bias" in node and np.ndim(kernel) >= 2
          and quantized_width(int(np.shape(kernel)[-1])))


def _map_dense(params: Mapping, fn: Callable[[Mapping], dict],
               tables: Callable[[Mapping], dict] = dict) -> dict:
  """`params` with every dense layer that `modeling.dense` computes in int8 replaced by
  `fn(layer)`, and the embeddings' scope by `tables(scope)` (whose LayerNorm is visited after);
  every other leaf as it is."""
  def visit(node, top: bool):
    if not isinstance(node, Mapping):
      return node
    if _is_dense(node):
      return fn(node)
    if _is_embeddings(node):
      node = tables(node)
    return {k: (v if top and k in FLOAT_SCOPES else visit(v, False)) for k, v in node.items()}
  return visit(params, True)


def is_quantized(params: Mapping) -> bool:
  """Whether `params` hold any int8 kernel or table (an int8 export, or `quantize_params`'
  output)."""
  found = []

  def look(node, key):
    found.append(key in node)
    return dict(node)
  _map_dense(params, lambda n: look(n, SCALE), lambda n: look(n, TABLES[0] + TABLE_SCALE))
  return any(found)


def quantize_params(params: Mapping, config: Any) -> dict:
  """A float model's parameters → the int8 model's: each dense kernel that `modeling.dense`
  computes in int8 (`quantized_width`, outside `FLOAT_SCOPES`) as int8 with its
  `kernel_scale`, and each embedding table as int8 with its per-row `<name>_scale`; LayerNorm,
  biases, logit layers and the rest unchanged. Any tree of this package's models, in either
  layer layout. Parameters that are quantized already are kept as they are."""
  if getattr(config, "quantization", "none") == "fp8":
    raise ValueError("quantize_params: the config computes in FP8 (quantization='fp8'); int8 "
                     "quantization starts from the float model (quantization='none').")

  def quantize(layer):
    if SCALE in layer:
      return dict(layer)
    q, scale = quantize_kernel(layer["kernel"])
    return {**layer, "kernel": q, SCALE: scale}

  def quantize_tables(scope):
    out = dict(scope)
    for name in TABLES:
      if name in scope and name + TABLE_SCALE not in scope:
        out[name], out[name + TABLE_SCALE] = quantize_table(scope[name])
    return out
  return _map_dense(params, quantize, quantize_tables)


def dequantize_params(params: Mapping) -> dict:
  """The inverse, for checks and the float formats: every int8 kernel and table as the float32
  values it stands for (each within half a scale step of the original), the scales dropped."""
  def dequantize(layer):
    if SCALE not in layer:
      return dict(layer)
    out = {k: v for k, v in layer.items() if k != SCALE}
    out["kernel"] = dequantize_kernel(layer["kernel"], layer[SCALE])
    return out

  def dequantize_tables(scope):
    scales = {name + TABLE_SCALE for name in TABLES}
    out = {k: v for k, v in scope.items() if k not in scales}
    for name in TABLES:
      if name + TABLE_SCALE in scope:
        out[name] = dequantize_table(scope[name], scope[name + TABLE_SCALE])
    return out
  return _map_dense(params, dequantize, dequantize_tables)


def quantize_model(config: Any, params: Mapping) -> tuple[Any, dict]:
  """`(config, params)` of a float model as the int8 model that computes them: the config with
  `quantization="int8"`, the parameters by `quantize_params`. An int8 model is returned as it is."""
  return config.replace(quantization="int8"), quantize_params(params, config)


def kernel_bytes(params: Mapping) -> int:
  """Bytes of the dense kernels (and their scales) that int8 quantizes: what it makes ~4x
  smaller."""
  total = []

  def count(layer):
    total.append(np.asarray(layer["kernel"]).nbytes
                 + (np.asarray(layer[SCALE]).nbytes if SCALE in layer else 0))
    return dict(layer)
  _map_dense(params, count)
  return sum(total)


def table_bytes(params: Mapping) -> int:
  """Bytes of the embedding tables (and their per-row scales), which int8 makes ~4x smaller."""
  total = []

  def count(scope):
    names = [n for name in TABLES for n in (name, name + TABLE_SCALE)]
    total.extend(np.asarray(scope[n]).nbytes for n in names if n in scope)
    return dict(scope)
  _map_dense(params, dict, count)
  return sum(total)


def parameter_bytes(params: Any) -> int:
  """Bytes of every parameter."""
  return sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(params))
