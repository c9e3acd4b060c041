"""The worker processes of a data preparation run: each dies with the command that started it
(even after `kill -9`), keeps freed memory for reuse, and reports its progress through a queue
to the bars of the command (`Progress`); `run_tasks` runs tasks in the pool, or in this process
without one, failing fast on a worker's error."""

from __future__ import annotations

import ctypes
import os
import queue as queue_lib
import signal
import threading
import time
from typing import Any, Callable

# The queue of this worker process's progress reports (set by `init_worker`, or by `run_tasks`
# for tasks run in-process); None: reports go nowhere.
_PROGRESS_QUEUE = None




def init_worker(progress_queue, parent_pid: int) -> None:
  global _PROGRESS_QUEUE
  die_with_parent(parent_pid)
  _PROGRESS_QUEUE = progress_queue
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per worker
  keep_freed_memory()


def die_with_parent(parent_pid: int) -> None:
  """Ends this worker when the command that started it dies, even by `kill -9` (which gives the
  pool no chance to stop its workers): on Linux the kernel sends SIGKILL (PR_SET_PDEATHSIG),
  elsewhere a thread watches the parent process id."""
  try:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1  # from <sys/prctl.h>
    watched = libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) == 0
  except (OSError, AttributeError):
    watched = False
  if os.getppid() != parent_pid:  # the parent died before the line above took effect
    os._exit(1)  # pylint: disable=protected-access
  if watched:
    return

  def watch():
    while os.getppid() == parent_pid:
      time.sleep(1.0)
    os._exit(1)  # pylint: disable=protected-access

  threading.Thread(target=watch, daemon=True, name="watch-parent").start()


def keep_freed_memory() -> None:
  """Has glibc keep freed memory for reuse instead of handing it back to the kernel at once.

  Every step of 2048 instances allocates and frees the same large numpy temporaries (several
  MB each); by default glibc unmaps them, and the kernel then zero-fills fresh pages for the next
  step: on the benchmark that was about 0.2 s of system time in a run of about 2.4 s CPU. The
  largest step still bounds the memory, so the peak stays what it was. Done in this program's
  own processes only (the command line and its workers); a no-op without glibc.
  """
  try:
    libc = ctypes.CDLL("libc.so.6")
  except OSError:
    return
  m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt parameters, from <malloc.h>
  libc.mallopt(m_mmap_threshold, 1 << 26)
  libc.mallopt(m_trim_threshold, 1 << 28)


def report(kind: str, amount: float) -> None:
  if _PROGRESS_QUEUE is not None:
    _PROGRESS_QUEUE.put((kind, amount))


class Progress:
  """A tqdm bar fed from worker processes through a queue (or directly, in-process)."""

  def __init__(self, enabled: bool, total: float, description: str, unit: str = "B"):
    self.bar = None
    if enabled:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      self.bar = tqdm(total=total, desc=description, unit=unit, unit_scale=True,
                      dynamic_ncols=True, smoothing=0.1)

  def update(self, amount: float) -> None:
    if self.bar is not None:
      self.bar.update(amount)

  def set_postfix(self, text: str) -> None:
    if self.bar is not None:
      self.bar.set_postfix_str(text)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def run_tasks(function, tasks: list[dict], pool, progress_queue, progress: Progress,
               on_result: Callable[[dict, Any], None]) -> None:
  """Runs tasks in the pool (or here, without one), feeding progress, failing fast."""
  global _PROGRESS_QUEUE
  if pool is None:

    class _Direct:  # in-process: progress goes straight to the bar
      put = staticmethod(lambda item: progress.update(item[1]))

    _PROGRESS_QUEUE = _Direct()
    try:
      for task in tasks:
        on_result(task, function(task))
    finally:
      _PROGRESS_QUEUE = None
    return
  pending = {id(task): (task, pool.apply_async(function, (task,))) for task in tasks}
  while pending:
    try:
      while True:
        progress.update(progress_queue.get(timeout=0.2)[1])
    except queue_lib.Empty:
      pass
    for key, (task, result) in list(pending.items()):
      if result.ready():
        on_result(task, result.get())  # re-raises a worker's error here
        del pending[key]
  try:
    while True:
      progress.update(progress_queue.get_nowait()[1])
  except queue_lib.Empty:
    pass
