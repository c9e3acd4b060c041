"""Every pre-training recipe compiled for real TPU topologies on this machine (libtpu, no chip):
per-device HBM, the largest batch that fits, collectives, and the roofline projection of step
time, MFU, days and cost to train. The table in benchmarks/RESULTS.md comes from here.

    python benchmarks/tpu_compile_table.py --out=benchmarks/results/tpu_compile.jsonl
    python benchmarks/tpu_compile_table.py --out=benchmarks/results/tpu_compile.jsonl --render

Each compile appends one JSON line as it finishes, so a run that is stopped resumes where it
was (finished rows are skipped). The first pass compiles each recipe for its paper pod (BERT:
16 chips for base, 64 for large, on v3, which the paper does not name) and v4-32, and the
notebooks' models on Colab's TPUs, then the rest of today's slices. Every recipe runs data parallel over the whole slice (`mesh_shape=-1,1,1`)
at its own global batch; a step that does not fit is compiled again with the gradient
accumulation the refusal names (the same step in micro-batches), and both rows are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "configs"))

PRETRAIN = ["base", "base_phase2", "large", "large_phase2", "roberta_base", "albert_base",
            "albert_large", "spanbert_base", "electra_small", "electra_base", "electra_large",
            "distilbert"]
PAPER_POD = {"base": "v3-32", "base_phase2": "v3-32", "large": "v3-128",
             "large_phase2": "v3-128"}
TODAY = ["v4-32", "v5p-64", "v5litepod-16", "v6e-64"]
# The notebooks' models on Colab's TPUs: inspect_pretraining's demo config, and the fine-tuning
# notebook's default model (all-MiniLM-L6-v2's shape) compiled as a pre-training step at the
# notebook's batch 32 x 128, which bounds the fine-tuning step's memory from above.
COLAB = {"demo": ["v2-8", "v5litepod-1"], "notebook_minilm": ["v2-8", "v5litepod-1"]}


def jobs(recipes: list[str], slices: list[str] | None) -> list[tuple[str, str]]:
  first, rest = [], []
  for recipe in recipes:
    targets = slices or ([PAPER_POD[recipe]] if recipe in PAPER_POD else []) + TODAY
    first += [(recipe, t) for t in targets[:2]]
    rest += [(recipe, t) for t in targets[2:]]
  if not slices:  # small and quick: with the first pass
    first += [(r, t) for r, ts in COLAB.items() if r in recipes for t in ts]
  return first + rest


def recipe_config(recipe: str):
  import pretrain as pretrain_configs  # pylint: disable=g-import-not-at-top
  import distill as distill_configs  # pylint: disable=g-import-not-at-top
  if recipe == "distilbert":
    config = distill_configs.get_config("distilbert")
    config.distillation.teacher_preset = "base"  # DistilBERT's teacher: BERT-base
    name = "configs/distill.py:distilbert"
  elif recipe == "notebook_minilm":
    config = pretrain_configs.get_config("tiny")
    config.model.update(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, dtype="bfloat16")
    config.global_batch_size = 32
    name = "MiniLM-L6-H384 (finetune_glue_tpu.ipynb), as a pre-training step"
  else:
    config = pretrain_configs.get_config(recipe)
    name = f"configs/pretrain.py:{recipe}"
  # Phase 2 continues phase 1: it trains from phase 1's last step to the end of the schedule.
  start = pretrain_configs.get_config(recipe[:-len("_phase2")]).train_until_step \
      if recipe.endswith("_phase2") else 0
  config.mesh_shape = (-1, 1, 1)
  from bert_jax.runs import pretraining  # pylint: disable=g-import-not-at-top
  config = pretraining.resolve_record_shapes(config)  # no records: the recipe's own shapes
  return config, name, int(config.train_until_step) - start


def run_one(recipe: str, accelerator: str, accum: int | None = None) -> dict:
  from bert_jax.runs import compile_check  # pylint: disable=g-import-not-at-top
  config, name, steps = recipe_config(recipe)
  if accum:
    config.grad_accum_steps = accum
  row = {"recipe": recipe, "config": name, "slice": accelerator,
         "global_batch": int(config.global_batch_size), "seq_length":
         int(config.data.max_seq_length), "grad_accum_steps": int(config.grad_accum_steps),
         "attention": config.model.get("attention_implementation") or "default"}
  start = time.perf_counter()
  try:
    report = compile_check.check(config, accelerator, config_name=name, steps=steps)
    row.update(report.as_dict(), status="fits")
    row["lines"] = report.lines()
  except compile_check.DoesNotFit as e:
    row.update(status="does not fit", error=str(e))
    row["suggested_accum"] = _suggested_accum(str(e))
  except Exception as e:  # pylint: disable=broad-except
    row.update(status="error", error=f"{type(e).__name__}: {e}"[:2000],
               traceback=traceback.format_exc()[-3000:])
  row["wall_seconds"] = time.perf_counter() - start
  return row


def _suggested_accum(message: str) -> int | None:
  import re  # pylint: disable=g-import-not-at-top
  found = re.search(r"--config\.grad_accum_steps=(\d+)", message)
  return int(found.group(1)) if found else None


def done_keys(path: str) -> set[tuple[str, str, int]]:
  keys = set()
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        if line.strip():
          row = json.loads(line)
          keys.add((row["recipe"], row["slice"], row["grad_accum_steps"]))
  return keys


def compile_all(path: str, recipes: list[str], slices: list[str] | None) -> None:
  todo = jobs(recipes, slices)
  done = done_keys(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  start = time.time()
  for i, (recipe, accelerator) in enumerate(todo):
    accum = 1
    while True:
      if (recipe, accelerator, accum) in done:
        row = _find(path, recipe, accelerator, accum)
      else:
        row = run_one(recipe, accelerator, accum if accum > 1 else None)
        with open(path, "a") as f:
          f.write(json.dumps(row) + "\n")
        elapsed = time.time() - start
        print(f"[{i + 1}/{len(todo)}] {recipe} on {accelerator} (accum {accum}): "
              f"{row['status']} in {row['wall_seconds']:.0f} s; {elapsed / 60:.0f} min so far",
              flush=True)
      nxt = row.get("suggested_accum")
      if row["status"] != "does not fit" or not nxt or nxt <= accum:
        break
      accum = nxt


def _find(path: str, recipe: str, accelerator: str, accum: int) -> dict:
  with open(path) as f:
    for line in f:
      row = json.loads(line)
      if (row["recipe"], row["slice"], row["grad_accum_steps"]) == (recipe, accelerator, accum):
        return row
  raise KeyError((recipe, accelerator, accum))


def bounds(row: dict) -> dict:
  """The row's compute and interconnect times from its stored counts and the chip's figures:
  step >= compute + collectives (no HBM term, whose estimate overstates scanned steps), MFU,
  days and cost at that step time."""
  from bert_jax.parallel import tpu_slices  # pylint: disable=g-import-not-at-top
  s = tpu_slices.parse(row["slice"])
  chip = s.chip
  flops = max(row["matmul_flops"], row["analytic_flops"] / s.devices)
  compute = flops / (chip.peak_flops / chip.devices_per_chip)
  wire = sum(c["wire_bytes"] for c in row["collectives"].values())
  ici = wire / (chip.ici_bandwidth / 2 / chip.devices_per_chip)
  step = compute + ici
  days = row["steps"] * step / 86400
  return {"compute_ms": compute * 1e3, "ici_ms": ici * 1e3, "step_ms": step * 1e3,
          "mfu": row["analytic_flops"] / (s.chips * chip.peak_flops * step),
          "hbm_gb": row["hbm_traffic"] / 1e9, "days": days,
          "cost": days * 24 * s.chips * chip.price}


def render(path: str) -> str:
  rows = [json.loads(l) for l in open(path) if l.strip()]
  out = ["| recipe | slice (chips) | batch x length, accum | compiles | HBM per device (of usable) "
         "| largest batch per device | collectives per step | compute + ICI per step (ms) "
         "| MFU <= | days >= | cost >= | HBM traffic estimate per device |",
         "|" + "---|" * 12]
  for row in rows:
    chips = row.get("chips", "")
    batch = f"{row['global_batch']} x {row['seq_length']}" + (
        f", accum {row['grad_accum_steps']}" if row["grad_accum_steps"] > 1 else "")
    if row["status"] != "fits":
      short = row.get("error", "").split(" (state and")[0].split(", which has")[0][:110]
      out.append(f"| {row['recipe']} | {row['slice']} | {batch} | {row['status']}: {short} "
                 "| | | | | | | | |")
      continue
    gib = 2**30
    b = bounds(row)
    coll = "; ".join(f"{k} x{int(v['count'])} {v['bytes'] / 2**20:.0f} MiB"
                     for k, v in sorted(row["collectives"].items())) or "none"
    out.append(
        f"| {row['recipe']} | {row['slice']} ({chips}) | {batch} | yes, "
        f"{row['compile_seconds']:.0f} s | {row['hbm_bytes'] / gib:.1f} of "
        f"{row['hbm_capacity'] / gib:.1f} GiB | ~{row['largest_batch_per_device']} "
        f"(now {row['batch_per_device'] // row['grad_accum_steps']}) | {coll} "
        f"| {b['compute_ms']:.1f} + {b['ici_ms']:.1f} | {b['mfu']:.0%} | {b['days']:.2f} "
        f"| ${b['cost']:,.0f} | {b['hbm_gb']:.1f} GB |")
  return "\n".join(out)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results",
                                                    "tpu_compile.jsonl"))
  parser.add_argument("--recipes", default=",".join(PRETRAIN + list(COLAB)))
  parser.add_argument("--slices", default="", help="comma-separated; default: paper pod + today's")
  parser.add_argument("--render", action="store_true", help="print the markdown table and exit")
  args = parser.parse_args()
  if args.render:
    print(render(args.out))
    return
  recipes = [r for r in args.recipes.split(",") if r]
  slices = [s for s in args.slices.split(",") if s] or None
  compile_all(args.out, recipes, slices)
  print(render(args.out))


if __name__ == "__main__":
  main()
