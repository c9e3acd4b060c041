"""FP8 dense layers whose operands are each quantized in one pass.

The numerics are Flax's `Fp8DirectDotGeneralOp` (delayed scaling): a dense layer's input and
kernel are divided by their scales, clipped and rounded to float8_e4m3fn, its output's gradient
likewise to float8_e5m2; each scale is the largest |value| of the last 1024 steps over the
format's largest value, and each step's own largest |value| enters the history. The six
variables (three scales, three histories) are Flax's, under the same names, in the
`_overwrite_with_gradient` collection whose "gradient" is their next value; checkpoints are
those of Flax's op. What differs is how many times each operand is read.

Hopper's FP8 GEMMs (cuBLASLt's) take both operands with the contracted dimension minor, so a
dense layer needs each FP8 operand in two layouts: the input as it is for the forward GEMM and
transposed for the kernel's gradient, the output's gradient as it is for the input's gradient
and transposed for the kernel's. Around Flax's op XLA's GPU compiler reads each activation
three times, once for its largest |value| (a reduction of its own), once to write both FP8
layouts, and the output's gradient once more for the bias gradient (BERT-base/128 on the
H200, cuBLASLt's GEMMs: 606 reduction kernels and 11.3 GB for the largest values alone;
`benchmarks/RESULTS.md`). Here one kernel reads each operand once and writes both layouts, the
per-tile largest |value| and, for the output's gradient, the per-tile column sums that make the
bias gradient (`quantize`, a Triton kernel through Pallas on GPUs, on each device's rows where
a program is split over several; XLA's operations elsewhere, the same values). The GEMMs then
read the kernel's outputs as they are. The three projections of an attention block share one
quantization of their common input (`quantized_input`, `Fp8Dense(share=...)`), and the
feed-forward's second layer applies GELU to its input inside its kernel
(`Fp8Dense(activation=...)`, `modeling.fused_activation`), so that GELU's output is never
written.

With Triton's GEMMs instead of cuBLASLt's XLA reads either layout and needs no transposed copy;
the kernel still writes one, which costs there about what it saves (RESULTS.md).

Two differences in the numbers: the bias gradient is summed in float32 (Flax's layer sums it
in the compute dtype), and the kernel's GELU takes an erfc of its own (within 1e-5 relative;
its bfloat16 output is the model's but for a few values in 10^4 at most). Everything else is
Flax's arithmetic (`tests/unit/model/test_fp8.py` compares the two).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import fp8_ops
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from bert_jax.model import target

__all__ = ["Fp8Dense", "Quantized", "QuantizedInput", "fp8_dense", "quantize",
           "quantize_activation", "quantized_input"]

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
# The child module holding a layer's six FP8 variables: the name Flax's `Dense` gives its
# `Fp8DirectDotGeneralOp`, so that states and checkpoints are the same either way.
STATE_NAME = "Fp8DirectDotGeneralOp_0"
# A kernel program's tile: 64 x 64 elements, read once, written twice (as it is and
# transposed); Triton's block shapes are powers of two.
TILE = 64
_WARPS = 4
_ANY = pl.BlockSpec(memory_space=pl.ANY)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Quantized:
  """An operand in FP8 as both GEMMs want it: `q` (rows, cols), `q_t` its transpose, `amax`
  its largest |value| (float32), `column_sums` its float32 column sums (None unless asked)."""
  q: jax.Array
  q_t: jax.Array
  amax: jax.Array
  column_sums: jax.Array | None


def _xla_quantize(x, scale, q_dtype, column_sums, activation=None):
  if activation is not None:
    x = _activation(activation)(x)
  q = fp8_ops.quantize(x, q_dtype, scale, x.dtype)
  sums = jnp.sum(x.astype(jnp.float32), axis=0) if column_sums else None
  return Quantized(q, q.T, jnp.max(jnp.abs(x)).astype(jnp.float32), sums)


def _divided(x, scale, interpret: bool):
  """x / scale in float32, correctly rounded as XLA's division is: Triton's `/` is CUDA's
  approximate division (`div.full.f32`, within 2 ulp), which would round a few values to the
  other neighbouring FP8 value; PTX's `div.rn.f32` is IEEE's."""
  scale = jnp.broadcast_to(scale, x.shape)
  if interpret:
    return x / scale
  return plgpu.elementwise_inline_asm(
      "div.rn.f32 $0, $1, $2;", args=[x, scale], constraints="=f,f,f", pack=1,
      result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, jnp.float32)])[0]


def _activation(name: str) -> Callable[[jax.Array], jax.Array]:
  """The model's own activation `name` (`modeling.activation_fn`): XLA's form, and the one
  whose derivative the backward pass takes."""
  from bert_jax.model import modeling  # pylint: disable=g-import-not-at-top (imports this)
  return modeling.activation_fn(name)


def _erfc(u: jax.Array) -> jax.Array:
  """erfc of float32 `u` in operations Pallas' Triton lowering has (it has no erf or erfc):
  the Chebyshev fit of Numerical Recipes (Press et al., 6.2), whose own relative error is under
  1.2e-7; evaluated in float32 it is within 1e-5 of the exact erfc from -9 to 9, where
  erfc(9) is 4e-37 (tests; XLA's own erfc is within 4e-6 there)."""
  z = jnp.abs(u)
  t = 1.0 / (1.0 + 0.5 * z)
  poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
      -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
          -0.82215223 + t * 0.17087277))))))))
  tail = t * jnp.exp(-z * z + poly)
  return jnp.where(u >= 0, tail, 2.0 - tail)


