r"""Which of four sentences comes next: a task from any corpus, in SWAG's CSV layout.

SWAG (Zellers et al. 2018) cannot be downloaded where this project has to prove that
multiple-choice fine-tuning learns, so this module writes a task of the same shape from a corpus
in BERT's pre-training format (one sentence per line, a blank line between documents), such as
the Shakespeare corpus of `data_prep/demo_corpus.py`. For each pair of consecutive sentences of a
document, the first is the context and the second the right ending; three distractors are other
sentences of the SAME document (same speakers, same names, same subject: a model cannot win by
spotting the topic, it has to read the order of the dialogue), drawn with a seeded generator.
Only where a document is too short for that do distractors come from other documents of the same
split, and the summary counts those examples. The right ending sits at a seeded random position.

The files read like rowanz/swagaf `data/`: `train.csv`, `val.csv`, `test.csv` with the header
`,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label`
(the first, unnamed column is the row index the official files were written with), where
video-id names the document, fold-ind is the index of the context sentence in it, startphrase is
sent1 (`sent1 + " " + sent2` without the trailing space), gold-source is "gold", and test.csv
leaves `label` empty as the official test file does; `test_labels.csv` is the same test set
with its labels, for scoring. The split goes by document (a seeded shuffle, 80/10/10 by
default): no document gives examples to two files, and distractors never cross a split.

`sent2` is left empty and every ending is a whole sentence. SWAG's `sent2` is the start of the
next sentence ("The man"), shared by all endings; here that would be the first words of the
RIGHT sentence, and the distractors (other whole sentences) would have to lose their own first
words to follow it, so a model could win by grammar alone (which remainder reads on from "And
then"?) without understanding the dialogue. With whole sentences all four endings are equally
well-formed and only their fit to the context tells them apart. Sentence A is the context and
sentence B an ending, as for SWAG with an empty `sent2`. The task has no clean ceiling: a
distractor can be the sentence before the context or the one after the right ending, and in a
dialogue those often read on plausibly too.

Degenerate pairs are left out (and counted): a context or ending of fewer than `min_words` or
more than `max_words` words, a line without lower-case letters (a speaker's name, a heading),
or one holding markup characters (`_`, `*`: stage directions that leaked into the text). Endings
are distinct from each other and from the context after lower-casing and collapsing spaces.

Baselines, on val and test (written into summary.json): a seeded random choice (expected 25%),
the longest ending (in words), and the ending that shares the most lower-cased words with the
context (ties to the lowest index).

    python -m data_prep.demo_corpus --output_file=data/shakespeare.txt
    python -m data_prep.next_sentence_choice --input_file=data/shakespeare.txt \
        --output_dir=data/next_sentence_swag
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import random
import re
import sys
from typing import Sequence

if __package__ in (None, ""):  # run as a script: make `bert_jax` / `data_prep` importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # pylint: disable=g-import-not-at-top

from bert_jax.file_io import write_text_atomic  # pylint: disable=g-import-not-at-top

HEADER = ("", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
          "ending0", "ending1", "ending2", "ending3", "label")
NUM_ENDINGS = 4
SPLIT_FILES = {"train": "train.csv", "val": "val.csv", "test": "test.csv"}
TEST_LABELS_FILE = "test_labels.csv"
_MARKUP = re.compile(r"[_*]")
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


@dataclasses.dataclass(frozen=True)
class ChoiceExample:
  video_id: str  # the document
  fold_ind: int  # the index of the context sentence in the document
  context: str
  endings: tuple[str, ...]
  label: int | None
  distractors_from_other_documents: bool = False


def read_corpus(path: str) -> list[list[str]]:
  """Documents (lists of sentences) of a file in BERT's pre-training format."""
  with open(path, "rb") as f:
    data = f.read()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise ValueError(f"{path}:{line}: bytes that are not UTF-8 ({e.reason}).") from None
  documents, sentences = [], []
  for line in text.splitlines() + [""]:
    if line.strip():
      sentences.append(" ".join(line.split()))
    elif sentences:
      documents.append(sentences)
      sentences = []
  if not documents:
    raise ValueError(f"{path}: no sentences (expected one sentence per line, a blank line "
                     "between documents).")
  return documents


