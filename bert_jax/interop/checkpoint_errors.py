"""The errors of checkpoint writes and reads, and what a user sees of them: one line each.

A storage failure reaches us wrapped by Orbax, TensorStore and asyncio, often several errors
deep and hundreds of lines long. Here a full disk (or quota, or file size limit) is told from
other failures by errno or by the text TensorStore gives it, a failed read is reduced to the
array and chunk it names, and a write failure surfaces, at the next save or wait, as one
`CheckpointError` naming the step that was not written and the last complete one. The echoes of
an aborted save or restore (Orbax's logged tracebacks, unawaited coroutines, background threads
calling into a closed event loop) are kept out of the output by logging filters and by hooks
around the process-wide `sys.unraisablehook` and `threading.excepthook`, which pass anything
else on.

`Damaged` and `NotDamage` are how one step's read reports to the fallback over steps
(`interop/checkpoint_store.py`): damage that an older step may not have, or an error no older
step cures.
"""

from __future__ import annotations

import errno
import logging as std_logging
import os
import re
import sys
import threading
import warnings
from typing import Any


class CheckpointError(RuntimeError):
  """A checkpoint that cannot be written or read back; the message names the directory, the
  step, the file or array, and what to do."""


class Damaged(Exception):
  """One step's problem, for the fallback to the step before it."""

  def __init__(self, problem: str):
    super().__init__(problem)
    self.problem = problem


class NotDamage(Exception):
  """An error that no older step would cure (another model's checkpoint, a subtree it does
  not have): raised as it is, without a fallback."""

  def __init__(self, error: Exception):
    super().__init__(str(error))
    self.error = error


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


def is_no_space(exc: BaseException) -> bool:
  return any((isinstance(e, OSError) and e.errno in _NO_SPACE_ERRNOS)
             or _NO_SPACE_TEXT.search(str(e)) for e in _chain(exc))


def one_line(text: str, limit: int = 240) -> str:
  text = re.split(r"\[tensorstore_spec|See full TensorStore details", text)[0]
  text = " ".join(text.split()).rstrip(" .;:")
  return text if len(text) <= limit else text[:limit - 3] + "..."


def explain(exc: BaseException, step_dir: str) -> str:
  """What a failed Orbax/TensorStore read says, in one line: the array and the reason when
  TensorStore names them, else the innermost error."""
  for e in reversed(_chain(exc)):
    match = _TENSORSTORE_READ.search(str(e))
    if match:
      leaf, chunk, where, reason = match.groups()
      where = os.path.relpath(where, os.path.dirname(step_dir)) if "://" not in where else where
      reason = one_line(reason.split("[tensorstore_spec")[0], 160) or type(e).__name__
      part = ("its metadata" if chunk in (".zarray", "zarr.json", ".zattrs")
              else f"chunk {chunk or 'all'}")
      return (f"array {leaf.replace('.', '/')} ({part}) cannot be read from "
              f"{where.rstrip('/')}/: {reason}")
  inner = _chain(exc)[-1]
  return f"{type(inner).__name__}: {one_line(str(inner))}"


# --------------------------------------------------------------- quieter failed reads/writes
class _OrbaxTracebacks(std_logging.Filter):
  """Orbax logs a failed background write with its whole traceback (hundreds of lines) before
  the error reaches the caller; the caller's `CheckpointError` says it in one line, so these
  records keep their first line only."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.exc_info and "orbax" in (record.pathname or ""):
      record.msg, record.args = one_line(record.getMessage(), 400), None
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
  # Orbax's frames are told by "orbax" in their file names, so no module of this package has
  # it in its own.
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


def quiet_aborted_reads() -> None:
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
