"""The BERT encoder as pure-functional Flax linen modules.

Parameter paths mirror the original TF1 variable names (`bert/encoder/layer_3/attention/self/
query/kernel`), so that conversion to TF1 and Hugging Face names is a table (`convert.py`), not
code. Every parameter is born with logical axis names; `sharding.py` maps those names onto a
device mesh, so the same modules run data-parallel, FSDP or tensor-parallel by changing rules
only. Parameters are stored in `param_dtype` (float32); matrix multiplies run in `dtype`
(bfloat16 on TPU); LayerNorm, softmax and anything feeding a loss run in float32.
"""

from __future__ import annotations

import functools
import math
import zlib
from typing import Any, Callable

import flax.linen as nn
import jax
from flax.linen import fp8_ops
import jax.numpy as jnp
import numpy as np

from bert_jax.model import cudnn_runtime
from bert_jax.model import dropout as dropout_lib
from bert_jax.model import fp8
from bert_jax.model import int8
from bert_jax.model import target
from bert_jax.model.configuration import BertConfig, PRESETS, get_preset  # re-exported

__all__ = ["BertConfig", "PRESETS", "get_preset", "BertModel", "BertEmbeddings", "BertEncoder",
           "BertLayer", "SharedLayerParts", "dot_product_attention", "attention_mask",
           "attention_kernel_description", "bert_initializer", "stack_layers", "unstack_layers",
           "LayerNorm", "residual_layer_norm", "Dropout"]

Dropout = dropout_lib.Dropout

# Logical axis names of activations. Parameters use: vocab, embed, embed_out, joined_kv, mlp,
# position, token_type, norm, classes, layers.
BATCH, LENGTH, EMBED = "activation_batch", "activation_length", "activation_embed"
HEADS, KV, MLP, VOCAB = "activation_heads", "activation_kv", "activation_mlp", "activation_vocab"

# Large negative for masked logits (attention, SQuAD windows): exp() of it is exactly 0 in float32, like the
# original's -10000 additive mask, without overflowing in bfloat16.
MASKED_LOGIT = -1e9


def bert_initializer(stddev: float) -> Callable[..., jax.Array]:
  """TF1's `truncated_normal_initializer(stddev)`: a N(0, stddev²) cut at ±2σ, not rescaled.

  (`jax.nn.initializers.truncated_normal` rescales so that the *truncated* distribution has the
  given deviation; the original did not, so BERT weights start ~12% narrower than that.)
  """
  def init(key, shape, dtype=jnp.float32):
    return (jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32) * stddev).astype(dtype)
  return init


def _dtype(name: str):
  return jnp.dtype(name)


def activation_fn(name: str) -> Callable[[jax.Array], jax.Array]:
  """The activation `hidden_act` names. GELU keeps only its input for the backward pass
  (`gelu`)."""
  if name == "gelu":  # the original: exact, via erf
    return functools.partial(gelu, approximate=False)
  if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_approximate"):
    return functools.partial(gelu, approximate=True)
  if name == "relu":
    return jax.nn.relu
  if name in ("silu", "swish"):
    return jax.nn.silu
  if name == "tanh":
    return jnp.tanh
  raise ValueError(f"Unknown hidden_act {name!r}.")


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def gelu(x: jax.Array, approximate: bool) -> jax.Array:
  """`jax.nn.gelu(x, approximate)`, whose backward pass keeps only `x` and computes the
  derivative from it.

  Why: differentiated as it is, GELU's forward computes its derivative's terms while it has x
  at hand and keeps them for the backward pass. In the GPU program of BERT-base/128 the forward
  kernel of each feed-forward layer then writes two more arrays of the feed-forward width
  beside its output (805 MB where 403 MB do) and the backward reads them back. Here the
  backward computes the terms again from x, which it reads anyway: 200 MB per layer less moved
  in all (2.4 GB per step; `benchmarks/gpu_compile_table.py`). The derivative is written with
  other operations than the forward's (erf where the forward has erfc, tanh through sigmoids),
  so that XLA does not merge the two computations back into one kept for later (as it does
  with `jax.checkpoint`, whose recomputation XLA's common-subexpression pass undoes).

  The exact form is computed in float32 whatever x's dtype, erfc as `jax.nn.gelu` has it:
  `jax.nn.gelu` on bfloat16 rounds erfc's argument to bfloat16, and XLA's GPU compiler put that
  product in a kernel of its own, so each feed-forward layer's forward wrote and read two more
  arrays of its width (1.0 GB where 0.4 GB do, 7.3 GB per BERT-base/128 step). Values equal
  `jax.nn.gelu`'s in float32 (and lose the argument's rounding in bfloat16); gradients equal its
  derivative within float32 rounding.
  """
  if approximate:
    return jax.nn.gelu(x, approximate=True)
  v = x.astype(jnp.float32)
  return (0.5 * v * jax.lax.erfc(v * -(1 / math.sqrt(2)))).astype(x.dtype)


def _gelu_fwd(x, approximate):
  return gelu(x, approximate), x


