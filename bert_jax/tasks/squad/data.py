"""SQuAD v1.1 / v2.0: examples, sliding-window features, and the n-best post-processing.

What the original `run_squad.py` does, with one change of mechanism and the same results:

- Reading: the official JSON files (`train-v1.1.json`, `dev-v2.0.json`, ...), local or gs://, or
  a prepared tensorflow-datasets directory (`squad/v1.1`, `squad/v2.0`), never downloading. A
  malformed file names the path and line; a missing field names where in the file it is missing.
- Features: the context is split on whitespace, each word is cut into word pieces, and the
  question (at most `max_query_length` pieces) is paired with windows of the context:
  `[CLS] question [SEP] window [SEP]`, windows `doc_stride` pieces apart, so a long context
  becomes several overlapping features. A token seen in several windows is scored only in the
  window where it has the most context on both sides (the `max_context` flag). Answers map to
  the piece span that covers them; a window that does not hold the whole answer (and every
  window of an unanswerable v2.0 question) points at [CLS], position 0.
- Text recovery: the original re-tokenizes the predicted words and aligns the normalised piece
  text with the original words character by character (`get_final_text`), falling back to whole
  words where the alignment fails. Here that alignment is done once, when the context is
  tokenized: every piece gets the character span it came from, and an answer is
  `context[start of first piece : end of last piece]`. The fallback is the same (a word whose
  pieces cannot be aligned, e.g. with [UNK], gives its pieces the whole word), and the text is
  the user's own characters — case, accents and spacing as in the context.
- Answers whose text is not found at their `answer_start` are counted and reported: one found
  within a few characters of its offset is used there ("repaired"); others are left out of
  training and listed by id in the report. Every other gold answer (the extra ones of training
  questions, all of an evaluation file's) is checked the same way and reported when absent.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import re
import unicodedata
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
from absl import logging

from bert_jax import file_io
from bert_jax.text import characters, tokenization, unknown_tokens
from bert_jax.text.tokenization import SPM_WORD_START, UNK

# How far from its `answer_start` an answer's text is still accepted (and used where it is).
REPAIR_WINDOW = 24
# Whitespace of the original `run_squad.py`: words are what lies between these characters.
_WORD_RE = re.compile(r"[^ \t\r\n\u202f]+")


@dataclasses.dataclass(frozen=True)
class Answer:
  text: str
  start: int  # character offset in the context


@dataclasses.dataclass
class SquadExample:
  """One question about one context. `answers` holds every gold answer (one in training files,
  up to five on dev); `is_impossible` marks v2.0 questions without an answer in the context."""
  qas_id: str
  question: str
  context: str
  answers: list[Answer]
  is_impossible: bool = False
  title: str = ""
  where: str = ""  # "file: data[i].paragraphs[j].qas[k]", for messages


# ------------------------------------------------------------------------------------ reading
# The official layout is walked in one place (here); the evaluator reads gold answers through it.
_JSON_NAMES = {list: "a list", str: "a string", dict: "a JSON object", int: "an integer",
               bool: "true or false"}


def describe(value: Any) -> str:
  """A value's type and a short repr, for messages about what a file holds instead."""
  text = repr(value)
  return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def load_json(path: str) -> Any:
  """A JSON file (local or gs://); invalid JSON or UTF-8 is an error naming path and line."""
  text = file_io.read_text(path)
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: line {e.lineno}, column {e.colno}: not valid JSON "
                     f"({e.msg}).") from e
  except RecursionError:
    raise ValueError(f"{path}: JSON nested too deeply to be a SQuAD file.") from None
  # `\ud800`-style escapes of lone surrogates parse, but are no text: refuse them here, where
  # the file is known, rather than in the tokenizer.
  if "\\ud" in text.lower() and _has_lone_surrogate(data):
    raise ValueError(f"{path}: holds an unpaired surrogate escape (such as \\ud800): not "
                     "valid Unicode text.")
  return data


