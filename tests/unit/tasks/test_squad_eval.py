"""SQuAD v1.1/v2.0 evaluation: v1.1 against torchmetrics' SQuAD metric, hand-computed v1.1 and
v2.0 scores (no-answer thresholds and the best-threshold search included), missing predictions,
the command line on files in the official layout, and the errors bad files give."""

import json
import math
import subprocess
import sys

import pytest
from torchmetrics.text import SQuAD

from bert_jax.tasks.squad import metrics as squad_eval
from bert_jax.tasks.squad.metrics import (compute_exact, compute_f1, evaluate, evaluate_v1,
                                       evaluate_v2, exact_match_score_v1, f1_score_v1,
                                       normalize_answer)
from tests import helpers

REPO = helpers.REPO


def write_json(path, obj):
  with open(path, "w", encoding="utf-8") as f:
    json.dump(obj, f, ensure_ascii=False)
  return str(path)


def squad_file(path, questions, version="1.1"):
  """An official-layout dataset: questions are (id, answer texts, is_impossible or None),
  spread over two articles and three paragraphs so that the walk over the nesting is tested."""
  qas = []
  for qid, answers, impossible in questions:
    qa = {"id": qid, "question": f"question {qid}?",
          "answers": [{"text": t, "answer_start": 0} for t in answers]}
    if impossible is not None:
      qa["is_impossible"] = impossible
    qas.append(qa)
  third = max(1, len(qas) // 3)
  data = [{"title": "A", "paragraphs": [{"context": "c1", "qas": qas[:third]},
                                        {"context": "c2", "qas": qas[third:2 * third]}]},
          {"title": "B", "paragraphs": [{"context": "c3", "qas": qas[2 * third:]}]}]
  return write_json(path, {"version": version, "data": data})


# -- normalisation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("The Eiffel Tower.", "eiffel tower"),
    ("An   apple, a\tDAY!!\n", "apple day"),
    ("the-end", "theend"),          # punctuation goes first: no article is left
    ("a.", ""),                     # ... and here punctuation removal exposes one
    ("theatre anthem", "theatre anthem"),  # articles only as whole words
    ("Rock 'n' Roll", "rock n roll"),
    ("$1,000.00", "100000"),
    ("“Quoted” — text", "“quoted” — text"),  # only ASCII punctuation goes
    ("«the»", "« »"),                  # an article becomes a space, which splits tokens
    ("x—a—y", "x— —y"),
    ("ÜBER Straße", "über straße"),
    ("", ""),
])
def test_normalize_answer(text, expected):
  assert normalize_answer(text) == expected


def test_per_answer_scores_by_hand():
  assert exact_match_score_v1("  the Denver  broncos!", "Denver Broncos")
  # gold [norman, conquest, of, england], prediction [norman, conquest]: P=1, R=1/2, F1=2/3.
  assert f1_score_v1("the Norman conquest", "Norman conquest of England") == pytest.approx(2 / 3)
  # Repeated tokens count as a multiset: one "cat" in common, P=1/3, R=1, F1=1/2.
  assert f1_score_v1("cat cat cat", "cat") == pytest.approx(0.5)
  assert f1_score_v1("saint denis", "Saint-Denis") == 0
  # Both sides normalise to nothing: v1.1 shares no token (F1 0) yet matches exactly; v2.0 says
  # both are "no answer" and gives F1 1. torchmetrics follows v2.0 here, so keep it out below.
  assert f1_score_v1("A", "the") == 0 and exact_match_score_v1("A", "the")
  assert compute_f1("the", "A") == 1 and compute_exact("the", "A") == 1
  assert compute_f1("", "Paris") == 0 and compute_f1("Paris", "") == 0
  assert compute_f1("1066", "in 1066") == pytest.approx(2 / 3)


# -- v1.1 against torchmetrics ---------------------------------------------------------------------

