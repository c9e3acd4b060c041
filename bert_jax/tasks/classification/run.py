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
from bert_jax.runs import finetune_config, finetune_job
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


@workdir_lock.holding("output_dir")
def run(task, *, data_dir: str, tokenizer, init_checkpoint: str | None, output_dir: str,
        bert_config_file: str | None = None, max_seq_length: int = 128,
        train_batch_size: int = 32, eval_batch_size: int = 8, predict_batch_size: int = 8,
        learning_rate: float = 5e-5, num_train_epochs: float = 3.0,
        warmup_proportion: float = 0.1, do_train: bool = False, do_eval: bool = False,
        do_predict: bool = False, seed: int = 12345, data_format: str = "auto",
        config: ml_collections.ConfigDict | None = None) -> dict[str, Any]:
  """Train / evaluate / predict a GLUE-style task; returns the evaluation results (also in
  eval_results.json)."""
  job = finetune_job.setup(config or finetune_config.get_config(), output_dir, tokenizer,
                           init_checkpoint, bert_config_file, max_seq_length,
                           {"train_batch_size": train_batch_size,
                            "eval_batch_size": eval_batch_size,
                            "predict_batch_size": predict_batch_size})
  objective = sequence_classification.SequenceClassification(
      task, max_seq_length, finetune_job.max_sequences_per_row(job.config, max_seq_length))
  if job.config.get("teacher_checkpoint"):  # taught by a fine-tuned teacher
    objective = task_distillation.TaskDistillation(
        objective, job.config.teacher_checkpoint, job.config.distill_temperature,
        job.config.distill_alpha).with_checkpoints(checkpoints)
  model = objective.model(job.bert_config)
  results: dict[str, Any] = {"task": task.name}
  train_examples = read_examples(task, data_dir, "train", data_format) if do_train else []
  num_steps = (finetune_job.num_train_steps(len(train_examples), train_batch_size,
                                            num_train_epochs) if do_train else 1)
  feats = None
  if do_train:
    feats = objective.featurize(train_examples, tokenizer)
    metrics.log(f"training: {len(train_examples)} examples, {num_steps} steps "
                f"({num_train_epochs} epochs of "
                f"{arrays.steps_per_epoch(len(train_examples), train_batch_size)}), "
                f"batch {train_batch_size}")
  state, init, result = finetune_job.fit(
      job, objective, model, tokenizer, feats=feats, num_steps=num_steps,
      batch_size=train_batch_size, learning_rate=learning_rate,
      warmup_proportion=warmup_proportion, seed=seed, init_checkpoint=init_checkpoint,
      bert_config_file=bert_config_file, header=f"{task.name} ({objective.num_labels} outputs)",
      results=results, metadata={
          "task": task.name, "num_labels": objective.num_labels,
          "max_seq_length": max_seq_length,
          "label_list": None if task.is_regression else list(task.label_list)})
  if result is not None and result.stopped_early:
    return finetune_job.stopped(job, result, num_steps, results)

  if isinstance(objective, task_distillation.TaskDistillation):  # the student alone from here
    objective, state, init = task_distillation.student_view(objective, state, init)
    model = objective.model(job.bert_config)
  predictor = finetune_job.make_predictor(job, objective, model, init)
  if do_eval:
    for split in task.eval_splits:
      examples = read_examples(task, data_dir, split, data_format)
      feats = objective.featurize(examples, tokenizer)
      logits = finetune_job.predict(predictor, objective, state.params, feats, eval_batch_size,
                                    desc=f"eval {split}")
      preds = sequence_classification.to_predictions(task, logits)
      split_metrics = task.compute_metrics(preds, feats["label"])
      split_metrics["num_examples"] = len(examples)
      if not task.is_regression:  # what always answering the most frequent label scores
        split_metrics["majority_class_accuracy"] = float(
            np.max(np.bincount(np.asarray(feats["label"], np.int64))) / max(len(examples), 1))
      results[split] = split_metrics
      job.writer.write(int(state.step),
                       {f"eval_{split}/{k}": v for k, v in split_metrics.items()})
      metrics.log(f"eval {split}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float)
                                                else f"{k} {v}" for k, v in split_metrics.items()))
  if do_predict:
    for split, filename in task.predict_splits.items():
      examples = read_examples(task, data_dir, split, data_format)
      feats = objective.featurize(examples, tokenizer)
      logits = finetune_job.predict(predictor, objective, state.params, feats, predict_batch_size,
                                    desc=f"predict {split}")
      path = file_io.join(output_dir, filename)
      if jax.process_index() == 0:
        task.write_predictions(path, sequence_classification.to_predictions(task, logits))
      results.setdefault("prediction_files", []).append(path)
      metrics.log(f"wrote {len(examples)} predictions to {path}")
  return finetune_job.finish(job, results)


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


def run_from_config(config: ml_collections.ConfigDict, tokenizer) -> dict[str, Any]:
  """The run a config describes (`registry.run_from_config` dispatches here)."""
  return run(task_from_config(config), data_dir=config.data_dir, tokenizer=tokenizer,
             init_checkpoint=config.init_checkpoint, output_dir=config.output_dir,
             bert_config_file=config.bert_config_file,
             max_seq_length=registry.CLASSIFICATION.max_length(config.max_seq_length),
             train_batch_size=config.train_batch_size, eval_batch_size=config.eval_batch_size,
             predict_batch_size=config.predict_batch_size, learning_rate=config.learning_rate,
             num_train_epochs=config.num_train_epochs,
             warmup_proportion=config.warmup_proportion, do_train=config.do_train,
             do_eval=config.do_eval, do_predict=config.do_predict, seed=config.seed,
             data_format=config.data_format, config=config)
