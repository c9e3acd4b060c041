"""Fault injection: damaged checkpoints, kill -9, a full disk, two runs on one workdir.

    .venv/bin/python benchmarks/faults.py                  # about 6 minutes on 2 CPU cores
    .venv/bin/python benchmarks/faults.py --append_results # also appends to benchmarks/RESULTS.md

Every trial is a real tiny pre-training run (the `test` model on 8 fake CPU devices, records
written as the tests write them, `tests/pretrain_helpers.py`), with fixed seeds: a rerun
draws the same damages (which file by size rank, which offset, which bit, when to kill).
Orbax writes arrays concurrently, so which arrays share an OCDBT data file, and in what order,
varies from run to run: the same offset can hit another array, or bytes no array reads (then
the step restores bit-identical, which counts as survived). A trial survives when the run says clearly what happened and
trains on nothing but intact data; it is lost otherwise (a crash deep in Orbax, a wrong
diagnosis, silently different numbers, a refusal that is not one line).

- checkpoint damage: a run saved steps 4 and 8; step 8 is damaged (each kind below), then
  restored the way a resuming run restores. Survives when step 8 comes back bit-identical
  (harmless damage), or when a warning names step 8 and the file or array and step 4 comes
  back bit-identical; both steps damaged: one error naming both; another model: the list of
  differences and no fallback. Two kinds also resume training and compare every loss with
  an uninterrupted run.
- kill -9 at a random moment of a run (seeded), then the same command again: the stale lock
  is taken over and every loss after the restart equals the uninterrupted run's, bit for bit.
- disk full: a run whose files may not exceed a size (RLIMIT_FSIZE; writes past it fail with
  EFBIG as they fail with ENOSPC on a full disk): one line naming the step not written and the
  last complete one, which still restores and verifies.
- two runs on one workdir: the second (another learning rate) is refused with one line naming
  the first's host and pid; the first's metrics rows and checkpoints are its own.

It also measures what the checksums cost a save and a restore.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import glob
import io
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np

SEED = 20240611
CHILD_ERROR = 3


# ------------------------------------------------------------------------------ the child
def child(args) -> int:
  """One run, as an entry point runs it (holding the workdir), in its own process."""
  if args.fsize:
    import resource
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize, args.fsize))
  from bert_jax.interop import checkpoint_errors
  from bert_jax.runs import pretraining
  from bert_jax.training import workdir_lock
  from tests import pretrain_helpers as ph
  overrides = json.loads(args.overrides)
  try:
    with workdir_lock.hold(args.workdir):
      pretraining.train_and_evaluate(ph.run_config(args.records, **overrides), args.workdir)
  except (checkpoint_errors.CheckpointError, workdir_lock.WorkdirInUseError) as e:
    print(f"error: {e}", flush=True)
    return CHILD_ERROR
  return 0


def spawn(records: str, workdir: str, fsize: int | None = None, **overrides):
  command = [sys.executable, os.path.abspath(__file__), "--child", "--records", records,
             "--workdir", workdir, "--overrides", json.dumps(overrides)]
  if fsize:
    command += ["--fsize", str(fsize)]
  return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


# ---------------------------------------------------------------------------- bookkeeping
class Tally:
  def __init__(self):
    self.rows: dict[str, list[int]] = {}
    self.notes: list[str] = []

  def add(self, kind: str, survived: bool, note: str):
    row = self.rows.setdefault(kind, [0, 0])
    row[0 if survived else 1] += 1
    line = f"{'survived' if survived else 'LOST'}  {kind}: {note}"
    self.notes.append(line)
    print(line, flush=True)

  def table(self) -> str:
    lines = ["| kind | trials | survived | lost |", "|---|---|---|---|"]
    for kind, (ok, lost) in self.rows.items():
      lines.append(f"| {kind} | {ok + lost} | {ok} | {lost} |")
    ok = sum(r[0] for r in self.rows.values())
    lost = sum(r[1] for r in self.rows.values())
    lines.append(f"| **all** | {ok + lost} | {ok} | {lost} |")
    return "\n".join(lines)


class Warnings(logging.Handler):
  """The warnings a restore logs, to check what it said."""

  def __init__(self):
    super().__init__(logging.WARNING)
    self.messages: list[str] = []

  def emit(self, record):
    self.messages.append(record.getMessage())


def quietly(fn, *args, **kwargs):
  """An in-process run without its progress lines (the trials print their own)."""
  with contextlib.redirect_stdout(io.StringIO()):
    return fn(*args, **kwargs)


@contextlib.contextmanager
def captured_warnings():
  handler = Warnings()
  logger = logging.getLogger("absl")
  logger.addHandler(handler)
  try:
    yield handler.messages
  finally:
    logger.removeHandler(handler)


def wait_for_rows(proc, workdir: str, rows: int, timeout_s: float = 300) -> bool:
  """Until the run has logged `rows` train rows (it is training), or has ended."""
  path = os.path.join(workdir, "metrics.jsonl")
  deadline = time.time() + timeout_s
  while proc.poll() is None and time.time() < deadline:
    if os.path.exists(path):
      with open(path, encoding="utf-8") as f:
        if sum('"train/loss"' in line for line in f) >= rows:
          return True
    time.sleep(0.05)
  return False


def losses(workdir: str) -> dict[int, float]:
  """The last loss logged for each step (a resumed run logs some steps again)."""
  from bert_jax.training import metrics
  rows = metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


# ------------------------------------------------------------------------------- damages
def data_files(step_dir: str) -> list[str]:
  """The OCDBT array data files of a step, largest first."""
  return sorted(glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True),
                key=lambda p: (-os.path.getsize(p), p))


def _rewrite(path: str, edit):
  with open(path, "rb") as f:
    data = bytearray(f.read())
  data = edit(data)
  with open(path, "wb") as f:
    f.write(bytes(data))


def truncate(path):
  _rewrite(path, lambda d: d[:len(d) // 2])


def garble(path, rng):
  def edit(d):
    at = int(rng.randint(0, max(1, len(d) - 16)))
    d[at:at + 16] = rng.bytes(16)
    return d
  _rewrite(path, edit)


def random_bytes(path, rng, size=4096):
  def edit(d):
    at = int(rng.randint(0, max(1, len(d) - size)))
    chunk = rng.bytes(min(size, len(d) - at))
    d[at:at + len(chunk)] = chunk
    return d
  _rewrite(path, edit)


def flip_bit(path, rng):
  def edit(d):
    d[int(rng.randint(0, len(d)))] ^= 1 << int(rng.randint(0, 8))
    return d
  _rewrite(path, edit)


def drop_array_from_metadata(path):
  tree = json.loads(open(path, encoding="utf-8").read())
  for key in [k for k in tree["tree_metadata"] if "'pooler'" in k]:
    del tree["tree_metadata"][key]
  open(path, "w", encoding="utf-8").write(json.dumps(tree))


def empty_dir(path):
  for name in os.listdir(path):
    target = os.path.join(path, name)
    shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)


def damages(rng):
  """(kind, how many trials, damage(step_dir, ckpt_dir))."""
  j = os.path.join
  return [
      ("delete state/_METADATA", 1, lambda s, c: os.remove(j(s, "state", "_METADATA"))),
      ("truncate state/_METADATA", 1, lambda s, c: truncate(j(s, "state", "_METADATA"))),
      ("garble state/_METADATA (16 random bytes)", 2,
       lambda s, c: garble(j(s, "state", "_METADATA"), rng)),
      ("state/_METADATA without an array (valid JSON)", 1,
       lambda s, c: drop_array_from_metadata(j(s, "state", "_METADATA"))),
      ("garble state/_sharding", 1, lambda s, c: garble(j(s, "state", "_sharding"), rng)),
      ("delete state/manifest.ocdbt", 1, lambda s, c: os.remove(j(s, "state", "manifest.ocdbt"))),
      ("garble the OCDBT process manifest", 1,
       lambda s, c: garble(j(s, "state", "ocdbt.process_0", "manifest.ocdbt"), rng)),
      ("delete state/array_metadatas", 1,
       lambda s, c: shutil.rmtree(j(s, "state", "array_metadatas"))),
      ("garble _CHECKPOINT_METADATA", 1, lambda s, c: garble(j(s, "_CHECKPOINT_METADATA"), rng)),
      ("garble meta/metadata", 1, lambda s, c: garble(j(s, "meta", "metadata"), rng)),
      ("garble data/metadata", 1, lambda s, c: garble(j(s, "data", "metadata"), rng)),
      ("data/metadata edited (valid JSON, another position)", 1,
       lambda s, c: open(j(s, "data", "metadata"), "w").write('{"per_process": [[0, 9]]}')),
      ("delete checksums/", 1, lambda s, c: shutil.rmtree(j(s, "checksums"))),
      ("4 KB of random bytes in an array data file", 3,
       lambda s, c: random_bytes(data_files(s)[int(rng.randint(0, 4))], rng)),
      ("one flipped bit in an array data file", 6,
       lambda s, c: flip_bit(data_files(s)[int(rng.randint(0, 4))], rng)),
      ("delete an array data file", 1, lambda s, c: os.remove(data_files(s)[0])),
      ("truncate an array data file", 1, lambda s, c: truncate(data_files(s)[0])),
      ("another step's array data (state/ of step 4)", 1,
       lambda s, c: (shutil.rmtree(j(s, "state")),
                     shutil.copytree(j(c, "4", "state"), j(s, "state")))),
      ("empty the step directory", 1, lambda s, c: empty_dir(s)),
      ("delete state/", 1, lambda s, c: shutil.rmtree(j(s, "state"))),
  ]


# -------------------------------------------------------------------------------- trials
def tree_equal(a, b) -> bool:
  import jax
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(
      np.asarray(x).dtype == np.asarray(y).dtype and np.shape(x) == np.shape(y)
      and np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(la, lb))


def restore_trial(abstract, clean, ckpts: str):
  """Restores as a resuming run does; returns (survived, note)."""
  from bert_jax.training import checkpointing
  manager = checkpointing.CheckpointManager(ckpts, async_save=False)
  with captured_warnings() as said:
    try:
      state, data, _ = manager.restore(abstract, set_aside_damaged=True)
    except Exception as e:  # pylint: disable=broad-except
      return False, f"{type(e).__name__}: {str(e)[:200]}"
    finally:
      with contextlib.suppress(Exception):
        manager.close()
  step = int(state.step)
  if step not in clean or not tree_equal(state, clean[step][0]) or data != clean[step][1]:
    return False, f"restored step {step} with other values (garbage)"
  if step == 8:
    return True, "harmless: step 8 restored bit-identical"
  named = [m for m in said if "step 8 is damaged" in m and any(
      w in m for w in ("state/", "metadata", "array ", "checksums", "is gone", "_METADATA"))]
  if not named:
    return False, f"fell back to step {step} without naming the damage: {said}"
  reason = named[0].split(" is damaged: ", 1)[1].split("; trying step")[0]
  return True, f"fell back to step 4; step 8: {reason[:150]}"


def damage_trials(tally, records, base, abstract, clean, rng, scratch):
  for kind, trials, damage in damages(rng):
    for trial in range(trials):
      target = os.path.join(scratch, f"damage-{len(tally.notes)}")
      shutil.copytree(base, target)
      ckpts = os.path.join(target, "checkpoints")
      damage(os.path.join(ckpts, "8"), ckpts)
      survived, note = restore_trial(abstract, clean, ckpts)
      tally.add(kind, survived, note if trials == 1 else f"#{trial + 1} {note}")
      shutil.rmtree(target)

  # Both steps damaged: one error naming both, not a fresh start.
  from bert_jax.interop import checkpoint_errors
  from bert_jax.training import checkpointing
  target = os.path.join(scratch, "damage-all")
  shutil.copytree(base, target)
  ckpts = os.path.join(target, "checkpoints")
  os.remove(os.path.join(ckpts, "8", "state", "_METADATA"))
  flip_bit(data_files(os.path.join(ckpts, "4"))[0], rng)
  manager = checkpointing.CheckpointManager(ckpts, async_save=False)
  try:
    manager.restore(abstract)
    tally.add("every step damaged", False, "restored something")
  except checkpoint_errors.CheckpointError as e:
    text = str(e)
    ok = "\n" not in text and "step 8:" in text and "step 4:" in text and ckpts in text
    tally.add("every step damaged", ok, text[:220])
  except Exception as e:  # pylint: disable=broad-except
    tally.add("every step damaged", False, f"{type(e).__name__}: {str(e)[:200]}")

  # Another model's checkpoint: the differences, no fallback, nothing set aside.
  from bert_jax.runs import pretraining
  from bert_jax.training import state as state_lib
  from tests import pretrain_helpers as ph
  shutil.rmtree(target)
  shutil.copytree(base, target)
  run = pretraining.build(ph.run_config(records, **{"model.intermediate_size": 96}))
  other, _ = state_lib.abstract_train_state(run.model, run.tx, run.mesh, run.rules,
                                            run.objective.example_batch(16),
                                            run.objective.input_names)
  manager = checkpointing.CheckpointManager(ckpts, async_save=False)
  try:
    manager.restore(other, set_aside_damaged=True)
    tally.add("another model's checkpoint", False, "restored")
  except ValueError as e:
    ok = ("step 8 does not fit this model" in str(e) and not manager.skipped
          and sorted(os.listdir(ckpts)) == ["4", "8"])
    tally.add("another model's checkpoint", ok, str(e).splitlines()[0][:200])
  shutil.rmtree(target)


def resume_trials(tally, records, base, reference, rng, scratch):
  """Damage, then the run itself resumes: every loss after the restart must be the
  uninterrupted run's."""
  from bert_jax.runs import pretraining
  from tests import pretrain_helpers as ph
  for kind, damage in (
      ("resume after a flipped bit (training)", lambda s: flip_bit(data_files(s)[1], rng)),
      ("resume after garbled data/metadata (training)",
       lambda s: garble(os.path.join(s, "data", "metadata"), rng))):
    target = os.path.join(scratch, "resume")
    shutil.copytree(base, target)
    damage(os.path.join(target, "checkpoints", "8"))
    before = len(open(os.path.join(target, "metrics.jsonl")).readlines())
    try:
      with captured_warnings() as said:
        quietly(pretraining.train_and_evaluate, ph.run_config(records, train_until_step=16),
                target)
    except Exception as e:  # pylint: disable=broad-except
      tally.add(kind, False, f"{type(e).__name__}: {str(e)[:200]}")
      shutil.rmtree(target)
      continue
    from bert_jax.training import metrics
    rows = metrics.read_jsonl(os.path.join(target, "metrics.jsonl"))[before:]
    after = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}
    differ = [s for s in after if after[s] != reference[s]]
    named = any("step 8 is damaged" in m for m in said)
    harmless = not named and min(after) > 9
    tally.add(kind, (named or harmless) and not differ and max(after) == 16,
              f"{'fell back to step 4' if named else 'restored step 8'}; steps "
              f"{min(after)}-{max(after)} {'differ: ' + str(differ) if differ else 'identical'}")
    shutil.rmtree(target)


