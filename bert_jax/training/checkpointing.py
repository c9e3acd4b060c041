"""The checkpoints of a training run: its train state saved as it trains, and resumed.

`CheckpointManager` is the Orbax checkpoint directory of `interop/checkpoint_store.py` (items,
checksums, fallback past damaged steps) with what a run adds: restoring the whole train state,
a background save's failure noticed within a step, and the TPU runtime's preemption notice.

Restoring takes an abstract state (ShapeDtypeStructs with shardings), so a checkpoint written
on one mesh restores onto any other. Before reading any array the stored shapes are compared
with the model's and every mismatch is listed (another model's checkpoint: an error, no
fallback). The input pipeline's position saved beside the state is `training/data_position.py`.
"""

from __future__ import annotations

from typing import Any

import flax.serialization
import jax
import orbax.checkpoint as ocp
from absl import logging

from bert_jax import file_io
from bert_jax.interop import kinds
from bert_jax.interop.checkpoint_errors import CheckpointError, Damaged, NotDamage
from bert_jax.interop.checkpoint_fingerprints import flat_leaves
from bert_jax.interop.checkpoint_store import CheckpointStore, flat_shapes


class CheckpointManager(CheckpointStore):
  """Save / resume of pre-training and fine-tuning runs (local paths or gs://)."""

  # --------------------------------------------------------------------------- during a run
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

  def check_for_errors(self) -> None:
    """Raises the `CheckpointError` of a background save that has failed, without waiting for
    one still writing: cheap enough for every step, so a failed save stops the run soon after,
    not one save later. Single process only: hosts would see a failure at different steps, so
    several learn of it at the next save or wait, which they reach together."""
    if self._pending_step is None or jax.process_count() > 1:
      return
    if not self._manager.is_saving_in_progress():
      self.wait_until_finished()

  # ------------------------------------------------------------------------ checks on read
  def check_compatible(self, abstract_state: Any, step: int) -> None:
    """Raises a ValueError listing every parameter whose stored shape differs from the model's,
    and any parameter present on only one side."""
    try:
      self._check_shapes(self._stored_shapes(step), abstract_state, step)
    except NotDamage as e:
      raise e.error from None
    except Damaged as d:
      raise CheckpointError(f"Checkpoint {self.directory} step {step} is damaged: "
                            f"{d.problem}.") from None

  def _check_shapes(self, stored_shapes: dict[str, tuple[int, ...]], abstract_state: Any,
                    step: int) -> None:
    wanted = flat_shapes(flax.serialization.to_state_dict(abstract_state))
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
      raise NotDamage(ValueError(
          f"Checkpoint {self.directory} step {step} does not fit this model "
          f"({len(problems)} differences):\n" + "\n".join(shown)
          + _layout_hint(set(stored_shapes), set(wanted))))

  def stored_layout(self) -> str | None:
    """How the layers of the newest readable step are laid out ("stacked" or "unrolled", as
    `layers_layout`), from its metadata without any array; None without one (a damaged step is
    passed over here as `restore` passes over it, and named there)."""
    for step in sorted(self.all_steps(), reverse=True):
      try:
        return layers_layout(self._stored_shapes(step))
      except Damaged:
        continue
    return None

  # ---------------------------------------------------------------------------- restore
  def restore(self, abstract_state: Any, step: int | None = None, *,
              set_aside_damaged: bool = False) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """`(state, data_position, metadata)` from `step` (default: the newest step that is not
    damaged), laid out as `abstract_state`'s shardings say, and checked against the checksums
    written at save.

    `set_aside_damaged`: newer damaged steps are renamed aside (what a run resuming here does,
    so that it can save those steps again); `self.skipped` lists them with their problems.
    """
    target = flax.serialization.to_state_dict(abstract_state)

    def read(s: int):
      record = self._read_json_files(s, ("state", "data", "meta"))
      stored_shapes = self._stored_shapes(s)
      self._check_recorded_shapes(record, stored_shapes)
      self._check_shapes(stored_shapes, abstract_state, s)
      restored = self._manager.restore(s, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
              item=target,
              restore_args=ocp.checkpoint_utils.construct_restore_args(target)),
          data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore()))
      data, meta = dict(restored["data"]), dict(restored["meta"])
      self._verify(record, flat_leaves(restored["state"]), {"data": data, "meta": meta})
      if record is None:
        logging.warning("Checkpoint %s step %d has no checksums (written before they were "
                        "recorded): restored unverified.", self.directory, s)
      return s, restored["state"], data, meta

    restored_step, tree, data, meta = self._first_good(step, read, set_aside=set_aside_damaged)
    state = flax.serialization.from_state_dict(abstract_state, tree)
    logging.info("Restored %s step %d.", self.directory, restored_step)
    return state, data, meta


# What names the layers' parameters in each layout: stacked (`scan_layers=True`, with or
# without `stack_unrolled`: one subtree whose leaves have a leading layer axis) or one subtree
# per layer.
_LAYOUT_MARKS = {"stacked": "/encoder/layer/", "unrolled": "/encoder/layer_0/"}


def layers_layout(names) -> str | None:
  """"stacked" or "unrolled": how the layers of a state whose flat parameter names are `names`
  are laid out; None where neither or both show (a model without layers, shared layers)."""
  found = [kind for kind, mark in _LAYOUT_MARKS.items() if any(mark in n for n in names)]
  return found[0] if len(found) == 1 else None


def _layout_hint(stored: set[str], wanted: set[str]) -> str:
  """The fix, where the two differ only in how the layers' parameters are laid out: stacked
  (`encoder/layer/...`, `scan_layers=True`) or one subtree per layer (`encoder/layer_0/...`)."""
  have, want = layers_layout(stored), layers_layout(wanted)
  if not have or not want or have == want:
    return ""
  resume = ("--config.model.scan_layers=True (on GPUs with --config.model.stack_unrolled=True "
            "as well, which runs the stacked layers unrolled)" if have == "stacked"
            else "--config.model.scan_layers=False")
  return (f"\nThe checkpoint's layers are {have} (scan_layers={have == 'stacked'}) and this "
          f"model's are {want}: resume with {resume}, or start from its weights (a fresh "
          "optimizer) with --config.init_checkpoint=<it> --config.init_mode=params, which "
          "converts the layout.")


def stored_layout(run_dir: str) -> str | None:
  """How the layers of the newest readable checkpoint of the run in `run_dir` are laid out
  (`CheckpointManager.stored_layout`); None where it has none. Creates nothing: a run refused
  after asking leaves its directory as it was."""
  if not file_io.exists(file_io.join(run_dir, kinds.CHECKPOINTS)):
    return None
  manager = run_checkpoints(run_dir, max_to_keep=None, async_save=False)
  try:
    return manager.stored_layout()
  finally:
    manager.close()


def run_checkpoints(run_dir: str, *, max_to_keep: int | None = 3, async_save: bool = True
                    ) -> CheckpointManager:
  """The checkpoint manager of a run directory (where runs save and resume)."""
  return CheckpointManager(file_io.join(run_dir, kinds.CHECKPOINTS),
                           max_to_keep=max_to_keep, async_save=async_save)
