"""Sentence-pair instances for masked-LM + next-sentence pre-training, as the original built them.

For each document (`dupe_factor` passes): the target length is `max_seq_length - 3`, or with
probability `short_seq_prob` a random length in [2, that]; sentences accumulate into a chunk until
it reaches the target or the document ends; segment A is a random number of the chunk's first
sentences; with probability 0.5 (always, if the chunk is one sentence) segment B is taken from a
random sentence of a random other document (ten tries to draw one that is not this document) and
the unused sentences of the chunk are put back, else B is the rest of the chunk; the longer segment
loses a token from a random end until the pair fits.

The original walks one document at a time, one chunk at a time, in Python. Here every (pass,
document) walk advances together: each step of the loop below takes the next chunk of *all*
unfinished walks with a few array operations, so the Python work grows with the number of chunks
in the longest document, not with the number of instances. (The one slow case is a corpus that
is a single huge document, e.g. no blank lines: about 0.15 ms per chunk of it, some 60,000
instances a second — still far faster than the original overall.) The draws are the original's, only
made in a different order (and truncation's coin flips per removed token are drawn as one
Binomial per segment, the same distribution), so the instances are distributed exactly as the
original's. The original also shuffles the documents before the passes; that only changes the
order in which instances come out, and the shard shuffles all its instances anyway.

Beyond the original, `objective` changes what the pair means: "sop" (ALBERT's sentence-order
prediction) always takes B as the rest of the chunk, so A and B are consecutive text of one
document, and swaps them with probability 0.5 (label 1 = swapped); "none" takes the same
consecutive pair and never swaps (label 0). Under both, a chunk of one sentence is split at a
random token inside it (ALBERT would take B from another document, which is no longer a pair of
one document), and truncation cuts only the outer ends (A's front, B's back), so that A still
ends where B begins. `build_single_segments` makes RoBERTa's single-segment rows instead:
FULL-SENTENCES (contiguous sentences up to the target length, crossing document boundaries with
a separator token between documents) and DOC-SENTENCES (the same within one document).

Documents are one int32 array of token ids plus sentence and document boundaries, and an instance
is four numbers (where A and B start in that array, and their lengths), so nothing per token or
per instance is a Python object; `Instances.features` cuts fixed-width rows out of the token
array for a batch of instances when they are written.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import bisect

import numpy as np

# How segments are laid out (`--sequence_mode`): NSP/SOP sentence pairs (BERT, ALBERT), or single
# segments of full sentences crossing documents (RoBERTa's FULL-SENTENCES) or within one document.
SEQUENCE_MODES = ("pairs", "full_sentences", "doc_sentences")

OBJECTIVES = ("nsp", "sop", "none")


class Documents(NamedTuple):
  """A shard's documents: sentence s is `tokens[sentence_starts[s]:sentence_starts[s + 1]]`, and
  document d is sentences `document_starts[d]` to `document_starts[d + 1] - 1`. Every sentence
  and every document is non-empty."""
  tokens: np.ndarray           # int32
  sentence_starts: np.ndarray  # int64, num_sentences + 1
  document_starts: np.ndarray  # int64, num_documents + 1

  @property
  def num_documents(self) -> int:
    return len(self.document_starts) - 1


def make_documents(documents: Sequence[Sequence[Sequence[int]]]) -> Documents:
  """`Documents` from nested lists (documents → sentences → ids); empty ones are dropped."""
  sentences = [s for d in documents for s in d if len(s)]
  per_document = [sum(1 for s in d if len(s)) for d in documents]
  lengths = np.array([len(s) for s in sentences], np.int64)
  tokens = np.array([t for s in sentences for t in s], np.int32)
  counts = np.array([n for n in per_document if n], np.int64)
  return Documents(tokens, np.concatenate([[0], np.cumsum(lengths)]),
                   np.concatenate([[0], np.cumsum(counts)]))


class Instances(NamedTuple):
  """Unmasked instances `[CLS] A [SEP] B [SEP]`, as spans of `Documents.tokens`."""
  a_start: np.ndarray         # int64
  a_length: np.ndarray        # int32
  b_start: np.ndarray         # int64
  b_length: np.ndarray        # int32
  is_random_next: np.ndarray  # bool

  @property
  def size(self) -> int:
    return len(self.a_start)

  def lengths(self, pair_separators: int = 1) -> np.ndarray:
    """Tokens of each instance with its special tokens: [CLS] A [SEP] (an instance without B),
    [CLS] A [SEP] B [SEP], or with `pair_separators` 2 RoBERTa's <s> A </s></s> B </s>."""
    la, lb = self.a_length.astype(np.int64), self.b_length.astype(np.int64)
    return la + lb + np.where(lb > 0, 2 + pair_separators, 2)

  def features(self, rows: np.ndarray, tokens: np.ndarray, max_seq_length: int, cls_id: int,
               sep_id: int, pair_separators: int = 1) -> dict[str, np.ndarray]:
    """input_ids, input_mask, segment_ids, next_sentence_labels of the given instances.

    `tokens` is `padded_tokens(documents.tokens, max_seq_length)`: a row's worth of zeros on
    both sides, so that for every instance the `max_seq_length` tokens from where A (or B) must
    start in the row are one window of the array, and a row is cut out of two such windows
    (positions outside the segments are then overwritten or zeroed). An instance with
    `b_length` 0 is one segment, [CLS] A [SEP], all of segment 0. Pairs use the tokenizer's
    `pair_separators`; RoBERTa's layout (2) has no segment embeddings, so its B keeps segment 0
    too, as its tokenizer gives it.
    """
    length = max_seq_length
    la = self.a_length[rows].astype(np.int64)
    lb = self.b_length[rows].astype(np.int64)
    has_b = lb > 0
    b_offset = la + 1 + pair_separators  # row position of B's first token
    position = np.arange(length)
    windows = np.lib.stride_tricks.sliding_window_view(tokens, length)
    # Row position p holds A's token p - 1 (p = 1..la) and B's token p - b_offset after that.
    input_ids = np.where(position <= la[:, None], windows[self.a_start[rows] + length - 1],
                         windows[self.b_start[rows] + length - b_offset])
    total = self.lengths(pair_separators)[rows]
    input_mask = position < total[:, None]
    input_ids *= input_mask
    rows_index = np.arange(len(rows))
    input_ids[:, 0] = cls_id
    for k in range(pair_separators if has_b.any() else 1):
      at = np.flatnonzero(has_b) if k else rows_index
      input_ids[at, la[at] + 1 + k] = sep_id
    input_ids[has_b, total[has_b] - 1] = sep_id
    segment_ids = input_mask & (position >= b_offset[:, None]) & has_b[:, None]
    if pair_separators != 1:
      segment_ids = np.zeros_like(segment_ids)
    return {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "segment_ids": segment_ids,
        "next_sentence_labels": self.is_random_next[rows][:, None],
    }


