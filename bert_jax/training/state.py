"""The train state, created already sharded.

The state is born on the mesh: `jax.eval_shape` traces its structure, the model's logical axis
names become shardings (optimizer moments follow their parameters), and a jitted init writes
every shard on its own device — no host ever holds a full copy. The abstract state
(ShapeDtypeStructs with shardings) is also the restore target of checkpoints, so a checkpoint
written on one mesh restores onto any other.

Besides its parameters a model may keep variables that the step sets rather than trains: the
scales and amax histories of FP8 matmuls (`BertConfig.quantization="fp8"`), Flax's
`_overwrite_with_gradient` collection. They are the state's `model_state`, `{}` for every
other model, and then absent from checkpoints: a state without them saves and restores as
before they existed.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.linen import fp8_ops
from jax._src import config as jax_config  # the threefry lowering's setting: no public alias
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax.parallel import sharding
from bert_jax.training import optimizer


# The collections of a model's variables that the train state carries besides `params`. Each is
# set, not trained: the backward pass returns a variable's next value as its gradient (the step
# applies them in `training.step.next_model_state`), and the optimizer never sees them.
MODEL_STATE_COLLECTIONS = (fp8_ops.OVERWRITE_WITH_GRADIENT,)


@flax.struct.dataclass
class TrainState:
  """Everything a resumed run needs besides the data position (`training/data_position.py`)."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # base dropout key; step s uses fold_in(rng, s)
  # {collection: variables} of MODEL_STATE_COLLECTIONS the model has (FP8 scales); {} if none.
  model_state: Any = flax.struct.field(default_factory=dict)


_FIELDS = ("step", "params", "opt_state", "rng")


def _state_dict(state: TrainState) -> dict[str, Any]:
  """The checkpointed tree: `model_state` only where the model has one, so that the states of
  models without it keep the tree (and read the checkpoints) they always had."""
  out = {name: flax.serialization.to_state_dict(getattr(state, name)) for name in _FIELDS}
  if state.model_state:
    out["model_state"] = flax.serialization.to_state_dict(state.model_state)
  return out


def _from_state_dict(target: TrainState, tree: dict[str, Any]) -> TrainState:
  tree = dict(tree)
  extra = sorted(set(tree) - set(_FIELDS) - {"model_state"})
  missing = sorted(set(_FIELDS) - set(tree))
  if extra or missing:
    raise ValueError(f"TrainState: the state dict has fields {sorted(tree)}; missing "
                     f"{missing}, unknown {extra}.")
  updates = {name: flax.serialization.from_state_dict(getattr(target, name), tree[name],
                                                      name=name) for name in _FIELDS}
  if target.model_state or "model_state" in tree:
    updates["model_state"] = flax.serialization.from_state_dict(
        target.model_state, tree.get("model_state", {}), name="model_state")
  return target.replace(**updates)


flax.serialization.register_serialization_state(TrainState, _state_dict, _from_state_dict,
                                                override=True)


def _init_variables_fn(model: nn.Module, batch: dict[str, Any], input_names: Sequence[str]):
  """`init(rng) -> (params, model_state)`; other collections an init makes are dropped."""
  def init_variables(rng):
    variables = model.init(rng, *(batch[k] for k in input_names))
    model_state = {c: variables[c] for c in MODEL_STATE_COLLECTIONS if c in variables}
    return variables["params"], model_state
  return init_variables


