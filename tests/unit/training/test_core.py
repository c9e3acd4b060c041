"""The training core is open: an objective defined here, in the test, trains through the public
interface (`Objective`, the step builder, the loop, the init order) with no change to them."""

import dataclasses
import os
import re
import signal

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax.data import arrays
from bert_jax.model import configuration, modeling
from bert_jax.parallel import sharding
from bert_jax.training import checkpointing, init_order, loop, metrics, optimizer
from bert_jax.training import step as step_lib
from bert_jax.training.objective import Objective

SEQ = 16


class PooledRegressor(nn.Module):
  """The encoder and one output on the pooled [CLS] vector."""
  config: configuration.BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, deterministic=True):
    out = modeling.BertModel(self.config, name="bert")(input_ids, input_mask, segment_ids,
                                                        deterministic=deterministic)
    return nn.Dense(1, name="regressor")(out["pooled_output"])[:, 0]


@dataclasses.dataclass(frozen=True)
class CountRegression(Objective):
  """Regress the share of the sequence's tokens that are odd ids: a toy target that only the
  tokens determine, so the model can learn it."""
  name: str = "count_regression"

  def model(self, bert_config):
    return PooledRegressor(bert_config)

  @property
  def input_names(self):
    return ("input_ids", "input_mask", "segment_ids")

  def batch_spec(self, batch_size):
    tokens = jax.ShapeDtypeStruct((batch_size, SEQ), np.int32)
    return {"input_ids": tokens, "input_mask": tokens, "segment_ids": tokens,
            "target": jax.ShapeDtypeStruct((batch_size,), np.float32),
            "weight": jax.ShapeDtypeStruct((batch_size,), np.float32)}

  def loss(self, outputs, batch, denominators):
    error = jnp.square(outputs - batch["target"]) * batch["weight"]
    sums = {"squared_error_sum": jnp.sum(error), "count": jnp.sum(batch["weight"])}
    return sums["squared_error_sum"] / denominators["examples"], sums

  def summarize(self, sums):
    return {"mse": float(sums["squared_error_sum"]) / max(float(sums["count"]), 1.0)}


def _data(n, rng):
  ids = rng.integers(5, 60, size=(n, SEQ)).astype(np.int32)
  return {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids),
          "target": (ids % 2).mean(axis=1).astype(np.float32) * 4.0,
          "weight": np.ones(n, np.float32)}


@pytest.mark.mesh
@pytest.mark.slow
def test_an_objective_defined_outside_the_package_trains_through_the_core(tmp_path):
  objective = CountRegression()
  bert_config = configuration.get_preset("test", vocab_size=64, max_position_embeddings=SEQ,
                                         hidden_dropout_prob=0.0)
  model = objective.model(bert_config)
  mesh = sharding.create_mesh((8, 1, 1))
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  tx, schedule = optimizer.create_optimizer(ml_collections.ConfigDict({
      "name": "adamw", "learning_rate": 3e-3, "total_steps": 120, "warmup_steps": 10,
      "weight_decay": 0.0, "eps": 1e-6, "bias_correction": True, "grad_clip_norm": 1.0}))
  workdir = str(tmp_path / "run")
  ckpt = checkpointing.run_checkpoints(workdir, async_save=False)
  init = init_order.initial_state(objective, model, tx, mesh, rules, batch_size=16, seed=0,
                                  checkpoints=ckpt)
  assert init.origin == "initialised from scratch"
  batch_sh = sharding.batch_sharding(mesh)
  train_step = step_lib.build_train_step(objective, model, tx, schedule, init.shardings,
                                         batch_sh, mesh, rules, grad_accum_steps=2)
  feats = _data(390, np.random.default_rng(0))  # 390 rows: the last batch of an epoch is padded
  held_out = _data(64, np.random.default_rng(1))
  eval_step = step_lib.jit_eval_step(step_lib.make_eval_step(objective, model),
                                     init.shardings.params, batch_sh, mesh, rules)

  def evaluate(state):
    sums = eval_step(state.params, arrays.to_global(held_out, batch_sh))
    return {f"eval/{k}": v for k, v in objective.summarize(jax.device_get(sums)).items()}

  writer = metrics.MetricWriter(workdir, tensorboard=False)
  before = evaluate(init.state)["eval/mse"]
  result = loop.train(
      init.state, train_step,
      arrays.training_batches(feats, 16, batch_sh, seed=0, trim=False, position=init.position),
      objective=objective, writer=writer, checkpoints=ckpt, metadata={"toy": True},
      evaluate=evaluate,
      config=loop.LoopConfig(until_step=120, examples_per_step=16, tokens_per_example=SEQ,
                             log_every_steps=20, checkpoint_every_steps=60,
                             eval_every_steps=60))
  writer.close()
  ckpt.close()
  assert result.step == 120 and not result.stopped_early
  # Learned: held-out error far below the untrained model's and the constant-mean guess.
  variance = float(np.var(held_out["target"]))
  assert result.scalars["eval/mse"] < 0.5 * variance < before, (result.scalars, variance, before)
  rows = metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  assert [r["step"] for r in rows if "train/mse" in r] == [20, 40, 60, 80, 100, 120]
  assert [r["step"] for r in rows if "eval/mse" in r] == [60, 120]
  # Saved with the data position, and the init order resumes it.
  again = checkpointing.run_checkpoints(workdir, async_save=False)
  assert again.all_steps() == [60, 120]
  resumed = init_order.initial_state(objective, model, tx, mesh, rules, batch_size=16, seed=0,
                                     checkpoints=again)
  again.close()
  assert int(resumed.state.step) == 120 and resumed.position == {"epoch": 4, "batch": 20}


