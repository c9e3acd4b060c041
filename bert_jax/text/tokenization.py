"""Tokenizers behind one interface: WordPiece over a BERT `vocab.txt`, SentencePiece (BERT's
and ALBERT's layouts), and RoBERTa's byte-level BPE (`vocab.json` + `merges.txt`).

Everything downstream (pre-training data, the input pipeline's dynamic masking, fine-tuning
features) needs the same few things from a tokenizer: text → ids, the ids of the five special
tokens, and which ids begin a word (whole-word masking groups a word's pieces). `Tokenizer`
is that interface; `load_tokenizer` picks the kind from the files the user has.

WordPiece reproduces the original BERT tokenizer: text cleanup (NUL, U+FFFD and control
characters dropped, any whitespace → space), CJK ideographs split into single characters,
punctuation split off, lower-casing with accent stripping for uncased vocabularies, greedy
longest-match-first pieces, and a word longer than `max_input_chars_per_word` (200, the
original's limit) becomes [UNK]. Two backends give the same ids on real text:

* `"rust"` — the `tokenizers` library (the engine of transformers' `BertTokenizer`), ~50×
  faster; the default when that library is installed.
* `"python"` — a plain re-statement of the original algorithm, used when `tokenizers` is
  missing and as the readable reference the tests hold the fast one to.

Either way, lines of printable ASCII (most English text) take a shortcut that gives the same
ids, since on them the basic tokenizer reduces to "runs of letters and digits, and every other
non-space character alone": one text at a time, a regex and a word cache; many lines at once
(`encode_batch`, `encode_lines`: what bulk users like data preparation call), array operations
over the bytes of a whole block of lines and a numpy hash table of the words seen before, with
no Python work per word — several times faster than the Rust backend.

They differ only where the original and transformers differ, on text unlike any real corpus:
private-use and unassigned code points (the original keeps them as [UNK]-bound words, the Rust
cleanup drops them) and the Greek final sigma (Python's `str.lower` is context-aware).
transformers' `BertTokenizer` caps words at 100 characters instead of 200; pass
`max_input_chars_per_word=100` to match it on words of 101–200 characters.

The five special tokens are known by role (pad, unk, cls, sep, mask), since the families name
them differently: BERT's [PAD] [UNK] [CLS] [SEP] [MASK], RoBERTa's <pad> <unk> <s> </s> <mask>,
ALBERT's <pad> <unk> [CLS] [SEP] [MASK]. Their strings, where they occur literally in text
("[MASK]", "<mask>"), are single tokens by default, as in transformers;
`split_special_tokens=True` treats them as ordinary text, as the original did. Pre-training data
uses the latter so that corpus text can never forge a [SEP] or a [MASK] inside an instance.

A damaged `vocab.txt` is refused at load, by file and line (`load_vocab`). One cut short looks
like any other, so its effect is checked where text is tokenized in bulk: `count_unknown` and
`check_unknown_rate` (data_prep's shards, fine-tuning features) stop a run whose word pieces are
mostly [UNK], naming the vocabulary and the rate.
"""

from __future__ import annotations

import abc
import itertools
import os
import re
import unicodedata
from typing import Iterable, Sequence

import numpy as np
from absl import logging

from bert_jax import file_io
from bert_jax.text import bpe

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
# SentencePiece's mark for "a space came before this piece", i.e. the piece starts a word.
SPM_WORD_START = "\u2581"


def plain_piece_text(piece: str) -> str:
  """A WordPiece or SentencePiece piece without its word mark ("##" before a continuation, "▁"
  before a word start)."""
  if piece.startswith("##"):
    return piece[2:]
  return piece.replace(SPM_WORD_START, "")


