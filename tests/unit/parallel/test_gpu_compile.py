"""The production step compiled for NVIDIA GPUs on this CPU machine (XLA's GPU compiler through
JAX's CUDA plugin, told the GPU's description instead of asking a device): the paper's recipe
lowers attention with its dropout to cuDNN's fused kernel forward and backward, stacked layers
run unrolled take fewer optimizer kernels, the fused dropout + residual + LayerNorm kernels
replace XLA's at every block, FP8 matmuls reach the GEMMs as FP8 (cuBLASLt's FP8 GEMM where
cuBLAS takes them, under the plugin's CUDA runtime; each operand written by one kernel, the
attention input quantized once, GELU applied by that kernel) and every other GEMM reads
bfloat16 operands (the tied decoder's gradient matmuls too), eight GPUs reduce their gradients
over NVLink, the low-precision LayerNorm, GELU recomputed in the backward pass and computed in
float32, the gather-free masked-LM loss, LayerNorm outputs written once, LayerNorm statistics
in one pass, dropout masks kept as bits and the key projection without its bias each move fewer
bytes than what they replace, the fused sites add their consumers' gradients in their own
backward kernel and keep the query and key GEMMs apart, GELU's tanh form runs in cuBLASLt's
GEMM epilogue, each kernel is counted in the part of the step it serves, a step that cannot
fit is refused with the fix, fine-tuning in bfloat16 takes the same fused kernels, and names
and errors say what is expected.

The compiles run in one fresh subprocess (JAX registers plugins once, when it starts) and each
test reads its part of the result.
"""

import collections
import json

import pytest

from bert_jax.parallel import gpu_targets
from bert_jax.parallel import hlo_costs
from tests import pretrain_helpers as ph

LAYERS = 2
# Each case: GPU machine, config overrides over the tiny model below (bfloat16 compute, as
# cuDNN's attention requires; the explicit attention path, XLA's LayerNorm and unrolled layers
# unless a case says otherwise, where a GPU would otherwise take the fused defaults).
CASES = {
    "paper_cudnn": ("h100", {"model.attention_implementation": "cudnn",
                             "model.attention_probs_dropout_prob": 0.1}),
    "fast_cudnn": ("h200", {"model.attention_implementation": "cudnn",
                            "model.attention_probs_dropout_prob": 0.0}),
    "paper_cudnn_f32_layer_norm": ("h100", {"model.attention_implementation": "cudnn",
                                            "model.attention_probs_dropout_prob": 0.1,
                                            "model.low_precision_layer_norm": False}),
    "paper_cudnn_stacked": ("h100", {"model.attention_implementation": "cudnn",
                                     "model.attention_probs_dropout_prob": 0.1,
                                     "model.scan_layers": True, "model.stack_unrolled": True}),
    "paper_cudnn_stacked_deeper": ("h100", {"model.attention_implementation": "cudnn",
                                            "model.attention_probs_dropout_prob": 0.1,
                                            "model.scan_layers": True,
                                            "model.stack_unrolled": True,
                                            "model.num_hidden_layers": 2 * LAYERS}),
    "paper_cudnn_fused_ln": ("h100", {"model.attention_implementation": "cudnn",
                                      "model.attention_probs_dropout_prob": 0.1,
                                      "model.layer_norm_implementation": "pallas"}),
    # Attention dropout inside our Triton kernels, with the fused sites, stacked layers.
    "paper_pallas": ("h100", {"model.attention_implementation": "pallas",
                              "model.attention_probs_dropout_prob": 0.1,
                              "model.layer_norm_implementation": "pallas",
                              "model.scan_layers": True, "model.stack_unrolled": True}),
    "fp8": ("h100", {"model.quantization": "fp8"}),
    "dp8": ("h100x8", {"model.attention_implementation": "cudnn"}),
    "a100": ("a100", {}),
    # Nothing set: what a GPU of this kind runs by default (`pretraining.platform_defaults`).
    "h200_defaults": ("h200", {"model.attention_implementation": None,
                               "model.layer_norm_implementation": None,
                               "model.scan_layers": None}),
}

