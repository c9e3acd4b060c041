"""Fine-tuning end to end: learning, counting every dev example, regression, MNLI outputs, CLI."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from bert_jax import inference
from bert_jax.runs import finetune_config
from bert_jax.tasks.classification import run as classification_run
from bert_jax.tasks.classification import objective as sequence_classification
from bert_jax.model import configuration
from bert_jax.tasks import pipeline
from bert_jax.tasks.classification import data as glue
from bert_jax.training import checkpointing, metrics
from tests import helpers
from tests.task_helpers import NEGATIVE, POSITIVE, sst2_dir as _sst2_dir

REPO = helpers.REPO
VOCAB = os.path.join(helpers.minilm_dir(), "vocab.txt")


@pytest.mark.slow
def test_tiny_model_learns_a_tiny_task_and_counts_every_dev_example(sst2_model, tokenizer,
                                                                     tmp_path):
  """conftest.py's `sst2_model`: 100 epochs of the 16 sentences, 13 of them as dev rows."""
  out, data = sst2_model["results"], sst2_model["data"]
  assert out["dev"]["num_examples"] == 13
  assert out["dev"]["accuracy"] == 1.0          # memorised: the dev rows are training rows
  # Beside it, what always answering the most frequent dev label scores.
  dev_labels = [1] * len(POSITIVE) + [0] * len(NEGATIVE)
  assert out["dev"]["majority_class_accuracy"] == pytest.approx(
      max(dev_labels[:13].count(0), dev_labels[:13].count(1)) / 13)
  lines = open(os.path.join(sst2_model["out"], "SST-2.tsv")).read().splitlines()
  assert lines[0] == "index\tprediction" and len(lines) == 6
  assert [l.split("\t")[1] for l in lines[1:]] == ["1"] * 5
  saved = json.load(open(os.path.join(sst2_model["out"], "eval_results.json")))
  assert saved["dev"]["accuracy"] == 1.0
  # Evaluating later from the fine-tuned output directory (a copy: other tests read the
  # original) gives the same numbers.
  shutil.copytree(sst2_model["out"], tmp_path / "out")
  again = classification_run.run(finetune_config.make(
      task_name="SST-2", data_dir=data, init_checkpoint=None, output_dir=str(tmp_path / "out"),
      max_seq_length=16, eval_batch_size=8, do_eval=True), tokenizer)
  assert again["dev"] == out["dev"]


@pytest.mark.slow
def test_evaluation_during_training_keeps_the_best_model_and_stops_early(
    tokenizer, bert_config_file, tmp_path):
  """`eval_every_steps`: dev scored as training goes (TensorBoard/metrics rows), the best model
  by the task's metric kept in <output_dir>/best as a fine-tuning output of its own (evaluating
  it gives the score it was kept for), training ended after `early_stopping_patience`
  evaluations without a better score, and the evaluation after training reusing the last."""
  data = _sst2_dir(tmp_path / "sst2", dev_size=13)
  out = str(tmp_path / "out")
  results = classification_run.run(finetune_config.make(
      task_name="SST-2", data_dir=data, init_checkpoint=None, bert_config_file=bert_config_file,
      output_dir=out, max_seq_length=16, train_batch_size=4, eval_batch_size=8,
      learning_rate=1e-3, num_train_epochs=15, do_train=True, do_eval=True,
      eval_every_steps=4, early_stopping_patience=2), tokenizer)
  rows = [r for r in metrics.read_jsonl(os.path.join(out, "metrics.jsonl"))
          if "eval_dev/accuracy" in r]
  scored = {r["step"]: r["eval_dev/accuracy"] for r in rows}
  steps = sorted(scored)
  assert steps[:3] == [4, 8, 12] and all(s % 4 == 0 for s in steps)
  best_value = max(scored.values())
  best_step = min(s for s in steps if scored[s] == best_value)  # the first to reach it
  stopped = results["early_stopping"]["stopped_at_step"]
  # Two evaluations after the best, none better: stopped there, well before step 60.
  assert stopped == steps[-1] == best_step + 8 < 60, scored
  assert results["best"] == {"step": best_step, "metric": "eval_dev/accuracy",
                             "value": best_value, "directory": os.path.join(out, "best")}
  assert results["dev"]["accuracy"] == scored[stopped]  # the last model, evaluated once more
  kept = json.load(open(os.path.join(out, "best", "eval_results.json")))
  assert (kept["step"], kept["eval_dev/accuracy"]) == (best_step, best_value)
  assert os.path.exists(os.path.join(out, "best", "bert_config.json"))
  store = checkpointing.run_checkpoints(os.path.join(out, "best"), async_save=False)
  assert store.all_steps() == [best_step]  # the earlier bests removed
  store.close()
  # Read as any fine-tuned model is: by the Python API (and so `predict`), and by evaluation.
  classifier = pipeline.load(os.path.join(out, "best"))
  dev = [line.split("\t") for line in open(os.path.join(data, "dev.tsv")).read().splitlines()[1:]]
  answers = classifier.classify([text for text, _ in dev])
  assert np.mean([a["label"] == label for a, (_, label) in zip(answers, dev)]) == best_value
  again = classification_run.run(finetune_config.make(
      task_name="SST-2", data_dir=data, init_checkpoint=None, output_dir=os.path.join(out, "best"),
      max_seq_length=16, eval_batch_size=8, do_eval=True), tokenizer)
  assert again["dev"]["accuracy"] == best_value


