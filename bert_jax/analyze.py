r"""Looking inside a model: where its heads attend, which heads it can lose, and what each layer
holds about a word's label.

    python -m bert_jax.analyze attention --checkpoint=CHECKPOINT \
        (--text="The cat sat on the mat." ... | --input_file=sentences.txt) \
        --output_dir=attention [--vocab_file=vocab.txt] [--max_seq_length=128] \
        [--plot_examples=1] [--json]

    python -m bert_jax.analyze heads --checkpoint=FINETUNED_OUTPUT_DIR --data_dir=DATA \
        --output_dir=heads [--task_name=...] [--prune_fraction=0.1] [--prune_to=N] [--json]

    python -m bert_jax.analyze probe --checkpoint=CHECKPOINT --train_file=train.conll \
        [--dev_file=dev.conll] [--label_column=-1] --output_dir=probe [--max_seq_length=128] \
        [--batch_size=16] [--json]

`attention`: `--checkpoint` is any checkpoint this package reads (a pre-training workdir, a
fine-tuning output, a Hugging Face or TF1 directory), of any family. Each input is one text or
`text a ||| text b`. Written to `--output_dir`: `example<e>_layer<l>.png` (for the first
`--plot_examples` inputs, one grid of heads per layer, tokens on both axes),
`head_statistics.json` and `head_statistics.png` (per layer and head, over every input token:
the attention given to [CLS], [SEP], punctuation, the previous and the next token, and the
entropy of the distribution, as Clark et al. 2019 measured them); the table is printed
(`--json`: the JSON instead).

`heads`: a fine-tuned model (the `--output_dir` of `finetune`, or its `best/`) on its task's dev
data, read as `finetune --do_eval` reads it (`--data_dir`, and the task's other flags where
the checkpoint did not record them): head importance (Michel et al. 2019), then the task's
metric as `--prune_fraction` of the heads at a time are pruned by importance, to none left.
Written: `head_pruning.json` (importance, the curve with each step's mask),
`head_pruning.png`, `head_importance.png`; with `--prune_to=N`, `pruned/`: the model keeping
the N most important heads with the others cut out of its matrices (a fine-tuning output that
`predict`, `convert` and `finetune` read), scored and timed against the full model.

`probe`: linear probes per layer (Tenney et al. 2019; Liu et al. 2019) for any checkpoint of any
family: one logistic regression per layer (0: the embeddings' output) trained on the frozen
vectors of `--train_file`'s words (each read at its first word piece) to predict the label in
`--label_column` (CoNLL layout: one word per line, its columns separated by spaces or tabs, a
blank line after each sentence; default: the last column; a `.conllu` file is Universal
Dependencies' CoNLL-U, default column 3, UPOS), scored on `--dev_file`'s words or on
20% of the training sentences held out. Written: `probe.json` (accuracy per layer on held-out
and on training words, the majority and word-form baselines, counts) and `probe.png`; the table
is printed (`--json`: the JSON instead).

The library is `bert_jax.analysis`.
"""

from __future__ import annotations

import json

from absl import app, flags

from bert_jax import cli, file_io, inference
from bert_jax.analysis import attention, probe, pruning_study
from bert_jax.interop import checkpoints
from bert_jax.runs import finetune_config
from bert_jax.tasks.tagging import data as tagging_data

FLAGS = flags.FLAGS
COMMANDS = ("attention", "heads", "probe")

# Flags that only some commands read: given to another they are a mistake, not a no-op.
_COMMAND_FLAGS = {"text": ("attention",), "input_file": ("attention",),
                  "plot_examples": ("attention",), "prune_fraction": ("heads",),
                  "prune_to": ("heads",), "train_file": ("probe",), "dev_file": ("probe",),
                  "max_train_words": ("probe",),
                  "label_column": ("heads", "probe")}
# The fine-tuning flags `heads` reads the task with (their help is finetune's).
_TASK_FLAGS = ("task_name", "data_dir", "data_format", "label_list", "regression",
               "text_a_column", "text_b_column", "label_column", "has_header", "tagging_scheme",
               "document_context", "predict_file", "version_2_with_negative", "eval_metric")
for _name in _TASK_FLAGS:
  _COMMAND_FLAGS.setdefault(_name, ("heads",))


def main(argv):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f"Name one analysis: {', '.join(COMMANDS)} (got "
                         f"{' '.join(argv[1:]) or 'none'}).")
  command = argv[1]
  for name, commands in _COMMAND_FLAGS.items():
    if FLAGS[name].present and command not in commands:
      raise app.UsageError(f"--{name} is for `analyze {' / '.join(commands)}`, not "
                           f"`analyze {command}`.")
  cli.prepare_process()
  {"attention": _attention, "heads": _heads, "probe": _probe}[command]()