def kill_trials(tally, records, reference, rng, scratch, trials):
  for trial in range(trials):
    workdir = os.path.join(scratch, f"kill-{trial}")
    proc = spawn(records, workdir, train_until_step=40, checkpoint_every_steps=4)
    wait_for_rows(proc, workdir, 1)
    delay = float(rng.uniform(0.0, 10.0))
    time.sleep(delay)
    ended = proc.poll() is not None
    try:
      killed_at = max(losses(workdir) or {0: 0})
    except ValueError:  # a row being written this very moment
      killed_at = "?"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    saved = sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints"))
                   if n.isdigit()) if os.path.isdir(os.path.join(workdir, "checkpoints")) else []
    lock_left = os.path.exists(os.path.join(workdir, ".lock"))
    again = spawn(records, workdir, train_until_step=40, checkpoint_every_steps=4)
    output = again.communicate()[0]
    if again.returncode != 0:
      tally.add("kill -9 at a random moment, then resume", False,
                f"#{trial + 1} resume exited {again.returncode}: {output[-300:]}")
      continue
    got = losses(workdir)
    differ = [s for s in got if got[s] != reference[s]]
    took_over = "Taking over the lock" in output
    ok = not differ and max(got) == 40 and (took_over or not lock_left)
    tally.add("kill -9 at a random moment, then resume", ok,
              f"#{trial + 1} killed {delay:.2f}s after the first logged step (logged up to "
              f"step {killed_at}, checkpoints {saved}"
              f"{'; the run had ended already' if ended else ''}); stale lock "
              f"{'taken over' if took_over else 'absent'}; losses of steps 2-40 "
              f"{'differ at ' + str(differ[:5]) if differ else 'bit-identical'}")
    shutil.rmtree(workdir)


