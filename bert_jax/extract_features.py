r"""Token vectors of chosen layers for every input line, as the original `extract_features.py`.

    python -m bert_jax.extract_features --input_file=sentences.txt --output_file=features.npz \
        --init_checkpoint=CHECKPOINT --vocab_file=vocab.txt --layers=-1,-2,-3,-4 \
        --max_seq_length=128 --batch_size=32

One example per input line; `text a ||| text b` makes a sentence pair, as in the original. The
output is a NumPy `.npz` archive: `layer_-1`, `layer_-2`, ... float32 (examples, max_seq_length,
hidden) — layer -1 is the last encoder layer and layer 0 the embeddings' output — plus
`input_ids`, `input_mask` and `segment_ids`, so padding can be dropped with the mask. It is
written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import io

import numpy as np
from absl import app, flags

from bert_jax import cli, file_io, inference
from bert_jax.interop import checkpoints
from bert_jax.model import modeling
from bert_jax.text import pairs

FLAGS = flags.FLAGS


def read_lines(path: str) -> tuple[list[str], list[str | None]]:
  texts_a, texts_b = [], []
  for number, line in enumerate(file_io.read_text(path).splitlines(), start=1):
    line = line.strip()
    if not line:
      continue
    if line.count("|||") > 1:
      raise ValueError(f"{path}:{number}: more than one '|||' separator (expected 'a' or "
                       "'a ||| b').")
    a, _, b = line.partition("|||")
    texts_a.append(a.strip())
    texts_b.append(b.strip() if b else None)
  if not texts_a:
    raise ValueError(f"{path}: no non-empty lines.")
  return texts_a, texts_b


def extract(config: modeling.BertConfig, encoder_params, tokenizer, texts_a, texts_b,
            layers: list[int], max_seq_length: int, batch_size: int = 32
            ) -> dict[str, np.ndarray]:
  """`{"layer_<i>": (n, length, hidden), "input_ids": ..., ...}` for the given layer indices."""
  total = config.num_hidden_layers + 1  # embeddings output + every layer
  for layer in layers:
    if not -total <= layer < total:
      raise ValueError(f"--layers: {layer} is out of range for {config.num_hidden_layers} "
                       f"layers (use -{total}..{total - 1}).")
  feats = pairs.encode_examples(tokenizer, texts_a, texts_b, max_seq_length)
  model = modeling.BertModel(config, add_pooling_layer=False, collect_hidden_states=True)
  predictor = inference.Predictor(
      model, output_fn=lambda out: tuple(out["hidden_states"][layer] for layer in layers))
  params = {k: v for k, v in encoder_params.items() if k != "pooler"}
  hidden = predictor(predictor.place(params), feats, batch_size, trim=False, desc="extract")
  outputs = dict(zip(layers, hidden))
  out = {f"layer_{layer}": np.asarray(v) for layer, v in outputs.items()}
  out.update(feats)
  return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config, encoder, origin = checkpoints.load_encoder(FLAGS.init_checkpoint,
                                                    FLAGS.bert_config_file)
  config = config.replace(scan_layers=False)
  tokenizer = cli.tokenizer_from_flags(FLAGS.init_checkpoint, FLAGS.bert_config_file)
  texts_a, texts_b = read_lines(FLAGS.input_file)
  layers = [int(x) for x in FLAGS.layers]
  arrays = extract(config, encoder, tokenizer, texts_a, texts_b, layers, FLAGS.max_seq_length,
                   FLAGS.batch_size)
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


if __name__ == "__main__":
  define_flags()
  app.run(cli.one_line_errors(main), flags_parser=cli.parse_flags)
