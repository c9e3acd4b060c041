"""Pre-training distillation (DistilBERT, Sanh et al. 2019): a student masked LM learns from a
fixed teacher's output distribution and hidden states, in the core's one jitted step.

One parameter tree holds both: the student at the usual top-level scopes (`bert`, `cls`: exactly
a `MaskedLm` model's parameters, so the student exports and fine-tunes as any BERT), and the
teacher under `teacher` (`teacher/bert/...`, `teacher/cls/predictions/...`, its own config:
any size or family its checkpoint has). Being more parameters of the same tree, the teacher is
sharded as the student is (its logical axis names give it shardings) and checkpointed with the
run, so a resumed run never reloads it. It runs deterministically (no dropout) under
`stop_gradient`, and `frozen_scopes = ("teacher",)` keeps the optimizer off it: no update, no
Adam moments, no weight decay.

The loss is DistilBERT's triple loss, each term normalised by whole-batch denominators (so
gradient accumulation stays exact):

  α_ce · T² · soft cross-entropy(student/T, teacher/T)   over the masked positions, weighted by
                                                         `masked_lm_weights`
  + α_mlm · the masked-LM loss                           (`MaskedLm.masked_lm_terms`)
  + α_cos · (1 − cos(h_student, h_teacher))              over real tokens (`input_mask`), last
                                                         hidden states; equal widths needed

with DistilBERT's defaults T = 2, α_ce = 5, α_mlm = 2, α_cos = 1. The soft cross-entropy differs
from DistilBERT's KL divergence by the teacher's entropy, a constant of the student: same
gradients. T² keeps the soft term's gradient scale independent of T (Hinton et al. 2015).

Teacher weights come from `teacher_checkpoint` (any kind `interop.checkpoints.load_any` reads)
through the two hooks of `training/objective.py`: `with_checkpoints` reads the teacher's config
(the model needs it), `initialize_params` loads its weights into the `teacher` scope of a
starting run and optionally initialises the student from it (`student_init`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import traverse_util

from bert_jax.model import modeling, target
from bert_jax.model.configuration import BertConfig, get_preset
from bert_jax.objectives.mlm import MaskedLm, MaskedLmModel
from bert_jax.text import features
from bert_jax.training import perf

TEACHER = "teacher"
STUDENT_INITS = ("scratch", "teacher_every_other_layer")
# How to compute (not the shape): a teacher runs as the student does, whatever its checkpoint
# recorded.
_COMPUTE_FIELDS = ("dtype", "param_dtype", "scan_layers", "stack_unrolled", "remat_policy",
                   "attention_implementation", "dropout_bits", "low_precision_layer_norm",
                   "layer_norm_implementation")


# -------------------------------------------------------------------------------- the models
class TeacherStudent(nn.Module):
  """A student model with its parameters at the root (`nn.share_scope`) and a teacher model
  under `teacher`, on the same inputs: `{"student": ..., "teacher": ...}`, the teacher's outputs
  deterministic and under `stop_gradient`. Any two modules of the same call signature."""
  student: nn.Module
  teacher: nn.Module

  def setup(self):
    nn.share_scope(self, self.student)

  @property
  def config(self) -> BertConfig:
    """The student's config (the init order reads the run model's layout from it)."""
    return self.student.config

  def __call__(self, *inputs, deterministic: bool = True):
    student = self.student(*inputs, deterministic=deterministic)
    teacher = self.teacher(*inputs, deterministic=True)
    return {"student": student, TEACHER: jax.tree.map(jax.lax.stop_gradient, teacher)}


# ------------------------------------------------------------------ loading the teacher's weights
def teacher_compute_config(teacher_config: BertConfig, student_config: BertConfig) -> BertConfig:
  """The teacher's shape, computed as the student is (dtype, layout, attention kernel), except
  for cuDNN's attention where the teacher's heads are not ones it takes
  (`target.cudnn_heads_fit`): the teacher then attends through XLA's kernel."""
  teacher = teacher_config.replace(**{k: getattr(student_config, k) for k in _COMPUTE_FIELDS})
  if teacher.attention_implementation == "cudnn" and not target.cudnn_heads_fit(teacher):
    teacher = teacher.replace(attention_implementation="xla")
  return teacher


def teacher_loader(reader, path: str) -> Callable[[bool], tuple[str, dict]]:
  """`load(scan_layers) -> (origin, params)`: the checkpoint at `path`, read by `reader`
  (`interop.checkpoints`) in the given layer layout, only when called."""
  def load(scan_layers: bool):
    loaded = reader.load_any(path)
    return loaded.origin, reader.in_layout(loaded.params, loaded.config, scan_layers)
  return load


