"""Where a model's heads attend: every layer's and head's attention probabilities for given
texts, and over a corpus the share each head gives to [CLS], [SEP], punctuation, the previous and
the next token, with the entropy of its distribution (Clark et al. 2019, "What Does BERT Look
At?"; Kovaleva et al. 2019).

The probabilities are the reference softmax(q·k/√d) over the real keys
(`modeling.attention_probabilities`), read from the model's own projections whatever kernel it
trains with (cuDNN, Pallas or XLA compute the same function without materialising it); they are
collected from unrolled layers, so scanned checkpoints are unrolled first.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
from typing import Any, Sequence

import jax
import numpy as np

from bert_jax import file_io
from bert_jax.model import configuration, modeling
from bert_jax.text import characters, pairs

# What `head_statistics` measures per head, in its table's order.
MEASURES = ("cls", "sep", "punctuation", "previous", "next", "entropy")
_WORD_MARKS = ("##", "\u0120", "\u2581")  # WordPiece continuation, byte-level BPE, SentencePiece


@dataclasses.dataclass
class AttentionMaps:
  """Per example: its real tokens, their ids, and (layers, heads, n, n) probabilities (rows:
  queries, columns: keys; each row sums to 1)."""
  tokens: list[list[str]]
  ids: list[np.ndarray]
  probabilities: list[np.ndarray]


def layer_index(path: Sequence[str]) -> int:
  """The index of the unrolled layer a module path lies in (`layer_<i>`); -1 for a block that
  no single layer owns (shared by every layer)."""
  for part in path:
    match = re.fullmatch(r"layer_(\d+)", part)
    if match:
      return int(match.group(1))
  return -1


def _in_layer_order(tree: Any) -> list[jax.Array]:
  """The sown probabilities of every layer, first to last: `layer_<i>` paths in index order;
  a block shared by every layer holds one entry per application, already in order."""
  found = []

  def walk(node, path):
    if isinstance(node, tuple):
      found.append((path, node))
    else:
      for key, value in node.items():
        walk(value, path + (key,))

  walk(tree, ())
  found.sort(key=lambda item: layer_index(item[0]))
  return [p for _, probs in found for p in probs]


def _with_pruned_heads(config: configuration.BertConfig, sown: list[jax.Array],
                       shape: tuple[int, int]) -> list[jax.Array]:
  """Every layer's maps at the full head count, the kept heads in their original places and
  the pruned ones NaN (drawn blank, their statistics NaN: JSON null). A layer without heads
  sowed nothing."""
  batch, length = shape
  sown = list(sown)
  out = []
  for layer in range(config.num_hidden_layers):
    full = jax.numpy.full((batch, config.num_attention_heads, length, length), jax.numpy.nan)
    kept = config.kept_heads(layer)
    if kept:
      full = full.at[:, jax.numpy.asarray(kept)].set(sown.pop(0))
    out.append(full)
  return out


def attention_maps(config: configuration.BertConfig, encoder_params: Any, tokenizer,
                   texts_a: Sequence[str], texts_b: Sequence[str | None] | None = None,
                   max_seq_length: int = 128, batch_size: int = 16) -> AttentionMaps:
  """Every layer's and head's attention probabilities for each text (or pair); a pruned
  model's removed heads are NaN."""
  config.check_sequence_length(max_seq_length, "--max_seq_length")
  config = config.replace(scan_layers=False)
  feats = pairs.encode_examples(tokenizer, texts_a, texts_b, max_seq_length)
  model = modeling.BertModel(config, add_pooling_layer=False)
  params = {k: v for k, v in encoder_params.items() if k != "pooler"}

  @jax.jit
  def forward(params, input_ids, input_mask, segment_ids):
    _, state = model.apply({"params": params}, input_ids, input_mask, segment_ids,
                           deterministic=True, mutable=[modeling.ATTENTION_MAPS])
    layers = _in_layer_order(state[modeling.ATTENTION_MAPS])
    if config.pruned_heads is not None:
      layers = _with_pruned_heads(config, layers, input_ids.shape)
    return jax.numpy.stack(layers, axis=1)  # (batch, layers, heads, q, k)

  out = AttentionMaps([], [], [])
  n = len(texts_a)
  for start in range(0, n, batch_size):
    rows = {k: v[start:start + batch_size] for k, v in feats.items()}
    probs = np.asarray(forward(params, rows["input_ids"], rows["input_mask"],
                               rows["segment_ids"]))
    if probs.shape[1] != config.num_hidden_layers:
      raise ValueError(f"collected {probs.shape[1]} layers' attention for a model of "
                       f"{config.num_hidden_layers}.")
    for i in range(len(rows["input_ids"])):
      length = int(rows["input_mask"][i].sum())
      ids = rows["input_ids"][i, :length]
      out.ids.append(ids)
      out.tokens.append(tokenizer.convert_ids_to_tokens(ids.tolist()))
      out.probabilities.append(probs[i, :, :, :length, :length])
  return out


def _is_punctuation(token: str) -> bool:
  for mark in _WORD_MARKS:
    if token.startswith(mark):
      token = token[len(mark):]
  return bool(token) and all(characters.is_punctuation(c) for c in token)


