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

`MaskingConfig.strategy` picks what a masked unit is: "token" (the original), "whole_word"
(the same as `whole_word_mask=True`), "ngram" (ALBERT: n consecutive words, P(n) ∝ 1/n for
n ≤ `max_ngram`) or "span" (SpanBERT: a run of words whose length is Geometric(`span_p`) clipped
at `max_span_length`, mean 3.8 words at 0.2 and 10; its 80/10/10 is drawn once per span). N-grams
and spans are measured in whole words, take the same `num_to_predict` budget, and never reach
over [CLS], [SEP] or padding (and so never over an instance boundary, since packed rows are
masked instance by instance). Spans keep one unmasked token between each other, so every span
is a maximal run of masked positions and `span_boundaries` finds the two tokens around it — what
a span boundary objective predicts from — in the records' positions alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np

STRATEGIES = ("token", "whole_word", "ngram", "span")


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  """What and how to mask. `whole_word_mask` and `strategy` are kept in step: whole_word_mask
  means "units are words" (so callers know to supply word starts), true for every strategy but
  "token"; whole_word_mask=True with strategy "token" is read as strategy "whole_word"."""

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
  strategy: str = "token"  # token | whole_word | ngram | span (see the module docstring)
  max_ngram: int = 3  # ngram: n in 1..max_ngram, P(n) ∝ 1/n (ALBERT's 3)
  span_p: float = 0.2  # span: length in words ~ Geometric(span_p) (SpanBERT's 0.2) ...
  max_span_length: int = 10  # ... clipped at this many words (SpanBERT's 10)

  def __post_init__(self):
    if self.strategy not in STRATEGIES:
      raise ValueError(f"masking strategy {self.strategy!r}: expected one of "
                       f"{', '.join(STRATEGIES)}.")
    if self.whole_word_mask and self.strategy == "token":
      object.__setattr__(self, "strategy", "whole_word")
    object.__setattr__(self, "whole_word_mask", self.strategy != "token")
    if self.strategy == "ngram" and self.max_ngram < 1:
      raise ValueError(f"max_ngram={self.max_ngram}: must be at least 1.")
    if self.strategy == "span" and not (0.0 < self.span_p <= 1.0 and self.max_span_length >= 1):
      raise ValueError(f"span_p={self.span_p}, max_span_length={self.max_span_length}: need "
                       "0 < span_p <= 1 and max_span_length >= 1.")

  def unit_length_probs(self) -> np.ndarray | None:
    """P(length = 1, 2, ...) in words of an n-gram or a span; None for token and whole word."""
    if self.strategy == "ngram":
      weights = 1.0 / np.arange(1, self.max_ngram + 1)
    elif self.strategy == "span":
      weights = self.span_p * (1.0 - self.span_p) ** np.arange(self.max_span_length)
    else:
      return None
    return weights / weights.sum()

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


# Tries per row at placing one drawn length before it is drawn anew, and in all before the row
# stops short of its budget (only when no place is left that a word of the length fits).
_TRIES_PER_LENGTH = 20
_MAX_FAILED_TRIES = 200