def rejection(sentence: str, min_words: int, max_words: int) -> str | None:
  """Why a sentence cannot be a context or an ending, or None if it can."""
  words = len(sentence.split())
  if words < min_words:
    return "too_short"
  if words > max_words:
    return "too_long"
  if not any(c.islower() for c in sentence):
    return "no_lower_case"
  if _MARKUP.search(sentence):
    return "markup"
  return None


def _key(sentence: str) -> str:
  return " ".join(sentence.lower().split())


def split_documents(num_documents: int, val_fraction: float, test_fraction: float,
                    seed: int) -> list[str]:
  """The split ("train", "val", "test") of each document, by a seeded shuffle."""
  order = list(range(num_documents))
  random.Random(seed).shuffle(order)
  n_test, n_val = round(num_documents * test_fraction), round(num_documents * val_fraction)
  split = ["train"] * num_documents
  for rank, index in enumerate(order):
    if rank < n_test:
      split[index] = "test"
    elif rank < n_test + n_val:
      split[index] = "val"
  return split


def build_examples(documents: Sequence[Sequence[str]], names: Sequence[str], seed: int,
                   min_words: int = 4, max_words: int = 50,
                   rejected: dict[str, int] | None = None) -> list[ChoiceExample]:
  """Examples from one split's documents; distractors from the same document where it has three
  usable ones, else from the other documents given here."""
  rng = random.Random(seed)
  rejected = rejected if rejected is not None else {}
  usable = [[rejection(s, min_words, max_words) is None for s in doc] for doc in documents]
  pool = [(d, i) for d, doc in enumerate(documents) for i in range(len(doc)) if usable[d][i]]
  examples = []
  for d, doc in enumerate(documents):
    for i in range(len(doc) - 1):
      reasons = [rejection(s, min_words, max_words) for s in (doc[i], doc[i + 1])]
      reason = reasons[0] or reasons[1]
      if reason is None and _key(doc[i]) == _key(doc[i + 1]):
        reason = "ending_repeats_context"
      if reason:
        rejected[reason] = rejected.get(reason, 0) + 1
        continue
      taken = {_key(doc[i]), _key(doc[i + 1])}
      candidates = [j for j in range(len(doc)) if usable[d][j] and j not in (i, i + 1)]
      rng.shuffle(candidates)
      distractors = []
      for j in candidates:
        if _key(doc[j]) not in taken and len(distractors) < NUM_ENDINGS - 1:
          distractors.append(doc[j])
          taken.add(_key(doc[j]))
      from_others = len(distractors) < NUM_ENDINGS - 1
      attempts = 0
      while len(distractors) < NUM_ENDINGS - 1 and attempts < 100 * NUM_ENDINGS and pool:
        attempts += 1
        other_d, j = pool[rng.randrange(len(pool))]
        if other_d != d and _key(documents[other_d][j]) not in taken:
          distractors.append(documents[other_d][j])
          taken.add(_key(documents[other_d][j]))
      if len(distractors) < NUM_ENDINGS - 1:
        rejected["too_few_distractors"] = rejected.get("too_few_distractors", 0) + 1
        continue
      label = rng.randrange(NUM_ENDINGS)
      endings = distractors[:label] + [doc[i + 1]] + distractors[label:]
      examples.append(ChoiceExample(names[d], i, doc[i], tuple(endings), label, from_others))
  return examples


def swag_csv_text(examples: Sequence[ChoiceExample], with_labels: bool = True) -> str:
  """The examples as a SWAG CSV file (header and one row per example)."""
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(HEADER)
  for row, example in enumerate(examples):
    label = str(example.label) if with_labels and example.label is not None else ""
    writer.writerow([row, example.video_id, example.fold_ind, example.context,
                     example.context, "", "gold", *example.endings, label])
  return out.getvalue()


