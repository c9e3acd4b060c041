"""The one step builder: the jitted train and eval steps of every objective and task.

`make_train_step(objective, model, tx, schedule, k)` is the whole optimizer step: the objective's
loss on the model's outputs, gradient accumulation over `k` micro-batches normalised by the
*whole* batch (the objective's `denominators`, computed before the split), the optimizer (which
clips and schedules), and the metrics the loop reports: the objective's sums, the loss, the
gradient norm and the learning rate. `jit_train_step` compiles it with explicit shardings and
the state donated, so parameters are updated in place; it is traced under the mesh and the
logical-axis rules, so the model's activation constraints resolve to that mesh.

Dropout: step `s` uses `fold_in(rng, s)` (micro-batch `i` folds in `i` as well), so a resumed
run draws exactly the masks an uninterrupted one would; so do a model's samples ("sample"
stream: ELECTRA's generator).

A model's `model_state` (FP8 scales and amax histories, `training/state.py`) is differentiated
with the parameters, and its "gradient" is its next value: the step *sets* it
(`next_model_state`); it never reaches the optimizer, weight decay, clipping or the gradient
norm. The evaluation step applies it as it stands.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_jax.model import int8
from bert_jax.parallel import sharding
from bert_jax.training.objective import Objective
from bert_jax.training import state as state_lib
from bert_jax.training.state import MODEL_STATE_COLLECTIONS, TrainState

# Step metrics that are not the objective's sums. `real_tokens` / `row_tokens`: the batch's
# non-padding tokens (`input_mask`) and all its token slots, whatever the rows' count and length
# (packed and trimmed batches vary, a multiple-choice example holds a row per ending), for the
# tokens/s, useful tokens/s and padding the loop reports; `sequences`: the sequences packed rows
# hold (`sequence_ids` 1..k), for sequences/s beside rows/s.
STEP_SCALARS = ("loss", "grad_norm", "learning_rate", "real_tokens", "row_tokens", "sequences")


def _split_micro_batches(batch: dict[str, jax.Array], k: int) -> dict[str, jax.Array]:
  """(B, ...) → (k, B/k, ...), micro-batch i = rows i, i+k, i+2k, ... so that every device
  keeps contributing rows of its own shard to every micro-batch (no resharding)."""
  def split(x):
    b = x.shape[0]
    if b % k:
      raise ValueError(f"Batch size {b} is not divisible by grad_accum_steps={k}.")
    return jnp.swapaxes(x.reshape((b // k, k) + x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


# The "sample" stream: draws a model makes besides dropout (ELECTRA's generator samples its
# replacements), from the step's key in training and from a fixed key in evaluation, so that an
# evaluation of the same parameters always sees the same samples.
_SAMPLE_STREAM = 0x53414D50
_EVAL_SAMPLE_SEED = 0


def apply_model(objective: Objective, model: nn.Module, params: Any, batch, *,
                deterministic: bool, rng: jax.Array | None = None,
                model_state: Any = None) -> Any:
  """The model's outputs on a batch: its inputs are the objective's `input_names`. `rng`
  (training) seeds dropout and the "sample" stream; without it, samples use a fixed key.
  `model_state`: the train state's (FP8 scales), for the models that have one."""
  if rng is None:
    rngs = {"sample": jax.random.PRNGKey(_EVAL_SAMPLE_SEED)}
  else:
    rngs = {"dropout": rng, "sample": jax.random.fold_in(rng, _SAMPLE_STREAM)}
  return apply_variables(model, {"params": params, **(model_state or {})},
                         *(batch[k] for k in objective.input_names),
                         deterministic=deterministic, rngs=rngs)


def apply_variables(model: nn.Module, variables: dict[str, Any], *args, **kwargs) -> Any:
  """`model.apply(variables, ...)`, with a model that needs FP8 scales it was not given
  refused in words (Flax would only say that a collection is empty)."""
  try:
    return model.apply(variables, *args, **kwargs)
  except flax.errors.ScopeCollectionNotFound as e:
    if not any(f'collection "{c}"' in str(e) for c in MODEL_STATE_COLLECTIONS):
      raise
    raise ValueError(
        "This model computes its dense layers in FP8 (BertConfig.quantization='fp8'), whose "
        "scales are training state (TrainState.model_state), not parameters, and none were "
        "given: pass the state's model_state, or run the same parameters with "
        "quantization='none'.") from None


