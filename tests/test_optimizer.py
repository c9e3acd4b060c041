"""The optimizer against a line-by-line numpy transcription of the original BERT update."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax.training import optimizer


def _params(rng):
  return {
      "bert": {"embeddings": {"word_embeddings": rng.randn(6, 4).astype(np.float32),
                              "LayerNorm": {"scale": rng.rand(4).astype(np.float32),
                                            "bias": rng.randn(4).astype(np.float32)}},
               "pooler": {"dense": {"kernel": rng.randn(4, 4).astype(np.float32),
                                    "bias": rng.randn(4).astype(np.float32)}}},
      "cls": {"predictions": {"output_bias": rng.randn(6).astype(np.float32)}},
  }


def _original_lr(step, peak, total, warmup):
  """optimization.py of the original: polynomial_decay(global_step) then the warmup override."""
  lr = peak * (1.0 - min(step, total) / total)
  if step < warmup:
    lr = peak * step / warmup
  return lr


def _original_step(params, grads, m, v, step, cfg):
  """AdamWeightDecayOptimizer.apply_gradients after clip_by_global_norm, in numpy."""
  flat_g = jax.tree.leaves(grads)
  norm = np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in flat_g))
  scale = cfg.grad_clip_norm / max(norm, cfg.grad_clip_norm)
  lr = _original_lr(step, cfg.learning_rate, cfg.total_steps, cfg.warmup_steps)
  paths = jax.tree_util.tree_flatten_with_path(params)[0]
  new_p, new_m, new_v = {}, {}, {}
  for (path, p), g, mm, vv in zip(paths, flat_g, jax.tree.leaves(m), jax.tree.leaves(v)):
    name = "/".join(k.key for k in path)
    g = g * scale
    mm = cfg.b1 * mm + (1 - cfg.b1) * g
    vv = cfg.b2 * vv + (1 - cfg.b2) * g * g
    update = mm / (np.sqrt(vv) + cfg.eps)
    if not any(x in name for x in ("LayerNorm", "layer_norm", "bias")):
      update = update + cfg.weight_decay * p
    new_p[name], new_m[name], new_v[name] = p - lr * update, mm, vv
  rebuild = lambda d: jax.tree.unflatten(jax.tree.structure(params),
                                         [d["/".join(k.key for k in path)] for path, _ in paths])
  return rebuild(new_p), rebuild(new_m), rebuild(new_v)


def _config(**kw):
  base = dict(name="adamw", learning_rate=1e-2, total_steps=10, warmup_steps=3,
              weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6, grad_clip_norm=1.0)
  base.update(kw)
  return ml_collections.ConfigDict(base)


def test_adamw_matches_the_original_update_step_by_step():
  rng = np.random.RandomState(0)
  cfg = _config()
  params = _params(rng)
  tx, _ = optimizer.create_optimizer(cfg)
  state = tx.init(params)
  ref_p = params
  ref_m = jax.tree.map(np.zeros_like, params)
  ref_v = jax.tree.map(np.zeros_like, params)
  ours = params
  for step in range(7):
    # Gradients large enough that clipping is active on some steps and not on others.
    grads = jax.tree.map(lambda p: (rng.randn(*p.shape) * (0.05 if step % 2 else 3.0)).astype(
        np.float32), params)
    updates, state = tx.update(grads, state, ours)
    ours = optax.apply_updates(ours, updates)
    ref_p, ref_m, ref_v = _original_step(ref_p, grads, ref_m, ref_v, step, cfg)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref_p)):
      np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-6)
  # Step 0 of the schedule is lr 0: the first update moved nothing... but later ones did.
  assert not np.allclose(np.asarray(ours["bert"]["pooler"]["dense"]["kernel"]),
                         params["bert"]["pooler"]["dense"]["kernel"])


def test_schedule_warmup_then_decay_of_the_whole_run():
  lr = optimizer.learning_rate_schedule(peak=1e-4, total_steps=1000, warmup_steps=100)
  for step in [0, 1, 50, 99, 100, 101, 500, 999, 1000, 1500]:
    assert float(lr(step)) == pytest.approx(_original_lr(step, 1e-4, 1000, 100), rel=1e-4,
                                            abs=1e-12)
  assert float(lr(100)) == pytest.approx(0.9e-4)  # the decay counts from step 0, as released
  with pytest.raises(ValueError, match="warmup_steps=20 must lie in"):
    optimizer.learning_rate_schedule(1e-4, total_steps=10, warmup_steps=20)


def test_weight_decay_mask_excludes_layernorm_and_biases():
  mask = optimizer.weight_decay_mask(_params(np.random.RandomState(0)))
  assert mask["bert"]["embeddings"]["word_embeddings"] is True
  assert mask["bert"]["pooler"]["dense"]["kernel"] is True
  assert mask["bert"]["embeddings"]["LayerNorm"]["scale"] is False
  assert mask["bert"]["pooler"]["dense"]["bias"] is False
  assert mask["cls"]["predictions"]["output_bias"] is False


def test_bias_correction_option_gives_textbook_adamw():
  rng = np.random.RandomState(1)
  params = _params(rng)
  grads = jax.tree.map(lambda p: rng.randn(*p.shape).astype(np.float32) * 0.1, params)
  cfg = _config(bias_correction=True, grad_clip_norm=0.0, warmup_steps=0)
  tx, _ = optimizer.create_optimizer(cfg)
  ref = optax.adamw(optimizer.learning_rate_schedule(1e-2, 10, 0), b1=0.9, b2=0.999, eps=1e-6,
                    weight_decay=0.01, mask=optimizer.weight_decay_mask)
  a, _ = tx.update(grads, tx.init(params), params)
  b, _ = ref.update(grads, ref.init(params), params)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6)


def test_lamb_trust_ratio_skips_excluded_parameters():
  rng = np.random.RandomState(2)
  params = _params(rng)
  grads = jax.tree.map(lambda p: rng.randn(*p.shape).astype(np.float32), params)
  lamb, _ = optimizer.create_optimizer(_config(name="lamb", grad_clip_norm=0.0, warmup_steps=0))
  adam, _ = optimizer.create_optimizer(_config(name="adamw", bias_correction=True,
                                               grad_clip_norm=0.0, warmup_steps=0))
  lu, _ = lamb.update(grads, lamb.init(params), params)
  au, _ = adam.update(grads, adam.init(params), params)
  # Excluded (bias / LayerNorm): identical to Adam. Included: rescaled to ‖w‖/‖update‖.
  np.testing.assert_allclose(lu["bert"]["pooler"]["dense"]["bias"],
                             au["bert"]["pooler"]["dense"]["bias"], rtol=1e-6)
  k_l, k_a = lu["bert"]["pooler"]["dense"]["kernel"], au["bert"]["pooler"]["dense"]["kernel"]
  w = params["bert"]["pooler"]["dense"]["kernel"]
  lr = 1e-2  # both updates carry the learning rate; the trust ratio is taken before it
  ratio = np.linalg.norm(w) / np.linalg.norm(np.asarray(k_a) / lr)
  np.testing.assert_allclose(np.asarray(k_l), np.asarray(k_a) * ratio, rtol=1e-5)
  with pytest.raises(ValueError, match="optimizer.name='sgd'"):
    optimizer.create_optimizer(_config(name="sgd"))
