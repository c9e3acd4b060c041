"""The tokenizer interface, and `load_tokenizer`, which picks the kind from the files given.

Everything downstream (pre-training data, the input pipeline's dynamic masking, fine-tuning
features) needs the same few things from a tokenizer: text → ids, the ids of the five special
tokens, and which ids begin a word (whole-word masking groups a word's pieces). `Tokenizer` is
that interface, so that no caller depends on which kind it holds. The kinds, each in a module of
its own: WordPiece over a BERT `vocab.txt` (`wordpiece`), SentencePiece in BERT's and ALBERT's
layouts (`sentencepiece_tokenizer`), and RoBERTa's byte-level BPE over `vocab.json` +
`merges.txt` (`bpe`).

The five special tokens are known by role (pad, unk, cls, sep, mask), since the families name
them differently: BERT's [PAD] [UNK] [CLS] [SEP] [MASK], RoBERTa's <pad> <unk> <s> </s> <mask>,
ALBERT's <pad> <unk> [CLS] [SEP] [MASK]. Their strings, where they occur literally in text
("[MASK]", "<mask>"), are single tokens by default, as in transformers;
`split_special_tokens=True` treats them as ordinary text, as the original did. Pre-training data
uses the latter so that corpus text can never forge a [SEP] or a [MASK] inside an instance.
"""

from __future__ import annotations

import abc
import itertools
import os
import re
from typing import Iterable, Sequence

import numpy as np

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
    return flatten_ids(self.encode_batch(texts))

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


def flatten_ids(id_lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
  """The ids of `id_lists` back to back (int32) and each list's count: the bulk form of
  `encode_batch` (`Tokenizer.encode_batch_flat`)."""
  counts = np.fromiter(map(len, id_lists), np.int64, count=len(id_lists))
  ids = np.fromiter(itertools.chain.from_iterable(id_lists), np.int32, count=int(counts.sum()))
  return ids, counts


def check_specials(source: str, present: Iterable[str],
                   required: Sequence[str] = SPECIAL_TOKENS,
                   how: str = "one per line in vocab.txt") -> None:
  """Refuses a vocabulary that lacks one of the special tokens a tokenizer of its kind needs,
  naming the file and where the tokens belong (`how`)."""
  present = set(present)
  missing = [t for t in required if t not in present]
  if missing:
    raise ValueError(f"{source}: the vocabulary lacks the special token(s) {', '.join(missing)}; "
                     f"the tokenizer needs all of {', '.join(required)} ({how}).")


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
    BPE, with `merges_file` or else the merges.txt beside it (`bpe.default_merges_file`); RoBERTa
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
  # Each kind's module builds on this one's `Tokenizer`, so they are imported when one is loaded.
  # pylint: disable-next=g-import-not-at-top
  from bert_jax.text import bpe, sentencepiece_tokenizer, wordpiece
  if spm_model_file:
    if flavour == "albert":
      return sentencepiece_tokenizer.AlbertSentencePieceTokenizer(
          spm_model_file, do_lower_case=do_lower_case, split_special_tokens=split_special_tokens)
    return sentencepiece_tokenizer.SentencePieceTokenizer(
        spm_model_file, do_lower_case=do_lower_case, split_special_tokens=split_special_tokens)
  if byte_level:
    return bpe.ByteLevelBPETokenizer(vocab_file, merges_file,
                                     split_special_tokens=split_special_tokens)
  return wordpiece.WordPieceTokenizer(vocab_file, do_lower_case=do_lower_case,
                                      split_special_tokens=split_special_tokens, **kwargs)
