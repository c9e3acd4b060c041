"""RoBERTa's byte-level BPE and ALBERT's SentencePiece, trained on Shakespeare, against
transformers' `RobertaTokenizer` and `AlbertTokenizer` built from the same files.

transformers 5 ignores `vocab_file=` / `merges_file=` in these constructors (the tokenizer keeps
a five-token vocabulary), so the references are built with `vocab=` / `merges=` and
`from_pretrained(directory)`, and each test asserts their size before comparing ids.
"""

import json
import os
import shutil

import numpy as np
import pytest

from bert_jax.text import bpe, sentencepiece_tokenizer, tokenization
from data_prep import train_tokenizer
from tests.helpers import HARD_CASES

VOCAB_SIZE = 2000
# Beyond the WordPiece hard cases: each family's special strings, numbers with commas, quotes that
# ALBERT rewrites, whitespace at the ends and in runs, case.
SUCCESSOR_CASES = HARD_CASES + [
    "<mask> and <s>x</s></s>y <pad><unk> but <MASK> and < mask> are text",
    "a<mask>b [CLS]a[SEP] [MASK]x",
    "1,000,000 people, 3,5 and 12, 7,s; 2,000, then 1999, 42",
    "``Quoted,'' he said; ''again``",
    "\n\n  \t leading\n\ttabs  and   runs\n\n",
    "   ",
    "\n",
    "HELLO World hello wORLD O'Brien McDonald's",
    "Supercalifragilisticexpialidocious" * 12,
    "naïve Ἀθῆναι Ωμέγα ǅ ﬀ Ⓐ ℌ",
]


@pytest.fixture(scope="module")
def roberta_files(plays_corpus, tmp_path_factory):
  prefix = str(tmp_path_factory.mktemp("roberta") / "rb")
  return train_tokenizer.train_byte_level_bpe([plays_corpus], prefix, VOCAB_SIZE)


@pytest.fixture(scope="module")
def albert_model(plays_corpus, tmp_path_factory):
  directory = tmp_path_factory.mktemp("albert")
  model = train_tokenizer.train_sentencepiece([plays_corpus], str(directory / "spiece"), "unigram",
                                              VOCAB_SIZE, flavour="albert")
  assert model == str(directory / "spiece.model")
  return model


def _hf_ids(reference, texts):
  return reference(list(texts), add_special_tokens=False)["input_ids"]


def test_byte_level_bpe_matches_roberta_tokenizer(roberta_files, plays_corpus):
  from transformers import RobertaTokenizer  # pylint: disable=g-import-not-at-top
  vocab_file, merges_file = roberta_files
  assert vocab_file.endswith("rb.vocab.json") and merges_file.endswith("rb.merges.txt")
  reference = RobertaTokenizer(vocab=vocab_file, merges=merges_file)
  assert len(reference) == VOCAB_SIZE  # the files really loaded, <mask> among them
  ours = tokenization.load_tokenizer(vocab_file=vocab_file)  # merges.txt found beside it
  assert isinstance(ours, bpe.ByteLevelBPETokenizer) and ours.vocab_size == VOCAB_SIZE
  assert ours.special_ids == {"pad_id": 1, "unk_id": 3, "cls_id": 0, "sep_id": 2,
                              "mask_id": VOCAB_SIZE - 1}
  assert ours.special_tokens == ("<pad>", "<unk>", "<s>", "</s>", "<mask>")
  assert ours.special_ids == {"pad_id": reference.pad_token_id, "unk_id": reference.unk_token_id,
                              "cls_id": reference.cls_token_id, "sep_id": reference.sep_token_id,
                              "mask_id": reference.mask_token_id}

  for text in SUCCESSOR_CASES:
    assert ours.encode(text) == _hf_ids(reference, [text])[0], repr(text)
  lines = open(plays_corpus, encoding="utf-8").read().split("\n")[:3000]
  assert ours.encode_batch(lines) == _hf_ids(reference, lines)
  assert ours.encode_batch(SUCCESSOR_CASES) == _hf_ids(reference, SUCCESSOR_CASES)
  # Pairs: <s> A </s></s> B </s>.
  for a, b in [("Hello world", "Good night, sweet prince."), ("", "x"), ("<mask> a", " b ")]:
    assert ours.build_inputs(ours.encode(a), ours.encode(b)) == reference(a, b)["input_ids"]
    assert ours.build_inputs(ours.encode(a)) == reference(a)["input_ids"]
  # The text's first word takes no "Ġ" (RobertaTokenizer's add_prefix_space=False).
  assert ours.tokenize("Hello") != ours.tokenize(" Hello")
  assert ours.tokenize(" Hello")[0].startswith(bpe.WORD_START)


