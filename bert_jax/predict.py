"""Inference from any of our checkpoints: fill-in-the-[MASK].

    python -m bert_jax.predict --checkpoint=WORKDIR --vocab_file=vocab.txt \
        --text="to be or not to [MASK], that is the question" --top_k=5

`--checkpoint` is a pre-training workdir (it holds `bert_config.json` and `checkpoints/`), an
Orbax checkpoint directory, or a Hugging Face BERT directory (`config.json` +
`model.safetensors`, with the `cls.*` heads).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import jax
import numpy as np
from absl import app, flags

from bert_jax import configuration, convert, file_io, heads, tokenization


def fill_mask(config: configuration.BertConfig, params: Any, tokenizer: tokenization.Tokenizer,
              texts: Sequence[str], top_k: int = 5) -> list[list[list[tuple[str, float]]]]:
  """For each text, for each [MASK] in it: the `top_k` (token, probability) predictions."""
  encoded = []
  for text in texts:
    ids = [tokenizer.cls_id] + tokenizer.encode(text)[:config.max_position_embeddings - 2] + [
        tokenizer.sep_id]
    encoded.append(ids)
  length = max(len(ids) for ids in encoded)
  masks = [[i for i, t in enumerate(ids) if t == tokenizer.mask_id] for ids in encoded]
  num_pred = max(1, max(len(m) for m in masks))
  batch = len(texts)
  input_ids = np.zeros((batch, length), np.int32)
  input_mask = np.zeros((batch, length), np.int32)
  positions = np.zeros((batch, num_pred), np.int32)
  for b, ids in enumerate(encoded):
    input_ids[b, :len(ids)] = ids
    input_mask[b, :len(ids)] = 1
    positions[b, :len(masks[b])] = masks[b]
  model = heads.BertForPreTraining(config)
  mlm_logits, _ = jax.jit(lambda p, a, m, s, q: model.apply({"params": p}, a, m, s, q))(
      params, input_ids, input_mask, np.zeros_like(input_ids), positions)
  probs = np.asarray(jax.nn.softmax(mlm_logits, axis=-1))
  out = []
  for b in range(batch):
    per_text = []
    for j in range(len(masks[b])):
      best = np.argsort(-probs[b, j])[:top_k]
      tokens = tokenizer.convert_ids_to_tokens(best.tolist())
      per_text.append([(t, float(probs[b, j, k])) for t, k in zip(tokens, best)])
    out.append(per_text)
  return out


def format_fill_mask(text: str, predictions: list[list[tuple[str, float]]]) -> str:
  lines = [text]
  if not predictions:
    lines.append("  (no [MASK] in this text)")
  for i, preds in enumerate(predictions):
    shown = ", ".join(f"{tok} {p:.1%}" for tok, p in preds)
    lines.append(f"  [MASK] #{i + 1}: {shown}")
  return "\n".join(lines)


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Command-line flags, defined only when run as a program (importers get none)."""
  flags.DEFINE_string("checkpoint", None, "Workdir, Orbax or Hugging Face directory.")
  flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt.")
  flags.DEFINE_string("spm_model_file", None, "SentencePiece model (instead of vocab_file).")
  flags.DEFINE_bool("do_lower_case", True, "Lower-case input (uncased models).")
  flags.DEFINE_multi_string("text", [], "Text with [MASK] tokens; may be repeated.")
  flags.DEFINE_integer("top_k", 5, "Predictions per [MASK].")
  flags.DEFINE_bool("json", False, "Print JSON instead of text.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not FLAGS.checkpoint or not FLAGS.text:
    raise app.UsageError("--checkpoint and at least one --text are required.")
  config, params = convert.load_pretraining_model(FLAGS.checkpoint)
  vocab = FLAGS.vocab_file
  if not vocab and not FLAGS.spm_model_file:
    for candidate in ("vocab.txt",):
      if file_io.exists(file_io.join(FLAGS.checkpoint, candidate)):
        vocab = file_io.join(FLAGS.checkpoint, candidate)
  tokenizer = tokenization.load_tokenizer(vocab_file=vocab, spm_model_file=FLAGS.spm_model_file,
                                          do_lower_case=FLAGS.do_lower_case)
  results = fill_mask(config, params, tokenizer, FLAGS.text, FLAGS.top_k)
  if FLAGS.json:
    print(json.dumps([{"text": t, "predictions": r} for t, r in zip(FLAGS.text, results)],
                     indent=2))
  else:
    for text, preds in zip(FLAGS.text, results):
      print(format_fill_mask(text, preds))


if __name__ == "__main__":
  define_flags()
  app.run(main)
