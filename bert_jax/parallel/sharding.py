"""Device mesh, logical-axis rules, and the shardings of parameters and batches.

The model names every parameter and activation axis logically (`embed`, `mlp`, `vocab`,
`activation_batch`, ...); this module alone decides which mesh axis each name is split over.
The mesh has three axes:

* `data`  — replicas that each see different examples (pure data parallelism);
* `fsdp`  — also different examples, but parameters and optimizer state are split across it
            (ZeRO-3 style), gathered layer by layer when used;
* `model` — tensor parallelism: attention heads, the FFN hidden units and the vocabulary split.

With the default rules a mesh of shape (N, 1, 1) is plain data parallelism, (1, N, 1) is FSDP and
(1, 1, N) is Megatron-style tensor parallelism; any mix works because the rules never change.
"""

from __future__ import annotations

from absl import logging
import math
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "model")

# Logical name → mesh axis (or axes, or None = replicated). Earlier rules win; a mesh axis is
# used at most once per array (flax assigns the first free one).
DEFAULT_LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] = (
    # activations
    ("activation_batch", ("data", "fsdp")),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "model"),
    ("activation_kv", None),
    ("activation_mlp", "model"),
    ("activation_vocab", "model"),
    # parameters
    ("vocab", "model"),
    ("joined_kv", "model"),
    ("mlp", "model"),
    ("embed", "fsdp"),
    ("embed_out", None),
    ("position", None),
    ("token_type", None),
    ("norm", None),
    ("classes", None),
    ("layers", None),
)


