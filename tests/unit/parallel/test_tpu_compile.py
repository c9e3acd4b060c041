"""The production step compiled for real TPU topologies on this CPU machine (libtpu's compile-only
devices): every objective builds, fits and communicates as its sharding says; the Pallas kernels
compile through Mosaic; a step that cannot fit is refused with the fix; slice names, the HLO
cost reader and the launcher's own slice arithmetic agree.

The TPU compiles run in one subprocess (libtpu stays out of the test session's JAX) and each
test reads its part of the result.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bert_jax.parallel import hlo_costs
from bert_jax.parallel import tpu_slices
from bert_jax.runs import compile_check
from tests import pretrain_helpers as ph

# Each case: objective recipe, slice, config overrides. The tiny model of the tests, rows of 64
# (128 for the Pallas kernels, whose block is 128).
CASES = {
    "mlm_nsp_dp": ("tiny", "v4-8", {}),
    "mlm_packed_pallas": ("roberta_base", "v5litepod-4", {
        "data.packing": True, "data.max_sequences_per_row": 3, "data.max_seq_length": 128,
        "model.attention_implementation": "pallas", "model.attention_probs_dropout_prob": 0.0}),
    "mlm_nsp_pallas_dropout": ("tiny", "v6e-4", {
        "data.max_seq_length": 128, "model.attention_implementation": "pallas", "model.attention_probs_dropout_prob": 0.1}),
    "mlm_sop": ("albert_base", "v5p-8", {}),
    "mlm_sbo": ("spanbert_base", "v4-8", {}),
    "electra": ("electra_small", "v4-8", {}),
    "distill": ("distilbert", "v4-8", {"distillation.teacher_preset": "test"}),
    "mlm_nsp_fsdp": ("tiny", "v4-8", {"mesh_shape": (1, -1, 1)}),
    "mlm_nsp_v3_cores": ("tiny", "v3-8", {}),
}

SCRIPT = r"""
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "configs"))
sys.path.insert(0, sys.argv[1])
import jax, jax.numpy as jnp
import distill as distill_configs
import pretrain as pretrain_configs
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from bert_jax.parallel import tpu_slices
from bert_jax.runs import compile_check
from tests import pretrain_helpers
cases = json.loads(sys.argv[2])
out = {}

def tiny(recipe, overrides):
  config = (distill_configs.get_config("distilbert") if recipe == "distilbert"
            else pretrain_configs.get_config(recipe))
  generator = {"generator_hidden_size": 32, "generator_num_hidden_layers": 1} \
      if recipe.startswith("electra") else {}
  config.model.update(vocab_size=512, hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=128, max_position_embeddings=256,
                      embedding_size=None if not recipe.startswith(("albert", "electra"))
                      else 32, **generator)
  config.data.max_seq_length, config.data.max_predictions_per_seq = 64, 10
  config.mesh_shape = (-1, 1, 1)
  config.global_batch_size = 32
  return pretrain_helpers.set_fields(config, overrides)

for name, (recipe, accelerator, overrides) in cases.items():
  try:
    report = compile_check.check(tiny(recipe, overrides), accelerator, config_name=name)
  except Exception as e:  # reported by the case's test
    out[name] = {"error": f"{type(e).__name__}: {e}"}
    continue
  out[name] = {**report.as_dict(), "lines": report.lines()}

# A step that cannot fit: refused, with the fix.
big = tiny("tiny", {})
big.global_batch_size, big.data.max_seq_length, big.data.max_predictions_per_seq = 16384, 128, 20
try:
  compile_check.check(big, "v5litepod-4", config_name="big")
  out["refused"] = None
except compile_check.DoesNotFit as e:
  out["refused"] = str(e)
# A mesh laid over another number of devices than the slice has.
try:
  compile_check.check(tiny("base", {"mesh_shape": [16, 1, 1]}), "v4-8")
  out["mesh_mismatch"] = None
