"""The train state, created already sharded.

The state is born on the mesh: `jax.eval_shape` traces its structure, the model's logical axis
names become shardings (optimizer moments follow their parameters), and a jitted init writes
every shard on its own device — no host ever holds a full copy. The abstract state
(ShapeDtypeStructs with shardings) is also the restore target of checkpoints, so a checkpoint
written on one mesh restores onto any other.
"""

from __future__ import annotations

from typing import Any, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax.parallel import sharding
from bert_jax.training import optimizer


@flax.struct.dataclass
class TrainState:
  """Everything a resumed run needs besides the data position (kept by checkpointing)."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # base dropout key; step s uses fold_in(rng, s)


def _init_params_fn(model: nn.Module, batch: dict[str, Any], input_names: Sequence[str]):
  def init_params(rng):
    return model.init(rng, *(batch[k] for k in input_names))["params"]
  return init_params


def abstract_train_state(model: nn.Module, tx: optax.GradientTransformation, mesh: Mesh,
                         rules, batch: dict[str, Any],
                         input_names: Sequence[str]
                         ) -> tuple[TrainState, TrainState]:
  """`(abstract_state, state_shardings)`: shapes, dtypes and shardings, nothing allocated.

  Parameters take the shardings of their logical names; optimizer moments those of their
  parameters; counters and the RNG are replicated. The abstract state (ShapeDtypeStructs with
  shardings) is also the restore target for checkpoints.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(_init_params_fn(model, batch, input_names), jax.random.PRNGKey(0))
    param_sh = sharding.param_shardings(boxed, mesh, rules)
    abstract_params = jax.tree.map(lambda x: x.value if isinstance(x, nn.Partitioned) else x,
                                   boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
  replicated = NamedSharding(mesh, PartitionSpec())
  opt_sh = optimizer.tree_map_params(tx, lambda _, s: s, abstract_opt, param_sh,
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
                       input_names: Sequence[str]
                       ) -> tuple[TrainState, TrainState]:
  """`(state, state_shardings)` with every array created directly in its shards.

  Parameters come from `PRNGKey(seed)` split once (parameters, dropout), so a model's initial
  weights depend only on the seed, never on the mesh.
  """
  _, state_sh = abstract_train_state(model, tx, mesh, rules, batch, input_names)
  init_params = _init_params_fn(model, batch, input_names)

  def init_state(seed_array):
    param_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed_array))
    params = nn.unbox(init_params(param_rng))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params), rng=dropout_rng)

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state = jax.jit(init_state, out_shardings=state_sh)(jnp.asarray(seed, jnp.uint32))
  return state, state_sh
