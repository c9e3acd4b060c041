"""SQuAD: reading the official files, windows and answer maps, post-processing, the CLI."""

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.interop import hf as hf_io
from bert_jax.text import tokenization
from bert_jax.tasks.squad import data as squad
from bert_jax.tasks.squad import objective as question_answering
from bert_jax.training import metrics
from data_prep import demo_corpus, demo_squad, train_tokenizer
from tests import helpers
from tests.task_helpers import CONTEXT_1, CONTEXT_2, OFFICIAL, overfit_set as _overfit_set

REPO = helpers.REPO
VOCAB = os.path.join(helpers.minilm_dir(), "vocab.txt")


def _write(path, data):
  path.write_text(json.dumps(data, ensure_ascii=False))
  return str(path)


def test_hand_checked_offsets_are_right():
  for article in OFFICIAL["data"]:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        a = qa["answers"][0]
        assert paragraph["context"][a["answer_start"]:].startswith(a["text"]), qa["id"]


def test_reads_official_json_v1_and_v2(tmp_path):
  examples = squad.read_squad_json(_write(tmp_path / "train.json", OFFICIAL))
  assert [e.qas_id for e in examples] == [f"q{i}" for i in range(1, 8)]
  assert examples[0].title == "Super_Bowl_50" and examples[0].context == CONTEXT_1
  assert examples[3].answers == [squad.Answer("September 4, 1981", 37)]
  v2 = json.loads(json.dumps(OFFICIAL))
  v2["data"][0]["paragraphs"][0]["qas"].append(
      {"id": "q8", "question": "Who won Super Bowl 51?", "answers": [], "is_impossible": True,
       "plausible_answers": [{"text": "Denver Broncos", "answer_start": 177}]})
  examples = squad.read_squad_json(_write(tmp_path / "v2.json", v2))
  assert examples[3].qas_id == "q8" and examples[3].is_impossible and not examples[3].answers
  assert squad.gold_answers(examples)["q8"] == []


@pytest.mark.parametrize("text,message", [
    ('{"data": [', "line 1, column 11"),
    ('{"data": [{"title": "t"}]}', "data[0]: no 'paragraphs'"),
    ('{"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "x", "question": "q"}]}]}]}',
     "data[0].paragraphs[0].qas[0] (id 'x'): no 'answers'"),
    ('{"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "x", "question": "q", '
     '"answers": [{"text": "c", "answer_start": "0"}]}]}]}]}',
     "qas[0] (id 'x').answers[0]: 'answer_start' must be an integer"),
    ('{"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "x", "question": "q", '
     '"answers": []}, {"id": "x", "question": "q", "answers": []}]}]}]}', "already used"),
])
def test_malformed_files_name_the_place(tmp_path, text, message):
  path = tmp_path / "bad.json"
  path.write_text(text)
  with pytest.raises(ValueError, match=re.escape(message)) as info:
    squad.read_squad_json(str(path))
  assert str(path) in str(info.value)


def test_pieces_map_back_to_the_users_characters(tokenizer):
  tokens = squad.tokenize_context(tokenizer, CONTEXT_2)
  texts = [CONTEXT_2[s:e] for s, e in zip(tokens.char_start, tokens.char_end)]
  pieces = tokenizer.convert_ids_to_tokens(tokens.ids)
  # Accents stripped by the uncased tokenizer come back from the context; CJK is one piece per
  # character; the no-break space inside "singer.\xa0She" separates pieces.
  assert texts[pieces.index("beyonce")] == "Beyoncé"
  assert texts[pieces.index("zurich")] == "Zürich"
  assert "東" in texts and "京" in texts
  assert texts[pieces.index("she")] == "She"
  assert tokens.aligned_words == tokens.num_words
  # The alignment on its own: continuation pieces, [UNK] in the middle, an unmatched piece.
  assert squad.align_pieces("Zürich", ["zu", "##rich"]) == [(0, 2), (2, 6)]
  assert squad.align_pieces("ab☃cd", ["ab", "[UNK]", "##cd"]) == [(0, 2), (2, 3), (3, 5)]
  assert squad.align_pieces("word", ["wo", "##xd"]) is None
  assert squad.align_pieces("Ｆｉｎｅ!", ["\u2581fine", "!"]) == [(0, 4), (4, 5)]  # NFKC


def _original_max_context(spans, cur, position):
  """`_check_is_max_context` of the original run_squad.py, transcribed as it is."""
  best_score, best_index = None, None
  for index, (start, length) in enumerate(spans):
    end = start + length - 1
    if position < start or position > end:
      continue
    score = min(position - start, end - position) + 0.01 * length
    if best_score is None or score > best_score:
      best_score, best_index = score, index
  return cur == best_index


