"""Which attention heads matter: head importance as Michel et al. (2019, "Are Sixteen Heads
Really Better than One?") define it, for any objective's loss.

Each self-attention block's output is multiplied, head by head, by a gate ξ_h
(`modeling.HEAD_GATES`, present only when an apply passes it; 1 keeps a head, 0 removes it).
The importance of a head is the expected absolute gradient of the loss with respect to its
gate, I_h = E_x |∂L(x)/∂ξ_h| at ξ = 1 (the first-order estimate of the loss's change when the
head is removed), the expectation taken over batches (of one example: the definition; larger:
as their code does), and normalised per layer by its L2 norm as their code does. Gates of 0 and 1 are also how a head-masked model is evaluated.
"""

from __future__ import annotations

from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.analysis import attention
from bert_jax.model import configuration, modeling
from bert_jax.training import step as step_lib


def gate_paths(params: Any) -> list[tuple[str, ...]]:
  """The module paths of the self-attention blocks in `params` (the dicts holding `query`,
  `key` and `value`), in layer order: `layer_<i>` by index; a block shared by every layer once."""
  found = []

  def walk(node, path):
    if not isinstance(node, dict):
      return
    if {"query", "key", "value"} <= set(node):
      found.append(path)
      return
    for key, value in node.items():
      walk(value, path + (key,))

  walk(params, ())
  if any("layer" in path for path in found):
    raise ValueError("head gates need unrolled layers: load the parameters unrolled "
                     "(interop.checkpoints.in_layout(params, config, scan_layers=False)).")
  return sorted(found, key=attention.layer_index)


def gates_tree(params: Any, gates: np.ndarray) -> dict:
  """The `HEAD_GATES` collection for `params` from a (blocks, heads) array, one row per block in
  `gate_paths` order."""
  paths = gate_paths(params)
  gates = jnp.asarray(gates, jnp.float32)
  if gates.ndim != 2 or gates.shape[0] != len(paths):
    raise ValueError(f"gates of shape {gates.shape} for {len(paths)} attention blocks.")
  tree: dict = {}
  for row, path in zip(gates, paths):
    node = tree
    for part in path:
      node = node.setdefault(part, {})
    node["gates"] = row
  return tree


def gates_array(tree: dict, params: Any) -> jax.Array:
  """The (blocks, heads) array of a `HEAD_GATES` collection (the inverse of `gates_tree`)."""
  rows = []
  for path in gate_paths(params):
    node = tree
    for part in path:
      node = node[part]
    rows.append(node["gates"])
  return jnp.stack(rows)


class ImportanceMeter:
  """`meter(params, batches)`: (blocks, heads) E |∂L/∂ξ_h| over `batches` of the objective's
  deterministic loss at ξ = 1, each block's row divided by its L2 norm when `normalize`. The
  gradient is compiled once per meter, so measuring again after a change of the parameters
  (heads silenced: `pruning.masked`) costs no new compilation."""

  def __init__(self, objective, model, config: configuration.BertConfig,
               normalize: bool = True):
    self.heads, self.normalize = config.num_attention_heads, normalize
    self._gradient = step_lib.make_model_state_gradient(
        objective, model, lambda grads, params: jnp.abs(gates_array(grads[modeling.HEAD_GATES],
                                                                    params)))

  def __call__(self, params: Any, batches: Iterable[dict[str, np.ndarray]]) -> np.ndarray:
    ones = {modeling.HEAD_GATES: gates_tree(params, np.ones((len(gate_paths(params)),
                                                             self.heads), np.float32))}
    total, count = 0.0, 0  # summed on the device, read once at the end
    for batch in batches:
      total = total + self._gradient(ones, params, batch)
      count += 1
    if not count:
      raise ValueError("no batches to measure head importance on.")
    importance = np.asarray(total, np.float64) / count
    if self.normalize:
      norms = np.linalg.norm(importance, axis=1, keepdims=True)
      importance = importance / np.where(norms > 0, norms, 1.0)
    return importance


def head_importance(objective, model, config: configuration.BertConfig, params: Any,
                    batches: Iterable[dict[str, np.ndarray]], normalize: bool = True
                    ) -> np.ndarray:
  """(blocks, heads): E |∂L/∂ξ_h| over `batches` of the objective's deterministic loss at
  ξ = 1, each block's row divided by its L2 norm when `normalize` (`ImportanceMeter`)."""
  return ImportanceMeter(objective, model, config, normalize)(params, batches)
