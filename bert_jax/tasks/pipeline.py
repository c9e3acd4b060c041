"""Any checkpoint from Python, in a notebook or a script: `pipeline.load(path)` reads it — a
pre-training workdir, a fine-tuning output directory, a Hugging Face directory, Google's TF1
checkpoint — with its vocabulary and the settings it was fine-tuned with, and offers what it
serves, returning the records `python -m bert_jax.predict --json` prints:

    from bert_jax.tasks import pipeline

    model = pipeline.load("out/sst2")          # model.mode == "classify"
    model.classify(["a moving and beautiful film", ("premise", "hypothesis")])
    pipeline.load("workdir").fill_mask("to be or not to [MASK]", top_k=5)
    pipeline.load("out/squad").answer("Who won?", context="...")
    pipeline.load("out/conll").tag("Alan Mulally of Boeing spoke in New York .")
    pipeline.load("out/swag").choose("A man sits down.", ["He eats.", "He flies.", ...])

`python -m bert_jax.predict` is this module behind flags: one way to read a checkpoint for
prediction, one set of settings.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from bert_jax import inference
from bert_jax.model.configuration import BertConfig
from bert_jax.runs import finetune_config
from bert_jax.tasks import finetuned, registry
from bert_jax.tasks.classification import predict as classification
from bert_jax.tasks.multiple_choice import data as swag
from bert_jax.tasks.multiple_choice import predict as multiple_choice
from bert_jax.tasks.squad import predict as squad_predict
from bert_jax.tasks.tagging import predict as tagging
from bert_jax.text import tokenization, vocab_files

# What a fine-tuned model records of how it was fed; given values override them. Where neither
# says: fine-tuning's defaults for SQuAD's windows (the original run_squad.py's), the task
# kind's length, and lower-casing as the vocabulary's record keeps it.
SETTINGS = ("do_lower_case", "max_seq_length", "doc_stride", "max_query_length")
DEFAULTS = {name: finetune_config.get_config()[name] for name in ("doc_stride",
                                                                  "max_query_length")}


def _settings(info: finetuned.CheckpointInfo, given: dict[str, Any]) -> dict[str, Any]:
  """The input settings of a checkpoint: `given` (values not None), else what fine-tuning
  recorded, else `DEFAULTS`."""
  out = {}
  for name in SETTINGS:
    value = given.get(name)
    value = info.metadata.get(name) if value is None else value
    out[name] = DEFAULTS.get(name) if value is None else value
  return out


@dataclasses.dataclass
class Model:
  """A loaded checkpoint: what it serves (`mode`), its tokenizer, and the methods of its mode."""
  info: finetuned.CheckpointInfo
  mode: str
  config: BertConfig
  tokenizer: tokenization.Tokenizer
  settings: dict[str, Any]
  params: Any = None                              # fill_mask: encoder + masked-LM head
  finetuned: finetuned.FinetunedModel | None = None
  labels: list[str] | None = None                 # classify: the outputs' names

  def _require(self, mode: str) -> None:
    if self.mode != mode:
      raise finetuned.PredictError(
          f"{self.info.path} is {self.info.describe()}: it serves {self.mode}, not {mode}.")

  @property
  def max_length(self) -> int:
    return registry.for_mode(self.mode).max_length(self.settings["max_seq_length"])

  def fill_mask(self, texts: str | Sequence[str], top_k: int = 5) -> list[dict[str, Any]]:
    """Per text: the `top_k` tokens and their probabilities for every [MASK]."""
    self._require("fill_mask")
    texts = [texts] if isinstance(texts, str) else list(texts)
    predictions = inference.fill_mask(self.config, self.params, self.tokenizer, texts, top_k)
    return [{"text": t, "predictions": p} for t, p in zip(texts, predictions)]

  def classify(self, texts: str | tuple[str, str] | Sequence[str | tuple[str, str]],
               batch_size: int = 32) -> list[dict[str, Any]]:
    """Per input (a text, a `(text, text_b)` pair, or "a ||| b"): the label, its probability
    and every class's (a regression model: its score)."""
    self._require("classify")
    if isinstance(texts, (str, tuple)):
      texts = [texts]
    inputs = [tuple(t) if isinstance(t, tuple) else classification.split_pair(t) for t in texts]
    return classification.classify(self.finetuned, self.tokenizer, inputs, self.labels,
                                   self.max_length, batch_size)

  def answer(self, questions: str | Sequence[str] | None = None, context: str | None = None, *,
             examples: Sequence[Any] = (), n_best: int = 5, max_answer_length: int = 30,
             null_score_diff_threshold: float = 0.0, batch_size: int = 32
             ) -> list[dict[str, Any]]:
    """The best span of `context` for each question (or for SQuAD `examples`), with its
    probability and the `n_best` candidates; a SQuAD 2.0 model also decides no-answer."""
    self._require("qa")
    examples = list(examples)
    if questions is not None:
      if context is None:
        raise ValueError("answer() needs the context the questions are about.")
      questions = [questions] if isinstance(questions, str) else list(questions)
      examples += squad_predict.question_examples(questions, context)
    return squad_predict.answer_questions(
        self.finetuned, self.tokenizer, examples, max_seq_length=self.max_length,
        doc_stride=self.settings["doc_stride"], max_query_length=self.settings["max_query_length"],
        max_answer_length=max_answer_length, n_best=n_best,
        null_score_diff_threshold=null_score_diff_threshold, batch_size=batch_size)

  def tag(self, texts: str | Sequence[str] = (), *, sentences: Sequence[Any] = (),
          batch_size: int = 32) -> list[dict[str, Any]]:
    """Per sentence of the raw text(s) (or of `sentences` already split): its words, a tag per
    word and the entities."""
    self._require("tag")
    texts = [texts] if isinstance(texts, str) else list(texts)
    sentences = list(sentences) + (tagging.sentences_from_text(texts) if texts else [])
    return tagging.tag(self.finetuned, self.tokenizer, sentences, self.max_length, batch_size)

  def choose(self, context: str | None = None, endings: Sequence[str] = (), start: str = "", *,
             examples: Sequence[Any] = (), batch_size: int = 32) -> list[dict[str, Any]]:
    """The most probable ending of `context` (+ `start`), with every ending's probability;
    or of each SWAG / HellaSwag example in `examples`."""
    self._require("choose")
    examples = list(examples)
    if context is not None:
      examples.insert(0, swag.ChoiceExample(example_id="1", context=context, start=start,
                                            endings=tuple(endings), label=None,
                                            source="choose()"))
    return multiple_choice.choose(self.finetuned, self.tokenizer, examples, self.max_length,
                                  batch_size)


