"""The optimizers of the paper and its successors, as optax transformations.

* `adamw` — the original BERT `AdamWeightDecayOptimizer`: Adam moments **without bias
  correction** (as released; `bias_correction=True` gives textbook AdamW), decoupled weight
  decay 0.01 on every weight except LayerNorm parameters and biases, global-norm clipping 1.0.
* `lamb` — You et al. 2019 for large batches: the same update with a per-layer trust ratio,
  which (as in their BERT code) skips the parameters excluded from weight decay.

The learning rate follows the original: linear warmup to the peak, and from then on the
polynomial decay *of the whole run* (`peak · (1 − step/total)^power`, not restarted after
warmup), reaching `end_learning_rate` at `total_steps`.

Two per-parameter options, both off by default (and then absent from the optimizer state, so
runs without them keep their state layout):

* `layerwise_lr_decay` — ELECTRA's layer-wise learning-rate decay (Clark et al. 2020): lower
  layers, which hold the more general pre-trained features, move less when fine-tuning. See
  `layerwise_lr_decay`.
* `frozen_scopes` — top-level parameter scopes that never change (a distillation teacher kept in
  the same tree): no update, no Adam moments, and no part in gradient clipping. See
  `create_optimizer`.
"""

from __future__ import annotations

import operator
import re
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

# Parameter-path fragments the original excludes from weight decay (regex search on names).
EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")


def learning_rate_schedule(peak: float, total_steps: int, warmup_steps: int,
                           power: float = 1.0, end_learning_rate: float = 0.0
                           ) -> Callable[[jax.Array], jax.Array]:
  """Linear warmup for `warmup_steps`, then the original's polynomial decay to the end."""
  if total_steps <= 0:
    raise ValueError(f"total_steps={total_steps} must be positive.")
  if not 0 <= warmup_steps <= total_steps:
    raise ValueError(f"warmup_steps={warmup_steps} must lie in [0, total_steps={total_steps}].")

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    progress = jnp.minimum(step, total_steps) / total_steps
    decayed = (peak - end_learning_rate) * (1.0 - progress) ** power + end_learning_rate
    if warmup_steps == 0:
      return decayed
    warm = peak * step / warmup_steps
    return jnp.where(step < warmup_steps, warm, decayed)
  return schedule


def weight_decay_mask(params: Any) -> Any:
  """True for parameters that get weight decay: everything but LayerNorm and biases."""
  def decayed(path, _):
    names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
    return not any(fragment in name for name in names for fragment in EXCLUDE_FROM_WEIGHT_DECAY)
  return jax.tree_util.tree_map_with_path(decayed, params)


class ScaleByAdamState(NamedTuple):
  mu: Any
  nu: Any


def scale_by_adam_without_bias_correction(b1: float = 0.9, b2: float = 0.999,
                                          eps: float = 1e-6) -> optax.GradientTransformation:
  """m/(√v + ε) with raw exponential moving averages, as BERT's released optimizer does.

  Without bias correction the first updates are larger than Adam's: from zero, m reaches
  (1 − β₁ᵗ) of its corrected value but √v only √(1 − β₂ᵗ), so an update is their ratio times
  Adam's: 3.2× at step 1, 6.6× at step 12, still 3.2× at step 100 and 1.3× at step 1,000 with
  the defaults. The paper's 10k warmup steps keep those steps small, and reproducing the
  released runs needs it.
  """
  def init(params):
    zeros = jax.tree.map(lambda p: jnp.zeros_like(p, jnp.float32), params)
    return ScaleByAdamState(mu=zeros, nu=jax.tree.map(jnp.copy, zeros))

  def update(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1.0 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1.0 - b2) * jnp.square(g), state.nu, updates)
    out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return out, ScaleByAdamState(mu=mu, nu=nu)

  return optax.GradientTransformation(init, update)


_LAYER = re.compile(r"layer_(\d+)")


def _path_names(path) -> list[str]:
  return [str(getattr(k, "key", getattr(k, "name", k))) for k in path]


