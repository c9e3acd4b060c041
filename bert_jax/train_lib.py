"""Train state created already sharded, and the jitted pre-training train / eval steps.

The state is born on the mesh: `jax.eval_shape` traces its structure, the model's logical axis
names become shardings (optimizer moments follow their parameters), and a jitted init writes
every shard on its own device. The train step is one `jax.jit` with explicit in/out shardings
and the state donated, so parameters are updated in place.

Gradient accumulation splits the global batch into `k` micro-batches inside the step and sums
their gradients. The loss of every micro-batch is normalised by the *whole* batch's MLM weight
and example counts, so k micro-batches give exactly the gradient of one k-times-larger batch
(the original's `sum(w·loss)/(sum(w)+1e-5)` is not a mean of per-micro-batch means).
"""

from __future__ import annotations

import functools
import glob
import os
from typing import Any, Callable, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax import heads, sharding
from bert_jax.configuration import BertConfig


@flax.struct.dataclass
class TrainState:
  """Everything a resumed run needs besides the data position (kept by checkpointing)."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # base dropout key; step s uses fold_in(rng, s)


def example_batch(batch_size: int, seq_length: int, max_predictions: int) -> dict[str, Any]:
  """Zeros in the pre-training batch layout (shapes only matter: used to trace init)."""
  import numpy as np
  i32 = lambda *s: np.zeros(s, np.int32)
  return {"input_ids": i32(batch_size, seq_length), "input_mask": i32(batch_size, seq_length),
          "segment_ids": i32(batch_size, seq_length),
          "masked_lm_positions": i32(batch_size, max_predictions),
          "masked_lm_ids": i32(batch_size, max_predictions),
          "masked_lm_weights": np.zeros((batch_size, max_predictions), np.float32),
          "next_sentence_labels": i32(batch_size, 1)}


# The batch features a model's __call__ takes, in order.
PRETRAINING_INPUTS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")
CLASSIFICATION_INPUTS = ("input_ids", "input_mask", "segment_ids")


def _init_params_fn(model: nn.Module, batch: dict[str, Any], input_keys: Sequence[str]):
  def init_params(rng):
    return model.init(rng, *(batch[k] for k in input_keys))["params"]
  return init_params


def abstract_train_state(model: nn.Module, tx: optax.GradientTransformation, mesh: Mesh,
                         rules, batch: dict[str, Any],
                         input_keys: Sequence[str] = PRETRAINING_INPUTS
                         ) -> tuple[TrainState, TrainState]:
  """`(abstract_state, state_shardings)`: shapes, dtypes and shardings, nothing allocated.

  Parameters take the shardings of their logical names; optimizer moments those of their
  parameters; counters and the RNG are replicated. The abstract state (ShapeDtypeStructs with
  shardings) is also the restore target for checkpoints.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(_init_params_fn(model, batch, input_keys), jax.random.PRNGKey(0))
    param_sh = sharding.param_shardings(boxed, mesh, rules)
    abstract_params = jax.tree.map(lambda x: x.value if isinstance(x, nn.Partitioned) else x,
                                   boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
  replicated = NamedSharding(mesh, PartitionSpec())
  opt_sh = optax.tree_map_params(tx, lambda _, s: s, abstract_opt, param_sh,
                                 transform_non_params=lambda _: replicated)
  state_sh = TrainState(step=replicated, params=param_sh, opt_state=opt_sh, rng=replicated)
  abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params,
                        opt_state=abstract_opt,
                        rng=jax.eval_shape(lambda: jax.random.PRNGKey(0)))
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, state_sh)
  return abstract, state_sh


def create_train_state(model: nn.Module, tx: optax.GradientTransformation, mesh: Mesh,
                       rules, seed: int, batch: dict[str, Any],
                       input_keys: Sequence[str] = PRETRAINING_INPUTS
                       ) -> tuple[TrainState, TrainState]:
  """`(state, state_shardings)` with every array created directly in its shards.

  Parameters come from `PRNGKey(seed)` split once (parameters, dropout), so a model's initial
  weights depend only on the seed, never on the mesh.
  """
  _, state_sh = abstract_train_state(model, tx, mesh, rules, batch, input_keys)
  init_params = _init_params_fn(model, batch, input_keys)

  def init_state(seed_array):
    param_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed_array))
    params = nn.unbox(init_params(param_rng))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params), rng=dropout_rng)

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state = jax.jit(init_state, out_shardings=state_sh)(jnp.asarray(seed, jnp.uint32))
  return state, state_sh