def disk_trials(tally, records, base, abstract, clean, scratch):
  from bert_jax.training import checkpointing
  cases = [("resume at step 8, files ≤ 200 kB", True, 200_000, 12, 8),
           ("resume at step 8, files ≤ 60 kB", True, 60_000, 12, 8),
           ("fresh run, files ≤ 30 kB (no checkpoint at all)", False, 30_000, 4, None)]
  for kind, resume, fsize, failed, last in cases:
    workdir = os.path.join(scratch, "disk")
    if resume:
      shutil.copytree(base, workdir)
    proc = spawn(records, workdir, fsize=fsize, train_until_step=16)
    output = proc.communicate()[0]
    ckpts = os.path.join(workdir, "checkpoints")
    where = (f"the last complete one is step {last}" if last is not None
             else "no complete checkpoint exists")
    line = f"error: no space left on {ckpts}: checkpoint step {failed} not written; {where}."
    said = [l for l in output.splitlines() if l.startswith("error:")]
    ok = proc.returncode == CHILD_ERROR and any(l.startswith(line) for l in said)
    steps = sorted(int(n) for n in os.listdir(ckpts) if n.isdigit())
    if ok and resume:
      manager = checkpointing.CheckpointManager(ckpts, async_save=False)
      state, _, _ = manager.restore(abstract)
      manager.close()
      ok = steps == [4, 8] and int(state.step) == 8 and tree_equal(state, clean[8][0])
    elif ok:
      ok = steps == []
    lines = len(output.splitlines())
    tally.add("disk full during a save", ok,
              f"{kind}: {said[0][7:150] if said else output[-200:]!r}... ({lines} lines of "
              f"output in all; checkpoints left {steps})")
    shutil.rmtree(workdir)


