"""create_pretraining_data end to end on real text: records, distributions, shards, bad input."""

import collections
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.data import tfrecords
from bert_jax.text import features, wordpiece
from data_prep import create_pretraining_data as cpd
from data_prep import demo_corpus, instances, train_tokenizer
from tests.helpers import minilm_dir
from tests import helpers

ROOT = helpers.REPO
VOCAB = os.path.join(minilm_dir(), "vocab.txt")
CLS, SEP, MASK = 101, 102, 103

# The reader spec of the original run_pretraining.py, spelled out.
ORIGINAL_SPEC = {
    "input_ids": ("int64", 128), "input_mask": ("int64", 128), "segment_ids": ("int64", 128),
    "masked_lm_positions": ("int64", 20), "masked_lm_ids": ("int64", 20),
    "masked_lm_weights": ("float32", 20), "next_sentence_labels": ("int64", 1),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """~300 KB of Shakespeare in BERT's input format, split over two files."""
  text = demo_corpus.corpus_text(max_bytes=300_000)
  documents = text.split("\n\n")
  directory = tmp_path_factory.mktemp("corpus")
  half = len(documents) // 2
  for name, part in (("a.txt", documents[:half]), ("b.txt", documents[half:])):
    (directory / name).write_text("\n\n".join(part), encoding="utf-8")
  return str(directory / "*.txt")


def run(corpus, output_dir, num_workers=1, num_output_shards=3, **overrides):
  settings = cpd.make_settings(corpus, VOCAB, **overrides)
  return cpd.create_pretraining_data(settings, output_dir=str(output_dir),
                                     num_output_shards=num_output_shards,
                                     num_workers=num_workers, show_progress=False)


def read_records(paths, masking="static", max_seq_length=128, max_predictions=20):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.set_visible_devices([], "GPU")
  spec = features.tf_feature_spec(max_seq_length, max_predictions, masking)
  dataset = tf.data.TFRecordDataset(sorted(paths)).batch(4096).map(
      lambda x: tf.io.parse_example(x, spec))
  parts = [{k: v.numpy() for k, v in batch.items()} for batch in dataset]
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def shard_files(directory):
  return sorted(glob.glob(os.path.join(str(directory), "pretrain-*.tfrecord")))


@pytest.fixture(scope="module")
def static_run(corpus, tmp_path_factory):
  out = tmp_path_factory.mktemp("static")
  summary = run(corpus, out, num_workers=2)
  return out, summary, read_records(shard_files(out))


def test_output_is_identical_for_any_number_of_workers(corpus, static_run, tmp_path):
  out, summary, _ = static_run
  assert summary["num_workers"] == 2 and summary["shards"] == 3
  run(corpus, tmp_path, num_workers=1)
  for ours, theirs in zip(shard_files(out), shard_files(tmp_path), strict=True):
    with open(ours, "rb") as a, open(theirs, "rb") as b:
      assert a.read() == b.read(), ours


def test_records_parse_with_the_original_reader_spec(static_run):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  out, summary, _ = static_run
  spec = {k: tf.io.FixedLenFeature([n], getattr(tf, dtype)) for k, (dtype, n) in
          ORIGINAL_SPEC.items()}
  records = list(tf.data.TFRecordDataset(shard_files(out)).batch(100_000))[0]
  parsed = tf.io.parse_example(records, spec)
  assert parsed["input_ids"].shape == (summary["instances"], 128)
  example = tf.train.Example.FromString(records[0].numpy())
  assert sorted(example.features.feature) == sorted(ORIGINAL_SPEC)


def unmasked_ids(r):
  """input_ids with the original tokens put back where they were masked."""
  ids = r["input_ids"].copy()
  np.put_along_axis(ids, r["masked_lm_positions"],
                    np.where(r["masked_lm_weights"] > 0, r["masked_lm_ids"],
                             np.take_along_axis(ids, r["masked_lm_positions"], 1)), 1)
  return ids


def test_records_are_tensorflows_bytes(tmp_path):
  """The array encoder and the in-place TFRecord framing against TensorFlow itself: values of
  every varint width, rows whose lengths need varints of different widths, float weights."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from data_prep import records  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(3)
  rows, length, predictions = 300, 40, 6
  schema = features.pretraining_features(length, predictions)
  widths = np.array([0, 1, 127, 128, 16383, 16384, 2**21 - 1, 2**21, 2**28, 2**35 - 1])
  ids = rng.choice(widths, (rows, length))
  ids[: rows // 2] = rng.integers(0, 30522, (rows // 2, length))
  ids[::7] = 0  # short records next to long ones
  batch = {"input_ids": ids, "input_mask": rng.random((rows, length)) < 0.5,
           "segment_ids": rng.integers(0, 2, (rows, length)),
           "masked_lm_positions": rng.integers(0, 300, (rows, predictions)),
           "masked_lm_ids": rng.integers(0, 30522, (rows, predictions)).astype(np.int32),
           "masked_lm_weights": rng.random((rows, predictions)).astype(np.float32),
           "next_sentence_labels": rng.integers(0, 2, (rows, 1))}
  path = str(tmp_path / "x.tfrecord")
  with records.TFRecordWriter(path) as writer:
    for part in (slice(0, 100), slice(100, rows)):
      buffer, ends = tfrecords.encode_examples_flat(
          {k: v[part] for k, v in batch.items()}, schema, prefix=tfrecords.frame_header,
          reserve_after=tfrecords.FRAME_AFTER)
      writer.write_framed(buffer, ends)
  serialized = [r.numpy() for r in tf.data.TFRecordDataset(path)]  # checks both checksums
  assert serialized == tfrecords.encode_examples(batch, schema)
  for row in (0, 7, rows - 1):
    example = tf.train.Example(features=tf.train.Features(feature={
        f.name: tf.train.Feature(float_list=tf.train.FloatList(value=batch[f.name][row]))
        if f.dtype == "float32" else
        tf.train.Feature(int64_list=tf.train.Int64List(value=np.asarray(batch[f.name][row],
                                                                         np.int64)))
        for f in schema}))
    assert tf.train.Example.FromString(serialized[row]) == example
    assert len(serialized[row]) == example.ByteSize()  # canonical: no longer than TF's own
  parsed = tf.io.parse_example(serialized, features.tf_feature_spec(length, predictions))
  for f in schema:
    np.testing.assert_array_equal(parsed[f.name].numpy(), np.asarray(batch[f.name], f.dtype))


def test_instance_layout(static_run):
  _, _, r = static_run
  # A masked position may hold any random id, [SEP] and [CLS] too (as in the original): the
  # layout is checked on the instance as built, before masking.
  ids, mask, segments = unmasked_ids(r), r["input_mask"], r["segment_ids"]
  lengths = mask.sum(1)
  assert (mask == (np.arange(128)[None] < lengths[:, None])).all()  # 1s then 0s
  assert (ids[mask == 0] == 0).all() and (segments[mask == 0] == 0).all()
  assert (ids[:, 0] == CLS).all()
  assert ((ids == SEP).sum(1) == 2).all()  # corpus text never forges a [SEP]
  assert ((ids == CLS).sum(1) == 1).all()
  first_sep = np.argmax(ids == SEP, axis=1)
  assert (ids[np.arange(len(ids)), lengths - 1] == SEP).all()
  position = np.arange(128)[None]
  expected_segments = (position > first_sep[:, None]) & (position < lengths[:, None])
  assert (segments == expected_segments).all()
  assert (first_sep >= 2).all() and (lengths - first_sep >= 3).all()  # A and B non-empty
  assert lengths.max() == 128


def test_masking_distributions(static_run):
  _, summary, r = static_run
  ids, weights = r["input_ids"], r["masked_lm_weights"] > 0
  positions, labels = r["masked_lm_positions"], r["masked_lm_ids"]
  lengths = r["input_mask"].sum(1)
  expected = np.minimum(20, np.maximum(1, np.rint(lengths * 0.15)))
  np.testing.assert_array_equal(weights.sum(1), expected)
  fraction = weights.sum() / (lengths - 3).sum()
  assert 0.148 < fraction < 0.158 and abs(summary["masked_fraction"] - fraction) < 1e-5
  at = np.take_along_axis(ids, positions, 1)[weights]  # what the model sees there
  assert (np.take_along_axis(r["input_mask"], positions, 1)[weights] == 1).all()
  assert (labels[~weights] == 0).all() and (positions[~weights] == 0).all()
  assert not np.isin(labels[weights], [CLS, SEP, 0, MASK]).any()
  n = weights.sum()
  shares = {"mask": (at == MASK).mean(), "kept": (at == labels[weights]).mean()}
  shares["random"] = 1 - shares["mask"] - shares["kept"]
  for key, target in (("mask", 0.8), ("kept", 0.1), ("random", 0.1)):
    assert abs(shares[key] - target) < 4 * np.sqrt(target * (1 - target) / n), shares
  assert abs(summary["mask_token_fraction"] - shares["mask"]) < 1e-5
  # Outside the chosen positions nothing is [MASK].
  chosen = np.zeros(ids.shape, bool)
  np.put_along_axis(chosen, positions, weights, 1)
  assert not (ids[~chosen] == MASK).any()


def test_nsp_and_short_sequence_rates(static_run):
  _, summary, r = static_run
  random_next = r["next_sentence_labels"][:, 0].mean()
  # 0.5 plus the chunks of one sentence, for which the original always takes a random B.
  assert 0.5 < random_next < 0.6, random_next
  assert summary["random_next_fraction"] == pytest.approx(random_next, abs=1e-5)
  passes = summary["documents"] * 10
  tolerance = 4 * np.sqrt(0.1 * 0.9 / passes)
  assert abs(summary["short_target_fraction"] - 0.1) < tolerance, summary["short_target_fraction"]
  # Short targets show in the output as instances well under the full length.
  lengths = r["input_mask"].sum(1)
  assert 0.05 < (lengths < 64).mean() < 0.5
  assert summary["padding_fraction"] == pytest.approx(1 - lengths.mean() / 128, abs=1e-5)
  # Unpacked rows report the packed data's measures too, so the two compare.
  assert summary["packing_efficiency"] == pytest.approx(lengths.mean() / 128, abs=1e-5)
  assert summary["sequences_per_row"] == 1.0 and summary["rows"] == summary["instances"]
  assert "packing" not in summary["settings"]  # unpacked settings (and stats files) as before
  assert summary["documents"] > 20 and summary["sentences"] > 2000


def test_ten_duplicates_carry_different_masks(corpus, static_run, tmp_path):
  _, summary, r = static_run
  once = run(corpus, tmp_path, dupe_factor=1)
  assert 9.0 < summary["instances"] / once["instances"] < 11.0
  original = r["input_ids"].copy()
  np.put_along_axis(original, r["masked_lm_positions"],
                    np.where(r["masked_lm_weights"] > 0, r["masked_lm_ids"],
                             np.take_along_axis(original, r["masked_lm_positions"], 1)), 1)
  chosen = np.zeros(original.shape, bool)
  np.put_along_axis(chosen, r["masked_lm_positions"], r["masked_lm_weights"] > 0, 1)
  # Segment A starts at a sentence start: its first ten tokens name a passage of the corpus,
  # which each of the ten passes puts in an instance again, masked afresh.
  groups = collections.defaultdict(list)
  for row, mask_pattern in zip(original[:, 1:11], chosen[:, 1:11]):
    groups[row.tobytes()].append(mask_pattern.tobytes())
  repeated = [g for g in groups.values() if len(g) >= 5]
  assert len(repeated) > 50
  distinct = np.mean([len(set(g)) > 1 for g in repeated])
  assert distinct > 0.9, distinct


def test_dynamic_masking_records(corpus, tmp_path):
  summary = run(corpus, tmp_path, masking="dynamic", num_output_shards=2)
  r = read_records(shard_files(tmp_path), masking="dynamic")
  assert set(r) == {"input_ids", "input_mask", "segment_ids", "next_sentence_labels",
                    "word_starts"}
  assert summary["settings"]["dupe_factor"] == 1 and "masked_fraction" not in summary
  assert not (r["input_ids"] == MASK).any()
  tok = wordpiece.WordPieceTokenizer(VOCAB)
  np.testing.assert_array_equal(r["word_starts"],
                                tok.word_starts(r["input_ids"]) & (r["input_mask"] == 1))
  assert (r["word_starts"] == 0).sum() > (r["input_mask"] == 0).sum()  # some "##" pieces


def test_whole_word_masking_run(corpus, tmp_path):
  run(corpus, tmp_path, do_whole_word_mask=True, per_word_draw=True, dupe_factor=2,
      num_output_shards=1)
  r = read_records(shard_files(tmp_path))
  tok = wordpiece.WordPieceTokenizer(VOCAB)
  labels_restored = r["input_ids"].copy()
  np.put_along_axis(labels_restored, r["masked_lm_positions"],
                    np.where(r["masked_lm_weights"] > 0, r["masked_lm_ids"],
                             np.take_along_axis(labels_restored, r["masked_lm_positions"], 1)), 1)
  starts = tok.word_starts(labels_restored)
  chosen = np.zeros(starts.shape, bool)
  np.put_along_axis(chosen, r["masked_lm_positions"], r["masked_lm_weights"] > 0, 1)
  # A continuation piece is chosen exactly when the piece before it is (same word),
  # unless it follows [CLS] or [SEP] (a segment cut mid-word starts its own unit).
  continuation = ~starts[:, 1:] & ~np.isin(labels_restored[:, :-1], [CLS, SEP])
  assert continuation.sum() > 1000
  assert (chosen[:, 1:][continuation] == chosen[:, :-1][continuation]).all()


def test_rerun_skips_finished_shards_and_cleans_up(corpus, static_run, tmp_path):
  out, _, _ = static_run
  first = run(corpus, tmp_path)
  paths = shard_files(tmp_path)
  os.remove(paths[1])
  stale = paths[1] + ".tmp-99999"
  with open(stale, "wb") as f:
    f.write(b"half a shard")
  again = run(corpus, tmp_path)
  assert again["shards_skipped_as_complete"] == 2 and not os.path.exists(stale)
  assert again["instances"] == first["instances"]
  for ours, theirs in zip(shard_files(tmp_path), shard_files(out), strict=True):
    with open(ours, "rb") as a, open(theirs, "rb") as b:
      assert a.read() == b.read()
  with pytest.raises(ValueError, match="other settings.*masked_lm_prob"):
    run(corpus, tmp_path, masked_lm_prob=0.2)
  summary = json.load(open(os.path.join(tmp_path, "summary.json"), encoding="utf-8"))
  assert summary["instances"] == first["instances"]
  assert not glob.glob(os.path.join(tmp_path, "*.tmp-*"))


def test_output_file_list_and_sentencepiece(corpus, tmp_path):
  text_files = sorted(glob.glob(corpus))
  model = train_tokenizer.train_sentencepiece(text_files, str(tmp_path / "spm"), "unigram",
                                              vocab_size=2000)
  outputs = [str(tmp_path / "one.tfrecord"), str(tmp_path / "two.tfrecord")]
  settings = cpd.make_settings(corpus, spm_model_file=model, dupe_factor=1,
                               do_whole_word_mask=True)
  summary = cpd.create_pretraining_data(settings, output_file=",".join(outputs),
                                        show_progress=False)
  assert os.path.exists(outputs[0] + ".summary.json")
  r = read_records(outputs)
  assert len(r["input_ids"]) == summary["instances"] > 500
  restored = r["input_ids"].copy()  # a random replacement may be any id, [SEP] too
  np.put_along_axis(restored, r["masked_lm_positions"],
                    np.where(r["masked_lm_weights"] > 0, r["masked_lm_ids"],
                             np.take_along_axis(restored, r["masked_lm_positions"], 1)), 1)
  assert ((restored == 3).sum(1) == 2).all() and (restored[:, 0] == 2).all()
  assert 0.13 < summary["masked_fraction"] < 0.17


def test_bad_input_names_file_and_line(corpus, tmp_path):
  bad = tmp_path / "bad.txt"
  bad.write_bytes("Good line one.\nGood line two.\n\nAnother document.\n".encode() +
                  b"caf\xe9 au lait \xff.\nLast line.\n")
  with pytest.raises(ValueError, match=r"bad.txt: line 5: bytes are not valid UTF-8"):
    run(str(bad), tmp_path / "out")
  summary = run(str(bad), tmp_path / "out2", decode_errors="ignore", num_output_shards=1)
  assert summary["input_lines_not_utf8"] == 1 and summary["documents"] == 2
  one_doc = tmp_path / "one_document.txt"
  one_doc.write_text("To be, or not to be.\nThat is the question.\nWhether 'tis nobler.\n",
                     encoding="utf-8")
  summary = run(str(one_doc), tmp_path / "out6", num_output_shards=1)
  assert summary["instances"] > 0
  assert any("fewer than 2 documents" in w for w in summary["warnings"])
  lines = tmp_path / "paragraphs.txt"
  lines.write_text("\n\n".join(f"Paragraph {i} is one line only." for i in range(20)),
                   encoding="utf-8")
  summary = run(str(lines), tmp_path / "out7", num_output_shards=1)
  assert any("have one sentence" in w for w in summary["warnings"])

  empty = tmp_path / "empty.txt"
  empty.write_text("\n\n   \n", encoding="utf-8")
  with pytest.raises(ValueError, match="hold no text"):
    run(str(empty), tmp_path / "out3")
  with pytest.raises(FileNotFoundError, match="matches no file"):
    run(str(tmp_path / "nothing-*.txt"), tmp_path / "out4")

  no_specials = tmp_path / "vocab.txt"
  no_specials.write_text("[PAD]\n[UNK]\nthe\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"vocab.txt: the vocabulary lacks.*\[CLS\]"):
    cpd.create_pretraining_data(cpd.make_settings(corpus, str(no_specials)),
                                output_dir=str(tmp_path / "out5"), show_progress=False)

  blocker = tmp_path / "a_file"
  blocker.write_text("x")
  with pytest.raises(PermissionError, match="Cannot write to output directory"):
    run(corpus, blocker / "sub")


def test_a_vocabulary_that_does_not_fit_the_corpus_stops_the_run(corpus, static_run, tmp_path):
  """A vocab.txt cut short (here at 1,000 entries, before BERT's single characters) tokenizes
  most words to [UNK]; the shard stops with the rate and the vocabulary named, and the flag
  that lets it go on."""
  short = tmp_path / "vocab.txt"
  short.write_text("\n".join(open(VOCAB, encoding="utf-8").read().split("\n")[:1000]) + "\n",
                   encoding="utf-8")
  settings = cpd.make_settings(corpus, str(short), dupe_factor=1, max_seq_length=32,
                               max_predictions_per_seq=5)
  with pytest.raises(ValueError, match=(
      r"\(the documents of shard 0\): 9\d\.\d% of [\d,]+ word pieces are \[UNK\] with "
      r"vocab\.txt \(1,000 entries\): the vocabulary does not fit this text .*; pass "
      r"--max_unknown_rate=1 to go on anyway\.$")):
    cpd.create_pretraining_data(settings, output_dir=str(tmp_path / "out"),
                                num_output_shards=1, show_progress=False)
  assert not glob.glob(str(tmp_path / "out" / "*.tfrecord*"))
  forced = cpd.create_pretraining_data(settings, output_dir=str(tmp_path / "out"),
                                       num_output_shards=1, show_progress=False,
                                       max_unknown_rate=1.0)
  assert forced["unknown_piece_fraction"] > 0.9
  assert static_run[1]["unknown_piece_fraction"] == 0.0


@pytest.mark.e2e
def test_command_line(corpus, tmp_path):
  """The script as users run it: flags, a progress bar, a summary, and errors without a trace."""
  env = helpers.command_env()
  ok = subprocess.run(
      [sys.executable, os.path.join(ROOT, "data_prep", "create_pretraining_data.py"),
       f"--input_file={corpus}", f"--vocab_file={VOCAB}", f"--output_dir={tmp_path / 'out'}",
       "--num_output_shards=2", "--num_workers=2", "--dupe_factor=1", "--max_seq_length=64",
       "--max_predictions_per_seq=10"],
      capture_output=True, text=True, env=env, timeout=300, check=False)
  assert ok.returncode == 0, ok.stderr
  assert "instances/s" in ok.stdout and "masked_fraction" in ok.stdout
  assert "it/s" in ok.stderr or "B/s" in ok.stderr  # tqdm's rate
  r = read_records(shard_files(tmp_path / "out"), max_seq_length=64, max_predictions=10)
  assert r["input_ids"].shape[1] == 64 and r["input_mask"].sum(1).max() == 64
  bad = subprocess.run(
      [sys.executable, "-m", "data_prep.create_pretraining_data", f"--input_file={corpus}",
       f"--vocab_file={tmp_path / 'missing.txt'}", f"--output_dir={tmp_path / 'x'}"],
      capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
  assert bad.returncode == 1
  assert "missing.txt: no such file" in bad.stderr and "Traceback" not in bad.stderr


def test_truncation_matches_the_originals_one_token_at_a_time_loop():
  """Closed-form truncation cuts each segment as often as the original's loop would, and
  takes each removed token from the front or the back with equal odds."""
  rng = np.random.default_rng(0)
  fronts = cuts = 0
  for limit in (2, 3, 17, 125, 200):
    la, lb = rng.integers(1, 301, 2000), rng.integers(1, 301, 2000)
    a_front, a_back, b_front, b_back = instances.truncation_cuts(la, lb, limit, rng)
    for i in range(len(la)):
      ref_a, ref_b = int(la[i]), int(lb[i])  # the original: the longer one (B on ties) loses
      while ref_a + ref_b > limit:
        if ref_a > ref_b:
          ref_a -= 1
        else:
          ref_b -= 1
      assert (la[i] - a_front[i] - a_back[i], lb[i] - b_front[i] - b_back[i]) == (ref_a, ref_b)
    assert min(a_front.min(), a_back.min(), b_front.min(), b_back.min()) >= 0
    fronts += a_front.sum() + b_front.sum()
    cuts += a_front.sum() + a_back.sum() + b_front.sum() + b_back.sum()
  assert abs(fronts / cuts - 0.5) < 4 * np.sqrt(0.25 / cuts)


def reference_pairs(documents, max_seq_length, short_seq_prob, rng):
  """One pass of the original pair building, one document and one chunk at a time, on sentence
  lengths only (the rule as DESIGN.md states it): yields (len_a, len_b, is_random_next)."""
  limit = max_seq_length - 3
  for d, doc in enumerate(documents):
    target = rng.randint(2, limit) if rng.random() < short_seq_prob else limit
    i = 0
    while i < len(doc):
      chunk = [doc[i]]
      while sum(chunk) < target and i + len(chunk) < len(doc):
        chunk.append(doc[i + len(chunk)])
      a_count = rng.randint(1, len(chunk) - 1) if len(chunk) > 1 else 1
      la = sum(chunk[:a_count])
      if len(chunk) == 1 or rng.random() < 0.5:
        for _ in range(10):
          other = rng.randrange(len(documents))
          if other != d:
            break
        lb = 0
        for length in documents[other][rng.randrange(len(documents[other])):]:
          lb += length
          if lb >= target - la:
            break
        i, random_next = i + a_count, True
      else:
        lb, i, random_next = sum(chunk[a_count:]), i + len(chunk), False
      while la + lb > limit:
        if la > lb:
          la -= 1
        else:
          lb -= 1
      yield la, lb, random_next


def test_pairs_are_distributed_as_the_originals():
  """The vectorised pair builder against the rule done the plain way, on real sentences.

  Documents of eight sentences give many (pass, document) walks, so that the walk-level draws
  (short targets above all) average out: both sides then agree to within a few standard
  deviations of their seed-to-seed spread.
  """
  import random  # pylint: disable=g-import-not-at-top
  tok = wordpiece.WordPieceTokenizer(VOCAB, split_special_tokens=True)
  text = demo_corpus.corpus_text(max_bytes=300_000)
  sentences = [ids for d in text.split("\n\n") for ids in tok.encode_batch(d.split("\n"))
               if ids]
  documents = [sentences[i:i + 8] for i in range(0, len(sentences), 8)]
  passes = 30
  ours, short = instances.build_instances(instances.make_documents(documents), 128, 0.1, passes,
                                          np.random.default_rng(0))
  rng = random.Random(0)
  lengths = [[len(s) for s in d] for d in documents]
  theirs = np.array([p for _ in range(passes) for p in reference_pairs(lengths, 128, 0.1, rng)])
  ours_total, theirs_total = ours.a_length + ours.b_length, theirs[:, 0] + theirs[:, 1]
  walks = passes * len(documents)
  assert abs(short / walks - 0.1) < 4 * np.sqrt(0.09 / walks)
  assert abs(ours.size / len(theirs) - 1) < 0.02, (ours.size, len(theirs))
  assert abs(ours.is_random_next.mean() - theirs[:, 2].mean()) < 0.012
  assert abs((ours_total < 64).mean() - (theirs_total < 64).mean()) < 0.02
  assert abs(ours_total.mean() / theirs_total.mean() - 1) < 0.015
  assert abs(ours.a_length.mean() / theirs[:, 0].mean() - 1) < 0.025
  assert abs(ours.b_length.mean() / theirs[:, 1].mean() - 1) < 0.025
  # The whole distribution of instance lengths (Kolmogorov-Smirnov distance).
  grid = np.arange(2, 126)
  cdf_ours = np.searchsorted(np.sort(ours_total), grid, side="right") / ours.size
  cdf_theirs = np.searchsorted(np.sort(theirs_total), grid, side="right") / len(theirs)
  assert np.abs(cdf_ours - cdf_theirs).max() < 0.03
  assert (ours.a_length > 0).all() and (ours.b_length > 0).all() and ours_total.max() == 125
  # B of a pair taken in order continues A's document.
  assert (ours.a_start + ours.a_length <= ours.b_start)[~ours.is_random_next].all()


def test_demo_corpus_sentences():
  assert demo_corpus.split_sentences(
      "Good morrow, Mr. Page. I go to St. Albans! Who is there? stand, ho! Then J. R. left.") == [
          "Good morrow, Mr. Page.", "I go to St. Albans!", "Who is there? stand, ho!",
          "Then J. R. left."]
