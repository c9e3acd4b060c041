r"""Inference from any of our checkpoints: fill-in-the-[MASK], classification, question answering.

    python -m bert_jax.predict --checkpoint=WORKDIR --vocab_file=vocab.txt \
        --text="to be or not to [MASK], that is the question" --top_k=5

    python -m bert_jax.predict --checkpoint=out/sst2 --vocab_file=vocab.txt \
        --text="a moving and beautiful film" --text="premise ||| hypothesis"

    python -m bert_jax.predict --checkpoint=out/squad --vocab_file=vocab.txt \
        --question="Who won?" --context_file=article.txt

`--mode` says what to do; `auto` (the default) reads it from the checkpoint: a fine-tuned
output directory of `bert_jax.finetune` records its task in the checkpoint metadata (a SQuAD
task → `qa`, a tagging task → `tag`, SWAG / HellaSwag → `choose`, any other task →
`classify`); everything else — a pre-training workdir, an Orbax checkpoint directory, a Hugging
Face BERT directory (`config.json` + `model.safetensors`, with the `cls.*` heads) or Google's
TF1 checkpoint (`.../bert_model.ckpt`) — is a pre-training model, so `fill_mask`.

- `fill_mask`: the `--top_k` tokens, with probabilities, for every [MASK] of each `--text`.
- `classify`: per input, the label with its probability and every class's probability (a
  regression model: its score). Inputs are `--text` (repeatable; a pair as
  `--text="premise ||| hypothesis"` or with `--text_b`) or `--input_file` (TSV, `text` or
  `text<TAB>text_b` per line; a header line is detected by fine-tuning's rule, or
  `--has_header`). Label names are the ones fine-tuning recorded in the
  checkpoint (`--label_list` or `--task_name` override them).
- `qa`: the best answer span of `--context` (or `--context_file`) for each `--question`, or for
  every question of an `--input_file` in the official SQuAD JSON layout, with its probability and
  the `--n_best` best candidates; for a SQuAD 2.0 model also the no-answer decision (null score
  − best span score against `--null_score_diff_threshold`). The features and the post-processing
  are fine-tuning's own (sliding windows over long contexts), so an `--input_file` gets exactly
  the answers of fine-tuning's `predictions.json` (given the window flags it was trained with:
  `--max_seq_length`, `--doc_stride`, `--max_query_length`).
- `tag`: raw `--text` (or an `--input_file`: a sentence per line, a blank line between
  documents) split into words as CoNLL splits them, each word tagged at its first piece (with
  the document context the tagger was trained with), the entities the tags make, and each tag's
  probability.
- `choose`: the most probable of the `--ending`s that continue `--context` (after a shared
  `--start`, SWAG's sent2), with every ending's probability; or every example of an
  `--input_file` in the SWAG CSV or HellaSwag JSONL layout.

Every family works the same way: BERT, RoBERTa, ALBERT, ELECTRA and DistilBERT (`model_type`
in the config). The vocabulary is `--vocab_file` / `--spm_model_file`, else the one beside the
checkpoint (in the directory of a TF1 prefix, a Hugging Face directory or a run directory):
`vocab.txt`, `spiece.model` / `spm.model`, or `vocab.json` + `merges.txt`
(`text/vocab_files.py`). In fill_mask texts, `[MASK]` also stands for the family's own mask
token (RoBERTa's `<mask>`).
`--output_file` writes one JSON object per input; `--json` prints them.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Sequence

import numpy as np
from absl import app, flags, logging

from bert_jax import cli, file_io, inference
from bert_jax.interop import checkpoints
from bert_jax.model import configuration, heads
from bert_jax.tasks import (conll, conlleval, glue, multiple_choice, question_answering,
                            sequence_classification, swag, token_classification)
from bert_jax.text import pairs, tokenization, vocab_files

MODES = ("fill_mask", "classify", "qa", "tag", "choose")
# What each mode needs, for messages that say why a checkpoint does not fit.
_NEEDS = {"fill_mask": "a pre-training model (masked-LM head)",
          "classify": "a fine-tuned classifier (the --output_dir of `finetune --task_name=SST-2` "
                      "or another GLUE / custom task)",
          "qa": "a fine-tuned SQuAD model (the --output_dir of `finetune --task_name=squad`)",
          "tag": "a fine-tuned tagger (the --output_dir of `finetune --task_name=conll2003` or "
                 "another tagging task)",
          "choose": "a fine-tuned multiple-choice model (the --output_dir of `finetune "
                    "--task_name=swag` or hellaswag)"}
# Separates the two texts of a pair inside one --text.
PAIR_SEPARATOR = "|||"
# Candidates per question that post-processing searches and keeps: fine-tuning's --n_best_size
# default, so that the answer (and its probability) is the one in fine-tuning's files however
# few candidates are shown.
_SQUAD_CANDIDATES = 20


class PredictError(ValueError):
  """A checkpoint, vocabulary or input that does not fit the request; the message says why."""


# ------------------------------------------------------------------------------ checkpoints
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
    if self.task is None:
      return "fill_mask"
    task = self.task.lower()
    if task.startswith("squad"):
      return "qa"
    if task in token_classification.TASK_NAMES:
      return "tag"
    if task in multiple_choice.TASK_NAMES:
      return "choose"
    return "classify"

  def describe(self) -> str:
    if self.kind != "orbax":
      return f"{checkpoints.KIND_NAMES[self.kind]} ({self.where}), a pre-training model"
    if self.mode == "fill_mask":
      return "a pre-training checkpoint (its metadata names no fine-tuned task)"
    if self.mode == "qa":
      return f"a fine-tuned SQuAD model (task {self.task!r})"
    if self.mode == "tag":
      return f"a fine-tuned tagger (task {self.task!r})"
    if self.mode == "choose":
      return f"a fine-tuned multiple-choice model (task {self.task!r})"
    labels = self.metadata.get("num_labels")
    return (f"a fine-tuned classifier (task {self.task!r}"
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
  raise PredictError(f"--mode={mode} needs {_NEEDS[mode]}, but {info.path} is "
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


def load_finetuned(info: CheckpointInfo, mode: str) -> FinetunedModel:
  """The model behind a fine-tuned output directory, for `mode` ("classify", "qa", "tag" or
  "choose").

  The weights are read by the same loader as every other Orbax tree (encoder + the task's head,
  with the config it was trained with); only the head module differs by task, and is the one
  fine-tuning's task plug-in builds from what the run recorded.
  """
  check_mode(info, mode)
  config, params = _load(info, require_heads=False)
  if mode == "tag":
    plugin = _tagging_plugin(info)
    head = plugin.head_scopes[0]
  elif mode == "choose":
    plugin = multiple_choice.MultipleChoice(int(info.metadata.get("num_choices") or 4))
    head = plugin.head_scopes[0]
  else:
    head = (sequence_classification.SequenceClassification if mode == "classify"
            else question_answering.SquadSpans).head_scopes[0]
  if head not in params:
    raise PredictError(f"{info.path}: the checkpoint records task {info.task!r} but holds no "
                       f"'{head}' parameters (it has {sorted(params)}).")
  if mode == "classify":  # as many outputs as the stored head has
    module = heads.BertForSequenceClassification(config, int(np.shape(params[head]["kernel"])[-1]))
  elif mode in ("tag", "choose"):
    module = plugin.model(config)
  else:
    module = heads.BertForQuestionAnswering(config)
  return FinetunedModel(info, config, params, module)


def _tagging_plugin(info: CheckpointInfo) -> token_classification.TokenClassification:
  """The tagging plug-in a fine-tuned tagger was trained as (its tags and head settings)."""
  meta = info.metadata
  labels = meta.get("label_list")
  if not labels:
    raise PredictError(f"{info.path}: a tagger that records no tag list (task {info.task!r}).")
  return token_classification.TokenClassification.with_head_of(
      meta, num_labels=len(labels), task_name=str(info.task))


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


def _check_length(max_seq_length: int, config: configuration.BertConfig) -> None:
  try:
    config.check_sequence_length(max_seq_length, "--max_seq_length")
  except ValueError as e:
    raise PredictError(str(e)) from e


# -------------------------------------------------------------------------------- fill-mask
def load_fill_mask_model(info: CheckpointInfo) -> tuple[configuration.BertConfig, Any]:
  """The encoder and its masked-LM head, from any kind of checkpoint (a next-sentence head is
  not needed: a Hugging Face `BertForMaskedLM` serves)."""
  check_mode(info, "fill_mask")
  try:
    return checkpoints.load_masked_lm(info.where)
  except (ValueError, FileNotFoundError) as e:
    raise PredictError(str(e)) from e


# ----------------------------------------------------------------------------- classification
def split_pair(text: str, text_b: str | None = None) -> tuple[str, str | None]:
  """`"premise ||| hypothesis"` → the two texts; a lone text stays single unless `text_b`."""
  if text_b is not None:
    return text, text_b
  if PAIR_SEPARATOR in text:
    a, b = text.split(PAIR_SEPARATOR, 1)
    return a.strip(), b.strip()
  return text, None


def read_classify_tsv(path: str, has_header: str = "auto") -> list[tuple[str, str | None]]:
  """`text` or `text<TAB>text_b` per line; a header line by fine-tuning's rule
  (`glue.decide_header`: detected, or `--has_header`)."""
  try:
    return glue.read_text_tsv(path, has_header)
  except ValueError as e:
    raise PredictError(str(e)) from None


def resolve_labels(model: FinetunedModel, task_name: str | None = None,
                   label_list: Sequence[str] | None = None) -> list[str] | None:
  """The label names in the head's order (None for regression): `--label_list`, else those of
  `--task_name`, else the ones the checkpoint records, else those of its recorded GLUE task,
  else class indices with a warning."""
  num_labels = model.num_labels
  if label_list:
    labels = list(label_list)
  else:
    labels = None if task_name else model.info.metadata.get("label_list")
  if labels is None:
    name = task_name or model.info.task
    if name and name.lower() != "custom":
      try:
        task = glue.get_task(name)
      except ValueError as e:
        raise PredictError(f"{model.info.path}: task {name!r}: {e} Pass --label_list.") from e
      labels = task.label_list
      if (1 if labels is None else len(labels)) != num_labels:
        raise PredictError(f"{model.info.path}: task {name} has "
                           f"{'one output' if labels is None else f'{len(labels)} labels'} but "
                           f"the model {num_labels} outputs; pass --task_name or --label_list.")
      return labels
    if num_labels == 1:
      return None
    logging.warning("%s does not record its label names (task %r): showing class indices; "
                    "pass --label_list=a,b,... for names.", model.info.path, name)
    return [str(i) for i in range(num_labels)]
  if num_labels == 1:
    raise PredictError(f"{model.info.path} is a regression model (one output); drop "
                       "--label_list.")
  if len(labels) != num_labels:
    raise PredictError(f"--label_list has {len(labels)} labels ({','.join(labels)}) but the "
                       f"model {model.info.path} has {num_labels} outputs.")
  return [str(label) for label in labels]


def classify(model: FinetunedModel, tokenizer: tokenization.Tokenizer,
             inputs: Sequence[tuple[str, str | None]], labels: list[str] | None,
             max_seq_length: int = 128, batch_size: int = 32) -> list[dict[str, Any]]:
  """Per input: `label`, `probability` and `probabilities` (label → probability), or `score`
  for a regression model; encoded exactly as fine-tuning encodes its examples."""
  _check_length(max_seq_length, model.config)
  feats = pairs.encode_examples(tokenizer, [a for a, _ in inputs],
                                        [b for _, b in inputs], max_seq_length)
  feats["weight"] = np.ones(len(inputs), np.float32)
  logits = np.asarray(run_model(model.module, model.params, feats, batch_size, trim=True,
                                desc="classify"), np.float64)
  results = []
  for (a, b), row in zip(inputs, logits):
    out: dict[str, Any] = {"text": a}
    if b is not None:
      out["text_b"] = b
    if labels is None:
      out["score"] = float(row[0])
    else:
      probs = np.exp(row - row.max())
      probs /= probs.sum()
      best = int(np.argmax(probs))
      out.update(label=labels[best], probability=float(probs[best]),
                 probabilities={name: float(p) for name, p in zip(labels, probs)})
    results.append(out)
  return results


def format_classification(result: dict[str, Any]) -> str:
  text = result["text"] + (f" {PAIR_SEPARATOR} {result['text_b']}" if "text_b" in result else "")
  if "score" in result:
    return f"{text}\n  score: {result['score']:.4f}"
  shown = ", ".join(f"{name} {p:.1%}" for name, p in result["probabilities"].items())
  return f"{text}\n  {result['label']} ({result['probability']:.1%})   [{shown}]"


# ------------------------------------------------------------------------------------- SQuAD
def question_examples(questions: Sequence[str], context: str) -> list[Any]:
  """SQuAD examples for questions about one context (ids q1, q2, ...)."""
  from bert_jax.tasks import squad  # pylint: disable=g-import-not-at-top
  if not context.strip():
    raise PredictError("The context is empty.")
  return [squad.SquadExample(f"q{i + 1}", q, context, [], where=f"--question #{i + 1}")
          for i, q in enumerate(questions)]


def answer_questions(model: FinetunedModel, tokenizer: tokenization.Tokenizer,
                     examples: Sequence[Any], *, max_seq_length: int = 384,
                     doc_stride: int = 128, max_query_length: int = 64,
                     max_answer_length: int = 30, n_best: int = 5,
                     null_score_diff_threshold: float = 0.0,
                     batch_size: int = 32) -> list[dict[str, Any]]:
  """Per question: `answer` ("" when a SQuAD 2.0 model says there is none), its `probability`,
  the `n_best` best candidates, and for SQuAD 2.0 `null_score_diff` (null score − best span
  score; above `null_score_diff_threshold` means no answer). Windows, logits and selection are
  fine-tuning's own (`squad.convert_examples_to_features`, `squad.postprocess`)."""
  from bert_jax.tasks import squad  # pylint: disable=g-import-not-at-top
  _check_length(max_seq_length, model.config)
  try:
    features = squad.convert_examples_to_features(
        examples, tokenizer, max_seq_length=max_seq_length, doc_stride=doc_stride,
        max_query_length=max_query_length, is_training=False)
  except ValueError as e:
    raise PredictError(str(e)) from e
  # No length trimming, as in fine-tuning: the logits are then exactly fine-tuning's.
  start_logits, end_logits = run_model(model.module, model.params, features.arrays, batch_size,
                                       trim=False, desc="answer")
  version_2 = model.version_2_with_negative
  predictions, nbest, null_odds = squad.postprocess(
      examples, features, start_logits, end_logits,
      n_best_size=max(n_best, _SQUAD_CANDIDATES), max_answer_length=max_answer_length,
      version_2_with_negative=version_2, null_score_diff_threshold=null_score_diff_threshold)
  results = []
  for example in examples:
    answer = predictions[example.qas_id]
    candidates = nbest[example.qas_id]
    out = {"id": example.qas_id, "question": example.question, "answer": answer,
           "probability": next(c["probability"] for c in candidates if c["text"] == answer),
           "n_best": candidates[:n_best]}
    if version_2:
      diff = null_odds[example.qas_id]
      out["null_score_diff"] = diff if math.isfinite(diff) else 1e30
      out["has_answer"] = bool(answer)
    results.append(out)
  return results