def two_runs_trial(tally, records, scratch):
  from bert_jax.training import checkpointing
  workdir = os.path.join(scratch, "shared")
  first = spawn(records, workdir, train_until_step=400, total_steps=400,
                checkpoint_every_steps=50, log_every_steps=5)
  metrics_file = os.path.join(workdir, "metrics.jsonl")
  wait_for_rows(first, workdir, 1)
  second = spawn(records, workdir, train_until_step=400, total_steps=400,
                 checkpoint_every_steps=50, **{"optimizer.learning_rate": 5e-4})
  output = second.communicate()[0]
  refused = [l for l in output.splitlines() if l.startswith("error:")]
  first_running = first.poll() is None
  first.send_signal(signal.SIGTERM)  # save and stop
  first_output = first.communicate()[0]
  steps = [r["step"] for r in __import__("bert_jax.training.metrics", fromlist=["x"]).read_jsonl(
      metrics_file) if "train/loss" in r]
  manager = checkpointing.CheckpointManager(os.path.join(workdir, "checkpoints"),
                                            async_save=False)
  try:
    meta = manager.restore_metadata()
  except FileNotFoundError:
    meta = {"run": {"optimizer": {"learning_rate": None}}}
  manager.close()
  ok = (second.returncode == CHILD_ERROR and len(refused) == 1 and first_running
        and f"pid {first.pid}" in refused[0] and "host " in refused[0]
        and steps == sorted(set(steps)) and first.returncode == 0
        and meta["run"]["optimizer"]["learning_rate"] == 1e-3
        and not os.path.exists(os.path.join(workdir, ".lock")))
  tally.add("two runs on one workdir", ok,
            f"{refused[0][7:200] if refused else output[-300:]!r}; first run "
            f"{'went on' if first_running else 'had ended'}, rows {steps[:2]}...{steps[-1:]} "
            f"in order, its checkpoints' learning rate {meta['run']['optimizer']['learning_rate']}"
            f"{'' if first.returncode == 0 else '; first run output: ' + first_output[-300:]}")
  shutil.rmtree(workdir)


