"""Model FLOPs utilisation (MFU) of the production pre-training step on one accelerator.

    python benchmarks/accelerator_step.py --configs=base,large \
        --variants=paper,fast-xla,fast-cudnn --layers=unrolled,scanned

Times exactly the step `bert_jax.pretrain` runs (`training.state.create_train_state` on the mesh,
`training.step.build_train_step` with donated state and the paper's optimizer) in bfloat16
compute with float32 parameters, for each attention variant:

* `paper` — the paper's recipe: attention-probability dropout 0.1, so attention runs on the
  explicit path (softmax in float32, a dropout mask over every probability);
* `fast-xla` — the fast recipe (`attention_probs_dropout_prob=0`, as MosaicBERT and ModernBERT
  train) through `jax.nn.dot_product_attention(implementation="xla")`;
* `fast-cudnn` — the same through cuDNN's fused flash-attention kernel (GPU only);
* `paper-cudnn` — the paper's recipe with the attention dropout inside cuDNN's fused kernel, and
  its A/B twins `-f32res` (float32 residual stream and LayerNorm at every site), `-bits32` (one
  random word per dropout decision instead of 16 bits) and `-fp8` (fp8 matmuls).

`--task=glue` or `--task=squad` times the fine-tuning step instead (the task's objective and
head as `finetune` builds them, MNLI's classifier or SQuAD's span head, at the paper's
fine-tuning shapes `finetune_compile.TASKS`, full-length random rows, the same optimizer): the
variants then say which kernels fine-tuning runs (`paper`: XLA's, what a bfloat16 fine-tuning
run computed before it took the fused kernels; `paper-cudnn-fusedln`: what it runs now on a
recent GPU).

`--layers` picks unrolled layers, `nn.scan` over layers, stacked parameters run unrolled, or
several (`LAYOUTS`). Shapes per preset (`SHAPES`) are the paper's sequence lengths; the batch is
random ids at full length (every row is real tokens, so hardware MFU and useful-token MFU
coincide). MFU = the analytic matmul FLOPs of the step (`MaskedLmNextSentence.flops_per_step`,
the count the training loop prints) / step time / the device's peak dense bf16 rate
(`training.perf.PEAK_FLOPS`). XLA's own FLOP count of the compiled
step is printed beside it as a check of the analytic count.

Steps are dispatched back to back as in training and timed over `--steps` with one sync at the
end, repeated `--repeats` times; the table gives the median. With `--out` the markdown section is
also written to a file (for `benchmarks/RESULTS.md`), and with `--json_out` the numbers as JSON
(what `gpu_suite.sh` summarises). A variant that fails (a config field not there yet, cuDNN
missing, out of memory) is reported as failed and the others still run.

`--dump_hlo_dir` writes the optimized HLO of each compiled step and prints what it is made of
(`hlo_summary`): the fusion kernels by kind, the custom calls by target (cuBLAS GEMMs, cuDNN
attention), and how many kernels touch each LayerNorm site (embeddings, two per layer, the MLM
transform), named from the operations' metadata and counted by shape (reduces over the hidden
axis, rsqrt). Kernels per site is the number a fused residual-add + LayerNorm should lower; the
dumped text shows which operations each kernel holds.
"""

from __future__ import annotations

import datetime
import gc
import json
import math
import os
import platform
import re
import statistics
import sys
import time

_STARTED = time.perf_counter()  # before JAX and the model are imported: the SETUP line's origin
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app, flags
import jax
import numpy as np

from benchmarks import finetune_compile
from bert_jax.model import configuration
from bert_jax.model import cudnn_runtime
from bert_jax.objectives import mlm_nsp
from bert_jax.parallel import hlo_costs
from bert_jax.parallel import sharding
from bert_jax.text import features
from bert_jax.training import optimizer
from bert_jax.training import perf
from bert_jax.training import state as state_lib
from bert_jax.training import step as step_lib
# pylint: enable=g-import-not-at-top,wrong-import-position

_CONFIGS = flags.DEFINE_list("configs", ["base", "large"], "Presets, in order.")
_VARIANTS = flags.DEFINE_list("variants", ["paper", "fast-xla", "fast-cudnn"],
                              "Attention variants (see the module docstring).")
_LAYERS = flags.DEFINE_list("layers", ["unrolled"], "unrolled, scanned and/or stacked "
                            "(`LAYOUTS`).")
_BATCH = flags.DEFINE_list("batch", [], "Per-config batch size overrides, e.g. base=256.")
_STEPS = flags.DEFINE_integer("steps", 20, "Steps per timed repeat.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats (median reported).")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps after compilation.")
_DTYPE = flags.DEFINE_string("dtype", "bfloat16", "Compute dtype (parameters stay float32).")
_PRNG = flags.DEFINE_string("prng", None, "jax_default_prng_impl (threefry2x32, rbg, unsafe_rbg).")
_PROFILE = flags.DEFINE_string(
    "profile_dir", None, "Trace 5 more steps of each variant here and print the device "
    "kernels that take the most time.")