def format_answer(result: dict[str, Any], threshold: float = 0.0) -> str:
  lines = [f"[{result['id']}] {result['question']}"]
  shown = result["answer"] if result["answer"] else "(no answer)"
  lines.append(f"  answer: {shown} ({result['probability']:.1%})")
  if "null_score_diff" in result:
    diff = result["null_score_diff"]
    relation = ">" if diff > threshold else "<="
    lines.append(f"  null score - best span score = {diff:.3f} {relation} threshold "
                 f"{threshold:g}: {'answerable' if result['has_answer'] else 'no answer'}")
  for i, candidate in enumerate(result["n_best"], 1):
    lines.append(f"  {i}. {candidate['text'] or '(no answer)'}  {candidate['probability']:.1%}")
  return "\n".join(lines)


# ---------------------------------------------------------------------------------- tagging
def sentences_from_text(texts: Sequence[str], source: str = "--text") -> list[Any]:
  """Raw text → sentences of words (`conll.split_words`, CoNLL-style: punctuation apart), one
  per non-empty line; a blank line starts a new document (what document context reads)."""
  sentences, document, line_number = [], 0, 0
  for text in texts:
    for line in text.split("\n"):
      line_number += 1
      words = conll.split_words(line)
      if not words:
        document += bool(sentences)
        continue
      sentences.append(conll.Sentence(words=tuple(words), labels=None, document=document,
                                      source=f"{source}:{line_number}", original_labels=None))
  return sentences