def _has_lone_surrogate(obj: Any) -> bool:
  if isinstance(obj, str):
    return any(0xD800 <= ord(ch) <= 0xDFFF for ch in obj)
  if isinstance(obj, dict):
    return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in obj.items())
  if isinstance(obj, list):
    return any(_has_lone_surrogate(v) for v in obj)
  return False


def require(obj: Any, key: str, kind: type, source: str, where: str) -> Any:
  """`obj[key]`, which must exist and be of `kind`; otherwise an error naming the place."""
  if not isinstance(obj, dict):
    raise ValueError(f"{source}: {where}: expected a JSON object, got {describe(obj)}.")
  if key not in obj:
    raise ValueError(f"{source}: {where}: no {key!r}.")
  value = obj[key]
  if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
    raise ValueError(f"{source}: {where}: {key!r} must be {_JSON_NAMES[kind]}, got "
                     f"{describe(value)}.")
  return value


def iter_questions(data: Any, source: str) -> Iterator[tuple[str, dict, dict, dict]]:
  """`(where, article, paragraph, qa)` for every question of the `data` list, checking the nesting on the
  way down. A repeated id is an error: predictions and scores are kept per id, so one of the two
  questions would silently be scored twice."""
  if not isinstance(data, list):
    raise ValueError(f"{source}: 'data' must be a list of articles, got {describe(data)}.")
  first_seen: dict[str, str] = {}
  for i, article in enumerate(data):
    for j, paragraph in enumerate(require(article, "paragraphs", list, source, f"data[{i}]")):
      for k, qa in enumerate(require(paragraph, "qas", list, source,
                                     f"data[{i}].paragraphs[{j}]")):
        where = f"data[{i}].paragraphs[{j}].qas[{k}]"
        qid = require(qa, "id", str, source, where)
        if qid in first_seen:
          raise ValueError(f"{source}: {where} (id {qid!r}): the id was already used at "
                           f"{first_seen[qid]}.")
        first_seen[qid] = where
        yield f"{where} (id {qid!r})", article, paragraph, qa


def dataset_articles(dataset: Any, source: str) -> list:
  """The `data` list of a parsed official file."""
  if not isinstance(dataset, dict) or "data" not in dataset:
    raise ValueError(f"{source}: expected a SQuAD dataset, a JSON object with a 'data' list of "
                     f"articles; got {describe(dataset)}.")
  return dataset["data"]


def parse_squad_json(dataset: Any, source: str) -> list[SquadExample]:
  """Examples from a parsed official file: {"data": [{"title", "paragraphs": [...]}]}."""
  examples = []
  for where, article, paragraph, qa in iter_questions(dataset_articles(dataset, source),
                                                      source):
    context = require(paragraph, "context", str, source, where.split(".qas[")[0])
    question = require(qa, "question", str, source, where)
    if not characters.has_text(question):
      raise ValueError(f"{source}: {where}: the question is empty.")
    is_impossible = qa.get("is_impossible", False)
    if not isinstance(is_impossible, bool):
      raise ValueError(f"{source}: {where}: 'is_impossible' must be true or false, got "
                       f"{describe(is_impossible)}.")
    answers = []
    for i, answer in enumerate(require(qa, "answers", list, source, where)):
      answers.append(Answer(require(answer, "text", str, source, f"{where}.answers[{i}]"),
                            require(answer, "answer_start", int, source,
                                    f"{where}.answers[{i}]")))
    if is_impossible and answers:
      raise ValueError(f"{source}: {where}: marked is_impossible but has answers.")
    examples.append(SquadExample(qa["id"], question, context, answers, is_impossible,
                                 str(article.get("title", "")), f"{source}: {where}"))
  return examples


def read_squad_json(path: str) -> list[SquadExample]:
  """The official SQuAD JSON file at `path` (local or gs://)."""
  examples = parse_squad_json(load_json(path), path)
  if not examples:
    raise ValueError(f"{path}: no questions in the file.")
  return examples


