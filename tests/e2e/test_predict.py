"""`python -m bert_jax.predict`: classification and question answering from fine-tuned output
directories (against what fine-tuning itself computes), fill-mask from a TF1 checkpoint prefix,
and the errors for a checkpoint or vocabulary that does not fit."""

import json
import os
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.tasks import finetuned
from bert_jax.tasks.classification import predict as classification_predict
from bert_jax import inference
from bert_jax.interop import checkpoint_store, checkpoints
from bert_jax.interop import tf1
from bert_jax.tasks.classification import objective as sequence_classification
from bert_jax.model import configuration, heads
from bert_jax.parallel import sharding
from bert_jax.tasks.classification import data as glue
from bert_jax.text import vocab_files
from tests import helpers
from tests.task_helpers import NEGATIVE, POSITIVE
from tests.task_helpers import CONTEXT_1, CONTEXT_2, overfit_set as _overfit_set

VOCAB = os.path.join(helpers.minilm_dir(), "vocab.txt")


def _cli(*args):
  return helpers.run_command("bert_jax.predict", *args)


def _ok(proc):
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc


def _json_lines(path):
  return [json.loads(line) for line in open(path, encoding="utf-8")]


@pytest.fixture(scope="module")
def sst2_out(sst2_model):
  """A tiny classifier that has memorised the 16 SST-2 sentences (conftest.py's)."""
  assert sst2_model["results"]["dev"]["accuracy"] == 1.0
  return sst2_model["out"]


@pytest.fixture(scope="module")
def squad_out(squad_v2_model):
  """A tiny SQuAD 2.0 model that has memorised eight questions (one unanswerable), with the
  predictions.json that fine-tuning writes for them (conftest.py's)."""
  return squad_v2_model["out"], squad_v2_model["data_file"]


SQUAD_WINDOW = ["--max_seq_length=64", "--doc_stride=32", "--max_query_length=16"]


# ---------------------------------------------------------------------------- classification
def _reference_probabilities(out, tokenizer, pairs):
  """What fine-tuning's own evaluation path computes for `pairs`: its featurization, its predict
  step on a mesh, the checkpoint's parameters."""
  config = configuration.BertConfig.from_json_file(os.path.join(out, "bert_config.json"))
  params, meta = checkpoint_store.load_params(os.path.join(out, "checkpoints"))
  assert meta["task"] == "sst2" and meta["num_labels"] == 2
  task = glue.get_task("SST-2")
  examples = [glue.Example(str(i), a, b, None) for i, (a, b) in enumerate(pairs)]
  feats = sequence_classification.featurize(task, examples, tokenizer, 128)
  model = heads.BertForSequenceClassification(config, 2)
  mesh = sharding.create_mesh((-1, 1, 1))
  param_sh = jax.tree.map(lambda _: sharding.replicated(mesh), params)
  predictor = inference.Predictor(model, mesh=mesh, param_shardings=param_sh)
  logits = predictor(jax.device_put(nn.unbox(params), param_sh), feats, 8)
  return np.asarray(jax.nn.softmax(np.asarray(logits, np.float64), axis=-1))


@pytest.mark.slow
@pytest.mark.e2e
def test_classify_cli_gives_the_memorised_labels_and_fine_tunings_probabilities(
    sst2_out, tokenizer, tmp_path):
  texts = [POSITIVE[0], NEGATIVE[1], POSITIVE[5]]
  pair = (NEGATIVE[3], POSITIVE[2])
  tsv = tmp_path / "inputs.tsv"
  tsv.write_text(f"{NEGATIVE[0]}\n\n{POSITIVE[3]}\n{POSITIVE[4]}\t{NEGATIVE[4]}\n")
  out_file = tmp_path / "preds.jsonl"
  proc = _ok(_cli(f"--checkpoint={sst2_out}", f"--vocab_file={VOCAB}",
                  *[f"--text={t}" for t in texts], f"--text={pair[0]} ||| {pair[1]}",
                  f"--input_file={tsv}", f"--output_file={out_file}"))
  results = _json_lines(out_file)
  pairs = [(t, None) for t in texts] + [pair, (NEGATIVE[0], None), (POSITIVE[3], None),
                                        (POSITIVE[4], NEGATIVE[4])]
  assert [(r["text"], r.get("text_b")) for r in results] == pairs
  # Auto mode found a classifier, and the label names are SST-2's, read from the checkpoint.
  assert [r["label"] for r in results[:3]] == ["1", "0", "1"]
  assert results[4]["label"] == "0" and results[5]["label"] == "1"
  assert all(r["probability"] > 0.9 for r in results[:3] + results[4:6])
  want = _reference_probabilities(sst2_out, tokenizer, pairs)
  got = np.asarray([[r["probabilities"]["0"], r["probabilities"]["1"]] for r in results])
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert all(r["probability"] == max(r["probabilities"].values()) for r in results)
  # The printed form: each input, then its label with the probability and all classes.
  printed = proc.stdout
  assert f"{NEGATIVE[3]} ||| {POSITIVE[2]}" in printed
  first = printed.splitlines()[1]
  assert first.startswith(f"  1 ({results[0]['probability']:.1%})")
  assert f"0 {results[0]['probabilities']['0']:.1%}, 1 {results[0]['probability']:.1%}" in first

  # Label names for a task the checkpoint does not name them for; a pair via --text_b.
  proc = _ok(_cli(f"--checkpoint={sst2_out}", f"--vocab_file={VOCAB}", "--mode=classify",
                  "--label_list=neg,pos", f"--text={pair[0]}", f"--text_b={pair[1]}", "--json"))
  (named,) = [json.loads(line) for line in proc.stdout.splitlines()]
  assert named["probabilities"] == pytest.approx({"neg": results[3]["probabilities"]["0"],
                                                 "pos": results[3]["probabilities"]["1"]},
                                                abs=1e-6)


