"""The Python API (`tasks/pipeline.py`): any checkpoint loaded by path with what it serves.
Fill-mask on a Hugging Face directory of every family gives transformers' own probabilities;
the fine-tuned modes give what `predict` prints (tests/e2e/test_predict.py, the tagging and
multiple-choice command tests); a method of another mode is refused by name."""

import json
import os
import shutil

import numpy as np
import pytest
import torch
import transformers

from bert_jax import inference
from bert_jax.tasks import finetuned, pipeline
from data_prep import train_tokenizer
from tests import helpers

SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0)
TEXT = "the king shall [MASK] to the castle , and the [MASK] with him ."


@pytest.fixture(scope="module")
def vocabularies(plays_corpus, tmp_path_factory):
  work = tmp_path_factory.mktemp("pipeline_vocabs")
  vocab, merges = train_tokenizer.train_byte_level_bpe([plays_corpus], str(work / "rb"), 600)
  spm = train_tokenizer.train_sentencepiece([plays_corpus], str(work / "spiece"), "unigram", 600,
                                            flavour="albert")
  return {"wordpiece": os.path.join(helpers.minilm_dir(), "vocab.txt"), "bpe": (vocab, merges),
          "spiece": spm}


def _family_dir(family, vocabularies, directory):
  """A Hugging Face masked LM of `family` with random weights (every tensor perturbed) and the
  family's vocabulary beside it."""
  torch.manual_seed(0)
  os.makedirs(directory)
  if family == "roberta":
    vocab, merges = vocabularies["bpe"]
    shutil.copy(vocab, os.path.join(directory, "vocab.json"))
    shutil.copy(merges, os.path.join(directory, "merges.txt"))
    size = len(json.load(open(vocab, encoding="utf-8")))
    model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(
        vocab_size=size, type_vocab_size=1, pad_token_id=1, **{**SIZES,
                                                               "max_position_embeddings": 66}))
  elif family == "albert":
    shutil.copy(vocabularies["spiece"], os.path.join(directory, "spiece.model"))
    model = transformers.AlbertForMaskedLM(transformers.AlbertConfig(
        vocab_size=600, embedding_size=16, hidden_act="gelu_new", **SIZES))
  else:
    shutil.copy(vocabularies["wordpiece"], os.path.join(directory, "vocab.txt"))
    config = {"bert": transformers.BertConfig(vocab_size=30522, **SIZES),
              "electra": transformers.ElectraConfig(vocab_size=30522, embedding_size=16, **SIZES),
              "distilbert": transformers.DistilBertConfig(
                  vocab_size=30522, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                  max_position_embeddings=64, dropout=0.0, attention_dropout=0.0)}[family]
    model = transformers.AutoModelForMaskedLM.from_config(config)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  model.eval().save_pretrained(directory)
  return model


@pytest.mark.parametrize("family", ["bert", "roberta", "albert", "electra", "distilbert"])
def test_fill_mask_on_every_familys_directory_gives_transformers_probabilities(
    family, vocabularies, tmp_path):
  reference = _family_dir(family, vocabularies, str(tmp_path / family))
  model = pipeline.load(str(tmp_path / family))
  assert model.mode == "fill_mask" and model.config.model_type == family
  (result,) = model.fill_mask(TEXT, top_k=3)
  assert result["text"] == TEXT and len(result["predictions"]) == 2  # one list per [MASK]
  # transformers' probabilities over the same ids, at the same positions.
  tokenizer = model.tokenizer
  mask_token = tokenizer.convert_ids_to_tokens([tokenizer.mask_id])[0]
  ids = tokenizer.build_inputs(tokenizer.encode(
      inference.mask_text(TEXT, mask_token, strip_left=bool(tokenizer.word_prefix))))
  with torch.no_grad():
    logits = reference(input_ids=torch.tensor([ids])).logits[0]
  probs = torch.softmax(logits, -1).numpy()
  where = [i for i, t in enumerate(ids) if t == tokenizer.mask_id]
  for position, predicted in zip(where, result["predictions"]):
    top = np.argsort(-probs[position])[:3]
    shown = [t.lstrip("\u0120\u2581") for t in tokenizer.convert_ids_to_tokens(top.tolist())]
    assert [t.lstrip("\u0120\u2581") for t, _ in predicted] == shown  # word marks aside
    np.testing.assert_allclose([p for _, p in predicted], probs[position][top], atol=1e-5)


def test_bfloat16_compute_gives_the_float32_predictions_closely(vocabularies, sst2_model,
                                                                tmp_path):
  """`dtype="bfloat16"`: the model computes in bfloat16 (parameters as stored) and predicts
  what float32 does, to bfloat16's rounding; another dtype is refused by name."""
  _family_dir("bert", vocabularies, str(tmp_path / "bert"))
  exact = pipeline.load(str(tmp_path / "bert"))
  fast = pipeline.load(str(tmp_path / "bert"), dtype="bfloat16")
  assert (exact.config.dtype, fast.config.dtype) == ("float32", "bfloat16")
  for want, got in zip(exact.fill_mask(TEXT, top_k=3)[0]["predictions"],
                       fast.fill_mask(TEXT, top_k=20)[0]["predictions"]):
    found = dict(got)
    for token, probability in want:  # float32's best three among bfloat16's best twenty
      assert found[token] == pytest.approx(probability, rel=0.05), (token, want, got)
  texts = ["a moving and beautiful film", ("a dull mess", "so boring")]
  exact = pipeline.load(sst2_model["out"]).classify(texts)
  fast = pipeline.load(sst2_model["out"], dtype="bfloat16").classify(texts)
  for a, b in zip(exact, fast):
    assert b["probability"] == pytest.approx(a["probability"], abs=0.02), (a, b)
  with pytest.raises(ValueError, match="dtype 'float16': expected one of float32, bfloat16"):
    pipeline.load(sst2_model["out"], dtype="float16")


def test_the_fine_tuned_modes_and_their_refusals(sst2_model, squad_v2_model):
  classifier = pipeline.load(sst2_model["out"])
  assert classifier.mode == "classify" and classifier.labels == ["0", "1"]
  (one,) = classifier.classify("a moving and beautiful film")
  both = classifier.classify(["a moving and beautiful film", ("a dull mess", "so boring")])
  # The same answer alone or in a batch (to float rounding: other shapes, other kernels).
  assert one["label"] == both[0]["label"] and both[1]["text_b"] == "so boring"
  assert one["probability"] == pytest.approx(both[0]["probability"], abs=1e-6)
  assert classifier.classify("a ||| b")[0]["text_b"] == "b"
  with pytest.raises(finetuned.PredictError, match="it serves classify, not fill_mask"):
    classifier.fill_mask("the [MASK]")
  named = pipeline.load(sst2_model["out"], label_list=["neg", "pos"])
  assert set(named.classify("fine")[0]["probabilities"]) == {"neg", "pos"}

  reader = pipeline.load(squad_v2_model["out"])
  assert reader.mode == "qa" and reader.settings["doc_stride"] == 32  # as fine-tuned
  context = "Alan Mulally ran Boeing's airplane business before he led Ford."
  answers = reader.answer(["Who led Ford?", "What did he run?"], context=context)
  assert [a["question"] for a in answers] == ["Who led Ford?", "What did he run?"]
  assert all(set(a) >= {"answer", "probability"} for a in answers), answers
  with pytest.raises(ValueError, match="needs the context"):
    reader.answer("Who?")
  with pytest.raises(TypeError, match="unknown settings"):
    pipeline.load(squad_v2_model["out"], doc_strides=3)
