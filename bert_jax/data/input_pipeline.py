"""Pre-training TFRecords → per-host tf.data → global batches sharded over the mesh.

Every host reads its own files (files are dealt round-robin by process index; with fewer files
than hosts, records are dealt instead), shuffles, batches its share of the global batch, parses
with the schema of `features.py`, and the hosts' arrays are assembled into one global
`jax.Array` per feature with `jax.make_array_from_process_local_data`.

The stream is a pure function of (seed, epoch, batch index): epoch `e` reads the files in a
seeded order with a seeded shuffle, and dynamic masks are drawn with `masking.py` from a
generator seeded by (seed, epoch, batch, process). So the position `{"epoch", "batch"}` is all
a checkpoint needs to resume the exact batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Sequence

import jax
import numpy as np

from bert_jax import file_io
from bert_jax.text import features, masking

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


_tf = file_io.tensorflow


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


def detect_masking(path: str) -> str:
  """'static' for records with masked-LM features, 'dynamic' for unmasked ones."""
  lengths = record_lengths(path)
  return features.STATIC if features.MASKED_LM_POSITIONS in lengths else features.DYNAMIC


def check_record_shapes(path: str, max_seq_length: int, max_predictions_per_seq: int,
                        masking_mode: str) -> None:
  """Compares the first record of `path` with the schema the config implies; names the feature
  and both sizes when they disagree (instead of tf.data's parse error mid-training)."""
  lengths = record_lengths(path)
  for f in features.pretraining_features(max_seq_length, max_predictions_per_seq, masking_mode):
    if f.name not in lengths:
      raise ValueError(f"{path}: records have no feature {f.name!r} (have {sorted(lengths)}); "
                       f"expected {masking_mode}-masking pre-training records.")
    if lengths[f.name] != f.length:
      what = ("max_seq_length" if f.length == max_seq_length and f.name != features.NEXT_SENTENCE_LABELS
              else "max_predictions_per_seq")
      raise ValueError(f"{path}: feature {f.name!r} has {lengths[f.name]} values per record but "
                       f"the config expects {f.length} ({what}={f.length}). Re-create the data "
                       f"or set the config to match.")


def _find_corrupt_record(files: Sequence[str]) -> str:
  """Names the file and byte offset of the first unreadable record (run only after a failure)."""
  tf = _tf()
  for path in files:
    try:
      for _ in tf.data.TFRecordDataset(path):
        pass
    except tf.errors.DataLossError as e:
      return f"{path}: {e.message.splitlines()[0]}"
  return "no corrupt record found on a second read"


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
  """

  def __init__(self, file_patterns: str | Sequence[str], *, global_batch_size: int,
               max_seq_length: int, max_predictions_per_seq: int,
               sharding: jax.sharding.Sharding | None, seed: int = 0,
               masking_config: masking.MaskingConfig | None = None, shuffle: bool = True,
               repeat: bool = True, shuffle_buffer_size: int = 10000,
               process_index: int | None = None, process_count: int | None = None,
               files: Sequence[str] | None = None):
    self.files = list(files) if files is not None else list_files(file_patterns)
    self.process_index = jax.process_index() if process_index is None else process_index
    self.process_count = jax.process_count() if process_count is None else process_count
    if global_batch_size % self.process_count:
      raise ValueError(f"global_batch_size={global_batch_size} is not divisible by the "
                       f"{self.process_count} hosts.")
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
    self.masking_mode = detect_masking(self.host_files[0])
    for path in self.host_files[:1] + self.host_files[-1:]:
      check_record_shapes(path, max_seq_length, max_predictions_per_seq, self.masking_mode)
    if self.masking_mode == features.DYNAMIC:
      if masking_config is None:
        raise ValueError(f"{self.host_files[0]}: dynamic-masking records need a masking config "
                         "(vocabulary size and the [MASK]/[CLS]/[SEP] ids).")
      if masking_config.max_predictions_per_seq != max_predictions_per_seq:
        masking_config = masking.MaskingConfig(**{
            **masking_config.__dict__, "max_predictions_per_seq": max_predictions_per_seq})
    self.masking_config = masking_config
    self.feature_spec = features.tf_feature_spec(max_seq_length, max_predictions_per_seq,
                                                 self.masking_mode)

  # ------------------------------------------------------------------------------ tf.data
  def _epoch_dataset(self, epoch: int):
    tf = _tf()
    files = list(self.host_files)
    if self.shuffle:
      order = np.random.default_rng([self.seed, epoch, 1]).permutation(len(files))
      files = [files[i] for i in order]
    ds = tf.data.Dataset.from_tensor_slices(files)
    # Deterministic interleave of a few files at once: parallel reads, same order every time.
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(4, len(files)), block_length=1,
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if self._record_shard is not None:
      ds = ds.shard(*self._record_shard)
    if self.shuffle:
      ds = ds.shuffle(self.shuffle_buffer_size, seed=int(np.random.default_rng(
          [self.seed, epoch, 2]).integers(2**31)), reshuffle_each_iteration=False)
    ds = ds.batch(self.host_batch_size, drop_remainder=True)
    return ds

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

  def _mask(self, batch: dict[str, np.ndarray], epoch: int, index: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([self.seed, epoch, index, self.process_index, 3])
    word_starts = batch.pop(features.WORD_STARTS, None)
    masked = masking.mask_batch(batch[features.INPUT_IDS], batch[features.INPUT_MASK],
                                self.masking_config, rng, word_starts)
    out = dict(batch)
    out.update({k: np.asarray(v, np.float32 if k == features.MASKED_LM_WEIGHTS else np.int32)
                for k, v in masked.items()})
    return out

  # ----------------------------------------------------------------------------- iteration
  def host_batches(self, position: dict[str, int] | None = None
                   ) -> Iterator[tuple[dict[str, np.ndarray], dict[str, int]]]:
    """Yields `(host_batch, position_after_it)` from `position` on."""
    data_loss_error = _tf().errors.DataLossError  # held: module attributes vanish at exit
    epoch = int((position or {}).get("epoch", 0))
    index = int((position or {}).get("batch", 0))
    while True:
      ds = self._epoch_dataset(epoch)
      if index:
        ds = ds.skip(index)  # skips serialized batches: no parsing, no masking
      produced = 0
      try:
        for batch in self._parse(ds).as_numpy_iterator():
          if self.masking_mode == features.DYNAMIC:
            batch = self._mask(batch, epoch, index)
          index += 1
          produced += 1
          yield batch, {"epoch": epoch, "batch": index}
      except data_loss_error as e:
        raise ValueError(f"Corrupt pre-training record: {_find_corrupt_record(self.host_files)}"
                         ) from e
      if not self.repeat:
        return
      if produced == 0 and index == 0:
        raise ValueError(f"{len(self.host_files)} files on host {self.process_index} hold fewer "
                         f"than one batch of {self.host_batch_size} records.")
      epoch, index = epoch + 1, 0

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
