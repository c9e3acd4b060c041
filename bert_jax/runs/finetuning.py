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

import dataclasses
import json
import math
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from bert_jax import file_io, inference
from bert_jax.data import arrays, packed_examples
from bert_jax.interop import checkpoints
from bert_jax.model import configuration
from bert_jax.parallel import sharding
from bert_jax.runs import finetune_config
from bert_jax.tasks import distillation as task_distillation
from bert_jax.tasks import glue, question_answering, sequence_classification
from bert_jax.text import vocab_files
from bert_jax.training import loop, metrics, optimizer, workdir_lock
from bert_jax.training import step as step_lib

get_config = finetune_config.get_config


@dataclasses.dataclass
class _Job:
  """What every fine-tuning run sets up the same way."""
  config: ml_collections.ConfigDict
  output_dir: str
  mesh: Any
  rules: Any
  batch_sh: Any
  bert_config: configuration.BertConfig
  checkpoints: Any
  writer: metrics.MetricWriter
  started: float


def _setup(config, output_dir, tokenizer, init_checkpoint, bert_config_file, max_seq_length,
           batch_sizes: dict[str, int]) -> _Job:
  started = time.time()
  file_io.makedirs(output_dir)
  mesh, rules = sharding.mesh_from_config(config)
  for name, size in batch_sizes.items():
    if size % sharding.data_parallel_size(mesh):
      raise ValueError(f"--{name}={size} is not divisible by the "
                       f"{sharding.data_parallel_size(mesh)} data-parallel devices.")
  ckpt = checkpoints.run_checkpoints(output_dir, max_to_keep=1)
  if ckpt.latest_step() is not None:  # this directory's own model: its config
    bert_config = checkpoints.read_config(output_dir, bert_config_file)
  else:
    bert_config = checkpoints.read_config(init_checkpoint, bert_config_file)
  overrides = {"dtype": config.dtype}
  if config.hidden_dropout_prob is not None:
    overrides["hidden_dropout_prob"] = config.hidden_dropout_prob
  bert_config = bert_config.replace(**overrides)
  bert_config.check_sequence_length(max_seq_length, "--max_seq_length")
  if tokenizer.vocab_size != bert_config.vocab_size:
    raise ValueError(f"The vocabulary has {tokenizer.vocab_size} entries but the model "
                     f"{bert_config.vocab_size}: pass the checkpoint's vocab file.")
  return _Job(config, output_dir, mesh, rules, sharding.batch_sharding(mesh), bert_config, ckpt,
              metrics.MetricWriter(output_dir), started)


def num_train_steps(num_examples: int, batch_size: int, epochs: float) -> int:
  """Steps of `epochs` passes over every example (the last batch of an epoch padded)."""
  return max(1, math.ceil(arrays.steps_per_epoch(num_examples, batch_size) * epochs - 1e-9))


def _optimizer(config, num_steps: int, learning_rate: float, warmup_proportion: float,
               num_layers: int | None = None, frozen_scopes: tuple[str, ...] = ()):
  """The fine-tuning optimizer; `num_layers` (the model's num_hidden_layers) places each layer
  for `config.layerwise_lr_decay`, which needs it when on; `frozen_scopes` (the objective's: a
  distillation teacher) get no update and no state."""
  return optimizer.create_optimizer(ml_collections.ConfigDict({
      "name": "adamw", "learning_rate": learning_rate, "total_steps": max(num_steps, 1),
      "warmup_steps": int(num_steps * warmup_proportion), "weight_decay": config.weight_decay,
      "eps": 1e-6, "bias_correction": config.bias_correction,
      "grad_clip_norm": config.grad_clip_norm,
      "layerwise_lr_decay": config.get("layerwise_lr_decay", 0.0) or 0.0,
      "frozen_scopes": tuple(frozen_scopes)}), num_layers=num_layers)


def max_sequences_per_row(config: ml_collections.ConfigDict, max_seq_length: int
                          ) -> int | None:
  """Examples per packed row when `config.packing` is on; None: one example per row."""
  if not config.get("packing", False):
    return None
  return packed_examples.max_sequences_per_row(
      config.get("packing_max_sequences_per_row", 8), max_seq_length)


def _row_multiple(job: _Job) -> int:
  """Packed rows of a training batch split evenly over processes, data-parallel devices and
  gradient-accumulation micro-batches."""
  shards = math.lcm(sharding.data_parallel_size(job.mesh), jax.process_count())
  return shards * int(job.config.get("grad_accum_steps", 1))