_OUT = flags.DEFINE_string("out", None, "Also write the markdown section here.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the results as JSON here.")
_DUMP_HLO = flags.DEFINE_string(
    "dump_hlo_dir", None, "Write each compiled step's optimized HLO text here and print its "
    "kernel counts (fusions, custom calls, kernels per LayerNorm site).")
_TASK = flags.DEFINE_enum(
    "task", "pretrain", ["pretrain", "glue", "squad"],
    "The step timed: pre-training (MLM + NSP), or fine-tuning at the paper's shapes "
    "(`finetune_compile.TASKS`): a GLUE pair task (MNLI's three labels) or SQuAD's spans.")
_ATTENTION_TILING = flags.DEFINE_string(
    "attention_tiling", None, "Our Triton attention kernels' tiling "
    "(block_q:block_k:backward_block:backward_step:num_warps; `triton_attention.Tiling`) for "
    "the variants that run them (paper-pallas-*); unset: the kernels' default.")
_BATCH_FILE = flags.DEFINE_string(
    "batch_file", None, "A real batch (.npz of the input pipeline's arrays, packed or not) "
    "instead of random full rows; its shape overrides the preset's.")

# The paper's pre-training lengths: 128 (90% of steps) and 512 (the last 10%), with its
# max_predictions_per_seq (20 and 76).
SHAPES = {
    "tiny": dict(batch=64, length=128, predictions=20),
    "base": dict(batch=256, length=128, predictions=20),
    "large": dict(batch=32, length=512, predictions=76),
}

VARIANTS = {
    "paper": dict(attention_probs_dropout_prob=0.1, attention_implementation=None),
    "fast-xla": dict(attention_probs_dropout_prob=0.0, attention_implementation="xla"),
    "fast-cudnn": dict(attention_probs_dropout_prob=0.0, attention_implementation="cudnn"),
    # No dropout at all: the bound on what dropout's random bits cost.
    "nodrop-cudnn": dict(attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0,
                         attention_implementation="cudnn"),
    # The paper's recipe with attention dropout inside cuDNN's fused kernel.
    "paper-cudnn": dict(attention_probs_dropout_prob=0.1, attention_implementation="cudnn"),
    # A/B against paper-cudnn, one change each: the float32 residual stream and LayerNorm of
    # flax's module at every site; one random 32-bit word per dropout decision (the default
    # draws 16 bits per decision); fp8 matmuls.
    "paper-cudnn-f32res": dict(attention_probs_dropout_prob=0.1, attention_implementation="cudnn",
                               low_precision_layer_norm=False),
    "paper-cudnn-bits32": dict(attention_probs_dropout_prob=0.1, attention_implementation="cudnn",
                               dropout_bits=32),
    "paper-cudnn-fp8": dict(attention_probs_dropout_prob=0.1, attention_implementation="cudnn",
                            quantization="fp8"),
    # GELU's tanh form, the original BERT code's `gelu`: cuBLASLt's epilogue computes it with
    # the bias add inside the first feed-forward GEMM where XLA routes that GEMM to cuBLASLt.
    "paper-cudnn-tanh": dict(attention_probs_dropout_prob=0.1, attention_implementation="cudnn",
                             hidden_act="gelu_new"),
    # Each block's dropout + residual add + LayerNorm as one kernel forward and one backward
    # (`model/pallas_layer_norm.py`), the masks drawn in the kernels.
    "paper-cudnn-fusedln": dict(attention_probs_dropout_prob=0.1,
                                attention_implementation="cudnn",
                                layer_norm_implementation="pallas"),
    "paper-cudnn-tanh-fusedln": dict(attention_probs_dropout_prob=0.1,
                                     attention_implementation="cudnn", hidden_act="gelu_new",
                                     layer_norm_implementation="pallas"),
    "paper-cudnn-fp8-fusedln": dict(attention_probs_dropout_prob=0.1,
                                    attention_implementation="cudnn", quantization="fp8",
                                    layer_norm_implementation="pallas"),
    # Attention dropout inside our Triton kernel (`model/triton_attention.py`) instead of
    # cuDNN's, the masks drawn from the layer's dropout key (a resumed run draws the same).
    "paper-pallas-fusedln": dict(attention_probs_dropout_prob=0.1,
                                 attention_implementation="pallas",
                                 layer_norm_implementation="pallas"),
}

# `--layers`: how the layers run and where their parameters live. "stacked": the scanned
# layout's stacked parameters and optimizer state, the layers run unrolled
# (`BertConfig.stack_unrolled`): one optimizer kernel per stacked leaf, not one per layer's leaf.
LAYOUTS = {
    "unrolled": dict(scan_layers=False),
    "scanned": dict(scan_layers=True),
    "stacked": dict(scan_layers=True, stack_unrolled=True),
}


