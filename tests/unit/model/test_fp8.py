"""FP8 matmuls (`BertConfig.quantization="fp8"`): the same parameters as the model without them,
training that tracks it, scales that the step overwrites (never the optimizer), accumulation
that gives the whole batch's scales, evaluation that applies them, and exact resume.

XLA:CPU executes float8_e4m3fn and float8_e5m2 dots (with the results of float32 dots of the
FP8 values), so the FP8 numerics run here, only not at FP8 speed.
"""

import dataclasses
import os

import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax import inference
from bert_jax.interop import checkpoint_store, hf_config
from bert_jax.model import configuration, fp8, heads, modeling
from bert_jax.objectives import mlm_nsp
from bert_jax.parallel import sharding
from bert_jax.runs import pretraining
from bert_jax.training import metrics, optimizer
from bert_jax.training import state as state_lib
from bert_jax.training import step as step_lib
from bert_jax.training.objective import Objective
from tests import helpers
from tests import pretrain_helpers as ph

OBJECTIVE = mlm_nsp.MaskedLmNextSentence(ph.SEQ, ph.PRED)
FP8 = "_overwrite_with_gradient"
OP = "Fp8DirectDotGeneralOp_0"
E4M3_MAX, E5M2_MAX = 448.0, 57344.0
STEPS = 8


def _config(quantization, **overrides):
  return configuration.get_preset("test", hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0,
                                  quantization=quantization, **overrides)


def _copy_task_batches(n, seed=0):
  """Pre-training batches whose masked tokens are the tokens at those positions: a task the
  tiny model learns within a few steps, so that the losses of two runs can be compared while
  they move (random targets would leave both flat at ln(vocab))."""
  rng = np.random.RandomState(seed)
  out = []
  for _ in range(n):
    b = helpers.random_pretraining_batch(rng, 16, ph.SEQ, ph.PRED, ph.VOCAB)
    at = np.take_along_axis(b["input_ids"], b["masked_lm_positions"], axis=1)
    b["masked_lm_ids"] = np.where(b["masked_lm_weights"] > 0, at, 0).astype(np.int32)
    out.append(b)
  return out


def _fp8_ops(model_state):
  """{layer path: the six variables of its FP8 op}."""
  flat = {"/".join(str(k.key) for k in path): leaf for path, leaf
          in jax.tree_util.tree_flatten_with_path(model_state[FP8])[0]}
  ops = {}
  for name, leaf in flat.items():
    layer, op, variable = name.rsplit("/", 2)
    assert op == OP, name
    ops.setdefault(layer, {})[variable] = (leaf if isinstance(leaf, jax.ShapeDtypeStruct)
                                           else np.asarray(leaf))
  return ops


def _train(quantization, batches, grad_accum_steps=1, keep=(), **overrides):
  """Trains the pre-training model on `batches`; returns losses, grad norms, the states after
  the steps in `keep` (on the host) and the last state."""
  model = heads.BertForPreTraining(_config(quantization, **overrides))
  mesh = sharding.create_mesh((1, 1, 1), jax.devices()[:1])
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  tx, schedule = optimizer.create_optimizer(ml_collections.ConfigDict(
      {"learning_rate": 1e-3, "total_steps": 100, "warmup_steps": 0}))
  state, state_sh = state_lib.create_train_state(model, tx, mesh, rules, 0,
                                                 OBJECTIVE.example_batch(16),
                                                 OBJECTIVE.input_names)
  step = step_lib.build_train_step(OBJECTIVE, model, tx, schedule, state_sh,
                                   sharding.batch_sharding(mesh), mesh, rules, grad_accum_steps)
  out = {"loss": [], "grad_norm": [], "states": {0: jax.device_get(state)}}
  for i, batch in enumerate(batches, start=1):
    state, m = step(state, batch)
    out["loss"].append(float(m["loss"]))
    out["grad_norm"].append(float(m["grad_norm"]))
    if i in keep:
      out["states"][i] = jax.device_get(state)
  out["last"] = jax.device_get(state)
  out["model"], out["state_sh"], out["mesh"], out["rules"] = model, state_sh, mesh, rules
  return out


@pytest.fixture(scope="module")
def runs():
  """float32 and FP8 (compute dtype float32) on the same batches; FP8 also with 4 micro-batches
  for two steps."""
  batches = _copy_task_batches(STEPS)
  return {"none": _train("none", batches),
          "fp8": _train("fp8", batches, keep=(1, 2)),
          "fp8_k4": _train("fp8", batches[:2], grad_accum_steps=4, keep=(1, 2))}


