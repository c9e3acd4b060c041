"""The optimizers of the paper and its successors, as optax transformations.

* `adamw` — the original BERT `AdamWeightDecayOptimizer`: Adam moments **without bias
  correction** (as released; `bias_correction=True` gives textbook AdamW), decoupled weight
  decay 0.01 on every weight except LayerNorm parameters and biases, global-norm clipping 1.0.
* `lamb` — You et al. 2019 for large batches: the same update with a per-layer trust ratio,
  which (as in their BERT code) skips the parameters excluded from weight decay.

The learning rate follows the original: linear warmup to the peak, and from then on the
polynomial decay *of the whole run* (`peak · (1 − step/total)^power`, not restarted after
warmup), reaching `end_learning_rate` at `total_steps`.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
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

  Without bias correction the first updates are smaller than Adam's (m and v start at 0); the
  paper's 10k warmup steps hide the difference, and reproducing the released runs needs it.
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


def create_optimizer(config: Any) -> tuple[optax.GradientTransformation,
                                           Callable[[jax.Array], jax.Array]]:
  """The optimizer and its learning-rate schedule from an ml_collections `optimizer` config.

  Fields (defaults are the paper's): name ('adamw' | 'lamb'), learning_rate (1e-4),
  total_steps, warmup_steps (10000), weight_decay (0.01), b1 (0.9), b2 (0.999), eps (1e-6),
  bias_correction (False for adamw, True for lamb), grad_clip_norm (1.0; 0 disables),
  power (1.0), end_learning_rate (0.0).
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
  chain.append(optax.scale_by_learning_rate(schedule))
  return optax.chain(*chain), schedule