def test_byte_level_bpe_specials_word_starts_and_bulk_calls(roberta_files):
  ours = tokenization.load_tokenizer(vocab_file=roberta_files[0], merges_file=roberta_files[1],
                                     flavour="roberta")
  text = "Unfortunately the unfathomable king <mask> spoke"
  ids = ours.encode(text)
  assert ids.count(ours.mask_id) == 1
  assert ours.convert_tokens_to_ids(ours.convert_ids_to_tokens(ids)) == ids
  assert ours.convert_tokens_to_ids(["<mask>", "no-such-token"]) == [ours.mask_id, ours.unk_id]
  pieces = ours.convert_ids_to_tokens(ids)
  starts = ours.word_starts(ids)
  assert starts[0] and not starts.all()  # the text's first piece starts a word, "Ġ" or not
  after_special = [i + 1 for i, t in enumerate(ids[:-1]) if t == ours.mask_id]
  np.testing.assert_array_equal(
      starts, [p.startswith(bpe.WORD_START) or i == 0 or i in after_special or t == ours.mask_id
               for i, (p, t) in enumerate(zip(pieces, ids))])
  # In a model input the first piece after <s> and after </s></s> starts a word.
  a, b = ours.encode("Hello there"), ours.encode("Farewell")
  row = np.array([ours.build_inputs(a, b)])
  starts = ours.word_starts(row)
  assert starts.shape == row.shape and starts[0, 1] and starts[0, len(a) + 3]
  # Corpus text never forges a special token when they are split as text.
  split = tokenization.load_tokenizer(vocab_file=roberta_files[0], split_special_tokens=True)
  assert not set(split.encode("<s> <mask> </s> <pad> <unk>")) & set(split.special_ids.values())
  # The bulk calls give what one text at a time gives.
  texts = ["first line", "", "<mask> café 中文", "x" * 300]
  flat, counts = ours.encode_batch_flat(texts)
  assert flat.dtype == np.int32 and counts.tolist() == [len(ours.encode(t)) for t in texts]
  assert flat.tolist() == sum((ours.encode(t) for t in texts), [])
  lines_ids, line_counts = ours.encode_lines("\n".join(texts))
  assert lines_ids.tolist() == flat.tolist() and line_counts.tolist() == counts.tolist()
  assert ours.encode("") == []


def test_albert_sentencepiece_matches_albert_tokenizer(albert_model, plays_corpus):
  from transformers import AlbertTokenizer  # pylint: disable=g-import-not-at-top
  reference = AlbertTokenizer.from_pretrained(os.path.dirname(albert_model))
  assert len(reference) == VOCAB_SIZE
  ours = tokenization.load_tokenizer(spm_model_file=albert_model, flavour="albert")
  assert isinstance(ours, sentencepiece_tokenizer.AlbertSentencePieceTokenizer)
  assert ours.vocab_size == VOCAB_SIZE
  assert (ours.pad_id, ours.unk_id, ours.cls_id, ours.sep_id, ours.mask_id) == (0, 1, 2, 3, 4)
  assert ours.special_tokens == ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]")
  for text in SUCCESSOR_CASES:
    assert ours.encode(text) == _hf_ids(reference, [text])[0], repr(text)
  lines = open(plays_corpus, encoding="utf-8").read().split("\n")[:3000]
  assert ours.encode_batch(lines) == _hf_ids(reference, lines)
  for a, b in [("Hello world", "Good night, sweet prince."), ("x", "[MASK] y")]:
    assert ours.build_inputs(ours.encode(a), ours.encode(b)) == reference(a, b)["input_ids"]
  # The preprocessing: quotes, accents, case and whitespace.
  assert ours.encode("``Café''  \t NAÏVE") == ours.encode('"cafe" naive')
  split = sentencepiece_tokenizer.AlbertSentencePieceTokenizer(albert_model,
                                                               split_special_tokens=True)
  assert ours.mask_id not in split.encode("a [MASK] b")
  assert split.encode_batch(["a [MASK] b", "Ab"]) == [split.encode("a [MASK] b"),
                                                      split.encode("ab")]