def tag(model: FinetunedModel, tokenizer: tokenization.Tokenizer, sentences: Sequence[Any],
        max_seq_length: int = 128, batch_size: int = 32) -> list[dict[str, Any]]:
  """Per sentence: its `words`, one `tags` entry per word (IOB2), each tag's `probability`,
  and the `entities` (type, text, first and last word) as conlleval reads the tags. Windows and
  document context are fine-tuning's own, so the tags equal its prediction files'."""
  _check_length(max_seq_length, model.config)
  if not sentences:
    raise PredictError("No words to tag.")
  labels = list(model.info.metadata["label_list"])
  features = conll.convert_to_features(
      sentences, tokenizer, labels, max_seq_length,
      document_context=bool(model.info.metadata.get("document_context", False)), progress=False)
  logits = np.asarray(run_model(model.module, model.params, features.arrays, batch_size,
                                trim=False, desc="tag"), np.float64)
  predicted = np.argmax(logits, axis=-1)
  tags = conll.words_from_predictions(features, predicted, labels)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs = (probs / probs.sum(-1, keepdims=True)).max(-1)
  word_probability = [[0.0] * n for n in features.num_words]
  for row, sentence in enumerate(features.sentence_index):
    for position in np.flatnonzero(features.word_index[row] >= 0):
      word_probability[sentence][features.word_index[row, position]] = float(probs[row, position])
  results = []
  for i, sentence in enumerate(sentences):
    entities = [{"type": kind, "text": " ".join(sentence.words[first:last + 1]),
                 "first_word": first, "last_word": last}
                for kind, first, last in conlleval.chunks(tags[i])]
    results.append({"words": list(sentence.words), "tags": tags[i],
                    "probabilities": word_probability[i], "entities": entities})
  return results


