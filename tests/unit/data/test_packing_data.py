"""Packed pre-training rows, the data side: the packer, data_prep --packing, the input pipeline.

Packed rows must hold exactly the instances of the unpacked data, masked the same way, in fewer
rows; these tests run data_prep both ways on the same Shakespeare text and compare."""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.data import input_pipeline, packing
from bert_jax.text import features, masking, wordpiece
from data_prep import create_pretraining_data as cpd
from data_prep import demo_corpus
from tests.helpers import minilm_dir
from tests import helpers

ROOT = helpers.REPO
VOCAB = os.path.join(minilm_dir(), "vocab.txt")
CLS, SEP, MASK = 101, 102, 103
SEQ, PRED, K = 128, 20, 3


# ------------------------------------------------------------------------------------ packer


def first_fit(lengths, max_seq_length, max_sequences_per_row, costs=None, max_cost=None):
  """Rows that first fit in the given order needs (the baseline a packer must beat)."""
  room, count, cost = [], [], []
  for length in lengths.tolist():
    c = 0 if costs is None else int(costs[length])
    for i in range(len(room)):
      if room[i] >= length and count[i] < max_sequences_per_row and (
          costs is None or cost[i] + c <= max_cost):
        room[i] -= length
        count[i] += 1
        cost[i] += c
        break
    else:
      room.append(max_seq_length - length)
      count.append(1)
      cost.append(c)
  return len(room)


def histograms(rng):
  """Instance lengths as corpora give them: short documents (Wikipedia-like: most instances a
  fraction of the row), books (most instances full, `short_seq_prob` of them shorter)."""
  for s in (128, 512):
    yield f"short_documents_{s}", s, np.clip(rng.lognormal(np.log(s / 4), 0.9, 4000), 5,
                                             s).astype(np.int64)
    yield f"medium_documents_{s}", s, np.clip(rng.lognormal(np.log(s / 2), 0.6, 4000), 5,
                                              s).astype(np.int64)
    yield f"books_{s}", s, np.where(rng.random(4000) < 0.1, rng.integers(5, s + 1, 4000),
                                    s - rng.integers(0, 4, 4000))


def check_packing(layout, lengths, max_seq_length, k, costs=None, max_cost=None):
  # Every instance in exactly one (row, slot), slots 0..n-1 of each row used in order.
  assert layout.row.shape == lengths.shape and layout.row.min() >= 0
  assert layout.row.max() < layout.num_rows and layout.slot.min() >= 0
  pairs = layout.row * k + layout.slot
  assert np.unique(pairs).size == lengths.size
  per_row = np.bincount(layout.row, minlength=layout.num_rows)
  assert per_row.min() >= 1 and per_row.max() <= k  # no empty row, never more than K
  assert (layout.slot < per_row[layout.row]).all()
  tokens = np.bincount(layout.row, weights=lengths, minlength=layout.num_rows)
  assert tokens.max() <= max_seq_length
  # Instances back to back: each starts where the one before it in its row ends.
  order = np.lexsort((layout.slot, layout.row))
  row, offset, length = layout.row[order], layout.offset[order], lengths[order]
  first = np.r_[True, row[1:] != row[:-1]]
  assert (offset[first] == 0).all()
  assert (offset[~first] == (offset + length)[:-1][~first[1:]]).all()
  if costs is not None:
    assert np.bincount(layout.row, weights=costs[lengths]).max() <= max_cost


def test_packer_keeps_every_limit_places_every_instance_once_and_beats_first_fit():
  rng = np.random.default_rng(0)
  for name, s, lengths in histograms(rng):
    budget = {128: 20, 512: 80}[s]  # max_predictions_per_seq per row, as users set it
    for k in (2, 3, 8):
      costs = packing.prediction_costs(s, 0.15, budget)
      layout = packing.pack(lengths, s, k, costs=costs, max_cost=budget, rng=rng)
      check_packing(layout, lengths, s, k, costs, budget)
      baseline = first_fit(lengths, s, k, costs, budget)
      assert layout.num_rows <= baseline, (name, k, layout.num_rows, baseline)
      lower_bound = max(lengths.sum() / s, lengths.size / k, costs[lengths].sum() / budget)
      assert layout.num_rows <= 1.15 * lower_bound, (name, k, layout.num_rows, lower_bound)
      assert layout.efficiency(lengths, s) == pytest.approx(
          lengths.sum() / (layout.num_rows * s))


