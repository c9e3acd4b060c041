"""A token-tagging fine-tuning run (CoNLL-2003 named entities, or any tag set in the CoNLL
layout): sentences → word-piece windows → the `TokenClassification` plug-in of the training core
→ entity-level scores as `conlleval` counts them and prediction files in the CoNLL layout.

The paper's setting (Section 5.3): each word is labelled and predicted at its first piece;
`document_context` fills each window with the sentences around it (never crossing a
`-DOCSTART-`); long sentences are split into windows of whole words, each word predicted once.
`feature_based` trains the paper's Table 7 variant on the same data with the encoder frozen.

Files written to `output_dir`: `eval_results.json` (per split: precision, recall, F1, token
accuracy, per entity type), `<split>_predictions.txt` (word, gold, predicted: what `conlleval`
reads, tags in the files' own scheme), beside the checkpoint, its config and vocabulary.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import ml_collections
import numpy as np

from bert_jax import file_io
from bert_jax.runs import finetune_job
from bert_jax.tasks import registry
from bert_jax.tasks.tagging import data as conll
from bert_jax.tasks.tagging import metrics as conlleval
from bert_jax.tasks.tagging import objective as token_classification
from bert_jax.training import metrics, workdir_lock

# Where each split's sentences come from, and the name of its prediction file.
_PREDICTION_FILES = {"dev": "dev_predictions.txt", "test": "test_predictions.txt"}


def labels_for(task_name: str, label_list: Sequence[str] | None) -> tuple[str, ...]:
  """The tag set in the order of the model's outputs (IOB2)."""
  if label_list:
    return conll.label_list_from(label_list)
  if task_name.lower() == "conll2003":
    return conll.CONLL2003_LABELS
  raise ValueError(f"--task_name={task_name} needs --label_list: the tags of your files "
                   "(O,B-PER,I-PER,...) or their entity types (PER,LOC,...).")


def read_sentences(task_name: str, data_dir: str, split: str, data_format: str, scheme: str,
                   labels: Sequence[str]) -> tuple[list[conll.Sentence], str]:
  """A split's sentences: CoNLL-layout files in `data_dir` (`eng.train`/`eng.testa`/`eng.testb`,
  `train.txt`/`valid.txt`/`test.txt`), or tfds `conll2003` from a prepared `data_dir`."""
  if data_format == "auto":
    try:
      return conll.read_split(data_dir, split, scheme=scheme, label_list=labels)
    except FileNotFoundError as missing:
      if task_name.lower() != "conll2003":
        raise
      try:
        return read_sentences(task_name, data_dir, split, "tfds", scheme, labels)
      except Exception as e:  # neither kind: say both
        raise ValueError(f"{missing} Nor does it read as a prepared tensorflow-datasets "
                         f"conll2003 directory: {e}") from None
  if data_format == "tfds":
    if task_name.lower() != "conll2003":
      raise ValueError(f"--data_format=tfds reads tfds 'conll2003'; --task_name={task_name} "
                       "reads CoNLL-layout files (--data_format=conll).")
    return conll.read_tfds(data_dir, {"dev": "validation"}.get(split, split)), \
        f"tfds conll2003[{split}]"
  if data_format not in ("conll", "files"):
    raise ValueError(f"--data_format={data_format}: tagging reads 'conll' files or 'tfds'.")
  return conll.read_split(data_dir, split, scheme=scheme, label_list=labels)


def _file_scheme(sentences: Sequence[conll.Sentence], scheme: str) -> str:
  """The scheme predictions are written in: the files' own (IOB1 as CoNLL-2003 was released)."""
  if scheme != "auto":
    return scheme
  originals = [s.original_labels for s in sentences if s.original_labels is not None]
  return conll.detect_scheme(originals) if originals else "iob2"