SCRIPT = r"""
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "configs"))
sys.path.insert(0, sys.argv[1])
from bert_jax.parallel import gpu_targets
gpu_targets.find_plugin()  # before anything starts JAX
import pretrain as pretrain_configs
from bert_jax.parallel import hlo_costs
from bert_jax.runs import compile_check
from tests import pretrain_helpers
cases = json.loads(sys.argv[2])
out = {}

def tiny(overrides, hidden=64):
  config = pretrain_configs.get_config("tiny")
  config.model.update(vocab_size=512, hidden_size=hidden, num_hidden_layers=%d,
                      num_attention_heads=hidden // 16, intermediate_size=4 * hidden,
                      dtype="bfloat16", attention_implementation="xla",
                      layer_norm_implementation="xla", scan_layers=False)
  config.data.max_seq_length, config.data.max_predictions_per_seq = 128, 20
  config.mesh_shape = (-1, 1, 1)
  config.global_batch_size = 64
  return pretrain_helpers.set_fields(config, overrides)

for name, (machine, overrides) in cases.items():
  try:
    report = compile_check.check(tiny(overrides), machine, config_name=name)
  except Exception as e:  # reported by the case's test
    out[name] = {"error": f"{type(e).__name__}: {e}"}
    continue
  text = report.hlo_text
  out[name] = {**report.as_dict(), "lines": report.lines(),
               "f8e4m3fn": text.count("f8e4m3fn"), "f8e5m2": text.count("f8e5m2"),
               "hlo_bytes": len(text),
               "pallas_kernels": hlo_costs.pallas_kernels(text),
               "operand_types": hlo_costs.matmul_operand_types(hlo_costs.parse(text))}

# The same step with one change swapped back at a time (GELU differentiated as it is or with
# jax.nn.gelu's forward, the loss as log_softmax and a gather, LayerNorm without its barrier or
# with two-pass statistics, dropout masks as bytes, the key's bias added): what each saves.
from bert_jax.model import dropout, modeling
from bert_jax.objectives import mlm
import contextlib, jax, jax.numpy as jnp

@contextlib.contextmanager
def swapped(module, attr, stand_in):
  kept = getattr(module, attr)
  setattr(module, attr, stand_in)
  try:
    yield
  finally:
    setattr(module, attr, kept)

paper = cases["paper_cudnn"][1]
from benchmarks.head_checks import gathered  # log_softmax and a gather, as written
as_is = lambda x, approximate: jax.nn.gelu(x, approximate=approximate)
# Our GELU's backward with jax.nn.gelu's forward (erfc's argument rounded to bfloat16).
bf16_argument = jax.custom_vjp(as_is, nondiff_argnums=(1,))
bf16_argument.defvjp(lambda x, approximate: (as_is(x, approximate), x), modeling._gelu_bwd)
statistics = modeling._row_statistics
dense = modeling.dense
# LayerNorm outputs written once pay from a width of a few hundred (at 64 XLA fuses alike).
out["layer_norm_written"] = compile_check.check(tiny(paper, 256), "h100").traffic
from bert_jax.model import fp8 as fp8_layers
fp8 = cases["fp8"][1]
for name, module, attr, stand_in, hidden, overrides in (
    ("gelu_as_is", modeling, "gelu", as_is, 64, paper),
    ("loss_gathered", mlm, "cross_entropy", gathered, 64, paper),
    ("gelu_bf16_argument", modeling, "gelu", bf16_argument, 256, paper),
    ("layer_norm_recomputed", modeling, "_materialized", lambda x: x, 256, paper),
    ("layer_norm_two_pass", modeling, "_row_statistics",
     lambda v, epsilon, one_pass: statistics(v, epsilon, False), 256, paper),
    ("dropout_mask_bytes", dropout, "_kept_as_bits", lambda keep: keep, 256, paper),
    ("key_bias_added", modeling, "dense",
     lambda config, features, axes, name, add_bias=True, activation=None: dense(
         config, features, axes, name, activation=activation),
     256, paper)):
  with swapped(module, attr, stand_in):
    out[name] = compile_check.check(tiny(overrides, hidden), "h100", config_name=name).traffic

# The fused sites' outputs handed over as one array, their consumers' gradients summed by
# autodiff (and `fan_out`) before the site's backward kernel reads them.
from bert_jax.model import pallas_layer_norm
fused_ln = cases["paper_cudnn_fused_ln"][1]
with swapped(modeling, "sites_take_copies", lambda config: False):
  out["fused_ln_summed_apart"] = compile_check.check(
      tiny(fused_ln), "h100", config_name="fused_ln_summed_apart").traffic

# The tied decoder differentiated as written: its gradient's matmuls (what they read).
untied = lambda spec, a, b: jnp.einsum(spec, a, b.astype(a.dtype),
                                       preferred_element_type=jnp.float32)
with swapped(modeling, "float32_einsum", untied):
  text = compile_check.check(tiny(paper), "h100", config_name="decoder_as_is").hlo_text
  out["decoder_as_is"] = hlo_costs.matmul_operand_types(hlo_costs.parse(text))

# GEMMs through cuBLASLt (Triton's GEMMs off, per compile): the epilogues of the first
# feed-forward GEMM with each GELU, and with the tanh form differentiated as jax.nn.gelu does.
import re
from bert_jax.runs import pretraining
def cublas_program(overrides):
  config = pretraining.with_records_settings(tiny(overrides))
  lowered = pretraining.compile_train_step(
      config, devices=gpu_targets.topology_devices("h100"), compile_step=False)["lowered"]
  return lowered.compile(compiler_options={"xla_gpu_enable_triton_gemm": False}).as_text()
def epilogues(overrides):
  return re.findall(r'"epilogue":"(\w+)"', cublas_program(overrides))
out["epilogues"] = {act: epilogues(dict(paper, **{"model.hidden_act": act}))
                    for act in ("gelu", "gelu_new")}
# FP8's matmuls with cuBLAS's GEMMs: which GEMM calls, under the CUDA runtime the target
# describes (the plugin's) and without one.
def cublas_calls(text):
  return sorted(set(re.findall(r'custom_call_target="(__cublas[^"]*)"', text)))
out["cuda_runtime"] = gpu_targets.cuda_runtime()
out["fp8_cublas_calls"] = cublas_calls(cublas_program(fp8))
with swapped(gpu_targets, "cuda_runtime", lambda: None):
  out["fp8_cublas_calls_no_runtime"] = cublas_calls(cublas_program(fp8))
# FP8's operands quantized by the one-pass kernel, or by XLA's operations (same values): the
# kernels' outputs, the kernels of XLA's that write FP8 arrays, and the other kernels' traffic.
def quantization(text):
  other = hlo_costs.traffic_by_kind(hlo_costs.parse(text))["other"]
  return {"kernel_outputs": re.findall(r'= \((f8\w+\[[\d,]+\])[^\n]*custom_call_target='
                                       r'"__gpu\$xla.gpu.triton"', text),
          "fp8_fusions": len(re.findall(r'= \(?f8\w+\[[^\n]* fusion\(', text)),
          "other_kernels": other["count"], "other_bytes": other["bytes"]}
out["fp8_one_pass"] = quantization(cublas_program(fp8))
with swapped(fp8_layers, "_implementation", lambda implementation: "xla"):
  out["fp8_xla_quantized"] = quantization(cublas_program(fp8))
# GELU applied before the second feed-forward layer instead of by its quantization kernel.
with swapped(modeling, "fused_activation", lambda config: None):
  out["fp8_gelu_apart"] = quantization(cublas_program(fp8))
with swapped(modeling, "gelu", as_is):
  out["epilogues"]["gelu_new_as_is"] = epilogues(dict(paper, **{"model.hidden_act": "gelu_new"}))
# The attention block's input gradient summed by `fan_out`, or by autodiff in arrival order:
# GEMMs that accumulate onto their addend (cuBLAS's beta = 1), and the other kernels.
def accumulation(text):
  other = hlo_costs.traffic_by_kind(hlo_costs.parse(text))["other"]
  return {"beta_one": text.count('"beta":1'), "other_kernels": other["count"],
          "other_bytes": other["bytes"], "concatenates": text.count(" concatenate(")}
out["fan_out"] = accumulation(cublas_program(paper))
# The same copies (values of their own) summed in arrival order; and as one value.
with swapped(modeling, "fan_out", lambda x, uses: jax.lax.optimization_barrier((x,) * uses)):
  out["fan_out_as_is"] = accumulation(cublas_program(paper))
with swapped(modeling, "fan_out", lambda x, uses: (x,) * uses):
  out["fan_out_one_value"] = accumulation(cublas_program(paper))

# The fused sites' copies as one value (without their optimization barrier), with cuBLAS's
# GEMMs: XLA's dot merger joins each block's query and key GEMMs, copies the key out, and
# concatenates their output gradients for the joined weight gradient.
def joined(text):
  other = hlo_costs.traffic_by_kind(hlo_costs.parse(text))["other"]
  return {"concatenates": text.count(" concatenate("), "other_bytes": other["bytes"]}
out["copies_apart"] = joined(cublas_program(fused_ln))
with swapped(pallas_layer_norm, "_copies", lambda y, uses: (y,) * uses):
  out["copies_one_value"] = joined(cublas_program(fused_ln))

# What the defaults case was built with: the compile-only H200's compute capability, read
# from its device kind, selects the fused fields.
from bert_jax.runs import pretraining
h200 = gpu_targets.topology_devices("h200")[0]
resolved = pretraining.bert_config_from(tiny(cases["h200_defaults"][1]), h200.platform,
                                        gpu_targets.compute_capability(h200))
out["h200_defaults_config"] = {f: getattr(resolved, f) for f in (
    "attention_implementation", "layer_norm_implementation", "scan_layers", "stack_unrolled")}

# The initial state's program (`state.lower_initial_state`): its random draws through JAX's
# threefry kernel, and the same program with them lowered inline.
from bert_jax.training import state as state_lib
def init_program(threefry_kernel):
  config = pretraining.with_records_settings(tiny(paper))
  run = pretraining.build(config, gpu_targets.topology_devices("h100"))
  example = run.objective.example_batch(config.global_batch_size)
  _, state_sh = state_lib.abstract_train_state(run.model, run.tx, run.mesh, run.rules, example,
                                               run.objective.input_names)
  text = state_lib.lower_initial_state(
      run.model, run.tx, run.mesh, run.rules, example, run.objective.input_names, state_sh,
      jax.ShapeDtypeStruct((), jnp.uint32), threefry_kernel).compile().as_text()
  return {"kernels": text.count('custom_call_target="cu_threefry2x32_ffi"'),
          "xor": len(re.findall(r"\bxor\(", text))}
out["init"] = init_program(True)
out["init_inline"] = init_program(False)

# A fine-tuning step (a GLUE pair task in bfloat16, its kernels left unset) built for an H200,
# as `benchmarks/finetune_compile.py` builds it: the model as `finetune_job.compute_config`
# computes it there, and the kernels its step calls; unpacked and over packed rows.
from benchmarks import finetune_compile
from bert_jax.model import configuration
shape = tiny({}).model
tiny_model = configuration.BertConfig(
    vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
    num_hidden_layers=shape.num_hidden_layers, num_attention_heads=shape.num_attention_heads,
    intermediate_size=shape.intermediate_size)
out["finetune"] = finetune_compile.compile_row("tiny", "glue", "fused", "h200", tiny_model)
out["finetune_packed"] = finetune_compile.compile_row("tiny", "glue", "fused", "h200", tiny_model,
                                                      max_sequences_per_row=4)

# Our attention kernels, forward and backward, compiled for an H200 at every head width and
# dtype (Triton's own compile runs here: shared memory is checked against the H200's), with the
# default tiling fitted to the heads, and with the unfitted default at float32 heads of 128.
from bert_jax.model import triton_attention
def attention_compiles(head_dim, dtype, tiling=None):
  device = gpu_targets.topology_devices("h200")[0]
  whole = jax.sharding.NamedSharding(jax.sharding.Mesh([device], ("data",)),
                                     jax.sharding.PartitionSpec())
  def grads(q, k, v, ids, seed):
    loss = lambda q, k, v: jnp.sum(triton_attention.flash_attention(
        q, k, v, ids, dropout_rate=0.1, seed=seed, interpret=False, tiling=tiling))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
  qkv = jax.ShapeDtypeStruct((2, 128, 2, head_dim), dtype, sharding=whole)
  try:
    jax.jit(grads).lower(qkv, qkv, qkv, jax.ShapeDtypeStruct((2, 128), jnp.int32, sharding=whole),
                         jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=whole)).compile()
    return "ok"
  except Exception as e:
    return f"{type(e).__name__}: {str(e)[:300]}"
out["attention_widths"] = {f"{d} {dt}": attention_compiles(d, dt)
                           for d in (32, 64, 96, 128, 256) for dt in ("bfloat16", "float32")}
out["attention_unfitted"] = attention_compiles(128, "float32", triton_attention.Tiling())

big = tiny({})
big.global_batch_size = 1 << 17
try:
  compile_check.check(big, "h100", config_name="big")
  out["refused"] = None
except compile_check.DoesNotFit as e:
  out["refused"] = str(e)
print("RESULT " + json.dumps(out))
""" % LAYERS


