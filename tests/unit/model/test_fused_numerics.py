"""The cheaper elementwise work of the step, checked against the reference math.

Dropout with 8/16/32 bits per decision keeps the right fraction and scales exactly; masks differ
across steps and layers and repeat for the same step (a resumed run draws the same ones). The
fused residual-add + LayerNorm equals flax's LayerNorm forward and backward in float32, keeps
float32 statistics under bfloat16, and leaves the whole model's loss and gradients unchanged in
float32. A short real run (Shakespeare records from data_prep) in bfloat16 with the low-precision
residual stream tracks the float32 run within the spread two float32 runs of different dropout
seeds show. cuDNN's attention dropout gets a distinct static seed per layer, and the layouts
under which its masks could not be regenerated are refused. GELU recomputed in its backward pass
and the masked-LM cross-entropy written without a gather give the reference's values and
gradients, float32 scores (the tied decoder's, attention's) take their gradient in the
compute dtype, and an attention block's input gradient is summed in the order XLA's GPU
compiler folds into its GEMMs.
"""

import glob
import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import configuration, dropout, modeling
from bert_jax.objectives import mlm, mlm_nsp
from bert_jax.parallel import sharding
from bert_jax.text import features
from bert_jax.training import optimizer
from bert_jax.training import state as state_lib
from bert_jax.training import step as step_lib
from data_prep import create_pretraining_data as cpd
from data_prep import demo_corpus
from tests import helpers

SEQ, PRED = 64, 10
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=128)


# ------------------------------------------------------------- GELU and the masked-LM loss
@pytest.mark.parametrize("name, approximate", [("gelu", False), ("gelu_new", True)])
def test_recomputed_gelu_gives_the_references_values_and_gradients(name, approximate):
  x = jax.random.normal(jax.random.PRNGKey(0), (4, 16, 32), jnp.float32) * 3
  weights = jax.random.normal(jax.random.PRNGKey(1), x.shape, jnp.float32)
  ours = modeling.activation_fn(name)
  ref = lambda v: jax.nn.gelu(v, approximate=approximate)
  np.testing.assert_allclose(ours(x), ref(x), rtol=1e-6, atol=1e-7)
  grad = lambda f: np.asarray(jax.grad(lambda v: jnp.sum(f(v) * weights))(x))
  # The derivative in float64: within float32 rounding of it, as close as jax's own
  # differentiation of jax.nn.gelu (closer for the tanh form, whose 1 - tanh^2 jax rounds).
  v = np.asarray(x, np.float64)
  if approximate:
    t = np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3))
    slope = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * np.sqrt(2 / np.pi) * (1 + 3 * 0.044715 * v * v)
  else:
    cdf = 0.5 * (1 + np.vectorize(math.erf)(v / np.sqrt(2)))
    slope = cdf + v * np.exp(-0.5 * v * v) / np.sqrt(2 * np.pi)
  exact = slope * np.asarray(weights, np.float64)
  np.testing.assert_allclose(grad(ours), exact, rtol=1e-5, atol=1e-6)
  assert np.abs(grad(ours) - exact).max() <= 2 * np.abs(grad(ref) - exact).max() + 1e-7
  # Its backward keeps the input alone: no residual of the forward's intermediate terms.
  residuals = jax.vjp(ours, x)[1]
  kept = [a for a in jax.tree.leaves(residuals) if hasattr(a, "shape") and a.size > 1]
  assert len(kept) == 1 and kept[0].shape == x.shape


def test_exact_gelu_on_bfloat16_is_the_float32_value_rounded_once():
  """bfloat16 in and out, the erfc computed in float32: each value is float32 GELU of the
  input rounded once to bfloat16 (jax.nn.gelu rounds erfc's argument to bfloat16 first)."""
  x = (jax.random.normal(jax.random.PRNGKey(0), (64, 256)) * 3).astype(jnp.bfloat16)
  y = modeling.activation_fn("gelu")(x)
  assert y.dtype == jnp.bfloat16
  expected = jax.nn.gelu(x.astype(jnp.float32), approximate=False).astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(expected, np.float32))


