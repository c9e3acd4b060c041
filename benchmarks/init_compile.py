"""How long XLA's GPU compiler takes over the program that creates the train state, with its
random draws through JAX's threefry kernel (as `training.state.lower_initial_state` lowers
them) and lowered inline (JAX's default on GPUs): compiled for an H100 or H200 on this
machine, no GPU.

    python benchmarks/init_compile.py --rows=base,large --target=h200 \
        --out=benchmarks/results/gpu_init_compile.jsonl

Lowered inline, every parameter's draws become unrolled threefry hashing inside a few large
fusions, each compiled by one thread; through the kernel the program is a call per draw and
many small fusions. Each row is one compile (the step's model at the suite's shapes,
`gpu_compile_table.config_for`, stacked layers with the fused sites unless `--variant` and
`--layers` say otherwise), appended to `--out` as a JSON line when it finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "configs"))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))


def compile_init(preset: str, variant: str, layers: str, target: str) -> list[dict]:
  """Two rows for one model: the initial state's program compiled as built, then inline."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import gpu_compile_table  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import gpu_targets  # pylint: disable=g-import-not-at-top
  from bert_jax.runs import pretraining  # pylint: disable=g-import-not-at-top
  from bert_jax.training import state as state_lib  # pylint: disable=g-import-not-at-top
  config = gpu_compile_table.config_for(preset, variant, layers)
  run = pretraining.build(config, gpu_targets.topology_devices(target))
  example = run.objective.example_batch(config.global_batch_size)
  _, state_sh = state_lib.abstract_train_state(run.model, run.tx, run.mesh, run.rules, example,
                                               run.objective.input_names)
  rows = []
  for kernel in (True, False):
    start = time.perf_counter()
    lowered = state_lib.lower_initial_state(
        run.model, run.tx, run.mesh, run.rules, example, run.objective.input_names, state_sh,
        jax.ShapeDtypeStruct((), jnp.uint32), threefry_kernel=kernel)
    lower_s = time.perf_counter() - start
    start = time.perf_counter()
    text = lowered.compile().as_text()
    compile_s = time.perf_counter() - start
    rows.append(dict(preset=preset, variant=variant, layers=layers, target=target,
                     jax=jax.__version__, threefry_kernel=kernel, lower_s=round(lower_s, 1),
                     compile_s=round(compile_s, 1),
                     fusions=len(re.findall(r"\sfusion\(", text)),
                     kernel_calls=text.count("cu_threefry2x32_ffi")))
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", default="base,large", help="Presets, in order.")
  parser.add_argument("--variant", default="paper-cudnn-fusedln")
  parser.add_argument("--layers", default="stacked")
  parser.add_argument("--target", default="h100")
  parser.add_argument("--out", default=None, help="Also append the rows here (JSON lines).")
  args = parser.parse_args()
  from bert_jax.parallel import gpu_targets  # pylint: disable=g-import-not-at-top
  gpu_targets.find_plugin()
  for preset in args.rows.split(","):
    for row in compile_init(preset, args.variant, args.layers, args.target):
      print(json.dumps(row), flush=True)
      if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
          f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
