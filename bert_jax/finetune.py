r"""Fine-tuning on GLUE, your own TSV tasks, and SQuAD, with the flags of the original
`run_classifier.py` and `run_squad.py`.

    python -m bert_jax.finetune --task_name=MRPC --data_dir=glue/MRPC \
        --init_checkpoint=PRETRAIN_WORKDIR_OR_HF_DIR --vocab_file=vocab.txt --do_lower_case \
        --output_dir=out/mrpc --do_train --do_eval --do_predict \
        --max_seq_length=128 --train_batch_size=32 --learning_rate=2e-5 --num_train_epochs=3

    python -m bert_jax.finetune --task_name=squad [--version_2_with_negative] \
        --train_file=train-v1.1.json --predict_file=dev-v1.1.json \
        --init_checkpoint=... --vocab_file=vocab.txt --output_dir=out/squad --do_train --do_predict \
        --max_seq_length=384 --doc_stride=128 --train_batch_size=32 --learning_rate=3e-5 \
        --num_train_epochs=2

`--init_checkpoint` is one of our pre-training workdirs (or its `checkpoints/`), a Hugging Face
BERT directory (`config.json` + `model.safetensors`), or Google's original TF1 checkpoint
(`uncased_L-12_H-768_A-12/bert_model.ckpt`, or its directory; `bert_config.json` beside it is
read unless `--bert_config_file` is given). The encoder is loaded and the classifier
starts from its initialisation. `--data_dir` holds the official GLUE TSV files, or a prepared
tensorflow-datasets directory (`--data_format=tfds`). Every evaluation example is counted (the
last partial batch is padded and masked, never dropped); `--do_predict` writes the files the
GLUE server accepts. For SQuAD, `--do_predict` writes `predictions.json`,
`nbest_predictions.json` (and `null_odds.json` for v2.0) for `--predict_file`, and scores them
with the official metrics when the file has answers; `--task_name=squad_v2` is
`--version_2_with_negative`. SQuAD without `--train_file`/`--predict_file` reads a prepared
tensorflow-datasets `squad/v1.1|v2.0` from `--data_dir`. Anything else is a `--config.x=y`
override of `get_config()` below.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_dict
import numpy as np
import optax
from absl import app, flags, logging

from bert_jax import (checkpointing, configuration, convert, file_io, heads, metrics, optimizer,
                      sharding, tokenization, train_lib)
from bert_jax.tasks import text_features

FLAGS = flags.FLAGS


def get_config() -> ml_collections.ConfigDict:
  """What the original flags do not cover. Override with --config.<field>=<value>."""
  return ml_collections.ConfigDict({
      "mesh_shape": (-1, 1, 1),
      "logical_axis_rules": None,
      "dtype": "float32",            # compute dtype of the encoder (bfloat16 on TPU)
      "weight_decay": 0.01,
      "grad_clip_norm": 1.0,
      "bias_correction": False,      # the released BERT optimizer has none
      "hidden_dropout_prob": config_dict.placeholder(float),  # None: the checkpoint's value
      "log_every_steps": 50,
      "shuffle_seed_offset": 0,
  })


def define_flags() -> None:
  """The original run_classifier.py flags, defined only when run as a program."""
  flags.DEFINE_string("task_name", None, "GLUE task (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, "
                      "RTE, WNLI), 'squad' / 'squad_v2', or 'custom' with --label_list.")
  flags.DEFINE_string("data_dir", None, "GLUE task directory (TSV files) or a tfds data_dir.")
  flags.DEFINE_enum("data_format", "auto", ["auto", "tsv", "tfds"], "auto: TSV if the "
                    "directory holds train.tsv/dev.tsv, else tensorflow-datasets.")
  flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt of the checkpoint.")
  flags.DEFINE_string("spm_model_file", None, "SentencePiece model (instead of vocab_file).")
  flags.DEFINE_bool("do_lower_case", True, "Lower-case the input (uncased models).")
  flags.DEFINE_string("bert_config_file", None, "bert_config.json (default: the checkpoint's).")
  flags.DEFINE_string("init_checkpoint", None, "Pre-trained encoder: our workdir/checkpoint, "
                      "a Hugging Face directory, or a TF1 checkpoint prefix "
                      "(.../bert_model.ckpt) or its directory.")
  flags.DEFINE_string("output_dir", None, "Checkpoints, metrics, predictions.")
  flags.DEFINE_integer("max_seq_length", 128, "Maximum total input length in tokens "
                       "(SQuAD: 384 unless given).")
  flags.DEFINE_integer("train_batch_size", 32, "Training batch size.")
  flags.DEFINE_integer("eval_batch_size", 8, "Evaluation batch size.")
  flags.DEFINE_integer("predict_batch_size", 8, "Prediction batch size.")
  flags.DEFINE_float("learning_rate", 5e-5, "Peak learning rate of Adam.")
  flags.DEFINE_float("num_train_epochs", 3.0, "Training epochs.")
  flags.DEFINE_float("warmup_proportion", 0.1, "Fraction of steps with linear warmup.")
  flags.DEFINE_bool("do_train", False, "Fine-tune.")
  flags.DEFINE_bool("do_eval", False, "Evaluate on the dev split(s).")
  flags.DEFINE_bool("do_predict", False, "Write GLUE-server predictions for the test split(s).")
  flags.DEFINE_integer("seed", 12345, "Seed for the classifier's init, dropout and shuffling.")
  flags.DEFINE_list("label_list", None, "custom task: the labels (omit with --regression).")
  flags.DEFINE_bool("regression", False, "custom task: one real-valued output.")
  flags.DEFINE_integer("text_a_column", 0, "custom task: column of the first text.")
  flags.DEFINE_integer("text_b_column", None, "custom task: column of the second text, if any.")
  flags.DEFINE_integer("label_column", 1, "custom task: column of the label.")
  flags.DEFINE_bool("skip_header", True, "custom task: the TSV files start with a header line.")
  train_lib.define_distributed_flags()
  # run_squad.py
  flags.DEFINE_string("train_file", None, "SQuAD: official training JSON (train-v1.1.json).")
  flags.DEFINE_string("predict_file", None, "SQuAD: JSON to predict (dev-v1.1.json); scored "
                      "when it has answers.")
  flags.DEFINE_bool("version_2_with_negative", False, "SQuAD 2.0: questions may have no answer.")
  flags.DEFINE_integer("doc_stride", 128, "SQuAD: distance between context windows, in tokens.")
  flags.DEFINE_integer("max_query_length", 64, "SQuAD: question tokens kept.")
  flags.DEFINE_integer("n_best_size", 20, "SQuAD: candidates per question in "
                       "nbest_predictions.json.")
  flags.DEFINE_integer("max_answer_length", 30, "SQuAD: longest answer, in tokens.")
  flags.DEFINE_float("null_score_diff_threshold", 0.0, "SQuAD 2.0: predict no answer when "
                     "null score - best score exceeds this (eval_results.json reports the best "
                     "threshold on dev).")
  from ml_collections import config_flags  # pylint: disable=g-import-not-at-top
  config_flags.DEFINE_config_dict("config", get_config(), "Overrides beyond the original flags.")


# ------------------------------------------------------------------------------------ data
def _labels_array(task, examples) -> np.ndarray:
  if task.is_regression:
    return np.asarray([float(e.label) if e.label is not None else 0.0 for e in examples],
                      np.float32)
  index = {name: i for i, name in enumerate(task.label_list)}
  return np.asarray([index[str(e.label)] if e.label is not None else 0 for e in examples],
                    np.int32)


def featurize(task, examples, tokenizer, max_seq_length: int) -> dict[str, np.ndarray]:
  feats = text_features.encode_examples(tokenizer, [e.text_a for e in examples],
                                        [e.text_b for e in examples], max_seq_length)
  feats["label"] = _labels_array(task, examples)
  feats["weight"] = np.ones(len(examples), np.float32)
  return feats


def _pad_rows(feats: dict[str, np.ndarray], multiple: int) -> dict[str, np.ndarray]:
  """Pads to a multiple of `multiple` rows with weight-0 copies of row 0 (never counted)."""
  n = len(feats["weight"])
  pad = (-n) % multiple
  if not pad:
    return feats
  out = {}
  for k, v in feats.items():
    filler = np.repeat(v[:1], pad, axis=0)
    if k == "weight":
      filler = np.zeros_like(filler)
    out[k] = np.concatenate([v, filler])
  return out


def trim_to_bucket(batch: dict[str, np.ndarray], min_length: int = 16) -> dict[str, np.ndarray]:
  """Cuts the padding columns no row of the batch uses, down to a power-of-two length.

  Short-sentence tasks (SST-2, CoLA) use a fraction of `max_seq_length`; computing only the
  columns needed is several times faster, and rounding up to powers of two keeps the number of
  compiled shapes at a handful. Results are unchanged: padded positions are masked anyway.
  """
  full = batch["input_ids"].shape[1]
  used = int(batch["input_mask"].sum(axis=1).max(initial=1))
  length = min_length
  while length < used:
    length *= 2
  length = min(length, full)
  if length == full:
    return batch
  return {k: (v[:, :length] if v.ndim == 2 and v.shape[1] == full else v)
          for k, v in batch.items()}


def _global(batch: dict[str, np.ndarray], batch_sharding) -> dict[str, jax.Array]:
  """The global batch from this host's rows (every host holds the same global batch here)."""
  n = len(batch["weight"])
  per_host = n // jax.process_count()
  lo = jax.process_index() * per_host
  return {k: jax.make_array_from_process_local_data(batch_sharding, v[lo:lo + per_host],
                                                    v.shape) for k, v in batch.items()}


