"""The GPU suite's pieces, checked on the CPU: the PyTorch peer (`benchmarks/peer_torch.py`), the
variants and HLO counts of `benchmarks/accelerator_step.py`, and `benchmarks/gpu_suite.sh`.

GPU time is scarce and the suite must run whole in one short run, so a mistake found there
costs that run. The peer runs here on the tiny preset in eager mode only:
`torch.compile` of even the tiny model took about three minutes on this 2-core machine, so
compile mode is left to the GPU suite. The benchmark scripts run in subprocesses, as the suite
runs them (they define absl flags and set JAX's platform at import).
"""

import ast
import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.model import configuration
from tests import helpers

ROOT = helpers.REPO
VOCAB = 30522  # the tiny preset keeps BERT's vocabulary


def _peer(tmp_path, *extra) -> tuple[list[dict], str]:
  out, js = tmp_path / "peer.md", tmp_path / "peer.json"
  cmd = [sys.executable, "benchmarks/peer_torch.py", "--device=cpu", "--configs=tiny",
         "--batch=tiny=4", "--steps=1", "--repeats=1", "--warmup=1", "--modes=eager",
         "--mlm=full,gathered", "--dtype=float32", f"--out={out}", f"--json_out={js}", *extra]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with open(js, encoding="utf-8") as f:
    data = json.load(f)
  assert data["failures"] == []
  return data["results"], out.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def random_rows(tmp_path_factory):
  return _peer(tmp_path_factory.mktemp("peer"))


def _check_losses(results):
  by_head = {r["mlm"]: r for r in results}
  assert set(by_head) == {"full", "gathered"}
  for r in results:
    assert all(math.isfinite(x) for x in r["losses"]), r["losses"]
    # Random initialisation predicts nearly uniformly: step 1's masked-LM loss is ln(vocab)
    # plus a little (logits of std ~0.2), and next-sentence ln 2 give or take.
    assert abs(r["first_mlm"] - math.log(VOCAB)) < 0.3, r["first_mlm"]
    assert abs(r["first_nsp"] - math.log(2)) < 0.3, r["first_nsp"]
  # Same weights, rows and dropout masks: the head over every position and the head over the
  # gathered masked positions give the same masked-LM loss.
  assert by_head["full"]["first_mlm"] == pytest.approx(by_head["gathered"]["first_mlm"],
                                                       abs=1e-3)


@pytest.mark.slow
def test_peer_rows_and_file(random_rows):
  results, markdown = random_rows
  assert len(results) == 2
  for r in results:
    assert r["impl"] == "torch" and r["mode"] == "eager" and r["recipe"] == "paper"
    assert r["shape"] == dict(batch=4, length=128, predictions=20, real=1.0, packed=False)
    assert r["step_s"] > 0 and r["first_step_s"] > 0 and r["mfu"] is None  # no peak on a CPU
  full = next(r for r in results if r["mlm"] == "full")
  gathered = next(r for r in results if r["mlm"] == "gathered")
  assert full["analytic"] == gathered["analytic"] == gathered["executed"] < full["executed"]
  assert "| config | batch × seq (masked) | peer | mode | first step (s) |" in markdown
  for head in ("full", "gathered"):
    assert (f"| tiny | 4 × 128 (20) random, 100% real | HF sdpa paper (attn dropout 0.1, "
            f"gelu), MLM head {head} | eager |") in markdown
  assert {r["hidden_act"] for r in results} == {"gelu"}


def test_peer_losses_random_rows(random_rows):
  _check_losses(random_rows[0])


