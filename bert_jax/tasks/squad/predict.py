"""A fine-tuned SQuAD model answering new questions (`predict --mode=qa`): the windows, logits
and answer selection are fine-tuning's own, so a SQuAD file gets exactly the answers of
fine-tuning's predictions.json; a SQuAD 2.0 model also decides whether there is an answer."""

from __future__ import annotations

import math
from typing import Any, Sequence

from bert_jax.model import heads
from bert_jax.tasks.finetuned import (CheckpointInfo, FinetunedModel, PredictError, check_length,
                                      run_model)
from bert_jax.tasks.squad import data as squad
from bert_jax.tasks.squad import objective as question_answering
from bert_jax.text import tokenization

# Candidates per question that post-processing searches and keeps: fine-tuning's --n_best_size
# default, so that the answer (and its probability) is the one in fine-tuning's files however
# few candidates are shown.
_SQUAD_CANDIDATES = 20


def head(info: CheckpointInfo) -> str:
  del info  # every SQuAD model's head is the same scope
  return question_answering.SquadSpans.head_scopes[0]


def model(info: CheckpointInfo, config, params) -> heads.BertForQuestionAnswering:
  del info, params
  return heads.BertForQuestionAnswering(config)


def question_examples(questions: Sequence[str], context: str) -> list[Any]:
  """SQuAD examples for questions about one context (ids q1, q2, ...)."""
  if not context.strip():
    raise PredictError("The context is empty.")
  return [squad.SquadExample(f"q{i + 1}", q, context, [], where=f"--question #{i + 1}")
          for i, q in enumerate(questions)]


def answer_questions(model: FinetunedModel, tokenizer: tokenization.Tokenizer,
                     examples: Sequence[Any], *, max_seq_length: int = 384,
                     doc_stride: int = 128, max_query_length: int = 64,
                     max_answer_length: int = 30, n_best: int = 5,
                     null_score_diff_threshold: float = 0.0,
                     batch_size: int = 32) -> list[dict[str, Any]]:
  """Per question: `answer` ("" when a SQuAD 2.0 model says there is none), its `probability`,
  the `n_best` best candidates, and for SQuAD 2.0 `null_score_diff` (null score − best span
  score; above `null_score_diff_threshold` means no answer). Windows, logits and selection are
  fine-tuning's own (`squad.convert_examples_to_features`, `squad.postprocess`)."""
  check_length(max_seq_length, model.config)
  try:
    features = squad.convert_examples_to_features(
        examples, tokenizer, max_seq_length=max_seq_length, doc_stride=doc_stride,
        max_query_length=max_query_length, is_training=False)
  except ValueError as e:
    raise PredictError(str(e)) from e
  # No length trimming, as in fine-tuning: the logits are then exactly fine-tuning's.
  start_logits, end_logits = run_model(model.module, model.params, features.arrays, batch_size,
                                       trim=False, desc="answer")
  version_2 = model.version_2_with_negative
  predictions, nbest, null_odds = squad.postprocess(
      examples, features, start_logits, end_logits,
      n_best_size=max(n_best, _SQUAD_CANDIDATES), max_answer_length=max_answer_length,
      version_2_with_negative=version_2, null_score_diff_threshold=null_score_diff_threshold)
  results = []
  for example in examples:
    answer = predictions[example.qas_id]
    candidates = nbest[example.qas_id]
    out = {"id": example.qas_id, "question": example.question, "answer": answer,
           "probability": next(c["probability"] for c in candidates if c["text"] == answer),
           "n_best": candidates[:n_best]}
    if version_2:
      diff = null_odds[example.qas_id]
      out["null_score_diff"] = diff if math.isfinite(diff) else 1e30
      out["has_answer"] = bool(answer)
    results.append(out)
  return results


def format_answer(result: dict[str, Any], threshold: float = 0.0) -> str:
  lines = [f"[{result['id']}] {result['question']}"]
  shown = result["answer"] if result["answer"] else "(no answer)"
  lines.append(f"  answer: {shown} ({result['probability']:.1%})")
  if "null_score_diff" in result:
    diff = result["null_score_diff"]
    relation = ">" if diff > threshold else "<="
    lines.append(f"  null score - best span score = {diff:.3f} {relation} threshold "
                 f"{threshold:g}: {'answerable' if result['has_answer'] else 'no answer'}")
  for i, candidate in enumerate(result["n_best"], 1):
    lines.append(f"  {i}. {candidate['text'] or '(no answer)'}  {candidate['probability']:.1%}")
  return "\n".join(lines)