# ---------------------------------------------------------------------------------- steps
def _classification_loss(task):
  def loss_fn(logits, batch):
    if task.is_regression:
      return heads.regression_loss(logits, batch["label"], batch["weight"])
    return heads.classification_loss(logits, batch["label"], batch["weight"])
  return loss_fn


def _span_loss(outputs, batch):
  start_logits, end_logits = outputs
  return heads.span_loss(start_logits, end_logits, batch["start_positions"],
                         batch["end_positions"], batch["weight"])


def make_train_step(model, loss_fn, tx, schedule, state_sh, batch_sh, mesh, rules):
  """One jitted step: `loss_fn(model outputs, batch)` gives the loss dict of `heads`."""
  def step(state, batch):
    rng = jax.random.fold_in(state.rng, state.step)

    def loss(params):
      outputs = model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                            batch["segment_ids"], deterministic=False, rngs={"dropout": rng})
      out = loss_fn(outputs, batch)
      return out["loss"], out
    (loss_value, out), grads = jax.value_and_grad(loss, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(step=state.step + 1, params=optax.apply_updates(state.params,
                                                                               updates),
                              opt_state=opt_state)
    m = {"loss": loss_value, "grad_norm": optax.tree.norm(grads),
         "learning_rate": schedule(state.step)}
    if "correct_sum" in out:
      m["accuracy"] = out["correct_sum"] / jnp.maximum(out["weight_sum"], 1.0)
    return new_state, m
  jitted = jax.jit(step, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, None),
                   donate_argnums=(0,))
  return train_lib.with_mesh(jitted, mesh, rules)