def read_squad_tfds(data_dir: str | None, split: str, version_2_with_negative: bool
                    ) -> list[SquadExample]:
  """A split ("train", "validation"; "dev" is accepted) of a prepared tfds `squad/v1.1|v2.0`."""
  tfds = file_io.tensorflow_datasets()
  name = "squad/v2.0" if version_2_with_negative else "squad/v1.1"
  split = {"dev": "validation", "eval": "validation"}.get(split, split)
  try:
    dataset = tfds.load(name, split=split, data_dir=data_dir, download=False,
                        shuffle_files=False)
  except AssertionError as e:
    raise FileNotFoundError(
        f"{name} is not prepared under {data_dir or 'the default tfds data_dir'} ({e}). Prepare "
        f"it once on a machine with internet access: `tfds build {name} --data_dir=DIR`, or pass "
        "the official JSON files with --train_file / --predict_file.") from e
  text = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)  # noqa: E731
  examples = []
  for record in tfds.as_numpy(dataset):
    answers = [Answer(text(t), int(s)) for t, s in zip(record["answers"]["text"],
                                                       record["answers"]["answer_start"])]
    qas_id = text(record["id"])
    if not characters.has_text(text(record["question"])):
      raise ValueError(f"{name}[{split}] id {qas_id}: the question is empty.")
    examples.append(SquadExample(qas_id, text(record["question"]), text(record["context"]),
                                 answers, bool(record.get("is_impossible", False)),
                                 text(record.get("title", b"")), f"{name}[{split}] id {qas_id}"))
  examples.sort(key=lambda e: e.qas_id)  # tfds storage order is shuffled; make it stable
  return examples


def gold_answers(examples: Iterable[SquadExample]) -> dict[str, list[str]]:
  """qas_id → gold answer texts (empty for unanswerable questions), as the evaluators take."""
  return {e.qas_id: [a.text for a in e.answers] for e in examples}


# ---------------------------------------------------------------------- context tokenization
@dataclasses.dataclass
class TokenizedContext:
  """The context's word pieces and, for each, the characters it came from."""
  ids: np.ndarray         # (pieces,) int32
  char_start: np.ndarray  # (pieces,) first character of the piece in the context
  char_end: np.ndarray    # (pieces,) one past its last character
  word: np.ndarray        # (pieces,) index of its whitespace word
  aligned_words: int = 0  # words whose pieces got exact spans (the others: the whole word)
  num_words: int = 0


def _canonical(text: str) -> str:
  """Case-, accent- and compatibility-folded `text` without spaces or control characters: the
  form in which a piece and the characters it came from are equal for any BERT tokenizer."""
  out = []
  for char in unicodedata.normalize("NFKD", text.lower()):
    if unicodedata.category(char) in ("Mn", "Cc", "Cf", "Zs") or char in (SPM_WORD_START,
                                                                           "\ufffd"):
      continue
    if char.isspace():
      continue
    out.append(char)
  return "".join(out)