@pytest.mark.mesh
@pytest.mark.slow
def test_padded_batches_do_not_change_predictions(tokenizer, bert_config_file, tmp_path):
  """Every example's logits are the same whatever batch it lands in and however it is padded."""
  task = glue.get_task("SST-2")
  config = configuration.BertConfig.from_json_file(bert_config_file)
  from bert_jax.model import heads
  from bert_jax.parallel import sharding
  model = heads.BertForSequenceClassification(config, 2)
  examples = [glue.Example(str(i), s, None, "1") for i, s in enumerate(POSITIVE + NEGATIVE[:5])]
  feats = sequence_classification.featurize(task, examples, tokenizer, 32)
  params = model.init(jax.random.PRNGKey(0), feats["input_ids"][:1], feats["input_mask"][:1],
                      feats["segment_ids"][:1])["params"]
  import flax.linen as nn
  params = nn.unbox(params)
  direct = np.asarray(model.apply({"params": params}, feats["input_ids"], feats["input_mask"],
                                  feats["segment_ids"]))
  mesh = sharding.create_mesh((8, 1, 1))
  param_sh = jax.tree.map(lambda _: sharding.replicated(mesh), params)
  predictor = inference.Predictor(model, mesh=mesh, param_shardings=param_sh)
  batched = predictor(params, feats, 8)
  assert batched.shape == direct.shape == (13, 2)
  np.testing.assert_allclose(batched, direct, atol=1e-5)


@pytest.mark.slow
def test_regression_task(tokenizer, bert_config_file, tmp_path):
  d = tmp_path / "stsb"
  d.mkdir()
  header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
  rows = [(a, b, float(i % 6)) for i, (a, b) in enumerate(zip(POSITIVE, NEGATIVE))]
  body = "".join(f"{i}\tmain\tf\t2012\t{i}\ts\ts\t{a}\t{b}\t{s}\n" for i, (a, b, s) in
                 enumerate(rows))
  (d / "train.tsv").write_text(header + body)
  (d / "dev.tsv").write_text(header + body)
  out = classification_run.run(finetune_config.make(
      task_name="STS-B", data_dir=str(d), init_checkpoint=None,
      bert_config_file=bert_config_file, output_dir=str(tmp_path / "out"), max_seq_length=32,
      train_batch_size=8, eval_batch_size=8, learning_rate=1e-3, num_train_epochs=150,
      do_train=True, do_eval=True), tokenizer)
  assert out["dev"]["num_examples"] == 8
  assert out["dev"]["pearson"] > 0.9  # fits its training pairs