def format_tags(result: dict[str, Any]) -> str:
  lines = [" ".join(f"{w}/{t}" if t != "O" else w for w, t in zip(result["words"], result["tags"]))]
  for entity in result["entities"]:
    lines.append(f"  {entity['type']}: {entity['text']}")
  return "\n".join(lines)


# ------------------------------------------------------------------------- multiple choice
def choose(model: FinetunedModel, tokenizer: tokenization.Tokenizer, examples: Sequence[Any],
           max_seq_length: int = 128, batch_size: int = 32) -> list[dict[str, Any]]:
  """Per example: the `choice` (index of the most probable ending), its `ending` and every
  ending's `probabilities`, paired as fine-tuning pairs them (`swag.featurize`)."""
  _check_length(max_seq_length, model.config)
  wanted = int(model.info.metadata.get("num_choices") or 0)
  for example in examples:
    if wanted and len(example.endings) != wanted:
      raise PredictError(f"{example.source}: {len(example.endings)} endings, but the model "
                         f"{model.info.path} chooses among {wanted}.")
  feats = swag.featurize(examples, tokenizer, max_seq_length)
  logits = np.asarray(run_model(model.module, model.params, feats, batch_size, trim=True,
                                desc="choose"), np.float64)
  results = []
  for example, row in zip(examples, logits):
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    best = int(np.argmax(probs))
    out = {"id": example.example_id, "context": example.context,
           "endings": [" ".join(p for p in (example.start, e) if p) for e in example.endings],
           "choice": best, "probabilities": [float(p) for p in probs]}
    out["ending"] = out["endings"][best]
    if example.label is not None:
      out["label"] = int(example.label)
    results.append(out)
  return results


