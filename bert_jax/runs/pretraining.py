"""A pre-training run: TFRecords → the config's objective → the core loop, sharded over a mesh.

`train_and_evaluate(config, workdir)` runs (or resumes) a run; the init order (this workdir's
checkpoint, else `config.init_checkpoint`, else from scratch) is
`training.init_order.initial_state`. `compile_train_step(config)` builds the same step for the
config's mesh without data or weights, to check that a config fits its pod before a run.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from bert_jax import file_io, objectives
from bert_jax.data import input_pipeline, records_summary
from bert_jax.interop import checkpoints, hf_config
from bert_jax.model import configuration, modeling, target
from bert_jax.parallel import gpu_targets, sharding
from bert_jax.text import masking, tokenization, vocab_files
from bert_jax.training import checkpointing, init_order, loop, metrics, optimizer
from bert_jax.training import step as step_lib, workdir_lock
from bert_jax.training.objective import Objective


def platform_defaults(bert_config: configuration.BertConfig, given: set[str], platform: str,
                      capability: tuple[int, int] | None = None,
                      max_seq_length: int | None = None,
                      resumed_layout: str | None = None) -> dict[str, Any]:
  """The compute fields left unset (not in `given`) that the platform the step is built for
  runs with, as `BertConfig.replace` arguments.

  The layout, `scan_layers` and `stack_unrolled` both unset: scanned layers (one compiled layer,
  stacked parameters, the same losses bit for bit) on TPUs, where the scanned loop is the
  production path of large JAX trainers; unrolled on CPUs and other GPUs, where the scanned step
  measured 1.05-1.10x (CPU) and 1.45x (H100) slower (benchmarks/RESULTS.md) although it compiles
  BERT-large's step in 0.55x the time, so the unrolled step pays for its compile within a few
  dozen steps; on a CUDA GPU of compute capability 8.0 or newer (`capability`; None: not one),
  the stacked layout run unrolled, with the fused kernels (`target.fused_kernel_fields`, each
  only where the model allows it): the program measured fastest on the
  H200 (benchmarks/RESULTS.md, "Stacked layers with the fused LayerNorm sites": 49.9 ms per
  BERT-base step, 1.23x torch.compile's paper recipe; the explicit attention path with XLA's
  LayerNorm measured 69.9 ms on an earlier build). The stacked layout run unrolled (one
  optimizer kernel per stacked leaf; checkpoints load into either layout) needs unshared,
  unpruned layers.

  A run resuming from its checkpoint (`resumed_layout`: "stacked" or "unrolled", as
  `checkpointing.layers_layout` reads the checkpoint) keeps its layers' layout where the
  layout is unset, whatever the platform would pick for a new run: the optimizer state it
  restores is laid out so. Stacked layers then run as the platform runs them (unrolled on a
  recent GPU, scanned elsewhere)."""
  layout_given = bool({"scan_layers", "stack_unrolled"} & given)
  fused_gpu = target.is_fused_gpu(platform, capability)
  unshared = bert_config.share_parameters == "none"
  fields: dict[str, Any] = {}
  if not layout_given and unshared and bert_config.pruned_heads is None:
    stacked = {"stacked": True, "unrolled": False}.get(
        resumed_layout, platform == "tpu" or fused_gpu)
    if stacked:
      fields.update(scan_layers=True, **({"stack_unrolled": True} if fused_gpu else {}))
    elif resumed_layout:
      fields["scan_layers"] = False
  elif not layout_given and platform == "tpu":
    fields["scan_layers"] = True
  if not fused_gpu:
    return fields
  fields.update(target.fused_kernel_fields(bert_config.replace(**fields), given, capability,
                                           max_seq_length))
  return fields


def bert_config_from(config: ml_collections.ConfigDict, platform: str | None = None,
                     capability: tuple[int, int] | None = None,
                     resumed_layout: str | None = None) -> configuration.BertConfig:
  """The model section of a run config → BertConfig: the preset, then the non-None fields
  (`stack_unrolled` implying the stacked layout it runs), then the defaults of the platform
  the step is built for (`platform_defaults`; a CUDA GPU's `capability` is
  `gpu_targets.compute_capability` of the run's devices; `resumed_layout` the layers' layout
  of the checkpoint a run resumes from)."""
  fields = {k: v for k, v in config.model.items() if k != "preset" and v is not None}
  given = set(fields)
  if fields.get("stack_unrolled"):
    fields.setdefault("scan_layers", True)
  bert_config = configuration.get_preset(config.model.preset, **fields)
  platform = platform or jax.default_backend()
  defaults = platform_defaults(bert_config, given, platform, capability,
                               config.data.get("max_seq_length"), resumed_layout)
  if not defaults:
    return bert_config
  logging.info("Defaults for this %s%s%s: %s (set a field to choose otherwise).", platform,
               f" of compute capability {capability[0]}.{capability[1]}" if capability else "",
               f", resuming a checkpoint of {resumed_layout} layers" if resumed_layout else "",
               ", ".join(f"{k}={v}" for k, v in defaults.items()))
  return bert_config.replace(**defaults)


def objective_from(config: ml_collections.ConfigDict,
                   max_sequences_per_row: int | None = None) -> Objective:
  """The config's objective, with its `objective_settings`; over packed rows
  (`max_sequences_per_row` instances each, as the records say) its packed layout."""
  packing = ({"packed": True, "max_sequences_per_row": max_sequences_per_row}
             if max_sequences_per_row else {})
  settings = dict(config.get("objective_settings") or {})
  name = config.get("objective", "mlm_nsp")
  # An objective with a section of its own (distillation: `config.distillation`) reads it too.
  section = getattr(objectives.OBJECTIVES.get(name), "config_section", None)
  if section and config.get(section) is not None:
    settings.update(config[section].to_dict())
  return objectives.get_objective(name, max_seq_length=config.data.max_seq_length,
                                  max_predictions_per_seq=config.data.max_predictions_per_seq,
                                  **packing, **settings).with_checkpoints(checkpoints)


def check_records_objective(config: ml_collections.ConfigDict, files: list[str]) -> None:
  """Refuses records whose sentence label means something else than the objective reads
  (`sentence_objective` in data_prep's summary.json: nsp, sop or none): NSP labels taught as
  sentence order, or back, train a head on the wrong question without any error."""
  name = config.get("objective", "mlm_nsp")
  wanted = getattr(objectives.OBJECTIVES.get(name), "sentence_objective", None)
  summary = records_summary.summary(files)
  if wanted is None or not summary:  # the label is not read, or records of the original tool
    return
  found = summary.get("sentence_objective", "nsp")  # summaries from before the key were NSP
  if found != wanted:
    fix = {"nsp": "mlm_nsp", "sop": "mlm_sop"}.get(found, "mlm")
    raise ValueError(
        f"config.objective={name} reads {wanted.upper()} labels but {summary['path']} says the "
        f"records carry sentence_objective={found!r}: set --config.objective={fix}, or rewrite "
        f"the records with data_prep --objective={wanted}.")


@dataclasses.dataclass
class Run:
  """What a run config builds: the objective, the model, its optimizer, and the mesh."""
  bert_config: configuration.BertConfig
  objective: Objective
  model: Any
  tx: Any
  schedule: Any
  mesh: jax.sharding.Mesh
  rules: Any


def check_config(config: ml_collections.ConfigDict) -> None:
  """Refuses values that contradict each other or cannot work, before anything is built: each
  message names the field and the fix (`--config.<field>=...`)."""
  def positive(name, value):
    if value is None or value <= 0:
      raise ValueError(f"config.{name}={value}: must be a positive number.")

  positive("global_batch_size", config.global_batch_size)
  positive("grad_accum_steps", config.grad_accum_steps)
  if config.global_batch_size % config.grad_accum_steps:
    raise ValueError(f"config.global_batch_size={config.global_batch_size} is not divisible by "
                     f"config.grad_accum_steps={config.grad_accum_steps}.")
  positive("total_steps", config.total_steps)
  positive("train_until_step", config.train_until_step)
  if config.train_until_step > config.total_steps:
    raise ValueError(
        f"config.train_until_step={config.train_until_step} is past config.total_steps="
        f"{config.total_steps}, where the learning-rate schedule ends at "
        f"{config.optimizer.get('end_learning_rate', 0.0)}: raise --config.total_steps or lower "
        "--config.train_until_step.")
  warmup = config.optimizer.warmup_steps
  if warmup < 0 or warmup > config.total_steps:
    raise ValueError(f"config.optimizer.warmup_steps={warmup} must lie in [0, total_steps="
                     f"{config.total_steps}].")
  positive("optimizer.learning_rate", config.optimizer.learning_rate)
  positive("log_every_steps", config.log_every_steps)
  for name in ("checkpoint_every_steps", "eval_every_steps"):
    if config.get(name) is not None and config[name] <= 0:
      raise ValueError(f"config.{name}={config[name]}: must be positive.")
  positive("data.max_seq_length", config.data.max_seq_length)
  if not 0 < config.data.max_predictions_per_seq <= config.data.max_seq_length:
    raise ValueError(f"config.data.max_predictions_per_seq={config.data.max_predictions_per_seq}"
                     f" must lie in [1, max_seq_length={config.data.max_seq_length}].")
  if config.data.get("packing"):
    positive("data.max_sequences_per_row", config.data.get("max_sequences_per_row"))
  if config.init_mode not in ("continue", "params"):
    raise ValueError(f"config.init_mode={config.init_mode!r}: expected 'continue' or 'params'.")


# The paper's phase-1 shapes: what a config that leaves them unset uses where there are no
# records to read them from (an ahead-of-time compile, a step built without data).
DEFAULT_RECORD_SHAPES = {"max_seq_length": 128, "max_predictions_per_seq": 20}


def resolve_record_shapes(config: ml_collections.ConfigDict, files: list[str] | None = None
                          ) -> ml_collections.ConfigDict:
  """`data.max_seq_length` and `data.max_predictions_per_seq` left unset (None) are the
  records' own (`records_summary.record_shapes`), each said in a line; without records, or
  for dynamic records without data_prep's summary, 128 tokens and a budget of
  ceil(masked_lm_prob x length) predictions (20 at 128, as the paper). A value the config sets
  is kept, and checked against the records when they are read. Returns a copy."""
  config = ml_collections.ConfigDict(config.to_dict())
  data = config.data
  unset = [k for k in DEFAULT_RECORD_SHAPES if data.get(k) is None]
  if not unset:
    return config
  found = records_summary.record_shapes(files) if files else {}
  for name in unset:
    if name in found:
      data[name], source = found[name]
      metrics.log(f"data.{name}={data[name]} from {source}")
    elif name == "max_seq_length" or data.get("max_seq_length") is None:
      data[name] = DEFAULT_RECORD_SHAPES[name]
    else:
      data[name] = max(1, math.ceil(data.masked_lm_prob * data.max_seq_length))
  return config


def resolve_vocabulary(config: ml_collections.ConfigDict, files: list[str]
                       ) -> ml_collections.ConfigDict:
  """`model.vocab_size` checked against the data (`records_summary.check_vocab_size`): taken
  from data_prep's `summary.json` when the config leaves it unset. Returns the config with the
  resolved size."""
  config = ml_collections.ConfigDict(config.to_dict())
  if config.model.vocab_size is None:
    found = records_summary.summary(files)
    config.model.vocab_size = found.get("vocab_size") or configuration.get_preset(
        config.model.preset).vocab_size
    if found.get("vocab_size"):
      logging.info("model.vocab_size=%d from %s", found["vocab_size"], found["path"])
  records_summary.check_vocab_size(config.model.vocab_size, files)
  return config


def with_records_settings(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`resolve_vocabulary` and `resolve_record_shapes` for an ahead-of-time compile, so that it
  builds the step of the run the config describes; the preset's vocabulary size and the default
  shapes where the records cannot be read from here (a bucket off the cloud), said in the
  log."""
  needs_records = config.model.vocab_size is None or any(
      config.data.get(k) is None for k in DEFAULT_RECORD_SHAPES)
  if not needs_records or not config.data.get("train_files"):
    return resolve_record_shapes(config)
  try:
    files = input_pipeline.list_files(config.data.train_files)
    config = resolve_record_shapes(config, files)
  except Exception as e:  # pylint: disable=broad-except  (any reason the records are out of reach)
    logging.warning("Compiling with the preset's vocabulary size and default shapes: the "
                    "records cannot be read here (%s).", e)
    return resolve_record_shapes(config)
  return resolve_vocabulary(config, files) if config.model.vocab_size is None else config


def keep_vocabulary(config: ml_collections.ConfigDict, files: list[str], workdir: str) -> None:
  """Copies the run's vocabulary (`records_summary.vocabulary`) into the workdir with its hash,
  so that exports, fine-tuning and `predict` use the vocabulary the model was trained with."""
  found, _ = records_summary.vocabulary(config.data, files)
  if found is None:
    return
  missing = [p for p in found.with_merges().paths if not file_io.exists(p)]
  if missing:
    logging.warning("The vocabulary %s named for these records does not exist: the workdir "
                    "keeps none (pass --vocab_file to predict).", ", ".join(missing))
    return
  kept = vocab_files.find_beside(workdir)
  if kept is not None:
    vocab_files.check_same(found, kept, "the records' vocabulary")
  flavour = tokenization.flavour_for(bert_config_from(config).model_type, found.spm_model_file)
  vocab_files.keep(dataclasses.replace(found, flavour=flavour or found.flavour), workdir)


def build(config: ml_collections.ConfigDict, devices=None,
          max_sequences_per_row: int | None = None, resumed_layout: str | None = None) -> Run:
  """What `config` builds for `devices` (default: all); `resumed_layout` is the layers' layout
  of the checkpoint the run resumes from (`checkpointing.stored_layout`), None for a new
  run."""
  config = resolve_record_shapes(config)  # a config's unset shapes, where no records decided
  check_config(config)
  # Scanned or unrolled layers by the platform the step is built for, which for an
  # ahead-of-time compile (a TPU topology from a CPU machine) is not the local one.
  device = devices[0] if devices else jax.devices()[0]
  bert_config = bert_config_from(config, device.platform,
                                 gpu_targets.compute_capability(device), resumed_layout)
  mesh, rules = sharding.mesh_from_config(config, devices)
  sharding.check_batch_divisible(config.global_batch_size, mesh)
  bert_config.check_sequence_length(config.data.max_seq_length, "data.max_seq_length")
  objective = objective_from(config, max_sequences_per_row)
  opt_config = ml_collections.ConfigDict(config.optimizer.to_dict())
  opt_config.total_steps = config.total_steps
  # The scopes the objective keeps fixed (a distillation teacher) besides the config's own.
  opt_config.frozen_scopes = tuple(dict.fromkeys(
      tuple(opt_config.get("frozen_scopes") or ()) + tuple(objective.frozen_scopes)))
  tx, schedule = optimizer.create_optimizer(opt_config)
  return Run(bert_config, objective, objective.model(bert_config), tx, schedule, mesh, rules)


def compile_train_step(config: ml_collections.ConfigDict, devices=None, compile_step: bool = True
                       ) -> dict[str, Any]:
  """Builds the config's train step for its mesh without data or parameters (ahead of time).

  Catches a config that does not fit its pod before any chip time is spent: shapes, shardings,
  and (when compiled) per-device memory and FLOPs. `devices` defaults to all; fake CPU devices
  (`--xla_force_host_platform_device_count`) stand in for a slice, and the compile-only devices
  of a real TPU topology (`parallel.tpu_slices.topology_devices`) give the TPU executable itself
  (`runs.compile_check` reads it). The step is the production one: the config's objective, over
  packed rows when `data.packing` is set, its rules, accumulation and attention kernel.
  """
  devices = list(jax.devices() if devices is None else devices)
  config = with_records_settings(config)
  shape = [int(s) for s in config.mesh_shape]
  if -1 not in shape:  # a slice's worth of the given devices
    devices = devices[:int(np.prod(shape))]
  packed_rows = config.data.max_sequences_per_row if config.data.get("packing") else None
  run = build(config, devices, max_sequences_per_row=packed_rows)
  lowered, abstract, state_sh = step_lib.lower_train_step(
      run.objective, run.model, run.tx, run.schedule, run.mesh, run.rules,
      config.global_batch_size, config.grad_accum_steps)
  out = {"mesh": dict(run.mesh.shape), "lowered": lowered, "state_shardings": state_sh,
         "vocab_size": run.bert_config.vocab_size,
         "num_parameters": sum(int(np.prod(p.shape)) for p in jax.tree.leaves(abstract.params)),
         "analytic_flops_per_step": run.objective.flops_per_step(run.bert_config,
                                                                 config.global_batch_size)}
  if compile_step:
    compiled = lowered.compile()
    cost = compiled.cost_analysis()
    cost = (cost[0] if cost else None) if isinstance(cost, (list, tuple)) else cost
    cost = cost or {}  # a GPU compile-only client gives none
    out["compiled"] = compiled
    out["compiled_flops_per_device"] = float(cost.get("flops", float("nan")))
    memory = compiled.memory_analysis()
    if memory is not None:
      out["memory"] = memory
      out["bytes_per_device"] = step_lib.device_bytes(memory)
  return out


def masking_config(config, files) -> masking.MaskingConfig | None:
  """How masks are drawn for dynamic-masking records (`records_summary.masking_config`), None
  for static ones."""
  return records_summary.masking_config(
      config.data, files, bert_config_from(config).model_type if "model" in config else None)


def evaluator(objective: Objective, eval_step, data: input_pipeline.PretrainingData,
              num_steps: int):
  """`evaluate(state)`: the objective's metrics over the first `num_steps` held-out batches."""
  def evaluate(state) -> dict[str, float]:
    sums = []
    for i, (batch, _) in enumerate(data.global_batches()):
      if i >= num_steps:
        break
      sums.append(eval_step(state.params, batch, state.model_state))
      loop.limit_in_flight(sums)
    if not sums:
      return {}
    total = jax.tree.map(lambda *x: float(np.sum(x)), *jax.device_get(sums))
    return {f"eval/{k}": v for k, v in objective.summarize(total).items()}
  return evaluate


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Runs (or resumes) pre-training; returns the last logged train and eval metrics, the step
  reached and `stopped_early` (a stop was requested before `train_until_step`)."""
  if not workdir or not str(workdir).strip():
    raise ValueError("--workdir is empty: name the directory for checkpoints and logs.")
  if not config.data.train_files:
    raise ValueError("config.data.train_files is not set: pass "
                     "--config.data.train_files='DIR/*.tfrecord' (the shards data_prep wrote).")
  files = input_pipeline.list_files(config.data.train_files)
  config = resolve_record_shapes(config, files)
  check_config(config)
  check_records_objective(config, files)
  config = resolve_vocabulary(config, files)
  # Checked first, so a refused config leaves no workdir behind; then one run per workdir.
  with workdir_lock.hold(workdir):
    return _train_and_evaluate(config, workdir, files)


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, files: list[str]
                        ) -> dict[str, Any]:
  pack_sequences = config.data.max_sequences_per_row if config.data.get("packing") else None
  # A run resuming here keeps its layers' layout, whatever this platform's default.
  run = build(config, max_sequences_per_row=(input_pipeline.detect_packing(files[0])
                                             or pack_sequences),
              resumed_layout=checkpointing.stored_layout(workdir))
  seq_len, max_pred = config.data.max_seq_length, config.data.max_predictions_per_seq
  eval_files = input_pipeline.list_files(config.data.eval_files) if config.data.eval_files else None
  train_files, eval_files = input_pipeline.split_train_eval(files, eval_files)
  batch_sh = sharding.batch_sharding(run.mesh)
  data_kwargs = dict(global_batch_size=config.global_batch_size, max_seq_length=seq_len,
                     max_predictions_per_seq=max_pred, sharding=batch_sh,
                     masking_config=masking_config(config, train_files),
                     skip_corrupt_records=config.data.get("skip_corrupt_records", False),
                     pack_sequences=pack_sequences)
  train_data = input_pipeline.PretrainingData(
      None, files=train_files, seed=config.seed,
      shuffle_buffer_size=config.data.shuffle_buffer_size, **data_kwargs)
  eval_data = input_pipeline.PretrainingData(None, files=eval_files, seed=config.seed + 1,
                                             shuffle=False, repeat=False, **data_kwargs)

  writer = metrics.MetricWriter(workdir, tensorboard=config.tensorboard)
  ckpt = checkpointing.run_checkpoints(workdir, max_to_keep=config.max_checkpoints_to_keep)
  records = records_summary.records_identity(train_files)
  init = init_order.initial_state(
      run.objective, run.model, run.tx, run.mesh, run.rules,
      batch_size=config.global_batch_size, seed=config.seed, checkpoints=ckpt,
      init_checkpoint=config.init_checkpoint or None, init_mode=config.init_mode,
      records=records)
  if jax.process_index() == 0:
    file_io.write_text_atomic(file_io.join(workdir, "config.json"), config.to_json_best_effort(
        indent=2) + "\n")
    run.bert_config.to_json_file(file_io.join(workdir, "bert_config.json"))
    keep_vocabulary(config, train_files, workdir)
  n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(init.state.params))
  metrics.log(f"BERT {n_params / 1e6:.1f}M parameters | {run.objective.name} | mesh "
              f"{dict(run.mesh.shape)} on {jax.device_count()} {jax.devices()[0].platform} "
              f"devices, {jax.process_count()} processes | {init.origin} | train "
              f"{len(train_files)} files, eval {len(eval_files)} files "
              f"({train_data.masking_mode} masking"
              + (f", packed{' as read' if train_data.packs_online else ''}: up to "
                 f"{train_data.max_sequences_per_row} sequences per row" if train_data.packed
                 else "") + f") | workdir {workdir}")
  metrics.log(modeling.attention_kernel_description(run.bert_config))

  train_step = step_lib.build_train_step(run.objective, run.model, run.tx, run.schedule,
                                         init.shardings, batch_sh, run.mesh, run.rules,
                                         config.grad_accum_steps)
  eval_step = step_lib.jit_eval_step(step_lib.make_eval_step(run.objective, run.model),
                                     init.shardings.params, batch_sh, run.mesh, run.rules,
                                     init.shardings.model_state)
  result = loop.train(
      init.state, train_step, train_data.global_batches(init.position),
      objective=run.objective,
      config=loop.LoopConfig(
          until_step=config.train_until_step, examples_per_step=config.global_batch_size,
          tokens_per_example=seq_len, log_every_steps=config.log_every_steps,
          checkpoint_every_steps=config.checkpoint_every_steps,
          eval_every_steps=config.eval_every_steps,
          flops_per_step=run.objective.flops_per_step(run.bert_config,
                                                      config.global_batch_size),
          records=records),
      writer=writer, checkpoints=ckpt,
      metadata={"bert_config": hf_config.to_hf_dict(run.bert_config), "run": config.to_dict()},
      evaluate=evaluator(run.objective, eval_step, eval_data, config.eval_steps))
  ckpt.close()
  writer.close()
  skipped = train_data.skipped_records + eval_data.skipped_records
  if skipped:
    metrics.log(f"skipped {skipped} damaged record(s) (data.skip_corrupt_records): "
                + "; ".join(str(d) for d in (train_data.damages + eval_data.damages)[:5]))
  return dict(result.scalars, step=result.step, stopped_early=result.stopped_early,
              skipped_records=skipped)
