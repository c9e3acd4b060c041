"""The pre-training loop: sharded steps, accumulation, exact resume, preemption, faults."""

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from bert_jax import inference
from bert_jax.interop import convert
from bert_jax.interop import checkpoint_store, checkpoints
from bert_jax.runs import pretraining
from bert_jax.data import input_pipeline
from bert_jax.model import heads, modeling
from bert_jax.parallel import sharding
from bert_jax.objectives import mlm_nsp
from bert_jax.training import checkpointing, metrics, optimizer
from bert_jax.training import state as state_lib
from bert_jax.training import step as step_lib
from tests import helpers
from tests import pretrain_helpers as ph


OBJECTIVE = mlm_nsp.MaskedLmNextSentence(ph.SEQ, ph.PRED)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
  return ph.write_records(str(tmp_path_factory.mktemp("records")))


def _losses(workdir):
  rows = metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def test_scan_layers_default_follows_the_platform():
  """`model.scan_layers` unset: scanned on TPUs, unrolled on CPUs and GPUs (where scanned
  steps measured slower); set, it is what it says everywhere."""
  config = ph.run_config("unused")
  assert config.model.scan_layers is None
  assert pretraining.bert_config_from(config, platform="tpu").scan_layers
  assert not pretraining.bert_config_from(config, platform="gpu").scan_layers
  assert not pretraining.bert_config_from(config, platform="cpu").scan_layers
  assert not pretraining.bert_config_from(config).scan_layers  # this machine: a CPU
  config.model.scan_layers = True
  assert pretraining.bert_config_from(config, platform="gpu").scan_layers
  config.model.scan_layers = False
  assert not pretraining.bert_config_from(config, platform="tpu").scan_layers
  # The stacked layout run unrolled needs the stacked layout: asked for, it is implied.
  config.model.scan_layers, config.model.stack_unrolled = None, True
  stacked = pretraining.bert_config_from(config, platform="gpu")
  assert stacked.scan_layers and stacked.stack_unrolled and not stacked.scanned_loop


def test_a_resumed_run_keeps_its_checkpoints_layout():
  """The layout unset, a run resuming from its checkpoint keeps the checkpoint's layers'
  layout on any platform (its optimizer state is laid out so); stacked layers run as the
  platform runs them. A layout set on the command line stays as set (and a checkpoint of the
  other layout is then refused, naming the fix)."""
  config = ph.recipe("base")

  def layout(platform, capability, resumed):
    b = pretraining.bert_config_from(config, platform, capability, resumed)
    return b.scan_layers, b.stack_unrolled

  for platform, capability in (("cpu", None), ("tpu", None), ("gpu", (7, 5)), ("gpu", (9, 0))):
    assert layout(platform, capability, "unrolled") == (False, False)
  assert layout("cpu", None, "stacked") == (True, False)
  assert layout("tpu", None, "stacked") == (True, False)
  assert layout("gpu", (7, 5), "stacked") == (True, False)
  assert layout("gpu", (9, 0), "stacked") == (True, True)  # the recent GPU's way to run them
  # Unrolled layers resumed on a recent GPU: its fused kernels all the same.
  resumed = pretraining.bert_config_from(config, "gpu", (9, 0), "unrolled")
  assert (resumed.attention_implementation, resumed.layer_norm_implementation) == (
      "cudnn", "pallas")
  # Set, the layout is what it says.
  config.model.scan_layers = True
  assert layout("cpu", None, "unrolled") == (True, False)
  # Shared layers have one layout: nothing to keep.
  albert = ph.recipe("albert_base")
  assert not pretraining.bert_config_from(albert, "gpu", (9, 0), "stacked").scan_layers


def test_a_run_resumes_in_the_layout_it_started_in(records, tmp_path, caplog):
  """A run started with stacked layers and resumed with the layout unset (where this CPU would
  pick unrolled ones, as a GPU run started under an older default would differ from a recent
  GPU's) continues: the same losses as an uninterrupted stacked run."""
  straight = str(tmp_path / "straight")
  pretraining.train_and_evaluate(
      ph.run_config(records, train_until_step=8, **{"model.scan_layers": True}), straight)
  resumed = str(tmp_path / "resumed")
  pretraining.train_and_evaluate(
      ph.run_config(records, train_until_step=4, **{"model.scan_layers": True}), resumed)
  caplog.clear()
  with caplog.at_level("INFO"):
    pretraining.train_and_evaluate(ph.run_config(records, train_until_step=8), resumed)
  assert "resuming a checkpoint of stacked layers: scan_layers=True" in caplog.text
  a, b = _losses(straight), _losses(resumed)
  assert max(b) == 8
  for s in range(6, 9):  # after the restart's first step
    assert a[s] == b[s], (s, a[s], b[s])
  assert checkpointing.stored_layout(resumed) == "stacked"
  assert checkpointing.stored_layout(straight) == "stacked"
  fresh = tmp_path / "fresh"  # no run there yet: nothing to keep, and nothing created
  assert checkpointing.stored_layout(str(fresh)) is None and not fresh.exists()


