"""Inference as a library: batching, bucketing and the deterministic forward pass under the
mesh and the logical-axis rules, for every command that runs a model without training it —
`predict`, `extract_features`, fine-tuning's evaluation and predictions, and the notebooks.

`Predictor` jits a module's forward pass once (parameters with their shardings, batches split
over the data axes), pads the rows to whole batches with weight-0 rows and drops them again, and
optionally cuts unused padding columns (`data/arrays.trim_to_bucket`). The same rows give the
same outputs whatever batch they land in.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import flax.linen as nn
import jax
import numpy as np

from bert_jax import file_io
from bert_jax.data import arrays
from bert_jax.model import heads, modeling
from bert_jax.model.configuration import BertConfig
from bert_jax.parallel import sharding
from bert_jax.text import features, pairs
from bert_jax.training.step import apply_variables, with_mesh


# The dtypes a model computes in at inference (`compute_config`); parameters stay as stored.
COMPUTE_DTYPES = ("float32", "bfloat16")


def check_dtype(dtype: str) -> None:
  """Refuses a compute dtype inference does not offer, by name."""
  if dtype not in COMPUTE_DTYPES:
    raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(COMPUTE_DTYPES)}.")


def compute_config(config: BertConfig, dtype: str) -> BertConfig:
  """`config` computing in `dtype` ("float32", the checkpoint's numbers to ~1e-5 of its
  reference; "bfloat16": matmuls and activations in bfloat16 with float32 parameters, LayerNorm
  statistics and softmax, as a bfloat16 training step computes: a few 1e-3 of the outputs'
  scale away). Outputs are float32 either way."""
  check_dtype(dtype)
  return config.replace(dtype=dtype)


class Predictor:
  """`predictor(params, feats, batch_size)` → the module's outputs for every row of `feats`.

  `mesh`/`rules` default to data parallelism over every local device with parameters
  replicated; a run passes its own (and `param_shardings`) so that evaluation sees the
  parameters exactly as training laid them out.
  """

  def __init__(self, module: nn.Module, input_names: Sequence[str] = features.ENCODER_INPUTS, *,
               mesh=None, rules=None, param_shardings=None, output_fn=None):
    self.module = module
    self.input_names = tuple(input_names)
    self.mesh = mesh if mesh is not None else sharding.create_mesh((-1, 1, 1))
    self.rules = rules if rules is not None else sharding.DEFAULT_LOGICAL_AXIS_RULES
    self.batch_sharding = sharding.batch_sharding(self.mesh)
    self.param_shardings = param_shardings
    output_fn = output_fn or (lambda outputs: outputs)

    def forward(params, batch):
      # Parameters only: a model with FP8 matmuls, whose scales are training state, is refused
      # in words (predict with the same parameters and quantization='none').
      outputs = apply_variables(module, {"params": params},
                                *(batch[k] for k in self.input_names), deterministic=True)
      return output_fn(outputs)
    self._forward = forward
    self._jitted = None

  def _compiled(self, params):
    """The forward pass, jitted once (parameters replicated unless shardings were given)."""
    if self._jitted is None:
      if self.param_shardings is None:
        self.param_shardings = jax.tree.map(lambda _: sharding.replicated(self.mesh), params)
      self._jitted = with_mesh(jax.jit(self._forward, in_shardings=(
          self.param_shardings, self.batch_sharding), out_shardings=None), self.mesh, self.rules)
    return self._jitted

  def place(self, params):
    """`params` laid out as this predictor takes them."""
    self._compiled(params)
    return jax.device_put(params, self.param_shardings)

  def batch_rows(self, batch_size: int, num_rows: int) -> int:
    """Rows per forward pass: no more than the input needs, a multiple of the data shards."""
    shards = sharding.data_parallel_size(self.mesh)
    rows = max(1, min(batch_size, num_rows))
    return -(-rows // shards) * shards

  def __call__(self, params, feats: dict[str, np.ndarray], batch_size: int, *,
               trim: bool = True, desc: str = "predict", progress: bool = True) -> Any:
    """Outputs (an array or a tuple of arrays) for every row of `feats`, in order.
    `trim` cuts padding columns (only for outputs without a sequence axis)."""
    if "weight" not in feats:
      feats = dict(feats, weight=np.ones(len(feats[self.input_names[0]]), np.float32))
    n = len(feats["weight"])
    step = self._compiled(params)
    rows = self.batch_rows(batch_size, n)
    padded = arrays.pad_rows(feats, rows)
    outputs = []
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    starts = range(0, len(padded["weight"]), rows)
    # A bar only where there is progress to show: several batches, on the reporting process.
    for start in tqdm(starts, desc=desc, unit="batch", leave=False,
                      disable=not progress or len(starts) < 2 or jax.process_index() != 0):
      batch = {k: v[start:start + rows] for k, v in padded.items()}
      if trim:
        batch = arrays.trim_to_bucket(batch)
      outputs.append(jax.device_get(step(params, arrays.to_global(batch,
                                                                  self.batch_sharding))))
    return jax.tree.map(lambda *parts: np.concatenate([np.asarray(p) for p in parts])[:n],
                        *outputs)


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
  """Probabilities of logits in float64, as prediction files and `predict` show them."""
  logits = np.asarray(logits, np.float64)
  e = np.exp(logits - logits.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


# -------------------------------------------------------------------------------- fill-mask
def mask_text(text: str, mask_token: str, strip_left: bool = False) -> str:
  """`text` with "[MASK]" written as the family's mask token (RoBERTa's "<mask>"). With
  `strip_left` (byte-level BPE) the spaces before a mask go: RoBERTa's released tokenizer strips
  them, so "the <mask>" is "Ġthe <mask>" and the mask stands for the word with its space."""
  if mask_token != "[MASK]":
    text = text.replace("[MASK]", mask_token)
  if strip_left:
    text = re.sub(r"\s+" + re.escape(mask_token), mask_token, text)
  return text


def fill_mask(config: BertConfig, params: Any, tokenizer, texts: Sequence[str],
              top_k: int = 5, batch_size: int = 32) -> list[list[list[tuple[str, float]]]]:
  """For each text, for each [MASK] in it: the `top_k` (token, probability) predictions.

  `params` are the encoder and the masked-LM head (`interop.checkpoints.load_masked_lm`); a
  next-sentence head, if present, is not needed.
  """
  encoded = []
  mask_token = tokenizer.convert_ids_to_tokens([tokenizer.mask_id])[0]
  for text in texts:
    text = mask_text(text, mask_token, strip_left=bool(tokenizer.word_prefix))
    # The family's single-segment layout ([CLS] A [SEP], or RoBERTa's <s> A </s>), cut to what
    # the position table serves (RoBERTa's offset included).
    encoded.append(tokenizer.build_inputs(tokenizer.encode(text)[:config.max_sequence_length - 2]))
  length = max(len(ids) for ids in encoded)
  masks = [[i for i, t in enumerate(ids) if t == tokenizer.mask_id] for ids in encoded]
  num_pred = max(1, max(len(m) for m in masks))
  n = len(texts)
  feats = {"input_ids": np.zeros((n, length), np.int32),
           "input_mask": np.zeros((n, length), np.int32),
           "segment_ids": np.zeros((n, length), np.int32),
           "masked_lm_positions": np.zeros((n, num_pred), np.int32)}
  for b, ids in enumerate(encoded):
    feats["input_ids"][b, :len(ids)] = ids
    feats["input_mask"][b, :len(ids)] = 1
    feats["masked_lm_positions"][b, :len(masks[b])] = masks[b]
  params = heads.masked_lm_params(params)
  predictor = Predictor(heads.BertForMaskedLM(config), features.ENCODER_INPUTS + (features.MASKED_LM_POSITIONS,),
                        output_fn=lambda logits: jax.nn.softmax(logits, axis=-1))
  probs = predictor(predictor.place(params), feats, batch_size, trim=False, progress=False)
  out = []
  for b in range(n):
    per_text = []
    for j in range(len(masks[b])):
      best = np.argsort(-probs[b, j])[:top_k]
      tokens = tokenizer.convert_ids_to_tokens(best.tolist())
      if tokenizer.word_prefix:  # byte-level pieces ("Ġcity", "Ã©"): show their text
        tokens = [tokenizer.piece_text(t) or t for t in tokens]
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


# ------------------------------------------------------------------ layer features
# Separates the two texts of a pair inside one line or one --text.
PAIR_SEPARATOR = "|||"


def read_text_pairs(path: str) -> tuple[list[str], list[str | None]]:
  """One example per non-empty line: `text`, or a pair as `text a ||| text b` (the original
  `extract_features.py` input)."""
  texts_a, texts_b = [], []
  for number, line in enumerate(file_io.read_text(path).splitlines(), start=1):
    line = line.strip()
    if not line:
      continue
    if line.count(PAIR_SEPARATOR) > 1:
      raise ValueError(f"{path}:{number}: more than one '|||' separator (expected 'a' or "
                       "'a ||| b').")
    a, _, b = line.partition(PAIR_SEPARATOR)
    texts_a.append(a.strip())
    texts_b.append(b.strip() if b else None)
  if not texts_a:
    raise ValueError(f"{path}: no non-empty lines.")
  return texts_a, texts_b


def extract_layers(config: BertConfig, encoder_params, tokenizer, texts_a, texts_b,
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
  predictor = Predictor(
      model, output_fn=lambda out: tuple(out["hidden_states"][layer] for layer in layers))
  params = {k: v for k, v in encoder_params.items() if k != "pooler"}
  hidden = predictor(predictor.place(params), feats, batch_size, trim=False, desc="extract")
  outputs = dict(zip(layers, hidden))
  out = {f"layer_{layer}": np.asarray(v) for layer, v in outputs.items()}
  out.update(feats)
  return out