# id -> (gold answers, prediction or None when the prediction is missing).
HARD_CASES = {
    "case": (["Denver Broncos"], "denver BRONCOS"),
    "article_punct": (["the Eiffel Tower."], "Eiffel tower"),
    "hyphen": (["Saint-Denis", "Paris"], "saint denis"),
    "spacing": (["an apple a day"], "An   apple, a   DAY!!"),
    "tabs": (["Super\tBowl\n50"], " super bowl 50 "),
    "partial": (["the Norman conquest of England"], "Norman conquest"),
    "multi_gold": (["10th century", "the 10th century", "in the 10th century"],
                   "10th and 11th centuries"),
    "empty_pred": (["Rollo"], ""),
    "unicode_case": (["Ünïcödé straße"], "ünïcödé STRASSE"),
    "unicode_punct": (["“quoted” — text"], "quoted text"),
    "word_articles": (["theatre anthem"], "the atre an them"),
    "repeats": (["new york new york"], "new york"),
    "money": (["$1,000"], "1000"),
    "apostrophes": (["Rock 'n' Roll"], "rock n roll"),
    "cjk": (["東京"], "東京都"),
    "hyphen_article": (["the-end"], "end"),
    "two_golds": (["Normandy", "Normandy", "France"], "in Normandy France"),
    "many_repeats": (["cat"], "cat cat cat"),
    "missing": (["never answered"], None),
}


def torchmetrics_squad(cases):
  preds = [{"prediction_text": p, "id": qid} for qid, (_, p) in cases.items() if p is not None]
  target = [{"answers": {"answer_start": [0] * len(g), "text": g}, "id": qid}
            for qid, (g, _) in cases.items()]
  metric = SQuAD()
  with pytest.warns(UserWarning) if any(p is None for _, p in cases.values()) else _no_op():
    metric.update(preds, target)
  return {k: float(v) for k, v in metric.compute().items()}


class _no_op:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def ours_v1(cases):
  gold = {qid: g for qid, (g, _) in cases.items()}
  predictions = {qid: p for qid, (_, p) in cases.items() if p is not None}
  return evaluate_v1(gold, predictions)


@pytest.mark.parametrize("qid", sorted(HARD_CASES))
def test_v1_matches_torchmetrics_per_question(qid):
  case = {qid: HARD_CASES[qid]}
  ours, theirs = ours_v1(case), torchmetrics_squad(case)
  assert ours["exact_match"] == pytest.approx(theirs["exact_match"], abs=1e-4)
  assert ours["f1"] == pytest.approx(theirs["f1"], abs=1e-4)


def test_v1_matches_torchmetrics_over_the_set_and_by_hand():
  ours, theirs = ours_v1(HARD_CASES), torchmetrics_squad(HARD_CASES)
  assert ours["exact_match"] == pytest.approx(theirs["exact_match"], abs=1e-4)
  assert ours["f1"] == pytest.approx(theirs["f1"], abs=1e-4)
  # By hand: exact on case, article_punct, spacing, tabs, money, apostrophes (6 of 19);
  # F1 adds those 6, partial 2/3 (P=1, R=1/2), multi_gold 1/3 (best: "10th century", P=1/4,
  # R=1/2), unicode_case 1/2, unicode_punct 2/5 ("text" of 2 and 3 tokens), repeats 2/3,
  # two_golds 1/2, many_repeats 1/2.
  f1_sum = 6 + 2 / 3 + 1 / 3 + 1 / 2 + 2 / 5 + 2 / 3 + 1 / 2 + 1 / 2
  assert ours == {"exact_match": pytest.approx(100 * 6 / 19),
                  "f1": pytest.approx(100 * f1_sum / 19), "total": 19, "missing": 1}


# -- v1.1 by hand ----------------------------------------------------------------------------------

def test_v1_missing_predictions_score_zero_but_count(caplog):
  gold = {"q1": ["The Cat"], "q2": ["dog"], "q3": ["a red fox", "fox"]}
  result = evaluate_v1(gold, {"q1": "cat", "q3": "red fox", "other": "ignored"})
  # q1 exact; q2 missing (0, counted); q3 exact against "a red fox" -> 2 of 3 questions.
  assert result == {"exact_match": pytest.approx(200 / 3), "f1": pytest.approx(200 / 3),
                    "total": 3, "missing": 1}
  assert "Unanswered question q2 will receive score 0." in caplog.text