def test_windows_and_max_context_equal_the_original_loops():
  rng = np.random.default_rng(0)
  for _ in range(200):
    n, window, stride = int(rng.integers(0, 300)), int(rng.integers(1, 80)), int(
        rng.integers(1, 80))
    starts = squad.window_starts(n, window, stride)
    spans, offset = [], 0  # the original loop
    while offset < n or not spans:
      length = min(n - offset, window)
      spans.append((offset, length))
      if offset + length >= n:
        break
      offset += min(length, stride)
    assert starts == [s for s, _ in spans]
    if n:
      mask = squad.max_context_mask(starts, n, window)
      expect = np.array([[_original_max_context(spans, w, p) for p in range(n)]
                         for w in range(len(spans))])
      np.testing.assert_array_equal(mask, expect)
      assert (mask.sum(axis=0) == 1).all()  # every piece is scored in exactly one window


def test_training_targets_point_at_the_answer_or_at_cls(tokenizer, tmp_path):
  examples = squad.read_squad_json(_write(tmp_path / "t.json", OFFICIAL))
  feats = squad.convert_examples_to_features(examples, tokenizer, max_seq_length=40,
                                             doc_stride=8, max_query_length=12,
                                             is_training=True)
  arrays = feats.arrays
  assert feats.report["answers_not_found"] == 0 and feats.report["answers_repaired"] == 0
  for f, e in enumerate(feats.example_index):
    example, tokens = examples[e], feats.tokens[e]
    ids = arrays["input_ids"][f]
    n = arrays["input_mask"][f].sum()
    query = tokenizer.encode(example.question)[:12]
    assert ids[0] == tokenizer.cls_id and ids[len(query) + 1] == tokenizer.sep_id
    assert ids[n - 1] == tokenizer.sep_id and (ids[n:] == 0).all()
    assert (arrays["segment_ids"][f][:len(query) + 2] == 0).all()
    assert (arrays["segment_ids"][f][len(query) + 2:n] == 1).all()
    context = feats.context_piece[f][len(query) + 2:n - 1]
    np.testing.assert_array_equal(ids[len(query) + 2:n - 1], tokens.ids[context])
    s, t = arrays["start_positions"][f], arrays["end_positions"][f]
    if s == 0:
      assert t == 0
      continue
    recovered = squad.answer_text(example.context, tokens, feats.context_piece[f][s],
                                  feats.context_piece[f][t])
    assert recovered == example.answers[0].text
  # Every question has at least one window that holds its whole answer.
  with_answer = {int(e) for f, e in enumerate(feats.example_index)
                 if arrays["start_positions"][f] > 0}
  assert with_answer == set(range(len(examples)))
  assert feats.report["features"] > len(examples)  # the contexts needed several windows


def test_answers_off_their_offset_are_counted_and_reported(tokenizer, tmp_path):
  data = json.loads(json.dumps(OFFICIAL))
  qas = data["data"][0]["paragraphs"][0]["qas"]
  qas[0]["answers"][0]["answer_start"] += 3       # a few characters off: repaired
  qas[1]["answers"][0]["text"] = "31–17"          # not in the context at all
  examples = squad.read_squad_json(_write(tmp_path / "t.json", data))
  feats = squad.convert_examples_to_features(examples, tokenizer, max_seq_length=64,
                                             doc_stride=16, is_training=True)
  assert feats.report["answers_repaired"] == 1 and feats.report["answers_repaired_ids"] == ["q1"]
  assert feats.report["answers_not_found"] == 1 and feats.report["answers_not_found_ids"] == ["q2"]
  assert 1 not in set(feats.example_index.tolist())  # q2 has no training windows


def test_every_gold_answer_is_checked_not_only_the_first(tokenizer, tmp_path, caplog):
  """An evaluation file's answers, and a training question's extra ones, are gold texts too: a
  damaged one is counted, named and warned about instead of reaching the scores unseen."""
  data = json.loads(json.dumps(OFFICIAL))
  qas = data["data"][0]["paragraphs"][0]["qas"]
  good = dict(qas[0]["answers"][0])
  qas[0]["answers"] = [good, {"text": "n\u00e9ver there", "answer_start": 0}, dict(good)]
  examples = squad.read_squad_json(_write(tmp_path / "t.json", data))
  for is_training in (False, True):
    feats = squad.convert_examples_to_features(examples, tokenizer, max_seq_length=64,
                                               doc_stride=16, is_training=is_training)
    assert feats.report["gold_answers_not_found"] == 1, is_training
    assert feats.report["gold_answers_not_found_ids"] == ["q1"]
    assert feats.report["answers_not_found"] == 0  # the first, which training reads, is sound
  assert "1 gold answers (besides the one training reads) are not in their context" in caplog.text
  clean = squad.read_squad_json(_write(tmp_path / "clean.json", OFFICIAL))
  assert squad.convert_examples_to_features(clean, tokenizer, max_seq_length=64, doc_stride=16
                                            ).report["gold_answers_not_found"] == 0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wordpiece_uncased", "sentencepiece", "byte_level_bpe"])
