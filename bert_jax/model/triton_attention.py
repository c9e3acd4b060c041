"""Flash attention for GPUs with BERT's attention-probability dropout inside the kernel (Pallas'
Triton backend), masked by segment ids.

Why a kernel of our own beside cuDNN's: cuDNN's dropout seed is static and its mask counter
lives in the process (`modeling._cudnn_attention`), so a run resumed from a checkpoint draws
other masks than the uninterrupted run, and a layer applied several times per step (scanned or
shared layers: ALBERT) cannot take it at all. Here the mask is a hash of (seed, row, key)
(`dropout.hash_bits`, the fused LayerNorm sites' draw; one 32-bit hash per two keys at the
default 16 bits per decision, `dropout.hash_keep_words`), the seed taken from the layer's
"dropout" key: every layer, step and call draws its own mask, a resumed run the same ones, and
the backward kernel draws it again instead of storing it. BERT's rows are short (128 or 512
tokens of 64-value heads), where the kernels' grids are wide and their loops short; whether this
kernel or cuDNN's is faster on a given GPU is measured (`benchmarks/attention_dropout_checks.py`
times both), not assumed.

The arithmetic is FlashAttention-2's: the forward pass takes an online softmax over blocks of
keys (in base 2) and keeps each query's log-sum-exp; the backward pass recomputes the
probabilities from it, one program per block of keys for their gradients and, in the same
program, one block of queries for theirs. With dropout the forward output is
`(P * keep / keep_prob) · V` for the undropped softmax P, as the explicit path computes it, and
the backward pass uses `rowsum(dO * O) = rowsum(P * dP)`, which holds with the mask applied.

Segment ids say who attends whom: a query attends the keys of its own id. Real tokens carry
their instance's id (packed rows) or 1, padding 0: real queries never see padding or another
instance, and padding queries see padding keys (their rows are never read). Any length and any
head width up to 256 are taken; blocks are powers of two, their ragged ends masked.

The kernels read q, k and v either as three arrays or side by side in one, as the joined
projection writes them (`joined_flash_attention`, `modeling.joined_projection`), and write their
gradients the same way.

Compiled on GPUs; interpreted elsewhere (the CPU tests). TPUs have `pallas_attention`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from bert_jax.model import dropout
from bert_jax.model import target

__all__ = ["Tiling", "flash_attention", "joined_flash_attention", "keep_mask", "reference",
           "default_tiling", "set_default_tiling"]

_LOG2_E = math.log2(math.e)
# Masked scores, in the base-2 domain: finite, so that a query whose keys are all masked (a row
# past the end) gives no NaN; exp2 of it less a real score is exactly 0 in float32.
_MASKED = -1e9
_NO_KEY, _NO_QUERY = -2, -1  # the ids loaded past the end of a row: they match nothing


@dataclasses.dataclass(frozen=True)
class Tiling:
  """How the kernels are laid out on the GPU; the values they compute are the same whatever it
  is (up to the order of float32 sums). Forward: `block_q` queries per program, keys taken
  `block_k` at a time. Backward: each program owns `backward_block` keys (their gradients) and
  the `backward_block` queries of the same index (theirs), and loops over the other side
  `backward_step` at a time. `num_warps` per program. Powers of two of at least 16 (Triton's
  dot). `benchmarks/attention_dropout_checks.py --tilings` times others on the GPU."""
  block_q: int = 64
  block_k: int = 64
  backward_block: int = 64
  backward_step: int = 64
  num_warps: int = 4

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      least = 1 if field.name == "num_warps" else 16
      if value < least or value & (value - 1):
        raise ValueError(f"Tiling: {field.name}={value}; expected a power of two of at least "
                         f"{least}.")

  @classmethod
  def parse(cls, text: str) -> "Tiling":
    """A tiling written as its fields' values, colon-separated
    (block_q:block_k:backward_block:backward_step:num_warps), as the checks print them."""
    values = text.split(":")
    if len(values) != len(dataclasses.fields(cls)) or not all(v.isdigit() for v in values):
      raise ValueError(f"Tiling {text!r}: expected {len(dataclasses.fields(cls))} whole "
                       "numbers, block_q:block_k:backward_block:backward_step:num_warps.")
    return cls(*map(int, values))

  def __str__(self) -> str:
    return ":".join(str(getattr(self, f.name)) for f in dataclasses.fields(self))


# The tiling a call without one takes: `Tiling()`, or what `set_default_tiling` chose (the GPU
# benchmarks time a step with the tiling the kernel checks found fastest on that GPU).
_default_tiling = Tiling()


def default_tiling() -> Tiling:
  return _default_tiling


def _fitted(tiling: Tiling, row_bytes: int) -> Tiling:
  """`tiling` with its blocks cut to fit a GPU's shared memory for rows (one head of one token)
  of `row_bytes`: blocks of at most 16 KiB of rows (128 rows of BERT's 64 bfloat16 values, 32
  of 128 float32 values). Compiled for an H200, the default tiling's backward kernel asked for
  279 KB of its 227 KB with float32 heads of 128 values; cut so, every head width up to 256 in
  either dtype compiles."""
  cap = max(16, 16384 // row_bytes)
  return dataclasses.replace(tiling, **{
      f.name: min(getattr(tiling, f.name), cap) for f in dataclasses.fields(tiling)
      if f.name != "num_warps"})


def set_default_tiling(tiling: Tiling) -> None:
  """The tiling of every later call that names none (a program traced afterwards takes it)."""
  global _default_tiling
  _default_tiling = tiling


@dataclasses.dataclass(frozen=True)
class _Static:
  """What the kernels are specialised on (hashable: a `custom_vjp` static argument)."""
  batch: int
  length: int
  heads: int
  head_dim: int
  head_pad: int  # head_dim rounded up to a power of two
  scale: float  # 1/sqrt(head_dim)
  cut: int  # drop where the draw is below this; 0: no dropout (no bits drawn)
  bits: int
  inv_keep: float
  exact: bool  # float32 operands: full-precision dots (no TF32)
  interpret: bool
  tiling: Tiling
  joined: bool  # q, k and v side by side in one (tokens, 3 * heads * head_dim) operand

  def refs(self, refs) -> tuple:
    """(q, k, v) refs of the kernels' one or three operands (their gradients' likewise)."""
    return tuple(refs) * 3 if self.joined else tuple(refs)

  def offset(self, part: int) -> int:
    """Where part `part` (0 q, 1 k, 2 v) starts in a row of its operand."""
    return part * self.heads * self.head_dim if self.joined else 0


def _rows(static: _Static, batch, head, queries) -> jax.Array:
  """The hash's row of each (batch, head, query): distinct over the whole call."""
  return (batch * static.heads + head) * static.length + queries