def align_pieces(word: str, pieces: Sequence[str], unknown: Iterable[str] = (UNK,)
                 ) -> list[tuple[int, int]] | None:
  """Each piece's (start, end) characters in `word`, or None where they cannot be matched.

  Both sides are compared in `_canonical` form, so lower-casing, stripped accents, NFKC and
  dropped control characters do not break the match. An unknown piece ([UNK]) covers the
  characters up to where the next piece matches. A piece with no characters of its own (a
  bare "▁") gets an empty span where it stands.
  """
  unknown = set(unknown)
  if word.isascii() and word.isprintable():  # most words: canonical = lower-cased, 1:1
    text, owner = word.lower(), range(len(word))
  else:
    chars, owner = [], []
    for i, char in enumerate(word):
      for c in _canonical(char):
        chars.append(c)
        owner.append(i)
    text = "".join(chars)
  # owner[k]: the character of `word` behind canonical character k.
  spans: list[tuple[int, int]] = []
  pos, pending_unknown = 0, None

  def span(lo: int, hi: int) -> tuple[int, int]:
    if lo >= hi:
      at = owner[lo] if lo < len(owner) else len(word)
      return at, at
    return owner[lo], owner[hi - 1] + 1

  for piece in pieces:
    if piece in unknown:
      if pending_unknown is not None:
        return None  # two unknowns in a row: where one ends is anyone's guess
      pending_unknown = len(spans)
      spans.append((0, 0))
      continue
    target = _canonical(tokenization.plain_piece_text(piece))
    if pending_unknown is not None:
      found = text.find(target, pos + 1) if target else -1
      if found < 0:
        return None
      spans[pending_unknown] = span(pos, found)
      pending_unknown, pos = None, found
    if not text.startswith(target, pos):
      return None
    spans.append(span(pos, pos + len(target)))
    pos += len(target)
  if pending_unknown is not None:
    if pos >= len(text):
      return None
    spans[pending_unknown] = span(pos, len(text))
    pos = len(text)
  return spans if pos == len(text) else None


def tokenize_context(tokenizer, context: str) -> TokenizedContext:
  """Whitespace words → word pieces with character spans (see the module docstring)."""
  matches = list(_WORD_RE.finditer(context))
  words = [m.group() for m in matches]
  # A word after a space is encoded as the whole context would encode it (byte-level BPE's
  # "Ġword"); the context's first word has no space before it.
  prefix = tokenizer.word_prefix
  id_lists = tokenizer.encode_batch(
      [(prefix if m.start() else "") + w for m, w in zip(matches, words)]) if words else []
  unknown = {tokenizer.convert_ids_to_tokens([tokenizer.unk_id])[0], UNK}
  ids, starts, ends, word_index = [], [], [], []
  aligned = 0
  for w, (match, piece_ids) in enumerate(zip(matches, id_lists)):
    if not piece_ids:
      continue  # only characters the tokenizer drops (control characters, ...)
    if tokenizer.lossless:  # byte-level BPE: the pieces' bytes are the text's, exactly
      offset = len(prefix) if match.start() else 0
      spans = tokenizer.char_spans((prefix if match.start() else "") + match.group(), piece_ids)
      if spans is not None:  # the space before the word belongs to no character of it
        spans = [(max(a - offset, 0), max(b - offset, 0)) for a, b in spans]
    else:
      spans = align_pieces(match.group(), tokenizer.convert_ids_to_tokens(piece_ids), unknown)
    if spans is None:
      spans = [(0, len(match.group()))] * len(piece_ids)
    else:
      aligned += 1
    ids.extend(piece_ids)
    starts.extend(match.start() + s for s, _ in spans)
    ends.extend(match.start() + e for _, e in spans)
    word_index.extend([w] * len(piece_ids))
  return TokenizedContext(np.asarray(ids, np.int32), np.asarray(starts, np.int64),
                          np.asarray(ends, np.int64), np.asarray(word_index, np.int64),
                          aligned, len(words))


def answer_text(context: str, tokens: TokenizedContext, first: int, last: int) -> str:
  """The context's characters behind pieces `first..last` (inclusive)."""
  return context[int(tokens.char_start[first]):int(tokens.char_end[last])]


def locate_answer(example: SquadExample, answer: Answer) -> tuple[int, int] | None:
  """The answer's (start, end) characters: at its offset, or found within `REPAIR_WINDOW`
  characters of it (closest first); None when the text is not there."""
  context, text = example.context, answer.text
  if not text.strip():
    return None
  if context.startswith(text, answer.start) and answer.start >= 0:
    return answer.start, answer.start + len(text)
  lo = max(0, answer.start - REPAIR_WINDOW)
  hits = [m.start() for m in re.finditer(re.escape(text),
                                         context[lo:answer.start + len(text) + REPAIR_WINDOW])]
  if not hits:
    return None
  best = min(hits, key=lambda h: abs(lo + h - answer.start))
  return lo + best, lo + best + len(text)


