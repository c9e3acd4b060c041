"""Checkpoint faults: a damaged newest step (named, then the step before it), another model's
checkpoint (still the list of differences), a full disk (one line naming the step), and two
runs on one workdir (refused; a dead run's lock taken over)."""

import glob
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from bert_jax.interop import checkpoint_errors, checkpoint_store
from bert_jax.runs import pretraining
from bert_jax.training import checkpointing, metrics, workdir_lock
from bert_jax.training import state as state_lib
from tests import helpers
from tests import pretrain_helpers as ph


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  """A tiny run with checkpoints at steps 4 and 8, and the abstract state that restores it."""
  root = tmp_path_factory.mktemp("faults")
  records = ph.write_records(str(root / "records"))
  workdir = str(root / "run")
  pretraining.train_and_evaluate(ph.run_config(records, train_until_step=8), workdir)
  run = pretraining.build(ph.run_config(records))
  abstract, _ = state_lib.abstract_train_state(run.model, run.tx, run.mesh, run.rules,
                                               run.objective.example_batch(16),
                                               run.objective.input_names)
  return {"records": records, "workdir": workdir, "abstract": abstract}


def _copy(base, tmp_path):
  target = str(tmp_path / "run")
  shutil.copytree(base["workdir"], target)
  return target, os.path.join(target, "checkpoints")


def _data_files(step_dir):
  """The OCDBT array data files of a step, largest first."""
  return sorted(glob.glob(os.path.join(step_dir, "state", "**", "d", "*"), recursive=True),
                key=os.path.getsize, reverse=True)


def _restore(base, directory, **kwargs):
  manager = checkpointing.CheckpointManager(directory, async_save=False)
  try:
    return manager, manager.restore(base["abstract"], **kwargs)
  finally:
    manager.close()


def _warnings(caplog):
  return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


@pytest.mark.slow
def test_flipped_bit_falls_back_to_the_previous_step_with_a_warning(base, tmp_path, caplog):
  _, ckpts = _copy(base, tmp_path)
  path = _data_files(os.path.join(ckpts, "8"))[0]
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 0x10
  open(path, "wb").write(bytes(data))
  with caplog.at_level(logging.WARNING):
    manager, (state, data_state, _) = _restore(base, ckpts)
  assert int(state.step) == 4 and data_state["per_process"] == [[0, 4]]
  assert [s for s, _ in manager.skipped] == [8]
  assert f"{ckpts} step 8 is damaged: array " in _warnings(caplog)
  assert "Restored step 4" in _warnings(caplog)


def test_array_data_of_another_step_is_caught_by_the_checksums(base, tmp_path, caplog):
  """Step 4's array data under step 8's name decodes without error: only the checksums
  written at save can tell (before them: 'resumed from step 8' with step 4's weights)."""
  _, ckpts = _copy(base, tmp_path)
  shutil.rmtree(os.path.join(ckpts, "8", "state"))
  shutil.copytree(os.path.join(ckpts, "4", "state"), os.path.join(ckpts, "8", "state"))
  with caplog.at_level(logging.WARNING):
    _, (state, _, _) = _restore(base, ckpts)
  assert int(state.step) == 4
  assert "differs from what was saved" in _warnings(caplog)
  # load_params (fine-tuning's encoder) checks the same way.
  with caplog.at_level(logging.WARNING):
    _, meta = checkpoint_store.load_params(ckpts, subtree="params/bert")
  assert meta["bert_config"]["hidden_size"] == 64
  assert "array params/bert/" in _warnings(caplog)


def test_deleted_metadata_is_named_not_taken_for_another_model(base, tmp_path, caplog):
  _, ckpts = _copy(base, tmp_path)
  os.remove(os.path.join(ckpts, "8", "state", "_METADATA"))
  with caplog.at_level(logging.WARNING):
    _, (state, _, _) = _restore(base, ckpts)
  assert int(state.step) == 4
  assert "step 8 is damaged: state/_METADATA is missing" in _warnings(caplog)


