"""Pruned heads (`bert_jax.model.pruning`, `analysis/pruning_study.py`): a pruned model computes
what the masked model computes, a layer may lose every head, the pruned checkpoint is read back
by `finetune`, `predict` and `convert`, and the study's curve is the task's own metric."""

import json
import os
import shutil

import jax
import matplotlib.image
import numpy as np
import pytest

from bert_jax.analysis import heads as heads_lib
from bert_jax.analysis import pruning_study
from bert_jax.interop import checkpoints
from bert_jax.model import configuration, modeling, pruning
from bert_jax.tasks import finetuned
from bert_jax.tasks.classification import predict as classification
from bert_jax.text import tokenization
from bert_jax.training import perf
from bert_jax.training import step as step_lib
from tests import helpers

def _logits(objective, config, params, batch, gates=None):
  state = None if gates is None else {modeling.HEAD_GATES: heads_lib.gates_tree(params, gates)}
  return np.asarray(step_lib.apply_model(objective, objective.model(config), params, batch,
                                         deterministic=True, model_state=state))


def test_a_pruned_model_computes_what_the_masked_model_computes(classifier):
  config, objective, _, params, batch = classifier
  heads = config.num_attention_heads
  remove = {0: [1, 5], 1: list(range(heads)), 2: [0, 7]}  # layer 1 loses every head
  gates = np.ones((3, heads), np.float32)
  for layer, gone in remove.items():
    gates[layer, gone] = 0.0
  masked = _logits(objective, config, params, batch, gates)
  small_config, small = pruning.prune_heads(params, config, remove)
  assert small_config.pruned_heads == ((1, 5), tuple(range(heads)), (0, 7))
  assert [small_config.heads_in_layer(i) for i in range(3)] == [6, 0, 6]
  layer_0 = small["bert"]["encoder"]["layer_0"]["attention"]
  assert layer_0["self"]["query"]["kernel"].shape == (64, 6 * config.head_dim)
  assert layer_0["output"]["dense"]["kernel"].shape == (6 * config.head_dim, 64)
  empty = small["bert"]["encoder"]["layer_1"]["attention"]
  assert "self" not in empty and set(empty["output"]["dense"]) == {"bias"}
  pruned = _logits(objective, small_config, small, batch)
  np.testing.assert_allclose(pruned, masked, atol=1e-5)
  assert np.abs(pruned - _logits(objective, config, params, batch)).max() > 3e-4  # a change
  # Silencing by zero output rows (the study's masks) is the same model.
  np.testing.assert_allclose(
      _logits(objective, config, pruning.masked(params, config, gates), batch), masked,
      atol=1e-5)
  # Pruning again counts heads in the original numbering; a head already gone is refused.
  again_config, again = pruning.prune_heads(small, small_config, {0: [0]})
  assert again_config.kept_heads(0) == (2, 3, 4, 6, 7)
  gates[0, 0] = 0.0
  np.testing.assert_allclose(_logits(objective, again_config, again, batch),
                             _logits(objective, config, params, batch, gates), atol=1e-5)
  with pytest.raises(ValueError, match="head 5 of layer 0 was pruned already"):
    pruning.prune_heads(small, small_config, {0: [5]})
  # Put back as zero heads, the full-size model computes the pruned one's outputs.
  full_config, full = pruning.restore_heads(small, small_config)
  assert full_config == config
  assert jax.tree.map(np.shape, full) == jax.tree.map(np.shape, params)
  np.testing.assert_allclose(_logits(objective, full_config, full, batch), pruned, atol=1e-5)


def test_pruned_heads_in_the_config_are_checked_and_written_both_ways():
  config = configuration.get_preset("test", num_hidden_layers=3)
  assert config.replace(pruned_heads=[[], [], []]).pruned_heads is None
  from_dict = config.replace(pruned_heads={"2": [3, 1]})  # transformers 4's form
  assert from_dict.pruned_heads == ((), (), (1, 3)) and from_dict.num_heads_kept == 22
  from bert_jax.interop import hf_config
  written = hf_config.to_hf_dict(from_dict)
  assert written["pruned_heads"] == {"2": [1, 3]}
  assert hf_config.config_from_dict(written) == from_dict
  assert configuration.BertConfig.from_dict(from_dict.to_original_dict()) == from_dict
  for bad, message in (([[0]], "has 1 rows for num_hidden_layers=3"),
                       ({"3": [0]}, "names layer '3'"),
                       ([[0, 0], [], []], "expected distinct heads in 0..7"),
                       ([[8], [], []], "expected distinct heads in 0..7")):
    with pytest.raises(ValueError, match=message):
      config.replace(pruned_heads=bad)
  with pytest.raises(ValueError, match="pruned heads need unrolled, unshared layers"):
    config.replace(pruned_heads=[[0], [], []], scan_layers=True)
  # MFU counts the attention a pruned layer still computes: 22 heads of 8 wide, not 24.
  h, i, s = config.hidden_size, config.intermediate_size, 16
  assert perf.encoder_forward_flops(config, 1, s) == s * 3 * (8 * h * h + 4 * h * i + 4 * s * h)
  assert perf.encoder_forward_flops(from_dict, 1, s) == s * (3 * 4 * h * i
                                                             + 22 * 8 * (8 * h + 4 * s))