def piece_span(tokens: TokenizedContext, start_char: int, end_char: int
               ) -> tuple[int, int] | None:
  """The shortest run of pieces covering characters [start_char, end_char)."""
  if not len(tokens.ids):
    return None
  first = int(np.searchsorted(tokens.char_end, start_char, side="right"))
  last = int(np.searchsorted(tokens.char_start, end_char, side="left")) - 1
  if first >= len(tokens.ids) or last < first:
    return None
  return first, last


# ------------------------------------------------------------------------------ windows
def window_starts(num_pieces: int, window: int, doc_stride: int) -> list[int]:
  """Where the windows of a context begin: `doc_stride` apart, the last one ending at the end
  (the original's loop: a window that reaches the end is the last)."""
  starts, offset = [], 0
  while True:
    starts.append(offset)
    length = min(num_pieces - offset, window)
    if offset + length >= num_pieces:
      return starts
    offset += min(length, doc_stride)


def max_context_mask(starts: Sequence[int], num_pieces: int, window: int) -> np.ndarray:
  """(windows, pieces) bool: piece p is scored in the window where min(left, right context)
  + 0.01·length is largest (the first such window on ties), as `_check_is_max_context`."""
  best_score = np.full(num_pieces, -np.inf)
  best = np.full(num_pieces, -1)
  positions = np.arange(num_pieces)
  for w, start in enumerate(starts):
    length = min(window, num_pieces - start)
    inside = (positions >= start) & (positions < start + length)
    score = np.minimum(positions - start, start + length - 1 - positions) + 0.01 * length
    better = inside & (score > best_score)
    best_score = np.where(better, score, best_score)
    best = np.where(better, w, best)
  return best[None, :] == np.arange(len(starts))[:, None]


@dataclasses.dataclass
class Features:
  """Model inputs for every window, and what post-processing needs to read the outputs back.

  `arrays`: input_ids / input_mask / segment_ids (features, max_seq_length) int32, `weight`,
  and in training `start_positions` / `end_positions`. `example_index[f]` is the example of
  feature f; `context_piece[f, t]` the context piece at position t (-1 for question, specials
  and padding); `max_context[f, t]` whether position t is scored in this window.
  """
  arrays: dict[str, np.ndarray]
  example_index: np.ndarray
  context_piece: np.ndarray
  max_context: np.ndarray
  tokens: list[TokenizedContext]  # per example (shared between questions on one context)
  report: dict[str, Any]


