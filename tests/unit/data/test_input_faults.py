"""Damaged pre-training records, an interrupted data preparation and impossible batch sizes:
each gets a one-line error that names the file and what was expected, or (opted into) a
counted skip — never a shorter dataset in silence."""

import glob
import json
import os
import shutil
import signal
import struct
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.data import input_pipeline, tfrecords
from data_prep import create_pretraining_data as cpd
from data_prep import demo_corpus, records
from tests.helpers import minilm_dir, wait_until
from tests import helpers

ROOT = helpers.REPO
VOCAB = os.path.join(minilm_dir(), "vocab.txt")
SEQ, PRED = 32, 5


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
  """Two shards of masked records from a little Shakespeare, with data_prep's summary."""
  directory = tmp_path_factory.mktemp("records")
  corpus = directory / "corpus.txt"
  corpus.write_text(demo_corpus.corpus_text(max_bytes=20_000), encoding="utf-8")
  settings = cpd.make_settings(str(corpus), VOCAB, max_seq_length=SEQ,
                               max_predictions_per_seq=PRED, dupe_factor=1)
  out = directory / "out"
  summary = cpd.create_pretraining_data(settings, output_dir=str(out), num_output_shards=2,
                                        show_progress=False)
  return str(out), summary


def record_starts(path):
  """Byte offsets where each record of a sound file starts (and the file's end)."""
  data = open(path, "rb").read()
  starts, offset = [], 0
  while offset < len(data):
    starts.append(offset)
    offset += 16 + struct.unpack("<Q", data[offset:offset + 8])[0]
  return starts + [len(data)]


def damaged_copy(shards, tmp_path, damage=None, summary=True):
  """The shards copied to tmp_path (with or without the summary); `damage(bytes, starts)` gives
  the new bytes of the first shard. Returns the shard paths."""
  out, _ = shards
  target = tmp_path / "data"
  target.mkdir(parents=True)
  for path in glob.glob(os.path.join(out, "pretrain-*.tfrecord")):
    shutil.copy(path, target)
  if summary:
    shutil.copy(os.path.join(out, "summary.json"), target)
  files = sorted(glob.glob(str(target / "pretrain-*.tfrecord")))
  if damage is not None:
    damaged = damage(open(files[0], "rb").read(), record_starts(files[0]))
    open(files[0], "wb").write(damaged)
  return files


def stream(files, skip=False, batch=1):
  return input_pipeline.PretrainingData(
      None, files=files, global_batch_size=batch, max_seq_length=SEQ,
      max_predictions_per_seq=PRED, sharding=None, shuffle=False, repeat=False,
      process_index=0, process_count=1, skip_corrupt_records=skip)


def all_input_ids(data):
  return [b["input_ids"][0].tolist() for b, _ in data.host_batches()]


def flip(offset):
  def damage(data, starts):
    out = bytearray(data)
    out[offset(starts)] ^= 0x10
    return bytes(out)
  return damage


def cut(offset):
  return lambda data, starts: data[:offset(starts)]


# Damage in the fourth record (index 3) of the first shard.
INSIDE_HEADER = cut(lambda s: s[3] + 6)
INSIDE_DATA = cut(lambda s: s[3] + 40)
DATA_BYTE = flip(lambda s: s[3] + 30)
LENGTH_BYTE = flip(lambda s: s[3] + 1)


def test_what_tf_data_makes_of_damage(shards, tmp_path):
  """Why the pipeline checks files itself: tf.data reads a file cut inside a record header as a
  clean, shorter file, and names no file when a record is cut or a byte is flipped."""
  tf = input_pipeline._tf()  # pylint: disable=protected-access
  sound = _sound_path(shards)
  path = str(tmp_path / "damaged.tfrecord")
  for damage in (INSIDE_HEADER, INSIDE_DATA, DATA_BYTE):
    damaged = damage(open(sound, "rb").read(), record_starts(sound))
    open(path, "wb").write(damaged)
    if damage is INSIDE_HEADER:
      assert sum(1 for _ in tf.data.TFRecordDataset(path)) == 3  # no error at all
      continue
    with pytest.raises(tf.errors.DataLossError) as caught:
      sum(1 for _ in tf.data.TFRecordDataset(path))
    assert "damaged.tfrecord" not in caught.value.message  # an offset alone, no file name


def _sound_path(shards):
  return sorted(glob.glob(os.path.join(shards[0], "pretrain-*.tfrecord")))[0]


def test_summary_lists_every_shards_records_and_bytes(shards):
  out, summary = shards
  files = sorted(glob.glob(os.path.join(out, "pretrain-*.tfrecord")))
  assert summary["records_per_file"] == {
      os.path.basename(p): sum(1 for _ in tfrecords.iter_records(p)) for p in files}
  assert summary["bytes_per_file"] == {os.path.basename(p): os.path.getsize(p) for p in files}
  assert sum(summary["records_per_file"].values()) == summary["instances"]


