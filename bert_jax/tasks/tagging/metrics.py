"""Entity-level precision, recall and F1 of a tagging, counted exactly as CoNLL's `conlleval`.

The NER numbers of the BERT paper (CoNLL-2003 F1), and of every paper it is compared with, are
the numbers that the shared task's Perl script `conlleval` (Erik Tjong Kim Sang, version
2004-01-26) prints. Libraries that "mimic conlleval" are reimplementations — seqeval's default
mode rebuilds entity spans and intersects them — and they differ from the script on tags the
script has rules for and they do not (see below). A score that is to stand next to a published
one has to come from the script's own rules, so this module reproduces them:

- A tag is split at its first hyphen into a prefix and a type ("B-PER" -> ("B", "PER"),
  "I-MISC-X" -> ("I", "MISC-X"), "O" -> ("O", "")).
- `end_of_chunk` / `start_of_chunk` are the script's boundary rules, for the previous and the
  current token's prefix and type. They read IOB1 (I-PER I-PER B-PER I-PER is two entities), IOB2,
  IOE1/IOE2 (E-), the bracket tags `[` and `]` (one-token chunks), and tolerate ill-formed
  sequences as the script does: an I-X after O or after another type starts an entity, B- ends
  the entity before it, and any change of type ends one entity and starts the next.
- The script does not keep spans: it reads gold and predicted tags side by side and counts an
  entity as correct when both start on the same token with the same type and both end on the
  same token, with no disagreement about an end in between. `evaluate` runs that very state
  machine; `chunks` lists the spans the same rules give, for inspection and tests.
- Sentence boundaries (a blank line, a line whose first column is "-X-") end every entity.
- Token accuracy counts every token, "O" included; a token is right when prefix and type both are.
- Precision, recall and F1 are 0 where the script prints 0 (nothing predicted, nothing to find).
  They are fractions here; `Scores.report()` prints the script's percentages and layout.

Where this module goes beyond the 2004 script, or departs from it:
- IOBES. The 2004 script has no rules for S- and none for E- followed by B-: it reads
  S-PER S-PER as one entity. IOBES taggers are scored with the IOBES-aware `conlleval` that adds
  the missing pairs (an S- or E- ends the entity; B- and S- after S- or E- start one; I- and E-
  after S- start one); those rules are included. They never fire on IOB1, IOB2, IOE1, IOE2 or
  bracket tags, so on those taggings the counts are the 2004 script's.
- `-DOCSTART-` lines are sentence boundaries. The script's boundary is "-X-" only: it reads a
  `-DOCSTART-` line of a CoNLL-2003 file as one more token, tagged as the line says, which moves
  its token accuracy. `docstart_is_boundary=False` gives the script's reading.
- Columns are separated by any white space (the script splits on single spaces), and boundary
  lines are not held to the column count of the token lines (the script stops at them, though
  it never uses their fields). Neither changes a number the script prints.
- `raw=True` is the script's `-r`: every tag but the outside tag is an entity of its own
  ("PER" -> "B-PER"); `outside_tag` is `-o` and, as in the script, matters only with `raw`.

Where seqeval 1.2.2's default mode disagrees with the script (both count the same on the tag
sets {O, B-X, I-X} and {O, B-X, I-X, E-X, S-X}): it takes a tag's prefix to be its first
character ("PER" is prefix "P", type "ER"; for the script it is prefix "PER", no entity); it has
no bracket tags; its B- and S- start an entity after any tag, where the script's B- after ".",
"[" or "]" of the same type does not; it types an untyped "B" as "_" where the script uses "";
and it counts an entity whose type is "0" under "0", where the script, a Perl program, reads the
string "0" as false and so as no type.

    python -m bert_jax.tasks.conlleval predictions.txt        # token gold predicted per line
    python -m bert_jax.tasks.conlleval -r < predictions.txt   # raw tags, read from stdin
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

# The script's sentence-boundary marker in the first column (its `$boundary`).
BOUNDARY = "-X-"
# First column of the document separator lines of the CoNLL-2003 files.
DOCSTART = "-DOCSTART-"

# (previous prefix, current prefix) pairs after which an entity has ended / a new one starts.
# The first line of each is the 2004-01-26 script; the rest are the IOBES-aware additions.
_END_PAIRS = frozenset({
    ("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O"),
    ("B", "S"), ("I", "S"), ("E", "S"), ("E", "B"),
    ("S", "B"), ("S", "I"), ("S", "E"), ("S", "S"), ("S", "O"),
})
_START_PAIRS = frozenset({
    ("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"), ("O", "E"),
    ("S", "B"), ("E", "B"), ("B", "S"), ("I", "S"), ("O", "S"), ("S", "S"), ("E", "S"),
    ("S", "I"), ("S", "E"),
})
# Prefixes at which a change of type neither ends nor starts an entity ("." is the script's).
_NEUTRAL = ("O", ".")
# Bracket tags: one-token entities, in the script since 1998-12-22.
_BRACKETS = ("[", "]")


def split_tag(tag: str) -> tuple[str, str]:
  """(prefix, type) of a tag, split at the first hyphen; no hyphen means no type.

  A type spelled "0" is no type, because the script assigns `$type ? $type : ""` and Perl
  reads the string "0" as false.
  """
  prefix, hyphen, type_ = tag.partition("-")
  if not hyphen:
    return tag, ""
  return prefix, ("" if type_ == "0" else type_)


def end_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
  """Whether an entity ended between the previous token and this one (prefixes and types)."""
  return ((prev_tag, tag) in _END_PAIRS
          or (prev_tag not in _NEUTRAL and prev_type != type_)
          or prev_tag in _BRACKETS)


def start_of_chunk(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
  """Whether an entity starts at this token, given the previous one (prefixes and types)."""
  return ((prev_tag, tag) in _START_PAIRS
          or (tag not in _NEUTRAL and prev_type != type_)
          or tag in _BRACKETS)


def chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
  """The entities of one sentence as (type, first token, last token inclusive).

  An entity runs from a token where `start_of_chunk` holds to the token before the next place
  where `end_of_chunk` (or another start) holds; the end of the sentence ends it. Its type is
  the type of its first token, the type under which the script counts it as found.

  On IOB1, IOB2, IOE1, IOE2 and IOBES tags the script's correct count is the number of these
  spans that gold and prediction share. Bracket or "." tags mixed with B-/I- can make the rules
  end an entity without starting one (the I- of "[-NP I-NP" is in no entity) or start one
  without ending the last; there the script's counts are not a function of spans, and
  `evaluate`, which runs the script's own loop, is the reference.
  """
  if isinstance(tags, str):
    raise TypeError(f"chunks() takes the tags of one sentence as a list, got the string "
                    f"{tags!r}.")
  found = []
  prev_tag, prev_type = "O", ""
  begin, begin_type = None, ""
  for i, tag in enumerate(list(tags) + ["O"]):  # the final "O" is the sentence boundary
    prefix, type_ = split_tag(tag)
    if begin is not None and end_of_chunk(prev_tag, prefix, prev_type, type_):
      found.append((begin_type, begin, i - 1))
      begin = None
    if i < len(tags) and start_of_chunk(prev_tag, prefix, prev_type, type_):
      if begin is not None:  # the rules started an entity without ending the open one
        found.append((begin_type, begin, i - 1))
      begin, begin_type = i, type_
    prev_tag, prev_type = prefix, type_
  if begin is not None:  # an entity the boundary does not end by rule ends with its sentence
    found.append((begin_type, begin, len(tags) - 1))
  return found


def _ratio(numerator: int, denominator: int) -> float:
  return numerator / denominator if denominator > 0 else 0.0


def _f1(precision: float, recall: float) -> float:
  return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Scores:
  """What `conlleval` reports, as fractions in [0, 1] (its percentages / 100).

  `found_gold` is the script's "phrases" (entities in the gold tags), `found_predicted` its
  "found" (entities in the predicted tags), `correct_chunks` its "correct". `per_type` maps each
  entity type seen in either to its `precision`, `recall`, `f1`, `found_predicted`,
  `found_gold` and `correct`, in the script's (sorted) order.
  """
  precision: float
  recall: float
  f1: float
  accuracy: float
  found_gold: int
  found_predicted: int
  correct_chunks: int
  tokens: int
  correct_tokens: int
  per_type: dict[str, dict[str, Any]]

  def as_dict(self) -> dict[str, Any]:
    """A JSON-ready copy."""
    return dataclasses.asdict(self)

  def report(self) -> str:
    """The text `conlleval` prints for these counts, line for line.

    Percentages are recomputed from the counts the way the script computes them (100 * correct
    / found, then F1 of the percentages), so that rounding to two decimals agrees too.
    """
    def percentages(correct: int, predicted: int, gold: int) -> tuple[float, float, float]:
      precision = 100 * correct / predicted if predicted > 0 else 0.0
      recall = 100 * correct / gold if gold > 0 else 0.0
      return precision, recall, _f1(precision, recall)

    lines = [f"processed {self.tokens} tokens with {self.found_gold} phrases; "
             f"found: {self.found_predicted} phrases; correct: {self.correct_chunks}."]
    if self.tokens > 0:
      precision, recall, f1 = percentages(self.correct_chunks, self.found_predicted,
                                          self.found_gold)
      lines.append(f"accuracy: {100 * self.correct_tokens / self.tokens:6.2f}%; "
                   f"precision: {precision:6.2f}%; recall: {recall:6.2f}%; FB1: {f1:6.2f}")
    for type_, counts in self.per_type.items():
      precision, recall, f1 = percentages(counts["correct"], counts["found_predicted"],
                                          counts["found_gold"])
      line = (f"{type_:>17}: precision: {precision:6.2f}%; recall: {recall:6.2f}%; "
              f"FB1: {f1:6.2f}  {counts['found_predicted']}")
      lines.append(line)
      # The script drops repeated names from its sorted list with `not($lastType) or ...`,
      # which keeps a repeat of the empty name (false in Perl): untyped entities found in both
      # the gold and the predicted tags get their line twice.
      if not type_ and counts["found_gold"] and counts["found_predicted"]:
        lines.append(line)
    return "".join(line + "\n" for line in lines)


class _Counter:
  """The script's main loop: one call of `add` per input line, boundaries included."""

  def __init__(self, raw: bool = False, outside_tag: str = "O"):
    self.raw = raw
    self.outside_tag = outside_tag
    self.last_correct, self.last_correct_type = "O", ""
    self.last_guessed, self.last_guessed_type = "O", ""
    self.in_correct = False
    self.found_gold: collections.Counter[str] = collections.Counter()
    self.found_predicted: collections.Counter[str] = collections.Counter()
    self.correct_chunks: collections.Counter[str] = collections.Counter()
    self.tokens = 0
    self.correct_tokens = 0

  def _raw(self, tag: str) -> str:
    if tag == self.outside_tag:
      tag = "O"
    return tag if tag == "O" else f"B-{tag}"

  def add(self, gold_tag: str, predicted_tag: str) -> None:
    """One token."""
    if self.raw:
      gold_tag, predicted_tag = self._raw(gold_tag), self._raw(predicted_tag)
    correct, correct_type = split_tag(gold_tag)
    guessed, guessed_type = split_tag(predicted_tag)
    self._step(correct, correct_type, guessed, guessed_type)
    if correct == guessed and correct_type == guessed_type:
      self.correct_tokens += 1
    self.tokens += 1

  def boundary(self) -> None:
    """A sentence boundary: a line the script reads as ("-X-", "O", "O")."""
    self._step("O", "", "O", "")

  def _step(self, correct: str, correct_type: str, guessed: str, guessed_type: str) -> None:
    end_correct = end_of_chunk(self.last_correct, correct, self.last_correct_type, correct_type)
    end_guessed = end_of_chunk(self.last_guessed, guessed, self.last_guessed_type, guessed_type)
    start_correct = start_of_chunk(self.last_correct, correct, self.last_correct_type,
                                   correct_type)
    start_guessed = start_of_chunk(self.last_guessed, guessed, self.last_guessed_type,
                                   guessed_type)
    if self.in_correct:
      if end_correct and end_guessed and self.last_guessed_type == self.last_correct_type:
        self.in_correct = False
        self.correct_chunks[self.last_correct_type] += 1
      elif end_correct != end_guessed or guessed_type != correct_type:
        self.in_correct = False
    if start_correct and start_guessed and guessed_type == correct_type:
      self.in_correct = True
    if start_correct:
      self.found_gold[correct_type] += 1
    if start_guessed:
      self.found_predicted[guessed_type] += 1
    self.last_correct, self.last_correct_type = correct, correct_type
    self.last_guessed, self.last_guessed_type = guessed, guessed_type

  def scores(self) -> Scores:
    correct_chunks = collections.Counter(self.correct_chunks)
    if self.in_correct:  # the script's check after its last line
      correct_chunks[self.last_correct_type] += 1
    found_gold = sum(self.found_gold.values())
    found_predicted = sum(self.found_predicted.values())
    correct = sum(correct_chunks.values())
    per_type = {}
    for type_ in sorted(set(self.found_gold) | set(self.found_predicted)):
      precision = _ratio(correct_chunks[type_], self.found_predicted[type_])
      recall = _ratio(correct_chunks[type_], self.found_gold[type_])
      per_type[type_] = {"precision": precision, "recall": recall,
                         "f1": _f1(precision, recall),
                         "found_predicted": self.found_predicted[type_],
                         "found_gold": self.found_gold[type_], "correct": correct_chunks[type_]}
    precision = _ratio(correct, found_predicted)
    recall = _ratio(correct, found_gold)
    return Scores(precision=precision, recall=recall, f1=_f1(precision, recall),
                  accuracy=_ratio(self.correct_tokens, self.tokens), found_gold=found_gold,
                  found_predicted=found_predicted, correct_chunks=correct, tokens=self.tokens,
                  correct_tokens=self.correct_tokens, per_type=per_type)


