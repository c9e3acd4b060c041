"""Attention heads removed from a trained model, and put back as zeros.

`prune_heads` cuts heads out of the matrices: each removed head's `head_dim` columns of the
layer's query, key and value kernels and biases, and its `head_dim` rows of the attention
output kernel. The model that remains computes exactly what the full model computes with those
heads' outputs set to zero (a gate of 0 in `modeling.HEAD_GATES`, or zero rows in the output
kernel), in less time and memory. Its config records what went (`BertConfig.pruned_heads`, the
original head indices per layer), so every loader of this package builds the smaller layers;
a layer may lose every head (its attention block is then its output bias, the residual and
LayerNorm).

`restore_heads` is the inverse up to the values: the removed heads come back with zero query,
key and value weights and zero output rows. Such a head attends uniformly to nothing (its values
are zero) and adds nothing, so the full-size model computes what the pruned one does. It is
how a pruned model is written for readers that know only whole layers (transformers 5 has no
pruned BERT; Google's TF1 code neither).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from bert_jax.model.configuration import BertConfig

_PROJECTIONS = ("query", "key", "value")


def encoder_layers(params: Mapping[str, Any], config: BertConfig) -> dict:
  """The one encoder of `params` (unrolled, `layer_<i>` for every layer of `config`)."""
  found = []

  def walk(node):
    if isinstance(node, Mapping):
      if "layer_0" in node:
        found.append(node)
        return
      if "layer" in node and "encoder" not in node:
        raise ValueError("pruning heads needs unrolled layers (layer_<i>); these are scanned.")
      for value in node.values():
        walk(value)

  walk(params)
  if len(found) != 1:
    raise ValueError(f"expected one encoder with unrolled layers in the parameters, found "
                     f"{len(found)}.")
  layers = sum(1 for key in found[0] if key.startswith("layer_"))
  if layers != config.num_hidden_layers:
    raise ValueError(f"the encoder has {layers} layers, the config {config.num_hidden_layers}.")
  return found[0]


def _copy(tree: Any) -> Any:
  """A copy of the dicts of `tree` (arrays shared), so that edits leave the original alone."""
  if isinstance(tree, Mapping):
    return {key: _copy(value) for key, value in tree.items()}
  return tree


def _columns(positions: Iterable[int], head_dim: int) -> np.ndarray:
  """The columns (or rows) of the heads at `positions` in a joined (heads × head_dim) axis."""
  positions = np.asarray(list(positions), np.int64)
  return (positions[:, None] * head_dim + np.arange(head_dim)[None, :]).reshape(-1)


def prune_heads(params: Mapping[str, Any], config: BertConfig,
                remove: Mapping[int, Iterable[int]]) -> tuple[BertConfig, dict]:
  """`(config, params)` without the heads `remove` names: layer → original head indices (as
  attention maps and importance number them, whatever was pruned before). Heads already gone
  are refused, so that a list is never read in the wrong numbering."""
  pruned = [list(config.pruned_heads[i]) if config.pruned_heads else []
            for i in range(config.num_hidden_layers)]
  for layer, heads in remove.items():
    if not 0 <= int(layer) < config.num_hidden_layers:
      raise ValueError(f"layer {layer}: the model has layers 0..{config.num_hidden_layers - 1}.")
    for head in heads:
      if not 0 <= int(head) < config.num_attention_heads:
        raise ValueError(f"head {head} of layer {layer}: the model has heads "
                         f"0..{config.num_attention_heads - 1}.")
      if int(head) in pruned[int(layer)]:
        raise ValueError(f"head {head} of layer {layer} was pruned already.")
      pruned[int(layer)].append(int(head))
  out = _copy(params)
  layers = encoder_layers(out, config)
  new_config = config.replace(pruned_heads=pruned)
  for i in range(config.num_hidden_layers):
    before, after = config.kept_heads(i), new_config.kept_heads(i)
    if before == after:
      continue
    attention = layers[f"layer_{i}"]["attention"]
    output = attention["output"]["dense"]
    if not after:  # no head left: no projections, and the output keeps its bias alone
      attention.pop("self", None)
      output.pop("kernel", None)
      continue
    keep = _columns([before.index(h) for h in after], config.head_dim)
    for name in _PROJECTIONS:
      block = attention["self"][name]
      block["kernel"] = np.asarray(block["kernel"])[:, keep]
      block["bias"] = np.asarray(block["bias"])[keep]
    output["kernel"] = np.asarray(output["kernel"])[keep, :]
  return new_config, out


def restore_heads(params: Mapping[str, Any], config: BertConfig) -> tuple[BertConfig, dict]:
  """`(config, params)` of the full-size model that computes what the pruned one does: every
  removed head back in its place with zero weights (see the module's docstring)."""
  if config.pruned_heads is None:
    return config, dict(params)
  out = _copy(params)
  layers = encoder_layers(out, config)
  full, width = config.num_attention_heads * config.head_dim, config.hidden_size
  for i in range(config.num_hidden_layers):
    kept = config.kept_heads(i)
    if len(kept) == config.num_attention_heads:
      continue
    cols = _columns(kept, config.head_dim)
    attention = layers[f"layer_{i}"]["attention"]
    output = attention["output"]["dense"]
    dtype = np.asarray(output["bias"]).dtype
    projections = attention.setdefault("self", {})
    for name in _PROJECTIONS:
      block = projections.setdefault(name, {})
      kernel, bias = np.zeros((width, full), dtype), np.zeros((full,), dtype)
      if kept:
        kernel[:, cols] = np.asarray(block["kernel"])
        bias[cols] = np.asarray(block["bias"])
      block["kernel"], block["bias"] = kernel, bias
    kernel = np.zeros((full, width), dtype)
    if kept:
      kernel[cols, :] = np.asarray(output["kernel"])
    output["kernel"] = kernel
  return config.replace(pruned_heads=None), out


def masked(params: Mapping[str, Any], config: BertConfig, mask: np.ndarray) -> dict:
  """`params` with the heads where `mask` (layers × heads, original numbering) is 0 silenced:
  their rows of the attention output kernel set to zero, which is what a gate of 0 does and
  what pruning them computes, at the full model's shapes (so one compiled forward pass serves
  every mask)."""
  if config.pruned_heads is not None:
    raise ValueError("masking heads needs the unpruned model (its config prunes "
                     f"{sum(len(h) for h in config.pruned_heads)} heads).")
  mask = np.asarray(mask)
  if mask.shape != (config.num_hidden_layers, config.num_attention_heads):
    raise ValueError(f"a head mask of shape {mask.shape} for {config.num_hidden_layers} layers "
                     f"of {config.num_attention_heads} heads.")
  out = _copy(params)
  layers = encoder_layers(out, config)
  for i in range(config.num_hidden_layers):
    off = np.flatnonzero(mask[i] == 0)
    if off.size:
      output = layers[f"layer_{i}"]["attention"]["output"]["dense"]
      kernel = np.array(output["kernel"])
      kernel[_columns(off, config.head_dim), :] = 0
      output["kernel"] = kernel
  return out
