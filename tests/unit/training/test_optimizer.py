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


def test_without_bias_correction_early_updates_are_larger_than_adams():
  """The released optimizer's raw moments: with a steady gradient, step t's update is
  (1 - b1^t) / sqrt(1 - b2^t) times Adam's, 3.2x at step 1 and 6.6x at step 12."""
  grads = {"w": jnp.asarray([0.5, -2.0, 1e-3], jnp.float32)}
  ours = optimizer.scale_by_adam_without_bias_correction(0.9, 0.999, eps=1e-12)
  adam = optax.scale_by_adam(0.9, 0.999, eps=1e-12)
  s_ours, s_adam = ours.init(grads), adam.init(grads)
  for t in range(1, 13):
    u_ours, s_ours = ours.update(grads, s_ours)
    u_adam, s_adam = adam.update(grads, s_adam)
    expected = (1 - 0.9**t) / np.sqrt(1 - 0.999**t)
    np.testing.assert_allclose(np.asarray(u_ours["w"]), expected * np.asarray(u_adam["w"]),
                               rtol=1e-4)
  assert expected == pytest.approx(6.57, abs=0.01)


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


# Layer-wise learning-rate decay and frozen scopes.

L = 3


def _layer(rng, lead=()):
  return {"attention": {"self": {"query": {"kernel": rng.randn(*lead, 4, 4).astype(np.float32),
                                           "bias": rng.randn(*lead, 4).astype(np.float32)}}},
          "output": {"LayerNorm": {"scale": rng.rand(*lead, 4).astype(np.float32)}}}


def _encoder_params(rng, layout="unrolled"):
  """Embeddings, L layers (unrolled, scanned or one shared block), pooler and a task head."""
  layers = [_layer(rng) for _ in range(L)]
  if layout == "unrolled":
    encoder = {f"layer_{i}": layer for i, layer in enumerate(layers)}
  elif layout == "scanned":
    encoder = {"layer": jax.tree.map(lambda *xs: np.stack(xs), *layers)}
  else:
    encoder = {"shared_layer": layers[0],
               "embedding_hidden_mapping_in": {"kernel": rng.randn(3, 4).astype(np.float32)}}
  return {"bert": {"embeddings": {"word_embeddings": rng.randn(6, 4).astype(np.float32),
                                  "LayerNorm": {"scale": rng.rand(4).astype(np.float32)}},
                   "encoder": encoder,
                   "pooler": {"dense": {"kernel": rng.randn(4, 4).astype(np.float32)}}},
          "classifier": {"kernel": rng.randn(4, 2).astype(np.float32),
                         "bias": rng.randn(2).astype(np.float32)}}


def _first_update(params, **kw):
  """The update of one step from zero moments with gradients of 1 everywhere: every parameter
  gets the same Adam step, so only its rate (and weight decay) tells them apart."""
  cfg = _config(warmup_steps=0, grad_clip_norm=0.0, weight_decay=0.0, **kw)
  tx, _ = optimizer.create_optimizer(cfg, num_layers=L)
  grads = jax.tree.map(np.ones_like, params)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  return updates


def test_layerwise_lr_decay_scales_each_depth_by_decay_to_the_distance_from_the_head():
  d = 0.8
  params = _encoder_params(np.random.RandomState(3))
  up = _first_update(params, layerwise_lr_decay=d)
  head = float(np.asarray(up["classifier"]["kernel"]).flat[0])
  assert head != 0.0
  bert = up["bert"]

  def ratio(x):
    r = np.asarray(x) / head
    np.testing.assert_allclose(r, r.flat[0], rtol=1e-6)  # one factor per parameter
    return float(r.flat[0])

  assert ratio(up["classifier"]["bias"]) == pytest.approx(1.0, rel=1e-6)
  assert ratio(bert["embeddings"]["word_embeddings"]) == pytest.approx(d ** (L + 2), rel=1e-6)
  assert ratio(bert["embeddings"]["LayerNorm"]["scale"]) == pytest.approx(d ** (L + 2), rel=1e-6)
  for i in range(L):
    for leaf in jax.tree.leaves(bert["encoder"][f"layer_{i}"]):
      assert ratio(leaf) == pytest.approx(d ** (L + 1 - i), rel=1e-6)
  assert ratio(bert["pooler"]["dense"]["kernel"]) == pytest.approx(d, rel=1e-6)
  # Off (the default, 0.0 or None): every parameter gets the head's update.
  for off in (0.0, None):
    plain = _first_update(params, layerwise_lr_decay=off)
    for leaf in jax.tree.leaves(plain):
      np.testing.assert_allclose(np.asarray(leaf), head, rtol=1e-6)