class Tokenizer(abc.ABC):
  """Text → ids, the special ids, and the word-start table used by whole-word masking."""

  vocab_size: int
  pad_id: int
  unk_id: int
  cls_id: int
  sep_id: int
  mask_id: int
  # word_start_table[id] is True where a token with that id begins a new word.
  word_start_table: np.ndarray
  # Separators between the two segments of a pair: one in BERT's [CLS] A [SEP] B [SEP].
  pair_separators = 1
  # Which family's tokenizer this is (`FLAVOURS`): what is kept beside a model says it.
  flavour = "bert"
  # What a word that follows a space inside a text is encoded with, when words are encoded one
  # at a time (SQuAD's context words): nothing for WordPiece and SentencePiece, whose pieces do
  # not depend on the space before a word; a space for byte-level BPE, whose "Ġword" differs
  # from "word".
  word_prefix = ""
  # Whether the pieces' text is exactly the input's (no normalisation, nothing dropped), so that
  # `char_spans` gives each piece's characters.
  lossless = False

  def char_spans(self, text: str, ids: Sequence[int]) -> list[tuple[int, int]] | None:
    """Each piece's (start, end) characters in `text` (the text `ids` encode), or None where
    the pieces are not the text's; only for `lossless` tokenizers."""
    raise TypeError(f"{type(self).__name__} is not lossless: align its pieces by their text.")

  def piece_text(self, piece: str) -> str:
    """The characters of the text a piece stands for, without its word-start mark: what SQuAD
    aligns with the context to find each piece's characters."""
    return plain_piece_text(piece)

  def tokenize(self, text: str) -> list[str]:
    return self.convert_ids_to_tokens(self.encode(text))

  @property
  def vocab_source(self) -> str:
    """The file the vocabulary came from, by name, for messages."""
    path = getattr(self, "vocab_file", None) or getattr(self, "model_file", None)
    return os.path.basename(str(path)) if path else type(self).__name__

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """Implemented by each kind of tokenizer."""

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [self.encode(t) for t in texts]

  def encode_batch_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The ids of all `texts` back to back (int32) and each text's count: what bulk users
    (data preparation) need, without a Python list per text."""
    return _flatten(self.encode_batch(texts))

  def encode_lines(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    """`encode_batch_flat` of the "\n"-separated lines of `text`."""
    return self.encode_batch_flat(text.split("\n"))

  @abc.abstractmethod
  def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
    """Implemented by each kind of tokenizer."""

  @abc.abstractmethod
  def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    """Implemented by each kind of tokenizer."""

  def word_starts(self, ids) -> np.ndarray:
    """Boolean array: which of `ids` begin a word (special tokens count as starts)."""
    return self.word_start_table[np.asarray(ids, dtype=np.int64)]

  def build_inputs(self, ids_a: Sequence[int], ids_b: Sequence[int] | None = None) -> list[int]:
    """One or two encoded segments as a model input: [CLS] A [SEP] B [SEP] for BERT and ALBERT,
    <s> A </s></s> B </s> for RoBERTa (`pair_separators`)."""
    ids = [self.cls_id, *ids_a, self.sep_id]
    if ids_b is not None:
      ids += [self.sep_id] * (self.pair_separators - 1) + [*ids_b, self.sep_id]
    return ids

  @property
  def special_ids(self) -> dict[str, int]:
    return {"pad_id": self.pad_id, "unk_id": self.unk_id, "cls_id": self.cls_id,
            "sep_id": self.sep_id, "mask_id": self.mask_id}

  @property
  def special_tokens(self) -> tuple[str, ...]:
    """The strings of the special tokens, in the order of `special_ids`."""
    return tuple(self.convert_ids_to_tokens(self.special_ids.values()))

  def _split_on_specials(self, text: str) -> list[str | int]:
    """Cuts `text` at literal special-token strings: pieces of text and special ids in order."""
    if "_specials_split" not in self.__dict__:
      ids = dict(zip(self.special_tokens, self.special_ids.values()))
      # Longest first, so that no special token is cut short by another that is its prefix.
      alternatives = sorted(ids, key=len, reverse=True)
      self._specials_split = (
          re.compile("(" + "|".join(re.escape(t) for t in alternatives) + ")"), ids)
    pattern, ids = self._specials_split
    pieces: list[str | int] = []
    for i, part in enumerate(pattern.split(text)):
      if i % 2:
        pieces.append(ids[part])
      elif part:
        pieces.append(part)
    return pieces


def _flatten(id_lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  counts = np.fromiter(map(len, id_lists), np.int64, count=len(id_lists))
  ids = np.fromiter(itertools.chain.from_iterable(id_lists), np.int32, count=int(counts.sum()))
  return ids, counts


def _splice(ids: np.ndarray, counts: np.ndarray, lines, id_lists: Sequence[Sequence[int]]
            ) -> tuple[np.ndarray, np.ndarray]:
  """Puts the ids of some lines, encoded apart (their count in `counts` is 0), in their places."""
  extra_ids, extra_counts = _flatten(id_lists)
  counts = counts.copy()
  counts[lines] = extra_counts
  from_extra = np.repeat(np.isin(np.arange(counts.size), lines), counts)
  merged = np.empty(from_extra.size, np.int32)
  merged[~from_extra] = ids
  merged[from_extra] = extra_ids
  return merged, counts


# The share of [UNK] word pieces above which bulk tokenization (pre-training data, fine-tuning
# features) stops: a vocabulary that fits the text leaves well under 1% (BERT's uncased vocabulary
# on English prose: about 0.01%); one cut short or meant for another language or casing leaves
# tens of percent. Between WARN and MAX a warning is logged.
MAX_UNKNOWN_RATE = 0.1
WARN_UNKNOWN_RATE = 0.01
# Below this many pieces a rate says little (one emoji in a short question is 10%): warn only.
MIN_PIECES_TO_REFUSE = 200


def count_unknown(tokenizer: "Tokenizer", ids) -> tuple[int, int]:
  """(unknown pieces, pieces) in `ids` (an int array of any shape, or lists of ids); [PAD],
  [CLS], [SEP] and [MASK] are not counted, so model inputs can be passed as they are."""
  if isinstance(ids, np.ndarray):
    flat = ids.reshape(-1)
  else:
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64)
  special = np.isin(flat, [tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id,
                           tokenizer.mask_id])
  return int((flat == tokenizer.unk_id).sum()), int(flat.size - special.sum())


def check_unknown_rate(tokenizer: "Tokenizer", unknown: int, pieces: int, source: str, *,
                       max_rate: float = MAX_UNKNOWN_RATE,
                       override: str = "") -> float:
  """The share of [UNK] among `pieces` word pieces of `source`; logs a warning above
  `WARN_UNKNOWN_RATE` and raises ValueError above `max_rate` (given enough pieces to tell).

  This is how a vocabulary cut short, or one that does not belong to the text (another
  language, cased text with an uncased vocabulary's accents stripped, ...) shows: its file looks
  fine, but most words fall apart into [UNK]. `override` names the setting that lets a run go on
  anyway (it ends the error message).
  """
  rate = unknown / pieces if pieces else 0.0
  if rate <= WARN_UNKNOWN_RATE:
    return rate
  message = (f"{source}: {rate:.1%} of {pieces:,} word pieces are [UNK] with "
             f"{tokenizer.vocab_source} ({tokenizer.vocab_size:,} entries): the vocabulary does "
             "not fit this text (a vocabulary file cut short, or one for other text?)")
  if rate > max_rate and pieces >= MIN_PIECES_TO_REFUSE:
    raise ValueError(message + (f"; {override} to go on anyway." if override else "."))
  logging.warning(message + ".")
  return rate


# ---------------------------------------------------------------------------------------------
# WordPiece


# Characters that no token of a vocabulary can hold: the basic tokenizer splits text on ASCII
# whitespace and drops NUL and control characters, so a token holding one is never produced —
# in a vocab.txt it is a sign of a damaged or wrong file. (Non-ASCII whitespace-only entries are
# not refused: released vocabularies hold some, e.g. U+2028 in the Chinese BERT vocab.txt, as
# placeholders that keep the ids of the entries after them.)
_BAD_VOCAB_CHARS = re.compile(r"[\x00-\x1f\x7f ]")
_BAD_CHAR_NAMES = {"\x00": "a NUL byte", " ": "a space", "\t": "a tab"}


def load_vocab(vocab_file: str, max_token_chars: int = 200) -> list[str]:
  """The tokens of a BERT `vocab.txt`, one a line; the line number (from 0) is the id.

  A UTF-8 byte-order mark and "\r" line ends are accepted, and spaces around a token dropped
  (as the original did). Refused, naming the file and line: an empty line, a token listed twice
  (both lines named: the original silently kept the later id), a token holding a space, a tab,
  NUL or another control character, and a token longer than `max_token_chars` characters after
  its "##" (the tokenizer's own word limit: such a token can never be produced). A vocabulary
  cut short cannot be told from its content; `check_unknown_rate` catches its effect on text.
  """
  try:
    text = file_io.read_text(vocab_file)
  except FileNotFoundError as e:
    raise FileNotFoundError(f"--vocab_file {vocab_file}: no such file.") from e
  if text.startswith("\ufeff"):
    text = text[1:]
  tokens = [line.strip(" \t\r") for line in text.split("\n")]
  if tokens and tokens[-1] == "":  # the newline after the last entry
    tokens.pop()
  if not tokens:
    raise ValueError(f"{vocab_file}: the vocabulary is empty.")
  _check_vocab_tokens(vocab_file, tokens, max_token_chars)
  return tokens


def _check_vocab_tokens(vocab_file: str, tokens: list[str], max_token_chars: int) -> None:
  """Raises on the first bad entry (see `load_vocab`); line numbers count from 1."""
  for line, token in enumerate(tokens, start=1):
    if not token:
      raise ValueError(f"{vocab_file}: line {line} is empty; every line of a vocab.txt is one "
                       "token (its id is the line number - 1).")
    bad = _BAD_VOCAB_CHARS.search(token)
    if bad:
      char = bad.group()
      name = _BAD_CHAR_NAMES.get(char, f"the control character U+{ord(char):04X}")
      raise ValueError(f"{vocab_file}: line {line}: the token {token[:40]!r} holds {name}, "
                       "which the tokenizer never leaves in a word: the file is damaged or not a "
                       "vocab.txt.")
    chars = len(token) - 2 if token.startswith("##") else len(token)
    if chars > max_token_chars:
      raise ValueError(f"{vocab_file}: line {line}: a token of {len(token):,} characters "
                       f"({token[:20]!r}...); words longer than {max_token_chars} characters "
                       "become [UNK], so no token can be that long: the file is damaged or not "
                       "a vocab.txt.")
  if len(set(tokens)) != len(tokens):
    first_line: dict[str, int] = {}
    for line, token in enumerate(tokens, start=1):
      if token in first_line:
        raise ValueError(f"{vocab_file}: line {line}: the token {token[:40]!r} is already on "
                         f"line {first_line[token]}; every token must be listed once (ids would "
                         "be ambiguous).")
      first_line[token] = line


def _check_specials(source: str, present: Iterable[str],
                    required: Sequence[str] = SPECIAL_TOKENS,
                    how: str = "one per line in vocab.txt") -> None:
  present = set(present)
  missing = [t for t in required if t not in present]
  if missing:
    raise ValueError(f"{source}: the vocabulary lacks the special token(s) {', '.join(missing)}; "
                     f"the tokenizer needs all of {', '.join(required)} ({how}).")


def has_text(text: str) -> bool:
  """Whether `text` keeps a character after the tokenizer's cleaning (which drops whitespace,
  control and format characters such as U+200B, NUL and U+FFFD): what "empty" means for an
  input text."""
  return any(not (_is_whitespace(c) or _is_control(c) or ord(c) in (0, 0xFFFD)) for c in text)


def _is_whitespace(char: str) -> bool:
  # \t, \n and \r are control characters to Unicode, but text means them as spaces.
  if char in " \t\n\r":
    return True
  return unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
  if char in "\t\n\r":
    return False
  return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
  cp = ord(char)
  # Every non-alphanumeric ASCII character counts, also "^ $ `" which Unicode calls symbols.
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(char).startswith("P")


def _is_cjk(cp: int) -> bool:
  """CJK Unified Ideographs (not Hangul or kana, which separate words with spaces)."""
  return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or
          0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or
          0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


class _PythonWordPiece:
  """The original BERT BasicTokenizer + WordpieceTokenizer, restated."""

  def __init__(self, vocab: dict[str, int], do_lower_case: bool, max_input_chars_per_word: int,
               unk_id: int):
    self.vocab = vocab
    self.do_lower_case = do_lower_case
    self.max_chars = max_input_chars_per_word
    self.unk_id = unk_id
    self._word_cache: dict[str, list[int]] = {}

  def _clean(self, text: str) -> str:
    out = []
    for char in text:
      cp = ord(char)
      if cp == 0 or cp == 0xFFFD or _is_control(char):
        continue
      if _is_whitespace(char):
        out.append(" ")
      elif _is_cjk(cp):
        out.append(f" {char} ")
      else:
        out.append(char)
    return "".join(out)

  def _split_punctuation(self, word: str) -> list[str]:
    pieces, current = [], []
    for char in word:
      if _is_punctuation(char):
        if current:
          pieces.append("".join(current))
          current = []
        pieces.append(char)
      else:
        current.append(char)
    if current:
      pieces.append("".join(current))
    return pieces

  def basic_tokens(self, text: str) -> list[str]:
    tokens = []
    for word in self._clean(text).split():
      if self.do_lower_case:
        word = unicodedata.normalize("NFD", word.lower())
        word = "".join(c for c in word if unicodedata.category(c) != "Mn")
      tokens.extend(self._split_punctuation(word))
    # Accent stripping can leave a token that is only whitespace-like marks; split once more.
    return " ".join(tokens).split()

  def word_ids(self, word: str) -> list[int]:
    cached = self._word_cache.get(word)
    if cached is not None:
      return cached
    ids = self._greedy_pieces(word)
    if len(self._word_cache) < 500_000:
      self._word_cache[word] = ids
    return ids

  def _greedy_pieces(self, word: str) -> list[int]:
    if len(word) > self.max_chars:
      return [self.unk_id]
    ids, start = [], 0
    while start < len(word):
      end = len(word)
      while end > start:
        piece = word[start:end] if start == 0 else "##" + word[start:end]
        piece_id = self.vocab.get(piece)
        if piece_id is not None:
          ids.append(piece_id)
          break
        end -= 1
      else:  # no piece matched: the whole word is unknown
        return [self.unk_id]
      start = end
    return ids

  def encode(self, text: str) -> list[int]:
    ids = []
    for word in self.basic_tokens(text):
      ids.extend(self.word_ids(word))
    return ids

  def encode_plain_ascii(self, text: str) -> list[int]:
    """`encode` for printable-ASCII text, where the basic tokenizer reduces to one regex.

    In printable ASCII there is nothing to clean, no accent and no CJK, and every character
    that is not a letter, digit or space is punctuation: words are the runs of letters and
    digits, and each other non-space character stands alone. Most English lines take this path,
    and their words come from the cache, which is why it is several times faster than even the
    Rust backend on such text.
    """
    if self.do_lower_case:
      text = text.lower()
    cache = self._word_cache
    ids = []
    for word in _ASCII_WORDS.findall(text):
      pieces = cache.get(word)
      ids.extend(pieces if pieces is not None else self.word_ids(word))
    return ids


def _is_plain_ascii(text: str) -> bool:
  return text.isascii() and (text.isprintable() or text.replace("\t", " ").isprintable())


_ASCII_WORDS = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9\s]")


# Byte classes of the array tokenizer: 0 separates (space, tab), 1 is part of a word (letters,
# digits), 2 stands alone (every other printable character: punctuation), 3 ends a line, and 4
# is anything else (non-ASCII bytes, control characters): a line holding one goes elsewhere.
_SPACE, _WORD, _ALONE, _NEWLINE, _OTHER = range(5)
_BYTE_CLASS = np.full(256, _OTHER, np.uint8)
_BYTE_CLASS[33:127] = _ALONE
for _chars in (b"abcdefghijklmnopqrstuvwxyz", b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", b"0123456789"):
  _BYTE_CLASS[np.frombuffer(_chars, np.uint8)] = _WORD
_BYTE_CLASS[[ord(" "), ord("\t")]] = _SPACE
_BYTE_CLASS[ord("\n")] = _NEWLINE
_LOW_BYTES = np.array([0] + [(1 << (8 * n)) - 1 for n in range(1, 9)], np.uint64)
_KEY_BYTES = 16  # tokens up to this long are looked up by their bytes, longer ones by a dict


class _AsciiLinesEncoder:
  """WordPiece ids of many lines of printable-ASCII text at once, with array operations.

  On such text the basic tokenizer is: words are runs of letters and digits, every other
  non-space character is a token of its own, spaces and tabs separate. So token boundaries come
  from a byte-class table, and each token is looked up by its bytes in an open-addressing hash
  table of the tokens seen before, built in numpy: a token of up to 8 bytes is its own uint64
  key, one of 9 to 16 bytes is two (the first with its top bit set, which ASCII never sets, so
  that the two kinds cannot be confused). Only tokens never seen before (a few tens of thousands
  in a corpus) and tokens over 16 bytes go through the Python WordPiece. The cost per token is a
  handful of array operations instead of a regex match, a string object and a dict lookup each —
  what makes tokenizing a large corpus several times faster than even the Rust backend.
  """

  _MAX_ENTRIES = 1 << 19  # distinct tokens kept; the table starts afresh beyond that
  _TWO_KEYS = np.uint64(1 << 63)

  def __init__(self, wordpiece: "_PythonWordPiece"):
    self.wordpiece = wordpiece
    self._reset(1 << 16)

  def _reset(self, slots: int) -> None:
    self.key_lo = np.zeros(slots, np.uint64)  # 0 marks a free slot (no token packs to 0)
    self.key_hi = np.zeros(slots, np.uint64)
    self.entry = np.zeros(slots, np.int32)
    self.size = 0
    self.piece_start = np.zeros(1024, np.int64)
    self.piece_count = np.zeros(1024, np.int32)
    self.pieces = np.zeros(4096, np.int32)
    self.num_pieces = 0
    self._add(np.array([ord("\n")], np.uint64), np.zeros(1, np.uint64), [[]])  # ends a line

  @staticmethod
  def _mix(key_lo: np.ndarray, key_hi: np.ndarray | None) -> np.ndarray:
    mixed = key_lo * np.uint64(0x9E3779B97F4A7C15)
    return mixed if key_hi is None else mixed ^ key_hi * np.uint64(0xC2B2AE3D27D4EB4F)

  def _slots(self, key_lo: np.ndarray, key_hi: np.ndarray | None) -> np.ndarray:
    bits = len(self.key_lo).bit_length() - 1
    return (self._mix(key_lo, key_hi) >> np.uint64(64 - bits)).astype(np.int64)

  def _find(self, key_lo: np.ndarray, key_hi: np.ndarray | None = None) -> np.ndarray:
    """Entry of each key, -1 where the table does not hold it. Without `key_hi` the keys are
    one-key tokens (top bit clear), for which the first key alone decides."""
    slot = self._slots(key_lo, key_hi)
    held = self.key_lo[slot]
    hit = held == key_lo
    if key_hi is not None:
      hit &= self.key_hi[slot] == key_hi
    found = np.where(hit, self.entry[slot], -1).astype(np.int32)
    todo = np.flatnonzero(~hit & (held != 0))  # a collision: probe the next slots
    mask = len(self.key_lo) - 1
    slot = (slot[todo] + 1) & mask
    while todo.size:
      held = self.key_lo[slot]
      hit = held == key_lo[todo]
      if key_hi is not None:
        hit &= self.key_hi[slot] == key_hi[todo]
      found[todo[hit]] = self.entry[slot[hit]]
      going = ~hit & (held != 0)
      todo, slot = todo[going], (slot[going] + 1) & mask
    return found

  def _insert(self, key_lo: np.ndarray, key_hi: np.ndarray, entries: np.ndarray) -> None:
    """Places distinct keys that the table does not hold (linear probing, all keys at once)."""
    todo = np.arange(key_lo.size)
    slot = self._slots(key_lo, key_hi)  # key_hi is 0 for one-key tokens: as `_find` hashes them
    mask = len(self.key_lo) - 1
    while todo.size:
      free = np.flatnonzero(self.key_lo[slot] == 0)
      # Several keys may want the same free slot: the first of them gets it.
      won_slots, first = np.unique(slot[free], return_index=True)
      winners = todo[free[first]]
      self.key_lo[won_slots] = key_lo[winners]
      self.key_hi[won_slots] = key_hi[winners]
      self.entry[won_slots] = entries[winners]
      placed = np.zeros(todo.size, bool)
      placed[free[first]] = True
      todo, slot = todo[~placed], (slot[~placed] + 1) & mask

  def _add(self, key_lo: np.ndarray, key_hi: np.ndarray, pieces: list[list[int]]) -> None:
    n = len(pieces)
    if self.size + n > len(self.key_lo) // 2:  # keep the table at most half full
      slots = len(self.key_lo)
      while self.size + n > slots // 2:
        slots *= 2
      used = np.flatnonzero(self.key_lo)
      old = self.key_lo[used], self.key_hi[used], self.entry[used]
      self.key_lo = np.zeros(slots, np.uint64)
      self.key_hi = np.zeros(slots, np.uint64)
      self.entry = np.zeros(slots, np.int32)
      self._insert(*old)
    counts = np.array([len(p) for p in pieces], np.int32)
    flat = np.array([i for p in pieces for i in p], np.int32)
    self.piece_start = _ensure(self.piece_start, self.size + n)
    self.piece_count = _ensure(self.piece_count, self.size + n)
    self.pieces = _ensure(self.pieces, self.num_pieces + flat.size)
    self.piece_start[self.size:self.size + n] = self.num_pieces + np.cumsum(counts) - counts
    self.piece_count[self.size:self.size + n] = counts
    self.pieces[self.num_pieces:self.num_pieces + flat.size] = flat
    self._insert(key_lo, key_hi, np.arange(self.size, self.size + n, dtype=np.int32))
    self.size += n
    self.num_pieces += flat.size

  def _lookup(self, key_lo: np.ndarray, two_keys: np.ndarray, key_hi: np.ndarray,
              too_long: np.ndarray) -> np.ndarray:
    entries = self._find(key_lo)  # right for one-key tokens; the others are redone below
    if two_keys.size:
      entries[two_keys] = self._find(key_lo[two_keys], key_hi)
    entries[too_long] = -1
    return entries

  def encode(self, data: np.ndarray, byte_class: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ids and per-line counts of `data`: uint8 bytes of lines that each end with "\n", already
    lower-cased where the vocabulary is uncased, holding only classes 0-3 (`byte_class`), and
    followed by `_KEY_BYTES` zero bytes (so that every token's key is two uint64 windows)."""
    n = data.size - _KEY_BYTES
    is_word = (byte_class == _WORD).view(np.int8)
    edges = np.diff(is_word, prepend=np.int8(0), append=np.int8(0))
    word_starts, word_ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    begins = (edges[:-1] == 1) | (byte_class >= _ALONE)  # a word, a lone character, a line end
    starts = np.flatnonzero(begins)
    lengths = np.ones(starts.size, np.int64)
    lengths[is_word[starts].view(bool)] = word_ends - word_starts
    line_ends = np.flatnonzero(byte_class[starts] == _NEWLINE)

    windows = np.ndarray((n + 8,), "<u8", buffer=data, strides=(1,))
    key_lo = windows[starts] & _LOW_BYTES[np.minimum(lengths, 8)]
    too_long = np.flatnonzero(lengths > _KEY_BYTES)
    two_keys = np.flatnonzero(lengths > 8)
    if too_long.size:
      two_keys = two_keys[lengths[two_keys] <= _KEY_BYTES]
    key_lo[two_keys] |= self._TWO_KEYS
    key_hi = windows[starts[two_keys] + 8] & _LOW_BYTES[lengths[two_keys] - 8]
    entries = self._lookup(key_lo, two_keys, key_hi, too_long)

    def unknown(entries):
      """Tokens to add (not those over 16 bytes), their second keys, and which have one."""
      new = np.flatnonzero(entries < 0)
      if too_long.size:
        new = new[lengths[new] <= _KEY_BYTES]
      has_two = key_lo[new] >= self._TWO_KEYS
      new_hi = np.zeros(new.size, np.uint64)
      new_hi[has_two] = key_hi[np.searchsorted(two_keys, new[has_two])]
      return new, new_hi, has_two

    new, new_hi, has_two = unknown(entries)
    if new.size:  # tokens not seen before: their pieces from the Python WordPiece
      # One of each (told apart by hash; a clash waits for the next round).
      _, first = np.unique(self._mix(key_lo[new], new_hi), return_index=True)
      if self.size + first.size > self._MAX_ENTRIES:  # start afresh: every token is new
        self._reset(1 << 16)
        entries = self._lookup(key_lo, two_keys, key_hi, too_long)
        new, new_hi, has_two = unknown(entries)
        _, first = np.unique(self._mix(key_lo[new], new_hi), return_index=True)
      raw = data.tobytes()
      while first.size:
        words = [raw[s:s + l].decode("ascii")
                 for s, l in zip(starts[new[first]].tolist(), lengths[new[first]].tolist())]
        self._add(key_lo[new[first]], new_hi[first],
                  [self.wordpiece._greedy_pieces(w) for w in words])
        found = self._find(key_lo[new])
        if has_two.any():
          found[has_two] = self._find(key_lo[new[has_two]], new_hi[has_two])
        entries[new] = found
        new, new_hi, has_two = new[found < 0], new_hi[found < 0], has_two[found < 0]
        _, first = np.unique(self._mix(key_lo[new], new_hi), return_index=True)

    counts = self.piece_count[entries].astype(np.int64)
    source_start = self.piece_start[entries]
    source = self.pieces[:self.num_pieces]
    if too_long.size:  # their pieces come from the Python WordPiece (and its cache)
      raw = data.tobytes()
      extra = [self.wordpiece.word_ids(raw[s:s + l].decode("ascii"))
               for s, l in zip(starts[too_long].tolist(), lengths[too_long].tolist())]
      extra_counts = np.array([len(p) for p in extra], np.int64)
      counts[too_long] = extra_counts
      source_start[too_long] = source.size + np.cumsum(extra_counts) - extra_counts
      source = np.concatenate([source, np.array([i for p in extra for i in p], np.int32)])
    total = np.cumsum(counts)
    ids = source[np.repeat(source_start - (total - counts), counts) +
                 np.arange(int(total[-1]) if total.size else 0)]
    per_line = np.diff(total[line_ends], prepend=0) if line_ends.size else np.zeros(0, np.int64)
    return ids, per_line


def _ensure(array: np.ndarray, size: int) -> np.ndarray:
  """`array`, or a copy at least twice as long when it is shorter than `size`."""
  if size <= array.size:
    return array
  bigger = np.zeros(max(size, 2 * array.size), array.dtype)
  bigger[:array.size] = array
  return bigger


def _rust_wordpiece(vocab: dict[str, int], do_lower_case: bool, max_input_chars_per_word: int,
                    split_special_tokens: bool):
  from tokenizers import Tokenizer as RustTokenizer  # pylint: disable=g-import-not-at-top
  from tokenizers import models, normalizers, pre_tokenizers  # pylint: disable=g-import-not-at-top
  tok = RustTokenizer(models.WordPiece(vocab, unk_token=UNK,
                                       max_input_chars_per_word=max_input_chars_per_word))
  tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                              strip_accents=do_lower_case,
                                              lowercase=do_lower_case)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  if not split_special_tokens:
    tok.add_special_tokens(list(SPECIAL_TOKENS))
  return tok


