"""Sequence packing for fine-tuning: a packed batch gives the same per-example outputs, loss and
gradients as the same examples unpacked (classification, regression and SQuAD spans); a packed
run trains on the same examples in the same order and evaluates as an unpacked one does."""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.data import arrays, packed_examples
from bert_jax.model import configuration
from bert_jax.runs import finetune_config
from bert_jax.tasks.classification import run as classification_run
from bert_jax.tasks.classification import data as glue
from bert_jax.tasks.squad import objective as question_answering
from bert_jax.tasks.classification import objective as sequence_classification
from bert_jax.tasks.squad import data as squad
from bert_jax.training import step as step_lib
from tests.task_helpers import NEGATIVE, POSITIVE, sst2_dir as _sst2_dir

TOLERANCE = 1e-5


def _max_difference(a, b) -> float:
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) if np.size(x) else 0.0
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _loss_and_grads(objective, model, params, batch):
  """The objective's loss and its gradient on `batch`, deterministic (no dropout)."""
  def loss_fn(p, b):
    outputs = step_lib.apply_model(objective, model, p, b, deterministic=True)
    return objective.loss(outputs, b, objective.denominators(b))[0]
  return jax.jit(jax.value_and_grad(loss_fn))(params, dict(batch))


def _outputs(objective, model, params, batch):
  """The model's deterministic outputs on `batch`, as numpy."""
  return jax.tree.map(np.asarray, jax.jit(
      lambda p, b: step_lib.apply_model(objective, model, p, b, deterministic=True))(
          params, {k: batch[k] for k in objective.input_names}))


def _init(model, objective, batch):
  return nn.unbox(model.init(jax.random.PRNGKey(0),
                             *(batch[k] for k in objective.input_names))["params"])


@pytest.mark.slow
@pytest.mark.parametrize("task_name", ["SST-2", "STS-B"])
def test_packed_classification_equals_unpacked(task_name, tokenizer, bert_config_file):
  task = glue.get_task(task_name)
  config = configuration.BertConfig.from_json_file(bert_config_file)
  sentences = POSITIVE + NEGATIVE
  examples = [glue.Example(str(i), a, b if task_name == "STS-B" else None,
                           str(i % 5 + 0.5) if task.is_regression else str(i % 2))
              for i, (a, b) in enumerate(zip(sentences, sentences[3:] + sentences[:3]))]
  feats = sequence_classification.featurize(task, examples, tokenizer, 64)
  # A partial batch, as training_batches makes it: 13 examples and 3 weight-0 fillers.
  feats = arrays.pad_rows({k: v[:13] for k, v in feats.items()}, 16)
  unpacked = sequence_classification.SequenceClassification(task, 64)
  packed = sequence_classification.SequenceClassification(task, 64, max_sequences_per_row=4)
  model = unpacked.model(config)
  params = _init(model, unpacked, feats)

  pack = packed_examples.batch_packer(4, multiple=2, max_rows=16)
  rows = pack(feats)
  num_rows = len(rows["weight"])
  assert num_rows < 13 and num_rows in (2, 4, 8)       # fewer rows, a power-of-two bucket
  assert rows["label"].shape == rows["weight"].shape == rows["cls_positions"].shape == (
      num_rows, 4)
  assert rows["weight"].sum() == 13                      # the fillers are not packed

  direct = _outputs(unpacked, model, params, feats)
  through_rows = _outputs(packed, model, params, rows)
  assert through_rows.shape == (num_rows, 4, task.num_labels)
  # Cut back out per example (as evaluation does), in the examples' order.
  real_rows, placement = packed_examples.pack_examples({k: v[:13] for k, v in feats.items()}, 4)
  per_example = packed_examples.per_example(
      _outputs(packed, model, params, real_rows), placement)
  assert per_example.shape == (13, task.num_labels)
  assert _max_difference(per_example, direct[:13]) <= TOLERANCE
  assert np.abs(direct).max() > 1e-3  # real numbers compared, not zeros

  loss, grads = _loss_and_grads(unpacked, model, params, feats)
  packed_loss, packed_grads = _loss_and_grads(packed, model, params, rows)
  assert abs(float(loss) - float(packed_loss)) <= TOLERANCE
  assert _max_difference(grads, packed_grads) <= TOLERANCE
  assert max(float(np.abs(g).max()) for g in jax.tree.leaves(grads)) > 1e-4