def test_cross_entropy_equals_log_softmax_at_the_label_with_its_gradient():
  key = jax.random.PRNGKey(0)
  logits = jax.random.normal(key, (3, 5, 97), jnp.float32) * 4
  logits = logits.at[0, 0].multiply(1e3)  # far from zero: the maximum must be taken out
  logits = logits.at[1, 2, 7].set(logits[1, 2].max())  # a tie: the first index wins
  labels = jax.random.randint(jax.random.PRNGKey(1), (3, 5), 0, 97)
  weights = jax.random.uniform(jax.random.PRNGKey(2), (3, 5))

  def ref(z):
    log_probs = jax.nn.log_softmax(z, axis=-1)
    return -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]

  loss, top = mlm.cross_entropy(logits, labels)
  np.testing.assert_allclose(loss, ref(logits), rtol=1e-6, atol=1e-5)
  np.testing.assert_array_equal(top, jnp.argmax(logits, axis=-1))
  assert np.all(np.isfinite(loss))
  # One pass over the logits: loss and prediction from a single reduction.
  text = jax.jit(lambda z: mlm.cross_entropy(z, labels)).lower(logits).as_text()
  assert text.count("stablehlo.reduce") == 1, text.count("stablehlo.reduce")
  grad = lambda f: jax.grad(lambda z: jnp.sum(weights * f(z)))(logits)
  np.testing.assert_allclose(grad(lambda z: mlm.cross_entropy(z, labels)[0]), grad(ref),
                             rtol=1e-5, atol=1e-6)
  # bfloat16 logits are read in float32, and their gradient is bfloat16.
  half = logits.astype(jnp.bfloat16)
  loss = mlm.cross_entropy(half, labels)[0]
  assert loss.dtype == jnp.float32
  np.testing.assert_allclose(loss, ref(half.astype(jnp.float32)), rtol=1e-6, atol=1e-4)
  assert jax.grad(lambda z: jnp.sum(mlm.cross_entropy(z, labels)[0]))(half).dtype == jnp.bfloat16


@pytest.mark.parametrize("spec, a_shape, b_shape", [
    ("...h,vh->...v", (3, 4, 16), (37, 16)),         # the tied decoder's scores
    ("btnd,bsnd->bnts", (2, 5, 3, 8), (2, 6, 3, 8)),  # attention's q·k
])
def test_float32_scores_take_their_gradient_in_the_operands_dtype(spec, a_shape, b_shape):
  """`modeling.float32_einsum`: in float32 autodiff's values and gradients; with bfloat16
  operands (b a float32 weight cast, as the tied table) float32 scores, and a backward whose
  matmuls read only bfloat16 and give the autodiff gradient of the rounded cotangent."""
  ka, kb, kw = jax.random.split(jax.random.PRNGKey(3), 3)
  a, b = jax.random.normal(ka, a_shape), jax.random.normal(kb, b_shape)
  out_shape = jax.eval_shape(lambda a, b: jnp.einsum(spec, a, b), a, b).shape
  w = jax.random.normal(kw, out_shape)
  plain = lambda spec, a, b: jnp.einsum(spec, a, b.astype(a.dtype),
                                        preferred_element_type=jnp.float32)
  ours = modeling.float32_einsum
  loss = lambda f: lambda a, b: jnp.sum(w * f(spec, a, b))
  np.testing.assert_array_equal(ours(spec, a, b), plain(spec, a, b))
  for got, want in zip(jax.grad(loss(ours), (0, 1))(a, b), jax.grad(loss(plain), (0, 1))(a, b)):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

  half = a.astype(jnp.bfloat16)
  assert ours(spec, half, b).dtype == jnp.float32
  np.testing.assert_array_equal(ours(spec, half, b), plain(spec, half, b))
  grads = jax.grad(loss(ours), (0, 1))
  da, db = grads(half, b)
  assert (da.dtype, db.dtype) == (jnp.bfloat16, jnp.float32)
  # What the backward computes: the rounded cotangent against the rounded operands, in float32.
  rounded = lambda x: x.astype(jnp.bfloat16).astype(jnp.float32)
  exact = jax.grad(lambda a, b: jnp.sum(rounded(w) * jnp.einsum(spec, a, b)), (0, 1))(
      half.astype(jnp.float32), rounded(b))
  np.testing.assert_allclose(np.asarray(da, np.float32), exact[0], rtol=1e-2, atol=1e-2)
  np.testing.assert_allclose(db, exact[1], rtol=1e-5, atol=1e-5)
  # Every matmul of the step reads bfloat16 operands; differentiated as written, the
  # backward's read the float32 cotangent.
  operand_types = lambda f: {v.aval.dtype for e in _equations(jax.make_jaxpr(f)(half, b).jaxpr)
                             if e.primitive.name == "dot_general" for v in e.invars}
  assert operand_types(grads) == {jnp.dtype(jnp.bfloat16)}
  assert jnp.dtype(jnp.float32) in operand_types(jax.grad(loss(plain), (0, 1)))