def padded_tokens(tokens: np.ndarray, max_seq_length: int) -> np.ndarray:
  pad = np.zeros(max_seq_length, np.int32)
  return np.concatenate([pad, tokens.astype(np.int32, copy=False), pad])


def truncation_cuts(la: np.ndarray, lb: np.ndarray, max_num_tokens: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, ...]:
  """Tokens that A and B lose from the front and from the back so that the pair fits.

  The original removes one token at a time from the longer segment (B on a tie), from the front
  or the back with equal odds. Which segment loses how many tokens does not depend on the coin
  flips, and each segment's front losses are then Binomial(losses, 1/2): drawn here in one call
  per segment instead of a loop of draws — the same distribution.
  Returns (a_front, a_back, b_front, b_back).
  """
  excess = np.maximum(la + lb - max_num_tokens, 0)
  a_longer = la > lb
  catch_up = np.minimum(excess, np.abs(la - lb))  # the longer one is cut to the other's length
  rest = excess - catch_up  # from equal lengths on, B and A take turns, B first
  cut_a = np.where(a_longer, catch_up, 0) + rest // 2
  cut_b = np.where(a_longer, 0, catch_up) + (rest + 1) // 2
  a_front, b_front = np.zeros_like(cut_a), np.zeros_like(cut_b)
  for cut, front in ((cut_a, a_front), (cut_b, b_front)):
    some = np.flatnonzero(cut)
    front[some] = rng.binomial(cut[some], 0.5)
  return a_front, cut_a - a_front, b_front, cut_b - b_front