@pytest.fixture(scope="module")
def compiled():
  return ph.script_result(SCRIPT, ph.REPO, json.dumps(CASES))


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_case_compiles_and_fits_its_gpus(compiled, case):
  row = compiled[case]
  assert "error" not in row, row.get("error")
  machine = gpu_targets.parse(CASES[case][0])
  assert row["fits"] and row["slice"] == machine.name and row["devices"] == machine.devices
  assert 0 < row["hbm_bytes"] < row["hbm_capacity"] == machine.chip.usable_hbm_per_device
  # The HLO's dots against the analytic count: all of it, or (a fused attention kernel: cuDNN's
  # or ours) all but attention's.
  ratio = row["matmul_flops"] / (row["analytic_flops"] / row["devices"])
  fused = (CASES[case][1].get("model.attention_implementation") in ("cudnn", "pallas")
           or case == "h200_defaults")
  assert (0.6 < ratio < 1.0) if fused else abs(ratio - 1) < 0.1, ratio
  assert 0 < row["mfu"] <= 1
  kinds = row["traffic"]
  assert kinds["matmul"]["count"] >= 6 * LAYERS and kinds["other"]["bytes"] > 0
  text = "\n".join(row["lines"])
  assert machine.chip.device_kind in text and "NVLink" in text and "elementwise" in text


def test_the_papers_recipe_runs_attention_dropout_inside_cudnns_kernel(compiled):
  calls = compiled["paper_cudnn"]["custom_calls"]
  assert calls.get("__cudnn$fmhaSoftmaxDropout") == LAYERS, calls
  assert calls.get("__cudnn$fmhaSoftmaxDropoutBackward") == LAYERS, calls
  assert compiled["paper_cudnn"]["custom_kernels"] == 2 * LAYERS
  fast = compiled["fast_cudnn"]["custom_calls"]
  assert fast.get("__cudnn$fmhaSoftmax") == LAYERS and not any("Dropout" in k for k in fast)
  # Without cuDNN the explicit path: no fused attention at all.
  assert not any("cudnn" in k for k in compiled["a100"]["custom_calls"])


