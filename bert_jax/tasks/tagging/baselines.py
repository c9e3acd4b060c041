"""What a tagger scores without learning anything, beside which a fine-tuned tagger's scores are
read: CoNLL-2003's own baseline (Tjong Kim Sang and De Meulder, 2003: tag the test phrases that
were entities of one type in training) and each word's most frequent training type, scored as
conlleval scores (`metrics.py`).
"""

from __future__ import annotations

import collections
from typing import Iterable, Sequence

from bert_jax.tasks.tagging import iob
from bert_jax.tasks.tagging import metrics as conlleval

Span = tuple[int, int, str]  # [start, end) word indices and a type


def entities(tags: Sequence[str]) -> list[Span]:
  """[start, end) entity spans of a tag sequence, by conlleval's rules."""
  return [(first, last + 1, kind) for kind, first, last in conlleval.chunks(tags)]


def phrase_lexicon(sentences: Iterable[tuple[Sequence[str], Sequence[str]]]
                   ) -> dict[tuple[str, ...], str]:
  """Entity phrases of the training (words, tags) that carry a single type wherever they occur
  as an entity there."""
  types: dict[tuple[str, ...], set] = collections.defaultdict(set)
  for words, tags in sentences:
    for start, end, kind in entities(tags):
      types[tuple(words[start:end])].add(kind)
  return {phrase: next(iter(kinds)) for phrase, kinds in types.items() if len(kinds) == 1}


def phrase_baseline(lexicon: dict[tuple[str, ...], str], words: Sequence[str]) -> list[str]:
  """CoNLL-2003's baseline (Tjong Kim Sang and De Meulder, 2003): tag the test phrases that were
  entities of a single type in training, the longest match first; everything else O."""
  longest = max((len(p) for p in lexicon), default=0)
  spans, i = [], 0
  while i < len(words):
    for length in range(min(longest, len(words) - i), 0, -1):
      kind = lexicon.get(tuple(words[i:i + length]))
      if kind is not None:
        spans.append((i, i + length, kind))
        i += length
        break
    else:
      i += 1
  return iob.from_spans(len(words), spans)


def word_majority_lexicon(sentences: Iterable[tuple[Sequence[str], Sequence[str]]]
                          ) -> dict[str, str]:
  """word → the entity type (or O) it carries most often in training; ties go to O, then to the
  first type by name."""
  seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for words, tags in sentences:
    for word, tag in zip(words, tags):
      seen[word][tag.partition("-")[2] or "O"] += 1
  return {word: min(c, key=lambda k: (-c[k], k != "O", k)) for word, c in seen.items()}


def word_majority_baseline(lexicon: dict[str, str], words: Sequence[str]) -> list[str]:
  """Each word gets its most frequent training type (O for unseen words); neighbours of one type
  make one phrase."""
  types = [lexicon.get(word, "O") for word in words]
  spans, start = [], None
  for i, kind in enumerate(types + ["O"]):
    if start is not None and kind != types[start]:
      spans.append((start, i, types[start]))
      start = None
    if start is None and kind != "O":
      start = i
  return iob.from_spans(len(words), spans)


def score(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, float]:
  """conlleval's entity-level precision, recall and F1, in percent as the script prints them."""
  scores = conlleval.evaluate(gold, predicted)
  return {"precision": round(100 * scores.precision, 2), "recall": round(100 * scores.recall, 2),
          "f1": round(100 * scores.f1, 2)}