# ---------------------------------------------------------------------------- what runs here
def test_xla_cpu_executes_float8_dots():
  """The premise of the other tests: XLA:CPU runs dots of FP8 operands (the forward's e4m3 and
  the backward's e5m2 x e4m3), giving the float32 dot of the same FP8 values."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(8, 32)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(32, 16)), jnp.float32)
  for lhs_type, rhs_type in ((jnp.float8_e4m3fn, jnp.float8_e4m3fn),
                             (jnp.float8_e5m2, jnp.float8_e4m3fn)):
    a, b = x.astype(lhs_type), w.astype(rhs_type)
    got = jax.jit(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.float32))(a, b)
    want = a.astype(jnp.float32) @ b.astype(jnp.float32)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)
    assert np.abs(np.asarray(got) - np.asarray(x @ w)).max() > 1e-2  # really rounded to FP8


# --------------------------------------------------------------- the layer and its kernel
def _flax_fp8_dense(features, dtype, **inits):
  return nn.Dense(features, dtype=dtype, dot_general_cls=nn.Fp8DirectDotGeneralOp, **inits)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fp8_dense_computes_flaxs_fp8_dense(dtype):
  """`fp8.Fp8Dense` is Flax's FP8 dense layer (the same variables under the same names) with
  each operand quantized in one pass: over three steps whose scales and histories each step
  feeds to the next, the output, the input's gradient and the six new FP8 variables are
  Flax's to the bit, the kernel's gradient to the last bit of an element or two (XLA:CPU sums
  the rows of the two programs' dots in other orders). The bias gradient is summed in float32:
  within float32's rounding of the exact sum, where Flax's, summed in the compute dtype, is no
  closer."""
  inits = dict(kernel_init=nn.initializers.normal(0.5), bias_init=nn.initializers.normal(0.1))
  ours, flax_layer = fp8.Fp8Dense(48, dtype=dtype, **inits), _flax_fp8_dense(48, dtype, **inits)
  x = jax.random.normal(jax.random.PRNGKey(1), (4, 20, 32)) * 3
  variables = ours.init(jax.random.PRNGKey(0), x)
  assert (jax.tree.map(jnp.shape, variables)
          == jax.tree.map(jnp.shape, flax_layer.init(jax.random.PRNGKey(0), x)))

  def grads(layer, variables, x):
    loss = lambda v, x: (layer.apply(v, x).astype(jnp.float32) ** 2).sum() * 1e-3
    return jax.grad(loss, argnums=(0, 1))(variables, x)

  for _ in range(3):
    (ours_v, ours_x), (flax_v, flax_x) = grads(ours, variables, x), grads(flax_layer, variables, x)
    np.testing.assert_array_equal(np.asarray(ours.apply(variables, x), np.float32),
                                  np.asarray(flax_layer.apply(variables, x), np.float32))
    np.testing.assert_array_equal(np.asarray(ours_x, np.float32), np.asarray(flax_x, np.float32))
    np.testing.assert_allclose(ours_v["params"]["kernel"], flax_v["params"]["kernel"],
                               rtol=2e-7, atol=0)
    for name, value in ours_v[FP8][fp8.STATE_NAME].items():
      np.testing.assert_array_equal(value, flax_v[FP8][fp8.STATE_NAME][name], err_msg=name)
    # The bias gradient: the column sums of the output's gradient (in the compute dtype).
    y = ours.apply(variables, x).astype(jnp.float32)
    exact = np.asarray((2e-3 * y).astype(dtype), np.float64).reshape(-1, 48).sum(axis=0)
    ours_error = np.abs(np.asarray(ours_v["params"]["bias"], np.float64) - exact).max()
    flax_error = np.abs(np.asarray(flax_v["params"]["bias"], np.float64) - exact).max()
    assert ours_error <= 1e-5 * np.abs(exact).max() + 1e-7, ours_error
    assert flax_error >= ours_error, (flax_error, ours_error)
    # The next step: these scales and histories, the parameters moved, larger inputs.
    variables = {"params": jax.tree.map(lambda p, g: p - 0.1 * g, variables["params"],
                                        flax_v["params"]), FP8: flax_v[FP8]}
    x = x * 1.5


@pytest.mark.parametrize("shape,dtype,q_dtype,scale", [
    ((70, 130), jnp.bfloat16, jnp.float8_e4m3fn, 0.01),  # ragged tiles; many values clipped
    ((128, 64), jnp.float32, jnp.float8_e5m2, 1e-4),
    ((64, 200), jnp.bfloat16, jnp.float8_e5m2, 3.0)])
def test_the_one_pass_kernel_gives_xlas_values(shape, dtype, q_dtype, scale):
  """The GPU kernel (interpreted here) writes what XLA's operations compute: the FP8 values
  in both layouts to the bit, the largest |value| exactly, the column sums to float32's
  rounding; on shapes that are not multiples of its tiles too."""
  x = (jax.random.normal(jax.random.PRNGKey(0), shape) * 5).astype(dtype)
  scale = jnp.asarray([scale], jnp.float32)
  got = fp8.quantize(x, scale, q_dtype, column_sums=True, implementation="pallas")
  want = fp8.quantize(x, scale, q_dtype, column_sums=True, implementation="xla")
  assert got.q.dtype == q_dtype and got.q.shape == shape and got.q_t.shape == shape[::-1]
  bits = lambda a: np.asarray(a).view(np.uint8)
  np.testing.assert_array_equal(bits(got.q), bits(want.q))
  np.testing.assert_array_equal(bits(got.q_t), bits(want.q_t))
  np.testing.assert_array_equal(bits(got.q_t), bits(want.q).T)
  assert float(got.amax) == float(want.amax) == float(jnp.abs(x).max())
  np.testing.assert_allclose(np.asarray(got.column_sums), np.asarray(want.column_sums),
                             rtol=1e-5, atol=1e-5)
  if scale[0] < 0.1:  # the range really clipped: the format's largest value is there
    assert np.abs(np.asarray(got.q, np.float32)).max() == float(jnp.finfo(q_dtype).max)


def test_the_kernel_applies_gelu_as_the_model_does():
  """The kernel applies the feed-forward's GELU itself (`fused_activation`), with an erfc of
  its own (Pallas' Triton lowering has none): within 1e-5 relative of the exact erfc from -9
  to 9 (XLA's own is within 4e-6), and the bfloat16 GELU it quantizes is the model's
  (`modeling.gelu`) on 4 M normal values times 3 but for a few in 10^4 at most; here the FP8
  values, as they are and transposed, and the largest |value|, are those of XLA's
  quantization of the model's GELU."""
  import math  # pylint: disable=g-import-not-at-top
  u = np.linspace(-9, 9, 20001, dtype=np.float32)
  exact = np.array([math.erfc(float(v)) for v in u])
  ours = np.asarray(fp8._erfc(jnp.asarray(u)), np.float64)  # pylint: disable=protected-access
  assert np.max(np.abs(ours - exact) / exact) <= 1e-5
  h = (jax.random.normal(jax.random.PRNGKey(0), (4096, 1024)) * 3).astype(jnp.bfloat16)
  kernel_gelu = fp8._kernel_gelu(  # pylint: disable=protected-access
      h.astype(jnp.float32)).astype(jnp.bfloat16)
  differ = np.mean(np.asarray(kernel_gelu, np.float32)
                   != np.asarray(modeling.gelu(h, False), np.float32))
  assert differ <= 1e-4, differ
  scale = jnp.asarray([0.02], jnp.float32)
  got = fp8.quantize(h[:200, :130], scale, jnp.float8_e4m3fn, activation="gelu",
                     implementation="pallas")
  want = fp8.quantize(modeling.gelu(h[:200, :130], False), scale, jnp.float8_e4m3fn,
                      implementation="xla")
  bits = lambda a: np.asarray(a).view(np.uint8)
  np.testing.assert_array_equal(bits(got.q), bits(want.q))
  np.testing.assert_array_equal(bits(got.q_t), bits(want.q_t))
  assert float(got.amax) == float(want.amax)
  with pytest.raises(ValueError, match="activation='relu'; expected one of gelu"):
    fp8.quantize(h, scale, jnp.float8_e4m3fn, activation="relu")


def test_query_key_and_value_share_one_quantized_input():
  """The attention block's three projections quantize their common input once, and the
  feed-forward's second layer applies GELU to its input itself (`fused_activation`). The
  step's gradients are then those of the model with Flax's FP8 layer at every dense layer
  (each quantizing its own input, GELU applied before it): every gradient to float32's
  rounding (the orders of sums differ), and the new scales and histories the same to the bit,
  the key's and value's input ones the query's."""
  model = heads.BertForPreTraining(_config("fp8"))
  batch = _copy_task_batches(1)[0]
  inputs = [jnp.asarray(batch[k]) for k in OBJECTIVE.input_names]

  def grads():
    variables = model.init(jax.random.PRNGKey(0), *inputs)
    loss = lambda v: sum(jnp.sum(out.astype(jnp.float32) ** 2)
                         for out in jax.tree.leaves(model.apply(v, *inputs)))
    return jax.grad(loss)(nn.unbox(variables))

  ours = grads()
  dense = modeling.dense

  def flax_dense(config, features, axes, name, add_bias=True, activation=None):
    if features % 16:
      return dense(config, features, axes, name, add_bias)

    def promote(inputs, kernel, bias, dtype=None, inexact=True):
      # The feed-forward's activation (`fused_activation`), applied before Flax's FP8 op.
      inputs, kernel, bias = nn.dtypes.promote_dtype(inputs, kernel, bias, dtype=dtype,
                                                     inexact=inexact)
      if activation is not None:
        inputs = modeling.activation_fn(activation)(inputs)
      return inputs, kernel, bias if add_bias else None

    return nn.Dense(
        features, dtype=config.dtype, param_dtype=config.param_dtype,
        kernel_init=nn.with_logical_partitioning(
            modeling.bert_initializer(config.initializer_range), axes),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), axes[1:]),
        dot_general_cls=nn.Fp8DirectDotGeneralOp, name=name, promote_dtype=promote)

  modeling.dense = flax_dense
  try:
    theirs = grads()
  finally:
    modeling.dense = dense
  flat = lambda tree: {jax.tree_util.keystr(p): np.asarray(v) for p, v
                       in jax.tree_util.tree_flatten_with_path(tree)[0]}
  ours, theirs = flat(ours), flat(theirs)
  assert ours.keys() == theirs.keys()
  for name, value in ours.items():
    if name.startswith(f"['{FP8}']"):
      np.testing.assert_array_equal(value, theirs[name], err_msg=name)
    else:
      np.testing.assert_allclose(value, theirs[name], rtol=1e-5, atol=1e-6, err_msg=name)
  attention = {k: v for k, v in ours.items() if "attention']['self" in k
               and k.endswith("['input_amax_history']")}
  assert len(attention) == 3 * 2 and all(v.any() for v in attention.values())


# --------------------------------------------------------------------------------- the config
def test_quantization_is_a_compute_field_checked_and_never_exported():
  with pytest.raises(ValueError, match=r"quantization='int4'; expected one of none, fp8, int8"):
    _config("int4")
  with pytest.raises(ValueError, match=r"quantization='fp8' needs unrolled, unshared layers"):
    _config("fp8", scan_layers=True)
  with pytest.raises(ValueError, match=r"share_parameters='all'"):
    configuration.get_preset("albert_base", quantization="fp8")
  config = _config("fp8")
  assert "quantization" not in hf_config.to_hf_dict(config)
  assert "quantization" not in config.to_original_dict()
  # The checkpoints' metadata (`to_hf_dict`) reads back as the same model, computed without FP8.
  again = hf_config.config_from_dict(hf_config.to_hf_dict(config))
  assert again == config.replace(quantization="none")
  # A run config selects it.
  run = ph.run_config("unused", **{"model.quantization": "fp8"})
  assert pretraining.bert_config_from(run, platform="gpu").quantization == "fp8"


def test_fp8_model_has_the_parameters_of_the_model_without():
  ids = jnp.zeros((2, ph.SEQ), jnp.int32)
  slots = jnp.zeros((2, ph.PRED), jnp.int32)

  def variables(quantization):
    model = heads.BertForPreTraining(_config(quantization))
    return nn.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), ids, ids, ids, slots))

  plain, fp8 = variables("none"), variables("fp8")
  shapes = lambda tree: {"/".join(str(k.key) for k in path): (leaf.shape, leaf.dtype)
                         for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
  assert shapes(fp8["params"]) == shapes(plain["params"])
  assert set(plain) == {"params"} and set(fp8) == {"params", FP8}
  layers = set(_fp8_ops(fp8))
  # Every dense layer of width a multiple of 16 computes in FP8; NSP's two logits do not.
  dense = {n.rsplit("/", 1)[0] for n in shapes(plain["params"]) if n.endswith("/kernel")}
  assert layers == {n for n in dense if "seq_relationship" not in n}, dense ^ layers
  assert len(layers) == 2 * 6 + 2  # per layer q, k, v, out, ffn in/out; pooler; MLM transform


# ------------------------------------------------------------------------------- the training
@pytest.mark.slow
def test_fp8_training_tracks_float32(runs):
  """FP8 rounds inputs and kernels to 3 mantissa bits (up to 2^-4 relative per element) and
  output gradients to 2: the losses differ by ~1e-2 (0.009 measured over these 8 steps, where
  bfloat16 differs by 0.001). 0.05 is five times that and under a sixth of what both runs learn
  (0.34). The loss alone hardly sees the scaling, though: with the scales frozen at 1 it still
  tracks for 8 steps (the embeddings learn). So the test also compares where each kernel went:
  with the scales updated, every FP8 kernel's total update points the float32 one's way
  (cosine >= 0.81 measured); frozen at 1, the attention projections' output gradients
  underflow e5m2 and their kernels stay put (cosine 0.01)."""
  plain, fp8 = np.asarray(runs["none"]["loss"]), np.asarray(runs["fp8"]["loss"])
  assert np.all(np.isfinite(fp8))
  assert plain[0] - plain[-1] > 0.25, plain  # learning, so the comparison means something
  assert np.abs(fp8 - plain).max() <= 0.05, (fp8, plain)
  assert fp8[0] - fp8[-1] >= 0.8 * (plain[0] - plain[-1]), (fp8, plain)

  def updates(run):
    before = jax.tree_util.tree_flatten_with_path(run["states"][0].params)[0]
    after = jax.tree.leaves(run["last"].params)
    return {"/".join(str(k.key) for k in path): np.asarray(b) - np.asarray(a)
            for (path, a), b in zip(before, after) if path[-1].key == "kernel"}

  plain_updates, fp8_updates = updates(runs["none"]), updates(runs["fp8"])
  cosines = {name: float(np.sum(u * fp8_updates[name])
                         / (np.linalg.norm(u) * np.linalg.norm(fp8_updates[name])))
             for name, u in plain_updates.items()}
  assert min(cosines.values()) >= 0.6, cosines


def test_stacked_layers_run_unrolled_train_as_the_unrolled_layers(runs):
  """FP8 with the layers' parameters stacked and run unrolled (`stack_unrolled`): each layer
  keeps its own FP8 op and scales, stored stacked like the parameters (one update kernel per
  stacked leaf), and the run is the unrolled run's: the same losses, and after as many steps
  the same scales and histories, layer by layer."""
  steps = 2  # `runs` keeps the states after steps 1 and 2
  stacked = _train("fp8", _copy_task_batches(STEPS)[:steps], scan_layers=True,
                   stack_unrolled=True)
  np.testing.assert_allclose(stacked["loss"], runs["fp8"]["loss"][:steps], atol=1e-6, rtol=0)
  assert stacked["last"].params["bert"]["encoder"]["layer"]["output"]["dense"]["kernel"].shape[
      0] == 2
  state = stacked["last"].model_state
  assert state[FP8]["bert"]["encoder"]["layer"]["output"]["dense"][OP][
      "input_amax_history"].shape[0] == 2
  per_layer = _fp8_ops(modeling.unstack_layers(state, 2))
  unrolled = _fp8_ops(runs["fp8"]["states"][steps].model_state)
  assert per_layer.keys() == unrolled.keys()
  for layer, variables in unrolled.items():
    for name, value in variables.items():
      np.testing.assert_allclose(per_layer[layer][name], value, rtol=1e-6, atol=0,
                                 err_msg=f"{layer}/{name}")


def test_fused_layer_norm_sites_train_fp8_as_xla_sites(runs):
  """FP8 with each block's dense bias, dropout (off here), residual add and LayerNorm in the
  fused kernels (`layer_norm_implementation="pallas"`, interpreted on the CPU) and stacked
  layers: the unrolled FP8 run's losses, and FP8 ops that the fused sites leave in place."""
  steps = 2
  fused = _train("fp8", _copy_task_batches(STEPS)[:steps], scan_layers=True,
                 stack_unrolled=True, layer_norm_implementation="pallas")
  np.testing.assert_allclose(fused["loss"], runs["fp8"]["loss"][:steps], atol=1e-5, rtol=0)
  assert _fp8_ops(modeling.unstack_layers(fused["last"].model_state, 2)).keys() == _fp8_ops(
      runs["fp8"]["last"].model_state).keys()


def test_scales_are_overwritten_by_the_backward_pass_each_step(runs):
  """Step 1 starts from empty histories: its scales stay 1 and each history gets the step's
  amax. Step 2's scales are then exactly amax / format max of step 1's histories, and step 2
  rolls the histories by one. An optimizer update of these variables would give neither."""
  initial = _fp8_ops(runs["fp8"]["states"][0].model_state)
  one = _fp8_ops(runs["fp8"]["states"][1].model_state)
  two = _fp8_ops(runs["fp8"]["states"][2].model_state)
  for layer in initial:
    assert all(np.all(initial[layer][s] == 1) for s in ("input_scale", "kernel_scale",
                                                        "output_grad_scale")), layer
    for kind, fmax in (("input", E4M3_MAX), ("kernel", E4M3_MAX), ("output_grad", E5M2_MAX)):
      history = one[layer][f"{kind}_amax_history"]
      assert np.all(one[layer][f"{kind}_scale"] == 1), (layer, kind)
      assert history[0] > 0 and not history[1:].any(), (layer, kind)
      np.testing.assert_allclose(two[layer][f"{kind}_scale"], history[0] / fmax, rtol=1e-6)
      assert two[layer][f"{kind}_amax_history"][-1] == history[0], (layer, kind)
      assert two[layer][f"{kind}_amax_history"][0] > 0, (layer, kind)
  # ...and they go on changing.
  last = _fp8_ops(runs["fp8"]["last"].model_state)
  assert any(not np.array_equal(last[l]["input_scale"], two[l]["input_scale"]) for l in last)


def test_the_optimizer_never_sees_the_scales(runs):
  """No Adam moments for them (the optimizer state is the float32 model's), and no part in
  the gradient norm that clipping uses: amaxes of 1-4 would dominate the norm if they were."""
  plain, fp8 = runs["none"]["last"], runs["fp8"]["last"]
  assert (jax.tree.structure(fp8.opt_state) == jax.tree.structure(plain.opt_state))
  assert jax.tree.map(np.shape, fp8.opt_state) == jax.tree.map(np.shape, plain.opt_state)
  assert jax.tree.structure(fp8.params) == jax.tree.structure(plain.params)
  np.testing.assert_allclose(runs["fp8"]["grad_norm"], runs["none"]["grad_norm"], rtol=0.1)
  assert plain.model_state == {}


def test_accumulation_gives_the_scales_of_the_whole_batch(runs):
  """4 micro-batches give the state of one step on the whole batch (the maximum of their
  amaxes), not 4 times it (a sum) nor a quarter batch's (the last micro-batch)."""
  for step in (1, 2):
    whole = _fp8_ops(runs["fp8"]["states"][step].model_state)
    micro = _fp8_ops(runs["fp8_k4"]["states"][step].model_state)
    for layer in whole:
      for name, value in whole[layer].items():
        np.testing.assert_allclose(micro[layer][name], value, rtol=1e-4, atol=0,
                                   err_msg=f"step {step} {layer} {name}")
  np.testing.assert_allclose(runs["fp8_k4"]["loss"], runs["fp8"]["loss"][:2], atol=1e-3)


@dataclasses.dataclass(frozen=True)
class _SequenceMean(Objective):
  """A loss on the sequence output: the pooler is built but never reaches it."""
  name: str = "sequence_mean"

  @property
  def input_names(self):
    return ("input_ids", "input_mask", "segment_ids")

  def model(self, bert_config):
    return modeling.BertModel(bert_config)

  def batch_spec(self, batch_size):
    tokens = jax.ShapeDtypeStruct((batch_size, ph.SEQ), np.int32)
    return {"input_ids": tokens, "input_mask": tokens, "segment_ids": tokens,
            "weight": jax.ShapeDtypeStruct((batch_size,), np.float32)}

  def loss(self, outputs, batch, denominators):
    # One feature, not a mean over features (which LayerNorm makes constant).
    value = jnp.sum(jnp.square(jnp.mean(outputs["sequence_output"][..., 0], axis=1) - 1.0)
                    * batch["weight"])
    return value / denominators["examples"], {"value_sum": value}

  def summarize(self, sums):
    return {"value": float(sums["value_sum"])}


@pytest.mark.slow
def test_a_layer_outside_the_gradient_keeps_its_scales():
  """Autodiff returns zeros for the scales of a dot whose output never reaches the loss (here
  the pooler); the step keeps them instead of writing zero scales, which would turn that
  layer's output into NaN wherever it is used (evaluation, a later objective)."""
  objective = _SequenceMean()
  model = objective.model(_config("fp8"))
  mesh = sharding.create_mesh((1, 1, 1), jax.devices()[:1])
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  tx, schedule = optimizer.create_optimizer(ml_collections.ConfigDict(
      {"learning_rate": 1e-3, "total_steps": 10, "warmup_steps": 0}))
  state, state_sh = state_lib.create_train_state(model, tx, mesh, rules, 0,
                                                 objective.example_batch(8),
                                                 objective.input_names)
  step = step_lib.build_train_step(objective, model, tx, schedule, state_sh,
                                   sharding.batch_sharding(mesh), mesh, rules)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, ph.VOCAB, size=(8, ph.SEQ)).astype(np.int32)
  batch = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids),
           "weight": np.ones(8, np.float32)}
  for _ in range(2):
    state, _ = step(state, batch)
  ops = _fp8_ops(jax.device_get(state.model_state))
  pooler = ops.pop("pooler/dense")
  assert all(np.all(pooler[s] == 1) for s in ("input_scale", "kernel_scale",
                                              "output_grad_scale")), pooler
  assert not any(pooler[h].any() for h in pooler if h.endswith("history"))
  assert all(o["input_scale"][0] != 1 and o["output_grad_scale"][0] != 1
             for o in ops.values()), ops
  pooled = jax.jit(lambda p, s, b: model.apply({"params": p, **s}, b["input_ids"])
                   ["pooled_output"])(state.params, state.model_state, batch)
  assert np.all(np.isfinite(np.asarray(pooled)))


