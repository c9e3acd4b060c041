"""Pre-training entry point: MLM + NSP on TFRecords, sharded over a device mesh.

    python -m bert_jax.pretrain --config=configs/pretrain.py:base --workdir=gs://BUCKET/run \
        --config.data.train_files='gs://BUCKET/data/train-*.tfrecord'

The run resumes by itself: if `workdir` holds a checkpoint, training continues from it (state,
RNG and data position), so a preempted job is simply started again with the same command.
Otherwise it starts from `config.init_checkpoint` (a previous phase; or, with
`init_mode="params"`, the weights of Google's TF1 release `.../bert_model.ckpt` or a Hugging Face
directory) or from scratch.

`main` only parses flags; `train_and_evaluate(config, workdir)` is the testable loop.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import time
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax import (checkpointing, configuration, convert, features, file_io, heads,
                      input_pipeline, masking, metrics, optimizer, sharding, train_lib)

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Command-line flags, defined only when run as a program (importers get none)."""
  config_flags.DEFINE_config_file("config", None, "Pre-training config file.", lock_config=True)
  flags.DEFINE_string("workdir", None, "Checkpoints, TensorBoard logs, metrics.jsonl.")
  train_lib.define_distributed_flags()
  flags.DEFINE_bool("compile_only", False,
                    "Compile the train step for the config's mesh, print its per-device memory "
                    "and FLOPs, and exit (no data needed): checks a config fits before a run.")


def bert_config_from(config: ml_collections.ConfigDict) -> configuration.BertConfig:
  """The model section of a run config → BertConfig (preset, then the non-None fields)."""
  fields = {k: v for k, v in config.model.items() if k != "preset" and v is not None}
  return configuration.get_preset(config.model.preset, **fields)


class _StopSignal:
  """Turns SIGTERM (TPU preemption, `kill`, a scheduler) into 'save and exit at the next step'."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    try:
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread: no signal handling
      self._previous = None
    return self

  def _handle(self, signum, frame):
    del signum, frame
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
    return False


def _gather_positions(position: dict[str, int]) -> dict[str, Any]:
  """Every process's data position (hosts read different files, so positions can differ)."""
  local = np.asarray([position.get("epoch", 0), position.get("batch", 0)], np.int64)
  if jax.process_count() == 1:
    return {"per_process": [local.tolist()]}
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  gathered = np.asarray(multihost_utils.process_allgather(local))
  return {"per_process": gathered.reshape(-1, 2).tolist()}


def _own_position(data_state: dict[str, Any]) -> dict[str, int]:
  per_process = data_state.get("per_process") or []
  if len(per_process) != jax.process_count():
    raise ValueError(f"The checkpoint's data position is for {len(per_process)} processes; this "
                     f"run has {jax.process_count()}. Resume with the same number of hosts.")
  epoch, batch = per_process[jax.process_index()]
  return {"epoch": int(epoch), "batch": int(batch)}


def _any_process(flag: bool) -> bool:
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(np.asarray(multihost_utils.process_allgather(np.asarray([int(flag)]))).any())