@pytest.mark.parametrize("damage, where", [
    (INSIDE_HEADER, "the file ends inside a record header"),
    (INSIDE_DATA, "the file ends inside the record")], ids=["cut_in_header", "cut_in_data"])
def test_a_shard_cut_short_is_named_with_records_expected_and_read(shards, tmp_path, damage,
                                                                    where):
  files = damaged_copy(shards, tmp_path, damage)
  expected = shards[1]["records_per_file"][os.path.basename(files[0])]
  with pytest.raises(ValueError) as caught:
    stream(files)
  message = str(caught.value)
  assert "\n" not in message
  assert message.startswith(f"{files[0]}: 3 of {expected:,} records are readable")
  assert "summary.json lists" in message and where in message
  assert "skip_corrupt_records" in message


@pytest.mark.parametrize("damage, reason", [
    (DATA_BYTE, "the record's data checksum does not match"),
    (LENGTH_BYTE, "the record header's checksum does not match")],
    ids=["data_byte", "length_byte"])
def test_a_flipped_byte_is_named_with_file_record_and_offset(shards, tmp_path, damage, reason):
  for summary in (True, False):  # the size is unchanged: found while reading, summary or not
    files = damaged_copy(shards, tmp_path / str(summary), damage, summary=summary)
    offset = record_starts(_sound_path(shards))[3]
    data = stream(files)
    with pytest.raises(ValueError) as caught:
      all_input_ids(data)
    message = str(caught.value)
    assert "\n" not in message
    assert f"{files[0]}: record 4 at byte offset {offset:,}: {reason}" in message
    assert "skip_corrupt_records=True" in message


@pytest.mark.parametrize("damage, skipped", [
    (INSIDE_HEADER, None), (INSIDE_DATA, None), (DATA_BYTE, 1), (LENGTH_BYTE, 1)],
    ids=["cut_in_header", "cut_in_data", "data_byte", "length_byte"])
def test_skip_corrupt_records_skips_and_counts(shards, tmp_path, damage, skipped):
  sound = all_input_ids(stream(damaged_copy(shards, tmp_path / "sound")))
  files = damaged_copy(shards, tmp_path / "damaged", damage)
  per_file = shards[1]["records_per_file"]
  if skipped is None:  # cut after three records: the rest of the file is missing
    skipped = per_file[os.path.basename(files[0])] - 3
  data = stream(files, skip=True)
  got = all_input_ids(data)
  assert data.skipped_records == skipped
  assert len(got) == len(sound) - skipped
  assert all(row in sound for row in got)
  assert [d.record for d in data.damages] == [3]


def test_skip_mode_reads_sound_files_exactly_as_tf_data(shards, tmp_path):
  files = damaged_copy(shards, tmp_path)
  tf_stream = input_pipeline.PretrainingData(
      None, files=files, global_batch_size=4, max_seq_length=SEQ, max_predictions_per_seq=PRED,
      sharding=None, seed=3, process_index=0, process_count=1)
  checked = input_pipeline.PretrainingData(
      None, files=files, global_batch_size=4, max_seq_length=SEQ, max_predictions_per_seq=PRED,
      sharding=None, seed=3, process_index=0, process_count=1, skip_corrupt_records=True)
  for (a, pa), (b, pb), _ in zip(tf_stream.host_batches(), checked.host_batches(), range(40)):
    assert pa == pb
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  assert checked.skipped_records == 0


def test_iter_records_finds_the_next_record_after_a_broken_header(tmp_path):
  path = str(tmp_path / "r.tfrecord")
  payloads = [bytes([65 + i]) * (10 + i) for i in range(6)]
  with records.TFRecordWriter(path) as writer:
    for payload in payloads:
      writer.write(payload)
  data = bytearray(open(path, "rb").read())
  starts = record_starts(path)
  data[starts[2] + 9] ^= 1   # the length checksum of record 3
  data[starts[4] + 14] ^= 1  # the data of record 5
  open(path, "wb").write(bytes(data))
  damages = []
  got = list(tfrecords.iter_records(path, damages.append))
  assert got == [payloads[i] for i in (0, 1, 3, 5)]
  assert [(d.record, d.offset) for d in damages] == [(2, starts[2]), (4, starts[4])]
  with pytest.raises(ValueError, match=rf"r\.tfrecord: record 3 at byte offset {starts[2]}: "):
    list(tfrecords.iter_records(path))
  found = tfrecords.scan(path)
  assert found.records == 4 and len(found.damages) == 2