def test_v1_refuses_questions_without_answers():
  with pytest.raises(ValueError, match=r"1 questions have no gold answer \(first: 'q2'\).*2\.0"):
    evaluate_v1({"q1": ["x"], "q2": []}, {"q1": "x", "q2": ""})
  with pytest.raises(ValueError, match="no questions"):
    evaluate_v1({}, {})


def test_bad_inputs_to_the_functions():
  with pytest.raises(TypeError, match=r"gold\['q1'\] must be a list of answer texts"):
    evaluate_v1({"q1": "Denver"}, {"q1": "Denver"})
  with pytest.raises(ValueError, match=r"entry 'q1': expected the answer text.*int 3"):
    evaluate_v2({"q1": ["x"]}, {"q1": 3})
  with pytest.raises(ValueError, match="only apply to SQuAD 2.0"):
    evaluate({"q1": ["x"]}, {"q1": "x"}, na_probs={"q1": 0.1})


# -- v2.0 by hand ----------------------------------------------------------------------------------

V2_GOLD = {"a1": ["Denver Broncos", "the Broncos"], "a2": ["Norman conquest of England"],
           "a3": ["1066"], "n1": [], "n2": [], "n3": []}
V2_PREDS = {"a1": "Broncos", "a2": "the Norman conquest", "a3": "", "n1": "", "n2": "Paris",
            "n3": ""}
# Raw per question (exact, f1): a1 (1, 1) via "the Broncos"; a2 (0, 2/3); a3 (0, 0): an empty
# answer to an answerable question; n1 (1, 1); n2 (0, 0): an answer where there is none; n3 (1, 1).
V2_NA_PROBS = {"a1": 0.1, "a2": 0.5, "a3": 0.9, "n1": 0.2, "n2": 0.8, "n3": 0.3}


def test_v2_without_na_probs():
  result = evaluate_v2(V2_GOLD, V2_PREDS)
  assert list(result) == ["exact", "f1", "total", "HasAns_exact", "HasAns_f1", "HasAns_total",
                          "NoAns_exact", "NoAns_f1", "NoAns_total"]
  assert result == {
      "exact": pytest.approx(100 * 3 / 6), "f1": pytest.approx(100 * (1 + 2 / 3 + 1 + 1) / 6),
      "total": 6,
      "HasAns_exact": pytest.approx(100 / 3), "HasAns_f1": pytest.approx(100 * (5 / 3) / 3),
      "HasAns_total": 3,
      "NoAns_exact": pytest.approx(200 / 3), "NoAns_f1": pytest.approx(200 / 3), "NoAns_total": 3}
  assert evaluate(V2_GOLD, V2_PREDS, version_2_with_negative=True) == result


def test_v2_threshold_and_best_thresholds():
  result = evaluate_v2(V2_GOLD, V2_PREDS, V2_NA_PROBS, na_prob_thresh=0.4)
  # Above 0.4 the model says "no answer": a2 and a3 score 0, n2 becomes right (1).
  # exact and f1 per question: a1 1, a2 0, a3 0, n1 1, n2 1, n3 1 -> 4/6.
  # Best threshold, from 3 (all "no answer") in ascending probability, on the raw scores:
  #   exact: a1 +1 -> 4 (new best, 0.1); n1 0, n3 0, a2 0, n2 -1 -> 3, a3 0 -> best 4 at 0.1.
  #   f1:    a1 +1 -> 4 (0.1); n1 0, n3 0; a2 +2/3 -> 14/3 (new best, 0.5); n2 -1, a3 0.
  assert result == {
      "exact": pytest.approx(400 / 6), "f1": pytest.approx(400 / 6), "total": 6,
      "HasAns_exact": pytest.approx(100 / 3), "HasAns_f1": pytest.approx(100 / 3),
      "HasAns_total": 3,
      "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 3,
      "best_exact": pytest.approx(400 / 6), "best_exact_thresh": 0.1,
      "best_f1": pytest.approx(100 * (14 / 3) / 6), "best_f1_thresh": 0.5}
  # The default threshold of 1.0 never says "no answer": same as without probabilities.
  default = evaluate_v2(V2_GOLD, V2_PREDS, V2_NA_PROBS)
  plain = evaluate_v2(V2_GOLD, V2_PREDS)
  assert {k: default[k] for k in plain} == plain
  assert default["best_f1_thresh"] == 0.5