def layer_depth(names: Sequence[str], num_layers: int) -> int | str | None:
  """ELECTRA's depth of a parameter path: 0 for the embeddings (and ALBERT's projection of
  them, `encoder/embedding_hidden_mapping_in`), i + 1 for `encoder/layer_{i}`, L + 1 for the
  pooler, and None (L + 2, the full rate) for everything else, i.e. the task heads.

  The pooler sits between the last layer and the head: ELECTRA's fine-tuning has none, and it
  is pre-trained (by next-sentence prediction) like the layers below it, yet nearest the task.

  Two encoder layouts have no single depth: "scanned" for `encoder/layer`, whose leaves stack
  the L layers along their leading axis, and "shared" for ALBERT's `encoder/shared_layer`.
  """
  if len(names) < 2 or names[0] != "bert":
    return None
  scope = names[1]
  if scope == "embeddings":
    return 0
  if scope == "pooler":
    return num_layers + 1
  if scope != "encoder" or len(names) < 3:
    return None
  block = names[2]
  if block == "embedding_hidden_mapping_in":
    return 0
  if block == "layer":
    return "scanned"
  if block == "shared_layer":
    return "shared"
  match = _LAYER.fullmatch(block)
  if match:
    i = int(match.group(1))
    if i >= num_layers:
      raise ValueError(f"Parameter {'/'.join(names)} is past num_layers={num_layers}: pass the "
                       "model's num_hidden_layers.")
    return i + 1
  return None


def layerwise_lr_factors(params: Any, decay: float, num_layers: int) -> Any:
  """Per-leaf multipliers `decay ** (L + 2 - depth)` of the learning rate (see `layer_depth`).

  Scanned layers get a vector of the L layers' factors shaped to broadcast over the leaves'
  leading (layer) axis. ALBERT's shared block gets the mean of the factors of depths 1..L: one
  set of weights serves every depth (its gradient sums every application's), so no single
  depth's factor is its own; the mean is the average rate of its applications.
  """
  _check_decay(decay)
  top = num_layers + 2
  # In float64 and then float32: each factor is the float32 nearest decay ** k.
  per_layer = float(decay) ** (top - np.arange(1, num_layers + 1, dtype=np.float64))

  def factor(path, leaf):
    names = _path_names(path)
    depth = layer_depth(names, num_layers)
    if depth is None:
      return np.float32(1.0)
    if depth == "shared":
      return np.float32(per_layer.mean())
    if depth == "scanned":
      shape = np.shape(leaf)
      if not shape or shape[0] != num_layers:
        raise ValueError(f"Scanned parameter {'/'.join(names)} has shape {shape}; expected a "
                         f"leading layer axis of num_layers={num_layers}.")
      return per_layer.astype(np.float32).reshape((num_layers,) + (1,) * (len(shape) - 1))
    return np.float32(float(decay) ** (top - depth))
  return jax.tree_util.tree_map_with_path(factor, params)


def _check_decay(decay) -> None:
  try:
    ok = 0.0 < float(decay) <= 1.0
  except (TypeError, ValueError):
    ok = False
  if not ok:
    raise ValueError(f"optimizer.layerwise_lr_decay={decay!r} must lie in (0, 1] "
                     "(0 or None turns it off).")


def layerwise_lr_decay(decay: float, num_layers: int) -> optax.GradientTransformation:
  """Multiplies each parameter's update by its layer's factor (`layerwise_lr_factors`).

  Stateless: the factors follow from the tree's paths and shapes, which jit sees as static, so
  they are constants folded into the step and multiply sharded updates elementwise. It goes
  right before `scale_by_learning_rate`, so it scales the whole update (Adam step, weight decay
  and LAMB's trust ratio), as ELECTRA's per-layer learning rate multiplies both.
  """
  _check_decay(decay)
  try:
    num_layers = operator.index(num_layers)
  except TypeError:
    num_layers = None
  if num_layers is None or num_layers <= 0:
    raise ValueError(f"optimizer.num_layers={num_layers!r}: layerwise_lr_decay needs the "
                     "encoder's number of layers (num_hidden_layers).")

  def init(params):
    del params
    return optax.EmptyState()

  def update(updates, state, params=None):
    del params
    factors = layerwise_lr_factors(updates, decay, num_layers)
    scaled = jax.tree.map(lambda u, f: (u * f).astype(u.dtype), updates, factors)
    return scaled, state

  return optax.GradientTransformation(init, update)


