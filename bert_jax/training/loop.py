"""The one training loop, shared by pre-training and fine-tuning.

Given a train state, the jitted step (`training/step.py`) and a stream of
`(global_batch, data_position)` pairs, it trains up to `until_step` and owns everything around
the steps: progress lines with rate, ETA and MFU; the objective's metrics, averaged exactly from
their sums, to the console, TensorBoard and `metrics.jsonl`; evaluation every
`eval_every_steps`, with model selection by one of its metrics (`training/selection.py`: the
best step kept, early stopping); checkpoints with the data position (so a resumed run reads
exactly the batches an uninterrupted one would); SIGTERM, Ctrl-C and TPU preemption (save, then
stop); and a NaN/inf loss (stop, name the last good checkpoint). What the objective or task is
does not matter here.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import signal
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np

from bert_jax.training import checkpointing, data_position, metrics, perf
from bert_jax.training import selection as selection_lib
from bert_jax.training.objective import Objective
from bert_jax.training.step import STEP_SCALARS


# How many dispatched steps may be ahead of the device. JAX returns from a jitted call before the
# device has run it; a loop that only fetches at log time queues up to `log_every_steps` steps.
# XLA:CPU holds each queued launch in a per-device slot (a semaphore) on its client thread pool,
# whose size is the number of devices: on a mesh of several CPU devices, launches blocked on full
# slots occupied every pool thread while the previous step's all-reduce waited for participants
# that had no thread left to run on, and the process hung. Two steps keep any device fed (the
# next step is dispatched while the current one runs) and bound host memory for queued batches.
MAX_STEPS_IN_FLIGHT = 2


def limit_in_flight(dispatched: Sequence, limit: int = MAX_STEPS_IN_FLIGHT) -> None:
  """Waits until at most `limit` of the `dispatched` outputs (oldest first) are unfinished."""
  if len(dispatched) > limit:
    jax.block_until_ready(dispatched[-1 - limit])


@dataclasses.dataclass
class LoopConfig:
  """When the loop stops, reports, evaluates and saves; what a step holds (for throughput)."""
  until_step: int
  examples_per_step: int           # the global batch
  tokens_per_example: int          # sequence length
  log_every_steps: int = 100
  checkpoint_every_steps: int | None = None   # None: only at the end (and when stopped)
  eval_every_steps: int | None = None         # None: only at the end
  flops_per_step: float | None = None         # analytic, for MFU
  records: str | None = None    # the identity of the records read, saved with the position
  # Longest silence between progress lines: a line with the step, rate and ETA whenever this
  # long has passed since the last one (one process: the others would not print it anyway).
  heartbeat_seconds: float | None = 30.0


@dataclasses.dataclass
class LoopResult:
  state: Any
  step: int
  scalars: dict[str, float]   # the last reported train/perf/eval scalars
  stopped_early: bool         # a stop (SIGTERM, Ctrl-C, preemption) came before until_step
  # Training ended before until_step because the selection's patience ran out (early
  # stopping): the run is complete, unlike one `stopped_early`.
  out_of_patience: bool = False


class StopSignal:
  """Turns SIGTERM (TPU preemption, `kill`, a scheduler) and Ctrl-C (SIGINT) into 'save and
  exit at the next step'. A second Ctrl-C aborts at once, without saving."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.requested = False
    self._previous: dict[int, Any] = {}

  def __enter__(self):
    for signum in self.SIGNALS:
      try:
        self._previous[signum] = signal.signal(signum, self._handle)
      except ValueError:  # not the main thread: no signal handling
        pass
    return self

  def _handle(self, signum, frame):
    del frame
    if signum == signal.SIGINT:
      if self.requested:  # the second Ctrl-C: the user does not want to wait
        raise KeyboardInterrupt
      # os.write, not print: a signal handler may interrupt a print in progress.
      os.write(2, b"\nCtrl-C: saving a checkpoint after this step, then stopping "
                  b"(Ctrl-C again aborts without saving).\n")
    self.requested = True

  def __exit__(self, *exc):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}
    return False


def _any_process(flag: bool) -> bool:
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(np.asarray(multihost_utils.process_allgather(np.asarray([int(flag)]))).any())