def head_statistics(maps: AttentionMaps, tokenizer) -> dict[str, np.ndarray]:
  """Per measure, a (layers, heads) array averaged over every query token of every example:
  the attention given to [CLS] / [SEP] (the family's own first and separator tokens),
  punctuation, the previous and the next token, and the entropy (nats) of the distribution."""
  sums = None
  count = 0
  for ids, tokens, probs in zip(maps.ids, maps.tokens, maps.probabilities):
    n = len(ids)
    targets = {"cls": ids == tokenizer.cls_id, "sep": ids == tokenizer.sep_id,
               "punctuation": np.asarray([_is_punctuation(t) for t in tokens])}
    measured = {name: probs[..., mask].sum(-1).sum(-1) for name, mask in targets.items()}
    measured["previous"] = np.diagonal(probs, offset=-1, axis1=-2, axis2=-1).sum(-1)
    measured["next"] = np.diagonal(probs, offset=1, axis1=-2, axis2=-1).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
      entropy = -np.where(probs > 0, probs * np.log(probs), 0.0).sum(-1)
    measured["entropy"] = entropy.sum(-1)
    pruned = np.isnan(probs[..., 0, 0])  # (layers, heads): NaN maps, NaN statistics
    for values in measured.values():
      values[pruned] = np.nan
    if sums is None:
      sums = {k: np.zeros_like(v, np.float64) for k, v in measured.items()}
    for k, v in measured.items():
      sums[k] += v
    count += n
  if not count:
    raise ValueError("no tokens to measure attention over.")
  return {k: sums[k] / count for k in MEASURES}


def statistics_table(stats: dict[str, np.ndarray]) -> str:
  """One line per layer and head, as people read it."""
  layers, heads = stats[MEASURES[0]].shape
  lines = ["layer head " + " ".join(f"{m:>11}" for m in MEASURES)]
  for layer in range(layers):
    for head in range(heads):
      values = [stats[m][layer, head] for m in MEASURES]
      lines.append(f"{layer:5d} {head:4d} " + (" ".join(f"{v:11.3f}" for v in values)
                                               if not np.isnan(values[0])
                                               else f"{'(pruned)':>11}"))
  return "\n".join(lines)


def as_json(stats: dict[str, np.ndarray]) -> dict[str, list]:
  """The statistics as JSON values: a pruned head's NaN as null."""
  return {m: [[None if np.isnan(v) else float(v) for v in row] for row in stats[m]]
          for m in MEASURES}


def write_statistics(stats: dict[str, np.ndarray], output_dir: str, num_examples: int,
                     num_tokens: int) -> list[str]:
  """`head_statistics.json` and `head_statistics.png` (one heat map per measure, layers by
  heads); returns the paths."""
  json_path = file_io.join(output_dir, "head_statistics.json")
  file_io.write_text_atomic(json_path, json.dumps(
      {"examples": num_examples, "tokens": num_tokens, "measures": list(MEASURES),
       **as_json(stats)}, indent=1) + "\n")
  plt = pyplot()
  layers, heads = stats[MEASURES[0]].shape
  fig, axes = plt.subplots(1, len(MEASURES), figsize=(3.2 * len(MEASURES), 0.45 * layers + 2))
  for ax, measure in zip(axes, MEASURES):
    image = ax.imshow(stats[measure], aspect="auto", cmap="viridis",
                      vmin=0.0, vmax=None if measure == "entropy" else 1.0)
    ax.set_title("entropy (nats)" if measure == "entropy" else f"to {measure}")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(heads))
    ax.set_yticks(range(layers))
    fig.colorbar(image, ax=ax, fraction=0.046)
  fig.tight_layout()
  png_path = file_io.join(output_dir, "head_statistics.png")
  save_png(fig, png_path)
  plt.close(fig)
  return [json_path, png_path]


def plot_example(maps: AttentionMaps, example: int, output_dir: str) -> list[str]:
  """One PNG per layer for one example: a grid of its heads, the tokens on both axes (keys
  across, queries down); returns the paths."""
  plt = pyplot()
  tokens, probs = maps.tokens[example], maps.probabilities[example]
  layers, heads, n, _ = probs.shape
  columns = min(heads, 4)
  rows = math.ceil(heads / columns)
  size = max(3.0, 0.16 * n + 1.0)
  paths = []
  for layer in range(layers):
    fig, axes = plt.subplots(rows, columns, figsize=(size * columns, size * rows),
                             squeeze=False)
    for head in range(rows * columns):
      ax = axes[head // columns][head % columns]
      if head >= heads:
        ax.axis("off")
        continue
      ax.imshow(probs[layer, head], cmap="Blues", vmin=0.0, vmax=1.0)
      pruned = " (pruned)" if np.isnan(probs[layer, head]).all() else ""
      ax.set_title(f"layer {layer} head {head}{pruned}", fontsize=9)
      ax.set_xticks(range(n))
      ax.set_yticks(range(n))
      ax.set_xticklabels(tokens, rotation=90, fontsize=6)
      ax.set_yticklabels(tokens, fontsize=6)
    fig.tight_layout()
    path = file_io.join(output_dir, f"example{example}_layer{layer}.png")
    save_png(fig, path)
    plt.close(fig)
    paths.append(path)
  return paths


def pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def save_png(fig, path: str) -> None:
  """Written whole and renamed into place (local or gs://): a PNG that exists is complete."""
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=110)
  file_io.write_bytes_atomic(path, buffer.getvalue())
