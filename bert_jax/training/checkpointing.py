"""Orbax checkpoints of the train state, the data position and the run's metadata.

A checkpoint step directory holds four items: `state` (parameters, optimizer state, step, RNG
— sharded arrays written by every host in parallel), `data` (the input pipeline's position, so
a resumed run reads exactly the batches an uninterrupted one would), `meta` (the model config,
for checks and for loading the encoder elsewhere) and `checksums` (what was saved, to check
what is read back). Orbax writes a step under a temporary name and commits it only when every
item is complete, so an interrupted save never looks like a checkpoint. Saves are
asynchronous: training continues while arrays are written.

Restoring takes an abstract state (ShapeDtypeStructs with shardings), so a checkpoint written
on one mesh restores onto any other. Before reading any array the stored shapes are compared
with the model's and every mismatch is listed (another model's checkpoint: an error, no
fallback).

Damage. A committed step can still be damaged afterwards (a disk error, a partial copy, a bit
flip on the way to a bucket), and compressed array data does not always fail to decode: it can
decode into other numbers. So every save records, per array, a fingerprint of its exact bits
(`fingerprints`: two 32-bit sums of a mixing hash of each element's bits and its position,
computed on the devices where the arrays live, so nothing is gathered to a host and the result
does not depend on the mesh), and digests of the `data` and `meta` items. A restore checks the
JSON files, that the stored shapes agree with those recorded, and the fingerprints of what it
read. A step that fails any of this is damaged: the newest steps are tried in turn, each
damaged one named (file or array) in a warning, and a run resuming from an older step sets the
damaged ones aside (`<step>.damaged-<time>`) so that it can save those steps again. Only when
no step restores is it an error, which lists every step's problem.

Write failures (a full disk above all) surface, at the next save or wait, as one
`CheckpointError` naming the step that was not written and the last complete one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging as std_logging
import os
import re
import sys
import threading
import time
import warnings
from typing import Any, Callable

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

CHECKSUMS_FORMAT = 1
_ITEMS = ("state", "data", "meta", "checksums")


class CheckpointError(RuntimeError):
  """A checkpoint that cannot be written or read back; the message names the directory, the
  step, the file or array, and what to do."""


class _Damaged(Exception):
  """One step's problem, for the fallback to the step before it."""

  def __init__(self, problem: str):
    super().__init__(problem)
    self.problem = problem


class _NotDamage(Exception):
  """An error that no older step would cure (another model's checkpoint, a subtree it does
  not have): raised as it is, without a fallback."""

  def __init__(self, error: Exception):
    super().__init__(str(error))
    self.error = error


def _state_dict(tree: Any) -> Any:
  return flax.serialization.to_state_dict(tree)


def _key_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def _flat_leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    name = _key_name(path)
    out["/".join(p for p in (prefix, name) if p)] = leaf
  return out


def _flat_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  return {name: tuple(getattr(leaf, "shape", ()))
          for name, leaf in _flat_leaves(tree).items()}


# ----------------------------------------------------------------------------- fingerprints
_SEEDS = (0x243F6A88, 0x85A308D3)


def _mix(h):
  """murmur3's 32-bit finaliser: a bijection, so a changed input always changes the output."""
  h = h ^ (h >> 16)
  h = h * np.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * np.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _words(x):
  """The bits of `x` as uint32 words (narrower types widened, 64-bit ones split in two)."""
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
  return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _leaf_fingerprint(x):
  words = _words(x)
  position = jnp.zeros(words.shape, jnp.uint32)
  stride = 1
  for dim in reversed(range(words.ndim)):
    position = position + (jax.lax.broadcasted_iota(jnp.uint32, words.shape, dim)
                           * np.uint32(stride % 2**32))
    stride *= words.shape[dim]
  # Sums modulo 2**32 are exact and do not depend on the order of the reduction, hence not on
  # the mesh; each element's term is a bijection of its bits, so changing any one element
  # always changes both sums, and changing several goes unseen with odds of 2**-64.
  return jnp.stack([jnp.sum(_mix(words ^ _mix(position ^ np.uint32(seed))), dtype=jnp.uint32)
                    for seed in _SEEDS])


_fingerprint_leaves = jax.jit(lambda leaves: jnp.stack([_leaf_fingerprint(x) for x in leaves]))