def test_each_kernel_is_counted_in_the_part_of_the_step_it_serves(compiled):
  """`hlo_costs.traffic_by_part` on the paper's recipe: every kernel lands in one part, read
  from the module path in its op_name (LayerNorm sites, dropout, attention, projections,
  feed-forward, heads, embeddings, forward and backward) or in the optimizer; cuDNN's
  backward attention kernel, one per layer, is the whole of "backward: attention"."""
  row = compiled["paper_cudnn"]
  parts = row["parts"]
  total = sum(k["bytes"] for k in row["traffic"].values())
  assert sum(p["bytes"] for p in parts.values()) == pytest.approx(total)
  assert sum(p["count"] for p in parts.values()) == sum(k["count"]
                                                        for k in row["traffic"].values())
  for phase in ("forward", "backward"):
    for component in ("layer norm", "dropout", "attention", "q, k, v, output projections",
                      "feed-forward", "heads and loss"):
      assert parts.get(f"{phase}: {component}", {}).get("bytes", 0) > 0, (phase, component)
  # The sum of the attention block's input gradients (`modeling.fan_out`) is the projections'.
  assert "backward: other" not in parts, parts["backward: other"]
  # The embeddings' gradient is a kernel of its own (their lookup is fused into the first
  # LayerNorm's kernel, whose root names it).
  assert parts["backward: embeddings"]["bytes"] > 0
  assert parts["backward: attention"]["count"] == LAYERS
  # The update touches each parameter, its gradient and both moments: more than 4 × 4 bytes
  # per float32 parameter, and a kernel per leaf at least.
  assert parts["optimizer"]["bytes"] > 16 * row["num_parameters"]
  assert parts["optimizer"]["count"] >= 16 * LAYERS
  assert parts.get("unnamed", {}).get("bytes", 0) < 0.01 * total
  assert parts.get("forward: other", {}).get("bytes", 0) < 0.01 * total
  assert list(parts) == sorted(parts, key=lambda p: -parts[p]["bytes"])


def test_stacked_layers_take_fewer_optimizer_kernels_for_the_same_bytes(compiled):
  """The layers' parameters stacked and run unrolled (`stack_unrolled`): the same step (cuDNN's
  attention with its dropout, one call site per layer), with each stacked leaf updated and
  normed in its kernels once instead of once per layer, moving about the same bytes."""
  unrolled, stacked = compiled["paper_cudnn"], compiled["paper_cudnn_stacked"]
  deeper = compiled["paper_cudnn_stacked_deeper"]
  assert "error" not in stacked, stacked.get("error")
  assert stacked["custom_calls"] == unrolled["custom_calls"]
  assert stacked["num_parameters"] == unrolled["num_parameters"]
  optimizer = lambda row: row["parts"]["optimizer"]["count"]
  assert optimizer(stacked) < optimizer(unrolled), (optimizer(stacked), optimizer(unrolled))
  # Twice the layers, no more optimizer kernels: each stacked leaf takes its layers in the same
  # kernels (the unrolled step's optimizer takes a kernel or more per leaf of every layer).
  assert deeper["custom_calls"]["__cudnn$fmhaSoftmaxDropout"] == 2 * LAYERS
  assert optimizer(deeper) <= optimizer(stacked), (optimizer(deeper), optimizer(stacked))
  all_kernels = lambda row: sum(k["count"] for k in row["traffic"].values())
  all_bytes = lambda row: sum(k["bytes"] for k in row["traffic"].values())
  assert all_kernels(stacked) < all_kernels(unrolled)
  assert all_bytes(stacked) < 1.03 * all_bytes(unrolled)


def test_fused_layer_norm_sites_are_one_kernel_each_way_and_move_fewer_bytes(compiled):
  """`layer_norm_implementation="pallas"`: each block's two sites (attention output, feed-
  forward output) are one Triton kernel forward and one backward, and the step's dropout and
  LayerNorm kernels, and its bytes outside the matmuls, fall."""
  xla, fused = compiled["paper_cudnn"], compiled["paper_cudnn_fused_ln"]
  assert "error" not in fused, fused.get("error")
  assert fused["custom_calls"]["__gpu$xla.gpu.triton"] == 2 * 2 * LAYERS
  assert "__gpu$xla.gpu.triton" not in xla["custom_calls"]
  parts = ("forward: layer norm", "backward: layer norm", "forward: dropout",
           "backward: dropout")
  kernels = lambda row: sum(row["parts"].get(p, {}).get("count", 0) for p in parts)
  moved = lambda row: sum(row["parts"].get(p, {}).get("bytes", 0) for p in parts)
  assert kernels(fused) < 0.8 * kernels(xla), (kernels(fused), kernels(xla))
  assert moved(fused) < 0.85 * moved(xla), (moved(fused), moved(xla))
  other = lambda row: row["traffic"]["other"]
  assert other(fused)["count"] < other(xla)["count"]
  assert other(fused)["bytes"] < other(xla)["bytes"]
  # The matmuls are the same (the dense layers' biases moved into the kernels).
  assert fused["traffic"]["matmul"]["count"] == xla["traffic"]["matmul"]["count"]


def test_fused_sites_add_their_consumers_gradients_in_their_backward_kernel(compiled):
  """With the fused sites each hands its output to its consumers as copies
  (`modeling.sites_take_copies`): the attention output to the feed-forward block and its
  residual, a block's output to the next block's residual, query, key and value. Their
  gradients are added inside the site's backward kernel, so the kernels of XLA's that added
  them (one per site whose output has several consumers: 2 x layers - 1) are gone, and with
  them the sums they wrote and the kernel read again."""
  copies = compiled["paper_cudnn_fused_ln"]["traffic"]["other"]
  apart = compiled["fused_ln_summed_apart"]["other"]
  assert copies["count"] == apart["count"] - (2 * LAYERS - 1), (copies, apart)
  assert copies["bytes"] < apart["bytes"], (copies, apart)


def test_the_fused_sites_copies_keep_the_query_and_key_gemms_apart(compiled):
  """Each copy a site hands over is a value of its own to the compiler
  (`pallas_layer_norm._copies`), so XLA's dot merger does not join a block's query and key
  GEMMs: with cuBLAS's GEMMs, no concatenation of their output gradients per layer, and fewer
  bytes outside the GEMMs than with the copies as one value."""
  apart, one = compiled["copies_apart"], compiled["copies_one_value"]
  assert apart["concatenates"] <= one["concatenates"] - LAYERS, (apart, one)
  assert apart["other_bytes"] < one["other_bytes"], (apart, one)