def convert_examples_to_features(examples: Sequence[SquadExample], tokenizer,
                                 max_seq_length: int = 384, doc_stride: int = 128,
                                 max_query_length: int = 64, is_training: bool = False,
                                 progress: bool = True,
                                 max_unknown_rate: float = unknown_tokens.MAX_UNKNOWN_RATE
                                 ) -> Features:
  """Windows of every example, with training targets when `is_training`.

  When more than `max_unknown_rate` of the word pieces of the questions and contexts are [UNK],
  the vocabulary does not fit the text (`unknown_tokens.check_unknown_rate`): an error.
  """
  if doc_stride <= 0:
    raise ValueError(f"--doc_stride must be positive, not {doc_stride}.")
  questions = tokenizer.encode_batch([e.question for e in examples])
  cache: dict[str, TokenizedContext] = {}
  rows: dict[str, list] = collections.defaultdict(list)
  example_index, context_piece, max_context, tokens_per_example = [], [], [], []
  report = collections.Counter()
  mismatched, repaired, absent_gold = [], [], []
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  for i, example in enumerate(tqdm(examples, desc="SQuAD features", unit="question",
                                   disable=not progress or len(examples) < 1000, leave=False)):
    tokens = cache.get(example.context)
    if tokens is None:
      tokens = cache[example.context] = tokenize_context(tokenizer, example.context)
      report["contexts"] += 1
      report["context_words"] += tokens.num_words
      report["context_words_aligned"] += tokens.aligned_words
    tokens_per_example.append(tokens)
    query = list(questions[i][:max_query_length])
    if len(questions[i]) > max_query_length:
      report["questions_truncated"] += 1
    # The original: room left by this question (3 special tokens; RoBERTa's layout has 4).
    window = max_seq_length - len(query) - 2 - tokenizer.pair_separators
    if window <= 0:
      raise ValueError(f"{example.where}: the question's {len(query)} tokens leave no room for "
                       f"the context in --max_seq_length={max_seq_length}; lower "
                       f"--max_query_length (now {max_query_length}).")
    # Every gold answer, not only the one training reads: a damaged extra answer would reach
    # evaluation as a gold text unseen.
    first = 1 if is_training and not example.is_impossible else 0
    absent_gold.extend(example.qas_id for answer in example.answers[first:]
                       if locate_answer(example, answer) is None)
    span = None
    if is_training and not example.is_impossible:
      if not example.answers:
        raise ValueError(f"{example.where}: a training question needs an answer (or "
                         "is_impossible with --version_2_with_negative).")
      located = locate_answer(example, example.answers[0])
      if located is None:
        mismatched.append(example.qas_id)
        continue
      if (located[0], located[1]) != (example.answers[0].start,
                                      example.answers[0].start + len(example.answers[0].text)):
        repaired.append(example.qas_id)
      span = piece_span(tokens, *located)
      if span is None:
        mismatched.append(example.qas_id)
        continue
    n = len(tokens.ids)
    starts = window_starts(n, window, doc_stride) if n else [0]
    scored = max_context_mask(starts, n, window) if n else np.zeros((1, 0), bool)
    prefix = tokenizer.build_inputs(query, [])[:-1]  # [CLS] q [SEP], or <s> q </s></s>
    for w, start in enumerate(starts):
      length = min(window, n - start)
      row = prefix + tokens.ids[start:start + length].tolist() + [tokenizer.sep_id]
      ids = np.zeros(max_seq_length, np.int32)
      ids[:len(row)] = row
      mask = np.zeros(max_seq_length, np.int32)
      mask[:len(row)] = 1
      segments = np.zeros(max_seq_length, np.int32)
      segments[len(prefix):len(row)] = 1
      piece = np.full(max_seq_length, -1, np.int32)
      piece[len(prefix):len(prefix) + length] = np.arange(start, start + length)
      best = np.zeros(max_seq_length, bool)
      best[len(prefix):len(prefix) + length] = scored[w, start:start + length]
      rows["input_ids"].append(ids)
      rows["input_mask"].append(mask)
      rows["segment_ids"].append(segments)
      if is_training:
        if span is not None and start <= span[0] and span[1] < start + length:
          rows["start_positions"].append(span[0] - start + len(prefix))
          rows["end_positions"].append(span[1] - start + len(prefix))
          report["windows_with_answer"] += 1
        else:  # the whole answer is not in this window, or there is none: [CLS]
          rows["start_positions"].append(0)
          rows["end_positions"].append(0)
      example_index.append(i)
      context_piece.append(piece)
      max_context.append(best)
  unknown, pieces = unknown_tokens.count_unknown(tokenizer, questions)
  for tokens in cache.values():
    more_unknown, more_pieces = unknown_tokens.count_unknown(tokenizer, tokens.ids)
    unknown, pieces = unknown + more_unknown, pieces + more_pieces
  report["unknown_piece_fraction"] = round(unknown / pieces, 6) if pieces else 0.0
  unknown_tokens.check_unknown_rate(
      tokenizer, unknown, pieces, _source_of(examples), max_rate=max_unknown_rate,
      override="raise max_unknown_rate (1 turns the check off)")
  report["examples"] = len(examples)
  report["features"] = len(example_index)
  report["answers_not_found"] = len(mismatched)
  report["answers_repaired"] = len(repaired)
  if mismatched:
    logging.warning("%d of %d answers are not in their context at their answer_start (or "
                    "cover no word piece) and are left out of training, e.g. ids %s",
                    len(mismatched), len(examples), ", ".join(mismatched[:10]))
  if repaired:
    logging.warning("%d answers were found a few characters away from their answer_start and "
                    "are used there, e.g. ids %s", len(repaired), ", ".join(repaired[:10]))
  report["gold_answers_not_found"] = len(absent_gold)
  if absent_gold:
    logging.warning("%d gold answers%s are not in their context at their answer_start: the "
                    "file may be damaged, and scores count them as given; e.g. ids %s",
                    len(absent_gold), " (besides the one training reads)" if is_training else "",
                    ", ".join(dict.fromkeys(absent_gold[:10])))
  arrays = {k: np.stack(v) if k in ("input_ids", "input_mask", "segment_ids")
            else np.asarray(v, np.int32) for k, v in rows.items()}
  if not example_index:
    arrays = {k: np.zeros((0, max_seq_length), np.int32)
              for k in ("input_ids", "input_mask", "segment_ids")}
  arrays["weight"] = np.ones(len(example_index), np.float32)
  out_report = dict(report)
  out_report["answers_not_found_ids"] = mismatched[:100]
  out_report["answers_repaired_ids"] = repaired[:100]
  out_report["gold_answers_not_found_ids"] = absent_gold[:100]
  return Features(arrays, np.asarray(example_index, np.int64),
                  np.asarray(context_piece, np.int32).reshape(-1, max_seq_length),
                  np.asarray(max_context, bool).reshape(-1, max_seq_length),
                  tokens_per_example, out_report)