SQUAD = {"version": "1.1", "data": [{"title": "t", "paragraphs": [
    {"context": "The cat sat on the mat in the old red house.", "qas": [
        {"id": "a", "question": "Where did the cat sit?",
         "answers": [{"text": "on the mat", "answer_start": 12}]},
        {"id": "b", "question": "What colour was the house?",
         "answers": [{"text": "red", "answer_start": 34}]}]},
    {"context": "Paris is the capital of France and its largest city by far.", "qas": [
        {"id": "c", "question": "What is the capital of France?",
         "answers": [{"text": "Paris", "answer_start": 0}]},
        {"id": "d", "question": "Which city is the largest?",
         "answers": [{"text": "Paris", "answer_start": 0}]},
        {"id": "e", "question": "Of which country is Paris the capital?",
         "answers": [{"text": "France", "answer_start": 24}]}]}]}]}


@pytest.mark.slow
def test_packed_squad_equals_unpacked_in_window_coordinates(tokenizer, bert_config_file,
                                                            tmp_path):
  """Start/end logits cut back into each window equal the unpacked ones on every real token;
  the loss (each window's softmax over its own tokens) and its gradient equal the unpacked
  model's with padding masked out of the softmax."""
  path = tmp_path / "train.json"
  path.write_text(json.dumps(SQUAD))
  examples = squad.read_squad_json(str(path))
  length = 64
  features = squad.convert_examples_to_features(examples, tokenizer, max_seq_length=length,
                                                doc_stride=32, max_query_length=16,
                                                is_training=True, progress=False)
  feats = features.arrays
  n = len(feats["weight"])
  config = configuration.BertConfig.from_json_file(bert_config_file)
  unpacked = question_answering.SquadSpans(length)
  packed = question_answering.SquadSpans(length, max_sequences_per_row=3)
  model = unpacked.model(config)
  params = _init(model, unpacked, feats)
  rows, placement = packed_examples.pack_examples(feats, 3, packed.position_columns)
  assert len(rows["weight"]) < n

  start, end = _outputs(unpacked, model, params, feats)
  row_start, row_end = _outputs(packed, model, params, rows)
  real = feats["input_mask"].astype(bool)
  for direct, through_rows in ((start, row_start), (end, row_end)):
    windows = packed_examples.per_window(through_rows, placement, length)
    assert _max_difference(windows[real], np.asarray(direct)[real]) <= TOLERANCE
    assert (windows[~real] < -1e8).all()  # never proposed by post-processing
  # Post-processing reads the packed logits as it reads unpacked ones.
  assert squad.postprocess(examples, features, *(np.where(real, x, -1e9) for x in (start, end)))[
      0] == squad.postprocess(examples, features,
                              *(packed_examples.per_window(x, placement, length)
                                for x in (row_start, row_end)))[0]

  class MaskedPadding(question_answering.SquadSpans):
    """The unpacked reference: padding out of the softmax, as packed windows have none."""
    def loss(self, outputs, batch, denominators):
      mask = batch["input_mask"].astype(bool)
      return super().loss(tuple(jnp.where(mask, x, -1e9) for x in outputs), batch,
                          denominators)

  reference = MaskedPadding(length)
  loss, grads = _loss_and_grads(reference, model, params, feats)
  packed_loss, packed_grads = _loss_and_grads(packed, model, params, rows)
  assert abs(float(loss) - float(packed_loss)) <= TOLERANCE
  assert _max_difference(grads, packed_grads) <= TOLERANCE
  assert float(loss) > 1.0  # an untrained head: a real loss, not a degenerate 0


