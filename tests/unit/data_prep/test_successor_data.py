"""The successors' data on real text: ALBERT's sentence order, RoBERTa's single-segment rows,
n-gram and span masking, and span boundaries — checked against the Shakespeare they come from.

Tolerances are four standard errors of the sample each statistic is measured on."""

import glob
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from bert_jax.data import input_pipeline, packing
from bert_jax.runs import pretraining
from bert_jax.text import features, masking, tokenization
from data_prep import create_pretraining_data as cpd
from data_prep import demo_corpus, instances, train_tokenizer
from tests.helpers import minilm_dir
from tests import helpers

ROOT = helpers.REPO
VOCAB = os.path.join(minilm_dir(), "vocab.txt")
CLS, SEP, MASK = 101, 102, 103
SEQ, PRED = 128, 20
# Clipped Geometric(0.2) on 1..10 words (SpanBERT), and P(n) ∝ 1/n on 1..3 (ALBERT).
SPAN_PROBS = 0.2 * 0.8 ** np.arange(10) / (1 - 0.8 ** 10)
NGRAM_PROBS = (1 / np.arange(1, 4)) / (1 / np.arange(1, 4)).sum()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """~150 KB of Shakespeare in BERT's input format (one scene per document)."""
  path = tmp_path_factory.mktemp("corpus") / "plays.txt"
  path.write_text(demo_corpus.corpus_text(max_bytes=150_000), encoding="utf-8")
  return str(path)


@pytest.fixture(scope="module")
def tokenizer():
  return tokenization.load_tokenizer(vocab_file=VOCAB, do_lower_case=True)


def document_ids(corpus_path, tok):
  """Each document's token ids back to back, as data_prep reads them (lines → ids)."""
  documents = open(corpus_path, encoding="utf-8").read().split("\n\n")
  out = []
  for document in documents:
    lines = [line for line in document.split("\n") if line]
    ids = [i for line_ids in tok.encode_batch(lines) for i in line_ids]
    if ids:
      out.append(np.array(ids, np.int32))
  return out


def run(corpus_path, directory, **overrides):
  overrides.setdefault("masking", "dynamic")
  settings = cpd.make_settings(corpus_path, overrides.pop("vocab_file", VOCAB), **overrides)
  summary = cpd.create_pretraining_data(settings, output_dir=str(directory), num_output_shards=1,
                                        num_workers=1, show_progress=False)
  return summary, sorted(glob.glob(os.path.join(str(directory), "pretrain-*.tfrecord")))


def read_records(paths, masking_mode, max_sequences_per_row=None):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  spec = features.tf_feature_spec(SEQ, PRED, masking_mode, max_sequences_per_row)
  dataset = tf.data.TFRecordDataset(paths).batch(4096).map(lambda x: tf.io.parse_example(x, spec))
  parts = [{k: v.numpy() for k, v in batch.items()} for batch in dataset]
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def within(observed, expected, n, what):
  """|observed - expected| within four standard errors of a share measured on n draws."""
  tolerance = 4 * np.sqrt(expected * (1 - expected) / n)
  assert abs(observed - expected) < tolerance, f"{what}: {observed:.4f} vs {expected:.4f} " \
      f"(n={n}, tolerance {tolerance:.4f})"


def in_one_document(needle, documents):
  key = np.asarray(needle, np.int32).tobytes()
  return any(key in d.tobytes() for d in documents)


# -------------------------------------------------------------------- sentence-level objective


