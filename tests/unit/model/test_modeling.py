"""The model's structure and options: golden shapes, presets, configs, layouts, dtypes, dropout."""

import json
import math
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.interop import hf_config
from bert_jax.interop import names as name_tables
from bert_jax.objectives import mlm_nsp
from bert_jax.model import configuration, heads, modeling
from tests import helpers

GOLDEN = os.path.join(helpers.REPO, "tests", "golden", "bert_base_param_shapes.json")


def _count(shapes):
  return sum(math.prod(s) for s in shapes.values())


def test_base_parameter_shapes_match_golden_file():
  shapes = name_tables.expected_shapes(configuration.get_preset("base"))
  with open(GOLDEN) as f:
    golden = {k: tuple(v) for k, v in json.load(f).items()}
  assert shapes == golden
  # The published sizes: BertModel-base 109,482,240 and BertForPreTraining-base 110,106,428
  # parameters (the tied decoder adds only its output bias).
  assert _count({k: v for k, v in shapes.items() if k.startswith("bert/")}) == 109_482_240
  assert _count(shapes) == 110_106_428


def test_presets():
  large = name_tables.expected_shapes(configuration.get_preset("large"))
  assert _count({k: v for k, v in large.items() if k.startswith("bert/")}) == 335_141_888
  compact = [n for n in configuration.PRESETS if n.startswith("L-")]
  assert len(compact) == 24
  for name in compact:
    cfg = configuration.PRESETS[name]
    assert name == (f"L-{cfg.num_hidden_layers}_H-{cfg.hidden_size}_"
                    f"A-{cfg.num_attention_heads}")
    assert cfg.num_attention_heads * 64 == cfg.hidden_size
    assert cfg.intermediate_size == 4 * cfg.hidden_size
  assert configuration.get_preset("tiny") == configuration.get_preset("L-2_H-128_A-2")
  with pytest.raises(KeyError, match="Unknown BERT preset 'huge'"):
    configuration.get_preset("huge")


def test_config_reads_original_and_hugging_face_files(tmp_path):
  original = {"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
              "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02,
              "intermediate_size": 3072, "max_position_embeddings": 512,
              "num_attention_heads": 12, "num_hidden_layers": 12, "type_vocab_size": 2,
              "vocab_size": 30522}
  path = tmp_path / "bert_config.json"
  path.write_text(json.dumps(original))
  assert configuration.BertConfig.from_json_file(str(path)) == configuration.get_preset("base")

  hf = hf_config.config_from_json_file(os.path.join(helpers.minilm_dir(), "config.json"))
  assert (hf.num_hidden_layers, hf.hidden_size, hf.intermediate_size, hf.layer_norm_eps) == (
      6, 384, 1536, 1e-12)

  # Written back and read again: the same shape.
  cfg = configuration.get_preset("mini")
  for flavour, write, read in (
      ("original", configuration.BertConfig.to_json_file, configuration.BertConfig.from_json_file),
      ("hf", hf_config.write_hf_config, hf_config.config_from_json_file)):
    out = tmp_path / f"{flavour}.json"
    write(cfg, str(out))
    assert read(str(out)) == cfg


@pytest.mark.parametrize("text, message", [
    ('{"hidden_size": 768,\n "num_hidden_layers": }', r"line 2: not valid JSON"),
    ('{"hidden_size": 768, "num_hidden_layers": 2, "num_attention_heads": 12, '
     '"intermediate_size": 8, "vocab_size": 10, "position_embedding_type": "relative_key"}',
     "only 'absolute'"),
    ('{"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 8, "vocab_size": 10}',
     "missing required field 'num_hidden_layers'"),
    ('{"hidden_size": 100, "num_hidden_layers": 2, "num_attention_heads": 12, '
     '"intermediate_size": 8, "vocab_size": 10}', "not divisible by num_attention_heads=12"),
    ('{"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, '
     '"intermediate_size": 8, "vocab_size": 10, "hidden_act": "mish"}', "hidden_act='mish'"),
])
def test_config_errors_name_the_file_and_field(tmp_path, text, message):
  path = tmp_path / "config.json"
  path.write_text(text)
  with pytest.raises(ValueError, match=message) as err:
    hf_config.config_from_json_file(str(path))
  assert str(path) in str(err.value)