def _gelu_bwd(approximate, x, grad):
  v = x.astype(jnp.float32)
  if approximate:  # d/dx of 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
    # With s(z) the sigmoid: 0.5 (1 + tanh u) = s(2u) and 1 - tanh^2 u = 4 s(2u) s(-2u),
    # which keeps its precision where tanh u rounds to 1.
    u = math.sqrt(2 / math.pi) * (v + 0.044715 * v * v * v)
    du = math.sqrt(2 / math.pi) * (1 + 3 * 0.044715 * v * v)
    slope = jax.nn.sigmoid(2 * u) * (1 + 2 * v * jax.nn.sigmoid(-2 * u) * du)
  else:  # Phi(x) + x phi(x)
    slope = (0.5 * (1 + jax.lax.erf(v * (1 / math.sqrt(2))))
             + v * jnp.exp(-0.5 * v * v) * (1 / math.sqrt(2 * math.pi)))
  return ((grad.astype(jnp.float32) * slope).astype(x.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


def dense(config: BertConfig, features: int, axes: tuple[str, str], name: str,
          add_bias: bool = True, activation: str | None = None) -> nn.Module:
  """A dense layer whose kernel and bias carry logical axis names.

  `add_bias=False`: the bias is a parameter as ever (initialised, loaded, saved, converted) but
  is not added to the output (`_without_bias`): for attention's key projection, whose bias
  cannot change attention (`BertSelfAttention`).

  With `config.quantization == "fp8"` it is `fp8.Fp8Dense`: the arithmetic and variables of
  Flax's `Dense` with its `Fp8DirectDotGeneralOp` (input and kernel in float8_e4m3fn, the
  output's gradient in float8_e5m2, each divided by a *delayed* scale: the largest |value| of
  the last 1024 steps over the format's maximum), each operand quantized in one pass on a GPU
  (`model/fp8.py`, which says why). Scales and amax histories are the
  `_overwrite_with_gradient` collection, whose "gradient" from the backward pass is their next
  value: the train state's `model_state`, which the step overwrites. They sit in a child module
  under the name Flax's op has, and `kernel` and `bias` keep their names and shapes:
  checkpoints and conversions are those of "none". `activation` (FP8 only,
  `fused_activation`): the layer's input is the pre-activation, and the FP8 kernel applies the
  activation as it quantizes it.

  Layers whose width is not a multiple of 16 (NSP's two logits, classifiers, span ends,
  ELECTRA's one score) stay in the compute dtype: Hopper's FP8 GEMMs need dimensions in
  multiples of 16, and these logit layers cost next to nothing and would lose most to rounding.

  With `config.quantization == "int8"` (inference) it is `int8.Int8Dense`: an int8 kernel with
  a scale per output, stored so in the parameters, times the input quantized per token, in
  int8 with int32 accumulation (`model/int8.py`, which says why). Layers narrower than 16 stay
  float there too, by the same reasoning.
  """
  if config.quantization == "int8" and int8.quantized_width(features):
    return int8.Int8Dense(features, axes, bert_initializer(config.initializer_range),
                          init_range=2.0 * config.initializer_range, dtype=_dtype(config.dtype),
                          param_dtype=_dtype(config.param_dtype), name=name)
  kernel_init = nn.with_logical_partitioning(bert_initializer(config.initializer_range), axes)
  bias_init = nn.with_logical_partitioning(nn.initializers.zeros_init(), axes[1:])
  if config.quantization == "fp8" and features % 16 == 0:
    return fp8.Fp8Dense(features, kernel_init, bias_init, dtype=_dtype(config.dtype),
                        param_dtype=_dtype(config.param_dtype), add_bias=add_bias,
                        activation=activation, name=name)
  if activation is not None:
    raise ValueError(f"dense {name!r}: activation={activation!r} is applied only by FP8 "
                     "layers (`fused_activation`).")
  return nn.Dense(
      features, dtype=_dtype(config.dtype), param_dtype=_dtype(config.param_dtype),
      kernel_init=kernel_init, bias_init=bias_init,
      promote_dtype=nn.dtypes.promote_dtype if add_bias else _without_bias, name=name)


def _without_bias(inputs, kernel, bias, dtype=None, inexact=True):
  """flax's `promote_dtype` for a Dense's (inputs, kernel, bias), returning no bias: the layer
  then adds none (its `bias` parameter stays where it is)."""
  inputs, kernel = nn.dtypes.promote_dtype(inputs, kernel, dtype=dtype, inexact=inexact)
  return inputs, kernel, None


def layer_norm(config: BertConfig, name: str = "LayerNorm",
               out_dtype: Any = jnp.float32) -> nn.Module:
  """LayerNorm with float32 statistics, its output in `out_dtype`. With
  `config.low_precision_layer_norm` it is `LayerNorm` below (its input may be bfloat16, the
  residual add fused in, one backward of its own, the GPU form where attention runs through
  cuDNN); without, flax's module computing everything in float32 (two-pass variance, as the
  reference). Both keep `scale` and `bias` under `name`."""
  init = lambda fn: nn.with_logical_partitioning(fn, ("norm",))
  if config.low_precision_layer_norm:
    return LayerNorm(epsilon=config.layer_norm_eps, param_dtype=_dtype(config.param_dtype),
                     out_dtype=out_dtype, gpu=config.attention_implementation == "cudnn",
                     name=name)
  return nn.LayerNorm(
      epsilon=config.layer_norm_eps, dtype=jnp.float32, param_dtype=_dtype(config.param_dtype),
      use_fast_variance=False, scale_init=init(nn.initializers.ones_init()),
      bias_init=init(nn.initializers.zeros_init()), name=name)


def _row_statistics(v: jax.Array, epsilon: float, one_pass: bool) -> tuple[jax.Array, jax.Array]:
  """(mean, 1/sqrt(variance + epsilon)) over the last axis of float32 `v`, keeping that axis.

  Two passes: the mean, then the mean square of the centred values (flax's LayerNorm, the
  reference). One pass: both sums at once over the values shifted by the row's first one, which
  lies within the row's spread, so the difference of the two means keeps float32's precision
  where a large common offset would cancel it in the plain E[v^2] - E[v]^2."""
  if not one_pass:
    mean = jnp.mean(v, axis=-1, keepdims=True)
    return mean, jax.lax.rsqrt(jnp.mean(jnp.square(v - mean), axis=-1, keepdims=True)
                               + epsilon)
  shift = jax.lax.slice_in_dim(v, 0, 1, axis=-1)
  shifted = v - shift
  s1, s2 = jax.lax.reduce((shifted, shifted * shifted), (np.float32(0), np.float32(0)),
                          lambda a, b: (a[0] + b[0], a[1] + b[1]), (v.ndim - 1,))
  s1, s2 = s1[..., None] / v.shape[-1], s2[..., None] / v.shape[-1]
  return shift + s1, jax.lax.rsqrt(jnp.maximum(s2 - s1 * s1, 0.0) + epsilon)


def _layer_norm_forward(x, residual, scale, bias, epsilon, out_dtype, gpu=False):
  v = x.astype(jnp.float32)
  if residual is not None:
    v = v + residual.astype(jnp.float32)
  # The saved input is the sum in the inputs' own dtype (bfloat16 in training: half the bytes
  # of float32), with the float32 row statistics beside it; the output is computed from the
  # float32 sum.
  total = v.astype(x.dtype)
  if gpu:
    total = _materialized(total)
  mean, rstd = _row_statistics(v, epsilon, one_pass=gpu)
  y = (v - mean) * rstd * scale.astype(jnp.float32) + bias.astype(jnp.float32)
  return y.astype(out_dtype), (total, mean, rstd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def residual_layer_norm(x: jax.Array, residual: jax.Array | None, scale: jax.Array,
                        bias: jax.Array, epsilon: float, out_dtype: Any,
                        gpu: bool = False) -> jax.Array:
  """LayerNorm(x + residual) · scale + bias with float32 statistics, the result in `out_dtype`.

  One function for the residual add and the normalisation, with its backward written out, so
  that XLA sees one reduction per row forward (mean, then variance of the centred sum, fused)
  and one backward (the two row means of the standard LayerNorm gradient, plus the column sums
  for scale and bias), and so that only the sum in the inputs' dtype and two float32 numbers per
  row are kept for the backward pass, instead of float32 intermediates. `residual` may be None
  (the embeddings' LayerNorm has no residual). The float32 result equals flax's LayerNorm
  within rounding; its gradient is the analytic one.

  `gpu`: the form XLA's GPU compiler lowers to fewer kernels (see `LayerNorm`): the saved sum
  written once, and both statistics from one pass over the row (`_row_statistics`).
  """
  return _layer_norm_forward(x, residual, scale, bias, epsilon, out_dtype, gpu)[0]


def _residual_layer_norm_fwd(x, residual, scale, bias, epsilon, out_dtype, gpu):
  y, (total, mean, rstd) = _layer_norm_forward(x, residual, scale, bias, epsilon, out_dtype,
                                               gpu)
  # `residual` itself is saved only as its structure: None, or (for its dtype) an empty array.
  marker = None if residual is None else jnp.zeros((0,), residual.dtype)
  return y, (total, mean, rstd, scale, bias, marker)


def _residual_layer_norm_bwd(epsilon, out_dtype, gpu, saved, grad):
  del epsilon, out_dtype, gpu
  total, mean, rstd, scale, bias, marker = saved
  grad = grad.astype(jnp.float32)
  normed = (total.astype(jnp.float32) - mean) * rstd
  reduce_axes = tuple(range(grad.ndim - 1))
  d_scale = jnp.sum(grad * normed, axis=reduce_axes).astype(scale.dtype)
  d_bias = jnp.sum(grad, axis=reduce_axes).astype(bias.dtype)
  g = grad * scale.astype(jnp.float32)
  d_total = rstd * (g - jnp.mean(g, axis=-1, keepdims=True)
                    - normed * jnp.mean(g * normed, axis=-1, keepdims=True))
  d_x = d_total.astype(total.dtype)
  d_residual = None if marker is None else d_total.astype(marker.dtype)
  return d_x, d_residual, d_scale, d_bias


residual_layer_norm.defvjp(_residual_layer_norm_fwd, _residual_layer_norm_bwd)


class LayerNorm(nn.Module):
  """LayerNorm over the last axis with float32 statistics and output in `out_dtype`; called
  with a `residual`, it normalises `x + residual` (the post-LN block's add, fused in).
  Parameters `scale` and `bias`, as flax's LayerNorm names them (checkpoints read the same).

  `gpu` (set where attention runs through cuDNN, that is on GPUs) shapes the program for XLA's
  GPU compiler, which cannot normalise a row in the kernel that sums it:
  - the output is written once and read by every consumer (`_materialized`), rather than
    recomputed from the LayerNorm's inputs inside the next site's kernel, where it keeps that
    LayerNorm from being lowered to few kernels;
  - the sum in the inputs' dtype, kept for the backward pass, is written once, and the
    backward's two kernels read it instead of recomputing it from both of its terms;
  - mean and variance come from one pass over the row, a kernel less than two passes.
  Measured on the H100 program of BERT-base/128 (`benchmarks/gpu_compile_table.py`): the
  first saves 2.8 GB per step and 1.1 GiB of peak memory, the other two 4.3 GB per step (the
  forward of a site from 3 row kernels to 2, 428 to 353 MB; its backward 354 to 253 MB). On a
  TPU program the barrier moved 0.4 GB more (v5e) and the one-pass statistics 3.6 GB more
  (v6e), so TPUs and CPUs go without."""
  epsilon: float = 1e-12
  param_dtype: Any = jnp.float32
  out_dtype: Any = jnp.float32
  gpu: bool = False

  @nn.compact
  def __call__(self, x: jax.Array, residual: jax.Array | None = None) -> jax.Array:
    scale, bias = _norm_parameters(self, x.shape[-1], self.param_dtype)
    y = residual_layer_norm(x, residual, scale, bias, self.epsilon, jnp.dtype(self.out_dtype),
                            self.gpu)
    return _materialized(y) if self.gpu else y


def _norm_parameters(module: nn.Module, width: int, dtype) -> tuple[jax.Array, jax.Array]:
  """A LayerNorm's `scale` (ones) and `bias` (zeros), named and partitioned as flax's."""
  scale = module.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                             ("norm",)), (width,), dtype)
  bias = module.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           ("norm",)), (width,), dtype)
  return scale, bias