@pytest.mark.parametrize("objective", ["sop", "none"])
def test_pairs_are_consecutive_text_of_one_document(corpus, tokenizer, tmp_path, objective):
  summary, paths = run(corpus, tmp_path, objective=objective, dupe_factor=4)
  r = read_records(paths, "dynamic")
  labels = r["next_sentence_labels"][:, 0]
  n = labels.size
  assert summary["sentence_objective"] == objective and summary["random_next_fraction"] is None
  if objective == "sop":
    within(labels.mean(), 0.5, n, "swapped share")
    assert summary["swapped_fraction"] == pytest.approx(labels.mean(), abs=1e-6)
  else:
    assert (labels == 0).all() and summary["swapped_fraction"] is None
  documents = document_ids(corpus, tokenizer)
  for ids, mask, segments, label in zip(r["input_ids"], r["input_mask"], r["segment_ids"],
                                        labels):
    length = int(mask.sum())
    seps = np.flatnonzero(ids[:length] == SEP)
    assert ids[0] == CLS and seps[-1] == length - 1
    a, b = ids[1:seps[-2]], ids[seps[-2] + 1:length - 1]
    assert a.size and b.size
    np.testing.assert_array_equal(segments[:length], np.arange(length) > seps[-2])
    first, second = (b, a) if label else (a, b)
    # In their order of the text, the two are one run of one document; swapped, they are not.
    assert in_one_document(np.concatenate([first, second]), documents)
    if label:
      assert not in_one_document(np.concatenate([a, b]), documents)


# ----------------------------------------------------------------- single-segment rows (RoBERTa)


@pytest.fixture(scope="module")
def single_runs(corpus, tmp_path_factory):
  out = {}
  for mode in ("full_sentences", "doc_sentences"):
    summary, paths = run(corpus, tmp_path_factory.mktemp(mode), objective="none",
                         sequence_mode=mode, short_seq_prob=0.0)
    out[mode] = summary, read_records(paths, "dynamic")
  return out


def test_single_segment_rows(corpus, tokenizer, single_runs):
  documents = [d.tobytes() for d in document_ids(corpus, tokenizer)]
  crossing = {}
  for mode, (summary, r) in single_runs.items():
    assert summary["sentence_objective"] == "none" and summary["sequence_mode"] == mode
    assert (r["segment_ids"] == 0).all() and (r["next_sentence_labels"] == 0).all()
    lengths = r["input_mask"].sum(axis=1)
    crossing[mode] = 0
    for ids, length in zip(r["input_ids"], lengths):
      assert ids[0] == CLS and ids[length - 1] == SEP
      pieces = np.split(ids[1:length - 1], np.flatnonzero(ids[1:length - 1] == SEP))
      pieces = [p[1:] if i else p for i, p in enumerate(pieces)]  # drop the separators
      assert all(p.size for p in pieces)  # never a separator first, last or twice
      crossing[mode] += len(pieces) > 1
      for i, piece in enumerate(pieces):
        key = piece.astype(np.int32).tobytes()
        assert any(key in d for d in documents)
        # A separator comes exactly where a document ends and the next begins.
        if i < len(pieces) - 1:
          assert any(d.endswith(key) for d in documents)
        if i > 0:
          assert any(d.startswith(key) for d in documents)
    # Rows near the target: short of it only by less than the sentence that did not fit (exactly
    # checked in the next test); Shakespeare's sentences are long (about 23 pieces, some 100).
    assert np.median(lengths) >= 0.85 * SEQ, (mode, np.median(lengths))
  assert crossing["full_sentences"] > 0 and crossing["doc_sentences"] == 0
  assert (single_runs["full_sentences"][0]["padding_fraction"] <
          single_runs["doc_sentences"][0]["padding_fraction"])


