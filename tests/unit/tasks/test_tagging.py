"""Token tagging end to end: the heads against transformers' PyTorch classes, the loss on first
pieces only, `finetune --task_name=conll2003` and `predict` on raw text through the command line,
the feature-based variant (Table 7) with its encoder untouched, conlleval against seqeval on a
real run's prediction file, and the mistakes a user makes."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import seqeval.metrics
import torch
import transformers

from bert_jax.interop import checkpoints
from bert_jax.interop import hf as hf_io
from bert_jax.model import heads
from bert_jax.runs import finetune_config
from bert_jax.tasks import registry
from bert_jax.tasks.tagging import data as conll
from bert_jax.tasks.tagging import metrics as conlleval
from bert_jax.tasks.tagging import objective as token_classification
from bert_jax.training import metrics
from tests import helpers, task_helpers



def _cli(module, *args):
  return helpers.run_command(module, *args)


def _hf_bert(tmp_path, cls, layers=2, **kwargs):
  """A transformers BERT model of class `cls` with random weights (nonzero biases, so a bias
  that is dropped shows) and the MiniLM vocabulary beside it."""
  torch.manual_seed(0)
  model = cls(transformers.BertConfig(
      vocab_size=30522, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2,
      intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0, attn_implementation="eager", **kwargs)).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.02 * torch.randn_like(p))
  directory = str(tmp_path / cls.__name__)
  model.save_pretrained(directory, safe_serialization=True)
  shutil.copy(os.path.join(helpers.minilm_dir(), "vocab.txt"), directory)
  return model, directory


def _batch(rng, batch, length):
  ids = rng.randint(1000, 30000, (batch, length)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, length - 3:] = 0
  segments = (np.arange(length)[None] >= length // 2).astype(np.int32).repeat(batch, 0)
  return ids, mask, segments


def test_token_classification_head_equals_transformers(tmp_path):
  model, directory = _hf_bert(tmp_path, transformers.BertForTokenClassification, num_labels=9)
  config, params, _ = hf_io.load_hf_checkpoint(directory)
  state = model.state_dict()
  params = {"bert": params["bert"], "classifier": {
      "kernel": state["classifier.weight"].numpy().T, "bias": state["classifier.bias"].numpy()}}
  ids, mask, segments = _batch(np.random.RandomState(0), 2, 12)
  with torch.no_grad():
    want = model(input_ids=torch.tensor(ids, dtype=torch.long),
                 attention_mask=torch.tensor(mask, dtype=torch.long),
                 token_type_ids=torch.tensor(segments, dtype=torch.long)).logits.numpy()
  got = np.asarray(heads.BertForTokenClassification(config, 9).apply(
      {"params": params}, ids, mask, segments))
  real = mask.astype(bool)
  np.testing.assert_allclose(got[real], want[real], atol=1e-5, rtol=1e-5)


def test_multiple_choice_head_equals_transformers(tmp_path):
  model, directory = _hf_bert(tmp_path, transformers.BertForMultipleChoice)
  config, params, _ = hf_io.load_hf_checkpoint(directory)
  state = model.state_dict()
  params = {"bert": params["bert"], "classifier": {
      "kernel": state["classifier.weight"].numpy().T, "bias": state["classifier.bias"].numpy()}}
  rng = np.random.RandomState(1)
  ids, mask, segments = (x.reshape(2, 3, 10) for x in _batch(rng, 6, 10))
  with torch.no_grad():
    want = model(input_ids=torch.tensor(ids, dtype=torch.long),
                 attention_mask=torch.tensor(mask, dtype=torch.long),
                 token_type_ids=torch.tensor(segments, dtype=torch.long)).logits.numpy()
  got = np.asarray(heads.BertForMultipleChoice(config).apply({"params": params}, ids, mask,
                                                             segments))
  assert got.shape == (2, 3)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_the_loss_reads_first_pieces_only():
  """Cross-entropy at weight-1 positions, averaged over them; logits elsewhere (later pieces,
  context, specials, padding) get no gradient."""
  rng = np.random.RandomState(0)
  logits = rng.randn(2, 6, 5).astype(np.float32)
  labels = rng.randint(0, 5, (2, 6)).astype(np.int32)
  weights = np.array([[0, 1, 0, 1, 1, 0], [0, 1, 1, 0, 0, 0]], np.float32)
  out = token_classification.token_classification_loss(logits, labels, weights)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  per_token = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
  np.testing.assert_allclose(float(out["loss"]), (per_token * weights).sum() / 5, rtol=1e-6)
  assert float(out["weight_sum"]) == 5
  grad = jax.grad(lambda x: token_classification.token_classification_loss(x, labels, weights)["loss"])(
      jnp.asarray(logits))
  assert np.all(np.asarray(grad)[weights == 0] == 0)
  assert np.all(np.abs(np.asarray(grad)[weights == 1]).sum(-1) > 0)


@pytest.mark.slow
@pytest.mark.e2e
def test_conll2003_through_the_command_line_and_predict_on_raw_text(bert_config_file, tmp_path):
  """`finetune --task_name=conll2003` on the released layout with document context, then
  `predict` on the same text laid out as raw sentences and documents gives exactly the tags of
  the run's prediction file, and the entities they make."""
  data = task_helpers.conll_dir(tmp_path / "conll", names=("eng.train", "eng.testa",
                                                           "eng.testb"))
  out = str(tmp_path / "ner")
  proc = _cli("bert_jax.finetune", "--task_name=conll2003", f"--data_dir={data}",
              f"--bert_config_file={bert_config_file}",
              f"--vocab_file={os.path.join(helpers.minilm_dir(), 'vocab.txt')}",
              "--do_lower_case", f"--output_dir={out}", "--do_train", "--do_eval", "--do_predict",
              "--document_context", "--max_seq_length=24", "--train_batch_size=8",
              "--learning_rate=2e-3", "--num_train_epochs=40")
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.load(open(os.path.join(out, "eval_results.json")))
  assert results["dev"]["f1"] == 1.0 and results["test"]["f1"] == 1.0, results
  assert set(results["dev"]["per_type"]) == {"PER", "ORG", "LOC", "MISC"}
  # The file is conlleval's input, tags in the files' own scheme (IOB1: "Rome" keeps its B-).
  lines = [line.split() for line in open(os.path.join(out, "dev_predictions.txt"))]
  rows = [row for row in lines if row and row[0] != "-DOCSTART-"]
  assert [row[1] for row in rows] == [t for s in task_helpers.gold_tags() for t in s]
  assert ["Rome", "B-LOC", "B-LOC"] in rows

  raw = "\n\n".join("\n".join(" ".join(w for w, *_ in sentence) for sentence in document)
                    for document in task_helpers.CONLL_DOCUMENTS)
  (tmp_path / "raw.txt").write_text(raw + "\n")
  proc = _cli("bert_jax.predict", f"--checkpoint={out}", f"--input_file={tmp_path / 'raw.txt'}",
              "--json")
  assert proc.returncode == 0, proc.stderr[-3000:]
  tagged = [json.loads(line) for line in proc.stdout.splitlines()]
  assert [t["words"] for t in tagged] == [[w for w, *_ in s] for d in task_helpers.CONLL_DOCUMENTS
                                          for s in d]
  assert [t["tags"] for t in tagged] == [conll.to_iob2(t) for t in task_helpers.gold_tags()]
  assert {"type": "PER", "text": "Werner Zwingmann", "first_word": 10,
          "last_word": 11} in tagged[-1]["entities"]
  assert all(0.0 < p <= 1.0 for t in tagged for p in t["probabilities"])
  # One sentence as --text: split into words as CoNLL writes them.
  proc = _cli("bert_jax.predict", f"--checkpoint={out}", "--text=Alan Mulally of Boeing spoke.")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Alan/B-PER Mulally/I-PER of Boeing/B-ORG spoke ." in proc.stdout
  # The Python API: the same tagger, the same records.
  from bert_jax.tasks import pipeline  # pylint: disable=g-import-not-at-top
  tagger = pipeline.load(out)
  assert tagger.mode == "tag"
  assert tagger.tag((tmp_path / "raw.txt").read_text()) == tagged