def rust_backend_available() -> bool:
  try:
    import tokenizers  # pylint: disable=g-import-not-at-top,unused-import
    return True
  except ImportError:
    return False


class WordPieceTokenizer(Tokenizer):
  """BERT WordPiece over a `vocab.txt` (cased or uncased)."""

  _BLOCK_CHARS = 1 << 20  # text tokenized per array pass

  def __init__(self, vocab_file: str, do_lower_case: bool = True,
               max_input_chars_per_word: int = 200, split_special_tokens: bool = False,
               backend: str = "auto"):
    self.vocab_file = vocab_file
    self.do_lower_case = do_lower_case
    self.split_special_tokens = split_special_tokens
    # The bound is the original's word limit even where a caller lowers it (to match
    # transformers' 100): a released vocabulary is never refused for a setting.
    self.id_to_token = load_vocab(vocab_file, max(200, max_input_chars_per_word))
    self.vocab = {token: i for i, token in enumerate(self.id_to_token)}
    _check_specials(vocab_file, self.vocab)
    self.vocab_size = len(self.id_to_token)
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        self.vocab[t] for t in SPECIAL_TOKENS)
    self.word_start_table = np.array([not t.startswith("##") for t in self.id_to_token], bool)
    if backend == "auto":
      backend = "rust" if rust_backend_available() else "python"
    if backend not in ("rust", "python"):
      raise ValueError(f"backend must be 'auto', 'rust' or 'python', not {backend!r}.")
    self.backend = backend
    self._python = _PythonWordPiece(self.vocab, do_lower_case, max_input_chars_per_word,
                                    self.unk_id)
    self._rust = (_rust_wordpiece(self.vocab, do_lower_case, max_input_chars_per_word,
                                  split_special_tokens) if backend == "rust" else None)
    self._ascii = _AsciiLinesEncoder(self._python)

  def _fast_path(self, text: str) -> bool:
    return _is_plain_ascii(text) and (self.split_special_tokens or "[" not in text)

  def encode(self, text: str) -> list[int]:
    if self._fast_path(text):
      return self._python.encode_plain_ascii(text)
    if self._rust is not None:
      return self._rust.encode(text, add_special_tokens=False).ids
    if self.split_special_tokens:
      return self._python.encode(text)
    ids: list[int] = []
    for piece in self._split_on_specials(text):
      if isinstance(piece, int):
        ids.append(piece)
      else:
        ids.extend(self._python.encode(piece))
    return ids

  def _encode_each(self, texts: Sequence[str]) -> list[list[int]]:
    """Text by text (Rust in one batch where available): for text the array path cannot take."""
    if self._rust is not None:
      return [e.ids for e in self._rust.encode_batch(list(texts), add_special_tokens=False)]
    return [self.encode(t) for t in texts]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    ids, counts = self.encode_batch_flat(texts)
    ids, ends = ids.tolist(), np.cumsum(counts).tolist()
    return [ids[s:e] for s, e in zip([0] + ends[:-1], ends)]

  def encode_batch_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    if not texts:
      return _flatten([])
    joined = "\n".join(texts)
    if joined.count("\n") == len(texts) - 1:
      return self.encode_lines(joined)
    # Texts that span lines are encoded on their own and put in their places.
    spanning = [i for i, t in enumerate(texts) if "\n" in t]
    ids, counts = self.encode_lines("\n".join("" if "\n" in t else t for t in texts))
    return _splice(ids, counts, spanning, [self.encode(texts[i]) for i in spanning])

  def encode_lines(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    """Ids of every "\n"-separated line of `text`, back to back (int32), and each line's count.

    Lines of printable ASCII (most lines of most corpora) are tokenized together by the array
    tokenizer; the others, found by a byte scan, text by text as in `encode`.
    """
    if len(text) > self._BLOCK_CHARS:  # in pieces of whole lines: bounded temporaries
      pieces, begin = [], 0
      while begin <= len(text):
        end = text.find("\n", begin + self._BLOCK_CHARS)
        end = len(text) if end < 0 else end
        pieces.append(self._encode_block(text[begin:end]))
        begin = end + 1
      return np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])
    return self._encode_block(text)

  def _encode_block(self, text: str) -> tuple[np.ndarray, np.ndarray]:
    raw = text.encode("utf-8") + b"\n"
    data = np.frombuffer((raw.lower() if self.do_lower_case else raw) + b"\0" * _KEY_BYTES,
                         np.uint8)
    byte_class = _BYTE_CLASS[data[:len(raw)]]
    odd = byte_class == _OTHER
    if not self.split_special_tokens:  # "[MASK]" and its kind are tokens of their own here
      odd |= data[:len(raw)] == ord("[")
    odd_bytes = np.flatnonzero(odd)
    if not odd_bytes.size:
      return self._ascii.encode(data, byte_class)
    line_ends = np.flatnonzero(byte_class == _NEWLINE)
    line_starts = np.concatenate([[0], line_ends[:-1] + 1])
    odd_lines = np.unique(np.searchsorted(line_ends, odd_bytes))
    if odd_lines.size > len(line_ends) // 2:  # mostly other text: not worth the array path
      lines = text.split("\n")
      return _flatten(self._encode_each(lines))
    data, byte_class = data.copy(), byte_class.copy()
    odd_texts = []
    for line in odd_lines.tolist():  # blank them for the array path, encode them one by one
      begin, end = line_starts[line], line_ends[line]
      odd_texts.append(raw[begin:end].decode("utf-8"))
      data[begin:end] = ord(" ")
      byte_class[begin:end] = _SPACE
    ids, counts = self._ascii.encode(data, byte_class)
    return _splice(ids, counts, odd_lines, self._encode_each(odd_texts))

  def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
    return [self.vocab.get(t, self.unk_id) for t in tokens]

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    return [self.id_to_token[int(i)] for i in ids]