def _packer(job: _Job, objective, feats, batch_size: int, seed) -> tuple[Any, float]:
  """The batch packer of a packed run, and the rows a step holds on average (for MFU); logs
  how well the first epoch's batches (up to 256 of them) pack."""
  k = objective.max_sequences_per_row
  multiple = _row_multiple(job)
  n = len(feats["weight"])
  order = arrays.epoch_order(n, seed, 0)
  batches = [order[b * batch_size:(b + 1) * batch_size]
             for b in range(min(256, arrays.steps_per_epoch(n, batch_size)))]
  report = packed_examples.efficiency(feats["input_mask"], batches, k, multiple=multiple,
                                      max_rows=batch_size)
  metrics.log(f"packing (up to {k} per row, first {len(batches)} batches): "
              f"{report.describe()}")
  pack = packed_examples.batch_packer(k, multiple=multiple, max_rows=batch_size,
                                      position_columns=getattr(objective, "position_columns",
                                                               ()))
  return pack, report.bucketed_rows / len(batches)


def _train(job: _Job, objective, model, tx, schedule, init, feats, num_steps: int,
           batch_size: int, seed: int, tokenizer, metadata: dict[str, Any]):
  """Trains through the core loop (checkpoints with the data position: an interrupted run
  resumes), then keeps what serving the model needs beside it: its config and vocabulary."""
  config = job.config
  train_step = step_lib.build_train_step(objective, model, tx, schedule, init.shardings,
                                         job.batch_sh, job.mesh, job.rules,
                                         config.get("grad_accum_steps", 1))
  pack, rows_per_step = None, batch_size
  if objective.max_sequences_per_row:
    pack, rows_per_step = _packer(job, objective, feats, batch_size,
                                  [seed, config.shuffle_seed_offset])
  batches = arrays.training_batches(feats, batch_size, job.batch_sh,
                                    seed=[seed, config.shuffle_seed_offset],
                                    trim=objective.trim_batches, position=init.position,
                                    pack=pack)
  meta = {"bert_config": job.bert_config.to_hf_dict(),
          "do_lower_case": bool(tokenizer.do_lower_case), **metadata}
  result = loop.train(
      init.state, train_step, batches, objective=objective,
      config=loop.LoopConfig(
          until_step=num_steps, examples_per_step=batch_size,
          tokens_per_example=objective.max_seq_length, log_every_steps=config.log_every_steps,
          checkpoint_every_steps=config.checkpoint_every_steps,
          flops_per_step=objective.flops_per_step(job.bert_config, rows_per_step)),
      writer=job.writer, checkpoints=job.checkpoints, metadata=meta)
  if jax.process_index() == 0:
    job.bert_config.to_json_file(file_io.join(job.output_dir, "bert_config.json"))
    files = vocab_files.of_tokenizer(tokenizer)
    if files.main:
      vocab_files.keep(files, job.output_dir)
  return result


def _fit(job: _Job, objective, model, tokenizer, *, feats, num_steps: int, batch_size: int,
         learning_rate: float, warmup_proportion: float, seed: int, init_checkpoint,
         bert_config_file, metadata: dict[str, Any], header: str,
         results: dict[str, Any]) -> tuple[Any, Any, Any]:
  """The init order, then (when `feats` are given) training: `(state, init, loop result or
  None)`. Training settings and time go into `results`."""
  tx, schedule = _optimizer(job.config, num_steps, learning_rate, warmup_proportion,
                            num_layers=job.bert_config.num_hidden_layers,
                            frozen_scopes=objective.frozen_scopes)
  init = checkpoints.initial_state(objective, model, tx, job.mesh, job.rules,
                                   batch_size=batch_size, seed=seed,
                                   checkpoints=job.checkpoints, init_checkpoint=init_checkpoint,
                                   bert_config_file=bert_config_file)
  metrics.log(f"{header}: {init.origin}; {job.bert_config.num_hidden_layers} layers; mesh "
              f"{dict(job.mesh.shape)}")
  if feats is None:
    return init.state, init, None
  result = _train(job, objective, model, tx, schedule, init, feats, num_steps, batch_size, seed,
                  tokenizer, metadata)
  results["train_steps"] = num_steps
  results["train_seconds"] = time.time() - job.started
  return result.state, init, result


def _stopped(job: _Job, result, num_steps: int, results: dict[str, Any]) -> dict[str, Any]:
  """A stop before the last step: no evaluation of a half-trained model, and no
  eval_results.json that could be taken for a finished run's."""
  metrics.log(f"Stopped at step {result.step} of {num_steps}: not evaluated. Run the same "
              "command again to resume.")
  job.checkpoints.close()
  job.writer.close()
  return dict(results, stopped_early=True, seconds=time.time() - job.started)


