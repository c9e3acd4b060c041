"""One run per workdir: `<workdir>/.lock` names the run that writes there.

Two runs writing one workdir interleave their metrics rows, wait on each other's checkpoint
saves, and replace each other's checkpoints (a second run with another learning rate once
silently did). So a pre-training or fine-tuning run takes the workdir with `hold(workdir)`
first, and a second run is refused with one line naming the first (host, pid, start time).

The lock file is JSON: host, pid, the process's start time as the kernel counts it (so a
recycled pid is not taken for the run), boot id, wall-clock start, command line, and a
random token that tells our own lock from one that replaced it. While held, a background
thread touches the file every `heartbeat_s` seconds.

A lock is stale, and taken over with a warning, when its run is certainly gone:
- same host: its pid is not running (a `kill -9`, a crash, an OOM kill), or runs another
  process than the one that wrote the lock, or the machine rebooted since;
- another host: it has not been touched for `stale_after_s` (a preempted or deleted VM cannot
  release its lock; its successor resumes after that long).

Local paths are created with `os.open(O_CREAT | O_EXCL)`, which is atomic: of two runs
starting together, exactly one creates the file. Taking over a stale lock is serialised by a
second, short-lived exclusive file, so two runs resuming at once do not both win. On `gs://`
and other object stores there is no exclusive create here: the lock is written, then read
back, and the run whose token is read back holds it — best effort, with a window of a few
hundred milliseconds in which two runs starting at the same moment could both proceed.

In a multi-host run only process 0 takes the lock (so take it after `jax.distributed` is
initialised); the other processes share its workdir. Holding is re-entrant within a process
(a run function called from another that holds it).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import inspect
import json
import os
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable, Iterator

from absl import logging

from bert_jax import file_io

LOCK_NAME = ".lock"
_HEARTBEAT_S = 60.0
_STALE_AFTER_S = 900.0

_held: dict[str, int] = {}   # lock path -> nesting depth, for this process
_held_guard = threading.Lock()


class WorkdirInUseError(RuntimeError):
  """Another run holds the workdir; the message names it and how to proceed."""


def _proc_start(pid: int) -> int | None:
  """The process's start time in clock ticks since boot (Linux), to tell a recycled pid."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      stat = f.read().decode("ascii", "replace")
    return int(stat.rsplit(")", 1)[1].split()[19])
  except (OSError, ValueError, IndexError):
    return None


def _boot_id() -> str | None:
  try:
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
      return f.read().strip()
  except OSError:
    return None


def _record() -> dict[str, Any]:
  now = time.time()
  return {"host": socket.gethostname(), "pid": os.getpid(), "proc_start": _proc_start(os.getpid()),
          "boot_id": _boot_id(),
          "started": datetime.datetime.fromtimestamp(now).isoformat(timespec="seconds"),
          "started_unix": now, "command": " ".join(sys.argv)[:500], "token": uuid.uuid4().hex}


def _describe(holder: dict[str, Any]) -> str:
  return (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started "
          f"{holder.get('started', '?')}")


def _mtime(path: str) -> float | None:
  if file_io.is_remote(path):
    try:
      stat = file_io.tensorflow().io.gfile.stat(path)
      return stat.mtime_nsec / 1e9
    except Exception:  # pylint: disable=broad-except
      return None
  try:
    return os.path.getmtime(path)
  except OSError:
    return None


def _read(path: str) -> tuple[bytes | None, dict[str, Any] | None]:
  """The lock's bytes (None: no lock) and its record (None: unreadable)."""
  try:
    raw = file_io.read_bytes(path)
  except FileNotFoundError:
    return None, None
  except Exception:  # pylint: disable=broad-except  # gfile's NotFoundError and the like
    if not file_io.exists(path):
      return None, None
    raise
  try:
    holder = json.loads(raw.decode("utf-8"))
    return raw, holder if isinstance(holder, dict) else None
  except (UnicodeDecodeError, ValueError):
    return raw, None


def _why_stale(path: str, holder: dict[str, Any] | None, stale_after_s: float) -> str | None:
  """Why the run that wrote `holder` is certainly gone, or None if it may be running."""
  age = time.time() - (_mtime(path) or time.time())
  if holder is None:
    # Being written right now, or garbage left by a crash; a writer takes milliseconds.
    return f"unreadable and untouched for {age:.0f}s" if age > 10 else None
  same_host = holder.get("host") == socket.gethostname()
  if same_host:
    if holder.get("boot_id") and _boot_id() and holder["boot_id"] != _boot_id():
      return "the machine has rebooted since"
    pid = holder.get("pid")
    if not isinstance(pid, int) or not file_io.pid_alive(pid):
      return f"pid {pid} is no longer running"
    recorded, current = holder.get("proc_start"), _proc_start(pid)
    if recorded is not None and current is not None and recorded != current:
      return f"pid {pid} is now another process"
    return None
  if age > stale_after_s:
    return f"not touched for {age / 60:.0f} minutes"
  return None


def _refuse(workdir: str, path: str, holder: dict[str, Any] | None) -> WorkdirInUseError:
  who = _describe(holder) if holder else "a run whose lock is being written"
  return WorkdirInUseError(
      f"{workdir} is in use by another run ({who}; lock {path}): wait for it to finish or "
      f"stop it, or use another workdir; if that run is gone, delete {path}.")