def _kept(static: _Static, seed_ref, rows, first, count: int) -> jax.Array:
  """The keep mask of queries `rows` (their hash rows) against `count` keys from `first`: one
  hash per 32 // bits keys (`dropout.hash_keep_words`), as `keep_mask` lays them out."""
  per_word = 32 // static.bits
  words = first // per_word + jnp.arange(count // per_word)
  hashes = dropout.hash_bits(seed_ref[0], seed_ref[1], rows[:, None], words[None, :])
  return dropout.hash_keep_words(hashes, static.cut, static.bits)


def _load(static: _Static, ref, batch, head, positions, part: int = 0):
  """Rows `positions` of one (batch, head) of part `part` of its operand (`_Static.offset`):
  the (len, head_pad) block, zero past the end, with its indices and mask (to store a block of
  the same rows)."""
  cols = jnp.arange(static.head_pad)
  idx = ((batch * static.length + positions)[:, None],
         (static.offset(part) + head * static.head_dim + cols)[None, :])
  mask = (positions < static.length)[:, None] & (cols < static.head_dim)[None, :]
  return plgpu.load(ref.at[idx], mask=mask, other=0.0), idx, mask


def _ids(static: _Static, ids_ref, batch, positions, missing: int):
  """The segment ids of rows `positions` of one batch row, `missing` past its end."""
  return plgpu.load(ids_ref.at[batch * static.length + positions],
                    mask=positions < static.length, other=missing)