@pytest.mark.slow
@pytest.mark.e2e
def test_cli_mnli_from_a_hugging_face_checkpoint(tmp_path):
  """The packaged MiniLM as --init_checkpoint; MNLI's two dev sets and three prediction files."""
  d = tmp_path / "MNLI"
  d.mkdir()
  cols = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
          "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
          "sentence2"]
  pairs = [("A man plays a guitar.", "A person makes music.", "entailment"),
           ("A dog runs in the park.", "The cat sleeps.", "neutral"),
           ("The room is empty.", "The room is full of people.", "contradiction")] * 4

  def write(name, labelled, n):
    extra = ["label1", "gold_label"] if labelled else []
    lines = ["\t".join(cols + extra)]
    for i, (a, b, label) in enumerate(pairs[:n]):
      row = [str(i), "1", f"{i}e", "fiction", "( x )", "( y )", "(ROOT x)", "(ROOT y)", a, b]
      lines.append("\t".join(row + ([label, label] if labelled else [])))
    (d / name).write_text("\n".join(lines) + "\n")

  write("train.tsv", True, 12)
  write("dev_matched.tsv", True, 5)
  write("dev_mismatched.tsv", True, 7)
  write("test_matched.tsv", False, 3)
  write("test_mismatched.tsv", False, 4)
  (d / "diagnostic.tsv").write_text("index\tsentence1\tsentence2\n0\tA b.\tC d.\n1\tE f.\tG h.\n")
  minilm = helpers.minilm_dir()
  proc = helpers.run_command(
      "bert_jax.finetune", "--task_name=MNLI", f"--data_dir={d}",
      f"--init_checkpoint={minilm}", f"--vocab_file={VOCAB}", f"--output_dir={tmp_path / 'o'}",
      "--do_train", "--do_eval", "--do_predict", "--max_seq_length=32",
      "--train_batch_size=8", "--eval_batch_size=8", "--predict_batch_size=8",
      "--num_train_epochs=1")
  assert proc.returncode == 0, proc.stderr[-4000:]
  results = json.load(open(tmp_path / "o" / "eval_results.json"))
  assert results["dev_matched"]["num_examples"] == 5
  assert results["dev_mismatched"]["num_examples"] == 7
  for name, n in (("MNLI-m.tsv", 3), ("MNLI-mm.tsv", 4), ("AX.tsv", 2)):
    lines = (tmp_path / "o" / name).read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == n + 1
    assert {l.split("\t")[1] for l in lines[1:]} <= {"entailment", "neutral", "contradiction"}


@pytest.mark.slow
@pytest.mark.e2e
def test_cli_takes_a_config_file_and_the_original_flags_override_it(bert_config_file, tmp_path):
  """`--config=configs/glue.py:sst2` sets the task and the paper's settings (train, eval and
  predict on); an original flag given beside it (`--num_train_epochs`, `--train_batch_size`)
  wins. 13 training rows in batches of 8: two steps an epoch, the second padded."""
  data = _sst2_dir(tmp_path / "sst2", dev_size=13)
  with open(os.path.join(data, "train.tsv")) as f:
    rows = f.read().splitlines()
  with open(os.path.join(data, "train.tsv"), "w") as f:
    f.write("\n".join(rows[:14]) + "\n")  # header + 13 rows
  out = tmp_path / "o"
  proc = helpers.run_command(
      "bert_jax.finetune", f"--config={os.path.join(REPO, 'configs', 'glue.py')}:sst2",
      f"--data_dir={data}", f"--bert_config_file={bert_config_file}", f"--vocab_file={VOCAB}",
      f"--output_dir={out}", "--max_seq_length=16", "--train_batch_size=8",
      "--num_train_epochs=3", "--config.mesh_shape=(1, 1, 1)")
  assert proc.returncode == 0, proc.stderr[-4000:]
  results = json.load(open(out / "eval_results.json"))
  assert results["task"] == "sst2" and results["train_steps"] == 6
  assert results["dev"]["num_examples"] == 13
  assert (out / "SST-2.tsv").exists()  # do_predict came from the config
  meta_rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
  assert max(r["step"] for r in meta_rows) == 6