def test_packer_edge_cases():
  empty = packing.pack(np.zeros(0, np.int64), 16, 3)
  assert empty.num_rows == 0 and empty.row.size == 0
  alone = packing.pack(np.array([16, 16, 9]), 16, 3)
  assert alone.num_rows == 3  # full rows stay alone
  one_per_row = packing.pack(np.array([5, 5, 5]), 16, 1)
  assert one_per_row.num_rows == 3
  costs = np.arange(17)  # a budget that binds before the room does
  by_cost = packing.pack(np.array([5, 5, 5]), 16, 3, costs=costs, max_cost=10)
  check_packing(by_cost, np.array([5, 5, 5]), 16, 3, costs, 10)
  assert by_cost.num_rows == 2
  with pytest.raises(ValueError, match="lengths must lie"):
    packing.pack(np.array([17]), 16, 3)
  with pytest.raises(ValueError, match="max_sequences_per_row"):
    packing.pack(np.array([4]), 16, 0)


# ------------------------------------------------------------------- data_prep on real text


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """~300 KB of Shakespeare in BERT's input format."""
  directory = tmp_path_factory.mktemp("corpus")
  (directory / "plays.txt").write_text(demo_corpus.corpus_text(max_bytes=300_000),
                                       encoding="utf-8")
  return str(directory / "plays.txt")


def run(corpus, output_dir, **overrides):
  settings = cpd.make_settings(corpus, VOCAB, **overrides)
  summary = cpd.create_pretraining_data(settings, output_dir=str(output_dir),
                                        num_output_shards=2, num_workers=1,
                                        show_progress=False)
  return summary, sorted(glob.glob(os.path.join(str(output_dir), "pretrain-*.tfrecord")))


def read_records(paths, masking_mode, max_sequences_per_row=None, length=SEQ):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  spec = features.tf_feature_spec(length, PRED, masking_mode, max_sequences_per_row)
  dataset = tf.data.TFRecordDataset(paths).batch(4096).map(lambda x: tf.io.parse_example(x, spec))
  parts = [{k: v.numpy() for k, v in batch.items()} for batch in dataset]
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
  """The same corpus and seed: static and dynamic, unpacked and packed."""
  out = {}
  for masking_mode in ("static", "dynamic"):
    for packed in (False, True):
      directory = tmp_path_factory.mktemp(f"{masking_mode}_{packed}")
      summary, paths = run(corpus, directory, masking=masking_mode, packing=packed,
                           max_sequences_per_row=K)
      out[masking_mode, packed] = (summary, paths, read_records(
          paths, masking_mode, K if packed else None))
  return out


def restored_ids(r):
  """input_ids with the original tokens put back where they were masked."""
  ids = r["input_ids"].copy()
  np.put_along_axis(ids, r["masked_lm_positions"],
                    np.where(r["masked_lm_weights"] > 0, r["masked_lm_ids"],
                             np.take_along_axis(ids, r["masked_lm_positions"], 1)), 1)
  return ids


def instance_keys(r, ids, names=("segment_ids", "word_starts")):
  """The instances as a sorted list, one bytes key each (ids, token features, NSP label)."""
  parts = [ids] + [r[n] for n in names if n in r] + [r["next_sentence_labels"]]
  rows = np.concatenate([np.asarray(p, np.int64) for p in parts], axis=1)
  return sorted(map(bytes, rows))


