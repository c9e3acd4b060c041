"""In-memory features (fine-tuning and inference inputs) → global batches.

Rows are dicts of numpy arrays with a `weight` column (1 = a real example). A batch that the
rows do not fill is padded with weight-0 copies of its first row, so every example is trained
on and counted and none is dropped; losses and metrics are weighted, so padding changes nothing.
`trim_to_bucket` cuts padding columns that no row of a batch uses, to a power of two (a handful
of compiled shapes), which is several times faster on short-sentence tasks.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import jax
import numpy as np


def pad_rows(feats: dict[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
  """Pads to a multiple of `multiple` rows with weight-0 copies of row 0 (never counted)."""
  n = len(feats["weight"])
  pad = (-n) % multiple
  if not pad:
    return feats
  out = {}
  for k, v in feats.items():
    filler = np.repeat(v[:1], pad, axis=0)
    if k == "weight":
      filler = np.zeros_like(filler)
    out[k] = np.concatenate([v, filler])
  return out


def trim_to_bucket(batch: dict[str, np.ndarray], min_length: int = 16) -> dict[str, np.ndarray]:
  """Cuts the padding columns no row of the batch uses, down to a power-of-two length.

  Short-sentence tasks (SST-2, CoLA) use a fraction of `max_seq_length`; computing only the
  columns needed is several times faster, and rounding up to powers of two keeps the number of
  compiled shapes at a handful. Results are unchanged: padded positions are masked anyway.
  """
  rows = batch["input_ids"].shape[:-1]  # (batch,) or, for multiple choice, (batch, choices)
  full = batch["input_ids"].shape[-1]
  used = int(batch["input_mask"].sum(axis=-1).max(initial=1))
  length = min_length
  while length < used:
    length *= 2
  length = min(length, full)
  if length == full:
    return batch
  # Per-token arrays (ids, masks, per-token labels) end in the sequence axis.
  return {k: (v[..., :length] if v.shape == rows + (full,) else v) for k, v in batch.items()}


def to_global(batch: dict[str, np.ndarray], sharding) -> dict[str, jax.Array]:
  """The global batch from this host's rows (every host holds the same rows here)."""
  n = len(batch["weight"])
  per_host = n // jax.process_count()
  lo = jax.process_index() * per_host
  return {k: jax.make_array_from_process_local_data(sharding, v[lo:lo + per_host], v.shape)
          for k, v in batch.items()}


def check_batch_size(batch_size: int, process_count: int | None = None,
                     field: str = "train_batch_size", flag: str = "--train_batch_size") -> None:
  """A batch must give every process the same positive number of rows; otherwise a ValueError
  naming the setting (`field`, set with `flag`) instead of a division by zero or tf.data's
  complaint several layers down."""
  process_count = jax.process_count() if process_count is None else process_count
  if (isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or
      batch_size <= 0 or batch_size % process_count):
    raise ValueError(f"{field}={batch_size!r}: must be a positive multiple of the number of "
                     f"processes ({process_count}); set {flag}.")


def steps_per_epoch(num_rows: int, batch_size: int) -> int:
  """Batches in one pass over every row (the last one padded)."""
  check_batch_size(batch_size)
  return max(1, math.ceil(num_rows / batch_size))


def epoch_order(num_rows: int, seed: Any, epoch: int) -> np.ndarray:
  """The rows of epoch `epoch` in training order: the permutation `default_rng([*seed, e])`."""
  seed = list(seed) if isinstance(seed, (list, tuple)) else [seed]
  return np.random.default_rng([*seed, epoch]).permutation(num_rows)


def training_batches(feats: dict[str, np.ndarray], batch_size: int, sharding, *, seed: Any,
                     trim: bool, position: dict[str, int] | None = None,
                     pack: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None
                     ) -> Iterator[tuple[dict[str, jax.Array], dict[str, int]]]:
  """Endless shuffled epochs over every row: yields `(global_batch, position_after_it)`.

  Epoch `e` is `epoch_order(n, seed, e)`, so the stream is a function of the seed alone and
  resumes exactly from a `{"epoch", "batch"}` position. `pack` (fine-tuning's sequence packing,
  `data/packed_examples.batch_packer`) turns each batch's examples into packed rows after they
  are picked, so packing changes neither the examples of a step nor the resume positions.
  """
  n = len(feats["weight"])
  if n == 0:
    raise ValueError("No training examples.")
  check_batch_size(batch_size)
  per_epoch = steps_per_epoch(n, batch_size)
  epoch = int((position or {}).get("epoch", 0))
  index = int((position or {}).get("batch", 0))
  while True:
    order = epoch_order(n, seed, epoch)
    for b in range(index, per_epoch):
      rows = order[b * batch_size:(b + 1) * batch_size]
      batch = pad_rows({k: v[rows] for k, v in feats.items()}, batch_size)
      if pack is not None:
        batch = pack(batch)
      if trim:
        batch = trim_to_bucket(batch)
      yield to_global(batch, sharding), {"epoch": epoch, "batch": b + 1}
    epoch, index = epoch + 1, 0