def _supported(x) -> bool:
  """Whole-byte numbers and booleans (not 4-bit types; 64-bit ones only where JAX has them)."""
  dtype = np.dtype(x.dtype)
  if dtype == np.bool_:
    return True
  if jnp.issubdtype(dtype, jnp.floating):
    bits = jnp.finfo(dtype).bits
  elif jnp.issubdtype(dtype, jnp.integer):
    bits = jnp.iinfo(dtype).bits
  else:
    return False
  return bits == 8 * dtype.itemsize and (bits <= 32 or jax.config.jax_enable_x64)


def _to_host(x) -> np.ndarray:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(x.addressable_data(0))  # a reduction's result: replicated everywhere
  return np.asarray(x)


def fingerprints(tree: Any, prefix: str = "") -> dict[str, str]:
  """`{leaf name: 16 hex digits}` of every array in `tree`, computed where the arrays are
  (device arrays on their devices; host arrays on the default device). Every process must call
  it for a tree of arrays spread over several processes, as for a save."""
  leaves = {name: leaf for name, leaf in _flat_leaves(tree, prefix).items()
            if hasattr(leaf, "dtype") and hasattr(leaf, "shape") and _supported(leaf)}
  # One computation per set of devices (a mesh's arrays, host arrays on the default device).
  groups: dict[Any, list[str]] = {}
  for name, leaf in leaves.items():
    key = (frozenset(leaf.sharding.device_set) if isinstance(leaf, jax.Array) else None)
    groups.setdefault(key, []).append(name)
  out = {}
  for names in groups.values():
    inputs = [leaves[n] if isinstance(leaves[n], jax.Array) else jnp.asarray(leaves[n])
              for n in names]
    for name, sums in zip(names, _to_host(_fingerprint_leaves(inputs))):
      out[name] = "".join(f"{int(v):08x}" for v in sums)
  return out


def _json_digest(obj: Any) -> str:
  """A digest of `obj` as it reads back from JSON (tuples become lists, and so on)."""
  canonical = json.dumps(json.loads(json.dumps(obj)), sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def checksum_record(state_tree: Any, data_position: Any, metadata: Any) -> dict[str, Any]:
  """The `checksums` item of a save: per array its shape, dtype and fingerprint; digests of
  the `data` and `meta` items."""
  state_tree = jax.tree.map(lambda x: x if hasattr(x, "shape") else np.asarray(x), state_tree)
  prints = fingerprints(state_tree)
  leaves = {}
  for name, leaf in _flat_leaves(state_tree).items():
    leaves[name] = {"shape": list(leaf.shape), "dtype": str(np.dtype(leaf.dtype)),
                    "fingerprint": prints.get(name)}
  return {"format": CHECKSUMS_FORMAT, "leaves": leaves, "data": _json_digest(data_position),
          "meta": _json_digest(metadata)}


# ------------------------------------------------------------------------- error messages
_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
_NO_SPACE_TEXT = re.compile(r"No space left on device|File too large|Disk quota exceeded|"
                            r"os_error_code='(28|27|122)'|\[Errno (28|27|122)\]")
_TENSORSTORE_READ = re.compile(
    r'"([^"]+?)/([^"/]*)" in OCDBT database at [^"]*"([^"]+)":?\s*(.*)', re.S)


def _chain(exc: BaseException) -> list[BaseException]:
  out, seen = [], set()
  while exc is not None and id(exc) not in seen:
    out.append(exc)
    seen.add(id(exc))
    exc = exc.__cause__ or exc.__context__
  return out


def _is_no_space(exc: BaseException) -> bool:
  return any((isinstance(e, OSError) and e.errno in _NO_SPACE_ERRNOS)
             or _NO_SPACE_TEXT.search(str(e)) for e in _chain(exc))


def _one_line(text: str, limit: int = 240) -> str:
  text = re.split(r"\[tensorstore_spec|See full TensorStore details", text)[0]
  text = " ".join(text.split()).rstrip(" .;:")
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _explain(exc: BaseException, step_dir: str) -> str:
  """What a failed Orbax/TensorStore read says, in one line: the array and the reason when
  TensorStore names them, else the innermost error."""
  for e in reversed(_chain(exc)):
    match = _TENSORSTORE_READ.search(str(e))
    if match:
      leaf, chunk, where, reason = match.groups()
      where = os.path.relpath(where, os.path.dirname(step_dir)) if "://" not in where else where
      reason = _one_line(reason.split("[tensorstore_spec")[0], 160) or type(e).__name__
      part = ("its metadata" if chunk in (".zarray", "zarr.json", ".zattrs")
              else f"chunk {chunk or 'all'}")
      return (f"array {leaf.replace('.', '/')} ({part}) cannot be read from "
              f"{where.rstrip('/')}/: {reason}")
  inner = _chain(exc)[-1]
  return f"{type(inner).__name__}: {_one_line(str(inner))}"


# --------------------------------------------------------------- quieter failed reads/writes
class _OrbaxTracebacks(std_logging.Filter):
  """Orbax logs a failed background write with its whole traceback (hundreds of lines) before
  the error reaches the caller; the caller's `CheckpointError` says it in one line, so these
  records keep their first line only."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.exc_info and "orbax" in (record.pathname or ""):
      record.msg, record.args = _one_line(record.getMessage(), 400), None
      record.exc_info, record.exc_text = None, None
    return True


class _NeverRetrieved(std_logging.Filter):
  """After a failed restore, the reads still in flight report their own failures through
  asyncio ('exception was never retrieved'): the same error again, already reported."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return not (exc is not None and "never retrieved" in str(record.msg)
                and _from_orbax(exc))