def load(checkpoint: str | finetuned.CheckpointInfo, *, mode: str = "auto",
         vocab: vocab_files.VocabularyFiles | None = None, vocab_flag: str = "--vocab_file",
         label_list: Sequence[str] | None = None, task_name: str | None = None,
         int8: bool = False, dtype: str = "float32", **settings: Any) -> Model:
  """The checkpoint at a path (or one `finetuned.inspect_checkpoint` has read), ready for its
  mode (`auto`: the task a fine-tuned model records, else `fill_mask`). `vocab`: the vocabulary
  to use, checked against the model's own (default: the one kept beside it). `settings`:
  `do_lower_case`, `max_seq_length`, `doc_stride`, `max_query_length` over the recorded ones.
  `label_list` / `task_name`: a classifier's label names over the recorded ones. `int8`: the
  float model quantized on load, its dense layers and tables int8 (`model/int8.py`); an int8
  export (`convert --int8`) is read as int8 without it. `dtype`: what the model computes in,
  "float32" or "bfloat16" (`inference.compute_config`)."""
  unknown = sorted(set(settings) - set(SETTINGS))
  if unknown:
    raise TypeError(f"load() got unknown settings {unknown}; it takes {', '.join(SETTINGS)}.")
  info = (checkpoint if isinstance(checkpoint, finetuned.CheckpointInfo)
          else finetuned.inspect_checkpoint(checkpoint))
  mode = info.mode if mode == "auto" else mode
  setting = _settings(info, settings)
  files = finetuned.find_vocab(info, vocab, vocab_flag)  # before any weights are read
  if mode == "fill_mask":
    config, params = finetuned.load_fill_mask_model(info, int8=int8, dtype=dtype)
    tokenizer = finetuned.load_tokenizer(info, config, files, setting["do_lower_case"])
    return Model(info, mode, config, tokenizer, setting, params=params)
  model = finetuned.load_finetuned(info, mode, int8=int8, dtype=dtype)
  tokenizer = finetuned.load_tokenizer(info, model.config, files, setting["do_lower_case"])
  labels = (classification.resolve_labels(model, task_name, label_list) if mode == "classify"
            else None)
  return Model(info, mode, model.config, tokenizer, setting, finetuned=model, labels=labels)
