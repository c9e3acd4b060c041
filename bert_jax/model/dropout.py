"""Dropout, the one implementation every module uses (encoder, attention's explicit path, heads).

Why not `flax.linen.Dropout`: it draws one random 32-bit word per element and compares it as a
float, and on an accelerator those random words are a visible part of the step (about 8% of a
BERT-base step on an H100, `benchmarks/RESULTS.md`). Here a keep/drop decision takes
`dropout_bits` bits (16 by default: two decisions per random word, 8: four), compared as an
unsigned integer against a threshold. The threshold quantises the rate to 1/2^bits (0.1 becomes
6554/65536 = 0.100006 at 16 bits); kept values are scaled by the *exact* inverse of the fraction
the threshold keeps, so the expected output equals the input exactly, whatever the quantisation.

The mask is kept between the forward and backward passes as one bit per element (`dropout`).

Masks come from the "dropout" RNG stream that the step folds the step number into, so a resumed
run draws exactly the masks an uninterrupted one would.

The GPU kernels that drop values themselves (the fused LayerNorm sites, the Triton attention)
never store a mask: each element's bits are a hash of (seed, row, column) (`hash_bits`), drawn
again in the backward pass, and decided by the same threshold rule, 32 // bits decisions per
hash (`hash_keep_words`, `hash_keep_at`).
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

DROPOUT_BITS = (8, 16, 32)


def threshold(rate: float, bits: int) -> tuple[int, float]:
  """(integer threshold, exact keep probability): drop where a uniform `bits`-bit draw is below
  the threshold (the rule of this module and of the Pallas kernel's in-kernel draws)."""
  levels = 1 << bits
  cut = min(levels - 1, max(0, round(rate * levels)))
  return cut, 1.0 - cut / levels


def keep_probability(rate: float, bits: int = 16) -> float:
  """The fraction of elements a mask of `rate` at `bits` bits keeps (exactly)."""
  return threshold(rate, bits)[1]


def _uniform_ints(rng: jax.Array, shape: tuple[int, ...], bits: int) -> jax.Array:
  """`shape` unsigned integers of `bits` bits each, cut from 32-bit random words.

  Words are drawn for the flattened array (32/bits decisions per word) and split with shifts,
  which XLA fuses into the consumer; the result is uint32 holding values < 2^bits.
  """
  size = math.prod(shape)
  words = jax.random.bits(rng, (-(-size // (32 // bits)),), jnp.uint32)
  return word_fields(words, bits)[:size].reshape(shape)


def word_fields(words: jax.Array, bits: int) -> jax.Array:
  """The `bits`-bit fields of each uint32 word, lowest first, side by side on the last axis:
  (..., n) -> (..., n * 32 // bits), uint32 values below 2^bits. How every word of random bits
  is cut into keep/drop decisions, `jax.random`'s here and the kernels' hashes
  (`hash_keep_words`); written in operations both XLA and Triton lower."""
  per_word = 32 // bits
  if per_word == 1:
    return words
  field = jnp.uint32((1 << bits) - 1)
  parts = [(words >> jnp.uint32(bits * i)) & field for i in range(per_word)]
  return jnp.stack(parts, axis=-1).reshape(*words.shape[:-1], words.shape[-1] * per_word)


def keep_mask(rng: jax.Array, shape: tuple[int, ...], rate: float, bits: int = 16
              ) -> tuple[jax.Array, float]:
  """`(mask, keep_probability)`: a boolean mask keeping each element with probability
  `keep_probability` (1 - rate, quantised to 1/2^bits)."""
  if bits not in DROPOUT_BITS:
    raise ValueError(f"dropout_bits={bits}; expected one of {DROPOUT_BITS}.")
  cut, keep = threshold(rate, bits)
  return _uniform_ints(rng, tuple(shape), bits) >= jnp.uint32(cut), keep


def pack_mask(mask: jax.Array) -> jax.Array:
  """A boolean mask whose last axis is a multiple of 8, as one bit per element: uint8, the
  last axis an eighth as long (bit j of byte i holds element 8i + j)."""
  groups = mask.reshape(*mask.shape[:-1], mask.shape[-1] // 8, 8).astype(jnp.uint8)
  return jnp.sum(groups << jnp.arange(8, dtype=jnp.uint8), axis=-1, dtype=jnp.uint8)


def unpack_mask(packed: jax.Array) -> jax.Array:
  """`pack_mask`'s inverse."""
  bits = (packed[..., None] >> jnp.arange(8, dtype=jnp.uint8)) & jnp.uint8(1)
  return bits.reshape(*packed.shape[:-1], packed.shape[-1] * 8).astype(jnp.bool_)


def _kept_as_bits(keep: jax.Array) -> jax.Array:
  """`keep`, through one bit per element where its last axis is a multiple of 8."""
  return unpack_mask(pack_mask(keep)) if keep.ndim and keep.shape[-1] % 8 == 0 else keep


def dropout(x: jax.Array, rate: float, rng: jax.Array, bits: int = 16) -> jax.Array:
  """`x` with elements dropped at `rate` and the kept ones scaled by 1/keep, in x's dtype.

  The mask passes through one bit per element (`pack_mask`) where the last axis allows: the
  compiler then keeps those bits for the kernels that read the mask again (the rest of the
  forward pass and the backward pass), an eighth of the byte per element it kept before. The
  mask itself is the same. Measured on compiled programs (`benchmarks/gpu_compile_table.py`):
  BERT-base/128 moves 2.1 GB per step less on an H100 (cuDNN attention) and 4.5 GB less on a
  TPU v6e (attention dropout on the explicit path), at 0.5 and 5.3 GiB less peak memory."""
  if rate <= 0.0:
    return x
  if rate >= 1.0:
    return jnp.zeros_like(x)
  keep, keep_prob = keep_mask(rng, x.shape, rate, bits)
  keep = _kept_as_bits(keep)
  return jnp.where(keep, x * jnp.asarray(1.0 / keep_prob, x.dtype), jnp.zeros((), x.dtype))


class Dropout(nn.Module):
  """`flax.linen.Dropout`'s interface (`rate`, `deterministic`, the "dropout" stream), with
  `bits` bits per decision (see the module docstring)."""
  rate: float
  bits: int = 16

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    if deterministic or self.rate <= 0.0:
      return x
    return dropout(x, self.rate, self.make_rng("dropout"), self.bits)


# ------------------------------------------------------- the bits the GPU kernels draw themselves
_GOLDEN = 0x9E3779B9  # 2^32 / golden ratio: spreads column indices over the word
_SHARD_SPREAD = 0x9E3779B1


def _fmix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finaliser: a bijection of uint32 in which every input bit flips every
  output bit with probability about 1/2."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def hash_bits(key0: jax.Array, key1: jax.Array, rows: jax.Array, cols: jax.Array
              ) -> jax.Array:
  """The 32 random bits of element (row, col) under the seed (key0, key1), as uint32.

  A pure function of its arguments, written in operations both Triton and XLA lower, so the
  kernels and their references compute the same bits. Distinct (row, col) under one seed give
  distinct inputs to the last bijective round (the row's hash is xored with the column times an
  odd constant), and the seed enters both rounds."""
  row_hash = _fmix32(rows.astype(jnp.uint32) ^ key0.astype(jnp.uint32))
  return _fmix32((row_hash ^ (cols.astype(jnp.uint32) * jnp.uint32(_GOLDEN)))
                 + key1.astype(jnp.uint32))


def hash_keep_words(h: jax.Array, cut: int, bits: int) -> jax.Array:
  """The keep/drop decisions that every hash of `h` (uint32, (..., n)) holds, 32 // bits of
  them (`word_fields`): (..., n * 32 // bits). One hash per decision would cost two (16 bits)
  or four (8) times the integer work. What the kernels draw a block at a time; `hash_keep_at`
  is the same rule element by element."""
  return word_fields(h, bits) >= jnp.uint32(cut)


def hash_keep_at(seed: jax.Array, rows: jax.Array, cols: jax.Array, cut: int, bits: int
                 ) -> jax.Array:
  """Whether element (row, col) is kept under `seed` (two uint32 words): field col % per_word
  (lowest first) of the hash of (row, col // per_word), per_word = 32 // bits; the kernels'
  masks (`hash_keep_words`), computed element by element for their references."""
  per_word = 32 // bits
  words = hash_bits(seed[0], seed[1], rows, cols // per_word)
  shift = (bits * (cols % per_word)).astype(jnp.uint32)
  field = jnp.uint32((1 << bits) - 1 if bits < 32 else 0xFFFFFFFF)
  return ((words >> shift) & field) >= jnp.uint32(cut)


def shard_seed(seed: jax.Array, shard: jax.Array) -> jax.Array:
  """`seed` (two uint32 words) for one shard of a kernel split over devices: each shard's rows
  count from 0, so its index goes into the seed, and no two shards draw the same mask."""
  spread = (shard.astype(jnp.uint32) + 1) * jnp.uint32(_SHARD_SPREAD)
  return seed.astype(jnp.uint32) ^ jnp.stack([spread, jnp.zeros_like(spread)])
