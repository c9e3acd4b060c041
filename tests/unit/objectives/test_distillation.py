"""Distillation as a plug-in of the training core: DistilBERT's pre-training triple loss (the
teacher under `teacher`, frozen, loaded from any checkpoint kind) and task-time distillation
of a fine-tuned teacher into a smaller student."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.analysis import pruning_study
from bert_jax.interop import convert
from bert_jax.interop import checkpoint_store, checkpoints
from bert_jax.model import configuration
from bert_jax.objectives import distillation
from bert_jax.objectives.mlm import MaskedLmModel
from bert_jax.runs import finetune_config, pretraining
from bert_jax.tasks.classification import run as classification_run
from bert_jax.tasks.classification import data as glue
from bert_jax.training import metrics
from tests import helpers
from tests import pretrain_helpers as ph

SEQ, PRED, VOCAB = ph.SEQ, ph.PRED, ph.VOCAB
TEACHER_LAYERS = 4  # a 2-layer student takes layers 0 and 2


def _tree_equal(a, b):
  la, lb = jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_flatten_with_path(b)[0]
  assert [p for p, _ in la] == [p for p, _ in lb]
  for (path, x), (_, y) in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(path))


@pytest.fixture(scope="module")
def records(tmp_path_factory):
  return ph.write_records(str(tmp_path_factory.mktemp("records")), num_files=2, per_file=48)


@pytest.fixture(scope="module")
def teacher_workdir(records, tmp_path_factory):
  """Our own pre-training workdir: a 4-layer masked LM trained for two steps."""
  workdir = str(tmp_path_factory.mktemp("teacher"))
  pretraining.train_and_evaluate(ph.run_config(
      records, objective="mlm", train_until_step=2, checkpoint_every_steps=1000,
      **{"model.num_hidden_layers": TEACHER_LAYERS}), workdir)
  return workdir


def _objective(teacher, **settings):
  return distillation.Distillation(max_seq_length=SEQ, max_predictions_per_seq=PRED,
                                   teacher_checkpoint=teacher, **settings
                                   ).with_checkpoints(checkpoints)


def _student_config(**fields):
  return configuration.get_preset("test", vocab_size=VOCAB, **fields)


def _started(objective, student_config, batch, seed=0):
  """The distillation model and the parameters a run starts from (teacher loaded)."""
  model = objective.model(student_config)
  params = jax.device_get(nn.unbox(model.init(
      jax.random.PRNGKey(seed), *(batch[k] for k in objective.input_names))["params"]))
  return model, objective.initialize_params(params)


def _batch(seed=0, n=4):
  return helpers.random_pretraining_batch(np.random.RandomState(seed), n, SEQ, PRED, VOCAB)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


# ------------------------------------------------------------------------------ the loss
@pytest.mark.slow
def test_loss_parts_equal_a_direct_computation(teacher_workdir):
  objective = _objective(teacher_workdir, temperature=3.0, alpha_ce=0.7, alpha_mlm=1.3,
                         alpha_cos=2.1)
  batch = _batch()
  model, params = _started(objective, _student_config(), batch)
  outputs = model.apply({"params": params}, *(batch[k] for k in objective.input_names),
                        deterministic=True)
  loss, sums = objective.loss(outputs, batch, objective.denominators(batch))

  # The teacher is the source model, run alone on its own weights.
  t_config, t_params = checkpoints.load_masked_lm(teacher_workdir, scan_layers=False)
  t_logits = np.asarray(MaskedLmModel(t_config).apply(
      {"params": t_params}, *(batch[k] for k in objective.input_names), deterministic=True))
  np.testing.assert_allclose(np.asarray(outputs["teacher"][0]), t_logits, rtol=1e-5, atol=1e-5)
  # The student is a plain masked LM on the root scopes.
  s_logits = np.asarray(MaskedLmModel(_student_config()).apply(
      {"params": {k: params[k] for k in ("bert", "cls")}},
      *(batch[k] for k in objective.input_names), deterministic=True))
  np.testing.assert_allclose(np.asarray(outputs["student"][0]), s_logits, rtol=1e-6, atol=1e-6)

  s_hidden, t_hidden = (np.asarray(outputs[k][1], np.float64) for k in ("student", "teacher"))
  s_logits, t_logits = s_logits.astype(np.float64), t_logits.astype(np.float64)
  w, ids = batch["masked_lm_weights"], batch["masked_lm_ids"]
  mask = batch["input_mask"].astype(np.float64)
  q = np.exp(_log_softmax(t_logits / 3.0))
  ce = -(q * _log_softmax(s_logits / 3.0)).sum(-1)
  mlm = -np.take_along_axis(_log_softmax(s_logits), ids[..., None], -1)[..., 0]
  cos = (s_hidden * t_hidden).sum(-1) / (np.linalg.norm(s_hidden, axis=-1)
                                         * np.linalg.norm(t_hidden, axis=-1))
  n_masked, n_tokens = w.sum(), mask.sum()
  expected = {"ce_loss": (w * ce).sum() / n_masked, "mlm_loss": (w * mlm).sum() / n_masked,
              "cos_loss": 1 - (mask * cos).sum() / n_tokens}
  want = 0.7 * 9.0 * expected["ce_loss"] + 1.3 * expected["mlm_loss"] + 2.1 * expected["cos_loss"]
  np.testing.assert_allclose(float(loss), want, rtol=1e-4)
  summary = objective.summarize(jax.device_get(sums))
  for k, v in expected.items():
    np.testing.assert_allclose(summary[k], v, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(summary["loss"], want, rtol=1e-4)
  agreement = (w * (s_logits.argmax(-1) == t_logits.argmax(-1))).sum() / n_masked
  np.testing.assert_allclose(summary["teacher_agreement"], agreement, rtol=1e-6)
  assert 0.0 <= summary["mlm_accuracy"] <= 1.0


@pytest.mark.slow
def test_width_mismatch_is_refused_unless_the_cosine_term_is_off(teacher_workdir):
  narrow = _student_config(hidden_size=32, num_attention_heads=2, intermediate_size=64)
  with pytest.raises(ValueError, match=r"alpha_cos=1.0.*student's width is 32 and the "
                                       r"teacher's 64"):
    _objective(teacher_workdir).model(narrow)
  objective = _objective(teacher_workdir, alpha_cos=0.0)
  batch = _batch()
  model, params = _started(objective, narrow, batch)
  outputs = model.apply({"params": params}, *(batch[k] for k in objective.input_names))
  loss, sums = objective.loss(outputs, batch, objective.denominators(batch))
  assert np.isfinite(float(loss)) and "cosine_sum" not in sums
  with pytest.raises(ValueError, match="student_init=teacher_every_other_layer"):
    _started(_objective(teacher_workdir, alpha_cos=0.0,
                        student_init="teacher_every_other_layer"), narrow, batch)


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True])
def test_student_init_copies_teacher_layer_2i(teacher_workdir, scan_layers):
  objective = _objective(teacher_workdir, student_init="teacher_every_other_layer")
  _, params = _started(objective, _student_config(scan_layers=scan_layers), _batch())
  if scan_layers:
    params = configuration_unstack(params)
  teacher = checkpoints.load_masked_lm(teacher_workdir, scan_layers=False)[1]
  for i in range(2):
    _tree_equal(params["bert"]["encoder"][f"layer_{i}"],
                teacher["bert"]["encoder"][f"layer_{2 * i}"])
  _tree_equal(params["bert"]["embeddings"], teacher["bert"]["embeddings"])
  _tree_equal(params["cls"], teacher["cls"])
  _tree_equal(params["teacher"], teacher)


def test_a_distilbert_student_takes_every_other_layer_without_token_types(teacher_workdir,
                                                                          tmp_path):
  """DistilBERT's student: no token-type table; the rest is the teacher's, and it exports as
  transformers' DistilBertForMaskedLM."""
  import transformers  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import hf as hf_io  # pylint: disable=g-import-not-at-top
  objective = _objective(teacher_workdir, student_init="teacher_every_other_layer")
  student = _student_config(model_type="distilbert", type_vocab_size=0)
  _, params = _started(objective, student, _batch())
  teacher = checkpoints.load_masked_lm(teacher_workdir, scan_layers=False)[1]
  embeddings = params["bert"]["embeddings"]
  assert "token_type_embeddings" not in embeddings
  _tree_equal(embeddings, {k: v for k, v in teacher["bert"]["embeddings"].items()
                           if k != "token_type_embeddings"})
  _tree_equal(params["bert"]["encoder"]["layer_1"], teacher["bert"]["encoder"]["layer_2"])
  out = hf_io.save_hf_checkpoint({k: params[k] for k in ("bert", "cls")}, student,
                                 str(tmp_path / "distilbert"))
  exported = transformers.DistilBertForMaskedLM.from_pretrained(out)
  np.testing.assert_array_equal(
      exported.distilbert.transformer.layer[1].attention.q_lin.weight.detach().numpy(),
      np.asarray(teacher["bert"]["encoder"]["layer_2"]["attention"]["self"]["query"]["kernel"]).T)