except ValueError as e:
  out["mesh_mismatch"] = str(e)

# The Pallas kernels alone, compiled by Mosaic for one chip: JAX's splash attention with segment
# ids, and the in-kernel-dropout kernel drawing from the hardware PRNG.
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
from bert_jax.model import pallas_attention
device = tpu_slices.topology_devices("v5litepod-4")[:1]
one = NamedSharding(Mesh(device, ("x",)), P())
heads, length, dim = 4, 256, 64
q = jax.ShapeDtypeStruct((heads, length, dim), jnp.bfloat16, sharding=one)
ids = jax.ShapeDtypeStruct((length,), jnp.int32, sharding=one)
kernel = splash.make_splash_mha(masks.MultiHeadMask([masks.FullMask((length, length))] * heads),
                                head_shards=1, q_seq_shards=1)
compiled = jax.jit(lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(s, s))
                   ).lower(q, q, q, ids).compile()
out["splash"] = compiled.as_text().count("tpu_custom_call")
x = jax.ShapeDtypeStruct((2, length, heads, dim), jnp.bfloat16, sharding=one)
seg = jax.ShapeDtypeStruct((2, length), jnp.int32, sharding=one)
seed = jax.ShapeDtypeStruct((), jnp.int32, sharding=one)
def loss(q, k, v, s, seed):
  o = pallas_attention.flash_attention(q, k, v, s, dropout_rate=0.1, seed=seed, prng="hardware",
                                       interpret=False)
  return o.astype(jnp.float32).sum()
compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x, seg, seed).compile()
out["dropout_kernel"] = compiled.as_text().count("tpu_custom_call")
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled():
  return ph.script_result(SCRIPT, ph.REPO, json.dumps(CASES))


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_objective_compiles_and_fits_a_tpu_slice(compiled, case):
  row = compiled[case]
  assert "error" not in row, row.get("error")
  recipe, accelerator, _ = CASES[case]
  slice_ = tpu_slices.parse(accelerator)
  assert row["fits"] and row["slice"] == accelerator and row["devices"] == slice_.devices
  assert 0 < row["hbm_bytes"] < row["hbm_capacity"] == slice_.chip.usable_hbm_per_device
  # The matmul FLOPs read from the compiled HLO (scanned layers' loop counted) agree with the
  # objective's analytic count; a Pallas kernel's attention matmuls are not HLO dots.
  per_device = row["analytic_flops"] / row["devices"]
  ratio = row["matmul_flops"] / per_device
  assert (0.5 < ratio < 1.0) if "pallas" in case else abs(ratio - 1) < 0.1, ratio
  assert 0 < row["mfu"] <= 1  # the roofline bound never exceeds the chip's peak
  assert row["largest_batch_per_device"] >= row["batch_per_device"]
  kinds = set(row["collectives"])
  if case == "mlm_nsp_fsdp":
    # FSDP: each device holds a quarter of the state and gathers parameters for use.
    assert "all-gather" in kinds, kinds
    assert row["argument_bytes"] < 0.35 * compiled["mlm_nsp_dp"]["argument_bytes"]
  else:
    # Data parallel: the gradient all-reduce over every device, and nothing else.
    assert kinds == {"all-reduce"}, kinds
    reduce = row["collectives"]["all-reduce"]
    assert reduce["max_group"] == slice_.devices
    # Every trained parameter's gradient, once (in bfloat16 where XLA reduces before the cast
    # to float32); distillation's teacher, here as large as the student, is frozen.
    trained = row["num_parameters"] * (0.5 if case == "distill" else 1.0)
    assert 2 * trained * 0.95 <= reduce["bytes"] <= 4 * trained * 1.05, reduce
  if "pallas" in case:
    assert row["custom_kernels"] > 0  # the attention is the Pallas kernel, compiled by Mosaic
  else:
    assert row["custom_kernels"] == 0