def _dot(static: _Static, a, b, trans_a=False, trans_b=False):
  return plgpu.dot(a, b, trans_a=trans_a, trans_b=trans_b, allow_tf32=not static.exact)


def _scores(static: _Static, q, k, q_ids, k_ids):
  """q·k/√d in base 2 (times log2 e), masked where the ids differ."""
  s = _dot(static, q, k, trans_b=True) * (static.scale * _LOG2_E)
  return jnp.where(q_ids[:, None] == k_ids[None, :], s, _MASKED)


def _forward_kernel(seed_ref, ids_ref, *refs, static: _Static):
  *inputs, o_ref, lse_ref = refs
  q_ref, k_ref, v_ref = static.refs(inputs)
  block, batch, head = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  bq, bk = static.tiling.block_q, static.tiling.block_k
  queries = block * bq + jnp.arange(bq)
  q, q_idx, q_mask = _load(static, q_ref, batch, head, queries)
  q_ids = _ids(static, ids_ref, batch, queries, _NO_QUERY)
  rows = _rows(static, batch, head, queries)

  def body(step, carry):
    acc, top, total = carry
    keys = step * bk + jnp.arange(bk)
    k, v = _load(static, k_ref, batch, head, keys, 1)[0], _load(static, v_ref, batch, head,
                                                                  keys, 2)[0]
    s = _scores(static, q, k, q_ids, _ids(static, ids_ref, batch, keys, _NO_KEY))
    new_top = jnp.maximum(top, jnp.max(s, axis=-1))
    shrink = jnp.exp2(top - new_top)
    p = jnp.exp2(s - new_top[:, None])
    total = total * shrink + jnp.sum(p, axis=-1)
    if static.cut:
      p = jnp.where(_kept(static, seed_ref, rows, step * bk, bk), p, 0.0)
    acc = acc * shrink[:, None] + _dot(static, p.astype(v.dtype), v)
    return acc, new_top, total

  init = (jnp.zeros((bq, static.head_pad), jnp.float32),
          jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32))
  acc, top, total = jax.lax.fori_loop(0, pl.cdiv(static.length, bk), body, init)
  out = acc * (static.inv_keep / total)[:, None]
  plgpu.store(o_ref.at[q_idx], out.astype(o_ref.dtype), mask=q_mask)
  plgpu.store(lse_ref.at[rows], top + jnp.log2(total), mask=queries < static.length)


def _probabilities(static: _Static, seed_ref, lse_ref, q, k, q_ids, k_ids, rows, first, q_ok):
  """(P, P's dropout mask or None) of a block of queries against the block of keys from
  `first`."""
  lse = plgpu.load(lse_ref.at[rows], mask=q_ok, other=0.0)
  p = jnp.exp2(_scores(static, q, k, q_ids, k_ids) - lse[:, None])
  return p, (_kept(static, seed_ref, rows, first, k.shape[0]) if static.cut else None)


def _score_gradient(static: _Static, p, keep, d_dropped, delta):
  """dL/d(q·k) from P, the gradient of the dropped probabilities and rowsum(dO * O)."""
  d_p = d_dropped if keep is None else jnp.where(keep, d_dropped * static.inv_keep, 0.0)
  return p * (d_p - delta[:, None]) * static.scale