def make_predict_step(model, param_sh, batch_sh, mesh, rules):
  def predict(params, batch):
    return model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                       batch["segment_ids"], deterministic=True)
  jitted = jax.jit(predict, in_shardings=(param_sh, batch_sh), out_shardings=None)
  return train_lib.with_mesh(jitted, mesh, rules)


def predict_all(predict_step, params, feats, batch_size, batch_sh, desc="predict",
                trim: bool = True):
  """The model's outputs (an array or a tuple of arrays) for every row of `feats`, padded to
  whole batches and the padding dropped again. `trim` cuts unused padding columns."""
  n = len(feats["weight"])
  padded = _pad_rows(feats, batch_size)
  outputs = []
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  for start in tqdm(range(0, len(padded["weight"]), batch_size), desc=desc, unit="batch",
                    disable=jax.process_index() != 0, leave=False):
    batch = {k: v[start:start + batch_size] for k, v in padded.items()}
    if trim:
      batch = trim_to_bucket(batch)
    outputs.append(jax.device_get(predict_step(params, _global(batch, batch_sh))))
  return jax.tree.map(lambda *parts: np.concatenate([np.asarray(p) for p in parts])[:n],
                      *outputs)


def to_predictions(task, logits: np.ndarray) -> np.ndarray:
  return logits.reshape(-1) if task.is_regression else np.argmax(logits, axis=-1)