def test_two_devices_per_chip_where_jax_sees_each_core(compiled):
  v3, v4 = compiled["mlm_nsp_v3_cores"], compiled["mlm_nsp_dp"]
  assert (v3["chips"], v3["devices"], v4["chips"], v4["devices"]) == (4, 8, 4, 4)
  assert v3["batch_per_device"] * 2 == v4["batch_per_device"] == 8
  assert v3["hbm_capacity"] < 16 * 2**30 < v4["hbm_capacity"]


def test_pallas_kernels_compile_through_mosaic(compiled):
  assert compiled["splash"] > 0
  assert compiled["dropout_kernel"] >= 2  # forward and backward kernels


def test_a_step_that_cannot_fit_is_refused_with_the_fix(compiled):
  message = compiled["refused"]
  assert message is not None
  assert "v5litepod-4" in message and "GiB" in message
  assert "--config.grad_accum_steps=" in message and "remat_policy" in message
  assert "mesh_shape=1,-1,1" in message


def test_a_mesh_of_another_size_than_the_slice_is_refused(compiled):
  assert "mesh_shape=(16, 1, 1)" in compiled["mesh_mismatch"]
  assert "v4-8 has 4" in compiled["mesh_mismatch"]


@pytest.mark.parametrize("name, chips, devices, hosts, topology", [
    ("v2-8", 4, 8, 1, "v2:2x2"),
    ("v3-32", 16, 32, 4, "v3:4x4"),
    ("v3-128", 64, 128, 16, "v3:8x8"),
    ("v4-32", 16, 16, 4, "v4:2x2x4"),
    ("v4-128", 64, 64, 16, "v4:4x4x4"),
    ("v5p-64", 32, 32, 8, "v5:2x4x4"),
    ("v5litepod-1", 1, 1, 1, "v5e:1x1"),
    ("v5e-16", 16, 16, 4, "v5e:4x4"),
    ("v6e-64", 64, 64, 16, "v6e:8x8"),
    ("v6e-128", 128, 128, 32, "v6e:8x16"),
    ("v4:4x4x12", 192, 192, 48, "v4:4x4x12"),
])
def test_slice_names_as_users_type_them(name, chips, devices, hosts, topology):
  s = tpu_slices.parse(name)
  assert (s.chips, s.devices, s.hosts, s.topology) == (chips, devices, hosts, topology)


@pytest.mark.parametrize("name, message", [
    ("v4-12", "multiples of 8"), ("v7-8", "not a TPU type"), ("v5e-12", "power of two"),
    ("v4:2x2", "3 dimensions"),
])
def test_bad_slice_names_say_what_is_expected(name, message):
  with pytest.raises(ValueError, match=message):
    tpu_slices.parse(name)


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["v2-8", "v3-16", "v4-64", "v5litepod-16", "v5p-32", "v6e-8",
                                  "v6e-64"])