def load_into_scope(params: dict, scope: str, loaded: Mapping, origin: str, field: str) -> dict:
  """`params` with every leaf of `params[scope]` taken from `loaded` (cast to its dtype). The
  checkpoint must have each of them at the same shape — a teacher left partly at its random
  initialisation would teach noise without an error — and may have more (a pooler, a
  next-sentence head), which are left out."""
  fresh = traverse_util.flatten_dict(params[scope], sep="/")
  found = traverse_util.flatten_dict(dict(loaded), sep="/")
  missing = sorted(k for k in fresh if k not in found)
  mismatched = [f"  {k}: checkpoint {tuple(np.shape(found[k]))} vs model "
                f"{tuple(np.shape(fresh[k]))}" for k in fresh
                if k in found and tuple(np.shape(found[k])) != tuple(np.shape(fresh[k]))]
  if missing or mismatched:
    lines = [f"{field}: {origin} does not fit the {scope} model (its config says one shape, its "
             "weights another, or it lacks a part the model needs):"]
    if missing:
      lines.append(f"missing ({len(missing)}): " + ", ".join(missing[:8])
                   + (" ..." if len(missing) > 8 else ""))
    lines += mismatched
    raise ValueError("\n".join(lines))
  unused = sorted(set(found) - set(fresh))
  if unused:
    logging.info("%s: not part of the %s model, left out: %s", origin, scope,
                 ", ".join(unused[:8]) + (" ..." if len(unused) > 8 else ""))
  taken = {k: np.asarray(found[k]).astype(np.asarray(v).dtype) for k, v in fresh.items()}
  return {**params, scope: traverse_util.unflatten_dict(taken, sep="/")}


def copy_every_other_layer(params: dict) -> dict:
  """DistilBERT's student initialisation: student layer i ← teacher layer 2i; the embeddings
  (and any projection of them) and the masked-LM head copied as they are, but a token-type
  table the student does not have (DistilBERT's). Shapes must agree
  (equal widths): a student that cannot take them is refused, naming what differs."""
  field = "config.distillation.student_init=teacher_every_other_layer"
  encoders = (params["bert"].get("encoder", {}), params[TEACHER]["bert"].get("encoder", {}))
  if any("shared_layer" in e for e in encoders):
    raise ValueError(f"{field}: models with shared layers (share_parameters) have no layers "
                     "to pick; use student_init=scratch.")
  scanned = "layer" in encoders[0]
  tree = modeling.unstack_layers(params, 0) if scanned else params
  teacher = tree[TEACHER]
  count = lambda encoder: sum(1 for k in encoder if k.startswith("layer_"))
  s_layers, t_layers = count(tree["bert"]["encoder"]), count(teacher["bert"]["encoder"])
  if 2 * (s_layers - 1) >= t_layers:
    raise ValueError(f"{field}: the student's {s_layers} layers need a teacher of at least "
                     f"{2 * s_layers - 1} (layer i <- layer 2i); the teacher has {t_layers}.")
  encoder = dict(tree["bert"]["encoder"])
  encoder.update({k: v for k, v in teacher["bert"]["encoder"].items()
                  if not k.startswith("layer_")})
  encoder.update({f"layer_{i}": teacher["bert"]["encoder"][f"layer_{2 * i}"]
                  for i in range(s_layers)})
  # The tables the student has (DistilBERT's student has no token-type table).
  embeddings = {k: v for k, v in teacher["bert"]["embeddings"].items()
                if k in tree["bert"]["embeddings"]}
  copied = {"bert": {**tree["bert"], "embeddings": embeddings, "encoder": encoder},
            "cls": {**tree["cls"], "predictions": teacher["cls"]["predictions"]}}
  want = traverse_util.flatten_dict({k: tree[k] for k in copied}, sep="/")
  got = traverse_util.flatten_dict(copied, sep="/")
  differ = [f"  {k}: student {tuple(np.shape(want[k]))}, teacher {tuple(np.shape(got[k]))}"
            for k in want if k not in got or np.shape(got[k]) != np.shape(want[k])]
  if differ or set(got) != set(want):
    raise ValueError(f"{field}: the student cannot take the teacher's weights (the two must "
                     "have the same shape but depth: width, feed-forward size, positions, "
                     "family); use student_init=scratch, or give the student the teacher's "
                     "shape:\n" + "\n".join(differ[:8]))
  out = {**tree, **copied}
  return modeling.stack_layers(out, s_layers) if scanned else out


def soft_cross_entropy(student_logits, teacher_logits, temperature: float) -> jax.Array:
  """−Σ softmax(teacher/T) · log_softmax(student/T) over the last axis, float32."""
  log_p = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
  q = jax.nn.softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
  return -jnp.sum(q * log_p, axis=-1)