def _from_orbax(exc: BaseException | None) -> bool:
  tb = getattr(exc, "__traceback__", None)
  while tb is not None:
    if "orbax" in tb.tb_frame.f_code.co_filename:
      return True
    tb = tb.tb_next
  return bool(re.search(r"Encountered error while reading array|in OCDBT database at",
                        str(exc)))


def _is_echo(exc: BaseException | None, obj: Any = None) -> bool:
  code = getattr(obj, "cr_code", None)
  return ((isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc))
          or (code is not None and "orbax" in code.co_filename) or _from_orbax(exc))


def _quiet_unraisable(previous):
  def hook(info):
    if not _is_echo(info.exc_value, info.object):
      previous(info)
  hook.quiet_orbax = True
  return hook


def _quiet_thread_exceptions(previous):
  def hook(args):
    if not _is_echo(args.exc_value):
      previous(args)
  hook.quiet_orbax = True
  return hook


_quiet_lock = threading.Lock()
_filters_installed = False


def _quiet_aborted_reads() -> None:
  """Installs the filters above, and hooks that drop the echoes of an aborted restore or save
  (its coroutines collected unfinished, its threads calling into a closed event loop);
  anything else still reaches the previous hooks. Idempotent; hooks replaced by someone else
  (a test runner) are wrapped again."""
  global _filters_installed
  with _quiet_lock:
    if not _filters_installed:
      _filters_installed = True
      std_logging.getLogger("absl").addFilter(_OrbaxTracebacks())
      std_logging.getLogger("asyncio").addFilter(_NeverRetrieved())
      warnings.filterwarnings(
          "ignore", r"coroutine '(async_serialize|async_deserialize|_read_array)[^']*' was "
          "never awaited", RuntimeWarning)
    if not getattr(sys.unraisablehook, "quiet_orbax", False):
      sys.unraisablehook = _quiet_unraisable(sys.unraisablehook)
    if not getattr(threading.excepthook, "quiet_orbax", False):
      threading.excepthook = _quiet_thread_exceptions(threading.excepthook)


def _all_agree(ok: bool) -> bool:
  """Whether `ok` holds on every process (each reads its own shards, so one host can meet
  damage the others do not)."""
  if jax.process_count() == 1:
    return ok
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(np.asarray(multihost_utils.process_allgather(np.asarray([int(ok)]))).all())