@pytest.fixture(scope="module")
def study(sst2_model, tmp_path_factory):
  """The study of the fine-tuned SST-2 classifier (2 layers of 8 heads; a copy, so that the
  shared model is not touched), 25% of the heads at a time, the model keeping 10 heads written."""
  root = tmp_path_factory.mktemp("heads")
  shutil.copytree(sst2_model["out"], root / "model")
  tokenizer = tokenization.load_tokenizer(
      vocab_file=os.path.join(helpers.minilm_dir(), "vocab.txt"), do_lower_case=True)
  result = pruning_study.study_checkpoint(
      str(root / "model"), {"data_dir": sst2_model["data"], "eval_batch_size": 8,
                            "predict_batch_size": 8},
      tokenizer, fraction=0.25, prune_to=10, output_dir=str(root / "analysis"), batch_size=8)
  return result, root, sst2_model


def test_the_pruning_curve_is_the_tasks_metric_with_heads_removed_by_importance(study):
  result, root, sst2_model = study
  assert result.metric == "accuracy"
  assert result.steps[0].score == pytest.approx(sst2_model["results"]["dev"]["accuracy"])
  assert [s.pruned for s in result.steps] == [0, 4, 6, 8, 12, 16]  # 25% steps, and 16 - 10
  for step in result.steps:
    assert int((step.mask == 0).sum()) == step.pruned
  for before, after in zip(result.steps, result.steps[1:]):  # masks only ever grow
    assert np.all(after.mask <= before.mask)
  # The first heads to go are the least important of the full model.
  first = np.flatnonzero(result.steps[1].mask.reshape(-1) == 0)
  assert set(first) == set(np.argsort(result.importance.reshape(-1), kind="stable")[:4])
  np.testing.assert_allclose(np.linalg.norm(result.importance, axis=1), 1.0, rtol=1e-6)
  # With every head gone the classifier still answers: the score of whatever it answers.
  assert 0.0 <= result.steps[-1].score <= 1.0
  mask = result.steps[-1].mask
  # A loss is better lower: its band lies above the unpruned score.
  losses = pruning_study.Study("eval_dev/loss", result.importance, [
      pruning_study.Step(0, 0.50, result.steps[0].mask), pruning_study.Step(4, 0.504, mask),
      pruning_study.Step(8, 0.40, mask), pruning_study.Step(12, 0.60, mask)])
  assert not losses.higher_is_better and losses.prunable_within() == 8
  written = pruning_study.write(result, str(root / "analysis"))
  record = json.load(open(written[0]))
  assert record["total_heads"] == 16 and len(record["curve"]) == 6
  assert record["prunable_within_1pct"] == result.prunable_within()
  for png in written[1:]:
    image = matplotlib.image.imread(png)
    assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0


def test_the_pruned_checkpoint_is_read_by_predict_convert_and_finetune(study):
  result, root, sst2_model = study
  info = result.pruned_model
  directory = info["directory"]
  assert info["heads_kept"] == 10 and sum(info["heads_per_layer"]) == 10
  assert info["parameters_pruned"] < info["parameters_full"]
  # The pruned model scores what the masked model scored in the study.
  assert info["score"] == pytest.approx(info["score_masked"])
  config = checkpoints.read_config(directory)
  assert config.num_heads_kept == 10
  loaded = finetuned.load_finetuned(finetuned.inspect_checkpoint(directory), "classify")
  texts = ["a gorgeous , witty , seductive movie .", "the story is lame and boring ."]
  tokenizer = tokenization.load_tokenizer(
      vocab_file=os.path.join(helpers.minilm_dir(), "vocab.txt"), do_lower_case=True)
  pruned_out = classification.classify(loaded, tokenizer, [(t, None) for t in texts],
                                        classification.resolve_labels(loaded))
  # Exported for transformers (no pruned layers there): zero heads, the same probabilities.
  export = str(root / "export")
  finetuned.convert(directory, export, "hf")
  hf_config = json.load(open(os.path.join(export, "config.json")))
  assert "pruned_heads" not in hf_config and hf_config["num_attention_heads"] == 8
  import torch
  import transformers
  model = transformers.BertForSequenceClassification.from_pretrained(export).eval()
  encoded = transformers.BertTokenizer.from_pretrained(export)(texts, padding=True,
                                                               return_tensors="pt")
  with torch.no_grad():
    probs = torch.softmax(model(**encoded).logits, -1).numpy()
  np.testing.assert_allclose(probs, [list(p["probabilities"].values()) for p in pruned_out],
                             atol=1e-5)
  # finetune --do_eval on the pruned directory: the score the study measured.
  proc = helpers.run_command(
      "bert_jax.finetune", "--task_name=SST-2", f"--data_dir={sst2_model['data']}",
      f"--output_dir={directory}", "--do_eval", "--eval_batch_size=8")  # its vocabulary
  assert proc.returncode == 0, proc.stderr[-3000:]
  scores = json.load(open(os.path.join(directory, "eval_results.json")))
  assert scores["dev"]["accuracy"] == pytest.approx(info["score"])
  # ... and fine-tuning starts from it: the encoder keeps its 10 heads.
  again = root / "again"
  proc = helpers.run_command(
      "bert_jax.finetune", "--task_name=SST-2", f"--data_dir={sst2_model['data']}",
      f"--init_checkpoint={directory}", f"--output_dir={again}", "--do_train",
      "--max_seq_length=16", "--train_batch_size=8", "--num_train_epochs=1")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert checkpoints.read_config(str(again)).num_heads_kept == 10
  tuned = checkpoints.load_any(str(again)).params["bert"]["encoder"]
  assert tuned["layer_0"]["attention"]["self"]["query"]["kernel"].shape[1] == \
      info["heads_per_layer"][0] * config.head_dim


