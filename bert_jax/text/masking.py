"""Masked-LM masking: the 80/10/10 rule, whole-word masking, `max_predictions_per_seq`.

The one implementation of the rule, in numpy over a batch of rows, used offline by
`data_prep/create_pretraining_data.py` (static masks, written into the records) and online by
the input pipeline (dynamic masks, drawn afresh each time a record is read).

What the original `create_pretraining_data.py` does, and so what this does:
* candidates are all real tokens except [CLS] and [SEP] (padding is never a candidate);
* `num_to_predict = min(max_predictions_per_seq, max(1, round(length * masked_lm_prob)))`,
  where `length` counts [CLS] and [SEP] too (Python's round: halves go to even);
* candidates are visited in a uniformly random order and taken until `num_to_predict` are
  chosen — a uniformly random subset, which `sample_positions` draws directly; with whole-word
  masking the units are words (a word-start piece and the non-start pieces after it) and a word
  that would overshoot `num_to_predict` is skipped, not cut;
* each chosen position becomes [MASK] with probability 0.8, stays itself with 0.1, and becomes a
  uniformly random id of the whole vocabulary with 0.1 (special and unused ids included, as in
  the original);
* `masked_lm_positions` are sorted, `masked_lm_ids` are the original ids there, and both are
  padded with 0 (weight 0.0) to `max_predictions_per_seq`.

Two choices go beyond the original. `per_word_draw=True` draws the 80/10/10 fate once per word,
so that a masked word is not half [MASK] and half visible (under whole-word masking the original
draws per piece, a known flaw that leaks the word). And a non-start piece right after [SEP]
(segment B cut from the front mid-word) starts its own unit instead of joining the last word of
segment A across the separator.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  vocab_size: int
  mask_id: int
  cls_id: int
  sep_id: int
  masked_lm_prob: float = 0.15
  max_predictions_per_seq: int = 20
  whole_word_mask: bool = False
  per_word_draw: bool = False  # 80/10/10 drawn per word (whole-word masking), not per piece
  mask_token_prob: float = 0.8   # → [MASK]
  random_token_prob: float = 0.1  # → a random id; the rest keeps the original token

  @classmethod
  def from_tokenizer(cls, tokenizer, **kwargs) -> "MaskingConfig":
    return cls(vocab_size=tokenizer.vocab_size, mask_id=tokenizer.mask_id,
               cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id, **kwargs)


def num_to_predict(lengths: np.ndarray, masked_lm_prob: float,
                   max_predictions_per_seq: int) -> np.ndarray:
  """Per row: min(max_predictions_per_seq, max(1, round(length * masked_lm_prob)))."""
  lengths = np.asarray(lengths, np.float64)
  return np.minimum(max_predictions_per_seq,
                    np.maximum(1, np.rint(lengths * masked_lm_prob))).astype(np.int64)


def _units(candidates: np.ndarray, word_starts: np.ndarray | None) -> np.ndarray:
  """Unit (word) index of every candidate position within its row, -1 elsewhere."""
  starts = candidates.copy()
  if word_starts is not None:
    previous_is_candidate = np.zeros_like(candidates)
    previous_is_candidate[:, 1:] = candidates[:, :-1]
    # A piece continues the word before it unless it is a word start or follows a special token.
    starts &= np.asarray(word_starts, bool) | ~previous_is_candidate
  unit = np.cumsum(starts, axis=1) - 1
  return np.where(candidates, unit, -1)


def sample_positions(candidates: np.ndarray, targets: np.ndarray,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """A uniformly random set of min(target, candidates) candidate positions per row — the set
  the original's shuffle-then-take-the-first picks. Returns the positions in ascending order
  (rows, most chosen in a row; 0 after a row's last) and how many each row has.

  Floyd's algorithm in the candidates' rank space: for j from n - k to n - 1, draw t in [0, j]
  and take t, or j if t is taken already. That is k draws per row (≤ max_predictions_per_seq),
  all rows at once, instead of sorting a random key for every position.
  """
  rows, length = candidates.shape
  n = candidates.sum(axis=1)
  k = np.minimum(targets, n)
  steps = int(k.max(initial=0))
  step = np.arange(steps)
  live = step < k[:, None]
  # All draws at once (t = floor(u * (j + 1)) for a uniform u in [0, 1): uniform on [0, j] to
  # within 2**-44); a step past a row's k draws nothing and lands in a spare column.
  top = np.where(live, (n - k)[:, None] + step, length)
  draw = np.where(live, (rng.random((rows, steps)) * (top + 1)).astype(np.int64), length)
  taken = np.zeros((rows, length + 1), bool)
  flat_taken = taken.reshape(-1)
  row_base = np.arange(rows) * (length + 1)
  ranks = np.empty((rows, steps), np.int64)
  for s in range(steps):
    pick = np.where(flat_taken[row_base + draw[:, s]], top[:, s], draw[:, s])
    flat_taken[row_base + pick] = True
    ranks[:, s] = pick
  ranks.sort(axis=1)
  # The r-th candidate of a row, from the flat indices of all candidates in row order.
  flat_candidates = np.flatnonzero(candidates)
  first = np.cumsum(n) - n
  picked = flat_candidates[np.minimum(first[:, None] + np.minimum(ranks, n[:, None] - 1),
                                      max(flat_candidates.size - 1, 0))]
  positions = np.where(live, picked - (np.arange(rows) * length)[:, None], 0)
  return positions, k


def choose_positions(candidates: np.ndarray, targets: np.ndarray, rng: np.random.Generator,
                     word_starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Which positions to predict: (chosen (rows, length) bool, unit index (rows, length)).

  Units are visited in random order (iid uniform keys, argsorted: a uniform permutation, like the
  original's shuffle) and taken greedily while they fit in `targets`. (Without word starts every
  unit is one token, and `sample_positions` gets the same distribution far faster.)
  """
  rows, length = candidates.shape
  unit = _units(candidates, word_starts)
  num_units = unit.max(axis=1, initial=-1) + 1
  row_index = np.repeat(np.arange(rows), length).reshape(rows, length)
  unit_sizes = np.bincount((row_index * length + unit)[candidates],
                           minlength=rows * length).reshape(rows, length)
  keys = rng.random((rows, length))
  keys[np.arange(length)[None, :] >= num_units[:, None]] = np.inf
  order = np.argsort(keys, axis=1)  # units in visiting order; non-units last
  sizes_in_order = np.take_along_axis(unit_sizes, order, axis=1)
  taken_in_order = np.zeros((rows, length), bool)
  count = np.zeros(rows, np.int64)
  for rank in range(int(num_units.max(initial=0))):
    size = sizes_in_order[:, rank]
    fits = (size > 0) & (count < targets) & (count + size <= targets)
    taken_in_order[:, rank] = fits
    count += np.where(fits, size, 0)
  taken_units = np.zeros((rows, length), bool)
  np.put_along_axis(taken_units, order, taken_in_order, axis=1)
  chosen = candidates & np.take_along_axis(taken_units, np.maximum(unit, 0), axis=1)
  return chosen, unit


def mask_batch(input_ids: np.ndarray, input_mask: np.ndarray, config: MaskingConfig,
               rng: np.random.Generator,
               word_starts: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Masks a batch of (rows, max_seq_length) id rows; returns the record's masked-LM features.

  `input_mask` marks real tokens (1) and padding (0). `word_starts` is needed only with
  `config.whole_word_mask`. Returns `input_ids` (masked copy), `masked_lm_positions`,
  `masked_lm_ids` (int64 ids, 0-padded) and `masked_lm_weights` (float32, 1.0 where real).
  """
  input_ids = np.asarray(input_ids)
  input_mask = np.asarray(input_mask).astype(bool, copy=False)
  if input_ids.ndim != 2 or input_ids.shape != input_mask.shape:
    raise ValueError(f"input_ids {input_ids.shape} and input_mask {input_mask.shape} must be "
                     "the same (rows, max_seq_length) shape.")
  if config.whole_word_mask and word_starts is None:
    raise ValueError("whole_word_mask needs word_starts (which tokens begin a word).")
  rows, length = input_ids.shape
  max_predictions = config.max_predictions_per_seq
  candidates = input_mask & (input_ids != config.cls_id) & (input_ids != config.sep_id)
  targets = num_to_predict(input_mask.sum(axis=1), config.masked_lm_prob, max_predictions)
  if config.whole_word_mask:
    chosen, unit = choose_positions(candidates, targets, rng, word_starts)
    count = chosen.sum(axis=1)
    flat = np.flatnonzero(chosen)  # row by row, ascending positions within a row
    slot = np.arange(flat.size) - np.repeat(np.cumsum(count) - count, count)
    positions = np.zeros((rows, max(int(count.max(initial=0)), 1)), np.int64)
    positions[flat // length, slot] = flat % length
  else:
    positions, count = sample_positions(candidates, targets, rng)
    unit = None
  width = positions.shape[1]
  if width < max_predictions:
    positions = np.pad(positions, ((0, 0), (0, max_predictions - width)))
  weights = np.arange(max_predictions) < count[:, None]
  labels = np.where(weights, np.take_along_axis(input_ids, positions, axis=1), 0)

  if config.per_word_draw and unit is not None:  # one fate per unit, shared by its pieces
    fate_u = np.take_along_axis(rng.random((rows, length)),
                                np.maximum(np.take_along_axis(unit, positions, axis=1), 0), axis=1)
  else:
    fate_u = rng.random((rows, max_predictions))
  random_ids = rng.integers(0, config.vocab_size, size=(rows, max_predictions))
  to_mask = fate_u < config.mask_token_prob
  to_random = ~to_mask & (fate_u >= 1.0 - config.random_token_prob)
  new_ids = np.where(to_mask, config.mask_id, np.where(to_random, random_ids, labels))

  masked_ids = input_ids.copy()
  where = (np.arange(rows)[:, None] * length + positions)[weights]
  masked_ids.reshape(-1)[where] = new_ids[weights]
  return {
      "input_ids": masked_ids,
      "masked_lm_positions": positions.astype(np.int64, copy=False),
      "masked_lm_ids": labels.astype(np.int64, copy=False),
      "masked_lm_weights": weights.astype(np.float32),
  }