def _attention():
  if bool(FLAGS.text) == bool(FLAGS.input_file):
    raise app.UsageError("Give the texts to look at: --text (repeatable) or --input_file.")
  if FLAGS.plot_examples < 0:
    raise app.UsageError(f"--plot_examples={FLAGS.plot_examples}: must be 0 or more.")
  if FLAGS.input_file:
    texts_a, texts_b = inference.read_text_pairs(FLAGS.input_file)
  else:
    split = [t.partition(inference.PAIR_SEPARATOR) for t in FLAGS.text]
    texts_a = [a.strip() for a, _, _ in split]
    texts_b = [b.strip() if sep else None for _, sep, b in split]
  config, encoder, origin = checkpoints.load_encoder(FLAGS.checkpoint)
  tokenizer = cli.tokenizer_from_flags(FLAGS.checkpoint, None)
  maps = attention.attention_maps(config, encoder, tokenizer, texts_a, texts_b,
                                  FLAGS.max_seq_length, FLAGS.batch_size)
  file_io.makedirs(FLAGS.output_dir)
  written = []
  for example in range(min(FLAGS.plot_examples, len(texts_a))):
    written += attention.plot_example(maps, example, FLAGS.output_dir)
  stats = attention.head_statistics(maps, tokenizer)
  tokens = sum(len(t) for t in maps.tokens)
  written += attention.write_statistics(stats, FLAGS.output_dir, len(texts_a), tokens)
  if FLAGS.json:
    print(json.dumps(attention.as_json(stats)))
  else:
    print(f"{len(texts_a)} inputs, {tokens} tokens, {config.num_hidden_layers} layers x "
          f"{config.num_attention_heads} heads, from {origin}")
    print(attention.statistics_table(stats))
  print(f"wrote {len(written)} files to {FLAGS.output_dir}")


def _heads():
  given = {name: FLAGS[name].value for name in _TASK_FLAGS if FLAGS[name].present}
  if FLAGS["max_seq_length"].present:
    given["max_seq_length"] = FLAGS.max_seq_length
  given["eval_batch_size"] = given["predict_batch_size"] = FLAGS.batch_size
  study = pruning_study.study_checkpoint(
      FLAGS.checkpoint, given, cli.tokenizer_from_flags(FLAGS.checkpoint, None),
      fraction=FLAGS.prune_fraction, prune_to=FLAGS.prune_to, output_dir=FLAGS.output_dir,
      batch_size=FLAGS.batch_size)
  written = pruning_study.write(study, FLAGS.output_dir)
  if FLAGS.json:
    print(json.dumps(study.as_dict()))
  else:
    print(pruning_study.table(study))
    if study.pruned_model:
      p = study.pruned_model
      print(f"pruned model ({p['heads_kept']} heads, per layer {p['heads_per_layer']}): "
            f"{study.metric} {p['score']:.4f}; {p['speedup']:.2f}x the full model's speed on "
            f"{p['rows_timed']} rows ({p['seconds_full'] * 1e3:.1f} ms -> "
            f"{p['seconds_pruned'] * 1e3:.1f} ms); "
            f"{p['parameters_pruned']:,} of {p['parameters_full']:,} parameters; written to "
            f"{p['directory']}")
  print(f"wrote {len(written)} files to {FLAGS.output_dir}")