class DropoutResidualLayerNorm(nn.Module):
  """LayerNorm(dropout(x + dense_bias) + residual) in one kernel each way
  (`pallas_layer_norm`), with the parameters of `LayerNorm` (so checkpoints read the same).
  `x` is a dense layer's output before its bias, which the kernels add (and whose gradient
  they sum). The dropout seed is the module's "dropout" key itself (its two words), which
  differs for every site and step; a resumed run draws the same.

  Under a mesh the kernel runs in `shard_map` on each device's rows (XLA cannot partition a
  custom kernel): the batch and length axes split as the rules split the activations, the
  width whole; each shard folds its index into the seed."""
  rate: float
  bits: int = 16
  epsilon: float = 1e-12
  param_dtype: Any = jnp.float32
  out_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, dense_bias: jax.Array, residual: jax.Array,
               deterministic: bool, uses: int = 1) -> jax.Array | tuple[jax.Array, ...]:
    """The site's output; `uses` > 1: that many copies of it, one per consumer, whose
    gradients the backward kernel adds (`pallas_layer_norm.dropout_residual_layer_norm`)."""
    from bert_jax.model import pallas_layer_norm
    scale, bias = _norm_parameters(self, x.shape[-1], self.param_dtype)
    rate = 0.0 if deterministic else self.rate
    seed = (_key_words(self.make_rng("dropout")) if rate > 0.0
            else jnp.zeros((2,), jnp.uint32))

    def kernel(x, dense_bias, residual, scale, bias, seed, shard=None):
      if shard is not None:
        seed = dropout_lib.shard_seed(seed, shard)
      return pallas_layer_norm.dropout_residual_layer_norm(
          x, dense_bias, residual, scale, bias, rate=rate, seed=seed, epsilon=self.epsilon,
          out_dtype=self.out_dtype, bits=self.bits, uses=uses)

    operands = (x, dense_bias, residual, scale, bias, seed)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
      return kernel(*operands)
    axes = target.dividing_mesh_axes(mesh, x.shape, (BATCH, LENGTH, None))
    spec, whole = jax.sharding.PartitionSpec(*axes), jax.sharding.PartitionSpec()
    return target.per_shard(kernel, operands, (spec, whole, spec, whole, whole, whole),
                            spec if uses == 1 else (spec,) * uses, axes)


def _key_words(key: jax.Array) -> jax.Array:
  """Two uint32 words of a PRNG key, whatever its implementation (threefry's key is two words;
  longer keys are folded pairwise with xor)."""
  words = jax.random.key_data(key).reshape(-1).astype(jnp.uint32)
  if words.shape[0] % 2:
    words = jnp.concatenate([words, jnp.zeros((1,), jnp.uint32)])
  return jax.lax.reduce(words.reshape(-1, 2), np.uint32(0), jax.lax.bitwise_xor, (0,))


def _materialized(x: jax.Array) -> jax.Array:
  """`x`, computed before anything that uses it and not recomputed by its users: an XLA
  optimization barrier (an identity, its gradient the incoming one)."""
  return jax.lax.optimization_barrier(x)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def float32_einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
  """`jnp.einsum(spec, a, b)` on operands in a's dtype, accumulated and returned in float32,
  with its gradient taken in a's dtype as every other matmul's is.

  For the scores a float32 softmax reads: the tied decoder's over the vocabulary, attention's
  explicit q·k, the sentence-order logits (a `...` of a's is summed in b's gradient). The
  backward rounds the scores' float32 gradient to a's dtype once; both gradient matmuls read it
  and accumulate in float32, and each operand's gradient comes back in that operand's dtype
  (the tied table's in float32). Differentiated as written, the float32 gradient made both
  gradient matmuls float32 ones: the compiler folds b's cast and its inverse away, and in the
  program compiled for an H200 the decoder's two (5,120 masked positions × 30,522 words × 768
  at BERT-base/128, 240 GFLOP each) read float32 operands, at half the bfloat16 rate or less.
  In float32 compute nothing is rounded: the gradients are autodiff's."""
  return jnp.einsum(spec, a, b.astype(a.dtype), preferred_element_type=jnp.float32)


def _float32_einsum_fwd(spec, a, b):
  return float32_einsum(spec, a, b), (a, b)


def _float32_einsum_bwd(spec, saved, grad):
  a, b = saved
  inputs, out = spec.split("->")
  in_a, in_b = inputs.split(",")
  g = grad.astype(a.dtype)
  da = jnp.einsum(f"{out},{in_b}->{in_a}", g, b.astype(a.dtype),
                  preferred_element_type=jnp.float32)
  db = jnp.einsum(f"{out},{in_a}->{in_b}", g, a, preferred_element_type=jnp.float32)
  return da.astype(a.dtype), db.astype(b.dtype)