def _kernel_gelu(v: jax.Array) -> jax.Array:
  """GELU (erf) of float32 `v`, as `modeling.gelu` writes it: 0.5 v erfc(-v / sqrt(2))."""
  return 0.5 * v * _erfc(v * -(1 / math.sqrt(2)))


# Activations the kernel applies to its operand before quantizing it (`Fp8Dense(activation=)`):
# the name `BertConfig.hidden_act` gives, and the float32 form the kernel computes.
_KERNEL_FORMS = {"gelu": _kernel_gelu}
KERNEL_ACTIVATIONS = tuple(_KERNEL_FORMS)


def _quantize_kernel(scale_ref, x_ref, q_ref, qt_ref, amax_ref, *sums_ref, q_max: float,
                     interpret: bool, activation: str | None):
  """One TILE x TILE tile: its largest |value|, its FP8 values written as they are and
  transposed, and (the output gradient's) its column sums. The division rounds to the
  operand's dtype before the clip and the rounding to FP8, as `fp8_ops.quantize`. With an
  `activation`, the operand is the activation of what is read, rounded to its dtype as the
  model's activation rounds its output."""
  i, j = pl.program_id(0), pl.program_id(1)
  rows_n, cols_n = x_ref.shape
  rows = i * TILE + jnp.arange(TILE)
  cols = j * TILE + jnp.arange(TILE)
  row_ok, col_ok = rows < rows_n, cols < cols_n
  mask = row_ok[:, None] & col_ok[None, :]
  x = plgpu.load(x_ref.at[rows[:, None], cols[None, :]], mask=mask, other=0.0)
  scale = plgpu.load(scale_ref.at[jnp.arange(1)]).astype(x.dtype).astype(jnp.float32)
  x = x.astype(jnp.float32)
  if activation is not None:
    x = _KERNEL_FORMS[activation](x).astype(x_ref.dtype).astype(jnp.float32)
  plgpu.store(amax_ref.at[i * pl.num_programs(1) + j + jnp.arange(1)],
              jnp.max(jnp.abs(x))[None])
  y = jnp.clip(_divided(x, scale, interpret).astype(x_ref.dtype).astype(jnp.float32),
               -q_max, q_max)
  plgpu.store(q_ref.at[rows[:, None], cols[None, :]], y.astype(q_ref.dtype), mask=mask)
  plgpu.store(qt_ref.at[cols[:, None], rows[None, :]], y.T.astype(qt_ref.dtype), mask=mask.T)
  if sums_ref:
    plgpu.store(sums_ref[0].at[i, cols], jnp.sum(x, axis=0), mask=col_ok)


def _pallas_parts(x, scale, q_dtype, column_sums, interpret, activation=None):
  """The kernel's outputs for `x` (rows, cols) (or its `activation`): q, q_t, the per-tile
  largest |values| and (`column_sums`) the per-tile-row column sums, or None."""
  rows, cols = x.shape
  grid = (pl.cdiv(rows, TILE), pl.cdiv(cols, TILE))
  out_shape = [jax.ShapeDtypeStruct((rows, cols), q_dtype),
               jax.ShapeDtypeStruct((cols, rows), q_dtype),
               jax.ShapeDtypeStruct((grid[0] * grid[1],), jnp.float32)]
  if column_sums:
    out_shape.append(jax.ShapeDtypeStruct((grid[0], cols), jnp.float32))
  out = pl.pallas_call(
      functools.partial(_quantize_kernel, q_max=float(jnp.finfo(q_dtype).max),
                        interpret=interpret, activation=activation),
      out_shape=tuple(out_shape), grid=grid, in_specs=[_ANY] * 2,
      out_specs=(_ANY,) * len(out_shape), interpret=interpret,
      compiler_params=plgpu.CompilerParams(num_warps=_WARPS),
      name="fp8_quantize")(scale.reshape(1).astype(jnp.float32), x)
  return tuple(out) if column_sums else (*out, None)


