"""A GLUE-style fine-tuning run (the nine GLUE tasks and custom TSV tasks): examples → the
`SequenceClassification` plug-in of the training core (optionally taught by a fine-tuned
teacher) → the task's metrics per dev split and GLUE-server prediction files.

Init order (`training.init_order.initial_state`): the output directory's own checkpoint (a
resumed or finished run; without training, the fine-tuned model to evaluate), else the encoder
of `init_checkpoint` (our workdir, a Hugging Face directory or a TF1 checkpoint) with the head at
its initialisation, else from scratch (`bert_config_file`). Every training example is used each
epoch: the last partial batch is padded with weight-0 rows, as evaluation does, so a train set
smaller than one batch trains too.

With `packing` (off by default), several short examples share a row of `max_seq_length`
(`data/packed_examples.py`): each step still trains on `train_batch_size` examples in the
unpacked order, on fewer rows; evaluation and prediction pack too and cut the outputs back out
per example, so metrics and prediction files are read as unpacked ones are.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np

from bert_jax import file_io
from bert_jax.data import arrays
from bert_jax.interop import checkpoints
from bert_jax.runs import finetune_job
from bert_jax.tasks import distillation as task_distillation
from bert_jax.tasks import registry
from bert_jax.tasks.classification import data as glue
from bert_jax.tasks.classification import objective as sequence_classification
from bert_jax.training import metrics, workdir_lock

def read_examples(task, data_dir, split, data_format):
  if data_format == "auto":
    data_format = "tsv" if any(file_io.exists(file_io.join(data_dir, f"{s}.tsv"))
                               for s in ("train", "dev", "dev_matched", "test")) else "tfds"
  return task.read_tsv(data_dir, split) if data_format == "tsv" else task.read_tfds(data_dir,
                                                                                    split)


@workdir_lock.holding("config.output_dir")
def run(config: ml_collections.ConfigDict, tokenizer, task=None) -> dict[str, Any]:
  """Train / evaluate / predict the GLUE-style task of a fine-tuning config
  (`finetune_config`; `task`: a task object instead of `config.task_name`'s); returns the
  evaluation results (also in eval_results.json)."""
  task = task or task_from_config(config)
  data_dir, output_dir, data_format = config.data_dir, config.output_dir, config.data_format
  max_seq_length = registry.CLASSIFICATION.max_length(config.max_seq_length)
  train_batch_size = config.train_batch_size
  do_train, do_eval, do_predict = config.do_train, config.do_eval, config.do_predict
  job = finetune_job.setup(config, tokenizer, max_seq_length)
  objective = sequence_classification.SequenceClassification(
      task, max_seq_length, finetune_job.max_sequences_per_row(job.config, max_seq_length))
  teacher = job.config.get("teacher_checkpoint")
  if not teacher and not do_train:
    # A distilled student's checkpoint holds its teacher too: evaluated again, it is read
    # with the teacher it recorded.
    teacher = finetune_job.recorded(output_dir).get(task_distillation.RECORDED_TEACHER)
    if teacher:
      metrics.log(f"{output_dir} holds a student distilled from {teacher}: read with it")
  if teacher:  # taught by a fine-tuned teacher
    objective = task_distillation.TaskDistillation(
        objective, teacher, job.config.distill_temperature,
        job.config.distill_alpha).with_checkpoints(checkpoints)
  model = objective.model(job.bert_config)
  results: dict[str, Any] = {"task": task.name}
  evaluator = _evaluator(job, task, objective, tokenizer)
  train_examples = read_examples(task, data_dir, "train", data_format) if do_train else []
  num_steps = (finetune_job.num_train_steps(len(train_examples), train_batch_size,
                                            config.num_train_epochs) if do_train else 1)
  feats = None
  if do_train:
    feats = objective.featurize(train_examples, tokenizer)
    metrics.log(f"training: {len(train_examples)} examples, {num_steps} steps "
                f"({config.num_train_epochs} epochs of "
                f"{arrays.steps_per_epoch(len(train_examples), train_batch_size)}), "
                f"batch {train_batch_size}")
  state, result = finetune_job.fit(
      job, objective, model, tokenizer, feats=feats, num_steps=num_steps,
      header=f"{task.name} ({objective.num_labels} outputs)", results=results, metadata={
          "task": task.name, "num_labels": objective.num_labels,
          "max_seq_length": max_seq_length,
          "label_list": None if task.is_regression else list(task.label_list),
          # What the model reads, for `predict --input_file` (a label column is not a text_b).
          "sentence_pairs": any(e.text_b is not None for e in train_examples) if do_train
                            else None,
          **({task_distillation.RECORDED_TEACHER: teacher} if teacher else {})},
      evaluator=evaluator)
  if result is not None and result.stopped_early:
    return finetune_job.stopped(job, result, num_steps, results)

  if do_eval:
    for split in task.eval_splits:
      split_metrics, _ = evaluator(state, split)
      results[split] = split_metrics
      job.writer.write(int(state.step),
                       {f"eval_{split}/{k}": v for k, v in split_metrics.items()})
      metrics.log(f"eval {split}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float)
                                                else f"{k} {v}" for k, v in split_metrics.items()))
  if do_predict:
    for split, filename in task.predict_splits.items():
      _, predictions = evaluator(state, split)
      path = file_io.join(output_dir, filename)
      if jax.process_index() == 0:
        task.write_predictions(path, predictions)
      results.setdefault("prediction_files", []).append(path)
      metrics.log(f"wrote {len(predictions)} predictions to {path}")
  return finetune_job.finish(job, results)


def _evaluator(job, task, objective, tokenizer) -> finetune_job.Evaluator:
  """The fine-tuned model on a split: its predictions, and on a labelled (dev) split the task's
  metrics beside what always answering the most frequent label scores. A distilled run is
  evaluated as the student alone."""
  config = job.config
  params_of = None
  if isinstance(objective, task_distillation.TaskDistillation):
    objective, params_of = objective.student, objective.student_params
  featurized = {}

  def apply(predict, split):
    if split not in featurized:  # read and featurized once, however often it is scored
      featurized[split] = objective.featurize(
          read_examples(task, config.data_dir, split, config.data_format), tokenizer)
    feats = featurized[split]
    if split not in task.eval_splits:  # a test split: predictions only
      logits = predict(feats, config.predict_batch_size, desc=f"predict {split}")
      return None, sequence_classification.to_predictions(task, logits)
    logits = predict(feats, config.eval_batch_size, desc=f"eval {split}")
    predictions = sequence_classification.to_predictions(task, logits)
    split_metrics = task.compute_metrics(predictions, feats["label"])
    split_metrics["num_examples"] = len(feats["label"])
    if not task.is_regression:  # what always answering the most frequent label scores
      split_metrics["majority_class_accuracy"] = float(
          np.max(np.bincount(np.asarray(feats["label"], np.int64))) / max(len(feats["label"]),
                                                                          1))
    return split_metrics, predictions

  return finetune_job.Evaluator(job, objective, objective.model(job.bert_config), apply,
                                split=task.eval_splits[0], tag=f"eval_{task.eval_splits[0]}",
                                metric=task.main_metric, params_of=params_of)


def task_from_config(config: ml_collections.ConfigDict):
  """The GLUE / custom task a config names."""
  if config.task_name.lower() == "custom":
    return glue.CustomTsvTask(label_list=config.label_list, regression=config.regression,
                              text_a_column=config.text_a_column,
                              text_b_column=config.text_b_column,
                              label_column=config.label_column,
                              has_header=config.get("has_header", "auto"))
  try:
    return glue.get_task(config.task_name)
  except ValueError:
    raise ValueError(f"--task_name={config.task_name!r} is not a task: expected "
                     f"{registry.all_names()}.") from None
