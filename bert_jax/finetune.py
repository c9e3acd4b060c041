r"""Fine-tuning on GLUE (and your own TSV tasks) with the flags of the original `run_classifier.py`.

    python -m bert_jax.finetune --task_name=MRPC --data_dir=glue/MRPC \
        --init_checkpoint=PRETRAIN_WORKDIR_OR_HF_DIR --vocab_file=vocab.txt --do_lower_case \
        --output_dir=out/mrpc --do_train --do_eval --do_predict \
        --max_seq_length=128 --train_batch_size=32 --learning_rate=2e-5 --num_train_epochs=3

`--init_checkpoint` is one of our pre-training workdirs (or its `checkpoints/`), or a Hugging Face
BERT directory (`config.json` + `model.safetensors`). The encoder is loaded and the classifier
starts from its initialisation. `--data_dir` holds the official GLUE TSV files, or a prepared
tensorflow-datasets directory (`--data_format=tfds`). Every evaluation example is counted (the
last partial batch is padded and masked, never dropped); `--do_predict` writes the files the
GLUE server accepts. Anything else is a `--config.x=y` override of `get_config()` below.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import app, flags, logging
from jax.sharding import NamedSharding, PartitionSpec

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
      "hidden_dropout_prob": None,   # None: the checkpoint's value
      "log_every_steps": 50,
      "shuffle_seed_offset": 0,
  })


def define_flags() -> None:
  """The original run_classifier.py flags, defined only when run as a program."""
  flags.DEFINE_string("task_name", None, "GLUE task (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, "
                      "RTE, WNLI) or 'custom' with --label_list.")
  flags.DEFINE_string("data_dir", None, "GLUE task directory (TSV files) or a tfds data_dir.")
  flags.DEFINE_enum("data_format", "auto", ["auto", "tsv", "tfds"], "auto: TSV if the "
                    "directory holds train.tsv/dev.tsv, else tensorflow-datasets.")
  flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt of the checkpoint.")
  flags.DEFINE_string("spm_model_file", None, "SentencePiece model (instead of vocab_file).")
  flags.DEFINE_bool("do_lower_case", True, "Lower-case the input (uncased models).")
  flags.DEFINE_string("bert_config_file", None, "bert_config.json (default: the checkpoint's).")
  flags.DEFINE_string("init_checkpoint", None, "Pre-trained encoder: our workdir/checkpoint "
                      "or a Hugging Face directory.")
  flags.DEFINE_string("output_dir", None, "Checkpoints, metrics, predictions.")
  flags.DEFINE_integer("max_seq_length", 128, "Maximum total input length in tokens.")
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
def _loss(model, task, params, batch, rng, deterministic):
  logits = model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                       batch["segment_ids"], deterministic=deterministic, rngs={"dropout": rng})
  if task.is_regression:
    out = heads.regression_loss(logits, batch["label"], batch["weight"])
  else:
    out = heads.classification_loss(logits, batch["label"], batch["weight"])
  return out["loss"], (out, logits)


def make_train_step(model, task, tx, schedule, state_sh, batch_sh, mesh, rules):
  def step(state, batch):
    rng = jax.random.fold_in(state.rng, state.step)
    (loss, (out, _)), grads = jax.value_and_grad(
        lambda p: _loss(model, task, p, batch, rng, False), has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(step=state.step + 1, params=optax.apply_updates(state.params,
                                                                               updates),
                              opt_state=opt_state)
    m = {"loss": loss, "grad_norm": optax.tree.norm(grads), "learning_rate": schedule(state.step)}
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


def predict_all(predict_step, params, feats, batch_size, batch_sh, desc="predict"
                ) -> np.ndarray:
  """Logits for every row of `feats` (padded to whole batches, padding dropped again)."""
  n = len(feats["weight"])
  padded = _pad_rows(feats, batch_size)
  outputs = []
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  for start in tqdm(range(0, len(padded["weight"]), batch_size), desc=desc, unit="batch",
                    disable=jax.process_index() != 0, leave=False):
    batch = trim_to_bucket({k: v[start:start + batch_size] for k, v in padded.items()})
    outputs.append(np.asarray(jax.device_get(predict_step(params, _global(batch, batch_sh)))))
  return np.concatenate(outputs)[:n]


def to_predictions(task, logits: np.ndarray) -> np.ndarray:
  return logits.reshape(-1) if task.is_regression else np.argmax(logits, axis=-1)


# ------------------------------------------------------------------------------------ run
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
  config = config or get_config()
  started = time.time()
  file_io.makedirs(output_dir)
  ckpt_dir = file_io.join(output_dir, "checkpoints")
  mesh, rules = sharding.mesh_from_config(config)
  batch_sh = sharding.batch_sharding(mesh)
  for name, size in (("train_batch_size", train_batch_size), ("eval_batch_size", eval_batch_size),
                     ("predict_batch_size", predict_batch_size)):
    if size % sharding.data_parallel_size(mesh):
      raise ValueError(f"--{name}={size} is not divisible by the "
                       f"{sharding.data_parallel_size(mesh)} data-parallel devices.")

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
  num_labels = 1 if task.is_regression else len(task.label_list)
  model = heads.BertForSequenceClassification(bert_config, num_labels)
  example = {k: np.zeros((train_batch_size, max_seq_length), np.int32)
             for k in train_lib.CLASSIFICATION_INPUTS}
  writer = metrics.MetricWriter(output_dir)
  results: dict[str, Any] = {"task": task.name}

  train_examples = _read(task, data_dir, "train", data_format) if do_train else []
  num_steps = int(len(train_examples) / train_batch_size * num_train_epochs) if do_train else 1
  opt_config = ml_collections.ConfigDict({
      "name": "adamw", "learning_rate": learning_rate, "total_steps": max(num_steps, 1),
      "warmup_steps": int(num_steps * warmup_proportion), "weight_decay": config.weight_decay,
      "eps": 1e-6, "bias_correction": config.bias_correction,
      "grad_clip_norm": config.grad_clip_norm})
  tx, schedule = optimizer.create_optimizer(opt_config)
  state, state_sh = train_lib.create_train_state(model, tx, mesh, rules, seed, example,
                                                 train_lib.CLASSIFICATION_INPUTS)
  if finetuned:
    params, _ = checkpointing.load_params(ckpt_dir, shardings=state_sh.params)
    state = state.replace(params=params)
    origin = f"fine-tuned checkpoint {ckpt_dir}"
  elif encoder is not None:
    merged = convert.merge_params(jax.device_get(state.params), {"bert": encoder},
                                  where=origin)
    state = state.replace(params=jax.device_put(merged, state_sh.params))
  metrics.log(f"{task.name}: {origin}; {bert_config.num_hidden_layers} layers, "
              f"{num_labels} outputs; mesh {dict(mesh.shape)}")

  if do_train:
    if num_steps < 1:
      raise ValueError(f"{len(train_examples)} training examples give no step of "
                       f"{train_batch_size}.")
    feats = featurize(task, train_examples, tokenizer, max_seq_length)
    train_step = make_train_step(model, task, tx, schedule, state_sh, batch_sh, mesh, rules)
    steps_per_epoch = len(train_examples) // train_batch_size
    metrics.log(f"training: {len(train_examples)} examples, {num_steps} steps "
                f"({num_train_epochs} epochs of {steps_per_epoch}), batch {train_batch_size}")
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    bar = tqdm(total=num_steps, desc="fine-tune", unit="step",
               disable=jax.process_index() != 0)
    step, window, t0 = 0, [], time.time()
    while step < num_steps:
      order = np.random.default_rng([seed, config.shuffle_seed_offset, step // steps_per_epoch]
                                    ).permutation(len(train_examples))
      for b in range(steps_per_epoch):  # the last partial batch is dropped, as the original
        if step >= num_steps:
          break
        rows = order[b * train_batch_size:(b + 1) * train_batch_size]
        batch = trim_to_bucket({k: v[rows] for k, v in feats.items()})
        state, m = train_step(state, _global(batch, batch_sh))
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
          writer.write(step, scalars)
          bar.set_postfix(loss=f"{loss:.4f}")
          window, t0 = [], time.time()
    bar.close()
    manager = checkpointing.CheckpointManager(ckpt_dir, max_to_keep=1)
    manager.save(num_steps, state, {}, {"bert_config": bert_config.to_hf_dict(),
                                        "task": task.name, "num_labels": num_labels})
    manager.close()
    if jax.process_index() == 0:
      bert_config.to_json_file(file_io.join(output_dir, "bert_config.json"))
    results["train_steps"] = num_steps
    results["train_seconds"] = time.time() - started

  predict_step = make_predict_step(model, state_sh.params, batch_sh, mesh, rules)
  if do_eval:
    for split in task.eval_splits:
      examples = _read(task, data_dir, split, data_format)
      feats = featurize(task, examples, tokenizer, max_seq_length)
      logits = predict_all(predict_step, state.params, feats, eval_batch_size, batch_sh,
                           desc=f"eval {split}")
      preds = to_predictions(task, logits)
      split_metrics = task.compute_metrics(preds, feats["label"])
      split_metrics["num_examples"] = len(examples)
      results[split] = split_metrics
      writer.write(int(state.step), {f"eval_{split}/{k}": v for k, v in split_metrics.items()})
      metrics.log(f"eval {split}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float)
                                                else f"{k} {v}" for k, v in split_metrics.items()))
  if do_predict:
    for split, filename in task.predict_splits.items():
      examples = _read(task, data_dir, split, data_format)
      feats = featurize(task, examples, tokenizer, max_seq_length)
      logits = predict_all(predict_step, state.params, feats, predict_batch_size, batch_sh,
                           desc=f"predict {split}")
      path = file_io.join(output_dir, filename)
      if jax.process_index() == 0:
        task.write_predictions(path, to_predictions(task, logits))
      results.setdefault("prediction_files", []).append(path)
      metrics.log(f"wrote {len(examples)} predictions to {path}")
  results["seconds"] = time.time() - started
  if jax.process_index() == 0:
    file_io.write_text_atomic(file_io.join(output_dir, "eval_results.json"),
                              json.dumps(results, indent=2, default=float) + "\n")
  writer.close()
  return results


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
  from bert_jax.tasks import glue  # pylint: disable=g-import-not-at-top
  if FLAGS.task_name.lower() == "custom":
    task = glue.CustomTsvTask(label_list=FLAGS.label_list, regression=FLAGS.regression,
                              text_a_column=FLAGS.text_a_column,
                              text_b_column=FLAGS.text_b_column,
                              label_column=FLAGS.label_column, skip_header=FLAGS.skip_header)
  else:
    task = glue.get_task(FLAGS.task_name)
  tokenizer = tokenization.load_tokenizer(vocab_file=FLAGS.vocab_file,
                                          spm_model_file=FLAGS.spm_model_file,
                                          do_lower_case=FLAGS.do_lower_case)
  run(task, data_dir=FLAGS.data_dir, tokenizer=tokenizer, init_checkpoint=FLAGS.init_checkpoint,
      output_dir=FLAGS.output_dir, bert_config_file=FLAGS.bert_config_file,
      max_seq_length=FLAGS.max_seq_length, train_batch_size=FLAGS.train_batch_size,
      eval_batch_size=FLAGS.eval_batch_size, predict_batch_size=FLAGS.predict_batch_size,
      learning_rate=FLAGS.learning_rate, num_train_epochs=FLAGS.num_train_epochs,
      warmup_proportion=FLAGS.warmup_proportion, do_train=FLAGS.do_train,
      do_eval=FLAGS.do_eval, do_predict=FLAGS.do_predict, seed=FLAGS.seed,
      data_format=FLAGS.data_format, config=FLAGS.config)


if __name__ == "__main__":
  define_flags()
  app.run(main)