def test_v2_best_threshold_ties_keep_the_order_of_na_probs():
  gold, preds = {"x": ["yes"], "y": []}, {"x": "yes", "y": "wrong"}
  # x then y: 1 -> 2 (x, best at 0.5) -> 1. y then x: 1 -> 0 -> 1, never better than 1.
  first = evaluate_v2(gold, preds, {"x": 0.5, "y": 0.5})
  assert (first["best_exact"], first["best_exact_thresh"]) == (100.0, 0.5)
  second = evaluate_v2(gold, preds, {"y": 0.5, "x": 0.5})
  assert (second["best_exact"], second["best_exact_thresh"]) == (50.0, 0.0)


def test_v2_missing_predictions_are_left_out(caplog):
  preds = {k: v for k, v in V2_PREDS.items() if k != "n3"}
  result = evaluate_v2(V2_GOLD, preds)
  # Five scored: exact a1 + n1 = 2/5; f1 (1 + 2/3 + 1)/5; NoAns over n1, n2 only.
  assert result["total"] == 5 and result["NoAns_total"] == 2
  assert result["exact"] == pytest.approx(40.0)
  assert result["f1"] == pytest.approx(100 * (8 / 3) / 5)
  assert result["NoAns_exact"] == pytest.approx(50.0)
  assert "Missing prediction for n3" in caplog.text
  # The best-threshold search counts only scored unanswerable questions (n1, n2): 2 of 5 to start.
  best = evaluate_v2(V2_GOLD, preds, V2_NA_PROBS)
  assert best["best_exact"] == pytest.approx(100 * 3 / 5) and best["best_exact_thresh"] == 0.1
  with pytest.raises(ValueError, match="none of the 6 questions has a prediction"):
    evaluate_v2(V2_GOLD, {"elsewhere": "x"})


def test_v2_only_unanswerable_and_gold_that_normalises_away():
  only_no = evaluate_v2({"n1": [], "n2": []}, {"n1": "", "n2": "the"})
  # "the" normalises to nothing, so it is a "no answer" too.
  assert only_no == {"exact": 100.0, "f1": 100.0, "total": 2, "NoAns_exact": 100.0,
                     "NoAns_f1": 100.0, "NoAns_total": 2}
  # A question whose only answer is "The" is answerable (it has answers), but it is scored
  # against the empty answer, as officially: the empty prediction matches it.
  quirk = evaluate_v2({"q": ["The"]}, {"q": ""})
  assert quirk == {"exact": 100.0, "f1": 100.0, "total": 1, "HasAns_exact": 100.0,
                   "HasAns_f1": 100.0, "HasAns_total": 1}


def test_v2_na_probs_checks():
  with pytest.raises(ValueError, match=r"na_probs: entry 'a1': .*must be a number, got str '0.1'"):
    evaluate_v2(V2_GOLD, V2_PREDS, {**V2_NA_PROBS, "a1": "0.1"})
  with pytest.raises(ValueError, match="must be a number, got bool"):
    evaluate_v2(V2_GOLD, V2_PREDS, {**V2_NA_PROBS, "a1": True})
  with pytest.raises(ValueError, match="must be a number, got float nan"):
    evaluate_v2(V2_GOLD, V2_PREDS, {**V2_NA_PROBS, "a1": math.nan})
  with pytest.raises(ValueError, match=r"no entry for 1 answered questions \(first: 'n3'\)"):
    evaluate_v2(V2_GOLD, V2_PREDS, {k: v for k, v in V2_NA_PROBS.items() if k != "n3"})


# -- files -----------------------------------------------------------------------------------------