@pytest.mark.slow
@pytest.mark.e2e
def test_peer_packed_rows(tmp_path):
  """Packed rows: block-diagonal mask, per-instance positions, NSP at each instance's [CLS]."""
  rng = np.random.RandomState(1)
  batch, length, predictions, slots = 2, 128, 20, 3
  lengths = [(50, 40, 30), (70, 58, 0)]  # the second row has an unused slot and no padding
  arrays = {k: np.zeros((batch, length), np.int32) for k in (
      "input_ids", "input_mask", "segment_ids", "position_ids", "sequence_ids")}
  arrays["cls_positions"] = np.zeros((batch, slots), np.int32)
  arrays["next_sentence_labels"] = rng.randint(0, 2, (batch, slots)).astype(np.int32)
  arrays["next_sentence_weights"] = np.zeros((batch, slots), np.float32)
  for row, parts in enumerate(lengths):
    start = 0
    for slot, n in enumerate(parts):
      if not n:
        continue
      span = slice(start, start + n)
      arrays["input_ids"][row, span] = rng.randint(1000, VOCAB, n)
      arrays["input_mask"][row, span] = 1
      arrays["segment_ids"][row, start + n // 2:start + n] = 1
      arrays["position_ids"][row, span] = np.arange(n)
      arrays["sequence_ids"][row, span] = slot + 1
      arrays["cls_positions"][row, slot] = start
      arrays["next_sentence_weights"][row, slot] = 1.0
      start += n
  positions = np.zeros((batch, predictions), np.int32)
  weights = np.zeros((batch, predictions), np.float32)
  for row in range(batch):
    real = np.flatnonzero(arrays["input_mask"][row])
    chosen = np.sort(rng.choice(real[1:], predictions - 3 * row, replace=False))
    positions[row, :len(chosen)] = chosen
    weights[row, :len(chosen)] = 1.0  # the second row leaves 3 prediction slots unused
  arrays["masked_lm_positions"] = positions
  arrays["masked_lm_ids"] = np.take_along_axis(arrays["input_ids"], positions, axis=1)
  arrays["masked_lm_weights"] = weights
  path = tmp_path / "packed.npz"
  np.savez(path, **arrays)
  results, markdown = _peer(tmp_path, f"--batch_file={path}")
  _check_losses(results)
  assert all(r["shape"]["packed"] for r in results)
  assert "| tiny | 2 × 128 (20) packed, 97% real |" in markdown


def _settings(name: str = "VARIANTS") -> dict[str, dict]:
  """`accelerator_step.VARIANTS` (or `LAYOUTS`), read from the source (no JAX, no absl flags
  imported)."""
  path = os.path.join(ROOT, "benchmarks", "accelerator_step.py")
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in tree.body:
    if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == name):
      return {ast.literal_eval(k): {kw.arg: ast.literal_eval(kw.value) for kw in v.keywords}
              for k, v in zip(node.value.keys, node.value.values)}
  raise AssertionError(f"no {name} in accelerator_step.py")


def test_variants_name_only_config_fields():
  """Each variant's overrides are `BertConfig` fields with values it accepts (the fields come
  from the model's side: this fails until they exist)."""
  variants = _settings()
  assert {"paper", "fast-xla", "fast-cudnn", "nodrop-cudnn", "paper-cudnn",
          "paper-cudnn-f32res", "paper-cudnn-bits32", "paper-cudnn-fp8"} <= set(variants)
  fields = {f.name for f in dataclasses.fields(configuration.BertConfig)}
  for name, overrides in variants.items():
    assert set(overrides) <= fields, (name, sorted(set(overrides) - fields))
    configuration.get_preset("base", dtype="bfloat16", **overrides)
  # `--layers`: the stacked layout run unrolled takes the paper's recipe through cuDNN, whose
  # dropout needs a call site per layer; the scanned loop does not.
  layouts = _settings("LAYOUTS")
  assert set(layouts) == {"unrolled", "scanned", "stacked"}
  for overrides in layouts.values():
    assert set(overrides) <= fields
  configuration.get_preset("base", **layouts["stacked"], **variants["paper-cudnn"])
  with pytest.raises(ValueError, match="needs unrolled, unshared layers"):
    configuration.get_preset("base", **layouts["scanned"], **variants["paper-cudnn"])