def test_layerwise_lr_decay_multiplies_the_weight_decay_too():
  """Placed before the learning rate, the factor scales the whole update, decay included."""
  d = 0.5
  params = _encoder_params(np.random.RandomState(4))
  cfg = _config(warmup_steps=0, grad_clip_norm=0.0, weight_decay=0.1)
  plain, _ = optimizer.create_optimizer(cfg)
  decayed, _ = optimizer.create_optimizer(_config(warmup_steps=0, grad_clip_norm=0.0,
                                                  weight_decay=0.1, layerwise_lr_decay=d),
                                          num_layers=L)
  grads = jax.tree.map(lambda p: np.random.RandomState(5).randn(*p.shape).astype(np.float32),
                       params)
  a, _ = plain.update(grads, plain.init(params), params)
  b, _ = decayed.update(grads, decayed.init(params), params)
  np.testing.assert_allclose(np.asarray(b["bert"]["encoder"]["layer_1"]["attention"]["self"]
                                        ["query"]["kernel"]),
                             d ** (L + 1 - 1) * np.asarray(a["bert"]["encoder"]["layer_1"]
                                                           ["attention"]["self"]["query"]
                                                           ["kernel"]), rtol=1e-6)


def test_layerwise_lr_decay_on_scanned_layers_equals_the_unrolled_layers():
  d = 0.7
  rng = np.random.RandomState(6)
  unrolled = _encoder_params(rng)
  scanned = jax.tree.map(lambda x: x, unrolled)
  layers = [scanned["bert"]["encoder"].pop(f"layer_{i}") for i in range(L)]
  scanned["bert"]["encoder"]["layer"] = jax.tree.map(lambda *xs: np.stack(xs), *layers)
  up_u = _first_update(unrolled, layerwise_lr_decay=d)
  up_s = _first_update(scanned, layerwise_lr_decay=d)
  for i in range(L):
    per_layer = jax.tree.map(lambda x, i=i: np.asarray(x)[i], up_s["bert"]["encoder"]["layer"])
    for a, b in zip(jax.tree.leaves(per_layer),
                    jax.tree.leaves(up_u["bert"]["encoder"][f"layer_{i}"])):
      np.testing.assert_allclose(a, np.asarray(b), rtol=1e-6)
  for key in ("embeddings", "pooler"):
    for a, b in zip(jax.tree.leaves(up_s["bert"][key]), jax.tree.leaves(up_u["bert"][key])):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
  # A stacked leaf whose leading axis is not num_layers is refused, not broadcast.
  tx, _ = optimizer.create_optimizer(_config(layerwise_lr_decay=d), num_layers=L + 1)
  with pytest.raises(ValueError, match="leading layer axis of num_layers=4"):
    tx.update(scanned, tx.init(scanned), scanned)


def test_layerwise_lr_decay_gives_the_shared_albert_block_the_mean_factor():
  d = 0.8
  params = _encoder_params(np.random.RandomState(7), layout="shared")
  up = _first_update(params, layerwise_lr_decay=d)
  head = float(np.asarray(up["classifier"]["kernel"]).flat[0])
  mean = np.mean([d ** (L + 2 - depth) for depth in range(1, L + 1)])
  for leaf in jax.tree.leaves(up["bert"]["encoder"]["shared_layer"]):
    np.testing.assert_allclose(np.asarray(leaf) / head, mean, rtol=1e-6)
  np.testing.assert_allclose(
      np.asarray(up["bert"]["encoder"]["embedding_hidden_mapping_in"]["kernel"]) / head,
      d ** (L + 2), rtol=1e-6)