@pytest.mark.mesh
def test_in_memory_batches_resume_exactly_and_count_every_row():
  """The fine-tuning stream: a position taken from it restarts it exactly, every row is seen
  once per epoch, and the padding rows of a partial batch carry weight 0."""
  mesh = sharding.create_mesh((8, 1, 1))
  batch_sh = sharding.batch_sharding(mesh)
  feats = {"input_ids": np.arange(21 * SEQ, dtype=np.int32).reshape(21, SEQ),
           "input_mask": np.ones((21, SEQ), np.int32), "weight": np.ones(21, np.float32)}
  stream = arrays.training_batches(feats, 8, batch_sh, seed=[3, 0], trim=False)
  first = [next(stream) for _ in range(7)]  # 3 batches an epoch: 8, 8, 5 rows + 3 padding
  epoch0 = np.concatenate([np.asarray(b["input_ids"])[np.asarray(b["weight"]) > 0, 0]
                           for b, _ in first[:3]])
  assert sorted(epoch0 // SEQ) == list(range(21))
  assert float(np.asarray(first[2][0]["weight"]).sum()) == 5.0
  assert [p for _, p in first[:4]] == [{"epoch": 0, "batch": 1}, {"epoch": 0, "batch": 2},
                                       {"epoch": 0, "batch": 3}, {"epoch": 1, "batch": 1}]
  resumed = arrays.training_batches(feats, 8, batch_sh, seed=[3, 0], trim=False,
                                    position=first[3][1])
  for (expected, _), (got, _) in zip(first[4:], [next(resumed) for _ in range(3)]):
    np.testing.assert_array_equal(np.asarray(got["input_ids"]), np.asarray(expected["input_ids"]))


def _count_regression_step(mesh_shape, total_steps: int, batch_size: int, checkpoints=None):
  """The outside objective's model, initial state (resumed from `checkpoints` where they hold a
  step) and jitted train step on a mesh."""
  objective = CountRegression()
  bert_config = configuration.get_preset("test", vocab_size=64, max_position_embeddings=SEQ)
  model = objective.model(bert_config)
  devices = jax.devices()[:int(np.prod(mesh_shape))]
  mesh = sharding.create_mesh(mesh_shape, devices)
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  tx, schedule = optimizer.create_optimizer(ml_collections.ConfigDict({
      "name": "adamw", "learning_rate": 1e-3, "total_steps": total_steps, "warmup_steps": 0}))
  init = init_order.initial_state(objective, model, tx, mesh, rules, batch_size=batch_size,
                                  seed=0, checkpoints=checkpoints)
  batch_sh = sharding.batch_sharding(mesh)
  return objective, init, step_lib.build_train_step(objective, model, tx, schedule,
                                                    init.shardings, batch_sh, mesh, rules), batch_sh


def test_a_progress_line_comes_at_least_every_heartbeat(capsys):
  """Steps slower than the log interval: a line with the step, rate and ETA whenever
  `heartbeat_seconds` pass without one (no metrics row, no device sync), so a long run is never
  silent for minutes; the logged lines come as before."""
  objective, init, jitted, batch_sh = _count_regression_step((1, 1, 1), 12, 8)
  now = [0.0]  # the loop's clock: each step takes 0.12 s of it, whatever the machine

  def slow_step(state, batch):
    now[0] += 0.12
    return jitted(state, batch)

  rows = []

  class Rows(metrics.MetricWriter):
    def write(self, step, scalars):
      rows.append(step)

  loop.train(init.state, slow_step,
             arrays.training_batches(_data(96, np.random.default_rng(0)), 8, batch_sh, seed=0,
                                     trim=False),
             objective=objective, writer=Rows(None, tensorboard=False),
             config=loop.LoopConfig(until_step=12, examples_per_step=8, tokens_per_example=SEQ,
                                    log_every_steps=6, heartbeat_seconds=0.2),
             clock=lambda: now[0])
  out = capsys.readouterr().out
  beats = re.findall(r"^step +(\d+)/12 \| steps/s [\d.]+ \| eta \S+$", out, re.M)
  logged = re.findall(r"^step +(\d+)/12 \| loss ", out, re.M)
  assert logged == ["6", "12"] and rows == [6, 12], out
  # Steps take 0.12 s, so no two lines are more than 2 steps apart: a beat in every stretch of
  # 2 steps between the logged lines (4 of them at least).
  assert len(beats) >= 3 and all(int(b) % 6 for b in beats), out


def test_model_selection_keeps_the_best_stops_without_improvement_and_resumes_exactly(
    tmp_path, capsys):
  """Evaluations every 2 steps with scripted scores: the best step is handed on as it is found,
  training ends after `patience` evaluations without improvement (a complete run, not a stop),
  and the selection is saved with each checkpoint, so a run interrupted half-way stops where an
  uninterrupted one stops, and one that had stopped does not train again."""
  scores = {2: 0.5, 4: 0.7, 6: 0.6, 8: 0.7, 10: 0.69, 12: 0.9, 14: 0.95}
  data = _data(96, np.random.default_rng(0))

  def run(workdir, until, selection, stop_at=None):
    ckpt = checkpointing.run_checkpoints(str(workdir), async_save=False)
    objective, init, jitted, batch_sh = _count_regression_step((1, 1, 1), 20, 8, ckpt)
    trained = []

    def train_step(state, batch):
      trained.append(int(state.step) + 1)
      if trained[-1] == stop_at:  # as a scheduler's SIGTERM would: save after this step, stop
        os.kill(os.getpid(), signal.SIGTERM)
      return jitted(state, batch)

    result = loop.train(
        init.state, train_step,
        arrays.training_batches(data, 8, batch_sh, seed=0, trim=False, position=init.position),
        objective=objective, writer=metrics.MetricWriter(None, tensorboard=False),
        checkpoints=ckpt, evaluate=lambda state: {"eval/accuracy": scores[int(state.step)]},
        selection=selection.restored(init.metadata),
        config=loop.LoopConfig(until_step=until, examples_per_step=8, tokens_per_example=SEQ,
                               log_every_steps=2, eval_every_steps=2,
                               checkpoint_every_steps=6))
    ckpt.close()
    return result, trained

  kept = []
  whole, trained = run(tmp_path / "whole", 20, loop.selection_lib.Selection(
      "eval/accuracy", patience=3, on_best=lambda step, state, s: kept.append(step)))
  # Best 0.7 at step 4; 6, 8 (0.7 is not better) and 10 bring nothing: stopped at 10.
  assert (whole.step, whole.out_of_patience, whole.stopped_early) == (10, True, False)
  assert trained == list(range(1, 11)) and kept == [2, 4]
  assert "Early stopping at step 10 of 20: no better eval/accuracy in the last 3 " \
         "evaluations (best accuracy 0.7000 at step 4)" in capsys.readouterr().out
  saved = checkpointing.run_checkpoints(str(tmp_path / "whole"), async_save=False)
  assert saved.all_steps() == [6, 10]
  assert saved.restore_metadata(10)["selection"] == {
      "metric": "eval/accuracy", "best_step": 4, "best_value": 0.7,
      "evaluations_since_best": 3, "last_step": 10}
  saved.close()

  # Run again: no step trained, the same end.
  again, trained = run(tmp_path / "whole", 20, loop.selection_lib.Selection(
      "eval/accuracy", patience=3))
  assert (again.step, again.out_of_patience, trained) == (10, True, [])

  # Stopped after step 7 (best 4, one evaluation since), then resumed.
  kept = []
  selection = lambda: loop.selection_lib.Selection(
      "eval/accuracy", patience=3, on_best=lambda step, state, s: kept.append(step))
  first, _ = run(tmp_path / "split", 20, selection(), stop_at=7)
  assert (first.step, first.stopped_early, first.out_of_patience) == (7, True, False)
  resumed, trained = run(tmp_path / "split", 20, selection())
  assert trained == [8, 9, 10] and kept == [2, 4]
  assert (resumed.step, resumed.out_of_patience) == (10, True)


@pytest.mark.mesh
@pytest.mark.slow
def test_the_loop_keeps_at_most_two_steps_in_flight():
  """JAX dispatches a step before the device has run the previous ones. The loop waits so that
  no more than `MAX_STEPS_IN_FLIGHT` are queued: XLA:CPU's per-device launch queue, filled by a
  loop that only fetched at log time, hung runs on meshes of several CPU devices (launches
  blocked on full queues took every thread the previous step's all-reduce needed)."""
  objective, init, jitted, batch_sh = _count_regression_step((8, 1, 1), 40, 64)
  dispatched, unfinished = [], []

  def train_step(state, batch):
    unfinished.append(sum(not m["loss"].is_ready() for m in dispatched))
    out = jitted(state, batch)
    dispatched.append(out[1])
    return out

  result = loop.train(
      init.state, train_step,
      arrays.training_batches(_data(640, np.random.default_rng(0)), 64, batch_sh, seed=0,
                              trim=False),
      objective=objective, writer=metrics.MetricWriter(None, tensorboard=False),
      config=loop.LoopConfig(until_step=40, examples_per_step=64, tokens_per_example=SEQ,
                             log_every_steps=40))
  assert result.step == 40
  # Before each dispatch at most MAX_STEPS_IN_FLIGHT earlier steps are unfinished.
  assert max(unfinished) <= loop.MAX_STEPS_IN_FLIGHT, unfinished