# A small optimized module in the form `compiled.as_text()` prints (a backslash continues a long
# instruction line).
_HLO = """HloModule jit_train_step, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%fused_computation (param_0: f32[8,16]) -> f32[8] {
  %param_0 = f32[8,16]{1,0} parameter(0)
  %constant = f32[] constant(0)
  ROOT %reduce.1 = f32[8]{0} reduce(%param_0, %constant), dimensions={1}, to_apply=%add, \
metadata={op_name="jit(step)/jvp(M)/bert/encoder/layer_0/output/LayerNorm/reduce_sum"}
}

%fused_computation.1 (param_0.1: f32[8,16]) -> f32[8,16] {
  %param_0.1 = f32[8,16]{1,0} parameter(0)
  ROOT %rsqrt.1 = f32[8,16]{1,0} rsqrt(%param_0.1), \
metadata={op_name="jit(step)/transpose(jvp(M))/bert/encoder/layer_0/output/LayerNorm/rsqrt"}
}

%fused_computation.2 (param_0.2: f32[8,16]) -> f32[16] {
  %param_0.2 = f32[8,16]{1,0} parameter(0)
  %constant.2 = f32[] constant(0)
  ROOT %reduce.2 = f32[16]{0} reduce(%param_0.2, %constant.2), dimensions={0}, to_apply=%add
}

%inner (param_0.4: f32[2,4,16]) -> f32[2,4] {
  %param_0.4 = f32[2,4,16]{2,1,0} parameter(0)
  %constant.4 = f32[] constant(0)
  ROOT %reduce.4 = f32[2,4]{1,0} reduce(f32[2,4,16]{2,1,0} %param_0.4, f32[] %constant.4), \
dimensions={2}, to_apply=%add
}

%fused_computation.3 (param_0.3: f32[2,4,16]) -> f32[2,4] {
  %param_0.3 = f32[2,4,16]{2,1,0} parameter(0)
  ROOT %fusion.9 = f32[2,4]{1,0} fusion(%param_0.3), kind=kLoop, calls=%inner
}

ENTRY %main (p: f32[8,16]) -> f32[8] {
  %p = f32[8,16]{1,0} parameter(0)
  %fusion = f32[8]{0} fusion(%p), kind=kInput, calls=%fused_computation
  %fusion.1 = f32[8,16]{1,0} fusion(%p), kind=kLoop, calls=%fused_computation.1
  %fusion.2 = f32[16]{0} fusion(%fusion.1), kind=kInput, calls=%fused_computation.2
  %custom-call = f32[8,16]{1,0} custom-call(%p), custom_call_target="__cublas$gemm"
  %pallas_call = (f8e4m3fn[8,16]{1,0}, f8e4m3fn[16,8]{1,0}) custom-call(%p), \
custom_call_target="__gpu$xla.gpu.triton", \
metadata={op_name="jit(train_step)/bert/pooler/dense/fp8_quantize/pallas_call"}
  %b = f32[2,4,16]{2,1,0} bitcast(%p)
  ROOT %fusion.3 = f32[2,4]{1,0} fusion(%b), kind=kCustom, calls=%fused_computation.3, \
backend_config={"fusion_backend_config":{"kind":"__triton"}}
}
"""


@pytest.mark.e2e
def test_hlo_summary_counts(tmp_path):
  """Kernels are top-level fusions (a nested one is part of its parent); a LayerNorm reduce is
  over the hidden axis of the tokens' rows, its operand's shape printed inline or looked up."""
  path = tmp_path / "step.hlo.txt"
  path.write_text(_HLO, encoding="utf-8")
  code = ("import json, sys; from benchmarks import accelerator_step as a; "
          f"h = a.hlo_summary(open({str(path)!r}).read(), 16, {{8}}); "
          "print(json.dumps(h)); print(a.describe_hlo(h, 4))")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        timeout=300, check=False, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  summary, line = proc.stdout.strip().splitlines()[-2:]
  h = json.loads(summary)
  assert h["kernels"] == 4
  assert h["kinds"] == {"kInput": 2, "kLoop": 1, "kCustom": 1}
  assert h["custom_fusions"] == {"__triton": 1}
  assert h["custom_calls"] == {"__cublas$gemm": 1, "__gpu$xla.gpu.triton": 1}
  assert h["pallas_kernels"] == {"fp8_quantize": 1}
  assert h["ln_reduce_kernels"] == 2  # %fusion, and %fusion.3 through the nested %inner
  assert h["ln_rsqrt_kernels"] == 1
  assert h["ln_per_site"] == {"bert/encoder/layer_0/output/LayerNorm": 2}
  assert "4 fusion kernels" in line and "1 sites named (model: 4)" in line
  assert "Pallas kernels by name: fp8_quantize 1" in line


@pytest.mark.e2e
def test_profiled_steps_run_without_command_buffers_unless_told():
  """Every run adds the flag that keeps command buffers off while profiling, once, after the
  flags there are; a setting of the user's stands."""
  code = ("from benchmarks import accelerator_step as a\n"
          "for flags in ('--xla_foo=1', '', a.PROFILE_FLAG + '=true'):\n"
          "  env = {'XLA_FLAGS': flags}\n"
          "  a.profile_without_command_buffers(env); a.profile_without_command_buffers(env)\n"
          "  print(env['XLA_FLAGS'])")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        timeout=300, check=False, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  flag = "--xla_enable_command_buffers_during_profiling"
  assert proc.stdout.strip().splitlines()[-3:] == [
      f"--xla_foo=1 {flag}=false", f"{flag}=false", f"{flag}=true"]


@pytest.mark.e2e
def test_gpu_suite_parses():
  proc = subprocess.run(["bash", "-n", os.path.join(ROOT, "benchmarks", "gpu_suite.sh")],
                        capture_output=True, text=True, check=False)
  assert proc.returncode == 0, proc.stderr