def _masking_config(config, files) -> masking.MaskingConfig | None:
  """Dynamic-masking records need the vocabulary's special ids; static ones carry masks.

  The vocabulary is `config.data.vocab_file` / `spm_model_file`, or else the one named in the
  `summary.json` that data_prep wrote beside the records.
  """
  if input_pipeline.detect_masking(files[0]) != features.DYNAMIC:
    return None
  from bert_jax import tokenization  # pylint: disable=g-import-not-at-top
  vocab_file, spm_file = config.data.vocab_file, config.data.spm_model_file
  lower, whole_word = config.data.do_lower_case, config.data.whole_word_mask
  summary_path = file_io.join(os.path.dirname(files[0]), "summary.json")
  if not (vocab_file or spm_file) and file_io.exists(summary_path):
    settings = json.loads(file_io.read_text(summary_path)).get("settings", {})
    vocab_file, spm_file = settings.get("vocab_file"), settings.get("spm_model_file")
    lower = settings.get("do_lower_case", lower)
    whole_word = settings.get("do_whole_word_mask", whole_word)
    logging.info("Dynamic masking with the vocabulary named in %s.", summary_path)
  if not (vocab_file or spm_file):
    raise ValueError(f"{files[0]} holds dynamic-masking records: set config.data.vocab_file "
                     "or config.data.spm_model_file so masks can be drawn.")
  tokenizer = tokenization.load_tokenizer(vocab_file=vocab_file or None,
                                          spm_model_file=spm_file or None, do_lower_case=lower)
  return masking.MaskingConfig.from_tokenizer(
      tokenizer, masked_lm_prob=config.data.masked_lm_prob,
      max_predictions_per_seq=config.data.max_predictions_per_seq,
      whole_word_mask=whole_word, per_word_draw=config.data.per_word_draw)


def _extend_positions(loaded: dict, fresh: dict) -> dict:
  """Phase 2 with a longer position table than phase 1 had: keep the trained rows, and take the
  remaining rows from the fresh initialisation."""
  old = np.asarray(loaded["bert"]["embeddings"]["position_embeddings"])
  new = np.asarray(fresh["bert"]["embeddings"]["position_embeddings"])
  if old.shape[0] < new.shape[0]:
    logging.warning("Extending position embeddings from %d to %d rows.", old.shape[0],
                    new.shape[0])
    merged = new.copy()
    merged[:old.shape[0]] = old
    loaded["bert"]["embeddings"]["position_embeddings"] = merged
  return loaded


def _initial_state(config, model, tx, mesh, rules, example, ckpt):
  """Init order: this workdir's latest checkpoint, else `init_checkpoint`, else from scratch.
  Returns `(state, state_shardings, data_position, origin)`."""
  abstract, state_sh = train_lib.abstract_train_state(model, tx, mesh, rules, example)
  if ckpt.latest_step() is not None:
    state, data_state, _ = ckpt.restore(abstract)
    return state, state_sh, _own_position(data_state), f"resumed from step {int(state.step)}"
  if config.init_checkpoint:
    source = config.init_checkpoint
    kind, location = convert.checkpoint_kind(source)
    if kind == "orbax" and file_io.exists(file_io.join(source, "checkpoints")):
      source = file_io.join(source, "checkpoints")
    if config.init_mode == "continue":
      if kind != "orbax":
        raise ValueError(f"init_checkpoint={source} is {convert.KIND_NAMES[kind]}: weights, but "
                         "no state of this trainer to continue; set init_mode='params' to start "
                         "from its weights.")
      other = checkpointing.CheckpointManager(source, max_to_keep=None, async_save=False)
      state, _, _ = other.restore(abstract)
      return state, state_sh, None, f"continuing {source} from step {int(state.step)}"
    if config.init_mode != "params":
      raise ValueError(f"init_mode={config.init_mode!r}; expected 'continue' or 'params'.")
    state, state_sh = train_lib.create_train_state(model, tx, mesh, rules, config.seed, example)
    if kind == "orbax":
      loaded, _ = checkpointing.load_params(source)
    else:  # Google's TF1 release or a Hugging Face directory; absent heads start fresh
      _, loaded = convert.load_pretraining_model(location, require_heads=False,
                                                 scan_layers=model.config.scan_layers)
    fresh = jax.device_get(state.params)
    merged = convert.merge_params(fresh, _extend_positions(loaded, fresh), where=source)
    params = jax.device_put(merged, state_sh.params)
    return state.replace(params=params), state_sh, None, f"weights from {source}"
  state, state_sh = train_lib.create_train_state(model, tx, mesh, rules, config.seed, example)
  return state, state_sh, None, "initialised from scratch"