def _check_size(x):
  if x.size >= 2**31:
    raise ValueError(f"fp8.quantize: {x.size:,} elements of {x.shape} on one device; the "
                     "kernel addresses fewer than 2^31. Split the batch over more devices.")


def _interpret() -> bool:
  return target.target_platform() != "gpu"


def quantize(x: jax.Array, scale: jax.Array, q_dtype, *, column_sums: bool = False,
             implementation: str | None = None, activation: str | None = None) -> Quantized:
  """`x` (rows, cols) divided by `scale`, clipped and rounded to `q_dtype`, in both layouts,
  with its largest |value| and (`column_sums`) its float32 column sums. With an `activation`
  (one of `KERNEL_ACTIVATIONS`) all of that is of `activation(x)`, which the kernel computes as
  it reads `x` instead of reading it from memory: its erfc is its own (`_erfc`), so its values
  may differ from XLA's in the last bit of the compute dtype.

  `implementation`: "pallas" (one kernel: compiled on GPUs, interpreted elsewhere), "xla"
  (XLA's operations), None: "pallas" where the program is built for a GPU, else "xla". Both
  give the same values; the column sums may differ in their last bits (the order of the sum).
  A program split over several devices takes XLA's here (a kernel's operand, a layer's weight,
  is small); its activations take the kernel per device (`quantize_activation`)."""
  implementation = _implementation(implementation)
  if activation is not None and activation not in KERNEL_ACTIVATIONS:
    raise ValueError(f"fp8.quantize: activation={activation!r}; expected one of "
                     f"{', '.join(KERNEL_ACTIVATIONS)}.")
  if implementation == "xla" or _several_devices():
    return _xla_quantize(x, scale, q_dtype, column_sums, activation)
  _check_size(x)
  q, q_t, amax, sums = _pallas_parts(x, scale, q_dtype, column_sums, _interpret(), activation)
  return Quantized(q, q_t, jnp.max(amax), None if sums is None else jnp.sum(sums, axis=0))


def quantize_activation(x: jax.Array, scale: jax.Array, q_dtype, *, column_sums: bool = False,
                        implementation: str | None = None, activation: str | None = None
                        ) -> Quantized:
  """`quantize` of an activation (batch[, length], features), its leading axes flattened into
  rows. In a program split over devices the kernel runs in `shard_map` on each device's rows
  (XLA cannot partition a kernel): the batch and length axes split as the logical rules split
  activations, the features whole; the largest |value| and the column sums are then reduced
  over the devices. `q_t`'s columns are then in the order of the devices' shards (the rows'
  order where only the batch is split): the order of a sum over them, which is all a weight
  gradient takes of them, as long as both its operands come from here."""
  implementation = _implementation(implementation)
  width = x.shape[-1]
  if implementation == "xla" or not _several_devices():
    return quantize(x.reshape(-1, width), scale, q_dtype, column_sums=column_sums,
                    implementation=implementation, activation=activation)
  from bert_jax.model import modeling  # pylint: disable=g-import-not-at-top (imports this)
  rows = (modeling.BATCH, modeling.LENGTH)[:x.ndim - 1]  # the leading axes' logical names
  axes = target.dividing_mesh_axes(jax.sharding.get_abstract_mesh(), x.shape,
                                   rows + (None,) * (x.ndim - len(rows)))
  split = tuple(name for names in axes if names for name in names) or None
  spec = jax.sharding.PartitionSpec
  interpret = _interpret()

  def per_shard(x, scale, shard):
    del shard  # the same arithmetic on every shard
    _check_size(x)
    q, q_t, amax, sums = _pallas_parts(x.reshape(-1, width), scale, q_dtype, column_sums,
                                       interpret, activation)
    out = (q.reshape(x.shape), q_t, jnp.max(amax)[None])
    return out + ((jnp.sum(sums, axis=0)[None],) if column_sums else ())

  out_specs = (spec(*axes), spec(None, split), spec(split)) + (
      (spec(split, None),) if column_sums else ())
  out = target.per_shard(per_shard, (x, scale), (spec(*axes), spec()), out_specs, axes)
  sums = jnp.sum(out[3], axis=0) if column_sums else None
  return Quantized(out[0].reshape(-1, width), out[1], jnp.max(out[2]), sums)