def test_packed_layout_and_records(runs):
  summary, _, r = runs["static", True]
  unpacked_summary = runs["static", False][0]
  assert summary["rows"] == r["input_ids"].shape[0] < unpacked_summary["rows"]
  assert summary["instances"] == unpacked_summary["instances"]
  assert set(r) == {f.name for f in features.packed_pretraining_features(SEQ, PRED, K)}
  sequence_ids, positions = r["sequence_ids"], r["position_ids"]
  mask, ids = r["input_mask"].astype(bool), restored_ids(r)
  assert ((sequence_ids > 0) == mask).all() and (positions[~mask] == 0).all()
  assert (ids[~mask] == 0).all() and (r["segment_ids"][~mask] == 0).all()
  # Instances back to back, each from its [CLS] with positions restarting at 0.
  present = r["next_sentence_weights"] > 0
  assert present[:, 0].all() and (present[:, :-1] >= present[:, 1:]).all()
  for row in range(0, len(ids), 97):
    real = mask[row].sum()
    assert mask[row, :real].all() and not mask[row, real:].any()
    for slot in np.flatnonzero(present[row]):
      where = np.flatnonzero(sequence_ids[row] == slot + 1)
      assert where[0] == r["cls_positions"][row, slot] and (np.diff(where) == 1).all()
      assert (positions[row, where] == np.arange(where.size)).all()
      assert ids[row, where[0]] == CLS and ids[row, where[-1]] == SEP
      assert (ids[row, where] == SEP).sum() == 2
  assert (r["cls_positions"][~present] == 0).all()
  assert (r["next_sentence_labels"][~present] == 0).all()


@pytest.mark.parametrize("masking_mode", ["static", "dynamic"])
def test_packed_records_decode_to_exactly_the_unpacked_instances(runs, masking_mode):
  _, _, unpacked = runs[masking_mode, False]
  _, _, packed = runs[masking_mode, True]
  instances, row, slot, offset = packing.unpack_rows(packed)
  assert len(row) == len(unpacked["input_ids"])
  if masking_mode == "dynamic":  # unmasked: the very same rows
    assert instance_keys(instances, instances["input_ids"]) == instance_keys(
        unpacked, unpacked["input_ids"])
    return
  # Static: the same instances (dupe_factor copies included) under the masks; each instance
  # masked on its own, as unpacked ones are: its predictions inside it, never [CLS]/[SEP].
  assert instance_keys(instances, restored_ids(instances), ("segment_ids",)) == instance_keys(
      unpacked, restored_ids(unpacked), ("segment_ids",))
  weights = instances["masked_lm_weights"] > 0
  lengths = instances["input_mask"].sum(1)
  np.testing.assert_array_equal(weights.sum(1), masking.num_to_predict(lengths, 0.15, PRED))
  labels = instances["masked_lm_ids"][weights]
  assert not np.isin(labels, [CLS, SEP, 0]).any()
  inside = np.take_along_axis(instances["input_mask"], instances["masked_lm_positions"], 1)
  assert inside[weights].all()
  # Laying the decoded instances back gives the records again, masks included.
  again = packing.pack_rows(instances, row, slot, offset, len(packed["input_ids"]), K, PRED)
  for name, values in packed.items():
    np.testing.assert_array_equal(again[name], values, err_msg=name)


def mask_shares(r):
  """(masked fraction of the maskable tokens, [MASK] share, kept share, random share)."""
  weights = r["masked_lm_weights"] > 0
  at = np.take_along_axis(r["input_ids"], r["masked_lm_positions"], 1)[weights]
  labels = r["masked_lm_ids"][weights]
  mask = r["input_mask"].astype(bool)
  ids = restored_ids(r)
  maskable = (mask & (ids != CLS) & (ids != SEP)).sum()
  to_mask = (at == MASK).mean()
  kept = (at == labels).mean()
  return weights.sum() / maskable, to_mask, kept, 1 - to_mask - kept, weights.sum()


def test_masking_statistics_equal_unpacked(runs):
  unpacked_summary, _, unpacked = runs["static", False]
  packed_summary, _, packed = runs["static", True]
  # The number of predictions is a function of each instance's length: exactly the same.
  assert packed_summary["masked_fraction"] == unpacked_summary["masked_fraction"]
  assert packed_summary["masked_per_instance"] == unpacked_summary["masked_per_instance"]
  ours, theirs = mask_shares(packed), mask_shares(unpacked)
  assert ours[0] == pytest.approx(theirs[0], abs=1e-9) and 0.148 < ours[0] < 0.158
  n = ours[4]
  for got, want, p in zip(ours[1:4], theirs[1:4], (0.8, 0.1, 0.1)):
    tolerance = 4 * np.sqrt(2 * p * (1 - p) / n)
    assert abs(got - want) < tolerance and abs(got - p) < tolerance, (ours, theirs)
  assert packed_summary["mask_token_fraction"] == pytest.approx(ours[1], abs=1e-5)
  # Outside the chosen positions nothing is [MASK].
  chosen = np.zeros(packed["input_ids"].shape, bool)
  np.put_along_axis(chosen, packed["masked_lm_positions"], packed["masked_lm_weights"] > 0, 1)
  assert not (packed["input_ids"][~chosen] == MASK).any()