def test_read_dataset_and_gold_answers(tmp_path):
  path = squad_file(tmp_path / "dev.json", [("q1", ["The Cat", "cat"], None), ("q2", [], True),
                                            ("q3", ["x"], False), ("q4", ["y"], None)])
  data = squad_eval.read_dataset(path)
  assert len(data) == 2
  assert squad_eval.gold_answers(data) == {"q1": ["The Cat", "cat"], "q2": [], "q3": ["x"],
                                           "q4": ["y"]}
  assert squad_eval.is_squad_v2(data)
  v1 = squad_eval.read_dataset(squad_file(tmp_path / "v1.json", [("q1", ["a"], None)]))
  assert not squad_eval.is_squad_v2(v1)


def test_dataset_errors_name_the_file_and_place(tmp_path):
  bad_json = tmp_path / "broken.json"
  bad_json.write_text('{"data": [\n  {"paragraphs": ]}\n')
  with pytest.raises(ValueError, match=rf"^{bad_json}: line 2, column 18: not valid JSON"):
    squad_eval.read_dataset(str(bad_json))

  not_utf8 = tmp_path / "latin1.json"
  not_utf8.write_bytes(b'{"data": [],\n "x": "caf\xe9"}')
  with pytest.raises(ValueError, match=rf"{not_utf8}: line 2: .*UTF-8"):
    squad_eval.read_dataset(str(not_utf8))

  qas = [{"id": f"q{k}", "answers": [{"text": "t"}]} for k in range(6)]
  qas[5] = {"id": "abc", "question": "?"}
  data = [{"paragraphs": []}, {"paragraphs": []}, {"paragraphs": [{"qas": qas}]}]
  path = write_json(tmp_path / "dev.json", {"data": data})
  with pytest.raises(ValueError) as e:
    squad_eval.read_dataset(path)
  assert str(e.value) == f"{path}: data[2].paragraphs[0].qas[5] (id 'abc'): no 'answers'."

  def error_for(data):
    with pytest.raises(ValueError) as e:
      squad_eval.read_dataset(write_json(tmp_path / "x.json", data))
    return str(e.value).split(": ", 1)[1]

  assert error_for({"version": "1.1"}).startswith("expected a SQuAD dataset")
  assert error_for({"q1": "a prediction file"}).startswith("expected a SQuAD dataset")
  assert error_for({"data": [{"title": "t"}]}) == "data[0]: no 'paragraphs'."
  assert error_for({"data": [{"paragraphs": [{"context": "c"}]}]}) == (
      "data[0].paragraphs[0]: no 'qas'.")
  assert error_for({"data": [{"paragraphs": [{"qas": [{"id": 7, "answers": []}]}]}]}) == (
      "data[0].paragraphs[0].qas[0]: 'id' must be a string, got int 7.")
  assert error_for({"data": [{"paragraphs": [{"qas": [
      {"id": "q", "answers": [{"text": "a"}, {"answer_start": 3}]}]}]}]}) == (
      "data[0].paragraphs[0].qas[0] (id 'q').answers[1]: no 'text'.")
  assert error_for({"data": [{"paragraphs": [{"qas": [
      {"id": "q", "answers": [{"text": "a"}]}, {"id": "q", "answers": []}]}]}]}) == (
      "data[0].paragraphs[0].qas[1] (id 'q'): the id was already used at "
      "data[0].paragraphs[0].qas[0].")


def test_prediction_and_na_prob_file_errors(tmp_path):
  preds = write_json(tmp_path / "preds.json", [{"id": "q1", "prediction_text": "a"}])
  with pytest.raises(ValueError, match=rf"^{preds}: expected a JSON object mapping .*got list"):
    squad_eval.read_predictions(preds)
  nbest = write_json(tmp_path / "nbest.json", {"q1": "a", "q2": [{"text": "b"}]})
  with pytest.raises(ValueError, match=rf"^{nbest}: entry 'q2': expected the answer text.*n-best"):
    squad_eval.read_predictions(nbest)
  probs = write_json(tmp_path / "probs.json", {"q1": 0.5, "q2": None})
  with pytest.raises(ValueError, match=rf"^{probs}: entry 'q2': .*must be a number, got NoneType"):
    squad_eval.read_na_probs(probs)
  assert squad_eval.read_predictions(write_json(tmp_path / "ok.json", {"q": "é"})) == {"q": "é"}