def create_mesh(mesh_shape: Sequence[int] = (-1, 1, 1),
                devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, model) mesh over `devices` (default: all). One entry may be -1 (= the rest).

  Axis types are Auto: linen's logical partitioning relies on sharding propagation, which the
  Explicit axes that `jax.make_mesh` now defaults to turn into assertions.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = [int(s) for s in mesh_shape]
  if len(shape) != len(MESH_AXES):
    raise ValueError(f"mesh_shape {tuple(mesh_shape)} must have {len(MESH_AXES)} entries "
                     f"{MESH_AXES}.")
  if shape.count(-1) > 1:
    raise ValueError(f"mesh_shape {tuple(mesh_shape)}: at most one entry may be -1.")
  if -1 in shape:
    known = math.prod(s for s in shape if s != -1)
    if len(devices) % known:
      raise ValueError(f"mesh_shape {tuple(mesh_shape)}: the fixed axes ({known} devices) do "
                       f"not divide the {len(devices)} devices available.")
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    raise ValueError(f"mesh_shape {tuple(shape)} uses {math.prod(shape)} devices but "
                     f"{len(devices)} are available: a mesh must use every device. Write -1 for "
                     "one axis to take the rest, e.g. --config.mesh_shape='(-1, 1, 1)'.")
  try:
    # Topology-aware order on TPU slices (neighbours on the ICI torus share the model axis).
    from jax.experimental import mesh_utils
    device_array = mesh_utils.create_device_mesh(shape, devices=devices)
  except (ValueError, NotImplementedError, AssertionError):
    device_array = np.asarray(devices).reshape(shape)
  return Mesh(device_array, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def rules_from_config(rules: Sequence[Sequence[Any]] | None) -> tuple[tuple[str, Any], ...]:
  """Normalises rules from an ml_collections config (lists of lists) to tuples."""
  if rules is None:
    return DEFAULT_LOGICAL_AXIS_RULES
  out = []
  for rule in rules:
    name, axes = rule
    out.append((str(name), tuple(axes) if isinstance(axes, (list, tuple)) else axes))
  return tuple(out)


def mesh_from_config(config: Any, devices: Sequence[jax.Device] | None = None
                     ) -> tuple[Mesh, tuple[tuple[str, Any], ...]]:
  """The mesh and rules an ml_collections config asks for.

  Reads `config.mesh_shape` (data, fsdp, model; one entry may be -1) and, if present,
  `config.logical_axis_rules` (list of [logical name, mesh axis or list of axes or None]).
  """
  shape = tuple(config.get("mesh_shape", (-1, 1, 1)))
  return create_mesh(shape, devices), rules_from_config(config.get("logical_axis_rules", None))


def logical_to_mesh_sharding(logical_specs: Any, mesh: Mesh,
                             rules: Sequence[tuple[str, Any]] = DEFAULT_LOGICAL_AXIS_RULES) -> Any:
  """A tree of logical PartitionSpecs → a tree of NamedShardings on `mesh`."""
  return nn.logical_to_mesh_sharding(logical_specs, mesh, rules)


def logical_partition_specs(boxed_tree: Any) -> Any:
  """Logical PartitionSpecs of a tree whose leaves are `nn.LogicallyPartitioned` (e.g. from
  `jax.eval_shape(model.init, ...)`)."""
  return nn.get_partition_spec(boxed_tree)


def _divisible_spec(spec: PartitionSpec, shape: Sequence[int], mesh: Mesh,
                    where: str) -> PartitionSpec:
  """Drops the split of any dimension the mesh axes do not divide evenly (JAX requires even
  shards), so that e.g. BERT's 30522-word vocabulary still loads on a 4-way `model` axis; the
  dimension is then replicated, and a warning names it so users can pad the vocabulary."""
  entries = list(spec) + [None] * (len(shape) - len(spec))
  for i, axes in enumerate(entries):
    if axes is None:
      continue
    names = axes if isinstance(axes, tuple) else (axes,)
    ways = math.prod(mesh.shape[a] for a in names)
    if shape[i] % ways:
      logging.warning("%s: dimension %d of size %d is not divisible by mesh axes %s (%d-way); "
                      "replicating it instead.", where, i, shape[i], names, ways)
      entries[i] = None
  return PartitionSpec(*entries)


def param_shardings(abstract_boxed_params: Any, mesh: Mesh,
                    rules: Sequence[tuple[str, Any]] = DEFAULT_LOGICAL_AXIS_RULES) -> Any:
  """NamedShardings for every parameter of an abstract (eval_shape'd) boxed parameter tree."""
  logical = logical_partition_specs(abstract_boxed_params)
  mesh_specs = nn.logical_to_mesh(logical, rules)
  is_boxed = lambda x: isinstance(x, nn.Partitioned)
  shape_leaves = [getattr(leaf, "value", leaf)
                  for leaf in jax.tree.leaves(abstract_boxed_params, is_leaf=is_boxed)]
  is_spec = lambda x: isinstance(x, PartitionSpec)
  paths_specs = jax.tree_util.tree_flatten_with_path(mesh_specs, is_leaf=is_spec)[0]
  treedef = jax.tree.structure(mesh_specs, is_leaf=is_spec)
  out = []
  for (path, spec), leaf in zip(paths_specs, shape_leaves):
    where = "/".join(str(getattr(k, "key", k)) for k in path)
    out.append(NamedSharding(mesh, _divisible_spec(spec, leaf.shape, mesh, where)))
  return jax.tree.unflatten(treedef, out)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension split over every data-carrying axis; the rest replicated."""
  return NamedSharding(mesh, PartitionSpec(("data", "fsdp")))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def data_parallel_size(mesh: Mesh) -> int:
  """How many shards the global batch is split into (must divide the global batch size)."""
  return mesh.shape["data"] * mesh.shape["fsdp"]


def check_batch_divisible(global_batch_size: int, mesh: Mesh) -> None:
  n = data_parallel_size(mesh)
  if global_batch_size % n:
    raise ValueError(f"Global batch size {global_batch_size} is not divisible by the "
                     f"{n} data-parallel shards of mesh {dict(mesh.shape)} (data × fsdp).")


def init_sharded(init_fn, mesh: Mesh, rules: Sequence[tuple[str, Any]], *args):
  """Runs `init_fn(*args)` (which returns a boxed variable tree) already sharded.

  The tree's shape is traced with `jax.eval_shape`, its logical specs become mesh shardings, and
  a jitted init writes each shard directly on its device: no host ever holds the full model.
  Returns `(unboxed_tree, shardings)`.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract = jax.eval_shape(init_fn, *args)
    shardings = param_shardings(abstract, mesh, rules)
    unboxed_init = lambda *a: nn.unbox(init_fn(*a))
    tree = jax.jit(unboxed_init, out_shardings=shardings)(*args)
  return tree, shardings