# --------------------------------------------------------------------- shared by every task
@dataclasses.dataclass
class _Job:
  """What every fine-tuning run sets up the same way: mesh, model config, where weights come
  from, the metric writer."""
  config: ml_collections.ConfigDict
  output_dir: str
  ckpt_dir: str
  mesh: Any
  rules: Any
  batch_sh: Any
  bert_config: configuration.BertConfig
  encoder: Any
  origin: str
  finetuned: bool
  writer: metrics.MetricWriter
  started: float


def _setup(config, output_dir, tokenizer, init_checkpoint, bert_config_file, max_seq_length,
           batch_sizes: dict[str, int], do_train: bool) -> _Job:
  started = time.time()
  file_io.makedirs(output_dir)
  ckpt_dir = file_io.join(output_dir, "checkpoints")
  mesh, rules = sharding.mesh_from_config(config)
  for name, size in batch_sizes.items():
    if size % sharding.data_parallel_size(mesh):
      raise ValueError(f"--{name}={size} is not divisible by the "
                       f"{sharding.data_parallel_size(mesh)} data-parallel devices.")
  # Without --do_train, an output_dir that holds a fine-tuned model is evaluated as it is.
  finetuned = not do_train and checkpointing.CheckpointManager(
      ckpt_dir, max_to_keep=None, async_save=False).latest_step() is not None
  bert_config, encoder, origin = convert.load_encoder(
      None if finetuned else init_checkpoint,
      bert_config_file or (file_io.join(output_dir, "bert_config.json") if finetuned else None))
  overrides = {"dtype": config.dtype}
  if config.hidden_dropout_prob is not None:
    overrides["hidden_dropout_prob"] = config.hidden_dropout_prob
  bert_config = bert_config.replace(**overrides)
  if max_seq_length > bert_config.max_position_embeddings:
    raise ValueError(f"--max_seq_length={max_seq_length} exceeds the model's "
                     f"max_position_embeddings={bert_config.max_position_embeddings}.")
  if tokenizer.vocab_size != bert_config.vocab_size:
    raise ValueError(f"The vocabulary has {tokenizer.vocab_size} entries but the model "
                     f"{bert_config.vocab_size}: pass the checkpoint's vocab file.")
  return _Job(config, output_dir, ckpt_dir, mesh, rules, sharding.batch_sharding(mesh),
              bert_config, encoder, origin, finetuned, metrics.MetricWriter(output_dir), started)