# ------------------------------------------------------------------------------ evaluation
@pytest.mark.slow
def test_evaluation_applies_the_scales_and_refuses_without_them(runs):
  run = runs["fp8"]
  model, mesh, rules, state = run["model"], run["mesh"], run["rules"], run["last"]
  batch = _copy_task_batches(1, seed=5)[0]
  batch_sh = sharding.batch_sharding(mesh)
  eval_step = step_lib.jit_eval_step(step_lib.make_eval_step(OBJECTIVE, model),
                                     run["state_sh"].params, batch_sh, mesh, rules,
                                     run["state_sh"].model_state)
  sums = jax.device_get(eval_step(state.params, batch, state.model_state))
  plain = runs["none"]
  plain_step = step_lib.jit_eval_step(step_lib.make_eval_step(OBJECTIVE, plain["model"]),
                                      plain["state_sh"].params, batch_sh, mesh, rules)
  plain_sums = jax.device_get(plain_step(plain["last"].params, batch))
  fp8_loss = OBJECTIVE.summarize(sums)["loss"]
  assert abs(fp8_loss - OBJECTIVE.summarize(plain_sums)["loss"]) <= 0.05, (sums, plain_sums)
  # The scales are applied: the same parameters with scales of 1 give another loss.
  ones = jax.tree.map(np.ones_like, state.model_state)
  assert OBJECTIVE.summarize(jax.device_get(eval_step(state.params, batch, ones)))["loss"] \
      != fp8_loss
  refusal = r"dense layers in FP8 \(BertConfig.quantization='fp8'\).*model_state"
  with pytest.raises(ValueError, match=refusal):
    step_lib.jit_eval_step(step_lib.make_eval_step(OBJECTIVE, model), run["state_sh"].params,
                           batch_sh, mesh, rules)(state.params, batch)
  predictor = inference.Predictor(model, OBJECTIVE.input_names)
  with pytest.raises(ValueError, match=refusal):
    predictor(predictor.place(state.params), batch, 16, trim=False, progress=False)


