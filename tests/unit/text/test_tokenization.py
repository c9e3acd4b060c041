"""WordPiece and SentencePiece tokenizers against transformers' BertTokenizer, on real text."""

import os

import numpy as np
import pytest

from bert_jax.text import (ascii_lines, sentencepiece_tokenizer, tokenization, unknown_tokens,
                           wordpiece)
from data_prep import demo_corpus, train_tokenizer
from tests.helpers import HARD_CASES, minilm_dir


def vocab_path() -> str:
  return os.path.join(minilm_dir(), "vocab.txt")


@pytest.fixture(scope="module")
def reference():
  from transformers import BertTokenizer  # pylint: disable=g-import-not-at-top
  tok = BertTokenizer.from_pretrained(minilm_dir())
  assert tok.vocab_size == 30522  # the vocabulary really loaded (transformers 5.x pitfall)
  return tok


@pytest.fixture(scope="module")
def corpus_lines():
  text = demo_corpus.corpus_text()
  lines = [line for line in text.split("\n") if line]
  assert len(text) > 4_000_000 and len(lines) > 50_000
  return lines


def hf_ids(reference, texts):
  return reference(list(texts), add_special_tokens=False)["input_ids"]


@pytest.mark.slow
def test_wordpiece_matches_transformers_on_the_whole_corpus(reference, corpus_lines):
  ours = wordpiece.WordPieceTokenizer(vocab_path(), max_input_chars_per_word=100)
  assert ours.vocab_size == 30522 and ours.backend == "rust"
  expected = hf_ids(reference, corpus_lines)
  got = ours.encode_batch(corpus_lines)
  mismatches = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
  assert not mismatches, [corpus_lines[i] for i in mismatches[:3]]
  assert sum(map(len, got)) > 1_000_000


def test_python_backend_is_the_original_algorithm(reference, corpus_lines):
  """The plain-Python restatement (no shortcuts) agrees with transformers on real lines."""
  ours = wordpiece.WordPieceTokenizer(vocab_path(), backend="python",
                                         max_input_chars_per_word=100)
  lines = corpus_lines[::25]
  expected = hf_ids(reference, lines)
  plain = ours._python  # pylint: disable=protected-access
  assert [plain.encode(line) for line in lines] == expected
  assert ours.encode_batch(lines) == expected


def test_array_path_is_the_plain_one(corpus_lines, monkeypatch):
  """The array tokenizer of printable-ASCII lines gives `encode`'s ids line by line: across
  blocks, with its table of known tokens starting afresh, with other lines mixed in (they go
  through the per-text path), and for tokens of 8, 9, 16, 17 and over 200 bytes."""
  lines = corpus_lines[:3000] + [
      "abcdefgh abcdefghi abcdefghijklmnop abcdefghijklmnopq", "x" * 250 + " y", "",
      "tab\tseparated\twords", "caf\u00e9 au lait", "[MASK] stays text", "\x7fdel", "  "]
  lines = lines[::2] + lines[1::2]
  for split in (True, False):
    tok = wordpiece.WordPieceTokenizer(vocab_path(), split_special_tokens=split)
    expected = [tok.encode(line) for line in lines]
    assert tok.encode_batch(lines) == expected
    ids, counts = tok.encode_lines("\n".join(lines))
    assert ids.dtype == np.int32 and counts.tolist() == [len(e) for e in expected]
    assert ids.tolist() == [i for e in expected for i in e]
    # A small table of known tokens and small blocks: the table starts afresh many times.
    table = ascii_lines.AsciiLinesEncoder  # pylint: disable=protected-access
    monkeypatch.setattr(table, "_MAX_ENTRIES", 500)
    fresh = wordpiece.WordPieceTokenizer(vocab_path(), split_special_tokens=split)
    monkeypatch.setattr(fresh, "_BLOCK_CHARS", 4000)
    assert fresh.encode_batch(lines) == expected
    assert fresh.encode_batch(lines[::-1]) == expected[::-1]
    monkeypatch.undo()
  # Texts that span lines are encoded whole, as `encode` does.
  assert tok.encode_batch(["one\ntwo", "three"]) == [tok.encode("one\ntwo"), tok.encode("three")]
  assert tok.encode_batch([]) == []


