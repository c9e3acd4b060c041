r"""Token vectors of chosen layers for every input line, as the original `extract_features.py`.

    python -m bert_jax.extract_features --input_file=sentences.txt --output_file=features.npz \
        --init_checkpoint=CHECKPOINT --vocab_file=vocab.txt --layers=-1,-2,-3,-4 \
        --max_seq_length=128 --batch_size=32 [--dtype=bfloat16]

One example per input line; `text a ||| text b` makes a sentence pair, as in the original. The
output is a NumPy `.npz` archive: `layer_-1`, `layer_-2`, ... float32 (examples, max_seq_length,
hidden) — layer -1 is the last encoder layer and layer 0 the embeddings' output — plus
`input_ids`, `input_mask` and `segment_ids`, so padding can be dropped with the mask. It is
written under a temporary name and renamed when complete. `--dtype=bfloat16` computes in
bfloat16 (the layers are still written as float32).
"""

from __future__ import annotations

import io

import numpy as np
from absl import app, flags

from bert_jax import cli, file_io, inference
from bert_jax.interop import checkpoints

FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  cli.prepare_process()
  config, encoder, origin = checkpoints.load_encoder(FLAGS.init_checkpoint,
                                                    FLAGS.bert_config_file)
  config = inference.compute_config(config.replace(scan_layers=False), FLAGS.dtype)
  tokenizer = cli.tokenizer_from_flags(FLAGS.init_checkpoint, FLAGS.bert_config_file)
  texts_a, texts_b = inference.read_text_pairs(FLAGS.input_file)
  layers = [int(x) for x in FLAGS.layers]
  arrays = inference.extract_layers(config, encoder, tokenizer, texts_a, texts_b, layers,
                                   FLAGS.max_seq_length, FLAGS.batch_size)
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  file_io.write_bytes_atomic(FLAGS.output_file, buffer.getvalue())
  print(f"{FLAGS.output_file}: {len(texts_a)} examples, layers {layers}, from {origin}")


def define_flags() -> None:
  flags.DEFINE_string("input_file", None, "One text per line ('a' or 'a ||| b').", required=True)
  flags.DEFINE_string("output_file", None, "The .npz to write.", required=True)
  flags.DEFINE_string("init_checkpoint", None, "Workdir, Orbax or Hugging Face directory.",
                      required=True)
  flags.DEFINE_string("bert_config_file", None, "bert_config.json (default: the checkpoint's).")
  cli.define_vocab_flags()
  flags.DEFINE_list("layers", ["-1", "-2", "-3", "-4"], "Layer indices (-1: the last).")
  flags.DEFINE_integer("max_seq_length", 128, "Maximum tokens per example.")
  flags.DEFINE_integer("batch_size", 32, "Examples per forward pass.")
  cli.define_dtype_flag()


if __name__ == "__main__":
  define_flags()
  app.run(cli.one_line_errors(main), flags_parser=cli.parse_flags)