@workdir_lock.holding("config.output_dir")
def run(config: ml_collections.ConfigDict, tokenizer) -> dict[str, Any]:
  """Train on the train split of a fine-tuning config's task (`finetune_config`), score dev
  (`do_eval`) and test (`do_predict`; scored when it has tags, as CoNLL-2003's has) and write
  their predictions; returns the results (also in eval_results.json)."""
  finetune_job.refuse_what_the_kind_lacks(
      config, "tagging", "the task's files, or a prepared tensorflow-datasets directory for "
      "conll2003", "; tagging windows are already filled with context (--document_context)")
  task_name, data_dir, output_dir = config.task_name.lower(), config.data_dir, config.output_dir
  max_seq_length = registry.TAGGING.max_length(config.max_seq_length)
  do_train = config.do_train
  # Without training, the model is the one the output directory holds: its tags and head.
  kept = {} if do_train else finetune_job.recorded(output_dir)
  labels = labels_for(task_name, config.label_list or kept.get("label_list"))
  job = finetune_job.setup(config, tokenizer, max_seq_length)
  objective = token_classification.TokenClassification.with_head_of(
      kept or config, num_labels=len(labels), max_seq_length=max_seq_length,
      task_name=task_name)
  model = objective.model(job.bert_config)
  scheme = config.tagging_scheme
  context = bool(kept.get("document_context", config.document_context))
  window = {"document_context": context}
  results: dict[str, Any] = {"task": task_name, "labels": list(labels),
                             "feature_based": objective.feature_based, **window}

  def featurize(split):
    sentences, source = read_sentences(task_name, data_dir, split, config.data_format, scheme,
                                       labels)
    features = conll.convert_to_features(sentences, tokenizer, labels, max_seq_length,
                                         document_context=context)
    metrics.log(f"{split}: {len(sentences)} sentences from {source} → "
                f"{len(features.sentence_index)} windows ({features.report})")
    return sentences, source, features

  feats, num_steps = None, 1
  if do_train:
    _, _, train_features = featurize("train")
    feats = train_features.arrays
    num_steps = finetune_job.num_train_steps(len(feats["weight"]), config.train_batch_size,
                                             config.num_train_epochs)
    results["train_features"] = train_features.report
  kind = ("feature-based: frozen encoder + BiLSTM" if objective.feature_based
          else "fine-tuned")
  header = f"{task_name} ({len(labels)} tags, {kind})"
  featurized = {}

  def apply(predict, split):
    """A split's words tagged, and scored where the files have tags."""
    if split not in featurized:  # read and featurized once, however often it is scored
      featurized[split] = featurize(split)
    sentences, _, features = featurized[split]
    batch_size = config.eval_batch_size if split == "dev" else config.predict_batch_size
    # Untrimmed: per-token outputs are joined across batches.
    logits = predict(features.arrays, batch_size, desc=f"{split} tags", trim=False)
    predicted = conll.words_from_predictions(features, np.argmax(logits, axis=-1), labels)
    scores = None
    if all(s.labels is not None for s in sentences):
      scores = conlleval.evaluate([list(s.labels) for s in sentences], predicted)
    return (None if scores is None else dict(scores.as_dict(), num_sentences=len(sentences)),
            (predicted, scores))

  evaluator = finetune_job.Evaluator(job, objective, model, apply, split="dev", tag="eval_dev",
                                     metric="f1")
  state, result = finetune_job.fit(
      job, objective, model, tokenizer, feats=feats, num_steps=num_steps, header=header,
      results=results,
      metadata={"task": task_name, "num_labels": len(labels), "label_list": list(labels),
                "max_seq_length": max_seq_length, **objective.head_settings(), **window},
      evaluator=evaluator)
  if result is not None and result.stopped_early:
    return finetune_job.stopped(job, result, num_steps, results)

  splits = [s for s, wanted in (("dev", config.do_eval), ("test", config.do_predict)) if wanted]
  for split in splits:
    split_scores, (predicted, scores) = evaluator(state, split)
    sentences, source, _ = featurized[split]
    path = file_io.join(output_dir, _PREDICTION_FILES[split])
    if jax.process_index() == 0:
      conll.write_predictions(path, sentences, predicted,
                              scheme=_file_scheme(sentences, scheme))
    results.setdefault("prediction_files", []).append(path)
    metrics.log(f"wrote tags of {sum(len(p) for p in predicted)} words of {source} to {path}")
    if split_scores is not None:
      results[split] = split_scores
      job.writer.write(int(state.step), {f"eval_{split}/{k}": v for k, v in split_scores.items()
                                         if isinstance(v, (int, float))})
      metrics.log(f"{split} ({source}), entity level as conlleval counts:\n" + scores.report())
  return finetune_job.finish(job, results)