@pytest.mark.slow
def test_feature_based_tagging_keeps_the_encoder_frozen(tmp_path):
  """Table 7's variant: the last four hidden states concatenated into a BiLSTM tagger; the
  encoder comes out of training bit for bit as it went in, the tagger learns the task."""
  _, directory = _hf_bert(tmp_path, transformers.BertModel, layers=3)
  config = finetune_config.get_config()
  config.update(dict(task_name="conll2003", data_dir=task_helpers.conll_dir(tmp_path / "conll"),
                     init_checkpoint=directory, output_dir=str(tmp_path / "out"),
                     do_train=True, do_eval=True, feature_based=True, lstm_size=32,
                     max_seq_length=32, train_batch_size=16, learning_rate=1e-2,
                     num_train_epochs=120, seed=1, log_every_steps=1000))
  tokenizer = conll_tokenizer()
  results = registry.run_from_config(ml_collections.ConfigDict(config), tokenizer)
  assert results["feature_based"] is True
  assert results["dev"]["f1"] >= 0.9, results["dev"]
  _, trained = checkpoints.load_pretraining_model(str(tmp_path / "out"), require_heads=False)
  _, start, _ = hf_io.load_hf_checkpoint(directory)
  flat_trained = dict(jax.tree_util.tree_leaves_with_path(trained["bert"]))
  flat_start = dict(jax.tree_util.tree_leaves_with_path(start["bert"]))
  assert set(flat_trained) <= set(flat_start)
  for path, value in flat_trained.items():
    np.testing.assert_array_equal(np.asarray(value), np.asarray(flat_start[path]), str(path))
  tagger = trained["tagger"]
  assert set(tagger) == {"forward_0", "backward_0", "forward_1", "backward_1", "classifier"}
  # The first BiLSTM reads 4 hidden states of 32 (input kernels 128 wide), the second both
  # directions of the first (64), the classifier both directions of the second.
  assert np.shape(tagger["forward_0"]["ii"]["kernel"]) == (128, 32)
  assert np.shape(tagger["backward_1"]["ii"]["kernel"]) == (64, 32)
  assert np.shape(tagger["classifier"]["kernel"]) == (64, 9)
  # Evaluated again without training and without the flags: the output directory's recorded
  # head (feature-based, its LSTM size) is the model built, and scores as before.
  config.update(dict(do_train=False, feature_based=False, lstm_size=768))
  again = registry.run_from_config(ml_collections.ConfigDict(config), tokenizer)
  assert again["feature_based"] is True and again["dev"] == results["dev"]
  # No transformers or TF1 class holds a BiLSTM tagger: refused by name; Orbax keeps it.
  proc = helpers.run_command("bert_jax.convert", f"--from={tmp_path / 'out'}",
                             f"--to={tmp_path / 'hf'}", "--format=hf")
  assert proc.returncode == 1 and "is a feature-based tagger" in proc.stderr, proc.stderr
  assert not (tmp_path / "hf").exists()
  proc = helpers.run_command("bert_jax.convert", f"--from={tmp_path / 'out'}",
                             f"--to={tmp_path / 'orbax'}", "--format=orbax")
  assert proc.returncode == 0, proc.stderr[-2000:]