def format_choice(result: dict[str, Any]) -> str:
  lines = [f"[{result['id']}] {result['context']}"]
  for i, (ending, p) in enumerate(zip(result["endings"], result["probabilities"])):
    mark = "*" if i == result["choice"] else " "
    lines.append(f" {mark}{i}. {ending}  {p:.1%}")
  return "\n".join(lines)


# ------------------------------------------------------------------------------ command line
FLAGS = flags.FLAGS

# Flags that only some modes read: given with another mode they are a mistake, not a no-op.
_MODE_FLAGS = {"text": ("fill_mask", "classify", "tag"), "top_k": ("fill_mask",),
               "text_b": ("classify",), "task_name": ("classify",), "label_list": ("classify",),
               "question": ("qa",), "context": ("qa", "choose"), "context_file": ("qa",),
               "ending": ("choose",), "start": ("choose",),
               "n_best": ("qa",), "null_score_diff_threshold": ("qa",), "doc_stride": ("qa",),
               "max_query_length": ("qa",), "max_answer_length": ("qa",),
               "max_seq_length": ("classify", "qa", "tag", "choose"),
               "batch_size": ("classify", "qa", "tag", "choose")}


def define_flags() -> None:
  """Command-line flags, defined only when run as a program (importers get none)."""
  flags.DEFINE_string("checkpoint", None, "Pre-training workdir, Orbax, Hugging Face or TF1 "
                      "checkpoint (fill_mask), or a fine-tuning --output_dir (classify, qa).")
  flags.DEFINE_enum("mode", "auto", ["auto", *MODES], "auto: qa for a fine-tuned SQuAD model, "
                    "tag for a tagger, choose for a multiple-choice model, classify for another "
                    "fine-tuned task, else fill_mask.")
  cli.define_vocab_flags()
  flags.DEFINE_multi_string("text", [], "fill_mask: text with [MASK] tokens; classify: a text, "
                            f"or a pair as 'a {PAIR_SEPARATOR} b'; tag: raw text (a sentence "
                            "per line). May be repeated.")
  flags.DEFINE_multi_string("text_b", [], "classify: second text of each --text, in order.")
  flags.DEFINE_string("has_header", "auto", "classify: whether --input_file starts with a "
                      "header line: auto (decided from the first line, as fine-tuning does), "
                      "true or false.")
  flags.DEFINE_string("input_file", None, "classify: TSV, text or text<TAB>text_b per line; "
                      "qa: official SQuAD JSON; fill_mask: one text per line; tag: a sentence "
                      "per line, a blank line between documents; choose: SWAG CSV (.csv) or "
                      "HellaSwag JSONL (.jsonl).")
  flags.DEFINE_string("output_file", None, "Write one JSON object per input (JSON lines).")
  flags.DEFINE_bool("json", False, "Print JSON instead of text.")
  flags.DEFINE_integer("top_k", 5, "fill_mask: predictions per [MASK].")
  flags.DEFINE_string("task_name", None, "classify: task whose label names to show, when the "
                      "checkpoint does not record one (a GLUE name).")
  flags.DEFINE_list("label_list", None, "classify: label names in the head's order (custom "
                    "tasks, whose names the checkpoint does not record).")
  flags.DEFINE_multi_string("question", [], "qa: a question about --context; may be repeated.")
  flags.DEFINE_string("context", None, "qa: the passage to answer from; choose: the sentence "
                      "the --ending options continue.")
  flags.DEFINE_multi_string("ending", [], "choose: a candidate ending of --context; give each "
                            "(at least two, as many as the model was trained with).")
  flags.DEFINE_string("start", None, "choose: the start of the continuation shared by every "
                      "--ending (SWAG's sent2), if any.")
  flags.DEFINE_string("context_file", None, "qa: file holding the passage.")
  flags.DEFINE_integer("n_best", 5, "qa: candidates shown per question.")
  flags.DEFINE_float("null_score_diff_threshold", 0.0, "qa, SQuAD 2.0: no answer when null "
                     "score - best span score exceeds this (fine-tuning's eval_results.json "
                     "reports the best threshold on dev).")
  flags.DEFINE_integer("max_seq_length", None, "Tokens per input (default: 128 for classify, "
                       "384 for qa, as fine-tuning).")
  flags.DEFINE_integer("doc_stride", 128, "qa: distance between context windows, in tokens.")
  flags.DEFINE_integer("max_query_length", 64, "qa: question tokens kept.")
  flags.DEFINE_integer("max_answer_length", 30, "qa: longest answer, in tokens.")
  flags.DEFINE_integer("batch_size", 32, "Inputs per forward pass (classify, qa).")