def test_the_launcher_counts_a_slice_as_the_library_does(name, tmp_path):
  s = tpu_slices.parse(name)
  launcher = os.path.join(ph.REPO, "launch", "tpu_pretrain.sh")
  proc = subprocess.run(
      ["bash", launcher, "--dry_run", "--skip_compile_check", "--tpu=t", "--zone=z",
       f"--accelerator={name}", "--config=tiny", "--data=gs://b/*.tfrecord",
       "--workdir=gs://b/w"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert f"{name}: {s.chips} chips, {s.devices} JAX devices, {s.hosts} worker(s)" in proc.stderr


@pytest.mark.mesh
def test_hlo_costs_count_loops_and_collectives_on_a_real_compiled_program():
  """A scanned matmul and a psum over the test session's 8 CPU devices: the HLO reader counts
  the loop's iterations and finds the all-reduce with its group and bytes."""
  mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
  w = jnp.ones((5, 64, 128), jnp.float32)
  x = jnp.ones((8 * 4, 64), jnp.float32)

  def step(w, x):
    def body(h, wi):
      return jnp.tanh(h @ wi[:, :64] + (h @ wi)[:, 64:]), None
    h, _ = jax.lax.scan(body, x, w)
    return jnp.sum(h)

  grad = jax.jit(jax.grad(step), in_shardings=(NamedSharding(mesh, P()),
                                               NamedSharding(mesh, P("data"))),
                 out_shardings=NamedSharding(mesh, P()))
  module = hlo_costs.parse(grad.lower(w, x).compile().as_text())
  # Forward: 2 matmuls of 4x64 by 64x64 and 64x128 per layer and device; backward twice that.
  forward = 5 * 2 * 4 * 64 * (64 + 128)
  assert 2.5 * forward <= hlo_costs.matmul_flops(module) <= 3.2 * forward
  found = hlo_costs.summarize(hlo_costs.collectives(module, 8))
  assert found["all-reduce"]["max_group"] == 8
  assert found["all-reduce"]["bytes"] >= 5 * 64 * 128 * 4  # the weights' gradient
  assert hlo_costs.hbm_bytes(module) > 5 * 64 * 128 * 4


@pytest.mark.slow
@pytest.mark.e2e
def test_preflight_compiles_the_trainers_step_and_refuses_one_that_cannot_fit():
  """What the launcher runs before it creates a slice: `bert_jax.pretrain --compile_for` with
  the trainer's own flags, its report shown, exit 1 naming the fix when the step cannot fit."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  small = ["--config=configs/pretrain.py:tiny", "--config.model.preset=test",
           "--config.model.vocab_size=512", "--config.data.max_seq_length=64",
           "--config.data.max_predictions_per_seq=10", "--config.global_batch_size=32"]
  preflight = [sys.executable, os.path.join(ph.REPO, "launch", "preflight.py")]
  ok = subprocess.run([*preflight, "--compile_for=v5litepod-4", "--", *small], env=env,
                      capture_output=True, text=True, timeout=600)
  assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
  assert "compiled for v5litepod-4: 4 TPU v5 lite chips" in ok.stdout
  assert "collectives per step: all-reduce" in ok.stdout and "MFU <=" in ok.stdout
  big = [*small, "--config.global_batch_size=65536", "--config.data.max_seq_length=120"]
  refused = subprocess.run([*preflight, "--compile_for=v5litepod-4", "--", *big], env=env,
                           capture_output=True, text=True, timeout=600)
  assert refused.returncode == 1, refused.stdout[-3000:]
  assert "FAILED" in refused.stderr and "does not fit" in refused.stderr
  assert "--config.grad_accum_steps=" in refused.stdout


@pytest.mark.parametrize("temp_gib, argument_gib, expected", [
    (4.0, 2.0, None),  # temporaries 0.5 GiB per sequence: the room left over that
    (0.0, 2.0, 8),     # none in HBM: no growth to extrapolate, the batch compiled
    (0.0, 20.0, 0)])   # none, and the step does not fit
def test_the_largest_batch_extrapolates_the_temporaries(temp_gib, argument_gib, expected):
  """A v5e chip (15.75 GiB usable), 8 sequences per device compiled."""
  slice_ = tpu_slices.parse("v5litepod-4")
  gib = 2 ** 30
  report = compile_check.Report(
      config_name="x", slice=slice_, mesh={"data": 4}, batch_per_device=8, seq_length=128,
      grad_accum_steps=1, num_parameters=1, argument_bytes=int(argument_gib * gib),
      output_bytes=0, alias_bytes=0, temp_bytes=int(temp_gib * gib), code_bytes=0,
      xla_flops=1.0, matmul_flops=1.0, analytic_flops=1.0, hbm_traffic=1.0, collectives={},
      steps=1, compile_seconds=1.0)
  if expected is None:
    expected = int((slice_.chip.usable_hbm_per_device - argument_gib * gib) // (gib / 2))
    assert expected == 27
  assert report.largest_batch_per_device == expected