def cosine(a, b, eps: float = 1e-8) -> jax.Array:
  """Cosine of the last axis, as torch's `cosine_similarity`: a·b / max(|a|·|b|, eps)."""
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  norms = jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1)
  return jnp.sum(a * b, axis=-1) / jnp.maximum(norms, eps)


# ----------------------------------------------------------------------------- the objective
@dataclasses.dataclass(frozen=True)
class Distillation(MaskedLm):
  """DistilBERT's triple loss (module docstring) on masked-LM records, packed or not.

  Settings (`config.distillation`): `teacher_checkpoint`, `temperature`, `alpha_ce`,
  `alpha_mlm`, `alpha_cos`, `student_init` ("scratch" or "teacher_every_other_layer");
  `teacher_preset` (a size preset) stands in for the checkpoint's config where only the step's
  shape is needed (`--compile_for` before the teacher exists).
  `teacher_config` and `load_teacher` are filled in by `with_checkpoints`.
  """
  name: str = "distill"
  teacher_checkpoint: str = ""
  teacher_preset: str = ""
  temperature: float = 2.0
  alpha_ce: float = 5.0
  alpha_mlm: float = 2.0
  alpha_cos: float = 1.0
  student_init: str = "scratch"
  teacher_config: BertConfig | None = None
  load_teacher: Callable[[bool], tuple[str, dict]] | None = dataclasses.field(
      default=None, compare=False, repr=False)
  head_scopes = ("cls",)
  # An init_checkpoint initialises the student; the teacher always comes from its own.
  init_scopes = ("bert", "cls")
  frozen_scopes = (TEACHER,)
  loss_parts = ("ce", "mlm", "cos")

  #: The run config section whose fields are this objective's settings.
  config_section = "distillation"

  def __post_init__(self):
    super().__post_init__()
    if not self.temperature > 0:
      raise ValueError(f"config.distillation.temperature={self.temperature}: must be positive.")
    for name in ("alpha_ce", "alpha_mlm", "alpha_cos"):
      if getattr(self, name) < 0:
        raise ValueError(f"config.distillation.{name}={getattr(self, name)}: must be >= 0.")
    if self.student_init not in STUDENT_INITS:
      raise ValueError(f"config.distillation.student_init={self.student_init!r}: expected one "
                       f"of {', '.join(STUDENT_INITS)}.")

  # ---------------------------------------------------------------------------- the teacher
  def with_checkpoints(self, reader) -> "Distillation":
    if not str(self.teacher_checkpoint or "").strip() and self.teacher_preset:
      # Only the teacher's shape: enough to build and compile the step ahead of time; a run
      # still needs the checkpoint (initialize_params refuses without it).
      return dataclasses.replace(self, teacher_config=get_preset(self.teacher_preset))
    if not str(self.teacher_checkpoint or "").strip():
      raise ValueError("config.distillation.teacher_checkpoint is not set: name the teacher (a "
                       "pre-training workdir, a Hugging Face BERT directory or a TF1 "
                       "checkpoint with its bert_config.json).")
    return dataclasses.replace(self, teacher_config=reader.read_config(self.teacher_checkpoint),
                               load_teacher=teacher_loader(reader, self.teacher_checkpoint))

  def _teacher_config(self, student_config: BertConfig) -> BertConfig:
    if self.teacher_config is None:
      raise ValueError(f"objective {self.name}: the teacher's config is unknown; the run reads "
                       "it from config.distillation.teacher_checkpoint (with_checkpoints).")
    teacher = teacher_compute_config(self.teacher_config, student_config)
    if teacher.vocab_size != student_config.vocab_size:
      raise ValueError(f"config.distillation.teacher_checkpoint={self.teacher_checkpoint}: the "
                       f"teacher's vocabulary has {teacher.vocab_size} entries, the student's "
                       f"{student_config.vocab_size}: distillation compares their predictions "
                       "over one vocabulary (set config.model.vocab_size, train on records of "
                       "the teacher's vocabulary).")
    if self.alpha_cos and teacher.hidden_size != student_config.hidden_size:
      raise ValueError(f"config.distillation.alpha_cos={self.alpha_cos} compares hidden states, "
                       f"but the student's width is {student_config.hidden_size} and the "
                       f"teacher's {teacher.hidden_size}: give the student the teacher's width "
                       "(config.model.hidden_size) or set config.distillation.alpha_cos=0.")
    return teacher

  def initialize_params(self, params: dict) -> dict:
    if self.load_teacher is None:
      raise ValueError(f"objective {self.name}: no teacher to load; the run reads it from "
                       "config.distillation.teacher_checkpoint (with_checkpoints).")
    scan_layers = "layer" in params["bert"].get("encoder", {})
    origin, loaded = self.load_teacher(scan_layers)
    params = load_into_scope(params, TEACHER, loaded, origin,
                             f"config.distillation.teacher_checkpoint={self.teacher_checkpoint}")
    logging.info("distillation teacher from %s", origin)
    if self.student_init == "teacher_every_other_layer":
      params = copy_every_other_layer(params)
      logging.info("student initialised from the teacher: layer i <- layer 2i, embeddings and "
                   "masked-LM head copied")
    return params

  # ------------------------------------------------------------------------------- the model
  def model(self, bert_config: BertConfig) -> TeacherStudent:
    teacher = self._teacher_config(bert_config)
    logging.info("%s", modeling.attention_kernel_description(bert_config))
    return TeacherStudent(MaskedLmModel(bert_config, return_hidden=True),
                          MaskedLmModel(teacher, return_hidden=True))

  # ------------------------------------------------------------------------ loss and metrics
  def denominators(self, batch) -> dict[str, jax.Array]:
    return {**super().denominators(batch),
            "tokens": jnp.maximum(jnp.sum(batch[features.INPUT_MASK].astype(jnp.float32)), 1.0)}

  def loss(self, outputs, batch, denominators):
    s_logits, s_hidden = outputs["student"]
    t_logits, t_hidden = outputs[TEACHER]
    weights = batch[features.MASKED_LM_WEIGHTS].astype(jnp.float32)
    ce = soft_cross_entropy(s_logits, t_logits, self.temperature)
    agree = (jnp.argmax(s_logits, -1) == jnp.argmax(t_logits, -1)).astype(jnp.float32)
    mlm_term, sums = self.masked_lm_terms(s_logits, batch, denominators)
    ce_sum = jnp.sum(weights * ce)
    sums.update(ce_loss_sum=ce_sum, teacher_agreement_sum=jnp.sum(weights * agree))
    loss = (self.alpha_ce * self.temperature ** 2 * ce_sum / denominators["mlm"]
            + self.alpha_mlm * mlm_term)
    if s_hidden.shape[-1] == t_hidden.shape[-1]:  # else alpha_cos is 0 (checked in `model`)
      mask = batch[features.INPUT_MASK].astype(jnp.float32)
      cos_sum = jnp.sum(mask * cosine(s_hidden, t_hidden))
      token_sum = jnp.sum(mask)
      sums.update(cosine_sum=cos_sum, token_sum=token_sum)
      loss = loss + self.alpha_cos * (token_sum - cos_sum) / denominators["tokens"]
    return loss, sums

  def summarize(self, sums: Mapping[str, Any]) -> dict[str, float]:
    """`mlm_loss`, `mlm_accuracy`, `ce_loss` (the soft cross-entropy at T per masked
    position), `teacher_agreement` (student and teacher top-1 equal at masked positions),
    `cosine` / `cos_loss` (mean over real tokens), and `loss`, their weighted sum."""
    out = {}
    if "mlm_weight_sum" in sums:
      w = max(float(sums["mlm_weight_sum"]), 1e-5)
      out["mlm_loss"] = float(sums["mlm_loss_sum"]) / w
      out["mlm_accuracy"] = float(sums["mlm_correct_sum"]) / w
      out["ce_loss"] = float(sums["ce_loss_sum"]) / w
      out["teacher_agreement"] = float(sums["teacher_agreement_sum"]) / w
      out["loss"] = (self.alpha_ce * self.temperature ** 2 * out["ce_loss"]
                     + self.alpha_mlm * out["mlm_loss"])
    if "cosine_sum" in sums:
      out["cosine"] = float(sums["cosine_sum"]) / max(float(sums["token_sum"]), 1.0)
      out["cos_loss"] = 1.0 - out["cosine"]
      if "loss" in out:
        out["loss"] += self.alpha_cos * out["cos_loss"]
    return out

  # ------------------------------------------------------------------------------- cost
  def flops_per_step(self, bert_config: BertConfig, batch_size: int) -> float:
    """The student's training FLOPs plus one forward pass of the teacher (no backward)."""
    student = super().flops_per_step(bert_config, batch_size)
    if self.teacher_config is None:
      return student
    teacher = self.teacher_config
    h, e, v = teacher.hidden_size, teacher.embedding_width, teacher.vocab_size
    forward = perf.encoder_forward_flops(teacher, batch_size, self.max_seq_length)
    forward += batch_size * self.max_predictions_per_seq * (2 * h * e + 2 * e * v)
    return student + forward
