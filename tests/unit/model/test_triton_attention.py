"""The GPU's Pallas attention kernels with dropout inside (`triton_attention.flash_attention`),
run here in Pallas' interpreter: without dropout they are the explicit path; with it they are
the explicit path under their own mask (`keep_mask`, a hash of seed and position), which keeps
the right fraction, scaled exactly, changes with the seed, the row, the head and the query, and
is drawn again by the backward kernel. The values do not depend on the tiling. A model whose
target is a GPU runs them at `attention_implementation="pallas"`; `test_gpu_compile.py`
compiles that model for an H100, and `benchmarks/attention_dropout_checks.py` runs the
compiled kernels on a GPU.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import dropout, modeling, target, triton_attention
from tests import helpers

BATCH, HEADS, HEAD_DIM = 2, 2, 32
RATE = 0.1
SEED = np.array([0x1234, 0xBEEF], np.uint32)
TOLERANCE = 1e-5
# Tilings whose blocks split a row of 96 tokens differently (one block, ragged blocks of 64,
# many small ones); the first is the default.
TILINGS = [triton_attention.Tiling(), triton_attention.Tiling(32, 16, 32, 16, 2),
           triton_attention.Tiling(128, 128, 128, 128, 8)]


def _qkv(length, seed=0, head_dim=HEAD_DIM, dtype=jnp.float32):
  keys = jax.random.split(jax.random.PRNGKey(seed), 4)
  shape = (BATCH, length, HEADS, head_dim)
  return tuple(jax.random.normal(k, shape, jnp.float32).astype(dtype) for k in keys)


def _rows(kind: str, length: int):
  """(input_mask, sequence_ids or None): right-padded rows, or packed rows of several
  instances each, padded at the end."""
  if kind == "unpacked":
    input_mask = np.zeros((BATCH, length), np.int32)
    input_mask[0, :length - 13] = 1
    input_mask[1, :length // 3] = 1
    return input_mask, None
  sequence_ids = np.zeros((BATCH, length), np.int32)
  sequence_ids[0, :30], sequence_ids[0, 30:61], sequence_ids[0, 61:length - 5] = 1, 2, 3
  sequence_ids[1, :50], sequence_ids[1, 50:] = 1, 2
  return (sequence_ids > 0).astype(np.int32), sequence_ids


def _ids(input_mask, sequence_ids):
  return modeling._segment_ids(jnp.asarray(input_mask),
                               None if sequence_ids is None else jnp.asarray(sequence_ids))


def _real(x, input_mask):
  """Outputs at real query positions only: no path defines what padding queries see."""
  return jnp.where(jnp.asarray(input_mask)[:, :, None, None] > 0, x, 0.0)


def _max_abs(a, b):
  return max(float(np.max(np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _loss_and_grads(attention, q, k, v, cotangent, input_mask):
  def loss(q, k, v):
    out = attention(q, k, v)
    return jnp.sum(_real(out.astype(jnp.float32), input_mask) * cotangent), out
  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  return _real(out, input_mask), grads


@functools.partial(jax.jit, static_argnames=("rate", "tiling", "bits"))
def _kernel(q, k, v, cotangent, ids, input_mask, seed, rate=0.0, tiling=TILINGS[0], bits=16):
  attend = lambda q, k, v: triton_attention.flash_attention(
      q, k, v, ids, dropout_rate=rate, seed=seed, bits=bits, tiling=tiling, interpret=True)
  return _loss_and_grads(attend, q, k, v, cotangent, input_mask)


@pytest.mark.parametrize("kind", ["unpacked", "packed"])
def test_without_dropout_the_kernels_are_the_explicit_path(kind):
  length = 96
  input_mask, sequence_ids = _rows(kind, length)
  q, k, v, cotangent = _qkv(length)
  mask = modeling.attention_mask(jnp.asarray(input_mask),
                                 None if sequence_ids is None else jnp.asarray(sequence_ids))
  explicit = lambda q, k, v: modeling._explicit_attention(q, k, v, mask, 0.0, None)
  want = jax.jit(functools.partial(_loss_and_grads, explicit))(q, k, v, cotangent, input_mask)
  ids = _ids(input_mask, sequence_ids)
  for tiling in TILINGS:
    got = _kernel(q, k, v, cotangent, ids, input_mask, SEED, tiling=tiling)
    assert _max_abs(got, want) <= TOLERANCE, tiling
  assert all(float(jnp.max(jnp.abs(g))) > 0.01 for g in want[1])
  # The comparison can fail: attending across instances (or to padding) is another answer.
  everything = modeling._explicit_attention(q, k, v, jnp.ones((1, 1, 1, 1), bool), 0.0, None)
  assert _max_abs(_real(everything, input_mask), want[0]) > 0.1


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_with_dropout_the_kernels_are_the_explicit_path_under_their_mask(bits):
  """Output and the three gradients equal the reference's (float32 softmax, the probabilities
  dropped by `keep_mask` and scaled by the exact inverse of the kept fraction): the backward
  kernels draw the forward's mask. Whatever the tiling, and at a ragged length."""
  length = 96
  input_mask, sequence_ids = _rows("packed", length)
  q, k, v, cotangent = _qkv(length, seed=1)
  ids = _ids(input_mask, sequence_ids)
  reference = functools.partial(triton_attention.reference, ids=ids, dropout_rate=RATE,
                                seed=SEED, bits=bits)
  want = jax.jit(functools.partial(_loss_and_grads, reference))(q, k, v, cotangent,
                                                                input_mask)
  for tiling in TILINGS:
    got = _kernel(q, k, v, cotangent, ids, input_mask, SEED, rate=RATE, tiling=tiling,
                  bits=bits)
    assert _max_abs(got, want) <= TOLERANCE, tiling
  # Another seed is another mask: the comparison can fail.
  other = _kernel(q, k, v, cotangent, ids, input_mask, SEED ^ np.uint32(1), rate=RATE,
                  bits=bits)
  assert _max_abs(other[0], want[0]) > 0.1


