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
`--output_file` writes one JSON object per input; `--json` prints them. `--int8` quantizes the
model on load and computes its dense layers and embeddings in int8 (`model/int8.py`), in
every mode; a checkpoint written by `convert --int8` is int8 already. `--dtype=bfloat16`
computes in bfloat16 (parameters as stored, outputs float32), a few 1e-3 of the outputs'
scale from float32, the default.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from absl import app, flags

from bert_jax import cli, file_io, inference
from bert_jax.tasks import finetuned, pipeline, registry
from bert_jax.tasks.classification import predict as classification
from bert_jax.tasks.multiple_choice import data as swag
from bert_jax.tasks.multiple_choice import predict as multiple_choice
from bert_jax.tasks.squad import data as squad
from bert_jax.tasks.squad import predict as squad_predict
from bert_jax.tasks.tagging import predict as tagging

FLAGS = flags.FLAGS
MODES = ("fill_mask", *(kind.mode for kind in registry.KINDS))
PAIR_SEPARATOR = classification.PAIR_SEPARATOR

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
  flags.DEFINE_integer("doc_stride", pipeline.DEFAULTS["doc_stride"],
                       "qa: distance between context windows, in tokens.")
  flags.DEFINE_integer("max_query_length", pipeline.DEFAULTS["max_query_length"],
                       "qa: question tokens kept.")
  flags.DEFINE_integer("max_answer_length", 30, "qa: longest answer, in tokens.")
  flags.DEFINE_integer("batch_size", 32, "Inputs per forward pass (classify, qa).")
  cli.define_dtype_flag()
  flags.DEFINE_bool("int8", False, "Quantize the float model on load and compute its dense "
                    "layers and embedding lookups in int8 (int8 weights, tables and "
                    "activations, bert_jax/model/int8.py); an "
                    "int8 export (convert --int8) is int8 without it.")


def _texts_from_flags() -> list[str]:
  texts = list(FLAGS.text)
  if FLAGS.input_file:
    texts += [line for line in file_io.read_text(FLAGS.input_file).splitlines() if line.strip()]
  return texts


def _classify_inputs(info) -> list[tuple[str, str | None]]:
  if FLAGS.text_b and len(FLAGS.text_b) != len(FLAGS.text):
    raise app.UsageError(f"{len(FLAGS.text_b)} --text_b for {len(FLAGS.text)} --text: give one "
                         "per --text (or write pairs as --text='a ||| b').")
  inputs = [classification.split_pair(t, FLAGS.text_b[i] if FLAGS.text_b else None)
            for i, t in enumerate(FLAGS.text)]
  if FLAGS.input_file:
    inputs += classification.read_classify_tsv(FLAGS.input_file, FLAGS.has_header, info)
  if not inputs:
    raise app.UsageError("--mode=classify needs --text or --input_file.")
  return inputs


def _qa_examples() -> list[Any]:
  examples = []
  if FLAGS.question and FLAGS.input_file:
    raise app.UsageError("Give --question (with --context) or --input_file, not both.")
  if FLAGS.question:
    if bool(FLAGS.context is not None) == bool(FLAGS.context_file):
      raise app.UsageError("--question needs exactly one of --context and --context_file.")
    context = (FLAGS.context if FLAGS.context is not None
               else file_io.read_text(FLAGS.context_file).rstrip("\n"))
    examples += squad_predict.question_examples(FLAGS.question, context)
  elif FLAGS.context is not None or FLAGS.context_file:
    raise app.UsageError("--context / --context_file need at least one --question.")
  if FLAGS.input_file:
    try:
      examples += squad.read_squad_json(FLAGS.input_file)
    except ValueError as e:
      raise finetuned.PredictError(str(e)) from e
  if not examples:
    raise app.UsageError("--mode=qa needs --question with --context (or --context_file), or "
                         "--input_file in the SQuAD JSON layout.")
  return examples


def _tag_inputs() -> list[Any]:
  texts = list(FLAGS.text)
  sentences = tagging.sentences_from_text(texts) if texts else []
  if FLAGS.input_file:
    more = tagging.sentences_from_text([file_io.read_text(FLAGS.input_file)], FLAGS.input_file)
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
      raise finetuned.PredictError(str(e)) from e
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
  """Every check that needs no weights first (mode, flags, inputs, vocabulary), then load
  (`pipeline.load`) and predict."""
  info = finetuned.inspect_checkpoint(FLAGS.checkpoint)
  mode = info.mode if FLAGS.mode == "auto" else FLAGS.mode
  for name, modes in _MODE_FLAGS.items():
    if FLAGS[name].present and mode not in modes:
      why = f" ({FLAGS.checkpoint} is {info.describe()})" if FLAGS.mode == "auto" else ""
      raise app.UsageError(f"--{name} is for --mode={' or '.join(modes)}, not --mode={mode}"
                           f"{why}.")
  if mode == "fill_mask":
    inputs = _texts_from_flags()
    if not inputs:
      raise app.UsageError("--mode=fill_mask needs --text (or --input_file).")
  else:
    inputs = {"classify": lambda: _classify_inputs(info), "qa": _qa_examples,
              "tag": _tag_inputs, "choose": _choice_inputs}[mode]()
  # A fine-tuned model records how it was fed: its values are the defaults, flags override.
  given = {name: FLAGS[name].value if FLAGS[name].present else None
           for name in pipeline.SETTINGS}
  model = pipeline.load(info, mode=mode, vocab=cli.vocabulary_from_flags(),
                        vocab_flag="--spm_model_file" if FLAGS.spm_model_file else "--vocab_file",
                        label_list=FLAGS.label_list, task_name=FLAGS.task_name,
                        int8=FLAGS.int8, dtype=FLAGS.dtype, **given)
  if mode == "fill_mask":
    results = model.fill_mask(inputs, FLAGS.top_k)
    # One object per input, like the other modes: `--output_file` and `--json` alike.
    _emit(results, [inference.format_fill_mask(r["text"], r["predictions"]) for r in results])
  elif mode == "classify":
    results = model.classify(inputs, FLAGS.batch_size)
    _emit(results, [classification.format_classification(r) for r in results])
  elif mode == "qa":
    results = model.answer(examples=inputs, n_best=FLAGS.n_best,
                           max_answer_length=FLAGS.max_answer_length,
                           null_score_diff_threshold=FLAGS.null_score_diff_threshold,
                           batch_size=FLAGS.batch_size)
    _emit(results, [squad_predict.format_answer(r, FLAGS.null_score_diff_threshold)
                    for r in results])
  elif mode == "tag":
    results = model.tag(sentences=inputs, batch_size=FLAGS.batch_size)
    _emit(results, [tagging.format_tags(r) for r in results])
  else:
    results = model.choose(examples=inputs, batch_size=FLAGS.batch_size)
    _emit(results, [multiple_choice.format_choice(r) for r in results])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not FLAGS.checkpoint:
    raise app.UsageError("--checkpoint is required.")
  cli.prepare_process()
  run_from_flags()


if __name__ == "__main__":
  define_flags()
  app.run(cli.one_line_errors(main), flags_parser=cli.parse_flags)
