"""Dropout, residual add and LayerNorm of a post-LN block in one GPU kernel each way.

Every BERT block ends twice with `LayerNorm(dropout(dense output + bias) + block input)`. XLA's
GPU compiler lowers that site to four kernels forward and four backward, plus the dropout mask's
and the bias add's own kernels (the H200 program of BERT-base/128: 207 LayerNorm and 89 dropout
kernels per step, 18.5 GB of the 91 GB it moves; `benchmarks/RESULTS.md`), because it does not
normalise a row in the kernel that sums it. Here each site is one kernel forward and one
backward (Pallas' Triton backend, `jax.experimental.pallas.triton`):

- forward: reads the dense output (without its bias, which the kernel adds) and the block input
  once; writes the normalised output, the sum (in the inputs' dtype, kept for the backward pass,
  as `modeling.residual_layer_norm` keeps it) and two float32 numbers per row (mean, 1/std);
- backward: reads the output's gradient and the saved sum; writes the gradients of both inputs
  and, per program, partial column sums for the dense bias, scale and bias gradients (XLA adds
  those up). An output handed to several consumers as copies (`uses`) brings back one gradient
  per copy, which the kernel adds as it reads them: the sum a kernel of XLA's would otherwise
  write and this kernel read again (`dropout_residual_layer_norm`).

A row of the residual stream (768 or 1024 values) stays in registers between the two row
reductions, so the statistics are two-pass (mean, then the variance of the centred values) at
no extra traffic.

The dropout mask is never stored. Both kernels draw it again from a counter-based hash of
(seed, row, column) (`dropout.hash_bits`: two rounds of MurmurHash3's 32-bit finaliser, the
seed's two words mixed in), one hash per 32 // bits columns (`dropout.hash_keep_words`), each
column's `bits` bits against `dropout.threshold(rate, bits)`, the same quantised rate and exact
rescaling as `model/dropout.py`. Its masks are not the XLA path's (those come from
`jax.random`); their statistics are (tests). The seed comes from the layer's "dropout" RNG
stream, so every layer and step gets its own masks and a resumed run draws the same ones.

Compiled for GPUs; interpreted elsewhere (CPU tests). TPUs are refused: this is Triton. JAX
0.11 deprecates Pallas' Triton backend in favour of Mosaic GPU (it warns at each compile) but
still lowers it; the kernels use only its loads, stores and element-wise operations.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from bert_jax.model import dropout
from bert_jax.model import target

__all__ = ["Tiling", "dropout_residual_layer_norm", "keep_mask"]


@dataclasses.dataclass(frozen=True)
class Tiling:
  """How the kernels are laid out on the GPU; the values they compute are the same whatever it
  is. `block_elements`: elements one program holds per array, in rows of the padded width (2
  rows of 1024 at BERT's widths: 16 values per thread at 4 warps, where Triton's own LayerNorm
  takes one row of 1024 over 4 warps); `num_warps` per program;
  `backward_programs`: the backward grid, whose programs each loop over every n-th block of
  rows accumulating the scale and bias gradients in registers, their partial sums (programs x 3
  x width float32: 9 MB at width 768) added up by XLA afterwards.
  `benchmarks/fused_layer_norm_checks.py --tilings` times others on the GPU."""
  block_elements: int = 2048
  num_warps: int = 4
  backward_programs: int = 1024

  def __post_init__(self):
    for name in ("block_elements", "num_warps"):  # Triton's block shapes and warp counts
      value = getattr(self, name)
      if value <= 0 or value & (value - 1):
        raise ValueError(f"Tiling: {name}={value}; expected a positive power of two.")
    if self.backward_programs <= 0:
      raise ValueError(f"Tiling: backward_programs={self.backward_programs}; expected a "
                       "positive count.")


def keep_mask(seed: jax.Array, shape: tuple[int, int], rate: float, bits: int = 16
              ) -> tuple[jax.Array, float]:
  """(mask, keep probability) of a (rows, width) site under `seed` (two uint32 words): what
  the kernels draw."""
  cut, keep_prob = dropout.threshold(rate, bits)
  rows = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
  cols = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
  return dropout.hash_keep_at(jnp.asarray(seed, jnp.uint32), rows, cols, cut, bits), keep_prob


@dataclasses.dataclass(frozen=True)
class _Static:
  """What the kernels are specialised on (hashable: a `custom_vjp` static argument)."""
  width: int
  padded: int  # the width rounded up to a power of two (Triton's blocks are powers of two)
  block_rows: int
  cut: int  # drop where the draw is below this; 0: no dropout (no bits drawn)
  bits: int
  inv_keep: float
  epsilon: float
  x_dtype: jnp.dtype  # and of the saved sum, and of x's gradient
  residual_dtype: jnp.dtype
  out_dtype: jnp.dtype
  interpret: bool
  tiling: Tiling


def _block(static: _Static, block, num_rows):
  """(rows, cols, row mask, column mask, 2D mask, 2D index) of row block `block`."""
  rows = block * static.block_rows + jnp.arange(static.block_rows)
  cols = jnp.arange(static.padded)
  row_ok, col_ok = rows < num_rows, cols < static.width
  mask = row_ok[:, None] & col_ok[None, :]
  return rows, cols, row_ok, col_ok, mask, (rows[:, None], cols[None, :])


def _kept(static: _Static, seed_ref, rows) -> jax.Array | None:
  """The keep mask of `rows` over the padded width: one hash per 32 // bits columns
  (`dropout.hash_keep_words`), as `keep_mask` lays them out."""
  if not static.cut:
    return None
  words = jnp.arange(static.padded // (32 // static.bits))
  return dropout.hash_keep_words(
      dropout.hash_bits(seed_ref[0], seed_ref[1], rows[:, None], words[None, :]), static.cut,
      static.bits)


def _forward_kernel(seed_ref, x_ref, r_ref, params_ref, y_ref, total_ref, stats_ref, *,
                    static: _Static):
  num_rows = x_ref.shape[0]
  rows, cols, row_ok, col_ok, mask, idx = _block(static, pl.program_id(0), num_rows)
  dense_bias, scale, bias = (
      plgpu.load(params_ref.at[i, cols], mask=col_ok, other=0.0) for i in range(3))
  x = plgpu.load(x_ref.at[idx], mask=mask, other=0.0).astype(jnp.float32) + dense_bias[None, :]
  r = plgpu.load(r_ref.at[idx], mask=mask, other=0.0).astype(jnp.float32)
  keep = _kept(static, seed_ref, rows)
  if keep is not None:
    x = jnp.where(keep, x * static.inv_keep, 0.0)
  v = jnp.where(mask, x + r, 0.0)
  plgpu.store(total_ref.at[idx], v.astype(total_ref.dtype), mask=mask)
  mean = jnp.sum(v, axis=-1) / static.width
  centred = jnp.where(col_ok[None, :], v - mean[:, None], 0.0)
  rstd = jax.lax.rsqrt(jnp.sum(centred * centred, axis=-1) / static.width + static.epsilon)
  y = centred * rstd[:, None] * scale[None, :] + bias[None, :]
  plgpu.store(y_ref.at[idx], y.astype(y_ref.dtype), mask=mask)
  plgpu.store(stats_ref.at[rows, 0], mean, mask=row_ok)
  plgpu.store(stats_ref.at[rows, 1], rstd, mask=row_ok)


def _backward_kernel(seed_ref, *refs, static: _Static, num_blocks: int, programs: int):
  *g_refs, total_ref, stats_ref, params_ref, dx_ref, dr_ref, part_ref = refs
  num_rows = g_refs[0].shape[0]
  program = pl.program_id(0)
  cols = jnp.arange(static.padded)
  col_ok = cols < static.width
  scale = plgpu.load(params_ref.at[1, cols], mask=col_ok, other=0.0)

  def body(step, sums):
    rows, cols, row_ok, col_ok, mask, idx = _block(static, program + step * programs, num_rows)
    g = sum(plgpu.load(g_ref.at[idx], mask=mask, other=0.0).astype(jnp.float32)
            for g_ref in g_refs)
    total = plgpu.load(total_ref.at[idx], mask=mask, other=0.0).astype(jnp.float32)
    mean = plgpu.load(stats_ref.at[rows, 0], mask=row_ok, other=0.0)
    rstd = plgpu.load(stats_ref.at[rows, 1], mask=row_ok, other=0.0)
    normed = jnp.where(mask, (total - mean[:, None]) * rstd[:, None], 0.0)
    gs = g * scale[None, :]
    mean_gs = jnp.sum(gs, axis=-1) / static.width
    mean_gsn = jnp.sum(gs * normed, axis=-1) / static.width
    d_total = jnp.where(mask, rstd[:, None] * (gs - mean_gs[:, None]
                                               - normed * mean_gsn[:, None]), 0.0)
    plgpu.store(dr_ref.at[idx], d_total.astype(dr_ref.dtype), mask=mask)
    keep = _kept(static, seed_ref, rows)
    d_x = d_total if keep is None else jnp.where(keep, d_total * static.inv_keep, 0.0)
    plgpu.store(dx_ref.at[idx], d_x.astype(dx_ref.dtype), mask=mask)
    d_dense_bias, d_scale, d_bias = sums
    return (d_dense_bias + jnp.sum(d_x, axis=0), d_scale + jnp.sum(g * normed, axis=0),
            d_bias + jnp.sum(g, axis=0))

  steps = (num_blocks - program + programs - 1) // programs
  zeros = jnp.zeros((static.padded,), jnp.float32)
  sums = jax.lax.fori_loop(0, steps, body, (zeros, zeros, zeros))
  for i, total in enumerate(sums):
    plgpu.store(part_ref.at[program, i, cols], total, mask=col_ok)


_ANY = pl.BlockSpec(memory_space=pl.ANY)


def _params(static: _Static) -> plgpu.CompilerParams:
  return plgpu.CompilerParams(num_warps=static.tiling.num_warps)


def _forward(static: _Static, x, residual, params, seed):
  rows = x.shape[0]
  out_shape = (jax.ShapeDtypeStruct(x.shape, static.out_dtype),
               jax.ShapeDtypeStruct(x.shape, x.dtype),
               jax.ShapeDtypeStruct((rows, 2), jnp.float32))
  return pl.pallas_call(
      functools.partial(_forward_kernel, static=static), out_shape=out_shape,
      grid=(pl.cdiv(rows, static.block_rows),), in_specs=[_ANY] * 4, out_specs=(_ANY,) * 3,
      compiler_params=_params(static), interpret=static.interpret,
      name="dropout_residual_layer_norm_fwd")(seed, x, residual, params)


def _backward(static: _Static, seed, grads, total, stats, params):
  """The gradients of x, residual and params from the output's (one per copy, `grads`)."""
  rows = total.shape[0]
  num_blocks = pl.cdiv(rows, static.block_rows)
  programs = min(num_blocks, static.tiling.backward_programs)
  out_shape = (jax.ShapeDtypeStruct(total.shape, static.x_dtype),
               jax.ShapeDtypeStruct(total.shape, static.residual_dtype),
               jax.ShapeDtypeStruct((programs, 3, static.width), jnp.float32))
  d_x, d_residual, parts = pl.pallas_call(
      functools.partial(_backward_kernel, static=static, num_blocks=num_blocks,
                        programs=programs),
      out_shape=out_shape, grid=(programs,), in_specs=[_ANY] * (4 + len(grads)),
      out_specs=(_ANY,) * 3, compiler_params=_params(static), interpret=static.interpret,
      name="dropout_residual_layer_norm_bwd")(seed, *grads, total, stats, params)
  return d_x, d_residual, jnp.sum(parts, axis=0)