def test_the_joined_projection_is_read_in_place():
  """`joined_flash_attention` of q, k, v side by side gives `flash_attention`'s output, and its
  gradient is theirs side by side, with and without dropout."""
  length = 80
  input_mask, sequence_ids = _rows("packed", length)
  q, k, v, cotangent = _qkv(length, seed=5)
  ids = _ids(input_mask, sequence_ids)
  for rate in (0.0, RATE):
    apart = _kernel(q, k, v, cotangent, ids, input_mask, SEED, rate=rate)
    joined = jax.jit(functools.partial(_loss_and_grads, lambda qkv, _, __: (
        triton_attention.joined_flash_attention(qkv, ids, dropout_rate=rate, seed=SEED,
                                                interpret=True))))(
        jnp.stack([q, k, v], axis=2), None, None, cotangent, input_mask)
    np.testing.assert_array_equal(joined[0], apart[0])
    np.testing.assert_array_equal(joined[1][0], jnp.stack(apart[1], axis=2))


def test_bfloat16_operands_are_the_reference_within_their_rounding():
  length = 64
  input_mask, sequence_ids = _rows("unpacked", length)
  q, k, v, cotangent = _qkv(length, seed=2, dtype=jnp.bfloat16)
  ids = _ids(input_mask, sequence_ids)
  reference = functools.partial(triton_attention.reference, ids=ids, dropout_rate=RATE,
                                seed=SEED)
  want = jax.jit(functools.partial(_loss_and_grads, reference))(q, k, v, cotangent, input_mask)
  got = _kernel(q, k, v, cotangent, ids, input_mask, SEED, rate=RATE)
  assert got[0].dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in got[1])
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.linalg.norm(a - b) <= 1e-2 * np.linalg.norm(b)


# --- The mask, read back through identity values: out[b, i, h, j] = dropped probs[b, h, i, j].

def _probability_matrix(seed, rate=RATE, tiling=TILINGS[0]):
  return np.asarray(_probabilities(jnp.asarray(seed), rate=rate, tiling=tiling))


