"""Multiple choice end to end: `finetune --task_name=swag` on the official CSV layout and
`predict` choosing among given endings through the command line (probabilities equal to the
run's prediction file), HellaSwag's JSONL through the same run, a model kept from training
evaluated again without retraining, and the mistakes a user makes."""

import csv
import json
import os

import ml_collections
import numpy as np
import pytest

from bert_jax.runs import finetune_config
from bert_jax.tasks import registry
from bert_jax.text import tokenization
from bert_jax.training import metrics
from tests import helpers, task_helpers

REPO = helpers.REPO
VOCAB = os.path.join(helpers.minilm_dir(), "vocab.txt")


def _cli(module, *args):
  return helpers.run_command(module, *args)


def _tokenizer():
  return tokenization.load_tokenizer(vocab_file=VOCAB, do_lower_case=True)


@pytest.mark.slow
@pytest.mark.e2e
def test_swag_through_the_command_line_and_predict_chooses_as_the_run_did(bert_config_file,
                                                                          tmp_path):
  data = task_helpers.swag_dir(tmp_path / "swag")
  out = str(tmp_path / "out")
  proc = _cli("bert_jax.finetune", "--task_name=swag", f"--data_dir={data}",
              f"--bert_config_file={bert_config_file}", f"--vocab_file={VOCAB}",
              "--do_lower_case", f"--output_dir={out}", "--do_train", "--do_eval", "--do_predict",
              "--max_seq_length=32", "--train_batch_size=8", "--learning_rate=1e-3",
              "--num_train_epochs=60", "--seed=3")
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.load(open(os.path.join(out, "eval_results.json")))
  assert results["dev"]["accuracy"] == 1.0, results
  assert results["dev"]["chance_accuracy"] == 0.25
  assert "test" not in results  # test.csv has no labels: predicted, not scored
  # Tokens/s counts every ending's row: the non-padding ones are a part of them.
  logged = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
  logged = [r for r in logged if "perf/tokens_per_sec" in r]
  assert logged and all(0 < r["perf/useful_tokens_per_sec"] < r["perf/tokens_per_sec"]
                        for r in logged)
  with open(os.path.join(out, "swag_test_submission.csv"), newline="") as f:
    submission = list(csv.reader(f))  # the leaderboard's form: row index, predicted ending
  assert submission[0] == ["", "pred"] and len(submission) == 1 + len(task_helpers.SWAG_EXAMPLES)
  with open(os.path.join(out, "test_predictions.csv"), newline="") as f:
    assert [row[1] for row in submission[1:]] == [row[1] for row in list(csv.reader(f))[1:]]
  with open(os.path.join(out, "dev_predictions.csv"), newline="") as f:
    rows = list(csv.reader(f))
  assert rows[0][:2] == ["id", "pred"]
  by_id = {row[0]: row for row in rows[1:]}
  assert [int(by_id[f"play{i}-{i}"][1]) for i in range(len(task_helpers.SWAG_EXAMPLES))] == [
      label for *_, label in task_helpers.SWAG_EXAMPLES]

  # predict: the first example given on the command line, as context, start and endings.
  sent1, sent2, endings, label = task_helpers.SWAG_EXAMPLES[0]
  proc = _cli("bert_jax.predict", f"--checkpoint={out}", f"--context={sent1}",
              f"--start={sent2}", *[f"--ending={e}" for e in endings], "--json")
  assert proc.returncode == 0, proc.stderr[-3000:]
  (choice,) = [json.loads(line) for line in proc.stdout.splitlines()]
  assert choice["choice"] == label
  from bert_jax.tasks import pipeline  # pylint: disable=g-import-not-at-top
  assert pipeline.load(out).choose(sent1, endings, start=sent2) == [choice]  # the Python API
  assert choice["ending"] == f"{sent2} {endings[label]}"
  np.testing.assert_allclose(choice["probabilities"],
                             [float(p) for p in by_id["play0-0"][2:]], atol=1e-5)
  # ... and every example of a file in the official layout.
  proc = _cli("bert_jax.predict", f"--checkpoint={out}",
              f"--input_file={os.path.join(data, 'val.csv')}", "--json")
  assert proc.returncode == 0, proc.stderr[-3000:]
  chosen = [json.loads(line) for line in proc.stdout.splitlines()]
  assert [c["choice"] for c in chosen] == [c["label"] for c in chosen]
  # A mistake: a different number of endings than the model was trained with.
  proc = _cli("bert_jax.predict", f"--checkpoint={out}", f"--context={sent1}",
              *[f"--ending={e}" for e in endings[:3]])
  assert proc.returncode != 0
  assert "3 endings" in proc.stderr and "among 4" in proc.stderr, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr


def _hellaswag_line(index, example, labelled=True):
  sent1, sent2, endings, label = example
  line = {"ind": index, "activity_label": "Theatre", "ctx_a": sent1, "ctx_b": sent2,
          "ctx": f"{sent1} {sent2}", "endings": endings, "split": "val",
          "split_type": "indomain", "source_id": f"play~{index}"}
  if labelled:
    line["label"] = label
  return json.dumps(line)