def _probe():
  if not FLAGS.train_file:
    raise app.UsageError("`analyze probe` needs --train_file (labelled words, one per line, in "
                         "CoNLL layout).")
  label_column = FLAGS.label_column
  if label_column is None:  # the last column; CoNLL-U's universal part of speech
    label_column = 3 if tagging_data.is_conllu(FLAGS.train_file) else -1
  # The files first: their mistakes are found before any weights are read.
  train = probe.read_labelled_words(FLAGS.train_file, label_column)
  if FLAGS.dev_file:
    dev = probe.read_labelled_words(FLAGS.dev_file, label_column)
    dev_source = FLAGS.dev_file
  else:
    train, dev = probe.hold_out(train)
    dev_source = f"{probe.DEV_FRACTION:.0%} of the sentences of {FLAGS.train_file}"
  available = sum(len(s.words) for s in train)
  if FLAGS.max_train_words is not None and FLAGS.max_train_words < 1:
    raise app.UsageError(f"--max_train_words={FLAGS.max_train_words}: must be 1 or more.")
  if FLAGS.max_train_words and available > FLAGS.max_train_words:
    train = probe.first_words(train, FLAGS.max_train_words)
    print(f"training on the first {sum(len(s.words) for s in train)} of {available} training "
          f"words (--max_train_words={FLAGS.max_train_words}: every word's vectors are kept in "
          "memory)")
  probe.label_list_of(train, FLAGS.train_file)
  config, encoder, origin = checkpoints.load_encoder(FLAGS.checkpoint)
  tokenizer = cli.tokenizer_from_flags(FLAGS.checkpoint, None)
  result = probe.probe_layers(config, encoder, tokenizer, train, dev,
                              train_source=FLAGS.train_file, max_seq_length=FLAGS.max_seq_length,
                              batch_size=FLAGS.batch_size)
  about = {"checkpoint": FLAGS.checkpoint, "train_file": FLAGS.train_file,
           "dev_file": dev_source, "label_column": label_column}
  file_io.makedirs(FLAGS.output_dir)
  written = probe.write_results(
      result, FLAGS.output_dir, title=f"{FLAGS.checkpoint}\nlabels: column {label_column} of "
      f"{FLAGS.train_file}", **about)
  if FLAGS.json:
    print(json.dumps(probe.to_json(result, **about)))
  else:
    d = result.details
    print(f"{d['train_words']} training words ({d['train_sentences']} sentences), "
          f"{d['dev_words']} held-out words ({d['dev_sentences']} sentences, from {dev_source}), "
          f"{len(result.labels)} labels, {config.num_hidden_layers} layers, from {origin}")
    if d["sentences_split_into_windows"] or d["words_with_pieces_cut"]:
      print(f"{d['sentences_split_into_windows']} sentences longer than --max_seq_length="
            f"{FLAGS.max_seq_length} read in windows (no word dropped); "
            f"{d['words_with_pieces_cut']} words longer than a row kept their first pieces")
    if d["dev_words_with_unseen_labels"]:
      print(f"{d['dev_words_with_unseen_labels']} held-out words have a label no training word "
            "has (counted as wrong)")
    print(probe.results_table(result))
  print(f"wrote {len(written)} files to {FLAGS.output_dir}")


def define_flags() -> None:
  flags.DEFINE_string("checkpoint", None, "Pre-training workdir, fine-tuning output, Hugging "
                      "Face or TF1 checkpoint.", required=True)
  flags.DEFINE_multi_string("text", [], "A text to look at ('a' or 'a ||| b'); repeatable.")
  flags.DEFINE_string("input_file", None, "One text per line ('a' or 'a ||| b').")
  flags.DEFINE_string("output_dir", None, "Where the PNGs and JSON go.", required=True)
  cli.define_vocab_flags()
  flags.DEFINE_integer("max_seq_length", 128, "Maximum tokens per input (heads: default, "
                       "the length the model was fine-tuned with).")
  flags.DEFINE_integer("batch_size", 16, "Inputs per forward pass.")
  flags.DEFINE_integer("plot_examples", 1, "Inputs whose maps are drawn, layer by layer.")
  flags.DEFINE_bool("json", False, "Print the statistics as JSON instead of a table.")
  flags.DEFINE_float("prune_fraction", 0.1, "heads: share of all heads pruned at each step.")
  flags.DEFINE_integer("prune_to", None, "heads: write the model keeping this many heads "
                       "(the most important) to <output_dir>/pruned.")
  flags.DEFINE_string("train_file", None, "probe: labelled words in CoNLL layout (one word per "
                      "line, columns separated by spaces or tabs, a blank line after each "
                      "sentence).")
  flags.DEFINE_string("dev_file", None, "probe: held-out words in the same layout (default: "
                      "20% of the training sentences).")
  flags.DEFINE_integer("max_train_words", 100_000, "probe: train on at most this many words "
                       "(the first whole sentences): every word's vector of every layer is held "
                       "in memory (BERT-base: 40 KB a word).")
  kinds = {name: (kind, text) for name, kind, text in finetune_config.ORIGINAL_FLAGS}
  for name in _TASK_FLAGS:
    kind, text = kinds[name]
    probe_text = (" probe: the label's column, 0 being the word's (default: the last, -1; "
                  "in a .conllu file 3, UPOS)." if name == "label_column" else "")
    getattr(flags, f"DEFINE_{kind}")(name, None, f"heads: {text}{probe_text}")


if __name__ == "__main__":
  define_flags()
  app.run(cli.one_line_errors(main), flags_parser=cli.parse_flags)