def test_albert_digit_comma_rule(plays_corpus, tmp_path):
  """With pieces that end in a digit and a comma (a model trained without SentencePiece's
  split_by_number), the rule cuts the comma off; transformers 5's AlbertTokenizer built from the
  .model does not, and `split_digit_comma=False` gives its ids."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  from transformers import AlbertTokenizer  # pylint: disable=g-import-not-at-top
  numbers = [f"In {y}, {n:,} men, {n * 7:,} horses and {n % 97}, more." for y, n in
             zip(range(1500, 1700), range(1000, 2_000_000, 9_995))]
  text = open(plays_corpus, encoding="utf-8").read().split("\n")[:4000] + numbers * 5
  spm.SentencePieceTrainer.train(
      sentence_iterator=(sentencepiece_tokenizer.albert_preprocess(t) for t in text if t),
      model_prefix=str(tmp_path / "spiece"), model_type="unigram", vocab_size=VOCAB_SIZE,
      pad_id=0, pad_piece="<pad>", unk_id=1, unk_piece="<unk>", bos_id=-1, eos_id=-1,
      control_symbols=["[CLS]", "[SEP]", "[MASK]"], split_by_number=False, minloglevel=2)
  model = str(tmp_path / "spiece.model")
  ours = sentencepiece_tokenizer.AlbertSentencePieceTokenizer(model)
  plain = sentencepiece_tokenizer.AlbertSentencePieceTokenizer(model, split_digit_comma=False)
  assert ours.split_digit_comma and not plain.split_digit_comma
  cases = ["In 1600, 1,000 men and 12, then 3,", "1,000,000", "x1, 2,"] + numbers[:20]
  fired = 0
  for case in cases:
    with_rule, without = ours.tokenize(case), plain.tokenize(case)
    assert not any(sentencepiece_tokenizer._ends_in_digit_comma(p) for p in with_rule), with_rule
    assert "".join(with_rule) == "".join(without)  # the same text, cut differently
    fired += with_rule != without
  assert fired >= 5
  reference = AlbertTokenizer.from_pretrained(str(tmp_path))
  assert len(reference) == VOCAB_SIZE
  assert [plain.encode(c) for c in cases] == _hf_ids(reference, cases)


def test_bad_files_and_arguments_are_named(roberta_files, albert_model, tmp_path):
  vocab_file, merges_file = roberta_files
  vocab = json.load(open(vocab_file, encoding="utf-8"))
  lines = open(merges_file, encoding="utf-8").read().split("\n")

  bad_merges = tmp_path / "bad.merges.txt"
  bad_merges.write_text("\n".join(lines[:3] + ["Ġ t h"] + lines[3:]), encoding="utf-8")
  with pytest.raises(ValueError, match=r"bad.merges.txt: line 4: 'Ġ t h' is not two symbols"):
    tokenization.load_tokenizer(vocab_file=vocab_file, merges_file=str(bad_merges))
  foreign = tmp_path / "foreign.merges.txt"
  foreign.write_text("#version: 0.2\nĠ t\nq zz\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"foreign.merges.txt: line 3: 'zz' is not in the vocab"):
    tokenization.load_tokenizer(vocab_file=vocab_file, merges_file=str(foreign))

  lone = tmp_path / "lone" / "vocab.json"
  lone.parent.mkdir()
  shutil.copy(vocab_file, lone)
  with pytest.raises(FileNotFoundError, match=r"lone/merges.txt: no such file"):
    tokenization.load_tokenizer(vocab_file=str(lone))
  junk = tmp_path / "junk.vocab.json"
  junk.write_text("<s>\n<pad>\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"junk.vocab.json: not JSON"):
    tokenization.load_tokenizer(vocab_file=str(junk), merges_file=merges_file)
  no_mask = tmp_path / "nomask.vocab.json"
  no_mask.write_text(json.dumps({t: i for t, i in vocab.items() if t != "<mask>"}))
  with pytest.raises(ValueError, match=r"nomask.vocab.json: the vocabulary lacks .*<mask>"):
    tokenization.load_tokenizer(vocab_file=str(no_mask), merges_file=merges_file)
  twice = tmp_path / "twice.vocab.json"
  twice.write_text(json.dumps({**vocab, "<mask>": 5}))
  with pytest.raises(ValueError, match=r"twice.vocab.json: .* both have id 5"):
    tokenization.load_tokenizer(vocab_file=str(twice), merges_file=merges_file)
  bert_vocab = tmp_path / "vocab.txt"
  bert_vocab.write_text("[PAD]\n[UNK]\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"vocab.txt: not JSON"):
    tokenization.load_tokenizer(vocab_file=str(bert_vocab), merges_file=merges_file)

  with pytest.raises(ValueError, match=r"flavour='albert' needs an ALBERT SentencePiece"):
    tokenization.load_tokenizer(vocab_file=vocab_file, flavour="albert")
  with pytest.raises(ValueError, match=r"flavour='roberta' needs a byte-level BPE"):
    tokenization.load_tokenizer(spm_model_file=albert_model, flavour="roberta")
  with pytest.raises(ValueError, match=r"flavour='bert' needs"):
    tokenization.load_tokenizer(vocab_file=vocab_file, flavour="bert")
  with pytest.raises(ValueError, match=r"merges_file=.* goes with a byte-level BPE vocab.json"):
    tokenization.load_tokenizer(spm_model_file=albert_model, merges_file=merges_file)
  with pytest.raises(ValueError, match=r"flavour='gpt': expected one of bert, albert, roberta"):
    tokenization.load_tokenizer(vocab_file=vocab_file, flavour="gpt")
  with pytest.raises(ValueError, match=r"backend: WordPiece options"):
    tokenization.load_tokenizer(vocab_file=vocab_file, backend="python")
  with pytest.raises(FileNotFoundError, match=r"nowhere.model: no such file"):
    tokenization.load_tokenizer(spm_model_file=str(tmp_path / "nowhere.model"), flavour="albert")
  with pytest.raises(ValueError, match=r"vocab_size=100: a byte-level BPE needs at least 261"):
    train_tokenizer.train_byte_level_bpe([vocab_file], str(tmp_path / "tiny"), 100)


def test_sentence_pairs_take_each_familys_layout(roberta_files, albert_model):
  """Fine-tuning inputs (`pairs.encode_examples`): RoBERTa's `<s> A </s></s> B </s>` as
  transformers encodes the pair, ALBERT's `[CLS] A [SEP] B [SEP]`, and truncation that leaves
  room for every special token."""
  from transformers import AlbertTokenizer, RobertaTokenizer  # pylint: disable=g-import-not-at-top
  from bert_jax.text import pairs  # pylint: disable=g-import-not-at-top
  vocab_file, merges_file = roberta_files
  roberta = RobertaTokenizer(vocab=vocab_file, merges=merges_file)
  albert = AlbertTokenizer.from_pretrained(os.path.dirname(albert_model))
  assert len(roberta) == VOCAB_SIZE and len(albert) == VOCAB_SIZE
  texts_a = ["Good morrow, my lord.", "Is this a dagger which I see before me?"]
  texts_b = ["How does your honour?", None]
  for ours, reference in ((tokenization.load_tokenizer(vocab_file=vocab_file), roberta),
                          (tokenization.load_tokenizer(spm_model_file=albert_model,
                                                       flavour="albert"), albert)):
    feats = pairs.encode_examples(ours, texts_a, texts_b, max_seq_length=48)
    for i, (a, b) in enumerate(zip(texts_a, texts_b)):
      expected = reference(a, b)["input_ids"] if b else reference(a)["input_ids"]
      n = int(feats["input_mask"][i].sum())
      assert feats["input_ids"][i, :n].tolist() == expected, (type(ours).__name__, a, b)
      if b:  # segment 1 starts after A's separators
        assert feats["segment_ids"][i, :n].tolist().index(1) == n - len(ours.encode(b)) - 1
    long = pairs.encode_examples(ours, ["word " * 40], ["other " * 40], max_seq_length=24)
    row = long["input_ids"][0]
    assert long["input_mask"][0].sum() == 24 and row[0] == ours.cls_id and row[23] == ours.sep_id
    assert (row == ours.sep_id).sum() == 1 + ours.pair_separators
