"""SQuAD v1.1 and v2.0 scores, computed exactly as the official evaluation scripts compute them.

Papers report SQuAD numbers from the official `evaluate-v1.1.py` and `evaluate-v2.0.py`, and
their details move scores by tenths of a point: the answer normalisation (case, ASCII
punctuation, the articles "a", "an", "the"), v1.1 scoring an unanswered question 0 but counting
it, v2.0 scoring an empty answer against an unanswerable question as a full match and leaving
unanswered questions out of its totals, and the v2.0 search for the best no-answer threshold.
This module reproduces those rules, order of summation included, so that its numbers are the
ones a leaderboard would give for the same prediction file:

    python -m bert_jax.tasks.squad_eval dev-v1.1.json predictions.json
    python -m bert_jax.tasks.squad_eval dev-v2.0.json predictions.json \
        --na_prob_file null_odds.json --out_file eval.json

It departs from the official scripts only where they would crash or print a number that means
nothing: bad files are errors naming the file and the place in it; v1.1 refuses a question
without answers (its official `max()` over no answers raises); v2.0 reports its HasAns/NoAns
breakdown and best thresholds over the questions it scored (the official script raises a
KeyError as soon as one prediction is missing).

The scoring functions take gold answers as a plain mapping `question id -> answer texts` (an
empty list for an unanswerable question), so that callers reading SQuAD through
tensorflow-datasets score the same way as callers reading the official JSON files.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import numbers
import re
import string
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from absl import logging

from bert_jax import file_io
from bert_jax.tasks.squad import data as squad

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# A wrong prediction file can miss thousands of questions: name a few, then count the rest.
_MAX_NAMED_MISSING = 10


# -- normalisation and per-answer scores -----------------------------------------------------------

def normalize_answer(s: str) -> str:
  """Lower-case, drop ASCII punctuation, drop whole-word articles, collapse white space.

  The steps run in the official order, which matters: punctuation goes before articles, so
  "the-end" becomes "theend" (no article left) while "a." becomes the article "a" (removed).
  """
  text = s.lower()
  text = "".join(ch for ch in text if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def _token_f1(prediction_tokens: list[str], gold_tokens: list[str]) -> float:
  """Harmonic mean of token precision and recall, counting repeated tokens as a multiset."""
  common = collections.Counter(prediction_tokens) & collections.Counter(gold_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0
  precision = 1.0 * num_same / len(prediction_tokens)
  recall = 1.0 * num_same / len(gold_tokens)
  return (2 * precision * recall) / (precision + recall)


def f1_score_v1(prediction: str, ground_truth: str) -> float:
  """v1.1 token F1: an answer that normalises to nothing shares no token, so it scores 0."""
  return _token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def exact_match_score_v1(prediction: str, ground_truth: str) -> bool:
  return normalize_answer(prediction) == normalize_answer(ground_truth)


def get_tokens(s: str) -> list[str]:
  if not s:
    return []
  return normalize_answer(s).split()


def compute_exact(a_gold: str, a_pred: str) -> int:
  return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold: str, a_pred: str) -> float:
  """v2.0 token F1: where either side has no tokens ("no answer"), 1 if both agree, else 0."""
  gold_toks, pred_toks = get_tokens(a_gold), get_tokens(a_pred)
  if not gold_toks or not pred_toks:
    return int(gold_toks == pred_toks)
  return _token_f1(pred_toks, gold_toks)


# -- input checks ----------------------------------------------------------------------------------

def _check_gold(gold: Mapping[str, Sequence[str]]) -> None:
  """Catches the easy slip of passing one answer string where a list of answers belongs."""
  for qid, answers in gold.items():
    if (isinstance(answers, str) or not isinstance(answers, Sequence) or
        not all(isinstance(a, str) for a in answers)):
      raise TypeError(f"gold[{qid!r}] must be a list of answer texts, got {squad.describe(answers)}.")


def _check_predictions(predictions: Any, source: str = "predictions") -> dict[str, str]:
  if not isinstance(predictions, Mapping):
    raise ValueError(f"{source}: expected a JSON object mapping question id to answer text, "
                     f"got {type(predictions).__name__}.")
  for qid, text in predictions.items():
    if not isinstance(text, str):
      hint = (" (an n-best file? use the file of single best answers)"
              if isinstance(text, (list, dict)) else "")
      raise ValueError(f"{source}: entry {qid!r}: expected the answer text (a string), got "
                       f"{squad.describe(text)}{hint}.")
  return dict(predictions)


def _check_na_probs(na_probs: Any, source: str = "na_probs") -> dict[str, float]:
  """Floats in the mapping's own order: `find_best_thresh` breaks ties between equal
  probabilities by that order, as the official script does."""
  if not isinstance(na_probs, Mapping):
    raise ValueError(f"{source}: expected a JSON object mapping question id to no-answer "
                     f"probability, got {type(na_probs).__name__}.")
  checked = {}
  for qid, prob in na_probs.items():
    if (isinstance(prob, bool) or not isinstance(prob, numbers.Real) or
        math.isnan(float(prob))):
      raise ValueError(f"{source}: entry {qid!r}: the no-answer probability must be a number, "
                       f"got {squad.describe(prob)}.")
    checked[qid] = float(prob)
  return checked


def _warn_missing(qids: list[str], message: str) -> None:
  for qid in qids[:_MAX_NAMED_MISSING]:
    logging.warning(message, qid)
  if len(qids) > _MAX_NAMED_MISSING:
    logging.warning("... and %d more questions without a prediction.",
                    len(qids) - _MAX_NAMED_MISSING)


# -- SQuAD v1.1 ------------------------------------------------------------------------------------

def evaluate_v1(gold: Mapping[str, Sequence[str]],
                predictions: Mapping[str, str]) -> dict[str, float | int]:
  """Official v1.1 exact match and F1 (percentages): the best over each question's answers.

  Every question counts in `total`; one without a prediction scores 0 and is counted in
  `missing`. Predictions for questions not in `gold` are ignored.
  """
  _check_gold(gold)
  predictions = _check_predictions(predictions)
  if not gold:
    raise ValueError("no questions to score: the gold answers are empty.")
  unanswerable = [qid for qid, answers in gold.items() if not answers]
  if unanswerable:
    raise ValueError(f"{len(unanswerable)} questions have no gold answer (first: "
                     f"{unanswerable[0]!r}); SQuAD 1.1 needs at least one per question. "
                     "Score data with unanswerable questions as SQuAD 2.0.")
  exact_match = f1 = 0
  missing = []
  for qid, answers in gold.items():
    if qid not in predictions:
      missing.append(qid)
      continue
    prediction = predictions[qid]
    exact_match += max(exact_match_score_v1(prediction, a) for a in answers)
    f1 += max(f1_score_v1(prediction, a) for a in answers)
  _warn_missing(missing, "Unanswered question %s will receive score 0.")
  total = len(gold)
  return {"exact_match": 100.0 * exact_match / total, "f1": 100.0 * f1 / total,
          "total": total, "missing": len(missing)}


# -- SQuAD v2.0 ------------------------------------------------------------------------------------

def _scoring_answers(answers: Sequence[str]) -> list[str]:
  """Answers that survive normalisation, or the empty answer that stands for "no answer"."""
  kept = [a for a in answers if normalize_answer(a)]
  return kept or [""]


def _raw_scores(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str]
                ) -> tuple[dict[str, int], dict[str, float]]:
  """Exact and F1 per question that has a prediction, in the order of `gold`."""
  exact, f1, missing = {}, {}, []
  for qid, answers in gold.items():
    if qid not in predictions:
      missing.append(qid)
      continue
    golds = _scoring_answers(answers)
    exact[qid] = max(compute_exact(a, predictions[qid]) for a in golds)
    f1[qid] = max(compute_f1(a, predictions[qid]) for a in golds)
  _warn_missing(missing, "Missing prediction for %s; it is left out of the totals.")
  return exact, f1


def _apply_no_ans_threshold(scores: Mapping[str, float], na_probs: Mapping[str, float],
                            has_ans: Mapping[str, bool], na_prob_thresh: float
                            ) -> dict[str, float]:
  """Above the threshold the model says "no answer": right exactly when there is none."""
  return {qid: float(not has_ans[qid]) if na_probs[qid] > na_prob_thresh else score
          for qid, score in scores.items()}


def _eval_dict(exact: Mapping[str, float], f1: Mapping[str, float],
               qids: Sequence[str]) -> dict[str, float | int]:
  total = len(qids)
  return {"exact": 100.0 * sum(exact[k] for k in qids) / total,
          "f1": 100.0 * sum(f1[k] for k in qids) / total, "total": total}


def find_best_thresh(predictions: Mapping[str, str], scores: Mapping[str, float],
                     na_probs: Mapping[str, float], has_ans: Mapping[str, bool]
                     ) -> tuple[float, float]:
  """The no-answer threshold that maximises the score, and that score (a percentage).

  Starts from answering "no answer" everywhere, then lets through questions in ascending order
  of no-answer probability: an answerable one gains its raw score, an unanswerable one loses 1
  if the model gave a non-empty answer. Only strict improvements move the threshold, and equal
  probabilities keep the order of `na_probs`, both as in the official script. Counts and the
  denominator are over the scored questions (`scores`).
  """
  cur_score = sum(1 for qid in scores if not has_ans[qid])
  best_score, best_thresh = cur_score, 0.0
  for qid in sorted(na_probs, key=lambda k: na_probs[k]):
    if qid not in scores:
      continue
    if has_ans[qid]:
      diff = scores[qid]
    else:
      diff = -1 if predictions[qid] else 0
    cur_score += diff
    if cur_score > best_score:
      best_score, best_thresh = cur_score, na_probs[qid]
  return 100.0 * best_score / len(scores), best_thresh


def evaluate_v2(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
                na_probs: Mapping[str, float] | None = None,
                na_prob_thresh: float = 1.0) -> dict[str, float | int]:
  """Official v2.0 scores (percentages), with HasAns/NoAns breakdown and, given `na_probs`,
  the best no-answer thresholds.

  A question whose gold list is empty is unanswerable; its only right answer is the empty
  string. Questions without a prediction are left out of every total, as officially.
  """
  _check_gold(gold)
  predictions = _check_predictions(predictions)
  exact_raw, f1_raw = _raw_scores(gold, predictions)
  if not exact_raw:
    raise ValueError(f"none of the {len(gold)} questions has a prediction; wrong prediction "
                     "file or split?")
  if na_probs is None:
    probs = {qid: 0.0 for qid in predictions}
  else:
    probs = _check_na_probs(na_probs)
    absent = [qid for qid in exact_raw if qid not in probs]
    if absent:
      raise ValueError(f"na_probs has no entry for {len(absent)} answered questions (first: "
                       f"{absent[0]!r}).")
  has_ans = {qid: bool(answers) for qid, answers in gold.items()}
  exact = _apply_no_ans_threshold(exact_raw, probs, has_ans, na_prob_thresh)
  f1 = _apply_no_ans_threshold(f1_raw, probs, has_ans, na_prob_thresh)
  out = _eval_dict(exact, f1, list(exact))
  for prefix, wanted in (("HasAns", True), ("NoAns", False)):
    qids = [qid for qid in exact if has_ans[qid] == wanted]
    if qids:
      out.update({f"{prefix}_{k}": v for k, v in _eval_dict(exact, f1, qids).items()})
  if na_probs is not None:
    out["best_exact"], out["best_exact_thresh"] = find_best_thresh(
        predictions, exact_raw, probs, has_ans)
    out["best_f1"], out["best_f1_thresh"] = find_best_thresh(predictions, f1_raw, probs, has_ans)
  return out


def evaluate(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
             na_probs: Mapping[str, float] | None = None,
             version_2_with_negative: bool = False,
             na_prob_thresh: float = 1.0) -> dict[str, float | int]:
  """`evaluate_v2` for SQuAD 2.0 (`version_2_with_negative`), else `evaluate_v1`."""
  if version_2_with_negative:
    return evaluate_v2(gold, predictions, na_probs, na_prob_thresh)
  if na_probs is not None:
    raise ValueError("no-answer probabilities only apply to SQuAD 2.0 "
                     "(version_2_with_negative=True).")
  return evaluate_v1(gold, predictions)


# -- the official files ----------------------------------------------------------------------------

def gold_answers(data: list[dict], source: str = "dataset") -> dict[str, list[str]]:
  """question id -> raw answer texts in file order (empty: unanswerable), from the `data` list.

  Only ids and answer texts are read, as the official scripts do (through the one walk of the
  official layout, `squad.iter_questions`); `source` names the file in error messages.
  """
  gold = {}
  for where, _, _, qa in squad.iter_questions(data, source):
    answers = squad.require(qa, "answers", list, source, where)
    gold[qa["id"]] = [squad.require(answer, "text", str, source, f"{where}.answers[{m}]")
                      for m, answer in enumerate(answers)]
  return gold


def read_dataset(path: str) -> list[dict]:
  """The `data` list of an official SQuAD JSON file (local or `gs://`), checked throughout."""
  data = squad.dataset_articles(squad.load_json(path), path)
  gold_answers(data, source=path)
  return data


def is_squad_v2(data: list[dict]) -> bool:
  """Whether any question is unanswerable (`is_impossible`, or no answers at all), which only
  SQuAD 2.0 scoring can handle."""
  return any(qa.get("is_impossible") is True or not qa.get("answers")
             for _, _, _, qa in squad.iter_questions(data, "dataset"))


def read_predictions(path: str) -> dict[str, str]:
  """A prediction file as the official scripts read it: `{question id: answer text}`."""
  return _check_predictions(squad.load_json(path), source=path)


def read_na_probs(path: str) -> dict[str, float]:
  """A `{question id: no-answer probability}` file, in file order (ties keep it)."""
  return _check_na_probs(squad.load_json(path), source=path)


# -- command line ----------------------------------------------------------------------------------

def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog="python -m bert_jax.tasks.squad_eval",
      description="Official SQuAD v1.1 / v2.0 evaluation of a prediction file.")
  parser.add_argument("data_file", help="the dataset, official SQuAD JSON (local or gs://)")
  parser.add_argument("pred_file", help="predictions: JSON object of question id -> answer")
  parser.add_argument("--na_prob_file", "--na-prob-file", "-n",
                      help="JSON object of question id -> no-answer probability (SQuAD 2.0)")
  parser.add_argument("--na_prob_thresh", "--na-prob-thresh", "-t", type=float, default=1.0,
                      help="predict no answer where the probability exceeds this (default 1.0)")
  parser.add_argument("--out_file", "--out-file", "-o", help="also write the scores here as JSON")
  parser.add_argument("--version", choices=("auto", "1.1", "2.0"), default="auto",
                      help="auto: 2.0 if the data has unanswerable questions or --na_prob_file "
                           "is given, else 1.1")
  return parser.parse_args(argv)


def _choose_version(requested: str, data: list[dict], na_prob_file: str | None) -> str:
  if requested == "auto":
    return "2.0" if na_prob_file or is_squad_v2(data) else "1.1"
  if requested == "1.1" and na_prob_file:
    raise ValueError("--na_prob_file only applies to SQuAD 2.0; drop it or use --version 2.0.")
  return requested


def run(args: argparse.Namespace) -> dict[str, float | int]:
  data = read_dataset(args.data_file)
  predictions = read_predictions(args.pred_file)
  version = _choose_version(args.version, data, args.na_prob_file)
  na_probs = read_na_probs(args.na_prob_file) if args.na_prob_file else None
  return evaluate(gold_answers(data, source=args.data_file), predictions, na_probs,
                  version_2_with_negative=version == "2.0", na_prob_thresh=args.na_prob_thresh)


def main(argv: Sequence[str] | None = None) -> int:
  args = _parse_args(argv)
  try:
    result = run(args)
  except (ValueError, OSError) as e:
    print(f"squad_eval: error: {e}", file=sys.stderr)
    return 1
  text = json.dumps(result, indent=2)
  print(text)
  if args.out_file:
    file_io.write_bytes_atomic(args.out_file, (text + "\n").encode("utf-8"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
