"""What every fine-tuning run does the same way, whatever its task: the output directory, mesh
and model config (`setup`), the fine-tuning optimizer, the init order and training through the
core loop (`fit`), a stop before the last step (`stopped`), the results file (`finish`), the
forward pass over a task's features (`predict`, packed or not), and its model scored on a split
once per step (`Evaluator`).

Evaluation during training (`eval_every_steps`): the run's `Evaluator` scores its dev split
every so many steps and at the end, as the evaluation after training does (which then reuses
the last one). The best model by the task's metric (`eval_metric`, by default the one its
papers report) is kept in `<output_dir>/best/` — a fine-tuning output directory of its own
(checkpoint, config, vocabulary, and its scores in eval_results.json) that `predict`, `convert`
and `finetune --do_eval` read — and with `early_stopping_patience` training ends after that many
evaluations without improvement (`training/selection.py`).

The runs (each task kind's `tasks/<kind>/run.py`) differ only in how they read, featurize,
score and write; everything here is shared by all of them.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import math
import time
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from bert_jax import file_io, inference
from bert_jax.data import arrays, packed_examples
from bert_jax.interop import checkpoints, hf_config
from bert_jax.model import configuration, modeling, target
from bert_jax.parallel import gpu_targets, sharding
from bert_jax.text import vocab_files
from bert_jax.training import checkpointing, init_order, loop, metrics, optimizer
from bert_jax.training import selection as selection_lib
from bert_jax.training import step as step_lib


@dataclasses.dataclass
class Job:
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
  best: checkpointing.CheckpointManager | None = None   # <output_dir>/best, when kept


# Where a run keeps its best model (`eval_every_steps`), inside its output directory.
BEST = "best"


def refuse_what_the_kind_lacks(config, kind: str, data: str, packing: str) -> None:
  """The refusals a task kind without packing or task-time distillation (tagging, multiple
  choice) makes before any work: `data` says what --data_dir holds, `packing` why --packing
  does not apply."""
  if not config.data_dir:
    raise ValueError(f"--task_name={config.task_name} needs --data_dir ({data}).")
  if config.get("packing"):
    raise ValueError(f"--packing is for GLUE-style tasks and SQuAD{packing}.")
  if config.get("teacher_checkpoint"):
    raise ValueError("--teacher_checkpoint: task-time distillation is for GLUE-style "
                     f"classification and regression tasks, not {kind}.")


def setup(config, tokenizer, max_seq_length: int,
          batch_flags: tuple[str, ...] = ("train_batch_size", "eval_batch_size",
                                          "predict_batch_size")) -> Job:
  """The output directory, mesh and model config of the run `config` describes; the batch
  sizes named in `batch_flags` (the ones the task uses) must split over the data-parallel
  devices."""
  started = time.time()
  output_dir, init_checkpoint = config.output_dir, config.init_checkpoint
  bert_config_file = config.bert_config_file
  file_io.makedirs(output_dir)
  mesh, rules = sharding.mesh_from_config(config)
  for name in batch_flags:
    size = config[name]
    if size % sharding.data_parallel_size(mesh):
      raise ValueError(f"--{name}={size} is not divisible by the "
                       f"{sharding.data_parallel_size(mesh)} data-parallel devices.")
  ckpt = checkpointing.run_checkpoints(output_dir, max_to_keep=1)
  if ckpt.latest_step() is not None:  # this directory's own model: its config
    bert_config = checkpoints.read_config(output_dir, bert_config_file)
  else:
    bert_config = checkpoints.read_config(init_checkpoint, bert_config_file)
  device = mesh.devices.flat[0]
  bert_config = compute_config(config, bert_config, max_seq_length, device.platform,
                               gpu_targets.compute_capability(device))
  if bert_config.attention_implementation in ("cudnn", "pallas"):
    metrics.log(modeling.attention_kernel_description(bert_config))
  bert_config.check_sequence_length(max_seq_length, "--max_seq_length")
  if tokenizer.vocab_size != bert_config.vocab_size:
    raise ValueError(f"The vocabulary has {tokenizer.vocab_size} entries but the model "
                     f"{bert_config.vocab_size}: pass the checkpoint's vocab file.")
  return Job(config, output_dir, mesh, rules, sharding.batch_sharding(mesh), bert_config, ckpt,
              metrics.MetricWriter(output_dir), started)


def compute_config(config: ml_collections.ConfigDict, bert_config: configuration.BertConfig,
                   max_seq_length: int, platform: str,
                   capability: tuple[int, int] | None = None) -> configuration.BertConfig:
  """The checkpoint's model as the run computes it: the config's `dtype`, `hidden_dropout_prob`
  and kernels, and, where the kernels are unset, those the run's devices run (`platform`; a
  CUDA GPU's `capability`, `gpu_targets.compute_capability`): on a CUDA GPU of
  compute capability 8.0 or newer, the fused kernels of pre-training's step
  (`target.fused_kernel_fields`: cuDNN's attention with its dropout, the Triton LayerNorm
  sites) wherever the model and dtype allow them; XLA's elsewhere. The layers' layout stays the
  one the model is built in here (unrolled), which every checkpoint loads into."""
  fields: dict[str, Any] = {"dtype": config.dtype}
  if config.hidden_dropout_prob is not None:
    fields["hidden_dropout_prob"] = config.hidden_dropout_prob
  kernels = ("attention_implementation", "layer_norm_implementation")
  given = {k for k in kernels if config.get(k) is not None}
  fields.update({k: config[k] for k in given})
  bert_config = bert_config.replace(**fields)
  if not target.is_fused_gpu(platform, capability):
    return bert_config
  defaults = target.fused_kernel_fields(bert_config, given, capability, max_seq_length)
  if defaults:
    metrics.log(f"defaults for this GPU of compute capability {capability[0]}.{capability[1]}: "
                + ", ".join(f"{k}={v}" for k, v in defaults.items())
                + " (set --config.<field> to choose otherwise)")
  return bert_config.replace(**defaults)


def num_train_steps(num_examples: int, batch_size: int, epochs: float) -> int:
  """Steps of `epochs` passes over every example (the last batch of an epoch padded)."""
  return max(1, math.ceil(arrays.steps_per_epoch(num_examples, batch_size) * epochs - 1e-9))


def make_optimizer(config, num_steps: int, learning_rate: float, warmup_proportion: float,
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


def row_multiple(job: Job) -> int:
  """Packed rows of a training batch split evenly over processes, data-parallel devices and
  gradient-accumulation micro-batches."""
  shards = math.lcm(sharding.data_parallel_size(job.mesh), jax.process_count())
  return shards * int(job.config.get("grad_accum_steps", 1))


def packer(job: Job, objective, feats, batch_size: int, seed) -> tuple[Any, float]:
  """The batch packer of a packed run, and the rows a step holds on average (for MFU); logs
  how well the first epoch's batches (up to 256 of them) pack."""
  k = objective.max_sequences_per_row
  multiple = row_multiple(job)
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