def _create_state(job: _Job, model, example_batch, num_steps, learning_rate, warmup_proportion,
                  seed):
  """Sharded train state with the encoder (or the fine-tuned model) loaded into it."""
  config = job.config
  opt_config = ml_collections.ConfigDict({
      "name": "adamw", "learning_rate": learning_rate, "total_steps": max(num_steps, 1),
      "warmup_steps": int(num_steps * warmup_proportion), "weight_decay": config.weight_decay,
      "eps": 1e-6, "bias_correction": config.bias_correction,
      "grad_clip_norm": config.grad_clip_norm})
  tx, schedule = optimizer.create_optimizer(opt_config)
  state, state_sh = train_lib.create_train_state(model, tx, job.mesh, job.rules, seed,
                                                 example_batch, train_lib.CLASSIFICATION_INPUTS)
  if job.finetuned:
    params, _ = checkpointing.load_params(job.ckpt_dir, shardings=state_sh.params)
    state = state.replace(params=params)
    job.origin = f"fine-tuned checkpoint {job.ckpt_dir}"
  elif job.encoder is not None:
    encoder = job.encoder
    if "pooler" not in state.params["bert"]:  # heads that do not read the pooler
      encoder = {k: v for k, v in encoder.items() if k != "pooler"}
    merged = convert.merge_params(jax.device_get(state.params), {"bert": encoder},
                                  where=job.origin)
    state = state.replace(params=jax.device_put(merged, state_sh.params))
  return state, state_sh, tx, schedule