def _fused(config, capability=(9, 0), platform="gpu"):
  b = pretraining.bert_config_from(config, platform, capability)
  return (b.attention_implementation, b.layer_norm_implementation, b.scan_layers,
          b.stack_unrolled)


def test_a_recent_gpu_runs_the_fused_program_where_the_model_allows():
  """Left unset on a CUDA GPU of compute capability 8.0 or newer, the attention kernel, the
  LayerNorm kernel and the layout are the program measured fastest (cuDNN's attention with its
  dropout, the fused LayerNorm sites, stacked layers run unrolled); each only where the model
  allows it, and a field the config sets stays as set."""
  fused = ("cudnn", "pallas", True, True)
  base = ph.recipe("base")
  assert _fused(base) == fused
  assert _fused(base, (8, 0)) == fused
  # Older GPUs, a GPU that gives no capability, and other platforms: as configured.
  assert _fused(base, (7, 5)) == (None, "xla", False, False)
  assert _fused(base, None) == (None, "xla", False, False)
  assert _fused(base, (9, 0), "tpu") == (None, "xla", True, False)
  assert _fused(base, (9, 0), "cpu") == (None, "xla", False, False)
  # Set on the command line, a field stays; the others still take the fused values.
  base.model.attention_implementation = "xla"
  base.model.scan_layers = False
  assert _fused(base) == ("xla", "pallas", False, False)
  # A scanned loop asked for: one attention call site for every layer, so not cuDNN's dropout.
  scanned = ph.recipe("base")
  scanned.model.scan_layers = True
  assert _fused(scanned) == (None, "pallas", True, False)
  scanned.model.attention_probs_dropout_prob = 0.0
  assert _fused(scanned)[0] == "cudnn"
  # float32 compute: neither kernel (cuDNN's attention and the fused sites are bf16/fp16).
  f32 = ph.recipe("base")
  f32.model.dtype = "float32"
  assert _fused(f32) == (None, "xla", True, True)
  # Heads cuDNN cannot take (312 / 12 = 26 values), or an odd length: not cuDNN's attention.
  odd = ph.recipe("base")
  odd.model.update(hidden_size=312, intermediate_size=1248)
  assert _fused(odd) == (None, "pallas", True, True)
  odd = ph.recipe("base")
  odd.data.max_seq_length = 127
  assert _fused(odd)[0] is None
  # Heads of 256 values: Hopper's cuDNN takes them, Ampere's does not.
  wide = ph.recipe("base")
  wide.model.num_attention_heads = 3
  assert _fused(wide)[0] == "cudnn" and _fused(wide, (8, 0))[0] is None
  # ALBERT's shared layers: no stacked layout; cuDNN's attention only without attention dropout.
  albert = ph.recipe("albert_base")
  assert albert.model.attention_probs_dropout_prob == 0
  assert _fused(albert) == ("cudnn", "pallas", False, False)
  albert.model.attention_probs_dropout_prob = 0.1
  assert _fused(albert)[0] is None
  # Each resolved config is one the model accepts, for every recipe.
  for variant in ("large", "roberta_base", "spanbert_base", "electra_small", "electra_base",
                  "tiny", "demo"):
    pretraining.bert_config_from(ph.recipe(variant), "gpu", (9, 0))


def _setup(config):
  bert_config = pretraining.bert_config_from(config)
  model = heads.BertForPreTraining(bert_config)
  opt = ml_collections.ConfigDict(config.optimizer.to_dict())
  opt.total_steps = config.total_steps
  tx, schedule = optimizer.create_optimizer(opt)
  return model, tx, schedule


def _batches(records, n, seed=0):
  data = input_pipeline.PretrainingData(records, global_batch_size=16, max_seq_length=ph.SEQ,
                                        max_predictions_per_seq=ph.PRED, sharding=None, seed=seed)
  it = data.host_batches()
  return [next(it)[0] for _ in range(n)]


