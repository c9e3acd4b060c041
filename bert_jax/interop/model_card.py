"""The model card (`README.md`) of a Hugging Face export: what the model is, where it came from,
how it was trained and on what, how it scored, and how to run it — read from the run that made
it (a pre-training workdir's `config.json`, the records' `summary.json`, `metrics.jsonl`; a
fine-tuning output's `eval_results.json`), so that a directory pushed to a hub describes itself.
Only what the run recorded is written; a source without a run (a Hugging Face or TF1 model)
gets the model and its origin.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from bert_jax import file_io
from bert_jax.interop import task_heads
from bert_jax.model.configuration import BertConfig

CARD_NAME = "README.md"

_PIPELINES = {task_heads.SEQUENCE_CLASSIFICATION: "text-classification",
              task_heads.QUESTION_ANSWERING: "question-answering",
              task_heads.TOKEN_CLASSIFICATION: "token-classification",
              task_heads.MULTIPLE_CHOICE: "multiple-choice"}


def _read_json(path: str) -> Any:
  try:
    return json.loads(file_io.read_text(path)) if file_io.exists(path) else None
  except (ValueError, OSError):
    return None


def _last_eval(metrics_path: str) -> dict[str, float]:
  """The last `eval/*` values a run logged (its final evaluation)."""
  if not file_io.exists(metrics_path):
    return {}
  found: dict[str, float] = {}
  for line in file_io.read_text(metrics_path).splitlines():
    try:
      row = json.loads(line)
    except ValueError:
      continue
    if isinstance(row, dict) and any(str(k).startswith("eval/") for k in row):
      found = {k: v for k, v in row.items() if str(k).startswith("eval/")}
      found["step"] = row.get("step")
  return found


def run_directory(candidates: Sequence[str]) -> str | None:
  """The first of `candidates` that holds what a run of ours writes (its metrics, or a
  fine-tuning's results)."""
  for directory in candidates:
    if directory and any(file_io.exists(file_io.join(directory, name))
                         for name in ("metrics.jsonl", "eval_results.json")):
      return directory
  return None


def _recipe(run: dict) -> list[str]:
  """The run's recipe, from the fields its config.json holds."""
  model, data, opt = run.get("model", {}), run.get("data", {}), run.get("optimizer", {})
  lines = [f"- objective: {run.get('objective') or 'mlm_nsp'}"]
  if run.get("total_steps"):
    lines.append(f"- {run['total_steps']:,} steps of {run.get('global_batch_size')} sequences of "
                 f"up to {data.get('max_seq_length')} tokens"
                 + (", packed several to a row" if data.get("packing") else ""))
  if opt.get("learning_rate"):
    lines.append(f"- {opt.get('name') or 'adamw'}, learning rate {opt['learning_rate']}, "
                 f"{opt.get('warmup_steps')} warm-up steps, weight decay "
                 f"{opt.get('weight_decay')}")
  if data.get("masking_strategy"):
    lines.append(f"- masking: {data['masking_strategy']}"
                 + (", whole words" if data.get("whole_word_mask") else "")
                 + f", {data.get('max_predictions_per_seq')} predictions per sequence at most")
  if model.get("hidden_dropout_prob") is not None:
    lines.append(f"- dropout {model['hidden_dropout_prob']}")
  return lines


def _data(summary: dict) -> list[str]:
  keys = (("documents", "documents"), ("sentences", "sentences"), ("instances", "instances"),
          ("tokens", "tokens"), ("rows", "rows"), ("dupe_factor", "duplicates (dupe_factor)"),
          ("masking_strategy", "masking"), ("masked_fraction", "masked fraction"),
          ("sentence_objective", "sentence objective"),
          ("packing_efficiency", "packing efficiency"))
  return [f"- {label}: {summary[key]:,}" if isinstance(summary[key], int) else
          f"- {label}: {summary[key]}" for key, label in keys if summary.get(key) is not None]


def _evaluation(results: dict | None, last_eval: dict) -> list[str]:
  lines = []
  if results:
    for split, scores in results.items():
      if isinstance(scores, dict):
        shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in scores.items())
        lines.append(f"- {split}: {shown}")
  elif last_eval:
    step = last_eval.pop("step", None)
    shown = ", ".join(f"{k[5:]} {v:.4g}" for k, v in sorted(last_eval.items())
                      if isinstance(v, (int, float)))
    lines.append(f"- held-out records at step {step}: {shown}")
  return lines


def write(directory: str, config: BertConfig, architecture: str, source: str,
          head: task_heads.Head | None = None, run_dir: str | None = None,
          lower_case: bool | None = None) -> str:
  """Writes `directory/README.md`; returns its path."""
  run = (_read_json(file_io.join(run_dir, "config.json")) or {}) if run_dir else {}
  run = run if isinstance(run, dict) and "global_batch_size" in run else {}
  results = _read_json(file_io.join(run_dir, "eval_results.json")) if run_dir else None
  last_eval = _last_eval(file_io.join(run_dir, "metrics.jsonl")) if run_dir else {}
  summary = None
  train_files = run.get("data", {}).get("train_files")
  if train_files:
    summary = _read_json(file_io.join(os.path.dirname(str(train_files).split(",")[0]),
                                      "summary.json"))
  if head is not None:
    pipeline = _PIPELINES[head.name]
  elif architecture.endswith(("ForMaskedLM", "ForPreTraining")) and config.model_type != "electra":
    pipeline = "fill-mask"
  else:
    pipeline = "feature-extraction"
  casing = "" if lower_case is None else (", uncased" if lower_case else ", cased")
  lines = ["---", "library_name: transformers", f"pipeline_tag: {pipeline}",
           f"tags:\n- bert_jax\n- {config.model_type}", "---", "",
           f"# {os.path.basename(os.path.normpath(directory))}", "",
           f"`{architecture}`: a {config.model_type} encoder of {config.num_hidden_layers} "
           f"layers, hidden size {config.hidden_size}, {config.num_attention_heads} attention "
           f"heads, a vocabulary of {config.vocab_size:,}{casing}, inputs of up to "
           f"{config.max_position_embeddings - config.position_offset} tokens; exported by "
           f"bert_jax from {source}.", ""]
  if head is not None:
    lines += ["## Task", "", f"{head.name.replace('_', ' ')}"
              + (f"; outputs: {', '.join(head.labels)}" if head.labels else "")
              + (f" (task `{results['task']}`)" if results and results.get("task") else ""), ""]
  if run:
    lines += ["## Pre-training", ""] + _recipe(run) + [""]
  if summary:
    lines += ["## Data", "", "The records' summary (data_prep):", ""] + _data(summary) + [""]
  evaluation = _evaluation(results, last_eval)
  if evaluation:
    lines += ["## Evaluation", ""] + evaluation + [""]
  lines += ["## Use", "", "```python", "from transformers import pipeline", "",
            f'model = pipeline("{pipeline}", model="{directory}")', "```", ""]
  path = file_io.join(directory, CARD_NAME)
  file_io.write_text_atomic(path, "\n".join(lines))
  return path
