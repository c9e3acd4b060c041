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
* `fast-cudnn` — the same through cuDNN's fused flash-attention kernel (GPU only).

`--layers` picks unrolled layers, `nn.scan` over layers, or both. Shapes per preset (`SHAPES`) are
the paper's sequence lengths; the batch is random ids at full length (every row is real tokens,
so hardware MFU and useful-token MFU coincide). MFU = the analytic matmul FLOPs of the step
(`MaskedLmNextSentence.flops_per_step`, the count the training loop prints) / step time / the
device's peak dense bf16 rate (`training.perf.PEAK_FLOPS`). XLA's own FLOP count of the compiled
step is printed beside it as a check of the analytic count.

Steps are dispatched back to back as in training and timed over `--steps` with one sync at the
end, repeated `--repeats` times; the table gives the median. With `--out` the markdown section is
also written to a file (for `benchmarks/RESULTS.md`).
"""

from __future__ import annotations

import datetime
import gc
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app, flags
import jax
import numpy as np

from bert_jax.model import configuration
from bert_jax.objectives import mlm_nsp
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
_LAYERS = flags.DEFINE_list("layers", ["unrolled"], "unrolled and/or scanned.")
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


def _xla_flops(compiled) -> float | None:
  try:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
      cost = cost[0] if cost else {}
    return float(cost.get("flops")) if cost and cost.get("flops") else None
  except Exception:  # pylint: disable=broad-except
    return None


def run_one(name: str, variant: str, layers: str, batch_size: int) -> dict:
  shape = dict(SHAPES[name], batch=batch_size)
  config = configuration.get_preset(name, dtype=_DTYPE.value, scan_layers=layers == "scanned",
                                    **VARIANTS[variant])
  packing = {}
  if _BATCH_FILE.value:
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
  objective = mlm_nsp.MaskedLmNextSentence(shape["length"], shape["predictions"], **packing)
  tx, schedule = optimizer.create_optimizer(
      {"name": "adamw", "learning_rate": 1e-4, "total_steps": 10000, "warmup_steps": 100,
       "weight_decay": 0.01, "eps": 1e-6, "grad_clip_norm": 1.0})
  mesh = sharding.create_mesh([-1, 1, 1])
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  model = objective.model(config)
  state, state_sh = state_lib.create_train_state(model, tx, mesh, rules, 0, np_batch,
                                                 objective.input_names)
  batch_sh = sharding.batch_sharding(mesh)
  batch = jax.device_put(np_batch, batch_sh)
  step = step_lib.build_train_step(objective, model, tx, schedule, state_sh, batch_sh, mesh, rules)
  start = time.perf_counter()
  compiled = step.lower(state, batch).compile()
  compile_s = time.perf_counter() - start
  for _ in range(_WARMUP.value):
    state, metrics = compiled(state, batch)
  first_loss = float(metrics["loss"])
  times = []
  for _ in range(_REPEATS.value):
    jax.block_until_ready(state.params)
    start = time.perf_counter()
    for _ in range(_STEPS.value):
      state, metrics = compiled(state, batch)
    jax.block_until_ready(state.params)
    times.append((time.perf_counter() - start) / _STEPS.value)
  last_loss = float(metrics["loss"])
  if _PROFILE.value:
    trace_dir = os.path.join(_PROFILE.value, f"{name}-{variant}-{layers}")
    with jax.profiler.trace(trace_dir):
      for _ in range(5):
        state, metrics = compiled(state, batch)
      jax.block_until_ready(state.params)
    print(top_kernels(trace_dir), flush=True)
  analytic = objective.flops_per_step(config, batch_size)
  peak = perf.peak_flops_per_device(jax.devices()[0])
  median = statistics.median(times)
  result = dict(name=name, variant=variant, layers=layers, shape=shape, compile_s=compile_s,
                step_s=median, spread=(min(times), max(times)), analytic=analytic,
                xla=_xla_flops(compiled), peak=peak,
                mfu=(analytic / median / peak / jax.device_count()) if peak else None,
                losses=(first_loss, last_loss),
                memory=_peak_memory())
  del state, compiled, step, batch
  gc.collect()
  return result


def top_kernels(trace_dir: str, top: int = 25) -> str:
  """Device time per kernel name in a `jax.profiler` trace (the Chrome-trace JSON it writes)."""
  import collections  # pylint: disable=g-import-not-at-top
  import glob  # pylint: disable=g-import-not-at-top
  import gzip  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
  if not paths:
    return f"(no trace under {trace_dir})"
  with gzip.open(paths[0], "rt") as f:
    trace = json.load(f)
  events = trace.get("traceEvents", [])
  device_pids = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
                 and "GPU" in str(e.get("args", {}).get("name", "")).upper()}
  totals = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e.get("pid") in device_pids:
      totals[e.get("name", "?")] += float(e.get("dur", 0))
  whole = sum(totals.values()) or 1.0
  lines = [f"device time in {trace_dir}: {whole / 1e3:.1f} ms over 5 steps"]
  for kernel, us in totals.most_common(top):
    lines.append(f"  {100 * us / whole:5.1f}%  {us / 5e3:7.2f} ms/step  {kernel[:110]}")
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
  return (f"| {r['name']} | {s['batch']} × {s['length']} ({s['predictions']}) {layout}, "
          f"{100 * s['real']:.0f}% real | {r['variant']} | "
          f"{r['layers']} | {r['compile_s']:.1f} | {1000 * r['step_s']:.1f} "
          f"({1000 * r['spread'][0]:.1f}–{1000 * r['spread'][1]:.1f}) | {tokens:,.0f} | "
          f"{r['analytic'] / 1e12:.2f} | {xla} | {r['analytic'] / r['step_s'] / 1e12:.0f} | "
          f"{mfu} | {mem} | {r['losses'][0]:.3f} → {r['losses'][1]:.3f} |")


def report(results: list[dict], failures: list[str]) -> str:
  device = jax.devices()[0]
  peak = perf.peak_flops_per_device(device)
  lines = [
      f"## MFU of the production pre-training step on {device.device_kind} "
      f"({datetime.date.today().isoformat()})", "",
      f"- Command: `python benchmarks/accelerator_step.py --configs={','.join(_CONFIGS.value)} "
      f"--variants={','.join(_VARIANTS.value)} --layers={','.join(_LAYERS.value)}"
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
      "sharded state), MLM at the masked positions + NSP; "
      + (f"the rows of `{_BATCH_FILE.value}`." if _BATCH_FILE.value
         else "full-length random rows."), "",
      "| config | batch × seq (masked) | attention | layers | compile (s) | step ms (min–max) "
      "| real tokens/s | analytic TFLOP/step | XLA TFLOP/step | achieved TFLOP/s | MFU | peak GiB "
      "| loss first → last |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  lines += [_row(r) for r in results]
  lines += [""] + [f"- Failed: {f}" for f in failures] + ([""] if failures else [])
  return "\n".join(lines)


def main(argv):
  del argv
  if _PRNG.value:
    jax.config.update("jax_default_prng_impl", _PRNG.value)
  batch_override = dict(item.split("=") for item in _BATCH.value)
  results, failures = [], []
  for name in _CONFIGS.value:
    for layers in _LAYERS.value:
      for variant in _VARIANTS.value:
        batch_size = int(batch_override.get(name, SHAPES[name]["batch"]))
        try:
          r = run_one(name, variant, layers, batch_size)
        except Exception as e:  # pylint: disable=broad-except
          # One variant failing (cuDNN missing on this device, out of memory) must not lose the
          # others' numbers.
          failures.append(f"{name} {variant} {layers}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:300]}")
          print(f"FAILED {failures[-1]}", flush=True)
          gc.collect()
          continue
        results.append(r)
        print(_row(r), flush=True)
        if _OUT.value:
          with open(_OUT.value, "w", encoding="utf-8") as f:
            f.write(report(results, failures))
  section = report(results, failures)
  print("\n" + section)
  if _OUT.value:
    with open(_OUT.value, "w", encoding="utf-8") as f:
      f.write(section)


if __name__ == "__main__":
  app.run(main)