def test_a_gpu_runs_the_fused_program_unless_told_otherwise(compiled):
  """With the attention kernel, the LayerNorm kernel and the layout left unset, a step built
  for an H200 (compute capability 9.0, read from the compile-only device's kind) is the program
  measured fastest there (`pretraining.platform_defaults`): attention dropout inside cuDNN's
  kernel, each LayerNorm site one Triton kernel each way, the stacked layers run unrolled."""
  assert compiled["h200_defaults_config"] == {
      "attention_implementation": "cudnn", "layer_norm_implementation": "pallas",
      "scan_layers": True, "stack_unrolled": True}
  row, unrolled = compiled["h200_defaults"], compiled["paper_cudnn_fused_ln"]
  assert "error" not in row, row.get("error")
  assert row["custom_calls"].get("__cudnn$fmhaSoftmaxDropout") == LAYERS, row["custom_calls"]
  assert row["custom_calls"].get("__gpu$xla.gpu.triton") == 2 * 2 * LAYERS
  assert row["num_parameters"] == unrolled["num_parameters"]


def test_our_triton_attention_takes_the_dropout_on_a_gpu(compiled):
  """`attention_implementation="pallas"` built for an H100: every layer's attention is our
  Triton kernel forward and backward (`model/triton_attention.py`), beside the fused sites'
  kernels, and no attention kernel of cuDNN's or XLA's softmax is left; the kernels read the
  joined projection's output in place."""
  row = compiled["paper_pallas"]
  assert "error" not in row, row.get("error")
  names = collections.Counter(row["pallas_kernels"])
  assert names == {"flash_attention_dropout_fwd": LAYERS, "flash_attention_dropout_bwd": LAYERS,
                   "dropout_residual_layer_norm_fwd": 2 * LAYERS,
                   "dropout_residual_layer_norm_bwd": 2 * LAYERS}, names
  assert not any("fmha" in target for target in row["custom_calls"]), row["custom_calls"]
  assert row["custom_calls"]["__gpu$xla.gpu.triton"] == 6 * LAYERS
  # The query, key and value are one GEMM each way (`modeling.joined_projection`), read in
  # place by the kernels: per layer two forward GEMMs, two input-gradient GEMMs and two
  # weight-gradient GEMMs fewer than with cuDNN's attention, whose three projections are apart.
  apart = compiled["paper_cudnn_stacked"]["traffic"]["matmul"]["count"]
  assert row["traffic"]["matmul"]["count"] == apart - 6 * LAYERS, (row["traffic"], apart)
  # The cuDNN step compiled alike names its own kernels: the count above can fail.
  cudnn = collections.Counter(compiled["h200_defaults"]["pallas_kernels"])
  assert "flash_attention_dropout_fwd" not in cudnn and cudnn, cudnn


def test_our_attention_kernels_compile_for_every_head_width(compiled):
  """Our Triton attention forward and backward compile for an H200 (Triton's compile checks
  their shared memory against the GPU's) at heads of 32 to 256 values in bfloat16 and float32,
  the default tiling cut to fit wide heads (`triton_attention._fitted`); uncut, float32 heads
  of 128 values ask for more than the GPU has."""
  assert set(compiled["attention_widths"].values()) == {"ok"}, compiled["attention_widths"]
  assert "Shared memory" in compiled["attention_unfitted"], compiled["attention_unfitted"]


def test_fine_tuning_in_bfloat16_runs_the_fused_kernels_on_a_recent_gpu(compiled):
  """A GLUE fine-tuning step in bfloat16 with its kernels left unset, built for an H200: its
  attention dropout inside cuDNN's kernel forward and backward, each LayerNorm site one Triton
  kernel each way, as pre-training's step there (`finetune_job.compute_config`); over packed
  rows too."""
  row = compiled["finetune"]
  assert (row["attention_implementation"], row["layer_norm_implementation"]) == (
      "cudnn", "pallas")
  calls = row["custom_calls"]
  assert calls.get("__cudnn$fmhaSoftmaxDropout") == LAYERS, calls
  assert calls.get("__cudnn$fmhaSoftmaxDropoutBackward") == LAYERS, calls
  assert calls.get("__gpu$xla.gpu.triton") == 2 * 2 * LAYERS, calls
  # Packed rows (`--packing`): lengths cannot say "block-diagonal", so each row's mask reaches
  # cuDNN's kernel as a bias, with the dropout still inside it.
  packed = compiled["finetune_packed"]["custom_calls"]
  assert packed.get("__cudnn$fmhaScaleBiasSoftmaxDropout") == LAYERS, packed
  assert packed.get("__cudnn$fmhaScaleBiasSoftmaxDropoutBackward") == LAYERS, packed


def test_the_initial_state_draws_its_parameters_through_the_threefry_kernel(compiled):
  """The program that creates the train state lowers threefry to JAX's GPU kernel, one call per
  draw, instead of unrolling its hash into the fusions (which made XLA's GPU compiler spend
  longer on BERT-base's init than on its train step); lowered inline, the hashing is back."""
  init, inline = compiled["init"], compiled["init_inline"]
  assert init["kernels"] > 2 * LAYERS, init
  assert inline["kernels"] == 0, inline
  assert init["xor"] < inline["xor"] / 10, (init, inline)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_matmul_of_a_bfloat16_step_reads_low_precision_operands(compiled, case):
  """Every GEMM of a bfloat16 step reads bfloat16 (or, under FP8, FP8) operands, the tied
  masked-LM decoder's gradient matmuls included (`modeling.float32_einsum`). Differentiated as
  written, the decoder's float32 scores made both its gradient matmuls float32 ones, the
  largest weight-sized matmuls of the step; swapped back, the check sees them."""
  assert "error" not in compiled[case], compiled[case].get("error")
  types = compiled[case]["operand_types"]
  assert types and not any("f32" in pair for pair in types), types
  assert types.get("bf16 x bf16", 0) >= 2 * LAYERS or case == "fp8", types
  assert compiled["decoder_as_is"].get("f32 x f32") == 2, compiled["decoder_as_is"]


def test_each_attention_input_gradient_is_added_by_its_gemm(compiled):
  """The block input's gradient from the residual and the query, key and value projections,
  summed by `modeling.fan_out`: all three input-gradient GEMMs of every layer accumulate onto
  the sum before them (cuBLAS's beta = 1). Summed by autodiff in arrival order, XLA folds
  fewer and leaves the others as kernels of their own, reading and writing the residual
  stream's width three times: more kernels, and more bytes."""
  fanned, as_is = compiled["fan_out"], compiled["fan_out_as_is"]
  assert fanned["beta_one"] >= 3 * LAYERS, fanned
  assert fanned["beta_one"] > as_is["beta_one"], (fanned, as_is)
  assert fanned["other_kernels"] < as_is["other_kernels"], (fanned, as_is)
  assert fanned["other_bytes"] < as_is["other_bytes"], (fanned, as_is)
  # Its copies are values of their own: as one value, XLA's dot merger joins the query and key
  # GEMMs and concatenates their output gradients, once per layer.
  one = compiled["fan_out_one_value"]
  assert fanned["concatenates"] <= one["concatenates"] - LAYERS, (fanned, one)
  assert fanned["other_bytes"] < one["other_bytes"], (fanned, one)