@pytest.mark.mesh
@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (2, 2, 2)])
def test_sharded_steps_equal_one_device(records, mesh_shape):
  """3 train steps (dropout on) on 8 devices give one device's losses and parameters."""
  config = ph.run_config(records)
  model, tx, schedule = _setup(config)
  batches = _batches(records, 3)
  example = OBJECTIVE.example_batch(16)
  results = {}
  for name, shape, devices in (("one", (1, 1, 1), jax.devices()[:1]),
                               ("many", mesh_shape, None)):
    mesh = sharding.create_mesh(shape, devices)
    rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
    state, state_sh = state_lib.create_train_state(model, tx, mesh, rules, 0, example,
                                                   OBJECTIVE.input_names)
    batch_sh = sharding.batch_sharding(mesh)
    step = step_lib.build_train_step(OBJECTIVE, model, tx, schedule, state_sh, batch_sh, mesh,
                                     rules)
    losses = []
    for b in batches:
      state, m = step(state, jax.device_put(b, batch_sh))
      losses.append(float(m["loss"]))
    results[name] = (losses, jax.device_get(state.params))
  np.testing.assert_allclose(results["many"][0], results["one"][0], atol=1e-5, rtol=0)
  diffs = [np.abs(a - b).max() for a, b in zip(jax.tree.leaves(results["many"][1]),
                                               jax.tree.leaves(results["one"][1]))]
  assert max(diffs) <= 1e-5
  assert results["one"][0][0] != results["one"][0][2]  # training moved


@pytest.mark.mesh
@pytest.mark.slow
def test_stacked_layers_run_unrolled_train_as_the_unrolled_layers(records):
  """3 train steps (dropout on) on a (2, 2, 2) mesh with the layers' parameters and optimizer
  state stacked but the layers unrolled (`stack_unrolled`) give the unrolled model's losses,
  gradient norms and parameters: the same dropout masks, the same update per leaf."""
  batches = _batches(records, 3)
  mesh = sharding.create_mesh((2, 2, 2))
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  batch_sh = sharding.batch_sharding(mesh)
  results = {}
  for name, overrides in (("unrolled", {"model.scan_layers": False}),
                          ("stacked", {"model.stack_unrolled": True})):
    model, tx, schedule = _setup(ph.run_config(records, **overrides))
    state, state_sh = state_lib.create_train_state(model, tx, mesh, rules, 0,
                                                   OBJECTIVE.example_batch(16),
                                                   OBJECTIVE.input_names)
    step = step_lib.build_train_step(OBJECTIVE, model, tx, schedule, state_sh, batch_sh, mesh,
                                     rules)
    seen = []
    for b in batches:
      state, m = step(state, jax.device_put(b, batch_sh))
      seen.append((float(m["loss"]), float(m["grad_norm"])))
    results[name] = (seen, jax.device_get(state.params), state_sh.params)
  np.testing.assert_allclose(results["stacked"][0], results["unrolled"][0], atol=1e-5, rtol=0)
  stacked = results["stacked"][1]
  layer = stacked["bert"]["encoder"]["layer"]
  assert layer["intermediate"]["dense"]["kernel"].shape[0] == 2  # one row per layer
  unrolled = modeling.stack_layers(results["unrolled"][1], 2)
  assert jax.tree.structure(unrolled) == jax.tree.structure(stacked)
  assert max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(unrolled),
                                                 jax.tree.leaves(stacked))) <= 1e-5
  # Sharded as the scanned layout is: the layer axis whole, the rest by the rules.
  kernel_sharding = results["stacked"][2]["bert"]["encoder"]["layer"]["intermediate"]["dense"][
      "kernel"]
  assert kernel_sharding.spec[0] is None and kernel_sharding.spec[1:] == ("fsdp", "model")


def test_an_ahead_of_time_compile_counts_the_vocabulary_of_the_records(tmp_path, caplog):
  """`--compile_only` with the vocabulary left to the records: their summary.json's size, as the
  run itself would take; records out of reach: the preset's, said."""
  records = ph.write_records(str(tmp_path / "data"), num_files=1)
  (tmp_path / "data" / "summary.json").write_text(json.dumps({"vocab_size": 640}))
  out = pretraining.compile_train_step(
      ph.run_config(records, **{"model.vocab_size": None}), compile_step=False)
  given = pretraining.compile_train_step(
      ph.run_config(records, **{"model.vocab_size": 640}), compile_step=False)
  assert out["vocab_size"] == given["vocab_size"] == 640
  assert out["num_parameters"] == given["num_parameters"]
  unreachable = pretraining.compile_train_step(
      ph.run_config(str(tmp_path / "nowhere" / "*.tfrecord"), **{"model.vocab_size": None}),
      compile_step=False)
  assert unreachable["vocab_size"] == 512  # the `test` preset's
  assert "Compiling with the preset's vocabulary size" in caplog.text