def _copies(y: jax.Array, uses: int) -> tuple[jax.Array, ...]:
  """`uses` copies of `y`, each a value of its own to the compiler (an optimization barrier:
  no data moves). As one value, XLA's dot merger joins two GEMMs that read it (a block's
  query and key projections) into one, then copies the key out of the joined output and, in
  the backward pass, writes the two output gradients side by side for the joined weight
  gradient: 300 MB per BERT-base/128 layer on the H200, against the 100 MB the joined GEMMs
  save by reading the input once."""
  return (y,) if uses == 1 else jax.lax.optimization_barrier((y,) * uses)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _fused(static: _Static, uses: int, x, residual, params, seed):
  return _copies(_forward(static, x, residual, params, seed)[0], uses)


def _fused_fwd(static, uses, x, residual, params, seed):
  y, total, stats = _forward(static, x, residual, params, seed)
  return _copies(y, uses), (seed, total, stats, params)


def _fused_bwd(static, uses, saved, grads):
  del uses  # one gradient per copy, `grads`
  seed, total, stats, params = saved
  d_x, d_residual, d_params = _backward(static, seed, grads, total, stats, params)
  return d_x, d_residual, d_params, np.zeros(seed.shape, jax.dtypes.float0)


_fused.defvjp(_fused_fwd, _fused_bwd)