def read_swag_csv(path: str) -> list[ChoiceExample]:
  """Examples of a CSV this module wrote (the baselines read them back to score them)."""
  with open(path, encoding="utf-8", newline="") as f:
    rows = list(csv.reader(f))
  if not rows or tuple(rows[0]) != HEADER:
    raise ValueError(f"{path}:1: header {rows[0] if rows else None}; expected {list(HEADER)}.")
  examples = []
  for line, row in enumerate(rows[1:], start=2):
    if len(row) != len(HEADER):
      raise ValueError(f"{path}:{line}: {len(row)} fields; expected {len(HEADER)}.")
    label = int(row[11]) if row[11] else None
    examples.append(ChoiceExample(row[1], int(row[2]), row[4], tuple(row[7:11]), label))
  return examples


# ---------------------------------------------------------------------------------------------
# Baselines.

def random_choice(examples: Sequence[ChoiceExample], seed: int = 0) -> list[int]:
  rng = random.Random(seed)
  return [rng.randrange(len(e.endings)) for e in examples]


def longest_ending(examples: Sequence[ChoiceExample]) -> list[int]:
  """The ending with the most words (the first of the longest)."""
  return [max(range(len(e.endings)), key=lambda k, e=e: (len(e.endings[k].split()), -k))
          for e in examples]


def word_overlap(examples: Sequence[ChoiceExample]) -> list[int]:
  """The ending sharing the most distinct lower-cased words with the context (the first of the
  best)."""
  predictions = []
  for e in examples:
    context = set(_WORD.findall(e.context.lower()))
    overlaps = [len(context & set(_WORD.findall(ending.lower()))) for ending in e.endings]
    predictions.append(overlaps.index(max(overlaps)))
  return predictions


def accuracy(predictions: Sequence[int], examples: Sequence[ChoiceExample]) -> float:
  if not examples:
    raise ValueError("accuracy of no examples")
  return sum(p == e.label for p, e in zip(predictions, examples)) / len(examples)


def baselines(examples: Sequence[ChoiceExample], seed: int = 0) -> dict[str, float]:
  """Accuracies in percent; `random_expected` is the chance level the random draw estimates."""
  return {
      "random_expected": round(100 / NUM_ENDINGS, 2),
      "random": round(100 * accuracy(random_choice(examples, seed), examples), 2),
      "longest_ending": round(100 * accuracy(longest_ending(examples), examples), 2),
      "word_overlap": round(100 * accuracy(word_overlap(examples), examples), 2),
  }


def build(input_file: str, output_dir: str, val_fraction: float = 0.1, test_fraction: float = 0.1,
          seed: int = 12345, min_words: int = 4, max_words: int = 50,
          max_train_examples: int | None = None) -> dict:
  """Writes the three CSV files, test_labels.csv and summary.json; returns the summary."""
  documents = read_corpus(input_file)
  stem = os.path.splitext(os.path.basename(input_file))[0]
  names = [f"{stem}-{d:05d}" for d in range(len(documents))]
  split_of = split_documents(len(documents), val_fraction, test_fraction, seed)
  os.makedirs(output_dir, exist_ok=True)
  summary = {"source": input_file, "layout": ",".join(HEADER), "seed": seed,
             "min_words": min_words, "max_words": max_words, "sent2": "",
             "max_train_examples": max_train_examples, "splits": {}, "rejected_pairs": {},
             "baselines": {}}
  examples_of = {}
  for offset, split in enumerate(("train", "val", "test")):
    indices = [d for d in range(len(documents)) if split_of[d] == split]
    rejected: dict[str, int] = {}
    examples = build_examples([documents[d] for d in indices], [names[d] for d in indices],
                              seed + 1 + offset, min_words, max_words, rejected)
    if split == "train" and max_train_examples is not None and len(examples) > max_train_examples:
      keep = sorted(random.Random(seed).sample(range(len(examples)), max_train_examples))
      examples = [examples[k] for k in keep]
    examples_of[split] = examples
    summary["rejected_pairs"][split] = dict(sorted(rejected.items()))
    summary["splits"][split] = {
        "documents": len(indices),
        "documents_with_examples": len({e.video_id for e in examples}),
        "examples": len(examples),
        "distractors_from_other_documents": sum(e.distractors_from_other_documents
                                                for e in examples),
        "label_counts": [sum(e.label == k for e in examples) for k in range(NUM_ENDINGS)],
    }
    if split != "train" and examples:
      summary["baselines"][split] = baselines(examples, seed)
  for split, examples in examples_of.items():
    write_text_atomic(os.path.join(output_dir, SPLIT_FILES[split]),
                      swag_csv_text(examples, with_labels=split != "test"))
  write_text_atomic(os.path.join(output_dir, TEST_LABELS_FILE), swag_csv_text(examples_of["test"]))
  write_text_atomic(os.path.join(output_dir, "summary.json"), json.dumps(summary, indent=2) + "\n")
  return summary


