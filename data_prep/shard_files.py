"""The files of a data preparation run: where its shards and summary go, whether the output
directory can be written, which shards an earlier run with the same settings finished, the
half-written shards an interrupted run left, and the local folder the split step uses."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

from absl import logging

from bert_jax import file_io
from data_prep import records


def output_paths(output_file: str | None, output_dir: str | None,
                 num_output_shards: int) -> tuple[list[str], str]:
  """The shard files and the summary file."""
  if bool(output_file) == bool(output_dir):
    raise ValueError("Give exactly one of --output_file (comma-separated files) and "
                     "--output_dir (with --num_output_shards).")
  if output_file:
    paths = [p.strip() for p in output_file.split(",") if p.strip()]
    if len(set(paths)) != len(paths):
      raise ValueError("--output_file lists the same file twice.")
    return paths, paths[0] + ".summary.json"
  if num_output_shards < 1:
    raise ValueError("--num_output_shards must be at least 1.")
  paths = [file_io.join(output_dir, f"pretrain-{i:05d}-of-{num_output_shards:05d}.tfrecord")
           for i in range(num_output_shards)]
  return paths, file_io.join(output_dir, "summary.json")


def _directory(path: str) -> str:
  return path.rsplit("/", 1)[0] if file_io.is_remote(path) else (os.path.dirname(path) or ".")


def check_writable(paths: list[str]) -> None:
  """Fails before any work if an output directory cannot be created or written."""
  for directory in sorted({_directory(p) for p in paths}):
    probe = file_io.join(directory, f".write-test-{os.getpid()}")
    try:
      file_io.makedirs(directory)
      file_io.write_bytes_atomic(probe, b"")
      if file_io.is_remote(probe):
        import tensorflow as tf  # pylint: disable=g-import-not-at-top
        tf.io.gfile.remove(probe)
      else:
        os.remove(probe)
    except Exception as e:  # pylint: disable=broad-except
      raise PermissionError(f"Cannot write to output directory {directory}: {e}") from e


def stats_path(shard_path: str) -> str:
  return shard_path + ".stats.json"


def finished_shards(paths: list[str], settings: dict[str, Any]) -> dict[int, dict]:
  """Shards already complete from an earlier run with the same settings (their stats)."""
  done = {}
  for index, path in enumerate(paths):
    if not (file_io.exists(path) and file_io.exists(stats_path(path))):
      continue
    stats = json.loads(file_io.read_text(stats_path(path)))
    size = _file_size(path)
    if "bytes" in stats and size != stats["bytes"]:
      logging.warning("%s has %d bytes but was written with %d (cut short or altered): writing "
                      "it again.", path, size, stats["bytes"])
      continue
    if stats.get("settings") != settings:
      differing = sorted(k for k in set(settings) | set(stats.get("settings", {}))
                         if settings.get(k) != stats.get("settings", {}).get(k))
      raise ValueError(f"{path} exists from a run with other settings (differing: "
                       f"{', '.join(differing)}). Delete it or write somewhere else.")
    done[index] = stats
  return done


def _file_size(path: str) -> int:
  if file_io.is_remote(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.io.gfile.stat(path).length
  return os.path.getsize(path)


def remove_stale_temporaries(paths: list[str]) -> None:
  """Half-written shards of an interrupted run (`<shard>.tmp-<pid>`) go before a rerun."""
  for directory in sorted({_directory(p) for p in paths}):
    if file_io.is_remote(directory):
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      names = [p for p in tf.io.gfile.glob(directory + "/*.tmp-*")]
      for name in names:
        if any(os.path.basename(name).startswith(os.path.basename(p) + ".tmp-") for p in paths):
          tf.io.gfile.remove(name)
      continue
    if not os.path.isdir(directory):
      continue
    shard_names = {os.path.basename(p) for p in paths}
    for name in os.listdir(directory):
      base = name.split(".tmp-")[0]
      if records.is_temporary_name(name) and (base in shard_names or
                                              base[:-len(".stats.json")] in shard_names):
        os.remove(os.path.join(directory, name))


SPLIT_DIR_PREFIX = "bert_jax_split_"


def make_split_dir(tmp_dir: str | None) -> str:
  """A fresh local folder for the split step, `bert_jax_split_<pid>_*`; the folders that runs
  killed before their cleanup left there (their process is gone) are removed first, so a rerun
  after `kill -9` leaves no copy of the corpus behind."""
  base = tmp_dir or tempfile.gettempdir()
  os.makedirs(base, exist_ok=True)
  for name in os.listdir(base):
    if not name.startswith(SPLIT_DIR_PREFIX):
      continue
    pid = name[len(SPLIT_DIR_PREFIX):].split("_", 1)[0]
    if pid.isdigit() and int(pid) != os.getpid() and not file_io.pid_alive(int(pid)):
      logging.info("Removing %s, left by an interrupted run (process %s).", name, pid)
      shutil.rmtree(os.path.join(base, name), ignore_errors=True)
  return tempfile.mkdtemp(prefix=f"{SPLIT_DIR_PREFIX}{os.getpid()}_", dir=base)