# ---------------------------------------------------------------------------------------------
# SentencePiece


class SentencePieceTokenizer(Tokenizer):
  """A SentencePiece model (unigram or BPE) trained with the BERT special tokens.

  `data_prep/train_tokenizer.py` makes such models: [PAD] and [UNK] are SentencePiece's pad and
  unk pieces, [CLS], [SEP] and [MASK] are control symbols (reserved ids that encoding never
  produces from text). A piece that starts with "▁" starts a word. Lower-casing, when asked for,
  happens before encoding and must match how the model was trained. (ALBERT's own preprocessing
  is `AlbertSentencePieceTokenizer`.)
  """

  def __init__(self, model_file: str, do_lower_case: bool = False,
               split_special_tokens: bool = False):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self.model_file = model_file
    self.do_lower_case = do_lower_case
    self.split_special_tokens = split_special_tokens
    try:
      proto = file_io.read_bytes(model_file)
    except FileNotFoundError as e:
      raise FileNotFoundError(f"--spm_model_file {model_file}: no such file.") from e
    self.sp = spm.SentencePieceProcessor()
    try:
      self.sp.LoadFromSerializedProto(proto)
    except Exception as e:  # sentencepiece raises a bare RuntimeError/OSError on junk
      raise ValueError(f"{model_file}: not a SentencePiece model ({e}).") from e
    self.vocab_size = self.sp.get_piece_size()
    self.id_to_token = [self.sp.id_to_piece(i) for i in range(self.vocab_size)]
    self.vocab = {piece: i for i, piece in enumerate(self.id_to_token)}
    names = dict(self.vocab)
    if self.sp.pad_id() >= 0:
      names[PAD] = self.sp.pad_id()
    if self.sp.unk_id() >= 0:
      names[UNK] = self.sp.unk_id()
    _check_specials(model_file, names, how="pad and unk as the model's pad and unk pieces, "
                    "[CLS], [SEP] and [MASK] as pieces of their own")
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        names[t] for t in SPECIAL_TOKENS)
    self.word_start_table = np.array(
        [p.startswith(SPM_WORD_START) or self.sp.is_control(i) or self.sp.is_unknown(i)
         for i, p in enumerate(self.id_to_token)], bool)

  def _preprocess(self, text: str) -> str:
    """What happens to text before SentencePiece sees it."""
    return text.lower() if self.do_lower_case else text

  def _encode_preprocessed(self, texts: list[str]) -> list[list[int]]:
    return self.sp.encode(texts)

  def encode(self, text: str) -> list[int]:
    if self.split_special_tokens:
      return self._encode_preprocessed([self._preprocess(text)])[0]
    pieces = self._split_on_specials(text)
    texts = [self._preprocess(p) for p in pieces if not isinstance(p, int)]
    encoded = iter(self._encode_preprocessed(texts))
    ids: list[int] = []
    for piece in pieces:
      if isinstance(piece, int):
        ids.append(piece)
      else:
        ids.extend(next(encoded))
    return ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    if self.split_special_tokens:
      return self._encode_preprocessed([self._preprocess(t) for t in texts])
    return [self.encode(t) for t in texts]

  def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
    return [self.vocab.get(t, self.unk_id) for t in tokens]

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    return [self.id_to_token[int(i)] for i in ids]