def test_whole_word_masks_stay_inside_instances(corpus, tmp_path):
  _, paths = run(corpus, tmp_path, do_whole_word_mask=True, per_word_draw=True, dupe_factor=2,
                 packing=True, max_sequences_per_row=K)
  r = read_records(paths, "static", K)
  instances, _, _, _ = packing.unpack_rows(r)
  ids = restored_ids(instances)
  starts = wordpiece.WordPieceTokenizer(VOCAB).word_starts(ids)
  chosen = np.zeros(ids.shape, bool)
  np.put_along_axis(chosen, instances["masked_lm_positions"],
                    instances["masked_lm_weights"] > 0, 1)
  continuation = ~starts[:, 1:] & ~np.isin(ids[:, :-1], [CLS, SEP]) & (ids[:, 1:] > 0)
  assert continuation.sum() > 1000
  assert (chosen[:, 1:][continuation] == chosen[:, :-1][continuation]).all()
  weights = instances["masked_lm_weights"] > 0
  assert (weights.sum(1) <= masking.num_to_predict(instances["input_mask"].sum(1), 0.15, PRED)).all()


def test_summary_reports_packing_efficiency(runs):
  for (masking_mode, packed), (summary, paths, r) in runs.items():
    tokens, rows = r["input_mask"].sum(), r["input_mask"].shape[0]
    assert summary["packing_efficiency"] == pytest.approx(tokens / (rows * SEQ), abs=1e-6)
    assert summary["packing_efficiency"] == pytest.approx(1 - summary["padding_fraction"],
                                                          abs=1e-6)
    assert summary["rows"] == rows == sum(summary["records_per_file"].values())
    assert summary["sequences_per_row"] == pytest.approx(summary["instances"] / rows, abs=1e-6)
    if packed:
      assert summary["settings"]["packing"] and summary["settings"]["max_sequences_per_row"] == K
      unpacked = runs[masking_mode, False][0]
      assert summary["packing_efficiency"] > max(0.99, unpacked["packing_efficiency"])
      assert summary["sequences_per_row"] > 1.01
    else:
      assert summary["sequences_per_row"] == 1.0
      assert "packing" not in summary["settings"]  # unpacked settings as before
    stats = json.loads(open(paths[0] + ".stats.json").read())
    assert stats["rows"] == summary["records_per_file"][os.path.basename(paths[0])]


# ------------------------------------------------------------------------- input pipeline


def stream(paths, **kwargs):
  tok = wordpiece.WordPieceTokenizer(VOCAB)
  return input_pipeline.PretrainingData(
      None, files=paths, global_batch_size=64, max_seq_length=SEQ, max_predictions_per_seq=PRED,
      sharding=None, masking_config=masking.MaskingConfig.from_tokenizer(tok), process_index=0,
      process_count=1, **kwargs)