def evaluate(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]], *,
             raw: bool = False, outside_tag: str = "O") -> Scores:
  """Scores of predicted against gold tags, given as lists of sentences (lists of tags).

  Sentences are separated as by blank lines in the script's input, so no entity crosses from one
  to the next. `raw` and `outside_tag` are the script's `-r` and `-o`.
  """
  if len(gold) != len(predicted):
    raise ValueError(f"evaluate: {len(gold)} gold sentences but {len(predicted)} predicted "
                     "sentences; both must be lists of sentences, one list of tags each.")
  counter = _Counter(raw=raw, outside_tag=outside_tag)
  for index, (gold_tags, predicted_tags) in enumerate(zip(gold, predicted)):
    for name, tags in (("gold", gold_tags), ("predicted", predicted_tags)):
      if isinstance(tags, str):
        raise ValueError(f"evaluate: {name} sentence {index} is the string {tags!r}, not a list "
                         "of tags; pass a list of sentences, e.g. [['B-PER', 'O']], not a "
                         "flat list of tags.")
    if len(gold_tags) != len(predicted_tags):
      raise ValueError(f"evaluate: sentence {index} has {len(gold_tags)} gold tags but "
                       f"{len(predicted_tags)} predicted tags; they must be tags of the same "
                       "tokens.")
    for gold_tag, predicted_tag in zip(gold_tags, predicted_tags):
      counter.add(gold_tag, predicted_tag)
    counter.boundary()
  return counter.scores()


