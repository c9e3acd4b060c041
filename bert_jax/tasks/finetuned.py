"""A fine-tuned (or pre-trained) model read back for prediction: what a `--checkpoint` is and
which task kind it serves (`registry`), its weights with the task's head, its vocabulary and
tokenizer, and the forward pass over a task's features. Each kind's `predict.py` builds on these;
`python -m bert_jax.predict` maps flags onto them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bert_jax import inference
from bert_jax.interop import checkpoints, task_heads
from bert_jax.interop import convert as interop_convert
from bert_jax.model import configuration
from bert_jax.model import int8 as int8_lib
from bert_jax.tasks import distillation as task_distillation
from bert_jax.tasks import registry
from bert_jax.text import tokenization, vocab_files

FILL_MASK_NEEDS = "a pre-training model (masked-LM head)"


class PredictError(ValueError):
  """A checkpoint, vocabulary or input that does not fit the request; the message says why."""


@dataclasses.dataclass
class CheckpointInfo:
  """What `--checkpoint` is, read without loading any weights."""
  path: str
  kind: str                 # "tf1", "hf" or "orbax" (`checkpoints.checkpoint_kind`)
  where: str                # the TF1 prefix, or the directory
  metadata: dict[str, Any]  # an Orbax checkpoint's metadata; {} for the other kinds

  @property
  def task(self) -> str | None:
    task = self.metadata.get("task")
    return str(task) if task else None

  @property
  def mode(self) -> str:
    """The mode this checkpoint serves: fine-tuning records its task, pre-training none."""
    return "fill_mask" if self.task is None else registry.find(self.task).mode

  def describe(self) -> str:
    if self.kind != "orbax":
      return f"{checkpoints.KIND_NAMES[self.kind]} ({self.where}), a pre-training model"
    if self.mode == "fill_mask":
      return "a pre-training checkpoint (its metadata names no fine-tuned task)"
    labels = self.metadata.get("num_labels") if self.mode == "classify" else None
    return (f"{registry.find(self.task).model_name} (task {self.task!r}"
            + (f", {labels} outputs)" if labels else ")"))


def inspect_checkpoint(path: str) -> CheckpointInfo:
  """The kind of `path` and, for an Orbax checkpoint, its metadata (a small JSON item)."""
  try:
    kind, where = checkpoints.checkpoint_kind(path)
    metadata: dict[str, Any] = checkpoints.run_metadata(where) if kind == "orbax" else {}
  except (ValueError, FileNotFoundError) as e:
    raise PredictError(str(e)) from e
  return CheckpointInfo(path, kind, where, metadata)


def check_mode(info: CheckpointInfo, mode: str) -> None:
  """Refuses a checkpoint of another kind, naming the path, what it is and what would fit."""
  if info.mode == mode:
    return
  hint = f" Use --mode={info.mode} (or --mode=auto) for this checkpoint."
  needs = FILL_MASK_NEEDS if mode == "fill_mask" else registry.for_mode(mode).serves
  raise PredictError(f"--mode={mode} needs {needs}, but {info.path} is "
                     f"{info.describe()}.{hint}")


def _load(info: CheckpointInfo, require_heads: bool) -> tuple[configuration.BertConfig, Any]:
  """`checkpoints.load_pretraining_model`, whose errors (no heads, shapes that do not fit the
  config, no config beside a TF1 checkpoint) are about the checkpoint, so are reported as such."""
  try:
    return checkpoints.load_pretraining_model(info.where, require_heads=require_heads)
  except (ValueError, FileNotFoundError) as e:
    raise PredictError(str(e)) from e


@dataclasses.dataclass
class FinetunedModel:
  """A fine-tuning output directory, loaded: the head, its weights and what fine-tuning saved."""
  info: CheckpointInfo
  config: configuration.BertConfig
  params: Any
  module: Any  # the task's model: classifier, span, tagging or multiple-choice head

  @property
  def num_labels(self) -> int:
    return int(np.shape(self.params["classifier"]["kernel"])[-1])

  @property
  def version_2_with_negative(self) -> bool:
    return "v2" in (self.info.task or "")  # fine-tuning records "squad v1.1" / "squad v2.0"


def load_finetuned(info: CheckpointInfo, mode: str, int8: bool = False,
                   dtype: str = "float32") -> FinetunedModel:
  """The model behind a fine-tuned output directory, for `mode` ("classify", "qa", "tag" or
  "choose").

  The weights are read by the same loader as every other Orbax tree (encoder + the task's head,
  with the config it was trained with); only the head module differs by task, and is the one
  the task's kind builds from what the run recorded (`<kind>/predict.py`: `head`, `model`).
  `int8`: the float model quantized on load (`model/int8.py`); an int8 export is int8 anyway.
  `dtype`: what it computes in (`inference.compute_config`).
  """
  check_mode(info, mode)
  inference.check_dtype(dtype)  # before any weights are read
  predict = registry.for_mode(mode).module("predict")
  head = predict.head(info)
  config, params = _load(info, require_heads=False)
  if int8:
    config, params = int8_lib.quantize_model(config, params)
  config = inference.compute_config(config, dtype)
  if head not in params:
    raise PredictError(f"{info.path}: the checkpoint records task {info.task!r} but holds no "
                       f"'{head}' parameters (it has {sorted(params)}).")
  return FinetunedModel(info, config, params, predict.model(info, config, params))


def find_vocab(info: CheckpointInfo, given: vocab_files.VocabularyFiles | None = None,
               flag: str = "--vocab_file") -> vocab_files.VocabularyFiles:
  """The given vocabulary (refused when the model keeps another), else the one beside the
  checkpoint (`vocab_files.resolve`). Called before any weights are read, so that a missing or
  wrong file fails at once."""
  try:
    return vocab_files.resolve(given, checkpoints.vocabulary_directories(info.where), info.path,
                               flag)
  except ValueError as e:
    raise PredictError(str(e)) from None


def load_tokenizer(info: CheckpointInfo, config: configuration.BertConfig,
                   files: vocab_files.VocabularyFiles,
                   do_lower_case: bool | None = None) -> tokenization.Tokenizer:
  """The tokenizer of `files` as the model's family reads them; it must fit the model."""
  tokenizer = files.load(config.model_type, do_lower_case)
  if tokenizer.vocab_size != config.vocab_size:
    raise PredictError(f"The vocabulary {files.describe()} has {tokenizer.vocab_size} entries "
                       f"but the model {info.path} {config.vocab_size}: pass the vocabulary the "
                       "model was trained with.")
  return tokenizer