def test_fp8_matmuls_reach_the_gemms_in_fp8(compiled):
  assert "error" not in compiled["fp8"], compiled["fp8"].get("error")
  # Inputs and kernels in e4m3 forward, the output's gradient in e5m2 backward.
  assert compiled["fp8"]["f8e4m3fn"] > 0 and compiled["fp8"]["f8e5m2"] > 0
  assert compiled["paper_cudnn"]["f8e4m3fn"] == 0


def test_fp8_matmuls_take_cublaslts_fp8_gemm_under_the_plugins_cuda_runtime(compiled):
  """The GPU's description carries the CUDA runtime (the plugin's, 12 or newer): with cuBLAS's
  GEMMs, which a GPU's autotuner picks for most of them, FP8 matmuls are cuBLASLt's FP8 GEMM.
  Described without one, XLA takes the runtime for older than CUDA 12 and computes the FP8
  operands in bfloat16 instead: not the program a GPU runs."""
  assert tuple(compiled["cuda_runtime"]) >= (12, 0), compiled["cuda_runtime"]
  assert "__cublas$lt$matmul$f8" in compiled["fp8_cublas_calls"], compiled["fp8_cublas_calls"]
  assert compiled["fp8_cublas_calls_no_runtime"] == ["__cublas$lt$matmul"], (
      compiled["fp8_cublas_calls_no_runtime"])


def test_fp8_operands_are_quantized_in_one_pass_and_the_attention_input_once(compiled):
  """Each FP8 operand goes through one kernel that writes both its layouts (and its largest
  |value|, and an output gradient's column sums): no kernel of XLA's writes an FP8 array, and
  the step moves at least one read of every quantized activation less than with XLA's
  operations: the reads for the largest |value| of each. The attention input is quantized once
  for the query, key and value: three (tokens, hidden) e4m3 operands per layer (that input, the
  attention output's and the feed-forward's) where each projection quantizing its own would
  make five."""
  ours, xla = compiled["fp8_one_pass"], compiled["fp8_xla_quantized"]
  assert ours["fp8_fusions"] == 0 and xla["fp8_fusions"] > 0, (ours, xla)
  tokens = 64 * 128
  assert ours["kernel_outputs"].count(f"f8e4m3fn[{tokens},64]") == 3 * LAYERS, ours
  assert ours["kernel_outputs"].count(f"f8e5m2[{tokens},256]") == LAYERS, ours
  assert xla["kernel_outputs"] == [], xla
  # Per layer the six output gradients' (five of width 64, one of 256) and the four inputs'
  # (three of 64, one of 256) reads for their largest |value|, in bfloat16.
  saved = xla["other_bytes"] - ours["other_bytes"]
  assert saved >= LAYERS * tokens * (5 * 64 + 256 + 3 * 64 + 256) * 2, (saved, ours, xla)
  assert ours["other_kernels"] < xla["other_kernels"], (ours, xla)


def test_fp8_gelu_is_applied_by_the_kernel_that_quantizes_it(compiled):
  """The second feed-forward layer's quantization kernel applies GELU as it reads the first
  layer's output (`modeling.fused_activation`): GELU's bfloat16 output (tokens x 256) is
  neither written nor read back, and its kernel is gone, in each layer."""
  ours, apart = compiled["fp8_one_pass"], compiled["fp8_gelu_apart"]
  saved = apart["other_bytes"] - ours["other_bytes"]
  assert saved >= LAYERS * 64 * 128 * 256 * 2 * 2, (saved, ours, apart)
  assert ours["other_kernels"] <= apart["other_kernels"] - LAYERS, (ours, apart)


def test_eight_gpus_reduce_each_gradient_once_over_all_of_them(compiled):
  row = compiled["dp8"]
  assert set(row["collectives"]) == {"all-reduce"}
  reduce = row["collectives"]["all-reduce"]
  assert reduce["max_group"] == 8
  assert 2 * row["num_parameters"] * 0.95 <= reduce["bytes"] <= 4 * row["num_parameters"] * 1.05
  assert row["batch_per_device"] * 8 == 64
  # The roofline's collective term: the ring's wire bytes over half of NVLink's two directions.
  wire = sum(c["wire_bytes"] for c in row["collectives"].values())
  assert row["collective_seconds"] == pytest.approx(wire / (gpu_targets.GPUS["h100"].ici_bandwidth
                                                            / 2))


def test_the_low_precision_layer_norm_moves_fewer_bytes(compiled):
  low = compiled["paper_cudnn"]["traffic"]["other"]["bytes"]
  f32 = compiled["paper_cudnn_f32_layer_norm"]["traffic"]["other"]["bytes"]
  assert low < 0.97 * f32, (low, f32)