def _read_lines(path: str | os.PathLike) -> Iterable[str]:
  """Lines of a UTF-8 file, each decoded alone so that a bad byte is reported with its line."""
  with open(path, "rb") as f:
    for line_number, raw_line in enumerate(f, start=1):
      try:
        yield raw_line.decode("utf-8")
      except UnicodeDecodeError as e:
        raise ValueError(f"{os.fspath(path)}:{line_number}: bytes are not valid UTF-8 "
                         f"({e.reason} at byte {e.start} of the line).") from e


def evaluate_conll_file(path_or_lines: str | os.PathLike | Iterable[str], *,
                        raw: bool = False, outside_tag: str = "O",
                        docstart_is_boundary: bool = True) -> Scores:
  """Scores of a file in the script's input format: a path, or the file's lines.

  Each token line holds white-space separated columns of which the last two are the gold and
  the predicted tag (CoNLL-2003's four columns plus a prediction, or just "word gold predicted",
  or just the two tags). A blank line, or a line whose first column is "-X-" or (unless
  `docstart_is_boundary` is False) "-DOCSTART-", is a sentence boundary. A token line with fewer
  than two columns, or with another number of columns than the first token line, is an error
  naming the file and line, where the script stops with "unexpected number of features".
  A string is a path; pass `open(...)`, `text.splitlines()` or a list to give lines.
  """
  if isinstance(path_or_lines, (str, os.PathLike)):
    source, lines = os.fspath(path_or_lines), _read_lines(path_or_lines)
  else:
    source, lines = "<lines>", path_or_lines
  boundaries = (BOUNDARY, DOCSTART) if docstart_is_boundary else (BOUNDARY,)
  counter = _Counter(raw=raw, outside_tag=outside_tag)
  num_columns, first_token_line = None, 0
  for line_number, line in enumerate(lines, start=1):
    fields = line.split()
    if not fields or fields[0] in boundaries:
      counter.boundary()
      continue
    if len(fields) < 2:
      raise ValueError(f"{source}:{line_number}: a token line needs at least 2 columns, the last "
                       f"two being the gold and the predicted tag; found 1: {line.rstrip()!r}.")
    if num_columns is None:
      num_columns, first_token_line = len(fields), line_number
    elif len(fields) != num_columns:
      raise ValueError(f"{source}:{line_number}: {len(fields)} columns, but line "
                       f"{first_token_line} has {num_columns}; every token line must have the "
                       f"same columns: {line.rstrip()!r}.")
    counter.add(fields[-2], fields[-1])
  return counter.scores()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m bert_jax.tasks.conlleval",
      description="Entity-level precision/recall/F1 of a tagging, as CoNLL's conlleval counts.")
  parser.add_argument("file", nargs="?", default="-",
                      help="token lines ending in gold and predicted tag; '-' reads stdin")
  parser.add_argument("-r", "--raw", action="store_true",
                      help="tags have no B-/I- prefixes: every non-outside tag is one entity")
  parser.add_argument("-o", "--outside_tag", default="O",
                      help="the outside tag of raw tags (only with -r, as in conlleval)")
  parser.add_argument("--docstart_as_token", action="store_true",
                      help="count -DOCSTART- lines as tokens, as the Perl script does")
  parser.add_argument("--json", action="store_true", help="print the scores as JSON")
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  args = _parse_args(argv)
  try:
    scores = evaluate_conll_file(sys.stdin if args.file == "-" else args.file, raw=args.raw,
                                 outside_tag=args.outside_tag,
                                 docstart_is_boundary=not args.docstart_as_token)
  except (ValueError, OSError) as e:
    print(f"conlleval: error: {e}", file=sys.stderr)
    return 1
  sys.stdout.write(json.dumps(scores.as_dict(), indent=2) + "\n" if args.json else scores.report())
  return 0


if __name__ == "__main__":
  sys.exit(main())