def choose_spans(candidates: np.ndarray, targets: np.ndarray, rng: np.random.Generator,
                 word_starts: np.ndarray, length_probs: np.ndarray, separate: bool
                 ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
  """N-grams or spans of whole words: (chosen (rows, length) bool, span index of each position
  (rows, length; -1 where not chosen), and a record of the spans drawn).

  Each row repeats: draw a length L in words from `length_probs`, then a uniformly random start
  word; the L words from there are taken if they lie in one run of candidates (no [CLS], [SEP]
  or padding inside), overlap no span taken before and, with `separate`, touch none either (so
  spans stay distinct runs of masked positions). A start that fails is drawn again, keeping L
  (so that the lengths taken follow `length_probs`, not a distribution skewed by where short
  spans fit more easily); after `_TRIES_PER_LENGTH` failures L is drawn anew. A span whose
  pieces would pass the row's budget is cut to its first words that fit (the budget is counted
  in pieces, like the original's); the row stops when the budget is met. The record holds per
  span its row, first word, drawn length and length taken, in the order taken — the statistics
  the tests check against `length_probs`.
  """
  rows, length = candidates.shape
  max_len = len(length_probs)
  unit = _units(candidates, word_starts)
  num_units = unit.max(axis=1, initial=-1) + 1
  width = max(int(num_units.max(initial=0)), 1)
  previous_is_candidate = np.zeros_like(candidates)
  previous_is_candidate[:, 1:] = candidates[:, :-1]
  run = np.cumsum(candidates & ~previous_is_candidate, axis=1)  # runs of candidates, per row
  row_index = np.repeat(np.arange(rows), length).reshape(rows, length)
  unit_pieces = np.bincount((row_index * width + np.maximum(unit, 0))[candidates],
                            minlength=rows * width).reshape(rows, width)
  unit_run = np.full((rows, width + max_len), -1, np.int64)  # -1 past the last unit
  unit_run[row_index[candidates], unit[candidates]] = run[candidates]
  piece_prefix = np.zeros((rows, width + max_len + 1), np.int64)
  piece_prefix[:, 1:width + 1] = np.cumsum(unit_pieces, axis=1)
  piece_prefix[:, width + 1:] = piece_prefix[:, width:width + 1]
  # taken[:, u + 1] for unit u, with a never-taken column on each side.
  taken = np.zeros((rows, width + max_len + 2), bool)
  span_of_unit = np.full((rows, width), -1, np.int64)
  spans_in_row = np.zeros(rows, np.int64)
  count = np.zeros(rows, np.int64)
  failures = np.zeros(rows, np.int64)
  cumulative = np.cumsum(length_probs)
  cumulative[-1] = 1.0

  def draw_lengths(n):
    return np.searchsorted(cumulative, rng.random(n), side="right") + 1

  pending = draw_lengths(rows)
  record = {"row": [], "start": [], "drawn": [], "taken": []}
  steps = np.arange(1, max_len + 1)
  active = np.flatnonzero((targets > 0) & (num_units > 0))
  while active.size:
    r = active
    drawn = pending[r]
    start = (rng.random(r.size) * num_units[r]).astype(np.int64)
    remaining = targets[r] - count[r]
    # Words that fit in the budget: the longest prefix of the L words within `remaining` pieces.
    pieces = piece_prefix[r[:, None], start[:, None] + steps] - piece_prefix[r, start][:, None]
    size = ((pieces <= remaining[:, None]) & (steps <= drawn[:, None])).sum(axis=1)
    end = start + np.maximum(size, 1) - 1
    same_run = unit_run[r, end] == unit_run[r, start]
    taken_prefix = np.cumsum(taken[r], axis=1)  # column u + 1 is word u
    at = np.arange(r.size)
    clash = taken_prefix[at, end + 1] - taken_prefix[at, start] > 0
    if separate:  # a taken word right before or after, in the same run, would merge the spans
      run_here = unit_run[r, start]
      clash |= taken[r, start] & (unit_run[r, start - 1] == run_here)
      clash |= taken[r, end + 2] & (unit_run[r, end + 1] == run_here)
    ok = (size > 0) & same_run & ~clash
    good = r[ok]
    for k in range(max_len):  # mark the words taken
      where = ok & (k < size)
      taken[r[where], start[where] + k + 1] = True
      span_of_unit[r[where], start[where] + k] = spans_in_row[r[where]]
    spans_in_row[good] += 1
    count[good] += pieces[ok, size[ok] - 1]
    for name, values in (("row", good), ("start", start[ok]), ("drawn", drawn[ok]),
                         ("taken", size[ok])):
      record[name].append(values)
    failures[good] = 0
    bad = r[~ok]
    failures[bad] += 1
    pending[good] = draw_lengths(good.size)
    redraw = bad[failures[bad] % _TRIES_PER_LENGTH == 0]
    pending[redraw] = draw_lengths(redraw.size)
    active = r[(count[r] < targets[r]) & (failures[r] < _MAX_FAILED_TRIES)]
  chosen = candidates & np.take_along_axis(taken[:, 1:width + 1], np.maximum(unit, 0), axis=1)
  span = np.where(chosen, np.take_along_axis(span_of_unit, np.maximum(unit, 0), axis=1), -1)
  record = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in record.items()}
  return chosen, span, record


