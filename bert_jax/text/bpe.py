"""Byte-level BPE (GPT-2 / RoBERTa `vocab.json` + `merges.txt`): the files read, checked and
trained, and the tokenizer over them (`ByteLevelBPETokenizer`).

RoBERTa replaced BERT's WordPiece with GPT-2's byte-level BPE: text is cut into words by GPT-2's
regular expression (a word keeps the space before it), each word's UTF-8 bytes are written as
printable characters (a space is "Ġ", a newline "Ċ"), and merges.txt's pairs are merged in rank
order. Every byte is a symbol, so no text is ever unknown. The encoding itself is the
`tokenizers` library's (the engine of transformers' `RobertaTokenizer`), built here from the two
files as read by this module, so that a damaged file is refused by name and line instead of by a
message from inside the library.

The released RoBERTa vocabulary puts `<s>`, `<pad>`, `</s>`, `<unk>` at ids 0-3 and `<mask>` last;
`train_vocab` writes that layout. Files are JSON and text only: nothing here unpickles.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Iterable, Sequence

import numpy as np

from bert_jax import file_io
from bert_jax.text.tokenization import Tokenizer, check_specials

BOS, PAD, EOS, UNK, MASK = "<s>", "<pad>", "</s>", "<unk>", "<mask>"
# The roles pad, unk, cls, sep, mask (the order of `Tokenizer.special_ids`): RoBERTa's classifier
# token is its <s>, its separator its </s>.
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS, MASK)
# The symbol of a space byte: a piece that starts with it starts a word.
WORD_START = "\u0120"
MERGES_HEADER = "#version"


def byte_symbols() -> list[str]:
  """The printable character that stands for each byte 0-255 (GPT-2's `bytes_to_unicode`):
  printable Latin-1 bytes stand for themselves, the others are shifted to U+0100 and up."""
  keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
          list(range(ord("®"), ord("ÿ") + 1)))
  symbols, shifted = {}, 0
  for b in range(256):
    if b in keep:
      symbols[b] = chr(b)
    else:
      symbols[b] = chr(256 + shifted)
      shifted += 1
  return [symbols[b] for b in range(256)]


def load_vocab_json(vocab_file: str) -> dict[str, int]:
  """The token → id table of a `vocab.json`; refused, naming the file: not a JSON object of
  string → integer, negative or repeated ids, and a vocabulary that lacks one of the 256 byte
  symbols (text holding that byte would lose it without a trace)."""
  try:
    text = file_io.read_text(vocab_file)
  except FileNotFoundError as e:
    raise FileNotFoundError(f"--vocab_file {vocab_file}: no such file.") from e
  try:
    vocab = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{vocab_file}: not JSON ({e}); a byte-level BPE vocab.json is one object "
                     'of token → id, e.g. {"<s>": 0, "<pad>": 1, ...}.') from e
  if not isinstance(vocab, dict) or not vocab:
    raise ValueError(f"{vocab_file}: expected a non-empty JSON object of token → id, found "
                     f"{type(vocab).__name__} {str(vocab)[:40]!r}.")
  seen: dict[int, str] = {}
  for token, index in vocab.items():
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
      raise ValueError(f"{vocab_file}: the id of {token[:40]!r} is {index!r}; ids are integers "
                       "from 0.")
    if index in seen:
      raise ValueError(f"{vocab_file}: {token[:40]!r} and {seen[index][:40]!r} both have id "
                       f"{index}; every id must belong to one token.")
    seen[index] = token
  missing = [s for s in byte_symbols() if s not in vocab]
  if missing:
    raise ValueError(f"{vocab_file}: {len(missing)} of the 256 byte symbols are missing (e.g. "
                     f"{missing[0]!r}); a byte-level BPE vocabulary holds them all (is this a "
                     "vocab.json of another kind of tokenizer?).")
  return vocab


def load_merges(merges_file: str, vocab: dict[str, int]) -> list[tuple[str, str]]:
  """The merges of a `merges.txt`, highest priority first: an optional "#version" line, then one
  pair a line, the two symbols separated by one space. Refused, naming the file and line (from
  1): a line that is not two symbols, and a pair whose symbols or whose merge the vocabulary
  lacks (a merges.txt of another vocabulary)."""
  try:
    text = file_io.read_text(merges_file)
  except FileNotFoundError as e:
    raise FileNotFoundError(f"--merges_file {merges_file}: no such file.") from e
  merges = []
  for line_number, line in enumerate(text.split("\n"), start=1):
    line = line.rstrip("\r")
    if not line or (line_number == 1 and line.startswith(MERGES_HEADER)):
      continue
    parts = line.split(" ")
    if len(parts) != 2 or not all(parts):
      raise ValueError(f"{merges_file}: line {line_number}: {line[:60]!r} is not two symbols "
                       "separated by one space; every line of a merges.txt is one merge.")
    for symbol in (parts[0], parts[1], parts[0] + parts[1]):
      if symbol not in vocab:
        raise ValueError(f"{merges_file}: line {line_number}: {symbol[:40]!r} is not in the "
                         "vocabulary; the merges.txt belongs to another vocab.json.")
    merges.append((parts[0], parts[1]))
  return merges


def build(vocab: dict[str, int], merges: list[tuple[str, str]], special_tokens: Iterable[str]):
  """A `tokenizers.Tokenizer` that encodes as transformers' `RobertaTokenizer` does: no space
  added before the text (its `add_prefix_space=False`), and `special_tokens` (empty: none) cut
  out of text as whole tokens before the rest is encoded."""
  # pylint: disable-next=g-import-not-at-top
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None,
                                   continuing_subword_prefix="", end_of_word_suffix="",
                                   fuse_unk=False))
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  special_tokens = list(special_tokens)
  if special_tokens:
    tokenizer.add_special_tokens(special_tokens)
  return tokenizer


def train_vocab(sentences: Iterable[str], vocab_file: str, merges_file: str, vocab_size: int,
                min_frequency: int = 2) -> None:
  """Trains a byte-level BPE of `vocab_size` tokens (specials included) on `sentences` and writes
  `vocab_file` / `merges_file` in RoBERTa's layout: <s>, <pad>, </s>, <unk> at 0-3, <mask> last."""
  from tokenizers import ByteLevelBPETokenizer  # pylint: disable=g-import-not-at-top
  if vocab_size < 256 + len(SPECIAL_TOKENS):
    raise ValueError(f"vocab_size={vocab_size}: a byte-level BPE needs at least "
                     f"{256 + len(SPECIAL_TOKENS)} tokens (256 bytes and 5 special tokens).")
  tokenizer = ByteLevelBPETokenizer(add_prefix_space=False)
  tokenizer.train_from_iterator(sentences, vocab_size=vocab_size - 1, min_frequency=min_frequency,
                                special_tokens=[BOS, PAD, EOS, UNK], show_progress=False)
  with tempfile.TemporaryDirectory(prefix="bert_jax_bpe_") as tmp:
    tokenizer.save_model(tmp)
    with open(os.path.join(tmp, "vocab.json"), encoding="utf-8") as f:
      vocab = json.load(f)
    with open(os.path.join(tmp, "merges.txt"), encoding="utf-8") as f:
      merges = f.read()
  if [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])[:4]] != [BOS, PAD, EOS, UNK]:
    raise RuntimeError(f"tokenizers did not put {BOS}, {PAD}, {EOS}, {UNK} first.")
  vocab[MASK] = len(vocab)
  file_io.write_text_atomic(vocab_file, json.dumps(vocab, ensure_ascii=False) + "\n")
  file_io.write_text_atomic(merges_file, merges)