def test_metadata_edited_into_valid_json_is_damage_not_a_mismatch(base, tmp_path, caplog):
  """A _METADATA that still parses but lacks an array disagrees with the checksum record:
  damage (fall back), where before it read as 'does not fit this model (1 differences)'."""
  _, ckpts = _copy(base, tmp_path)
  path = os.path.join(ckpts, "8", "state", "_METADATA")
  tree = json.loads(open(path, encoding="utf-8").read())
  lost = [k for k in tree["tree_metadata"] if "'params', 'bert', 'pooler'" in k]
  assert lost
  for key in lost:
    del tree["tree_metadata"][key]
  open(path, "w", encoding="utf-8").write(json.dumps(tree))
  with caplog.at_level(logging.WARNING):
    _, (state, _, _) = _restore(base, ckpts)
  assert int(state.step) == 4
  assert "state/_METADATA disagrees with the shapes recorded at save" in _warnings(caplog)


def test_garbled_json_is_named_and_the_resumed_run_trains_on(base, tmp_path, caplog):
  """Through the run itself: the damaged step is named, set aside, and the run resumes from
  step 4 with exactly the losses it had (steps 6-8 again), then saves step 8 anew."""
  workdir, ckpts = _copy(base, tmp_path)
  with open(os.path.join(ckpts, "8", "data", "metadata"), "r+b") as f:
    f.seek(3)
    f.write(b"\xff\x00{")
  before = {r["step"]: r["train/loss"] for r in metrics.read_jsonl(
      os.path.join(workdir, "metrics.jsonl")) if "train/loss" in r}
  with caplog.at_level(logging.WARNING):
    out = pretraining.train_and_evaluate(ph.run_config(base["records"], train_until_step=10),
                                         workdir)
  assert out["step"] == 10
  assert "step 8 is damaged: data/metadata is not valid JSON" in _warnings(caplog)
  rows = [r for r in metrics.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
          if "train/loss" in r]
  again = {r["step"]: r["train/loss"] for r in rows[len(before):]}
  for step in (6, 7, 8):
    assert again[step] == before[step], (step, again[step], before[step])
  names = sorted(os.listdir(ckpts))
  assert [n for n in names if n.isdigit()] == ["10", "4", "8"]
  assert any(n.startswith("8.damaged-") for n in names)


def test_every_step_damaged_is_one_error_naming_each(base, tmp_path):
  _, ckpts = _copy(base, tmp_path)
  os.remove(os.path.join(ckpts, "8", "state", "_METADATA"))
  shutil.rmtree(os.path.join(ckpts, "4", "checksums"))
  with pytest.raises(checkpoint_errors.CheckpointError) as err:
    _restore(base, ckpts)
  message = str(err.value)
  assert "\n" not in message
  assert message.startswith(f"No checkpoint in {ckpts} can be restored: ")
  assert "step 8: state/_METADATA is missing" in message
  assert "step 4: checksums/ is missing" in message


def test_another_model_still_lists_the_differences_without_fallback(base, tmp_path):
  _, ckpts = _copy(base, tmp_path)
  run = pretraining.build(ph.run_config(base["records"], **{"model.intermediate_size": 96}))
  abstract, _ = state_lib.abstract_train_state(run.model, run.tx, run.mesh, run.rules,
                                               run.objective.example_batch(16),
                                               run.objective.input_names)
  manager = checkpointing.CheckpointManager(ckpts, async_save=False)
  with pytest.raises(ValueError, match=r"step 8 does not fit this model \(\d+ differences\)"
                     r":\n  params/bert/encoder/layer_0/intermediate/dense/bias: checkpoint "
                     r"\(128,\) vs model \(96,\)"):
    manager.restore(abstract)
  assert not manager.skipped
  # Another layout of the same layers: the differences, and how to resume.
  stacked = pretraining.build(ph.run_config(base["records"], **{"model.stack_unrolled": True}))
  abstract, _ = state_lib.abstract_train_state(stacked.model, stacked.tx, stacked.mesh,
                                               stacked.rules, run.objective.example_batch(16),
                                               run.objective.input_names)
  with pytest.raises(ValueError, match=r"(?s)params/bert/encoder/layer/attention.*"
                     r"The checkpoint's layers are unrolled \(scan_layers=False\) and this "
                     r"model's are stacked: resume with --config.model.scan_layers=False"):
    manager.restore(abstract)
  manager.close()


