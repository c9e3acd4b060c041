"""Every model family through every downstream task, by the same fine-tuning run the command
line calls (`runs.registry.run_from_config`): BERT, RoBERTa, ALBERT, ELECTRA and DistilBERT
× token tagging (CoNLL-2003 layout) and multiple choice (SWAG layout), plus the GLUE and SQuAD
cells that other files leave open (ALBERT SQuAD, DistilBERT GLUE and SQuAD). The README's
table of which family runs which task points here.

Each family is a Hugging Face directory of what transformers' PyTorch classes save with random
weights (no dropout), with the family's vocabulary trained on Shakespeare beside it, read with
no vocabulary flag (found beside the model, read as its `model_type` reads it). The tasks are
small enough for a tiny model to memorise (dev = train), so perfect scores show the whole
route — reading, pieces and windows, the head, the loss, prediction back to words or endings,
the scores — is right for that family's tokenizer and encoder.
"""

import json
import os
import shutil

import ml_collections
import pytest
import torch
import transformers

from bert_jax.interop import checkpoints
from bert_jax.runs import finetune_config
from bert_jax.tasks import registry
from bert_jax.tasks.tagging import metrics as conlleval
from bert_jax.text import vocab_files
from data_prep import train_tokenizer
from tests import task_helpers
from tests.task_helpers import NEGATIVE, POSITIVE, sst2_dir as _sst2_dir
from tests.task_helpers import OFFICIAL

FAMILIES = ["bert", "roberta", "albert", "electra", "distilbert"]
VOCAB_SIZE = 1000
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
             attn_implementation="eager")


def _save(model, directory, files):
  model.save_pretrained(directory, safe_serialization=True)
  for source, name in files:
    shutil.copy(source, os.path.join(directory, name))
  return directory


@pytest.fixture(scope="module")
def family_dir(plays_corpus, tmp_path_factory):
  """family → a Hugging Face directory (built on first use)."""
  built = {}
  work = tmp_path_factory.mktemp("families")

  def build(family):
    if family in built:
      return built[family]
    torch.manual_seed(0)
    directory = str(work / family)
    if family == "roberta":
      vocab, merges = train_tokenizer.train_byte_level_bpe([plays_corpus], str(work / "rb"),
                                                           VOCAB_SIZE)
      size = len(json.load(open(vocab, encoding="utf-8")))
      model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(
          vocab_size=size, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
          bos_token_id=0, eos_token_id=2, **SIZES))
      files = [(vocab, "vocab.json"), (merges, "merges.txt")]
    elif family == "albert":
      spm = train_tokenizer.train_sentencepiece([plays_corpus], str(work / "spiece"), "unigram",
                                                VOCAB_SIZE, flavour="albert")
      model = transformers.AlbertForPreTraining(transformers.AlbertConfig(
          vocab_size=VOCAB_SIZE, embedding_size=16, max_position_embeddings=128,
          hidden_act="gelu_new", **SIZES))
      files = [(spm, "spiece.model")]
    else:  # WordPiece families, cased (tagging keeps the case of names)
      vocab = train_tokenizer.train_wordpiece([plays_corpus, _task_text(work)],
                                              str(work / f"wp_{family}"),
                                              vocab_size=VOCAB_SIZE, do_lower_case=False)
      size = sum(1 for _ in open(vocab, encoding="utf-8"))
      if family == "bert":
        model = transformers.BertForPreTraining(transformers.BertConfig(
            vocab_size=size, max_position_embeddings=128, **SIZES))
      elif family == "electra":
        model = transformers.ElectraForPreTraining(transformers.ElectraConfig(
            vocab_size=size, embedding_size=16, max_position_embeddings=128, **SIZES))
      else:
        model = transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(
            vocab_size=size, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
            max_position_embeddings=128, dropout=0.0, attention_dropout=0.0))
      files = [(vocab, "vocab.txt")]
    _save(model.eval(), directory, files)
    if family != "albert":
      with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": False}, f)
    else:
      with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True}, f)
    assert checkpoints.read_config(directory).model_type == family
    built[family] = directory
    return directory
  return build