def random_batch(rng: np.random.RandomState, batch: int, length: int, predictions: int,
                 vocab_size: int) -> dict[str, np.ndarray]:
  """Full-length rows of random ids with `predictions` masked positions each."""
  positions = np.sort(np.stack([rng.choice(np.arange(1, length), predictions, replace=False)
                                for _ in range(batch)]), axis=1).astype(np.int32)
  input_ids = rng.randint(1000, vocab_size, size=(batch, length)).astype(np.int32)
  segment_ids = (np.arange(length)[None, :] >= length // 2).astype(np.int32).repeat(batch, 0)
  return {
      features.INPUT_IDS: input_ids,
      features.INPUT_MASK: np.ones((batch, length), np.int32),
      features.SEGMENT_IDS: segment_ids,
      features.MASKED_LM_POSITIONS: positions,
      features.MASKED_LM_IDS: np.take_along_axis(input_ids, positions, axis=1),
      features.MASKED_LM_WEIGHTS: np.ones((batch, predictions), np.float32),
      features.NEXT_SENTENCE_LABELS: rng.randint(0, 2, size=(batch, 1)).astype(np.int32),
  }


def finetune_objective_and_batch(task: str, rng: np.random.RandomState, batch: int,
                                 length: int, vocab_size: int):
  """The fine-tuning objective of `task` (`finetune_compile.objective`) and a batch for it:
  `random_batch`'s full-length rows, with random labels."""
  objective = finetune_compile.objective(task, length)
  rows = random_batch(rng, batch, length, 0, vocab_size)
  np_batch = {**objective.example_batch(batch),
              **{k: rows[k] for k in features.ENCODER_INPUTS},
              "weight": np.ones((batch,), np.float32)}
  if task == "glue":
    np_batch["label"] = rng.randint(0, 3, size=(batch,)).astype(np.int32)
  else:
    starts = rng.randint(length // 2, length - 8, size=(batch,)).astype(np.int32)
    np_batch.update(start_positions=starts, end_positions=starts + rng.randint(0, 8, (batch,)
                                                                               ).astype(np.int32))
  return objective, np_batch


def _xla_flops(compiled) -> float | None:
  try:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
      cost = cost[0] if cost else {}
    return float(cost.get("flops")) if cost and cost.get("flops") else None
  except Exception:  # pylint: disable=broad-except
    return None


# Optimized HLO text, as `compiled.as_text()` prints it: computations open with a header line
# ending in "{" and close with "}"; each instruction is `[ROOT] %name = type opcode(operands),
# attributes`; a fusion names its body with `calls=`, and `metadata={op_name=...}` keeps the
# module path of the JAX operation an instruction came from (".../layer_0/output/LayerNorm/...").
_HLO_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([^\s(]+)\s*\(")
_HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(?:\w+\[([\d,]*)\])?")
_HLO_FUSION = re.compile(r"\sfusion\(")
_HLO_CALLS = re.compile(r"calls=%?([\w.\-]+)")
_HLO_KIND = re.compile(r"kind=(k\w+)")
_HLO_BACKEND_KIND = re.compile(r'"kind":"([^"]+)"')
_HLO_TARGET = re.compile(r'custom_call_target="([^"]+)"')
# The first operand of a reduce: its shape printed inline, or its name.
_HLO_REDUCE = re.compile(r"\sreduce\(\(?(?:\w+\[([\d,]*)\]\S*\s+)?%?([\w.\-]+)")
_HLO_DIMENSIONS = re.compile(r"dimensions=\{([\d,]*)\}")
_LAYER_NORM = re.compile(r"layer_?norm", re.IGNORECASE)


def _hlo_computations(text: str) -> dict[str, list[str]]:
  computations, current = {}, None
  for line in text.splitlines():
    if line and not line[0].isspace() and line.rstrip().endswith("{"):
      match = _HLO_HEADER.match(line)
      if match:
        current = computations.setdefault(match.group(1), [])
        continue
    if line.startswith("}"):
      current = None
    elif current is not None:
      current.append(line)
  return computations


def layer_norm_site(op_name: str) -> str | None:
  """The module path of the LayerNorm an operation belongs to, without JAX's transformation
  wrappers (`jvp(...)`, `transpose(...)`), so a site's forward and backward kernels agree:
  "jit(step)/transpose(jvp(M))/bert/encoder/layer_0/output/LayerNorm/mul" gives
  "bert/encoder/layer_0/output/LayerNorm"."""
  parts = [p for p in op_name.split("/") if "(" not in p and ")" not in p]
  for i, part in enumerate(parts):
    if _LAYER_NORM.search(part):
      return "/".join(parts[:i + 1])
  return None


def hlo_summary(text: str, hidden: int, rows: set[int]) -> dict:
  """Kernel counts of an optimized HLO module.

  Kernels are the fusion instructions outside fused computations (a fusion's body, with any
  fusion nested in it, is one kernel). LayerNorm is measured two ways, so that a renamed module
  or a rewritten pattern cannot hide it: by the LayerNorm sites named in each kernel's metadata
  (kernels per site is what a fused residual-add + LayerNorm with its own backward should
  lower), and by shape: a kernel with a reduce of an operand whose last dimension is `hidden`,
  over that dimension alone, with `rows` rows (tokens, or masked positions for the MLM
  transform) — LayerNorm's statistics forward and its input gradient backward, and nothing else
  in BERT (softmax reduces over keys, the loss over the vocabulary, bias gradients over tokens).
  """
  computations = _hlo_computations(text)
  shapes = {}
  for lines in computations.values():
    for line in lines:
      match = _HLO_INSTRUCTION.match(line)
      if match and match.group(2) is not None:
        shapes[match.group(1)] = [int(d) for d in match.group(2).split(",") if d]
  fused = {m.group(1) for lines in computations.values() for line in lines
           if _HLO_FUSION.search(line) for m in [_HLO_CALLS.search(line)] if m}

  def body(name: str, seen: set[str]) -> list[str]:
    lines = computations.get(name, [])
    out = list(lines)
    for line in lines:
      match = _HLO_CALLS.search(line) if _HLO_FUSION.search(line) else None
      if match and match.group(1) not in seen:
        seen.add(match.group(1))
        out += body(match.group(1), seen)
    return out

  def reduces_hidden(line: str) -> bool:
    match, dims = _HLO_REDUCE.search(line), _HLO_DIMENSIONS.search(line)
    if not match or not dims:
      return False
    if match.group(1) is not None:
      sizes = [int(d) for d in match.group(1).split(",") if d]
    else:
      sizes = shapes.get(match.group(2), [])
    reduced = [int(d) for d in dims.group(1).split(",") if d]
    return (len(sizes) >= 2 and sizes[-1] == hidden and reduced == [len(sizes) - 1]
            and math.prod(sizes[:-1]) in rows)

  kinds, backend_kinds, targets, per_site = {}, {}, {}, {}
  kernels = ln_reduce = ln_rsqrt = ln_named = 0
  for name, lines in computations.items():
    for line in lines:
      for target in _HLO_TARGET.findall(line):
        targets[target] = targets.get(target, 0) + 1
      if name in fused or not _HLO_FUSION.search(line):
        continue
      kernels += 1
      kind = _HLO_KIND.search(line)
      kind = kind.group(1) if kind else "?"
      kinds[kind] = kinds.get(kind, 0) + 1
      if kind == "kCustom":
        backend = _HLO_BACKEND_KIND.search(line)
        backend = backend.group(1) if backend else "?"
        backend_kinds[backend] = backend_kinds.get(backend, 0) + 1
      calls = _HLO_CALLS.search(line)
      inner = [line] + (body(calls.group(1), {calls.group(1)}) if calls else [])
      ln_reduce += any(" reduce(" in l and reduces_hidden(l) for l in inner)
      ln_rsqrt += any(" rsqrt(" in l for l in inner)
      sites = {layer_norm_site(m) for l in inner for m in hlo_costs.OP_NAME.findall(l)} - {None}
      ln_named += bool(sites)
      for site in sites:
        per_site[site] = per_site.get(site, 0) + 1
  return dict(kernels=kernels, kinds=kinds, custom_fusions=backend_kinds, custom_calls=targets,
              pallas_kernels=hlo_costs.pallas_kernels(text), ln_kernels=ln_named,
              ln_per_site=per_site, ln_reduce_kernels=ln_reduce, ln_rsqrt_kernels=ln_rsqrt)


def describe_hlo(h: dict, layer_norm_sites: int) -> str:
  """One line of `hlo_summary`; `layer_norm_sites`: how many the model has (2L + 2)."""
  count = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))
  custom = f" [{count(h['custom_fusions'])}]" if h["custom_fusions"] else ""
  per_site = sorted(h["ln_per_site"].values())
  if per_site:
    named = (f"{len(per_site)} sites named (model: {layer_norm_sites}), kernels per site median "
             f"{statistics.median(per_site):g} (min {per_site[0]}, max {per_site[-1]}), "
             f"{h['ln_kernels']} kernels touch one")
  else:
    named = f"no site named in the metadata (model: {layer_norm_sites})"
  pallas = (f" (Pallas kernels by name: {count(h['pallas_kernels'])})"
            if h.get("pallas_kernels") else "")
  return (f"{h['kernels']} fusion kernels ({count(h['kinds'])}{custom}); custom calls: "
          f"{count(h['custom_calls']) or 'none'}{pallas}; LayerNorm: {named}; by shape "
          f"{h['ln_reduce_kernels']} kernels reduce over the hidden axis "
          f"({h['ln_reduce_kernels'] / max(layer_norm_sites, 1):.1f}/site), "
          f"{h['ln_rsqrt_kernels']} compute an rsqrt")


def _dump_hlo(text: str, name: str, variant: str, layers: str, config, shape: dict) -> str:
  """Writes the compiled step's HLO `text` and returns its summary line; never raises."""
  try:
    os.makedirs(_DUMP_HLO.value, exist_ok=True)
    path = os.path.join(_DUMP_HLO.value, f"{name}-{variant}-{layers}.hlo.txt")
    with open(path, "w", encoding="utf-8") as f:
      f.write(text)
    rows = {shape["batch"] * shape["length"], shape["batch"] * shape["predictions"]}
    line = describe_hlo(hlo_summary(text, config.hidden_size, rows),
                        2 * config.num_hidden_layers + 2)
  except Exception as e:  # pylint: disable=broad-except
    line = f"no summary ({type(e).__name__}: {str(e)[:200]})"
  print(f"HLO {name} {variant} {layers}: {line}", flush=True)
  return line


def run_one(name: str, variant: str, layers: str, batch_size: int) -> dict:
  shape = dict(SHAPES[name], batch=batch_size)
  config = configuration.get_preset(name, dtype=_DTYPE.value, **LAYOUTS[layers],
                                    **VARIANTS[variant])
  packing = {}
  if _TASK.value != "pretrain":
    shape = dict(finetune_compile.TASKS[_TASK.value], batch=batch_size, predictions=0)
    objective, np_batch = finetune_objective_and_batch(
        _TASK.value, np.random.RandomState(0), batch_size, shape["length"], config.vocab_size)
  elif _BATCH_FILE.value:
    with np.load(_BATCH_FILE.value, allow_pickle=False) as stored:
      np_batch = {k: stored[k] for k in stored.files}
    shape = dict(batch=np_batch[features.INPUT_IDS].shape[0],
                 length=np_batch[features.INPUT_IDS].shape[1],
                 predictions=np_batch[features.MASKED_LM_IDS].shape[1])
    if features.SEQUENCE_IDS in np_batch:
      packing = {"packed": True,
                 "max_sequences_per_row": np_batch[features.CLS_POSITIONS].shape[1]}
  else:
    np_batch = random_batch(np.random.RandomState(0), batch_size, shape["length"],
                            shape["predictions"], config.vocab_size)
  shape["real"] = float(np.mean(np_batch[features.INPUT_MASK]))
  shape["packed"] = bool(packing)
  if _TASK.value == "pretrain":
    objective = mlm_nsp.MaskedLmNextSentence(shape["length"], shape["predictions"], **packing)
  tx, schedule = optimizer.create_optimizer(
      {"name": "adamw", "learning_rate": 1e-4, "total_steps": 10000, "warmup_steps": 100,
       "weight_decay": 0.01, "eps": 1e-6, "grad_clip_norm": 1.0})
  mesh = sharding.create_mesh([-1, 1, 1])
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  model = objective.model(config)

  def setup(phase: str, seconds: float) -> None:
    # Each phase as it ends, so that a run cut short still says where its time went.
    print(f"SETUP {name} {variant} {layers}: {phase} {seconds:.1f} s "
          f"({time.perf_counter() - _STARTED:.1f} s since the process started)", flush=True)

  start = time.perf_counter()
  state, state_sh = state_lib.create_train_state(model, tx, mesh, rules, 0, np_batch,
                                                 objective.input_names)
  jax.block_until_ready(state)
  setup("state", time.perf_counter() - start)
  batch_sh = sharding.batch_sharding(mesh)
  batch = jax.device_put(np_batch, batch_sh)
  step = step_lib.build_train_step(objective, model, tx, schedule, state_sh, batch_sh, mesh, rules)
  start = time.perf_counter()
  lowered = step.lower(state, batch)
  lower_s = time.perf_counter() - start
  setup("tracing and lowering", lower_s)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start  # the table's compile: lowering included
  setup("XLA compile", compile_s - lower_s)
  # The optimized HLO, printed once for the dump and the profile's kernel kinds.
  start = time.perf_counter()
  hlo_text = compiled.as_text() if _DUMP_HLO.value or _PROFILE.value else None
  hlo = _dump_hlo(hlo_text, name, variant, layers, config, shape) if _DUMP_HLO.value else None
  if hlo_text is not None:
    setup("optimized HLO text", time.perf_counter() - start)
  start = time.perf_counter()
  for _ in range(_WARMUP.value):
    state, metrics = compiled(state, batch)
  first_loss = float(metrics["loss"])
  setup(f"{_WARMUP.value} warm-up steps", time.perf_counter() - start)
  times = []
  for _ in range(_REPEATS.value):
    jax.block_until_ready(state.params)
    start = time.perf_counter()
    for _ in range(_STEPS.value):
      state, metrics = compiled(state, batch)
    jax.block_until_ready(state.params)
    times.append((time.perf_counter() - start) / _STEPS.value)
  last_loss = float(metrics["loss"])
  profile = None
  if _PROFILE.value:
    trace_dir = os.path.join(_PROFILE.value, f"{name}-{variant}-{layers}")
    try:  # a profile that fails costs the profile, not the timing above
      with jax.profiler.trace(trace_dir):
        for _ in range(5):
          state, metrics = compiled(state, batch)
        jax.block_until_ready(state.params)
      profile = device_time(trace_dir, 5, statistics.median(times), hlo_text)
    except Exception as e:  # pylint: disable=broad-except
      profile = {"error": f"profiling failed: {type(e).__name__}: {e}"}
    print(describe_device_time(profile, f"{name} {variant} {layers}"), flush=True)
  analytic = objective.flops_per_step(config, batch_size)
  peak = perf.peak_flops_per_device(jax.devices()[0])
  median = statistics.median(times)
  result = dict(name=name, task=_TASK.value, variant=variant, layers=layers,
                hidden_act=config.hidden_act,
                shape=shape, compile_s=compile_s,
                step_s=median, spread=(min(times), max(times)), analytic=analytic,
                xla=_xla_flops(compiled), peak=peak,
                mfu=(analytic / median / peak / jax.device_count()) if peak else None,
                losses=(first_loss, last_loss),
                memory=_peak_memory(), hlo=hlo, profile=profile,
                device=jax.devices()[0].device_kind)
  if config.attention_implementation == "pallas" and jax.default_backend() == "gpu":
    from bert_jax.model import triton_attention  # pylint: disable=g-import-not-at-top
    result["attention_tiling"] = str(triton_attention.default_tiling())
  del state, compiled, step, batch
  gc.collect()
  return result


def device_time(trace_dir: str, steps: int, step_s: float, hlo_text: str | None = None,
                top: int = 15) -> dict:
  """Where a step's device time goes, read from a `jax.profiler` trace (its .xplane.pb, through
  `jax.profiler.ProfileData`: no TensorBoard needed).

  Kernels are the events of the device planes: on a GPU those of its stream lines (named by
  the HLO instruction they run, `hlo_op`, where the trace records it, else by the kernel's own
  name; no derived line counts a kernel twice), on a TPU those of its "XLA Ops" line, on a CPU
  the events of XLA's threads that name an HLO instruction. The traced steps run without command
  buffers (`profile_without_command_buffers`): kernel times are each kernel's own, and the
  traced steps wait longer between kernels than the timed ones.

  Per step: the time kernels run (`busy_ms`: the union of their intervals, so overlapping
  streams count once) against the timed step's wall time, the rest being time the device
  waits (launches, host work); the kernel time by kind (`hlo_costs`'
  matmul / attention / collective / other, read from the compiled HLO) and by part of the step
  (`hlo_costs.model_part`: forward or backward LayerNorm, dropout, attention, projections,
  feed-forward, heads, embeddings, and the optimizer); the kernels shorter than 10 µs, whose
  count and time say what launch gaps and tails cost; and the instructions that take most,
  grouped by name without their numeric suffix, with the bandwidth each group reaches on the
  bytes `hlo_costs` counts for it."""
  import collections  # pylint: disable=g-import-not-at-top
  import glob  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  paths = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))
  if not paths:
    return {"error": f"no .xplane.pb under {trace_dir}"}
  data = jax.profiler.ProfileData.from_file(paths[-1])
  planes = [p for p in data.planes if p.name.startswith("/device:")]
  if not planes:
    planes = [p for p in data.planes if p.name == "/host:CPU"]
  events = []  # (start_ns, end_ns, HLO instruction or kernel name)
  for plane in planes:
    lines = list(plane.lines)
    streams = [line for line in lines if line.name.startswith("Stream")]
    ops = [line for line in lines if line.name == "XLA Ops"]
    every_event = bool(streams or ops)  # a GPU's kernels, a TPU's ops: each event is one
    for line in streams or ops or lines:
      for e in line.events:
        op = dict(e.stats).get("hlo_op") or (e.name if every_event else None)
        if op and e.duration_ns > 0:
          events.append((e.start_ns, e.start_ns + e.duration_ns, str(op)))
  if not events:
    return {"error": f"no kernel events with an hlo_op in {paths[-1]}"}
  events.sort()
  busy, end = 0.0, -1.0
  for start, stop, _ in events:
    if stop > end:
      busy += stop - max(start, end)
      end = stop
  kinds, parts, moved = {}, {}, {}
  if hlo_text:
    module = hlo_costs.parse(hlo_text)
    for _, instr, nbytes in hlo_costs.instruction_traffic(module):
      kinds[instr.name] = hlo_costs.kernel_kind(module, instr)
      parts[instr.name] = hlo_costs.model_part(hlo_costs.op_name(instr, module))
      moved[instr.name] = moved.get(instr.name, 0.0) + nbytes
  by_kind, by_part, by_group, group_kernels, group_bytes = (
      collections.Counter() for _ in range(5))
  short, short_ns = 0, 0.0
  seen = set()
  for start, stop, op in events:
    by_kind[kinds.get(op, "unmatched" if kinds else "all")] += stop - start
    by_part[parts.get(op, "unmatched" if parts else "all")] += stop - start
    if stop - start < 10_000:
      short, short_ns = short + 1, short_ns + stop - start
    group = re.sub(r"[.\d]+$", "", op)
    by_group[group] += stop - start
    group_kernels[group] += 1
    if op not in seen:
      seen.add(op)
      group_bytes[group] += moved.get(op, 0.0)  # HBM bytes per step, each instruction once
  ms = lambda ns: ns / steps / 1e6
  return {
      "step_ms": 1e3 * step_s, "busy_ms": ms(busy), "kernels_per_step": len(events) / steps,
      "kinds_ms": {k: ms(v) for k, v in by_kind.most_common()},
      "parts_ms": {k: ms(v) for k, v in by_part.most_common()},
      "short_kernels_per_step": short / steps, "short_ms": ms(short_ns),
      "top": [{"group": g, "ms": ms(v), "kernels_per_step": group_kernels[g] / steps,
               "gb_per_s": (group_bytes[g] / (v / steps / 1e9) / 1e9) if group_bytes[g] else None}
              for g, v in by_group.most_common(top)]}