def test_gelu_loss_and_layer_norm_changes_move_fewer_bytes(compiled):
  """Each change against the step without it (only that function swapped back)."""
  ours = compiled["paper_cudnn"]["traffic"]["other"]["bytes"]
  # GELU: an array of the feed-forward width (64 x 128 x 256 bfloat16) per layer less moved.
  saved = compiled["gelu_as_is"]["other"]["bytes"] - ours
  assert saved >= LAYERS * 64 * 128 * 256 * 2, saved
  # The loss: no scatter into a zeroed float32 array of the logits' size (64 x 20 x 512).
  saved = compiled["loss_gathered"]["other"]["bytes"] - ours
  assert saved >= 64 * 20 * 512 * 4, saved
  # LayerNorm outputs written once (cuDNN attention, so a GPU), at width 256: at least a
  # float32 residual sum (64 x 128 x 256) per layer not written and read back.
  saved = (compiled["layer_norm_recomputed"]["other"]["bytes"]
           - compiled["layer_norm_written"]["other"]["bytes"])
  assert saved >= LAYERS * 64 * 128 * 256 * 4, saved
  # GELU computed in float32 (one kernel) against jax.nn.gelu's bfloat16 argument (a kernel
  # of its own): at least one and a half arrays of the feed-forward width (64 x 128 x 1024
  # bfloat16) per layer less written and read.
  saved = (compiled["gelu_bf16_argument"]["other"]["bytes"]
           - compiled["layer_norm_written"]["other"]["bytes"])
  assert saved >= 1.5 * LAYERS * 64 * 128 * 1024 * 2, saved
  # LayerNorm statistics in one pass: at least a bfloat16 array of the residual stream per
  # encoder site (two per layer) less read.
  saved = (compiled["layer_norm_two_pass"]["other"]["bytes"]
           - compiled["layer_norm_written"]["other"]["bytes"])
  assert saved >= 2 * LAYERS * 64 * 128 * 256 * 2, saved
  # Dropout masks kept as bits: at least two byte-per-element masks of the residual stream
  # (64 x 128 x 256) per encoder site (two per layer) less read, an eighth of them instead.
  saved = (compiled["dropout_mask_bytes"]["other"]["bytes"]
           - compiled["layer_norm_written"]["other"]["bytes"])
  assert saved >= 2 * LAYERS * 2 * 64 * 128 * 256 * 7 / 8, saved
  # The key's bias not added: at least the keys' bytes (64 x 128 x 256 bfloat16) per layer
  # less moved (at BERT-base's size, the keys written again and read back: 3 times that).
  saved = (compiled["key_bias_added"]["other"]["bytes"]
           - compiled["layer_norm_written"]["other"]["bytes"])
  assert saved >= LAYERS * 64 * 128 * 256 * 2, saved


def test_tanh_gelu_is_computed_in_the_feed_forward_gemms_epilogue(compiled):
  """With its GEMMs through cuBLASLt, GELU's tanh form (the original BERT code's `gelu`,
  `hidden_act="gelu_new"`) is computed with the bias add by the first feed-forward GEMM, which
  also writes GELU's input for the backward pass (BIAS_GELU_AUX): one per encoder layer and one
  in the masked-LM head's transform. cuBLASLt has no exact (erf) GELU, and jax.nn.gelu's own
  derivative keeps more than the input, so neither gets it."""
  epilogues = compiled["epilogues"]
  assert epilogues["gelu_new"].count("BIAS_GELU_AUX") == LAYERS + 1, epilogues["gelu_new"]
  assert "BIAS" in epilogues["gelu"] and not any("GELU" in e for e in epilogues["gelu"])
  assert "BIAS_GELU_AUX" not in epilogues["gelu_new_as_is"], epilogues["gelu_new_as_is"]


def test_a_step_that_cannot_fit_is_refused_with_the_fix(compiled):
  message = compiled["refused"]
  assert message is not None
  assert "h100" in message and "GiB" in message and "--config.grad_accum_steps=" in message


@pytest.mark.parametrize("name, chips, kind", [
    ("h100", 1, "NVIDIA H100 80GB HBM3"), ("H200x8", 8, "NVIDIA H200"),
    ("a100x4", 4, "NVIDIA A100-SXM4-80GB")])
def test_gpu_machines_by_the_names_users_type(name, chips, kind):
  machine = gpu_targets.parse(name)
  assert (machine.chips, machine.devices, machine.chip.device_kind) == (chips, chips, kind)
  assert machine.topology == f"1x1x{chips}"
  config = machine.chip.target_config()
  assert f'device_description_str: "{kind}"' in config
  assert f"core_count: {machine.chip.sms}" in config
  assert f"major: {machine.chip.compute_capability[0]}" in config
  assert "runtime_version" not in config
  assert "runtime_version { major: 12 minor: 9 patch: 0 }" in machine.chip.target_config((12, 9))


@pytest.mark.parametrize("name, message", [
    ("h100x3", "1, 2, 4 or 8 GPUs"), ("v100", "not a GPU machine"), ("h100x", "not a GPU")])
def test_bad_gpu_names_say_what_is_expected(name, message):
  with pytest.raises(ValueError, match=message):
    gpu_targets.parse(name)


def test_a_devices_compute_capability():
  """A CUDA device says its own ("8.6"); a compile-only device is known by its kind; a CPU, a
  TPU or a GPU that says something else (ROCm's "gfx90a") has none."""
  import types  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  device = lambda **kw: types.SimpleNamespace(**kw)
  assert gpu_targets.compute_capability(device(compute_capability="8.6")) == (8, 6)
  assert gpu_targets.compute_capability(device(device_kind="NVIDIA H200")) == (9, 0)
  assert gpu_targets.compute_capability(device(device_kind="NVIDIA A100-SXM4-80GB")) == (8, 0)
  assert gpu_targets.compute_capability(device(compute_capability="gfx90a",
                                               device_kind="AMD Instinct MI250X")) is None
  assert gpu_targets.compute_capability(device(device_kind="TPU v4")) is None
  assert gpu_targets.compute_capability(jax.devices()[0]) is None  # this machine's CPU


def test_usable_memory_is_what_jax_preallocates(monkeypatch):
  chip = gpu_targets.GPUS["h100"]
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  assert chip.usable_hbm_per_device == int(0.75 * chip.hbm_bytes)
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".9")
  assert chip.usable_hbm_per_device == int(0.9 * chip.hbm_bytes)


def test_without_the_plugin_the_error_says_how_to_get_it(tmp_path):
  code = ("import json\nfrom bert_jax.parallel import gpu_targets\n"
          "try:\n  gpu_targets.topology_devices('h100')\n"
          "except RuntimeError as e:\n  print('RESULT ' + json.dumps(str(e)))\n")
  error = ph.script_result(code, timeout=300, BERT_JAX_GPU_COMPILER=str(tmp_path))
  assert error.startswith("compiling for h100 needs JAX's CUDA plugin")
  assert str(tmp_path) in error and "requirements/gpu_compiler.txt" in error


