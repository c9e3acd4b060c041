r"""Trains a vocabulary on the user's corpus: SentencePiece (unigram or BPE), WordPiece, or
RoBERTa's byte-level BPE.

    python -m data_prep.train_tokenizer --input_file='corpus/*.txt' --model_type=unigram \
      --vocab_size=32000 --output_prefix=vocab/spm   # → vocab/spm.model, vocab/spm.vocab
    python -m data_prep.train_tokenizer --input_file='corpus/*.txt' --model_type=wordpiece \
      --vocab_size=30522 --output_prefix=vocab/wp    # → vocab/wp.vocab.txt (BERT format)
    python -m data_prep.train_tokenizer --input_file='corpus/*.txt' --model_type=byte_bpe \
      --vocab_size=50265 --output_prefix=vocab/rb    # → vocab/rb.vocab.json, vocab/rb.merges.txt

Either way the vocabulary has BERT's special tokens, so `create_pretraining_data.py` and the
models take it as is: SentencePiece gets [PAD] = 0 and [UNK] = 1 as its pad/unk pieces and
[CLS], [SEP], [MASK] as control symbols (ids reserved, never produced from text); WordPiece
writes a `vocab.txt` that starts [PAD], [UNK], [CLS], [SEP], [MASK] and marks continuation pieces
with "##", like Google's. `--do_lower_case` lower-cases the training text (SentencePiece) or
lower-cases and strips accents (WordPiece, as uncased BERT does); use the same flag when
creating pre-training data. Input lines are sentences; blank lines are skipped.

`--flavour=albert` gives a SentencePiece model in ALBERT's layout instead (<pad> = 0, <unk> = 1,
[CLS], [SEP], [MASK] at 2-4), trained on text cleaned as ALBERT's tokenizer cleans it
(`sentencepiece_tokenizer.albert_preprocess`: accents dropped, and lower-cased with
--do_lower_case); load it with `load_tokenizer(spm_model_file=..., flavour="albert")`.
`--model_type=byte_bpe` writes RoBERTa's layout (<s>, <pad>, </s>, <unk> at 0-3, <mask> last); it
never lower-cases.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Iterator

if __package__ in (None, ""):  # run as a script: make `bert_jax` / `data_prep` importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
from absl import app, flags

from bert_jax import file_io
from bert_jax.text import bpe, sentencepiece_tokenizer, tokenization, wordpiece
from data_prep import corpus_io
# pylint: enable=g-import-not-at-top

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Command-line flags, defined only when run as a program (importers get none)."""
  flags.DEFINE_string("input_file", None,
                      "Comma-separated globs of training text (local or gs://).")
  flags.DEFINE_string("output_prefix", None, "Output path prefix (local or gs://).")
  flags.DEFINE_enum("model_type", "unigram", ["unigram", "bpe", "wordpiece", "byte_bpe"],
                    "Vocabulary kind (byte_bpe: RoBERTa's byte-level BPE).")
  flags.DEFINE_enum("flavour", "bert", ["bert", "albert"],
                    "SentencePiece: BERT's special pieces, or ALBERT's layout and preprocessing.")
  flags.DEFINE_integer("vocab_size", 32000, "Vocabulary size, special tokens included.")
  flags.DEFINE_bool("do_lower_case", True, "Lower-case the text (uncased vocabulary).")
  flags.DEFINE_integer("max_sentences", 10_000_000,
                       "Train on at most this many sentences (SentencePiece samples them).")
  flags.DEFINE_float("character_coverage", 0.9999, "SentencePiece: characters to cover.")
  flags.DEFINE_enum("decode_errors", "strict", list(corpus_io.DECODE_ERRORS),
                    "What to do with bytes that are not UTF-8 (see create_pretraining_data).")


CONTROL_SYMBOLS = (tokenization.CLS, tokenization.SEP, tokenization.MASK)
# SentencePiece's pad and unk pieces per flavour; the control symbols are the same in both.
PAD_UNK_PIECES = {"bert": (tokenization.PAD, tokenization.UNK), "albert": ("<pad>", "<unk>")}


def iter_sentences(input_files: list[str], decode_errors: str = "strict") -> Iterator[str]:
  for path in input_files:
    for document in corpus_io.iter_documents(path, decode_errors):
      yield from document


def check_has_text(input_files: list[str], decode_errors: str = "strict") -> None:
  """Refuses a corpus without a sentence (empty files, blank lines only): every trainer would
  write a vocabulary of the special tokens alone and report success."""
  if next(iter_sentences(input_files, decode_errors), None) is None:
    raise ValueError(f"{', '.join(input_files)}: no text (empty, or blank lines only); a "
                     "vocabulary is learnt from a corpus.")