def _task_text(work) -> str:
  """The tasks' own text, beside Shakespeare in the WordPiece vocabularies' training text: a
  1,000-entry vocabulary of the plays alone lacks characters the tasks use (SQuAD's digits and
  accents), and their [UNK]s are refused."""
  path = work / "task_text.txt"
  if not path.exists():
    lines = list(POSITIVE + NEGATIVE)
    lines += [" ".join(w for w, *_ in sentence) for document in task_helpers.CONLL_DOCUMENTS
              for sentence in document]
    lines += [" ".join([a, b, *endings]) for a, b, endings, _ in task_helpers.SWAG_EXAMPLES]
    for article in OFFICIAL["data"]:
      for paragraph in article["paragraphs"]:
        lines.append(paragraph["context"])
        lines += [qa["question"] for qa in paragraph["qas"]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return str(path)


def _tokenizer(directory):
  found = vocab_files.find_beside(directory)
  return found.load(checkpoints.read_config(directory).model_type)


def _run(directory, output_dir, **settings):
  config = finetune_config.get_config()
  config.update(dict(init_checkpoint=directory, output_dir=str(output_dir), do_train=True,
                     do_eval=True, learning_rate=2e-3, seed=3, log_every_steps=1000))
  config.update(settings)
  return registry.run_from_config(ml_collections.ConfigDict(config), _tokenizer(directory))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_token_tagging_runs_for_every_family(family_dir, family, tmp_path):
  """CoNLL-2003 files as released (IOB1) → windows of 24 pieces with document context (the
  long sentence takes several) → every word tagged once, scored as conlleval counts."""
  directory = family_dir(family)
  results = _run(directory, tmp_path / "out", task_name="conll2003",
                 data_dir=task_helpers.conll_dir(tmp_path / "conll"), do_predict=True,
                 max_seq_length=24, train_batch_size=8, num_train_epochs=60,
                 document_context=True)
  assert results["train_features"]["sentences_split"] >= 1, results["train_features"]
  for split in ("dev", "test"):
    assert results[split]["f1"] == 1.0, (split, results[split])
  # The prediction file is conlleval's input: every word once, gold and predicted in IOB1.
  path = os.path.join(tmp_path, "out", "test_predictions.txt")
  scores = conlleval.evaluate_conll_file(path)
  assert scores.tokens == sum(len(t) for t in task_helpers.gold_tags())
  assert scores.f1 == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_multiple_choice_runs_for_every_family(family_dir, family, tmp_path):
  """SWAG CSV files → four (context, start + ending) pairs per example in the family's pair
  layout → one score each → the right ending of every dev example, a prediction per test row."""
  directory = family_dir(family)
  results = _run(directory, tmp_path / "out", task_name="swag",
                 data_dir=task_helpers.swag_dir(tmp_path / "swag"), do_predict=True,
                 max_seq_length=32, train_batch_size=8, num_train_epochs=60)
  assert results["dev"]["accuracy"] == 1.0, results["dev"]
  assert results["dev"]["num_examples"] == len(task_helpers.SWAG_EXAMPLES)
  rows = open(os.path.join(tmp_path, "out", "test_predictions.csv")).read().splitlines()
  assert len(rows) == 1 + len(task_helpers.SWAG_EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["distilbert"])
def test_glue_runs_for_distilbert(family_dir, family, tmp_path):
  results = _run(family_dir(family), tmp_path / "out", task_name="SST-2",
                 data_dir=_sst2_dir(tmp_path / "sst2"), max_seq_length=32,
                 train_batch_size=16, num_train_epochs=60)
  assert results["dev"]["accuracy"] == 1.0, results["dev"]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["albert", "distilbert"])
def test_squad_runs_for_albert_and_distilbert(family_dir, family, tmp_path):
  data = str(tmp_path / "train-v1.1.json")
  with open(data, "w") as f:
    json.dump(OFFICIAL, f)
  results = _run(family_dir(family), tmp_path / "out", task_name="squad", train_file=data,
                 predict_file=data, do_eval=False, do_predict=True, max_seq_length=64,
                 doc_stride=24, max_query_length=16, train_batch_size=8, learning_rate=3e-3,
                 num_train_epochs=40)
  assert results["eval"]["f1"] > 50.0, results["eval"]