def test_a_gpu_programs_kernels_are_sorted_by_kind():
  text = """HloModule m, is_scheduled=true

%fused_dot (p0: bf16[8,16], p1: bf16[16,4]) -> bf16[8,4] {
  %p0 = bf16[8,16]{1,0} parameter(0)
  %p1 = bf16[16,4]{1,0} parameter(1)
  ROOT %d = bf16[8,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_add (p0: bf16[8,4]) -> f32[8,4] {
  %p0 = bf16[8,4]{1,0} parameter(0)
  ROOT %c = f32[8,4]{1,0} convert(%p0)
}

ENTRY %main (a: bf16[8,16], b: bf16[16,4], q: bf16[2,4,8,16]) -> f32[8,4] {
  %a = bf16[8,16]{1,0} parameter(0)
  %b = bf16[16,4]{1,0} parameter(1)
  %q = bf16[2,4,8,16]{3,2,1,0} parameter(2)
  %gemm = bf16[8,4]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot
  %att = (bf16[2,4,8,16]{3,2,1,0}, u8[0]{0}) custom-call(%q, %q, %q), custom_call_target="__cudnn$fmhaSoftmax"
  ROOT %out = f32[8,4]{1,0} fusion(%gemm), kind=kLoop, calls=%fused_add
}
"""
  module = hlo_costs.parse(text)
  kinds = hlo_costs.traffic_by_kind(module)
  assert kinds["matmul"] == {"count": 1, "bytes": (8 * 16 + 16 * 4 + 8 * 4) * 2}
  assert kinds["attention"] == {"count": 1, "bytes": 4 * 2 * 4 * 8 * 16 * 2}
  assert kinds["other"] == {"count": 1, "bytes": 8 * 4 * 2 + 8 * 4 * 4}
  assert hlo_costs.custom_calls(module) == {"__cudnn$fmhaSoftmax": 1}
  assert sum(k["bytes"] for k in kinds.values()) == hlo_costs.hbm_bytes(module)


def test_a_gemm_fused_with_the_slice_of_a_stacked_weight_is_a_matmul_of_its_layer():
  """cuBLAS's GEMM reading its weight straight out of a stacked leaf (`dynamic_slice_fusion`,
  which XLA makes without an op_name of its own): a matmul, in the part its GEMM's op_name
  names, reading one layer's slice of the stack; the scratch beside a GEMM's output (the
  trailing s8 array, here sized 8x) is no array it writes, in or out of such a fusion."""
  text = """HloModule m, is_scheduled=true

%dynamic-slice-fusion.1 (p0: bf16[12,16,4], p1: bf16[8,16]) -> (bf16[8,4], s8[4096]) {
  %p1 = bf16[8,16]{1,0} parameter(1)
  %p0 = bf16[12,16,4]{2,1,0} parameter(0)
  %split.1 = bf16[1,16,4]{2,1,0} slice(%p0), slice={[3:4], [0:16], [0:4]}
  %bitcast.1 = bf16[16,4]{1,0} bitcast(%split.1)
  ROOT %gemm = (bf16[8,4]{1,0}, s8[4096]{0}) custom-call(%p1, %bitcast.1), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/transpose(jvp(M))/bert/encoder/layer_3/intermediate/dense/dot_general"}
}

ENTRY %main (w: bf16[12,16,4], x: bf16[8,16]) -> ((bf16[8,4], s8[4096]), (bf16[8,4], s8[512])) {
  %w = bf16[12,16,4]{2,1,0} parameter(0)
  %x = bf16[8,16]{1,0} parameter(1)
  %sliced = (bf16[8,4]{1,0}, s8[4096]{0}) fusion(%w, %x), kind=kCustom, calls=%dynamic-slice-fusion.1, backend_config={"fusion_backend_config":{"kind":"__custom_fusion","custom_fusion_config":{"name":"dynamic_slice_fusion"}}}
  %plain = (bf16[8,4]{1,0}, s8[512]{0}) custom-call(%x, %x), custom_call_target="__cublas$gemm", metadata={op_name="jit(step)/jvp(M)/bert/encoder/layer_0/attention/self/query/dot_general"}
  ROOT %out = ((bf16[8,4]{1,0}, s8[4096]{0}), (bf16[8,4]{1,0}, s8[512]{0})) tuple(%sliced, %plain)
}
"""
  module = hlo_costs.parse(text)
  kinds = hlo_costs.traffic_by_kind(module)
  layer = 16 * 4 * 2
  assert kinds["matmul"] == {"count": 2, "bytes": (8 * 16 * 2 + layer + 8 * 4 * 2)
                             + (2 * 8 * 16 * 2 + 8 * 4 * 2)}
  assert kinds["other"]["count"] == 0
  parts = hlo_costs.traffic_by_part(module)
  assert parts["backward: feed-forward"]["count"] == 1
  assert parts["forward: q, k, v, output projections"]["count"] == 1
  assert "unnamed" not in parts


def test_a_kernel_that_slices_after_elementwise_work_reads_only_the_slice():
  """LayerNorm's one-pass shift: a kernel adds two arrays and keeps each row's first value;
  it reads one element per row of each operand (in the operand's type), not the whole arrays.
  A kernel that also uses the whole sum reads all of it."""
  text = """HloModule m, is_scheduled=true

%fused_slice (p0: bf16[64,256], p1: bf16[64,256]) -> f32[64,1] {
  %p0 = bf16[64,256]{1,0} parameter(0)
  %p1 = bf16[64,256]{1,0} parameter(1)
  %c0 = f32[64,256]{1,0} convert(%p0)
  %c1 = f32[64,256]{1,0} convert(%p1)
  %s = f32[64,256]{1,0} add(%c0, %c1)
  ROOT %first = f32[64,1]{1,0} slice(%s), slice={[0:64], [0:1]}
}

%fused_both (p0: bf16[64,256], p1: bf16[64,256]) -> (f32[64,1], f32[64,256]) {
  %p0 = bf16[64,256]{1,0} parameter(0)
  %p1 = bf16[64,256]{1,0} parameter(1)
  %s = bf16[64,256]{1,0} add(%p0, %p1)
  %first = bf16[64,1]{1,0} slice(%s), slice={[0:64], [0:1]}
  %c = f32[64,1]{1,0} convert(%first)
  %w = f32[64,256]{1,0} convert(%s)
  ROOT %t = (f32[64,1]{1,0}, f32[64,256]{1,0}) tuple(%c, %w)
}

ENTRY %main (a: bf16[64,256], b: bf16[64,256]) -> (f32[64,1], (f32[64,1], f32[64,256])) {
  %a = bf16[64,256]{1,0} parameter(0)
  %b = bf16[64,256]{1,0} parameter(1)
  %x = f32[64,1]{1,0} fusion(%a, %b), kind=kLoop, calls=%fused_slice
  %y = (f32[64,1]{1,0}, f32[64,256]{1,0}) fusion(%a, %b), kind=kLoop, calls=%fused_both
  ROOT %out = (f32[64,1]{1,0}, (f32[64,1]{1,0}, f32[64,256]{1,0})) tuple(%x, %y)
}
"""
  module = hlo_costs.parse(text)
  moved = {i.name: b for _, i, b in hlo_costs.instruction_traffic(module)}
  assert moved["x"] == 2 * 64 * 2 + 64 * 4
  assert moved["y"] == 2 * 64 * 256 * 2 + 64 * 4 + 64 * 256 * 4