def keep_serving_files(job: Job, tokenizer, directory: str) -> None:
  """What serving a model needs beside its checkpoint: its config and vocabulary."""
  if jax.process_index() == 0:
    job.bert_config.to_json_file(file_io.join(directory, "bert_config.json"))
    files = vocab_files.of_tokenizer(tokenizer)
    if files.main:
      vocab_files.keep(files, directory)


def _best_keeper(job: Job, tokenizer, meta: dict[str, Any]
                 ) -> Callable[[int, Any, dict[str, float]], None]:
  """Keeps a new best model in `<output_dir>/best`: its whole train state (so that the directory
  is a fine-tuning output in its own right), config, vocabulary and scores. The new step is
  written before the old one is removed, so there is a best model at every moment."""
  directory = file_io.join(job.output_dir, BEST)
  job.best = checkpointing.run_checkpoints(directory, max_to_keep=None, async_save=False)
  served = False  # the config and vocabulary, the same for every best: written once

  def keep(step: int, state, scalars: dict[str, float]) -> None:
    nonlocal served
    if step in job.best.all_steps():  # a resumed run reaching a step it had kept before
      job.best.delete(step)
    job.best.save(step, state, {}, meta)
    for old in job.best.all_steps():
      if old != step:
        job.best.delete(old)
    if not served:
      keep_serving_files(job, tokenizer, directory)
      served = True
    if jax.process_index() == 0:
      file_io.write_text_atomic(file_io.join(directory, "eval_results.json"), json.dumps(
          {"step": step, **scalars}, indent=2, default=float) + "\n")
    metrics.log(f"best so far: step {step}, kept in {directory}")
  return keep