@dataclasses.dataclass
class Run:
  """What a run config builds: the model, its optimizer, and the mesh it is laid out on."""
  bert_config: configuration.BertConfig
  model: heads.BertForPreTraining
  tx: Any
  schedule: Any
  mesh: jax.sharding.Mesh
  rules: Any


def build(config: ml_collections.ConfigDict, devices=None) -> Run:
  bert_config = bert_config_from(config)
  mesh, rules = sharding.mesh_from_config(config, devices)
  sharding.check_batch_divisible(config.global_batch_size, mesh)
  if config.data.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError(f"data.max_seq_length={config.data.max_seq_length} exceeds the model's "
                     f"max_position_embeddings={bert_config.max_position_embeddings}.")
  opt_config = ml_collections.ConfigDict(config.optimizer.to_dict())
  opt_config.total_steps = config.total_steps
  tx, schedule = optimizer.create_optimizer(opt_config)
  return Run(bert_config, heads.BertForPreTraining(bert_config), tx, schedule, mesh, rules)


def compile_train_step(config: ml_collections.ConfigDict, devices=None, compile_step: bool = True
                       ) -> dict[str, Any]:
  """Builds the config's train step for its mesh without data or parameters (ahead of time).

  Catches a config that does not fit its pod before any chip time is spent: shapes, shardings,
  and (when compiled) per-device memory and FLOPs. `devices` defaults to all; fake CPU devices
  (`--xla_force_host_platform_device_count`) stand in for a slice.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = [int(s) for s in config.mesh_shape]
  if -1 not in shape:  # a slice's worth of the given devices
    devices = devices[:int(np.prod(shape))]
  run = build(config, devices)
  seq_len, max_pred = config.data.max_seq_length, config.data.max_predictions_per_seq
  example = train_lib.example_batch(config.global_batch_size, seq_len, max_pred)
  abstract, state_sh = train_lib.abstract_train_state(run.model, run.tx, run.mesh, run.rules,
                                                      example)
  batch_sh = sharding.batch_sharding(run.mesh)
  abstract_batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sh)
                    for k, v in example.items()}
  step = train_lib.jit_train_step(run.model, run.tx, run.schedule, state_sh, batch_sh, run.mesh,
                                  run.rules, config.grad_accum_steps)
  lowered = step.lower(abstract, abstract_batch)
  out = {"mesh": dict(run.mesh.shape), "lowered": lowered, "state_shardings": state_sh,
         "num_parameters": sum(int(np.prod(p.shape)) for p in jax.tree.leaves(abstract.params)),
         "analytic_flops_per_step": train_lib.pretraining_flops_per_step(
             run.bert_config, config.global_batch_size, seq_len, max_pred)}
  if compile_step:
    compiled = lowered.compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    out["compiled"] = compiled
    out["compiled_flops_per_device"] = float(cost.get("flops", float("nan")))
    memory = compiled.memory_analysis()
    if memory is not None:
      out["bytes_per_device"] = int(memory.argument_size_in_bytes + memory.output_size_in_bytes
                                    + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
  return out


def evaluate(eval_step, params, data: input_pipeline.PretrainingData, num_steps: int
             ) -> dict[str, float]:
  """Average metrics over the first `num_steps` batches of the held-out stream."""
  sums = []
  for i, (batch, _) in enumerate(data.global_batches()):
    if i >= num_steps:
      break
    sums.append(eval_step(params, batch))
  if not sums:
    return {}
  total = jax.tree.map(lambda *x: float(np.sum(x)), *jax.device_get(sums))
  return {f"eval/{k}": v for k, v in train_lib.summarize(total).items()}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Runs (or resumes) pre-training; returns the last logged train and eval metrics."""
  run = build(config)
  bert_config, model, tx, schedule, mesh, rules = (run.bert_config, run.model, run.tx,
                                                   run.schedule, run.mesh, run.rules)
  seq_len, max_pred = config.data.max_seq_length, config.data.max_predictions_per_seq

  files = input_pipeline.list_files(config.data.train_files)
  eval_files = input_pipeline.list_files(config.data.eval_files) if config.data.eval_files else None
  train_files, eval_files = input_pipeline.split_train_eval(files, eval_files)
  mask_cfg = _masking_config(config, train_files)
  batch_sh = sharding.batch_sharding(mesh)
  data_kwargs = dict(global_batch_size=config.global_batch_size, max_seq_length=seq_len,
                     max_predictions_per_seq=max_pred, sharding=batch_sh,
                     masking_config=mask_cfg)
  train_data = input_pipeline.PretrainingData(
      None, files=train_files, seed=config.seed,
      shuffle_buffer_size=config.data.shuffle_buffer_size, **data_kwargs)
  eval_data = input_pipeline.PretrainingData(None, files=eval_files, seed=config.seed + 1,
                                             shuffle=False, repeat=False, **data_kwargs)

  writer = metrics.MetricWriter(workdir, tensorboard=config.tensorboard)
  ckpt = checkpointing.CheckpointManager(file_io.join(workdir, "checkpoints"),
                                         max_to_keep=config.max_checkpoints_to_keep)
  example = train_lib.example_batch(config.global_batch_size, seq_len, max_pred)
  state, state_sh, position, origin = _initial_state(config, model, tx, mesh, rules, example,
                                                     ckpt)
  start_step = int(state.step)
  if jax.process_index() == 0:
    file_io.write_text_atomic(file_io.join(workdir, "config.json"), config.to_json_best_effort(
        indent=2) + "\n")
    bert_config.to_json_file(file_io.join(workdir, "bert_config.json"))
  n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(state.params))
  metrics.log(f"BERT {n_params / 1e6:.1f}M parameters | mesh {dict(mesh.shape)} on "
              f"{jax.device_count()} {jax.devices()[0].platform} devices, {jax.process_count()} "
              f"processes | {origin} | train {len(train_files)} files, eval {len(eval_files)} "
              f"files ({train_data.masking_mode} masking) | workdir {workdir}")

  train_step = train_lib.jit_train_step(model, tx, schedule, state_sh, batch_sh, mesh, rules,
                                        config.grad_accum_steps)
  eval_step = train_lib.jit_eval_step(model, state_sh.params, batch_sh, mesh, rules)
  flops = train_lib.pretraining_flops_per_step(bert_config, config.global_batch_size, seq_len,
                                               max_pred)
  peak = train_lib.peak_flops_per_device(jax.devices()[0])
  meta = {"bert_config": bert_config.to_hf_dict(), "run": config.to_dict()}

  last: dict[str, float] = {}
  window: list[dict[str, jax.Array]] = []
  window_start, window_first_step = time.time(), start_step
  last_good_step = ckpt.latest_step()
  step = start_step
  batches = train_data.global_batches(position)

  def save(at_step, pos):
    nonlocal last_good_step
    ckpt.save(at_step, state, _gather_positions(pos), meta)
    last_good_step = at_step

  def check_finite(window_metrics, first, last_step):
    losses = [float(m["loss"]) for m in window_metrics]
    bad = [i for i, x in enumerate(losses) if not math.isfinite(x)]
    if bad:
      ckpt.wait_until_finished()
      raise FloatingPointError(
          f"Loss became {losses[bad[0]]} at step {first + bad[0] + 1} (steps {first + 1}-"
          f"{last_step}). Training stopped; the last good checkpoint is step {last_good_step} in "
          f"{ckpt.directory}. Lower optimizer.learning_rate or check the data, then restart.")

  with _StopSignal() as stop:
    pos = position or {"epoch": 0, "batch": 0}
    compile_start = time.time()
    while step < config.train_until_step:
      batch, pos = next(batches)
      state, step_metrics = train_step(state, batch)
      step += 1
      window.append(step_metrics)
      if step == start_step + 1:
        check_finite([jax.device_get(step_metrics)], start_step, step)
        metrics.log(f"first step (compilation included) took {time.time() - compile_start:.1f}s")
        window_start, window_first_step = time.time(), step
        window = []
      is_log = step % config.log_every_steps == 0 or step == config.train_until_step
      is_ckpt = step % config.checkpoint_every_steps == 0 or step == config.train_until_step
      stopping = _any_process(stop.requested) if (is_log or jax.process_count() == 1) else False
      stopping = stopping or ckpt.reached_preemption(step)
      if (is_log or is_ckpt or stopping) and window:
        fetched = jax.device_get(window)
        check_finite(fetched, window_first_step, step)
        elapsed = max(time.time() - window_start, 1e-9)
        steps_per_sec = len(fetched) / elapsed
        sums = {k: float(np.sum([m[k] for m in fetched])) for k in fetched[0]
                if k.endswith("_sum") or k == "nsp_count"}
        scalars = {f"train/{k}": v for k, v in train_lib.summarize(sums).items()}
        scalars.update({"train/learning_rate": float(fetched[-1]["learning_rate"]),
                        "train/grad_norm": float(fetched[-1]["grad_norm"]),
                        "perf/steps_per_sec": steps_per_sec,
                        "perf/sequences_per_sec": steps_per_sec * config.global_batch_size,
                        "perf/tokens_per_sec": steps_per_sec * config.global_batch_size * seq_len,
                        "perf/eta_seconds": (config.train_until_step - step) / steps_per_sec})
        if peak:
          scalars["perf/mfu"] = flops * steps_per_sec / (peak * jax.device_count())
        writer.write(step, scalars)
        metrics.log(metrics.console_line(step, config.train_until_step, scalars))
        last.update(scalars)
        window, window_start, window_first_step = [], time.time(), step
      if step % config.eval_every_steps == 0 or step == config.train_until_step:
        eval_scalars = evaluate(eval_step, state.params, eval_data, config.eval_steps)
        writer.write(step, eval_scalars)
        metrics.log(f"eval at step {step}: " + ", ".join(
            f"{k.split('/')[1]} {v:.4f}" for k, v in eval_scalars.items()))
        last.update(eval_scalars)
      if is_ckpt or stopping:
        save(step, pos)
      if is_ckpt or step % config.eval_every_steps == 0:
        window_start = time.time()  # evaluation and saving are not training throughput
      if stopping:
        ckpt.wait_until_finished()
        metrics.log(f"Stop requested: saved step {step} to {ckpt.directory}; run the same "
                    "command again to resume.")
        break
  if not any(k.startswith("eval/") for k in last):  # nothing left to train: report where it is
    eval_scalars = evaluate(eval_step, state.params, eval_data, config.eval_steps)
    metrics.log(f"eval at step {step}: " + ", ".join(
        f"{k.split('/')[1]} {v:.4f}" for k, v in eval_scalars.items()))
    last.update(eval_scalars)
  ckpt.close()
  writer.close()
  last["step"] = step
  return last


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if FLAGS.workdir is None or FLAGS.config is None:
    raise app.UsageError("--config and --workdir are required.")
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # progress is printed; keep library INFO chatter out
  train_lib.initialize_distributed_from_flags()
  if FLAGS.compile_only:
    out = compile_train_step(FLAGS.config)
    gib = out.get("bytes_per_device", float("nan")) / 2**30
    metrics.log(f"mesh {out['mesh']}: {out['num_parameters'] / 1e6:.1f}M parameters, "
                f"{gib:.2f} GiB per device, {out['compiled_flops_per_device'] / 1e12:.2f} "
                f"TFLOP per device per step (analytic total "
                f"{out['analytic_flops_per_step'] / 1e12:.2f} TFLOP)")
    return
  train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  define_flags()
  app.run(main)