def _source_of(examples: Sequence[SquadExample]) -> str:
  """The file (or tfds split) the examples came from, for messages."""
  if not examples:
    return "SQuAD examples"
  where = examples[0].where
  return where.split(": data[")[0] if ": data[" in where else where.split(" id ")[0]


# ---------------------------------------------------------------------------- predictions
def _softmax(scores: Sequence[float]) -> list[float]:
  if not scores:
    return []
  top = max(scores)
  exps = [math.exp(s - top) for s in scores]
  total = sum(exps)
  return [e / total for e in exps]


def _best_indexes(logits: np.ndarray, n_best_size: int) -> np.ndarray:
  """The `n_best_size` highest positions, ties in position order (the original's stable sort)."""
  return np.argsort(-logits, kind="stable")[:n_best_size]


def postprocess(examples: Sequence[SquadExample], features: Features, start_logits: np.ndarray,
                end_logits: np.ndarray, n_best_size: int = 20, max_answer_length: int = 30,
                version_2_with_negative: bool = False, null_score_diff_threshold: float = 0.0
                ) -> tuple[dict[str, str], dict[str, list[dict]], dict[str, float]]:
  """`(predictions, nbest, null_odds)`: the three files of the original `write_predictions`.

  Per example, every window proposes its `n_best_size` best starts × ends; a pair counts when
  both are context tokens, the start is scored in this window (max context), end ≥ start and it
  spans at most `max_answer_length` pieces. Candidates are ranked by start + end logit and the
  first `n_best_size` distinct texts kept, with softmax probabilities. In v2.0 the null answer
  ([CLS], [CLS]) of the window with the lowest null score competes, and the prediction is ""
  when null score − best non-null score > `null_score_diff_threshold`; that difference per
  question is `null_odds`.
  """
  by_example: dict[int, list[int]] = collections.defaultdict(list)
  for f, e in enumerate(features.example_index.tolist()):
    by_example[e].append(f)
  predictions: dict[str, str] = {}
  nbest_json: dict[str, list[dict]] = {}
  null_odds: dict[str, float] = {}
  for e, example in enumerate(examples):
    tokens = features.tokens[e]
    candidates = []  # (score, start_logit, end_logit, first_piece, last_piece)
    null = None      # (score, start_logit, end_logit) of the window with the lowest null score
    for f in by_example.get(e, []):
      s_logits, e_logits = start_logits[f], end_logits[f]
      pieces, scored = features.context_piece[f], features.max_context[f]
      if version_2_with_negative:
        null_score = float(s_logits[0] + e_logits[0])
        if null is None or null_score < null[0]:
          null = (null_score, float(s_logits[0]), float(e_logits[0]))
      starts = _best_indexes(s_logits, n_best_size)
      ends = _best_indexes(e_logits, n_best_size)
      s_grid, e_grid = np.meshgrid(starts, ends, indexing="ij")
      valid = ((pieces[s_grid] >= 0) & (pieces[e_grid] >= 0) & scored[s_grid]
               & (e_grid >= s_grid) & (e_grid - s_grid + 1 <= max_answer_length))
      for s, t in zip(s_grid[valid].tolist(), e_grid[valid].tolist()):
        candidates.append((float(s_logits[s]) + float(e_logits[t]), float(s_logits[s]),
                           float(e_logits[t]), int(pieces[s]), int(pieces[t])))
    # The original's ranking: one stable sort of all candidates in (window, start, end) order,
    # the null answer last, by start + end logit.
    if null is not None:
      candidates.append((null[0], null[1], null[2], -1, -1))
    candidates.sort(key=lambda c: c[0], reverse=True)
    entries, seen = [], set()
    for _, s_logit, e_logit, first, last in candidates:
      if len(entries) >= n_best_size:
        break
      if first < 0:  # the null answer
        text = ""
      else:
        text = answer_text(example.context, tokens, first, last)
        if text in seen:
          continue
      seen.add(text)
      entries.append({"text": text, "start_logit": s_logit, "end_logit": e_logit})
    if version_2_with_negative and "" not in seen and null is not None:
      entries.append({"text": "", "start_logit": null[1], "end_logit": null[2]})
    if not entries:  # nothing valid at all (e.g. an empty context): the original's nonce answer
      entries.append({"text": "empty", "start_logit": 0.0, "end_logit": 0.0})
    probs = _softmax([x["start_logit"] + x["end_logit"] for x in entries])
    nbest_json[example.qas_id] = [
        {"text": x["text"], "probability": p, "start_logit": x["start_logit"],
         "end_logit": x["end_logit"]} for x, p in zip(entries, probs)]
    if not version_2_with_negative:
      predictions[example.qas_id] = entries[0]["text"]
      continue
    best_non_null = next((x for x in entries if x["text"]), None)
    if best_non_null is None:
      null_odds[example.qas_id] = math.inf
      predictions[example.qas_id] = ""
      continue
    diff = null[0] - best_non_null["start_logit"] - best_non_null["end_logit"]
    null_odds[example.qas_id] = diff
    predictions[example.qas_id] = "" if diff > null_score_diff_threshold else best_non_null["text"]
  return predictions, nbest_json, null_odds


def write_prediction_files(output_dir: str, predictions: Mapping[str, str],
                           nbest: Mapping[str, list[dict]], null_odds: Mapping[str, float] | None
                           ) -> dict[str, str]:
  """`predictions.json`, `nbest_predictions.json` and (v2.0) `null_odds.json`, each written
  whole or not at all, in the layout the official evaluation scripts read."""
  paths = {"predictions": file_io.join(output_dir, "predictions.json"),
           "nbest": file_io.join(output_dir, "nbest_predictions.json")}
  file_io.write_text_atomic(paths["predictions"], json.dumps(predictions, indent=4) + "\n")
  file_io.write_text_atomic(paths["nbest"], json.dumps(nbest, indent=4) + "\n")
  if null_odds is not None:
    paths["null_odds"] = file_io.join(output_dir, "null_odds.json")
    file_io.write_text_atomic(paths["null_odds"], json.dumps(
        {k: (v if math.isfinite(v) else 1e30) for k, v in null_odds.items()}, indent=4) + "\n")
  return paths