@pytest.mark.parametrize("backend", ["rust", "python"])
def test_hard_cases_match_transformers(reference, backend):
  ours = wordpiece.WordPieceTokenizer(vocab_path(), backend=backend,
                                         max_input_chars_per_word=100)
  for text in HARD_CASES:
    assert ours.encode(text) == hf_ids(reference, [text])[0], text
  assert ours.encode_batch(HARD_CASES) == hf_ids(reference, HARD_CASES)


def test_documented_differences_of_the_python_backend(reference):
  """Private-use characters: the original keeps them as a word ([UNK]); Rust cleanup drops them."""
  python = wordpiece.WordPieceTokenizer(vocab_path(), backend="python")
  text = "\ue000pua word"
  assert python.tokenize(text) == ["[UNK]", "word"]
  assert reference.convert_ids_to_tokens(hf_ids(reference, [text])[0]) == ["pu", "##a", "word"]


def test_cased_vocabulary_matches_transformers(corpus_lines):
  from transformers import BertTokenizer  # pylint: disable=g-import-not-at-top
  tokens = wordpiece.load_vocab(vocab_path())
  reference = BertTokenizer(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=False)
  assert reference.vocab_size == 30522
  lines = corpus_lines[::40] + HARD_CASES
  for backend in ("rust", "python"):
    ours = wordpiece.WordPieceTokenizer(vocab_path(), do_lower_case=False, backend=backend,
                                           max_input_chars_per_word=100)
    assert ours.encode_batch(lines) == hf_ids(reference, lines), backend
  assert ours.tokenize("Hamlet") != ["hamlet"]


def test_word_length_limit_is_the_originals_200():
  word = "ab" * 75  # 150 characters that WordPiece can spell
  ours = wordpiece.WordPieceTokenizer(vocab_path())
  assert len(ours.tokenize(word)) > 1 and "[UNK]" not in ours.tokenize(word)
  assert ours.tokenize("ab" * 101) == ["[UNK]"]
  capped = wordpiece.WordPieceTokenizer(vocab_path(), max_input_chars_per_word=100)
  assert capped.tokenize(word) == ["[UNK]"]  # transformers' limit


def test_special_tokens_in_text():
  default = wordpiece.WordPieceTokenizer(vocab_path())
  assert default.tokenize("a [MASK] b[SEP]") == ["a", "[MASK]", "b", "[SEP]"]
  for backend in ("rust", "python"):
    split = wordpiece.WordPieceTokenizer(vocab_path(), split_special_tokens=True,
                                            backend=backend)
    assert split.tokenize("a [MASK] b[SEP]") == ["a", "[", "mask", "]", "b", "[", "sep", "]"]
  assert (default.cls_id, default.sep_id, default.mask_id, default.pad_id, default.unk_id) == (
      101, 102, 103, 0, 100)


def test_word_starts_mark_wordpiece_continuations():
  tok = wordpiece.WordPieceTokenizer(vocab_path())
  ids = tok.encode("unaffable presumptuousness")
  tokens = tok.convert_ids_to_tokens(ids)
  assert len(tokens) > 2
  np.testing.assert_array_equal(tok.word_starts(ids), [not t.startswith("##") for t in tokens])
  assert tok.word_start_table[[tok.cls_id, tok.sep_id, tok.mask_id]].all()