@functools.partial(jax.jit, static_argnames=("rate", "tiling"))
def _probabilities(seed, rate, tiling):
  length = 64
  q, k, _, _ = _qkv(length, seed=3, head_dim=length)
  identity = jnp.broadcast_to(jnp.eye(length)[None, :, None, :], q.shape)
  ids = jnp.ones((BATCH, length), jnp.int32)
  out = triton_attention.flash_attention(q, k, identity, ids, dropout_rate=rate, seed=seed,
                                         tiling=tiling, interpret=True)
  return jnp.swapaxes(out, 1, 2)


def test_the_mask_keeps_the_right_fraction_scaled_exactly_and_follows_seed_and_position():
  probabilities = _probability_matrix(SEED, rate=0.0)
  dropped = _probability_matrix(SEED)
  assert probabilities.min() > 0.0  # so a zero below means "dropped"
  kept = dropped != 0.0
  keep_prob = dropout.keep_probability(RATE)
  standard_error = math.sqrt(keep_prob * (1.0 - keep_prob) / kept.size)
  assert abs(kept.mean() - keep_prob) < 4 * standard_error, (kept.mean(), keep_prob)
  np.testing.assert_allclose(dropped[kept], probabilities[kept] / keep_prob, rtol=2e-6)
  # The mask is `keep_mask`'s, and the same whatever the tiling.
  want, _ = triton_attention.keep_mask(SEED, kept.shape, RATE)
  np.testing.assert_array_equal(kept, np.asarray(want))
  tiled = _probability_matrix(SEED, tiling=TILINGS[1])  # other blocks: other float32 sums
  np.testing.assert_array_equal(tiled != 0.0, kept)
  np.testing.assert_allclose(tiled, dropped, rtol=1e-5, atol=1e-7)
  # Same seed, same mask (a resumed run); another seed, or another row, head or query block of
  # the same seed, an independent one: keep rate 0.9 disagrees on 2 * 0.9 * 0.1 = 18%.
  np.testing.assert_array_equal(_probability_matrix(SEED.copy()), dropped)
  disagree = lambda a, b: float(np.mean(a != b))
  for other_seed in (SEED ^ np.array([1, 0], np.uint32), SEED ^ np.array([0, 1], np.uint32)):
    assert 0.15 < disagree(kept, _probability_matrix(other_seed) != 0.0) < 0.21
  half = kept.shape[2] // 2
  block = lambda b, h, part: kept[b, h, part * half:(part + 1) * half]
  for other in (block(1, 0, 0), block(0, 1, 0), block(0, 0, 1)):
    assert 0.15 < disagree(block(0, 0, 0), other) < 0.21


def _interpreted_on_a_gpu(monkeypatch) -> list:
  """Make the model's target a GPU, its Triton kernels interpreted; returns the list of the
  kernels' calls, (which, dropout rate), as they come."""
  calls = []
  monkeypatch.setattr(target, "target_platform", lambda: "gpu")
  for name in ("flash_attention", "joined_flash_attention"):
    def interpreted(*args, kernel=getattr(triton_attention, name), name=name, **kwargs):
      calls.append((name, kwargs["dropout_rate"]))
      return kernel(*args, interpret=True, **kwargs)
    monkeypatch.setattr(triton_attention, name, interpreted)
  return calls