def _train(job: _Job, state, train_step, feats, num_steps, batch_size, seed, trim: bool):
  """Shuffled epochs over `feats` (the last partial batch dropped, as the original) until
  `num_steps`, with a progress bar and periodic scalars."""
  config, n = job.config, len(feats["weight"])
  steps_per_epoch = n // batch_size
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  bar = tqdm(total=num_steps, desc="fine-tune", unit="step", disable=jax.process_index() != 0)
  step, window, t0 = 0, [], time.time()
  while step < num_steps:
    order = np.random.default_rng([seed, config.shuffle_seed_offset, step // steps_per_epoch]
                                  ).permutation(n)
    for b in range(steps_per_epoch):
      if step >= num_steps:
        break
      rows = order[b * batch_size:(b + 1) * batch_size]
      batch = {k: v[rows] for k, v in feats.items()}
      if trim:
        batch = trim_to_bucket(batch)
      state, m = train_step(state, _global(batch, job.batch_sh))
      window.append(m)
      step += 1
      bar.update(1)
      if step % config.log_every_steps == 0 or step == num_steps:
        fetched = jax.device_get(window)
        loss = float(np.mean([x["loss"] for x in fetched]))
        if not math.isfinite(loss):
          raise FloatingPointError(f"Loss became {loss} by step {step}; lower --learning_rate.")
        scalars = {"train/loss": loss, "train/learning_rate": float(fetched[-1]["learning_rate"]),
                   "perf/steps_per_sec": len(fetched) / max(time.time() - t0, 1e-9)}
        if "accuracy" in fetched[0]:
          scalars["train/accuracy"] = float(np.mean([x["accuracy"] for x in fetched]))
        job.writer.write(step, scalars)
        bar.set_postfix(loss=f"{loss:.4f}")
        window, t0 = [], time.time()
  bar.close()
  return state


def _save(job: _Job, state, num_steps: int, tokenizer, metadata: dict[str, Any]) -> None:
  """The fine-tuned model with what serving it needs: its config, its vocabulary (copied to
  `vocab.txt` / `spm.model` beside it) and, in the metadata, the task and input settings."""
  manager = checkpointing.CheckpointManager(job.ckpt_dir, max_to_keep=1)
  manager.save(num_steps, state, {}, {"bert_config": job.bert_config.to_hf_dict(),
                                      "do_lower_case": bool(tokenizer.do_lower_case),
                                      **metadata})
  manager.close()
  if jax.process_index() == 0:
    job.bert_config.to_json_file(file_io.join(job.output_dir, "bert_config.json"))
    source = getattr(tokenizer, "vocab_file", None) or getattr(tokenizer, "model_file", None)
    if source:
      name = "vocab.txt" if getattr(tokenizer, "vocab_file", None) else "spm.model"
      target = file_io.join(job.output_dir, name)
      if os.path.abspath(source) != os.path.abspath(target):
        file_io.write_bytes_atomic(target, file_io.read_bytes(source))


def _finish(job: _Job, results: dict[str, Any]) -> dict[str, Any]:
  results["seconds"] = time.time() - job.started
  if jax.process_index() == 0:
    file_io.write_text_atomic(file_io.join(job.output_dir, "eval_results.json"),
                              json.dumps(results, indent=2, default=float) + "\n")
  job.writer.close()
  return results


def _num_steps(num_examples: int, batch_size: int, epochs: float) -> int:
  steps = int(num_examples / batch_size * epochs)
  if steps < 1:
    raise ValueError(f"{num_examples} training examples give no step of {batch_size}.")
  return steps


# ------------------------------------------------------------------------------------ GLUE
def _read(task, data_dir, split, data_format):
  if data_format == "auto":
    data_format = "tsv" if any(file_io.exists(file_io.join(data_dir, f"{s}.tsv"))
                               for s in ("train", "dev", "dev_matched", "test")) else "tfds"
  return task.read_tsv(data_dir, split) if data_format == "tsv" else task.read_tfds(data_dir,
                                                                                    split)


def run(task, *, data_dir: str, tokenizer, init_checkpoint: str | None, output_dir: str,
        bert_config_file: str | None = None, max_seq_length: int = 128,
        train_batch_size: int = 32, eval_batch_size: int = 8, predict_batch_size: int = 8,
        learning_rate: float = 5e-5, num_train_epochs: float = 3.0,
        warmup_proportion: float = 0.1, do_train: bool = False, do_eval: bool = False,
        do_predict: bool = False, seed: int = 12345, data_format: str = "auto",
        config: ml_collections.ConfigDict | None = None) -> dict[str, Any]:
  """Train / evaluate / predict; returns the evaluation results (also in eval_results.json)."""
  job = _setup(config or get_config(), output_dir, tokenizer, init_checkpoint, bert_config_file,
               max_seq_length, {"train_batch_size": train_batch_size,
                                "eval_batch_size": eval_batch_size,
                                "predict_batch_size": predict_batch_size}, do_train)
  num_labels = 1 if task.is_regression else len(task.label_list)
  model = heads.BertForSequenceClassification(job.bert_config, num_labels)
  example = {k: np.zeros((train_batch_size, max_seq_length), np.int32)
             for k in train_lib.CLASSIFICATION_INPUTS}
  results: dict[str, Any] = {"task": task.name}

  train_examples = _read(task, data_dir, "train", data_format) if do_train else []
  num_steps = (_num_steps(len(train_examples), train_batch_size, num_train_epochs)
               if do_train else 1)
  state, state_sh, tx, schedule = _create_state(job, model, example, num_steps, learning_rate,
                                                warmup_proportion, seed)
  metrics.log(f"{task.name}: {job.origin}; {job.bert_config.num_hidden_layers} layers, "
              f"{num_labels} outputs; mesh {dict(job.mesh.shape)}")

  if do_train:
    feats = featurize(task, train_examples, tokenizer, max_seq_length)
    train_step = make_train_step(model, _classification_loss(task), tx, schedule, state_sh,
                                 job.batch_sh, job.mesh, job.rules)
    metrics.log(f"training: {len(train_examples)} examples, {num_steps} steps "
                f"({num_train_epochs} epochs of {len(train_examples) // train_batch_size}), "
                f"batch {train_batch_size}")
    state = _train(job, state, train_step, feats, num_steps, train_batch_size, seed, trim=True)
    _save(job, state, num_steps, tokenizer, {
        "task": task.name, "num_labels": num_labels, "max_seq_length": max_seq_length,
        "label_list": None if task.is_regression else list(task.label_list)})
    results["train_steps"] = num_steps
    results["train_seconds"] = time.time() - job.started

  predict_step = make_predict_step(model, state_sh.params, job.batch_sh, job.mesh, job.rules)
  if do_eval:
    for split in task.eval_splits:
      examples = _read(task, data_dir, split, data_format)
      feats = featurize(task, examples, tokenizer, max_seq_length)
      logits = predict_all(predict_step, state.params, feats, eval_batch_size, job.batch_sh,
                           desc=f"eval {split}")
      preds = to_predictions(task, logits)
      split_metrics = task.compute_metrics(preds, feats["label"])
      split_metrics["num_examples"] = len(examples)
      results[split] = split_metrics
      job.writer.write(int(state.step),
                       {f"eval_{split}/{k}": v for k, v in split_metrics.items()})
      metrics.log(f"eval {split}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float)
                                                else f"{k} {v}" for k, v in split_metrics.items()))
  if do_predict:
    for split, filename in task.predict_splits.items():
      examples = _read(task, data_dir, split, data_format)
      feats = featurize(task, examples, tokenizer, max_seq_length)
      logits = predict_all(predict_step, state.params, feats, predict_batch_size, job.batch_sh,
                           desc=f"predict {split}")
      path = file_io.join(output_dir, filename)
      if jax.process_index() == 0:
        task.write_predictions(path, to_predictions(task, logits))
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
                                "predict_batch_size": predict_batch_size}, do_train)
  model = heads.BertForQuestionAnswering(job.bert_config)
  example = {k: np.zeros((train_batch_size, max_seq_length), np.int32)
             for k in train_lib.CLASSIFICATION_INPUTS}
  version = "v2.0" if version_2_with_negative else "v1.1"
  results: dict[str, Any] = {"task": f"squad {version}"}
  window = {"max_seq_length": max_seq_length, "doc_stride": doc_stride,
            "max_query_length": max_query_length}

  if do_train:
    examples, source = _squad_examples(train_file, data_dir, "train", version_2_with_negative)
    if not version_2_with_negative and any(e.is_impossible for e in examples):
      raise ValueError(f"{source} has unanswerable questions (is_impossible): SQuAD 2.0 "
                       "needs --version_2_with_negative.")
    features = squad.convert_examples_to_features(examples, tokenizer, is_training=True,
                                                  **window)
    feats = features.arrays
    num_steps = _num_steps(len(feats["weight"]), train_batch_size, num_train_epochs)
    results["train_features"] = features.report
    metrics.log(f"training: {len(examples)} questions from {source} → {len(feats['weight'])} "
                f"windows ({features.report.get('answers_not_found', 0)} answers not found in "
                f"their context, {features.report.get('answers_repaired', 0)} repaired), "
                f"{num_steps} steps of {train_batch_size}")
  else:
    num_steps = 1
  state, state_sh, tx, schedule = _create_state(job, model, example, num_steps, learning_rate,
                                                warmup_proportion, seed)
  metrics.log(f"SQuAD {version}: {job.origin}; {job.bert_config.num_hidden_layers} layers; "
              f"mesh {dict(job.mesh.shape)}")
  if do_train:
    train_step = make_train_step(model, _span_loss, tx, schedule, state_sh, job.batch_sh,
                                 job.mesh, job.rules)
    # No length trimming: the original's softmax runs over every position, padding included.
    state = _train(job, state, train_step, feats, num_steps, train_batch_size, seed, trim=False)
    _save(job, state, num_steps, tokenizer, {"task": f"squad {version}", **window})
    results["train_steps"] = num_steps
    results["train_seconds"] = time.time() - job.started

  if do_predict:
    examples, source = _squad_examples(predict_file, data_dir, "validation",
                                       version_2_with_negative)
    features = squad.convert_examples_to_features(examples, tokenizer, is_training=False,
                                                  **window)
    predict_step = make_predict_step(model, state_sh.params, job.batch_sh, job.mesh, job.rules)
    start_logits, end_logits = predict_all(predict_step, state.params, features.arrays,
                                           predict_batch_size, job.batch_sh,
                                           desc="predict SQuAD", trim=False)
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


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  for name in ("task_name", "output_dir"):
    if not getattr(FLAGS, name):
      raise app.UsageError(f"--{name} is required.")
  if not (FLAGS.do_train or FLAGS.do_eval or FLAGS.do_predict):
    raise app.UsageError("At least one of --do_train, --do_eval, --do_predict.")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # progress is printed; keep library INFO chatter out
  train_lib.initialize_distributed_from_flags()
  tokenizer = tokenization.load_tokenizer(vocab_file=FLAGS.vocab_file,
                                          spm_model_file=FLAGS.spm_model_file,
                                          do_lower_case=FLAGS.do_lower_case)
  squad_version = SQUAD_TASKS.get(FLAGS.task_name.lower(), "not squad")
  if squad_version != "not squad":
    if squad_version is False and FLAGS.version_2_with_negative:
      raise app.UsageError(f"--task_name={FLAGS.task_name} is SQuAD 1.1; drop "
                           "--version_2_with_negative or use --task_name=squad_v2.")
    main_squad(tokenizer, bool(squad_version or FLAGS.version_2_with_negative))
    return
  from bert_jax.tasks import glue  # pylint: disable=g-import-not-at-top
  if FLAGS.task_name.lower() == "custom":
    task = glue.CustomTsvTask(label_list=FLAGS.label_list, regression=FLAGS.regression,
                              text_a_column=FLAGS.text_a_column,
                              text_b_column=FLAGS.text_b_column,
                              label_column=FLAGS.label_column, skip_header=FLAGS.skip_header)
  else:
    task = glue.get_task(FLAGS.task_name)
  run(task, data_dir=FLAGS.data_dir, tokenizer=tokenizer, init_checkpoint=FLAGS.init_checkpoint,
      output_dir=FLAGS.output_dir, bert_config_file=FLAGS.bert_config_file,
      max_seq_length=FLAGS.max_seq_length, train_batch_size=FLAGS.train_batch_size,
      eval_batch_size=FLAGS.eval_batch_size, predict_batch_size=FLAGS.predict_batch_size,
      learning_rate=FLAGS.learning_rate, num_train_epochs=FLAGS.num_train_epochs,
      warmup_proportion=FLAGS.warmup_proportion, do_train=FLAGS.do_train,
      do_eval=FLAGS.do_eval, do_predict=FLAGS.do_predict, seed=FLAGS.seed,
      data_format=FLAGS.data_format, config=FLAGS.config)


