"""The production pre-training step against Hugging Face's `FlaxBertForPreTraining`.

    make bench-env
    .venv-bench/bin/python benchmarks/pretrain_step.py --configs=tiny,base

Where `model_step.py` compares the two models inside one hand-written step, this times the step
`bert_jax.pretrain` actually runs: the train state created sharded on the mesh
(`training.state.create_train_state`), `training.step.build_train_step` with explicit
shardings, donated state and the paper's optimizer (`optimizer.create_optimizer`: clipping, AdamW without bias
correction, weight-decay mask, warmup + decay schedule). The peer runs the same optimizer
transformation on the same weights and batch. Reported per model: compile time, steps/s,
tokens/s, and XLA's FLOP count of the compiled step next to the analytic count of
`MaskedLmNextSentence.flops_per_step` (the count MFU is computed from), so the MFU a run prints
is checked against what the compiler says it executes.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app, flags
import jax
import ml_collections
import numpy as np
import optax

from benchmarks import model_step as ms  # the peer, the batches, machine description, recording
from bert_jax.model import configuration
from bert_jax.objectives import mlm_nsp
from bert_jax.parallel import sharding
from bert_jax.training import optimizer
from bert_jax.training import state as state_lib
from bert_jax.training import step as step_lib
# pylint: enable=g-import-not-at-top,wrong-import-position

_MESH = flags.DEFINE_list("mesh_shape", ["-1", "1", "1"], "(data, fsdp, model) for ours.")


def _paper_optimizer():
  cfg = ml_collections.ConfigDict({"name": "adamw", "learning_rate": 1e-4, "total_steps": 1000,
                                   "warmup_steps": 10, "weight_decay": 0.01, "eps": 1e-6,
                                   "bias_correction": False, "grad_clip_norm": 1.0})
  return optimizer.create_optimizer(cfg)


def _time_compile(fn, *args):
  start = time.perf_counter()
  compiled = fn.lower(*args).compile()
  return compiled, time.perf_counter() - start


class Side:
  """One contender's compiled train step and live training state, stepped in turns.

  `run()` does one step, waits for it, and returns (seconds, loss); `useful_tokens.py` reuses
  this (and `build_ours` / `build_peer`) for more than two contenders.
  """

  def __init__(self, label, compiled, compile_s, state, step_fn):
    self.label, self.compiled, self.compile_s = label, compiled, compile_s
    self.state, self._step_fn = state, step_fn
    self.times: list[float] = []
    self.losses: list[float] = []

  def run(self, timed: bool) -> None:
    start = time.perf_counter()
    self.state, loss = self._step_fn(self.compiled, self.state)
    elapsed = time.perf_counter() - start
    self.losses.append(loss)
    if timed:
      self.times.append(elapsed)


def build_ours(label, objective, config, np_batch, tx, schedule, mesh, rules, seed,
               params=None) -> Side:
  """Exactly what bert_jax.pretrain builds: sharded state, donated, `build_train_step`.
  `params` (host arrays of this model's layout) replace the freshly initialised weights."""
  model = objective.model(config)
  state, state_sh = state_lib.create_train_state(model, tx, mesh, rules, seed, np_batch,
                                                 objective.input_names)
  if params is not None:
    state = state.replace(params=jax.device_put(params, state_sh.params))
  batch_sh = sharding.batch_sharding(mesh)
  batch = jax.device_put(np_batch, batch_sh)
  step = step_lib.build_train_step(objective, model, tx, schedule, state_sh, batch_sh, mesh,
                                   rules)
  compiled, compile_s = _time_compile(step, state, batch)

  def step_fn(compiled, state):
    state, metrics = compiled(state, batch)
    jax.block_until_ready(state.params)
    return state, float(metrics["loss"])
  side = Side(label, compiled, compile_s, state, step_fn)
  side.model, side.batch, side.objective = model, batch, objective
  side.mesh, side.rules = mesh, rules
  return side


def eval_loss(side: Side, params=None) -> float:
  """Our model's loss without dropout on the side's batch (the parity checks)."""
  objective, model = side.objective, side.model
  fn = step_lib.with_mesh(jax.jit(lambda p, b: objective.loss(
      step_lib.apply_model(objective, model, p, b, deterministic=True), b,
      objective.denominators(b))[0]), side.mesh, side.rules)
  return float(fn(side.state.params if params is None else params, side.batch))


def build_peer(label, config, params, np_batch, tx, seed) -> Side:
  """FlaxBertForPreTraining holding `params` (ours, unrolled layout), the same optimizer."""
  peer_params, peer_loss, _ = ms.build_peer(config, params, np_batch["input_ids"].shape[1])
  peer_batch = jax.device_put(np_batch)

  def peer_step(params, opt_state, b, rng):
    rng, dropout_rng = jax.random.split(rng)
    (loss, _), grads = jax.value_and_grad(peer_loss, has_aux=True)(params, b, dropout_rng, False)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, rng
  peer_state = (peer_params, tx.init(peer_params), jax.random.PRNGKey(seed))
  peer_jit = jax.jit(peer_step, donate_argnums=(0, 1))
  compiled, compile_s = _time_compile(peer_jit, peer_state[0], peer_state[1], peer_batch,
                                      peer_state[2])

  def step_fn(compiled, state):
    p, o, loss, r = compiled(state[0], state[1], peer_batch, state[2])
    jax.block_until_ready(p)
    return (p, o, r), float(loss)
  side = Side(label, compiled, compile_s, peer_state, step_fn)
  side.batch = peer_batch
  side.eval_loss = lambda: float(jax.jit(lambda p, b: peer_loss(
      p, b, jax.random.PRNGKey(0), True)[0])(side.state[0], peer_batch))
  return side


def alternate(sides, warmup: int, steps: int) -> None:
  """Steps every side in turns, the order reversed every round, so that load which comes and
  goes slows all alike; the first `warmup` rounds are not timed."""
  for i in range(warmup + steps):
    for side in (sides if i % 2 == 0 else sides[::-1]):
      side.run(timed=i >= warmup)


def benchmark(name: str, seed: int, mesh_shape) -> dict:
  shape = ms.SHAPES.get(name, ms.DEFAULT_SHAPE)
  steps = ms._STEPS.value or shape["steps"]  # pylint: disable=protected-access
  warmup = ms._WARMUP.value or shape["warmup"]  # pylint: disable=protected-access
  config = configuration.get_preset(name)
  np_batch = ms.make_batch(np.random.RandomState(seed), shape["batch"], shape["length"],
                           shape["predictions"], config.vocab_size)
  np_batch["next_sentence_labels"] = np_batch["next_sentence_labels"].reshape(-1, 1)
  tx, schedule = _paper_optimizer()
  mesh = sharding.create_mesh(mesh_shape)
  objective = mlm_nsp.MaskedLmNextSentence(shape["length"], shape["predictions"])
  ours = build_ours("ours", objective, config, np_batch, tx, schedule, mesh,
                    sharding.DEFAULT_LOGICAL_AXIS_RULES, seed)
  peer = build_peer("peer", config, jax.device_get(ours.state.params), np_batch, tx, seed)
  alternate([ours, peer], warmup, steps)
  flops_ours, _ = ms._xla_costs(ours.compiled)  # pylint: disable=protected-access
  flops_peer, _ = ms._xla_costs(peer.compiled)  # pylint: disable=protected-access
  analytic = objective.flops_per_step(config, shape["batch"])
  return dict(name=name, shape=shape, steps=steps, warmup=warmup,
              times={"ours": ours.times, "peer": peer.times},
              losses={"ours": ours.losses, "peer": peer.losses},
              compile_s={"ours": ours.compile_s, "peer": peer.compile_s},
              flops={"ours": (flops_ours or 0) * jax.device_count(), "peer": flops_peer},
              analytic=analytic, mesh=dict(mesh.shape))


def report(results) -> str:
  import datetime  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  lines = [f"## Production pre-training step (training core) vs Hugging Face FlaxBertForPreTraining "
           f"({datetime.date.today().isoformat()})", "",
           f"- Command: `.venv-bench/bin/python benchmarks/pretrain_step.py "
           f"--configs={','.join(r['name'] for r in results)}`",
           f"- Machine: {ms.machine_description()}; load average {os.getloadavg()[0]:.2f} at "
           "the end",
           f"- Versions: jax {jax.__version__}, transformers {transformers.__version__}",
           "- Step: ours = `training.step.build_train_step` on the mesh shown (sharded state, "
           "donated, "
           "the paper's AdamW without bias correction, clipping, schedule); peer = "
           "FlaxBertForPreTraining + the same optax transformation; same weights and batch, "
           "dropout on, float32; steps alternate between the two.", "",
           "| config | batch × seq (masked) | model | compile (s) | median step (s) | steps/s "
           "| tokens/s | XLA GFLOP/step | analytic GFLOP/step | HF / ours |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in results:
    s = r["shape"]
    med = {k: statistics.median(v) for k, v in r["times"].items()}
    for who, label in (("ours", f"bert_jax (mesh {r['mesh']})"),
                       ("peer", "HF FlaxBertForPreTraining")):
      ratio = f"**{med['peer'] / med['ours']:.2f}×**" if who == "peer" else ""
      lines.append(
          f"| {r['name']} | {s['batch']} × {s['length']} ({s['predictions']}) | {label} | "
          f"{r['compile_s'][who]:.1f} | {med[who]:.3f} | {1 / med[who]:.2f} | "
          f"{s['batch'] * s['length'] / med[who]:,.0f} | {r['flops'][who] / 1e9:,.0f} | "
          f"{r['analytic'] / 1e9:,.0f} | {ratio} |")
  lines += ["", "Analytic GFLOP/step is the matmul count of the step bert_jax does (MLM decoder at "
            "the masked positions only); XLA's count for ours should sit a few percent above it "
            "(elementwise work), the peer's above that by the full-vocabulary decoder.", ""]
  return "\n".join(lines)


def main(argv):
  del argv
  mesh_shape = [int(x) for x in _MESH.value]
  results = [benchmark(name, ms._SEED.value, mesh_shape)  # pylint: disable=protected-access
             for name in ms._CONFIGS.value]  # pylint: disable=protected-access
  section = report(results)
  print("\n" + section)
  if ms._RECORD.value:  # pylint: disable=protected-access
    ms.append_results(ms._RESULTS_FILE.value, section)  # pylint: disable=protected-access


if __name__ == "__main__":
  app.run(main)