# -- command line ----------------------------------------------------------------------------------

def run_cli(*args):
  return subprocess.run([sys.executable, "-m", "bert_jax.tasks.squad_eval", *map(str, args)],
                        cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.e2e
def test_cli_v1_end_to_end(tmp_path):
  data = squad_file(tmp_path / "dev-v1.1.json",
                    [("q1", ["The Cat"], None), ("q2", ["dog"], None), ("q3", ["red fox"], None)])
  preds = write_json(tmp_path / "predictions.json", {"q1": "cat!", "q3": "fox"})
  out = tmp_path / "eval" / "result.json"
  proc = run_cli(data, preds, "--out_file", out)
  assert proc.returncode == 0, proc.stderr
  # q1 exact; q2 unanswered (0); q3 F1 2/3 (P=1, R=1/2).
  expected = {"exact_match": pytest.approx(100 / 3), "f1": pytest.approx(100 * (5 / 3) / 3),
              "total": 3, "missing": 1}
  assert json.loads(proc.stdout) == expected
  assert json.loads(out.read_text()) == expected
  assert "Unanswered question q2 will receive score 0." in proc.stderr


@pytest.mark.e2e
def test_cli_v2_detected_from_the_data_and_from_na_probs(tmp_path):
  questions = [(qid, answers, not answers) for qid, answers in V2_GOLD.items()]
  data = squad_file(tmp_path / "dev-v2.0.json", questions, version="v2.0")
  preds = write_json(tmp_path / "predictions.json", V2_PREDS)
  probs = write_json(tmp_path / "null_odds.json", V2_NA_PROBS)
  proc = run_cli(data, preds, "--na_prob_file", probs, "--na_prob_thresh", "0.4")
  assert proc.returncode == 0, proc.stderr
  assert json.loads(proc.stdout) == evaluate_v2(V2_GOLD, V2_PREDS, V2_NA_PROBS, 0.4)

  # In-process from here: the same entry point without a new interpreter each time.
  v1_layout = squad_file(tmp_path / "plain.json", [(q, a or ["x"], None) for q, a, _ in questions])
  assert squad_eval.main([data, preds]) == 0                  # is_impossible -> 2.0
  assert squad_eval.main([v1_layout, preds, "-n", probs]) == 0  # na_prob_file -> 2.0
  assert squad_eval.main([v1_layout, preds]) == 0              # neither -> 1.1


def test_cli_versions_and_errors(tmp_path, capsys):
  data = squad_file(tmp_path / "dev.json", [("q1", ["big bird"], None), ("q2", [], True),
                                            ("q3", ["c"], None)])
  preds = write_json(tmp_path / "p.json", {"q1": "bird", "q2": "", "q3": "c"})
  probs = write_json(tmp_path / "n.json", {"q1": 0.0, "q2": 0.0, "q3": 0.0})

  assert squad_eval.main([data, preds]) == 0
  auto = json.loads(capsys.readouterr().out)
  assert "NoAns_total" in auto and "best_exact" not in auto
  assert auto["f1"] == pytest.approx(100 * (2 / 3 + 1 + 1) / 3)  # q1 P=1, R=1/2

  assert squad_eval.main([data, preds, "--version", "1.1"]) == 1
  assert "no gold answer" in capsys.readouterr().err
  assert squad_eval.main([data, preds, "--version", "1.1", "--na_prob_file", probs]) == 1
  assert "--na_prob_file only applies to SQuAD 2.0" in capsys.readouterr().err

  broken = tmp_path / "broken.json"
  broken.write_text('{"q1": "a",\n "q2": }')
  assert squad_eval.main([data, str(broken)]) == 1
  assert f"squad_eval: error: {broken}: line 2, column 8: not valid JSON" in (
      capsys.readouterr().err)
  assert squad_eval.main([str(tmp_path / "absent.json"), preds]) == 1
  assert "absent.json" in capsys.readouterr().err
