"""Fine-tuning steps compiled for an NVIDIA GPU on this machine (XLA's GPU compiler, no GPU):
the program fine-tuning ran in bfloat16 before it took the fused kernels (XLA's attention, the
explicit softmax with its dropout, and XLA's LayerNorm) against the one it runs now on a GPU of
compute capability 8.0 or newer (`runs/finetune_job.compute_config`: cuDNN's attention with its
dropout inside the kernel, the Triton dropout + residual + LayerNorm sites), and against the
same with our Triton attention ("pallas": its dropout inside, the joined projection).

    python benchmarks/finetune_compile.py --target=h200 \
        --out=benchmarks/results/gpu_finetune_compile.jsonl [--rows=base:glue,base:squad]

Each row is the production fine-tuning train step (the task's objective and head, the
fine-tuning optimizer, data parallel over one GPU) at the paper's shapes: GLUE 32 × 128, SQuAD
32 × 384. Per row: the HBM the step needs, its kernels by kind and the bytes each kind moves per
step, the time the kernels outside the matmuls need at least at the GPU's peak bandwidth, and
the custom calls (cuDNN's attention, the Triton kernels). GEMM kernels are the compiler's
defaults (no autotuning without a GPU), so matmul bytes are indicative; the other kernels are
the program's own. Rows append to `--out` as they finish; rows already there (same step, GPU,
JAX and XLA_FLAGS) are skipped. Nothing here is a step time: that needs the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# The paper's fine-tuning shapes (Devlin et al. 2019, section 4 and appendix A.3): GLUE at 128
# tokens, SQuAD at 384, batch 32. `accelerator_step.py --task` times the same tasks.
TASKS = {"glue": {"batch": 32, "length": 128}, "squad": {"batch": 32, "length": 384}}
KERNELS = {
    # What a bfloat16 fine-tuning run computed before: XLA's kernels.
    "xla": {"attention_implementation": "xla", "layer_norm_implementation": "xla"},
    # Left unset: what `finetune_job.compute_config` picks for the GPU.
    "fused": {},
    # Our Triton attention with its dropout and the joined projection, the fused sites as above.
    "pallas": {"attention_implementation": "pallas"},
}
DEFAULT_ROWS = "base:glue,base:squad,large:squad"


def objective(task: str, length: int, max_sequences_per_row: int | None = None):
  """The objective of `task` as `finetune` builds it: "glue", MNLI's classifier (a pair task of
  three labels); "squad", SQuAD's span head. Imports nothing that the GPU image lacks."""
  from bert_jax.tasks.classification import data as glue  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks.classification import objective as classification  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks.squad import objective as squad  # pylint: disable=g-import-not-at-top
  if task == "glue":
    return classification.SequenceClassification(glue.get_task("mnli"), length,
                                                 max_sequences_per_row)
  return squad.SquadSpans(length, max_sequences_per_row=max_sequences_per_row)