def main_squad(tokenizer, version_2: bool) -> None:
  do_predict = FLAGS.do_predict or FLAGS.do_eval
  if FLAGS.do_train and not (FLAGS.train_file or FLAGS.data_dir):
    raise app.UsageError("--do_train needs --train_file (or a tfds --data_dir).")
  if do_predict and not (FLAGS.predict_file or FLAGS.data_dir):
    raise app.UsageError("--do_predict needs --predict_file (or a tfds --data_dir).")
  run_squad(tokenizer=tokenizer, init_checkpoint=FLAGS.init_checkpoint,
            output_dir=FLAGS.output_dir, train_file=FLAGS.train_file,
            predict_file=FLAGS.predict_file, data_dir=FLAGS.data_dir,
            version_2_with_negative=version_2, bert_config_file=FLAGS.bert_config_file,
            max_seq_length=FLAGS.max_seq_length if FLAGS["max_seq_length"].present else 384,
            doc_stride=FLAGS.doc_stride, max_query_length=FLAGS.max_query_length,
            train_batch_size=FLAGS.train_batch_size, predict_batch_size=FLAGS.predict_batch_size,
            learning_rate=FLAGS.learning_rate, num_train_epochs=FLAGS.num_train_epochs,
            warmup_proportion=FLAGS.warmup_proportion, n_best_size=FLAGS.n_best_size,
            max_answer_length=FLAGS.max_answer_length,
            null_score_diff_threshold=FLAGS.null_score_diff_threshold, do_train=FLAGS.do_train,
            do_predict=do_predict, seed=FLAGS.seed, config=FLAGS.config)


if __name__ == "__main__":
  define_flags()
  app.run(main)