float32_einsum.defvjp(_float32_einsum_fwd, _float32_einsum_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def fan_out(x: jax.Array, uses: int) -> tuple[jax.Array, ...]:
  """`uses` copies of `x`, one for each of its consumers, whose gradients come back summed
  latest first: g[1] + (g[2] + (… + (g[-1] + g[0]))).

  For an attention block's input, read by the residual (first) and the query, key and value
  projections. Autodiff adds the cotangents in the order they arrive, the running sum first.
  XLA's GPU compiler folds an add into the GEMM whose output is its first operand (cuBLAS's
  beta = 1: the GEMM reads the sum and writes onto it), and leaves it as a kernel of its own
  when that GEMM already accumulates, without trying the other operand. So of the three input
  gradients the key's was added by a kernel of its own, three passes over the residual stream
  per layer (4.8 GB per BERT-large/512 step in the H200's program, of which folding leaves the
  GEMMs' one read: 3.2 GB less). Summed here, each GEMM's output comes first onto the sum
  before it, and all three fold. Values are the same up to the order of a sum. Used for GPUs
  only: compiled for a TPU, whose compiler fuses the adds its own way, the same step moved
  more with it than without. Each copy is a value of its own to the compiler, as the fused
  sites' are (`pallas_layer_norm._copies`: XLA's dot merger then joins no two projections)."""
  return jax.lax.optimization_barrier((x,) * uses)


def _fan_out_fwd(x, uses):
  return fan_out(x, uses), None


def _fan_out_bwd(uses, _, grads):
  with jax.named_scope("fan_out"):  # the adds' op_name, for `hlo_costs.model_part`
    total = grads[0]
    for grad in reversed(grads[1:]):
      total = grad + total
  return (total,)


fan_out.defvjp(_fan_out_fwd, _fan_out_bwd)


def joined_projection(config: BertConfig) -> bool:
  """Whether a block's query, key and value are one GEMM against their three kernels side by
  side, whose output our Triton attention kernels read in place
  (`triton_attention.joined_flash_attention`): `attention_implementation="pallas"` on a GPU,
  plain dense layers (FP8 and int8 have their own). One GEMM of three times the width instead
  of three, the block input read once, and backward one weight-gradient GEMM and one
  input-gradient GEMM over the three gradients, which the kernel writes side by side. cuDNN's
  attention takes dense q, k and v, so with it the joined output would be copied apart (and
  XLA's dot merger, which joins such GEMMs by itself, is kept from it: `fan_out`)."""
  return (config.attention_implementation == "pallas" and config.quantization == "none"
          and target.target_platform() == "gpu")


def attention_input_uses(config: BertConfig) -> int:
  """How many times an attention block's input is read: by the residual, and by the query, key
  and value projections (`fan_out`, `sites_take_copies`), in that order; by the residual and
  the joined projection (`joined_projection`)."""
  return 2 if joined_projection(config) else 4


def fused_activation(config: BertConfig) -> str | None:
  """The feed-forward activation the second FP8 dense layer applies to its input inside its
  quantization kernel (`fp8.fp8_dense`), or None where the first layer's block applies it.

  In FP8 the activation's output is read by one kernel only, the one that quantizes it for the
  second layer's GEMMs: written in bfloat16 and read back, 402 MB per BERT-base/128 layer
  forward (4.8 GB per step, about 13 GB at BERT-large/512; the H200's program). That kernel
  applies it instead, as it reads the first layer's output. GELU (erf) only, and only where the
  second layer computes in FP8 (its width a multiple of 16)."""
  if (config.quantization == "fp8" and config.hidden_act in fp8.KERNEL_ACTIVATIONS
      and config.hidden_size % 16 == 0):
    return config.hidden_act
  return None


def sites_take_copies(config: BertConfig) -> bool:
  """Whether a block's LayerNorm sites hand their output to its consumers as copies, one each,
  so that the site's backward kernel adds their gradients as it reads them: with the fused
  sites (`DropoutResidualLayerNorm`), whose kernel can. Autodiff would otherwise add them in a
  kernel of XLA's, which writes the sum the site's kernel then reads: per layer, the attention
  output's two consumers and the block output's four, about 190 MB per BERT-base/128 layer on
  the H200, where XLA's GPU compiler does not fold those adds into the GEMMs whose outputs
  they are once its autotuner has chosen cuBLAS. A block's output goes to the next block as its
  residual, query, key and value, the copies `fan_out` would make."""
  return config.layer_norm_implementation == "pallas"


def attention_mask(input_mask: jax.Array, sequence_ids: jax.Array | None = None) -> jax.Array:
  """Which keys each query may attend to, as a boolean mask broadcastable to (b, heads, q, kv).

  Unpacked rows: every query sees the row's real keys, (batch, 1, 1, kv). Packed rows (several
  instances per row, Krell et al. 2021): query i sees key j only if both belong to the same
  instance, `sequence_ids[i] == sequence_ids[j] != 0`, so no instance sees another and each
  gives what it gives alone; (batch, 1, q, kv). Padding queries then see nothing (their rows
  are fully masked, harmless: nothing reads them).
  """
  keys = input_mask[:, None, None, :].astype(jnp.bool_)
  if sequence_ids is None:
    return keys
  same = sequence_ids[:, :, None] == sequence_ids[:, None, :]
  return same[:, None] & (sequence_ids[:, None, None, :] != 0) & keys


def _segment_ids(input_mask: jax.Array, sequence_ids: jax.Array | None) -> jax.Array:
  """What the Pallas kernels take instead of a mask, (batch, length) int32: a query attends the
  keys of its own id. Real tokens get their instance's id (packed) or 1 (unpacked) and padding
  gets 0, so real queries never see padding or another instance. Padding queries see padding
  keys, unlike the other paths; nothing reads those rows."""
  real = input_mask.astype(jnp.bool_)
  ids = real.astype(jnp.int32) if sequence_ids is None else jnp.where(real, sequence_ids, 0)
  return ids.astype(jnp.int32)


def _pallas_attention(query, key, value, input_mask, sequence_ids, dropout_rate, dropout_rng,
                      dropout_bits):
  """Pallas attention, masked by segment ids (`_segment_ids`): on a GPU the Triton kernels
  (`_triton_attention`), elsewhere the TPU's (interpreted off a TPU).

  TPU: lengths must be multiples of 128 (the kernels' block). Without dropout this is JAX's
  Pallas flash-attention kernel (online softmax over key blocks). With attention-probability
  dropout it is `pallas_attention.flash_attention`, which draws the mask inside the kernel from
  a seed taken from the layer's dropout key (so every step and layer gets its own masks and a
  resumed run draws the same ones) and regenerates it in the backward pass.

  Under a mesh the kernel runs in `shard_map` on each device's rows and heads: XLA cannot
  partition a Pallas kernel, and would otherwise gather the whole batch onto every device.
  Each shard folds its index into the seed, so shards never repeat each other's masks.
  """
  if target.target_platform() == "gpu":
    return _triton_attention((query, key, value), input_mask, sequence_ids, dropout_rate,
                             dropout_rng, dropout_bits)
  from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash
  from bert_jax.model import pallas_attention
  length = query.shape[1]
  if length % pallas_flash.MIN_BLOCK_SIZE:
    raise ValueError(
        f"attention_implementation='pallas' needs a sequence length that is a multiple of "
        f"{pallas_flash.MIN_BLOCK_SIZE} on a TPU (the kernel's block), got {length}; use "
        f"'xla' or pad the rows.")
  ids = _segment_ids(input_mask, sequence_ids)
  seed = (jnp.zeros((), jnp.int32) if dropout_rate == 0.0 else
          jax.lax.bitcast_convert_type(jax.random.bits(dropout_rng, (), jnp.uint32), jnp.int32))

  def kernel(q, k, v, ids, seed, shard):
    if dropout_rate > 0.0:
      if shard is not None:
        seed = seed ^ (shard * jnp.int32(-1640531535))  # 0x9E3779B1: spreads shard indices
      return pallas_attention.flash_attention(q, k, v, ids, dropout_rate=dropout_rate,
                                              seed=seed)
    to_heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # (b, s, n, d) <-> (b, n, s, d)
    out = pallas_flash.flash_attention(
        to_heads_first(q), to_heads_first(k), to_heads_first(v),
        segment_ids=pallas_flash.SegmentIds(q=ids, kv=ids),
        sm_scale=1.0 / math.sqrt(q.shape[-1]))
    return to_heads_first(out)

  return _attention_per_shard(kernel, (query, key, value), ids, seed)


def _triton_attention(operands: tuple, input_mask, sequence_ids, dropout_rate, dropout_rng,
                      dropout_bits):
  """The GPU's Pallas kernels: attention-probability dropout drawn inside the kernel from the
  layer's dropout key, as the fused LayerNorm sites draw theirs (every step, layer and call its
  own masks; a resumed run the same ones; scanned and shared layers too), at any length.
  `operands`: (q, k, v), each (batch, length, heads, head_dim)
  (`triton_attention.flash_attention`), or the joined projection's output alone, (batch,
  length, 3, heads, head_dim) (`joined_flash_attention`, `joined_projection`)."""
  from bert_jax.model import triton_attention
  attend = (triton_attention.flash_attention if len(operands) == 3
            else triton_attention.joined_flash_attention)
  ids = _segment_ids(input_mask, sequence_ids)
  seed = (_key_words(dropout_rng) if dropout_rate > 0.0 else jnp.zeros((2,), jnp.uint32))

  def kernel(*args):
    *inputs, ids, seed, shard = args
    if shard is not None:
      seed = dropout_lib.shard_seed(seed, shard)
    return attend(*inputs, ids, dropout_rate=dropout_rate, seed=seed, bits=dropout_bits)

  return _attention_per_shard(kernel, operands, ids, seed)


def _attention_per_shard(kernel, operands: tuple, ids, seed):
  """`kernel(*operands, ids, seed, shard)` on the whole arrays (`shard` None), or under a mesh
  on each device's rows and heads (batch and heads split as the rules split these activations,
  where they divide; every device keeps whole sequences, which attention needs). `operands`:
  q, k, v (batch, length, heads, head_dim), or the joined (batch, length, 3, heads, head_dim);
  the output is (batch, length, heads, head_dim)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return kernel(*operands, ids, seed, None)
  shape = operands[0].shape
  axes = target.dividing_mesh_axes(mesh, shape, (BATCH,) + (None,) * (len(shape) - 3)
                                   + (HEADS, None))
  spec = jax.sharding.PartitionSpec
  return target.per_shard(kernel, (*operands, ids, seed),
                          (spec(*axes),) * len(operands) + (spec(*axes[:2]), spec()),
                          spec(axes[0], None, axes[-2], None), (axes[0], axes[-2]))


def cudnn_dropout_seed(module_path: tuple[str, ...]) -> int:
  """The static seed of cuDNN's attention dropout at one attention call site: a stable hash of
  the module's path, so that every layer draws its own masks."""
  return zlib.crc32("/".join(module_path).encode()) & 0x7FFFFFFF


def _cudnn_attention(query, key, value, input_mask, sequence_ids, dropout_rate, seed):
  """cuDNN's fused flash attention, with attention-probability dropout inside the kernel.

  `jax.nn.dot_product_attention` has no dropout argument; JAX's cuDNN lowering underneath it
  does (`jax._src.cudnn.fused_attention_stablehlo.dot_product_attention`, private: its use is
  confined to this function). Its seed is static, written into the kernel's configuration; XLA
  then advances a counter of that kernel call site on every execution, so masks differ from
  step to step, and the backward kernel, whose counter runs in step with the forward's,
  regenerates the forward's mask. Hence the rules `BertConfig` enforces for this path: one call
  site per layer (unrolled, unshared layers: a scanned or shared layer would run one call site
  several times per step, forwards then backwards in reverse order), and a distinct seed per
  layer (`cudnn_dropout_seed`). The counter lives in the process: a resumed run draws new
  masks, not the ones an uninterrupted run would have drawn (use "pallas" or the explicit path
  where bit-exact resumption of attention masks matters). XLA must keep these kernels out of
  its command buffers (`cudnn_runtime`).
  """
  if dropout_rate == 0.0:
    if sequence_ids is None:
      return jax.nn.dot_product_attention(query, key, value,
                                          key_value_seq_lengths=_row_lengths(input_mask),
                                          implementation="cudnn")
    # Packed rows: lengths cannot say "block-diagonal", so the full (b, 1, q, kv) mask goes in;
    # `jax.nn.dot_product_attention` hands cuDNN a mask as an additive bias.
    return jax.nn.dot_product_attention(query, key, value,
                                        mask=attention_mask(input_mask, sequence_ids),
                                        implementation="cudnn")
  cudnn_runtime.check_cudnn_dropout(jax.default_backend())
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_fmha  # GPU only
  common = dict(scale=1.0 / math.sqrt(query.shape[-1]), seed=int(seed),
                dropout_rate=float(dropout_rate), qkv_layout="BTNH")
  if sequence_ids is None:
    lengths = _row_lengths(input_mask)
    return cudnn_fmha.dot_product_attention(query, key, value, q_seqlen=lengths,
                                            kv_seqlen=lengths,
                                            mask_type=cudnn_fmha.MaskType.PADDING, **common)
  return cudnn_fmha.dot_product_attention(query, key, value,
                                          mask=attention_mask(input_mask, sequence_ids),
                                          **common)


def _row_lengths(input_mask: jax.Array) -> jax.Array:
  """Each row's length, as cuDNN's fused kernel takes padding: per-row lengths, not a mask.
  BERT rows are right-padded (real tokens first), so the length is the mask's sum. A row of
  padding alone (a batch filled up at the end of an epoch, weighted 0) counts one token: its
  output is never used, and a row without a single key is left out of what cuDNN is asked."""
  return jnp.maximum(jnp.sum(input_mask.astype(jnp.int32), axis=-1), 1)


def dot_product_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                          input_mask: jax.Array, *, dropout_rate: float,
                          dropout_rng: jax.Array | None, deterministic: bool,
                          implementation: str | None = None,
                          sequence_ids: jax.Array | None = None, dropout_bits: int = 16,
                          cudnn_seed: int | None = None) -> jax.Array:
  """The one place attention is computed. Shapes: q/k/v (batch, length, heads, head_dim).

  `input_mask` is (batch, length) with 1 for real tokens: padded keys get no attention weight.
  `sequence_ids` (batch, length), given for packed rows, confines attention to each packed
  instance (`attention_mask`); every implementation honours it.

  Kernels, by `implementation`:
  - "cudnn": cuDNN's fused flash attention, with the paper's attention-probability dropout
    inside the kernel (`_cudnn_attention`; `cudnn_seed` is the call site's static seed);
  - "pallas": our Pallas kernels, Triton's on a GPU and the TPU's elsewhere, dropout drawn
    inside the kernel from the layer's dropout key (`_pallas_attention`);
  - "xla": `jax.nn.dot_product_attention`'s XLA path without dropout;
  - None: `jax.nn.dot_product_attention` picks without dropout, except for the CPU, where XLA
    runs the explicit path 1.2-1.4x faster (benchmarks/RESULTS.md, attention core at 4x512).
  "xla" and None with attention dropout in training run the explicit path: the reference
  (softmax in float32, the mask drawn with `dropout_bits` bits per decision).
  """
  dropping = not deterministic and dropout_rate > 0.0
  rate = dropout_rate if dropping else 0.0
  if implementation == "pallas":
    return _pallas_attention(query, key, value, input_mask, sequence_ids, rate, dropout_rng,
                             dropout_bits)
  if implementation == "cudnn":
    if dropping and cudnn_seed is None:
      raise ValueError("cuDNN attention dropout needs the call site's static seed "
                       "(modeling.cudnn_dropout_seed of the attention module's path).")
    return _cudnn_attention(query, key, value, input_mask, sequence_ids, rate, cudnn_seed)
  if dropping or (implementation is None and target.target_platform() == "cpu"):
    return _explicit_attention(query, key, value, attention_mask(input_mask, sequence_ids),
                               rate, dropout_rng, dropout_bits)
  return jax.nn.dot_product_attention(query, key, value,
                                      mask=attention_mask(input_mask, sequence_ids),
                                      implementation=implementation)