def test_every_answer_of_a_realistic_set_maps_into_windows_and_back(kind, tmp_path, tokenizer):
  if kind == "byte_level_bpe":  # RoBERTa's: a word after a space is "Ġword"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(demo_corpus.corpus_text(max_bytes=1_000_000))
    vocab_file, _ = train_tokenizer.train_byte_level_bpe([str(corpus)], str(tmp_path / "rb"),
                                                         4000)
    tok = tokenization.load_tokenizer(vocab_file=vocab_file)
  elif kind == "sentencepiece":
    import sentencepiece as spm
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(demo_corpus.corpus_text(max_bytes=1_000_000))
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=4000,
        user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], pad_id=0, unk_id=1, bos_id=-1,
        eos_id=-1, pad_piece="[PAD]", unk_piece="[UNK]", minloglevel=2)
    tok = tokenization.load_tokenizer(spm_model_file=str(tmp_path / "sp.model"),
                                      do_lower_case=False)
  else:
    tok = tokenizer
  data = demo_squad.shakespeare_squad(400)
  examples = squad.parse_squad_json(data, "shakespeare")
  assert len(examples) > 2000
  feats = squad.convert_examples_to_features(examples, tok, max_seq_length=96, doc_stride=24,
                                             max_query_length=24, is_training=True,
                                             progress=False)
  assert feats.report["answers_not_found"] == 0
  if kind != "sentencepiece":  # every word's pieces aligned exactly with its characters
    assert feats.report["context_words_aligned"] == feats.report["context_words"]
  assert feats.report["features"] > 2 * len(examples)  # long contexts, many windows
  starts, ends = feats.arrays["start_positions"], feats.arrays["end_positions"]
  found, exact = set(), 0
  for f in np.flatnonzero(starts > 0):
    e = int(feats.example_index[f])
    example = examples[e]
    text = squad.answer_text(example.context, feats.tokens[e],
                             feats.context_piece[f][starts[f]], feats.context_piece[f][ends[f]])
    # Always the answer; word pieces that start or end inside the answer's first or last word
    # (possible with SentencePiece, whose pieces may carry punctuation) widen it to whole pieces.
    assert example.answers[0].text in text, (example.qas_id, text)
    exact += text == example.answers[0].text
    found.add(e)
  assert found == set(range(len(examples)))  # every answer lies whole in some window
  windows_with_answer = int((starts > 0).sum())
  if kind != "sentencepiece":
    # BERT pieces split at punctuation, and byte-level BPE's pre-tokenizer splits letters from
    # punctuation: always exact.
    assert exact == windows_with_answer
  else:
    assert exact >= 0.9 * windows_with_answer


# ------------------------------------------------------------------------------ predictions
def _original_write_predictions(examples, feats, start_logits, end_logits, n_best_size,
                                max_answer_length, version_2):
  """The selection logic of the original `write_predictions`, transcribed loop for loop (text
  recovery aside, which is `answer_text` in both), to compare `postprocess` against."""
  out_pred, out_nbest, out_odds = {}, {}, {}
  for e, example in enumerate(examples):
    prelim, score_null, null_start, null_end = [], 1e6, 0.0, 0.0
    for f in np.flatnonzero(feats.example_index == e):
      sl, el = start_logits[f].tolist(), end_logits[f].tolist()
      best = lambda logits: [i for i, _ in sorted(enumerate(logits), key=lambda x: x[1],
                                                  reverse=True)][:n_best_size]
      if version_2:
        if sl[0] + el[0] < score_null:
          score_null, null_start, null_end = sl[0] + el[0], sl[0], el[0]
      for s in best(sl):
        for t in best(el):
          if feats.context_piece[f][s] < 0 or feats.context_piece[f][t] < 0:
            continue
          if not feats.max_context[f][s] or t < s or t - s + 1 > max_answer_length:
            continue
          prelim.append((f, s, t, sl[s], el[t]))
    if version_2:
      prelim.append((-1, 0, 0, null_start, null_end))
    prelim = sorted(prelim, key=lambda x: x[3] + x[4], reverse=True)
    nbest, seen = [], {}
    for f, s, t, a, b in prelim:
      if len(nbest) >= n_best_size:
        break
      if s > 0:
        text = squad.answer_text(example.context, feats.tokens[e], feats.context_piece[f][s],
                                 feats.context_piece[f][t])
        if text in seen:
          continue
      else:
        text = ""
      seen[text] = True
      nbest.append((text, a, b))
    if version_2 and "" not in seen:
      nbest.append(("", null_start, null_end))
    if not nbest:
      nbest.append(("empty", 0.0, 0.0))
    out_nbest[example.qas_id] = [x[0] for x in nbest]
    if not version_2:
      out_pred[example.qas_id] = nbest[0][0]
    else:
      best_non_null = next(x for x in nbest if x[0])
      out_odds[example.qas_id] = score_null - best_non_null[1] - best_non_null[2]
      out_pred[example.qas_id] = best_non_null[0] if out_odds[example.qas_id] <= 0.0 else ""
  return out_pred, out_nbest, out_odds


