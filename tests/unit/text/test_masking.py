"""The 80/10/10 masking rule on rows of real tokenized text."""

import os

import numpy as np
import pytest

from bert_jax.text import masking, wordpiece
from data_prep import demo_corpus
from tests.helpers import minilm_dir

MAX_SEQ_LENGTH = 128


@pytest.fixture(scope="module")
def tokenizer():
  return wordpiece.WordPieceTokenizer(os.path.join(minilm_dir(), "vocab.txt"),
                                         split_special_tokens=True)


@pytest.fixture(scope="module")
def rows(tokenizer):
  """[CLS] A [SEP] B [SEP] rows of real text, of varied lengths, padded with 0."""
  lines = [l for l in demo_corpus.corpus_text(max_bytes=250_000).split("\n") if l]
  ids = tokenizer.encode_batch(lines)
  rng = np.random.default_rng(0)
  input_ids = np.zeros((2000, MAX_SEQ_LENGTH), np.int64)
  for r in range(len(input_ids)):
    budget = int(rng.integers(8, MAX_SEQ_LENGTH - 3 + 1))
    a = [t for i in range(3 * r, 3 * r + 2) for t in ids[i % len(ids)]][:budget // 2]
    b = ids[(3 * r + 2) % len(ids)][:budget - len(a)] or [tokenizer.unk_id]
    a = a or [tokenizer.unk_id]
    row = [tokenizer.cls_id] + a + [tokenizer.sep_id] + b + [tokenizer.sep_id]
    input_ids[r, :len(row)] = row
  input_mask = (np.arange(MAX_SEQ_LENGTH)[None] < (input_ids != 0).sum(1)[:, None]).astype(int)
  word_starts = tokenizer.word_starts(input_ids) & (input_mask == 1)
  return input_ids, input_mask, word_starts


def config(tokenizer, **kwargs):
  return masking.MaskingConfig.from_tokenizer(tokenizer, **kwargs)


def test_num_to_predict_is_the_originals_formula():
  lengths = np.arange(1, 513)
  expected = [min(20, max(1, int(round(n * 0.15)))) for n in lengths]
  np.testing.assert_array_equal(masking.num_to_predict(lengths, 0.15, 20), expected)


def test_masking_statistics(tokenizer, rows):
  input_ids, input_mask, _ = rows
  rng = np.random.default_rng(1)
  out = masking.mask_batch(input_ids, input_mask, config(tokenizer), rng)
  weights = out["masked_lm_weights"] > 0
  positions, labels = out["masked_lm_positions"], out["masked_lm_ids"]
  lengths = input_mask.sum(1)
  # Exactly num_to_predict per row (every row has enough candidates), at most 20.
  np.testing.assert_array_equal(weights.sum(1), masking.num_to_predict(lengths, 0.15, 20))
  # ≈ 15% of non-special tokens, a bit more because [CLS]/[SEP] count in the length.
  fraction = weights.sum() / (lengths - 3).sum()
  assert 0.145 < fraction < 0.165, fraction
  # Positions: sorted, inside the real tokens, never [CLS]/[SEP]; padding slots are zero.
  assert (np.diff(positions, axis=1)[weights[:, 1:]] > 0).all()
  assert (np.where(weights, positions, 0) < lengths[:, None]).all()
  at = np.take_along_axis(input_ids, positions, 1)
  assert not np.isin(at[weights], [tokenizer.cls_id, tokenizer.sep_id, 0]).any()
  assert (positions[~weights] == 0).all() and (labels[~weights] == 0).all()
  np.testing.assert_array_equal(labels[weights], at[weights])
  # 80% [MASK], 10% random, 10% unchanged (4 sigma of a binomial).
  new = np.take_along_axis(out["input_ids"], positions, 1)[weights]
  n = weights.sum()
  for share, expected in [((new == tokenizer.mask_id).mean(), 0.8),
                          ((new == labels[weights]).mean(), 0.1 + 0.1 / tokenizer.vocab_size),
                          (((new != tokenizer.mask_id) & (new != labels[weights])).mean(), 0.1)]:
    assert abs(share - expected) < 4 * np.sqrt(expected * (1 - expected) / n), (share, expected)
  # Nothing else changed.
  changed = out["input_ids"] != input_ids
  chosen = np.zeros_like(changed)
  np.put_along_axis(chosen, positions, weights, 1)
  assert not (changed & ~chosen).any()


def test_sampled_positions_are_uniform_subsets():
  """Each k-subset of a row's candidates is equally likely, wherever the candidates lie."""
  rng = np.random.default_rng(5)
  rows = 60_000
  candidates = np.zeros((rows, 9), bool)
  candidates[:, [1, 2, 4, 5, 7]] = True  # gaps, as [CLS]/[SEP] make them
  candidates[::2] = False
  candidates[::2, [0, 8]] = True  # rows with two candidates, at both ends
  targets = np.where(np.arange(rows) % 2, 2, 5)  # more than the candidates in even rows
  positions, count = masking.sample_positions(candidates, targets, rng)
  assert positions.shape == (rows, 2) and (count == 2).all()
  np.testing.assert_array_equal(positions[::2], [[0, 8]] * (rows // 2))
  picked = positions[1::2]
  assert (picked[:, 0] < picked[:, 1]).all() and candidates[1::2][0, picked].all()
  subsets, counts = np.unique(picked, axis=0, return_counts=True)
  assert len(subsets) == 10  # 5 choose 2
  expected = len(picked) / 10
  assert (np.abs(counts - expected) < 5 * np.sqrt(expected)).all(), counts


def test_cap_and_tiny_rows(tokenizer, rows):
  input_ids, input_mask, _ = rows
  out = masking.mask_batch(input_ids, input_mask,
                           config(tokenizer, max_predictions_per_seq=5, masked_lm_prob=0.5),
                           np.random.default_rng(2))
  candidates = (input_mask == 1) & ~np.isin(input_ids, [tokenizer.cls_id, tokenizer.sep_id])
  np.testing.assert_array_equal(out["masked_lm_weights"].sum(1),
                                np.minimum(masking.num_to_predict(input_mask.sum(1), 0.5, 5),
                                           candidates.sum(1)))
  assert (out["masked_lm_weights"].sum(1) == 5).mean() > 0.95
  assert out["masked_lm_positions"].shape == (len(input_ids), 5)
  tiny = np.array([[tokenizer.cls_id, 2023, tokenizer.sep_id, 2003, tokenizer.sep_id, 0, 0]])
  out = masking.mask_batch(tiny, tiny != 0, config(tokenizer), np.random.default_rng(3))
  assert out["masked_lm_weights"].sum() == 1  # max(1, round(5 * 0.15)) = 1
  assert out["masked_lm_positions"][0, 0] in (1, 3)


def test_same_seed_same_masks(tokenizer, rows):
  input_ids, input_mask, _ = rows
  a = masking.mask_batch(input_ids, input_mask, config(tokenizer), np.random.default_rng(7))
  b = masking.mask_batch(input_ids, input_mask, config(tokenizer), np.random.default_rng(7))
  c = masking.mask_batch(input_ids, input_mask, config(tokenizer), np.random.default_rng(8))
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])
  assert not np.array_equal(a["masked_lm_positions"], c["masked_lm_positions"])


def _words(word_starts_row, candidates_row):
  """Lists of positions, one per word (a start and the continuation pieces after it)."""
  words, current = [], []
  for p, (start, cand) in enumerate(zip(word_starts_row, candidates_row)):
    if not cand:
      if current:
        words.append(current)
      current = []
      continue
    if start and current:
      words.append(current)
      current = []
    current.append(p)
  if current:
    words.append(current)
  return words


@pytest.mark.parametrize("per_word_draw", [False, True])
def test_whole_word_masking(tokenizer, rows, per_word_draw):
  input_ids, input_mask, word_starts = rows
  cfg = config(tokenizer, whole_word_mask=True, per_word_draw=per_word_draw)
  out = masking.mask_batch(input_ids, input_mask, cfg, np.random.default_rng(4), word_starts)
  weights = out["masked_lm_weights"] > 0
  targets = masking.num_to_predict(input_mask.sum(1), 0.15, 20)
  assert (weights.sum(1) <= targets).all()
  assert weights.sum(1).mean() > 0.9 * targets.mean()
  candidates = (input_mask == 1) & ~np.isin(input_ids, [tokenizer.cls_id, tokenizer.sep_id])
  multi_piece_masked = mixed_fate = 0
  for r in range(len(input_ids)):
    chosen = set(out["masked_lm_positions"][r][weights[r]].tolist())
    for word in _words(word_starts[r], candidates[r]):
      inside = [p in chosen for p in word]
      assert all(inside) or not any(inside), (r, word)  # whole words only
      if all(inside) and len(word) > 1:
        multi_piece_masked += 1
        fates = {out["input_ids"][r, p] == tokenizer.mask_id for p in word}
        mixed_fate += len(fates) > 1
  assert multi_piece_masked > 100
  if per_word_draw:
    assert mixed_fate == 0
  else:  # the original's per-piece draw: some words come out half [MASK]
    assert mixed_fate > 0


def test_whole_word_masking_needs_word_starts(tokenizer, rows):
  input_ids, input_mask, _ = rows
  with pytest.raises(ValueError, match="word_starts"):
    masking.mask_batch(input_ids, input_mask, config(tokenizer, whole_word_mask=True),
                       np.random.default_rng(0))
