"""Which heads a fine-tuned model can lose: head importance on its task's dev data, the task's
metric as heads are pruned by importance, and a smaller model that keeps the N most important.

Michel et al. (2019, "Are Sixteen Heads Really Better than One?", Section 4 and Figure 3):
importance is E|∂L/∂ξ_h| over the dev data (`heads.head_importance`, normalised per layer);
heads are removed iteratively, a fixed share of all heads at a time, by importance measured
again on the model as it is after each removal, and the task's metric is read after every
step. Removing a head during the study is silencing it (`pruning.masked`: its rows of the
attention output set to zero, exactly a gate of 0), so one compiled forward pass serves every
step; the model finally written (`--prune_to`) has the heads cut out of its matrices
(`pruning.prune_heads`), computes the same outputs, and is timed against the original.

The model, its dev data and metric are the fine-tuning run's own (`finetune_job.inspect`),
so every task kind works as `finetune --do_eval` scores it. Importance needs the loss, so the
dev features must carry its targets: GLUE-style labels, tags and multiple-choice answers do;
SQuAD's dev questions are cut again as training cuts them, with answer positions
(`Evaluator.loss_features`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any, Callable

import jax
import numpy as np

from bert_jax import file_io, inference
from bert_jax.analysis import attention
from bert_jax.analysis import heads as heads_lib
from bert_jax.data import arrays
from bert_jax.interop import checkpoints, hf_config
from bert_jax.model import pruning
from bert_jax.runs import finetune_config, finetune_job
from bert_jax.tasks import distillation as task_distillation
from bert_jax.tasks import finetuned, registry
from bert_jax.training import checkpointing, metrics
from bert_jax.training import selection as selection_lib
from bert_jax.training import state as state_lib
from bert_jax.training import step as step_lib
from bert_jax.text import vocab_files

# Within this share of the unpruned score a pruned model "keeps" the metric.
TOLERANCE = 0.01
# Dev rows the pruned and the full model are timed on.
TIMED_ROWS = 256
# Input settings a fine-tuned checkpoint records, which its dev data is read with again.
_RECORDED = ("max_seq_length", "doc_stride", "max_query_length", "document_context",
             "label_list")


@dataclasses.dataclass
class Step:
  """One point of the curve: how many heads are silenced, and the metric then."""
  pruned: int
  score: float
  mask: np.ndarray  # (layers, heads): 1 kept, 0 silenced


@dataclasses.dataclass
class Study:
  """What `run` measured: the metric's name, the importance of every head of the full model,
  the curve, and (with `prune_to`) the model written and its timing."""
  metric: str
  importance: np.ndarray
  steps: list[Step]
  pruned_model: dict[str, Any] | None = None

  @property
  def total_heads(self) -> int:
    return int(self.importance.size)

  @property
  def higher_is_better(self) -> bool:
    """As model selection reads a metric: a `...loss` is better lower, the rest higher."""
    return selection_lib.Selection(self.metric).higher_is_better

  def within(self, score: float, tolerance: float = TOLERANCE) -> bool:
    """Whether `score` is within `tolerance` (relative) of the unpruned score, or better."""
    base = self.steps[0].score
    if self.higher_is_better:
      return score >= base - tolerance * abs(base)
    return score <= base + tolerance * abs(base)

  def prunable_within(self, tolerance: float = TOLERANCE) -> int:
    """The most heads pruned at a step whose score is within `tolerance` of the unpruned."""
    return max(s.pruned for s in self.steps if self.within(s.score, tolerance))

  def as_dict(self) -> dict[str, Any]:
    return {"metric": self.metric, "total_heads": self.total_heads,
            "importance": self.importance.round(6).tolist(),
            "curve": [{"pruned": s.pruned, "kept": self.total_heads - s.pruned,
                       "fraction_pruned": s.pruned / self.total_heads, "score": s.score,
                       "mask": s.mask.astype(int).tolist()} for s in self.steps],
            f"prunable_within_{int(TOLERANCE * 100)}pct": self.prunable_within(),
            "pruned_model": self.pruned_model}


def _schedule(total: int, fraction: float, prune_to: int | None) -> list[int]:
  """Heads silenced after each step: every `fraction` of the heads up to all of them, and the
  count that leaves `prune_to` heads."""
  step = max(1, int(round(fraction * total)))
  counts = set(range(step, total + 1, step)) | {total}
  if prune_to is not None:
    counts.add(total - prune_to)
  return sorted(c for c in counts if c > 0)


def _batches(feats: dict[str, np.ndarray], batch_size: int):
  padded = arrays.pad_rows(feats, batch_size)
  for start in range(0, len(padded["weight"]), batch_size):
    yield {k: v[start:start + batch_size] for k, v in padded.items()}


def _check_targets(objective, model, params, feats, task: str) -> None:
  """Refuses dev features without what the loss reads, naming what is missing."""
  batch = next(_batches(feats, 1))
  try:
    jax.eval_shape(lambda p, b: step_lib.deterministic_loss(objective, model, p, b),
                   params, batch)
  except KeyError as e:
    raise ValueError(f"task {task!r}: its dev features carry no {e} (the loss's targets), so "
                     "head importance, the gradient of that loss, cannot be measured on them."
                     ) from None


class _Scorer:
  """The task's metric on its dev split for any parameters of the model's shape: the run's
  own evaluator applied to the outputs of those parameters. Keeps the features it was given
  (for the importance batches)."""

  def __init__(self, inspection: finetune_job.Inspection, split: str, model=None):
    self.inspection, self.split = inspection, split
    self.objective = inspection.evaluator.objective
    self.predictor = inference.Predictor(model or inspection.evaluator.model,
                                         self.objective.input_names)
    self.feats: dict[str, np.ndarray] | None = None
    # The task's own measure, or the run's --eval_metric.
    self.metric = inspection.job.config.get("eval_metric") or inspection.evaluator.metric

  def __call__(self, params) -> float:
    placed = self.predictor.place(params)

    def predict(feats, batch_size, *, desc, trim=True):
      self.feats = feats
      return finetune_job.predict(self.predictor, self.objective, placed, feats, batch_size,
                                  desc=desc, trim=trim)

    scores, _ = self.inspection.evaluator.score_with(predict, self.split)
    if scores is None:
      raise ValueError(f"the {self.split} data has no gold answers to score "
                       f"{self.metric} on.")
    if self.metric not in scores:
      names = sorted(k for k, v in scores.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool))
      raise ValueError(f"--eval_metric={self.metric}: the {self.split} scores are "
                       f"{', '.join(names)}.")
    return float(scores[self.metric])


def run(inspection: finetune_job.Inspection, *, task: str, fraction: float = 0.1,
        prune_to: int | None = None, batch_size: int = 32, output_dir: str | None = None,
        log: Callable[[str], None] = metrics.log) -> Study:
  """The study on the inspected model (see the module's docstring); with `prune_to`, the model
  keeping that many heads is written to `<output_dir>/pruned` and timed against the full one."""
  config = inspection.job.bert_config
  if config.pruned_heads is not None:
    raise ValueError("this model has pruned heads already: study the model it was pruned "
                     "from.")
  total = config.num_hidden_layers * config.num_attention_heads
  if prune_to is not None and not 0 <= prune_to <= total:
    raise ValueError(f"--prune_to={prune_to}: the model has {total} heads "
                     f"({config.num_hidden_layers} layers x {config.num_attention_heads}).")
  if not 0 < fraction <= 1:
    raise ValueError(f"--prune_fraction={fraction}: a share of the heads in (0, 1].")
  pruned_dir = file_io.join(output_dir, "pruned") if output_dir else None
  if prune_to is not None and pruned_dir and file_io.exists(pruned_dir):
    raise ValueError(f"{pruned_dir} exists: give another --output_dir (a pruned model is never "
                     "written over another).")
  # The evaluated model (a distilled student without its teacher): what is studied and pruned.
  objective, model = inspection.evaluator.objective, inspection.evaluator.model
  params = jax.tree.map(np.asarray, jax.device_get(
      inspection.evaluator.model_params(inspection.state.params)))
  scorer = _Scorer(inspection, inspection.evaluator.split)
  started = time.time()
  mask = np.ones((config.num_hidden_layers, config.num_attention_heads), np.float32)
  steps = [Step(0, scorer(params), mask.copy())]
  log(f"all {total} heads: {scorer.metric} {steps[0].score:.4f} on {scorer.split} "
      f"({len(scorer.feats['weight'])} rows)")
  evaluator = inspection.evaluator
  loss_feats = (evaluator.loss_features(scorer.split) if evaluator.loss_features
                else scorer.feats)
  _check_targets(objective, model, params, loss_feats, task)

  meter = heads_lib.ImportanceMeter(objective, model, config)

  def importance_of(current):
    return meter(pruning.masked(params, config, current), _batches(loss_feats, batch_size))

  full_importance = importance_of(mask)
  importance = full_importance
  schedule = _schedule(total, fraction, prune_to)
  for n, count in enumerate(schedule):
    ranked = np.where(mask > 0, importance, np.inf).reshape(-1)
    silence = np.argsort(ranked, kind="stable")[:count - steps[-1].pruned]
    mask.reshape(-1)[silence] = 0.0
    steps.append(Step(count, scorer(pruning.masked(params, config, mask)), mask.copy()))
    elapsed = time.time() - started
    log(f"pruned {count}/{total} heads: {scorer.metric} {steps[-1].score:.4f} "
        f"[{n + 1}/{len(schedule)}, {elapsed:.0f}s, ETA "
        f"{elapsed / (n + 1) * (len(schedule) - n - 1):.0f}s]")
    if count < total:
      importance = importance_of(mask)
  study = Study(scorer.metric, full_importance, steps)
  if prune_to is not None and output_dir is not None:
    target = next(s for s in steps if s.pruned == total - prune_to)
    study.pruned_model = write_pruned(inspection, params, target.mask, pruned_dir, scorer,
                                      batch_size)
    study.pruned_model["score_masked"] = target.score
    log(f"kept {prune_to} heads in {study.pruned_model['directory']}: {scorer.metric} "
        f"{study.pruned_model['score']:.4f}, {study.pruned_model['speedup']:.2f}x the full "
        f"model's speed, {study.pruned_model['parameter_ratio']:.3f} of its parameters")
  return study


def study_checkpoint(checkpoint: str, given: dict[str, Any], tokenizer, **options) -> Study:
  """`run` on the fine-tuned model in `checkpoint` (a `finetune` output directory, or its
  `best/`), its task read as `finetune --do_eval` would read it: the task and input settings
  the checkpoint recorded, with the fine-tuning fields in `given` on top (`--data_dir`, ...)."""
  info = finetuned.inspect_checkpoint(checkpoint)
  if info.kind != "orbax" or info.task is None:
    raise ValueError(f"{checkpoint} is {info.describe()}: `analyze heads` needs a fine-tuned "
                     "model (the --output_dir of `finetune`, or its best/).")
  recorded = info.metadata
  task = str(given.pop("task_name", None) or info.task)
  if task.lower().startswith("squad "):  # recorded as "squad v1.1" / "squad v2.0"
    task = "squad_v2" if "v2" in task else "squad_v1"
  fields = {name: recorded[name] for name in _RECORDED if recorded.get(name) is not None}
  fields.update(task_name=task, output_dir=info.where, init_checkpoint=None, do_train=False,
                do_eval=True, do_predict=False, **given)
  config = finetune_config.make(**fields)
  return finetune_job.inspect(lambda: registry.run_from_config(config, tokenizer),
                              lambda inspection: run(inspection, task=task, **options))


def _timed_side_by_side(models: dict[str, tuple[inference.Predictor, Any]],
                        feats: dict[str, np.ndarray], batch_size: int, repeats: int = 5,
                        max_rows: int = TIMED_ROWS) -> dict[str, float]:
  """Seconds of the fastest of `repeats` forward passes of each model over the same (up to
  `max_rows`) rows, after one pass each to compile; the models take turns, so that whatever
  else the machine does falls on both alike."""
  rows = {k: v[:max_rows] for k, v in feats.items()}
  placed = {name: predictor.place(params) for name, (predictor, params) in models.items()}
  for name, (predictor, _) in models.items():
    predictor(placed[name], rows, batch_size, progress=False)
  best = {name: math.inf for name in models}
  for _ in range(repeats):
    for name, (predictor, _) in models.items():
      start = time.perf_counter()
      predictor(placed[name], rows, batch_size, progress=False)
      best[name] = min(best[name], time.perf_counter() - start)
  return best


def _count(params) -> tuple[int, int]:
  leaves = jax.tree.leaves(params)
  return sum(int(np.size(a)) for a in leaves), sum(int(np.asarray(a).nbytes) for a in leaves)


def write_pruned(inspection: finetune_job.Inspection, params, mask: np.ndarray, directory: str,
                 scorer: _Scorer, batch_size: int) -> dict[str, Any]:
  """The model without the heads `mask` silences, written as a fine-tuning output directory
  (train state with fresh optimizer moments, config with `pruned_heads`, vocabulary, the run's
  metadata) that `finetune --do_eval`, `predict` and `convert` read; scored and timed against
  the full model on the same dev features."""
  job, objective = inspection.job, inspection.evaluator.objective
  config = job.bert_config
  remove = {layer: [int(h) for h in np.flatnonzero(mask[layer] == 0)]
            for layer in range(config.num_hidden_layers)}
  pruned_config, pruned_params = pruning.prune_heads(params, config, remove)
  pruned_model = objective.model(pruned_config)
  tx, _ = finetune_job.make_optimizer(job.config, 1, job.config.learning_rate,
                                      job.config.warmup_proportion,
                                      num_layers=config.num_hidden_layers,
                                      frozen_scopes=objective.frozen_scopes)
  state = state_lib.TrainState(step=inspection.state.step, params=pruned_params,
                               opt_state=tx.init(pruned_params), rng=inspection.state.rng,
                               model_state=inspection.state.model_state)
  source = job.output_dir
  meta = {k: v for k, v in checkpoints.run_metadata(source).items()
          if k != task_distillation.RECORDED_TEACHER}  # the student alone is written
  meta.update(bert_config=hf_config.to_hf_dict(pruned_config), pruned_from=source)
  manager = checkpointing.run_checkpoints(directory, max_to_keep=None, async_save=False)
  manager.save(int(inspection.state.step), state, {}, meta)
  manager.close()
  pruned_config.to_json_file(file_io.join(directory, "bert_config.json"))
  vocab_files.copy_kept(source, directory)
  # The pruned model scored by the same evaluator, then both timed on the same features.
  pruned_scorer = _Scorer(inspection, scorer.split, model=pruned_model)
  score = pruned_scorer(pruned_params)
  seconds = _timed_side_by_side({"full": (scorer.predictor, params),
                                 "pruned": (pruned_scorer.predictor, pruned_params)},
                                scorer.feats, batch_size)
  full_s, pruned_s = seconds["full"], seconds["pruned"]
  full_n, full_bytes = _count(params)
  pruned_n, pruned_bytes = _count(pruned_params)
  return {"directory": directory, "heads_kept": pruned_config.num_heads_kept,
          "heads_per_layer": [pruned_config.heads_in_layer(i)
                              for i in range(config.num_hidden_layers)],
          "pruned_heads": [list(h) for h in pruned_config.pruned_heads or ()],
          "score": score, "seconds_full": full_s, "seconds_pruned": pruned_s,
          "speedup": full_s / pruned_s,
          "rows_timed": min(len(scorer.feats["weight"]), TIMED_ROWS),
          "parameters_full": full_n, "parameters_pruned": pruned_n,
          "parameter_ratio": pruned_n / full_n, "bytes_full": full_bytes,
          "bytes_pruned": pruned_bytes}


# ------------------------------------------------------------------------------- writing
def write(study: Study, output_dir: str) -> list[str]:
  """`head_pruning.json`, `head_pruning.png` (the metric against the share of heads pruned,
  the 1% band drawn) and `head_importance.png` (layers × heads)."""
  plt = attention.pyplot()
  file_io.makedirs(output_dir)
  written = [file_io.join(output_dir, "head_pruning.json")]
  file_io.write_text_atomic(written[0], json.dumps(study.as_dict(), indent=1) + "\n")

  def save(fig, name):
    written.append(file_io.join(output_dir, name))
    attention.save_png(fig, written[-1])
    plt.close(fig)

  total = study.total_heads
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  x = [100.0 * s.pruned / total for s in study.steps]
  ax.plot(x, [s.score for s in study.steps], marker="o")
  base = study.steps[0].score
  band = TOLERANCE * abs(base) * (-1 if study.higher_is_better else 1)
  ax.axhspan(min(base, base + band), max(base, base + band), color="tab:green", alpha=0.15,
             label=f"within {TOLERANCE:.0%} of all heads")
  if study.pruned_model:
    kept = study.pruned_model["heads_kept"]
    ax.scatter([100.0 * (total - kept) / total], [study.pruned_model["score"]], color="tab:red",
               zorder=3, label=f"pruned model ({kept} heads)")
  ax.set_xlabel("heads pruned, by importance (%)")
  ax.set_ylabel(study.metric)
  ax.set_title(f"{study.metric} as heads are pruned ({total} heads)")
  ax.grid(alpha=0.3)
  ax.legend(loc="lower left")
  save(fig, "head_pruning.png")

  fig, ax = plt.subplots(figsize=(0.45 * study.importance.shape[1] + 2,
                                  0.4 * study.importance.shape[0] + 1.5))
  image = ax.imshow(study.importance, cmap="viridis", aspect="auto")
  ax.set_xlabel("head")
  ax.set_ylabel("layer")
  ax.set_xticks(range(study.importance.shape[1]))
  ax.set_yticks(range(study.importance.shape[0]))
  ax.set_title("head importance (normalised per layer)")
  fig.colorbar(image, ax=ax)
  save(fig, "head_importance.png")
  return written


def table(study: Study) -> str:
  """The curve as text: heads pruned, kept, the metric and its change."""
  base = study.steps[0].score
  lines = [f"{'pruned':>7} {'kept':>5} {study.metric:>10} {'change':>8}"]
  for s in study.steps:
    lines.append(f"{s.pruned:>7} {study.total_heads - s.pruned:>5} {s.score:>10.4f} "
                 f"{(s.score - base):>+8.4f}")
  lines.append(f"{study.prunable_within()} of {study.total_heads} heads pruned within "
               f"{TOLERANCE:.0%} of the full model's {study.metric}.")
  return "\n".join(lines)