def run_model(module: Any, params: Any, feats: dict[str, np.ndarray], batch_size: int,
              trim: bool, desc: str) -> Any:
  """The module's outputs for every row of `feats`, by the inference library's forward pass
  (data-parallel over the local devices, parameters replicated) — the one fine-tuning's
  evaluation uses, so the outputs equal what fine-tuning computes for the same rows."""
  predictor = inference.Predictor(module)
  return predictor(predictor.place(params), feats, batch_size, trim=trim, desc=desc)


def check_length(max_seq_length: int, config: configuration.BertConfig) -> None:
  try:
    config.check_sequence_length(max_seq_length, "--max_seq_length")
  except ValueError as e:
    raise PredictError(str(e)) from e


# --------------------------------------------------------------------------------- export
def export_head(path: str) -> task_heads.Head | None:
  """The task head of a fine-tuned output directory as the released formats name it (its
  kind's, with the outputs' names the run recorded); None for any other checkpoint (a
  pre-training workdir, a Hugging Face or TF1 model)."""
  kind, _ = checkpoints.checkpoint_kind(path)
  if kind != "orbax":
    return None
  info = inspect_checkpoint(path)
  if info.task is None:
    return None
  if info.metadata.get("feature_based"):
    raise ValueError(f"{info.path} is a feature-based tagger (frozen encoder + BiLSTM), which "
                     "no transformers or TF1 class holds: --format=orbax keeps it.")
  labels = info.metadata.get("label_list")
  return task_heads.Head(registry.find(info.task).head,
                         tuple(str(label) for label in labels) if labels else None)


def convert(source: str, target: str, output_format: str,
            bert_config_file: str | None = None, int8: bool = False) -> str:
  """`python -m bert_jax.convert`: `interop.convert.convert`, a fine-tuned model with its head
  written as its task class (`BertForSequenceClassification`, run_classifier.py's names, ...);
  to Orbax with every head and what the run recorded (its task, labels and input settings), so
  that `predict` serves the copy as it served the run. `int8`: `model/int8.py`'s export."""
  interop_convert.check_int8_format(output_format, int8)  # before anything is read
  head = export_head(source) if output_format in ("hf", "tf1") else None  # orbax keeps all
  metadata = finetuned_metadata(source) if output_format == "orbax" else None
  return interop_convert.convert(source, target, output_format, bert_config_file, head,
                                 int8=int8, metadata=metadata)


def finetuned_metadata(path: str) -> dict[str, Any] | None:
  """What a fine-tuned output directory recorded beside its weights (task, labels, settings),
  less what a writer records anew (the config, the step) and a distilled student's teacher
  (a copy holds the student alone); None for any other checkpoint."""
  if checkpoints.checkpoint_kind(path)[0] != "orbax":
    return None
  info = inspect_checkpoint(path)
  if info.task is None:
    return None
  return {k: v for k, v in info.metadata.items()
          if k not in ("bert_config", "step", task_distillation.RECORDED_TEACHER)}


# -------------------------------------------------------------------------------- fill-mask
def load_fill_mask_model(info: CheckpointInfo, int8: bool = False, dtype: str = "float32"
                         ) -> tuple[configuration.BertConfig, Any]:
  """The encoder and its masked-LM head, from any kind of checkpoint (a next-sentence head is
  not needed: a Hugging Face `BertForMaskedLM` serves); with `int8`, quantized on load;
  computing in `dtype` (`inference.compute_config`)."""
  check_mode(info, "fill_mask")
  inference.check_dtype(dtype)  # before any weights are read
  try:
    config, params = checkpoints.load_masked_lm(info.where)
  except (ValueError, FileNotFoundError) as e:
    raise PredictError(str(e)) from e
  if int8:
    config, params = int8_lib.quantize_model(config, params)
  return inference.compute_config(config, dtype), params