def attention_probabilities(query: jax.Array, key: jax.Array, mask: jax.Array) -> jax.Array:
  """softmax(q·k/√d) in float32 over the keys `mask` allows: (batch, heads, queries, keys).
  The reference every kernel computes, and what attention maps show."""
  scale = 1.0 / math.sqrt(query.shape[-1])
  logits = float32_einsum("btnd,bsnd->bnts", query, key) * scale
  logits = jnp.where(mask, logits, MASKED_LOGIT)
  return jax.nn.softmax(logits, axis=-1)


def _explicit_attention(query, key, value, mask, dropout_rate, dropout_rng, dropout_bits=16):
  """softmax(q·k/√d) in float32, masked, with the probabilities dropped out (the paper's)."""
  probs = attention_probabilities(query, key, mask)
  if dropout_rate > 0.0:
    probs = dropout_lib.dropout(probs, dropout_rate, dropout_rng, dropout_bits)
  return jnp.einsum("bnts,bsnd->btnd", probs.astype(value.dtype), value)


def attention_kernel_description(config: BertConfig) -> str:
  """Which attention kernel a model of `config` runs, in words (a run logs it at start)."""
  fused = {None: ("explicit softmax (XLA:CPU)" if jax.default_backend() == "cpu"
                  else "jax.nn.dot_product_attention (XLA)"),
           "xla": "jax.nn.dot_product_attention (XLA)",
           "cudnn": "cuDNN flash attention",
           "pallas": ("Pallas Triton flash attention (segment ids)"
                      if target.target_platform() == "gpu"
                      else "Pallas TPU flash attention (segment ids)")
           }[config.attention_implementation]
  rate = config.attention_probs_dropout_prob
  if rate > 0.0 and config.attention_implementation == "cudnn":
    # `_cudnn_attention`: the kernel's mask counter starts again with the process.
    return (f"attention: {fused} with attention-probability dropout p={rate:g} inside the "
            "kernel in training (its masks start again with the process: a resumed run draws "
            "other attention masks than an uninterrupted one; attention_implementation=xla "
            "or pallas resumes them exactly)")
  if rate > 0.0 and config.attention_implementation == "pallas":
    return (f"attention: {fused} with attention-probability dropout p={rate:g} inside the "
            "kernel in training")
  if rate > 0.0:
    return (f"attention: explicit softmax with attention-probability dropout p={rate:g} in "
            f"training; {fused} in evaluation")
  return f"attention: {fused}"


class BertEmbeddings(nn.Module):
  """Word + position + token-type embeddings, then LayerNorm and dropout (DistilBERT: no
  token types, `type_vocab_size=0`).

  The tables are `config.embedding_width` wide: hidden_size for BERT and RoBERTa, E (128) for
  ALBERT, whose encoder projects them up to hidden_size (`embedding_hidden_mapping_in`), so a
  30k vocabulary costs V·E instead of V·H parameters.

  Under `quantization="int8"` each table is int8 with a float32 scale per row beside it
  (`word_embeddings_scale`, ...): a lookup dequantizes the rows it gathers, and `attend` is an
  int8 matmul (`model/int8.py`, which says why).
  """
  config: BertConfig

  def setup(self):
    cfg = self.config
    init = bert_initializer(cfg.initializer_range)
    pdt = _dtype(cfg.param_dtype)
    self.int8 = cfg.quantization == "int8"

    # Plain parameters (not nn.Embed) so paths are `embeddings/word_embeddings` as in TF1, and
    # so the MLM decoder can reuse the table (`attend`). Returns (table, per-row scales or None).
    def table(name, rows, axes):
      shape = (rows, cfg.embedding_width)
      if self.int8:
        return int8.table_param(self, name, shape, axes, init, 2.0 * cfg.initializer_range)
      return self.param(name, nn.with_logical_partitioning(init, axes), shape, pdt), None

    self.word_embeddings, self.word_scale = table("word_embeddings", cfg.vocab_size,
                                                  ("vocab", "embed"))
    self.position_embeddings, self.position_scale = table(
        "position_embeddings", cfg.max_position_embeddings, ("position", "embed"))
    if cfg.type_vocab_size:  # none in DistilBERT
      self.token_type_embeddings, self.token_type_scale = table(
          "token_type_embeddings", cfg.type_vocab_size, ("token_type", "embed"))
    # Low-precision LayerNorm: its output, and dropout on it, already in the compute dtype.
    self.layer_norm = layer_norm(cfg, out_dtype=_dtype(cfg.dtype))
    self.dropout = Dropout(cfg.hidden_dropout_prob, cfg.dropout_bits)

  def __call__(self, input_ids, segment_ids, position_ids, deterministic: bool):
    if self.config.type_vocab_size == 1:
      # One token type (RoBERTa): pipelines still emit pair segment ids, which would otherwise
      # index past the one-row table (where jnp.take clamps silently).
      segment_ids = jnp.zeros_like(segment_ids)
    # Under FSDP the table's hidden axis is split; gather it before the lookup (as FSDP does for
    # every weight) so the row gather partitions cleanly over a vocabulary split on `model`.
    word_table = nn.with_logical_constraint(self.word_embeddings, ("vocab", None))

    def take(table, scale, ids):
      return jnp.take(table, ids, axis=0) if scale is None else int8.take_rows(table, scale, ids)
    x = (take(word_table, self.word_scale, input_ids)
         + take(self.position_embeddings, self.position_scale, position_ids))
    if self.config.type_vocab_size:
      x = x + take(self.token_type_embeddings, self.token_type_scale, segment_ids)
    x = self.layer_norm(x.astype(jnp.float32))
    x = self.dropout(x, deterministic=deterministic).astype(_dtype(self.config.dtype))
    return nn.with_logical_constraint(x, (BATCH, LENGTH, EMBED))

  def attend(self, x: jax.Array) -> jax.Array:
    """Scores against every word embedding (the tied MLM decoder), accumulated in float32; of
    an int8 table, in int8 with int32 accumulation (`int8.int8_attend`)."""
    if self.int8:
      return int8.int8_attend(x, self.word_embeddings, self.word_scale)
    return float32_einsum("...h,vh->...v", x, self.word_embeddings)


# The collection that holds every layer's attention probabilities when an apply makes it
# mutable (unrolled layers; `analysis/attention.py`), whatever kernel the model runs.
ATTENTION_MAPS = "attention_maps"
# A gate ξ per head on each self-attention block's output (Michel et al. 2019), present only
# when an apply passes this collection (`analysis/heads.py`): 1 keeps a head, 0 removes it.
HEAD_GATES = "head_gates"