def checksum_cost(records) -> str:
  """What fingerprints add to a save (blocking part) and to a restore, on the tiny model."""
  import flax.serialization
  import jax
  from bert_jax.interop import checkpoint_fingerprints
  from bert_jax.runs import pretraining
  from bert_jax.training import checkpointing
  from bert_jax.training import state as state_lib
  from tests import pretrain_helpers as ph
  config = ph.run_config(records)
  run = pretraining.build(config)
  state, _ = state_lib.create_train_state(run.model, run.tx, run.mesh, run.rules, 0,
                                          run.objective.example_batch(16),
                                          run.objective.input_names)
  tree = flax.serialization.to_state_dict(state)
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
  # What the first save of a run pays once (this process compiled it already: a fresh copy).
  fresh = jax.jit(lambda leaves: jax.numpy.stack(
      [checkpoint_fingerprints._leaf_fingerprint(x)  # pylint: disable=protected-access
       for x in leaves]))
  start = time.perf_counter()
  jax.block_until_ready(fresh(jax.tree.leaves(tree)))
  compile_s = time.perf_counter() - start
  checkpoint_fingerprints.checksum_record(tree, {}, {})
  record_s = []
  for _ in range(20):
    start = time.perf_counter()
    checkpoint_fingerprints.checksum_record(tree, {}, {})
    record_s.append(time.perf_counter() - start)
  directory = tempfile.mkdtemp(prefix="ckpt-cost-")
  manager = checkpointing.CheckpointManager(directory, max_to_keep=2)
  save_s = []
  for step in range(1, 11):
    start = time.perf_counter()
    manager.save(step, state, {"per_process": [[0, step]]}, {"x": 1})
    save_s.append(time.perf_counter() - start)
    manager.wait_until_finished()
  restore_s = []
  for _ in range(3):
    start = time.perf_counter()
    manager.restore(state)
    restore_s.append(time.perf_counter() - start)
  manager.close()
  shutil.rmtree(directory)
  record, save, restore = (float(np.median(x)) * 1e3 for x in (record_s, save_s[1:], restore_s))
  return (f"Checksums, tiny model ({n:,} numbers in {len(jax.tree.leaves(tree))} arrays, 8 CPU "
          f"devices): computing them takes {record:.1f} ms (median of 20) of a save whose "
          f"blocking part takes {save:.1f} ms in all (median of 9, checksums included), "
          f"{100 * record / save:.0f}%; the first save of a run also compiles the fingerprint "
          f"function once ({compile_s:.1f} s here, one reduction per array, on CPU); a restore "
          f"(checks included) takes {restore:.0f} ms. They are computed on the devices holding "
          "the arrays, a few integer operations per number, and only two 32-bit sums per "
          "array come to the host: on an accelerator the per-number work is memory-bound "
          "and small next to writing the same bytes to disk.")