# ------------------------------------------------------------------------------ the manager
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

  def _step_dir(self, step: int) -> epath.Path:
    return epath.Path(self.directory) / str(step)

  # ------------------------------------------------------------------------------- save
  def save(self, step: int, state: Any, data_position: dict[str, Any],
           metadata: dict[str, Any], force: bool = True) -> bool:
    """Starts an (async) save of `state` at `step`; returns whether a save was started.

    A failed earlier save is raised here, as a `CheckpointError` naming its step."""
    self.wait_until_finished()
    _quiet_aborted_reads()
    tree = _state_dict(state)
    args = ocp.args.Composite(
        state=ocp.args.PyTreeSave(tree), data=ocp.args.JsonSave(data_position),
        meta=ocp.args.JsonSave(metadata),
        checksums=ocp.args.JsonSave(checksum_record(tree, data_position, metadata)))
    try:
      started = bool(self._manager.save(int(step), args=args, force=force))
    except Exception as e:  # pylint: disable=broad-except
      raise self._write_error(e, int(step)) from (None if _is_no_space(e) else e)
    if started:
      self._pending_step = int(step)
    return started

  def wait_until_finished(self) -> None:
    """Waits for the save in flight; raises a `CheckpointError` naming its step if it failed."""
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._write_error(e, self._pending_step) from (None if _is_no_space(e) else e)
    self._pending_step = None

  def check_for_errors(self) -> None:
    """Raises the `CheckpointError` of a background save that has failed, without waiting for
    one still writing: cheap enough for every step, so a failed save stops the run soon after,
    not one save later. Single process only: hosts would see a failure at different steps, so
    several learn of it at the next save or wait, which they reach together."""
    if self._pending_step is None or jax.process_count() > 1:
      return
    if not self._manager.is_saving_in_progress():
      self.wait_until_finished()

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
    _quiet_aborted_reads()
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
    if _is_no_space(exc):
      return CheckpointError(f"no space left on {self.directory}: {which} not written; {last}. "
                             "Free space there (or give another workdir) and run again.")
    return CheckpointError(f"{which} could not be written to {self.directory} "
                           f"({_explain(exc, str(self._step_dir(step or 0)))}); {last}.")

  # ------------------------------------------------------------------------ checks on read
  def check_compatible(self, abstract_state: Any, step: int) -> None:
    """Raises a ValueError listing every parameter whose stored shape differs from the model's,
    and any parameter present on only one side."""
    try:
      self._check_shapes(self._stored_shapes(step), abstract_state, step)
    except _NotDamage as e:
      raise e.error from None
    except _Damaged as d:
      raise CheckpointError(f"Checkpoint {self.directory} step {step} is damaged: "
                            f"{d.problem}.") from None

  def _stored_shapes(self, step: int) -> dict[str, tuple[int, ...]]:
    try:
      stored = self._manager.item_metadata(step)["state"]
    except Exception as e:  # pylint: disable=broad-except
      raise _Damaged(f"state/ cannot be read: {_explain(e, str(self._step_dir(step)))}") from None
    if stored is None:
      raise _Damaged("state/_METADATA cannot be read")
    return _flat_shapes(getattr(stored, "tree", stored))

  def _check_shapes(self, stored_shapes: dict[str, tuple[int, ...]], abstract_state: Any,
                    step: int) -> None:
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
      raise _NotDamage(ValueError(
          f"Checkpoint {self.directory} step {step} does not fit this model "
          f"({len(problems)} differences):\n" + "\n".join(shown)))

  def _read_json_files(self, step: int, items: tuple[str, ...]) -> dict[str, Any]:
    """Checks that the step's JSON files are there and parse; returns the checksum record
    (None for a checkpoint written before checksums were)."""
    step_dir = self._step_dir(step)
    if not step_dir.exists():
      raise _Damaged(f"{step_dir} is gone")
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
          raise _Damaged(f"{name} is missing" if (step_dir / name.split("/")[0]).exists()
                         else f"{name.split('/')[0]}/ is missing")
        continue
      try:
        parsed[name] = json.loads(path.read_bytes().decode("utf-8"))
      except (UnicodeDecodeError, ValueError) as e:
        raise _Damaged(f"{name} is not valid JSON ({_one_line(str(e), 100)})") from None
    record = parsed.get("checksums/metadata")
    if has_checksums and not (isinstance(record, dict) and isinstance(record.get("leaves"), dict)
                              and record.get("format") == CHECKSUMS_FORMAT):
      raise _Damaged("checksums/metadata is not a checksum record")
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
      raise _Damaged(f"state/_METADATA disagrees with the shapes recorded at save "
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
      raise _Damaged(f"checksums/metadata has no entry for {unrecorded[0]}")
    checked = {n: a for n, a in arrays.items()
               if leaves[n].get("fingerprint")
               and leaves[n].get("dtype") == str(np.dtype(a.dtype))}
    read = fingerprints(checked)
    bad = [n for n in checked if read.get(n) != leaves[n]["fingerprint"]]
    if bad:
      more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
      raise _Damaged(f"array {bad[0]}{more} differs from what was saved (fingerprint "
                     f"{read.get(bad[0])}, saved {leaves[bad[0]]['fingerprint']}): its data "
                     "under state/ is damaged")
    for item, value in items.items():
      if record.get(item) is not None and _json_digest(value) != record[item]:
        raise _Damaged(f"{item}/metadata differs from what was saved (digest "
                       f"{_json_digest(value)}, saved {record[item]})")

  # ---------------------------------------------------------------------------- restore
  def _attempt(self, step: int, read: Callable[[int], Any]) -> Any:
    """`read(step)`, with damage (whatever the reason) as `_Damaged`, agreed on by every
    process; another model's checkpoint (ValueError from the shape check) passes through."""
    _quiet_aborted_reads()
    problem = None
    try:
      result = read(step)
    except _Damaged as d:
      problem = d.problem
    except _NotDamage:
      raise
    except Exception as e:  # pylint: disable=broad-except  # Orbax/TensorStore read errors
      problem = _explain(e, str(self._step_dir(step)))
    if not _all_agree(problem is None):
      raise _Damaged(problem or "damaged as read on another process")
    return result

  def _first_good(self, step: int | None, read: Callable[[int], Any],
                  set_aside: bool = False) -> Any:
    """`read` of `step`, or (None) of the newest step that is not damaged."""
    try:
      return self._first_good_or_not_damage(step, read, set_aside)
    except _NotDamage as e:
      raise e.error from None

  def _first_good_or_not_damage(self, step: int | None, read: Callable[[int], Any],
                                set_aside: bool) -> Any:
    self.skipped = []
    if step is not None:
      try:
        return self._attempt(step, read)
      except _Damaged as d:
        raise CheckpointError(f"Checkpoint {self.directory} step {step} is damaged: "
                              f"{d.problem}.") from None
    steps = sorted(self.all_steps(), reverse=True)
    if not steps:
      raise FileNotFoundError(f"No checkpoint in {self.directory}.")
    for i, candidate in enumerate(steps):
      try:
        result = self._attempt(candidate, read)
      except _Damaged as d:
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
              f"({_one_line(str(e), 120)}): move or delete {self._step_dir(s)} and run "
              "again.") from None
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices("bert_jax:set_aside_damaged_checkpoints")
    self._manager.reload()
    return names

  def restore(self, abstract_state: Any, step: int | None = None, *,
              set_aside_damaged: bool = False) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """`(state, data_position, metadata)` from `step` (default: the newest step that is not
    damaged), laid out as `abstract_state`'s shardings say, and checked against the checksums
    written at save.

    `set_aside_damaged`: newer damaged steps are renamed aside (what a run resuming here does,
    so that it can save those steps again); `self.skipped` lists them with their problems.
    """
    target = _state_dict(abstract_state)

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
      self._verify(record, _flat_leaves(restored["state"]), {"data": data, "meta": meta})
      if record is None:
        logging.warning("Checkpoint %s step %d has no checksums (written before they were "
                        "recorded): restored unverified.", self.directory, s)
      return s, restored["state"], data, meta

    restored_step, tree, data, meta = self._first_good(step, read, set_aside=set_aside_damaged)
    state = flax.serialization.from_state_dict(abstract_state, tree)
    logging.info("Restored %s step %d.", self.directory, restored_step)
    return state, data, meta

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
        raise _Damaged(f"state/ cannot be read: {_explain(e, str(self._step_dir(s)))}") from None
      node = getattr(stored, "tree", stored)
      self._check_recorded_shapes(record, _flat_shapes(node))
      for key in keys:
        if not isinstance(node, dict) or key not in node:
          raise _NotDamage(KeyError(
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
      self._verify(record, _flat_leaves(tree, subtree), {"meta": meta})
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
  manager = CheckpointManager(directory, max_to_keep=None, async_save=False)
  try:
    return manager.load_params(step, subtree, shardings)
  finally:
    manager.close()


# --------------------------------------------------------------------------- data positions
def gather_positions(position: dict[str, int]) -> dict[str, Any]:
  """Every process's data position, for the checkpoint (hosts read different files, so their
  positions can differ): `[epoch, batch]`, or `[epoch, batch, row]` for a stream that packs
  rows as it reads (`row`: where in that batch of records the next row lies)."""
  local = np.asarray([position.get("epoch", 0), position.get("batch", 0),
                      position.get("row", 0)], np.int64)
  if jax.process_count() == 1:
    gathered = local[None]
  else:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    gathered = np.asarray(multihost_utils.process_allgather(local)).reshape(-1, 3)
  if not gathered[:, 2].any():  # the layout checkpoints of unpacked streams have always had
    gathered = gathered[:, :2]
  return {"per_process": gathered.tolist()}


def own_position(data_state: dict[str, Any]) -> dict[str, int]:
  """This process's position from a checkpoint's `data` item."""
  per_process = data_state.get("per_process") or []
  if len(per_process) != jax.process_count():
    raise ValueError(f"The checkpoint's data position is for {len(per_process)} processes; this "
                     f"run has {jax.process_count()}. Resume with the same number of hosts.")
  epoch, batch, *row = per_process[jax.process_index()]
  return {"epoch": int(epoch), "batch": int(batch), **({"row": int(row[0])} if row else {})}