class BertSelfAttention(nn.Module):
  """Multi-head self-attention: `num_heads` heads of `config.head_dim` (all of the config's
  unless heads were pruned: then the projections are that much narrower, and a layer with
  none left contributes nothing but its output bias)."""
  config: BertConfig
  num_heads: int | None = None  # None: config.num_attention_heads

  @nn.compact
  def __call__(self, x, input_mask, deterministic: bool, sequence_ids=None):
    """`x`: the block's input (batch, length, hidden), or a copy of it for each of the query,
    key and value projections, as `BertAttention` passes them (`fan_out`)."""
    cfg = self.config
    heads = cfg.num_attention_heads if self.num_heads is None else self.num_heads
    if joined_projection(cfg):
      return self._joined(x[0] if isinstance(x, tuple) else x, input_mask, deterministic,
                          sequence_ids, heads)
    width = heads * cfg.head_dim
    inputs = dict(zip(("query", "key", "value"), x if isinstance(x, tuple) else (x,) * 3))
    batch, length, _ = inputs["query"].shape

    def project(name, shared=None):
      # The key's bias adds q·b_k to every score of query q: the same for all of its keys, so
      # softmax (masked or not, dropout after it) gives the same probabilities without it, and
      # its gradient is exactly zero. Not added, it costs no kernel writing the keys again (and
      # none summing its zero gradient): 1.8 GB per BERT-base/128 step on the H100 program.
      # Kept as a parameter, checkpoints of every family read and write as before.
      layer = dense(cfg, width, ("embed", "joined_kv"), name, add_bias=name != "key")
      if isinstance(layer, fp8.Fp8Dense):
        # The three read the same input, quantized once (by the query's layer) instead of
        # three times: their input scales and histories see the same values every step, so
        # are the same, and the query's new ones become all three's.
        y, shared = layer(inputs[name], shared=shared, share=True)
      else:
        y = layer(inputs[name])
      y = y.reshape(batch, length, heads, cfg.head_dim)
      return nn.with_logical_constraint(y, (BATCH, LENGTH, HEADS, KV)), shared

    query, shared = project("query")
    (key, _), (value, _) = project("key", shared), project("value", shared)
    # Asked for (`analysis/attention.py`); `init`, for which every collection is mutable, keeps
    # none, so a model's variables are its parameters alone.
    if self.is_mutable_collection(ATTENTION_MAPS) and not self.is_initializing():
      self.sow(ATTENTION_MAPS, "probabilities",
               attention_probabilities(query, key, attention_mask(input_mask, sequence_ids)))
    use_dropout = not deterministic and cfg.attention_probs_dropout_prob > 0.0
    out = dot_product_attention(
        query, key, value, input_mask, dropout_rate=cfg.attention_probs_dropout_prob,
        dropout_rng=self.make_rng("dropout") if use_dropout else None,
        deterministic=deterministic, implementation=cfg.attention_implementation,
        sequence_ids=sequence_ids, dropout_bits=cfg.dropout_bits,
        cudnn_seed=cudnn_dropout_seed(self.scope.path))
    return self._output(out)

  def _output(self, out):
    """The heads' outputs (batch, length, heads, head_dim), gated where asked, as one row."""
    out = nn.with_logical_constraint(out, (BATCH, LENGTH, HEADS, KV))
    if self.has_variable(HEAD_GATES, "gates"):
      out = out * self.get_variable(HEAD_GATES, "gates").astype(out.dtype)[:, None]
    return out.reshape(*out.shape[:2], -1)

  def _joined(self, x, input_mask, deterministic, sequence_ids, heads):
    """The joined projection (`joined_projection`) and our Triton kernels reading it in place.
    The three layers' parameters are those of the separate path (`query`, `key`, `value`, each
    a kernel and a bias, initialised alike), so checkpoints and conversions are unchanged; the
    key's bias is not added, as there."""
    cfg = self.config
    hidden = x.shape[-1]
    kernels, biases = zip(*(_ProjectionParams(cfg, heads * cfg.head_dim, name=name)(hidden)
                            for name in ("query", "key", "value")))
    dtype = _dtype(cfg.dtype)
    with jax.named_scope("query_key_value"):  # the op_name `hlo_costs.model_part` reads
      # One two-dimensional GEMM. Written as an einsum over a (hidden, 3, heads, head_dim)
      # kernel, the one a mesh splitting the heads would split as each projection, the H200's
      # program had 544 kernels against 532 and moved 3.6 GB more per BERT-base step. Under
      # such a mesh XLA reshards this kernel (768 x 2304 at BERT-base) instead.
      kernel = jnp.concatenate([k.astype(dtype) for k in kernels], axis=1)
      bias = jnp.concatenate([biases[0], jnp.zeros_like(biases[1]), biases[2]]).astype(dtype)
      qkv = jnp.dot(x.astype(dtype), kernel) + bias
    qkv = nn.with_logical_constraint(qkv.reshape(*x.shape[:-1], 3, heads, cfg.head_dim),
                                     (BATCH, LENGTH, None, HEADS, KV))
    if self.is_mutable_collection(ATTENTION_MAPS) and not self.is_initializing():
      self.sow(ATTENTION_MAPS, "probabilities",
               attention_probabilities(qkv[:, :, 0], qkv[:, :, 1],
                                       attention_mask(input_mask, sequence_ids)))
    rate = 0.0 if deterministic else cfg.attention_probs_dropout_prob
    out = _triton_attention((qkv,), input_mask, sequence_ids, rate,
                            self.make_rng("dropout") if rate > 0.0 else None, cfg.dropout_bits)
    return self._output(out)


class _ProjectionParams(nn.Module):
  """The kernel and bias of one of the joined projection's layers, declared as `nn.Dense`
  declares them (same names, initialisers, logical axes and random draws), returned
  unapplied."""
  config: BertConfig
  features: int

  @nn.compact
  def __call__(self, in_features: int) -> tuple[jax.Array, jax.Array]:
    cfg = self.config
    axes = ("embed", "joined_kv")
    kernel = self.param("kernel", nn.with_logical_partitioning(
        bert_initializer(cfg.initializer_range), axes), (in_features, self.features),
                        _dtype(cfg.param_dtype))
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           axes[1:]),
                      (self.features,), _dtype(cfg.param_dtype))
    return kernel, bias


class BertResidualOutput(nn.Module):
  """dense → dropout → add the block's input → LayerNorm (post-LN), as in every BERT block.
  `activation`: the feed-forward's, applied by the FP8 dense layer to its input
  (`fused_activation`)."""
  config: BertConfig
  in_axis: str
  activation: str | None = None

  @nn.compact
  def __call__(self, x, residual, deterministic: bool, uses: int = 1):
    """The block's output; `uses` > 1 (fused sites only, `sites_take_copies`): a copy for
    each of its consumers, whose gradients the site's backward kernel adds."""
    cfg = self.config
    if cfg.layer_norm_implementation == "pallas":
      # The dense layer's bias, dropout, the add and the LayerNorm in one kernel each way.
      y, dense_bias = _dense_and_bias(cfg, self.in_axis, x, residual, self.activation)
      y = DropoutResidualLayerNorm(cfg.hidden_dropout_prob, cfg.dropout_bits,
                                   cfg.layer_norm_eps, _dtype(cfg.param_dtype),
                                   _dtype(cfg.dtype), name="LayerNorm")(
                                       y, dense_bias, residual.astype(y.dtype), deterministic,
                                       uses)
      constrain = lambda y: nn.with_logical_constraint(y, (BATCH, LENGTH, EMBED))
      return constrain(y) if uses == 1 else tuple(constrain(copy) for copy in y)
    if uses != 1:
      raise ValueError(f"BertResidualOutput: uses={uses} takes the fused sites "
                       "(layer_norm_implementation='pallas').")
    if x.shape[-1]:
      y = dense(cfg, cfg.hidden_size, (self.in_axis, "embed"), "dense",
                activation=self.activation)(x)
    else:  # a layer whose every head was pruned: the projection of nothing is its bias
      y = _Bias(cfg, name="dense")(residual.shape)
    y = Dropout(cfg.hidden_dropout_prob, cfg.dropout_bits)(y, deterministic=deterministic)
    if cfg.low_precision_layer_norm:
      # The add fused into the LayerNorm (`residual_layer_norm`), inputs and output in the
      # compute dtype, statistics in float32.
      y = layer_norm(cfg, out_dtype=_dtype(cfg.dtype))(y, residual)
    else:
      y = layer_norm(cfg)(y.astype(jnp.float32) + residual.astype(jnp.float32))
    return nn.with_logical_constraint(y.astype(_dtype(cfg.dtype)), (BATCH, LENGTH, EMBED))


