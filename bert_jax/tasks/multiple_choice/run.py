"""A multiple-choice fine-tuning run (SWAG, HellaSwag): examples → (context, ending) pairs →
the `MultipleChoice` plug-in of the training core → accuracy and a prediction file.

The paper's SWAG setting (Section 4.4): four pairs per example (the given sentence, and the
start of the next one followed by each ending), one score per pair from the pooled [CLS],
softmax over the four; 3 epochs, learning rate 2e-5, batch 16 (`configs/swag.py`).

Files written to `output_dir`: `eval_results.json` (accuracy per split beside chance and what
always picking the most frequent answer position scores), `<split>_predictions.csv` (per
example its predicted ending and every ending's probability), `<task>_test_submission.csv` (the
test predictions in the form the task's leaderboard reads), beside the checkpoint, its config
and vocabulary.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np

from bert_jax import file_io, inference
from bert_jax.runs import finetune_job
from bert_jax.tasks import registry
from bert_jax.tasks.multiple_choice import objective as multiple_choice
from bert_jax.tasks.multiple_choice import data as swag
from bert_jax.training import metrics, workdir_lock

_PREDICTION_FILES = {"dev": "dev_predictions.csv", "test": "test_predictions.csv"}


def _num_choices(examples, source: str) -> int:
  counts = {len(e.endings) for e in examples}
  if len(counts) != 1:
    raise ValueError(f"{source}: examples have {sorted(counts)} endings; one task has one "
                     "number of endings.")
  return counts.pop()


@workdir_lock.holding("config.output_dir")
def run(config: ml_collections.ConfigDict, tokenizer) -> dict[str, Any]:
  """Train on the train split of a fine-tuning config's task (`finetune_config`), score dev
  (`do_eval`) and predict test (`do_predict`; scored when it has labels); returns the results
  (also in eval_results.json)."""
  finetune_job.refuse_what_the_kind_lacks(
      config, "multiple choice", "the task's files: swag's train.csv/val.csv/test.csv or "
      "hellaswag's *.jsonl", ", not multiple choice")
  task_name, data_dir, output_dir = config.task_name.lower(), config.data_dir, config.output_dir
  max_seq_length = registry.MULTIPLE_CHOICE.max_length(config.max_seq_length)
  do_train = config.do_train
  job = finetune_job.setup(config, tokenizer, max_seq_length)
  results: dict[str, Any] = {"task": task_name}
  train_examples, num_choices = None, None
  if do_train:
    train_examples, source = swag.read_split(task_name, data_dir, "train")
    num_choices = _num_choices(train_examples, source)
  else:  # the fine-tuned model's own number of endings, else the task's
    num_choices = int(finetune_job.recorded(output_dir).get("num_choices") or 4)
  objective = multiple_choice.MultipleChoice(num_choices, max_seq_length, task_name)
  model = objective.model(job.bert_config)
  feats, num_steps = None, 1
  if do_train:
    feats = swag.featurize(train_examples, tokenizer, max_seq_length)
    num_steps = finetune_job.num_train_steps(len(train_examples), config.train_batch_size,
                                             config.num_train_epochs)
    metrics.log(f"training: {len(train_examples)} examples of {num_choices} endings from "
                f"{source}, {num_steps} steps of {config.train_batch_size}")
  featurized = {}

  def apply(predict, split):
    """Each example's probability per ending, and the accuracy where the split has answers."""
    if split not in featurized:  # read and featurized once, however often it is scored
      examples, source = swag.read_split(task_name, data_dir, split)
      if _num_choices(examples, source) != num_choices:
        raise ValueError(f"{source}: {_num_choices(examples, source)} endings per example, "
                         f"but the model chooses among {num_choices}.")
      featurized[split] = examples, source, swag.featurize(examples, tokenizer, max_seq_length)
    examples, _, split_feats = featurized[split]
    batch_size = config.eval_batch_size if split == "dev" else config.predict_batch_size
    probabilities = inference.softmax(predict(split_feats, batch_size,
                                              desc=f"{split} choices"))
    if not all(e.label is not None for e in examples):
      return None, probabilities
    gold = np.asarray([e.label for e in examples])
    return {"accuracy": swag.accuracy(np.argmax(probabilities, axis=-1), gold),
            "num_examples": len(examples), "chance_accuracy": 1.0 / num_choices,
            # What always answering the most frequent right position scores.
            "majority_position_accuracy": float(np.max(np.bincount(gold)) / len(gold))
            }, probabilities

  evaluator = finetune_job.Evaluator(job, objective, model, apply, split="dev", tag="eval_dev",
                                     metric="accuracy")
  state, result = finetune_job.fit(
      job, objective, model, tokenizer, feats=feats, num_steps=num_steps,
      header=f"{task_name} ({num_choices} endings)", results=results,
      metadata={"task": task_name, "num_choices": num_choices,
                "max_seq_length": max_seq_length}, evaluator=evaluator)
  if result is not None and result.stopped_early:
    return finetune_job.stopped(job, result, num_steps, results)

  for split in [s for s, wanted in (("dev", config.do_eval), ("test", config.do_predict))
                if wanted]:
    split_metrics, probabilities = evaluator(state, split)
    examples, source, _ = featurized[split]
    path = file_io.join(output_dir, _PREDICTION_FILES[split])
    paths = [path]
    if split == "test":  # also in the form the task's leaderboard reads
      paths.append(file_io.join(output_dir, f"{task_name}_test_submission.csv"))
    if jax.process_index() == 0:
      swag.write_predictions(path, examples, probabilities)
      if split == "test":
        swag.write_submission(paths[1], task_name, probabilities)
    results.setdefault("prediction_files", []).extend(paths)
    metrics.log(f"wrote predictions for {len(examples)} examples of {source} to {path}")
    if split_metrics is not None:
      results[split] = split_metrics
      job.writer.write(int(state.step), {f"eval_{split}/{k}": v
                                         for k, v in split_metrics.items()})
      metrics.log(f"{split}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in split_metrics.items()))
  return finetune_job.finish(job, results)