def test_single_segments_are_greedy_whole_sentences():
  """Every row holds whole sentences while the next one still fits: a row is short of the
  target only by less than what would come next (with full_sentences, the separator and the
  next document's first sentence), or where its document (doc_sentences) or the shard ends."""
  rng = np.random.default_rng(3)
  docs = [[list(range(1000 * d + 50 * s, 1000 * d + 50 * s + int(n)))
           for s, n in enumerate(rng.integers(1, 12, size=rng.integers(1, 9)))]
          for d in range(40)]
  documents = instances.make_documents(docs)
  target = 24 - 2
  first_sentences = set(documents.sentence_starts[documents.document_starts[:-1]].tolist())
  for cross in (True, False):
    built, short, tokens = instances.build_single_segments(documents, 24, 0.0, 2, rng, cross,
                                                            sep_id=-1)
    assert short == 0 and (built.a_length <= target).all() and (built.b_length == 0).all()
    assert (tokens == -1).any() == cross
    units = (instances.with_document_separators(documents, -1)[1] if cross else
             documents.sentence_starts).tolist()
    assert built.size == 2 * (built.size // 2)  # the same rows on both passes
    for begin, length in zip(built.a_start.tolist(), built.a_length.tolist()):
      end = begin + length
      assert begin in units and tokens[begin] != -1 and tokens[end - 1] != -1
      assert cross or -1 not in tokens[begin:end].tolist()
      if end not in units:  # a sentence longer than the target, cut
        assert length == target and units[units.index(begin) + 1] > end
        continue
      j = units.index(end)
      if j == len(units) - 1:
        continue  # the end of the shard
      coming = units[j + 1] - end
      if tokens[end] == -1:  # a separator and the next document's first sentence
        coming += units[j + 2] - units[j + 1]
      elif not cross and end in first_sentences:
        continue  # doc_sentences: the end of a document
      assert length + coming > target, (cross, begin, end)


def test_roberta_vocabulary_layouts(corpus, tmp_path):
  vocab_file, _ = train_tokenizer.train_byte_level_bpe([corpus], str(tmp_path / "rb"), 1000)
  tok = tokenization.load_tokenizer(vocab_file=vocab_file)
  _, paths = run(corpus, tmp_path / "full", vocab_file=vocab_file, objective="none",
                 sequence_mode="full_sentences")
  r = read_records(paths, "dynamic")
  lengths = r["input_mask"].sum(axis=1)
  assert (r["input_ids"][:, 0] == tok.cls_id).all()
  assert (r["input_ids"][np.arange(lengths.size), lengths - 1] == tok.sep_id).all()
  assert ((r["input_ids"] == tok.sep_id).sum(axis=1) > 1).any()  # rows that cross documents
  _, paths = run(corpus, tmp_path / "sop", vocab_file=vocab_file, objective="sop")
  r = read_records(paths, "dynamic")
  for ids, length in zip(r["input_ids"][:50], r["input_mask"].sum(axis=1)[:50]):
    seps = np.flatnonzero(ids[:length] == tok.sep_id)
    # <s> A </s></s> B </s>, as the tokenizer lays out a pair; no segment embeddings.
    np.testing.assert_array_equal(
        ids[:length], tok.build_inputs(ids[1:seps[0]], ids[seps[1] + 1:length - 1]))
  assert (r["segment_ids"] == 0).all()


# --------------------------------------------------------------------- n-gram and span masking


@pytest.fixture(scope="module")
def rows(single_runs, tokenizer):
  """Real unmasked rows: the doc_sentences records, with their word starts."""
  r = single_runs["doc_sentences"][1]
  return r["input_ids"], r["input_mask"].astype(bool), r["word_starts"].astype(bool)


def config(tokenizer, **kwargs):
  return masking.MaskingConfig.from_tokenizer(tokenizer, max_predictions_per_seq=PRED, **kwargs)


def runs_of(masked):
  """Per row, the maximal runs of masked positions, as (row, first, last) triples."""
  left, right, offset = masking.span_boundaries(masked["masked_lm_positions"],
                                                masked["masked_lm_weights"])
  first = (offset == 0) & (masked["masked_lm_weights"] > 0)
  row = np.nonzero(first)[0]
  return row, left[first] + 1, right[first] - 1


@pytest.mark.parametrize("strategy", ["ngram", "span"])
def test_unit_lengths_follow_their_distribution(tokenizer, rows, strategy):
  input_ids, input_mask, word_starts = rows
  cfg = config(tokenizer, strategy=strategy)
  probs = SPAN_PROBS if strategy == "span" else NGRAM_PROBS
  np.testing.assert_allclose(cfg.unit_length_probs(), probs)
  rng = np.random.default_rng(0)
  candidates = input_mask & (input_ids != CLS) & (input_ids != SEP)
  targets = masking.num_to_predict(input_mask.sum(1), 0.15, PRED)
  drawn = []
  for _ in range(4):
    chosen, span, record = masking.choose_spans(candidates, targets, rng, word_starts, probs,
                                                separate=strategy == "span")
    drawn.append(record["drawn"])
    # The positions chosen are exactly the recorded spans' words, within the budget.
    assert chosen.sum() == (span >= 0).sum() and (chosen.sum(1) <= targets).all()
    assert (word_starts & chosen).sum() == record["taken"].sum()
    assert (record["taken"] <= record["drawn"]).all()
  drawn = np.concatenate(drawn)
  for n, p in enumerate(probs, start=1):
    within((drawn == n).mean(), p, drawn.size, f"{strategy} share of length {n}")
  if strategy == "span":  # mean 3.8 words (the SpanBERT paper's figure)
    mean = (np.arange(1, 11) * SPAN_PROBS).sum()
    sd = np.sqrt(((np.arange(1, 11) - mean) ** 2 * SPAN_PROBS).sum())
    assert mean == pytest.approx(3.8, abs=0.01)
    assert abs(drawn.mean() - mean) < 4 * sd / np.sqrt(drawn.size)


def test_span_masks_are_separate_runs_per_span_fate_and_budget(tokenizer, rows):
  input_ids, input_mask, word_starts = rows
  rng = np.random.default_rng(1)
  targets = masking.num_to_predict(input_mask.sum(1), 0.15, PRED)
  fates, count = [], 0
  for _ in range(3):
    masked = masking.mask_batch(input_ids, input_mask, config(tokenizer, strategy="span"), rng,
                                word_starts)
    weights = masked["masked_lm_weights"] > 0
    assert (weights.sum(1) <= targets).all()
    count += weights.sum()
    row, first, last = runs_of(masked)
    for r, a, b in zip(row, first, last):
      ids = input_ids[r]
      # A run is whole words of one segment: [CLS]/[SEP]/padding around it, never inside.
      assert word_starts[r, a] and (b + 1 == len(ids) or word_starts[r, b + 1])
      assert input_mask[r, a:b + 1].all() and not np.isin(ids[a:b + 1], [CLS, SEP]).any()
      new = masked["input_ids"][r, a:b + 1]
      if (new == MASK).all():
        fates.append(0)
      elif (new == ids[a:b + 1]).all():
        fates.append(2)
      else:
        assert not (new == MASK).any(), "a span half [MASK]"
        fates.append(1)
  fates = np.array(fates)
  for fate, p in ((0, 0.8), (1, 0.1), (2, 0.1)):
    within((fates == fate).mean(), p, fates.size, f"span fate {fate}")
  # The 15% budget: all but a sliver (a word that does not fit the last pieces) is used.
  assert 0.98 * 3 * targets.sum() <= count <= 3 * targets.sum()


def test_span_boundaries_by_hand():
  positions = np.array([[3, 4, 5, 9, 11, 12, 0, 0], [1, 2, 0, 0, 0, 0, 0, 0]])
  weights = (np.arange(8) < np.array([[6], [2]])).astype(np.float32)
  left, right, offset = masking.span_boundaries(positions, weights)
  np.testing.assert_array_equal(left, [[2, 2, 2, 8, 10, 10, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(right, [[6, 6, 6, 10, 13, 13, 0, 0], [3, 3, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(offset, [[0, 1, 2, 0, 0, 1, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0]])
  # Any leading shape; a row with nothing masked gives zeros.
  left, right, offset = masking.span_boundaries(positions[None, :, :3], np.zeros((1, 2, 3)))
  assert left.shape == (1, 2, 3) and not left.any() and not right.any() and not offset.any()


def test_static_and_dynamic_span_masking_agree(corpus, tmp_path):
  """data_prep's static masks and the pipeline's dynamic ones (through the config wiring of
  `pretraining.masking_config`), on packed doc_sentences rows: the same statistics."""
  common = dict(objective="none", sequence_mode="doc_sentences", packing=True,
                masking_strategy="span")
  static_summary, static_paths = run(corpus, tmp_path / "static", masking="static",
                                     dupe_factor=2, **common)
  _, dynamic_paths = run(corpus, tmp_path / "dynamic", **common)
  assert static_summary["sequences_per_row"] > 1.05  # the short ends of documents share rows
  static = read_records(static_paths, "static", 3)
  cfg = ml_collections.ConfigDict({"data": {
      "vocab_file": VOCAB, "spm_model_file": "", "do_lower_case": True, "masked_lm_prob": 0.15,
      "max_predictions_per_seq": PRED, "whole_word_mask": False, "per_word_draw": False,
      "masking_strategy": "span", "max_ngram": 3, "span_p": 0.2, "max_span_length": 10}})
  masking_config = pretraining.masking_config(cfg, dynamic_paths)
  assert masking_config.strategy == "span" and masking_config.whole_word_mask
  data = input_pipeline.PretrainingData(
      None, files=dynamic_paths, global_batch_size=64, max_seq_length=SEQ,
      max_predictions_per_seq=PRED, sharding=None, masking_config=masking_config,
      process_index=0, process_count=1, shuffle=False, repeat=False)
  batches = [b for b, _ in data.host_batches()]
  dynamic = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}

  def statistics(r):
    unpacked = packing.unpack_rows(r)[0]
    weights = unpacked["masked_lm_weights"] > 0
    new = np.take_along_axis(unpacked["input_ids"], unpacked["masked_lm_positions"], 1)
    row, first, last = runs_of(unpacked)
    return {"masked_share": weights.sum() / (unpacked["input_mask"].sum() - 2 * len(weights)),
            "mask_token_share": (new[weights] == MASK).mean(),
            "run_pieces": np.mean(last - first + 1), "n": weights.sum(), "runs": row.size}

  s, d = statistics(static), statistics(dynamic)
  assert abs(s["masked_share"] - d["masked_share"]) < 0.005, (s, d)
  assert 0.14 < s["masked_share"] < 0.155
  # Two estimates, each from its runs (the fate is per span): half the runs bound the difference.
  within(d["mask_token_share"], s["mask_token_share"], min(s["runs"], d["runs"]) // 2,
         "[MASK] share")
  assert abs(s["run_pieces"] - d["run_pieces"]) < 0.25, (s, d)


# ------------------------------------------------------------------------------ bad settings


@pytest.mark.e2e
def test_bad_combinations_give_one_line_errors(corpus, tmp_path):
  for overrides, named in (
      (dict(sequence_mode="full_sentences"), "--objective=none"),
      (dict(sequence_mode="doc_sentences", objective="sop"), "--objective=none"),
      (dict(masking_strategy="span", do_whole_word_mask=True), "--do_whole_word_mask"),
      (dict(masking_strategy="span", span_p=0.0), "span_p"),
      (dict(masking_strategy="ngram", max_ngram=0), "max_ngram")):
    with pytest.raises(ValueError, match=named) as error:
      cpd.check_settings(cpd.make_settings(corpus, VOCAB, **overrides))
    assert "\n" not in str(error.value)
  with pytest.raises(ValueError, match="strategy 'spans'"):
    masking.MaskingConfig(vocab_size=10, mask_id=3, cls_id=1, sep_id=2, strategy="spans")
  result = subprocess.run(
      [sys.executable, "-m", "data_prep.create_pretraining_data", f"--input_file={corpus}",
       f"--vocab_file={VOCAB}", f"--output_dir={tmp_path}", "--sequence_mode=full_sentences",
       "--objective=sop", "--noprogress"], cwd=ROOT, capture_output=True, text=True, check=False)
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and "--sequence_mode=full_sentences" in lines[0] and \
      "--objective=none" in lines[0], result.stderr
