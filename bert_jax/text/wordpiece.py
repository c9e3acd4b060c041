"""WordPiece over a BERT `vocab.txt`: the file read and checked, and the tokenizer itself.

WordPiece reproduces the original BERT tokenizer: text cleanup (NUL, U+FFFD and control
characters dropped, any whitespace → space), CJK ideographs split into single characters,
punctuation split off (`characters`), lower-casing with accent stripping for uncased
vocabularies, greedy longest-match-first pieces, and a word longer than
`max_input_chars_per_word` (200, the original's limit) becomes [UNK]. Two backends give the same
ids on real text:

* `"rust"` — the `tokenizers` library (the engine of transformers' `BertTokenizer`), ~50×
  faster; the default when that library is installed.
* `"python"` — a plain re-statement of the original algorithm, used when `tokenizers` is
  missing and as the readable reference the tests hold the fast one to.

Either way, lines of printable ASCII (most English text) take a shortcut that gives the same
ids, since on them the basic tokenizer reduces to "runs of letters and digits, and every other
non-space character alone": one text at a time, a regex and a word cache; many lines at once
(`encode_batch`, `encode_lines`: what bulk users like data preparation call), array operations
over the bytes of a whole block of lines and a numpy hash table of the words seen before
(`ascii_lines`), with no Python work per word — several times faster than the Rust backend.

They differ only where the original and transformers differ, on text unlike any real corpus:
private-use and unassigned code points (the original keeps them as [UNK]-bound words, the Rust
cleanup drops them) and the Greek final sigma (Python's `str.lower` is context-aware).
transformers' `BertTokenizer` caps words at 100 characters instead of 200; pass
`max_input_chars_per_word=100` to match it on words of 101–200 characters.

A damaged `vocab.txt` is refused at load, by file and line (`load_vocab`); one cut short is
caught by its effect on text (`unknown_tokens`).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable, Sequence

import numpy as np

from bert_jax import file_io
from bert_jax.text import ascii_lines, characters
from bert_jax.text.tokenization import (SPECIAL_TOKENS, UNK, Tokenizer, check_specials,
                                        flatten_ids)

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
      if cp == 0 or cp == 0xFFFD or characters.is_control(char):
        continue
      if characters.is_whitespace(char):
        out.append(" ")
      elif characters.is_cjk(cp):
        out.append(f" {char} ")
      else:
        out.append(char)
    return "".join(out)

  def _split_punctuation(self, word: str) -> list[str]:
    pieces, current = [], []
    for char in word:
      if characters.is_punctuation(char):
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
    ids = self.greedy_pieces(word)
    if len(self._word_cache) < 500_000:
      self._word_cache[word] = ids
    return ids

  def greedy_pieces(self, word: str) -> list[int]:
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


def _splice(ids: np.ndarray, counts: np.ndarray, lines, id_lists: Sequence[Sequence[int]]
            ) -> tuple[np.ndarray, np.ndarray]:
  """Puts the ids of some lines, encoded apart (their count in `counts` is 0), in their places."""
  extra_ids, extra_counts = flatten_ids(id_lists)
  counts = counts.copy()
  counts[lines] = extra_counts
  from_extra = np.repeat(np.isin(np.arange(counts.size), lines), counts)
  merged = np.empty(from_extra.size, np.int32)
  merged[~from_extra] = ids
  merged[from_extra] = extra_ids
  return merged, counts


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
    check_specials(vocab_file, self.vocab)
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
    self._ascii = ascii_lines.AsciiLinesEncoder(self._python)

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

  def tokenizers_json(self) -> str:
    """This tokenizer as the `tokenizers` library saves one (`tokenizer.json`): the Rust
    pipeline that `encode` runs, its word limit included, with BERT's [CLS] A [SEP] B [SEP]
    template and the WordPiece decoder, so that another program (transformers' AutoTokenizer
    on a Hugging Face export) splits text into the same ids."""
    from tokenizers import decoders, processors  # pylint: disable=g-import-not-at-top
    tok = _rust_wordpiece(self.vocab, self.do_lower_case, self._python.max_chars,
                          self.split_special_tokens)
    tok.post_processor = processors.BertProcessing(("[SEP]", self.sep_id),
                                                   ("[CLS]", self.cls_id))
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok.to_str()

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    ids, counts = self.encode_batch_flat(texts)
    ids, ends = ids.tolist(), np.cumsum(counts).tolist()
    return [ids[s:e] for s, e in zip([0] + ends[:-1], ends)]

  def encode_batch_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    if not texts:
      return flatten_ids([])
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
    padding = b"\0" * ascii_lines.KEY_BYTES
    data = np.frombuffer((raw.lower() if self.do_lower_case else raw) + padding, np.uint8)
    byte_class = ascii_lines.BYTE_CLASS[data[:len(raw)]]
    odd = byte_class == ascii_lines.OTHER
    if not self.split_special_tokens:  # "[MASK]" and its kind are tokens of their own here
      odd |= data[:len(raw)] == ord("[")
    odd_bytes = np.flatnonzero(odd)
    if not odd_bytes.size:
      return self._ascii.encode(data, byte_class)
    line_ends = np.flatnonzero(byte_class == ascii_lines.NEWLINE)
    line_starts = np.concatenate([[0], line_ends[:-1] + 1])
    odd_lines = np.unique(np.searchsorted(line_ends, odd_bytes))
    if odd_lines.size > len(line_ends) // 2:  # mostly other text: not worth the array path
      lines = text.split("\n")
      return flatten_ids(self._encode_each(lines))
    data, byte_class = data.copy(), byte_class.copy()
    odd_texts = []
    for line in odd_lines.tolist():  # blank them for the array path, encode them one by one
      begin, end = line_starts[line], line_ends[line]
      odd_texts.append(raw[begin:end].decode("utf-8"))
      data[begin:end] = ord(" ")
      byte_class[begin:end] = ascii_lines.SPACE
    ids, counts = self._ascii.encode(data, byte_class)
    return _splice(ids, counts, odd_lines, self._encode_each(odd_texts))

  def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
    return [self.vocab.get(t, self.unk_id) for t in tokens]

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    return [self.id_to_token[int(i)] for i in ids]