def test_pipeline_yields_the_packed_layout_and_masks_each_instance(runs):
  _, paths, _ = runs["dynamic", True]
  paths = paths[:1]  # one file: the pipeline reads its records in order
  records = read_records(paths, "dynamic", K)
  data = stream(paths, shuffle=False, repeat=False)
  assert data.packed and data.max_sequences_per_row == K and data.masking_mode == "dynamic"
  assert not stream(runs["dynamic", False][1]).packed
  assert stream(runs["dynamic", False][1]).max_sequences_per_row is None
  batches = [b for b, _ in data.host_batches()]
  expected = {f.name for f in features.packed_pretraining_features(SEQ, PRED, K)}
  assert set(batches[0]) == expected
  for name in expected:
    assert batches[0][name].dtype == (np.float32 if "weights" in name else np.int32), name
  batch = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  rows = len(batch["input_ids"])
  for name in ("input_mask", "segment_ids", "position_ids", "sequence_ids", "cls_positions",
               "next_sentence_labels", "next_sentence_weights"):
    np.testing.assert_array_equal(batch[name], records[name][:rows], err_msg=name)
  # Masks drawn per instance: each gets num_to_predict of its own length, inside itself.
  instances, _, _, _ = packing.unpack_rows(batch)
  weights = instances["masked_lm_weights"] > 0
  np.testing.assert_array_equal(
      weights.sum(1), masking.num_to_predict(instances["input_mask"].sum(1), 0.15, PRED))
  shares = mask_shares(batch)
  assert 0.148 < shares[0] < 0.158 and abs(shares[1] - 0.8) < 4 * np.sqrt(0.16 / shares[4])
  assert not np.isin(instances["masked_lm_ids"][weights], [CLS, SEP]).any()
  np.testing.assert_array_equal(restored_ids(batch), records["input_ids"][:rows])
  # The unpacked pipeline on the same instances: the same masked fraction.
  unpacked = [b for b, _ in stream(runs["dynamic", False][1], shuffle=False,
                                   repeat=False).host_batches()]
  unpacked = {k: np.concatenate([b[k] for b in unpacked]) for k in unpacked[0]}
  assert abs(mask_shares(unpacked)[0] - shares[0]) < 0.003


def test_pipeline_resumes_packed_dynamic_batches_exactly(runs):
  _, paths, _ = runs["dynamic", True]
  data = stream(paths)
  stream_a = data.host_batches()
  first = [next(stream_a) for _ in range(3)]
  again, _ = next(stream(paths).host_batches(first[1][1]))
  for name, values in first[2][0].items():
    np.testing.assert_array_equal(again[name], values, err_msg=name)


def test_pipeline_packs_dynamic_records_as_it_reads_them(runs):
  """data.packing: unpacked dynamic records packed by the pipeline hold every instance of an
  epoch exactly once, in fewer rows, masked per instance, and resume exactly mid-group."""
  _, paths, records = runs["dynamic", False]
  data = stream(paths, shuffle=False, repeat=False, pack_sequences=K)
  assert data.packed and data.packs_online and data.max_sequences_per_row == K
  batches = list(data.host_batches())
  expected = {f.name for f in features.packed_pretraining_features(SEQ, PRED, K)}
  assert set(batches[0][0]) == expected
  for name in expected:
    assert batches[0][0][name].dtype == (np.float32 if "weights" in name else np.int32), name
  batch = {k: np.concatenate([b[k] for b, _ in batches]) for k in batches[0][0]}
  rows = len(batch["input_ids"])
  instances, _, _, _ = packing.unpack_rows(batch)
  # Padding: the records' share, at least halved.
  assert rows % 64 == 0 and rows < len(records["input_ids"])
  assert 1 - batch["input_mask"].mean() < 0.5 * (1 - records["input_mask"].mean())
  # Every instance once (the rows cut off by the last short batch aside), none twice.
  got = instance_keys(dict(instances, input_ids=restored_ids(instances)),
                      restored_ids(instances), names=("segment_ids",))
  want = instance_keys(records, records["input_ids"], names=("segment_ids",))
  assert len(set(got)) == len(got) and set(got) <= set(want)
  assert len(got) > 0.9 * len(want)
  weights = instances["masked_lm_weights"] > 0
  np.testing.assert_array_equal(
      weights.sum(1), masking.num_to_predict(instances["input_mask"].sum(1), 0.15, PRED))
  assert (batch["masked_lm_weights"].sum(1) <= PRED).all()
  # Positions carry the row inside a group of records: a resumed stream gives the same batches.
  repeating = stream(paths, pack_sequences=K).host_batches()
  first = [next(repeating) for _ in range(12)]
  assert any(pos.get("row") for _, pos in first)
  for i in (3, 8):
    again = stream(paths, pack_sequences=K).host_batches(first[i][1])
    for j in range(i + 1, i + 3):
      got_batch, got_position = next(again)
      assert got_position == first[j][1]
      for name, values in first[j][0].items():
        np.testing.assert_array_equal(got_batch[name], values, err_msg=name)
  with pytest.raises(ValueError, match="static-masking records"):
    stream(runs["static", False][1], pack_sequences=K)
  # Records packed by data_prep are read as written.
  assert not stream(runs["dynamic", True][1], pack_sequences=K).packs_online