# ---------------------------------------------------------------------------- checkpoints
def test_states_without_scales_keep_their_checkpoint_tree(runs):
  """Checkpoints of models without FP8 hold what they always held (and old ones restore);
  FP8 states add `model_state` beside the parameters."""
  plain, fp8 = runs["none"]["last"], runs["fp8"]["last"]
  tree = flax.serialization.to_state_dict(plain)  # what checkpointing saves
  assert set(tree) == {"step", "params", "opt_state", "rng"}
  assert set(flax.serialization.to_state_dict(fp8)) == set(tree) | {"model_state"}
  back = flax.serialization.from_state_dict(plain, tree)
  assert jax.tree.structure(back) == jax.tree.structure(plain)
  fp8_tree = flax.serialization.to_state_dict(fp8)
  again = flax.serialization.from_state_dict(fp8, fp8_tree)
  assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(again.model_state),
                                                  jax.tree.leaves(fp8.model_state)))


@pytest.mark.slow
def test_fp8_run_resumes_exactly(tmp_path):
  """6 steps, or 3 then a resume to 6 (the checkpoint of step 3 holds the scales): the same
  losses and the same parameters and scales, bit for bit; evaluation runs with the scales."""
  records = ph.write_records(str(tmp_path / "data"))
  settings = {"model.quantization": "fp8", "model.hidden_dropout_prob": 0.1,
              "checkpoint_every_steps": 3, "eval_every_steps": 3}
  straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
  out = pretraining.train_and_evaluate(ph.run_config(records, train_until_step=6, **settings),
                                       straight)
  assert np.isfinite(out["eval/loss"]), out
  pretraining.train_and_evaluate(ph.run_config(records, train_until_step=3, **settings),
                                 resumed)
  pretraining.train_and_evaluate(ph.run_config(records, train_until_step=6, **settings),
                                 resumed)

  def losses(workdir):
    return {r["step"]: r["train/loss"] for r in
            metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl")) if "train/loss" in r}
  a, b = losses(straight), losses(resumed)
  # The first step of each start is compilation and not logged.
  assert sorted(a) == [2, 3, 4, 5, 6] and sorted(b) == [2, 3, 5, 6], (a, b)
  assert all(a[s] == b[s] for s in b), (a, b)
  for subtree in ("params", "model_state"):
    a, _ = checkpoint_store.load_params(os.path.join(straight, "checkpoints"), subtree=subtree)
    b, meta = checkpoint_store.load_params(os.path.join(resumed, "checkpoints"), subtree=subtree)
    assert meta["step"] == 6
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    if subtree == "model_state":
      ops = _fp8_ops(b)
      assert len(ops) == 14 and all(o["input_scale"][0] != 1 for o in ops.values())


def test_the_gpu_fp8_checks_pass_in_the_interpreter(tmp_path):
  """`benchmarks/fp8_checks.py`, which the GPU suite runs with its checks, on the CPU at small
  shapes: every check passes and every timing runs."""
  text = helpers.run_device_checks(
      "fp8_checks.py", tmp_path / "checks.md", "--rows=256", "--width=64", "--features=128",
      "--check_rows=100", "--steps=1", "--repeats=1")
  assert text.count("- PASS") == 13 and "FAIL" not in text, text
  assert text.count("(**") == 3, text


def _dense_state(rng, length=16):
  """A dense layer's six FP8 variables with histories of earlier steps in them."""
  history = lambda top: np.concatenate([rng.uniform(top / 10, top, 3), np.zeros(length - 3)])
  return tuple(jnp.asarray(a, jnp.float32) for a in (
      [1.0], history(8.0), [1.0], history(0.5), [1.0], history(2e-3)))


@pytest.mark.mesh
@pytest.mark.parametrize("mesh_shape,length_axis", [((4, 1, 1), None), ((2, 1, 2), "model")])
def test_the_kernel_runs_per_device_under_a_mesh(mesh_shape, length_axis):
  """Split over devices (rows by batch, and by length too), each device's rows go through the
  kernel in `shard_map` (interpreted here): the output, the input's gradient and the new FP8
  variables are those of XLA's quantization to the bit, the kernel's and bias's gradients to
  float32's rounding (the order of the sum over rows)."""
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(8, 16, 32)) * 3, jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(32, 48)) * 0.2, jnp.float32)
  bias = jnp.asarray(rng.normal(size=(48,)), jnp.float32)
  cotangent = jnp.asarray(rng.normal(size=(8, 16, 48)) * 1e-3, jnp.float32)
  state = _dense_state(rng)
  mesh = sharding.create_mesh(list(mesh_shape), devices=jax.devices()[:4])
  rules = tuple((name, length_axis if name == modeling.LENGTH else axes)
                for name, axes in sharding.DEFAULT_LOGICAL_AXIS_RULES)

  def step(implementation):
    def loss(x, kernel, bias, state):
      y = fp8.fp8_dense(x, kernel, bias, state, implementation=implementation)
      return jnp.sum(y * cotangent), y
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True))

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    x = jax.device_put(x, NamedSharding(mesh, PartitionSpec(("data", "fsdp"), length_axis)))
    jaxpr = str(jax.make_jaxpr(step("pallas"))(x, kernel, bias, state))
    (grads, y), (want, want_y) = (step(impl)(x, kernel, bias, state)
                                  for impl in ("pallas", "xla"))
  assert "shard_map" in jaxpr and "pallas_call" in jaxpr
  np.testing.assert_array_equal(np.asarray(y), np.asarray(want_y))
  np.testing.assert_array_equal(np.asarray(grads[0]), np.asarray(want[0]))
  for got, expected in zip(grads[3], want[3]):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
  assert float(grads[3][0][0]) != 1.0  # the scales moved: the histories were used
  for got, expected in zip(grads[1:3], want[1:3]):
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-7)