def _texts_from_flags() -> list[str]:
  texts = list(FLAGS.text)
  if FLAGS.input_file:
    texts += [line for line in file_io.read_text(FLAGS.input_file).splitlines() if line.strip()]
  return texts


def _classify_inputs() -> list[tuple[str, str | None]]:
  if FLAGS.text_b and len(FLAGS.text_b) != len(FLAGS.text):
    raise app.UsageError(f"{len(FLAGS.text_b)} --text_b for {len(FLAGS.text)} --text: give one "
                         "per --text (or write pairs as --text='a ||| b').")
  inputs = [split_pair(t, FLAGS.text_b[i] if FLAGS.text_b else None)
            for i, t in enumerate(FLAGS.text)]
  if FLAGS.input_file:
    inputs += read_classify_tsv(FLAGS.input_file, FLAGS.has_header)
  if not inputs:
    raise app.UsageError("--mode=classify needs --text or --input_file.")
  return inputs


def _qa_examples() -> list[Any]:
  from bert_jax.tasks import squad  # pylint: disable=g-import-not-at-top
  examples = []
  if FLAGS.question and FLAGS.input_file:
    raise app.UsageError("Give --question (with --context) or --input_file, not both.")
  if FLAGS.question:
    if bool(FLAGS.context is not None) == bool(FLAGS.context_file):
      raise app.UsageError("--question needs exactly one of --context and --context_file.")
    context = (FLAGS.context if FLAGS.context is not None
               else file_io.read_text(FLAGS.context_file).rstrip("\n"))
    examples += question_examples(FLAGS.question, context)
  elif FLAGS.context is not None or FLAGS.context_file:
    raise app.UsageError("--context / --context_file need at least one --question.")
  if FLAGS.input_file:
    try:
      examples += squad.read_squad_json(FLAGS.input_file)
    except ValueError as e:
      raise PredictError(str(e)) from e
  if not examples:
    raise app.UsageError("--mode=qa needs --question with --context (or --context_file), or "
                         "--input_file in the SQuAD JSON layout.")
  return examples