@pytest.mark.parametrize("version_2", [False, True])
def test_postprocess_equals_the_original_selection_on_random_logits(tokenizer, version_2):
  examples = squad.parse_squad_json(demo_squad.shakespeare_squad(30, seed=1), "shakespeare")
  feats = squad.convert_examples_to_features(examples, tokenizer, max_seq_length=64,
                                             doc_stride=16, max_query_length=16)
  rng = np.random.default_rng(2)
  shape = feats.arrays["input_ids"].shape
  # Few distinct values: many ties, which both must break the same way.
  start = rng.integers(-8, 8, size=shape).astype(np.float32) / 2
  end = rng.integers(-8, 8, size=shape).astype(np.float32) / 2
  preds, nbest, odds = squad.postprocess(examples, feats, start, end, n_best_size=7,
                                         max_answer_length=5, version_2_with_negative=version_2)
  want_preds, want_nbest, want_odds = _original_write_predictions(
      examples, feats, start, end, 7, 5, version_2)
  assert preds == want_preds
  assert {k: [x["text"] for x in v] for k, v in nbest.items()} == want_nbest
  assert odds == pytest.approx(want_odds)
  for entries in nbest.values():
    assert sum(x["probability"] for x in entries) == pytest.approx(1.0)
    scores = [x["start_logit"] + x["end_logit"] for x in entries
              if x["text"] or not version_2]
    assert scores == sorted(scores, reverse=True)


def test_postprocess_finds_planted_answers_and_respects_the_limits(tokenizer, tmp_path):
  examples = squad.read_squad_json(_write(tmp_path / "t.json", OFFICIAL))
  train = squad.convert_examples_to_features(examples, tokenizer, max_seq_length=48,
                                             doc_stride=16, is_training=True)
  feats = squad.convert_examples_to_features(examples, tokenizer, max_seq_length=48,
                                             doc_stride=16)
  np.testing.assert_array_equal(train.arrays["input_ids"], feats.arrays["input_ids"])
  start = np.full(feats.arrays["input_ids"].shape, -5.0, np.float32)
  end = start.copy()
  rows = np.arange(len(start))
  start[rows, train.arrays["start_positions"]] = 5.0  # the gold span, or [CLS] where it is not
  end[rows, train.arrays["end_positions"]] = 5.0
  preds, nbest, _ = squad.postprocess(examples, feats, start, end)
  assert preds == {e.qas_id: e.answers[0].text for e in examples}
  assert all(len(v) <= 20 and len({x["text"] for x in v}) == len(v) for v in nbest.values())
  # "National Football League" is three pieces: a one-piece limit must pick something else.
  limited, _, _ = squad.postprocess(examples, feats, start, end, max_answer_length=1)
  assert limited["q3"] != "National Football League" and len(limited["q3"].split()) == 1
  # SQuAD 2.0: raise [CLS] in every window of q1; the null answer wins beyond the threshold.
  q1 = feats.example_index == 0
  start[q1, 0] = end[q1, 0] = 6.0
  preds, nbest, odds = squad.postprocess(examples, feats, start, end,
                                         version_2_with_negative=True)
  assert odds["q1"] == pytest.approx(12.0 - 10.0) and preds["q1"] == ""
  assert nbest["q1"][0]["text"] == "" and nbest["q1"][1]["text"] == "Denver Broncos"
  assert odds["q2"] < 0 and preds["q2"] == "24–10"
  kept, _, _ = squad.postprocess(examples, feats, start, end, version_2_with_negative=True,
                                 null_score_diff_threshold=2.5)
  assert kept["q1"] == "Denver Broncos"
  paths = squad.write_prediction_files(str(tmp_path), preds, nbest, odds)
  assert json.load(open(paths["predictions"])) == preds
  assert set(json.load(open(paths["null_odds"]))) == set(preds)
  assert json.load(open(paths["nbest"]))["q1"][0].keys() == {"text", "probability",
                                                            "start_logit", "end_logit"}