def conll_tokenizer():
  from bert_jax.text import tokenization  # pylint: disable=g-import-not-at-top
  return tokenization.load_tokenizer(
      vocab_file=os.path.join(helpers.minilm_dir(), "vocab.txt"), do_lower_case=True)


def _relabelled(documents):
  """The documents with some gold tags changed (entity types swapped, some O words made
  entities), so that a model trained on the originals disagrees with them here and there."""
  other = {"PER": "LOC", "LOC": "ORG", "ORG": "MISC", "MISC": "PER"}
  out = []
  for d, document in enumerate(documents):
    out.append([])
    for s, sentence in enumerate(document):
      tokens = []
      for w, (word, pos, chunk, tag) in enumerate(sentence):
        if tag != "O" and (d + s + w) % 3 == 0:
          tag = f"{tag[:2]}{other[tag[2:]]}"
        elif tag == "O" and (d + s + w) % 7 == 0:
          tag = "I-MISC"
        tokens.append((word, pos, chunk, tag))
      out[-1].append(tokens)
  return out


@pytest.mark.slow
def test_conlleval_equals_seqeval_on_a_real_runs_predictions(bert_config_file, tmp_path):
  """A tagger's prediction file on a dev set whose gold tags partly disagree with what it
  learned, scored by our conlleval and by seqeval (default mode, over the same columns): the
  same numbers."""
  data = task_helpers.conll_dir(tmp_path / "conll", names=("train.txt", "test.txt"))
  (tmp_path / "conll" / "valid.txt").write_text(
      task_helpers.conll_text(_relabelled(task_helpers.CONLL_DOCUMENTS)))
  config = finetune_config.get_config()
  config.update(dict(task_name="conll2003", data_dir=data,
                     bert_config_file=bert_config_file, output_dir=str(tmp_path / "out"),
                     do_train=True, do_eval=True, max_seq_length=16, train_batch_size=8,
                     learning_rate=3e-3, num_train_epochs=20, seed=2, log_every_steps=1000,
                     eval_every_steps=10))
  results = registry.run_from_config(ml_collections.ConfigDict(config), conll_tokenizer())
  # Entity F1 scored while training (the task's measure); the last is the final evaluation.
  rows = {r["step"]: r["eval_dev/f1"] for r in metrics.read_jsonl(
      os.path.join(tmp_path, "out", "metrics.jsonl")) if "eval_dev/f1" in r}
  assert sorted(rows)[:2] == [10, 20] and rows[results["train_steps"]] == results["dev"]["f1"]
  assert results["best"]["metric"] == "eval_dev/f1"
  path = os.path.join(tmp_path, "out", "dev_predictions.txt")
  scores = conlleval.evaluate_conll_file(path)
  assert 0.0 < scores.f1 < 1.0, scores.report()  # some right, some wrong: a real comparison
  assert scores.f1 == pytest.approx(results["dev"]["f1"], abs=1e-12)
  gold, predicted, sentence_gold, sentence_predicted = [], [], [], []
  for line in open(path).read().splitlines() + [""]:
    fields = line.split()
    if not fields or fields[0] == "-DOCSTART-":
      if sentence_gold:
        gold.append(sentence_gold)
        predicted.append(sentence_predicted)
      sentence_gold, sentence_predicted = [], []
      continue
    sentence_gold.append(fields[-2])
    sentence_predicted.append(fields[-1])
  for ours, theirs in ((scores.precision, seqeval.metrics.precision_score),
                       (scores.recall, seqeval.metrics.recall_score),
                       (scores.f1, seqeval.metrics.f1_score)):
    assert ours == pytest.approx(theirs(gold, predicted), abs=1e-12)


@pytest.mark.slow
@pytest.mark.e2e
def test_tagging_mistakes_get_one_clear_line(bert_config_file, tmp_path):
  data = task_helpers.conll_dir(tmp_path / "conll")
  base = ["--do_train", f"--data_dir={data}", f"--bert_config_file={bert_config_file}",
          f"--vocab_file={os.path.join(helpers.minilm_dir(), 'vocab.txt')}",
          f"--output_dir={tmp_path / 'out'}"]
  proc = _cli("bert_jax.finetune", "--task_name=tagging", *base)
  assert proc.returncode != 0 and "needs --label_list" in proc.stderr, proc.stderr[-2000:]
  proc = _cli("bert_jax.finetune", "--task_name=tagging", "--label_list=PER,LOC", *base)
  assert proc.returncode != 0
  assert "train.txt:" in proc.stderr and "B-ORG" in proc.stderr, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr
  proc = _cli("bert_jax.finetune", "--task_name=conll2003", "--packing", *base)
  assert proc.returncode != 0 and "--packing" in proc.stderr.splitlines()[-1], proc.stderr[-2000:]
