"""Pallas TPU attention with BERT's attention-probability dropout inside the kernel.

BERT's pre-training recipe drops attention *probabilities* (p=0.1). JAX's fused kernels do not
expose those probabilities, so without this module dropout forces the explicit path, which
materialises the (batch, heads, length, length) probabilities and mask in HBM. Here the mask is
drawn inside the kernel from a seed and the element's position, and the backward kernel draws
the same bits again instead of storing the mask.

BERT's rows are short (length <= 512, head_dim 64), so a grid step holds one block of queries
against the whole row of keys and values in VMEM and takes a plain softmax over the row: no
online softmax, and the dropped probabilities are exactly `softmax * keep / keep_prob`, as the
explicit path computes them. Grid (batch, heads, query blocks).

Two sources of random bits (`prng`), which give *different* masks for the same seed:
- "hardware": the TPU core's PRNG (`pltpu.prng_seed` / `prng_random_bits`), seeded with
  (seed, batch, head, query block). Fast; the default on a TPU. The TPU interpreter implements
  it as a stub (all-zero bits), so it cannot run off a TPU.
- "threefry": a counter-based Threefry-2x32 draw on the vector units, keyed by the seed, one
  64-bit counter per (batch, head, query, key) element. The same bits on every platform and for
  every `block_q`; the default in interpret mode, and what the tests check.
The choice matters only to a run resumed on another kind of machine (or with another `prng`):
it draws other masks than the uninterrupted run would have, which is statistically harmless.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.extend.random import threefry2x32_p

from bert_jax.model import dropout
from bert_jax.model import target

__all__ = ["flash_attention", "dropout_threshold", "PRNGS"]

# `modeling.MASKED_LOGIT`, repeated here because modeling imports this module. Masked logits
# are replaced by it, as on the explicit path: exp() of it is exactly 0 in float32.
MASKED_LOGIT = -1e9

PRNGS = ("hardware", "threefry")
MIN_BLOCK = 128  # key rows are lanes: a row of keys must fill whole 128-lane vregs
NUM_LANES, NUM_SUBLANES = 128, 8
# Threefry's second key word: a fixed tag, so that the key is the seed alone.
_THREEFRY_KEY_TAG = 0x42455254  # "BERT"
_SIGN_BIT = -(2**31)


@dataclasses.dataclass(frozen=True)
class _Static:
  """Everything the kernels are specialised on (hashable: a `custom_vjp` static argument)."""
  block_q: int
  scale: float
  threshold: int  # drop an element iff its unsigned 32-bit draw is below this; 0 = no dropout
  keep_scale: float  # 1 / the exact fraction of draws `threshold` keeps
  prng: str
  interpret: bool


def dropout_threshold(rate: float) -> tuple[int, float]:
  """(threshold, keep_prob): a probability is kept iff its uniform unsigned 32-bit draw is
  `>= threshold`, which happens with probability exactly `keep_prob = 1 - threshold / 2**32`.
  Scaling kept probabilities by `1 / keep_prob` (not by `1 / (1 - rate)`, which differs from it
  by the rounding of `rate * 2**32`) keeps the expectation of the output exactly unchanged.
  """
  if not 0.0 <= rate < 1.0:
    raise ValueError(f"dropout_rate must be in [0, 1), got {rate}.")
  return dropout.threshold(rate, 32)


def _tpu_interpret_forced() -> bool:
  """Whether `pltpu.force_tpu_interpret_mode()` is in effect: it overrides a pallas_call's own
  `interpret`, so the kernels then run interpreted whatever this module passes."""
  try:
    from jax._src import config as jax_config
    return bool(jax_config.pallas_tpu_interpret_mode_context_manager.value)
  except (ImportError, AttributeError):
    return False


def _random_bits(seed, batch_idx, head_idx, q_block, *, num_heads, num_q_blocks,
                 shape: tuple[int, int], prng: str) -> jax.Array:
  """The uniform 32-bit draws of one grid step's (block_q, length) probabilities, as int32.

  A pure function of (seed, batch, head, query block) and the static shape: the forward and the
  backward kernels call it with the same arguments and so drop the same probabilities. Every
  (batch, head, query block) gets its own bits: no two heads, rows or positions share a mask,
  and the caller's seed differs for every step and layer.
  """
  if prng == "hardware":
    # Mosaic seeds the core's generator with at most two words: the seed, and the grid step.
    pltpu.prng_seed(seed, (batch_idx * num_heads + head_idx) * num_q_blocks + q_block)
    return pltpu.prng_random_bits(shape)
  if prng != "threefry":
    raise ValueError(f"prng must be one of {PRNGS}, got {prng!r}.")
  # Counter mode: key = (seed, tag); counter = (batch * heads + head, query * length + key),
  # unique for every element of the layer's (batch, heads, length, length) probabilities. All
  # operands are full 2D vectors: the kernel never forms 1D or (2,)-shaped PRNG keys.
  block_q, length = shape
  as_uint = lambda x: jax.lax.bitcast_convert_type(x, jnp.uint32)
  full = lambda x: jnp.full(shape, x, jnp.int32)
  rows = jax.lax.broadcasted_iota(jnp.int32, shape, 0) + q_block * block_q
  cols = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
  bits_a, bits_b = threefry2x32_p.bind(
      as_uint(full(seed)), as_uint(full(jnp.int32(_THREEFRY_KEY_TAG))),
      as_uint(full(batch_idx * num_heads + head_idx)), as_uint(rows * length + cols))
  return jax.lax.bitcast_convert_type(bits_a ^ bits_b, jnp.int32)


def _keep(bits: jax.Array, threshold: int) -> jax.Array:
  """`uint32(bits) >= threshold`, compared as signed int32 with the sign bit flipped (the same
  order), which every backend compares natively."""
  return (bits ^ jnp.int32(_SIGN_BIT)) >= jnp.int32(threshold + _SIGN_BIT)


def _probabilities(seed_ref, q_ref, k_ref, q_ids_ref, kv_ids_ref, static: _Static, lse=None):
  """One grid step's masked scaled logits turned into probabilities, in float32.

  Returns (probs, dropped probs or None, keep mask or None, lse); `lse` (block_q, 1) is the
  row's log-sum-exp, computed here in the forward and given back to the backward.
  """
  b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  q, k = q_ref[...], k_ref[...]
  block_q, length = q.shape[0], k.shape[0]
  s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                          preferred_element_type=jnp.float32) * static.scale
  q_ids = jnp.tile(q_ids_ref[...], (1, length // NUM_LANES))  # (block_q, length)
  kv_ids = kv_ids_ref[:1, :]  # (1, length)
  s = jnp.where(q_ids == kv_ids, s, MASKED_LOGIT)
  if lse is None:
    m = jnp.max(s, axis=1, keepdims=True)
    e = jnp.exp(s - m)
    total = jnp.sum(e, axis=1, keepdims=True)  # >= 1: a query always sees its own key
    probs = e * (1.0 / total)
    lse = m + jnp.log(total)
  else:
    probs = jnp.exp(s - lse)
  if not static.threshold:
    return probs, None, None, lse
  bits = _random_bits(seed_ref[0], b, h, i, num_heads=pl.num_programs(1),
                      num_q_blocks=pl.num_programs(2),
                      shape=(block_q, length), prng=static.prng)
  keep = _keep(bits, static.threshold)
  return probs, jnp.where(keep, probs * static.keep_scale, 0.0), keep, lse


def _forward_kernel(seed_ref, q_ref, k_ref, v_ref, q_ids_ref, kv_ids_ref, o_ref, lse_ref, *,
                    static: _Static):
  probs, dropped, _, lse = _probabilities(seed_ref, q_ref, k_ref, q_ids_ref, kv_ids_ref, static)
  probs = probs if dropped is None else dropped
  v = v_ref[...]
  o_ref[...] = jax.lax.dot(probs.astype(v.dtype), v,
                           preferred_element_type=jnp.float32).astype(o_ref.dtype)
  lse_ref[...] = jnp.broadcast_to(lse, lse_ref.shape)


def _backward_kernel(seed_ref, q_ref, k_ref, v_ref, q_ids_ref, kv_ids_ref, lse_ref, o_ref,
                     do_ref, dq_ref, dk_ref, dv_ref, dk_acc, dv_acc, *, static: _Static):
  """dq of this query block; dk and dv summed over the query blocks (the last grid axis) in
  float32 scratch and written after the last one.

  With P the probabilities, M = keep / keep_prob and O = (P * M) V:
  dV = (P * M)^T dO; dP = (dO V^T) * M; dS = P * (dP - rowsum(dO * O)) (rowsum(dP * P) equals
  rowsum(dO * O), dropout or not); dQ = scale * dS K; dK = scale * dS^T Q.
  """
  i = pl.program_id(2)

  @pl.when(i == 0)
  def _():
    dk_acc[...] = jnp.zeros_like(dk_acc)
    dv_acc[...] = jnp.zeros_like(dv_acc)

  lse = jnp.expand_dims(lse_ref[0], -1)  # (block_q, 1)
  probs, dropped, keep, _ = _probabilities(seed_ref, q_ref, k_ref, q_ids_ref, kv_ids_ref,
                                           static, lse=lse)
  q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
  di = jnp.sum(do.astype(jnp.float32) * o_ref[...].astype(jnp.float32), axis=1, keepdims=True)
  used = probs if dropped is None else dropped
  dv_acc[...] += jax.lax.dot(used.T.astype(do.dtype), do, preferred_element_type=jnp.float32)
  dp = jax.lax.dot_general(do.astype(v.dtype), v, (((1,), (1,)), ((), ())),
                           preferred_element_type=jnp.float32)
  if keep is not None:
    dp = jnp.where(keep, dp * static.keep_scale, 0.0)
  ds = probs * (dp - di) * static.scale
  dq_ref[...] = jax.lax.dot(ds.astype(k.dtype), k,
                            preferred_element_type=jnp.float32).astype(dq_ref.dtype)
  dk_acc[...] += jax.lax.dot(ds.T.astype(q.dtype), q, preferred_element_type=jnp.float32)

  @pl.when(i == pl.num_programs(2) - 1)
  def _():
    dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
    dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def _specs(static: _Static, length: int, head_dim: int):
  """Block specs shared by both kernels (index maps get the scalar-prefetch seed last)."""
  sq = pl.squeezed
  q_block = pl.BlockSpec((sq, sq, static.block_q, head_dim), lambda b, h, i, _: (b, h, i, 0))
  kv_full = pl.BlockSpec((sq, sq, length, head_dim), lambda b, h, i, _: (b, h, 0, 0))
  # Segment ids in the layouts the kernel compares without relayout: queries down the
  # sublanes (replicated across lanes), keys along the lanes (replicated down sublanes).
  q_ids = pl.BlockSpec((sq, static.block_q, NUM_LANES), lambda b, h, i, _: (b, i, 0))
  kv_ids = pl.BlockSpec((sq, NUM_SUBLANES, length), lambda b, h, i, _: (b, 0, 0))
  return q_block, kv_full, q_ids, kv_ids


def _ids_layouts(segment_ids):
  batch, length = segment_ids.shape
  q_ids = jax.lax.broadcast_in_dim(segment_ids, (batch, length, NUM_LANES), (0, 1))
  kv_ids = jax.lax.broadcast_in_dim(segment_ids, (batch, NUM_SUBLANES, length), (0, 2))
  return q_ids, kv_ids


def _interpret_arg(static: _Static):
  return pltpu.InterpretParams() if static.interpret else False


def _forward(static: _Static, q, k, v, segment_ids, seed):
  """q/k/v (batch, heads, length, head_dim) -> (out, lse (batch, heads, length) float32)."""
  batch, heads, length, head_dim = q.shape
  q_block, kv_full, q_ids, kv_ids = _specs(static, length, head_dim)
  lse_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, static.block_q, NUM_LANES),
                          lambda b, h, i, _: (b, h, i, 0))
  out, lse = pl.pallas_call(
      functools.partial(_forward_kernel, static=static),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(batch, heads, length // static.block_q),
          in_specs=[q_block, kv_full, kv_full, q_ids, kv_ids],
          out_specs=[q_block, lse_spec]),
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((batch, heads, length, NUM_LANES), jnp.float32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel")),
      interpret=_interpret_arg(static),
      name="bert_attention_dropout_fwd",
  )(seed, q, k, v, *_ids_layouts(segment_ids))
  return out, lse[..., 0]


def _backward(static: _Static, q, k, v, segment_ids, seed, out, lse, d_out):
  batch, heads, length, head_dim = q.shape
  q_block, kv_full, q_ids, kv_ids = _specs(static, length, head_dim)
  lse_spec = pl.BlockSpec((pl.squeezed, pl.squeezed, 1, static.block_q),
                          lambda b, h, i, _: (b, h, 0, i))
  return pl.pallas_call(
      functools.partial(_backward_kernel, static=static),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(batch, heads, length // static.block_q),
          in_specs=[q_block, kv_full, kv_full, q_ids, kv_ids, lse_spec, q_block, q_block],
          out_specs=[q_block, kv_full, kv_full],
          scratch_shapes=[pltpu.VMEM((length, head_dim), jnp.float32)] * 2),
      out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "arbitrary")),
      interpret=_interpret_arg(static),
      name="bert_attention_dropout_bwd",
  )(seed, q, k, v, *_ids_layouts(segment_ids), lse[:, :, None, :], out, d_out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(static, q, k, v, segment_ids, seed):
  return _forward(static, q, k, v, segment_ids, seed)[0]


def _attention_fwd(static, q, k, v, segment_ids, seed):
  out, lse = _forward(static, q, k, v, segment_ids, seed)
  return out, (q, k, v, segment_ids, seed, out, lse)


def _attention_bwd(static, residuals, d_out):
  q, k, v, segment_ids, seed, out, lse = residuals
  dq, dk, dv = _backward(static, q, k, v, segment_ids, seed, out, lse, d_out)
  return dq, dk, dv, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def flash_attention(query: jax.Array, key: jax.Array, value: jax.Array, segment_ids: jax.Array,
                    *, dropout_rate: float = 0.0, seed: jax.Array | None = None,
                    prng: str | None = None, block_q: int | None = None,
                    interpret: bool | None = None) -> jax.Array:
  """softmax(q·k/√d) in float32 within each segment, probabilities dropped out, times v.

  query/key/value: (batch, length, heads, head_dim), any float dtype; the output has the query's
  layout and dtype. `segment_ids` (batch, length) int: query i sees key j iff their ids are
  equal (padding has id 0: padding queries see padding keys; nothing should read them).

  `dropout_rate` > 0 drops each probability independently, keeping it with probability
  `keep_prob` (`dropout_threshold`) and scaling kept ones by 1 / keep_prob. The mask is a pure
  function of `seed` (an int32 scalar, may be traced: derive it from the step's dropout key, so
  that each step and layer draws its own masks and a resumed run draws the same ones) and of
  each element's (batch, head, query, key) position. `prng` picks the bit source: "hardware"
  or "threefry" (module docstring); None means "hardware" when compiling for a TPU and
  "threefry" in interpret mode. A rate of 0 draws no bits.

  `block_q` query rows per grid step (default 128; a multiple of 128 dividing the length):
  larger blocks mean fewer grid steps and more VMEM, (block_q, length) float32 temporaries.
  `interpret` None runs the kernels in the TPU interpreter off a TPU, compiled for one (also
  ahead of time from another machine, under a mesh of TPU topology devices);
  False compiles for a TPU wherever the trace is (to lower for a TPU from another host).
  """
  batch, length, heads, head_dim = query.shape
  if key.shape != query.shape or value.shape != query.shape:
    raise ValueError(f"query, key and value must have one shape (batch, length, heads, "
                     f"head_dim), got {query.shape}, {key.shape}, {value.shape}.")
  if segment_ids.shape != (batch, length):
    raise ValueError(f"segment_ids must be (batch, length) = {(batch, length)}, got "
                     f"{segment_ids.shape}.")
  if length % MIN_BLOCK:
    raise ValueError(f"Pallas attention needs a sequence length that is a multiple of "
                     f"{MIN_BLOCK} (the kernel's block), got {length}; use 'xla' or pad the "
                     f"rows.")
  block_q = MIN_BLOCK if block_q is None else block_q
  if block_q % MIN_BLOCK or length % block_q:
    raise ValueError(f"block_q must be a multiple of {MIN_BLOCK} that divides the length "
                     f"{length}, got {block_q}.")
  if interpret is None:
    interpret = target.target_platform() != "tpu"
  interpreted = interpret or _tpu_interpret_forced()
  if prng is None:
    prng = "threefry" if interpreted else "hardware"
  if prng not in PRNGS:
    raise ValueError(f"prng must be one of {PRNGS}, got {prng!r}.")
  threshold, keep_prob = dropout_threshold(dropout_rate)
  if threshold:
    if seed is None:
      raise ValueError("Attention dropout needs a seed (an int32 scalar).")
    if prng == "hardware" and interpreted:
      raise ValueError("prng='hardware' cannot run in interpret mode: the TPU interpreter's "
                       "hardware PRNG is a stub returning zeros (every probability would be "
                       "dropped); use prng='threefry'.")
    seed = jnp.asarray(seed)
    if seed.shape != () or not jnp.issubdtype(seed.dtype, jnp.integer):
      raise ValueError(f"seed must be an integer scalar, got {seed.dtype}{list(seed.shape)}.")
    seed = seed.astype(jnp.int32).reshape(1)
  else:
    seed = jnp.zeros((1,), jnp.int32)  # unread: no bits are drawn
  static = _Static(block_q=block_q, scale=1.0 / math.sqrt(head_dim), threshold=threshold,
                   keep_scale=1.0 / keep_prob, prng=prng, interpret=bool(interpret))
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # (b, s, n, d) <-> (b, n, s, d)
  out = _attention(static, heads_first(query), heads_first(key), heads_first(value),
                   segment_ids.astype(jnp.int32), seed)
  return heads_first(out)