def test_the_model_runs_the_triton_kernels_where_its_target_is_a_gpu(monkeypatch):
  """`attention_implementation="pallas"` in a model built for a GPU: without dropout the model
  is the explicit path's model; with it, a step's masks follow its dropout key (the same key,
  the same output: a resumed run), and scanned layers take them too."""
  calls = _interpreted_on_a_gpu(monkeypatch)
  config = modeling.get_preset("tiny").replace(attention_probs_dropout_prob=RATE,
                                               hidden_dropout_prob=0.0)
  length = 40
  input_mask, _ = _rows("unpacked", length)
  ids = jax.random.randint(jax.random.PRNGKey(4), (BATCH, length), 0, config.vocab_size)
  segments = jnp.zeros((BATCH, length), jnp.int32)

  def run(cfg, deterministic, key=0):
    model = modeling.BertModel(cfg)
    params = model.init(jax.random.PRNGKey(0), ids, input_mask, segments)
    calls.clear()
    out = model.apply(params, ids, input_mask, segments, deterministic=deterministic,
                      rngs={"dropout": jax.random.PRNGKey(key)})
    return np.asarray(_real(out["sequence_output"][:, :, None, :], input_mask))

  explicit = run(config.replace(attention_implementation="xla"), True)
  pallas = config.replace(attention_implementation="pallas")
  np.testing.assert_allclose(run(pallas, True), explicit, atol=TOLERANCE)
  assert calls == [("joined_flash_attention", 0.0)] * config.num_hidden_layers
  # The joined projection keeps the three layers' parameters (names, shapes, initial values)
  # and gives each its own gradient.
  grads = {}
  for name, cfg in (("xla", config.replace(attention_implementation="xla")), ("pallas", pallas)):
    model = modeling.BertModel(cfg)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), ids, input_mask, segments))
    loss = lambda p: jnp.sum(jnp.sin(model.apply(p, ids, input_mask, segments)[
        "sequence_output"]) * jnp.asarray(input_mask)[:, :, None])
    grads[name] = (params, jax.grad(loss)(params))
  assert (jax.tree.structure(grads["xla"][0]) == jax.tree.structure(grads["pallas"][0]))
  assert _max_abs(grads["xla"][0], grads["pallas"][0]) == 0.0
  for want, got in zip(jax.tree.leaves(grads["xla"][1]), jax.tree.leaves(grads["pallas"][1])):
    assert _max_abs(want, got) <= TOLERANCE * max(1.0, float(jnp.max(jnp.abs(want))))
  query = grads["pallas"][1]["params"]["encoder"]["layer_0"]["attention"]["self"]["query"]
  assert float(jnp.max(jnp.abs(query["kernel"]))) > 1e-3
  dropped = run(pallas, False)
  assert calls == [("joined_flash_attention", RATE)] * config.num_hidden_layers
  np.testing.assert_array_equal(run(pallas, False), dropped)
  assert np.abs(run(pallas, False, key=1) - dropped).max() > 1e-2
  assert np.abs(dropped - explicit).max() > 1e-2
  scanned = run(pallas.replace(scan_layers=True), False)
  assert np.isfinite(scanned).all() and np.abs(scanned - explicit).max() > 1e-2
  assert "Pallas Triton" in modeling.attention_kernel_description(pallas)


def test_bad_arguments_get_clear_errors():
  q = jnp.zeros((1, 16, 1, 16))
  ids = jnp.ones((1, 16), jnp.int32)
  attend = functools.partial(triton_attention.flash_attention, interpret=True)
  with pytest.raises(ValueError, match="one .batch, length, heads, head_dim. shape"):
    attend(q, q[:, :8], q, ids)
  with pytest.raises(ValueError, match="share a dtype"):
    attend(q, q.astype(jnp.bfloat16), q, ids)
  with pytest.raises(ValueError, match=r"ids \(1, 8\); expected"):
    attend(q, q, q, ids[:, :8])
  with pytest.raises(ValueError, match="a seed is required"):
    attend(q, q, q, ids, dropout_rate=0.1)
  with pytest.raises(ValueError, match="bits=12"):
    attend(q, q, q, ids, bits=12)
  with pytest.raises(ValueError, match="up to 256"):
    attend(jnp.zeros((1, 16, 1, 512)), jnp.zeros((1, 16, 1, 512)), jnp.zeros((1, 16, 1, 512)),
           ids)
  with pytest.raises(ValueError, match="backward_step=8; expected a power of two"):
    triton_attention.Tiling(backward_step=8)
  with pytest.raises(ValueError, match="num_warps=3"):
    triton_attention.Tiling(num_warps=3)


@pytest.mark.mesh
def test_under_a_mesh_every_shard_draws_its_own_masks(monkeypatch):
  """The encoder with the Triton kernels (its target a GPU) and attention dropout, data-parallel
  over 4 devices: the kernels run per shard in `shard_map`, each shard folds its index into the
  seed (`dropout.shard_seed`), so 4 identical rows, one per device, come out different; the same
  key gives the same outputs, another key other ones."""
  _interpreted_on_a_gpu(monkeypatch)
  cfg = modeling.get_preset("tiny").replace(hidden_dropout_prob=0.0,
                                            attention_probs_dropout_prob=RATE,
                                            attention_implementation="pallas",
                                            num_hidden_layers=1)
  helpers.assert_every_shard_draws_its_own_masks(helpers.sharded_dropout_outputs(cfg, 48))