def _dense_and_bias(cfg: BertConfig, in_axis: str, x, residual, activation=None
                    ) -> tuple[jax.Array, jax.Array | None]:
  """(a block's output projection of `x` without its bias, that bias), for the fused kernel,
  which adds it; int8's layer adds its own (None). Called inside the block's `__call__`, so the
  layer is its child `dense`, as on the other path (a method would add its name to the op
  names that tell the step's parts apart)."""
  if not x.shape[-1]:  # every head pruned: nothing projected, the bias alone
    return (jnp.zeros(residual.shape, _dtype(cfg.dtype)),
            _Bias(cfg, name="dense")(residual.shape[-1:]))
  if cfg.quantization == "int8":
    return dense(cfg, cfg.hidden_size, (in_axis, "embed"), "dense")(x), None
  layer = dense(cfg, cfg.hidden_size, (in_axis, "embed"), "dense", add_bias=False,
                activation=activation)
  y = layer(x)
  return y, nn.meta.unbox(layer.variables["params"]["bias"])


class _Bias(nn.Module):
  """The bias of a dense layer whose input has no features left, broadcast to `shape`: what
  the attention output of a layer with every head pruned computes. A kernel of zero rows is
  left out rather than stored, as checkpoints cannot hold empty arrays."""
  config: BertConfig

  @nn.compact
  def __call__(self, shape) -> jax.Array:
    cfg = self.config
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           ("embed",)),
                      (cfg.hidden_size,), _dtype(cfg.param_dtype))
    return jnp.broadcast_to(bias.astype(_dtype(cfg.dtype)), tuple(shape[:-1]) + bias.shape)


class BertAttention(nn.Module):
  config: BertConfig
  num_heads: int | None = None  # None: config.num_attention_heads

  @nn.compact
  def __call__(self, x, input_mask, deterministic: bool, sequence_ids=None, uses: int = 1):
    """`x`: the block's input, or (fused sites, `sites_take_copies`) the previous block's
    copies of it for the residual, query, key and value. `uses`: as `BertResidualOutput`."""
    if isinstance(x, tuple):
      residual, *copies = x
      projected = tuple(copies)
    else:
      residual, projected = x, x
      if target.target_platform() == "gpu" and self.num_heads != 0:
        # Where XLA's GPU compiler folds each input gradient into its GEMM (`fan_out`); a
        # TPU's program moves more with it (1.2 GB per BERT-base step on a v4-8).
        residual, *copies = fan_out(x, attention_input_uses(self.config))
        projected = tuple(copies)
    if self.num_heads == 0:  # every head pruned: nothing attends
      context = jnp.zeros(residual.shape[:-1] + (0,), residual.dtype)
    else:
      context = BertSelfAttention(self.config, self.num_heads, name="self")(
          projected, input_mask, deterministic, sequence_ids)
    return BertResidualOutput(self.config, "joined_kv", name="output")(
        context, residual, deterministic, uses)


class BertIntermediate(nn.Module):
  """The feed-forward's first dense layer and its activation; with `fused_activation`, its
  output before the activation, which the next layer applies."""
  config: BertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    y = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "dense")(x)
    if not fused_activation(cfg):
      y = activation_fn(cfg.hidden_act)(y)
    return nn.with_logical_constraint(y, (BATCH, LENGTH, MLP))


class BertLayer(nn.Module):
  """One post-LN transformer block. With `scanned`, returns `(carry, per-layer output)`.

  `shared` holds the parts of the block that every layer uses (`SharedLayerParts`, created
  once by the encoder, so their parameters live at `encoder/shared_layer/...`); the layer
  creates the other parts itself. Sharing the whole block needs no `shared`: the encoder then
  applies one `BertLayer` repeatedly.
  """
  config: BertConfig
  scanned: bool = False
  collect_hidden_states: bool = False
  shared: "SharedLayerParts | None" = None
  num_heads: int | None = None  # this layer's attention heads (pruned); None: the config's
  # Copies of the output for the next block's residual, query, key and value
  # (`attention_input_uses`), when the encoder hands them over (`sites_take_copies`); 1: the
  # output itself.
  output_uses: int = 1

  @nn.compact
  def __call__(self, x, input_mask, deterministic: bool, sequence_ids=None):
    cfg = self.config
    parts = self.shared.parts if self.shared is not None else ()
    attention = (self.shared.attention if "attention" in parts
                 else BertAttention(cfg, self.num_heads, name="attention"))
    intermediate = (self.shared.intermediate if "ffn" in parts
                    else BertIntermediate(cfg, name="intermediate"))
    output = (self.shared.output if "ffn" in parts
              else BertResidualOutput(cfg, "mlp", fused_activation(cfg), name="output"))
    if sites_take_copies(cfg):  # the attention output read by the feed-forward and its residual
      x, residual = attention(x, input_mask, deterministic, sequence_ids, uses=2)
    else:
      x = residual = attention(x, input_mask, deterministic, sequence_ids)
    y = output(intermediate(x), residual, deterministic, self.output_uses)
    if self.scanned:
      return y, (y if self.collect_hidden_states else None)
    return y


class SharedLayerParts(nn.Module):
  """The parts of a block shared across layers ("attention": the attention block; "ffn": the
  feed-forward block), named as inside `BertLayer` so that checkpoints read the same way."""
  config: BertConfig
  parts: tuple[str, ...]

  def setup(self):
    if "attention" in self.parts:
      self.attention = BertAttention(self.config)
    if "ffn" in self.parts:
      self.intermediate = BertIntermediate(self.config)
      self.output = BertResidualOutput(self.config, "mlp", fused_activation(self.config))