def _tag_inputs() -> list[Any]:
  texts = list(FLAGS.text)
  sentences = sentences_from_text(texts) if texts else []
  if FLAGS.input_file:
    more = sentences_from_text([file_io.read_text(FLAGS.input_file)], FLAGS.input_file)
    offset = 1 + max((s.document for s in sentences), default=-1)
    sentences += [dataclasses.replace(s, document=s.document + offset) for s in more]
  if not sentences:
    raise app.UsageError("--mode=tag needs --text or --input_file (raw text).")
  return sentences


def _choice_inputs() -> list[Any]:
  examples = []
  if FLAGS.ending or FLAGS.context is not None:
    if FLAGS.context is None or len(FLAGS.ending) < 2:
      raise app.UsageError("--mode=choose needs --context with at least two --ending.")
    examples.append(swag.ChoiceExample(example_id="1", context=FLAGS.context,
                                       start=FLAGS.start or "", endings=tuple(FLAGS.ending),
                                       label=None, source="--context/--ending"))
  if FLAGS.input_file:
    try:
      if FLAGS.input_file.endswith(".jsonl"):
        examples += swag.read_hellaswag_jsonl(FLAGS.input_file)
      else:
        examples += swag.read_swag_csv(FLAGS.input_file)
    except ValueError as e:
      raise PredictError(str(e)) from e
  if not examples:
    raise app.UsageError("--mode=choose needs --context with --ending, or --input_file (SWAG "
                         "CSV or HellaSwag JSONL).")
  return examples


