"""Sentence-pair instances for masked-LM + next-sentence pre-training, as the original built them.

For each document (in shuffled order, `dupe_factor` passes): the target length is
`max_seq_length - 3`, or with probability `short_seq_prob` a random length in [2, that]; sentences
accumulate into a chunk until it reaches the target or the document ends; segment A is a random
number of the chunk's first sentences; with probability 0.5 (always, if the chunk is one
sentence) segment B is taken from a random sentence of a random other document and the unused
sentences of the chunk are put back, else B is the rest of the chunk; the longer segment loses a
token from a random end until the pair fits. The draws use `random.Random` as the original did
and give the same distribution of pairs (truncation draws all of a pair's coin flips at once).

A document is one int32 array of its token ids plus sentence boundaries, so segments are slices
(no per-token Python objects), and instances go straight into fixed-width arrays.
"""

from __future__ import annotations

import bisect
import itertools
import random
from typing import NamedTuple, Sequence

import numpy as np


class Document(NamedTuple):
  ids: np.ndarray          # int32, all sentences' token ids back to back
  bounds_list: list[int]   # sentence i is ids[bounds_list[i]:bounds_list[i + 1]]

  @property
  def num_sentences(self) -> int:
    return len(self.bounds_list) - 1


def make_document(sentences: Sequence[Sequence[int]]) -> Document:
  bounds = [0]
  for sentence in sentences:
    bounds.append(bounds[-1] + len(sentence))
  ids = np.fromiter(itertools.chain.from_iterable(sentences), np.int32, count=bounds[-1])
  return Document(ids, bounds)


class InstanceArrays:
  """Growable fixed-width storage for unmasked instances: `[CLS] A [SEP] B [SEP]` + padding."""

  def __init__(self, max_seq_length: int, cls_id: int, sep_id: int, capacity: int = 1024):
    self.max_seq_length = max_seq_length
    self.cls_id, self.sep_id = cls_id, sep_id
    self.size = 0
    self.tokens = np.zeros((capacity, max_seq_length), np.int32)
    self.len_a = np.zeros(capacity, np.int32)
    self.len_b = np.zeros(capacity, np.int32)
    self.is_random_next = np.zeros(capacity, bool)

  def _grow(self) -> None:
    capacity = 2 * len(self.len_a)
    for name in ("tokens", "len_a", "len_b", "is_random_next"):
      old = getattr(self, name)
      new = np.zeros((capacity,) + old.shape[1:], old.dtype)
      new[:len(old)] = old
      setattr(self, name, new)

  def add(self, segment_a: np.ndarray, segment_b: np.ndarray, is_random_next: bool) -> None:
    if self.size == len(self.len_a):
      self._grow()
    row = self.tokens[self.size]
    la, lb = len(segment_a), len(segment_b)
    row[0] = self.cls_id
    row[1:1 + la] = segment_a
    row[1 + la] = self.sep_id
    row[2 + la:2 + la + lb] = segment_b
    row[2 + la + lb] = self.sep_id
    self.len_a[self.size], self.len_b[self.size] = la, lb
    self.is_random_next[self.size] = is_random_next
    self.size += 1

  def features(self, rows: np.ndarray) -> dict[str, np.ndarray]:
    """input_ids, input_mask, segment_ids, next_sentence_labels of the given rows."""
    lengths = self.len_a[rows] + self.len_b[rows] + 3
    position = np.arange(self.max_seq_length)[None, :]
    input_mask = position < lengths[:, None]
    segment_ids = input_mask & (position >= (self.len_a[rows] + 2)[:, None])
    return {
        "input_ids": self.tokens[rows].astype(np.int64),
        "input_mask": input_mask.astype(np.int64),
        "segment_ids": segment_ids.astype(np.int64),
        "next_sentence_labels": self.is_random_next[rows].astype(np.int64)[:, None],
    }


def truncate_pair(a: list[int], b: list[int], max_num_tokens: int, rng: random.Random) -> None:
  """Shrinks spans a = [start, end), b = [start, end) in place until they fit together.

  The original removes one token at a time from the longer segment (B on a tie), from the front
  or the back with equal odds. Which segment loses how many tokens does not depend on the coin
  flips, and each segment's front losses are then Binomial(losses, 1/2): drawn here in one call
  (the popcount of random bits) instead of a loop of draws — the same distribution, faster.
  """
  la, lb = a[1] - a[0], b[1] - b[0]
  excess = la + lb - max_num_tokens
  if excess <= 0:
    return
  if la > lb:
    cut_a, cut_b = min(excess, la - lb), 0
  else:
    cut_a, cut_b = 0, min(excess, lb - la)
  rest = excess - cut_a - cut_b  # from equal lengths on, B and A take turns, B first
  cut_b += (rest + 1) // 2
  cut_a += rest // 2
  for span, cut in ((a, cut_a), (b, cut_b)):
    if cut:
      front = bin(rng.getrandbits(cut)).count("1")
      span[0] += front
      span[1] -= cut - front


def add_document_instances(documents: Sequence[Document], document_index: int,
                           max_seq_length: int, short_seq_prob: float, rng: random.Random,
                           out: InstanceArrays) -> bool:
  """Appends the instances of one document to `out`; returns whether the target was short."""
  document = documents[document_index]
  bounds = document.bounds_list
  max_num_tokens = max_seq_length - 3
  target_seq_length = max_num_tokens
  short = rng.random() < short_seq_prob
  if short:
    target_seq_length = rng.randint(2, max_num_tokens)

  n = len(bounds) - 1
  chunk_start = 0  # first sentence of the current chunk
  while chunk_start < n:
    # The chunk grows sentence by sentence until it reaches the target or the document ends.
    i = min(bisect.bisect_left(bounds, bounds[chunk_start] + target_seq_length,
                               chunk_start + 1) - 1, n - 1)
    chunk_sentences = i + 1 - chunk_start
    a_end = 1  # sentences of the chunk that go into segment A
    if chunk_sentences >= 2:
      a_end = rng.randint(1, chunk_sentences - 1)
    a_span = [bounds[chunk_start], bounds[chunk_start + a_end]]
    if chunk_sentences == 1 or rng.random() < 0.5:
      is_random_next = True
      target_b_length = target_seq_length - (a_span[1] - a_span[0])
      for _ in range(10):  # a different document, if one turns up within ten draws
        random_index = rng.randint(0, len(documents) - 1)
        if random_index != document_index:
          break
      other = documents[random_index].bounds_list
      start_sentence = rng.randint(0, len(other) - 2)
      start = other[start_sentence]
      # Whole sentences from there until B reaches its target length (or the document ends).
      stop = min(bisect.bisect_left(other, start + target_b_length, start_sentence + 1),
                 len(other) - 1)
      b_source, b_span = documents[random_index].ids, [start, other[stop]]
      i -= chunk_sentences - a_end  # put the unused sentences back
    else:
      is_random_next = False
      b_source, b_span = document.ids, [bounds[chunk_start + a_end], bounds[i + 1]]
    truncate_pair(a_span, b_span, max_num_tokens, rng)
    assert a_span[1] > a_span[0] and b_span[1] > b_span[0]
    out.add(document.ids[a_span[0]:a_span[1]], b_source[b_span[0]:b_span[1]], is_random_next)
    chunk_start = i + 1
  return short