def albert_preprocess(text: str, do_lower_case: bool = True, keep_accents: bool = False) -> str:
  """ALBERT's text cleanup before SentencePiece (its `preprocess_text`): runs of whitespace
  become one space and the ends are stripped, LaTeX-style quotes `` and '' become ", accents are
  dropped (NFKD, then the combining marks removed) unless `keep_accents`, and the text is
  lower-cased when `do_lower_case`. Training text goes through the same function
  (`data_prep/train_tokenizer.py`), so the model sees at training what it sees at encoding."""
  text = " ".join(text.strip().split())
  text = text.replace("``", '"').replace("''", '"')
  if not keep_accents:
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
  return text.lower() if do_lower_case else text


class AlbertSentencePieceTokenizer(SentencePieceTokenizer):
  """An ALBERT `spiece.model` (<pad> = 0, <unk> = 1, [CLS] = 2, [SEP] = 3, [MASK] = 4) with
  ALBERT's preprocessing (`albert_preprocess`) and its rule for numbers.

  The rule: a piece that ends in a digit and a comma ("▁1," of "1,000") is encoded again without
  the comma, and the comma follows as a piece of its own, so that numbers are cut the same way
  whatever punctuation follows them. ALBERT's tokenizer and transformers' Python
  `AlbertTokenizer` apply it (and transformers' converted ALBERT tokenizers approximate it with
  scores); transformers 5 building an `AlbertTokenizer` straight from a `spiece.model` does not,
  so `split_digit_comma=False` gives its ids. A model whose pieces never end in a digit and a
  comma (SentencePiece's default `split_by_number` training makes none) is not affected.
  """

  flavour = "albert"

  def __init__(self, model_file: str, do_lower_case: bool = True, keep_accents: bool = False,
               split_special_tokens: bool = False, split_digit_comma: bool = True):
    super().__init__(model_file, do_lower_case=do_lower_case,
                     split_special_tokens=split_special_tokens)
    self.keep_accents = keep_accents
    self.split_digit_comma = split_digit_comma and any(
        _ends_in_digit_comma(p) for p in self.id_to_token)

  def _preprocess(self, text: str) -> str:
    return albert_preprocess(text, self.do_lower_case, self.keep_accents)

  def _encode_preprocessed(self, texts: list[str]) -> list[list[int]]:
    encoded = self.sp.encode(texts)
    if self.split_digit_comma:
      for i, text in enumerate(texts):
        if "," in text:
          encoded[i] = self._split_digit_commas(text, encoded[i])
    return encoded

  def _split_digit_commas(self, text: str, ids: list[int]) -> list[int]:
    pieces = self.sp.encode(text, out_type=str)
    if not any(_ends_in_digit_comma(p) for p in pieces):
      return ids
    out: list[int] = []
    for piece, piece_id in zip(pieces, ids):
      if not _ends_in_digit_comma(piece):
        out.append(piece_id)
        continue
      number = self.sp.encode(piece[:-1].replace(SPM_WORD_START, ""), out_type=str)
      if not piece.startswith(SPM_WORD_START) and number[0].startswith(SPM_WORD_START):
        number = number[1:] if len(number[0]) == 1 else [number[0][1:]] + number[1:]
      out.extend(self.sp.piece_to_id(p) for p in number + [piece[-1]])
    return out