def _implementation(implementation: str | None) -> str:
  if implementation is None:
    return "pallas" if target.target_platform() == "gpu" else "xla"
  if implementation not in ("pallas", "xla"):
    raise ValueError(f"fp8.quantize: implementation={implementation!r}; expected 'pallas' or "
                     "'xla'.")
  return implementation


def _several_devices() -> bool:
  """Whether the program in context is split over more than one device."""
  mesh = jax.sharding.get_abstract_mesh()
  return not mesh.empty and math.prod(mesh.shape.values()) > 1


# ------------------------------------------------------------------------------ the scaling
def _next(scale, history, q_dtype):
  """This step's scale, from the history before it (Flax's `update_fp8_meta`)."""
  return fp8_ops.compute_scale(jnp.max(history, axis=0), scale,
                               fp8_ops.get_fp8_max(q_dtype, jnp.float32))


def _recorded(history, amax):
  """The history with this step's largest |value| in front (Flax's `compute_amax_history`)."""
  return jnp.roll(history, shift=-1, axis=0).at[0].set(amax.astype(history.dtype))


def _gemm(a, b, out_dtype):
  """a (m, k) x b (n, k) -> (m, n): both operands with the contracted dimension minor, the
  layout cuBLASLt's FP8 GEMMs take."""
  return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=out_dtype)


def _own(shared, operand):
  """A GEMM's two operands, the `shared` one as a value of this layer's own: an optimization
  barrier over both (no data moves), which differs from layer to layer by the other operand,
  so that XLA does not merge the barriers of layers sharing a quantized input. Those layers
  would otherwise hand XLA's dot merger GEMMs with a common operand, which it joins: the three
  weight gradients of query, key and value into one GEMM whose other operand, their output
  gradients side by side, a kernel of its own writes first (151 MB per BERT-base/128 layer on
  the H200, against the 50 MB the joined GEMM saves by reading the input once)."""
  return jax.lax.optimization_barrier((shared, operand))


def _dequantized(y, a_scale, b_scale):
  """A GEMM's output times its operands' scales (Flax's `out_dq`: their float32 product in the
  output's dtype)."""
  scale = a_scale.astype(jnp.float32) * b_scale.astype(jnp.float32)
  return y * jnp.broadcast_to(scale.astype(y.dtype), y.shape)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedInput:
  """A dense layer's input in FP8 (`quantized_input`), which layers reading the same input can
  share: `q` and `q_t` its two layouts, `scale` the scale it was divided by, `history` the
  input's amax history with this step's largest |value| in front."""
  q: jax.Array
  q_t: jax.Array
  scale: jax.Array
  history: jax.Array


def quantized_input(x: jax.Array, scale: jax.Array, history: jax.Array,
                    implementation: str | None = None, activation: str | None = None
                    ) -> QuantizedInput:
  """`x` (..., features) (or its `activation`, `quantize`) quantized to float8_e4m3fn under the
  scale the input's `history` gives (Flax's delayed scaling), with the history this step
  leaves. Nothing differentiates through it: `fp8_dense` returns the input's gradient itself,
  and the new scale and history as the gradients of the old."""
  x, scale, history = jax.lax.stop_gradient((x, scale, history))
  scale = _next(scale, history, E4M3)
  qx = quantize_activation(x, scale, E4M3, implementation=implementation,
                           activation=activation)
  return QuantizedInput(qx.q, qx.q_t, scale, _recorded(history, qx.amax))


def _forward(implementation, activation, x, kernel, bias, state, shared):
  """The output, and what the backward pass keeps. `kernel` comes in `x`'s dtype (its cast to
  it is differentiated outside, as Flax's layer casts it before its op)."""
  _, _, k_scale, k_history, g_scale, g_history = state
  dtype = x.dtype
  s_k = _next(k_scale, k_history, E4M3)
  qk = quantize(kernel, s_k, E4M3, implementation=implementation)
  y = _dequantized(_gemm(*_own(shared.q, qk.q_t), dtype), shared.scale, s_k)
  if bias is not None:
    y = y + bias.astype(dtype)
  y = y.reshape(*x.shape[:-1], kernel.shape[1])
  new_state = (shared.scale, shared.history, s_k, _recorded(k_history, qk.amax))
  # With an activation the input itself (its pre-activation) is kept for its derivative.
  pre_activation = x if activation is not None else None
  return y, (shared.q_t, qk.q, g_scale, g_history, new_state, bias, pre_activation)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _fp8_dense(implementation, activation, x, kernel, bias, state, shared):
  return _forward(implementation, activation, x, kernel, bias, state, shared)[0]