def score_baselines(output_dir: str, seed: int = 12345) -> dict[str, dict[str, float]]:
  """The baselines of an existing directory (val.csv and test_labels.csv)."""
  return {"val": baselines(read_swag_csv(os.path.join(output_dir, SPLIT_FILES["val"])), seed),
          "test": baselines(read_swag_csv(os.path.join(output_dir, TEST_LABELS_FILE)), seed)}


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Command-line flags, defined only when run as a program (importers get none)."""
  flags.DEFINE_string("input_file", None, "Corpus: one sentence per line, blank line between "
                      "documents.")
  flags.DEFINE_string("output_dir", None, "Where to write train/val/test CSV files.")
  flags.DEFINE_float("val_fraction", 0.1, "Share of documents for val.csv.")
  flags.DEFINE_float("test_fraction", 0.1, "Share of documents for test.csv.")
  flags.DEFINE_integer("seed", 12345, "Seed of the split, the distractors and the positions.")
  flags.DEFINE_integer("min_words", 4, "Shortest usable sentence, in words.")
  flags.DEFINE_integer("max_words", 50, "Longest usable sentence, in words.")
  flags.DEFINE_integer("max_train_examples", None, "Keep at most this many training examples "
                       "(a seeded sample).")
  flags.DEFINE_bool("overwrite", False, "Rebuild even if summary.json exists.")
  flags.DEFINE_bool("baseline", False, "Only score the baselines of an existing output_dir.")


def main(argv):
  del argv
  summary_path = os.path.join(FLAGS.output_dir, "summary.json")
  if FLAGS.baseline:
    results = score_baselines(FLAGS.output_dir, FLAGS.seed)
  elif os.path.exists(summary_path) and not FLAGS.overwrite:
    print(f"[next_sentence_choice] {summary_path} exists: nothing to do (--overwrite to rebuild).")
    results = score_baselines(FLAGS.output_dir, FLAGS.seed)
  else:
    if not FLAGS.input_file:
      raise app.UsageError("--input_file is required to build the task.")
    summary = build(FLAGS.input_file, FLAGS.output_dir, FLAGS.val_fraction, FLAGS.test_fraction,
                    FLAGS.seed, FLAGS.min_words, FLAGS.max_words, FLAGS.max_train_examples)
    for split, stats in summary["splits"].items():
      print(f"[next_sentence_choice] {split:5s} {stats}; rejected pairs "
            f"{summary['rejected_pairs'][split]}")
    results = summary["baselines"]
  for split, result in results.items():
    print(f"[next_sentence_choice] {split:5s} accuracy % {result}")


if __name__ == "__main__":
  define_flags()
  flags.mark_flag_as_required("output_dir")
  app.run(main)