def _child(code):
  return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=helpers.command_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
@pytest.mark.e2e
def test_full_disk_is_one_line_naming_the_step_and_the_last_complete_one(base, tmp_path):
  """A real run resuming at step 8 whose files may not exceed 64 kB (RLIMIT_FSIZE: writes
  beyond it fail with EFBIG, as on a full disk with ENOSPC): the save of step 12 fails.

  The limit sits below the smallest file any save must write: the word embeddings and their
  two Adam moments are 128 kB arrays, each written whole into one data file. (At 200 kB the
  outcome depended on how the checkpointer's threads happened to group arrays into files: a
  save under load could pass and the next one fail.)"""
  workdir, ckpts = _copy(base, tmp_path)
  proc = _child(f"""
      import resource, signal, sys
      signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
      resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, 64_000))
      from bert_jax.runs import pretraining
      from bert_jax.interop import checkpoint_errors
      from tests import pretrain_helpers as ph
      try:
        pretraining.train_and_evaluate(
            ph.run_config({base['records']!r}, train_until_step=16), {workdir!r})
      except checkpoint_errors.CheckpointError as e:
        print("error:", e)
        sys.exit(3)
      """)
  output = proc.communicate(timeout=240)[0]
  assert proc.returncode == 3, output[-3000:]
  assert (f"error: no space left on {ckpts}: checkpoint step 12 not written; the last "
          "complete one is step 8.") in output, output[-3000:]
  assert len(output.splitlines()) < 40, output[-3000:]
  # The earlier checkpoints are intact: step 8 restores and verifies.
  manager, (state, _, _) = _restore(base, ckpts)
  assert int(state.step) == 8 and not manager.skipped
  assert sorted(n for n in os.listdir(ckpts) if n.isdigit()) == ["4", "8"]


@pytest.mark.e2e
def test_a_second_run_is_refused_and_a_dead_runs_lock_taken_over(tmp_path, caplog):
  workdir = str(tmp_path / "run")
  holder = _child(f"""
      import sys, time
      from bert_jax.training import workdir_lock
      with workdir_lock.hold({workdir!r}, process_index=0):
        print("holding", flush=True)
        time.sleep(120)
      """)
  assert holder.stdout.readline().strip() == "holding"
  with pytest.raises(workdir_lock.WorkdirInUseError) as err:
    with workdir_lock.hold(workdir, process_index=0):
      pass
  message = str(err.value)
  assert "\n" not in message and f"pid {holder.pid}" in message and "host " in message
  lock = json.loads(open(os.path.join(workdir, ".lock"), encoding="utf-8").read())
  assert lock["pid"] == holder.pid
  # kill -9 leaves the lock behind; the next run (same host, pid gone) takes it over.
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  assert os.path.exists(os.path.join(workdir, ".lock"))

  @workdir_lock.holding("workdir")
  def run(workdir):
    with workdir_lock.hold(workdir, process_index=0) as nested:  # re-entrant in one process
      assert nested is None
    return json.loads(open(os.path.join(workdir, ".lock"), encoding="utf-8").read())

  with caplog.at_level(logging.WARNING):
    mine = run(workdir=workdir)
  assert mine["pid"] == os.getpid()
  assert f"pid {holder.pid} is no longer running" in _warnings(caplog)
  assert not os.path.exists(os.path.join(workdir, ".lock"))  # released on exit
  assert jax.process_count() == 1 and np.isfinite(1.0)