def run_training(job: Job, objective, model, tx, schedule, init, feats, num_steps: int,
                 batch_size: int, seed: int, tokenizer, metadata: dict[str, Any],
                 evaluator: "Evaluator | None" = None):
  """Trains through the core loop (checkpoints with the data position: an interrupted run
  resumes; with `eval_every_steps`, the `evaluator` scores the dev split as it goes and the best
  model is kept), then keeps what serving the model needs beside it: its config and
  vocabulary. Returns the loop's result and the model selection (None without evaluation
  during training)."""
  config = job.config
  train_step = step_lib.build_train_step(objective, model, tx, schedule, init.shardings,
                                         job.batch_sh, job.mesh, job.rules,
                                         config.get("grad_accum_steps", 1))
  pack, rows_per_step = None, batch_size
  if objective.max_sequences_per_row:
    pack, rows_per_step = packer(job, objective, feats, batch_size,
                                 [seed, config.shuffle_seed_offset])
  batches = arrays.training_batches(feats, batch_size, job.batch_sh,
                                    seed=[seed, config.shuffle_seed_offset],
                                    trim=objective.trim_batches, position=init.position,
                                    pack=pack)
  meta = {"bert_config": hf_config.to_hf_dict(job.bert_config),
          "do_lower_case": bool(tokenizer.do_lower_case), **metadata}
  every = config.get("eval_every_steps")
  evaluate = selection = None
  if every and evaluator is not None:
    evaluate = evaluator.scalars
    selection = selection_lib.Selection(
        f"{evaluator.tag}/{config.get('eval_metric') or evaluator.metric}",
        patience=config.get("early_stopping_patience"),
        on_best=(_best_keeper(job, tokenizer, meta) if config.get("keep_best", True)
                 else None)).restored(init.metadata)
  result = loop.train(
      init.state, train_step, batches, objective=objective,
      config=loop.LoopConfig(
          until_step=num_steps, examples_per_step=batch_size,
          tokens_per_example=objective.max_seq_length, log_every_steps=config.log_every_steps,
          checkpoint_every_steps=config.checkpoint_every_steps, eval_every_steps=every,
          flops_per_step=objective.flops_per_step(job.bert_config, rows_per_step)),
      writer=job.writer, checkpoints=job.checkpoints, metadata=meta, evaluate=evaluate,
      selection=selection)
  keep_serving_files(job, tokenizer, job.output_dir)
  return result, selection