_REMAT_POLICIES = {
    "full": None,  # save nothing: recompute the whole layer in the backward pass
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


_LAYERS_AXIS = {nn.PARTITION_NAME: "layers"}  # the stacked layout's leading axis


class BertEncoder(nn.Module):
  """`num_hidden_layers` blocks, unrolled (`layer_{i}`) or scanned (`layer`, stacked params).

  Factorized embeddings (ALBERT) are first projected from E to hidden_size
  (`embedding_hidden_mapping_in`, where ALBERT's checkpoints keep it: in the encoder).
  Cross-layer sharing (`config.share_parameters`): "all" applies one block, `shared_layer`,
  num_hidden_layers times (scanned too: its parameters are broadcast into the loop, so both
  layouts have the same tree); "attention" / "ffn" keep that part once in `shared_layer` and
  the rest per layer in `layer_{i}` (unrolled only; the config refuses scan with them).
  """
  config: BertConfig
  collect_hidden_states: bool = False

  @nn.compact
  def __call__(self, x, input_mask, deterministic: bool, sequence_ids=None):
    cfg = self.config
    if cfg.factorized_embeddings:
      x = dense(cfg, cfg.hidden_size, ("embed_out", "embed"), "embedding_hidden_mapping_in")(x)
      x = nn.with_logical_constraint(x, (BATCH, LENGTH, EMBED))
    layer_cls = BertLayer
    if cfg.remat_policy != "none":
      # Argument 0 is the module itself, so `deterministic` is argument 3.
      layer_cls = nn.remat(BertLayer, policy=_REMAT_POLICIES[cfg.remat_policy],
                           prevent_cse=not cfg.scanned_loop, static_argnums=(3,))
    if cfg.share_parameters == "all":
      return self._shared(layer_cls, x, input_mask, deterministic, sequence_ids)
    shared = None
    if cfg.share_parameters in ("attention", "ffn"):
      shared = SharedLayerParts(cfg, (cfg.share_parameters,), name="shared_layer")
    if cfg.scanned_loop:
      stack = nn.scan(layer_cls, variable_axes={"params": 0},
                      split_rngs={"params": True, "dropout": True},
                      in_axes=(nn.broadcast, nn.broadcast, nn.broadcast),
                      length=cfg.num_hidden_layers,
                      metadata_params=_LAYERS_AXIS)
      x, stacked = stack(cfg, scanned=True, collect_hidden_states=self.collect_hidden_states,
                         name="layer")(x, input_mask, deterministic, sequence_ids)
      hidden_states = (tuple(stacked[i] for i in range(cfg.num_hidden_layers))
                       if self.collect_hidden_states else ())
      return x, hidden_states
    hidden_states = []
    for i in range(cfg.num_hidden_layers):
      # A block's output goes to the next block as its copies (`sites_take_copies`).
      uses = (attention_input_uses(cfg) if sites_take_copies(cfg) and i + 1 < cfg.num_hidden_layers
              and cfg.heads_in_layer(i + 1) != 0 else 1)
      x = layer_cls(cfg, shared=shared, num_heads=cfg.heads_in_layer(i), output_uses=uses,
                    name=f"layer_{i}")(x, input_mask, deterministic, sequence_ids)
      hidden_states.append(x[0] if isinstance(x, tuple) else x)
    return x, (tuple(hidden_states) if self.collect_hidden_states else ())

  def _shared(self, layer_cls, x, input_mask, deterministic, sequence_ids):
    """One block (`shared_layer`) applied num_hidden_layers times; its gradient is the sum of
    every application's, as in ALBERT."""
    cfg = self.config
    if cfg.scanned_loop:
      stack = nn.scan(layer_cls, variable_broadcast="params",
                      split_rngs={"params": False, "dropout": True},
                      in_axes=(nn.broadcast, nn.broadcast, nn.broadcast),
                      length=cfg.num_hidden_layers)
      x, stacked = stack(cfg, scanned=True, collect_hidden_states=self.collect_hidden_states,
                         name="shared_layer")(x, input_mask, deterministic, sequence_ids)
      hidden_states = (tuple(stacked[i] for i in range(cfg.num_hidden_layers))
                       if self.collect_hidden_states else ())
      return x, hidden_states
    layer = layer_cls(cfg, name="shared_layer")
    hidden_states = []
    for _ in range(cfg.num_hidden_layers):
      x = layer(x, input_mask, deterministic, sequence_ids)
      hidden_states.append(x)
    return x, (tuple(hidden_states) if self.collect_hidden_states else ())


def _stacked(*layers):
  """One leaf of the stacked layout from the same leaf of every layer (boxed at init)."""
  if nn.meta.is_axis_metadata(layers[0]):
    value = jnp.stack([layer.unbox(apply_constraint=False) for layer in layers])
    return layers[0].replace_boxed(value).add_axis(0, _LAYERS_AXIS)
  return jnp.stack(layers)


def _split(stacked) -> list:
  """A stacked leaf's layers (boxed at init). A JAX array through `jnp.split`, not indexing:
  its gradient is one concatenation, which XLA reads inside the optimizer's kernels, where an
  index's gradient pads every layer's gradient to the whole stack. A NumPy array (a checkpoint
  on the host) stays on the host, a view per layer."""
  if nn.meta.is_axis_metadata(stacked):
    box = stacked.remove_axis(0, _LAYERS_AXIS)
    return [box.replace_boxed(part) for part in _split(stacked.unbox(apply_constraint=False))]
  if isinstance(stacked, np.ndarray):
    return list(stacked)
  return [jnp.squeeze(part, 0) for part in jnp.split(stacked, stacked.shape[0])]


def _layers_unrolled(encoder: dict) -> dict:
  """An encoder's parameters stacked (`layer/...`, a leading layer axis) → one subtree per
  layer (`layer_{i}/...`), as the unrolled code reads them; the depth is the arrays' own."""
  if "layer" not in encoder:
    return encoder
  out = {k: v for k, v in encoder.items() if k != "layer"}
  leaves, tree = jax.tree.flatten(encoder["layer"], is_leaf=nn.meta.is_axis_metadata)
  for i, layer in enumerate(zip(*(_split(leaf) for leaf in leaves))):
    out[f"layer_{i}"] = jax.tree.unflatten(tree, layer)
  return out


def _layers_stacked(encoder: dict) -> dict:
  """The inverse of `_layers_unrolled`."""
  count = sum(1 for k in encoder if k.startswith("layer_"))
  if not count:
    return encoder
  out = {k: v for k, v in encoder.items() if not k.startswith("layer_")}
  out["layer"] = jax.tree.map(_stacked, *(encoder[f"layer_{i}"] for i in range(count)),
                              is_leaf=nn.meta.is_axis_metadata)
  return out


# What `stack_unrolled` stores stacked: the parameters and FP8's scales and amax histories (whose
# "gradient" is their next value: joined like a parameter's gradient, it is every layer's next
# value, stacked), so that each of their leaves is updated in one kernel for all layers.
STACKED_COLLECTIONS = ("params", fp8_ops.OVERWRITE_WITH_GRADIENT)


def encoder_class(config: BertConfig) -> type[nn.Module]:
  """`BertEncoder`, or with `config.stack_unrolled` the same unrolled encoder whose layer
  parameters (and FP8 state) are stored stacked, as `scan_layers` stores them: each layer reads
  its slice of every stacked leaf, and the gradient of a stacked leaf is its layers' gradients
  joined. Module paths, and so dropout's keys, are the unrolled encoder's: the two compute the
  same values from the same weights."""
  if not config.stack_unrolled:
    return BertEncoder
  each = lambda fn: lambda collections: {name: fn(tree) for name, tree in collections.items()}
  return nn.map_variables(BertEncoder, STACKED_COLLECTIONS, trans_in_fn=each(_layers_unrolled),
                          trans_out_fn=each(_layers_stacked), init=True)


class BertPooler(nn.Module):
  """tanh(dense(first token)): the sentence vector NSP and classifiers read. ELECTRA has no
  pooler (`config.has_pooler`): its sentence vector is the first token's output itself.

  With `cls_positions` (batch, k) — packed rows — it pools the [CLS] of each packed instance
  instead, giving (batch, k, hidden).
  """
  config: BertConfig

  @nn.compact
  def __call__(self, sequence_output, cls_positions=None):
    if cls_positions is None:
      first = sequence_output[:, 0]
    else:
      first = jnp.take_along_axis(sequence_output, cls_positions[..., None].astype(jnp.int32),
                                  axis=1)
    if not self.config.has_pooler:
      return first
    return jnp.tanh(dense(self.config, self.config.hidden_size, ("embed", "embed_out"),
                          "dense")(first))


class BertModel(nn.Module):
  """Embeddings → encoder → pooler. Returns a dict of float32 outputs.

  Outputs: `sequence_output` (batch, length, hidden), `pooled_output` (batch, hidden) when
  `add_pooling_layer`, and `hidden_states` (embeddings output then each layer's output) when
  `collect_hidden_states`.

  Packed rows (several instances per row) pass `position_ids` restarting at 0 for each
  instance, `sequence_ids` (1..k per instance, 0 on padding: attention stays inside each
  instance) and `cls_positions` (batch, k): `pooled_output` is then (batch, k, hidden), one per
  instance. Each instance then gets what it would get alone in a row of its own.

  Position ids, given or not, are shifted by `config.position_offset` before the lookup
  (RoBERTa: 2, the first position after its padding index), so packed rows pass positions
  restarting at 0 for every family.
  """
  config: BertConfig
  add_pooling_layer: bool = True
  collect_hidden_states: bool = False

  def setup(self):
    self.embeddings = BertEmbeddings(self.config)
    self.encoder = encoder_class(self.config)(self.config,
                                              collect_hidden_states=self.collect_hidden_states)
    if self.add_pooling_layer:
      self.pooler = BertPooler(self.config)

  def __call__(self, input_ids, input_mask=None, segment_ids=None, position_ids=None,
               deterministic: bool = True, sequence_ids=None,
               cls_positions=None) -> dict[str, Any]:
    if input_mask is None:
      input_mask = jnp.ones(input_ids.shape, jnp.int32)
    x = self.embed(input_ids, segment_ids, position_ids, deterministic)
    sequence_output, layer_outputs = self.encoder(x, input_mask, deterministic, sequence_ids)
    out = {"sequence_output": sequence_output.astype(jnp.float32)}
    if self.add_pooling_layer:
      out["pooled_output"] = self.pooler(sequence_output, cls_positions).astype(jnp.float32)
    if self.collect_hidden_states:
      out["hidden_states"] = tuple(h.astype(jnp.float32) for h in (x,) + layer_outputs)
    return out

  def embed(self, input_ids, segment_ids=None, position_ids=None, deterministic: bool = True
            ) -> jax.Array:
    """The embedding layer's output (before any projection to hidden_size). ELECTRA's
    generator reads the discriminator's tables through it."""
    batch, length = input_ids.shape
    self.config.check_sequence_length(length, "Sequence length")
    if segment_ids is None:
      segment_ids = jnp.zeros((batch, length), jnp.int32)
    if position_ids is None:
      position_ids = jnp.broadcast_to(jnp.arange(length), (batch, length))
    if self.config.position_offset:
      position_ids = position_ids + self.config.position_offset
    return self.embeddings(input_ids, segment_ids, position_ids, deterministic)

  def attend(self, x: jax.Array) -> jax.Array:
    return self.embeddings.attend(x)


# ------------------------------------------------------------------ layouts of layer parameters
def unstack_layers(params: dict, num_layers: int) -> dict:
  """Scanned layout (`encoder/layer/...` with a leading layer axis) → `encoder/layer_{i}/...`.

  Works on any tree that contains `encoder` dicts (plain arrays, not boxed); other entries are
  returned as they are. Lossless: `stack_layers(unstack_layers(p)) == p`. Each encoder's depth
  is read from its own arrays (ELECTRA's generator need not be as deep as the discriminator);
  `num_layers` is the main encoder's, kept for the callers.
  """
  return _each_encoder(params, _layers_unrolled)


def stack_layers(params: dict, num_layers: int) -> dict:
  """`encoder/layer_{i}/...` → scanned layout with a leading layer axis (each encoder with its
  own depth, as `unstack_layers`)."""
  return _each_encoder(params, _layers_stacked)


def _each_encoder(tree, convert: Callable[[dict], dict]):
  """`tree` with `convert` applied to every `encoder` dict in it (`_layers_unrolled` and
  `_layers_stacked` leave an encoder already in their output's layout as it is)."""
  if not isinstance(tree, dict):
    return tree
  return {k: convert(v) if k == "encoder" and isinstance(v, dict) else _each_encoder(v, convert)
          for k, v in tree.items()}