@pytest.mark.mesh
@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch(records):
  config = ph.run_config(records, **{"model.hidden_dropout_prob": 0.0,
                                     "model.attention_probs_dropout_prob": 0.0})
  model, tx, schedule = _setup(config)
  batch = _batches(records, 1)[0]
  mesh = sharding.create_mesh((4, 1, 1), jax.devices()[:4])
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  batch_sh = sharding.batch_sharding(mesh)
  out = {}
  for k in (1, 4):
    state, state_sh = state_lib.create_train_state(model, tx, mesh, rules, 0,
                                                   OBJECTIVE.example_batch(16),
                                                   OBJECTIVE.input_names)
    step = step_lib.build_train_step(OBJECTIVE, model, tx, schedule, state_sh, batch_sh, mesh,
                                     rules, k)
    for _ in range(2):  # the second step sees non-zero learning rate and moved parameters
      state, m = step(state, jax.device_put(batch, batch_sh))
    out[k] = (jax.device_get(m), jax.device_get(state.params))
  for key in ("loss", "grad_norm", "mlm_correct_sum", "mlm_weight_sum", "nsp_loss_sum"):
    assert abs(float(out[1][0][key]) - float(out[4][0][key])) <= 1e-5, key
  assert max(np.abs(a - b).max() for a, b in zip(jax.tree.leaves(out[1][1]),
                                                 jax.tree.leaves(out[4][1]))) <= 1e-5


@pytest.mark.slow
def test_resume_continues_exactly(records, tmp_path, caplog):
  """8 steps, stop, resume to 16 == 16 uninterrupted steps: same losses, same parameters."""
  straight = str(tmp_path / "straight")
  pretraining.train_and_evaluate(ph.run_config(records, train_until_step=16), straight)
  resumed = str(tmp_path / "resumed")
  pretraining.train_and_evaluate(ph.run_config(records, train_until_step=8), resumed)
  first = _losses(resumed)
  pretraining.train_and_evaluate(ph.run_config(records, train_until_step=16), resumed)
  a, b = _losses(straight), _losses(resumed)
  assert max(first) == 8 and max(b) == 16
  for s in range(10, 17):  # steps after the restart (the first post-restart step is compile)
    assert a[s] == b[s], (s, a[s], b[s])
  assert "The records changed" not in caplog.text  # the same records: the same position
  pa, _ = checkpoint_store.load_params(os.path.join(straight, "checkpoints"))
  pb, _ = checkpoint_store.load_params(os.path.join(resumed, "checkpoints"))
  for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert sorted(os.listdir(os.path.join(resumed, "checkpoints"))) == ["12", "16", "8"]  # keep 3
  # The encoder alone, as fine-tuning loads it: no optimizer state, no pre-training heads.
  encoder, meta = checkpoint_store.load_params(os.path.join(resumed, "checkpoints"),
                                               subtree="params/bert")
  assert sorted(encoder) == ["embeddings", "encoder", "pooler"]
  np.testing.assert_array_equal(np.asarray(encoder["pooler"]["dense"]["kernel"]),
                                np.asarray(pb["bert"]["pooler"]["dense"]["kernel"]))
  assert meta["bert_config"]["num_hidden_layers"] == 2


def test_records_rewritten_under_the_same_names_are_not_resumed_into(tmp_path, caplog):
  """Records regenerated between a stop and a restart (another seed, same shard names): the
  saved position is no place in them; the run says so and starts their first epoch instead
  of resuming silently into other data. The first run leaves the records' shapes unset (the
  default config does): they are read from the records."""
  data = str(tmp_path / "data")
  records = ph.write_records(data, num_files=2, seed=0)
  workdir = str(tmp_path / "run")
  caplog.set_level("INFO")
  pretraining.train_and_evaluate(ph.run_config(records, train_until_step=4, **{
      "data.max_seq_length": None, "data.max_predictions_per_seq": None}), workdir)
  assert f"data.max_seq_length={ph.SEQ} from the records" in caplog.text
  assert f"data.max_predictions_per_seq={ph.PRED} from the records" in caplog.text
  data_item = json.load(open(os.path.join(workdir, "checkpoints", "4", "data", "metadata")))
  assert len(data_item["records"]) == 16 and len(data_item["per_process"]) == 1
  ph.write_records(data, num_files=2, seed=1)  # the same names, other records
  with open(os.path.join(data, "summary.json"), "w") as f:
    json.dump({"regenerated": True}, f)
  out = pretraining.train_and_evaluate(ph.run_config(records, train_until_step=8), workdir)
  assert out["step"] == 8
  assert "The records changed since this checkpoint was saved" in caplog.text