def _fp8_dense_fwd(implementation, activation, x, kernel, bias, state, shared):
  return _forward(implementation, activation, x, kernel, bias, state, shared)


def _fp8_dense_bwd(implementation, activation, saved, g):
  x_t, k_q, g_scale, g_history, new_state, bias, pre_activation = saved
  s_x, s_k = new_state[0], new_state[2]  # this step's input and kernel scales
  dtype = g.dtype
  s_g = _next(g_scale, g_history, E5M2)
  qg = quantize_activation(g, s_g, E5M2, column_sums=bias is not None,
                           implementation=implementation)
  d_x = _dequantized(_gemm(qg.q, k_q, dtype), s_k, s_g).reshape(*g.shape[:-1], k_q.shape[0])
  if activation is not None:  # the model's activation's own derivative (`modeling.gelu`)
    d_x = jax.vjp(_activation(activation), pre_activation)[1](d_x)[0]
  d_kernel = _dequantized(_gemm(*_own(x_t, qg.q_t), dtype), s_x, s_g)
  d_bias = None if bias is None else qg.column_sums.astype(bias.dtype)
  return d_x, d_kernel, d_bias, new_state + (s_g, _recorded(g_history, qg.amax)), None


_fp8_dense.defvjp(_fp8_dense_fwd, _fp8_dense_bwd)


def fp8_dense(x: jax.Array, kernel: jax.Array, bias: jax.Array | None, state: tuple,
              shared: QuantizedInput | None = None, implementation: str | None = None,
              activation: str | None = None) -> jax.Array:
  """`x @ kernel + bias` over the last axis of `x` (with an `activation`, `activation(x) @
  kernel + bias`), both operands in float8_e4m3fn and the output's gradient in float8_e5m2, in
  `x`'s dtype. `state`: (input scale, input history, kernel scale, kernel history,
  output-gradient scale, its history), Flax's; their gradients are their next values.
  `shared`: the input already quantized (`quantized_input`), by this layer or by another
  reading the same input, whose scale and history then become this layer's (None: quantized
  here). `implementation`: as `quantize`. `activation` (one of `KERNEL_ACTIVATIONS`): applied
  by the quantization kernel as it reads `x`, so that the activation's output, which only this
  layer reads, is never written; its derivative is the model's (`modeling.activation_fn`)."""
  if shared is None:
    shared = quantized_input(x, state[0], state[1], implementation, activation)
  return _fp8_dense(implementation, activation, x, kernel.astype(x.dtype), bias, tuple(state),
                    shared)


# ------------------------------------------------------------------------------ the module
class _Fp8State(fp8_ops.Fp8DotGeneralBase):
  """Flax's six FP8 variables, created as Flax's op creates them."""

  def __call__(self) -> tuple[jax.Array, ...]:
    return (self.input_scale.value, self.input_amax_history.value, self.kernel_scale.value,
            self.kernel_amax_history.value, self.output_grad_scale.value,
            self.output_grad_amax_history.value)


class Fp8Dense(nn.Module):
  """A dense layer computed by `fp8_dense`, with the parameters and FP8 variables of Flax's
  `nn.Dense(..., dot_general_cls=nn.Fp8DirectDotGeneralOp)` under the same names."""
  features: int
  kernel_init: Callable[..., Any]
  bias_init: Callable[..., Any]
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  add_bias: bool = True  # False: the bias is a parameter but is not added (`modeling.dense`)
  activation: str | None = None  # applied to the input first, inside the quantization kernel

  @nn.compact
  def __call__(self, x: jax.Array, shared: QuantizedInput | None = None,
               share: bool = False) -> jax.Array | tuple[jax.Array, QuantizedInput]:
    """The layer's output; `shared`: its input as another layer quantized it (`fp8_dense`).
    `share`: also return the input as this layer quantized it, for others reading the same."""
    kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features),
                        self.param_dtype)
    bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype)
    state = _Fp8State(name=STATE_NAME)()
    x = x.astype(self.dtype)
    if shared is None:
      shared = quantized_input(x, state[0], state[1], activation=self.activation)
    y = fp8_dense(x, kernel, bias if self.add_bias else None, state, shared,
                  activation=self.activation)
    return (y, shared) if share else y