def next_model_state(current: Any, returned: Any) -> Any:
  """The model state after a step: what the backward pass returned as its gradient.

  Where a variable came back all zeros, its dot never took part in the loss's gradient (an
  unused pooler, a teacher behind `stop_gradient`): autodiff then gives zeros, not a value, so
  the variable keeps its current value (zero scales would turn that layer's output into NaN
  wherever it is used). A scale the FP8 op computes is never zero, and an amax history it
  returns is all zeros only when every amax in its window is.
  """
  return jax.tree.map(lambda old, new: jnp.where(jnp.any(new != 0), new, old).astype(old.dtype),
                      current, returned)


def make_train_step(objective: Objective, model: nn.Module, tx: optax.GradientTransformation,
                    schedule: Callable, grad_accum_steps: int = 1
                    ) -> Callable[[TrainState, dict], tuple[TrainState, dict]]:
  """`step(state, batch) -> (state, metrics)`, not yet jitted (see `jit_train_step`).
  Refuses an int8 model (`model/int8.py`), or a distillation's int8 student, at once, and any
  int8 parameters (an int8 teacher's too) when traced: int8 kernels have no gradient."""
  for part in (model, getattr(model, "student", None)):
    if getattr(getattr(part, "config", None), "quantization", None) == "int8":
      raise ValueError(int8.TRAINING_ERROR)

  def train_step(state: TrainState, batch: dict[str, jax.Array]):
    if any(leaf.dtype == jnp.int8 for leaf in jax.tree.leaves(state.params)):
      raise ValueError(int8.TRAINING_ERROR)
    dropout_rng = jax.random.fold_in(state.rng, state.step)
    denominators = objective.denominators(batch)

    def loss_fn(params, model_state, micro_batch, rng):
      outputs = apply_model(objective, model, params, micro_batch, deterministic=False, rng=rng,
                            model_state=model_state)
      return objective.loss(outputs, micro_batch, denominators)

    # Gradients of the parameters, and the model state's next values (`next_model_state`).
    grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)
    if grad_accum_steps == 1:
      (loss, sums), (grads, returned) = grad_fn(state.params, state.model_state, batch,
                                                dropout_rng)
    else:
      micro = _split_micro_batches(batch, grad_accum_steps)
      first = jax.tree.map(lambda x: x[0], micro)
      loss_shape, sums_shape = jax.eval_shape(loss_fn, state.params, state.model_state, first,
                                              dropout_rng)
      zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)

      # Every micro-batch starts from the same model state, so each returns the same scales
      # and the same history shifted by one, differing only in the newest amax: the elementwise
      # maximum is the amax of the whole batch, i.e. the state one step on the whole batch
      # gives (the gradients are scaled by the whole batch's denominators), whatever k is.
      # A sum would be k times too large; the last micro-batch would see a k-th of the batch.
      def body(carry, inputs):
        acc_loss, acc_sums, acc_grads, acc_returned = carry
        index, micro_batch = inputs
        (l, s), (g, r) = grad_fn(state.params, state.model_state, micro_batch,
                                 jax.random.fold_in(dropout_rng, index))
        return (acc_loss + l, jax.tree.map(jnp.add, acc_sums, s),
                jax.tree.map(jnp.add, acc_grads, g),
                jax.tree.map(jnp.maximum, acc_returned, r)), None

      init = (zeros(loss_shape), zeros(sums_shape), jax.tree.map(jnp.zeros_like, state.params),
              jax.tree.map(jnp.zeros_like, state.model_state))
      (loss, sums, grads, returned), _ = jax.lax.scan(body, init,
                                                      (jnp.arange(grad_accum_steps), micro))

    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(sums)
    metrics.update(loss=loss, grad_norm=optax.tree.norm(grads),
                   learning_rate=schedule(state.step))
    if "input_mask" in batch:
      metrics["real_tokens"] = jnp.sum(batch["input_mask"].astype(jnp.float32))
      metrics["row_tokens"] = jnp.float32(batch["input_mask"].size)
    if "sequence_ids" in batch:
      metrics["sequences"] = jnp.sum(jnp.max(batch["sequence_ids"], axis=-1)).astype(jnp.float32)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                         model_state=next_model_state(state.model_state, returned)), metrics

  return train_step


def deterministic_loss(objective: Objective, model: nn.Module, params: Any, batch,
                       model_state: Any = None) -> tuple[jax.Array, dict]:
  """`(loss, sums)` of the model without dropout on a batch: what evaluation measures."""
  outputs = apply_model(objective, model, params, batch, deterministic=True,
                        model_state=model_state)
  return objective.loss(outputs, batch, objective.denominators(batch))


def make_eval_step(objective: Objective, model: nn.Module) -> Callable[..., dict]:
  """`eval_step(params, batch[, model_state]) -> sums` of the deterministic model (no
  dropout); a model with FP8 scales needs the state's `model_state` (refused without)."""
  def eval_step(params, batch, model_state=None):
    return deterministic_loss(objective, model, params, batch, model_state)[1]
  return eval_step