def _emit(results: list[dict[str, Any]], formatted: list[str]) -> None:
  if FLAGS.output_file:
    file_io.write_text_atomic(FLAGS.output_file, "".join(
        json.dumps(r, ensure_ascii=False) + "\n" for r in results))
  if FLAGS.json:
    for r in results:
      print(json.dumps(r, ensure_ascii=False))
  else:
    print("\n".join(formatted))


def run_from_flags() -> None:
  """Every check that needs no weights first (mode, flags, vocabulary), then load and predict."""
  info = inspect_checkpoint(FLAGS.checkpoint)
  mode = info.mode if FLAGS.mode == "auto" else FLAGS.mode
  # A fine-tuned model records how it was fed: its values are the defaults, flags override.
  setting = {name: (info.metadata[name] if info.metadata.get(name) is not None
                    and not FLAGS[name].present else FLAGS[name].value)
             for name in ("do_lower_case", "max_seq_length", "doc_stride", "max_query_length")}
  if info.metadata.get("do_lower_case") is None:  # the vocabulary's record decides
    setting["do_lower_case"] = cli.lower_case_from_flags()
  for name, modes in _MODE_FLAGS.items():
    if FLAGS[name].present and mode not in modes:
      why = f" ({FLAGS.checkpoint} is {info.describe()})" if FLAGS.mode == "auto" else ""
      raise app.UsageError(f"--{name} is for --mode={' or '.join(modes)}, not --mode={mode}"
                           f"{why}.")
  # The vocabulary is checked before any weights are read.
  files = find_vocab(info, cli.vocabulary_from_flags(),
                     "--spm_model_file" if FLAGS.spm_model_file else "--vocab_file")
  if mode == "fill_mask":
    texts = _texts_from_flags()
    if not texts:
      raise app.UsageError("--mode=fill_mask needs --text (or --input_file).")
    config, params = load_fill_mask_model(info)
    tokenizer = load_tokenizer(info, config, files, setting["do_lower_case"])
    predictions = inference.fill_mask(config, params, tokenizer, texts, FLAGS.top_k)
    # One object per input, like the other modes: `--output_file` and `--json` alike.
    _emit([{"text": t, "predictions": p} for t, p in zip(texts, predictions)],
          [inference.format_fill_mask(t, p) for t, p in zip(texts, predictions)])
    return
  if mode in ("tag", "choose"):
    inputs = _tag_inputs() if mode == "tag" else _choice_inputs()
    model = load_finetuned(info, mode)
    tokenizer = load_tokenizer(info, model.config, files, setting["do_lower_case"])
    length = setting["max_seq_length"] or 128
    if mode == "tag":
      results = tag(model, tokenizer, inputs, length, FLAGS.batch_size)
      _emit(results, [format_tags(r) for r in results])
    else:
      results = choose(model, tokenizer, inputs, length, FLAGS.batch_size)
      _emit(results, [format_choice(r) for r in results])
    return
  inputs = _classify_inputs() if mode == "classify" else _qa_examples()
  model = load_finetuned(info, mode)
  tokenizer = load_tokenizer(info, model.config, files, setting["do_lower_case"])
  if mode == "classify":
    labels = resolve_labels(model, FLAGS.task_name, FLAGS.label_list)
    results = classify(model, tokenizer, inputs, labels, setting["max_seq_length"] or 128,
                       FLAGS.batch_size)
    _emit(results, [format_classification(r) for r in results])
    return
  results = answer_questions(
      model, tokenizer, inputs, max_seq_length=setting["max_seq_length"] or 384,
      doc_stride=setting["doc_stride"], max_query_length=setting["max_query_length"],
      max_answer_length=FLAGS.max_answer_length, n_best=FLAGS.n_best,
      null_score_diff_threshold=FLAGS.null_score_diff_threshold, batch_size=FLAGS.batch_size)
  _emit(results, [format_answer(r, FLAGS.null_score_diff_threshold) for r in results])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not FLAGS.checkpoint:
    raise app.UsageError("--checkpoint is required.")
  cli.quiet_unless_verbose()
  run_from_flags()


if __name__ == "__main__":
  define_flags()
  app.run(cli.one_line_errors(main), flags_parser=cli.parse_flags)
