"""Sentence and sentence-pair examples → fixed-length model inputs, as `run_classifier.py` did.

`[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]` (each family's layout: the tokenizer's
`build_inputs`, RoBERTa's `<s> a </s></s> b </s>`), segment ids 0 for the first part and 1 for
the second, padded with 0 to `max_seq_length`. Pairs that are too long lose tokens from the end of
the longer side, one at a time (the original's `_truncate_seq_pair`), so a short question keeps
all of its words when paired with a long passage.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def truncate_pair(tokens_a: list[int], tokens_b: list[int], max_length: int) -> None:
  """In place: drop from the end of the longer list until both fit in `max_length`."""
  while len(tokens_a) + len(tokens_b) > max_length:
    if len(tokens_a) > len(tokens_b):
      tokens_a.pop()
    else:
      tokens_b.pop()


def encode_examples(tokenizer, texts_a: Sequence[str], texts_b: Sequence[str | None] | None,
                    max_seq_length: int) -> dict[str, np.ndarray]:
  """`input_ids`, `input_mask`, `segment_ids` (n, max_seq_length) int32 for n examples."""
  n = len(texts_a)
  ids_a = tokenizer.encode_batch(list(texts_a))
  has_b = texts_b is not None and any(t is not None for t in texts_b)
  ids_b = (tokenizer.encode_batch([t or "" for t in texts_b]) if has_b else [None] * n)
  input_ids = np.zeros((n, max_seq_length), np.int32)
  input_mask = np.zeros((n, max_seq_length), np.int32)
  segment_ids = np.zeros((n, max_seq_length), np.int32)
  for i in range(n):
    a = list(ids_a[i])
    b = list(ids_b[i]) if (has_b and texts_b[i] is not None) else None
    if b is not None:
      # 3 special tokens for BERT's layout, 4 for RoBERTa's <s> A </s></s> B </s>.
      truncate_pair(a, b, max_seq_length - 2 - tokenizer.pair_separators)
      row = tokenizer.build_inputs(a, b)
      segments = [0] * (len(a) + 1 + tokenizer.pair_separators) + [1] * (len(b) + 1)
    else:
      a = a[:max_seq_length - 2]
      row = tokenizer.build_inputs(a)
      segments = [0] * len(row)
    input_ids[i, :len(row)] = row
    input_mask[i, :len(row)] = 1
    segment_ids[i, :len(row)] = segments
  return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids}