def test_bad_layerwise_lr_decay_or_missing_num_layers_is_refused():
  for bad in (-0.5, 1.5, "0.8x"):
    with pytest.raises(ValueError, match="layerwise_lr_decay"):
      optimizer.create_optimizer(_config(layerwise_lr_decay=bad), num_layers=L)
  with pytest.raises(ValueError, match="num_layers"):
    optimizer.create_optimizer(_config(layerwise_lr_decay=0.8))
  tx, _ = optimizer.create_optimizer(_config(layerwise_lr_decay=0.8, num_layers=L))  # a field
  params = _encoder_params(np.random.RandomState(8))
  tx.update(params, tx.init(params), params)
  with pytest.raises(ValueError, match="past num_layers=2"):
    tx, _ = optimizer.create_optimizer(_config(layerwise_lr_decay=0.8), num_layers=2)
    tx.update(params, tx.init(params), params)


def _count_moments(opt_state):
  return len(jax.tree.leaves(opt_state))


def test_frozen_scopes_get_no_update_no_state_and_leave_clipping_alone():
  rng = np.random.RandomState(9)
  student = _params(rng)
  teacher = {"encoder": {"kernel": rng.randn(5, 4).astype(np.float32),
                         "bias": rng.randn(4).astype(np.float32)}}
  params = dict(student, teacher=teacher)
  # Clipping is active (large gradients) and weight decay is on: neither may reach the teacher.
  cfg = _config(warmup_steps=0, frozen_scopes=("teacher",))
  tx, _ = optimizer.create_optimizer(cfg)
  alone, _ = optimizer.create_optimizer(_config(warmup_steps=0))
  state, alone_state = tx.init(params), alone.init(student)
  # Adam moments only for the student: the same leaves as the optimizer of the student alone.
  assert _count_moments(state) == _count_moments(alone_state) == (
      2 * len(jax.tree.leaves(student)) + 1)
  step = jax.jit(tx.update)
  ours, ref = params, student
  for _ in range(4):
    grads = jax.tree.map(lambda p: (rng.randn(*p.shape) * 5.0).astype(np.float32), params)
    grads["teacher"] = jax.tree.map(lambda g: g * 100.0, grads["teacher"])  # huge, and ignored
    updates, state = step(grads, state, ours)
    ours = optax.apply_updates(ours, updates)
    ref_grads = {k: v for k, v in grads.items() if k != "teacher"}
    ref_updates, alone_state = alone.update(ref_grads, alone_state, ref)
    ref = optax.apply_updates(ref, ref_updates)
    for a, b in zip(jax.tree.leaves({k: v for k, v in ours.items() if k != "teacher"}),
                    jax.tree.leaves(ref)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  for a, b in zip(jax.tree.leaves(ours["teacher"]), jax.tree.leaves(teacher)):
    assert np.array_equal(np.asarray(a), b)  # bitwise
  assert not np.allclose(np.asarray(ours["bert"]["pooler"]["dense"]["kernel"]),
                         student["bert"]["pooler"]["dense"]["kernel"])


def test_frozen_scopes_with_layerwise_decay_and_sharded_state_layout():
  """Both options together; the state's parameter-shaped parts still map onto the parameters
  (how shardings of the state are derived), frozen ones staying stateless."""
  rng = np.random.RandomState(10)
  params = dict(_encoder_params(rng, layout="scanned"), teacher={"w": np.ones((3,), np.float32)})
  tx, _ = optimizer.create_optimizer(
      _config(frozen_scopes=["teacher"], layerwise_lr_decay=0.9), num_layers=L)
  state = jax.eval_shape(tx.init, params)
  names = jax.tree_util.tree_map_with_path(lambda path, _: "/".join(
      str(getattr(k, "key", k)) for k in path), params)
  mapped = optimizer.tree_map_params(tx, lambda _, name: name, state, names,
                                     transform_non_params=lambda _: "-")
  assert jax.tree.structure(mapped) == jax.tree.structure(state)
  leaves = jax.tree.leaves(mapped)
  assert "teacher/w" not in leaves
  assert leaves.count("bert/encoder/layer/output/LayerNorm/scale") == 2  # mu and nu
  # Without frozen scopes it is optax's own.
  plain, _ = optimizer.create_optimizer(_config(layerwise_lr_decay=0.9), num_layers=L)
  plain_state = jax.eval_shape(plain.init, params)
  assert (jax.tree.leaves(optimizer.tree_map_params(plain, lambda _, n: n, plain_state, names,
                                                    transform_non_params=lambda _: "-"))
          == jax.tree.leaves(optax.tree_map_params(plain, lambda _, n: n, plain_state, names,
                                                   transform_non_params=lambda _: "-")))
  grads = jax.tree.map(np.ones_like, params)
  updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)
  assert not np.any(np.asarray(updates["teacher"]["w"]))
  with pytest.raises(ValueError, match=r"frozen_scopes names \['techer'\]"):
    tx, _ = optimizer.create_optimizer(_config(frozen_scopes=["techer"]))
    tx.init(params)
  with pytest.raises(ValueError, match="must be a list"):
    optimizer.create_optimizer(_config(frozen_scopes="teacher"))


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True])
def test_finetuning_optimizer_applies_layerwise_decay_to_a_real_model(scan_layers):
  """Fine-tuning's optimizer (`layerwise_lr_decay` from the fine-tuning config, the layer count
  from the BertConfig) on the parameter names of an actual classifier, unrolled and scanned."""
  from flax import linen as nn
  from bert_jax.model import configuration, heads
  from bert_jax.runs import finetune_config, finetune_job
  cfg = configuration.get_preset("test", vocab_size=50, scan_layers=scan_layers)
  n = cfg.num_hidden_layers
  ids = jnp.zeros((2, 8), jnp.int32)
  params = nn.unbox(heads.BertForSequenceClassification(cfg, num_labels=2).init(
      jax.random.PRNGKey(0), ids, jnp.ones_like(ids), jnp.zeros_like(ids))["params"])
  config = finetune_config.get_config()
  assert config.layerwise_lr_decay == 0.0  # off by default
  config.layerwise_lr_decay, config.weight_decay, config.grad_clip_norm = 0.8, 0.0, 0.0
  tx, _ = finetune_job.make_optimizer(config, num_steps=10, learning_rate=1e-3,
                                      warmup_proportion=0.0, num_layers=n)
  updates, _ = jax.jit(tx.update)(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
  head = float(np.asarray(updates["classifier"]["kernel"]).flat[0])
  bert = updates["bert"]
  for leaf in jax.tree.leaves(bert["embeddings"]):
    np.testing.assert_allclose(np.asarray(leaf) / head, 0.8 ** (n + 2), rtol=1e-6)
  for leaf in jax.tree.leaves(bert["pooler"]):
    np.testing.assert_allclose(np.asarray(leaf) / head, 0.8, rtol=1e-6)
  for i in range(n):
    layer = (jax.tree.map(lambda x, i=i: x[i], bert["encoder"]["layer"]) if scan_layers
             else bert["encoder"][f"layer_{i}"])
    for leaf in jax.tree.leaves(layer):
      np.testing.assert_allclose(np.asarray(leaf) / head, 0.8 ** (n + 1 - i), rtol=1e-6)


@pytest.mark.slow
def test_finetuning_run_with_layerwise_decay(tokenizer, bert_config_file, tmp_path):
  """A short GLUE run through the classification run with the decay on: the BertConfig's layer count
  reaches the optimizer, and sharded, jitted training steps take it."""
  from bert_jax.runs import finetune_config
  from bert_jax.tasks.classification import run as classification_run
  data = tmp_path / "sst2"
  data.mkdir()
  rows = [("a moving and beautiful film", 1), ("a dull and lifeless mess", 0)] * 4
  for split in ("train", "dev"):
    (data / f"{split}.tsv").write_text(
        "sentence\tlabel\n" + "".join(f"{s}\t{l}\n" for s, l in rows))
  out = classification_run.run(finetune_config.make(
      task_name="SST-2", layerwise_lr_decay=0.8, data_dir=str(data), init_checkpoint=None,
      bert_config_file=bert_config_file, output_dir=str(tmp_path / "out"), max_seq_length=16,
      train_batch_size=8, eval_batch_size=8, learning_rate=1e-3, num_train_epochs=2,
      warmup_proportion=0.0, do_train=True, do_eval=True), tokenizer)
  assert out["train_steps"] == 2 and out["dev"]["num_examples"] == 8
