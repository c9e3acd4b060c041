r"""Looking inside a model: where its heads attend.

    python -m bert_jax.analyze attention --checkpoint=CHECKPOINT \
        (--text="The cat sat on the mat." ... | --input_file=sentences.txt) \
        --output_dir=attention [--vocab_file=vocab.txt] [--max_seq_length=128] \
        [--plot_examples=1] [--json]

`--checkpoint` is any checkpoint this package reads (a pre-training workdir, a fine-tuning
output, a Hugging Face or TF1 directory), of any family. Each input is one text or
`text a ||| text b`. Written to `--output_dir`: `example<e>_layer<l>.png` (for the first
`--plot_examples` inputs, one grid of heads per layer, tokens on both axes),
`head_statistics.json` and `head_statistics.png` (per layer and head, over every input token:
the attention given to [CLS], [SEP], punctuation, the previous and the next token, and the
entropy of the distribution, as Clark et al. 2019 measured them); the table is printed
(`--json`: the JSON instead). The library is `bert_jax.analysis`.
"""

from __future__ import annotations

import json

from absl import app, flags

from bert_jax import cli, file_io, inference
from bert_jax.analysis import attention
from bert_jax.interop import checkpoints

FLAGS = flags.FLAGS
COMMANDS = ("attention",)


def main(argv):
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f"Name one analysis: {', '.join(COMMANDS)} (got "
                         f"{' '.join(argv[1:]) or 'none'}).")
  cli.quiet_unless_verbose()
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
    print(json.dumps({m: stats[m].tolist() for m in attention.MEASURES}))
  else:
    print(f"{len(texts_a)} inputs, {tokens} tokens, {config.num_hidden_layers} layers x "
          f"{config.num_attention_heads} heads, from {origin}")
    print(attention.statistics_table(stats))
  print(f"wrote {len(written)} files to {FLAGS.output_dir}")


def define_flags() -> None:
  flags.DEFINE_string("checkpoint", None, "Pre-training workdir, fine-tuning output, Hugging "
                      "Face or TF1 checkpoint.", required=True)
  flags.DEFINE_multi_string("text", [], "A text to look at ('a' or 'a ||| b'); repeatable.")
  flags.DEFINE_string("input_file", None, "One text per line ('a' or 'a ||| b').")
  flags.DEFINE_string("output_dir", None, "Where the PNGs and JSON go.", required=True)
  cli.define_vocab_flags()
  flags.DEFINE_integer("max_seq_length", 128, "Maximum tokens per input.")
  flags.DEFINE_integer("batch_size", 16, "Inputs per forward pass.")
  flags.DEFINE_integer("plot_examples", 1, "Inputs whose maps are drawn, layer by layer.")
  flags.DEFINE_bool("json", False, "Print the statistics as JSON instead of a table.")


if __name__ == "__main__":
  define_flags()
  app.run(cli.one_line_errors(main), flags_parser=cli.parse_flags)