# ---------------------------------------------------------------------------------- main
def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--records", help=argparse.SUPPRESS)
  parser.add_argument("--workdir", help=argparse.SUPPRESS)
  parser.add_argument("--overrides", default="{}", help=argparse.SUPPRESS)
  parser.add_argument("--fsize", type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument("--kill_trials", type=int, default=4)
  parser.add_argument("--append_results", action="store_true",
                      help="append the table to benchmarks/RESULTS.md")
  args = parser.parse_args(argv)
  if args.child:
    return child(args)

  started = time.time()
  import jax
  from bert_jax.runs import pretraining
  from bert_jax.training import checkpointing
  from bert_jax.training import state as state_lib
  from tests import pretrain_helpers as ph
  logging.getLogger("absl").setLevel(logging.WARNING)
  rng = np.random.RandomState(SEED)
  tally = Tally()
  scratch = tempfile.mkdtemp(prefix="faults-")
  try:
    records = ph.write_records(os.path.join(scratch, "records"))
    print("reference runs: uninterrupted to step 40; steps 4 and 8 saved", flush=True)
    reference_dir = os.path.join(scratch, "reference")
    quietly(pretraining.train_and_evaluate, ph.run_config(records, train_until_step=40),
            reference_dir)
    reference = losses(reference_dir)
    base = os.path.join(scratch, "base")
    quietly(pretraining.train_and_evaluate, ph.run_config(records, train_until_step=8), base)
    run = pretraining.build(ph.run_config(records))
    abstract, _ = state_lib.abstract_train_state(run.model, run.tx, run.mesh, run.rules,
                                                 run.objective.example_batch(16),
                                                 run.objective.input_names)
    clean_manager = checkpointing.CheckpointManager(os.path.join(base, "checkpoints"),
                                                    async_save=False)
    clean = {s: clean_manager.restore(abstract, step=s)[:2] for s in (4, 8)}
    clean_manager.close()
    clean = {s: (jax.device_get(st), d) for s, (st, d) in clean.items()}

    damage_trials(tally, records, base, abstract, clean, rng, scratch)
    resume_trials(tally, records, base, reference, rng, scratch)
    kill_trials(tally, records, reference, rng, scratch, args.kill_trials)
    disk_trials(tally, records, base, abstract, clean, scratch)
    two_runs_trial(tally, records, scratch)
    cost = checksum_cost(records)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)

  minutes = (time.time() - started) / 60
  table = tally.table()
  print("\n" + table + "\n\n" + cost + f"\n\n{minutes:.1f} minutes", flush=True)
  if args.append_results:
    machine = (f"{platform.node()}: {os.cpu_count()} CPU cores, {platform.machine()}, "
               f"Python {platform.python_version()}, jax {jax.__version__}, orbax-checkpoint "
               f"{__import__('orbax.checkpoint', fromlist=['x']).__version__}")
    section = (
        "\n\n## Fault injection: damaged checkpoints, kill -9, full disk, two runs "
        "(`benchmarks/faults.py`)\n\n"
        f"`.venv/bin/python benchmarks/faults.py --append_results` on {machine}; "
        f"{datetime.date.today().isoformat()}, {minutes:.1f} minutes, seed {SEED}.\n\n"
        "Survived: a clear message and a correct fallback or refusal, nothing trained on "
        "damaged data (restored arrays bit-identical to the intact step's; resumed losses "
        "bit-identical to an uninterrupted run's). Lost: anything else.\n\n"
        + table + "\n\n" + cost + "\n\nEvery trial:\n\n"
        + "\n".join(f"- {n}" for n in tally.notes) + "\n")
    path = os.path.join(REPO, "benchmarks", "RESULTS.md")
    with open(path, "a", encoding="utf-8") as f:  # appended as the file is now
      f.write(section)
    print(f"appended to {path}")
  return 0 if all(r[1] == 0 for r in tally.rows.values()) else 1


if __name__ == "__main__":
  sys.exit(main())