def describe_device_time(found: dict, label: str) -> str:
  """`device_time` as the lines the suite's log and summary show."""
  if "error" in found:
    return f"PROFILE {label}: {found['error']}"
  kinds = ", ".join(f"{k} {v:.1f}" for k, v in found["kinds_ms"].items())
  lines = [f"PROFILE {label}: step {found['step_ms']:.1f} ms, kernels busy {found['busy_ms']:.1f}"
           f" ms ({found['kernels_per_step']:.0f} kernels), by kind (ms): {kinds}"]
  if "parts_ms" in found:
    parts = ", ".join(f"{k} {v:.2f}" for k, v in found["parts_ms"].items())
    lines.append(f"  by part (ms): {parts}")
    lines.append(f"  kernels under 10 µs: {found['short_kernels_per_step']:.0f} per step, "
                 f"{found['short_ms']:.2f} ms")
  for t in found["top"]:
    rate = f", {t['gb_per_s']:,.0f} GB/s" if t["gb_per_s"] else ""
    lines.append(f"  {t['ms']:7.2f} ms  {t['kernels_per_step']:5.0f}×  {t['group'][:70]}{rate}")
  return "\n".join(lines)


def _peak_memory() -> float | None:
  try:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use", 0) / 2**30
  except Exception:  # pylint: disable=broad-except
    return None