def test_fan_out_sums_its_gradients_latest_consumer_first():
  """`modeling.fan_out`: copies forward; backward, the gradients' sum, each add taking the
  later consumer's gradient as its first operand onto the sum of those before it (the order in
  which XLA's GPU compiler folds each add into the GEMM that produced its first operand).
  Attention blocks take it where the program is built for GPUs only."""
  x = jax.random.normal(jax.random.PRNGKey(0), (3, 5))
  weights = [jax.random.normal(jax.random.PRNGKey(i + 1), (3, 5)) for i in range(4)]
  loss = lambda copies: sum(jnp.sum(w * jnp.tanh(c)) for w, c in zip(weights, copies))
  copies = modeling.fan_out(x, 4)
  assert len(copies) == 4 and all(c is x or np.array_equal(c, x) for c in copies)
  np.testing.assert_allclose(jax.grad(lambda x: loss(modeling.fan_out(x, 4)))(x),
                             jax.grad(lambda x: loss((x,) * 4))(x), rtol=1e-6, atol=1e-6)
  # The backward alone, on cotangents that tell the operands apart.
  grads = tuple(jnp.full((2,), float(10 ** i)) for i in range(4))
  _, vjp = jax.vjp(lambda x: modeling.fan_out(x, 4), x[0, :2])
  adds = [e for e in _equations(jax.make_jaxpr(vjp)(grads).jaxpr)
          if e.primitive.name in ("add", "add_any")]
  assert len(adds) == 3, adds
  np.testing.assert_array_equal(vjp(grads)[0], jnp.full((2,), 1111.0))
  # g3 + g0 first, then g2 onto it, then g1: each add's second operand is the previous sum.
  assert all(a.invars[1] is prev.outvars[0] for a, prev in zip(adds[1:], adds)), adds
  # An attention block takes it on GPUs only (`test_gpu_compile.py` compiles one): traced for
  # this CPU, as for a TPU, autodiff sums the gradients as it does.
  fanned = lambda f: "fan_out" in str(jax.make_jaxpr(jax.grad(f))(x))
  assert fanned(lambda x: sum(jnp.sum(c) for c in modeling.fan_out(x, 2)))
  cfg = configuration.get_preset("tiny")
  block, tokens = modeling.BertAttention(cfg), jnp.ones((1, 4, cfg.hidden_size))
  mask = jnp.ones((1, 4), jnp.int32)
  params = block.init(jax.random.PRNGKey(0), tokens, mask, True)
  assert not fanned(lambda x: jnp.sum(block.apply(params, tokens + x[0, 0], mask, True)))


@pytest.mark.slow
def test_the_head_checks_pass_on_the_cpu(tmp_path):
  """`benchmarks/head_checks.py`, which the GPU suite runs with its checks: at small shapes on
  the CPU every check passes and the loss is timed against its two-pass form."""
  text = helpers.run_device_checks("head_checks.py", tmp_path / "checks.md", "--positions=64",
                                   "--vocab=512", "--hidden=64", "--steps=1", "--repeats=1")
  assert text.count("- PASS") == 7 and "FAIL" not in text, text
  assert "ms in one pass" in text and "ms in two" in text, text


def _equations(jaxpr):
  """Every equation of a jaxpr, those of the jaxprs inside it (custom rules, jit) included."""
  for e in jaxpr.eqns:
    yield e
    for param in e.params.values():
      for inner in (param if isinstance(param, (list, tuple)) else [param]):
        inner = getattr(inner, "jaxpr", inner)
        if hasattr(inner, "eqns"):
          yield from _equations(inner)