@pytest.mark.parametrize("size, processes", [(0, 1), (-8, 1), (6, 4)])
def test_global_batch_size_must_be_a_positive_multiple_of_the_processes(shards, size,
                                                                       processes):
  files = sorted(glob.glob(os.path.join(shards[0], "pretrain-*.tfrecord")))
  with pytest.raises(ValueError, match=(
      rf"^global_batch_size={size}: must be a positive multiple of the number of processes "
      rf"\({processes}\); set --config.global_batch_size\.$")):
    input_pipeline.PretrainingData(None, files=files, global_batch_size=size,
                                   max_seq_length=SEQ, max_predictions_per_seq=PRED,
                                   sharding=None, process_index=0, process_count=processes)


def test_fine_tuning_batch_size_is_checked_where_batches_are_made():
  from bert_jax.data import arrays  # pylint: disable=g-import-not-at-top
  feats = {"input_ids": np.zeros((10, 4), np.int32), "weight": np.ones(10, np.float32)}
  message = (r"^train_batch_size=0: must be a positive multiple of the number of processes "
             r"\(1\); set --train_batch_size\.$")
  with pytest.raises(ValueError, match=message):
    arrays.steps_per_epoch(10, 0)
  with pytest.raises(ValueError, match=message):
    next(arrays.training_batches(feats, 0, None, seed=0, trim=False))
  assert arrays.steps_per_epoch(10, 4) == 3


def test_a_rerun_of_data_prep_rewrites_a_shard_cut_short(shards, tmp_path):
  out, summary = shards
  target = tmp_path / "out"
  shutil.copytree(out, target)
  files = sorted(glob.glob(str(target / "pretrain-*.tfrecord")))
  sound = open(files[0], "rb").read()
  open(files[0], "wb").write(sound[:len(sound) // 2])
  again = cpd.create_pretraining_data(summary["settings"], output_dir=str(target),
                                      num_output_shards=2, show_progress=False)
  assert open(files[0], "rb").read() == sound
  assert again["shards_skipped_as_complete"] == 1


# ---------------------------------------------------------------------------------------------
# data_prep killed with kill -9


def _children(pid):
  import psutil  # pylint: disable=g-import-not-at-top
  try:
    return psutil.Process(pid).children(recursive=True)
  except psutil.NoSuchProcess:
    return []


def _gone(process) -> bool:
  import psutil  # pylint: disable=g-import-not-at-top
  try:
    return process.status() == psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return True


@pytest.mark.e2e
def test_data_prep_killed_leaves_no_split_folder_and_no_workers(tmp_path):
  """`kill -9` mid-run: the workers end with the command (one is held stopped in the middle
  of writing its shard, so it cannot simply finish its task and leave), and the rerun removes
  the split folder the killed run left and finishes with no temporary file anywhere."""
  corpus = tmp_path / "corpus.txt"
  corpus.write_text(demo_corpus.corpus_text(max_bytes=1_500_000), encoding="utf-8")
  scratch, out = tmp_path / "scratch", tmp_path / "out"
  command = [sys.executable, "-m", "data_prep.create_pretraining_data",
             f"--input_file={corpus}", f"--vocab_file={VOCAB}", f"--output_dir={out}",
             "--num_output_shards=4", "--num_workers=2", f"--tmp_dir={scratch}",
             "--max_seq_length=64", "--dupe_factor=5", "--noprogress"]
  environment = helpers.command_env()
  run = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
  workers = []
  try:
    def writing():  # a worker's half-written shard, `<shard>.tmp-<worker pid>`
      children = {c.pid: c for c in _children(run.pid)}
      for name in glob.glob(str(out / "*.tmp-*")):
        pid = name.rsplit(".tmp-", 1)[1]
        if pid.isdigit() and int(pid) in children:
          return children[int(pid)]
      return None
    wait_until(writing, "a worker writing a shard", limit_s=120, poll_s=0.01)
    busy = writing()
    workers = [c for c in _children(run.pid) if c.pid != run.pid]
    busy.send_signal(signal.SIGSTOP)
    assert run.poll() is None, "the run ended before it could be killed: give it more text"
    run.kill()
    run.wait()
    assert glob.glob(str(scratch / "bert_jax_split_*"))  # what kill -9 leaves behind
    wait_until(lambda: all(_gone(w) for w in workers), "the workers to end with their parent",
               limit_s=30)
  finally:
    if run.poll() is None:
      run.kill()
    for worker in workers:  # only if the test failed: never leave them behind
      if not _gone(worker):
        worker.kill()
  done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert not glob.glob(str(scratch / "bert_jax_split_*")), os.listdir(scratch)
  assert len(glob.glob(str(out / "pretrain-*.tfrecord"))) == 4
  assert not glob.glob(str(out / "*.tmp-*"))
  summary = json.load(open(out / "summary.json"))
  assert sum(summary["records_per_file"].values()) == summary["instances"]