def _backward_kernel(seed_ref, ids_ref, *refs, static: _Static):
  parts = 1 if static.joined else 3
  inputs, (o_ref, do_ref, lse_ref), outputs = refs[:parts], refs[parts:parts + 3], refs[-parts:]
  q_ref, k_ref, v_ref = static.refs(inputs)
  dq_ref, dk_ref, dv_ref = static.refs(outputs)
  block, batch, head = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  size, step_size = static.tiling.backward_block, static.tiling.backward_step
  steps = pl.cdiv(static.length, step_size)
  own = block * size + jnp.arange(size)

  def queries_of(positions):
    q, idx, mask = _load(static, q_ref, batch, head, positions)
    d_o, o = (_load(static, ref, batch, head, positions)[0] for ref in (do_ref, o_ref))
    q_ids = _ids(static, ids_ref, batch, positions, _NO_QUERY)
    delta = jnp.sum(d_o.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    return q, q_ids, d_o, delta, idx, mask

  # The gradients of this program's keys and values, over every block of queries.
  k, k_idx, k_mask = _load(static, k_ref, batch, head, own, 1)
  v, v_idx, _ = _load(static, v_ref, batch, head, own, 2)
  k_ids = _ids(static, ids_ref, batch, own, _NO_KEY)

  def key_body(step, carry):
    d_k, d_v = carry
    queries = step * step_size + jnp.arange(step_size)
    q, q_ids, d_o, delta, _, _ = queries_of(queries)
    rows = _rows(static, batch, head, queries)
    p, keep = _probabilities(static, seed_ref, lse_ref, q, k, q_ids, k_ids, rows, block * size,
                             queries < static.length)
    dropped = p if keep is None else jnp.where(keep, p * static.inv_keep, 0.0)
    d_v = d_v + _dot(static, dropped.astype(d_o.dtype), d_o, trans_a=True)
    d_s = _score_gradient(static, p, keep, _dot(static, d_o, v, trans_b=True), delta)
    d_k = d_k + _dot(static, d_s.astype(q.dtype), q, trans_a=True)
    return d_k, d_v

  zeros = jnp.zeros((size, static.head_pad), jnp.float32)
  d_k, d_v = jax.lax.fori_loop(0, steps, key_body, (zeros, zeros))
  plgpu.store(dk_ref.at[k_idx], d_k.astype(dk_ref.dtype), mask=k_mask)
  plgpu.store(dv_ref.at[v_idx], d_v.astype(dv_ref.dtype), mask=k_mask)

  # The gradient of the queries of the same index, over every block of keys.
  q, q_ids, d_o, delta, q_idx, q_mask = queries_of(own)
  rows = _rows(static, batch, head, own)

  def query_body(step, d_q):
    keys = step * step_size + jnp.arange(step_size)
    k, v = _load(static, k_ref, batch, head, keys, 1)[0], _load(static, v_ref, batch, head,
                                                                  keys, 2)[0]
    k_ids = _ids(static, ids_ref, batch, keys, _NO_KEY)
    p, keep = _probabilities(static, seed_ref, lse_ref, q, k, q_ids, k_ids, rows,
                             step * step_size, own < static.length)
    d_s = _score_gradient(static, p, keep, _dot(static, d_o, v, trans_b=True), delta)
    return d_q + _dot(static, d_s.astype(k.dtype), k)

  d_q = jax.lax.fori_loop(0, steps, query_body, zeros)
  plgpu.store(dq_ref.at[q_idx], d_q.astype(dq_ref.dtype), mask=q_mask)


_ANY = pl.BlockSpec(memory_space=pl.ANY)


# Grids are (blocks, batch, heads): the first axis varies fastest as programs are launched, so
# the programs of one (batch, head), which read the same keys and values (and, backward, the
# same queries and output gradients), run side by side and find them in L2.
def _call(kernel, static: _Static, grid, out_shape, name, *operands):
  return pl.pallas_call(
      functools.partial(kernel, static=static), out_shape=out_shape, grid=grid,
      in_specs=[_ANY] * len(operands), out_specs=tuple(_ANY for _ in out_shape),
      compiler_params=plgpu.CompilerParams(num_warps=static.tiling.num_warps),
      interpret=static.interpret, name=name)(*operands)


def _forward(static: _Static, inputs, ids, seed):
  grid = (pl.cdiv(static.length, static.tiling.block_q), static.batch, static.heads)
  tokens, width = static.batch * static.length, static.heads * static.head_dim
  out_shape = (jax.ShapeDtypeStruct((tokens, width), inputs[0].dtype),
               jax.ShapeDtypeStruct((static.batch * static.heads * static.length,),
                                    jnp.float32))
  return _call(_forward_kernel, static, grid, out_shape, "flash_attention_dropout_fwd",
               seed, ids, *inputs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(static: _Static, inputs: tuple, ids, seed):
  """`inputs`: (q, k, v), each (tokens, heads * head_dim), or (q k v side by side,)."""
  return _forward(static, inputs, ids, seed)[0]


def _attention_fwd(static, inputs, ids, seed):
  out, lse = _forward(static, inputs, ids, seed)
  return out, (inputs, ids, seed, out, lse)


def _attention_bwd(static, saved, d_out):
  inputs, ids, seed, out, lse = saved
  grid = (pl.cdiv(static.length, static.tiling.backward_block), static.batch, static.heads)
  out_shape = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs)
  d_inputs = _call(_backward_kernel, static, grid, out_shape, "flash_attention_dropout_bwd",
                   seed, ids, *inputs, out, d_out.astype(out.dtype), lse)
  float0 = lambda x: np.zeros(x.shape, jax.dtypes.float0)
  return tuple(d_inputs), float0(ids), float0(seed)


_attention.defvjp(_attention_fwd, _attention_bwd)


def flash_attention(query: jax.Array, key: jax.Array, value: jax.Array, ids: jax.Array, *,
                    dropout_rate: float = 0.0, seed: jax.Array | None = None, bits: int = 16,
                    interpret: bool | None = None, tiling: Tiling | None = None) -> jax.Array:
  """softmax(q·k/√d) · v over the keys of each query's own id, with the probabilities dropped
  at `dropout_rate` inside the kernel. q, k, v: (batch, length, heads, head_dim), one dtype;
  `ids` (batch, length) integers; `seed` two uint32 words (needed when `dropout_rate` > 0);
  `bits` bits per keep/drop decision (`dropout.threshold`). The result has q's shape and dtype.
  `interpret` None: compiled on GPUs, interpreted elsewhere. `tiling` None: the default
  (`set_default_tiling`), its blocks cut to fit the GPU's shared memory for wide heads
  (`_fitted`); a tiling given is taken as it is."""
  if key.shape != query.shape or value.shape != query.shape:
    raise ValueError(f"flash_attention: query {query.shape}, key {key.shape} and value "
                     f"{value.shape} must have one (batch, length, heads, head_dim) shape.")
  if key.dtype != query.dtype or value.dtype != query.dtype:
    raise ValueError(f"flash_attention: query, key and value must share a dtype, got "
                     f"{query.dtype}, {key.dtype}, {value.dtype}.")
  return _attend((query, key, value), query.shape, ids, dropout_rate=dropout_rate, seed=seed,
                 bits=bits, interpret=interpret, tiling=tiling)


def joined_flash_attention(qkv: jax.Array, ids: jax.Array, **kwargs) -> jax.Array:
  """`flash_attention` of a joined projection's output: `qkv` (batch, length, 3, heads,
  head_dim), the queries, keys and values side by side in each row, as one GEMM against the
  three projections' kernels side by side writes them. The kernels read each part where it
  lies and the backward kernel writes the three gradients into one array of the same layout,
  the operand of one weight-gradient GEMM and one input-gradient GEMM; kept apart, each part
  would be copied out forward and the gradients copied together backward."""
  batch, length, parts, heads, head_dim = qkv.shape
  if parts != 3:
    raise ValueError(f"joined_flash_attention: qkv {qkv.shape}; expected (batch, length, 3, "
                     "heads, head_dim).")
  return _attend((qkv,), (batch, length, heads, head_dim), ids, **kwargs)


def _attend(inputs: tuple, shape: tuple[int, int, int, int], ids: jax.Array, *,
            dropout_rate: float = 0.0, seed: jax.Array | None = None, bits: int = 16,
            interpret: bool | None = None, tiling: Tiling | None = None) -> jax.Array:
  batch, length, heads, head_dim = shape
  head_pad = max(16, pl.next_power_of_2(head_dim))
  if tiling is None:
    tiling = _fitted(_default_tiling, head_pad * jnp.dtype(inputs[0].dtype).itemsize)
  if ids.shape != (batch, length):
    raise ValueError(f"flash_attention: ids {ids.shape}; expected (batch, length) = "
                     f"{(batch, length)}.")
  if head_dim > 256:
    raise ValueError(f"flash_attention: heads of {head_dim} values; the kernels take up to "
                     "256.")
  if batch * heads * length >= 2**31 or sum(x.size for x in inputs) >= 2**31:
    raise ValueError(f"flash_attention: {shape} on one device; the kernels address fewer than "
                     "2^31 rows and elements. Split the batch over more devices.")
  if bits not in dropout.DROPOUT_BITS:
    raise ValueError(f"flash_attention: bits={bits}; expected one of {dropout.DROPOUT_BITS}.")
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"flash_attention: dropout_rate must be in [0, 1), got {dropout_rate}.")
  cut, keep_prob = dropout.threshold(dropout_rate, bits) if dropout_rate > 0 else (0, 1.0)
  if cut and seed is None:
    raise ValueError("flash_attention: a seed is required when dropout_rate > 0.")
  if interpret is None:
    platform = target.target_platform()
    if platform == "tpu":
      raise ValueError("triton_attention is a GPU (Triton) kernel; a TPU runs "
                       "pallas_attention.")
    interpret = platform != "gpu"
  static = _Static(batch=batch, length=length, heads=heads, head_dim=head_dim,
                   head_pad=head_pad, scale=1.0 / math.sqrt(head_dim), cut=cut, bits=bits,
                   inv_keep=1.0 / keep_prob, exact=inputs[0].dtype == jnp.float32,
                   interpret=bool(interpret), tiling=tiling, joined=len(inputs) == 1)
  seed = jnp.zeros((2,), jnp.uint32) if seed is None else jnp.asarray(seed, jnp.uint32)
  flat = tuple(x.reshape(batch * length, -1) for x in inputs)
  out = _attention(static, flat, ids.reshape(-1).astype(jnp.int32), seed)
  return out.reshape(shape)


