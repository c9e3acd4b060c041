"""A fine-tuning run: a task's examples → its plug-in of the training core → evaluation and
prediction files. One path for every task; GLUE-style classification (`run`) and SQuAD spans
(`run_squad`) differ only in how they read, score and write.

Init order (`interop.checkpoints.initial_state`): the output directory's own checkpoint (a
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
from bert_jax.runs import finetune_config, finetune_job, multiple_choice, tagging
from bert_jax.tasks import distillation as task_distillation
from bert_jax.tasks import glue, question_answering, sequence_classification
from bert_jax.training import metrics, workdir_lock

get_config = finetune_config.get_config
num_train_steps = finetune_job.num_train_steps
max_sequences_per_row = finetune_job.max_sequences_per_row


# ------------------------------------------------------------------------------------ GLUE
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
  job = finetune_job.setup(config or get_config(), output_dir, tokenizer, init_checkpoint,
                           bert_config_file, max_seq_length,
                           {"train_batch_size": train_batch_size,
                            "eval_batch_size": eval_batch_size,
                            "predict_batch_size": predict_batch_size})
  objective = sequence_classification.SequenceClassification(
      task, max_seq_length, max_sequences_per_row(job.config, max_seq_length))
  if job.config.get("teacher_checkpoint"):  # taught by a fine-tuned teacher
    objective = task_distillation.TaskDistillation(
        objective, job.config.teacher_checkpoint, job.config.distill_temperature,
        job.config.distill_alpha).with_checkpoints(checkpoints)
  model = objective.model(job.bert_config)
  results: dict[str, Any] = {"task": task.name}
  train_examples = read_examples(task, data_dir, "train", data_format) if do_train else []
  num_steps = (num_train_steps(len(train_examples), train_batch_size, num_train_epochs)
               if do_train else 1)
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


# ----------------------------------------------------------------------------------- SQuAD
def _squad_examples(path: str | None, data_dir: str | None, split: str, version_2: bool):
  from bert_jax.tasks import squad  # pylint: disable=g-import-not-at-top
  if path:
    return squad.read_squad_json(path), path
  if not data_dir:
    raise ValueError(f"Give --{'train' if split == 'train' else 'predict'}_file (official "
                     "SQuAD JSON) or --data_dir (a prepared tensorflow-datasets directory).")
  return (squad.read_squad_tfds(data_dir, split, version_2),
          f"tfds squad/{'v2.0' if version_2 else 'v1.1'}[{split}]")


@workdir_lock.holding("output_dir")
def run_squad(*, tokenizer, init_checkpoint: str | None, output_dir: str,
              train_file: str | None = None, predict_file: str | None = None,
              data_dir: str | None = None, version_2_with_negative: bool = False,
              bert_config_file: str | None = None, max_seq_length: int = 384,
              doc_stride: int = 128, max_query_length: int = 64, train_batch_size: int = 32,
              predict_batch_size: int = 8, learning_rate: float = 5e-5,
              num_train_epochs: float = 3.0, warmup_proportion: float = 0.1,
              n_best_size: int = 20, max_answer_length: int = 30,
              null_score_diff_threshold: float = 0.0, do_train: bool = False,
              do_predict: bool = False, seed: int = 12345,
              config: ml_collections.ConfigDict | None = None) -> dict[str, Any]:
  """SQuAD v1.1 / v2.0 as the original `run_squad.py`: train on `train_file`, write
  predictions.json / nbest_predictions.json / null_odds.json for `predict_file`, and, where the
  file has gold answers (a dev set), the official metrics in eval_results.json."""
  from bert_jax.tasks import squad, squad_eval  # pylint: disable=g-import-not-at-top
  job = finetune_job.setup(config or get_config(), output_dir, tokenizer, init_checkpoint,
                           bert_config_file, max_seq_length,
                           {"train_batch_size": train_batch_size,
                            "predict_batch_size": predict_batch_size})
  objective = question_answering.SquadSpans(
      max_seq_length, version_2_with_negative, max_sequences_per_row(job.config, max_seq_length))
  model = objective.model(job.bert_config)
  version = "v2.0" if version_2_with_negative else "v1.1"
  results: dict[str, Any] = {"task": f"squad {version}"}
  window = {"max_seq_length": max_seq_length, "doc_stride": doc_stride,
            "max_query_length": max_query_length}

  feats = None
  if do_train:
    examples, source = _squad_examples(train_file, data_dir, "train", version_2_with_negative)
    if not version_2_with_negative and any(e.is_impossible for e in examples):
      raise ValueError(f"{source} has unanswerable questions (is_impossible): SQuAD 2.0 "
                       "needs --version_2_with_negative.")
    features = squad.convert_examples_to_features(examples, tokenizer, is_training=True,
                                                  **window)
    feats = features.arrays
    num_steps = num_train_steps(len(feats["weight"]), train_batch_size, num_train_epochs)
    results["train_features"] = features.report
    metrics.log(f"training: {len(examples)} questions from {source} → {len(feats['weight'])} "
                f"windows ({features.report.get('answers_not_found', 0)} answers not found in "
                f"their context, {features.report.get('answers_repaired', 0)} repaired), "
                f"{num_steps} steps of {train_batch_size}")
  else:
    num_steps = 1
  state, init, result = finetune_job.fit(
      job, objective, model, tokenizer, feats=feats, num_steps=num_steps,
      batch_size=train_batch_size, learning_rate=learning_rate,
      warmup_proportion=warmup_proportion, seed=seed, init_checkpoint=init_checkpoint,
      bert_config_file=bert_config_file, header=f"SQuAD {version}", results=results,
      metadata={"task": f"squad {version}", **window})
  if result is not None and result.stopped_early:
    return finetune_job.stopped(job, result, num_steps, results)

  if do_predict:
    examples, source = _squad_examples(predict_file, data_dir, "validation",
                                       version_2_with_negative)
    features = squad.convert_examples_to_features(examples, tokenizer, is_training=False,
                                                  **window)
    # Untrimmed: outputs with a sequence axis are joined across batches.
    start_logits, end_logits = finetune_job.predict(
        finetune_job.make_predictor(job, objective, model, init), objective, state.params,
        features.arrays, predict_batch_size, desc="predict SQuAD", trim=False)
    predictions, nbest, null_odds = squad.postprocess(
        examples, features, start_logits, end_logits, n_best_size=n_best_size,
        max_answer_length=max_answer_length, version_2_with_negative=version_2_with_negative,
        null_score_diff_threshold=null_score_diff_threshold)
    if jax.process_index() == 0:
      results["prediction_files"] = squad.write_prediction_files(
          output_dir, predictions, nbest, null_odds if version_2_with_negative else None)
    metrics.log(f"wrote predictions for {len(examples)} questions of {source} "
                f"({len(features.example_index)} windows) to {output_dir}")
    gold = squad.gold_answers(examples)
    if any(gold.values()):  # a dev set: score it as the official script would
      scores = squad_eval.evaluate(gold, predictions,
                                   na_probs=null_odds if version_2_with_negative else None,
                                   version_2_with_negative=version_2_with_negative)
      results["eval"] = scores
      job.writer.write(int(state.step), {f"eval/{k}": v for k, v in scores.items()
                                         if isinstance(v, (int, float))})
      metrics.log("eval: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                        for k, v in scores.items()))
  return finetune_job.finish(job, results)


# SQuAD task names → version 2.0 or not (None: --version_2_with_negative decides).
SQUAD_TASKS = {"squad": None, "squad_v1": False, "squad_v1.1": False, "squad_v2": True,
               "squad_v2.0": True, "squad2": True}


def task_from_config(config: ml_collections.ConfigDict):
  """The GLUE / custom task a config names (SQuAD names are handled by the caller)."""
  if config.task_name.lower() == "custom":
    return glue.CustomTsvTask(label_list=config.label_list, regression=config.regression,
                              text_a_column=config.text_a_column,
                              text_b_column=config.text_b_column,
                              label_column=config.label_column,
                              has_header=config.get("has_header", "auto"))
  try:
    return glue.get_task(config.task_name)
  except ValueError:
    raise ValueError(
        f"--task_name={config.task_name!r} is not a task: expected a GLUE task "
        f"({', '.join(glue.GLUE_TASKS)}), SQuAD ({', '.join(SQUAD_TASKS)}), tagging "
        "(conll2003, or tagging with --label_list), multiple choice (swag, hellaswag), or "
        "'custom' (your own TSV files, with --label_list or --regression).") from None


def check_config(config: ml_collections.ConfigDict) -> None:
  """Refuses fine-tuning settings that cannot work, naming the flag, before any data is read."""
  for name in ("train_batch_size", "eval_batch_size", "predict_batch_size", "learning_rate",
               "num_train_epochs"):
    value = config.get(name)
    if value is not None and value <= 0:
      raise ValueError(f"--{name}={value}: must be positive.")
  if config.max_seq_length is not None and config.max_seq_length < 8:
    raise ValueError(f"--max_seq_length={config.max_seq_length}: too short for any input "
                     "(the original uses 128, SQuAD 384).")
  if not 0.0 <= config.warmup_proportion <= 1.0:
    raise ValueError(f"--warmup_proportion={config.warmup_proportion}: must lie in [0, 1].")
  if config.init_checkpoint is not None and not str(config.init_checkpoint).strip() and \
      config.do_train:
    raise ValueError("--init_checkpoint is empty: name the pre-trained model (a pre-training "
                     "workdir, a Hugging Face directory or a TF1 bert_model.ckpt), or leave the "
                     "flag out to train from random weights.")


def run_from_config(config: ml_collections.ConfigDict, tokenizer) -> dict[str, Any]:
  """Every fine-tuning run a config describes (what `python -m bert_jax.finetune` calls)."""
  check_config(config)
  task_name = config.task_name.lower()
  common = dict(data_dir=config.data_dir, tokenizer=tokenizer,
                init_checkpoint=config.init_checkpoint, output_dir=config.output_dir,
                bert_config_file=config.bert_config_file,
                max_seq_length=config.max_seq_length or 128,
                train_batch_size=config.train_batch_size, eval_batch_size=config.eval_batch_size,
                predict_batch_size=config.predict_batch_size,
                learning_rate=config.learning_rate, num_train_epochs=config.num_train_epochs,
                warmup_proportion=config.warmup_proportion, do_train=config.do_train,
                do_eval=config.do_eval, do_predict=config.do_predict, seed=config.seed,
                config=config)
  if task_name in tagging.TAGGING_TASKS + multiple_choice.CHOICE_TASKS and not config.data_dir:
    raise ValueError(f"--task_name={config.task_name} needs --data_dir (the task's files, or a "
                     "prepared tensorflow-datasets directory for conll2003).")
  if task_name in tagging.TAGGING_TASKS:
    return tagging.run_tagging(task_name=task_name, label_list=config.label_list,
                               data_format=config.data_format, **common)
  if task_name in multiple_choice.CHOICE_TASKS:
    return multiple_choice.run_multiple_choice(task_name=task_name, **common)
  squad_version = SQUAD_TASKS.get(config.task_name.lower(), "not squad")
  if squad_version != "not squad":
    if squad_version is False and config.version_2_with_negative:
      raise ValueError(f"--task_name={config.task_name} is SQuAD 1.1; drop "
                       "--version_2_with_negative or use --task_name=squad_v2.")
    do_predict = config.do_predict or config.do_eval
    if config.get("teacher_checkpoint"):
      raise ValueError("--teacher_checkpoint: task-time distillation is for GLUE-style "
                       "classification and regression tasks, not SQuAD.")
    if config.do_train and not (config.train_file or config.data_dir):
      raise ValueError("--do_train needs --train_file (or a tfds --data_dir).")
    if do_predict and not (config.predict_file or config.data_dir):
      raise ValueError("--do_predict needs --predict_file (or a tfds --data_dir).")
    return run_squad(
        tokenizer=tokenizer, init_checkpoint=config.init_checkpoint,
        output_dir=config.output_dir, train_file=config.train_file,
        predict_file=config.predict_file, data_dir=config.data_dir,
        version_2_with_negative=bool(squad_version or config.version_2_with_negative),
        bert_config_file=config.bert_config_file, max_seq_length=config.max_seq_length or 384,
        doc_stride=config.doc_stride, max_query_length=config.max_query_length,
        train_batch_size=config.train_batch_size, predict_batch_size=config.predict_batch_size,
        learning_rate=config.learning_rate, num_train_epochs=config.num_train_epochs,
        warmup_proportion=config.warmup_proportion, n_best_size=config.n_best_size,
        max_answer_length=config.max_answer_length,
        null_score_diff_threshold=config.null_score_diff_threshold, do_train=config.do_train,
        do_predict=do_predict, seed=config.seed, config=config)
  return run(task_from_config(config), data_dir=config.data_dir, tokenizer=tokenizer,
             init_checkpoint=config.init_checkpoint, output_dir=config.output_dir,
             bert_config_file=config.bert_config_file,
             max_seq_length=config.max_seq_length or 128,
             train_batch_size=config.train_batch_size, eval_batch_size=config.eval_batch_size,
             predict_batch_size=config.predict_batch_size, learning_rate=config.learning_rate,
             num_train_epochs=config.num_train_epochs,
             warmup_proportion=config.warmup_proportion, do_train=config.do_train,
             do_eval=config.do_eval, do_predict=config.do_predict, seed=config.seed,
             data_format=config.data_format, config=config)
