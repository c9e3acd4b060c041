"""How much of a masked word its two neighbours give away, by counting: a ceiling-like reference
for what a tiny model's masked-LM accuracy can reach on a corpus from local context alone.

    python benchmarks/neighbour_counts.py --corpus=demo_output/corpus.txt \
        --vocab_file=demo_output/vocab.vocab.txt

The corpus is tokenized with the vocabulary; the first 90% of its pieces are counted, and
20,000 positions of the last 10% are predicted as the most frequent piece seen between the same
left and right neighbours (else after the same left neighbour, else the most frequent piece).
Printed beside it: the left-neighbour-only and the unigram guess (what `make demo` calls the
frequency baseline). Neighbours here are clean; a masked-LM model sees 15% of them masked.
"""

from __future__ import annotations

import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app, flags
import numpy as np

from bert_jax.text import tokenization
# pylint: enable=g-import-not-at-top,wrong-import-position

_CORPUS = flags.DEFINE_string("corpus", None, "Text file, one sentence per line.", required=True)
_VOCAB = flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt.", required=True)
_POSITIONS = flags.DEFINE_integer("positions", 20000, "Held-out positions to score.")


def _most_frequent(pairs: collections.Counter) -> dict:
  best: dict = {}
  for (context, piece), count in pairs.items():
    if context not in best or count > best[context][1]:
      best[context] = (piece, count)
  return {context: piece for context, (piece, _) in best.items()}


def main(argv):
  del argv
  tokenizer = tokenization.load_tokenizer(vocab_file=_VOCAB.value, do_lower_case=True)
  ids: list[int] = []
  with open(_CORPUS.value, encoding="utf-8") as f:
    for line in f:
      if line.strip():
        ids.extend(tokenizer.convert_tokens_to_ids(tokenizer.tokenize(line.strip())))
  ids_array = np.asarray(ids)
  cut = int(len(ids_array) * 0.9)
  train, test = ids_array[:cut].tolist(), ids_array[cut:]
  both = _most_frequent(collections.Counter(
      ((a, b), m) for a, m, b in zip(train[:-2], train[1:-1], train[2:])))
  left = _most_frequent(collections.Counter(zip(train[:-1], train[1:])))
  unigram = collections.Counter(train).most_common(1)[0][0]
  positions = np.random.default_rng(0).choice(np.arange(1, len(test) - 1),
                                              min(_POSITIONS.value, len(test) - 2), replace=False)
  hits = collections.Counter()
  for p in positions:
    a, m, b = int(test[p - 1]), int(test[p]), int(test[p + 1])
    hits["both neighbours"] += both.get((a, b), left.get(a, unigram)) == m
    hits["left neighbour"] += left.get(a, unigram) == m
    hits["unigram"] += unigram == m
  print(f"{len(ids_array):,} pieces, vocabulary {tokenizer.vocab_size:,}; "
        + ", ".join(f"{k} {v / len(positions):.1%}" for k, v in hits.items()))


if __name__ == "__main__":
  app.run(main)
