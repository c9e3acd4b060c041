"""Orbax checkpoints of the train state, the data position and the run's metadata.

A checkpoint step directory holds three items: `state` (parameters, optimizer state, step, RNG
— sharded arrays written by every host in parallel), `data` (the input pipeline's position, so
a resumed run reads exactly the batches an uninterrupted one would) and `meta` (the model
config, for checks and for loading the encoder elsewhere). Orbax writes a step under a
temporary name and commits it only when every item is complete, so an interrupted save never
looks like a checkpoint. Saves are asynchronous: training continues while arrays are written.

Restoring takes an abstract state (ShapeDtypeStructs with shardings), so a checkpoint written
on one mesh restores onto any other. Before reading any array the stored shapes are compared
with the model's and every mismatch is listed.
"""

from __future__ import annotations

import os
from typing import Any

import flax.serialization
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath


def _state_dict(tree: Any) -> Any:
  return flax.serialization.to_state_dict(tree)


def _flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    name = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
    out[name] = tuple(getattr(leaf, "shape", ()))
  return out


class CheckpointManager:
  """Save / resume of pre-training and fine-tuning runs (local paths or gs://)."""

  def __init__(self, directory: str, *, max_to_keep: int | None = 3, async_save: bool = True):
    directory = str(directory)
    # Orbax wants absolute paths; a relative --output_dir is relative to where the user stands.
    self.directory = directory if "://" in directory else os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                           enable_async_checkpointing=async_save, create=True)
    # Handlers named up front so that metadata can be read before any save/restore call.
    handlers = {"state": ocp.PyTreeCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler()}
    self._manager = ocp.CheckpointManager(epath.Path(self.directory), options=options,
                                          item_handlers=handlers)

  # --------------------------------------------------------------------------------- queries
  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def reached_preemption(self, step: int) -> bool:
    """True on every host once the TPU runtime announced a preemption (a sync point).

    The notice travels through the multi-process coordination service, so a single process
    has none to ask (and asking every step would raise every step).
    """
    if jax.process_count() == 1:
      return False
    try:
      return bool(self._manager.reached_preemption(step))
    except Exception:  # pylint: disable=broad-except  # no preemption service (CPU, tests)
      return False

  # ------------------------------------------------------------------------------- save
  def save(self, step: int, state: Any, data_position: dict[str, Any],
           metadata: dict[str, Any], force: bool = True) -> bool:
    """Starts an (async) save of `state` at `step`; returns whether a save was started."""
    args = ocp.args.Composite(state=ocp.args.PyTreeSave(_state_dict(state)),
                              data=ocp.args.JsonSave(data_position),
                              meta=ocp.args.JsonSave(metadata))
    return bool(self._manager.save(int(step), args=args, force=force))

  def wait_until_finished(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  # ---------------------------------------------------------------------------- restore
  def check_compatible(self, abstract_state: Any, step: int) -> None:
    """Raises a ValueError listing every parameter whose stored shape differs from the model's,
    and any parameter present on only one side."""
    stored = self._manager.item_metadata(step)["state"]
    stored_tree = getattr(stored, "tree", stored)
    stored_shapes = _flat_shapes(stored_tree)
    wanted = _flat_shapes(_state_dict(abstract_state))
    problems = []
    # Parameters first: they say what differs; optimizer moments only repeat it.
    for name in sorted(set(stored_shapes) | set(wanted),
                       key=lambda n: (not n.startswith("params/"), n)):
      if name not in stored_shapes:
        problems.append(f"  {name}: missing from the checkpoint (model {wanted[name]})")
      elif name not in wanted:
        problems.append(f"  {name}: in the checkpoint {stored_shapes[name]}, not in the model")
      elif stored_shapes[name] != wanted[name]:
        problems.append(f"  {name}: checkpoint {stored_shapes[name]} vs model {wanted[name]}")
    if problems:
      shown = problems[:40] + ([f"  ... and {len(problems) - 40} more"] if len(problems) > 40
                               else [])
      raise ValueError(f"Checkpoint {self.directory} step {step} does not fit this model "
                       f"({len(problems)} differences):\n" + "\n".join(shown))

  def restore(self, abstract_state: Any, step: int | None = None
              ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """`(state, data_position, metadata)` from `step` (default: latest), laid out as
    `abstract_state`'s shardings say."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No checkpoint in {self.directory}.")
    self.check_compatible(abstract_state, step)
    target = _state_dict(abstract_state)
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(item=target,
                                     restore_args=ocp.checkpoint_utils.construct_restore_args(
                                         target)),
        data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()))
    state = flax.serialization.from_state_dict(abstract_state, restored["state"])
    logging.info("Restored %s step %d.", self.directory, step)
    return state, dict(restored["data"]), dict(restored["meta"])

  def restore_metadata(self, step: int | None = None) -> dict[str, Any]:
    step = self.latest_step() if step is None else step
    restored = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
    return dict(restored["meta"])


def load_params(directory: str, step: int | None = None, subtree: str = "params",
                shardings: Any = None) -> tuple[Any, dict[str, Any]]:
  """Only the parameters (default) — or a part such as `params/bert`, the encoder for
  fine-tuning — of a checkpoint, without reading the optimizer state.

  Returns `(tree, metadata)`. Without `shardings`, arrays land on the first local device.
  """
  manager = CheckpointManager(directory, max_to_keep=None, async_save=False)
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"No checkpoint in {directory}.")
  stored = manager._manager.item_metadata(step)["state"]  # pylint: disable=protected-access
  node = getattr(stored, "tree", stored)
  keys = subtree.split("/")
  for key in keys:
    if not isinstance(node, dict) or key not in node:
      raise KeyError(f"{directory} step {step}: no '{subtree}' in the checkpoint "
                     f"(has {sorted(node) if isinstance(node, dict) else type(node)}).")
    node = node[key]
  device = jax.local_devices()[0]
  if shardings is None:
    shardings = jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(device), node)
  leaf_target = jax.tree.map(
      lambda m, s: jax.ShapeDtypeStruct(tuple(m.shape), np.dtype(m.dtype), sharding=s),
      node, shardings)
  target = leaf_target
  for key in reversed(keys):
    target = {key: target}
  restored = manager._manager.restore(step, args=ocp.args.Composite(  # pylint: disable=protected-access
      state=ocp.args.PyTreeRestore(item=target,
                                   restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                                   partial_restore=True),
      meta=ocp.args.JsonRestore()))
  tree = restored["state"]
  for key in keys:
    tree = tree[key]
  meta = dict(restored["meta"], step=step)  # which step was read (the caller reports it)
  manager.close()
  return tree, meta


# --------------------------------------------------------------------------- data positions
def gather_positions(position: dict[str, int]) -> dict[str, Any]:
  """Every process's data position, for the checkpoint (hosts read different files, so their
  positions can differ)."""
  local = np.asarray([position.get("epoch", 0), position.get("batch", 0)], np.int64)
  if jax.process_count() == 1:
    return {"per_process": [local.tolist()]}
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  gathered = np.asarray(multihost_utils.process_allgather(local))
  return {"per_process": gathered.reshape(-1, 2).tolist()}


def own_position(data_state: dict[str, Any]) -> dict[str, int]:
  """This process's position from a checkpoint's `data` item."""
  per_process = data_state.get("per_process") or []
  if len(per_process) != jax.process_count():
    raise ValueError(f"The checkpoint's data position is for {len(per_process)} processes; this "
                     f"run has {jax.process_count()}. Resume with the same number of hosts.")
  epoch, batch = per_process[jax.process_index()]
  return {"epoch": int(epoch), "batch": int(batch)}
