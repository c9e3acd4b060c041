"""The GPU suite's variants of the pre-training step compiled for an H100 on this machine (XLA's
GPU compiler, no GPU): memory, kernels, and the HBM bytes each kind of kernel moves per step.
What the GPU run (`gpu_suite.sh`) will time, read from the program before any GPU time is spent.

    python benchmarks/gpu_compile_table.py --out=benchmarks/results/gpu_compile.jsonl
    python benchmarks/gpu_compile_table.py --out=benchmarks/results/gpu_compile.jsonl --render

The step is the production one (`configs/pretrain.py:base` / `large` on one GPU, data parallel
mesh), at the suite's shapes (`accelerator_step.SHAPES`: base 256 x 128, large 64 x 512) with
each variant's model settings (`accelerator_step.VARIANTS`). Per row: the HBM a GPU would need
against what JAX preallocates (75% of 80 GB), the kernels per step by kind, the bytes each kind
moves, the time the elementwise and reduction kernels need at least at peak bandwidth, and how
many kernels touch each LayerNorm site (`accelerator_step.hlo_summary`); rows also keep the
kernels and bytes by part of the step (`--render_parts`: LayerNorm sites, dropout, attention,
projections, feed-forward, heads, embeddings, forward and backward, and the optimizer). GEMM
kernels are the compiler's defaults (no autotuning without a GPU), so matmul bytes are
indicative; the other kernels are the program's own. Each compile appends a JSON line as it
finishes; rows already in the file (same step, GPU and XLA_FLAGS) are skipped. `--target=h200`
compiles for an H200, whose figures (bandwidth above all) change some of the compiler's fusion
decisions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "configs"))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

ROWS = [("base", v) for v in ("paper", "paper-cudnn", "fast-cudnn", "paper-cudnn-f32res",
                              "paper-cudnn-bits32", "paper-cudnn-fp8")] + \
       [("large", v) for v in ("paper", "paper-cudnn", "fast-cudnn", "paper-cudnn-fp8")]
LARGE_BATCH = 64  # the suite's large/512 batch


def config_for(preset: str, variant: str, layers: str = "unrolled"):
  import accelerator_step  # pylint: disable=g-import-not-at-top
  import pretrain as pretrain_configs  # pylint: disable=g-import-not-at-top
  shape = accelerator_step.SHAPES[preset]
  config = pretrain_configs.get_config(preset)
  config.mesh_shape = (-1, 1, 1)
  config.global_batch_size = LARGE_BATCH if preset == "large" else shape["batch"]
  config.data.max_seq_length = shape["length"]
  config.data.max_predictions_per_seq = shape["predictions"]
  config.model.dtype = "bfloat16"
  for key, value in {**accelerator_step.LAYOUTS[layers],
                     **accelerator_step.VARIANTS[variant]}.items():
    if value is not None:
      config.model[key] = value
  return config


def row_head(preset: str, variant: str, target: str, layers: str = "unrolled") -> dict:
  """What names a row: the step (its layers' layout, `accelerator_step.LAYOUTS`), its shape,
  the GPU, the compiler's flags (XLA_FLAGS, which change the program: Triton or cuBLAS GEMMs,
  passes turned off) and JAX's version (XLA's); with the CUDA runtime the GPU's description
  names (`gpu_targets.cuda_runtime`, which decides FP8's GEMMs)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import gpu_targets  # pylint: disable=g-import-not-at-top
  config = config_for(preset, variant, layers)
  runtime = gpu_targets.cuda_runtime()
  return {"preset": preset, "variant": variant, "layers": layers, "target": target,
          "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax": jax.__version__,
          "cuda_runtime": ".".join(map(str, runtime)) if runtime else None,
          "batch": int(config.global_batch_size), "length": int(config.data.max_seq_length)}


def _key(row: dict) -> tuple:
  return (row["preset"], row["variant"], row.get("layers", "unrolled"), row["target"],
          row.get("xla_flags", ""))


def _step_name(row: dict) -> str:
  """The variant, with its layers' layout where they are not unrolled."""
  layers = row.get("layers", "unrolled")
  return row["variant"] + ("" if layers == "unrolled" else f" ({layers} layers)")


def compile_row(row: dict) -> dict:
  """The step `row_head` named, compiled: `row` with what the compile found."""
  import accelerator_step  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import hlo_costs  # pylint: disable=g-import-not-at-top
  from bert_jax.runs import compile_check  # pylint: disable=g-import-not-at-top
  from bert_jax.runs import pretraining  # pylint: disable=g-import-not-at-top
  preset, variant, target = row["preset"], row["variant"], row["target"]
  config = config_for(preset, variant, row["layers"])
  start = time.perf_counter()
  try:
    report = compile_check.check(config, target, config_name=f"{preset} {variant}")
  except compile_check.DoesNotFit as e:
    return dict(row, fits=False, refused=str(e), seconds=time.perf_counter() - start)
  rows = {row["batch"] * row["length"], row["batch"] * int(config.data.max_predictions_per_seq)}
  hidden = pretraining.bert_config_from(config).hidden_size
  hlo = accelerator_step.hlo_summary(report.hlo_text, hidden, rows)
  per_site = sorted(hlo["ln_per_site"].values())
  return dict(row, fits=True, parts=report.parts, seconds=time.perf_counter() - start,
              hbm_gib=report.hbm_bytes / 2**30,
              traffic=report.traffic, other_ms=report.other_seconds * 1e3,
              matmul_ms=report.compute_seconds * 1e3, custom_calls=report.custom_calls,
              kernels=hlo["kernels"], ln_sites=len(per_site),
              ln_kernels_per_site=statistics.median(per_site) if per_site else None,
              ln_reduce_per_site=hlo["ln_reduce_kernels"] / max(len(per_site), 1),
              operand_types=hlo_costs.matmul_operand_types(hlo_costs.parse(report.hlo_text)))


def _float32_gemms(row: dict) -> str:
  """How many of a row's GEMMs read a float32 operand ("not counted" for rows compiled before
  the count was kept)."""
  from bert_jax.parallel import hlo_costs  # pylint: disable=g-import-not-at-top
  types = row.get("operand_types")
  return "not counted" if types is None else str(hlo_costs.float32_matmuls(types))


def render(rows: list[dict]) -> str:
  """The markdown table; its header gives the figures of the rows' GPU (usable memory, peak
  bandwidth and bf16 FLOP/s), which the "at least" columns divide by."""
  from bert_jax.parallel import gpu_targets  # pylint: disable=g-import-not-at-top
  chip = gpu_targets.parse(rows[0]["target"] if rows else "h100").chip
  lines = [
      f"| step | HBM GiB (of {chip.usable_hbm_per_device / 2**30:.1f}) | kernels: matmul / "
      "attention / other | GB moved: matmul / attention / other | other kernels ≥ ms at "
      f"{chip.hbm_bandwidth / 1e12:.2f} TB/s | matmuls ≥ ms at {chip.peak_flops / 1e12:.0f} "
      "TFLOP/s | kernels per LayerNorm site (reduces) | GEMMs on float32 operands |",
      "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    name = f"{r['preset']} {r['batch']}×{r['length']} {_step_name(r)}"
    if r.get("xla_flags"):
      name += f" `{r['xla_flags']}`"
    if not r.get("fits"):
      lines.append(f"| {name} | does not fit: {r.get('refused', r.get('error', ''))[:160]} "
                   "| | | | | | |")
      continue
    t = r["traffic"]
    count = " / ".join(str(int(t[k]["count"])) for k in ("matmul", "attention", "other"))
    moved = " / ".join(f"{t[k]['bytes'] / 1e9:.1f}" for k in ("matmul", "attention", "other"))
    lines.append(f"| {name} | {r['hbm_gib']:.1f} | {count} | {moved} | {r['other_ms']:.1f} | "
                 f"{r['matmul_ms']:.1f} | {r['ln_kernels_per_site']:g} "
                 f"({r['ln_reduce_per_site']:.1f}) | {_float32_gemms(r)} |")
  return "\n".join(lines)


def render_parts(rows: list[dict]) -> str:
  """Kernels and HBM bytes per step by part of the step (`hlo_costs.model_part`), one column
  per row that has them, parts in the first such row's order (most bytes first)."""
  rows = [r for r in rows if r.get("parts")]
  if not rows:
    return "(no row has parts)"
  names = []
  for r in rows:
    name = f"{r['preset']} {_step_name(r)}"
    names.append(name + (f" `{r['xla_flags']}`" if r.get("xla_flags") else ""))
  order = list(rows[0]["parts"]) + sorted({p for r in rows for p in r["parts"]}
                                          - set(rows[0]["parts"]))
  lines = ["| part (kernels, GB per step) | " + " | ".join(names) + " |",
           "|---|" + "---|" * len(rows)]
  for part in order:
    cells = []
    for r in rows:
      found = r["parts"].get(part)
      cells.append(f"{int(found['count'])}, {found['bytes'] / 1e9:.2f}" if found else "")
    lines.append(f"| {part} | " + " | ".join(cells) + " |")
  totals = [f"{int(sum(p['count'] for p in r['parts'].values()))}, "
            f"{sum(p['bytes'] for p in r['parts'].values()) / 1e9:.2f}" for r in rows]
  lines.append("| all | " + " | ".join(totals) + " |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="JSON lines, appended as rows finish.")
  parser.add_argument("--target", default="h100")
  parser.add_argument("--rows", default="", help="preset:variant[:layers],... (layers: "
                      "accelerator_step.LAYOUTS, default unrolled; default rows: all)")
  parser.add_argument("--render", action="store_true", help="Print the markdown table only.")
  parser.add_argument("--render_parts", action="store_true",
                      help="Print the kernels and bytes by part of the step only.")
  args = parser.parse_args()
  done = []
  if os.path.exists(args.out):
    with open(args.out, encoding="utf-8") as f:
      done = [json.loads(line) for line in f if line.strip()]
  if args.render or args.render_parts:
    print(render_parts(done) if args.render_parts else render(done))
    return
  from bert_jax.parallel import gpu_targets  # pylint: disable=g-import-not-at-top
  gpu_targets.find_plugin()
  wanted = [tuple(r.split(":")) for r in args.rows.split(",") if r] or ROWS
  have = {_key(r) for r in done}
  for i, (preset, variant, *layout) in enumerate(wanted):
    layers = layout[0] if layout else "unrolled"
    head = row_head(preset, variant, args.target, layers)
    if _key(head) in have:
      continue
    print(f"[{i + 1}/{len(wanted)}] compiling {preset} {_step_name(head)} for {args.target}...",
          flush=True)
    try:
      row = compile_row(head)
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      row = dict(head, fits=False,
                 error=f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")
    with open(args.out, "a", encoding="utf-8") as f:
      f.write(json.dumps(row) + "\n")
    print(render([row]).splitlines()[-1], flush=True)
  with open(args.out, encoding="utf-8") as f:
    print(render([json.loads(line) for line in f if line.strip()]))


if __name__ == "__main__":
  main()
