"""Distillation's claim, checked small: a student taught by a fine-tuned teacher keeps more of the
teacher's accuracy than the same student trained on the labels alone, and runs faster (Sanh et
al. 2019: DistilBERT keeps 97% of BERT-base's GLUE score and runs 60% faster).

    python benchmarks/distillation.py --workdir=/tmp/electra_vs_mlm --data_dir=data/rt_sst2

The same task, corpus, vocabulary and records as `benchmarks/electra_vs_mlm.py` (the same
`--workdir` reuses its stages: its masked-LM encoder is the teacher here).

  teacher   4 layers x 128 (2 heads), masked-LM pre-training, fine-tuned on the task (seed 1).
  student   2 layers x 128, masked-LM pre-trained on the same records for the same steps.
  student alone      fine-tuned on the labels only (seeds 1..3).
  student distilled  fine-tuned with the teacher in the same step (task-time distillation:
                     0.5 x T² x soft cross-entropy at T = 2 + 0.5 x the label loss; seeds 1..3).
Every fine-tuning run has the same settings. Speed: examples/s of the fine-tuned models'
forward pass over the dev set's features (batch 128, length 64), teacher and student measured
side by side in one process (best of 5 passes after a warm-up; nothing else running).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import electra_vs_mlm as evm  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_integer("pretrain_steps", 2178, "Pre-training steps of teacher and student (the "
                     "masked-LM steps of electra_vs_mlm.py's equal-compute run).")

STUDENT = {"objective": "mlm", "model.preset": "L-2_H-128_A-2", "model.hidden_size": 128,
           "model.num_hidden_layers": 2, "model.num_attention_heads": 2,
           "model.intermediate_size": 512}


def examples_per_second(setup: dict, checkpoint: str, repeats: int = 5, batch: int = 128
                        ) -> float:
  """Forward passes of the fine-tuned classifier over the dev features, examples/s."""
  # pylint: disable=g-import-not-at-top
  import jax
  from bert_jax import inference
  from bert_jax.interop import checkpoints
  from bert_jax.tasks.classification import data as glue
  from bert_jax.tasks.classification import objective as sequence_classification
  from bert_jax.text import tokenization
  # pylint: enable=g-import-not-at-top
  task = glue.get_task("SST-2")
  tokenizer = tokenization.load_tokenizer(vocab_file=setup["vocab"], do_lower_case=True)
  feats = sequence_classification.featurize(task, task.read_tsv(setup["data_dir"], "dev"),
                                            tokenizer, setup["seq"])
  loaded = checkpoints.load_any(checkpoint)
  objective = sequence_classification.SequenceClassification(task, setup["seq"], None)
  model = objective.model(loaded.config.replace(scan_layers=False))
  params = {k: v for k, v in checkpoints.in_layout(loaded.params, loaded.config, False).items()
            if k != "teacher"}
  predictor = inference.Predictor(model, objective.input_names)
  predictor(params, feats, batch, progress=False)  # compile
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(predictor(params, feats, batch, progress=False))
    best = min(best, time.perf_counter() - start)
  return len(feats["weight"]) / best


def main(argv):
  del argv
  setup = evm.prepare(os.path.abspath(FLAGS.workdir), os.path.abspath(FLAGS.data_dir))
  steps = FLAGS.pretrain_steps
  teacher_run, _ = evm.pretrain(setup, "mlm", evm.MODELS["mlm"], steps)
  student_run, _ = evm.pretrain(setup, "student", STUDENT, steps)
  teacher_accuracy = evm.finetune(setup, "mlm", teacher_run, 1)
  teacher_dir = os.path.join(setup["work"], "finetune_mlm_seed1")
  seeds = [int(s) for s in FLAGS.seeds]
  alone = [evm.finetune(setup, "student", student_run, s) for s in seeds]
  distilled = [evm.finetune(setup, "student_distilled", student_run, s,
                            teacher_checkpoint=teacher_dir, distill_temperature=2.0,
                            distill_alpha=0.5) for s in seeds]
  speed = {"teacher": examples_per_second(setup, teacher_dir),
           "student": examples_per_second(setup, os.path.join(setup["work"],
                                                              "finetune_student_seed1"))}
  results = dict(teacher=teacher_accuracy, alone=alone, distilled=distilled, speed=speed)
  with open(os.path.join(setup["work"], "distillation_results.json"), "w") as f:
    json.dump(results, f, indent=2)

  mean = statistics.mean
  print(f"\n### Task-time distillation into a 2-layer student "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores; dev "
        f"{setup['data_dir']}/dev.tsv)\n")
  print("| model | dev accuracy per seed | mean | of the teacher's | examples/s |")
  print("|---|---|---:|---:|---:|")
  print(f"| teacher (4 x 128) | {teacher_accuracy:.4f} | {teacher_accuracy:.4f} | 100% | "
        f"{speed['teacher']:,.0f} |")
  for label, accs in (("student alone (2 x 128)", alone),
                      ("student distilled (2 x 128)", distilled)):
    print(f"| {label} | {', '.join(f'{a:.4f}' for a in accs)} | {mean(accs):.4f} | "
          f"{100 * mean(accs) / teacher_accuracy:.1f}% | {speed['student']:,.0f} |")
  wins = sum(d > a for d, a in zip(distilled, alone))
  print(f"\ndistilled - alone: {100 * (mean(distilled) - mean(alone)):+.2f} points (mean over "
        f"{len(seeds)} seeds; distilled ahead on {wins} of {len(seeds)}); student "
        f"{speed['student'] / speed['teacher']:.2f}x the teacher's examples/s.")


if __name__ == "__main__":
  app.run(main)
