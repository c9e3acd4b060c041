"""Fine-tuned models in the released formats: which transformers class holds each task head of
each family, the names its tensors take there and in Google's TF1 fine-tuning scripts, and the
label fields of its config.

A fine-tuned tree is the encoder (`bert/...`) plus one head. The heads are named as transformers
names them (`classifier`, `qa_outputs`), so most map one to one; the differences:

* RoBERTa's sequence classifier: transformers' `RobertaClassificationHead` is dense → tanh →
  out_proj on the first token, which is our pooler (tanh(dense([CLS]))) and classifier; so our
  `bert/pooler/dense` is its `classifier.dense` and our `classifier` its `classifier.out_proj`.
* DistilBERT's and ELECTRA's sequence classifiers and multiple-choice heads have no exact
  transformers form: DistilBERT's reads relu(pre_classifier([CLS])) where ours reads
  tanh(pooler([CLS])); ELECTRA's puts a dense layer and GELU before its output layer
  (`ElectraClassificationHead`, `SequenceSummary`) where ours, as the original ELECTRA's, is
  one dense layer on [CLS]. They are refused, with the difference named, rather than written as
  a model that computes something else.
* The feature-based tagger (frozen encoder + BiLSTM) has no transformers class at all.

TF1 has names for the heads of Google's own scripts: `run_classifier.py` (`output_weights`
(labels, hidden), `output_bias`; BERT and ALBERT) and `run_squad.py` (`cls/squad/...`; BERT).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from bert_jax.interop import names
from bert_jax.model.configuration import BertConfig

# transformers' names of the task heads (its class suffixes), which the task kinds map onto.
SEQUENCE_CLASSIFICATION = "sequence_classification"
QUESTION_ANSWERING = "question_answering"
TOKEN_CLASSIFICATION = "token_classification"
MULTIPLE_CHOICE = "multiple_choice"
HEADS = (SEQUENCE_CLASSIFICATION, QUESTION_ANSWERING, TOKEN_CLASSIFICATION, MULTIPLE_CHOICE)

_CLASS_SUFFIX = {SEQUENCE_CLASSIFICATION: "ForSequenceClassification",
                 QUESTION_ANSWERING: "ForQuestionAnswering",
                 TOKEN_CLASSIFICATION: "ForTokenClassification",
                 MULTIPLE_CHOICE: "ForMultipleChoice"}
_FAMILY_CLASS = {"bert": "Bert", "albert": "Albert", "roberta": "Roberta", "electra": "Electra",
                 "distilbert": "DistilBert"}
# The parameter scope of each head in our trees (and in transformers' state dicts).
HEAD_SCOPES = {SEQUENCE_CLASSIFICATION: "classifier", QUESTION_ANSWERING: "qa_outputs",
               TOKEN_CLASSIFICATION: "classifier", MULTIPLE_CHOICE: "classifier"}

_POOLED_DIFFERS = {
    "distilbert": "transformers' DistilBERT heads read relu(pre_classifier([CLS])); this "
                  "model's head reads tanh(pooler([CLS]))",
    "electra": "transformers' ELECTRA heads put a dense layer and GELU before the output layer; "
               "this model's head, as the original ELECTRA's, is one dense layer on [CLS]",
}


@dataclasses.dataclass(frozen=True)
class Head:
  """A fine-tuned model's head: which one (`HEADS`) and the names of its outputs, in order
  (class or tag names; None for regression, spans and endings)."""
  name: str
  labels: tuple[str, ...] | None = None

  def __post_init__(self):
    if self.name not in HEADS:
      raise ValueError(f"head={self.name!r}; expected one of {', '.join(HEADS)}.")


def hf_class(head: Head, config: BertConfig) -> str:
  """The transformers class that computes what `head` on `config`'s encoder computes; a
  ValueError naming the difference where there is none."""
  family = config.model_type
  if head.name in (SEQUENCE_CLASSIFICATION, MULTIPLE_CHOICE) and family in _POOLED_DIFFERS:
    raise ValueError(f"No Hugging Face class for this {family} {head.name.replace('_', ' ')} "
                     f"model: {_POOLED_DIFFERS[family]}. Export its encoder "
                     "(--format=orbax keeps the whole model), or fine-tune BERT, ALBERT or "
                     "RoBERTa for a model that leaves for transformers whole.")
  return _FAMILY_CLASS[family] + _CLASS_SUFFIX[head.name]


def _linear_rows(ours: str, theirs: str, kernel_layout: str = names.T) -> list[names.Row]:
  """A dense layer's two rows, Hugging Face column only."""
  return [names.Row(f"{ours}/kernel", "", names.SAME, f"{theirs}.weight", kernel_layout),
          names.Row(f"{ours}/bias", "", names.SAME, f"{theirs}.bias", names.SAME)]