def fit(job: Job, objective, model, tokenizer, *, feats, num_steps: int,
        metadata: dict[str, Any], header: str, results: dict[str, Any],
        evaluator: "Evaluator | None" = None) -> tuple[Any, Any]:
  """The init order, then (when `feats` are given) training at the config's batch size,
  learning rate and seed, with the `evaluator` scoring the dev split every `eval_every_steps`:
  `(state, loop result or None)`. Training settings and time go into `results`."""
  config = job.config
  tx, schedule = make_optimizer(config, num_steps, config.learning_rate,
                                config.warmup_proportion,
                                num_layers=job.bert_config.num_hidden_layers,
                                frozen_scopes=objective.frozen_scopes)
  init = init_order.initial_state(objective, model, tx, job.mesh, job.rules,
                                  batch_size=config.train_batch_size, seed=config.seed,
                                  checkpoints=job.checkpoints,
                                  init_checkpoint=config.init_checkpoint,
                                  bert_config_file=config.bert_config_file)
  metrics.log(f"{header}: {init.origin}; {job.bert_config.num_hidden_layers} layers; mesh "
              f"{dict(job.mesh.shape)}")
  if feats is None:
    look = _INSPECTOR.get()
    if look is not None:  # `inspect`: the model handed over instead of evaluated
      try:
        value = look(Inspection(job, objective, model, evaluator, init.state))
      finally:
        _close(job)
      raise _Inspected(value)
    return init.state, None
  result, selection = run_training(job, objective, model, tx, schedule, init, feats, num_steps,
                                   config.train_batch_size, config.seed, tokenizer, metadata,
                                   evaluator)
  results["train_steps"] = num_steps
  results["train_seconds"] = time.time() - job.started
  if selection is not None and selection.best_step is not None:
    kept = file_io.join(job.output_dir, BEST) if selection.on_best else None
    results["best"] = {"step": selection.best_step, "metric": selection.metric,
                       "value": selection.best_value, "directory": kept}
    metrics.log(selection.describe() + (f": kept in {kept}" if kept else ""))
  if result.out_of_patience:
    results["early_stopping"] = {"stopped_at_step": result.step,
                                 "patience": config.early_stopping_patience}
  return result.state, result


@dataclasses.dataclass
class Inspection:
  """A fine-tuned model as its run sees it: the job, the task's objective and model, the
  restored train state, and the evaluator that scores a split with the task's own reader and
  metric (`Evaluator`; its `apply` takes any `predict`, so other parameters can be scored)."""
  job: Job
  objective: Any
  model: Any
  evaluator: "Evaluator | None"
  state: Any


_INSPECTOR: contextvars.ContextVar[Callable[[Inspection], Any] | None] = contextvars.ContextVar(
    "finetune_inspector", default=None)


class _Inspected(Exception):
  """Carries what `inspect`'s callback returned out of the run that called it."""

  def __init__(self, value):
    super().__init__("inspected")
    self.value = value


def inspect(run: Callable[[], Any], look: Callable[[Inspection], Any]) -> Any:
  """`look(inspection)` of the fine-tuned model that `run()` (a task kind's run of a config
  without training: its output directory holds the model) sets up, in place of evaluating
  it: what `analyze heads` uses to score changed models with every task's own reader, metric
  and features. The run's files are closed after `look` returns."""
  token = _INSPECTOR.set(look)
  try:
    run()
  except _Inspected as handed:
    return handed.value
  finally:
    _INSPECTOR.reset(token)
  raise ValueError("the fine-tuning run ended before its model was set up.")


def stopped(job: Job, result, num_steps: int, results: dict[str, Any]) -> dict[str, Any]:
  """A stop before the last step: no evaluation of a half-trained model, and no
  eval_results.json that could be taken for a finished run's."""
  metrics.log(f"Stopped at step {result.step} of {num_steps}: not evaluated. Run the same "
              "command again to resume.")
  _close(job)
  return dict(results, stopped_early=True, seconds=time.time() - job.started)


def _close(job: Job) -> None:
  job.checkpoints.close()
  if job.best is not None:
    job.best.close()
  job.writer.close()


def finish(job: Job, results: dict[str, Any]) -> dict[str, Any]:
  results["seconds"] = time.time() - job.started
  if jax.process_index() == 0:
    file_io.write_text_atomic(file_io.join(job.output_dir, "eval_results.json"),
                              json.dumps(results, indent=2, default=float) + "\n")
  _close(job)
  return results


