"""Token tagging data: CoNLL-2003 named entities and any task kept in its layout.

BERT's paper fine-tunes on CoNLL-2003 by labelling every word on its FIRST word piece (the
other pieces of a word are neither scored nor predicted), with as much document context around
each sentence as the row holds. This module is the data side of that: reading the files
(`read_conll`, `read_split`) or a prepared tensorflow-datasets directory (`read_tfds`), turning
sentences into model rows (`convert_to_features`), and turning per-position predictions back
into one tag per word and a file that `conlleval` scores (`words_from_predictions`,
`write_predictions`).

The files. The released CoNLL-2003 files (`eng.train`, `eng.testa`, `eng.testb`; copies are
often named `train.txt`, `valid.txt`, `test.txt`) hold one word per line with four
space-separated columns (word, part of speech, chunk, entity tag), a blank line after each
sentence and a `-DOCSTART- -X- -X- O` line before each document (a Reuters article). Any file in
that layout reads the same way: the word is the first column, the tag the last (or
`label_column`), two or more columns separated by spaces or tabs. A file without any
-DOCSTART- line is ONE document: document context then reaches into the neighbouring sentences
of the file, which is what someone tagging a plain text expects.

Tag schemes. The released files are IOB1: a chunk starts with I-X unless it directly follows
a chunk of the same type X, and only then with B-X. Many redistributions (and tfds) are IOB2,
where every chunk starts with B-X. Both describe the same chunks, so sentences are always
converted to IOB2 on reading (the model's labels, `CONLL2003_LABELS`), the file's own tags are
kept beside them (`Sentence.original_labels`), and predictions are written back in the file's
scheme, so that conlleval compares like with like. IOBES / BILOU tags are refused: convert
them first.

Rows. Every word is encoded on its own (`tokenizer.word_prefix + word`: byte-level BPE needs
the space a word follows, as transformers' `add_prefix_space=True` does), so a word's pieces are
the same wherever it sits. A sentence that fits is one row; a longer one is cut into runs of
whole words, each its own row, so that no word is lost or predicted twice. Around the words a
row predicts ("owned" words), the rest of the row holds context pieces, split as evenly as
possible between the two sides: from the same sentence, or with `document_context` (the paper's
setting) from the neighbouring sentences of the same document. Context is never scored.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import unicodedata
from typing import Sequence

import numpy as np

from bert_jax import file_io
from bert_jax.tasks.tagging import iob
# The tag rules are iob.py's; these names are read from here too.
from bert_jax.tasks.tagging.iob import (  # noqa: F401
    DOCSTART, SCHEMES, detect_scheme, to_iob1, to_iob2)
from bert_jax.text import tokenization, unknown_tokens

# IOB2, in the order the model's outputs use (the order tfds's conll2003 and transformers'
# CoNLL-2003 datasets use too).
CONLL2003_LABELS: tuple[str, ...] = (
    "O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")

_COLUMNS_RE = re.compile(r"[ \t]+")

# Where `read_split` looks, in this order, for each split: the released names first.
_SPLIT_STEMS = {
    "train": ("train",),
    "dev": ("valid", "dev", "validation"),
    "test": ("test",),
}
_RELEASED_NAMES = {"train": "eng.train", "dev": "eng.testa", "test": "eng.testb"}
_EXTENSIONS = (".txt", ".conll", ".iob2", ".bio")


@dataclasses.dataclass(frozen=True)
class Sentence:
  """One sentence: its words, their IOB2 tags, and where it came from.

  `document` is the index of its document within its source (documents are separated by
  -DOCSTART- lines; a file without any is one document). `source` is "path:line" of its first
  word, for messages; sentences of one file share the part before the last ":". `labels` is
  None for unlabelled text; `original_labels` are the tags as the file wrote them (IOB1 or
  IOB2), so that predictions can be written back in the file's scheme.
  """
  words: tuple[str, ...]
  labels: tuple[str, ...] | None
  document: int
  source: str
  original_labels: tuple[str, ...] | None = None


# ---------------------------------------------------------------------------------------------
# Tags and schemes


def label_list_from(items: Sequence[str] | str) -> tuple[str, ...]:
  """A label list from `--label_list`: full IOB2 tags kept in order, or bare entity types.

  * full tags ("O,B-PER,I-PER,B-LOC,I-LOC"): kept in the order given; "O" must be there, and
    every I-X needs its B-X (a model that cannot begin a chunk cannot predict one);
  * bare types ("PER,LOC"): expanded to ("O", "B-PER", "I-PER", "B-LOC", "I-LOC"); an "O" among
    them is allowed and ignored.
  A string is split at commas. Duplicates, a mix of the two forms and IOBES tags are refused.
  """
  if isinstance(items, str):
    items = items.split(",")
  names = [str(item).strip() for item in items if str(item).strip()]
  if not names:
    raise ValueError("label_list is empty: give the tags (O,B-PER,I-PER,...) or the entity "
                     "types (PER,LOC,...).")
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(f"label_list {','.join(names)}: {', '.join(duplicates)} given twice.")
  for name in names:
    if iob.IOBES_RE.fullmatch(name):
      raise ValueError(f"label_list: {iob.bad_tag_message(name)}")
    if re.search(r"\s", name):
      raise ValueError(f"label_list: {name!r} holds a space.")
  is_tag = [name == "O" or iob.TAG_RE.fullmatch(name) is not None for name in names]
  if all(is_tag) and any(name != "O" for name in names):
    if "O" not in names:
      raise ValueError(f"label_list {','.join(names)}: \"O\" (outside any entity) is missing; "
                       "every tag set needs it.")
    missing = [n for n in names if n.startswith("I-") and "B-" + n[2:] not in names]
    if missing:
      raise ValueError(f"label_list {','.join(names)}: {', '.join(missing)} without "
                       f"{', '.join('B-' + n[2:] for n in missing)}; IOB2 begins every chunk with "
                       "B-, so list both (or give bare types such as PER,LOC).")
    return tuple(names)
  types = [name for name in names if name != "O"]
  if not types:
    raise ValueError("label_list holds only \"O\": give at least one entity type.")
  if any(iob.TAG_RE.fullmatch(name) for name in types):
    raise ValueError(f"label_list {','.join(names)}: mixes full tags (B-X, I-X) and bare types; "
                     "give either all tags (O,B-PER,I-PER) or all types (PER,LOC).")
  return ("O",) + tuple(tag for kind in types for tag in (f"B-{kind}", f"I-{kind}"))


# ---------------------------------------------------------------------------------------------
# Reading


def _strip_bom(text: str) -> str:
  return text[1:] if text.startswith("\ufeff") else text


@dataclasses.dataclass(frozen=True)
class ColumnSentence:
  """One sentence of a CoNLL-layout file as written: its words, the values of the label column
  (None when read without one), each word's line number and its document's index."""
  words: tuple[str, ...]
  labels: tuple[str, ...] | None
  lines: tuple[int, ...]
  document: int


# CoNLL-U (Universal Dependencies): ten tab-separated columns per word.
CONLLU_COLUMNS = ("ID", "FORM", "LEMMA", "UPOS", "XPOS", "FEATS", "HEAD", "DEPREL", "DEPS",
                  "MISC")


def is_conllu(path: str) -> bool:
  """Whether `path` is read as CoNLL-U: by its name (`.conllu`), as Universal Dependencies
  releases its files."""
  return path.lower().endswith(".conllu")


def read_columns(path: str, label_column: int | None,
                 conllu: bool = False) -> list[ColumnSentence]:
  """The sentences of a CoNLL-layout file, each word with the value of its `label_column`
  (counted from 0, the word's own column, or from the end: -1 is the last; None: no labels,
  any columns after the word ignored). The one reader of the layout: the tagging task checks
  the values as tags (`read_conll`), layer probes take any labels (`analysis/probe.py`).

  The layout: one word per line, its columns separated by spaces or tabs, the word first; a
  blank line after each sentence; `-DOCSTART-` lines begin a new document. Every word line must
  have the columns of the first one (a line with another number would put another field in the
  label's place).

  With `conllu`, Universal Dependencies' CoNLL-U: ten tab-separated columns (`CONLLU_COLUMNS`;
  the word is FORM, column 1, which may hold spaces; `label_column` counts the ten, e.g. 3 for
  UPOS), `#` comment lines (`# newdoc` begins a document), and the lines of multiword tokens
  (ID `1-2`) and empty nodes (ID `1.1`) skipped, so that the words are the syntactic ones.

  Errors are ValueErrors naming "path:line" and what was expected.
  """
  data = file_io.read_bytes(path)
  try:
    text = _strip_bom(data.decode("utf-8"))
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise ValueError(f"{path}:{line}: bytes that are not UTF-8 ({e.reason}); CoNLL files are "
                     "read as UTF-8 (re-encode a Latin-1 file first, e.g. with iconv).") from None
  sentences: list[ColumnSentence] = []
  words: list[str] = []
  labels: list[str] = []
  line_numbers: list[int] = []
  document = 0
  document_has_words = False
  num_columns = first_line = column = None
  word_column = 1 if conllu else 0

  def end_sentence():
    nonlocal words, labels, line_numbers
    if words:
      sentences.append(ColumnSentence(tuple(words), tuple(labels) if column is not None
                                      else None, tuple(line_numbers), document))
    words, labels, line_numbers = [], [], []

  def new_document():
    nonlocal document, document_has_words
    end_sentence()
    if document_has_words:
      document += 1
      document_has_words = False

  if conllu and label_column is not None:
    if not -len(CONLLU_COLUMNS) <= label_column < len(CONLLU_COLUMNS):
      raise ValueError(f"{path}: label_column={label_column} is out of range: CoNLL-U has "
                       f"{len(CONLLU_COLUMNS)} columns ({' '.join(CONLLU_COLUMNS)}, counted "
                       "from 0; UPOS is 3).")
    column = label_column % len(CONLLU_COLUMNS)
    if column in (0, 1):
      raise ValueError(f"{path}: label_column={label_column} is CoNLL-U's "
                       f"{CONLLU_COLUMNS[column]}, not a label (UPOS is 3, XPOS 4, DEPREL 7).")
  for line_number, line in enumerate(text.split("\n"), start=1):
    stripped = line.strip(" \t\r")
    if not stripped:
      end_sentence()
      continue
    where = f"{path}:{line_number}"
    if conllu:
      if stripped.startswith("#"):
        if stripped.startswith("# newdoc"):
          new_document()
        continue
      fields = line.rstrip("\r").split("\t")
      if len(fields) != len(CONLLU_COLUMNS):
        raise ValueError(f"{where}: {len(fields)} tab-separated columns; CoNLL-U has "
                         f"{len(CONLLU_COLUMNS)} ({' '.join(CONLLU_COLUMNS)}).")
      if "-" in fields[0] or "." in fields[0]:  # a multiword token's range, an empty node
        continue
    else:
      fields = _COLUMNS_RE.split(stripped)
      if fields[0] == DOCSTART:
        new_document()
        continue
      if num_columns is None:
        num_columns, first_line = len(fields), line_number
        if label_column is not None:
          if num_columns < 2:
            raise ValueError(f"{where}: one column ({fields[0]!r}); expected the word and its "
                             "labels separated by spaces or tabs (CoNLL-2003: word, POS, chunk, "
                             "tag). For an unlabelled file pass label_column=None.")
          if not -num_columns <= label_column < num_columns:
            raise ValueError(f"{where}: label_column={label_column} is out of range: the line "
                             f"has {num_columns} columns (the word, then its labels; columns "
                             "count from 0, or from -1 for the last).")
          column = label_column % num_columns
          if column == 0:
            raise ValueError(f"{where}: label_column={label_column} is the word's own column; "
                             "the label is in another (e.g. 1 for the part of speech of "
                             "CoNLL-2003, -1 for the last column).")
      if label_column is not None and len(fields) != num_columns:
        if len(fields) == 1:
          raise ValueError(f"{where}: one column ({fields[0]!r}); expected {num_columns} "
                           f"columns (the word, then its labels), as on the first word line "
                           f"({first_line}).")
        raise ValueError(f"{where}: {len(fields)} columns; expected {num_columns}, as on the "
                         f"first word line ({first_line}).")
    words.append(fields[word_column])
    line_numbers.append(line_number)
    document_has_words = True
    if column is not None:
      labels.append(fields[column])
  end_sentence()
  if not sentences:
    raise ValueError(f"{path}: no sentences (expected one word per line, its labels in "
                     "columns, a blank line after each sentence).")
  return sentences


def read_conll(path: str, *, scheme: str = "auto", label_column: int | None = -1,
               label_list: Sequence[str] | None = None) -> list[Sentence]:
  """The sentences of a CoNLL-layout file (see the module docstring), tags converted to IOB2.

  `scheme`: "auto" (IOB1 when some chunk begins with I-, else IOB2), "iob1" or "iob2" (then a
  chunk that begins with I- is an error: the file looks like IOB1). `label_column`: the column
  of the tag (-1: the last); None reads an unlabelled file (the word is the first column, any
  others are ignored, `labels` is None). `label_list`: when given, every tag (in IOB2) must be
  one of them. Errors are ValueErrors naming "path:line" and what was expected.
  """
  if scheme not in ("auto",) + SCHEMES:
    raise ValueError(f"scheme={scheme!r}: expected auto, iob1 or iob2.")
  known = set(label_list) if label_list is not None else None
  read = read_columns(path, label_column)
  for sentence in read:
    for tag, line in zip(sentence.labels or (), sentence.lines):
      try:
        iob.split_tag(tag)
      except ValueError as e:
        raise ValueError(f"{path}:{line}: {e}") from None
  if label_column is None:
    return [Sentence(r.words, None, r.document, f"{path}:{r.lines[0]}", None) for r in read]
  if scheme == "iob2":
    for r in read:
      position = iob.chunk_initial_i(list(r.labels))
      if position is not None:
        raise ValueError(
            f"{path}:{r.lines[position]}: the tag {r.labels[position]!r} begins a chunk "
            f"(it does not follow a tag of its type): with scheme=iob2 every chunk begins with "
            f"B-. The file looks like IOB1 (as the released CoNLL-2003 files are); read it with "
            f"scheme=iob1 or auto.")
  sentences = []
  for r in read:
    iob2 = to_iob2(list(r.labels))
    if known is not None:
      for position, tag in enumerate(iob2):
        if tag not in known:
          written = f" (written {r.labels[position]!r})" if r.labels[position] != tag else ""
          raise ValueError(f"{path}:{r.lines[position]}: the tag {tag!r}{written} is not in the "
                           f"label list; known labels: {', '.join(label_list)}.")
    sentences.append(Sentence(r.words, tuple(iob2), r.document, f"{path}:{r.lines[0]}",
                              r.labels))
  return sentences


def read_split(data_dir: str, split: str, **kwargs) -> tuple[list[Sentence], str]:
  """(sentences, path) of a split ("train", "dev", "test") of a CoNLL-layout directory.

  Looks for the released names (eng.train, eng.testa, eng.testb), then train / valid, dev,
  validation / test with the extensions .txt, .conll, .iob2, .bio; `kwargs` go to `read_conll`.
  """
  if split not in _SPLIT_STEMS:
    raise ValueError(f"split={split!r}: expected one of {', '.join(_SPLIT_STEMS)}.")
  names = [_RELEASED_NAMES[split]] + [stem + ext for stem in _SPLIT_STEMS[split]
                                      for ext in _EXTENSIONS]
  for name in names:
    path = file_io.join(data_dir, name)
    if file_io.exists(path):
      return read_conll(path, **kwargs), path
  raise FileNotFoundError(f"{data_dir}: no {split} file; looked for {', '.join(names)}.")


def read_tfds(data_dir: str | None, split: str) -> list[Sentence]:
  """The sentences of a split of tensorflow-datasets' `conll2003`, prepared under `data_dir`;
  never downloads.

  Splits: "train", "dev" (also "validation"), "test". Tags are mapped by NAME from tfds's
  ClassLabel to IOB2 (so a different label order there would still be read right), and kept as
  tfds names them in `original_labels`.

  Documents: tfds examples carry no document id, and tfds stores a split's examples in a
  shuffled order (by a hash of each example's key), so the sentences that come out next to each
  other are not neighbours in the news text. Each sentence is therefore its own document:
  document context from tfds data would be context from random other sentences. Use the files
  (`read_split`) for the paper's document context.
  """
  tfds_split = {"dev": "dev", "validation": "dev", "valid": "dev"}.get(split, split)
  if tfds_split not in ("train", "dev", "test"):
    raise ValueError(f"split={split!r}: expected train, dev or test.")
  tfds = file_io.tensorflow_datasets()
  where = data_dir or "the default tfds data_dir"
  try:
    builder = tfds.builder("conll2003", data_dir=data_dir)
    dataset = builder.as_dataset(split=tfds_split, shuffle_files=False)
  except (AssertionError, FileNotFoundError) as e:  # tfds's ways of saying "not prepared here"
    raise FileNotFoundError(
        f"conll2003 is not prepared under {where} ({e}). Prepare it once on a machine with "
        "internet access: `tfds build conll2003 --data_dir=DIR`, then pass that directory; or "
        "give the CoNLL files themselves.") from e
  names = builder.info.features["ner"].feature.names
  sentences = []
  for index, record in enumerate(tfds.as_numpy(dataset)):
    words = tuple(w.decode("utf-8") if isinstance(w, bytes) else str(w)
                  for w in record["tokens"])
    if not words:
      continue
    original = tuple(names[int(i)] for i in record["ner"])
    source = f"tfds conll2003/{tfds_split}:{index}"
    try:
      labels = tuple(to_iob2(original))
    except ValueError as e:
      raise ValueError(f"{source}: {e}") from None
    sentences.append(Sentence(words, labels, len(sentences), source, original))
  if not sentences:
    raise ValueError(f"conll2003 {tfds_split} under {where}: no sentences.")
  return sentences


# Abbreviations whose final "." belongs to the word (CoNLL-2003 writes "Mr." and "Corp." as one
# token), beside initials and dotted acronyms ("J.", "U.S.", "e.g.") found by their shape.
_ABBREVIATIONS = frozenset("""
    mr mrs ms dr prof st jr sr rev gen gov sen rep lt col sgt capt cmdr adm maj messrs mt ft
    inc corp ltd co bros plc llc dept univ assn
    jan feb mar apr jun jul aug sep sept oct nov dec
    no nos vs etc approx est vol pp fig
    """.split())
_INITIALS_RE = re.compile(r"(?:[^\W\d_]\.)+")
_CLITIC_RE = re.compile(r"(.+?)('[sS]|[nN]'[tT])")
_CLITICS = frozenset({"'s", "n't"})


def _is_punctuation(char: str) -> bool:
  return unicodedata.category(char).startswith("P")


def _is_abbreviation(word: str) -> bool:
  """Whether `word` (ending in ".") is an abbreviation that keeps its final period."""
  return bool(_INITIALS_RE.fullmatch(word)) or word[:-1].lower() in _ABBREVIATIONS


def _split_token(token: str) -> list[str]:
  if all(_is_punctuation(c) for c in token) or token.lower() in _CLITICS:
    return [token]  # "...", "--", "?!", and text already cut ("'s"): one word
  leading = []
  while _is_punctuation(token[0]):
    leading.append(token[0])
    token = token[1:]
  trailing: list[str] = []
  while _is_punctuation(token[-1]):
    if token.endswith("...") and len(token) > 3:
      trailing.insert(0, "...")
      token = token[:-3]
      continue
    if token[-1] == "." and _is_abbreviation(token):
      break
    trailing.insert(0, token[-1])
    token = token[:-1]
  clitic = _CLITIC_RE.fullmatch(token)
  core = [clitic.group(1), clitic.group(2)] if clitic else [token]
  return leading + core + trailing


def split_words(text: str) -> list[str]:
  """Raw text → words as CoNLL-2003 cuts them, for tagging text that is not in CoNLL layout.

  Split at whitespace; then punctuation at either end of a word is a word of its own ("(Reuters"
  → "(", "Reuters"; "said," → "said", ","), except the final period of an abbreviation ("Mr.",
  "Corp.", initials and dotted acronyms such as "J." and "U.S."); inside a word it stays
  ("1,000", "e-mail", "U.S."). A trailing "'s" or "n't" is split off as the Penn Treebank
  (and CoNLL-2003) do ("Germany's" → "Germany", "'s"). A run of punctuation alone ("...",
  "--") is one word.
  """
  words: list[str] = []
  for token in text.split():
    words.extend(_split_token(token))
  return words


# ---------------------------------------------------------------------------------------------
# Features


@dataclasses.dataclass
class TaggingFeatures:
  """Model rows of tagged sentences, and what maps their positions back to words.

  `arrays`: "input_ids", "input_mask", "segment_ids", "label_ids" (n, S) int32 ("label_ids" 0
  where not scored), "label_weights" (n, S) float32 (1 at the first piece of each word the row
  owns, for labelled sentences), "weight" (n,) float32 ones. `sentence_index[i]` is the sentence
  whose words row i predicts; `word_index[i, p]` the word (within that sentence) whose first
  piece sits at position p and which row i owns, -1 elsewhere. `num_words` per sentence.
  `report`: counts (sentences, words, windows, sentences_split, words_truncated_pieces,
  empty_words, pieces, unknown_pieces).
  """
  arrays: dict[str, np.ndarray]
  sentence_index: np.ndarray
  word_index: np.ndarray
  num_words: list[int]
  report: dict


def _document_key(sentence: Sentence) -> tuple[str, int]:
  source = sentence.source.rsplit(":", 1)[0] if ":" in sentence.source else sentence.source
  return source, sentence.document


def _context_units(sentences: Sequence[Sentence], document_context: bool) -> list[list[int]]:
  """Runs of sentence indices whose pieces form one context stream: each sentence alone, or with
  `document_context` each maximal run of consecutive sentences of the same document."""
  if not document_context:
    return [[i] for i in range(len(sentences))]
  units: list[list[int]] = []
  previous = None
  for i, sentence in enumerate(sentences):
    key = _document_key(sentence)
    if units and key == previous:
      units[-1].append(i)
    else:
      units.append([i])
    previous = key
  return units


def _chunks(lengths: np.ndarray, budget: int, target: int) -> list[tuple[int, int]]:
  """Consecutive runs [a, b) of whole words: the whole sentence when its pieces fit in `budget`,
  else runs of at most `target` pieces (a word longer than that alone; no word exceeds
  `budget`)."""
  if int(lengths.sum()) <= budget:
    return [(0, len(lengths))]
  runs, start, size = [], 0, 0
  for w, length in enumerate(lengths.tolist()):
    if w > start and size + length > target:
      runs.append((start, w))
      start, size = w, 0
    size += length
  runs.append((start, len(lengths)))
  return runs


def _split_context(room: int, left: int, right: int) -> tuple[int, int]:
  """Pieces of context to take on each side: `room` split evenly, a side short of pieces giving
  its share to the other."""
  take_left = min(left, max(room // 2, room - right))
  return take_left, min(right, room - take_left)


def convert_to_features(sentences: Sequence[Sentence], tokenizer: tokenization.Tokenizer,
                        label_list: Sequence[str], max_seq_length: int, *,
                        document_context: bool = False, progress: bool = True,
                        max_target_pieces: int | None = None,
                        max_unknown_rate: float = unknown_tokens.MAX_UNKNOWN_RATE
                        ) -> TaggingFeatures:
  """Sentences → model rows (see the module docstring and `TaggingFeatures`).

  Each row is `tokenizer.build_inputs(pieces)` ([CLS] ... [SEP], or RoBERTa's <s> ... </s>),
  padded with 0 to `max_seq_length`, segment ids 0. A word that encodes to no piece at all
  (only control or format characters) is given one [UNK] so that it still gets a tag; a word
  with more pieces than a row holds keeps its first ones (both counted in the report).

  A sentence whose pieces fit in `max_seq_length - 2` is one row; a longer one is cut into runs
  of whole words of at most `max_target_pieces` pieces (default: half the row, so that every row
  keeps context on both sides of the words it predicts). Context fills the rest of each row,
  evenly on both sides: the sentence's other words, or with `document_context` also the
  neighbouring sentences of its document (consecutive sentences in `sentences` with the same
  source file and `document`; never across a -DOCSTART-).

  A vocabulary that turns more than `max_unknown_rate` of the pieces into [UNK] is an error
  (`unknown_tokens.check_unknown_rate`).
  """
  budget = max_seq_length - 2
  if budget < 1:
    raise ValueError(f"max_seq_length={max_seq_length}: a row needs room for [CLS], [SEP] and "
                     "at least one piece.")
  target = budget // 2 if max_target_pieces is None else min(max_target_pieces, budget)
  target = max(target, 1)
  label_index = {tag: i for i, tag in enumerate(label_list)}
  if len(label_index) != len(label_list):
    raise ValueError(f"label_list {', '.join(label_list)} names a label twice.")
  report = collections.Counter(sentences=len(sentences))

  # Every distinct word encoded once, on its own; the [UNK] rate counts every occurrence.
  word_ids: dict[str, int] = {}
  occurrences: list[int] = []
  for sentence in sentences:
    for word in sentence.words:
      index = word_ids.setdefault(word, len(word_ids))
      if index == len(occurrences):
        occurrences.append(0)
      occurrences[index] += 1
  distinct = list(word_ids)
  encoded = (tokenizer.encode_batch([tokenizer.word_prefix + w for w in distinct])
             if distinct else [])
  per_word = np.asarray([unknown_tokens.count_unknown(tokenizer, [ids]) for ids in encoded],
                        np.int64).reshape(-1, 2)
  unknown, pieces = (int(v) for v in np.asarray(occurrences, np.int64) @ per_word)
  report["pieces"] = pieces
  report["unknown_pieces"] = unknown
  unknown_tokens.check_unknown_rate(
      tokenizer, unknown, pieces, _sources_of(sentences), max_rate=max_unknown_rate,
      override="raise max_unknown_rate (1 turns the check off)")
  word_pieces = [np.asarray(ids[:budget] if ids else [tokenizer.unk_id], np.int32)
                 for ids in encoded]
  encoded_lengths = np.asarray([len(ids) for ids in encoded], np.int64)
  report["empty_words"] = int(np.asarray(occurrences, np.int64) @ (encoded_lengths == 0))
  report["words_truncated_pieces"] = int(
      np.asarray(occurrences, np.int64) @ (encoded_lengths > budget))

  rows_ids: list[np.ndarray] = []
  rows_mask: list[np.ndarray] = []
  rows_labels: list[np.ndarray] = []
  rows_weights: list[np.ndarray] = []
  rows_words: list[np.ndarray] = []
  sentence_index: list[int] = []
  num_words = [len(s.words) for s in sentences]

  units = _context_units(sentences, document_context)
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  bar = tqdm(total=len(sentences), desc="tagging features", unit="sentence",
             disable=not progress or len(sentences) < 1000, leave=False)
  for unit in units:
    # The unit's pieces back to back, and where each of its sentences' words begin in them.
    unit_pieces, word_starts, lengths_of = [], [], []
    offset = 0
    for s in unit:
      sentence = sentences[s]
      if sentence.labels is not None and len(sentence.labels) != len(sentence.words):
        raise ValueError(f"{sentence.source}: {len(sentence.words)} words but "
                         f"{len(sentence.labels)} labels.")
      pieces_of = [word_pieces[word_ids[w]] for w in sentence.words]
      lengths = np.fromiter((len(p) for p in pieces_of), np.int64, count=len(pieces_of))
      starts = offset + np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
      unit_pieces.extend(pieces_of)
      word_starts.append(starts)
      lengths_of.append(lengths)
      offset = int(starts[-1])
    stream = np.concatenate(unit_pieces) if unit_pieces else np.zeros(0, np.int32)

    for s, starts, lengths in zip(unit, word_starts, lengths_of):
      sentence = sentences[s]
      report["words"] += len(sentence.words)
      if not sentence.words:
        bar.update(1)
        continue
      if sentence.labels is not None:
        try:
          label_ids = np.asarray([label_index[t] for t in sentence.labels], np.int32)
        except KeyError as e:
          raise ValueError(f"{sentence.source}: the tag {e.args[0]!r} is not in the label list; "
                           f"known labels: {', '.join(label_list)}.") from None
      runs = _chunks(lengths, budget, target)
      if len(runs) > 1:
        report["sentences_split"] += 1
      for a, b in runs:
        first, last = int(starts[a]), int(starts[b])
        take_left, take_right = _split_context(budget - (last - first), first,
                                               len(stream) - last)
        pieces_row = stream[first - take_left:last + take_right]
        row = np.zeros(max_seq_length, np.int32)
        inputs = tokenizer.build_inputs(pieces_row.tolist())
        assert len(inputs) <= max_seq_length, (len(inputs), max_seq_length)
        row[:len(inputs)] = inputs
        positions = 1 + take_left + (starts[a:b] - first)
        words_row = np.full(max_seq_length, -1, np.int32)
        words_row[positions] = np.arange(a, b)
        labels_row = np.zeros(max_seq_length, np.int32)
        weights_row = np.zeros(max_seq_length, np.float32)
        if sentence.labels is not None:
          labels_row[positions] = label_ids[a:b]
          weights_row[positions] = 1.0
        mask = np.zeros(max_seq_length, np.int32)
        mask[:len(inputs)] = 1
        rows_ids.append(row)
        rows_mask.append(mask)
        rows_words.append(words_row)
        rows_labels.append(labels_row)
        rows_weights.append(weights_row)
        sentence_index.append(s)
      bar.update(1)
  bar.close()

  n = len(sentence_index)
  shape = (n, max_seq_length)
  arrays = {
      "input_ids": np.stack(rows_ids) if n else np.zeros(shape, np.int32),
      "input_mask": np.stack(rows_mask) if n else np.zeros(shape, np.int32),
      "segment_ids": np.zeros(shape, np.int32),
      "label_ids": np.stack(rows_labels) if n else np.zeros(shape, np.int32),
      "label_weights": np.stack(rows_weights) if n else np.zeros(shape, np.float32),
      "weight": np.ones(n, np.float32),
  }
  report["windows"] = n
  for key in ("words", "sentences_split", "words_truncated_pieces", "empty_words"):
    report.setdefault(key, 0)
  return TaggingFeatures(arrays=arrays, sentence_index=np.asarray(sentence_index, np.int64),
                         word_index=np.stack(rows_words) if n else np.full(shape, -1, np.int32),
                         num_words=num_words, report=dict(report))


def _sources_of(sentences: Sequence[Sentence]) -> str:
  files = list(dict.fromkeys(_document_key(s)[0] for s in sentences))
  return ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "") or (
      "tagging sentences")


def words_from_predictions(features: TaggingFeatures, predicted: np.ndarray,
                           label_list: Sequence[str]) -> list[list[str]]:
  """Per sentence, one IOB2 tag per word, from per-position label indices.

  `predicted`: (n, S) label indices (the argmax of the per-position logits), or (n, S, labels)
  logits. Each word's tag is the one predicted at its first piece in the row that owns it; every
  word gets exactly one (asserted). The tags are made valid IOB2 (`to_iob2`: an I-X that begins
  a chunk becomes B-X), which names the chunks conlleval would read from them.
  """
  predicted = np.asarray(predicted)
  if predicted.ndim == 3:
    predicted = predicted.argmax(-1)
  if predicted.shape != features.word_index.shape:
    raise ValueError(f"predictions of shape {predicted.shape}; the features have rows of shape "
                     f"{features.word_index.shape}.")
  tags: list[list[str | None]] = [[None] * n for n in features.num_words]
  rows, positions = np.nonzero(features.word_index >= 0)
  words = features.word_index[rows, positions]
  for row, word, label in zip(rows.tolist(), words.tolist(),
                              predicted[rows, positions].tolist()):
    sentence = int(features.sentence_index[row])
    assert tags[sentence][word] is None, f"sentence {sentence} word {word} predicted twice"
    tags[sentence][word] = label_list[label]
  for sentence, sentence_tags in enumerate(tags):
    assert all(t is not None for t in sentence_tags), f"sentence {sentence}: a word unpredicted"
  return [to_iob2(t) for t in tags]


def write_predictions(path: str, sentences: Sequence[Sentence],
                      predicted_tags: Sequence[Sequence[str]], *, scheme: str = "iob2") -> None:
  """Writes "word gold predicted" lines, the layout conlleval reads.

  A blank line after each sentence, and a "-DOCSTART- O O" line (then a blank line) between
  documents. Gold is the file's own tag (`original_labels`), "O" for unlabelled sentences; the
  predicted tags are written in `scheme` ("iob1" or "iob2": give the file's own, e.g.
  `detect_scheme(s.original_labels for s in sentences)`, so both columns share it). Written
  under a temporary name and renamed when complete.
  """
  if scheme not in SCHEMES:
    raise ValueError(f"scheme={scheme!r}: expected iob1 or iob2.")
  if len(predicted_tags) != len(sentences):
    raise ValueError(f"{len(predicted_tags)} predicted tag lists for {len(sentences)} sentences.")
  convert = to_iob1 if scheme == "iob1" else to_iob2
  lines: list[str] = []
  previous = None
  for sentence, tags in zip(sentences, predicted_tags):
    if len(tags) != len(sentence.words):
      raise ValueError(f"{sentence.source}: {len(sentence.words)} words but {len(tags)} "
                       "predicted tags.")
    key = _document_key(sentence)
    if previous is not None and key != previous:
      lines += [f"{DOCSTART} O O", ""]
    previous = key
    gold = sentence.original_labels or sentence.labels or ("O",) * len(sentence.words)
    for word, gold_tag, tag in zip(sentence.words, gold, convert(tags)):
      if not word or re.search(r"\s", word):
        raise ValueError(f"{sentence.source}: the word {word!r} is empty or holds whitespace, "
                         "which a CoNLL line cannot hold.")
      lines.append(f"{word} {gold_tag} {tag}")
    lines.append("")
  file_io.write_text_atomic(path, "\n".join(lines) + ("\n" if lines else ""))