def frozen_labels(frozen_scopes: Sequence[str]) -> Callable[[Any], Any]:
  """'frozen' for every leaf under one of the top-level `frozen_scopes`, else 'trainable'.

  A scope the tree lacks is an error: a misspelt teacher scope would otherwise train it.
  """
  frozen = tuple(frozen_scopes)

  def labels(params):
    if not isinstance(params, Mapping):
      # optax.tree_map_params initialises with one placeholder standing for the whole tree.
      return "trainable"
    missing = [s for s in frozen if s not in params]
    if missing:
      raise ValueError(f"optimizer.frozen_scopes names {missing}, which the parameters lack "
                       f"(top-level scopes: {sorted(params)}).")
    return jax.tree_util.tree_map_with_path(
        lambda path, _: "frozen" if _path_names(path)[0] in frozen else "trainable", params)
  return labels


def tree_map_params(tx: optax.GradientTransformation, f: Callable[..., Any], state: Any,
                    *rest: Any, transform_non_params: Callable[[Any], Any] | None = None) -> Any:
  """`optax.tree_map_params` (e.g. optimizer-state shardings from the parameters') for states
  with frozen scopes too: where a frozen parameter has no state, the state holds an
  `optax.MaskedNode`, which stays one instead of being matched against the parameter."""
  is_masked = lambda x: isinstance(x, optax.MaskedNode)
  return optax.tree_map_params(tx, lambda v, *r: v if is_masked(v) else f(v, *r), state, *rest,
                               transform_non_params=transform_non_params, is_leaf=is_masked)


def create_optimizer(config: Any, num_layers: int | None = None
                     ) -> tuple[optax.GradientTransformation, Callable[[jax.Array], jax.Array]]:
  """The optimizer and its learning-rate schedule from an ml_collections `optimizer` config.

  Fields (defaults are the paper's): name ('adamw' | 'lamb'), learning_rate (1e-4),
  total_steps, warmup_steps (10000), weight_decay (0.01), b1 (0.9), b2 (0.999), eps (1e-6),
  bias_correction (False for adamw, True for lamb), grad_clip_norm (1.0; 0 disables),
  power (1.0), end_learning_rate (0.0).

  Beyond the paper:
  * layerwise_lr_decay (0.0 or None: off; ELECTRA fine-tunes with 0.8 base, 0.9 large) with
    num_layers (the encoder's num_hidden_layers; the argument wins over the field). The number
    of layers is taken, not guessed from names, because scanned layers have none.
  * frozen_scopes (()): top-level parameter scopes that get no update and no optimizer state.
    The whole chain runs on the other parameters only, so the global norm of clipping is the
    trainable parameters' and weight decay never reaches the frozen ones.
  """
  get = config.get
  name = get("name", "adamw")
  schedule = learning_rate_schedule(
      peak=get("learning_rate", 1e-4), total_steps=get("total_steps"),
      warmup_steps=get("warmup_steps", 10000), power=get("power", 1.0),
      end_learning_rate=get("end_learning_rate", 0.0))
  b1, b2, eps = get("b1", 0.9), get("b2", 0.999), get("eps", 1e-6)
  bias_correction = get("bias_correction", None)
  if bias_correction is None:
    bias_correction = name == "lamb"
  adam = (optax.scale_by_adam(b1=b1, b2=b2, eps=eps) if bias_correction
          else scale_by_adam_without_bias_correction(b1=b1, b2=b2, eps=eps))
  chain = []
  clip = get("grad_clip_norm", 1.0)
  if clip and clip > 0:
    chain.append(optax.clip_by_global_norm(clip))
  chain.append(adam)
  chain.append(optax.add_decayed_weights(get("weight_decay", 0.01), mask=weight_decay_mask))
  if name == "lamb":
    chain.append(optax.masked(optax.scale_by_trust_ratio(), weight_decay_mask))
  elif name != "adamw":
    raise ValueError(f"optimizer.name={name!r}; expected 'adamw' or 'lamb'.")
  decay = get("layerwise_lr_decay", None)
  if decay:  # 0, 0.0 and None: off
    chain.append(layerwise_lr_decay(decay, num_layers if num_layers is not None
                                    else get("num_layers", None)))
  chain.append(optax.scale_by_learning_rate(schedule))
  tx = optax.chain(*chain)
  frozen = get("frozen_scopes", None) or ()
  if isinstance(frozen, str):
    raise ValueError(f"optimizer.frozen_scopes={frozen!r} must be a list of scope names.")
  frozen = tuple(frozen)
  if frozen:
    tx = optax.partition({"trainable": tx, "frozen": optax.set_to_zero()},
                         frozen_labels(frozen))
  return tx, schedule

