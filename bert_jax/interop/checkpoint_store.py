"""Our run directories' checkpoint kind: Orbax steps, written and read back with checks.

A checkpoint step directory holds four items: `state` (parameters, optimizer state, step, RNG
— sharded arrays written by every host in parallel), `data` (the input pipeline's position, so
a resumed run reads exactly the batches an uninterrupted one would), `meta` (the model config,
for checks and for loading the encoder elsewhere) and `checksums` (what was saved, to check
what is read back: `interop/checkpoint_fingerprints.py`). Orbax writes a step under a temporary
name and commits it only when every item is complete, so an interrupted save never looks like a
checkpoint. Saves may be asynchronous: the caller continues while arrays are written.

This is the format beside Hugging Face's and TF1's (`interop/hf.py`, `interop/tf1.py`): every
loader reads weights and metadata from it (`load_params`), conversions write it, and the
checkpoint manager of a training run (`training/checkpointing.py`) builds on `CheckpointStore`
to save and resume the train state.

Damage. A read checks the JSON files, that the stored shapes agree with those recorded at save,
and the fingerprints of what it read. A step that fails any of this is damaged: the newest
steps are tried in turn, each damaged one named (file or array) in a warning, and a run
resuming from an older step sets the damaged ones aside (`<step>.damaged-<time>`) so that it
can save those steps again. Only when no step restores is it an error, which lists every step's
problem. Write failures surface, at the next save or wait, as one `CheckpointError`
(`interop/checkpoint_errors.py`).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import flax.serialization
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from bert_jax.interop.checkpoint_errors import (CheckpointError, Damaged, NotDamage, explain,
                                                is_no_space, one_line, quiet_aborted_reads)
from bert_jax.interop.checkpoint_fingerprints import (CHECKSUMS_FORMAT, checksum_record,
                                                      compile_ahead, fingerprints, flat_leaves,
                                                      json_digest)

_ITEMS = ("state", "data", "meta", "checksums")


def _state_dict(tree: Any) -> Any:
  return flax.serialization.to_state_dict(tree)


def flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  """`{leaf name: shape}` of `tree`, named as in the checksum record."""
  return {name: tuple(getattr(leaf, "shape", ()))
          for name, leaf in flat_leaves(tree).items()}


def _all_agree(ok: bool) -> bool:
  """Whether `ok` holds on every process (each reads its own shards, so one host can meet
  damage the others do not)."""
  if jax.process_count() == 1:
    return ok
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(np.asarray(multihost_utils.process_allgather(np.asarray([int(ok)]))).all())


class CheckpointStore:
  """A directory of checkpoint steps (local path or gs://): saves, and reads checked against
  what was saved, falling back past damaged steps."""

  def __init__(self, directory: str, *, max_to_keep: int | None = 3, async_save: bool = True):
    directory = str(directory)
    # Orbax wants absolute paths; a relative --output_dir is relative to where the user stands.
    self.directory = directory if "://" in directory else os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                           enable_async_checkpointing=async_save, create=True)
    # Handlers named up front so that metadata can be read before any save/restore call.
    handlers = {"state": ocp.PyTreeCheckpointHandler(), "data": ocp.JsonCheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler(), "checksums": ocp.JsonCheckpointHandler()}
    self._manager = ocp.CheckpointManager(epath.Path(self.directory), options=options,
                                          item_handlers=handlers)
    self._pending_step: int | None = None   # the step of the save that may still be writing
    # (step, problem) of the damaged steps the last restore passed over, newest first.
    self.skipped: list[tuple[int, str]] = []

  # --------------------------------------------------------------------------------- queries
  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def _step_dir(self, step: int) -> epath.Path:
    return epath.Path(self.directory) / str(step)

  # ------------------------------------------------------------------------------- save
  def save(self, step: int, state: Any, data_position: dict[str, Any],
           metadata: dict[str, Any], force: bool = True) -> bool:
    """Starts an (async) save of `state` at `step`; returns whether a save was started.

    A failed earlier save is raised here, as a `CheckpointError` naming its step."""
    self.wait_until_finished()
    quiet_aborted_reads()
    tree = _state_dict(state)
    args = ocp.args.Composite(
        state=ocp.args.PyTreeSave(tree), data=ocp.args.JsonSave(data_position),
        meta=ocp.args.JsonSave(metadata),
        checksums=ocp.args.JsonSave(checksum_record(tree, data_position, metadata)))
    try:
      started = bool(self._manager.save(int(step), args=args, force=force))
    except Exception as e:  # pylint: disable=broad-except
      raise self._write_error(e, int(step)) from (None if is_no_space(e) else e)
    if started:
      self._pending_step = int(step)
    return started

  def delete(self, step: int) -> None:
    """Removes a committed step (waiting for a save in flight first)."""
    self.wait_until_finished()
    self._manager.delete(int(step))

  def prepare(self, state: Any) -> None:
    """Compiles what a save of `state` runs on the devices (its fingerprints) now, before
    training, instead of at the first save (`checkpoint_fingerprints.compile_ahead`)."""
    compile_ahead(_state_dict(state))

  def wait_until_finished(self) -> None:
    """Waits for the save in flight; raises a `CheckpointError` naming its step if it failed."""
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._write_error(e, self._pending_step) from (None if is_no_space(e) else e)
    self._pending_step = None

  def close(self) -> None:
    try:
      self.wait_until_finished()
    except CheckpointError:
      try:
        self._manager.close()
      except Exception:  # pylint: disable=broad-except  # the same failure, raised again
        pass
      raise
    self._manager.close()

  def _committed_steps(self) -> list[int]:
    try:
      self._manager.reload()
    except Exception:  # pylint: disable=broad-except
      pass
    return self.all_steps()

  def _write_error(self, exc: BaseException, step: int | None) -> CheckpointError:
    """One line for a save that failed: which step, why, and the last complete one."""
    quiet_aborted_reads()
    if step is not None and jax.process_index() == 0:
      for tmp in epath.Path(self.directory).glob(f"{step}.orbax-checkpoint-tmp*"):
        try:  # what was written of it is of no use, and the disk may be full
          tmp.rmtree()
        except OSError:
          pass
    complete = [s for s in self._committed_steps() if s != step]
    last = (f"the last complete one is step {max(complete)}" if complete
            else "no complete checkpoint exists")
    which = f"checkpoint step {step}" if step is not None else "a checkpoint"
    if is_no_space(exc):
      return CheckpointError(f"no space left on {self.directory}: {which} not written; {last}. "
                             "Free space there (or give another workdir) and run again.")
    return CheckpointError(f"{which} could not be written to {self.directory} "
                           f"({explain(exc, str(self._step_dir(step or 0)))}); {last}.")

  # ------------------------------------------------------------------------ checks on read
  def _stored_shapes(self, step: int) -> dict[str, tuple[int, ...]]:
    try:
      stored = self._manager.item_metadata(step)["state"]
    except Exception as e:  # pylint: disable=broad-except
      raise Damaged(f"state/ cannot be read: {explain(e, str(self._step_dir(step)))}") from None
    if stored is None:
      raise Damaged("state/_METADATA cannot be read")
    return flat_shapes(getattr(stored, "tree", stored))

  def _read_json_files(self, step: int, items: tuple[str, ...]) -> dict[str, Any]:
    """Checks that the step's JSON files are there and parse; returns the checksum record
    (None for a checkpoint written before checksums were)."""
    step_dir = self._step_dir(step)
    if not step_dir.exists():
      raise Damaged(f"{step_dir} is gone")
    names = [("state/_METADATA", True), ("state/_sharding", False)] if "state" in items else []
    names += [(f"{item}/metadata", True) for item in items if item != "state"]
    has_checksums = (step_dir / "checksums").exists() or self._recorded_checksums(step_dir)
    if has_checksums:
      names.append(("checksums/metadata", True))
    parsed = {}
    for name, required in names:
      path = step_dir / name
      if not path.exists():
        if required:
          raise Damaged(f"{name} is missing" if (step_dir / name.split("/")[0]).exists()
                         else f"{name.split('/')[0]}/ is missing")
        continue
      try:
        parsed[name] = json.loads(path.read_bytes().decode("utf-8"))
      except (UnicodeDecodeError, ValueError) as e:
        raise Damaged(f"{name} is not valid JSON ({one_line(str(e), 100)})") from None
    record = parsed.get("checksums/metadata")
    if has_checksums and not (isinstance(record, dict) and isinstance(record.get("leaves"), dict)
                              and record.get("format") == CHECKSUMS_FORMAT):
      raise Damaged("checksums/metadata is not a checksum record")
    return record

  @staticmethod
  def _recorded_checksums(step_dir: epath.Path) -> bool:
    """Whether Orbax's step metadata lists a `checksums` item (so its absence is damage)."""
    try:
      info = json.loads((step_dir / "_CHECKPOINT_METADATA").read_text())
      return "checksums" in (info.get("item_handlers") or {})
    except (OSError, ValueError, AttributeError):
      return False

  @staticmethod
  def _check_recorded_shapes(record: dict[str, Any] | None,
                             stored_shapes: dict[str, tuple[int, ...]]) -> None:
    """The stored tree (state/_METADATA) must be the one whose checksums were recorded: a
    damaged _METADATA otherwise passes for another model's checkpoint."""
    if record is None:
      return
    recorded = {n: tuple(v.get("shape", ())) for n, v in record["leaves"].items()}
    differ = [n for n in sorted(set(recorded) | set(stored_shapes))
              if recorded.get(n) != stored_shapes.get(n)]
    if differ:
      first = differ[0]
      raise Damaged(f"state/_METADATA disagrees with the shapes recorded at save "
                     f"({len(differ)} arrays, e.g. {first}: {stored_shapes.get(first, 'absent')} "
                     f"vs recorded {recorded.get(first, 'absent')})")

  @staticmethod
  def _verify(record: dict[str, Any] | None, arrays: dict[str, Any],
              items: dict[str, Any]) -> None:
    """Compares what was read with the checksums recorded at save."""
    if record is None:
      return
    leaves = record["leaves"]
    unrecorded = sorted(set(arrays) - set(leaves))
    if unrecorded:
      raise Damaged(f"checksums/metadata has no entry for {unrecorded[0]}")
    checked = {n: a for n, a in arrays.items()
               if leaves[n].get("fingerprint")
               and leaves[n].get("dtype") == str(np.dtype(a.dtype))}
    read = fingerprints(checked)
    bad = [n for n in checked if read.get(n) != leaves[n]["fingerprint"]]
    if bad:
      more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
      raise Damaged(f"array {bad[0]}{more} differs from what was saved (fingerprint "
                     f"{read.get(bad[0])}, saved {leaves[bad[0]]['fingerprint']}): its data "
                     "under state/ is damaged")
    for item, value in items.items():
      if record.get(item) is not None and json_digest(value) != record[item]:
        raise Damaged(f"{item}/metadata differs from what was saved (digest "
                       f"{json_digest(value)}, saved {record[item]})")

  # ---------------------------------------------------------------------------- restore
  def _attempt(self, step: int, read: Callable[[int], Any]) -> Any:
    """`read(step)`, with damage (whatever the reason) as `Damaged`, agreed on by every
    process; another model's checkpoint (ValueError from the shape check) passes through."""
    quiet_aborted_reads()
    problem = None
    try:
      result = read(step)
    except Damaged as d:
      problem = d.problem
    except NotDamage:
      raise
    except Exception as e:  # pylint: disable=broad-except  # Orbax/TensorStore read errors
      problem = explain(e, str(self._step_dir(step)))
    if not _all_agree(problem is None):
      raise Damaged(problem or "damaged as read on another process")
    return result

  def _first_good(self, step: int | None, read: Callable[[int], Any],
                  set_aside: bool = False) -> Any:
    """`read` of `step`, or (None) of the newest step that is not damaged."""
    try:
      return self._first_good_or_not_damage(step, read, set_aside)
    except NotDamage as e:
      raise e.error from None

  def _first_good_or_not_damage(self, step: int | None, read: Callable[[int], Any],
                                set_aside: bool) -> Any:
    self.skipped = []
    if step is not None:
      try:
        return self._attempt(step, read)
      except Damaged as d:
        raise CheckpointError(f"Checkpoint {self.directory} step {step} is damaged: "
                              f"{d.problem}.") from None
    steps = sorted(self.all_steps(), reverse=True)
    if not steps:
      raise FileNotFoundError(f"No checkpoint in {self.directory}.")
    for i, candidate in enumerate(steps):
      try:
        result = self._attempt(candidate, read)
      except Damaged as d:
        self.skipped.append((candidate, d.problem))
        then = (f"trying step {steps[i + 1]}" if i + 1 < len(steps)
                else "no older step to try")
        logging.warning("Checkpoint %s step %d is damaged: %s; %s.", self.directory,
                        candidate, d.problem, then)
        continue
      if self.skipped:
        moved = self._set_aside([s for s, _ in self.skipped]) if set_aside else []
        logging.warning("Restored step %d of %s instead of the damaged step%s %s%s.",
                        candidate, self.directory, "s" if len(self.skipped) > 1 else "",
                        ", ".join(str(s) for s, _ in self.skipped),
                        f" (set aside as {', '.join(moved)})" if moved else "")
      return result
    raise CheckpointError(
        f"No checkpoint in {self.directory} can be restored: "
        + "; ".join(f"step {s}: {p}" for s, p in self.skipped)
        + ". Restore the directory from a copy, or move it away to start afresh.")

  def _set_aside(self, steps: list[int]) -> list[str]:
    """Renames damaged steps to `<step>.damaged-<time>` (not a step name to Orbax), so that
    the run can save those steps again and nothing is deleted."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    names = [f"{s}.damaged-{stamp}" for s in steps]
    if jax.process_index() == 0:
      for s, name in zip(steps, names):
        try:
          self._step_dir(s).rename(epath.Path(self.directory) / name)
        except Exception as e:  # pylint: disable=broad-except
          raise CheckpointError(
              f"Checkpoint {self.directory} step {s} is damaged and could not be moved aside "
              f"({one_line(str(e), 120)}): move or delete {self._step_dir(s)} and run "
              "again.") from None
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices("bert_jax:set_aside_damaged_checkpoints")
    self._manager.reload()
    return names

  def restore_metadata(self, step: int | None = None) -> dict[str, Any]:
    """The `meta` item of `step` (default: the newest step whose `meta` is intact)."""

    def read(s: int):
      record = self._read_json_files(s, ("meta",))
      meta = dict(self._manager.restore(s, args=ocp.args.Composite(
          meta=ocp.args.JsonRestore()))["meta"])
      self._verify(record, {}, {"meta": meta})
      return meta

    return self._first_good(step, read)

  def load_params(self, step: int | None = None, subtree: str = "params",
                  shardings: Any = None) -> tuple[Any, dict[str, Any]]:
    """See the module function `load_params`."""
    keys = subtree.split("/")

    def read(s: int):
      record = self._read_json_files(s, ("state", "meta"))
      try:
        stored = self._manager.item_metadata(s)["state"]
      except Exception as e:  # pylint: disable=broad-except
        raise Damaged(f"state/ cannot be read: {explain(e, str(self._step_dir(s)))}") from None
      node = getattr(stored, "tree", stored)
      self._check_recorded_shapes(record, flat_shapes(node))
      for key in keys:
        if not isinstance(node, dict) or key not in node:
          raise NotDamage(KeyError(
              f"{self.directory} step {s}: no '{subtree}' in the checkpoint (has "
              f"{sorted(node) if isinstance(node, dict) else type(node)})."))
        node = node[key]
      device = jax.local_devices()[0]
      leaf_shardings = shardings
      if leaf_shardings is None:
        leaf_shardings = jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(device), node)
      target = jax.tree.map(
          lambda m, sh: jax.ShapeDtypeStruct(tuple(m.shape), np.dtype(m.dtype), sharding=sh),
          node, leaf_shardings)
      for key in reversed(keys):
        target = {key: target}
      restored = self._manager.restore(s, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(
              item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
              partial_restore=True),
          meta=ocp.args.JsonRestore()))
      tree = restored["state"]
      for key in keys:
        tree = tree[key]
      meta = dict(restored["meta"])
      self._verify(record, flat_leaves(tree, subtree), {"meta": meta})
      return tree, dict(meta, step=s)

    return self._first_good(step, read)


def load_params(directory: str, step: int | None = None, subtree: str = "params",
                shardings: Any = None) -> tuple[Any, dict[str, Any]]:
  """Only the parameters (default) — or a part such as `params/bert`, the encoder for
  fine-tuning — of a checkpoint, without reading the optimizer state; checked against the
  checksums written at save (a damaged newest step falls back to the one before, with a
  warning).

  Returns `(tree, metadata)`, the metadata with the `step` that was read. Without
  `shardings`, arrays land on the first local device.
  """
  manager = CheckpointStore(directory, max_to_keep=None, async_save=False)
  try:
    return manager.load_params(step, subtree, shardings)
  finally:
    manager.close()