def _init(config, batch, rng=0):
  model = heads.BertForPreTraining(config)
  variables = model.init(jax.random.PRNGKey(rng), batch["input_ids"], batch["input_mask"],
                         batch["segment_ids"], batch["masked_lm_positions"])
  return model, nn.unbox(variables["params"])


def _loss_fn(model, batch, deterministic=True, dropout_seed=0):
  def loss(params):
    mlm, nsp = model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                           batch["segment_ids"], batch["masked_lm_positions"],
                           deterministic=deterministic,
                           rngs={"dropout": jax.random.PRNGKey(dropout_seed)})
    return mlm_nsp.pretraining_loss(mlm, nsp, batch)[0]
  return loss


@pytest.fixture(scope="module")
def batch():
  cfg = configuration.get_preset("test")
  return helpers.random_pretraining_batch(np.random.RandomState(3), 4, 24, 5, cfg.vocab_size)


def _max_diff(a, b):
  return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.slow
@pytest.mark.parametrize("scan, remat", [(True, "none"), (False, "full"), (True, "dots"),
                                         (True, "dots_no_batch")])
def test_scan_and_remat_compute_the_same_function(batch, scan, remat):
  """Scanned layers (stacked parameters) and rematerialisation change how, never what."""
  base_cfg = configuration.get_preset("test")
  model, params = _init(base_cfg, batch)
  other_cfg = base_cfg.replace(scan_layers=scan, remat_policy=remat)
  other = heads.BertForPreTraining(other_cfg)
  other_params = modeling.stack_layers(params, base_cfg.num_hidden_layers) if scan else params
  # The stacked tree has exactly the structure the scanned model initialises.
  _, fresh = _init(other_cfg, batch)
  assert jax.tree.structure(fresh) == jax.tree.structure(other_params)
  assert modeling.unstack_layers(other_params, 2).keys() == params.keys()
  assert _max_diff(modeling.unstack_layers(other_params, 2), params) == 0.0

  loss, grads = jax.jit(jax.value_and_grad(_loss_fn(model, batch)))(params)
  other_loss, other_grads = jax.jit(jax.value_and_grad(_loss_fn(other, batch)))(other_params)
  assert abs(float(loss) - float(other_loss)) <= 1e-5
  if scan:
    other_grads = modeling.unstack_layers(other_grads, 2)
  assert _max_diff(grads, other_grads) <= 1e-5


@pytest.mark.parametrize("remat", ["none", "dots"])
def test_stacked_layers_run_unrolled_are_the_unrolled_model(batch, remat):
  """`stack_unrolled`: the scanned layout's stacked parameters, the unrolled model's code. Its
  initial parameters are the unrolled model's stacked, and with dropout on (the same module
  paths, so the same masks) its loss and gradients are the unrolled model's, bit for bit, with
  its layers rematerialised or not."""
  cfg = configuration.get_preset("test")
  model, params = _init(cfg, batch)
  stacked_cfg = cfg.replace(scan_layers=True, stack_unrolled=True, remat_policy=remat)
  stacked_model, stacked = _init(stacked_cfg, batch)
  _, scanned = _init(cfg.replace(scan_layers=True), batch)
  assert jax.tree.structure(stacked) == jax.tree.structure(scanned)
  assert _max_diff(modeling.stack_layers(params, 2), stacked) == 0.0
  loss, grads = jax.jit(jax.value_and_grad(
      _loss_fn(model, batch, deterministic=False, dropout_seed=5)))(params)
  stacked_loss, stacked_grads = jax.jit(jax.value_and_grad(
      _loss_fn(stacked_model, batch, deterministic=False, dropout_seed=5)))(stacked)
  assert float(loss) == float(stacked_loss)
  assert float(loss) != float(_loss_fn(model, batch)(params))  # dropout was on
  assert _max_diff(modeling.stack_layers(grads, 2), stacked_grads) == 0.0
  # Each layer reads its own row: scaling row 1 of a stacked leaf changes the output.
  moved = jax.tree.map(lambda x: x, stacked)
  kernel = moved["bert"]["encoder"]["layer"]["output"]["dense"]["kernel"]
  moved["bert"]["encoder"]["layer"]["output"]["dense"]["kernel"] = kernel.at[1].multiply(3.0)
  assert float(_loss_fn(stacked_model, batch)(moved)) != float(_loss_fn(stacked_model,
                                                                         batch)(stacked))
  with pytest.raises(ValueError, match="stack_unrolled=True .* needs scan_layers=True"):
    cfg.replace(stack_unrolled=True)