def _create_exclusive(path: str, data: bytes) -> bool:
  try:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
  except FileExistsError:
    return False
  try:
    os.write(fd, data)
    os.fsync(fd)
  finally:
    os.close(fd)
  return True


def _take_over_local(path: str, stale_raw: bytes) -> None:
  """Removes the stale lock `stale_raw`, unless it changed meanwhile (then another run got
  there first, and the caller's next exclusive create tells)."""
  guard = path + ".takeover"
  for _ in range(100):
    if _create_exclusive(guard, str(os.getpid()).encode()):
      break
    guard_age = time.time() - (_mtime(guard) or time.time())
    if guard_age > 30:  # left by a run killed in the middle of a takeover
      with contextlib.suppress(FileNotFoundError):
        os.remove(guard)
    time.sleep(0.05)
  else:
    return
  try:
    raw, _ = _read(path)
    if raw == stale_raw:
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.remove(guard)


def _acquire(workdir: str, path: str, stale_after_s: float) -> dict[str, Any]:
  record = _record()
  data = (json.dumps(record, indent=1) + "\n").encode("utf-8")
  remote = file_io.is_remote(path)
  for _ in range(20):
    if remote:
      raw, holder = _read(path)
      if raw is None:
        file_io.write_bytes_atomic(path, data)
        time.sleep(0.5)  # let a racing writer's object land before reading back
        _, holder = _read(path)
        if holder and holder.get("token") == record["token"]:
          return record
        raise _refuse(workdir, path, holder)
    else:
      if _create_exclusive(path, data):
        return record
      raw, holder = _read(path)
      if raw is None:
        continue  # released in between: try again
    why = _why_stale(path, holder, stale_after_s)
    if why is None:
      if holder is None:
        time.sleep(0.2)  # being written: read it again
        continue
      raise _refuse(workdir, path, holder)
    logging.warning("Taking over the lock %s of a run that is gone (%s; %s).", path,
                    _describe(holder) if holder else "unreadable lock", why)
    if remote:
      file_io.remove(path)
    else:
      _take_over_local(path, raw)
  raise WorkdirInUseError(f"Could not take the lock {path} of {workdir} (it keeps changing): "
                          "another run is starting there; use another workdir.")


class _Heartbeat(threading.Thread):
  """Touches the lock now and then, so that a run on another host can tell it is alive."""

  def __init__(self, path: str, interval_s: float):
    super().__init__(name="workdir-lock-heartbeat", daemon=True)
    self.path, self.interval_s = path, interval_s
    self.stop = threading.Event()

  def run(self):
    while not self.stop.wait(self.interval_s):
      try:
        if file_io.is_remote(self.path):
          raw, _ = _read(self.path)
          if raw is not None:
            file_io.write_bytes_atomic(self.path, raw)
        else:
          os.utime(self.path)
      except Exception:  # pylint: disable=broad-except  # a missed beat is not fatal
        pass


def _release(path: str, record: dict[str, Any]) -> None:
  try:
    _, holder = _read(path)
    if holder is not None and holder.get("token") == record["token"]:
      file_io.remove(path)
    else:
      logging.warning("Lock %s is no longer this run's (%s); leaving it.", path,
                      _describe(holder) if holder else "gone or unreadable")
  except Exception as e:  # pylint: disable=broad-except  # never hide the run's own outcome
    logging.warning("Could not release the lock %s: %s", path, e)


def _process_index() -> int:
  if "jax" not in sys.modules:
    return 0
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index()


@contextlib.contextmanager
def hold(workdir: str, *, process_index: int | None = None,
         heartbeat_s: float = _HEARTBEAT_S,
         stale_after_s: float = _STALE_AFTER_S) -> Iterator[dict[str, Any] | None]:
  """Holds `<workdir>/.lock` for the duration of the block; raises `WorkdirInUseError` (one
  line naming the other run's host and pid) when another live run holds it. Yields the lock
  record (None on processes other than 0, and when this process already holds it)."""
  index = _process_index() if process_index is None else process_index
  if index != 0:
    yield None
    return
  workdir = str(workdir)
  if not file_io.is_remote(workdir):
    workdir = os.path.abspath(workdir)
  path = file_io.join(workdir, LOCK_NAME)
  with _held_guard:
    nested = path in _held
    if nested:
      _held[path] += 1
  if nested:
    try:
      yield None
    finally:
      with _held_guard:
        _held[path] -= 1
    return
  file_io.makedirs(workdir)
  record = _acquire(workdir, path, stale_after_s)
  with _held_guard:
    _held[path] = 1
  heartbeat = _Heartbeat(path, heartbeat_s)
  heartbeat.start()
  try:
    yield record
  finally:
    heartbeat.stop.set()
    with _held_guard:
      del _held[path]
    _release(path, record)


def holding(workdir_arg: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
  """Decorator: the function runs holding the lock of its argument named `workdir_arg`, or of
  a field of one (`"config.output_dir"`).

      @workdir_lock.holding("workdir")
      def train_and_evaluate(config, workdir): ...
  """
  arg, _, field = workdir_arg.partition(".")

  def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
      workdir = signature.bind(*args, **kwargs).arguments[arg]
      if field:
        workdir = workdir[field]
      with hold(workdir):
        return fn(*args, **kwargs)
    return wrapper
  return decorate
