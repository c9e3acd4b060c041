"""Pre-training TFRecords → per-host tf.data → global batches sharded over the mesh.

Every host reads its own files (files are dealt round-robin by process index; with fewer files
than hosts, records are dealt instead), shuffles, batches its share of the global batch, parses
with the schema of `features.py`, and the hosts' arrays are assembled into one global
`jax.Array` per feature with `jax.make_array_from_process_local_data`.

The stream is a pure function of (seed, epoch, batch index): epoch `e` reads the files in a
seeded order with a seeded shuffle, and dynamic masks are drawn with `masking.py` from a
generator seeded by (seed, epoch, batch, process). So the position `{"epoch", "batch"}` is all
a checkpoint needs to resume the exact batches an uninterrupted run would have seen.

Packed records (`data_prep --packing`: several instances per row, `packing.py`) are recognised
from the first record's features like the masking mode; `PretrainingData.packed` and
`max_sequences_per_row` tell the run to use the packed objective, batches carry the packed
layout (`position_ids`, `sequence_ids`, `cls_positions`, per-instance `next_sentence_labels`
and `next_sentence_weights`), and dynamic packed rows are masked instance by instance
(`packing.mask_rows`), exactly as unpacked instances are.

Damaged files are named, never read around in silence. data_prep's `summary.json` beside the
files lists each shard's records and bytes; a file whose size differs (cut short — tf.data
reads a file cut inside a record header as a clean, shorter file) is an error naming the file
and the records expected and found, and a checksum failure while reading (tf.data's
DataLossError, which names no file) becomes an error naming the file, the record and the byte
offset. `skip_corrupt_records=True` (`config.data.skip_corrupt_records`) instead reads every
file with `tfrecords.iter_records`, which skips damaged records, and counts them
(`PretrainingData.skipped_records`); undamaged files give exactly the same stream.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import threading
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from absl import logging

from bert_jax import file_io
from bert_jax.data import arrays, packing, tfrecords
from bert_jax.text import features, masking

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


_tf = file_io.tensorflow

# Fewest records packed together when the pipeline packs rows as it reads (`data.packing`).
ONLINE_PACKING_GROUP = 1024


def list_files(patterns: str | Sequence[str]) -> list[str]:
  """Sorted files matching comma-separated glob patterns (local or gs://)."""
  tf = _tf()
  if isinstance(patterns, str):
    patterns = [p for p in patterns.split(",") if p.strip()]
  files = []
  for pattern in patterns:
    matched = tf.io.gfile.glob(pattern.strip())
    if not matched:
      raise FileNotFoundError(f"No files match {pattern!r}.")
    files.extend(matched)
  return sorted(set(files))


def record_lengths(path: str) -> dict[str, int]:
  """Feature name → number of values in the first record of `path`."""
  tf = _tf()
  try:
    raw = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
  except tf.errors.DataLossError as e:
    raise ValueError(f"{path}: the first record is corrupt ({e.message.splitlines()[0]}).") from e
  if raw is None:
    raise ValueError(f"{path}: contains no records.")
  example = tf.train.Example.FromString(raw.numpy())
  out = {}
  for name, feature in example.features.feature.items():
    kind = feature.WhichOneof("kind")
    out[name] = len(getattr(feature, kind).value) if kind else 0
  return out


def detect_masking(path: str, lengths: dict[str, int] | None = None) -> str:
  """'static' for records with masked-LM features, 'dynamic' for unmasked ones (`lengths`:
  `record_lengths(path)` when already read)."""
  lengths = lengths or record_lengths(path)
  return features.STATIC if features.MASKED_LM_POSITIONS in lengths else features.DYNAMIC


def detect_packing(path: str, lengths: dict[str, int] | None = None) -> int | None:
  """`max_sequences_per_row` of packed records (`data_prep --packing`), None for unpacked ones."""
  lengths = lengths or record_lengths(path)
  return lengths[features.CLS_POSITIONS] if features.SEQUENCE_IDS in lengths else None


def check_record_shapes(path: str, max_seq_length: int, max_predictions_per_seq: int,
                        masking_mode: str, max_sequences_per_row: int | None = None,
                        lengths: dict[str, int] | None = None) -> None:
  """Compares the first record of `path` with the schema the config implies; names the feature
  and both sizes when they disagree (instead of tf.data's parse error mid-training)."""
  lengths = lengths or record_lengths(path)
  layout = (f"packed ({max_sequences_per_row} per row) " if max_sequences_per_row else "")
  per_row = {features.CLS_POSITIONS, features.NEXT_SENTENCE_WEIGHTS}
  if max_sequences_per_row:
    per_row.add(features.NEXT_SENTENCE_LABELS)
  # Every setting the records disagree with, with the value they were written with.
  differ: dict[str, tuple[int, int, str]] = {}
  for f in features.pretraining_features(max_seq_length, max_predictions_per_seq, masking_mode,
                                         max_sequences_per_row):
    if f.name not in lengths:
      raise ValueError(f"{path}: records have no feature {f.name!r} (have {sorted(lengths)}); "
                       f"expected {layout}{masking_mode}-masking pre-training records.")
    if lengths[f.name] != f.length:
      if f.name in per_row:
        what = "max_sequences_per_row"
      elif f.length == max_seq_length and f.name != features.NEXT_SENTENCE_LABELS:
        what = "max_seq_length"
      else:
        what = "max_predictions_per_seq"
      differ.setdefault(what, (lengths[f.name], f.length, f.name))
  if differ:
    found = ", ".join(f"{what}={stored} ({name!r} has {stored} values per record; the config "
                      f"{expected})" for what, (stored, expected, name) in differ.items())
    flags = " ".join(f"--config.data.{what}={stored}" for what, (stored, _, _) in differ.items())
    raise ValueError(f"{path}: the records were written with {found}: add {flags}, or "
                     "re-create the data with the config's settings.")


def check_packed_budget(summary_path: str | None, config: masking.MaskingConfig) -> None:
  """Dynamic packed rows were packed so that their instances' masked-LM predictions fit
  data_prep's `max_predictions_per_seq` at its `masked_lm_prob`; masking them with a smaller
  budget or a larger probability could overflow a row. Said before training starts (from
  data_prep's summary beside the files) rather than at the first row that overflows."""
  if not summary_path:
    return
  try:
    settings = json.loads(file_io.read_text(summary_path)).get("settings") or {}
  except (ValueError, OSError):
    return
  packed_for = settings.get("max_predictions_per_seq")
  prob = settings.get("masked_lm_prob")
  if packed_for is None or prob is None:
    return
  if config.max_predictions_per_seq < packed_for or config.masked_lm_prob > prob:
    raise ValueError(
        f"{summary_path}: these packed rows were packed for max_predictions_per_seq="
        f"{packed_for} per row at masked_lm_prob={prob}; masking them with "
        f"max_predictions_per_seq={config.max_predictions_per_seq} and masked_lm_prob="
        f"{config.masked_lm_prob} could leave a row's predictions without room. Set the config "
        f"to at least {packed_for} (and at most {prob}), or re-create the data.")


SKIP_HINT = ("set data.skip_corrupt_records=True to train on without the damaged records "
             "(they are counted and reported)")


def recorded_counts(files: Sequence[str]) -> dict[str, dict[str, Any]]:
  """Per file, what data_prep wrote: `{"records", "bytes", "summary"}` from the summary JSON
  files beside it (`summary.json`, or `<first output>.summary.json` for `--output_file`).
  Files without one (another tool's records, or an older summary) are left out."""
  by_directory: dict[str, set[str]] = {}
  for path in files:
    by_directory.setdefault(_directory(path), set()).add(os.path.basename(path))
  out: dict[str, dict[str, Any]] = {}
  for directory, names in by_directory.items():
    for summary_path in sorted(file_io.glob(file_io.join(directory, "*summary.json"))):
      try:
        summary = json.loads(file_io.read_text(summary_path))
      except (ValueError, OSError):
        continue
      if not isinstance(summary, dict) or not isinstance(summary.get("records_per_file"), dict):
        continue
      sizes = summary.get("bytes_per_file") or {}
      for name, count in summary["records_per_file"].items():
        if name in names:
          out[file_io.join(directory, name)] = {"records": int(count), "bytes": sizes.get(name),
                                                "summary": summary_path}
  return out


def _directory(path: str) -> str:
  return path.rsplit("/", 1)[0] if file_io.is_remote(path) else (os.path.dirname(path) or ".")


def _sizes(files: Sequence[str]) -> list[int]:
  if not any(file_io.is_remote(p) for p in files):
    return [os.path.getsize(p) for p in files]
  with concurrent.futures.ThreadPoolExecutor(16) as pool:  # a bucket: one request per file
    return list(pool.map(tfrecords.file_size, files))


def check_recorded_counts(files: Sequence[str], recorded: dict[str, dict[str, Any]],
                          skip: bool = False) -> dict[str, int]:
  """Compares each file's size with what data_prep wrote (a stat per file, no reading); a file
  that differs is read through to count its sound records. Raises naming the file, the
  records expected and those found — or, with `skip`, logs it and returns the records missing
  per file."""
  checked = [p for p in files if p in recorded and recorded[p]["bytes"] is not None]
  missing: dict[str, int] = {}
  for path, size in zip(checked, _sizes(checked)):
    want = recorded[path]
    if size == want["bytes"]:
      continue
    found = tfrecords.scan(path)
    where = f"; first damage: {found.damages[0]}" if found.damages else ""
    message = (f"{path}: {found.records:,} of {want['records']:,} records are readable "
               f"({want['summary']} lists {want['records']:,} records in {want['bytes']:,} "
               f"bytes; the file has {size:,} bytes: cut short or altered{where})")
    if not skip:
      raise ValueError(f"{message}. Re-create it with data_prep (a rerun writes it again), or "
                       f"{SKIP_HINT}.")
    missing[path] = max(0, want["records"] - found.records) or len(found.damages)
    logging.warning("%s; skipping the %d missing or damaged record(s).", message, missing[path])
  return missing


def _find_corrupt_record(files: Sequence[str]) -> str:
  """Names the file, record and byte offset of the first damage (run only after a failure)."""
  for path in files:
    found = tfrecords.scan(path)
    if found.damages:
      return str(found.damages[0])
  return "no damaged record found on a second read"


class PretrainingData:
  """A resumable stream of global pre-training batches for one host.

  Args:
    file_patterns: comma-separated globs of TFRecord shards.
    global_batch_size: sequences per step over all hosts.
    max_seq_length, max_predictions_per_seq: the record layout (checked against the files).
    sharding: the batch sharding (leading axis over the data axes), or None for numpy batches.
    seed: shuffling and dynamic-masking seed.
    masking_config: needed for dynamic records (masks are drawn here); ignored for static ones.
    shuffle, repeat: off for evaluation streams.
    skip_corrupt_records: skip damaged records and files cut short instead of stopping; they
      are logged and counted in `skipped_records` (`config.data.skip_corrupt_records`).
    pack_sequences: pack unpacked dynamic-masking records as they are read, up to this many
      instances per row (`config.data.packing` with `data.max_sequences_per_row`); see
      `_packed_online`. Records that are packed already are read as they are.
  """

  def __init__(self, file_patterns: str | Sequence[str], *, global_batch_size: int,
               max_seq_length: int, max_predictions_per_seq: int,
               sharding: jax.sharding.Sharding | None, seed: int = 0,
               masking_config: masking.MaskingConfig | None = None, shuffle: bool = True,
               repeat: bool = True, shuffle_buffer_size: int = 10000,
               process_index: int | None = None, process_count: int | None = None,
               files: Sequence[str] | None = None, skip_corrupt_records: bool = False,
               pack_sequences: int | None = None):
    self.process_index = jax.process_index() if process_index is None else process_index
    self.process_count = jax.process_count() if process_count is None else process_count
    arrays.check_batch_size(global_batch_size, self.process_count, "global_batch_size",
                            "--config.global_batch_size")
    self.files = list(files) if files is not None else list_files(file_patterns)
    self.global_batch_size = global_batch_size
    self.host_batch_size = global_batch_size // self.process_count
    self.max_seq_length = max_seq_length
    self.max_predictions_per_seq = max_predictions_per_seq
    self.sharding = sharding
    self.seed = seed
    self.shuffle = shuffle
    self.repeat = repeat
    self.shuffle_buffer_size = shuffle_buffer_size
    if len(self.files) >= self.process_count:
      self.host_files = self.files[self.process_index::self.process_count]
      self._record_shard = None
    else:
      self.host_files = list(self.files)
      self._record_shard = (self.process_count, self.process_index)
    self.skip_corrupt_records = skip_corrupt_records
    self._lock = threading.Lock()
    self._skipped: dict[str, int] = {}   # file -> records skipped in it (most in one pass)
    self.damages: list[tfrecords.Damage] = []  # each damage seen, once
    self._recorded = recorded_counts(self.host_files)
    self._skipped.update(check_recorded_counts(self.host_files, self._recorded,
                                               skip=skip_corrupt_records))
    first = record_lengths(self.host_files[0])  # one read of the first record, not three
    self.masking_mode = detect_masking(self.host_files[0], first)
    # The records' own layout: up to this many instances per record (None: one per record).
    records_per_row = detect_packing(self.host_files[0], first)
    for path in dict.fromkeys(self.host_files[:1] + self.host_files[-1:]):
      check_record_shapes(path, max_seq_length, max_predictions_per_seq, self.masking_mode,
                          records_per_row, first if path == self.host_files[0] else None)
    # Rows as batches carry them: packed as written, packed here, or one instance each.
    self.max_sequences_per_row = records_per_row
    self.packs_online = bool(pack_sequences) and records_per_row is None
    if self.packs_online:
      if self.masking_mode != features.DYNAMIC:
        raise ValueError(
            f"{self.host_files[0]}: data.packing packs dynamic-masking records as they are "
            "read, and these are static-masking records (their masks were drawn for rows of "
            "one instance). Write packed records with data_prep --packing, or dynamic-masking "
            "ones with data_prep --masking=dynamic, or set data.packing=False.")
      if pack_sequences < 1:
        raise ValueError(f"data.max_sequences_per_row={pack_sequences}: must be at least 1.")
      self.max_sequences_per_row = int(pack_sequences)
    if self.masking_mode == features.DYNAMIC:
      if masking_config is None:
        raise ValueError(f"{self.host_files[0]}: dynamic-masking records need a masking config "
                         "(vocabulary size and the [MASK]/[CLS]/[SEP] ids).")
      if masking_config.max_predictions_per_seq != max_predictions_per_seq:
        masking_config = masking.MaskingConfig(**{
            **masking_config.__dict__, "max_predictions_per_seq": max_predictions_per_seq})
      if self.packed and not self.packs_online:
        check_packed_budget(self._recorded.get(self.host_files[0], {}).get("summary"),
                            masking_config)
    self.masking_config = masking_config
    self.feature_spec = features.tf_feature_spec(max_seq_length, max_predictions_per_seq,
                                                 self.masking_mode, records_per_row)

  @property
  def packed(self) -> bool:
    """Whether rows hold several instances (the packed layout of `features.py`): the run
    then needs the packed objective (attention kept within instances, NSP per [CLS])."""
    return self.max_sequences_per_row is not None

  # ------------------------------------------------------------------------ damaged records
  @property
  def skipped_records(self) -> int:
    """Records skipped so far as damaged or missing, over this host's files (each file counted
    once, not once per epoch)."""
    with self._lock:
      return sum(self._skipped.values())

  def _note_damage(self, damage: tfrecords.Damage, counts: dict[str, int]) -> None:
    with self._lock:
      counts[damage.path] = counts.get(damage.path, 0) + 1
      self._skipped[damage.path] = max(self._skipped.get(damage.path, 0), counts[damage.path])
      if any(d.path == damage.path and d.offset == damage.offset for d in self.damages):
        return
      self.damages.append(damage)
    logging.warning("Skipping a damaged pre-training record: %s (%d skipped on this host so "
                    "far).", damage, self.skipped_records)

  def _checked_records(self, path: bytes) -> Iterator[bytes]:
    """A file's sound records (skip mode); the records it lacks against data_prep's count are
    counted once the file is read through."""
    path = path.decode() if isinstance(path, bytes) else str(path)
    counts: dict[str, int] = {}
    good = 0
    for record in tfrecords.iter_records(path, lambda d: self._note_damage(d, counts)):
      good += 1
      yield record
    expected = self._recorded.get(path, {}).get("records")
    if expected is not None and good < expected:
      with self._lock:
        self._skipped[path] = max(self._skipped.get(path, 0), expected - good)

  # ------------------------------------------------------------------------------ tf.data
  def _epoch_dataset(self, epoch: int, batch_size: int, drop_remainder: bool = True):
    tf = _tf()
    files = list(self.host_files)
    if self.shuffle:
      order = np.random.default_rng([self.seed, epoch, 1]).permutation(len(files))
      files = [files[i] for i in order]
    ds = tf.data.Dataset.from_tensor_slices(files)
    if self.skip_corrupt_records:  # the same records, each checksum checked here, damage skipped
      read = tf.autograph.experimental.do_not_convert(
          lambda path: tf.data.Dataset.from_generator(
              self._checked_records, args=(path,),
              output_signature=tf.TensorSpec((), tf.string)))
    else:
      read = tf.data.TFRecordDataset
    # Deterministic interleave of a few files at once: parallel reads, same order every time.
    ds = ds.interleave(read, cycle_length=min(4, len(files)), block_length=1,
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if self._record_shard is not None:
      ds = ds.shard(*self._record_shard)
    if self.shuffle:
      ds = ds.shuffle(self.shuffle_buffer_size, seed=int(np.random.default_rng(
          [self.seed, epoch, 2]).integers(2**31)), reshuffle_each_iteration=False)
    return ds.batch(batch_size, drop_remainder=drop_remainder)

  def _parse(self, ds):
    tf = _tf()
    spec = self.feature_spec

    def parse(serialized):
      parsed = tf.io.parse_example(serialized, spec)
      return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}
    ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    options.deterministic = True
    options.threading.private_threadpool_size = max(2, min(16, os.cpu_count() or 2))
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)

  def _mask(self, batch: dict[str, np.ndarray], seed: Sequence[int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if self.packed:  # instance by instance, as unpacked ones
      masked = packing.mask_rows(batch, self.masking_config, rng)
      batch.pop(features.WORD_STARTS, None)
    else:
      word_starts = batch.pop(features.WORD_STARTS, None)
      masked = masking.mask_batch(batch[features.INPUT_IDS], batch[features.INPUT_MASK],
                                  self.masking_config, rng, word_starts)
    out = dict(batch)
    out.update({k: np.asarray(v, np.float32 if k == features.MASKED_LM_WEIGHTS else np.int32)
                for k, v in masked.items()})
    return out

  # ----------------------------------------------------------------------------- iteration
  def _record_batches(self, position: dict[str, int] | None, batch_size: int,
                      drop_remainder: bool = True
                      ) -> Iterator[tuple[dict[str, np.ndarray], int, int]]:
    """Parsed batches of `batch_size` records, epoch after epoch, from `position` on: yields
    `(batch, epoch, its index in the epoch)`."""
    data_loss_error = _tf().errors.DataLossError  # held: module attributes vanish at exit
    epoch = int((position or {}).get("epoch", 0))
    index = int((position or {}).get("batch", 0))
    while True:
      ds = self._epoch_dataset(epoch, batch_size, drop_remainder)
      if index:
        ds = ds.skip(index)  # skips serialized batches: no parsing, no masking
      produced = 0
      try:
        for batch in self._parse(ds).as_numpy_iterator():
          yield batch, epoch, index
          index += 1
          produced += 1
      except data_loss_error as e:
        said = re.search(r"(corrupted|truncated) record at \d+", e.message or "")
        said = f" (tf.data: {said.group()})" if said else ""
        raise ValueError(f"Corrupt pre-training record: {_find_corrupt_record(self.host_files)}"
                         f"{said}. Re-create the file with data_prep, or {SKIP_HINT}.") from e
      if not self.repeat:
        return
      if produced == 0 and index == 0:
        raise ValueError(f"{len(self.host_files)} files on host {self.process_index} hold fewer "
                         f"than one batch of {batch_size} records.")
      epoch, index = epoch + 1, 0

  def host_batches(self, position: dict[str, int] | None = None
                   ) -> Iterator[tuple[dict[str, np.ndarray], dict[str, int]]]:
    """Yields `(host_batch, position_after_it)` from `position` on."""
    if self.packs_online:
      yield from self._packed_online(position)
      return
    for batch, epoch, index in self._record_batches(position, self.host_batch_size):
      if self.masking_mode == features.DYNAMIC:
        batch = self._mask(batch, [self.seed, epoch, index, self.process_index, 3])
      yield batch, {"epoch": epoch, "batch": index + 1}

  def _packed_online(self, position: dict[str, int] | None
                     ) -> Iterator[tuple[dict[str, np.ndarray], dict[str, int]]]:
    """Packed rows made from unpacked dynamic-masking records as they are read.

    Records are read in groups of `max_sequences_per_row` batches' worth (at least
    `ONLINE_PACKING_GROUP` records: a packer that sees more lengths leaves less room); each is packed
    on its own (`packing.pack`, with each row's masked-LM budget kept, as data_prep packs) into
    rows in a seeded order, and the rows go out `host_batch_size` at a time, a batch taking
    rows from the next group when one runs out. The position after a batch is where its next
    row lies — `{"epoch", "batch": group, "row": row in the group's packing}` — so a resumed
    stream repacks that group and skips the rows already trained on: the same rows, the same
    masks. A group at the end of an epoch may be short (nothing is dropped); in a stream that
    does not repeat, a last batch that the rows cannot fill is dropped, as for unpacked rows.
    """
    k = self.max_sequences_per_row
    length, budget = self.max_seq_length, self.max_predictions_per_seq
    costs = packing.prediction_costs(length, self.masking_config.masked_lm_prob, budget)
    skip = int((position or {}).get("row", 0))
    n = self.host_batch_size
    pending: dict[str, np.ndarray] = {}  # rows not yet given out, oldest first
    owners = np.zeros((0, 3), np.int64)  # per pending row: (epoch, group, row)
    group_size = max(self.host_batch_size * k, ONLINE_PACKING_GROUP)
    for batch, epoch, group in self._record_batches(position, group_size, drop_remainder=False):
      lengths = batch[features.INPUT_MASK].sum(1)
      placed = packing.pack(lengths, length, k, costs=costs, max_cost=budget,
                            rng=np.random.default_rng([self.seed, epoch, group,
                                                       self.process_index, 4]))
      rows = packing.pack_rows(batch, placed.row, placed.slot, placed.offset, placed.num_rows, k)
      tags = np.stack([np.full(placed.num_rows, epoch), np.full(placed.num_rows, group),
                       np.arange(placed.num_rows)], 1)
      pending = {name: np.concatenate([pending[name], values[skip:]]) if pending
                 else values[skip:] for name, values in rows.items()}
      owners = np.concatenate([owners, tags[skip:]])
      skip = 0
      while len(owners) >= n:
        out = {name: values[:n] for name, values in pending.items()}
        pending = {name: values[n:] for name, values in pending.items()}
        first, owners = owners[0], owners[n:]
        out = self._mask({name: values.astype(np.int32) if values.dtype.kind in "iu" else values
                          for name, values in out.items()},
                         [self.seed, *(int(x) for x in first), self.process_index, 5])
        if len(owners):
          after = {"epoch": int(owners[0, 0]), "batch": int(owners[0, 1]),
                   "row": int(owners[0, 2])}
        else:
          after = {"epoch": epoch, "batch": group + 1, "row": 0}
        yield out, after

  def global_batches(self, position: dict[str, int] | None = None
                     ) -> Iterator[tuple[dict[str, jax.Array], dict[str, int]]]:
    """Yields `(global_batch, position_after_it)`; arrays sharded as `self.sharding`."""
    for host_batch, pos in self.host_batches(position):
      yield self.to_global(host_batch), pos

  def to_global(self, host_batch: dict[str, np.ndarray]) -> dict[str, Any]:
    if self.sharding is None:
      return host_batch
    return {k: jax.make_array_from_process_local_data(
        self.sharding, v, (self.global_batch_size,) + v.shape[1:]) for k, v in host_batch.items()}


def split_train_eval(files: Sequence[str], eval_files: Sequence[str] | None,
                     holdout_fraction: float = 0.05) -> tuple[list[str], list[str]]:
  """Training and held-out evaluation files. Without explicit eval files, the last shards
  (≥1, about `holdout_fraction` of them) are held out; a single file cannot be split."""
  files = sorted(files)
  if eval_files:
    overlap = sorted(set(files) & set(eval_files))
    if overlap:
      raise ValueError(f"Evaluation files are also training files: {overlap[:3]}")
    return files, sorted(eval_files)
  if len(files) < 2:
    raise ValueError(f"Only {len(files)} training file; name evaluation files explicitly or "
                     "write several shards so one can be held out.")
  n_eval = max(1, int(round(len(files) * holdout_fraction)))
  return files[:-n_eval], files[-n_eval:]