def hf_rows(head: Head, config: BertConfig) -> list[names.Row]:
  """The name table of a fine-tuned model: the family's encoder rows (no pre-training heads),
  then the head's; RoBERTa's classifier takes the pooler (module docstring)."""
  hf_class(head, config)  # refuses the heads transformers has no class for
  encoder = [r for r in names.family_table(config, "hf") if r.ours.startswith("bert/")]
  scope = HEAD_SCOPES[head.name]
  if config.model_type == "roberta" and head.name == SEQUENCE_CLASSIFICATION:
    encoder = [r for r in encoder if not r.ours.startswith("bert/pooler/")]
    return encoder + _linear_rows("bert/pooler/dense", "classifier.dense") + _linear_rows(
        scope, "classifier.out_proj")
  return encoder + _linear_rows(scope, scope)


def tf1_rows(head: Head, config: BertConfig) -> list[names.Row]:
  """The TF1 name table of a fine-tuned BERT or ALBERT as Google's scripts name it: the
  encoder's rows, then `output_weights`/`output_bias` (run_classifier.py) or `cls/squad/...`
  (run_squad.py, BERT)."""
  family = config.model_type
  if head.name == SEQUENCE_CLASSIFICATION and family in ("bert", "albert"):
    prefix = ""
  elif head.name == QUESTION_ANSWERING and family == "bert":
    prefix = "cls/squad/"
  else:
    raise ValueError(f"No TF1 names for a {family} {head.name.replace('_', ' ')} model: "
                     "Google's TF1 scripts fine-tune BERT and ALBERT classifiers "
                     "(run_classifier.py) and BERT SQuAD models (run_squad.py) only; "
                     "--format=hf or --format=orbax keep this one.")
  encoder = [r for r in names.family_table(config, "tf1") if r.ours.startswith("bert/")]
  scope = HEAD_SCOPES[head.name]
  return encoder + [
      names.Row(f"{scope}/kernel", f"{prefix}output_weights", names.T, "", names.SAME),
      names.Row(f"{scope}/bias", f"{prefix}output_bias", names.SAME, "", names.SAME)]


def hf_config_fields(head: Head, num_outputs: int) -> dict:
  """What transformers' config of a task model says beyond the encoder: the number of outputs
  with their names (`id2label`/`label2id`) and, for a sequence classifier, `problem_type`."""
  if head.name in (QUESTION_ANSWERING, MULTIPLE_CHOICE):
    return {}
  labels: Sequence[str] = head.labels or [f"LABEL_{i}" for i in range(num_outputs)]
  if len(labels) != num_outputs:
    raise ValueError(f"{len(labels)} label names ({', '.join(labels)}) for a head of "
                     f"{num_outputs} outputs.")
  out = {"id2label": {str(i): str(l) for i, l in enumerate(labels)},
         "label2id": {str(l): i for i, l in enumerate(labels)}}
  if head.name == SEQUENCE_CLASSIFICATION:
    out["problem_type"] = ("regression" if num_outputs == 1 and not head.labels
                           else "single_label_classification")
  return out