def build_instances(documents: Documents, max_seq_length: int, short_seq_prob: float,
                    dupe_factor: int, rng: np.random.Generator, objective: str = "nsp",
                    pair_separators: int = 1) -> tuple[Instances, int]:
  """All instances of `dupe_factor` passes over the documents; also returns how many of the
  (pass, document) walks had a short target length. `objective` is "nsp" (the original),
  "sop" or "none" (see the module docstring)."""
  if objective not in OBJECTIVES:
    raise ValueError(f"objective {objective!r}: expected one of {', '.join(OBJECTIVES)}.")
  starts = documents.sentence_starts
  num_documents = documents.num_documents
  max_num_tokens = max_seq_length - 2 - pair_separators
  # One walk per (pass, document): the document, the next sentence, the end, the target.
  doc = np.tile(np.arange(num_documents, dtype=np.int64), dupe_factor)
  short = rng.random(doc.size) < short_seq_prob
  target = np.where(short, rng.integers(2, max_num_tokens + 1, size=doc.size), max_num_tokens)
  cursor = documents.document_starts[doc]
  end = documents.document_starts[doc + 1]
  parts = []
  while doc.size:
    n = doc.size
    # The chunk grows sentence by sentence until it reaches the target or the document ends:
    # its last sentence is the one before the first whose start is `target` tokens on.
    reach = np.searchsorted(starts, starts[cursor] + target, side="left")
    last = np.minimum(np.maximum(reach, cursor + 1) - 1, end - 1)
    chunk = last + 1 - cursor
    a_count = rng.integers(1, np.maximum(chunk, 2))  # [1, chunk - 1]; 1 for a lone sentence
    a_lo, a_hi = starts[cursor], starts[cursor + a_count]
    b_lo, b_hi = starts[cursor + a_count], starts[last + 1]
    if objective != "nsp":
      parts.append(_consecutive_pair(a_lo, a_hi, b_lo, b_hi, chunk, max_num_tokens,
                                     objective == "sop", rng))
      cursor = last + 1
      going = cursor < end
      doc, cursor, end, target = doc[going], cursor[going], end[going], target[going]
      continue
    is_random = (chunk == 1) | (rng.random(n) < 0.5)
    pick = np.flatnonzero(is_random)
    if pick.size:
      other = rng.integers(0, num_documents, size=pick.size)
      for _ in range(9):  # a different document, if one turns up within ten draws
        again = np.flatnonzero(other == doc[pick])
        if not again.size:
          break
        other[again] = rng.integers(0, num_documents, size=again.size)
      first, stop = documents.document_starts[other], documents.document_starts[other + 1]
      from_sentence = first + rng.integers(0, stop - first)
      # Whole sentences from there until B reaches its target length (or the document ends).
      target_b = target[pick] - (a_hi[pick] - a_lo[pick])
      reach_b = np.searchsorted(starts, starts[from_sentence] + target_b, side="left")
      b_lo[pick] = starts[from_sentence]
      b_hi[pick] = starts[np.minimum(np.maximum(reach_b, from_sentence + 1), stop)]
      last[pick] -= chunk[pick] - a_count[pick]  # put the unused sentences back
    a_front, a_back, b_front, b_back = truncation_cuts(a_hi - a_lo, b_hi - b_lo,
                                                       max_num_tokens, rng)
    a_lo, a_hi, b_lo, b_hi = a_lo + a_front, a_hi - a_back, b_lo + b_front, b_hi - b_back
    parts.append((a_lo, (a_hi - a_lo).astype(np.int32), b_lo, (b_hi - b_lo).astype(np.int32),
                  is_random))
    cursor = last + 1
    going = cursor < end
    doc, cursor, end, target = doc[going], cursor[going], end[going], target[going]
  if not parts:
    empty = np.zeros(0, np.int64)
    return Instances(empty, empty.astype(np.int32), empty, empty.astype(np.int32),
                     empty.astype(bool)), int(short.sum())
  instances = Instances(*(np.concatenate(column) for column in zip(*parts)))
  assert (instances.a_length > 0).all() and (instances.b_length > 0).all()
  return instances, int(short.sum())