def test_the_gpu_attention_checks_pass_in_the_interpreter(tmp_path):
  """`benchmarks/attention_dropout_checks.py --implementation=pallas`, which the GPU suite runs
  with its checks, on the CPU (`--triton`: the Triton kernels interpreted at small shapes):
  every check passes, every tiling is timed, and the fastest is kept for the steps after."""
  import json  # pylint: disable=g-import-not-at-top
  fastest = tmp_path / "fastest.json"
  text = helpers.run_device_checks(
      "attention_dropout_checks.py", tmp_path / "checks.md", "--implementation=pallas",
      "--triton", "--shapes=2:64:2:32,1:40:1:16", "--tilings=32:16:32:16:2", "--steps=1",
      "--repeats=1", f"--fastest_out={fastest}")
  assert text.count("- PASS") == 12 and "FAIL" not in text, text
  assert text.count("forward + backward at") == 2, text
  kept = json.loads(fastest.read_text())
  assert set(kept) == {"2:64:2:32", "1:40:1:16"}, kept
  for shape in kept.values():
    assert triton_attention.Tiling.parse(shape["tiling"]) in (
        triton_attention.Tiling(), triton_attention.Tiling(32, 16, 32, 16, 2))
  with pytest.raises(ValueError, match="expected 5 whole numbers"):
    triton_attention.Tiling.parse("64:64:64")


@pytest.mark.mesh
def test_the_joined_projection_split_over_data_and_heads_equals_one_device(monkeypatch):
  """The encoder with the joined projection and the Triton kernels (its target a GPU), its
  parameters and activations split by the logical rules over 2 data × 2 model devices (heads
  split): the stacked kernel's heads axis is split as each projection's columns are, each
  device's kernels take their rows and heads, and the output and the parameters' gradients
  are the single device's."""
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import sharding  # pylint: disable=g-import-not-at-top
  _interpreted_on_a_gpu(monkeypatch)
  cfg = modeling.get_preset("tiny").replace(attention_implementation="pallas",
                                            num_hidden_layers=1)
  model = modeling.BertModel(cfg, add_pooling_layer=False)
  ids = jax.random.randint(jax.random.PRNGKey(1), (4, 40), 5, cfg.vocab_size)
  input_mask = jnp.asarray(np.arange(40)[None, :] < np.array([[40], [31], [17], [40]]),
                           jnp.int32)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), ids, input_mask)["params"])

  def loss(params, ids, input_mask):
    with nn.logical_axis_rules(sharding.DEFAULT_LOGICAL_AXIS_RULES):
      out = model.apply({"params": params}, ids, input_mask)["sequence_output"]
    return jnp.sum(jnp.sin(out) * input_mask[:, :, None]), out

  step = jax.jit(jax.value_and_grad(loss, has_aux=True))
  (_, want), want_grads = step(params, ids, input_mask)
  mesh = sharding.create_mesh([2, 1, 2], devices=jax.devices()[:4])
  with jax.set_mesh(mesh):
    specs = nn.get_partition_spec(model.init(jax.random.PRNGKey(0), ids, input_mask))["params"]
    placed = jax.tree.map(lambda p, s: jax.device_put(p, NamedSharding(
        mesh, nn.logical_to_mesh_axes(s, sharding.DEFAULT_LOGICAL_AXIS_RULES))), params, specs)
    rows = NamedSharding(mesh, PartitionSpec(sharding.MESH_AXES[0]))
    (_, got), got_grads = step(placed, jax.device_put(ids, rows),
                               jax.device_put(input_mask, rows))
  query = placed["encoder"]["layer_0"]["attention"]["self"]["query"]["kernel"]
  assert "model" in str(query.sharding.spec), query.sharding  # the heads are split
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=TOLERANCE)
  for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                               atol=TOLERANCE * max(1.0, float(jnp.max(jnp.abs(b)))))