def _ends_in_digit_comma(piece: str) -> bool:
  return len(piece) > 1 and piece[-1] == "," and piece[-2].isdigit()


# ---------------------------------------------------------------------------------------------
# Byte-level BPE


class ByteLevelBPETokenizer(Tokenizer):
  """GPT-2 / RoBERTa byte-level BPE over a `vocab.json` and its `merges.txt` (see `bpe`).

  Ids equal transformers' `RobertaTokenizer` built from the same two files, with its defaults:
  no space is added before the text, so a word at the start of a text is a different piece from
  the same word after a space ("Hello" vs "ĠHello"), and nothing is lower-cased. The special
  tokens by role are <pad>, <unk>, <s> (classifier), </s> (separator) and <mask>.
  """

  # RoBERTa separates a pair with two separators: <s> A </s></s> B </s>.
  pair_separators = 2
  flavour = "roberta"
  word_prefix = " "
  do_lower_case = False  # byte-level BPE keeps case
  lossless = True

  def __init__(self, vocab_file: str, merges_file: str | None = None,
               split_special_tokens: bool = False):
    self.vocab_file = vocab_file
    self.merges_file = merges_file or default_merges_file(vocab_file)
    self.split_special_tokens = split_special_tokens
    self.vocab = bpe.load_vocab_json(vocab_file)
    self.vocab_size = len(self.vocab)
    self.id_to_token = [""] * self.vocab_size
    for token, index in self.vocab.items():
      if index >= self.vocab_size:
        raise ValueError(f"{vocab_file}: the id of {token[:40]!r} is {index} but there are "
                         f"{self.vocab_size} tokens; ids must be 0 to {self.vocab_size - 1}.")
      self.id_to_token[index] = token
    _check_specials(vocab_file, self.vocab, bpe.SPECIAL_TOKENS,
                    how="keys of vocab.json, as in RoBERTa's")
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        self.vocab[t] for t in bpe.SPECIAL_TOKENS)
    self._byte_of = {symbol: b for b, symbol in enumerate(bpe.byte_symbols())}
    merges = bpe.load_merges(self.merges_file, self.vocab)
    self._special_set = set(self.special_ids.values())
    self._is_special = np.zeros(self.vocab_size, bool)
    self._is_special[list(self.special_ids.values())] = True
    self.word_start_table = self._is_special | np.array(
        [t.startswith(bpe.WORD_START) for t in self.id_to_token], bool)
    self._rust = bpe.build(self.vocab, merges,
                           () if split_special_tokens else bpe.SPECIAL_TOKENS)

  def encode(self, text: str) -> list[int]:
    return self._rust.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._rust.encode_batch(list(texts), add_special_tokens=False)]

  def word_starts(self, ids) -> np.ndarray:
    """As `Tokenizer.word_starts`, and also the first piece of a text: at the start of `ids`'
    last axis or after a special token ("Hello" in "<s>Hello": no "Ġ", as no space precedes it)."""
    ids = np.asarray(ids, dtype=np.int64)
    starts = self.word_start_table[ids]
    if ids.ndim and ids.shape[-1]:
      starts[..., 0] = True
      starts[..., 1:] |= self._is_special[ids[..., :-1]]
    return starts

  def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
    return [self.vocab.get(t, self.unk_id) for t in tokens]

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    return [self.id_to_token[int(i)] for i in ids]

  def char_spans(self, text: str, ids: Sequence[int]) -> list[tuple[int, int]] | None:
    """Each piece's characters in `text`, from its bytes (one symbol per byte): a piece that
    holds part of a character's UTF-8 bytes gets that whole character. None when a special
    token stands for text ("<mask>" written in the text)."""
    owner = [i for i, char in enumerate(text) for _ in range(len(char.encode("utf-8")))]
    spans, pos = [], 0
    for piece_id, piece in zip(ids, self.convert_ids_to_tokens(ids)):
      width = len(piece)
      if int(piece_id) in self._special_set or not width or pos + width > len(owner):
        return None
      spans.append((owner[pos], owner[pos + width - 1] + 1))
      pos += width
    return spans if pos == len(owner) else None

  def piece_text(self, piece: str) -> str:
    """The bytes a piece stands for, as text, without the space that starts a word; a piece that
    holds only part of a character's UTF-8 bytes stands for no whole character: ""."""
    if piece in self.special_tokens:
      return piece
    data = bytes(self._byte_of[c] for c in piece if c in self._byte_of)
    return data.decode("utf-8", errors="ignore").lstrip(" ")