def test_pipeline_names_a_packing_mismatch(runs):
  _, packed_paths, _ = runs["static", True]
  _, unpacked_paths, _ = runs["static", False]
  with pytest.raises(ValueError, match="no feature 'position_ids'"):
    stream([packed_paths[0], unpacked_paths[0]], shuffle=False)


@pytest.mark.e2e
def test_command_line_packing(corpus, tmp_path):
  out = tmp_path / "out"
  done = subprocess.run(
      [sys.executable, "-m", "data_prep.create_pretraining_data", f"--input_file={corpus}",
       f"--vocab_file={VOCAB}", f"--output_dir={out}", "--num_output_shards=1",
       "--num_workers=1", "--masking=dynamic", "--packing", "--max_sequences_per_row=2",
       "--max_seq_length=256", "--max_predictions_per_seq=40", "--noprogress"],
      capture_output=True, text=True, env=helpers.command_env(), cwd=ROOT,
      timeout=300, check=False)
  assert done.returncode == 0, done.stderr
  assert "packing_efficiency" in done.stdout and "sequences_per_row" in done.stdout
  summary = json.loads((out / "summary.json").read_text())
  assert summary["settings"]["max_sequences_per_row"] == 2
  r = read_records(sorted(glob.glob(str(out / "pretrain-*.tfrecord"))), "dynamic", 2, length=256)
  assert r["cls_positions"].shape[1] == 2 and r["input_ids"].shape[1] == 256
  assert (r["next_sentence_weights"].sum(1) == 2).any()


@pytest.mark.parametrize("whole_word", [False, True])
def test_mask_rows_is_mask_batch_on_the_instances(runs, whole_word):
  """Dynamic masking of packed rows is the unpacked masking of their instances, laid back."""
  _, _, r = runs["dynamic", True]
  rows = {k: v[:300] for k, v in r.items()}
  tok = wordpiece.WordPieceTokenizer(VOCAB)
  config = masking.MaskingConfig.from_tokenizer(tok, whole_word_mask=whole_word,
                                                per_word_draw=whole_word)
  got = packing.mask_rows(rows, config, np.random.default_rng(5))
  instances, row, slot, offset = packing.unpack_rows(rows)
  masked = masking.mask_batch(instances["input_ids"], instances["input_mask"], config,
                              np.random.default_rng(5), instances["word_starts"])
  want = packing.pack_rows({**instances, **masked}, row, slot, offset, 300, K, PRED)
  assert set(got) == {"input_ids"} | {n for n in want if n.startswith("masked_lm")}
  for name, values in got.items():
    np.testing.assert_array_equal(values, want[name], err_msg=name)
  assert (got["masked_lm_weights"] > 0).sum() > 300


def test_a_row_budget_too_small_is_named(runs):
  _, paths, r = runs["dynamic", True]
  # Before training: the config's budget is below the one the rows were packed for.
  with pytest.raises(ValueError, match="packed for max_predictions_per_seq=20 per row"):
    input_pipeline.PretrainingData(
        None, files=paths, global_batch_size=64, max_seq_length=SEQ, max_predictions_per_seq=10,
        sharding=None, process_index=0, process_count=1,
        masking_config=masking.MaskingConfig.from_tokenizer(wordpiece.WordPieceTokenizer(VOCAB)))
  # Where it is masked: a row whose instances need more predictions than the budget.
  config = masking.MaskingConfig.from_tokenizer(wordpiece.WordPieceTokenizer(VOCAB),
                                                max_predictions_per_seq=12)
  with pytest.raises(ValueError, match="more than max_predictions_per_seq=12 per row"):
    packing.mask_rows({k: v[:200] for k, v in r.items()}, config, np.random.default_rng(0))