_TANH_GELU = r"""
import json
import jax.numpy as jnp, numpy as np, torch
from transformers.activations import ACT2FN
from benchmarks import peer_torch as peer
from bert_jax.model import modeling
ours, theirs = peer.hf_config("tiny", "paper", "gelu_new")
x = np.linspace(-6, 6, 1001, dtype=np.float32)
mine = np.asarray(modeling.activation_fn(ours.hidden_act)(jnp.asarray(x)))
hf = ACT2FN[theirs.hidden_act](torch.from_numpy(x)).numpy()
exact = ACT2FN["gelu"](torch.from_numpy(x)).numpy()
default = peer.hf_config("tiny", "paper")[1].hidden_act
print(json.dumps(dict(ours=ours.hidden_act, theirs=theirs.hidden_act, default=default,
                      diff=float(np.abs(mine - hf).max()),
                      from_exact=float(np.abs(hf - exact).max()))))
"""


@pytest.mark.e2e
def test_peer_with_the_tanh_gelu_computes_ours():
  """`--hidden_act=gelu_new` (beside ours `paper-cudnn-tanh`) gives both sides GELU's tanh form:
  the same function to float32 rounding, and measurably not the exact one."""
  proc = subprocess.run([sys.executable, "-c", _TANH_GELU], cwd=ROOT, capture_output=True,
                        text=True, timeout=600, check=False,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-3000:]
  seen = json.loads(proc.stdout.strip().splitlines()[-1])
  assert seen["ours"] == seen["theirs"] == "gelu_new" and seen["default"] == "gelu"
  assert seen["diff"] < 1e-6, seen
  assert seen["from_exact"] > 1e-4, seen


_SDPA_MASKS = r"""
import json, sys
import numpy as np, torch
from benchmarks import peer_torch as peer
ours, theirs = peer.hf_config("tiny", "paper")
model = peer.transformers.BertForPreTraining(theirs).train()
rows = peer.load_rows(peer.parse_args(["--device=cpu"]), "tiny", 2, ours.vocab_size)
seen = {}
for name, mask in (("full", None), ("padded", [1] * 100 + [0] * 28)):
  if mask is not None:
    rows = dict(rows, input_mask=np.array([mask, [1] * 128], np.int32))
  calls = []
  def backend(graph, example_inputs):
    calls.extend(dict(mask=n.kwargs.get("attn_mask") is not None,
                      dropout=n.kwargs.get("dropout_p")) for n in graph.graph.nodes
                 if "scaled_dot_product" in str(n.target))
    return graph.forward
  torch._dynamo.reset()
  loss = torch.compile(peer.PretrainingLoss(model, "full", torch.bfloat16), backend=backend)
  loss(peer.to_torch(rows, "cpu"))[0].backward()
  seen[name] = calls
print(json.dumps(seen))
"""