def keep_mask(seed: jax.Array, shape: tuple[int, int, int, int], rate: float, bits: int = 16
              ) -> tuple[jax.Array, float]:
  """(mask, keep probability) of the kernels' dropout over (batch, heads, queries, keys)
  probabilities under `seed` (two uint32 words): what they draw."""
  batch, heads, length, keys = shape
  cut, keep_prob = dropout.threshold(rate, bits)
  b = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
  h = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
  i = jax.lax.broadcasted_iota(jnp.int32, shape, 2)
  j = jax.lax.broadcasted_iota(jnp.int32, shape, 3)
  seed = jnp.asarray(seed, jnp.uint32)
  rows = (b * heads + h) * length + i
  return dropout.hash_keep_at(seed, rows, j, cut, bits), keep_prob


def reference(query, key, value, ids, *, dropout_rate: float = 0.0, seed=None, bits: int = 16
              ) -> jax.Array:
  """What the kernels compute, written as the explicit path computes attention (float32
  softmax, probabilities dropped by `keep_mask`, cast to v's dtype for the product)."""
  scale = 1.0 / math.sqrt(query.shape[-1])
  logits = jnp.einsum("btnd,bsnd->bnts", query, key,
                      preferred_element_type=jnp.float32,
                      precision=jax.lax.Precision.HIGHEST) * scale
  allowed = (ids[:, :, None] == ids[:, None, :])[:, None]
  probs = jax.nn.softmax(jnp.where(allowed, logits, -1e9), axis=-1)
  if dropout_rate > 0:
    keep, keep_prob = keep_mask(seed, probs.shape, dropout_rate, bits)
    probs = jnp.where(keep, probs / keep_prob, 0.0)
  return jnp.einsum("bnts,bsnd->btnd", probs.astype(value.dtype), value,
                    preferred_element_type=jnp.float32,
                    precision=jax.lax.Precision.HIGHEST).astype(query.dtype)
