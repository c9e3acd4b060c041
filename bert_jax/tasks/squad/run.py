"""A SQuAD v1.1 / v2.0 fine-tuning run, as the original `run_squad.py`: questions → sliding
windows over their contexts → the `SquadSpans` plug-in of the training core → the n-best
post-processing, predictions.json / nbest_predictions.json / null_odds.json, and on a dev set
the official scores.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections

from bert_jax.runs import finetune_job
from bert_jax.tasks import registry
from bert_jax.tasks.squad import data as squad
from bert_jax.tasks.squad import metrics as squad_eval
from bert_jax.tasks.squad import objective as question_answering
from bert_jax.training import metrics, workdir_lock


def _squad_examples(path: str | None, data_dir: str | None, split: str, version_2: bool):
  if path:
    return squad.read_squad_json(path), path
  if not data_dir:
    raise ValueError(f"Give --{'train' if split == 'train' else 'predict'}_file (official "
                     "SQuAD JSON) or --data_dir (a prepared tensorflow-datasets directory).")
  return (squad.read_squad_tfds(data_dir, split, version_2),
          f"tfds squad/{'v2.0' if version_2 else 'v1.1'}[{split}]")


def check(config: ml_collections.ConfigDict) -> bool:
  """Refuses SQuAD settings that cannot work; returns whether the run is SQuAD 2.0."""
  squad_version = registry.SQUAD_VERSIONS[config.task_name.lower()]
  if squad_version is False and config.version_2_with_negative:
    raise ValueError(f"--task_name={config.task_name} is SQuAD 1.1; drop "
                     "--version_2_with_negative or use --task_name=squad_v2.")
  if config.get("teacher_checkpoint"):
    raise ValueError("--teacher_checkpoint: task-time distillation is for GLUE-style "
                     "classification and regression tasks, not SQuAD.")
  if config.do_train and not (config.train_file or config.data_dir):
    raise ValueError("--do_train needs --train_file (or a tfds --data_dir).")
  if (config.do_predict or config.do_eval) and not (config.predict_file or config.data_dir):
    raise ValueError("--do_predict needs --predict_file (or a tfds --data_dir).")
  return bool(squad_version or config.version_2_with_negative)


@workdir_lock.holding("config.output_dir")
def run(config: ml_collections.ConfigDict, tokenizer) -> dict[str, Any]:
  """SQuAD v1.1 / v2.0 as the original `run_squad.py`, for a fine-tuning config
  (`finetune_config`): train on `train_file`, write predictions.json / nbest_predictions.json /
  null_odds.json for `predict_file`, and, where the file has gold answers (a dev set), the
  official metrics in eval_results.json. --do_eval predicts too, since SQuAD scores its
  predictions file."""
  version_2_with_negative = check(config)
  data_dir, output_dir = config.data_dir, config.output_dir
  max_seq_length = registry.SQUAD.max_length(config.max_seq_length)
  train_batch_size = config.train_batch_size
  job = finetune_job.setup(config, tokenizer, max_seq_length,
                           ("train_batch_size", "predict_batch_size"))
  objective = question_answering.SquadSpans(
      max_seq_length, version_2_with_negative,
      finetune_job.max_sequences_per_row(job.config, max_seq_length))
  model = objective.model(job.bert_config)
  version = "v2.0" if version_2_with_negative else "v1.1"
  results: dict[str, Any] = {"task": f"squad {version}"}
  window = {"max_seq_length": max_seq_length, "doc_stride": config.doc_stride,
            "max_query_length": config.max_query_length}

  feats = None
  if config.do_train:
    examples, source = _squad_examples(config.train_file, data_dir, "train",
                                       version_2_with_negative)
    if not version_2_with_negative and any(e.is_impossible for e in examples):
      raise ValueError(f"{source} has unanswerable questions (is_impossible): SQuAD 2.0 "
                       "needs --version_2_with_negative.")
    features = squad.convert_examples_to_features(examples, tokenizer, is_training=True,
                                                  **window)
    feats = features.arrays
    num_steps = finetune_job.num_train_steps(len(feats["weight"]), train_batch_size,
                                             config.num_train_epochs)
    results["train_features"] = features.report
    metrics.log(f"training: {len(examples)} questions from {source} → {len(feats['weight'])} "
                f"windows ({features.report.get('answers_not_found', 0)} answers not found in "
                f"their context, {features.report.get('answers_repaired', 0)} repaired), "
                f"{num_steps} steps of {train_batch_size}")
  else:
    num_steps = 1
  read = {}

  def apply(predict, split):
    """The questions of --predict_file answered: their scores where it has answers (a dev set,
    scored as the official script would), and what the prediction files hold."""
    if split not in read:  # read and cut into windows once, however often it is scored
      examples, source = _squad_examples(config.predict_file, data_dir, split,
                                         version_2_with_negative)
      read[split] = examples, source, squad.convert_examples_to_features(
          examples, tokenizer, is_training=False, **window)
    examples, source, features = read[split]
    # Untrimmed: outputs with a sequence axis are joined across batches.
    start_logits, end_logits = predict(features.arrays, config.predict_batch_size,
                                       desc="predict SQuAD", trim=False)
    predictions, nbest, null_odds = squad.postprocess(
        examples, features, start_logits, end_logits, n_best_size=config.n_best_size,
        max_answer_length=config.max_answer_length,
        version_2_with_negative=version_2_with_negative,
        null_score_diff_threshold=config.null_score_diff_threshold)
    gold = squad.gold_answers(examples)
    scores = None
    if any(gold.values()):
      scores = squad_eval.evaluate(gold, predictions,
                                   na_probs=null_odds if version_2_with_negative else None,
                                   version_2_with_negative=version_2_with_negative)
    return scores, (examples, source, features, predictions, nbest, null_odds)

  def with_answers(split):
    """The split's windows cut as training cuts them, with answer positions: the loss's
    targets, which prediction windows lack."""
    examples = (read[split][0] if split in read else
                _squad_examples(config.predict_file, data_dir, split, version_2_with_negative)[0])
    return squad.convert_examples_to_features(examples, tokenizer, is_training=True,
                                              **window).arrays

  evaluator = finetune_job.Evaluator(job, objective, model, apply, split="validation",
                                     tag="eval", metric="f1", loss_features=with_answers)
  state, result = finetune_job.fit(
      job, objective, model, tokenizer, feats=feats, num_steps=num_steps,
      header=f"SQuAD {version}", results=results,
      metadata={"task": f"squad {version}", **window}, evaluator=evaluator)
  if result is not None and result.stopped_early:
    return finetune_job.stopped(job, result, num_steps, results)

  if config.do_predict or config.do_eval:
    scores, (examples, source, features, predictions, nbest, null_odds) = evaluator(
        state, "validation")
    if jax.process_index() == 0:
      results["prediction_files"] = squad.write_prediction_files(
          output_dir, predictions, nbest, null_odds if version_2_with_negative else None)
    metrics.log(f"wrote predictions for {len(examples)} questions of {source} "
                f"({len(features.example_index)} windows) to {output_dir}")
    if scores is not None:
      results["eval"] = scores
      job.writer.write(int(state.step), {f"eval/{k}": v for k, v in scores.items()
                                         if isinstance(v, (int, float))})
      metrics.log("eval: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                        for k, v in scores.items()))
  return finetune_job.finish(job, results)