def _eval_line(step: int, scalars: dict[str, float]) -> str:
  return f"eval at step {step}: " + ", ".join(
      f"{k.split('/', 1)[1]} {v}" if isinstance(v, int) else f"{k.split('/', 1)[1]} {v:.4f}"
      for k, v in scalars.items())


def train(state: Any, train_step: Callable, batches: Iterator[tuple[dict, dict]], *,
          objective: Objective, config: LoopConfig, writer: metrics.MetricWriter,
          checkpoints: checkpointing.CheckpointManager | None = None,
          metadata: dict[str, Any] | None = None,
          evaluate: Callable[[Any], dict[str, float]] | None = None,
          selection: selection_lib.Selection | None = None,
          clock: Callable[[], float] = time.monotonic) -> LoopResult:
  """Trains from `state.step` to `config.until_step`; see the module docstring.

  `clock` gives the seconds that rates, ETAs and the heartbeat are measured in.

  `evaluate(state)` returns prefixed scalars (`eval/...`); it runs every `eval_every_steps`
  and at the end (also when nothing was left to train). Without `checkpoints` nothing is saved.
  `selection` (restored from the checkpoint the state came from) counts every evaluation and
  ends training early when its patience runs out; its state is saved with each checkpoint.
  """
  start_step = step = int(state.step)
  until = config.until_step
  peak = perf.peak_flops_per_device(jax.devices()[0]) if config.flops_per_step else None
  last: dict[str, float] = {}
  last_good_step = checkpoints.latest_step() if checkpoints is not None else None
  window: list[dict[str, jax.Array]] = []
  window_start, window_first_step = clock(), start_step
  # The last steps' outputs, for `limit_in_flight`; not the logging window, which each report
  # empties: its fetch waits for one device's copy of a replicated metric, so on a mesh a step
  # it fetched may still be running on the other devices.
  in_flight: collections.deque = collections.deque(maxlen=MAX_STEPS_IN_FLIGHT + 1)
  evaluated = False
  stopping = False
  out_of_patience = selection is not None and selection.exhausted
  if out_of_patience:  # a resumed run that had stopped for lack of improvement
    metrics.log(f"Not training: early stopping ended this run at step {step} "
                f"({selection.describe()}).")

  def check_finite(window_metrics, first, last_step):
    losses = [float(m["loss"]) for m in window_metrics]
    bad = [i for i, x in enumerate(losses) if not math.isfinite(x)]
    if bad:
      where = (f"the last good checkpoint is step {last_good_step} in {checkpoints.directory}"
               if checkpoints is not None and last_good_step is not None
               else "no checkpoint was saved")
      if checkpoints is not None:
        checkpoints.wait_until_finished()
      raise FloatingPointError(
          f"Loss became {losses[bad[0]]} at step {first + bad[0] + 1} (steps {first + 1}-"
          f"{last_step}). Training stopped; {where}. Lower the learning rate or check the data, "
          "then restart.")

  def report(fetched):
    elapsed = max(clock() - window_start, 1e-9)
    steps_per_sec = len(fetched) / elapsed
    sums = {k: float(np.sum([m[k] for m in fetched])) for k in fetched[0]
            if k not in STEP_SCALARS}
    scalars = {f"train/{k}": v for k, v in objective.summarize(sums).items()}
    scalars.setdefault("train/loss", float(np.mean([m["loss"] for m in fetched])))
    rows_per_sec = steps_per_sec * config.examples_per_step
    total = lambda name: float(np.sum([m[name] for m in fetched]))
    packed = "sequences" in fetched[0]  # packed rows: several sequences each
    measured = "real_tokens" in fetched[0]  # the rows as they were (trimmed, per ending, ...)
    scalars.update({"train/learning_rate": float(fetched[-1]["learning_rate"]),
                    "train/grad_norm": float(fetched[-1]["grad_norm"]),
                    "perf/steps_per_sec": steps_per_sec,
                    "perf/sequences_per_sec": (total("sequences") / elapsed if packed
                                               else rows_per_sec),
                    "perf/tokens_per_sec": (total("row_tokens") / elapsed if measured else
                                            rows_per_sec * config.tokens_per_example),
                    "perf/eta_seconds": (until - step) / steps_per_sec})
    if packed:
      scalars["perf/rows_per_sec"] = rows_per_sec
    if measured:  # what the rows hold besides padding
      scalars["perf/useful_tokens_per_sec"] = total("real_tokens") / elapsed
      scalars["perf/padding_fraction"] = 1.0 - total("real_tokens") / total("row_tokens")
    if peak:
      scalars["perf/mfu"] = config.flops_per_step * steps_per_sec / (peak * jax.device_count())
    writer.write(step, scalars)
    metrics.log(metrics.console_line(step, until, scalars))
    last.update(scalars)
    heartbeat.update(time=clock(), step=step)

  def beat():
    """A progress line between the logged ones: steps dispatched since the last line, no
    device sync, no metrics row."""
    now = clock()
    rate = (step - heartbeat["step"]) / max(now - heartbeat["time"], 1e-9)
    metrics.log(metrics.console_line(step, until, {"perf/steps_per_sec": rate,
                                                   "perf/eta_seconds": (until - step) /
                                                   max(rate, 1e-9)}))
    heartbeat.update(time=now, step=step)

  def run_evaluation():
    nonlocal evaluated
    scalars = evaluate(state)
    writer.write(step, scalars)
    metrics.log(_eval_line(step, scalars))
    last.update(scalars)
    evaluated = True
    if selection is not None:
      selection.update(step, state, scalars)

  def saved_metadata():
    if selection is None:
      return metadata or {}
    return dict(metadata or {}, **{selection_lib.METADATA_KEY: selection.record()})

  heartbeat = {"time": clock(), "step": start_step}
  if checkpoints is not None and step < until:
    checkpoints.prepare(state)  # a save's device program compiled now, not at the first save
  with StopSignal() as stop:
    position = None
    compile_start = clock()
    while step < until and not out_of_patience:
      batch, position = next(batches)
      state, step_metrics = train_step(state, batch)
      step += 1
      window.append(step_metrics)
      in_flight.append(step_metrics)
      limit_in_flight(in_flight)
      if step == start_step + 1:
        check_finite([jax.device_get(step_metrics)], start_step, step)
        metrics.log(f"first step (compilation included) took {clock() - compile_start:.1f}s")
        window_start, window_first_step, window = clock(), step, []
        heartbeat.update(time=window_start, step=step)
      is_log = step % config.log_every_steps == 0 or step == until
      if (not is_log and config.heartbeat_seconds and jax.process_count() == 1
          and clock() - heartbeat["time"] >= config.heartbeat_seconds):
        beat()
      is_ckpt = step == until or bool(config.checkpoint_every_steps
                                      and step % config.checkpoint_every_steps == 0)
      is_eval = evaluate is not None and (step == until or bool(
          config.eval_every_steps and step % config.eval_every_steps == 0))
      stopping = _any_process(stop.requested) if (is_log or jax.process_count() == 1) else False
      if checkpoints is not None:
        checkpoints.check_for_errors()  # a failed background save stops the run here
        stopping = stopping or checkpoints.reached_preemption(step)
      if (is_log or is_ckpt or stopping) and window:
        fetched = jax.device_get(window)
        check_finite(fetched, window_first_step, step)
        report(fetched)
        window, window_start, window_first_step = [], clock(), step
      if is_eval:
        run_evaluation()
        if selection is not None and selection.exhausted and step < until:
          out_of_patience = is_ckpt = True
          metrics.log(f"Early stopping at step {step} of {until}: no better "
                      f"{selection.metric} in the last {selection.patience} evaluations "
                      f"({selection.describe()}).")
      if checkpoints is not None and (is_ckpt or stopping):
        checkpoints.save(step, state, data_position.gather_positions(position, config.records),
                         saved_metadata())
        last_good_step = step
      if is_ckpt or is_eval:
        window_start = clock()  # evaluation and saving are not training throughput
        heartbeat.update(time=window_start, step=step)
      if stopping:
        if checkpoints is not None:
          checkpoints.wait_until_finished()
          metrics.log(f"Stop requested: saved step {step} to {checkpoints.directory}; run the "
                      "same command again to resume.")
        break
  if evaluate is not None and not evaluated:  # nothing left to train: report where it is
    run_evaluation()
  if checkpoints is not None:
    checkpoints.wait_until_finished()
  last["step"] = step
  return LoopResult(state, step, last, stopped_early=stopping and step < until,
                    out_of_patience=out_of_patience)