def test_dropout_is_active_in_training_and_reproducible(batch):
  cfg = configuration.get_preset("test")
  model, params = _init(cfg, batch)
  eval_loss = _loss_fn(model, batch)(params)
  train_a = _loss_fn(model, batch, deterministic=False, dropout_seed=1)(params)
  train_b = _loss_fn(model, batch, deterministic=False, dropout_seed=1)(params)
  train_c = _loss_fn(model, batch, deterministic=False, dropout_seed=2)(params)
  assert float(train_a) == float(train_b)
  assert float(train_a) != float(eval_loss) and float(train_a) != float(train_c)
  # With both dropout rates at zero, the training path is the evaluation path.
  no_drop = heads.BertForPreTraining(cfg.replace(hidden_dropout_prob=0.0,
                                                 attention_probs_dropout_prob=0.0))
  assert abs(float(_loss_fn(no_drop, batch, deterministic=False)(params)) -
             float(eval_loss)) <= 1e-6


def test_attention_paths_agree():
  """The explicit path (used for attention-probability dropout) is the fused path's math."""
  rng = np.random.RandomState(0)
  q, k, v = (jnp.asarray(rng.randn(2, 7, 4, 8), jnp.float32) for _ in range(3))
  mask = jnp.asarray([[1] * 7, [1] * 4 + [0] * 3])
  fused = modeling.dot_product_attention(q, k, v, mask, dropout_rate=0.1, dropout_rng=None,
                                         deterministic=True)
  # Rate → 0 with dropout "on" takes the explicit branch; keep-probability 1 - 1e-12 keeps all.
  explicit = modeling.dot_product_attention(q, k, v, mask, dropout_rate=1e-12,
                                            dropout_rng=jax.random.PRNGKey(0),
                                            deterministic=False)
  assert float(jnp.max(jnp.abs(fused - explicit))) <= 1e-6


