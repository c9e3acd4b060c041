"""The tokenizer files of a Hugging Face export: transformers' AutoTokenizer, given nothing but
the export's directory, splits text into the ids this package's tokenizer gives, for every family
and casing (a cased model read lower-cased would see `linux` where it learnt `Linux`)."""

import json

import pytest
import transformers

from bert_jax.interop import hf_config, hf_tokenizer
from bert_jax.text import vocab_files
from data_prep import train_tokenizer
from tests import helpers

TEXTS = helpers.HARD_CASES + [
    "Linux Is Great", "HELLO World hello wORLD O'Brien McDonald's",
    "<mask> and <s>x</s> [MASK] [CLS]a[SEP]", "1,000,000 people, 3,5 and 12",
    "``Quoted,'' he said", "   ", "naïve Ἀθῆναι Ωμέγα ǅ ﬀ Ⓐ ℌ"]
CONFIGS = {
    "bert": transformers.BertConfig, "electra": transformers.ElectraConfig,
    "albert": lambda **k: transformers.AlbertConfig(embedding_size=16, **k),
    "roberta": lambda **k: transformers.RobertaConfig(pad_token_id=1, **k),
    "distilbert": lambda **k: transformers.DistilBertConfig(dim=32, n_layers=1, n_heads=2,
                                                            hidden_dim=37, vocab_size=k["vocab_size"],
                                                            max_position_embeddings=64),
}


@pytest.fixture(scope="module")
def vocabularies(plays_corpus, tmp_path_factory):
  """(family, lower-cased?) → vocabulary files trained on the plays (the packaged MiniLM's real
  uncased vocab.txt for BERT)."""
  work = tmp_path_factory.mktemp("vocabs")
  cased = train_tokenizer.train_wordpiece([plays_corpus], str(work / "cased"), vocab_size=800,
                                          do_lower_case=False)
  uncased = train_tokenizer.train_wordpiece([plays_corpus], str(work / "uncased"),
                                            vocab_size=800, do_lower_case=True)
  spm = train_tokenizer.train_sentencepiece([plays_corpus], str(work / "spiece"), "unigram", 800,
                                            flavour="albert")
  vocab, merges = train_tokenizer.train_byte_level_bpe([plays_corpus], str(work / "rb"), 800)
  minilm = f"{helpers.minilm_dir()}/vocab.txt"
  return {
      ("bert", True): vocab_files.VocabularyFiles(vocab_file=minilm, do_lower_case=True),
      ("bert", False): vocab_files.VocabularyFiles(vocab_file=cased, do_lower_case=False),
      ("electra", True): vocab_files.VocabularyFiles(vocab_file=uncased, do_lower_case=True),
      ("electra", False): vocab_files.VocabularyFiles(vocab_file=cased, do_lower_case=False),
      ("distilbert", False): vocab_files.VocabularyFiles(vocab_file=cased, do_lower_case=False),
      ("albert", True): vocab_files.VocabularyFiles(spm_model_file=spm, do_lower_case=True,
                                                    flavour="albert"),
      ("roberta", False): vocab_files.VocabularyFiles(vocab_file=vocab, merges_file=merges),
  }


@pytest.mark.parametrize("family, lower", [("bert", True), ("bert", False), ("electra", True),
                                           ("electra", False), ("distilbert", False),
                                           ("albert", True), ("roberta", False)])
def test_auto_tokenizer_on_the_export_gives_our_ids(vocabularies, family, lower, tmp_path):
  files = vocabularies[(family, lower)]
  ours = files.load(family)
  config = hf_config.config_from_dict(
      CONFIGS[family](vocab_size=ours.vocab_size).to_dict())
  vocab_files.keep(files, str(tmp_path))
  written = hf_tokenizer.write(str(tmp_path), config)
  assert written and "model_max_length=" in written
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert len(theirs) == ours.vocab_size
  assert theirs.model_max_length == config.max_position_embeddings - config.position_offset
  for text in TEXTS:
    assert theirs(text, add_special_tokens=False)["input_ids"] == ours.encode(text), text
  pair = theirs("Linux Is Great", "and so is this")["input_ids"]
  assert theirs.convert_ids_to_tokens(pair)[0] == hf_tokenizer.tokenizer_config(
      files, config)["cls_token"]
  first = theirs.tokenize("Linux Is Great")[0].lstrip("\u2581\u0120")  # SentencePiece's ▁, BPE's Ġ
  assert first[0] == ("l" if lower else "L")
  specials = json.load(open(tmp_path / hf_tokenizer.SPECIAL_TOKENS_NAME))
  assert specials["mask_token"] == theirs.mask_token


def test_sentencepiece_in_berts_layout_gets_no_tokenizer_files(plays_corpus, tmp_path):
  spm = train_tokenizer.train_sentencepiece([plays_corpus], str(tmp_path / "spm"), "unigram", 500)
  files = vocab_files.VocabularyFiles(spm_model_file=spm, do_lower_case=True)
  out = tmp_path / "export"
  vocab_files.keep(files, str(out))
  config = hf_config.config_from_dict(transformers.BertConfig(vocab_size=500).to_dict())
  with pytest.raises(ValueError, match="SentencePiece model in BERT's layout"):
    hf_tokenizer.write(str(out), config)
  assert not (out / hf_tokenizer.CONFIG_NAME).exists()