def dropout_residual_layer_norm(x: jax.Array, dense_bias: jax.Array | None,
                                residual: jax.Array, scale: jax.Array, bias: jax.Array, *,
                                rate: float, seed: jax.Array | None, epsilon: float, out_dtype,
                                bits: int = 16, interpret: bool | None = None,
                                tiling: Tiling = Tiling(), uses: int = 1
                                ) -> jax.Array | tuple[jax.Array, ...]:
  """LayerNorm(dropout(x + dense_bias) + residual) · scale + bias over the last axis, in one
  kernel each way.

  `uses` > 1 returns that many copies of the output, one for each of its consumers: their
  gradients reach the backward kernel apart, which adds them as it reads them. Autodiff would
  add them first, in a kernel of XLA's reading them all and writing their sum, which the
  backward kernel then reads again (a block's output, read by the next block's residual and its
  query, key and value projections: 4 arrays read and 1 written, then read; BERT-base/128 on
  the H200 2.3 GB per step in all).

  `x` (the dense layer's output before its bias) and `residual` (..., width) in the compute
  dtype; `dense_bias` (None: none), `scale` and `bias` (width,); `seed` two uint32 words
  (None only when `rate` is 0); the result in `out_dtype`. The bias add, the statistics and
  the normalisation are float32. `interpret` None: compiled on GPUs, interpreted elsewhere.
  Gradients flow to `x`, `dense_bias`, `residual`, `scale` and `bias`. `tiling` lays the
  kernels out (values are the same whatever it is)."""
  platform = target.target_platform()
  if platform == "tpu":
    raise ValueError("layer_norm_implementation='pallas' is a GPU (Triton) kernel; on a TPU "
                     "use 'xla'.")
  if interpret is None:
    interpret = platform != "gpu"
  if bits not in dropout.DROPOUT_BITS:
    raise ValueError(f"dropout bits={bits}; expected one of {dropout.DROPOUT_BITS}.")
  if uses < 1:
    raise ValueError(f"dropout_residual_layer_norm: uses={uses}; expected at least 1.")
  cut, keep_prob = dropout.threshold(rate, bits) if rate > 0.0 else (0, 1.0)
  if cut and seed is None:
    raise ValueError("dropout_residual_layer_norm: a seed is required when rate > 0.")
  seed = jnp.zeros((2,), jnp.uint32) if seed is None else jnp.asarray(seed, jnp.uint32)
  width = x.shape[-1]
  if x.size >= 2**31:
    # Element offsets inside the kernels are 32-bit.
    raise ValueError(f"dropout_residual_layer_norm: {x.size:,} elements of {x.shape} on one "
                     "device; the kernels address fewer than 2^31. Split the batch over more "
                     "devices, or use layer_norm_implementation='xla'.")
  padded = max(4, pl.next_power_of_2(width))  # whole hash words of decisions (4 at 8 bits)
  static = _Static(width=width, padded=padded,
                   block_rows=max(1, tiling.block_elements // padded), cut=cut, bits=bits,
                   inv_keep=1.0 / keep_prob, epsilon=float(epsilon), x_dtype=x.dtype,
                   residual_dtype=residual.dtype, out_dtype=jnp.dtype(out_dtype),
                   interpret=bool(interpret), tiling=tiling)
  if dense_bias is None:
    dense_bias = jnp.zeros((width,), jnp.float32)
  # One (3, width) float32 operand: a kernel of XLA's prepares it (on stacked layers, slicing
  # this layer's rows) instead of one per vector.
  params = jnp.stack([dense_bias, scale, bias]).astype(jnp.float32)
  ys = _fused(static, uses, x.reshape(-1, width), residual.reshape(-1, width), params, seed)
  ys = tuple(y.reshape(*x.shape) for y in ys)
  return ys[0] if uses == 1 else ys
