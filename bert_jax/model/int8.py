"""Int8 inference: post-training quantization of the dense layers (Q8BERT-style int8 weights and
activations, Zafrir et al. 2019), `BertConfig.quantization="int8"`.

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

What stays float, and why:
- embeddings (lookups, no matmul; the masked-LM decoder is the word table itself), LayerNorm,
  biases, softmax and GELU: cheap elementwise work or tables, where rounding buys nothing;
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


def int8_matmul(x: jax.Array, kernel: jax.Array, kernel_scale: jax.Array,
                bias: jax.Array | None = None) -> jax.Array:
  """x (..., k) float times an int8 `kernel` (k, n) with per-column `kernel_scale` (n,): the
  rows of x quantized per token, the product in int8 with int32 accumulation, rescaled to
  float32, plus `bias`."""
  if kernel.dtype != jnp.int8:
    raise ValueError(f"int8_matmul: the kernel is {kernel.dtype}, expected int8 (quantize the "
                     "parameters with int8.quantize_params).")
  qx, sx = quantize_rows(x)
  acc = jax.lax.dot_general(qx, kernel, (((qx.ndim - 1,), (0,)), ((), ())),
                            preferred_element_type=jnp.int32)
  y = acc.astype(jnp.float32) * sx * kernel_scale.astype(jnp.float32)
  if bias is not None:
    y = y + bias.astype(jnp.float32)
  return y


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

    def kernel_init(key, shape, dtype=jnp.int8):
      w = self.kernel_init(key, shape, jnp.float32)
      return jnp.clip(jnp.round(w / step), -QMAX, QMAX).astype(dtype)

    kernel = self.param("kernel", nn.with_logical_partitioning(kernel_init, self.axes),
                        (x.shape[-1], self.features), jnp.int8)
    scale = self.param(SCALE, nn.with_logical_partitioning(nn.initializers.constant(step),
                                                           self.axes[1:]),
                       (self.features,), jnp.float32)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           self.axes[1:]),
                      (self.features,), self.param_dtype)
    return int8_matmul(x, kernel, scale, bias).astype(self.dtype)


# ------------------------------------------------------------------------- the parameters
def quantize_kernel(kernel: Any) -> tuple[np.ndarray, np.ndarray]:
  """`(int8 kernel, float32 scales)` of a float kernel (in, out), or of a stack of them (a
  scanned layout: (layers, in, out) → scales (layers, out)): per output channel, max|w| / 127."""
  w = np.asarray(kernel, np.float32)
  amax = np.max(np.abs(w), axis=-2)
  scale = np.where(amax > 0, amax / QMAX, 1.0).astype(np.float32)
  q = np.clip(np.rint(w / scale[..., None, :]), -QMAX, QMAX).astype(np.int8)
  return q, scale


def dequantize_kernel(kernel: Any, scale: Any) -> np.ndarray:
  """The float32 kernel that an int8 kernel and its scales stand for."""
  return (np.asarray(kernel, np.float32) * np.asarray(scale, np.float32)[..., None, :])


def _is_dense(node: Mapping) -> bool:
  kernel = node.get("kernel")
  return (kernel is not None and "bias" in node and np.ndim(kernel) >= 2
          and quantized_width(int(np.shape(kernel)[-1])))


def _map_dense(params: Mapping, fn: Callable[[Mapping], dict]) -> dict:
  """`params` with every dense layer that `modeling.dense` computes in int8 replaced by
  `fn(layer)`; every other leaf as it is."""
  def visit(node, top: bool):
    if not isinstance(node, Mapping):
      return node
    if _is_dense(node):
      return fn(node)
    return {k: (v if top and k in FLOAT_SCOPES else visit(v, False)) for k, v in node.items()}
  return visit(params, True)


def is_quantized(params: Mapping) -> bool:
  """Whether `params` hold any int8 kernel (an int8 export, or `quantize_params`' output)."""
  found = []

  def look(node):
    found.append(SCALE in node)
    return dict(node)
  _map_dense(params, look)
  return any(found)


def quantize_params(params: Mapping, config: Any) -> dict:
  """A float model's parameters → the int8 model's: each dense kernel that `modeling.dense`
  computes in int8 (`quantized_width`, outside `FLOAT_SCOPES`) as int8 with its
  `kernel_scale`; embeddings, LayerNorm, biases, logit layers and the rest unchanged. Any tree
  of this package's models, in either layer layout. Parameters that are quantized already are
  returned as they are."""
  if getattr(config, "quantization", "none") == "fp8":
    raise ValueError("quantize_params: the config computes in FP8 (quantization='fp8'); int8 "
                     "quantization starts from the float model (quantization='none').")
  if is_quantized(params):
    return _map_dense(params, dict)

  def quantize(layer):
    q, scale = quantize_kernel(layer["kernel"])
    return {**layer, "kernel": q, SCALE: scale}
  return _map_dense(params, quantize)


def dequantize_params(params: Mapping) -> dict:
  """The inverse, for checks: every int8 kernel as the float32 kernel it stands for (each value
  within half a scale step of the original), `kernel_scale` dropped."""
  def dequantize(layer):
    if SCALE not in layer:
      return dict(layer)
    out = {k: v for k, v in layer.items() if k != SCALE}
    out["kernel"] = dequantize_kernel(layer["kernel"], layer[SCALE])
    return out
  return _map_dense(params, dequantize)


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


def parameter_bytes(params: Any) -> int:
  """Bytes of every parameter."""
  return sum(np.asarray(leaf).nbytes for leaf in jax.tree.leaves(params))