# ------------------------------------------------------------------------------------ dropout
@pytest.mark.parametrize("bits", [8, 16, 32])
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_keeps_the_quantised_fraction_and_scales_exactly(bits, rate):
  x = jnp.full((257, 301), 3.0, jnp.float32)  # odd sizes: words split across rows
  y = dropout.dropout(x, rate, jax.random.PRNGKey(7), bits)
  keep = dropout.keep_probability(rate, bits)
  assert abs(keep - (1 - rate)) <= 2.0 ** -bits
  kept = np.asarray(y) != 0
  n = kept.size
  assert abs(kept.mean() - keep) <= 5 * np.sqrt(keep * (1 - keep) / n)
  np.testing.assert_array_equal(np.asarray(y)[kept], np.float32(3.0) * np.float32(1.0 / keep))
  # Neighbours (the parts of one random word) are independent: P(both kept) = keep².
  both = (kept[:, :-1] & kept[:, 1:]).mean()
  assert abs(both - keep ** 2) <= 5 * np.sqrt(keep ** 2 * (1 - keep ** 2) / n)


@pytest.mark.parametrize("bits", [8, 16, 32])
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_the_kernels_hash_keeps_the_quantised_fraction_with_independent_neighbours(bits, rate):
  """The GPU kernels' mask (`dropout.hash_keep_at`; `hash_keep_words` draws it a block at a
  time): 32 // bits decisions from each hash, every one keeping the quantised fraction, and
  neighbours, whether they share a hash or not, independent: P(both kept) = keep² for every
  offset within and across words. The block form equals it element for element."""
  seed = jnp.asarray([0x1234, 0xBEEF], jnp.uint32)
  cut, keep = dropout.threshold(rate, bits)
  rows = jax.lax.broadcasted_iota(jnp.int32, (512, 1024), 0)
  cols = jax.lax.broadcasted_iota(jnp.int32, (512, 1024), 1)
  kept = np.asarray(dropout.hash_keep_at(seed, rows, cols, cut, bits))
  n = kept.size
  assert abs(kept.mean() - keep) <= 5 * np.sqrt(keep * (1 - keep) / n)
  for offset in (1, 2, 3, 4, 5):
    both = (kept[:, :-offset] & kept[:, offset:]).mean()
    assert abs(both - keep ** 2) <= 5 * np.sqrt(keep ** 2 * (1 - keep ** 2) / n), offset
  words = dropout.hash_bits(seed[0], seed[1], rows[:, :1024 // (32 // bits)],
                            cols[:, :1024 // (32 // bits)])
  np.testing.assert_array_equal(np.asarray(dropout.hash_keep_words(words, cut, bits)), kept)
  # Another seed is another mask.
  other = np.asarray(dropout.hash_keep_at(seed ^ jnp.uint32(1), rows, cols, cut, bits))
  assert abs((other == kept).mean() - (keep ** 2 + (1 - keep) ** 2)) < 0.01


def test_dropout_masks_follow_the_key_and_keep_the_dtype():
  x = jnp.ones((64, 64), jnp.bfloat16)
  a = dropout.dropout(x, 0.1, jax.random.PRNGKey(1))
  b = dropout.dropout(x, 0.1, jax.random.PRNGKey(1))
  c = dropout.dropout(x, 0.1, jax.random.PRNGKey(2))
  assert a.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert (np.asarray(a) != np.asarray(c)).any()
  assert dropout.dropout(x, 0.0, jax.random.PRNGKey(1)) is x
  with pytest.raises(ValueError, match="dropout_bits=12"):
    dropout.keep_mask(jax.random.PRNGKey(0), (4,), 0.1, 12)
  with pytest.raises(ValueError, match="dropout_bits=12"):
    configuration.get_preset("test", dropout_bits=12)


@pytest.mark.parametrize("shape", [(3, 5, 16), (40, 768), (2, 2, 4, 8)])
def test_a_mask_packed_to_bits_unpacks_to_itself(shape):
  mask = jax.random.bernoulli(jax.random.PRNGKey(3), 0.9, shape)
  packed = dropout.pack_mask(mask)
  assert packed.dtype == jnp.uint8 and packed.shape == (*shape[:-1], shape[-1] // 8)
  np.testing.assert_array_equal(np.asarray(dropout.unpack_mask(packed)), np.asarray(mask))
  # Bit j of byte i is element 8i + j.
  first = np.asarray(mask).reshape(-1, shape[-1])[0, :8]
  assert int(np.asarray(packed).reshape(-1)[0]) == sum(int(b) << j for j, b in enumerate(first))


@pytest.mark.parametrize("width", [768, 301])
def test_dropout_through_bits_keeps_the_masks_decisions(width):
  """The mask kept as bits (a width that is a multiple of 8) or as it is (any other): the same
  elements are kept as `keep_mask` decides, forward and in the gradient."""
  x = jax.random.normal(jax.random.PRNGKey(0), (6, width))
  rng = jax.random.PRNGKey(5)
  keep, keep_prob = dropout.keep_mask(rng, x.shape, 0.1, 16)
  expected = np.where(np.asarray(keep), np.asarray(x) * np.float32(1 / keep_prob), 0)
  np.testing.assert_array_equal(np.asarray(dropout.dropout(x, 0.1, rng)), expected)
  grad = jax.grad(lambda v: jnp.sum(dropout.dropout(v, 0.1, rng)))(x)
  np.testing.assert_array_equal(np.asarray(grad) != 0, np.asarray(keep))


def test_attention_masks_differ_across_steps_and_layers_and_repeat_for_a_step(monkeypatch):
  """Every attention-probability mask the model draws, recorded as the explicit path draws it:
  two layers x two steps are four different masks, and step 1 drawn again is step 1's."""
  cfg = configuration.get_preset("test", hidden_dropout_prob=0.0, **TINY)
  batch = helpers.random_pretraining_batch(np.random.RandomState(0), 2, 16, 3, cfg.vocab_size)
  model = modeling.BertModel(cfg)
  params = model.init(jax.random.PRNGKey(0), batch["input_ids"])
  drawn = []
  real_dropout = dropout.dropout

  def recording(x, rate, rng, bits=16):
    out = real_dropout(x, rate, rng, bits)
    drawn.append(np.asarray(out != 0))
    return out
  monkeypatch.setattr(dropout, "dropout", recording)
  base = jax.random.PRNGKey(3)
  for step in (0, 1, 1):
    model.apply(params, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                deterministic=False, rngs={"dropout": jax.random.fold_in(base, step)})
  assert len(drawn) == 6 and all(m.shape == (2, 4, 16, 16) for m in drawn)
  first_four = drawn[:4]
  for i in range(4):
    for j in range(i + 1, 4):
      assert (first_four[i] != first_four[j]).any(), (i, j)
  np.testing.assert_array_equal(drawn[2], drawn[4])
  np.testing.assert_array_equal(drawn[3], drawn[5])


# ------------------------------------------------------------------------------ LayerNorm
def _flax_layer_norm(x, scale, bias):
  return nn.LayerNorm(epsilon=1e-12, use_fast_variance=False).apply(
      {"params": {"scale": scale, "bias": bias}}, x)


@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("with_residual", [True, False])
def test_residual_layer_norm_equals_flax_forward_and_backward_in_float32(with_residual, gpu):
  """Both forms: two-pass statistics, and the GPU's (one pass over shifted values, the sum
  written once)."""
  keys = jax.random.split(jax.random.PRNGKey(0), 5)
  x = jax.random.normal(keys[0], (4, 9, 32)) * 3 + 1
  residual = jax.random.normal(keys[1], (4, 9, 32)) if with_residual else None
  scale = 1 + jax.random.normal(keys[2], (32,))
  bias = jax.random.normal(keys[3], (32,))
  weights = jax.random.normal(keys[4], (4, 9, 32))

  def ours(x, residual, scale, bias):
    y = modeling.residual_layer_norm(x, residual, scale, bias, 1e-12, jnp.float32, gpu)
    return jnp.sum(jnp.tanh(y) * weights)

  def reference(x, residual, scale, bias):
    total = x if residual is None else x + residual
    return jnp.sum(jnp.tanh(_flax_layer_norm(total, scale, bias)) * weights)

  argnums = (0, 1, 2, 3) if with_residual else (0, 2, 3)
  assert abs(float(ours(x, residual, scale, bias) - reference(x, residual, scale, bias))) <= 1e-4
  for a, b in zip(jax.grad(ours, argnums)(x, residual, scale, bias),
                  jax.grad(reference, argnums)(x, residual, scale, bias)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


def test_one_pass_statistics_keep_float32_precision_under_a_large_offset():
  """Rows of spread 1 around 10^4: E[v^2] - E[v]^2 would cancel to noise of order 10 (float32
  carries 10^8 to 7 digits); shifted by the row's first value, mean and variance agree with the
  two-pass ones to float32 rounding."""
  v = jax.random.normal(jax.random.PRNGKey(0), (16, 768)) + 1e4
  mean, rstd = modeling._row_statistics(v, 1e-12, one_pass=True)
  ref_mean, ref_rstd = modeling._row_statistics(v, 1e-12, one_pass=False)
  np.testing.assert_allclose(np.asarray(mean), np.asarray(ref_mean), rtol=1e-7)
  np.testing.assert_allclose(np.asarray(rstd), np.asarray(ref_rstd), rtol=1e-4)


@pytest.mark.parametrize("gpu", [False, True])
def test_residual_layer_norm_in_bfloat16_keeps_float32_statistics(gpu):
  """bfloat16 in and out; the statistics are those of the float32 sum (a large common offset,
  which bfloat16 statistics would lose, does not shift the output)."""
  x = (jax.random.normal(jax.random.PRNGKey(0), (8, 64)) + 30.0).astype(jnp.bfloat16)
  residual = jax.random.normal(jax.random.PRNGKey(1), (8, 64)).astype(jnp.bfloat16)
  scale, bias = jnp.ones((64,)), jnp.zeros((64,))
  y = modeling.residual_layer_norm(x, residual, scale, bias, 1e-12, jnp.bfloat16, gpu)
  assert y.dtype == jnp.bfloat16
  exact = _flax_layer_norm(x.astype(jnp.float32) + residual.astype(jnp.float32), scale, bias)
  # One bfloat16 rounding of the output (|y| < 4: 2^-8 relative, 1/64 absolute at most).
  np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(exact), atol=2 ** -6)
  grads = jax.grad(lambda x, r: jnp.sum(modeling.residual_layer_norm(
      x, r, scale, bias, 1e-12, jnp.bfloat16, gpu).astype(jnp.float32) ** 2), (0, 1))(x, residual)
  assert all(g.dtype == jnp.bfloat16 for g in grads)


@pytest.mark.slow
def test_low_precision_layer_norm_leaves_the_float32_model_unchanged():
  """The pre-training loss and every gradient of the float32 model: the fused LayerNorm against
  flax's, ≤ 1e-5 (the same parameter tree, so checkpoints read either way)."""
  batch = helpers.random_pretraining_batch(np.random.RandomState(1), 4, 24, 4, 512)
  outputs = {}
  for fused in (True, False):
    cfg = configuration.get_preset("test", low_precision_layer_norm=fused,
                                   hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    objective = mlm_nsp.MaskedLmNextSentence(24, 4)
    model = objective.model(cfg)
    params = nn.unbox(model.init(jax.random.PRNGKey(0),
                                 *(batch[k] for k in objective.input_names))["params"])

    def loss(p, model=model, objective=objective):
      out = step_lib.apply_model(objective, model, p, batch, deterministic=True)
      return objective.loss(out, batch, objective.denominators(batch))[0]
    outputs[fused] = (params, jax.jit(jax.value_and_grad(loss))(params))
  (p_a, (l_a, g_a)), (p_b, (l_b, g_b)) = outputs[True], outputs[False]
  assert jax.tree.structure(p_a) == jax.tree.structure(p_b)
  assert abs(float(l_a) - float(l_b)) <= 1e-5
  for a, b in zip(jax.tree.leaves(g_a), jax.tree.leaves(g_b)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------- bfloat16 against float32, trained
@pytest.fixture(scope="module")
def shakespeare_batches(tmp_path_factory):
  """Masked records of 60 kB of the plays, written by data_prep, as 32-row batches.

  The vocabulary is MiniLM's (uncased BERT's), not one trained here: the WordPiece trainer
  (Hugging Face tokenizers) breaks ties among equally frequent pairs in hash order, which
  differs from process to process, so a vocabulary trained here would differ from run to run
  and with it the data and the losses compared below."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  directory = tmp_path_factory.mktemp("fused_numerics")
  corpus = directory / "plays.txt"
  corpus.write_text(demo_corpus.corpus_text(max_bytes=60_000), encoding="utf-8")
  vocab_file = os.path.join(helpers.minilm_dir(), "vocab.txt")
  settings = cpd.make_settings(str(corpus), vocab_file, max_seq_length=SEQ,
                               max_predictions_per_seq=PRED, dupe_factor=2)
  cpd.create_pretraining_data(settings, output_dir=str(directory / "records"),
                              num_output_shards=1, num_workers=1, show_progress=False)
  spec = features.tf_feature_spec(SEQ, PRED, features.STATIC)
  files = sorted(glob.glob(os.path.join(str(directory / "records"), "pretrain-*.tfrecord")))
  rows = [{k: v.numpy() for k, v in b.items()} for b in
          tf.data.TFRecordDataset(files).batch(32, drop_remainder=True).map(
              lambda x: tf.io.parse_example(x, spec))]
  with open(vocab_file, encoding="utf-8") as f:
    vocab_size = sum(1 for _ in f)
  return vocab_size, [{k: v.astype(np.int32) if v.dtype == np.int64 else v
                       for k, v in b.items()} for b in rows]


def _train(batches, vocab_size, steps, dtype, seed, low_precision=True, layer_norm="xla"):
  cfg = configuration.get_preset("test", vocab_size=vocab_size, dtype=dtype,
                                 low_precision_layer_norm=low_precision,
                                 layer_norm_implementation=layer_norm, **TINY)
  objective = mlm_nsp.MaskedLmNextSentence(SEQ, PRED)
  model = objective.model(cfg)
  tx, schedule = optimizer.create_optimizer(
      {"name": "adamw", "learning_rate": 2e-3, "total_steps": steps, "warmup_steps": 5,
       "weight_decay": 0.01, "eps": 1e-6, "grad_clip_norm": 1.0})
  mesh = sharding.create_mesh([1, 1, 1], devices=jax.devices()[:1])
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  state, state_sh = state_lib.create_train_state(model, tx, mesh, rules, 0, batches[0],
                                                 objective.input_names)
  # Placed as the step's output places it: an input laid out otherwise would compile the step
  # a second time at step 2.
  state = state.replace(rng=jax.device_put(jax.random.PRNGKey(seed), state_sh.rng))
  batch_sh = sharding.batch_sharding(mesh)
  train_step = step_lib.build_train_step(objective, model, tx, schedule, state_sh, batch_sh,
                                         mesh, rules)
  losses = []
  for i in range(steps):
    state, metrics = train_step(state, jax.device_put(batches[i % len(batches)], batch_sh))
    losses.append(float(metrics["loss"]))
  return np.asarray(losses)


@pytest.mark.slow
def test_bfloat16_run_tracks_float32_within_dropout_noise(shakespeare_batches):
  """Same data, same initial weights: the bfloat16 run (low-precision residual stream and
  LayerNorm), and the same with each block's dropout + residual + LayerNorm in the fused
  kernels (their own masks), end within 3x the gap that two float32 runs of different dropout
  seeds show, and all learn."""
  vocab_size, batches = shakespeare_batches
  steps = 40
  f32_a = _train(batches, vocab_size, steps, "float32", seed=1)
  f32_b = _train(batches, vocab_size, steps, "float32", seed=2)
  bf16 = _train(batches, vocab_size, steps, "bfloat16", seed=1)
  fused = _train(batches, vocab_size, steps, "bfloat16", seed=1, layer_norm="pallas")
  tail = lambda losses: losses[-10:].mean()
  noise = abs(tail(f32_a) - tail(f32_b))
  for run in (f32_a, bf16, fused):
    assert tail(run) < run[:3].mean() - 1.0, run   # it learns
  for run in (bf16, fused):
    assert abs(tail(run) - tail(f32_a)) <= 3 * noise + 0.05, (tail(run), tail(f32_a), noise)


# ----------------------------------------------------------------------- cuDNN's dropout seeds
def test_cudnn_dropout_gets_a_distinct_seed_per_layer():
  paths = [("bert", "encoder", f"layer_{i}", "attention", "self") for i in range(24)]
  seeds = [modeling.cudnn_dropout_seed(p) for p in paths]
  assert len(set(seeds)) == 24 and all(0 <= s < 2 ** 31 for s in seeds)
  assert seeds[3] == modeling.cudnn_dropout_seed(paths[3])  # stable across processes (crc32)


@pytest.mark.parametrize("fields", [dict(scan_layers=True), dict(share_parameters="all")])
def test_cudnn_attention_dropout_refuses_layouts_that_reuse_one_call_site(fields):
  with pytest.raises(ValueError, match="needs unrolled, unshared layers"):
    configuration.get_preset("test", attention_implementation="cudnn",
                             attention_probs_dropout_prob=0.1, **fields)
  # Without attention dropout any layout may use the kernel.
  configuration.get_preset("test", attention_implementation="cudnn",
                           attention_probs_dropout_prob=0.0, **fields)
  # The stacked layout run unrolled keeps a call site per layer.
  configuration.get_preset("test", attention_implementation="cudnn",
                           attention_probs_dropout_prob=0.1, scan_layers=True,
                           stack_unrolled=True)