@pytest.mark.e2e
def test_a_fine_tuned_classifier_leaves_for_transformers_and_predicts_there_as_here(
    sst2_out, tmp_path):
  """`convert --format=hf` of a fine-tuning output: transformers' BertForSequenceClassification
  with SST-2's label names, whose pipeline gives our predict's labels and probabilities;
  `--format=tf1`: run_classifier.py's output_weights and output_bias."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  export = tmp_path / "hf"
  proc = _ok(helpers.run_command("bert_jax.convert", f"--from={sst2_out}", f"--to={export}",
                                 "--format=hf"))
  assert f"wrote hf: {export}" in proc.stdout
  written = json.load(open(export / "config.json"))
  assert written["architectures"] == ["BertForSequenceClassification"]
  assert written["id2label"] == {"0": "0", "1": "1"}
  assert written["problem_type"] == "single_label_classification"
  card = (export / "README.md").read_text(encoding="utf-8")
  assert "pipeline_tag: text-classification" in card and "`BertForSequenceClassification`" in card
  assert "outputs: 0, 1 (task `sst2`)" in card and "- dev: accuracy 1" in card, card
  texts = [POSITIVE[0], NEGATIVE[1], POSITIVE[2], NEGATIVE[3]]
  ours = [json.loads(line) for line in _ok(_cli(
      f"--checkpoint={sst2_out}", *[f"--text={t}" for t in texts], "--json")).stdout.splitlines()]
  classifier = transformers.pipeline("text-classification", model=str(export), top_k=None,
                                     device="cpu")
  for mine, scores in zip(ours, classifier(texts), strict=True):
    theirs = {s["label"]: s["score"] for s in scores}
    assert theirs == pytest.approx(mine["probabilities"], abs=1e-5)
    assert max(theirs, key=theirs.get) == mine["label"]

  prefix = tmp_path / "tf1" / "bert_model.ckpt"
  _ok(helpers.run_command("bert_jax.convert", f"--from={sst2_out}", f"--to={prefix}",
                          "--format=tf1"))
  reader = tf.train.load_checkpoint(str(prefix))
  _, params = checkpoints.load_pretraining_model(sst2_out, require_heads=False)
  np.testing.assert_array_equal(reader.get_tensor("output_weights"),
                                np.asarray(params["classifier"]["kernel"]).T)
  np.testing.assert_array_equal(reader.get_tensor("output_bias"),
                                np.asarray(params["classifier"]["bias"]))


def test_a_file_in_the_training_layout_is_read_as_the_model_reads(sst2_out, tmp_path):
  """SST-2's own layout (sentence<TAB>label, a header or not) for a model fine-tuned on single
  sentences: the labels are left out of the input, said once, not read as second sentences;
  two texts on a line are a pair, with a word that the model reads single sentences."""
  texts = [POSITIVE[0], NEGATIVE[1], POSITIVE[2]]
  alone = [json.loads(l) for l in _ok(_cli(f"--checkpoint={sst2_out}",
                                          *[f"--text={t}" for t in texts],
                                          "--json")).stdout.splitlines()]
  for header in ("sentence\tlabel\n", ""):
    tsv = tmp_path / "train.tsv"
    tsv.write_text(header + "".join(f"{t}\t{l}\n" for t, l in zip(texts, "101")))
    proc = _ok(_cli(f"--checkpoint={sst2_out}", f"--input_file={tsv}", "--json"))
    got = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["text"], r.get("text_b")) for r in got] == [(t, None) for t in texts]
    assert [r["probabilities"] for r in got] == [r["probabilities"] for r in alone]
    assert "the last column of 3 lines holds labels, as in training files" in proc.stderr
  tsv.write_text(f"{texts[0]}\t1\n{texts[1]}\t{texts[2]}\n")
  proc = _ok(_cli(f"--checkpoint={sst2_out}", f"--input_file={tsv}", "--json"))
  got = [json.loads(line) for line in proc.stdout.splitlines()]
  assert [(r["text"], r.get("text_b")) for r in got] == [(texts[0], None), (texts[1], texts[2])]
  assert ("1 lines hold two texts (e.g. line 2), read as a pair, but the model was fine-tuned "
          "on single sentences") in proc.stderr


def test_label_names_follow_the_task_or_the_flags(sst2_out):
  info = finetuned.inspect_checkpoint(sst2_out)
  assert info.mode == "classify" and info.task == "sst2"
  model = finetuned.load_finetuned(info, "classify")
  assert classification_predict.resolve_labels(model) == ["0", "1"]
  assert classification_predict.resolve_labels(model, label_list=["neg", "pos"]) == ["neg", "pos"]
  with pytest.raises(finetuned.PredictError, match="3 labels .* 2 outputs"):
    classification_predict.resolve_labels(model, label_list=["a", "b", "c"])
  with pytest.raises(finetuned.PredictError, match="MNLI has 3 labels but the model 2 outputs"):
    classification_predict.resolve_labels(model, task_name="MNLI")
  assert classification_predict.resolve_labels(model, task_name="RTE") == ["entailment", "not_entailment"]
  assert classification_predict.split_pair("a ||| b") == ("a", "b")
  assert classification_predict.split_pair("a") == ("a", None)


def test_a_regression_model_gives_its_score(tokenizer, bert_config_file):
  """STS-B-like: one output, shown as a score; no label names, none accepted."""
  config = configuration.BertConfig.from_json_file(bert_config_file)
  module = heads.BertForSequenceClassification(config, 1)
  pairs = [(POSITIVE[0], NEGATIVE[0]), (POSITIVE[1], None)]
  feats = sequence_classification.featurize(glue.get_task("STS-B"),
                             [glue.Example(str(i), a, b, None) for i, (a, b) in enumerate(pairs)],
                             tokenizer, 32)
  params = nn.unbox(module.init(jax.random.PRNGKey(1), feats["input_ids"], feats["input_mask"],
                                feats["segment_ids"])["params"])
  want = np.asarray(module.apply({"params": params}, feats["input_ids"], feats["input_mask"],
                                 feats["segment_ids"]))[:, 0]
  info = finetuned.CheckpointInfo("sts-model", "orbax", "sts-model",
                                {"task": "stsb", "num_labels": 1})
  model = finetuned.FinetunedModel(info, config, params, module)
  assert classification_predict.resolve_labels(model) is None
  with pytest.raises(finetuned.PredictError, match="regression model"):
    classification_predict.resolve_labels(model, label_list=["a", "b"])
  results = classification_predict.classify(model, tokenizer, pairs, None, max_seq_length=32)
  assert [set(r) for r in results] == [{"text", "text_b", "score"}, {"text", "score"}]
  np.testing.assert_allclose([r["score"] for r in results], want, atol=1e-5)
  assert classification_predict.format_classification(results[1]).endswith(f"score: {results[1]['score']:.4f}")


# ------------------------------------------------------------------------- question answering
@pytest.mark.slow
@pytest.mark.e2e
def test_qa_cli_answers_a_question_about_a_context(squad_out):
  out, _ = squad_out
  context_file = os.path.join(os.path.dirname(out), "context.txt")
  with open(context_file, "w", encoding="utf-8") as f:
    f.write(CONTEXT_2 + "\n")
  proc = _ok(_cli(f"--checkpoint={out}", f"--vocab_file={VOCAB}", *SQUAD_WINDOW,
                  "--question=When was Beyoncé born?",
                  "--question=How many moons does Jupiter have?",
                  f"--context_file={context_file}", "--n_best=3", "--json"))
  born, moons = [json.loads(line) for line in proc.stdout.splitlines()]
  assert born["answer"] == "September 4, 1981" and born["has_answer"]
  assert born["probability"] > 0.5 and born["n_best"][0]["text"] == "September 4, 1981"
  assert len(born["n_best"]) == 3 and born["null_score_diff"] < 0
  assert moons["answer"] == "" and not moons["has_answer"] and moons["null_score_diff"] > 0
  # The printed form, and a lenient threshold turning the no-answer into the best span.
  proc = _ok(_cli(f"--checkpoint={out}", f"--vocab_file={VOCAB}", *SQUAD_WINDOW,
                  "--question=Which NFL team won Super Bowl 50?", f"--context={CONTEXT_1}",
                  "--question=How many moons does Jupiter have?",
                  "--null_score_diff_threshold=1e9"))
  lines = proc.stdout.splitlines()
  assert lines[0] == "[q1] Which NFL team won Super Bowl 50?"
  assert lines[1].startswith("  answer: Denver Broncos (")
  assert "threshold 1e+09: answerable" in lines[2]
  assert lines[3].startswith("  1. Denver Broncos  ")
  q2 = lines.index("[q2] How many moons does Jupiter have?")
  assert not lines[q2 + 1].startswith("  answer: (no answer)") and "answerable" in lines[q2 + 2]


@pytest.mark.e2e
def test_qa_input_file_gives_fine_tunings_predictions(squad_out, tmp_path):
  out, data_file = squad_out
  out_file = tmp_path / "answers.jsonl"
  # No --vocab_file nor window flags: the fine-tuned directory holds and records them.
  _ok(_cli(f"--checkpoint={out}", "--mode=qa", f"--input_file={data_file}",
           f"--output_file={out_file}"))
  results = _json_lines(out_file)
  predictions = json.load(open(os.path.join(out, "predictions.json")))
  nbest = json.load(open(os.path.join(out, "nbest_predictions.json")))
  null_odds = json.load(open(os.path.join(out, "null_odds.json")))
  assert {r["id"]: r["answer"] for r in results} == predictions
  gold = {qa["id"]: (qa["answers"][0]["text"] if qa["answers"] else "")
          for a in _overfit_set()["data"] for p in a["paragraphs"] for qa in p["qas"]}
  assert predictions == gold  # memorised
  for r in results:
    want = next(x["probability"] for x in nbest[r["id"]] if x["text"] == r["answer"])
    assert r["probability"] == pytest.approx(want, abs=1e-5)
    assert [x["text"] for x in r["n_best"]] == [x["text"] for x in nbest[r["id"]][:5]]
    assert r["null_score_diff"] == pytest.approx(null_odds[r["id"]], abs=1e-4)


# --------------------------------------------------------------------------------- fill-mask
@pytest.mark.slow
@pytest.mark.e2e
def test_fill_mask_finds_the_vocab_beside_a_tf1_prefix(tmp_path, tokenizer):
  config = configuration.get_preset("test", vocab_size=30522)
  ids = np.zeros((1, 8), np.int32)
  params = nn.unbox(heads.BertForPreTraining(config).init(
      jax.random.PRNGKey(3), ids, ids + 1, ids, ids[:, :2])["params"])
  prefix = tf1.save_tf1_checkpoint(params, config, str(tmp_path / "release"))
  assert prefix.endswith("bert_model.ckpt")
  texts = ["the cat sat on the [MASK] .", "[MASK] is a [MASK] city"]
  # Without a vocabulary anywhere: the error names where it looked.
  info = finetuned.inspect_checkpoint(prefix)
  assert info.kind == "tf1" and info.mode == "fill_mask"
  release = str(tmp_path / "release")
  with pytest.raises(finetuned.PredictError, match=f"looked in {release} for vocab.txt"):
    finetuned.find_vocab(info)
  shutil.copy(VOCAB, os.path.join(release, "vocab.txt"))
  proc = _ok(_cli(f"--checkpoint={prefix}", *[f"--text={t}" for t in texts], "--top_k=3",
                  "--json"))
  got = [json.loads(line) for line in proc.stdout.splitlines()]  # one object per input
  want = inference.fill_mask(config, params, tokenizer, texts, top_k=3)
  assert [g["text"] for g in got] == texts
  assert [len(g["predictions"]) for g in got] == [1, 2]
  for g, w in zip(got, want):
    for g_mask, w_mask in zip(g["predictions"], w):
      assert [t for t, _ in g_mask] == [t for t, _ in w_mask]
      np.testing.assert_allclose([p for _, p in g_mask], [p for _, p in w_mask], atol=1e-5)


# ------------------------------------------------------------------------------------ errors
@pytest.mark.e2e
def test_a_checkpoint_of_another_kind_is_refused_with_what_it_is(squad_out, sst2_out, tmp_path):
  out, _ = squad_out
  proc = _cli(f"--checkpoint={out}", f"--vocab_file={VOCAB}", "--mode=classify", "--text=hi")
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  message = proc.stderr.strip().splitlines()[-1]
  assert message.startswith("error: --mode=classify needs a fine-tuned classifier")
  assert f"but {out} is a fine-tuned SQuAD model (task 'squad v2.0')" in message
  assert "Use --mode=qa" in message
  # qa on a pre-training workdir (weights only, as convert writes one).
  config = configuration.get_preset("test", vocab_size=30522)
  ids = np.zeros((1, 8), np.int32)
  params = nn.unbox(heads.BertForPreTraining(config).init(
      jax.random.PRNGKey(0), ids, ids + 1, ids, ids[:, :2])["params"])
  workdir = checkpoints.save_orbax_params(params, config, str(tmp_path / "pretrain"))
  info = finetuned.inspect_checkpoint(workdir)
  assert info.mode == "fill_mask"
  with pytest.raises(finetuned.PredictError, match=(
      f"--mode=qa needs a fine-tuned SQuAD model .* but {workdir} is a pre-training checkpoint "
      r"\(its metadata names no fine-tuned task\). Use --mode=fill_mask")):
    finetuned.load_finetuned(info, "qa")
  # fill-mask on a classifier; classify on a Hugging Face directory.
  with pytest.raises(finetuned.PredictError, match=f"but {sst2_out} is a fine-tuned classifier "
                     r"\(task 'sst2', 2 outputs\)"):
    finetuned.load_fill_mask_model(finetuned.inspect_checkpoint(sst2_out))
  with pytest.raises(finetuned.PredictError, match="is a Hugging Face directory"):
    finetuned.check_mode(finetuned.inspect_checkpoint(helpers.minilm_dir()), "classify")
  # Fine-tuning copied its vocabulary beside the checkpoint; without it, the error says where
  # it looked.
  info = finetuned.inspect_checkpoint(sst2_out)
  finetuned.load_finetuned(info, "classify")
  assert finetuned.find_vocab(info).vocab_file == os.path.join(sst2_out, "vocab.txt")
  bare = str(tmp_path / "bare")
  shutil.copytree(sst2_out, bare)
  os.remove(os.path.join(bare, "vocab.txt"))
  info = finetuned.inspect_checkpoint(bare)
  with pytest.raises(finetuned.PredictError,
                     match=f"No vocabulary for {bare}: looked in {bare} for vocab.txt "
                           r"\(WordPiece\), spm.model / spiece.model \(SentencePiece\) or "
                           r"vocab.json \+ merges.txt \(byte-level BPE\). Pass .*--vocab_file"):
    finetuned.find_vocab(info)
  with pytest.raises(finetuned.PredictError, match="nowhere.txt does not exist"):
    finetuned.find_vocab(info, vocab_files.VocabularyFiles(vocab_file=str(tmp_path / "nowhere.txt")))
  # A vocabulary of the same size in another order (another corpus's) is refused: the model
  # keeps its own, with its hash.
  lines = open(VOCAB, encoding="utf-8").read().splitlines()
  lines[1000], lines[1001] = lines[1001], lines[1000]
  other = tmp_path / "other_vocab.txt"
  other.write_text("\n".join(lines) + "\n", encoding="utf-8")
  assert list(json.load(open(os.path.join(sst2_out, "vocab_record.json")))["files"]) == [
      "vocab.txt"]
  with pytest.raises(finetuned.PredictError, match=(
      r"--vocab_file=.*other_vocab.txt \(sha256 \w+\) is not the vocabulary this model was "
      r"trained with \(.*vocab.txt, sha256 \w+\): leave --vocab_file out")):
    finetuned.find_vocab(finetuned.inspect_checkpoint(sst2_out),
                       vocab_files.VocabularyFiles(vocab_file=str(other)))
  assert finetuned.find_vocab(finetuned.inspect_checkpoint(sst2_out), vocab_files.VocabularyFiles(
      vocab_file=VOCAB)).vocab_file == VOCAB
  with pytest.raises(finetuned.PredictError, match="does not exist"):
    finetuned.inspect_checkpoint(str(tmp_path / "missing"))