def default_merges_file(vocab_file: str) -> str:
  """The merges.txt beside a vocab.json: "vocab.json" at the end of the name becomes
  "merges.txt" (vocab.json → merges.txt, spm.vocab.json → spm.merges.txt)."""
  if not vocab_file.endswith("vocab.json"):
    raise ValueError(f"{vocab_file}: give merges_file; only for a file named ...vocab.json is "
                     "the merges.txt beside it found by name.")
  return vocab_file[:-len("vocab.json")] + "merges.txt"


FLAVOURS = ("bert", "albert", "roberta")


def flavour_for(model_type: str | None, spm_model_file: str | None = None) -> str | None:
  """The tokenizer flavour a model of `model_type` reads its files with: an ALBERT model's
  SentencePiece model gets ALBERT's preprocessing, any other SentencePiece model BERT's. For a
  vocab.txt or vocab.json the files decide (None)."""
  if not spm_model_file:
    return None
  return "albert" if model_type == "albert" else "bert"


def load_tokenizer(vocab_file: str | None = None, spm_model_file: str | None = None,
                   do_lower_case: bool = True, split_special_tokens: bool = False,
                   merges_file: str | None = None, flavour: str | None = None,
                   **kwargs) -> Tokenizer:
  """The tokenizer of the files given; exactly one of `vocab_file` and `spm_model_file`.

  * a `vocab.txt`: WordPiece (`kwargs` are its options);
  * a `vocab.json` (a name ending in .json, or any name with `merges_file`): RoBERTa's byte-level
    BPE, with `merges_file` or else the merges.txt beside it (`default_merges_file`); RoBERTa
    does not lower-case, so `do_lower_case` does not apply;
  * a SentencePiece `.model`: BERT's layout, or with `flavour="albert"` an ALBERT spiece.model
    with ALBERT's preprocessing.

  `flavour` ("bert", "albert", "roberta"; None: from the files) only has to agree with the files.
  """
  if bool(vocab_file) == bool(spm_model_file):
    raise ValueError("Give exactly one of vocab_file (WordPiece vocab.txt, or byte-level BPE "
                     "vocab.json) and spm_model_file (SentencePiece .model).")
  if flavour is not None and flavour not in FLAVOURS:
    raise ValueError(f"flavour={flavour!r}: expected one of {', '.join(FLAVOURS)}.")
  byte_level = bool(vocab_file) and (bool(merges_file) or vocab_file.endswith(".json") or
                                     flavour == "roberta")
  given = f"vocab_file={vocab_file}" if vocab_file else f"spm_model_file={spm_model_file}"
  if merges_file and not vocab_file:
    raise ValueError(f"merges_file={merges_file} goes with a byte-level BPE vocab.json, not with "
                     f"{given}.")
  expected = {"bert": "a WordPiece vocab.txt or a SentencePiece .model",
              "albert": "an ALBERT SentencePiece .model (spm_model_file)",
              "roberta": "a byte-level BPE vocab.json (vocab_file) and its merges.txt"}
  if flavour is not None and ((flavour == "albert" and not spm_model_file) or
                              (flavour == "bert" and byte_level) or
                              (flavour == "roberta" and spm_model_file)):
    raise ValueError(f"flavour={flavour!r} needs {expected[flavour]}, not {given}"
                     f"{' with merges_file' if merges_file else ''}.")
  if kwargs and (spm_model_file or byte_level):
    raise ValueError(f"{', '.join(sorted(kwargs))}: WordPiece options, not for {given}.")
  if spm_model_file:
    if flavour == "albert":
      return AlbertSentencePieceTokenizer(spm_model_file, do_lower_case=do_lower_case,
                                          split_special_tokens=split_special_tokens)
    return SentencePieceTokenizer(spm_model_file, do_lower_case=do_lower_case,
                                  split_special_tokens=split_special_tokens)
  if byte_level:
    return ByteLevelBPETokenizer(vocab_file, merges_file,
                                 split_special_tokens=split_special_tokens)
  return WordPieceTokenizer(vocab_file, do_lower_case=do_lower_case,
                            split_special_tokens=split_special_tokens, **kwargs)