class ByteLevelBPETokenizer(Tokenizer):
  """GPT-2 / RoBERTa byte-level BPE over a `vocab.json` and its `merges.txt` (read and checked as
  above).

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
    self.vocab = load_vocab_json(vocab_file)
    self.vocab_size = len(self.vocab)
    self.id_to_token = [""] * self.vocab_size
    for token, index in self.vocab.items():
      if index >= self.vocab_size:
        raise ValueError(f"{vocab_file}: the id of {token[:40]!r} is {index} but there are "
                         f"{self.vocab_size} tokens; ids must be 0 to {self.vocab_size - 1}.")
      self.id_to_token[index] = token
    check_specials(vocab_file, self.vocab, SPECIAL_TOKENS,
                   how="keys of vocab.json, as in RoBERTa's")
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
        self.vocab[t] for t in SPECIAL_TOKENS)
    self._byte_of = {symbol: b for b, symbol in enumerate(byte_symbols())}
    merges = load_merges(self.merges_file, self.vocab)
    self._special_set = set(self.special_ids.values())
    self._is_special = np.zeros(self.vocab_size, bool)
    self._is_special[list(self.special_ids.values())] = True
    self.word_start_table = self._is_special | np.array(
        [t.startswith(WORD_START) for t in self.id_to_token], bool)
    self._rust = build(self.vocab, merges, () if split_special_tokens else SPECIAL_TOKENS)

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
