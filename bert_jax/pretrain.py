"""Pre-training entry point: the config's objective (MLM + NSP by default) on TFRecords,
sharded over a device mesh.

    python -m bert_jax.pretrain --config=configs/pretrain.py:base --workdir=gs://BUCKET/run \
        --config.data.train_files='gs://BUCKET/data/train-*.tfrecord'

The run resumes by itself: if `workdir` holds a checkpoint, training continues from it (state,
RNG and data position), so a preempted job is simply started again with the same command.
Otherwise it starts from `config.init_checkpoint` (a previous phase; or, with
`init_mode="params"`, the weights of Google's TF1 release `.../bert_model.ckpt` or a Hugging Face
directory) or from scratch.

Before renting a slice, `--compile_for=v4-32` compiles the same step for that slice's real
topology on this machine and says whether it fits, what it communicates and how fast it could
run (`runs/compile_check.py`); `--compile_for=h100` (h200, a100, h100x8, ...) does the same for
NVIDIA GPUs, with the HBM traffic of the GPU program's kernels by kind. This module only parses flags; the run is
`bert_jax.runs.pretraining.train_and_evaluate(config, workdir)`.
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from bert_jax import cli
from bert_jax.runs import pretraining
from bert_jax.training import metrics

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Command-line flags, defined only when run as a program (importers get none)."""
  config_flags.DEFINE_config_file("config", None, "Pre-training config file.", lock_config=True)
  flags.DEFINE_string("workdir", None, "Checkpoints, TensorBoard logs, metrics.jsonl.")
  cli.define_distributed_flags()
  flags.DEFINE_bool("compile_only", False,
                    "Compile the train step for the config's mesh, print its per-device memory "
                    "and FLOPs, and exit (no data needed): checks a config fits before a run.")
  flags.DEFINE_list("compile_for", [],
                    "TPU slices such as v4-32, v5p-64, v5litepod-16, v6e-64 (or a topology "
                    "such as v4:4x4x12), or GPU machines such as h100, h200, a100, h100x8: "
                    "compile the exact train step for each on this machine (needs libtpu or "
                    "JAX's CUDA plugin, no TPU or GPU), print per-chip HBM against the chip's, "
                    "FLOPs, collectives, the kernels' HBM traffic and a roofline of step time, "
                    "MFU, days and cost to train; exit 1 if it does not fit. No data or "
                    "workdir needed.")
  flags.DEFINE_integer("start_step", 0,
                       "With --compile_for: the step the run starts from, for the time to "
                       "train (a phase 2 continuing phase 1: phase 1's last step).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if FLAGS.config is None:
    raise app.UsageError("--config is required.")
  if FLAGS.compile_for:
    cli.prepare_process()
    from bert_jax.runs import compile_check  # pylint: disable=g-import-not-at-top
    compile_check.check_slices(FLAGS.config, FLAGS.compile_for,
                               config_flags.get_config_filename(FLAGS["config"]),
                               steps=int(FLAGS.config.train_until_step) - FLAGS.start_step)
    return
  if FLAGS.workdir is None:
    raise app.UsageError("--workdir is required.")
  cli.prepare_process()
  cli.initialize_distributed_from_flags()
  if FLAGS.compile_only:
    out = pretraining.compile_train_step(FLAGS.config)
    gib = out.get("bytes_per_device", float("nan")) / 2**30
    metrics.log(f"mesh {out['mesh']}: {out['num_parameters'] / 1e6:.1f}M parameters "
                f"(vocabulary {out['vocab_size']:,}), "
                f"{gib:.2f} GiB per device, {out['compiled_flops_per_device'] / 1e12:.2f} "
                f"TFLOP per device per step (analytic total "
                f"{out['analytic_flops_per_step'] / 1e12:.2f} TFLOP)")
    return
  pretraining.train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  define_flags()
  app.run(cli.one_line_errors(main), flags_parser=cli.parse_flags)