# ----------------------------------------------------------------------------------- steps
def _loss_sums(model, params, batch, rng, deterministic, mlm_denominator, nsp_denominator):
  mlm_logits, nsp_logits = model.apply(
      {"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
      batch["masked_lm_positions"], deterministic=deterministic, rngs={"dropout": rng})
  mlm = heads.masked_lm_loss(mlm_logits, batch["masked_lm_ids"], batch["masked_lm_weights"])
  nsp = heads.next_sentence_loss(nsp_logits, batch["next_sentence_labels"])
  loss = mlm["loss_sum"] / mlm_denominator + nsp["loss_sum"] / nsp_denominator
  sums = {"mlm_loss_sum": mlm["loss_sum"], "mlm_correct_sum": mlm["correct_sum"],
          "mlm_weight_sum": mlm["weight_sum"], "nsp_loss_sum": nsp["loss_sum"],
          "nsp_correct_sum": nsp["correct_sum"], "nsp_count": nsp["weight_sum"]}
  return loss, sums


def _split_micro_batches(batch: dict[str, jax.Array], k: int) -> dict[str, jax.Array]:
  """(B, ...) → (k, B/k, ...), micro-batch i = rows i, i+k, i+2k, ... so that every device
  keeps contributing rows of its own shard to every micro-batch (no resharding)."""
  def split(x):
    b = x.shape[0]
    if b % k:
      raise ValueError(f"Batch size {b} is not divisible by grad_accum_steps={k}.")
    return jnp.swapaxes(x.reshape((b // k, k) + x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def train_step(state: TrainState, batch: dict[str, jax.Array], *, model: nn.Module,
               tx: optax.GradientTransformation, schedule: Callable, grad_accum_steps: int = 1
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on the global batch; returns the new state and metric sums."""
  dropout_rng = jax.random.fold_in(state.rng, state.step)
  # Normalisers of the whole batch, as the original's loss over one batch.
  mlm_den = jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)) + 1e-5
  nsp_den = jnp.asarray(batch["next_sentence_labels"].shape[0], jnp.float32)
  grad_fn = jax.grad(
      lambda p, b, r: _loss_sums(model, p, b, r, False, mlm_den, nsp_den), has_aux=True)

  if grad_accum_steps == 1:
    grads, sums = grad_fn(state.params, batch, dropout_rng)
  else:
    micro = _split_micro_batches(batch, grad_accum_steps)

    def body(carry, inputs):
      acc_grads, acc_sums = carry
      index, micro_batch = inputs
      g, s = grad_fn(state.params, micro_batch, jax.random.fold_in(dropout_rng, index))
      return (jax.tree.map(jnp.add, acc_grads, g), jax.tree.map(jnp.add, acc_sums, s)), None

    zeros_g = jax.tree.map(jnp.zeros_like, state.params)
    zeros_s = {k: jnp.zeros((), jnp.float32) for k in
               ("mlm_loss_sum", "mlm_correct_sum", "mlm_weight_sum", "nsp_loss_sum",
                "nsp_correct_sum", "nsp_count")}
    (grads, sums), _ = jax.lax.scan(body, (zeros_g, zeros_s),
                                    (jnp.arange(grad_accum_steps), micro))

  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(sums)
  metrics["loss"] = sums["mlm_loss_sum"] / mlm_den + sums["nsp_loss_sum"] / nsp_den
  metrics["grad_norm"] = optax.tree.norm(grads)
  metrics["learning_rate"] = schedule(state.step)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return new_state, metrics


def eval_step(params: Any, batch: dict[str, jax.Array], *, model: nn.Module
              ) -> dict[str, jax.Array]:
  """Metric sums of the deterministic model on one batch."""
  mlm_den = jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)) + 1e-5
  nsp_den = jnp.asarray(batch["next_sentence_labels"].shape[0], jnp.float32)
  _, sums = _loss_sums(model, params, batch, jax.random.PRNGKey(0), True, mlm_den, nsp_den)
  return sums


def jit_train_step(model, tx, schedule, state_shardings, batch_sharding, mesh, rules,
                   grad_accum_steps: int = 1):
  """The train step, jitted with explicit shardings and the state donated."""
  step = functools.partial(train_step, model=model, tx=tx, schedule=schedule,
                           grad_accum_steps=grad_accum_steps)
  jitted = jax.jit(step, in_shardings=(state_shardings, batch_sharding),
                   out_shardings=(state_shardings, None), donate_argnums=(0,))
  return with_mesh(jitted, mesh, rules)


def jit_eval_step(model, param_shardings, batch_sharding, mesh, rules):
  step = functools.partial(eval_step, model=model)
  jitted = jax.jit(step, in_shardings=(param_shardings, batch_sharding), out_shardings=None)
  return with_mesh(jitted, mesh, rules)


def with_mesh(fn, mesh, rules):
  """Traces (and runs) `fn` with the mesh and logical rules in scope, so the model's
  activation constraints resolve to this mesh."""
  @functools.wraps(fn)
  def wrapped(*args):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return fn(*args)
  wrapped.lower = lambda *args: _lower(fn, mesh, rules, *args)
  return wrapped


def _lower(fn, mesh, rules, *args):
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return fn.lower(*args)


def summarize(sums: dict[str, Any]) -> dict[str, float]:
  """Metric sums (possibly added over many steps) → the reported averages."""
  out = {}
  if "mlm_weight_sum" in sums:
    w = max(float(sums["mlm_weight_sum"]), 1e-5)
    out["mlm_loss"] = float(sums["mlm_loss_sum"]) / w
    out["mlm_accuracy"] = float(sums["mlm_correct_sum"]) / w
  if "nsp_count" in sums:
    n = max(float(sums["nsp_count"]), 1.0)
    out["nsp_loss"] = float(sums["nsp_loss_sum"]) / n
    out["nsp_accuracy"] = float(sums["nsp_correct_sum"]) / n
  if "mlm_loss" in out and "nsp_loss" in out:
    out["loss"] = out["mlm_loss"] + out["nsp_loss"]
  return out


# --------------------------------------------------------------------------------- FLOPs
def pretraining_flops_per_step(config: BertConfig, batch_size: int, seq_length: int,
                               max_predictions: int) -> float:
  """Analytic matmul FLOPs of one training step (forward + backward = 3 × forward).

  Per layer and token: QKV + output projections 8H², FFN 4HI (2 FLOPs per MAC), attention
  scores and context 4SH. Heads: pooler 2H², MLM transform 2H² and decoder 2HV at the masked
  positions only, NSP 4H. Embedding lookups and elementwise work are not counted, as in the
  usual MFU convention.
  """
  h, i, layers, v = (config.hidden_size, config.intermediate_size, config.num_hidden_layers,
                     config.vocab_size)
  tokens = batch_size * seq_length
  per_token_layer = 8 * h * h + 4 * h * i + 4 * seq_length * h
  forward = tokens * layers * per_token_layer
  forward += batch_size * (2 * h * h + 4 * h)                 # pooler + NSP
  forward += batch_size * max_predictions * (2 * h * h + 2 * h * v)  # MLM head
  return 3.0 * forward


# Peak dense bf16 matmul FLOP/s per chip, for MFU. Unknown devices (CPUs) report no MFU.
PEAK_FLOPS = {
    "TPU v2": 45e12, "TPU v3": 123e12, "TPU v4": 275e12, "TPU v5 lite": 197e12,
    "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v5": 459e12, "TPU v6 lite": 918e12,
    "TPU v6e": 918e12, "NVIDIA H100": 989e12, "NVIDIA H200": 989e12, "NVIDIA A100": 312e12,
}


def peak_flops_per_device(device: jax.Device) -> float | None:
  kind = getattr(device, "device_kind", "")
  for name in sorted(PEAK_FLOPS, key=len, reverse=True):
    if kind.startswith(name):
      return PEAK_FLOPS[name]
  return None


# ------------------------------------------------------------------------------ multi-process
def _on_tpu_vm() -> bool:
  """TPU chips attached to this machine (the device nodes the TPU runtime itself looks for)."""
  return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


def define_distributed_flags() -> None:
  """The flags of a multi-process run outside Cloud TPU, for the entry points' `define_flags`."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string("coordinator_address", None,
                      "host:port of process 0 for multi-process runs outside Cloud TPU (TPU VM "
                      "slices are found by themselves).")
  flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.")
  flags.DEFINE_integer("process_id", None, "This process's index (0-based).")


def initialize_distributed_from_flags() -> None:
  from absl import flags  # pylint: disable=g-import-not-at-top
  f = flags.FLAGS
  initialize_distributed(f.coordinator_address, f.num_processes, f.process_id)


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None,
                           process_id: int | None = None) -> None:
  """Joins a multi-process run before JAX starts its backends.

  Given a coordinator, with those arguments (GPU clusters, local test runs). On Cloud TPU VMs
  `jax.distributed.initialize()` reads the slice from the TPU metadata (one worker or many),
  and the coordination service it starts is what Orbax's multi-host checkpoints and the
  preemption notice rely on; on GKE the worker list comes from `TPU_WORKER_HOSTNAMES`.
  Elsewhere (a CPU or a single GPU machine) there is nothing to join.
  """
  if coordinator_address:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
    return
  hostnames = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
  if len(hostnames) > 1 or _on_tpu_vm():
    jax.distributed.initialize()