def _row(r: dict) -> str:
  s = r["shape"]
  tokens = s["batch"] * s["length"] * s["real"] / r["step_s"]  # real (non-padding) tokens
  mfu = f"**{100 * r['mfu']:.1f}%**" if r["mfu"] is not None else "n/a"
  xla = f"{r['xla'] * jax.device_count() / 1e12:.2f}" if r["xla"] else "n/a"
  mem = f"{r['memory']:.1f}" if r["memory"] is not None else "n/a"
  layout = "packed" if s["packed"] else ("real" if _BATCH_FILE.value else "random")
  what = (f"({s['predictions']})" if r.get("task", "pretrain") == "pretrain"
          else f"{r['task']} fine-tuning,")
  return (f"| {r['name']} | {s['batch']} × {s['length']} {what} {layout}, "
          f"{100 * s['real']:.0f}% real | {r['variant']} | "
          f"{r['layers']} | {r['compile_s']:.1f} | {1000 * r['step_s']:.1f} "
          f"({1000 * r['spread'][0]:.1f}–{1000 * r['spread'][1]:.1f}) | {tokens:,.0f} | "
          f"{r['analytic'] / 1e12:.2f} | {xla} | {r['analytic'] / r['step_s'] / 1e12:.0f} | "
          f"{mfu} | {mem} | {r['losses'][0]:.3f} → {r['losses'][1]:.3f} |")


