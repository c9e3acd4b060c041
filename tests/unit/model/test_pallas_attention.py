"""The Pallas attention kernels with dropout inside (`pallas_attention.flash_attention`): without
dropout they are the explicit path; with it, the dropped probabilities (read back by attending
to identity values, so that the output *is* the probability matrix) keep the right fraction,
scaled exactly, with masks that follow the seed and the position, and the backward kernel
regenerates the forward's mask. Off a TPU the kernels run in the TPU interpreter with Threefry
bits; both bit sources are lowered for a TPU, which runs Mosaic's lowering of the kernels.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jax_core

from bert_jax.model import modeling, pallas_attention
from tests import helpers

BATCH, LENGTH, HEADS, HEAD_DIM = 2, 256, 2, 16  # two query blocks of 128 per row
RATE = 0.1
SEED = 1234
TOLERANCE = 1e-5
THRESHOLD, KEEP_PROB = pallas_attention.dropout_threshold(RATE)


def _qkv(seed=0, head_dim=HEAD_DIM, shape=(BATCH, LENGTH, HEADS)):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  return tuple(jax.random.normal(k, (*shape, head_dim), jnp.float32) for k in keys)


def _rows(kind: str):
  """(input_mask, sequence_ids or None, segment ids for the kernel): right-padded unpacked
  rows, or packed rows of several instances each, padded at the end."""
  input_mask = np.ones((BATCH, LENGTH), np.int32)
  if kind == "unpacked":
    input_mask[0, 200:] = 0
    input_mask[1, 77:] = 0
    return input_mask, None, input_mask.copy()
  sequence_ids = np.zeros((BATCH, LENGTH), np.int32)
  sequence_ids[0, :90], sequence_ids[0, 90:150], sequence_ids[0, 150:230] = 1, 2, 3
  sequence_ids[1, :140], sequence_ids[1, 140:] = 1, 2
  input_mask = (sequence_ids > 0).astype(np.int32)
  return input_mask, sequence_ids, sequence_ids.copy()


def _real(x, input_mask):
  """Outputs at real query positions only: no path defines what padding queries see."""
  return jnp.where(jnp.asarray(input_mask)[:, :, None, None] > 0, x, 0.0)


def _max_abs(a, b):
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _loss_and_grads(attention, q, k, v, input_mask, cotangent):
  def loss(q, k, v):
    out = attention(q, k, v)
    return jnp.sum(_real(out, input_mask) * cotangent), out
  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  return out, grads


@jax.jit
def _kernel_and_grads(q, k, v, ids, input_mask, cotangent):
  return _loss_and_grads(lambda q, k, v: pallas_attention.flash_attention(q, k, v, ids),
                         q, k, v, input_mask, cotangent)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["unpacked", "packed"])
def test_without_dropout_equals_the_explicit_path(kind):
  input_mask, sequence_ids, ids = _rows(kind)
  q, k, v = _qkv()
  cotangent = jax.random.normal(jax.random.PRNGKey(9), q.shape)
  mask = modeling.attention_mask(jnp.asarray(input_mask),
                                 None if sequence_ids is None else jnp.asarray(sequence_ids))
  explicit = lambda q, k, v: modeling._explicit_attention(q, k, v, mask, 0.0, None)
  out, grads = _kernel_and_grads(q, k, v, jnp.asarray(ids), input_mask, cotangent)
  ref_out, ref_grads = jax.jit(functools.partial(_loss_and_grads, explicit))(
      q, k, v, input_mask, cotangent)
  assert _max_abs(_real(out, input_mask), _real(ref_out, input_mask)) <= TOLERANCE
  assert _max_abs(grads, ref_grads) <= TOLERANCE
  assert all(float(jnp.max(jnp.abs(g))) > 0.01 for g in grads)
  # The comparison can fail: attending across segments (or to padding) is another answer.
  everything = modeling._explicit_attention(q, k, v, jnp.ones((1, 1, 1, 1), bool), 0.0, None)
  assert _max_abs(_real(everything, input_mask), _real(ref_out, input_mask)) > 0.1


# --- Dropout, read back through identity values: out[b, i, h, j] = dropped probs[b, h, i, j].

@functools.partial(jax.jit, static_argnames=("rate", "block_q"))
def _probability_matrix(seed, rate=RATE, block_q=None):
  """(batch, heads, length, length) dropped probabilities of random queries and keys over
  whole rows (one segment), for `seed`."""
  q, k, _ = _qkv(seed=1, head_dim=LENGTH)
  identity = jnp.broadcast_to(jnp.eye(LENGTH)[None, :, None, :], q.shape)
  ids = jnp.ones((BATCH, LENGTH), jnp.int32)
  out = pallas_attention.flash_attention(q, k, identity, ids, dropout_rate=rate, seed=seed,
                                         block_q=block_q)
  return jnp.swapaxes(out, 1, 2)


@pytest.fixture(scope="module")
def probabilities():
  return np.asarray(_probability_matrix(jnp.int32(0), rate=0.0))


@pytest.fixture(scope="module")
def dropped():
  return np.asarray(_probability_matrix(jnp.int32(SEED)))


def test_dropout_keeps_the_right_fraction_and_scales_kept_probabilities_exactly(
    probabilities, dropped):
  assert np.allclose(probabilities.sum(-1), 1.0, atol=1e-5)
  assert probabilities.min() > 0.0  # so a zero below means "dropped"
  kept = dropped != 0.0
  standard_error = math.sqrt(KEEP_PROB * (1.0 - KEEP_PROB) / kept.size)
  assert abs(kept.mean() - KEEP_PROB) < 4 * standard_error, (kept.mean(), KEEP_PROB)
  assert KEEP_PROB == 1.0 - THRESHOLD / 2**32 and THRESHOLD == round(RATE * 2**32)
  # Kept probabilities are the softmax's times 1/keep_prob, exactly (float32 arithmetic).
  np.testing.assert_array_equal(dropped[kept],
                                (probabilities * np.float32(1.0 / KEEP_PROB))[kept])


def test_masks_follow_the_seed_and_the_position(dropped):
  kept = dropped != 0.0
  again = np.asarray(_probability_matrix(jnp.int32(SEED)))
  np.testing.assert_array_equal(again, dropped)  # a resumed run draws the same masks
  other_seed = np.asarray(_probability_matrix(jnp.int32(SEED + 1))) != 0.0
  # Independent masks of keep rate 0.9 disagree on 2 * 0.9 * 0.1 = 18% of their elements.
  disagree = lambda a, b: float(np.mean(a != b))
  assert 0.15 < disagree(kept, other_seed) < 0.21
  half = LENGTH // 2
  block = lambda b, h, q_block: kept[b, h, q_block * half:(q_block + 1) * half]
  for other in (block(1, 0, 0), block(0, 1, 0), block(0, 0, 1), block(1, 1, 1)):
    assert 0.15 < disagree(block(0, 0, 0), other) < 0.21
  # Threefry's counters are element positions: the block size does not change the mask.
  np.testing.assert_array_equal(
      np.asarray(_probability_matrix(jnp.int32(SEED), block_q=2 * 128)), dropped)


@jax.jit
def _dropped_kernel_and_grads(q, k, v, ids, input_mask, cotangent, seed):
  return _loss_and_grads(
      lambda q, k, v: pallas_attention.flash_attention(q, k, v, ids, dropout_rate=RATE,
                                                       seed=seed),
      q, k, v, input_mask, cotangent)


def test_backward_regenerates_the_forward_mask(dropped):
  """Gradients equal those of the explicit math multiplied by the forward's recovered mask
  (the mask depends on the seed and the positions, not on the values)."""
  keep = jnp.asarray(dropped != 0.0)
  input_mask, sequence_ids, ids = _rows("packed")
  q, k, v = _qkv(seed=2)
  cotangent = jax.random.normal(jax.random.PRNGKey(9), q.shape)
  allowed = modeling.attention_mask(jnp.asarray(input_mask), jnp.asarray(sequence_ids))

  def explicit(q, k, v):
    logits = jnp.einsum("btnd,bsnd->bnts", q, k) / math.sqrt(HEAD_DIM)
    probs = jax.nn.softmax(jnp.where(allowed, logits, modeling.MASKED_LOGIT), axis=-1)
    probs = jnp.where(keep, probs * np.float32(1.0 / KEEP_PROB), 0.0)
    return jnp.einsum("bnts,bsnd->btnd", probs, v)

  out, grads = _dropped_kernel_and_grads(q, k, v, jnp.asarray(ids), input_mask, cotangent,
                                         jnp.int32(SEED))
  ref_out, ref_grads = jax.jit(functools.partial(_loss_and_grads, explicit))(
      q, k, v, input_mask, cotangent)
  assert _max_abs(_real(out, input_mask), _real(ref_out, input_mask)) <= TOLERANCE
  assert _max_abs(grads, ref_grads) <= TOLERANCE
  # Can fail: another seed's mask gives other gradients.
  _, other = _dropped_kernel_and_grads(q, k, v, jnp.asarray(ids), input_mask, cotangent,
                                       jnp.int32(SEED + 1))
  assert _max_abs(other, ref_grads) > 0.01


def test_the_mean_over_seeds_is_the_output_without_dropout(probabilities):
  """Each element of a draw (the output for identity values) is p m / keep_prob with
  m ~ Bernoulli(keep_prob), independent across elements and seeds: its mean is p, the output
  without dropout, and its variance p² (1 - keep_prob) / keep_prob, so the mean of n draws is
  off by z standard errors, z of mean 0 and variance 1 (binomial, not normal, for small n)."""
  n = 8
  draws = np.stack([np.asarray(_probability_matrix(jnp.int32(100 + s))) for s in range(n)])
  exact = probabilities.astype(np.float64)
  error = draws.astype(np.float64).mean(0) - exact
  z = error / np.sqrt(exact**2 * (1.0 - KEEP_PROB) / KEEP_PROB / n)
  # Over 2.6e5 independent elements, mean(z) and mean(z²) have standard errors ~0.002-0.005.
  assert abs(z.mean()) < 0.02 and abs(np.mean(z**2) - 1.0) < 0.03, (z.mean(), np.mean(z**2))
  # The outputs for other values, by linearity: the mean's error is ~1/√n a single draw's.
  v = np.asarray(_qkv(seed=3)[2], np.float64)
  output_error = lambda probs: np.abs(np.einsum("bnts,bsnd->btnd", probs, v)).mean()
  assert output_error(error) < output_error(draws[0] - exact) / 2


def _kernel_primitives(rate, prng, interpret):
  """Names of the primitives inside the kernels of a forward and backward pass."""
  q, k, v = _qkv(shape=(1, 128, 1))
  ids = jnp.ones((1, 128), jnp.int32)
  loss = lambda q: jnp.sum(pallas_attention.flash_attention(
      q, k, v, ids, dropout_rate=rate, seed=jnp.int32(5), prng=prng, interpret=interpret))
  jaxpr = jax.make_jaxpr(jax.grad(loss))(q)
  names = set()

  def visit(jaxpr):
    for eqn in jaxpr.eqns:
      names.add(eqn.primitive.name)
      for sub in jax_core.jaxprs_in_params(eqn.params):
        visit(sub)
  visit(jaxpr.jaxpr)
  return names


def test_a_zero_rate_draws_no_bits():
  assert {"pallas_call", "threefry2x32"} <= _kernel_primitives(RATE, "threefry", None)
  assert {"prng_seed", "prng_random_bits"} <= _kernel_primitives(RATE, "hardware", False)
  for prng, interpret in (("threefry", None), ("hardware", False)):
    names = _kernel_primitives(0.0, prng, interpret)
    assert "pallas_call" in names
    assert not names & {"threefry2x32", "prng_seed", "prng_random_bits"}, names


@pytest.mark.parametrize("prng", ["hardware", "threefry"])
def test_kernels_lower_for_tpu(prng):
  """BERT-base's attention shapes in bfloat16, with dropout and packed segment ids, through
  Mosaic's lowering of both kernels (forward, and forward + backward under `jax.grad`)."""
  q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(head_dim=64, shape=(2, 512, 2)))
  ids = jnp.asarray(np.repeat(np.array([[1] * 200 + [2] * 250 + [0] * 62]), 2, axis=0))
  attend = lambda q, k, v, seed: pallas_attention.flash_attention(
      q, k, v, ids, dropout_rate=RATE, seed=seed, prng=prng, interpret=False)
  loss = lambda q, k, v, seed: jnp.sum(attend(q, k, v, seed).astype(jnp.float32))
  for fn, kernels in ((attend, 1), (jax.grad(loss, argnums=(0, 1, 2)), 2)):
    lowered = jax.jit(fn).trace(q, k, v, jnp.int32(7)).lower(lowering_platforms=("tpu",))
    text = lowered.as_text()
    assert text.count("tpu_custom_call") == kernels, text.count("tpu_custom_call")
    assert "bert_attention_dropout_fwd" in text
    assert ("bert_attention_dropout_bwd" in text) == (kernels == 2)