# ------------------------------------------------------------------------------------ CLI
@pytest.mark.slow
@pytest.mark.e2e
def test_cli_overfits_a_handful_of_questions_v2(squad_v2_model):
  """A tiny BERT learns eight SQuAD 2.0 questions (one unanswerable) through the command line,
  then predicts them back with the official files and scores (the run: conftest.py's
  `squad_v2_model`; the same fine-tuning on a model-parallel mesh is checked below)."""
  out = pathlib.Path(squad_v2_model["out"])
  predictions = json.load(open(out / "predictions.json"))
  gold = {qa["id"]: (qa["answers"][0]["text"] if qa["answers"] else "")
          for a in _overfit_set()["data"] for p in a["paragraphs"] for qa in p["qas"]}
  assert predictions == gold
  results = json.load(open(out / "eval_results.json"))["eval"]
  assert results["exact"] == 100.0 and results["f1"] == 100.0
  assert results["HasAns_total"] == 7 and results["NoAns_total"] == 1
  assert results["best_f1"] == 100.0
  odds = json.load(open(out / "null_odds.json"))
  assert odds["q8"] > 0 > max(v for k, v in odds.items() if k != "q8")
  nbest = json.load(open(out / "nbest_predictions.json"))
  assert set(nbest) == set(gold)
  # 20 candidates, plus the null answer where it did not make the 20 (as the original does).
  assert all(len(v) <= 21 and {x["text"] for x in v} >= {""} for v in nbest.values())


@pytest.mark.mesh
@pytest.mark.slow
def test_fine_tuning_on_a_model_parallel_mesh_takes_the_steps_of_data_parallel(
    tmp_path, tokenizer, bert_config_file):
  """SQuAD 2.0 fine-tuning over a (4 data × 2 model) mesh: the same losses, step by step, as
  data parallel over the same 8 devices (sharding changes where the numbers live, not what
  they are)."""
  from bert_jax.runs import finetune_config
  from bert_jax.tasks.squad import run as squad_run
  data_file = _write(tmp_path / "train-v2.0.json", _overfit_set())
  losses = {}
  for name, mesh in (("model", (4, 1, 2)), ("data", (8, 1, 1))):
    out = str(tmp_path / name)
    results = squad_run.run(finetune_config.make(
        task_name="squad", version_2_with_negative=True, init_checkpoint=None,
        bert_config_file=bert_config_file, output_dir=out, train_file=data_file,
        max_seq_length=64, doc_stride=32, max_query_length=16, train_batch_size=8,
        learning_rate=1e-3, num_train_epochs=4, do_train=True, log_every_steps=1,
        mesh_shape=mesh), tokenizer)
    losses[name] = {r["step"]: r["train/loss"] for r in metrics.read_jsonl(
        os.path.join(out, "metrics.jsonl")) if "train/loss" in r}
    assert max(losses[name]) == results["train_steps"] >= 6  # the windows of 4 epochs
  assert sorted(losses["model"]) == sorted(losses["data"]) and len(losses["data"]) >= 5
  for step, loss in losses["data"].items():
    assert losses["model"][step] == pytest.approx(loss, abs=1e-5), step


@pytest.mark.slow
def test_a_train_set_smaller_than_one_batch_trains(tmp_path, tokenizer, bert_config_file):
  """Five questions with --train_batch_size=8: every epoch is one padded batch (weight-0 rows
  never count), and the model learns the five answers."""
  from bert_jax.tasks.squad import run as squad_run
  data = json.loads(json.dumps(OFFICIAL))
  data["data"][1]["paragraphs"][0]["qas"] = data["data"][1]["paragraphs"][0]["qas"][:2]
  data_file = _write(tmp_path / "train-v1.1.json", data)
  from bert_jax.runs import finetune_config
  results = squad_run.run(finetune_config.make(
      task_name="squad", init_checkpoint=None, bert_config_file=bert_config_file,
      output_dir=str(tmp_path / "out"), train_file=data_file, predict_file=data_file,
      max_seq_length=128, doc_stride=64, max_query_length=32, train_batch_size=8,
      predict_batch_size=8, learning_rate=1e-3, num_train_epochs=120, do_train=True,
      do_predict=True, do_eval=True, eval_every_steps=40, keep_best=False), tokenizer)
  assert results["train_steps"] == 120  # one (padded) batch per epoch
  assert results["eval"]["total"] == 5 and results["eval"]["exact_match"] == 100.0
  # Scored by the official measures while training, F1 picking the best; nothing kept.
  rows = {r["step"]: r["eval/f1"] for r in metrics.read_jsonl(
      str(tmp_path / "out" / "metrics.jsonl")) if "eval/f1" in r}
  assert sorted(rows) == [40, 80, 120] and rows[120] == results["eval"]["f1"]
  assert results["best"]["metric"] == "eval/f1" and results["best"]["directory"] is None
  assert not os.path.exists(tmp_path / "out" / "best")