@pytest.mark.mesh
@pytest.mark.slow
def test_checkpoint_restores_onto_another_mesh(records, tmp_path):
  workdir = str(tmp_path / "run")
  pretraining.train_and_evaluate(ph.run_config(records, train_until_step=4, mesh_shape=(2, 2, 2)),
                              workdir)
  config = ph.run_config(records, train_until_step=6, mesh_shape=(1, 8, 1))
  out = pretraining.train_and_evaluate(config, workdir)
  assert out["step"] == 6 and np.isfinite(out["train/loss"])


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _cli_args(records, workdir, **overrides):
  args = [sys.executable, "-m", "bert_jax.pretrain",
          f"--config={os.path.join(ph.REPO, 'configs', 'pretrain.py')}:tiny",
          f"--workdir={workdir}", "--config.model.preset=test",
          f"--config.model.vocab_size={ph.VOCAB}", f"--config.data.train_files={records}",
          f"--config.data.max_seq_length={ph.SEQ}", f"--config.data.max_predictions_per_seq={ph.PRED}",
          "--config.data.shuffle_buffer_size=64", "--config.global_batch_size=16",
          "--config.total_steps=40", "--config.optimizer.warmup_steps=3",
          "--config.optimizer.learning_rate=0.001", "--config.log_every_steps=1",
          "--config.eval_steps=2", "--config.checkpoint_every_steps=4", "--config.tensorboard=False"]
  args += [f"--config.{k}={v}" for k, v in overrides.items()]
  return args


