"""The one place a fine-tuning task is named: which kind of task a `--task_name` (or the task a
fine-tuned checkpoint records) is, and where that kind lives.

Four kinds, each a package of the same rooms — `data` (its files: readers, features,
prediction files), `objective` (the plug-in of the training core: model, batch, loss),
`metrics`, `run` (the fine-tuning run: `run(config, tokenizer)`) and `predict` (a fine-tuned
model applied to new inputs) — so that `finetune` and `predict` dispatch from here and a new kind is
one more package and one more entry:

| kind            | task names                                   | predict mode | length |
|-----------------|----------------------------------------------|--------------|--------|
| classification  | the GLUE tasks, `custom` (your TSV files)    | classify     | 128    |
| squad           | squad, squad_v1(.1), squad_v2(.0), squad2    | qa           | 384    |
| tagging         | conll2003, tagging, ner                      | tag          | 128    |
| multiple_choice | swag, hellaswag                              | choose       | 128    |

This module imports no task (each imports it for its defaults); `module()` loads a kind's room
when it is used.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

from bert_jax.interop import task_heads

# SQuAD task names → version 2.0 or not (None: --version_2_with_negative decides).
SQUAD_VERSIONS = {"squad": None, "squad_v1": False, "squad_v1.1": False, "squad_v2": True,
                  "squad_v2.0": True, "squad2": True}


@dataclasses.dataclass(frozen=True)
class TaskKind:
  """A kind of fine-tuning task: its names, its package and the defaults its runs share."""
  name: str
  names: tuple[str, ...]  # task names of this kind; () for classification: every other name
  mode: str               # the `predict --mode` that serves its fine-tuned models
  max_seq_length: int     # tokens per input when --max_seq_length is not given
  model_name: str         # what its fine-tuned model is called in messages
  example: str            # where such a model comes from
  head: str               # its head as transformers names it (`interop.task_heads.HEADS`)

  @property
  def serves(self) -> str:
    """What `predict --mode` needs, for messages."""
    return f"{self.model_name} ({self.example})"

  def module(self, room: str) -> ModuleType:
    """This kind's `data`, `objective`, `metrics`, `run` or `predict` module."""
    return importlib.import_module(f"bert_jax.tasks.{self.name}.{room}")

  def max_length(self, given: int | None) -> int:
    return int(given) if given else self.max_seq_length


CLASSIFICATION = TaskKind(
    "classification", (), "classify", 128, "a fine-tuned classifier",
    "the --output_dir of `finetune --task_name=SST-2` or another GLUE / custom task",
    task_heads.SEQUENCE_CLASSIFICATION)
SQUAD = TaskKind("squad", tuple(SQUAD_VERSIONS), "qa", 384, "a fine-tuned SQuAD model",
                 "the --output_dir of `finetune --task_name=squad`",
                 task_heads.QUESTION_ANSWERING)
TAGGING = TaskKind("tagging", ("conll2003", "tagging", "ner"), "tag", 128, "a fine-tuned tagger",
                   "the --output_dir of `finetune --task_name=conll2003` or another tagging task",
                   task_heads.TOKEN_CLASSIFICATION)
MULTIPLE_CHOICE = TaskKind(
    "multiple_choice", ("swag", "hellaswag"), "choose", 128,
    "a fine-tuned multiple-choice model",
    "the --output_dir of `finetune --task_name=swag` or hellaswag", task_heads.MULTIPLE_CHOICE)
KINDS = (CLASSIFICATION, SQUAD, TAGGING, MULTIPLE_CHOICE)


def find(task_name: str) -> TaskKind:
  """The kind of a task name as users give it (`--task_name`) or as a fine-tuned checkpoint
  records it (SQuAD runs record "squad v1.1" / "squad v2.0"). Any name no other kind claims is
  classification, whose own reader refuses names it does not know."""
  name = task_name.lower()
  if name in SQUAD_VERSIONS or name.startswith("squad "):
    return SQUAD
  for kind in (TAGGING, MULTIPLE_CHOICE):
    if name in kind.names:
      return kind
  return CLASSIFICATION


def for_mode(mode: str) -> TaskKind:
  """The kind whose fine-tuned models `predict --mode=mode` serves."""
  for kind in KINDS:
    if kind.mode == mode:
      return kind
  raise ValueError(f"--mode={mode}: no task kind is predicted that way (expected one of "
                   f"{', '.join(k.mode for k in KINDS)}).")


def all_names() -> str:
  """Every task name, for messages that refuse one."""
  glue_tasks = CLASSIFICATION.module("data").GLUE_TASKS
  return (f"a GLUE task ({', '.join(glue_tasks)}), SQuAD ({', '.join(SQUAD.names)}), tagging "
          "(conll2003, or tagging with --label_list), multiple choice (swag, hellaswag), or "
          "'custom' (your own TSV files, with --label_list or --regression)")


def check_config(config) -> None:
  """Refuses fine-tuning settings that cannot work, naming the flag, before any data is read."""
  for name in ("train_batch_size", "eval_batch_size", "predict_batch_size", "learning_rate",
               "num_train_epochs"):
    value = config.get(name)
    if value is not None and value <= 0:
      raise ValueError(f"--{name}={value}: must be positive.")
  if config.max_seq_length is not None and config.max_seq_length < 8:
    raise ValueError(f"--max_seq_length={config.max_seq_length}: too short for any input "
                     "(the original uses 128, SQuAD 384).")
  if not 0.0 <= config.warmup_proportion <= 1.0:
    raise ValueError(f"--warmup_proportion={config.warmup_proportion}: must lie in [0, 1].")
  if config.init_checkpoint is not None and not str(config.init_checkpoint).strip() and \
      config.do_train:
    raise ValueError("--init_checkpoint is empty: name the pre-trained model (a pre-training "
                     "workdir, a Hugging Face directory or a TF1 bert_model.ckpt), or leave the "
                     "flag out to train from random weights.")
  check_evaluation(config)


def check_evaluation(config) -> None:
  """Refuses evaluation settings during training that cannot work, naming the flag."""
  every, patience = config.get("eval_every_steps"), config.get("early_stopping_patience")
  if every is not None and every <= 0:
    raise ValueError(f"--eval_every_steps={every}: must be positive.")
  if patience is not None:
    if patience < 1:
      raise ValueError(f"--early_stopping_patience={patience}: must be at least 1 evaluation.")
    if every is None:
      raise ValueError("--early_stopping_patience counts evaluations during training: set "
                       "--eval_every_steps too.")
  if every is not None and config.do_train and not config.do_eval:
    raise ValueError("--eval_every_steps scores the dev data while training: add --do_eval "
                     "(SQuAD: and a --predict_file with answers).")


def run_from_config(config, tokenizer) -> dict:
  """Every fine-tuning run a config describes (what `python -m bert_jax.finetune` calls): the
  task's kind runs it (`<kind>/run.py: run`)."""
  check_config(config)
  return find(config.task_name).module("run").run(config, tokenizer)