# ------------------------------------------------------------------------ tensorflow-datasets
def _as_tfds_records(examples, version_2):
  """The examples in the feature layout of tfds `squad/v1.1` / `squad/v2.0`."""
  records = []
  for e in examples:
    record = {"id": e.qas_id, "title": e.title, "context": e.context, "question": e.question,
              "answers": {"text": np.asarray([a.text for a in e.answers], object),
                          "answer_start": np.asarray([a.start for a in e.answers], np.int32)}}
    if version_2:
      record["is_impossible"] = e.is_impossible
      record["plausible_answers"] = {"text": np.zeros(0, object),
                                     "answer_start": np.zeros(0, np.int32)}
    records.append(record)
  return records


@pytest.mark.parametrize("version_2", [False, True])
def test_tfds_squad_reads_like_the_json_files(tmp_path, version_2):
  import tensorflow as tf
  import tensorflow_datasets as tfds
  data = _overfit_set() if version_2 else OFFICIAL
  from_json = squad.read_squad_json(_write(tmp_path / "dev.json", data))
  records = _as_tfds_records(from_json, version_2)[::-1]  # tfds stores records shuffled

  def as_dataset(self, split, *args, **kwargs):
    assert self.name == "squad" and self.builder_config.name == ("v2.0" if version_2 else "v1.1")
    assert split == "validation"
    text, texts = tf.TensorSpec((), tf.string), tf.TensorSpec((None,), tf.string)
    spans = {"text": texts, "answer_start": tf.TensorSpec((None,), tf.int32)}
    signature = {"id": text, "title": text, "context": text, "question": text, "answers": spans}
    if version_2:
      signature.update(is_impossible=tf.TensorSpec((), tf.bool), plausible_answers=spans)
    return tf.data.Dataset.from_generator(lambda: iter(records), output_signature=signature)

  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    from_tfds = squad.read_squad_tfds(str(tmp_path), "dev", version_2)
  key = lambda e: (e.qas_id, e.question, e.context, e.answers, e.is_impossible, e.title)
  assert sorted(map(key, from_tfds)) == sorted(map(key, from_json))


def test_tfds_squad_that_is_not_prepared_says_how_to_prepare_it(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"tfds build squad/v1.1 --data_dir=DIR"):
    squad.read_squad_tfds(str(tmp_path), "train", False)


# ------------------------------------------------------------------------- span head parity
@pytest.mark.slow
def test_span_head_and_loss_match_the_reference(tmp_path, tokenizer):
  """MiniLM + a span head against transformers' PyTorch BertForQuestionAnswering with the same
  weights, on real SQuAD windows: logits at every real token and the loss within 1e-5."""
  import jax.numpy as jnp
  import torch
  import transformers
  from bert_jax.model import heads
  torch.manual_seed(0)
  reference = transformers.BertForQuestionAnswering.from_pretrained(
      helpers.minilm_dir(), attn_implementation="eager").eval()
  config, params, _ = hf_io.load_hf_checkpoint(helpers.minilm_dir())
  weight = reference.qa_outputs.weight.detach().numpy()
  bias = reference.qa_outputs.bias.detach().numpy()
  model = heads.BertForQuestionAnswering(config)
  ours = {"bert": {k: v for k, v in params["bert"].items() if k != "pooler"},
          "qa_outputs": {"kernel": weight.T, "bias": bias}}
  examples = squad.read_squad_json(_write(tmp_path / "t.json", OFFICIAL))
  feats = squad.convert_examples_to_features(examples, tokenizer, max_seq_length=48,
                                             doc_stride=16, is_training=True).arrays
  start, end = model.apply({"params": ours}, feats["input_ids"], feats["input_mask"],
                           feats["segment_ids"])
  with torch.no_grad():
    out = reference(input_ids=torch.tensor(feats["input_ids"]),
                    attention_mask=torch.tensor(feats["input_mask"]),
                    token_type_ids=torch.tensor(feats["segment_ids"]))
  real = feats["input_mask"].astype(bool)
  assert abs(np.asarray(start) - out.start_logits.numpy())[real].max() < 1e-5
  assert abs(np.asarray(end) - out.end_logits.numpy())[real].max() < 1e-5
  # The loss: windows without padding, where the softmax runs over the same positions.
  full = np.flatnonzero(real.all(axis=1))
  assert len(full) >= 3
  with torch.no_grad():
    loss = reference(input_ids=torch.tensor(feats["input_ids"][full]),
                     attention_mask=torch.tensor(feats["input_mask"][full]),
                     token_type_ids=torch.tensor(feats["segment_ids"][full]),
                     start_positions=torch.tensor(feats["start_positions"][full]).long(),
                     end_positions=torch.tensor(feats["end_positions"][full]).long()).loss
  weights = np.zeros(len(feats["weight"]), np.float32)
  weights[full] = 1.0  # weight 0 rows (padding of a partial batch) must not count
  ours_loss = question_answering.span_loss(start, end, jnp.asarray(feats["start_positions"]),
                              jnp.asarray(feats["end_positions"]), jnp.asarray(weights))
  assert abs(float(ours_loss["loss"]) - float(loss)) < 1e-5


