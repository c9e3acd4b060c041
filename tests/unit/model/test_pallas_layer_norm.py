"""The fused dropout + residual add + LayerNorm kernels (`pallas_layer_norm`), run in Pallas'
interpreter on the CPU: with the kernels' own mask applied to the input, forward and every
gradient are `modeling.residual_layer_norm`'s; the masks keep the right fraction, scaled
exactly, follow the seed, the row and the column and nothing else, and the backward kernel
draws the forward's; the model with `layer_norm_implementation="pallas"` is the model with
"xla" without dropout (the same parameters, outputs and gradients; unrolled, scanned and
stacked layers), draws the same masks for
the same key and others for another, and under a mesh gives every shard its own masks. The
GPU program it compiles to is checked in `tests/unit/parallel/test_gpu_compile.py`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import configuration, dropout, modeling, pallas_layer_norm
from tests import helpers

RATE = 0.1
SEED = np.array([1234, 5678], np.uint32)
EPS = 1e-12


def _inputs(rows, width, seed=0):
  rng = np.random.default_rng(seed)
  x, residual = (jnp.asarray(rng.normal(size=(rows, width)), jnp.float32) for _ in range(2))
  dense_bias, scale, bias = (jnp.asarray(rng.normal(size=(width,)), jnp.float32)
                             for _ in range(3))
  return x, dense_bias, residual, scale, bias


def _max_abs(a, b):
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _max_relative(a, b):
  """The largest difference of two trees' leaves, each over its leaf's largest |value| (at
  least 1): sums taken in another order differ by float32 rounding of the sum's size."""
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             / max(1.0, float(np.max(np.abs(np.asarray(y)))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("rows, width, bits, programs", [
    (37, 48, 16, 1024),  # width padded to 64: blocks of 32 rows, the second one partial
    (64, 768, 8, 3),     # BERT-base's width: 32 blocks of 2 rows looped over by 3 programs
    (9, 1024, 32, 2),    # BERT-large's width, one decision per 32-bit word, a partial block
])
def test_forward_and_gradients_are_the_reference_with_the_kernels_mask(rows, width, bits,
                                                                        programs):
  x, dense_bias, residual, scale, bias = _inputs(rows, width)
  keep, keep_prob = pallas_layer_norm.keep_mask(SEED, (rows, width), RATE, bits)

  def fused(x, dense_bias, residual, scale, bias):
    return pallas_layer_norm.dropout_residual_layer_norm(
        x, dense_bias, residual, scale, bias, rate=RATE, seed=SEED, epsilon=EPS,
        out_dtype=jnp.float32, bits=bits,
        tiling=pallas_layer_norm.Tiling(backward_programs=programs))

  def reference(x, dense_bias, residual, scale, bias):
    dropped = jnp.where(keep, (x + dense_bias) / keep_prob, 0.0)
    return modeling.residual_layer_norm(dropped, residual, scale, bias, EPS, jnp.float32)

  cotangent = jnp.asarray(np.random.default_rng(1).normal(size=(rows, width)), jnp.float32)
  out, vjp = jax.vjp(jax.jit(fused), x, dense_bias, residual, scale, bias)
  expected, vjp_expected = jax.vjp(reference, x, dense_bias, residual, scale, bias)
  np.testing.assert_allclose(out, expected, atol=1e-5, rtol=1e-5)
  for name, got, want in zip(("x", "dense_bias", "residual", "scale", "bias"),
                             vjp(cotangent), vjp_expected(cotangent)):
    scale_of = float(np.max(np.abs(want))) or 1.0
    assert _max_abs(got, want) <= 1e-5 * max(1.0, scale_of), name
  # The mask did something: where it dropped, the input's gradient is exactly zero.
  d_x = np.asarray(vjp(cotangent)[0])
  assert (d_x[~np.asarray(keep)] == 0).all() and (d_x[np.asarray(keep)] != 0).all()


def test_copies_for_several_consumers_bring_back_the_sum_of_their_gradients():
  """`uses=3`: three copies of the output, and every input's gradient that of one output
  whose gradient is the three copies' sum (added in the backward kernel, not before it)."""
  rows, width = 21, 48
  x, dense_bias, residual, scale, bias = _inputs(rows, width)
  run = lambda uses: jax.jit(lambda *args: pallas_layer_norm.dropout_residual_layer_norm(
      *args, rate=RATE, seed=SEED, epsilon=EPS, out_dtype=jnp.float32, uses=uses))
  args = (x, dense_bias, residual, scale, bias)
  copies, vjp = jax.vjp(run(3), *args)
  single, vjp_single = jax.vjp(run(1), *args)
  assert len(copies) == 3
  for copy in copies:
    np.testing.assert_array_equal(copy, single)
  rng = np.random.default_rng(2)
  cotangents = tuple(jnp.asarray(rng.normal(size=(rows, width)), jnp.float32)
                     for _ in range(3))
  got, want = vjp(cotangents), vjp_single(sum(cotangents))
  for name, a, b in zip(("x", "dense_bias", "residual", "scale", "bias"), got, want):
    assert _max_relative(a, b) < 1e-6, name
  # Each copy's gradient counts: without the third, the gradients change.
  partial = vjp(cotangents[:2] + (jnp.zeros_like(cotangents[2]),))
  assert _max_abs(partial[0], got[0]) > 1e-3
  with pytest.raises(ValueError, match="uses=0"):
    run(0)(*args)


def test_without_dropout_or_dense_bias_it_is_the_residual_layer_norm():
  x, _, residual, scale, bias = _inputs(13, 40)
  out = pallas_layer_norm.dropout_residual_layer_norm(
      x, None, residual, scale, bias, rate=0.0, seed=None, epsilon=EPS, out_dtype=jnp.float32)
  np.testing.assert_allclose(
      out, modeling.residual_layer_norm(x, residual, scale, bias, EPS, jnp.float32),
      atol=1e-5, rtol=1e-5)


def test_bfloat16_inputs_give_bfloat16_outputs_close_to_float32():
  x, dense_bias, residual, scale, bias = _inputs(16, 64)
  run = lambda dtype, out: pallas_layer_norm.dropout_residual_layer_norm(
      x.astype(dtype), dense_bias, residual.astype(dtype), scale, bias, rate=RATE, seed=SEED,
      epsilon=EPS, out_dtype=out)
  low, high = run(jnp.bfloat16, jnp.bfloat16), run(jnp.float32, jnp.float32)
  assert low.dtype == jnp.bfloat16
  # bfloat16 inputs and output: rounding of ~2^-8 relative on values of a few units.
  assert _max_abs(low.astype(jnp.float32), high) < 0.1


@pytest.mark.parametrize("bits", dropout.DROPOUT_BITS)
def test_masks_keep_the_quantised_rate_and_are_independent_across_positions(bits):
  rows, width = 512, 768
  keep, keep_prob = pallas_layer_norm.keep_mask(SEED, (rows, width), RATE, bits)
  keep = np.asarray(keep, np.float64)
  assert keep_prob == dropout.keep_probability(RATE, bits)
  sd = np.sqrt(keep_prob * (1 - keep_prob) / keep.size)
  assert abs(keep.mean() - keep_prob) < 5 * sd, (keep.mean(), keep_prob)
  # Every row and every column keeps about the rate (no row or column stuck).
  assert abs(keep.mean(axis=1) - keep_prob).max() < 6 * np.sqrt(keep_prob * (1 - keep_prob)
                                                                / width)
  assert abs(keep.mean(axis=0) - keep_prob).max() < 6 * np.sqrt(keep_prob * (1 - keep_prob)
                                                                / rows)
  # Neighbours (next column, next row) are uncorrelated.
  centred = keep - keep.mean()
  for a, b in ((centred[:, 1:], centred[:, :-1]), (centred[1:], centred[:-1])):
    correlation = (a * b).mean() / centred.var()
    assert abs(correlation) < 5 / np.sqrt(a.size), correlation


def test_masks_follow_the_seed_and_each_shard_gets_its_own():
  shape = (256, 768)
  mask = lambda seed: np.asarray(pallas_layer_norm.keep_mask(seed, shape, RATE)[0])
  base = mask(SEED)
  np.testing.assert_array_equal(base, mask(SEED.copy()))
  # Independent masks agree where both keep or both drop: keep^2 + drop^2 of the elements.
  keep_prob = dropout.keep_probability(RATE)
  independent = keep_prob ** 2 + (1 - keep_prob) ** 2
  others = [SEED ^ np.array([1, 0], np.uint32), SEED ^ np.array([0, 1], np.uint32),
            np.asarray(dropout.shard_seed(jnp.asarray(SEED), jnp.int32(0))),
            np.asarray(dropout.shard_seed(jnp.asarray(SEED), jnp.int32(1)))]
  masks = [base] + [mask(s) for s in others]
  for i in range(len(masks)):
    for j in range(i + 1, len(masks)):
      agreement = (masks[i] == masks[j]).mean()
      assert abs(agreement - independent) < 0.01, (i, j, agreement)


def test_refusals():
  x, dense_bias, residual, scale, bias = _inputs(4, 16)
  with pytest.raises(ValueError, match="seed is required"):
    pallas_layer_norm.dropout_residual_layer_norm(x, dense_bias, residual, scale, bias,
                                                  rate=RATE, seed=None, epsilon=EPS,
                                                  out_dtype=jnp.float32)
  with pytest.raises(ValueError, match="expected one of"):
    pallas_layer_norm.dropout_residual_layer_norm(x, dense_bias, residual, scale, bias,
                                                  rate=RATE, seed=SEED, epsilon=EPS,
                                                  out_dtype=jnp.float32, bits=12)
  huge = jax.ShapeDtypeStruct((2**21, 1024), jnp.bfloat16)
  with pytest.raises(ValueError, match="fewer than 2\\^31"):
    jax.eval_shape(lambda x: pallas_layer_norm.dropout_residual_layer_norm(
        x, None, x, scale[:1].repeat(1024), bias[:1].repeat(1024), rate=0.0, seed=None,
        epsilon=EPS, out_dtype=jnp.bfloat16), huge)
  with pytest.raises(ValueError, match="num_warps=3"):
    pallas_layer_norm.Tiling(num_warps=3)
  with pytest.raises(ValueError, match="low_precision_layer_norm=True"):
    configuration.get_preset("test", layer_norm_implementation="pallas",
                             low_precision_layer_norm=False)
  with pytest.raises(ValueError, match="layer_norm_implementation='triton'"):
    configuration.get_preset("test", layer_norm_implementation="triton")


def _model(impl, **overrides):
  cfg = configuration.get_preset("test", layer_norm_implementation=impl, num_hidden_layers=2,
                                 **overrides)
  return modeling.BertModel(cfg, add_pooling_layer=False)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [{}, {"scan_layers": True},
                                    {"scan_layers": True, "stack_unrolled": True}],
                         ids=["unrolled", "scanned", "stacked"])
def test_the_model_is_the_xla_model_without_dropout_and_follows_its_key_with_it(layout):
  ids = jnp.asarray(np.random.RandomState(0).randint(5, 99, (3, 24)), jnp.int32)
  mask = jnp.asarray(np.arange(24)[None, :] < np.array([[24], [17], [9]]), jnp.int32)
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  fused, xla = _model("pallas", **layout), _model("xla", **layout)
  params = nn.unbox(fused.init(jax.random.PRNGKey(0), ids, mask))
  assert (jax.tree.map(jnp.shape, params)
          == jax.tree.map(jnp.shape, nn.unbox(xla.init(jax.random.PRNGKey(0), ids, mask))))

  def loss(model, params, **kwargs):
    out = model.apply(params, ids, mask, **kwargs)["sequence_output"]
    return jnp.sum(jnp.sin(out))

  value, grads = jax.value_and_grad(lambda p: loss(fused, p))(params)
  value_xla, grads_xla = jax.value_and_grad(lambda p: loss(xla, p))(params)
  assert abs(float(value) - float(value_xla)) < 1e-5 * max(1.0, abs(float(value_xla)))
  assert _max_relative(grads, grads_xla) < 1e-5
  # The dense layers' biases reach the kernel and get their gradient from it.
  first = lambda tree: tree["params"]["encoder"].get("layer_0", tree["params"]["encoder"].get(
      "layer"))  # unrolled: layer_0; scanned and stacked: every layer's, stacked
  layer, layer_xla = first(grads), first(grads_xla)
  assert float(jnp.abs(layer["output"]["dense"]["bias"]).max()) > 0
  assert _max_relative(layer["attention"]["output"]["dense"]["bias"],
                       layer_xla["attention"]["output"]["dense"]["bias"]) < 1e-5

  train = lambda key: loss(fused, params, deterministic=False, rngs={"dropout": key})
  a, b, c = train(jax.random.PRNGKey(1)), train(jax.random.PRNGKey(1)), train(
      jax.random.PRNGKey(2))
  assert float(a) == float(b)
  assert abs(float(a) - float(c)) > 1e-3 and abs(float(a) - float(value)) > 1e-3


def test_every_site_draws_its_own_mask():
  """Two blocks' output sites with the same parameters and inputs agree without dropout and
  differ with it: each draws its own mask from its own key."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  cfg = configuration.get_preset("test", layer_norm_implementation="pallas")

  class TwoSites(nn.Module):
    @nn.compact
    def __call__(self, x, residual, deterministic):
      return [modeling.BertResidualOutput(cfg, "embed", name=f"site_{i}")(
          x, residual, deterministic) for i in range(2)]

  x = jax.random.normal(jax.random.PRNGKey(0), (2, 32, cfg.hidden_size), jnp.float32)
  model = TwoSites()
  params = model.init(jax.random.PRNGKey(0), x, x, True)
  params = {"params": {"site_0": params["params"]["site_0"],
                       "site_1": params["params"]["site_0"]}}
  same = model.apply(params, x, x, True)
  np.testing.assert_array_equal(same[0], same[1])
  dropped = model.apply(params, x, x, False, rngs={"dropout": jax.random.PRNGKey(3)})
  assert _max_abs(dropped[0], dropped[1]) > 1e-3


@pytest.mark.mesh
@pytest.mark.slow
def test_the_model_under_a_mesh_gives_every_shard_its_own_masks():
  """Data-parallel over 4 devices (the kernel runs per shard in `shard_map`): 4 identical rows,
  one per device, come out different; the same key gives the same outputs; without dropout
  the mesh changes nothing."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import sharding  # pylint: disable=g-import-not-at-top
  model = _model("pallas", attention_probs_dropout_prob=0.0)
  ids = np.tile(np.random.RandomState(0).randint(5, 99, (1, 32)), (4, 1)).astype(np.int32)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), ids)["params"])
  mesh = sharding.create_mesh([4, 1, 1], devices=jax.devices()[:4])
  rows = NamedSharding(mesh, PartitionSpec(sharding.MESH_AXES[0]))

  @functools.partial(jax.jit, static_argnums=3)
  def run(params, ids, key, deterministic):
    with nn.logical_axis_rules(sharding.DEFAULT_LOGICAL_AXIS_RULES):
      return model.apply({"params": params}, ids, deterministic=deterministic,
                         rngs={"dropout": key})["sequence_output"]

  plain = np.asarray(model.apply({"params": params}, ids)["sequence_output"])
  with jax.set_mesh(mesh):
    sharded_ids = jax.device_put(ids, rows)
    a = np.asarray(run(params, sharded_ids, jax.random.PRNGKey(1), False))
    b = np.asarray(run(params, sharded_ids, jax.random.PRNGKey(1), False))
    d = np.asarray(run(params, sharded_ids, jax.random.PRNGKey(1), True))
  np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(d, plain, atol=1e-5)
  for i in range(4):
    for j in range(i + 1, 4):
      assert np.abs(a[i] - a[j]).max() > 1e-3, (i, j)


@pytest.mark.slow
def test_the_gpu_checks_pass_in_the_interpreter(tmp_path):
  """`benchmarks/fused_layer_norm_checks.py`, which the GPU suite runs first, on the CPU: every
  check passes, and every tiling it times runs."""
  text = helpers.run_device_checks(
      "fused_layer_norm_checks.py", tmp_path / "checks.md", "--rows=64", "--width=48",
      "--check_rows=24", "--steps=1", "--repeats=1", "--tilings=2048:4:2,256:2:1")
  assert text.count("- PASS") == 9 and "FAIL" not in text and "failed" not in text, text
  assert text.count("ms (**") == 3, text
