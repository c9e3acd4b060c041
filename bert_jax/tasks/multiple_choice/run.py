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
from bert_jax.runs import finetune_config, finetune_job
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


@workdir_lock.holding("output_dir")
def run_multiple_choice(*, task_name: str = "swag", data_dir: str, tokenizer,
                        init_checkpoint: str | None, output_dir: str,
                        bert_config_file: str | None = None, max_seq_length: int = 128,
                        train_batch_size: int = 16, eval_batch_size: int = 8,
                        predict_batch_size: int = 8, learning_rate: float = 2e-5,
                        num_train_epochs: float = 3.0, warmup_proportion: float = 0.1,
                        do_train: bool = False, do_eval: bool = False, do_predict: bool = False,
                        seed: int = 12345,
                        config: ml_collections.ConfigDict | None = None) -> dict[str, Any]:
  """Train on the train split, score dev (`do_eval`) and predict test (`do_predict`; scored
  when it has labels); returns the results (also in eval_results.json)."""
  config = config or finetune_config.get_config()
  if config.get("packing"):
    raise ValueError("--packing is for GLUE-style tasks and SQuAD, not multiple choice.")
  if config.get("teacher_checkpoint"):
    raise ValueError("--teacher_checkpoint: task-time distillation is for GLUE-style "
                     "classification and regression tasks, not multiple choice.")
  job = finetune_job.setup(config, output_dir, tokenizer, init_checkpoint, bert_config_file,
                           max_seq_length, {"train_batch_size": train_batch_size,
                                            "eval_batch_size": eval_batch_size,
                                            "predict_batch_size": predict_batch_size})
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
    num_steps = finetune_job.num_train_steps(len(train_examples), train_batch_size,
                                             num_train_epochs)
    metrics.log(f"training: {len(train_examples)} examples of {num_choices} endings from "
                f"{source}, {num_steps} steps of {train_batch_size}")
  state, init, result = finetune_job.fit(
      job, objective, model, tokenizer, feats=feats, num_steps=num_steps,
      batch_size=train_batch_size, learning_rate=learning_rate,
      warmup_proportion=warmup_proportion, seed=seed, init_checkpoint=init_checkpoint,
      bert_config_file=bert_config_file, header=f"{task_name} ({num_choices} endings)",
      results=results, metadata={"task": task_name, "num_choices": num_choices,
                                 "max_seq_length": max_seq_length})
  if result is not None and result.stopped_early:
    return finetune_job.stopped(job, result, num_steps, results)

  predictor = finetune_job.make_predictor(job, objective, model, init)
  for split in [s for s, wanted in (("dev", do_eval), ("test", do_predict)) if wanted]:
    examples, source = swag.read_split(task_name, data_dir, split)
    if _num_choices(examples, source) != num_choices:
      raise ValueError(f"{source}: {_num_choices(examples, source)} endings per example, but "
                       f"the model chooses among {num_choices}.")
    split_feats = swag.featurize(examples, tokenizer, max_seq_length)
    batch_size = eval_batch_size if split == "dev" else predict_batch_size
    probabilities = inference.softmax(finetune_job.predict(predictor, objective, state.params,
                                                 split_feats, batch_size,
                                                 desc=f"{split} choices"))
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
    if all(e.label is not None for e in examples):
      gold = np.asarray([e.label for e in examples])
      split_metrics = {
          "accuracy": swag.accuracy(np.argmax(probabilities, axis=-1), gold),
          "num_examples": len(examples), "chance_accuracy": 1.0 / num_choices,
          # What always answering the most frequent right position scores.
          "majority_position_accuracy": float(np.max(np.bincount(gold)) / len(gold))}
      results[split] = split_metrics
      job.writer.write(int(state.step), {f"eval_{split}/{k}": v
                                         for k, v in split_metrics.items()})
      metrics.log(f"{split}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in split_metrics.items()))
  return finetune_job.finish(job, results)


def run_from_config(config: ml_collections.ConfigDict, tokenizer) -> dict[str, Any]:
  """The run a config describes (`registry.run_from_config` dispatches here)."""
  if not config.data_dir:
    raise ValueError(f"--task_name={config.task_name} needs --data_dir (the task's files, or a "
                     "prepared tensorflow-datasets directory for conll2003).")
  return run_multiple_choice(
      task_name=config.task_name.lower(), data_dir=config.data_dir,
      tokenizer=tokenizer, init_checkpoint=config.init_checkpoint, output_dir=config.output_dir,
      bert_config_file=config.bert_config_file,
      max_seq_length=registry.MULTIPLE_CHOICE.max_length(config.max_seq_length),
      train_batch_size=config.train_batch_size, eval_batch_size=config.eval_batch_size,
      predict_batch_size=config.predict_batch_size, learning_rate=config.learning_rate,
      num_train_epochs=config.num_train_epochs, warmup_proportion=config.warmup_proportion,
      do_train=config.do_train, do_eval=config.do_eval, do_predict=config.do_predict,
      seed=config.seed, config=config)