# ------------------------------------------------------- against the original run_squad.py
WINDOW = {"max_seq_length": 96, "doc_stride": 24, "max_query_length": 24}
WINDOW_V2 = dict(WINDOW, max_seq_length=40, doc_stride=8)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
  """What the original run_squad.py makes of the data of the four comparisons below, in one
  process (TensorFlow and the original code imported once): {(kind, version_2): (data file,
  output directory, features)}. Training features of 330 questions on 60 real passages (SQuAD
  1.1) and of the hand-checked set with an unanswerable question (2.0); predictions from drawn
  logits for another 60 passages, as 1.1 and as 2.0."""
  work = tmp_path_factory.mktemp("original")
  dev = _write(work / "dev.json", demo_squad.shakespeare_squad(60, seed=4))
  specs = {
      ("features", False): dict(
          input_file=_write(work / "train.json", demo_squad.shakespeare_squad(60, seed=3)),
          version_2=False, is_training=True, **WINDOW),
      ("features", True): dict(input_file=_write(work / "train-v2.json", _overfit_set()),
                               version_2=True, is_training=True, **WINDOW_V2)}
  for version_2 in (False, True):
    specs["predictions", version_2] = dict(
        input_file=dev, version_2=version_2, is_training=False, logits_seed=5, n_best_size=20,
        max_answer_length=30, **WINDOW)
  spec_files = []
  for i, spec in enumerate(specs.values()):
    spec.update(vocab_file=VOCAB, output_dir=str(work / f"out{i}"))
    os.makedirs(spec["output_dir"])
    spec_files.append(_write(work / f"spec{i}.json", spec))
  proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "original_run_squad.py"),
                         *spec_files], env=helpers.command_env(), capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return {key: (spec["input_file"], pathlib.Path(spec["output_dir"]),
                json.load(open(os.path.join(spec["output_dir"], "features.json"))))
          for key, spec in specs.items()}


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("version_2", [False, True])
def test_training_features_equal_the_original(original, tokenizer, version_2):
  """Every window of 330 questions on 60 real passages (SQuAD 1.1), or of the hand-checked set
  with an unanswerable question (2.0): ids, segments, answer positions and max-context flags
  equal those of the original `convert_examples_to_features`."""
  data_file, _, theirs_all = original["features", version_2]
  examples = squad.read_squad_json(data_file)
  ours = squad.convert_examples_to_features(examples, tokenizer, is_training=True,
                                            **(WINDOW_V2 if version_2 else WINDOW))
  assert len(theirs_all) == len(ours.example_index) > 2 * len(examples)
  for f, theirs in enumerate(theirs_all):
    assert examples[ours.example_index[f]].qas_id == theirs["qas_id"]
    for name, key in (("input_ids", "input_ids"), ("input_mask", "input_mask"),
                      ("segment_ids", "segment_ids")):
      assert ours.arrays[name][f].tolist() == theirs[key], (f, name)
    assert int(ours.arrays["start_positions"][f]) == theirs["start_position"], f
    assert int(ours.arrays["end_positions"][f]) == theirs["end_position"], f
    assert np.flatnonzero(ours.max_context[f]).tolist() == theirs["max_context"], f


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("version_2", [False, True])
def test_predictions_equal_the_original_write_predictions(original, tokenizer, version_2):
  """The same logits through the original `write_predictions` (n-best, null score,
  `get_final_text`) and through `postprocess` give the same answers and n-best lists."""
  data_file, out, _ = original["predictions", version_2]
  logits = np.load(out / "logits.npz")
  examples = squad.read_squad_json(data_file)
  feats = squad.convert_examples_to_features(examples, tokenizer, **WINDOW)
  preds, nbest, odds = squad.postprocess(examples, feats, logits["start"], logits["end"],
                                         version_2_with_negative=version_2)
  # The original joins whitespace-separated words with one space; here the context's own
  # characters come back (a newline inside an answer stays a newline).
  norm = lambda text: " ".join(text.split())  # noqa: E731
  want = json.load(open(out / "predictions.json"))
  assert {k: norm(v) for k, v in preds.items()} == {k: norm(v) for k, v in want.items()}
  assert sum(bool(v) for v in want.values()) > len(want) // 2
  want_nbest = json.load(open(out / "nbest_predictions.json"))
  assert set(nbest) == set(want_nbest)
  for qid, entries in want_nbest.items():
    assert [norm(x["text"]) for x in nbest[qid]] == [norm(x["text"]) for x in entries], qid
    np.testing.assert_allclose([x["probability"] for x in nbest[qid]],
                               [x["probability"] for x in entries], rtol=1e-6)
  if version_2:
    want_odds = json.load(open(out / "null_odds.json"))
    assert odds == pytest.approx(want_odds)