def _consecutive_pair(a_lo, a_hi, b_lo, b_hi, chunk, max_num_tokens: int, swap: bool,
                      rng: np.random.Generator) -> tuple[np.ndarray, ...]:
  """SOP / no-objective pairs of a step of chunks: A = the chunk's first sentences, B = the rest
  (a lone sentence is split at a random token inside it; one of a single token gives no pair),
  cut at the outer ends to fit, then swapped with probability 0.5 if `swap`."""
  lone = chunk == 1
  lone_length = a_hi - a_lo
  split = a_lo + np.maximum(1, (rng.random(chunk.size) * lone_length).astype(np.int64))
  a_hi, b_lo = np.where(lone, split, a_hi), np.where(lone, split, b_lo)
  keep = (a_hi > a_lo) & (b_hi > b_lo)
  a_front, a_back, b_front, b_back = truncation_cuts(a_hi - a_lo, b_hi - b_lo, max_num_tokens,
                                                     rng)
  a_lo, b_hi = a_lo + a_front + a_back, b_hi - b_front - b_back
  swapped = (rng.random(chunk.size) < 0.5) if swap else np.zeros(chunk.size, bool)
  first_lo = np.where(swapped, b_lo, a_lo)
  first_length = np.where(swapped, b_hi - b_lo, a_hi - a_lo)
  second_lo = np.where(swapped, a_lo, b_lo)
  second_length = np.where(swapped, a_hi - a_lo, b_hi - b_lo)
  return (first_lo[keep], first_length[keep].astype(np.int32), second_lo[keep],
          second_length[keep].astype(np.int32), swapped[keep])


def with_document_separators(documents: Documents, sep_id: int
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The shard's sentences as one stream with a separator token between documents, as units:
  (tokens, unit starts (num_units + 1), which units are separators)."""
  lengths = np.diff(documents.sentence_starts)
  between = documents.document_starts[1:-1]  # the first sentence of every document but the first
  tokens = np.insert(documents.tokens, documents.sentence_starts[between], sep_id)
  unit_lengths = np.insert(lengths, between, 1)
  is_separator = np.insert(np.zeros(lengths.size, bool), between, True)
  return (tokens.astype(np.int32, copy=False),
          np.concatenate([[0], np.cumsum(unit_lengths)]).astype(np.int64), is_separator)


def build_single_segments(documents: Documents, max_seq_length: int, short_seq_prob: float,
                          dupe_factor: int, rng: np.random.Generator, cross_documents: bool,
                          sep_id: int) -> tuple[Instances, int, np.ndarray]:
  """RoBERTa's single-segment rows, [CLS] ... [SEP]: whole consecutive sentences while they fit
  in the target length (`max_seq_length - 2`, or with probability `short_seq_prob` a random
  length in [2, that], drawn per row), a sentence longer than the target alone and cut at its
  end. `cross_documents` (FULL-SENTENCES) runs on over document boundaries with a separator
  token between documents (never first or last in a row); otherwise (DOC-SENTENCES) a
  document's last row is whatever is left of it.

  Returns the instances (B empty, label 0), how many rows had a short target, and the token
  array the instances point into (with the separators when crossing documents).

  One row follows from where the last ended, so this is a loop over rows with a binary search
  each (about a microsecond per row), not the array walk of `build_instances`.
  """
  max_num_tokens = max_seq_length - 2
  if cross_documents:
    tokens, unit_starts, is_separator = with_document_separators(documents, sep_id)
    walks = [(0, len(unit_starts) - 1)] if len(unit_starts) > 1 else []
  else:
    tokens, unit_starts = documents.tokens, documents.sentence_starts
    is_separator = np.zeros(len(unit_starts) - 1, bool)
    bounds = documents.document_starts.tolist()
    walks = list(zip(bounds[:-1], bounds[1:]))
  starts, separator = unit_starts.tolist(), is_separator.tolist()
  row_starts, row_lengths = [], []
  short = 0
  block, used = np.zeros(0), 0
  for _ in range(dupe_factor):
    for cursor, end in walks:
      while cursor < end:
        if separator[cursor]:
          cursor += 1
          continue
        if used + 2 > block.size:  # per row: whether short, and the short length
          block, used = rng.random(8192), 0
        target = max_num_tokens
        if block[used] < short_seq_prob:
          target = 2 + int(block[used + 1] * (max_num_tokens - 1))
          short += 1
        used += 2
        fits = bisect.bisect_right(starts, starts[cursor] + target, cursor + 1, end + 1) - 1
        last = max(fits - 1, cursor)
        if separator[last]:
          last -= 1
        row_starts.append(starts[cursor])
        row_lengths.append(min(starts[last + 1] - starts[cursor], target))
        cursor = last + 1
  a_start = np.array(row_starts, np.int64)
  a_length = np.array(row_lengths, np.int32)
  instances = Instances(a_start, a_length, a_start.copy(), np.zeros_like(a_length),
                        np.zeros(a_start.size, bool))
  return instances, short, tokens