def test_refusals():
  q, k, v = _qkv(shape=(1, 96, 1))
  with pytest.raises(ValueError, match="multiple of 128"):
    pallas_attention.flash_attention(q, k, v, jnp.ones((1, 96), jnp.int32))
  q, k, v = _qkv(shape=(1, 128, 1))
  ids = jnp.ones((1, 128), jnp.int32)
  with pytest.raises(ValueError, match="interpret mode"):
    pallas_attention.flash_attention(q, k, v, ids, dropout_rate=RATE, seed=jnp.int32(1),
                                     prng="hardware", interpret=True)
  with pytest.raises(ValueError, match="needs a seed"):
    pallas_attention.flash_attention(q, k, v, ids, dropout_rate=RATE)
  with pytest.raises(ValueError, match="block_q"):
    pallas_attention.flash_attention(q, k, v, ids, block_q=192)


@pytest.mark.mesh
@pytest.mark.slow
def test_the_model_under_a_mesh_gives_every_shard_its_own_masks():
  """The encoder with `attention_implementation="pallas"` and attention dropout, data-parallel
  over 4 devices (the kernel runs per shard in `shard_map`): 4 identical rows, one per device,
  come out different (each shard folds its index into the seed), the same key gives the same
  outputs, and another key other ones. (Four of the 8 fake devices: the TPU interpreter, which
  runs every shard's kernel on the host, stalls with 8 shards on a 2-core machine.)"""
  from bert_jax.model import configuration  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import tpu as pltpu  # pylint: disable=g-import-not-at-top
  cfg = configuration.get_preset("test", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.1,
                                 attention_implementation="pallas", max_position_embeddings=128,
                                 num_hidden_layers=1)
  # The kernel without dropout (init) runs in the TPU interpreter.
  helpers.assert_every_shard_draws_its_own_masks(
      helpers.sharded_dropout_outputs(cfg, 128, pltpu.force_tpu_interpret_mode))