@pytest.mark.slow
def test_hellaswag_jsonl_trains_and_a_kept_model_evaluates_again(bert_config_file, tmp_path):
  data = tmp_path / "hellaswag"
  data.mkdir()
  for name in ("hellaswag_train.jsonl", "hellaswag_val.jsonl"):
    (data / name).write_text("\n".join(_hellaswag_line(i, e) for i, e in
                                       enumerate(task_helpers.SWAG_EXAMPLES)) + "\n")
  config = finetune_config.get_config()
  config.update(dict(task_name="hellaswag", data_dir=str(data), bert_config_file=bert_config_file,
                     output_dir=str(tmp_path / "out"), do_train=True, do_eval=True,
                     max_seq_length=32, train_batch_size=8, learning_rate=1e-3,
                     num_train_epochs=60, seed=3, log_every_steps=1000,
                     eval_every_steps=20))
  first = registry.run_from_config(ml_collections.ConfigDict(config), _tokenizer())
  assert first["dev"]["accuracy"] == 1.0, first
  # Scored while training; the evaluation after it is the one at the last step.
  rows = {r["step"]: r["eval_dev/accuracy"] for r in metrics.read_jsonl(
      str(tmp_path / "out" / "metrics.jsonl")) if "eval_dev/accuracy" in r}
  assert sorted(rows) == [20, 40, 60] and rows[60] == 1.0
  assert first["best"]["metric"] == "eval_dev/accuracy"
  assert first["best"]["value"] == max(rows.values())
  # Evaluating the kept model again (no --do_train) gives the same predictions.
  config.update(dict(do_train=False))
  again = registry.run_from_config(ml_collections.ConfigDict(config), _tokenizer())
  assert again["dev"]["accuracy"] == first["dev"]["accuracy"]
  first_rows = open(tmp_path / "out" / "dev_predictions.csv").read()
  assert first_rows.count("\n") == 1 + len(task_helpers.SWAG_EXAMPLES)


@pytest.mark.slow
@pytest.mark.e2e
def test_choice_mistakes_get_one_clear_line(bert_config_file, tmp_path):
  data = task_helpers.swag_dir(tmp_path / "swag")
  with open(os.path.join(data, "train.csv"), "a") as f:
    f.write("9,x,9,a b,a,b,gold,e0,e1,e2,e3,7\n")
  proc = _cli("bert_jax.finetune", "--task_name=swag", f"--data_dir={data}",
              f"--bert_config_file={bert_config_file}", f"--vocab_file={VOCAB}",
              f"--output_dir={tmp_path / 'out'}", "--do_train")
  assert proc.returncode != 0
  last = proc.stderr.strip().splitlines()[-1]
  assert "train.csv" in last and "line 8" in last and "7" in last, proc.stderr[-2000:]
  proc = _cli("bert_jax.finetune", "--task_name=swag", f"--data_dir={tmp_path / 'nowhere'}",
              f"--bert_config_file={bert_config_file}", f"--vocab_file={VOCAB}",
              f"--output_dir={tmp_path / 'out2'}", "--do_train")
  assert proc.returncode != 0 and "train.csv" in proc.stderr.strip().splitlines()[-1]


def test_what_multiple_choice_does_not_take_is_refused_before_any_work(bert_config_file,
                                                                         tmp_path):
  """No --data_dir (the message names the task's files), --packing, --teacher_checkpoint."""
  base = dict(task_name="swag", bert_config_file=bert_config_file, do_train=True,
              output_dir=str(tmp_path / "out"))
  for fields, message in ((dict(data_dir=None), "swag's train.csv"),
                          (dict(data_dir=str(tmp_path), packing=True),
                           "--packing .* not multiple choice"),
                          (dict(data_dir=str(tmp_path), teacher_checkpoint=str(tmp_path)),
                           "--teacher_checkpoint.* not multiple choice")):
    with pytest.raises(ValueError, match=message) as refused:
      registry.run_from_config(finetune_config.make(**base, **fields), _tokenizer())
    assert "conll2003" not in str(refused.value)


def test_configs_hold_the_papers_settings():
  """`configs/swag.py` is the paper's SWAG run (3 epochs, 2e-5, batch 16); `configs/tagging.py`
  its NER run with document context, and the feature-based variant with the last four layers."""
  import importlib.util  # pylint: disable=g-import-not-at-top

  def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "configs",
                                                                     f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

  swag_config = load("swag").get_config()
  assert (swag_config.task_name, swag_config.num_train_epochs, swag_config.learning_rate,
          swag_config.train_batch_size) == ("swag", 3.0, 2e-5, 16)
  assert load("swag").get_config("hellaswag").task_name == "hellaswag"
  tagging = load("tagging")
  ner = tagging.get_config("conll2003")
  assert ner.task_name == "conll2003" and ner.document_context and not ner.feature_based
  features = tagging.get_config("feature_based")
  assert features.feature_based and tuple(features.feature_layers) == (-1, -2, -3, -4)
  assert features.lstm_size == 768
