"""Sequence packing: several `[CLS] A [SEP] B [SEP]` instances per row, without cross-contamination.

Rows padded to `max_seq_length` waste a fifth of the compute at 512 on books and over half on
corpora of short documents. Krell et al. 2021 ("Efficient Sequence Packing without
Cross-contamination", arXiv 2107.02027) lay several instances back to back in one row; the
model keeps them apart with per-token sequence ids (attention never crosses instances) and
positions that restart at 0 for each instance, and reads each instance's [CLS] for its
next-sentence label. The row layout is the packed schema of `bert_jax/text/features.py`.

Three pieces, used by `data_prep` (offline) and the input pipeline (online) alike:

* `pack` decides which instances share a row, from their lengths only, over the histogram of
  lengths (Krell et al.'s histogram packing: the work grows with the number of distinct lengths
  and row shapes, not with the number of instances). It is first-fit decreasing made to mind
  the row's slots: each row starts with the longest instance left, each further slot takes the
  longest instance that fits in its fair share of what is left (room / slots left, and of the
  masked-LM budget likewise), the last slot the longest that fits, and identical rows are made
  in bulk. Plain decreasing packing (Krell et al.'s SPFHP, first-fit decreasing) pairs long
  instances with long ones, and where `max_sequences_per_row` binds (short documents) leaves
  the short ones three to a mostly empty row: on such histograms it packed worse than first
  fit in random order, which this beats (tests/unit/data/test_packing_data.py). A row holds at most `max_sequences_per_row` instances, and, when
  the masked-LM budget is given, its instances' predictions add up to at most
  `max_predictions_per_seq` (the budget is per row for packed data: e.g. 80 at 512).
* `pack_rows` / `unpack_rows` lay instances (rows of the unpacked layout) into packed rows and
  cut them back out, masked-LM features included: unpack(pack(x)) == x.
* `mask_rows` masks packed rows (the input pipeline's dynamic masking) by cutting the
  instances out, masking them with `masking.mask_batch` exactly as unpacked instances are
  masked (each instance gets its own ~15%, [CLS]/[SEP] are never chosen, whole words never
  reach across an instance boundary), and laying the predictions back; data_prep masks the
  instances with the same call before it lays them into rows. So packed and unpacked data have
  the same masking statistics, with one implementation of the rules.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple

import numpy as np

from bert_jax.text import features, masking

DEFAULT_MAX_SEQUENCES_PER_ROW = 3  # Krell et al.: three per row already packs >99% at 512


class Packing(NamedTuple):
  """Where each instance goes: row, slot in the row (0..K-1, in row order) and first position."""
  row: np.ndarray     # int64, per instance
  slot: np.ndarray    # int64, per instance
  offset: np.ndarray  # int64, per instance
  num_rows: int

  def efficiency(self, lengths: np.ndarray, max_seq_length: int) -> float:
    """Real tokens / row tokens."""
    return float(np.sum(lengths)) / max(1, self.num_rows * max_seq_length)


def pack(lengths: np.ndarray, max_seq_length: int, max_sequences_per_row: int, *,
         costs: np.ndarray | None = None, max_cost: int | None = None,
         rng: np.random.Generator | None = None) -> Packing:
  """Assigns instances of the given lengths to rows (see the module docstring).

  `costs[length]` (e.g. masked-LM predictions of an instance of that length) with `max_cost`
  adds a second budget per row. Instances of equal length are placed in the order given; with
  `rng` the rows come out in a random order (else grouped by their contents).
  """
  lengths = np.asarray(lengths, np.int64)
  if max_sequences_per_row < 1:
    raise ValueError(f"max_sequences_per_row={max_sequences_per_row}: must be at least 1.")
  if lengths.size and (lengths.min() < 1 or lengths.max() > max_seq_length):
    raise ValueError(f"instance lengths must lie in [1, {max_seq_length}], got "
                     f"[{lengths.min()}, {lengths.max()}].")
  if costs is None:
    cost_table, budget = np.zeros(max_seq_length + 1, np.int64), 0
  else:
    cost_table = np.asarray(costs, np.int64)
    budget = int(max_cost)
    if lengths.size and cost_table[lengths].max() > budget:
      raise ValueError(f"an instance alone costs {cost_table[lengths].max()} > {budget}.")
  histogram = np.bincount(lengths, minlength=max_seq_length + 1).astype(np.int64)
  groups: list[tuple[int, tuple[int, ...]]] = []  # (rows, their instances' lengths)
  while histogram.any():
    left = histogram.copy()
    room, budget_left, contents = max_seq_length, budget, []
    while len(contents) < max_sequences_per_row:
      fits = left[:room + 1] > 0
      if costs is not None:
        fits &= cost_table[:room + 1] <= budget_left
      candidates = np.flatnonzero(fits)
      if not candidates.size:
        break
      slots = max_sequences_per_row - len(contents)
      length = int(candidates[-1])
      if contents and slots > 1:  # leave the slots after this one their share
        share = fits[:room // slots + 1]
        if costs is not None:
          share = share & (cost_table[:share.size] <= budget_left // slots)
        within_share = np.flatnonzero(share)
        if within_share.size:
          length = int(within_share[-1])
      contents.append(length)
      left[length] -= 1
      room -= length
      budget_left -= int(cost_table[length])
    used = np.bincount(contents, minlength=max_seq_length + 1)
    # The same row again while every length in it has instances left: the choices above
    # depend only on which lengths are left, so one pass makes all the identical rows.
    repeat = int((histogram[used > 0] // used[used > 0]).min())
    histogram -= repeat * used
    groups.append((repeat, tuple(contents)))

  # Expand the groups into rows and slots (one array operation per group and slot).
  slot_row, slot_index, slot_length, slot_offset = [], [], [], []
  first_row = 0
  for count, contents in groups:
    rows = np.arange(first_row, first_row + count, dtype=np.int64)
    offset = 0
    for slot, length in enumerate(contents):
      slot_row.append(rows)
      slot_index.append(np.full(count, slot, np.int64))
      slot_length.append(np.full(count, length, np.int64))
      slot_offset.append(np.full(count, offset, np.int64))
      offset += length
    first_row += count
  num_rows = first_row
  if not groups:
    empty = np.zeros(0, np.int64)
    return Packing(empty, empty, empty, 0)
  slot_row, slot_index, slot_length, slot_offset = (
      np.concatenate(a) for a in (slot_row, slot_index, slot_length, slot_offset))
  # The slots of each length take the instances of that length, in order.
  by_length_slots = np.argsort(slot_length, kind="stable")
  by_length_items = np.argsort(lengths, kind="stable")
  take = np.empty(lengths.size, np.int64)
  take[by_length_items] = by_length_slots
  row = slot_row[take]
  if rng is not None:
    row = rng.permutation(num_rows)[row]
  return Packing(row, slot_index[take], slot_offset[take], num_rows)


def row_order(packing: Packing) -> tuple[np.ndarray, np.ndarray]:
  """The instances in row order (row by row, slot by slot), and where each row's begin there
  (num_rows + 1 offsets)."""
  order = np.lexsort((packing.slot, packing.row))
  counts = np.bincount(packing.row, minlength=packing.num_rows)
  return order, np.concatenate([[0], np.cumsum(counts)])


_TOKEN_FEATURES = (features.INPUT_IDS, features.INPUT_MASK, features.SEGMENT_IDS,
                   features.WORD_STARTS)
_MASKED_LM = (features.MASKED_LM_POSITIONS, features.MASKED_LM_IDS, features.MASKED_LM_WEIGHTS)


def pack_rows(instances: Mapping[str, np.ndarray], row: np.ndarray, slot: np.ndarray,
              offset: np.ndarray, num_rows: int, max_sequences_per_row: int,
              max_predictions_per_seq: int | None = None) -> dict[str, np.ndarray]:
  """Packed rows from instances in the unpacked layout (`instances[name]`: (n, S) rows, and
  `next_sentence_labels` (n, 1) where there are any); instance i goes to `row[i]`
  (0..num_rows-1), slot `slot[i]`, from position `offset[i]`. Masked-LM features, if there,
  are laid into `max_predictions_per_seq` slots per row (raises if a row's instances have more
  predictions than that)."""
  input_mask = np.asarray(instances[features.INPUT_MASK]).astype(bool, copy=False)
  n, length = input_mask.shape
  row, slot, offset = (np.asarray(a, np.int64) for a in (row, slot, offset))
  k = max_sequences_per_row
  if n and (slot.max() >= k or (offset + input_mask.sum(1)).max() > length):
    raise ValueError("instances do not fit the rows (slot or end beyond the row).")
  instance, position = np.nonzero(input_mask)  # row-major: the values of `x[input_mask]`
  where = row[instance] * length + offset[instance] + position
  out: dict[str, np.ndarray] = {}
  for name in _TOKEN_FEATURES:
    if name in instances:
      values = np.asarray(instances[name])
      packed = np.zeros(num_rows * length, values.dtype)
      packed[where] = values[input_mask]
      out[name] = packed.reshape(num_rows, length)
  position_ids = np.zeros(num_rows * length, np.int64)
  position_ids[where] = position
  sequence_ids = np.zeros(num_rows * length, np.int64)
  sequence_ids[where] = slot[instance] + 1
  out[features.POSITION_IDS] = position_ids.reshape(num_rows, length)
  out[features.SEQUENCE_IDS] = sequence_ids.reshape(num_rows, length)
  cls_positions = np.zeros((num_rows, k), np.int64)
  cls_positions[row, slot] = offset
  weights = np.zeros((num_rows, k), np.float32)
  weights[row, slot] = 1.0
  out[features.CLS_POSITIONS] = cls_positions
  if features.NEXT_SENTENCE_LABELS in instances:  # fine-tuning examples carry their own labels
    labels = np.zeros((num_rows, k), np.int64)
    labels[row, slot] = np.asarray(instances[features.NEXT_SENTENCE_LABELS]).reshape(n)
    out[features.NEXT_SENTENCE_LABELS] = labels
  out[features.NEXT_SENTENCE_WEIGHTS] = weights
  if features.MASKED_LM_WEIGHTS in instances:
    out.update(_lay_predictions(instances, row, slot, offset, num_rows, k,
                                int(max_predictions_per_seq)))
  return out


def _lay_predictions(instances: Mapping[str, np.ndarray], row: np.ndarray, slot: np.ndarray,
                     offset: np.ndarray, num_rows: int, k: int, width: int
                     ) -> dict[str, np.ndarray]:
  """The instances' masked-LM features laid into `width` slots per row, slot by slot, with
  positions in the row."""
  chosen = np.asarray(instances[features.MASKED_LM_WEIGHTS]) > 0  # a prefix of each row
  count = chosen.sum(1)
  per_slot = np.zeros((num_rows, k), np.int64)
  per_slot[row, slot] = count
  starts = np.cumsum(per_slot, axis=1) - per_slot  # where each slot's predictions begin
  totals = per_slot.sum(1)
  if num_rows and totals.max() > width:
    raise ValueError(f"a packed row's instances have {totals.max()} masked-LM predictions, "
                     f"more than max_predictions_per_seq={width} per row.")
  instance, j = np.nonzero(chosen)
  target = row[instance] * width + starts[row[instance], slot[instance]] + j
  positions = np.asarray(instances[features.MASKED_LM_POSITIONS])
  out = {}
  for name, values in ((features.MASKED_LM_POSITIONS, positions[chosen] + offset[instance]),
                       (features.MASKED_LM_IDS,
                        np.asarray(instances[features.MASKED_LM_IDS])[chosen]),
                       (features.MASKED_LM_WEIGHTS,
                        np.asarray(instances[features.MASKED_LM_WEIGHTS])[chosen])):
    packed = np.zeros(num_rows * width, np.asarray(instances[name]).dtype)
    packed[target] = values
    out[name] = packed.reshape(num_rows, width)
  return out


def unpack_rows(rows: Mapping[str, np.ndarray], max_predictions_per_seq: int | None = None
                ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
  """The instances of packed rows in the unpacked layout, row by row and slot by slot, and
  each one's (row, slot, offset) — what `pack_rows` takes to lay them back. Masked-LM
  features come out `max_predictions_per_seq` wide (default: as wide as the rows')."""
  sequence_ids = np.asarray(rows[features.SEQUENCE_IDS]).astype(np.int64, copy=False)
  num_rows, length = sequence_ids.shape
  k = np.shape(rows[features.CLS_POSITIONS])[1]
  present = np.asarray(rows[features.NEXT_SENTENCE_WEIGHTS]) > 0
  row, slot = np.nonzero(present)
  cls_positions = np.asarray(rows[features.CLS_POSITIONS]).astype(np.int64)
  # An instance ends where the next one in its row starts, the last one where the row's real
  # tokens end.
  ends = np.concatenate([cls_positions[:, 1:], np.zeros((num_rows, 1), np.int64)], axis=1)
  ends = np.where(np.concatenate([present[:, 1:], np.zeros((num_rows, 1), bool)], axis=1),
                  ends, (sequence_ids > 0).sum(1, keepdims=True))
  offset = cls_positions[row, slot]
  inside = np.arange(length) < (ends[row, slot] - offset)[:, None]
  source = np.minimum(offset[:, None] + np.arange(length), length - 1)
  out: dict[str, np.ndarray] = {}
  for name in _TOKEN_FEATURES:
    if name in rows:
      values = np.asarray(rows[name])
      out[name] = np.where(inside, values[row[:, None], source], 0).astype(values.dtype)
  labels = np.asarray(rows[features.NEXT_SENTENCE_LABELS])
  out[features.NEXT_SENTENCE_LABELS] = labels[row, slot][:, None]
  if features.MASKED_LM_WEIGHTS in rows:
    weights = np.asarray(rows[features.MASKED_LM_WEIGHTS])
    width = max_predictions_per_seq or weights.shape[1]
    chosen = weights > 0
    positions = np.asarray(rows[features.MASKED_LM_POSITIONS]).astype(np.int64)
    at_row, at_slot = np.nonzero(chosen)
    which_slot = sequence_ids[at_row, positions[chosen]] - 1
    instance_of = np.full((num_rows, k), -1, np.int64)
    instance_of[row, slot] = np.arange(row.size)
    instance = instance_of[at_row, which_slot]  # ascending: rows in order, slots by position
    count = np.bincount(instance, minlength=row.size)
    j = np.arange(instance.size) - np.repeat(np.cumsum(count) - count, count)
    for name, values in ((features.MASKED_LM_POSITIONS, positions[chosen] - offset[instance]),
                         (features.MASKED_LM_IDS, np.asarray(rows[features.MASKED_LM_IDS])[chosen]),
                         (features.MASKED_LM_WEIGHTS, weights[chosen])):
      unpacked = np.zeros((row.size, width), np.asarray(rows[name]).dtype)
      unpacked[instance, j] = values
      out[name] = unpacked
  return out, row, slot, offset


def mask_rows(rows: Mapping[str, np.ndarray], config: masking.MaskingConfig,
              rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Masks packed rows: each instance as `masking.mask_batch` masks an unpacked instance (its
  own ~15%, at most `config.max_predictions_per_seq`), and all of a row's predictions in
  `config.max_predictions_per_seq` slots. Returns the masked `input_ids` and the masked-LM
  features of the rows (positions are row positions)."""
  needed = (features.INPUT_IDS, features.INPUT_MASK, features.SEQUENCE_IDS,
            features.CLS_POSITIONS, features.NEXT_SENTENCE_LABELS, features.NEXT_SENTENCE_WEIGHTS)
  if config.whole_word_mask:
    needed += (features.WORD_STARTS,)
  instances, row, slot, offset = unpack_rows({name: rows[name] for name in needed})
  masked = masking.mask_batch(instances[features.INPUT_IDS], instances[features.INPUT_MASK],
                              config, rng, instances.get(features.WORD_STARTS))
  input_ids = np.asarray(rows[features.INPUT_IDS])
  out = _lay_predictions(masked, row, slot, offset, len(input_ids),
                         np.shape(rows[features.CLS_POSITIONS])[1], config.max_predictions_per_seq)
  # The masked ids, put where the predictions are (the only tokens masking changes).
  chosen = masked[features.MASKED_LM_WEIGHTS] > 0
  instance = np.nonzero(chosen)[0]
  new_ids = np.take_along_axis(masked[features.INPUT_IDS], masked[features.MASKED_LM_POSITIONS],
                               1)[chosen]
  masked_ids = input_ids.copy()
  masked_ids[row[instance], offset[instance] + masked[features.MASKED_LM_POSITIONS][chosen]] = (
      new_ids)
  out[features.INPUT_IDS] = masked_ids
  return out


def prediction_costs(max_seq_length: int, masked_lm_prob: float,
                     max_predictions_per_seq: int) -> np.ndarray:
  """Masked-LM predictions of an instance of each length 0..max_seq_length (the budget `pack`
  keeps per row so that every instance gets its full ~15%)."""
  return masking.num_to_predict(np.arange(max_seq_length + 1), masked_lm_prob,
                                max_predictions_per_seq)