@pytest.mark.mesh
@pytest.mark.slow
@pytest.mark.e2e
def test_two_processes_match_one(records, tmp_path):
  """2 local JAX processes × 4 CPU devices train like one process on 8 devices fed the same
  global batches (each host reads its own files)."""
  workdir = str(tmp_path / "multi")
  port = _free_port()
  procs = [subprocess.Popen(
      _cli_args(records, workdir, train_until_step=5, mesh_shape="(8, 1, 1)") +
      [f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}"],
      env=helpers.command_env(4), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  outputs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
  multi = _losses(workdir)
  # Only process 0 reports: progress lines on its console, one metrics row per step.
  progress = [re.findall(r"^step +\d+/5 ", out, re.M) for out in outputs]
  assert len(progress[0]) >= 4 and not progress[1], outputs[1][-3000:]
  rows = [r["step"] for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
          if "train/loss" in r]
  assert rows == sorted(set(rows)) and set(rows) >= {2, 3, 4, 5}
  # Both processes wrote one checkpoint together (Orbax multi-host), restorable by one process.
  assert checkpointing.CheckpointManager(os.path.join(workdir, "checkpoints")).all_steps()

  # The same global batches in one process: host 0's rows, then host 1's.
  config = ph.run_config(records)
  model, tx, schedule = _setup(config)
  files = input_pipeline.list_files(records)
  train_files, _ = input_pipeline.split_train_eval(files, None)
  streams = [input_pipeline.PretrainingData(
      None, files=train_files, global_batch_size=16, max_seq_length=ph.SEQ,
      max_predictions_per_seq=ph.PRED, sharding=None, seed=config.seed, shuffle_buffer_size=64,
      process_index=i, process_count=2).host_batches() for i in range(2)]
  mesh = sharding.create_mesh((8, 1, 1))
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  state, state_sh = state_lib.create_train_state(model, tx, mesh, rules, config.seed,
                                                 OBJECTIVE.example_batch(16),
                                                   OBJECTIVE.input_names)
  batch_sh = sharding.batch_sharding(mesh)
  step = step_lib.build_train_step(OBJECTIVE, model, tx, schedule, state_sh, batch_sh, mesh,
                                     rules)
  single = {}
  for s in range(1, 6):
    parts = [next(st)[0] for st in streams]
    batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    state, m = step(state, jax.device_put(batch, batch_sh))
    single[s] = OBJECTIVE.summarize(jax.device_get(m))["loss"]
  for s in range(2, 6):
    assert abs(multi[s] - single[s]) <= 1e-5, (s, multi[s], single[s])


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_stop_signal_saves_and_resume_continues(records, tmp_path, signum):
  workdir = str(tmp_path / "preempted")
  proc = subprocess.Popen(_cli_args(records, workdir, train_until_step=100000,
                                    total_steps=200000, checkpoint_every_steps=100000),
                          env=helpers.command_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  metrics_file = os.path.join(workdir, "metrics.jsonl")
  helpers.wait_until(lambda: proc.poll() is not None or (
      os.path.exists(metrics_file) and len(metrics.read_jsonl(metrics_file)) >= 3),
                     "three logged steps", poll_s=0.5)
  proc.send_signal(signum)
  output = proc.communicate(timeout=120)[0]
  assert proc.returncode == 0, output[-3000:]
  assert "Stop requested: saved step" in output and "Traceback" not in output
  steps = checkpointing.CheckpointManager(os.path.join(workdir, "checkpoints")).all_steps()
  assert len(steps) == 1 and 3 <= steps[0] < 100000
  saved = steps[0]
  out = pretraining.train_and_evaluate(ph.run_config(records, train_until_step=saved + 2,
                                                  total_steps=200000), workdir)
  assert out["step"] == saved + 2


@pytest.mark.slow
def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(records, tmp_path):
  workdir = str(tmp_path / "nan")
  pretraining.train_and_evaluate(ph.run_config(records, train_until_step=4), workdir)
  # An absurd learning rate blows the weights up within a few steps.
  config = ph.run_config(records, train_until_step=40, **{"optimizer.learning_rate": 1e30,
                                                          "optimizer.warmup_steps": 0})
  with pytest.raises(FloatingPointError) as err:
    pretraining.train_and_evaluate(config, workdir)
  message = str(err.value)
  assert "Loss became" in message and "last good checkpoint is step 4" in message
  assert checkpointing.CheckpointManager(os.path.join(workdir, "checkpoints")).all_steps() == [4]


def test_record_shape_mismatch_names_feature_and_sizes(records, tmp_path):
  """Every setting the records disagree with, in one message with the flags that fit them (not
  one failed start per setting)."""
  config = ph.run_config(records, **{"data.max_seq_length": 64})
  with pytest.raises(ValueError, match=r"the records were written with max_seq_length=32 "
                                       r"\('input_ids' has 32 values per record; the config 64\): "
                                       r"add --config.data.max_seq_length=32, or re-create"):
    pretraining.train_and_evaluate(config, str(tmp_path / "w"))
  config = ph.run_config(records, **{"data.max_seq_length": 64,
                                     "data.max_predictions_per_seq": 7})
  with pytest.raises(ValueError) as error:
    pretraining.train_and_evaluate(config, str(tmp_path / "w"))
  assert (f"add --config.data.max_seq_length={ph.SEQ} "
          f"--config.data.max_predictions_per_seq={ph.PRED}, or re-create") in str(error.value)


def test_corrupt_record_names_file_and_offset(tmp_path):
  pattern = ph.write_records(str(tmp_path / "data"), num_files=2, per_file=40)
  files = input_pipeline.list_files(pattern)
  data = open(files[0], "rb").read()
  with open(files[0], "wb") as f:
    f.write(data[:len(data) // 2] + b"\x00" * 7 + data[len(data) // 2 + 7:])
  stream = input_pipeline.PretrainingData(pattern, global_batch_size=8, max_seq_length=ph.SEQ,
                                          max_predictions_per_seq=ph.PRED, sharding=None,
                                          shuffle=False, repeat=False)
  with pytest.raises(ValueError, match=r"Corrupt pre-training record: .*train-00000.tfrecord.*"
                                       r"corrupted record at \d+"):
    list(stream.host_batches())


@pytest.mark.slow
def test_a_run_skips_damaged_records_only_when_asked_and_counts_them(tmp_path):
  pattern = ph.write_records(str(tmp_path / "data"), num_files=3, per_file=40)
  files = input_pipeline.list_files(pattern)
  data = open(files[0], "rb").read()
  with open(files[0], "wb") as f:
    f.write(data[:len(data) // 2] + b"\x00" * 7 + data[len(data) // 2 + 7:])
  with pytest.raises(ValueError, match=r"train-00000\.tfrecord: record \d+ at byte offset \d+"):
    pretraining.train_and_evaluate(ph.run_config(pattern, train_until_step=12,
                                                 checkpoint_every_steps=100),
                                   str(tmp_path / "strict"))
  out = pretraining.train_and_evaluate(
      ph.run_config(pattern, train_until_step=12, checkpoint_every_steps=100,
                    **{"data.skip_corrupt_records": True}), str(tmp_path / "skipping"))
  assert out["step"] == 12 and out["skipped_records"] >= 1


def test_dynamic_masking_draws_fresh_masks_each_epoch(tmp_path):
  from bert_jax.text import masking
  pattern = ph.write_records(str(tmp_path / "dyn"), num_files=2, per_file=64, masking="dynamic")
  cfg = masking.MaskingConfig(vocab_size=ph.VOCAB, mask_id=4, cls_id=2, sep_id=3,
                              max_predictions_per_seq=ph.PRED)
  stream = input_pipeline.PretrainingData(pattern, global_batch_size=32, max_seq_length=ph.SEQ,
                                          max_predictions_per_seq=ph.PRED, sharding=None,
                                          masking_config=cfg, shuffle=False, seed=5)
  assert stream.masking_mode == "dynamic"
  it = stream.host_batches()
  epoch0 = [next(it) for _ in range(4)]
  epoch1 = [next(it) for _ in range(4)]
  assert epoch0[-1][1] == {"epoch": 0, "batch": 4} and epoch1[0][1] == {"epoch": 1, "batch": 1}
  for (a, _), (b, _) in zip(epoch0, epoch1):
    np.testing.assert_array_equal(a["segment_ids"], b["segment_ids"])   # same records
    assert not np.array_equal(a["masked_lm_positions"], b["masked_lm_positions"])  # new masks
  # Reproducible from the position: a fresh stream resumed at epoch 1 draws the same masks.
  again = next(stream.host_batches({"epoch": 1, "batch": 0}))[0]
  np.testing.assert_array_equal(again["masked_lm_positions"], epoch1[0][0]["masked_lm_positions"])
  # Statistics: min(max_pred, max(1, round(0.15·len))) predictions per row; 80/10/10.
  rows = [b for b, _ in epoch0 + epoch1]
  weights = np.concatenate([b["masked_lm_weights"] for b in rows])
  lengths = np.concatenate([b["input_mask"].sum(1) for b in rows])
  expected = np.minimum(ph.PRED, np.maximum(1, np.rint(lengths * 0.15)))
  np.testing.assert_array_equal(weights.sum(1), expected)
  masked = np.concatenate([np.take_along_axis(b["input_ids"], b["masked_lm_positions"], 1)
                           for b in rows])[weights > 0]
  labels = np.concatenate([b["masked_lm_ids"] for b in rows])[weights > 0]
  frac_mask = np.mean(masked == 4)
  frac_same = np.mean(masked == labels)
  assert 0.75 < frac_mask < 0.85 and 0.06 < frac_same < 0.16, (frac_mask, frac_same)


@pytest.mark.mesh
@pytest.mark.slow
@pytest.mark.parametrize("masking,packed_as_read", [("static", False), ("dynamic", False),
                                                     ("dynamic", True)])
def test_packed_rows_from_real_text_train_end_to_end(tmp_path, masking, packed_as_read):
  """data_prep --packing on Shakespeare → a run that picks the packed objective from the
  records (several instances per row, NSP per instance) and learns; or unpacked dynamic
  records packed as they are read (`data.packing`)."""
  from data_prep import create_pretraining_data as cpd
  from data_prep import demo_corpus, train_tokenizer
  corpus = tmp_path / "corpus.txt"
  demo_corpus.write_corpus(str(corpus), max_bytes=120_000)
  vocab = train_tokenizer.train_wordpiece([str(corpus)], str(tmp_path / "wp"), vocab_size=800)
  settings = cpd.make_settings(str(corpus), vocab, max_seq_length=64, max_predictions_per_seq=16,
                               masking=masking, dupe_factor=2, packing=not packed_as_read,
                               max_sequences_per_row=3, short_seq_prob=0.5)
  summary = cpd.create_pretraining_data(settings, output_dir=str(tmp_path / "data"),
                                        num_output_shards=3, num_workers=1, show_progress=False)
  # Half the instances are short (short_seq_prob=0.5): some rows hold several of them.
  if packed_as_read:
    assert summary["packing_efficiency"] < 0.93
  else:
    assert summary["packing_efficiency"] > 0.95 and summary["rows"] < summary["instances"]
  config = ph.run_config(str(tmp_path / "data" / "*.tfrecord"), train_until_step=60,
                         total_steps=60, eval_every_steps=60, checkpoint_every_steps=60,
                         log_every_steps=10, mesh_shape=(2, 2, 2),
                         **{"model.vocab_size": None, "model.hidden_dropout_prob": 0.0,
                            "data.max_seq_length": 64, "data.max_predictions_per_seq": 16,
                            "data.packing": packed_as_read,
                            "optimizer.learning_rate": 3e-3, "optimizer.warmup_steps": 5})
  workdir = str(tmp_path / "run")
  out = pretraining.train_and_evaluate(config, workdir)
  rows = [r for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
          if "train/mlm_loss" in r]
  # Packed rows, whoever packed them: little padding, and the useful tokens/s reported.
  padding = np.mean([r["perf/padding_fraction"] for r in rows])
  assert padding < (0.6 * (1 - summary["packing_efficiency"]) if packed_as_read else 0.06)
  assert all(0 < r["perf/useful_tokens_per_sec"] <= r["perf/tokens_per_sec"] for r in rows)
  # Sequences/s counts the sequences the rows hold, rows/s the rows.
  assert all(r["perf/sequences_per_sec"] > r["perf/rows_per_sec"] > 0 for r in rows)
  assert rows[-1]["train/mlm_loss"] < rows[0]["train/mlm_loss"] - 0.3
  assert out["eval/mlm_loss"] < np.log(summary["vocab_size"]) - 0.5  # below a uniform guess
  assert 0.0 < out["eval/nsp_accuracy"] <= 1.0 and 0.5 <= out["eval/nsp_majority_baseline"] < 1
  bert_config, params = checkpoints.load_pretraining_model(workdir)
  assert "cls" in params and bert_config.vocab_size == summary["vocab_size"]


@pytest.mark.mesh
@pytest.mark.slow
def test_real_text_dynamic_masking_end_to_end(tmp_path, capsys):
  """Shakespeare → WordPiece vocab → dynamic-masking TFRecords → pre-training → fill-mask →
  export.

  The vocabulary for drawing masks, and the model's vocabulary size, are found through
  data_prep's summary.json; the workdir keeps the vocabulary (and its hash), and an export
  carries it on and says which step it exported."""
  from bert_jax.text import tokenization
  from data_prep import create_pretraining_data as cpd
  from data_prep import demo_corpus, train_tokenizer
  corpus = tmp_path / "corpus.txt"
  demo_corpus.write_corpus(str(corpus), max_bytes=250_000)
  vocab = train_tokenizer.train_wordpiece([str(corpus)], str(tmp_path / "wp"), vocab_size=1200)
  settings = cpd.make_settings(str(corpus), vocab, max_seq_length=64, max_predictions_per_seq=10,
                               masking="dynamic")
  cpd.create_pretraining_data(settings, output_dir=str(tmp_path / "data"), num_output_shards=4,
                              num_workers=1, show_progress=False)
  tokenizer = tokenization.load_tokenizer(vocab_file=vocab)
  config = ph.run_config(str(tmp_path / "data" / "*.tfrecord"), train_until_step=60,
                         total_steps=60, eval_every_steps=60, checkpoint_every_steps=60,
                         log_every_steps=10, mesh_shape=(2, 2, 2), tensorboard=True,
                         **{"model.vocab_size": None,  # unset: read from summary.json
                            "model.hidden_dropout_prob": 0.0,
                            "data.max_seq_length": 64, "data.max_predictions_per_seq": 10,
                            "optimizer.learning_rate": 3e-3, "optimizer.warmup_steps": 5})
  workdir = str(tmp_path / "run")
  out = pretraining.train_and_evaluate(config, workdir)
  rows = [r for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
          if "train/mlm_loss" in r]
  assert rows[-1]["train/mlm_loss"] < rows[0]["train/mlm_loss"] - 0.5
  events = os.listdir(os.path.join(workdir, "tensorboard"))
  assert any(name.startswith("events.out.tfevents") for name in events)
  # Held-out masked-LM loss well below a uniform guess over the vocabulary.
  assert out["eval/mlm_loss"] < np.log(tokenizer.vocab_size) - 0.5
  bert_config, params = checkpoints.load_pretraining_model(workdir)
  preds = inference.fill_mask(bert_config, params, tokenizer, ["and so [MASK] the king ."],
                            top_k=3)
  assert len(preds[0]) == 1 and len(preds[0][0]) == 3
  assert all(0.0 <= p <= 1.0 for _, p in preds[0][0])
  assert bert_config.vocab_size == tokenizer.vocab_size
  kept = json.load(open(os.path.join(workdir, "vocab_record.json")))["files"]["vocab.txt"]
  assert open(os.path.join(workdir, "vocab.txt"), "rb").read() == open(vocab, "rb").read()
  assert kept["sha256"] == hashlib.sha256(open(vocab, "rb").read()).hexdigest()
  capsys.readouterr()
  exported = convert.convert(workdir, str(tmp_path / "hf"), "hf")
  said = capsys.readouterr().out
  assert f"{os.path.join(workdir, 'checkpoints')} step 60" in said, said
  assert f"copied the vocabulary: {os.path.join(exported, 'vocab.txt')}" in said, said
  assert json.load(open(os.path.join(exported, "vocab_record.json")))["files"]["vocab.txt"][
      "sha256"] == kept["sha256"]
  # A complete Hub directory: transformers' tokenizer reads the vocabulary as the run did, and
  # the model card tells the recipe, the data and the last evaluation.
  import transformers  # pylint: disable=g-import-not-at-top
  auto = transformers.AutoTokenizer.from_pretrained(exported)
  line = "And so, my LORD, the king's Ægean crown —"
  assert auto(line, add_special_tokens=False)["input_ids"] == tokenizer.encode(line)
  card = open(os.path.join(exported, "README.md"), encoding="utf-8").read()
  assert f"wrote the model card: {os.path.join(exported, 'README.md')}" in said
  assert "pipeline_tag: fill-mask" in card and "`BertForPreTraining`" in card
  for section in ("## Pre-training", "## Data", "## Evaluation", "## Use"):
    assert section in card, card
  assert "- 60 steps of 16 sequences of up to 64 tokens" in card, card
  assert "held-out records at step 60: " in card and "mlm_loss" in card, card
