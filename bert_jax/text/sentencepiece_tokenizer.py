"""SentencePiece tokenizers: a model in BERT's layout (`data_prep/train_tokenizer.py` makes
them), and an ALBERT `spiece.model` with ALBERT's text preprocessing and its rule for numbers.

Both read the model with the `sentencepiece` library; they differ in the special pieces' names
and in what happens to text before encoding, which must match how the model was trained.
"""

from __future__ import annotations

import unicodedata
from typing import Iterable, Sequence

import numpy as np

from bert_jax import file_io
from bert_jax.text.tokenization import (PAD, SPECIAL_TOKENS, SPM_WORD_START, UNK, Tokenizer,
                                        check_specials)


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
    check_specials(model_file, names, how="pad and unk as the model's pad and unk pieces, "
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
    return self.encode_batch([text])[0]

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """One call into SentencePiece for the plain parts of every text: its per-call cost (~100
    µs from Python) outweighs the encoding of a short text, such as the single words SQuAD's
    contexts are encoded as."""
    if self.split_special_tokens:
      return self._encode_preprocessed([self._preprocess(t) for t in texts])
    split = [self._split_on_specials(t) for t in texts]
    encoded = iter(self._encode_preprocessed(
        [self._preprocess(p) for pieces in split for p in pieces if not isinstance(p, int)]))
    out = []
    for pieces in split:
      ids: list[int] = []
      for piece in pieces:
        if isinstance(piece, int):
          ids.append(piece)
        else:
          ids.extend(next(encoded))
      out.append(ids)
    return out

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