def configuration_unstack(params):
  from bert_jax.model import modeling  # pylint: disable=g-import-not-at-top
  return modeling.unstack_layers(params, 2)


def test_teacher_from_a_hugging_face_directory_gives_the_source_model_outputs(tmp_path):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  hf_config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3,
                                      num_attention_heads=2, intermediate_size=128,
                                      max_position_embeddings=128)
  source = transformers.BertForMaskedLM(hf_config).eval()
  source.save_pretrained(str(tmp_path / "hf"), safe_serialization=True)
  assert os.path.exists(tmp_path / "hf" / "model.safetensors")

  objective = _objective(str(tmp_path / "hf"), student_init="teacher_every_other_layer")
  assert objective.teacher_config.num_hidden_layers == 3
  batch = _batch(seed=1)
  model, params = _started(objective, _student_config(), batch)
  outputs = model.apply({"params": params}, *(batch[k] for k in objective.input_names))
  with torch.no_grad():
    out = source(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                 attention_mask=torch.tensor(batch["input_mask"], dtype=torch.long),
                 token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long),
                 output_hidden_states=True)
  logits = np.take_along_axis(out.logits.numpy(), batch["masked_lm_positions"][..., None], 1)
  np.testing.assert_allclose(np.asarray(outputs["teacher"][0]), logits, rtol=1e-4, atol=1e-4)
  real = batch["input_mask"].astype(bool)
  np.testing.assert_allclose(np.asarray(outputs["teacher"][1])[real],
                             out.hidden_states[-1].numpy()[real], rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------- runs: frozen, resumed
def _distill_config(records, teacher, **overrides):
  return ph.run_config(records, objective="distill", checkpoint_every_steps=1000,
                       distillation={"teacher_checkpoint": teacher, "temperature": 2.0,
                                     "alpha_ce": 5.0, "alpha_mlm": 2.0, "alpha_cos": 1.0,
                                     "student_init": "teacher_every_other_layer"},
                       **overrides)


@pytest.mark.slow
def test_distillation_run_freezes_the_teacher_resumes_exactly_and_exports_a_plain_bert(
    records, teacher_workdir, tmp_path, monkeypatch):
  config = _distill_config(records, teacher_workdir, train_until_step=4)
  run = pretraining.build(config)
  assert isinstance(run.objective, distillation.Distillation)
  # The optimizer keeps no state for the teacher: no moments under `teacher`.
  from bert_jax.training import state as state_lib  # pylint: disable=g-import-not-at-top
  abstract, _ = state_lib.abstract_train_state(
      run.model, run.tx, run.mesh, run.rules, run.objective.example_batch(16),
      run.objective.input_names)
  opt_paths = [jax.tree_util.keystr(p) for p, _ in
               jax.tree_util.tree_flatten_with_path(abstract.opt_state)[0]]
  assert opt_paths and not any("teacher" in p for p in opt_paths)

  straight = str(tmp_path / "straight")
  pretraining.train_and_evaluate(config, straight)
  resumed = str(tmp_path / "resumed")
  pretraining.train_and_evaluate(_distill_config(records, teacher_workdir, train_until_step=2),
                                 resumed)
  # The resumed run restores the teacher with the rest of its state: no weights are read.
  def no_loading(*args, **kwargs):
    raise AssertionError(f"a resumed run read a checkpoint's weights: {args}")
  monkeypatch.setattr(checkpoints, "load_any", no_loading)
  out = pretraining.train_and_evaluate(config, resumed)
  monkeypatch.undo()
  assert out["step"] == 4
  pa, _ = checkpoint_store.load_params(os.path.join(straight, "checkpoints"))
  pb, _ = checkpoint_store.load_params(os.path.join(resumed, "checkpoints"))
  _tree_equal(pa, pb)

  rows = metrics.read_jsonl(os.path.join(resumed, "metrics.jsonl"))
  last = [r for r in rows if "train/loss" in r][-1]
  assert {"train/ce_loss", "train/mlm_loss", "train/cos_loss", "train/cosine",
          "train/mlm_accuracy", "train/teacher_agreement"} <= set(last)

  # The teacher is bitwise the source; the student moved away from teacher layer 2i.
  teacher = checkpoints.load_masked_lm(teacher_workdir, scan_layers=False)[1]
  _tree_equal(pb["teacher"], teacher)
  moved = pb["bert"]["encoder"]["layer_1"]["attention"]
  assert not np.array_equal(np.asarray(jax.tree.leaves(moved)[0]),
                            np.asarray(jax.tree.leaves(
                                teacher["bert"]["encoder"]["layer_2"]["attention"])[0]))

  # The student alone: a plain BERT masked LM, in our format and exported to Hugging Face.
  s_config, s_params = checkpoints.load_masked_lm(resumed, scan_layers=False)
  assert s_config.num_hidden_layers == 2 and "teacher" not in s_params
  exported = convert.convert(resumed, str(tmp_path / "hf"), "hf")
  h_config, h_params = checkpoints.load_masked_lm(exported, scan_layers=False)
  assert h_config.num_hidden_layers == 2
  _tree_equal(h_params["bert"]["encoder"], s_params["bert"]["encoder"])
  import transformers  # pylint: disable=g-import-not-at-top
  model, info = transformers.BertForMaskedLM.from_pretrained(exported, output_loading_info=True)
  assert model.config.num_hidden_layers == 2 and not info["missing_keys"], info


# --------------------------------------------------------------------- task-time distillation
def _sst2(path):
  from tests.task_helpers import sst2_dir as _sst2_dir  # pylint: disable=g-import-not-at-top
  return _sst2_dir(path)


@pytest.mark.slow
def test_task_distillation_teaches_a_smaller_student(tokenizer, tmp_path):
  data = _sst2(tmp_path / "sst2")
  task = glue.get_task("SST-2")
  teacher_cfg = str(tmp_path / "teacher_config.json")
  configuration.get_preset("test", vocab_size=30522, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0).to_json_file(teacher_cfg)
  student_cfg = str(tmp_path / "student_config.json")
  configuration.get_preset("test", vocab_size=30522, num_hidden_layers=1, hidden_size=32,
                           num_attention_heads=2, intermediate_size=64,
                           hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0).to_json_file(student_cfg)
  common = dict(data_dir=data, init_checkpoint=None, max_seq_length=16,
                train_batch_size=16, eval_batch_size=8, learning_rate=1e-3,
                warmup_proportion=0.1, do_train=True, do_eval=True, num_train_epochs=40)
  teacher_dir = str(tmp_path / "teacher")
  taught = classification_run.run(finetune_config.make(
      bert_config_file=teacher_cfg, output_dir=teacher_dir, **common), tokenizer, task)
  assert taught["dev"]["accuracy"] == 1.0

  student_dir = str(tmp_path / "student")
  out = classification_run.run(finetune_config.make(
      bert_config_file=student_cfg, output_dir=student_dir, teacher_checkpoint=teacher_dir,
      distill_temperature=2.0, distill_alpha=0.5, eval_every_steps=20, **common), tokenizer,
      task)
  assert out["dev"]["num_examples"] == 16
  assert out["dev"]["accuracy"] >= 0.9, out["dev"]  # the student's own model, evaluated

  rows = metrics.read_jsonl(os.path.join(student_dir, "metrics.jsonl"))
  # Evaluated as the student alone while training too; the last is the final evaluation.
  scored = {r["step"]: r["eval_dev/accuracy"] for r in rows if "eval_dev/accuracy" in r}
  assert sorted(scored) == [20, 40] and scored[40] == out["dev"]["accuracy"]
  last = [r for r in rows if "train/loss" in r][-1]
  assert {"train/distill_loss", "train/task_loss", "train/teacher_agreement",
          "train/accuracy"} <= set(last)
  assert last["train/teacher_agreement"] > 0.5
  # The teacher stayed the fine-tuned one, bitwise, and the student is a plain 1-layer model.
  student, _ = checkpoint_store.load_params(os.path.join(student_dir, "checkpoints"))
  source, _ = checkpoint_store.load_params(os.path.join(teacher_dir, "checkpoints"))
  _tree_equal(student["teacher"], source)
  assert sorted(k for k in student["bert"]["encoder"]) == ["layer_0"]
  assert student["classifier"]["kernel"].shape == (32, 2)
  # Evaluated again without --teacher_checkpoint: the run reads the teacher it recorded.
  again = classification_run.run(finetune_config.make(
      output_dir=student_dir, data_dir=data, init_checkpoint=None, max_seq_length=16,
      eval_batch_size=8, do_train=False, do_eval=True), tokenizer, task)
  assert again["dev"]["accuracy"] == out["dev"]["accuracy"]
  # Its heads studied as the student alone; the pruned student is written without a teacher.
  study = pruning_study.study_checkpoint(
      student_dir, {"data_dir": data, "eval_batch_size": 8, "predict_batch_size": 8},
      tokenizer, fraction=0.5, prune_to=1, output_dir=str(tmp_path / "heads"), batch_size=8)
  assert study.steps[0].score == out["dev"]["accuracy"] and study.total_heads == 2
  pruned_dir = study.pruned_model["directory"]
  assert "teacher_checkpoint" not in checkpoints.run_metadata(pruned_dir)
  pruned, _ = checkpoint_store.load_params(os.path.join(pruned_dir, "checkpoints"))
  assert "teacher" not in pruned
  assert pruned["bert"]["encoder"]["layer_0"]["attention"]["self"]["query"]["kernel"].shape == \
      (32, 16)


def test_task_distillation_loss_equals_a_direct_computation(tmp_path):
  from bert_jax.tasks import distillation as task_distillation  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks.classification import objective as sequence_classification  # pylint: disable=g-import-not-at-top
  task = glue.get_task("SST-2")
  student = sequence_classification.SequenceClassification(task, 16)
  objective = task_distillation.TaskDistillation(student, "unused", temperature=3.0, alpha=0.3)
  rng = np.random.RandomState(0)
  s, t = rng.randn(6, 2).astype(np.float32), rng.randn(6, 2).astype(np.float32)
  batch = {"label": rng.randint(0, 2, 6).astype(np.int32),
           "weight": np.array([1, 1, 1, 1, 1, 0], np.float32)}
  loss, sums = objective.loss({"student": jnp.asarray(s), "teacher": jnp.asarray(t)}, batch,
                              objective.denominators(batch))
  w = batch["weight"]
  soft = -(np.exp(_log_softmax(t / 3.0)) * _log_softmax(s / 3.0)).sum(-1)
  hard = -np.take_along_axis(_log_softmax(s), batch["label"][:, None], 1)[:, 0]
  want = 0.3 * 9.0 * (w * soft).sum() / 5 + 0.7 * (w * hard).sum() / 5
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  np.testing.assert_allclose(objective.summarize(jax.device_get(sums))["loss"], want, rtol=1e-5)


def test_distilbert_recipe_config(teacher_workdir):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("distill_config",
                                                os.path.join(ph.REPO, "configs", "distill.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  assert (config.objective, config.model.preset, config.optimizer.learning_rate,
          config.distillation.temperature, config.distillation.alpha_ce,
          config.distillation.alpha_mlm, config.distillation.alpha_cos) == (
              "distill", "distilbert_base", 5e-4, 2.0, 5.0, 2.0, 1.0)
  with pytest.raises(ValueError, match="config.distillation.teacher_checkpoint is not set"):
    pretraining.objective_from(config)
  config.distillation.teacher_checkpoint = teacher_workdir
  objective = pretraining.objective_from(config)
  assert isinstance(objective, distillation.Distillation)
  assert objective.student_init == "teacher_every_other_layer"
  assert objective.frozen_scopes == ("teacher",)
  assert objective.teacher_config.num_hidden_layers == TEACHER_LAYERS