def test_compiled_peer_gives_sdpa_a_mask_only_for_padded_rows():
  """Under `torch.compile` the peer's full-length rows must reach SDPA without a mask (its flash
  kernel takes none): transformers' "sdpa" builds an all-true mask while dynamo traces, and a
  mask sends CUDA's SDPA to the math path (probabilities in float32, the 93.7 GiB peak of the
  large model measured on an H200). Padded rows keep theirs. Read from the graph dynamo traces.
  With transformers 5.17 (the GPU image's) and the plain "sdpa" name, full rows get a mask here;
  transformers 5.23 skips it by itself."""
  proc = subprocess.run([sys.executable, "-c", _SDPA_MASKS], cwd=ROOT, capture_output=True,
                        text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  seen = json.loads(proc.stdout.strip().splitlines()[-1])
  layers = configuration.get_preset("tiny").num_hidden_layers
  for name, has_mask in (("full", False), ("padded", True)):
    assert len(seen[name]) == layers, seen
    assert all(c["mask"] is has_mask and c["dropout"] == 0.1 for c in seen[name]), seen


def _our_step_on_the_cpu(tmp_path, *args: str) -> tuple[dict, str]:
  """`accelerator_step.py` on the tiny preset with `args`, as the suite runs it: its one row
  (the JSON output) and its markdown section."""
  js = tmp_path / "ours.json"
  cmd = [sys.executable, "benchmarks/accelerator_step.py", "--configs=tiny", "--variants=paper",
         "--batch=tiny=4", "--repeats=1", "--warmup=1", *args, f"--json_out={js}",
         f"--out={tmp_path / 'o.md'}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
                        check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with open(js, encoding="utf-8") as f:
    (row,) = json.load(f)["results"]
  return row, (tmp_path / "o.md").read_text(encoding="utf-8")


def test_our_step_profiled_on_the_cpu(tmp_path):
  """`accelerator_step.py --profile_dir` as the suite runs it: the trace's kernels are read from
  its .xplane.pb, matched to the compiled step's HLO instructions and their kinds, and the
  device's busy time is no more than the kernels' summed time allows."""
  row, text = _our_step_on_the_cpu(tmp_path, "--steps=2", f"--profile_dir={tmp_path / 'trace'}")
  profile = row["profile"]
  assert "error" not in profile, profile
  kinds = profile["kinds_ms"]
  assert kinds.get("matmul", 0) > 0 and kinds.get("other", 0) > 0, kinds  # matched to the HLO
  assert 0 < profile["busy_ms"] <= sum(kinds.values()) + 1e-6
  assert profile["kernels_per_step"] > 100  # the tiny step's kernels, not a handful of events
  parts = profile["parts_ms"]  # the same kernel time, split by part of the step
  assert abs(sum(parts.values()) - sum(kinds.values())) < 1e-6 * max(1.0, sum(kinds.values()))
  for part in ("forward: layer norm", "backward: layer norm", "forward: feed-forward",
               "backward: attention", "optimizer"):
    assert parts.get(part, 0) > 0, (part, parts)
  assert 0 <= profile["short_ms"] <= sum(kinds.values()) + 1e-6
  assert 0 <= profile["short_kernels_per_step"] <= profile["kernels_per_step"]
  top = profile["top"]
  assert top and all(t["ms"] > 0 for t in top)
  assert [t["ms"] for t in top] == sorted((t["ms"] for t in top), reverse=True)
  assert any(t["gb_per_s"] for t in top)  # bytes from hlo_costs for the groups it counts
  assert "PROFILE tiny paper unrolled" in text and "by part (ms): " in text


@pytest.mark.parametrize("task, length, classes", [("squad", 384, 384), ("glue", 128, 3)])
def test_our_fine_tuning_step_timed_as_the_suite_times_it(tmp_path, task, length, classes):
  """`accelerator_step.py --task` times the fine-tuning step (the suite's part t): the task's
  objective at the paper's fine-tuning length, and a first loss near that of guessing among its
  classes (SQuAD: every position), as a freshly initialised head gives."""
  row, text = _our_step_on_the_cpu(tmp_path, f"--task={task}", "--steps=1")
  assert row["task"] == task and (row["shape"]["batch"], row["shape"]["length"]) == (4, length)
  assert abs(row["losses"][0] - math.log(classes)) < 0.1 * math.log(classes), row["losses"]
  assert row["analytic"] > 0
  assert "fine-tuning step" in text and f"--task={task}" in text


def test_bench_batches_from_a_real_corpus(tmp_path):
  """`bench_batches.py` writes the suite's real rows: the input pipeline's first batch over
  Shakespeare, whole files only, packed rows with their packing arrays and less padding."""
  out = tmp_path / "batches"
  proc = subprocess.run([sys.executable, "benchmarks/bench_batches.py", f"--out_dir={out}",
                         f"--work_dir={tmp_path / 'work'}", "--lengths=128"], cwd=ROOT,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                        text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert sorted(os.listdir(out)) == ["128_packed.npz", "128_unpacked.npz"]  # no partial file
  real = {}
  for layout in ("unpacked", "packed"):
    with np.load(out / f"128_{layout}.npz", allow_pickle=False) as f:
      batch = {k: f[k] for k in f.files}
    assert batch["input_ids"].shape == (256, 128)
    assert batch["masked_lm_positions"].shape == (256, 20)
    assert ("sequence_ids" in batch) is (layout == "packed")
    ids, mask = batch["input_ids"], batch["input_mask"].astype(bool)
    assert (ids[mask] > 0).all() and (ids[~mask] == 0).all()
    real[layout] = mask.mean()
  assert 0.5 < real["unpacked"] < real["packed"] <= 1.0


def test_a_failed_profile_keeps_the_timing(tmp_path):
  """A trace that cannot be written costs the profile, not the step's timing."""
  blocker = tmp_path / "a_file"
  blocker.write_text("not a folder", encoding="utf-8")
  js = tmp_path / "ours.json"
  cmd = [sys.executable, "benchmarks/accelerator_step.py", "--configs=tiny", "--variants=paper",
         "--batch=tiny=4", "--steps=1", "--repeats=1", "--warmup=1",
         f"--profile_dir={blocker}", f"--json_out={js}"]
  proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                        capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with open(js, encoding="utf-8") as f:
    data = json.load(f)
  assert data["failures"] == []
  (row,) = data["results"]
  assert row["step_s"] > 0
  assert row["profile"]["error"].startswith("profiling failed"), row["profile"]