def report(results: list[dict], failures: list[str]) -> str:
  device = jax.devices()[0]
  step_name, objective_name = {
      "pretrain": ("pre-training", "MLM at the masked positions + NSP"),
      "glue": ("fine-tuning", "MNLI's classifier (3 labels) on the pooled [CLS]"),
      "squad": ("fine-tuning", "SQuAD's start and end over every position"),
  }[_TASK.value]
  peak = perf.peak_flops_per_device(device)
  lines = [
      f"## MFU of the production {step_name} step on {device.device_kind} "
      f"({datetime.date.today().isoformat()})", "",
      f"- Command: `python benchmarks/accelerator_step.py --configs={','.join(_CONFIGS.value)} "
      f"--variants={','.join(_VARIANTS.value)} --layers={','.join(_LAYERS.value)}"
      + (f" --task={_TASK.value}" if _TASK.value != "pretrain" else "")
      + (f" --batch={','.join(_BATCH.value)}" if _BATCH.value else "")
      + (f" --prng={_PRNG.value}" if _PRNG.value else "")
      + (f" --batch_file={_BATCH_FILE.value}" if _BATCH_FILE.value else "")
      + f" --steps={_STEPS.value} --repeats={_REPEATS.value}`",
      f"- Machine: {jax.device_count()} × {device.device_kind}, {os.cpu_count()} CPU cores, "
      f"{platform.system()} {platform.machine()}; jax {jax.__version__}; compute {_DTYPE.value}, "
      "parameters float32",
      f"- Peak used for MFU: {peak / 1e12:.0f} TFLOP/s dense bf16 per device" if peak else
      "- Peak: unknown device, no MFU",
      "- Step: `training.step.build_train_step` (the paper's AdamW, clipping, schedule, donated "
      f"sharded state), {objective_name}; "
      + (f"the rows of `{_BATCH_FILE.value}`." if _BATCH_FILE.value
         else "full-length random rows."), "",
      "| config | batch × seq (masked) | attention | layers | compile (s) | step ms (min–max) "
      "| real tokens/s | analytic TFLOP/step | XLA TFLOP/step | achieved TFLOP/s | MFU | peak GiB "
      "| loss first → last |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  lines += [_row(r) for r in results]
  lines += [""] + [f"- HLO {r['name']} {r['variant']} {r['layers']}: {r['hlo']}"
                   for r in results if r.get("hlo")]
  profiles = [describe_device_time(r["profile"], f"{r['name']} {r['variant']} {r['layers']}")
              for r in results if r.get("profile")]
  lines += ["", "```", *profiles, "```"] if profiles else []
  lines += [f"- Failed: {f}" for f in failures] + ([""] if failures else [])
  return "\n".join(lines)


def _write(results: list[dict], failures: list[str]) -> None:
  if _OUT.value:
    with open(_OUT.value, "w", encoding="utf-8") as f:
      f.write(report(results, failures))
  if _JSON_OUT.value:
    with open(_JSON_OUT.value, "w", encoding="utf-8") as f:
      json.dump({"results": [dict(r, impl="jax") for r in results], "failures": failures}, f,
                indent=1)


# Profiled steps run without command buffers: inside one, JAX 0.11.2's trace reports the
# kernels under the command buffer's name instead of their HLO instructions.
PROFILE_FLAG = "--xla_enable_command_buffers_during_profiling"


def profile_without_command_buffers(environ=os.environ) -> None:
  """Adds `PROFILE_FLAG`=false to XLA_FLAGS unless they set it (before JAX starts). Every run
  sets it, profiled or not (it acts only while profiling): XLA_FLAGS are part of the
  compilation cache's key, so a profiled and a timed run of one step share their compile."""
  cudnn_runtime.default_xla_flag(PROFILE_FLAG, "false", environ)


def main(argv):
  del argv
  for flag, given, known in (("--variants", _VARIANTS.value, VARIANTS),
                             ("--layers", _LAYERS.value, LAYOUTS)):
    if set(given) - set(known):
      raise app.UsageError(f"{flag}: {', '.join(sorted(set(given) - set(known)))} unknown; "
                           f"expected some of {', '.join(known)}.")
  if _TASK.value != "pretrain" and _BATCH_FILE.value:
    raise app.UsageError("--batch_file holds pre-training rows; --task=pretrain reads it.")
  if _ATTENTION_TILING.value:
    from bert_jax.model import triton_attention  # pylint: disable=g-import-not-at-top
    try:
      triton_attention.set_default_tiling(triton_attention.Tiling.parse(_ATTENTION_TILING.value))
    except ValueError as e:
      raise app.UsageError(f"--attention_tiling: {e}") from e
  cudnn_runtime.prepare()  # before JAX starts its backends
  profile_without_command_buffers()
  if _PRNG.value:
    jax.config.update("jax_default_prng_impl", _PRNG.value)
  batch_override = dict(item.split("=") for item in _BATCH.value)
  results, failures = [], []
  for name in _CONFIGS.value:
    for layers in _LAYERS.value:
      for variant in _VARIANTS.value:
        default = (SHAPES[name] if _TASK.value == "pretrain"
                   else finetune_compile.TASKS[_TASK.value])["batch"]
        batch_size = int(batch_override.get(name, default))
        try:
          r = run_one(name, variant, layers, batch_size)
        except Exception as e:  # pylint: disable=broad-except
          # One variant failing (cuDNN missing on this device, out of memory) must not lose the
          # others' numbers.
          failures.append(f"{name} {variant} {layers}: {type(e).__name__}: "
                          f"{(str(e).splitlines() or [''])[0][:300]}")
          print(f"FAILED {failures[-1]}", flush=True)
          gc.collect()
          _write(results, failures)
          continue
        results.append(r)
        print(_row(r), flush=True)
        _write(results, failures)
  print("\n" + report(results, failures), flush=True)
  _write(results, failures)


if __name__ == "__main__":
  app.run(main)
