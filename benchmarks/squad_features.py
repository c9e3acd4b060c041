r"""Benchmark: SQuAD features and post-processing against the original `run_squad.py`.

Both sides take the same SQuAD-format file (real passages from the Shakespeare corpus,
`data_prep/demo_squad.py`), the same vocabulary (the uncased BERT vocab.txt of the packaged
MiniLM) and the paper's settings (max_seq_length 384, doc_stride 128, max_query_length 64,
n_best_size 20, max_answer_length 30), and run in this one process, interleaved, `--repeats`
times; the medians of CPU time are compared:

- training features: the original `read_squad_examples` + `convert_examples_to_features`
  (its `FullTokenizer`) vs `squad.read_squad_json` + `squad.convert_examples_to_features`;
- prediction: `write_predictions` (n-best, null score, `get_final_text`, the three files) vs
  `squad.postprocess` + `squad.write_prediction_files`, on the same random logits.

The outputs are compared before any time is reported (window ids and answer positions equal,
predictions equal up to whitespace). The original is `run_squad.py` of PyPI
`bert-tensorflow==1.0.4` (installed by `make env`); its TF1 model code is not needed and is
replaced by empty modules before the import.

    python benchmarks/squad_features.py [--num_contexts=1000] [--repeats=3] [--version_2]

With --version_2 every third question is made unanswerable (SQuAD 2.0 layout).

Prints a Markdown table for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # pylint: disable=g-import-not-at-top

from bert_jax.text import tokenization  # pylint: disable=g-import-not-at-top
from bert_jax.tasks.squad import data as squad  # pylint: disable=g-import-not-at-top
from data_prep import demo_squad  # pylint: disable=g-import-not-at-top

SETTINGS = {"max_seq_length": 384, "doc_stride": 128, "max_query_length": 64}


def load_original():
  import bert  # pylint: disable=g-import-not-at-top,unused-import
  for name in ("modeling", "optimization"):
    sys.modules[f"bert.{name}"] = types.ModuleType(f"bert.{name}")
  from bert import run_squad, tokenization as original_tokenization  # pylint: disable=g-import-not-at-top
  return run_squad, original_tokenization


def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or platform.machine()


def cpu_timed(fn):
  start_cpu, start_wall = time.process_time(), time.perf_counter()
  out = fn()
  return out, time.process_time() - start_cpu, time.perf_counter() - start_wall


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--num_contexts", type=int, default=1000)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--version_2", action="store_true")
  args = parser.parse_args()

  from tests import helpers  # pylint: disable=g-import-not-at-top  (where the MiniLM lives)
  vocab = os.path.join(helpers.minilm_dir(), "vocab.txt")
  work = tempfile.mkdtemp(prefix="squad_bench_")
  data_file = os.path.join(work, "train.json")
  data = demo_squad.shakespeare_squad(args.num_contexts)
  if args.version_2:  # SQuAD 2.0: every third question loses its answer
    questions = [qa for p in data["data"][0]["paragraphs"] for qa in p["qas"]]
    for i, qa in enumerate(questions):
      qa["is_impossible"] = i % 3 == 0
      if qa["is_impossible"]:
        qa["answers"] = []
  with open(data_file, "w", encoding="utf-8") as f:
    json.dump(data, f)
  run_squad, original_tokenization = load_original()
  run_squad.FLAGS(["run_squad", f"--version_2_with_negative={args.version_2}"])
  original_tokenizer = original_tokenization.FullTokenizer(vocab, do_lower_case=True)
  tokenizer = tokenization.load_tokenizer(vocab_file=vocab, do_lower_case=True)

  def original_features():
    examples = run_squad.read_squad_examples(data_file, is_training=True)
    features = []
    run_squad.convert_examples_to_features(examples, original_tokenizer,
                                           is_training=True, output_fn=features.append,
                                           **SETTINGS)
    return examples, features

  def our_features():
    examples = squad.read_squad_json(data_file)
    return examples, squad.convert_examples_to_features(examples, tokenizer, is_training=True,
                                                        progress=False, **SETTINGS)

  times = {"original features": [], "ours features": [], "original predictions": [],
           "ours predictions": []}
  for _ in range(args.repeats):
    (orig_examples, orig_features), cpu, _ = cpu_timed(original_features)
    times["original features"].append(cpu)
    (examples, features), cpu, _ = cpu_timed(our_features)
    times["ours features"].append(cpu)
  # Same windows, same targets, before any time counts.
  assert len(orig_features) == len(features.example_index), (len(orig_features),
                                                              len(features.example_index))
  for f, theirs in enumerate(orig_features):
    assert features.arrays["input_ids"][f].tolist() == theirs.input_ids, f
    assert int(features.arrays["start_positions"][f]) == theirs.start_position, f
    assert int(features.arrays["end_positions"][f]) == theirs.end_position, f

  rng = np.random.default_rng(0)
  shape = features.arrays["input_ids"].shape
  # Random scores, low on padding as a trained model's are (the original's write_predictions
  # fails on a question whose best candidates are all padding).
  padding = features.arrays["input_mask"] == 0
  start_logits = np.where(padding, -10.0, rng.normal(size=shape)).astype(np.float32)
  end_logits = np.where(padding, -10.0, rng.normal(size=shape)).astype(np.float32)
  results = [run_squad.RawResult(unique_id=f.unique_id, start_logits=start_logits[i].tolist(),
                                 end_logits=end_logits[i].tolist())
             for i, f in enumerate(orig_features)]
  eval_features = squad.convert_examples_to_features(examples, tokenizer, progress=False,
                                                     **SETTINGS)
  orig_dir, our_dir = os.path.join(work, "original"), os.path.join(work, "ours")
  os.makedirs(orig_dir)
  os.makedirs(our_dir)

  def original_predictions():
    run_squad.write_predictions(orig_examples, orig_features, results, 20, 30, True,
                                f"{orig_dir}/predictions.json", f"{orig_dir}/nbest.json",
                                f"{orig_dir}/null_odds.json")

  def our_predictions():
    out = squad.postprocess(examples, eval_features, start_logits, end_logits,
                            version_2_with_negative=args.version_2)
    squad.write_prediction_files(our_dir, out[0], out[1], out[2] if args.version_2 else None)
    return out[0]

  for _ in range(args.repeats):
    times["original predictions"].append(cpu_timed(original_predictions)[1])
    ours, cpu, _ = cpu_timed(our_predictions)
    times["ours predictions"].append(cpu)
  theirs = json.load(open(f"{orig_dir}/predictions.json"))
  norm = lambda text: " ".join(text.split())  # noqa: E731
  assert {k: norm(v) for k, v in ours.items()} == {k: norm(v) for k, v in theirs.items()}

  med = {k: statistics.median(v) for k, v in times.items()}
  print(f"Command: `python benchmarks/squad_features.py --num_contexts={args.num_contexts} "
        f"--repeats={args.repeats}{' --version_2' if args.version_2 else ''}`")
  print(f"Machine: {cpu_model()}, {os.cpu_count()} cores, no accelerator, Python "
        f"{platform.python_version()}. Date: {datetime.date.today()}.")
  print(f"Data: {len(examples):,} questions on {args.num_contexts:,} passages, "
        f"{len(orig_features):,} windows of {SETTINGS['max_seq_length']}; outputs checked equal "
        "(window ids and answer positions; predictions up to whitespace).\n")
  print("| median CPU seconds | original run_squad.py | bert_jax | original / bert_jax |")
  print("|---|---|---|---|")
  for what in ("features", "predictions"):
    o, b = med[f"original {what}"], med[f"ours {what}"]
    print(f"| {what} | {o:.2f} | {b:.2f} | {o / b:.1f}× |")


if __name__ == "__main__":
  main()
