"""Fine-tuning examples packed into rows, and the model's outputs cut back out per example.

GLUE sentences average a few dozen tokens at `max_seq_length=128` and short SQuAD contexts
leave a window half empty, so most of an unpacked batch's compute goes to padding. Packing lays
several examples back to back in one row, in the packed layout of pre-training
(`data/packing.py`, `text/features.py`): per-token `sequence_ids` (1..k, 0 on padding) keep
attention inside each example, `position_ids` restart at 0 for each, and `cls_positions`
(rows, k) say where each example's [CLS] is. Which examples share a row is `packing.pack`'s
decision (the same first-fit-decreasing packer as pre-training); the rows are laid by
`packing.pack_rows`.

What a training step means does not change: the batch is the same `train_batch_size` examples
in the same shuffled order (`arrays.training_batches` picks them, then they are packed), and
per-example columns (`label`, `weight`, SQuAD's `start_positions`) become (rows, k), with
weight 0 in unused slots, so losses that average over the weights still average over examples.
The number of rows varies from batch to batch; it is rounded up to a power of two (padded with
weight-0 rows), so a run compiles a handful of shapes, never more rows than the unpacked batch.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np

from bert_jax.data import arrays, packing
from bert_jax.text import features


class Placement(NamedTuple):
  """Where each example went: its row, slot and first position in the row, and its length."""
  row: np.ndarray
  slot: np.ndarray
  offset: np.ndarray
  length: np.ndarray


def max_sequences_per_row(requested: int, max_seq_length: int) -> int:
  """Slots per row: an example is at least `[CLS] [SEP]`, so more than half the row length
  could never be used (and the slot axis then never looks like a token axis to
  `arrays.trim_to_bucket`)."""
  return max(1, min(int(requested), max_seq_length // 2))


def pack_examples(feats: Mapping[str, np.ndarray], max_sequences_per_row: int,
                  position_columns: Sequence[str] = ()) -> tuple[dict[str, np.ndarray], Placement]:
  """Examples in the unpacked layout → packed rows, and where each example went.

  Token columns (n, S) must be the encoder inputs; every (n,) column (labels, `weight`) becomes
  (rows, k) with 0 in unused slots, and those named in `position_columns` (positions in the
  example, e.g. SQuAD's answer span) are moved to positions in the row.
  """
  input_mask = np.asarray(feats[features.INPUT_MASK])
  n, length = input_mask.shape
  lengths = input_mask.astype(bool).sum(1)
  k = max_sequences_per_row
  placed = packing.pack(lengths, length, k)
  tokens = {}
  for name, values in feats.items():
    values = np.asarray(values)
    if values.ndim == 2 and values.shape[1] == length:
      if name not in features.ENCODER_INPUTS:
        raise ValueError(f"cannot pack the per-token column {name!r}.")
      tokens[name] = values
  rows = packing.pack_rows(tokens, placed.row, placed.slot, placed.offset, placed.num_rows, k)
  rows.pop(features.NEXT_SENTENCE_WEIGHTS)  # the examples' own weights say which slots count
  out = {name: values.astype(np.int32) for name, values in rows.items()}
  for name, values in feats.items():
    values = np.asarray(values)
    if values.ndim != 1:
      continue
    if name in position_columns:
      values = values + placed.offset.astype(values.dtype)
    per_slot = np.zeros((placed.num_rows, k), values.dtype)
    per_slot[placed.row, placed.slot] = values
    out[name] = per_slot
  return out, Placement(placed.row, placed.slot, placed.offset, lengths)


def bucket_rows(num_rows: int, multiple: int, max_rows: int) -> int:
  """Rows a packed batch is padded to: a power of two (a few compiled shapes), a multiple of
  `multiple` (rows split evenly over processes, data-parallel devices and micro-batches), and
  no more than `max_rows` (the unpacked batch) rounded up to `multiple`."""
  rows = 1
  while rows < num_rows:
    rows *= 2
  rows = min(rows, max_rows)
  return max(multiple, -(-rows // multiple) * multiple)


def batch_packer(max_sequences_per_row: int, *, multiple: int, max_rows: int,
                 position_columns: Sequence[str] = ()
                 ) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
  """What `arrays.training_batches` applies to each batch it picked: the real examples (the
  weight-0 fillers of a last partial batch add nothing) packed, padded to `bucket_rows`."""
  def pack_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    real = np.asarray(batch["weight"]) > 0
    if real.any() and not real.all():
      batch = {name: values[real] for name, values in batch.items()}
    rows, _ = pack_examples(batch, max_sequences_per_row, position_columns)
    return arrays.pad_rows(rows, bucket_rows(len(rows["weight"]), multiple, max_rows))
  return pack_batch


class Efficiency(NamedTuple):
  """How well a stream of batches packs."""
  examples: int
  rows: int          # packed rows, before the padding of the last bucket
  bucketed_rows: int
  tokens: int        # real tokens
  max_seq_length: int
  unpacked_rows: int  # what the same batches take unpacked (a partial one padded to full)

  def describe(self) -> str:
    def share(rows: int) -> float:  # real tokens / row tokens
      return self.tokens / max(1, rows * self.max_seq_length)
    return (f"{self.examples} examples in {self.rows} rows ({self.bucketed_rows} with bucket "
            f"padding, {self.unpacked_rows} unpacked), efficiency {share(self.rows):.3f} "
            f"({share(self.bucketed_rows):.3f} with bucket padding, "
            f"{share(self.unpacked_rows):.3f} unpacked)")


def efficiency(input_mask: np.ndarray, batches: Sequence[np.ndarray], max_sequences_per_row: int,
               *, multiple: int, max_rows: int) -> Efficiency:
  """How the given batches (index arrays into the examples) pack, as `batch_packer` packs them
  (`max_rows`: the unpacked batch)."""
  lengths = np.asarray(input_mask).astype(bool).sum(1)
  length = np.shape(input_mask)[1]
  examples = rows = bucketed = 0
  for batch in batches:
    placed = packing.pack(lengths[batch], length, max_sequences_per_row)
    examples += len(batch)
    rows += placed.num_rows
    bucketed += bucket_rows(placed.num_rows, multiple, max_rows)
  tokens = int(sum(lengths[batch].sum() for batch in batches))
  return Efficiency(examples, rows, bucketed, tokens, length, len(batches) * max_rows)


def per_example(outputs: np.ndarray, placement: Placement) -> np.ndarray:
  """(rows, k, ...) per-slot outputs (classification logits) → (n, ...) per example."""
  return np.asarray(outputs)[placement.row, placement.slot]


def per_window(outputs: np.ndarray, placement: Placement, max_seq_length: int,
               fill: float = -1e9) -> np.ndarray:
  """(rows, S) per-token outputs (SQuAD start/end logits) → (n, max_seq_length) in each
  example's own positions; positions past an example's end (its padding, unpacked) get `fill`,
  so n-best post-processing never proposes them."""
  outputs = np.asarray(outputs)
  n = len(placement.row)
  out = np.full((n, max_seq_length), fill, outputs.dtype)
  position = np.arange(max_seq_length)
  inside = position[None, :] < placement.length[:, None]
  source = np.minimum(placement.offset[:, None] + position[None, :], outputs.shape[1] - 1)
  taken = outputs[placement.row[:, None], source]
  out[inside] = taken[inside]
  return out