def span_boundaries(masked_lm_positions: np.ndarray, masked_lm_weights: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per masked position: the position just before its span, the one just after, and its
  offset within the span — what a span boundary objective reads (SpanBERT predicts each token
  of a span from the two tokens around it and its offset).

  A span is a maximal run of consecutive masked positions (the records keep positions in
  ascending order). Under `strategy="span"` spans never touch, so runs are spans; under other
  strategies neighbouring units merge into one run. Slots with weight 0 get (0, 0, 0).
  Works on any leading shape: (..., max_predictions_per_seq) in, three of that shape out.
  """
  positions = np.asarray(masked_lm_positions, np.int64)
  real = np.asarray(masked_lm_weights) > 0
  slots = positions.shape[-1]
  flat_positions = positions.reshape(-1, slots)
  flat_real = real.reshape(-1, slots)
  follows = np.zeros_like(flat_real)  # slot j continues the run of slot j - 1
  follows[:, 1:] = (flat_real[:, 1:] & flat_real[:, :-1] &
                    (flat_positions[:, 1:] == flat_positions[:, :-1] + 1))
  column = np.broadcast_to(np.arange(slots), flat_positions.shape)
  first_slot = np.maximum.accumulate(np.where(follows, 0, column), axis=1)
  precedes = np.zeros_like(flat_real)  # slot j's run goes on in slot j + 1
  precedes[:, :-1] = follows[:, 1:]
  last_slot = np.flip(np.minimum.accumulate(np.flip(np.where(precedes, slots, column), 1),
                                            axis=1), 1)
  start = np.take_along_axis(flat_positions, first_slot, axis=1)
  end = np.take_along_axis(flat_positions, last_slot, axis=1)
  left = np.where(flat_real, start - 1, 0).reshape(positions.shape)
  right = np.where(flat_real, end + 1, 0).reshape(positions.shape)
  offset = np.where(flat_real, flat_positions - start, 0).reshape(positions.shape)
  return left, right, offset


def mask_batch(input_ids: np.ndarray, input_mask: np.ndarray, config: MaskingConfig,
               rng: np.random.Generator,
               word_starts: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Masks a batch of (rows, max_seq_length) id rows; returns the record's masked-LM features.

  `input_mask` marks real tokens (1) and padding (0). `word_starts` is needed with
  `config.whole_word_mask` (every strategy but "token"). Returns `input_ids` (masked copy),
  `masked_lm_positions`, `masked_lm_ids` (int64 ids, 0-padded) and `masked_lm_weights`
  (float32, 1.0 where real).
  """
  input_ids = np.asarray(input_ids)
  input_mask = np.asarray(input_mask).astype(bool, copy=False)
  if input_ids.ndim != 2 or input_ids.shape != input_mask.shape:
    raise ValueError(f"input_ids {input_ids.shape} and input_mask {input_mask.shape} must be "
                     "the same (rows, max_seq_length) shape.")
  if config.whole_word_mask and word_starts is None:
    raise ValueError(f"masking strategy {config.strategy!r} needs word_starts (which tokens "
                     "begin a word).")
  rows, length = input_ids.shape
  max_predictions = config.max_predictions_per_seq
  candidates = input_mask & (input_ids != config.cls_id) & (input_ids != config.sep_id)
  targets = num_to_predict(input_mask.sum(axis=1), config.masked_lm_prob, max_predictions)
  length_probs = config.unit_length_probs()
  if length_probs is not None:  # n-grams or spans: `unit` is then the span of each position
    chosen, unit, _ = choose_spans(candidates, targets, rng, word_starts, length_probs,
                                   separate=config.strategy == "span")
  elif config.whole_word_mask:
    chosen, unit = choose_positions(candidates, targets, rng, word_starts)
  if config.whole_word_mask:
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

  per_unit = config.per_word_draw or config.strategy == "span"
  if per_unit and unit is not None:  # one fate per unit (word, n-gram, span), shared by its pieces
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