def test_an_empty_question_is_an_error_naming_its_id(tmp_path):
  data = json.loads(json.dumps(OFFICIAL))
  data["data"][0]["paragraphs"][0]["qas"][1]["question"] = " \t"
  path = _write(tmp_path / "train.json", data)
  with pytest.raises(ValueError, match=re.escape(
      f"{path}: data[0].paragraphs[0].qas[1] (id 'q2'): the question is empty.")):
    squad.read_squad_json(path)
  # The same from a prepared tensorflow-datasets directory.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  records = _as_tfds_records(squad.read_squad_json(_write(tmp_path / "ok.json", OFFICIAL)),
                             False)
  records[1]["question"] = ""

  def as_dataset(self, split, *args, **kwargs):
    del self, split, args, kwargs
    text, texts = tf.TensorSpec((), tf.string), tf.TensorSpec((None,), tf.string)
    signature = {"id": text, "title": text, "context": text, "question": text,
                 "answers": {"text": texts, "answer_start": tf.TensorSpec((None,), tf.int32)}}
    return tf.data.Dataset.from_generator(lambda: iter(records), output_signature=signature)

  with tfds.testing.mock_data(as_dataset_fn=as_dataset):
    with pytest.raises(ValueError, match=re.escape(
        "squad/v1.1[validation] id q2: the question is empty.")):
      squad.read_squad_tfds(str(tmp_path), "dev", False)


def test_a_vocabulary_that_does_not_fit_the_text_is_refused(tmp_path, tokenizer):
  """Questions and contexts mostly [UNK] (here a vocab.txt cut at 1,000 entries): the features
  would be noise, so featurization stops and names the file, the rate and the vocabulary."""
  passage = demo_corpus.corpus_text(max_bytes=3000).replace("\n", " ")
  data = {"data": [{"title": "t", "paragraphs": [{"context": passage, "qas": [
      {"id": "p1", "question": "Who speaks first?", "answers": [
          {"text": passage[:12], "answer_start": 0}]}]}]}]}
  path = _write(tmp_path / "dev.json", data)
  examples = squad.read_squad_json(path)
  short_vocab = tmp_path / "vocab.txt"
  short_vocab.write_text("\n".join(open(VOCAB, encoding="utf-8").read().split("\n")[:1000]) + "\n",
                         encoding="utf-8")
  short = tokenization.load_tokenizer(vocab_file=str(short_vocab))
  with pytest.raises(ValueError, match=(
      rf"^{re.escape(path)}: 9\d\.\d% of [\d,]+ word pieces are \[UNK\] with vocab\.txt "
      r"\(1,000 entries\): the vocabulary does not fit this text.*max_unknown_rate")):
    squad.convert_examples_to_features(examples, short, max_seq_length=64, doc_stride=32)
  forced = squad.convert_examples_to_features(examples, short, max_seq_length=64,
                                              doc_stride=32, max_unknown_rate=1.0)
  assert forced.report["unknown_piece_fraction"] > 0.9
  fits = squad.convert_examples_to_features(examples, tokenizer, max_seq_length=64,
                                            doc_stride=32)
  assert fits.report["unknown_piece_fraction"] < 0.01


def test_deep_nesting_and_lone_surrogates_are_named_with_the_file(tmp_path):
  deep = tmp_path / "deep.json"
  deep.write_text("[" * 100_000 + "]" * 100_000)
  with pytest.raises(ValueError, match=re.escape(f"{deep}: JSON nested too deeply")):
    squad.read_squad_json(str(deep))
  text = json.dumps(OFFICIAL)
  context = OFFICIAL["data"][0]["paragraphs"][0]["context"]
  lone = tmp_path / "lone.json"
  lone.write_text(text.replace(json.dumps(context)[1:-1], json.dumps(context)[1:-1] + "\\ud800",
                               1))
  with pytest.raises(ValueError, match=re.escape(f"{lone}: holds an unpaired surrogate escape")):
    squad.read_squad_json(str(lone))
  # A surrogate pair is an ordinary character (here an emoji) and is read.
  pair = tmp_path / "pair.json"
  pair.write_text(text.replace(json.dumps(context)[1:-1], json.dumps(context)[1:-1]
                               + " \\ud83d\\ude00", 1))
  assert "\U0001F600" in squad.read_squad_json(str(pair))[0].context