def _finish(job: _Job, results: dict[str, Any]) -> dict[str, Any]:
  results["seconds"] = time.time() - job.started
  if jax.process_index() == 0:
    file_io.write_text_atomic(file_io.join(job.output_dir, "eval_results.json"),
                              json.dumps(results, indent=2, default=float) + "\n")
  job.checkpoints.close()
  job.writer.close()
  return results


def _predictor(job: _Job, objective, model, init) -> inference.Predictor:
  return inference.Predictor(model, objective.input_names, mesh=job.mesh, rules=job.rules,
                             param_shardings=init.shardings.params)


def _predict(predictor: inference.Predictor, objective, params, feats, batch_size: int, *,
             desc: str, trim: bool = True):
  """The model's outputs per example (per window), in order. A packed run packs the whole set
  (`batch_size` rows per forward pass) and cuts the outputs back out: per-slot outputs per
  example, per-token outputs (SQuAD's logits) into each window's own positions."""
  k = objective.max_sequences_per_row
  if not k:
    return predictor(params, feats, batch_size, desc=desc, trim=trim)
  rows, placement = packed_examples.pack_examples(feats, k)
  length = np.shape(feats["input_mask"])[1]
  metrics.log(f"{desc}: {len(placement.row)} examples packed in {len(rows['weight'])} rows "
              f"(efficiency "
              f"{placement.length.sum() / max(1, len(rows['weight']) * length):.3f})")
  outputs = predictor(params, rows, batch_size, desc=desc, trim=trim)
  if isinstance(outputs, tuple):  # per token: (rows, S) each
    return tuple(packed_examples.per_window(o, placement, length) for o in outputs)
  return packed_examples.per_example(outputs, placement)


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
  job = _setup(config or get_config(), output_dir, tokenizer, init_checkpoint, bert_config_file,
               max_seq_length, {"train_batch_size": train_batch_size,
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
  state, init, result = _fit(
      job, objective, model, tokenizer, feats=feats, num_steps=num_steps,
      batch_size=train_batch_size, learning_rate=learning_rate,
      warmup_proportion=warmup_proportion, seed=seed, init_checkpoint=init_checkpoint,
      bert_config_file=bert_config_file, header=f"{task.name} ({objective.num_labels} outputs)",
      results=results, metadata={
          "task": task.name, "num_labels": objective.num_labels,
          "max_seq_length": max_seq_length,
          "label_list": None if task.is_regression else list(task.label_list)})
  if result is not None and result.stopped_early:
    return _stopped(job, result, num_steps, results)

  if isinstance(objective, task_distillation.TaskDistillation):  # the student alone from here
    objective, state, init = task_distillation.student_view(objective, state, init)
    model = objective.model(job.bert_config)
  predictor = _predictor(job, objective, model, init)
  if do_eval:
    for split in task.eval_splits:
      examples = read_examples(task, data_dir, split, data_format)
      feats = objective.featurize(examples, tokenizer)
      logits = _predict(predictor, objective, state.params, feats, eval_batch_size,
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
      logits = _predict(predictor, objective, state.params, feats, predict_batch_size,
                        desc=f"predict {split}")
      path = file_io.join(output_dir, filename)
      if jax.process_index() == 0:
        task.write_predictions(path, sequence_classification.to_predictions(task, logits))
      results.setdefault("prediction_files", []).append(path)
      metrics.log(f"wrote {len(examples)} predictions to {path}")
  return _finish(job, results)


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
  job = _setup(config or get_config(), output_dir, tokenizer, init_checkpoint, bert_config_file,
               max_seq_length, {"train_batch_size": train_batch_size,
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
  state, init, result = _fit(
      job, objective, model, tokenizer, feats=feats, num_steps=num_steps,
      batch_size=train_batch_size, learning_rate=learning_rate,
      warmup_proportion=warmup_proportion, seed=seed, init_checkpoint=init_checkpoint,
      bert_config_file=bert_config_file, header=f"SQuAD {version}", results=results,
      metadata={"task": f"squad {version}", **window})
  if result is not None and result.stopped_early:
    return _stopped(job, result, num_steps, results)

  if do_predict:
    examples, source = _squad_examples(predict_file, data_dir, "validation",
                                       version_2_with_negative)
    features = squad.convert_examples_to_features(examples, tokenizer, is_training=False,
                                                  **window)
    # Untrimmed: outputs with a sequence axis are joined across batches.
    start_logits, end_logits = _predict(
        _predictor(job, objective, model, init), objective, state.params, features.arrays,
        predict_batch_size, desc="predict SQuAD", trim=False)
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
  return _finish(job, results)


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
        f"({', '.join(glue.GLUE_TASKS)}), SQuAD ({', '.join(SQUAD_TASKS)}), or 'custom' (your "
        "own TSV files, with --label_list or --regression).") from None


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