@pytest.mark.parametrize("packed", [False, True])
def test_attention_without_its_key_bias_is_attention_with_it(packed):
  """The key projection's bias is a parameter but is not added: q·b_k is the same for every key
  of query q, so the layer's output equals the textbook attention that adds it (a large random
  bias here), padded or packed rows; the bias's gradient is exactly zero."""
  cfg = configuration.get_preset("test", hidden_size=32, num_attention_heads=4)
  rng = np.random.RandomState(0)
  x = jnp.asarray(rng.randn(2, 9, 32), jnp.float32)
  mask = jnp.asarray([[1] * 9, [1] * 6 + [0] * 3])
  ids = jnp.asarray([[1] * 4 + [2] * 5, [1] * 3 + [2] * 3 + [0] * 3]) if packed else None
  layer = modeling.BertSelfAttention(cfg)
  params = nn.unbox(layer.init(jax.random.PRNGKey(0), x, mask, True, ids)["params"])
  params = jax.tree_util.tree_map_with_path(
      lambda path, p: (p + 5 * jnp.asarray(rng.randn(*p.shape), p.dtype)
                       if path[-1].key == "bias" else p), params)
  ours = layer.apply({"params": params}, x, mask, True, ids)

  def project(name):
    y = x @ params[name]["kernel"] + params[name]["bias"]
    return y.reshape(2, 9, 4, 8)
  q, k, v = project("query"), project("key"), project("value")
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(8)
  allowed = modeling.attention_mask(mask, ids)
  probs = jax.nn.softmax(jnp.where(allowed, scores, -1e9), axis=-1)
  reference = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(2, 9, 32)
  real = np.asarray(mask, bool)
  np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(reference)[real], atol=1e-5)
  grads = jax.grad(lambda p: jnp.sum(layer.apply({"params": p}, x, mask, True, ids) ** 2))(
      params)
  assert float(jnp.abs(grads["key"]["bias"]).max()) == 0.0
  assert float(jnp.abs(grads["query"]["bias"]).max()) > 0


def test_padding_does_not_leak_into_real_tokens(batch):
  cfg = configuration.get_preset("test")
  model, params = _init(cfg, batch)
  apply = lambda ids: modeling.BertModel(cfg).apply(
      {"params": params["bert"]}, ids, batch["input_mask"], batch["segment_ids"])
  changed = np.where(batch["input_mask"] == 0, 7, batch["input_ids"])
  a, b = apply(batch["input_ids"]), apply(changed)
  real = batch["input_mask"].astype(bool)
  assert (batch["input_mask"] == 0).any()
  assert float(np.abs(np.asarray(a["sequence_output"]) - np.asarray(b["sequence_output"]))[real].max()) == 0.0


@pytest.mark.slow
def test_bfloat16_compute_keeps_float32_parameters(batch):
  cfg = configuration.get_preset("test")
  model, params = _init(cfg, batch)
  bf16 = heads.BertForPreTraining(cfg.replace(dtype="bfloat16"))
  _, bf16_params = _init(cfg.replace(dtype="bfloat16"), batch)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(bf16_params))
  mlm32, nsp32 = model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                             batch["segment_ids"], batch["masked_lm_positions"])
  mlm16, nsp16 = bf16.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                            batch["segment_ids"], batch["masked_lm_positions"])
  assert mlm16.dtype == jnp.float32 and nsp16.dtype == jnp.float32  # logits feed losses in fp32
  assert float(jnp.max(jnp.abs(mlm16 - mlm32))) < 0.1
  jaxpr = str(jax.make_jaxpr(lambda p: bf16.apply(
      {"params": p}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
      batch["masked_lm_positions"]))(params))
  assert "bf16" in jaxpr
  loss, grads = jax.value_and_grad(_loss_fn(bf16, batch))(params)
  assert np.isfinite(float(loss))
  assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))


def test_initializer_is_tf1_truncated_normal():
  x = np.asarray(modeling.bert_initializer(0.02)(jax.random.PRNGKey(0), (400, 500)))
  assert np.abs(x).max() <= 0.04 + 1e-7            # cut at two standard deviations
  assert abs(x.std() - 0.02 * 0.8796) < 3e-4       # the std of N(0, 0.02²) truncated at ±2σ


def test_hidden_states_are_collected(batch):
  cfg = configuration.get_preset("test")
  _, params = _init(cfg, batch)
  for scan in (False, True):
    c = cfg.replace(scan_layers=scan)
    p = modeling.stack_layers(params, 2) if scan else params
    out = modeling.BertModel(c, collect_hidden_states=True).apply(
        {"params": p["bert"]}, batch["input_ids"], batch["input_mask"], batch["segment_ids"])
    assert len(out["hidden_states"]) == cfg.num_hidden_layers + 1
    np.testing.assert_allclose(out["hidden_states"][-1], out["sequence_output"], atol=1e-6)