def test_vocabulary_without_specials_is_refused(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("[PAD]\n[UNK]\nthe\nking\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"vocab.txt.*\[CLS\], \[SEP\], \[MASK\]"):
    wordpiece.WordPieceTokenizer(str(path))
  with pytest.raises(FileNotFoundError, match="no such file"):
    wordpiece.WordPieceTokenizer(str(tmp_path / "missing.txt"))
  with pytest.raises(ValueError, match="exactly one"):
    tokenization.load_tokenizer()


# -- damaged vocabularies: refused by file and line; released ones load -----------------------

SMALL_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s"]


def _write_vocab(tmp_path, tokens, prefix=b"", newline="\n"):
  path = tmp_path / "vocab.txt"
  path.write_bytes(prefix + (newline.join(tokens) + newline).encode("utf-8"))
  return str(path)


@pytest.mark.parametrize("tokens, message", [
    (SMALL_VOCAB + ["dog", "cat"], "line 10: the token 'cat' is already on line 7"),
    (SMALL_VOCAB[:6] + [""] + SMALL_VOCAB[6:], "line 7 is empty"),
    (SMALL_VOCAB + ["new york"], "line 9: the token 'new york' holds a space"),
    (SMALL_VOCAB + ["new\tyork"], "line 9: the token 'new\\tyork' holds a tab"),
    (SMALL_VOCAB + ["nu\x00l"], "line 9: the token 'nu\\x00l' holds a NUL byte"),
    (SMALL_VOCAB + ["esc\x1b[0m"], "line 9: the token 'esc\\x1b[0m' holds the control "
                                   "character U+001B"),
    (SMALL_VOCAB + ["x" * 100_000], "line 9: a token of 100,000 characters"),
], ids=["duplicate", "empty", "space", "tab", "nul", "control", "long"])
def test_a_damaged_vocabulary_is_refused_naming_file_and_line(tmp_path, tokens, message):
  path = _write_vocab(tmp_path, tokens)
  with pytest.raises(ValueError) as caught:
    tokenization.load_tokenizer(vocab_file=path)
  assert str(caught.value).startswith(f"{path}: {message}")
  assert "\n" not in str(caught.value)


def test_vocabulary_quirks_of_real_files_are_accepted(tmp_path):
  """A byte-order mark, CRLF line ends, spaces around a token (the original stripped them), and
  entries that are non-ASCII whitespace — the Chinese BERT vocab.txt holds U+2028 — as ids that
  keep the following entries in place. The MiniLM vocabulary (BERT's uncased one) loads whole."""
  tok = tokenization.load_tokenizer(vocab_file=_write_vocab(
      tmp_path, SMALL_VOCAB + [" dog ", "\u2028", "\u3000", "fish"], prefix=b"\xef\xbb\xbf",
      newline="\r\n"))
  assert (tok.pad_id, tok.mask_id, tok.vocab_size) == (0, 4, 12)
  assert tok.vocab["dog"] == 8 and tok.vocab["fish"] == 11
  assert tok.encode("the cats dog fish") == [5, 6, 7, 8, 11]
  assert tokenization.load_tokenizer(vocab_file=vocab_path()).vocab_size == 30522


def test_a_vocabulary_that_does_not_fit_the_text_is_found_by_its_unknown_rate(tmp_path, caplog):
  """A vocabulary cut short looks like any other file; its effect shows in the share of [UNK]
  pieces. (BERT's vocab.txt keeps its single characters and "##" characters early, so a cut
  after them leaves no [UNK], only longer piece sequences — the cut at 1,000 entries drops
  them.)"""
  text = demo_corpus.corpus_text(max_bytes=20_000)
  first = open(vocab_path(), encoding="utf-8").read().split("\n")[:1000]
  short = tokenization.load_tokenizer(vocab_file=_write_vocab(tmp_path, first))
  ids, _ = short.encode_lines(text)
  unknown, pieces = unknown_tokens.count_unknown(short, ids)
  assert unknown / pieces > 0.9 and pieces > unknown_tokens.MIN_PIECES_TO_REFUSE
  with pytest.raises(ValueError, match=(
      r"^corpus\.txt: 9\d\.\d% of [\d,]+ word pieces are \[UNK\] with vocab\.txt \(1,000 "
      r"entries\): the vocabulary does not fit this text .*; pass --x=1 to go on anyway\.$")):
    unknown_tokens.check_unknown_rate(short, unknown, pieces, "corpus.txt", override="pass --x=1")
  assert unknown_tokens.check_unknown_rate(short, unknown, pieces, "corpus.txt",
                                         max_rate=1.0) > 0.9
  assert "word pieces are [UNK]" in caplog.text
  # A handful of pieces says little: a warning, never an error.
  assert unknown_tokens.check_unknown_rate(short, 5, 10, "one question") == 0.5
  full = tokenization.load_tokenizer(vocab_file=vocab_path())
  ids, _ = full.encode_lines(text)
  assert unknown_tokens.count_unknown(full, ids)[0] == 0
  # Model inputs can be passed as they are: [CLS], [SEP] and [PAD] are not pieces of text.
  row = np.array([[full.cls_id, full.unk_id, 2158, full.sep_id, full.pad_id, full.pad_id]])
  assert unknown_tokens.count_unknown(full, row) == (1, 2)
  assert unknown_tokens.count_unknown(full, [[full.unk_id], [7, 8]]) == (1, 3)


@pytest.fixture(scope="module")
def training_text(tmp_path_factory):
  path = tmp_path_factory.mktemp("tok") / "corpus.txt"
  path.write_text(demo_corpus.corpus_text(max_bytes=300_000), encoding="utf-8")
  return str(path)


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_training_and_tokenizer(training_text, tmp_path, model_type):
  model = train_tokenizer.train_sentencepiece([training_text], str(tmp_path / "spm"), model_type,
                                              vocab_size=2000)
  tok = tokenization.load_tokenizer(spm_model_file=model, do_lower_case=True)
  assert isinstance(tok, sentencepiece_tokenizer.SentencePieceTokenizer)
  assert tok.vocab_size == 2000
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  lines = open(training_text, encoding="utf-8").read().split("\n")[:500]
  ids = tok.encode_batch(lines)
  flat = np.concatenate([np.asarray(i) for i in ids if i])
  assert flat.size > 5000
  assert not np.isin(flat, [0, 2, 3, 4]).any()  # text never yields [PAD]/[CLS]/[SEP]/[MASK]
  assert (flat == tok.unk_id).mean() < 0.01
  # Word starts: "▁" pieces; a word's continuation pieces are not starts.
  some = tok.encode("Unfortunately, the unfathomable king")
  pieces = tok.convert_ids_to_tokens(some)
  np.testing.assert_array_equal(tok.word_starts(some), [p.startswith("\u2581") for p in pieces])
  assert not tok.word_starts(some).all() and tok.word_starts(some)[0]
  # Literal specials in text: one token by default, plain text when split.
  assert tok.encode("a [MASK] b").count(tok.mask_id) == 1
  split = sentencepiece_tokenizer.SentencePieceTokenizer(model, do_lower_case=True,
                                                         split_special_tokens=True)
  assert tok.mask_id not in split.encode("a [MASK] b")


def test_wordpiece_training_gives_a_bert_vocab(training_text, tmp_path):
  path = train_tokenizer.train_wordpiece([training_text], str(tmp_path / "wp"), vocab_size=3000)
  lines = open(path, encoding="utf-8").read().split("\n")
  assert lines[:5] == list(tokenization.SPECIAL_TOKENS)
  assert any(t.startswith("##") for t in lines)
  tok = wordpiece.WordPieceTokenizer(path)
  assert tok.vocab_size <= 3000
  ids = tok.encode_batch(open(training_text, encoding="utf-8").read().split("\n")[:2000])
  flat = np.concatenate([np.asarray(i) for i in ids if i])
  assert (flat == tok.unk_id).mean() < 0.01
  # The same corpus, the same vocabulary: a second training writes the same file (the trainer
  # alone breaks ties in an order that changes from run to run).
  again = train_tokenizer.train_wordpiece([training_text], str(tmp_path / "again"),
                                          vocab_size=3000)
  assert open(again, encoding="utf-8").read() == "\n".join(lines)


def test_sentencepiece_model_errors(tmp_path):
  junk = tmp_path / "junk.model"
  junk.write_bytes(b"not a model")
  with pytest.raises(ValueError, match="junk.model: not a SentencePiece model"):
    sentencepiece_tokenizer.SentencePieceTokenizer(str(junk))
