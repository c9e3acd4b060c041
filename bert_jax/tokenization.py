"""Tokenizers behind one interface: WordPiece over a BERT `vocab.txt`, and SentencePiece.

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
ids: one regex splits words and punctuation, and a cache maps each distinct word to its pieces.

They differ only where the original and transformers differ, on text unlike any real corpus:
private-use and unassigned code points (the original keeps them as [UNK]-bound words, the Rust
cleanup drops them) and the Greek final sigma (Python's `str.lower` is context-aware).
transformers' `BertTokenizer` caps words at 100 characters instead of 200; pass
`max_input_chars_per_word=100` to match it on words of 101–200 characters.

Special-token strings that occur literally in text ("[MASK]", "[SEP]") are single tokens by
default, as in transformers; `split_special_tokens=True` treats them as ordinary text, as the
original did. Pre-training data uses the latter so that corpus text can never forge a [SEP] or a
[MASK] inside an instance.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable, Sequence

import numpy as np

from bert_jax import file_io

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
# SentencePiece's mark for "a space came before this piece", i.e. the piece starts a word.
SPM_WORD_START = "\u2581"


class Tokenizer:
  """Text → ids, the special ids, and the word-start table used by whole-word masking."""

  vocab_size: int
  pad_id: int
  unk_id: int
  cls_id: int
  sep_id: int
  mask_id: int
  # word_start_table[id] is True where a token with that id begins a new word.
  word_start_table: np.ndarray

  def tokenize(self, text: str) -> list[str]:
    return self.convert_ids_to_tokens(self.encode(text))

  def encode(self, text: str) -> list[int]:
    raise NotImplementedError

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [self.encode(t) for t in texts]

  def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
    raise NotImplementedError

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    raise NotImplementedError

  def word_starts(self, ids) -> np.ndarray:
    """Boolean array: which of `ids` begin a word (special tokens count as starts)."""
    return self.word_start_table[np.asarray(ids, dtype=np.int64)]

  @property
  def special_ids(self) -> dict[str, int]:
    return {"pad_id": self.pad_id, "unk_id": self.unk_id, "cls_id": self.cls_id,
            "sep_id": self.sep_id, "mask_id": self.mask_id}

  def _split_on_specials(self, text: str) -> list[str | int]:
    """Cuts `text` at literal special-token strings: pieces of text and special ids in order."""
    pieces: list[str | int] = []
    for i, part in enumerate(_SPECIALS_RE.split(text)):
      if i % 2:
        pieces.append(getattr(self, _SPECIAL_ATTR[part]))
      elif part:
        pieces.append(part)
    return pieces


_SPECIALS_RE = re.compile("(" + "|".join(re.escape(t) for t in SPECIAL_TOKENS) + ")")
_SPECIAL_ATTR = {PAD: "pad_id", UNK: "unk_id", CLS: "cls_id", SEP: "sep_id", MASK: "mask_id"}


# ---------------------------------------------------------------------------------------------
# WordPiece


def load_vocab(vocab_file: str) -> list[str]:
  """The tokens of a BERT `vocab.txt`, one a line; the line number is the id."""
  try:
    text = file_io.read_text(vocab_file)
  except FileNotFoundError as e:
    raise FileNotFoundError(f"--vocab_file {vocab_file}: no such file.") from e
  tokens = [line.strip() for line in text.split("\n")]
  if tokens and tokens[-1] == "":  # the newline after the last entry
    tokens.pop()
  if not tokens:
    raise ValueError(f"{vocab_file}: the vocabulary is empty.")
  return tokens


def _check_specials(source: str, present: Iterable[str]) -> None:
  missing = [t for t in SPECIAL_TOKENS if t not in set(present)]
  if missing:
    raise ValueError(f"{source}: the vocabulary lacks the special token(s) {', '.join(missing)}; "
                     f"BERT needs all of {', '.join(SPECIAL_TOKENS)} (one per line in vocab.txt).")


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

  def __init__(self, vocab_file: str, do_lower_case: bool = True,
               max_input_chars_per_word: int = 200, split_special_tokens: bool = False,
               backend: str = "auto"):
    self.vocab_file = vocab_file
    self.do_lower_case = do_lower_case
    self.split_special_tokens = split_special_tokens
    self.id_to_token = load_vocab(vocab_file)
    # As in the original, a token listed twice keeps its last id.
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

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    out: list = [None] * len(texts)
    rest = []
    for i, text in enumerate(texts):
      if self._fast_path(text):
        out[i] = self._python.encode_plain_ascii(text)
      else:
        rest.append(i)
    if rest and self._rust is not None:
      encodings = self._rust.encode_batch([texts[i] for i in rest], add_special_tokens=False)
      for i, encoding in zip(rest, encodings):
        out[i] = encoding.ids
    else:
      for i in rest:
        out[i] = self.encode(texts[i])
    return out

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
  happens before encoding, as ALBERT did, and must match how the model was trained.
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
    _check_specials(model_file, names)
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        names[t] for t in SPECIAL_TOKENS)
    self.word_start_table = np.array(
        [p.startswith(SPM_WORD_START) or self.sp.is_control(i) or self.sp.is_unknown(i)
         for i, p in enumerate(self.id_to_token)], bool)

  def _encode_text(self, text: str) -> list[int]:
    if self.do_lower_case:
      text = text.lower()
    return self.sp.encode(text)

  def encode(self, text: str) -> list[int]:
    if self.split_special_tokens:
      return self._encode_text(text)
    ids: list[int] = []
    for piece in self._split_on_specials(text):
      if isinstance(piece, int):
        ids.append(piece)
      else:
        ids.extend(self._encode_text(piece))
    return ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    if self.split_special_tokens:
      return self.sp.encode([t.lower() for t in texts] if self.do_lower_case else list(texts))
    return [self.encode(t) for t in texts]

  def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
    return [self.vocab.get(t, self.unk_id) for t in tokens]

  def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
    return [self.id_to_token[int(i)] for i in ids]


def load_tokenizer(vocab_file: str | None = None, spm_model_file: str | None = None,
                   do_lower_case: bool = True, split_special_tokens: bool = False,
                   **kwargs) -> Tokenizer:
  """WordPiece for a `vocab.txt`, SentencePiece for a `.model`; exactly one must be given."""
  if bool(vocab_file) == bool(spm_model_file):
    raise ValueError("Give exactly one of vocab_file (WordPiece vocab.txt) and spm_model_file "
                     "(SentencePiece .model).")
  if spm_model_file:
    return SentencePieceTokenizer(spm_model_file, do_lower_case=do_lower_case,
                                  split_special_tokens=split_special_tokens)
  return WordPieceTokenizer(vocab_file, do_lower_case=do_lower_case,
                            split_special_tokens=split_special_tokens, **kwargs)