def test_the_heads_command_refuses_mistakes_in_one_line(study, tmp_path):
  _, root, sst2_model = study
  model = str(root / "model")
  for args, message in [
      ((f"--checkpoint={helpers.minilm_dir()}",),
       "a pre-training model: `analyze heads` needs a fine-tuned model"),
      ((f"--checkpoint={model}", "--prune_to=17"),
       "error: --prune_to=17: the model has 16 heads (2 layers x 8)."),
      ((f"--checkpoint={model}", "--prune_fraction=0"),
       "error: --prune_fraction=0.0: a share of the heads in (0, 1]."),
      ((f"--checkpoint={model}", "--prune_to=4", f"--output_dir={root / 'analysis'}"),
       f"error: {root / 'analysis' / 'pruned'} exists: give another --output_dir"),
      ((f"--checkpoint={model}", "--text=a"),
       "error: --text is for `analyze attention`, not `analyze heads`."),
      ((f"--checkpoint={model}", "--eval_metric=bleu"),
       "error: --eval_metric=bleu: the dev scores are accuracy, majority_class_accuracy, "
       "num_examples."),
  ]:
    flags = (f"--data_dir={sst2_model['data']}", f"--output_dir={tmp_path / 'out'}", *args)
    proc = helpers.run_command("bert_jax.analyze", "heads", *flags)
    line = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and (line.startswith(message) or message in line), proc.stderr


def test_attention_of_a_pruned_model_leaves_its_removed_heads_blank(study, tmp_path):
  result, root, _ = study
  out = tmp_path / "maps"
  proc = helpers.run_command("bert_jax.analyze", "attention",
                             f"--checkpoint={result.pruned_model['directory']}",
                             "--text=a gorgeous , witty , seductive movie .",
                             f"--output_dir={out}", "--max_seq_length=16")
  assert proc.returncode == 0, proc.stderr
  assert "(pruned)" in proc.stdout
  saved = json.load(open(out / "head_statistics.json"))
  gone = np.asarray(result.pruned_model["pruned_heads"], dtype=object)
  for layer in range(2):
    for head in range(8):
      value = saved["cls"][layer][head]
      assert (value is None) == (head in gone[layer]), (layer, head, value)
  assert matplotlib.image.imread(out / "example0_layer0.png").std() > 0


def test_squad_heads_are_measured_on_its_dev_questions_cut_with_answers(squad_v2_model,
                                                                        tmp_path):
  """SQuAD's prediction windows carry no answer positions: importance reads the same questions
  cut as training cuts them; the curve is the official F1."""
  shutil.copytree(squad_v2_model["out"], tmp_path / "model")
  tokenizer = tokenization.load_tokenizer(
      vocab_file=os.path.join(helpers.minilm_dir(), "vocab.txt"), do_lower_case=True)
  result = pruning_study.study_checkpoint(
      str(tmp_path / "model"), {"predict_file": squad_v2_model["data_file"]}, tokenizer,
      fraction=0.5, batch_size=8)
  scores = json.load(open(os.path.join(squad_v2_model["out"], "eval_results.json")))["eval"]
  assert result.metric == "f1" and result.steps[0].score == pytest.approx(scores["f1"])
  assert [s.pruned for s in result.steps] == [0, 8, 16]
  assert result.importance.shape == (2, 8) and np.all(result.importance > 0)
  assert result.pruned_model is None