def abstract_train_state(model: nn.Module, tx: optax.GradientTransformation, mesh: Mesh,
                         rules, batch: dict[str, Any],
                         input_names: Sequence[str]
                         ) -> tuple[TrainState, TrainState]:
  """`(abstract_state, state_shardings)`: shapes, dtypes and shardings, nothing allocated.

  Parameters take the shardings of their logical names; optimizer moments those of their
  parameters; counters, the RNG and the model state (a few scalars and histories per layer)
  are replicated. The abstract state (ShapeDtypeStructs with shardings) is also the restore
  target for checkpoints.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    # The key is made inside the trace too: nothing here may run concretely, because the mesh
    # may be of compile-only devices (a TPU topology compiled for from another machine).
    init_variables = _init_variables_fn(model, batch, input_names)
    boxed, boxed_model_state = jax.eval_shape(lambda: init_variables(jax.random.PRNGKey(0)))
    param_sh = sharding.param_shardings(boxed, mesh, rules)
    abstract_params = jax.tree.map(lambda x: x.value if isinstance(x, nn.Partitioned) else x,
                                   boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
  replicated = NamedSharding(mesh, PartitionSpec())
  opt_sh = optimizer.tree_map_params(tx, lambda _, s: s, abstract_opt, param_sh,
                                     transform_non_params=lambda _: replicated)
  abstract_model_state = nn.unbox(boxed_model_state)
  state_sh = TrainState(step=replicated, params=param_sh, opt_state=opt_sh, rng=replicated,
                        model_state=jax.tree.map(lambda _: replicated, abstract_model_state))
  abstract = TrainState(step=jax.ShapeDtypeStruct((), jnp.int32), params=abstract_params,
                        opt_state=abstract_opt,
                        rng=jax.eval_shape(lambda: jax.random.PRNGKey(0)),
                        model_state=abstract_model_state)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, state_sh)
  return abstract, state_sh


def create_train_state(model: nn.Module, tx: optax.GradientTransformation, mesh: Mesh,
                       rules, seed: int, batch: dict[str, Any],
                       input_names: Sequence[str], shardings: TrainState | None = None
                       ) -> tuple[TrainState, TrainState]:
  """`(state, state_shardings)` with every array created directly in its shards.

  Parameters come from `PRNGKey(seed)` split once (parameters, dropout), so a model's initial
  weights depend only on the seed, never on the mesh. `shardings`: those `abstract_train_state`
  gave for the same arguments, when the caller has them (the model's init is then traced once
  less: seconds for a large model).
  """
  state_sh = shardings
  if state_sh is None:
    _, state_sh = abstract_train_state(model, tx, mesh, rules, batch, input_names)
  seed_array = jnp.asarray(seed, jnp.uint32)
  lowered = lower_initial_state(model, tx, mesh, rules, batch, input_names, state_sh,
                                seed_array)
  return lowered.compile()(seed_array), state_sh


def lower_initial_state(model: nn.Module, tx: optax.GradientTransformation, mesh: Mesh,
                        rules, batch: dict[str, Any], input_names: Sequence[str],
                        state_sh: TrainState, seed_array: Any,
                        threefry_kernel: bool = True) -> jax.stages.Lowered:
  """The program `create_train_state` runs, lowered for `mesh` (`seed_array`: a uint32 scalar
  or its ShapeDtypeStruct; `threefry_kernel=False`: the draws lowered inline, JAX's default,
  for comparison).

  Its random draws lowered to JAX's threefry kernel on GPUs: the same
  numbers (the algorithm is the same, written once as a CUDA kernel), and a program XLA's GPU
  compiler turns out in a fraction of the time. Lowered inline, every parameter's draws become
  unrolled hashing inside a few large fusions: BERT-base's took 60.7 s to compile for an H200
  on a 2-core machine, against 10.1 s with the kernel, BERT-large's 137.4 s against 19.2 s
  (`benchmarks/init_compile.py`). Only here: in the train step the dropout bits stay inline,
  fused into the kernels that use them.
  """
  init_variables = _init_variables_fn(model, batch, input_names)

  def init_state(seed_array):
    param_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed_array))
    params, model_state = nn.unbox(init_variables(param_rng))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params), rng=dropout_rng, model_state=model_state)

  # JAX's `jax_threefry_gpu_kernel_lowering` is part of the trace context, so only what is
  # traced inside takes it; no other platform reads it. A JAX without it lowers inline.
  setting = getattr(jax_config, "threefry_gpu_kernel_lowering", None)
  kernels = setting(True) if threefry_kernel and setting is not None else contextlib.nullcontext()
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules), kernels:
    return jax.jit(init_state, out_shardings=state_sh).lower(seed_array)