def train_sentencepiece(input_files: list[str], output_prefix: str, model_type: str,
                        vocab_size: int, do_lower_case: bool = True,
                        max_sentences: int = 10_000_000, character_coverage: float = 0.9999,
                        decode_errors: str = "strict", flavour: str = "bert") -> str:
  """Trains and writes `<output_prefix>.model` / `.vocab`; returns the model path."""
  check_has_text(input_files, decode_errors)
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  if flavour not in PAD_UNK_PIECES:
    raise ValueError(f"flavour={flavour!r}: expected one of {', '.join(PAD_UNK_PIECES)}.")
  pad_piece, unk_piece = PAD_UNK_PIECES[flavour]
  sentences = iter_sentences(input_files, decode_errors)
  if flavour == "albert":
    sentences = (sentencepiece_tokenizer.albert_preprocess(s, do_lower_case) for s in sentences)
  elif do_lower_case:
    sentences = (s.lower() for s in sentences)
  with tempfile.TemporaryDirectory(prefix="bert_jax_spm_") as tmp:
    prefix = os.path.join(tmp, "spm")
    try:
      spm.SentencePieceTrainer.train(
          sentence_iterator=sentences, model_prefix=prefix, model_type=model_type,
          vocab_size=vocab_size, character_coverage=character_coverage,
          input_sentence_size=max_sentences, shuffle_input_sentence=True,
          pad_id=0, pad_piece=pad_piece, unk_id=1, unk_piece=unk_piece,
          bos_id=-1, eos_id=-1, control_symbols=list(CONTROL_SYMBOLS),
          normalization_rule_name="nmt_nfkc", minloglevel=2)
    except RuntimeError as e:
      raise ValueError(f"SentencePiece could not train on {len(input_files)} file(s) with "
                       f"--vocab_size={vocab_size}: {e}") from e
    for suffix in (".model", ".vocab"):
      with open(prefix + suffix, "rb") as f:
        file_io.write_bytes_atomic(output_prefix + suffix, f.read())
  return output_prefix + ".model"


def train_wordpiece(input_files: list[str], output_prefix: str, vocab_size: int,
                    do_lower_case: bool = True, decode_errors: str = "strict") -> str:
  """Trains a BERT WordPiece vocabulary; writes `<output_prefix>.vocab.txt` and returns it.

  The same corpus gives the same vocabulary, run after run. Hugging Face's trainer numbers the
  word-continuing pieces of single characters ("##a") in the order of a hash table, which
  differs from run to run, and breaks ties between equally frequent merges by those numbers:
  three runs on the same 200 kB gave three vocabularies. So a first pass, stopped before any
  merge, finds which "##" characters the corpus has, and the training pass gets them, sorted,
  right after the special tokens: numbered in a fixed order, every tie then falls the same way.
  The vocabulary holds the same pieces either way (those "##" characters are in it anyway), so
  the size asked for is unchanged.
  """
  check_has_text(input_files, decode_errors)
  # pylint: disable-next=g-import-not-at-top
  from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

  def train(size: int, special_tokens: list[str]) -> dict[str, int]:
    tokenizer = Tokenizer(models.WordPiece(unk_token=tokenization.UNK))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case,
        lowercase=do_lower_case)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=size, special_tokens=special_tokens,
                                        continuing_subword_prefix="##", show_progress=False)
    tokenizer.train_from_iterator(iter_sentences(input_files, decode_errors), trainer=trainer)
    return tokenizer.get_vocab()

  special = list(tokenization.SPECIAL_TOKENS)
  continuing = sorted(t for t in train(1, special) if t.startswith("##"))
  vocab = train(vocab_size, special + continuing)
  tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
  path = output_prefix + ".vocab.txt"
  file_io.write_text_atomic(path, "\n".join(tokens) + "\n")
  return path


def train_byte_level_bpe(input_files: list[str], output_prefix: str, vocab_size: int,
                         decode_errors: str = "strict") -> tuple[str, str]:
  """Trains RoBERTa's byte-level BPE; writes `<output_prefix>.vocab.json` and
  `<output_prefix>.merges.txt` and returns both paths."""
  check_has_text(input_files, decode_errors)
  vocab_file, merges_file = output_prefix + ".vocab.json", output_prefix + ".merges.txt"
  bpe.train_vocab(iter_sentences(input_files, decode_errors), vocab_file, merges_file, vocab_size)
  return vocab_file, merges_file


def main(argv):
  del argv
  input_files = corpus_io.expand_input_patterns(FLAGS.input_file)
  if FLAGS.flavour == "albert" and FLAGS.model_type not in ("unigram", "bpe"):
    print(f"train_tokenizer: error: --flavour=albert is a SentencePiece layout; "
          f"--model_type={FLAGS.model_type} has none.", file=sys.stderr)
    sys.exit(1)
  try:
    if FLAGS.model_type == "wordpiece":
      path = train_wordpiece(input_files, FLAGS.output_prefix, FLAGS.vocab_size,
                             FLAGS.do_lower_case, FLAGS.decode_errors)
      tokenizer = wordpiece.WordPieceTokenizer(path, do_lower_case=FLAGS.do_lower_case)
    elif FLAGS.model_type == "byte_bpe":
      path, merges_file = train_byte_level_bpe(input_files, FLAGS.output_prefix,
                                               FLAGS.vocab_size, FLAGS.decode_errors)
      tokenizer = bpe.ByteLevelBPETokenizer(path, merges_file)
    else:
      path = train_sentencepiece(input_files, FLAGS.output_prefix, FLAGS.model_type,
                                 FLAGS.vocab_size, FLAGS.do_lower_case, FLAGS.max_sentences,
                                 FLAGS.character_coverage, FLAGS.decode_errors, FLAGS.flavour)
      tokenizer = tokenization.load_tokenizer(spm_model_file=path,
                                              do_lower_case=FLAGS.do_lower_case,
                                              flavour=FLAGS.flavour)
  except (ValueError, FileNotFoundError) as e:
    print(f"train_tokenizer: error: {e}", file=sys.stderr)
    sys.exit(1)
  print(f"Wrote {path}: {tokenizer.vocab_size:,} tokens "
        f"(special ids: {tokenizer.special_ids}).")
  if tokenizer.vocab_size < FLAGS.vocab_size:
    print(f"note: --vocab_size={FLAGS.vocab_size:,} asked for more tokens than the corpus "
          f"yields: {tokenizer.vocab_size:,} are every piece it has; a larger corpus gives "
          "more, and a model's vocab_size must be this file's size.")


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["input_file", "output_prefix"])
  app.run(main)