def compile_row(preset: str, task: str, kernels: str, target: str, bert_config=None,
                max_sequences_per_row: int | None = None) -> dict:
  """The fine-tuning step of `preset` (or of `bert_config`, named `preset`) on `task`'s shape
  with `kernels`, over packed rows with `max_sequences_per_row`, compiled for `target`: what it
  needs and moves, and the kernels it calls."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.model import configuration  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import gpu_targets, hlo_costs, sharding  # pylint: disable=g-import-not-at-top
  from bert_jax.runs import finetune_config, finetune_job  # pylint: disable=g-import-not-at-top
  from bert_jax.training import step as step_lib  # pylint: disable=g-import-not-at-top
  shape = TASKS[task]
  devices = gpu_targets.topology_devices(target)[:1]
  config = finetune_config.make(dtype="bfloat16", train_batch_size=shape["batch"],
                                **KERNELS[kernels])
  bert_config = finetune_job.compute_config(
      config, bert_config or configuration.get_preset(preset), shape["length"],
      devices[0].platform, gpu_targets.compute_capability(devices[0]))
  task_objective = objective(task, shape["length"], max_sequences_per_row)
  mesh, rules = sharding.mesh_from_config(config, devices)
  tx, schedule = finetune_job.make_optimizer(config, 1000, config.learning_rate,
                                             config.warmup_proportion,
                                             num_layers=bert_config.num_hidden_layers)
  start = time.perf_counter()
  lowered, _, _ = step_lib.lower_train_step(task_objective, task_objective.model(bert_config),
                                            tx, schedule, mesh, rules, shape["batch"])
  compiled = lowered.compile()
  seconds = time.perf_counter() - start
  module = hlo_costs.parse(compiled.as_text())
  chip = gpu_targets.parse(target).chip
  traffic = hlo_costs.traffic_by_kind(module)
  return {"preset": preset, "task": task, "kernels": kernels, "target": target,
          "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""),
          **shape, "attention_implementation": bert_config.attention_implementation,
          "layer_norm_implementation": bert_config.layer_norm_implementation,
          "compile_seconds": seconds,
          "hbm_gib": step_lib.device_bytes(compiled.memory_analysis()) / 2**30,
          "traffic": traffic, "custom_calls": hlo_costs.custom_calls(module),
          "other_ms": traffic["other"]["bytes"] / chip.hbm_bandwidth * 1e3}


def _key(row: dict) -> tuple:
  """What names a row: the step, the GPU, JAX's version and the compiler's flags."""
  return (row["preset"], row["task"], row["kernels"], row["target"], row["jax"],
          row.get("xla_flags", ""))


def render(rows: list[dict]) -> str:
  """The markdown table of `rows`."""
  lines = ["| step | kernels | jax | HBM GiB | kernels: matmul / attention / other | GB moved: "
           "matmul / attention / other | other kernels ≥ ms at peak bandwidth | custom calls |",
           "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    t = r["traffic"]
    count = " / ".join(str(int(t[k]["count"])) for k in ("matmul", "attention", "other"))
    moved = " / ".join(f"{t[k]['bytes'] / 1e9:.2f}" for k in ("matmul", "attention", "other"))
    calls = ", ".join(f"{k.split('$')[-1]} {v}" for k, v in sorted(r["custom_calls"].items()))
    lines.append(f"| {r['preset']} {r['task']} {r['batch']}×{r['length']} | {r['kernels']} "
                 f"(attention {r['attention_implementation']}, LayerNorm "
                 f"{r['layer_norm_implementation']}) | {r['jax']} | {r['hbm_gib']:.1f} | {count} | "
                 f"{moved} | {r['other_ms']:.2f} | {calls or '—'} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="JSON lines, appended as rows finish.")
  parser.add_argument("--target", default="h200", help="h100, h200 or a100.")
  parser.add_argument("--rows", default=DEFAULT_ROWS, help="preset:task, comma-separated.")
  parser.add_argument("--render", action="store_true", help="Only print the table of --out.")
  args = parser.parse_args()
  from bert_jax.parallel import gpu_targets  # pylint: disable=g-import-not-at-top
  done = []
  if os.path.exists(args.out):
    with open(args.out, encoding="utf-8") as f:
      done = [json.loads(line) for line in f if line.strip()]
  if args.render:
    print(render(done))
    return
  gpu_targets.find_plugin()  # before anything starts JAX
  import jax  # pylint: disable=g-import-not-at-top
  have = {_key(r) for r in done}
  for item in args.rows.split(","):
    preset, task = item.split(":")
    for kernels in KERNELS:
      head = {"preset": preset, "task": task, "kernels": kernels, "target": args.target,
              "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", "")}
      if _key(head) in have:
        continue
      print(f"compiling {preset} {task} {kernels} for {args.target} ...", flush=True)
      row = compile_row(preset, task, kernels, args.target)
      print(f"  {row['compile_seconds']:.0f} s", flush=True)
      with open(args.out, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
      done.append(row)
  print(render([r for r in done if r["target"] == args.target]))


if __name__ == "__main__":
  main()