def make_model_state_gradient(objective: Objective, model: nn.Module,
                              reduce: Callable[[Any, Any], Any] = lambda grads, params: grads
                              ) -> Callable[..., Any]:
  """`gradient(model_state, params, batch)`: `reduce(grads, params)` of the gradient of the
  deterministic loss with respect to the variables passed beside the parameters — how the loss
  moves with what is not trained (the head gates of `analysis/heads.py`), jitted once with the
  reduction, so that only what is asked for leaves the device."""
  grad = jax.grad(lambda model_state, params, batch: deterministic_loss(
      objective, model, params, batch, model_state)[0])
  return jax.jit(lambda model_state, params, batch: reduce(grad(model_state, params, batch),
                                                           params))


def make_full_batch_steps(loss: Callable[..., jax.Array], tx: optax.GradientTransformation
                          ) -> Callable[..., tuple[Any, Any]]:
  """`steps(params, opt_state, num_steps, *data) -> (params, opt_state)`: `num_steps` updates of
  `tx` by the gradient of `loss(params, *data)` over the whole of fixed `data`, in one loop on
  the device, jitted once per `num_steps`. How a classifier over fixed features trains (the
  linear probes of `analysis/probe.py`); models train by `make_train_step`."""
  def steps(params, opt_state, num_steps, *data):
    def one(_, carry):
      params, opt_state = carry
      updates, opt_state = tx.update(jax.grad(loss)(params, *data), opt_state, params)
      return optax.apply_updates(params, updates), opt_state
    return jax.lax.fori_loop(0, num_steps, one, (params, opt_state))
  return jax.jit(steps, static_argnums=(2,))


def jit_train_step(train_step: Callable, state_shardings, batch_sharding, mesh, rules):
  """The train step, jitted with explicit shardings and the state donated."""
  jitted = jax.jit(train_step, in_shardings=(state_shardings, batch_sharding),
                   out_shardings=(state_shardings, None), donate_argnums=(0,))
  return with_mesh(jitted, mesh, rules)


def jit_eval_step(eval_step: Callable, param_shardings, batch_sharding, mesh, rules,
                  model_state_shardings=None):
  """The eval step, jitted: `(params, batch)`, or with `model_state_shardings` (the state
  shardings' `model_state`) `(params, batch, model_state)`."""
  shardings = (param_shardings, batch_sharding)
  if model_state_shardings is not None:
    shardings += (model_state_shardings,)
  jitted = jax.jit(eval_step, in_shardings=shardings, out_shardings=None)
  return with_mesh(jitted, mesh, rules)


def build_train_step(objective: Objective, model: nn.Module, tx, schedule, state_shardings,
                     batch_sharding, mesh, rules, grad_accum_steps: int = 1):
  """`make_train_step` + `jit_train_step`: what a run calls."""
  return jit_train_step(make_train_step(objective, model, tx, schedule, grad_accum_steps),
                        state_shardings, batch_sharding, mesh, rules)


def lower_train_step(objective: Objective, model: nn.Module, tx, schedule, mesh, rules,
                     batch_size: int, grad_accum_steps: int = 1):
  """The train step of `batch_size` rows lowered for `mesh` without data or parameters (ahead
  of time; the mesh may be of compile-only devices): `(lowered, abstract state, state
  shardings)`. The step is the one `build_train_step` gives a run."""
  example = objective.example_batch(batch_size)
  abstract, state_sh = state_lib.abstract_train_state(model, tx, mesh, rules, example,
                                                      objective.input_names)
  batch_sh = sharding.batch_sharding(mesh)
  abstract_batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sh)
                    for k, v in example.items()}
  step = build_train_step(objective, model, tx, schedule, state_sh, batch_sh, mesh, rules,
                          grad_accum_steps)
  return step.lower(abstract, abstract_batch), abstract, state_sh


def device_bytes(memory) -> int:
  """What a compiled step holds on a device, from its `memory_analysis()`: the arguments, the
  outputs that do not reuse them (donation) and the temporaries."""
  return int(memory.argument_size_in_bytes + memory.output_size_in_bytes
             + memory.temp_size_in_bytes - memory.alias_size_in_bytes)


def with_mesh(fn, mesh, rules):
  """Traces (and runs) `fn` with the mesh and logical rules in scope, so the model's
  activation constraints resolve to this mesh. `.lower(...)` does the same for AOT."""
  @functools.wraps(fn)
  def wrapped(*args):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return fn(*args)

  def lower(*args):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return fn.lower(*args)
  wrapped.lower = lower
  return wrapped
