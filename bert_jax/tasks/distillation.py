"""Task-time distillation: a fine-tuned teacher's predictions teach a smaller student the task
(Hinton et al. 2015; DistilBERT's and TinyBERT's prediction-layer distillation).

`TaskDistillation` wraps the task's own objective (`SequenceClassification`): the student is
that objective's model at the root of the parameter tree (so the fine-tuned student is a plain
model of the task), the teacher the same task model at *its* config under `teacher`, loaded from
a fine-tuning output directory (which holds its classifier head) by the core's
`initialize_params` hook, deterministic, under `stop_gradient`, and frozen by the optimizer
(`frozen_scopes`). Everything else — batches, features, packing, metrics — is the task's.

  loss = α · T² · soft cross-entropy(student/T, teacher/T) + (1 − α) · the task's loss

(regression tasks: α · squared error to the teacher's score + (1 − α) · to the label), both per
example of the whole batch. Defaults T = 2 and α = 0.5: the values of the released DistilBERT
task distillation (`run_squad_w_distillation.py`: temperature 2.0, alpha_ce 0.5 beside the task
loss at 0.5); TinyBERT's prediction-layer distillation used T = 1 without the hard labels.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax.numpy as jnp

from bert_jax.model.configuration import BertConfig
from bert_jax.objectives import distillation
from bert_jax.training.objective import Objective

TEACHER = distillation.TEACHER
# Where a distilled student's run records its teacher's directory (its checkpoint metadata): the
# student's checkpoint holds the teacher's parameters too, so reading the run again needs it.
# A copy of the student alone (`convert`, a pruned model) records none.
RECORDED_TEACHER = "teacher_checkpoint"


@dataclasses.dataclass(frozen=True)
class TaskDistillation(Objective):
  """The task objective `student`, taught by the fine-tuned model at `teacher_checkpoint`."""
  student: Objective
  teacher_checkpoint: str = ""
  temperature: float = 2.0
  alpha: float = 0.5
  teacher_config: BertConfig | None = None
  load_teacher: Callable[[bool], tuple[str, dict]] | None = dataclasses.field(
      default=None, compare=False, repr=False)
  frozen_scopes = (TEACHER,)

  def __post_init__(self):
    if not self.temperature > 0:
      raise ValueError(f"--distill_temperature={self.temperature}: must be positive.")
    if not 0.0 <= self.alpha <= 1.0:
      raise ValueError(f"--distill_alpha={self.alpha}: must lie in [0, 1] (the weight of the "
                       "teacher's soft targets; 1 - alpha goes to the labels).")

  def __getattr__(self, name: str):
    # The task's own attributes (featurize, num_labels, max_seq_length, packing, ...).
    if name.startswith("__") or name == "student":
      raise AttributeError(name)
    return getattr(self.student, name)

  @property
  def name(self) -> str:
    return self.student.name

  @property
  def head_scopes(self) -> tuple[str, ...]:
    return self.student.head_scopes

  @property
  def init_scopes(self):
    return self.student.init_scopes

  @property
  def trim_batches(self) -> bool:
    return self.student.trim_batches

  # ---------------------------------------------------------------------------- the teacher
  def with_checkpoints(self, reader) -> "TaskDistillation":
    if not str(self.teacher_checkpoint or "").strip():
      raise ValueError("--teacher_checkpoint is empty: name the fine-tuned teacher (the "
                       "--output_dir of its fine-tuning run on this task).")
    return dataclasses.replace(
        self, student=self.student.with_checkpoints(reader),
        teacher_config=reader.read_config(self.teacher_checkpoint),
        load_teacher=distillation.teacher_loader(reader, self.teacher_checkpoint))

  def initialize_params(self, params: dict) -> dict:
    if self.load_teacher is None:
      raise ValueError("task distillation: no teacher to load; the run reads it from "
                       "--teacher_checkpoint (with_checkpoints).")
    params = self.student.initialize_params(params)
    origin, loaded = self.load_teacher("layer" in params["bert"].get("encoder", {}))
    return distillation.load_into_scope(params, TEACHER, loaded, origin,
                                        f"--teacher_checkpoint={self.teacher_checkpoint}")

  # ------------------------------------------------------------------------------ the model
  def model(self, bert_config: BertConfig) -> distillation.TeacherStudent:
    if self.teacher_config is None:
      raise ValueError("task distillation: the teacher's config is unknown; the run reads it "
                       "from --teacher_checkpoint (with_checkpoints).")
    if self.teacher_config.vocab_size != bert_config.vocab_size:
      raise ValueError(f"--teacher_checkpoint={self.teacher_checkpoint}: the teacher's "
                       f"vocabulary has {self.teacher_config.vocab_size} entries, the student's "
                       f"{bert_config.vocab_size}: both must read the same token ids.")
    teacher = distillation.teacher_compute_config(self.teacher_config, bert_config)
    return distillation.TeacherStudent(self.student.model(bert_config),
                                       self.student.model(teacher))

  def student_params(self, tree: Mapping[str, Any]) -> dict:
    """A parameter tree (or its shardings) without the teacher: what the student's own model
    (`student.model`) reads, for evaluation and prediction."""
    return {k: v for k, v in tree.items() if k != TEACHER}

  @property
  def input_names(self) -> tuple[str, ...]:
    return self.student.input_names

  def batch_spec(self, batch_size: int):
    return self.student.batch_spec(batch_size)

  # ------------------------------------------------------------------------ loss and metrics
  def denominators(self, batch):
    return self.student.denominators(batch)

  def loss(self, outputs, batch, denominators):
    s_logits, t_logits = outputs["student"], outputs[TEACHER]
    hard, sums = self.student.loss(s_logits, batch, denominators)
    s_logits = s_logits.reshape(-1, s_logits.shape[-1])  # packed rows: (rows, k, outputs)
    t_logits = t_logits.reshape(-1, t_logits.shape[-1])
    weights = batch["weight"].reshape(-1).astype(jnp.float32)
    if s_logits.shape[-1] == 1:  # regression: the teacher's score is the soft target
      soft = jnp.square(s_logits[:, 0] - t_logits[:, 0])
      scale = 1.0
    else:
      soft = distillation.soft_cross_entropy(s_logits, t_logits, self.temperature)
      scale = self.temperature ** 2
      agree = (jnp.argmax(s_logits, -1) == jnp.argmax(t_logits, -1)).astype(jnp.float32)
      sums = dict(sums, teacher_agreement_sum=jnp.sum(weights * agree))
    soft_sum = jnp.sum(weights * soft)
    sums = dict(sums, distill_loss_sum=soft_sum)
    loss = (self.alpha * scale * soft_sum / denominators["examples"]
            + (1.0 - self.alpha) * hard)
    return loss, sums

  def summarize(self, sums: Mapping[str, Any]) -> dict[str, float]:
    """The task's metrics (its `loss` reported as `task_loss`), `distill_loss` (the soft
    cross-entropy at T per example), `teacher_agreement`, and `loss`, the weighted sum."""
    out = dict(self.student.summarize(sums))
    n = max(float(sums.get("weight_sum", 0.0)), 1.0)
    if "loss" in out:
      out["task_loss"] = out.pop("loss")
    if "distill_loss_sum" in sums:
      out["distill_loss"] = float(sums["distill_loss_sum"]) / n
    if "teacher_agreement_sum" in sums:
      out["teacher_agreement"] = float(sums["teacher_agreement_sum"]) / n
    if "task_loss" in out and "distill_loss" in out:
      scale = self.temperature ** 2 if "teacher_agreement" in out else 1.0
      out["loss"] = (self.alpha * scale * out["distill_loss"]
                     + (1.0 - self.alpha) * out["task_loss"])
    return out

  def flops_per_step(self, bert_config: BertConfig, batch_size: int) -> float | None:
    """The student's training FLOPs plus a third of the teacher's (its forward pass only)."""
    student = self.student.flops_per_step(bert_config, batch_size)
    if student is None or self.teacher_config is None:
      return student
    return student + self.student.flops_per_step(self.teacher_config, batch_size) / 3.0