def test_packing_reduces_rows_on_short_sentences(tokenizer):
  task = glue.get_task("SST-2")
  examples = [glue.Example(str(i), s, None, "1") for i, s in enumerate(POSITIVE + NEGATIVE)]
  feats = sequence_classification.featurize(task, examples, tokenizer, 128)
  rows, placement = packed_examples.pack_examples(feats, 8)
  assert len(rows["weight"]) * 4 <= len(examples)   # 16 sentences of ≤ 10 tokens: ≤ 4 rows
  # Every example's tokens are in its row, where its [CLS] says, with positions from 0.
  for i in range(len(examples)):
    r, s, o, n = (int(a[i]) for a in placement)
    assert rows["cls_positions"][r, s] == o
    np.testing.assert_array_equal(rows["input_ids"][r, o:o + n], feats["input_ids"][i, :n])
    np.testing.assert_array_equal(rows["position_ids"][r, o:o + n], np.arange(n))
    assert (rows["sequence_ids"][r, o:o + n] == s + 1).all()
  report = packed_examples.efficiency(feats["input_mask"], [np.arange(len(examples))], 8,
                                      multiple=1, max_rows=16)
  unpacked_efficiency = feats["input_mask"].sum() / feats["input_mask"].size
  assert report.rows == len(rows["weight"])
  assert report.tokens / (report.rows * 128) > 3 * unpacked_efficiency


def _metric_rows(out_dir):
  return {r["step"]: r for r in map(json.loads, open(os.path.join(out_dir, "metrics.jsonl")))
          if "train/loss" in r}


@pytest.mark.slow
def test_packed_run_trains_and_evaluates_like_an_unpacked_one(tokenizer, bert_config_file,
                                                               tmp_path):
  """The same examples in the same order: equal training losses step by step; and the packed
  run's model evaluated packed and unpacked gives the same dev predictions."""
  data = _sst2_dir(tmp_path / "sst2", dev_size=13)
  common = dict(task_name="SST-2", data_dir=data, init_checkpoint=None,
                bert_config_file=bert_config_file, max_seq_length=64, train_batch_size=16,
                eval_batch_size=8, learning_rate=1e-3, num_train_epochs=4,
                warmup_proportion=0.1, log_every_steps=1)
  packed = classification_run.run(finetune_config.make(
      output_dir=str(tmp_path / "packed"), do_train=True, do_eval=True, do_predict=True,
      packing=True, **common), tokenizer)
  plain = classification_run.run(finetune_config.make(
      output_dir=str(tmp_path / "plain"), do_train=True, packing=False, **common), tokenizer)
  packed_losses, plain_losses = _metric_rows(tmp_path / "packed"), _metric_rows(tmp_path / "plain")
  # (The first step's line is the compilation's; steps 2-4 report.)
  assert sorted(packed_losses) == sorted(plain_losses) == [2, 3, 4]
  for step in packed_losses:
    for name in ("train/loss", "train/accuracy", "train/grad_norm"):
      assert packed_losses[step][name] == pytest.approx(plain_losses[step][name], abs=1e-4)
  assert packed["train_steps"] == plain["train_steps"] == 4

  # The packed run's own model, evaluated unpacked: the same dev results and test predictions.
  predictions = tmp_path / "packed" / "SST-2.tsv"
  packed_predictions = predictions.read_text()
  predictions.unlink()
  again = classification_run.run(finetune_config.make(
      output_dir=str(tmp_path / "packed"), do_eval=True, do_predict=True, packing=False,
      **{k: v for k, v in common.items() if k != "bert_config_file"}), tokenizer)
  assert again["dev"] == packed["dev"]
  assert again["dev"]["num_examples"] == 13
  assert predictions.read_text() == packed_predictions