def predict(predictor: inference.Predictor, objective, params, feats, batch_size: int, *,
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


def recorded(output_dir: str) -> dict[str, Any]:
  """What a fine-tuning output directory's own checkpoint recorded about its task (labels,
  endings, head settings), so that evaluating or predicting without `--do_train` builds the
  model it holds; {} when it holds no checkpoint yet."""
  if not file_io.exists(output_dir):
    return {}
  try:
    return checkpoints.run_metadata(output_dir)
  except (FileNotFoundError, ValueError):
    return {}


class Evaluator:
  """A run's model applied to one of its splits, once per (step, split): the evaluations during
  training (`eval_every_steps`) and the one after it share the work.

  `apply(predict, split)` returns `(scores or None, outputs)` — None where the split has no gold
  answers to score — with `predict(feats, batch_size, *, desc, trim=True)` the model's outputs
  for a split's features under the parameters being evaluated. Evaluation during training
  scores `split`, its numbers reported as `<tag>/<name>`; `metric` is the task's own measure of
  a better model (the one its papers report). `params_of` picks the evaluated model's
  parameters from the train state's (a distilled student's, without its teacher).
  `loss_features(split)`, where given, cuts a split with the training targets the scored
  features lack (what a loss on the dev data, such as head importance, reads).
  """

  def __init__(self, job: Job, objective, model,
               apply: Callable[[Callable, str], tuple[dict[str, Any] | None, Any]], *,
               split: str, tag: str, metric: str, params_of: Callable[[Any], Any] | None = None,
               loss_features: Callable[[str], dict[str, np.ndarray]] | None = None):
    self.job, self.objective, self.model, self._apply = job, objective, model, apply
    # A split's features with the loss's targets, where the ones scored lack them (SQuAD's
    # prediction windows carry no answer positions); None: the scored features have them.
    self.loss_features = loss_features
    self.split, self.tag, self.metric = split, tag, metric
    self._params_of = params_of or (lambda params: params)
    self._predictor: inference.Predictor | None = None
    self._memo: dict[tuple[int, str], Any] = {}

  def __call__(self, state, split: str) -> tuple[dict[str, Any] | None, Any]:
    key = (int(state.step), split)
    if key not in self._memo:
      params = self._params_of(state.params)
      if self._predictor is None:  # laid out as training laid out the parameters
        self._predictor = inference.Predictor(
            self.model, self.objective.input_names, mesh=self.job.mesh, rules=self.job.rules,
            param_shardings=jax.tree.map(lambda a: a.sharding, params))

      def run(feats, batch_size: int, *, desc: str, trim: bool = True):
        return predict(self._predictor, self.objective, params, feats, batch_size, desc=desc,
                       trim=trim)

      self._memo = {k: v for k, v in self._memo.items() if k[0] == key[0]}
      self._memo[key] = self._apply(run, split)
    return self._memo[key]

  def model_params(self, params: Any) -> Any:
    """The evaluated model's parameters within a train state's (a distilled student's)."""
    return self._params_of(params)

  def score_with(self, predict: Callable, split: str) -> tuple[dict[str, Any] | None, Any]:
    """The split scored from the outputs of any `predict(feats, batch_size, *, desc, trim)`
    (another model's, other parameters'), with this run's reader, features and metric."""
    return self._apply(predict, split)

  def scalars(self, state) -> dict[str, float]:
    """The scores of `split` as the loop reports an evaluation (`<tag>/<name>`)."""
    scores, _ = self(state, self.split)
    if scores is None:
      raise ValueError(f"--eval_every_steps: the {self.split} data has no gold answers to "
                       "score.")
    return {f"{self.tag}/{k}": int(v) if isinstance(v, (int, np.integer)) else float(v)
            for k, v in scores.items()
            if isinstance(v, (int, float, np.number)) and not isinstance(v, bool)}
