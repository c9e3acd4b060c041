"""ALBERT and RoBERTa against transformers' PyTorch models (CPU, float32, random weights).

Each reference model is built with seeded random weights (every tensor perturbed, so that every
row of the name tables and every transpose matters), saved with `save_pretrained(...,
safe_serialization=True)` and read through the normal loading route (`checkpoints.load_any`
and friends, which pick the family from `config.json`). Outputs are compared at real tokens of
batches with padding, then our export is loaded back into transformers. ALBERT's TF1 route is
checked with a checkpoint written by TensorFlow under the names of google-research/albert's
`modeling.py`, derived here by that code's own rules rather than from our table.
"""

import json
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
import torch
import transformers
from jax.sharding import PartitionSpec

from bert_jax.interop import checkpoints
from bert_jax.interop import hf as hf_io
from bert_jax.interop import hf_config as hf_config_io
from bert_jax.interop import names as name_tables
from bert_jax.interop import tf1
from bert_jax.model import configuration, heads, modeling
from bert_jax.parallel import sharding
from bert_jax.objectives.mlm import masked_lm_loss
from bert_jax.objectives.mlm_nsp import next_sentence_loss
from tests import helpers

TOL = 1e-5


def _perturb(model, seed):
  """Random init leaves biases and LayerNorms at 0/1; move every tensor."""
  torch.manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  return model.eval()


def _max_diff(ours, ref, real=None):
  diff = np.abs(np.asarray(ours, np.float32) - np.asarray(ref, np.float32))
  return float((diff[real] if real is not None else diff).max())


def _gather(logits, positions):
  return np.take_along_axis(logits, positions[..., None], axis=1)


def _hf_labels(batch):
  labels = np.full(batch["input_ids"].shape, -100)
  for b in range(labels.shape[0]):
    for p, i, w in zip(batch["masked_lm_positions"][b], batch["masked_lm_ids"][b],
                       batch["masked_lm_weights"][b]):
      if w > 0:
        labels[b, p] = i
  return torch.tensor(labels)


# -------------------------------------------------------------------------------------- ALBERT
ALBERT_KW = dict(vocab_size=1000, embedding_size=32, hidden_size=64, num_hidden_layers=3,
                 num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
                 type_vocab_size=2, hidden_act="gelu_new", hidden_dropout_prob=0.1,
                 attention_probs_dropout_prob=0.1)


@pytest.fixture(scope="module")
def albert(tmp_path_factory):
  torch.manual_seed(0)
  hf_config = transformers.AlbertConfig(**ALBERT_KW, attn_implementation="eager")
  model = _perturb(transformers.AlbertForPreTraining(hf_config), 1)
  path = str(tmp_path_factory.mktemp("hf_albert"))
  model.save_pretrained(path, safe_serialization=True)
  return path, model


def _albert_reference(model, batch, **kwargs):
  with torch.no_grad():
    args = dict(input_ids=torch.tensor(batch["input_ids"]),
                attention_mask=torch.tensor(batch["input_mask"]),
                token_type_ids=torch.tensor(batch["segment_ids"]))
    return model(**args, **kwargs), model.albert(**args)


def _albert_ours(config, params, batch):
  model = heads.BertForPreTraining(config)
  mlm, sop = jax.jit(lambda p, b: model.apply(
      {"params": p}, b["input_ids"], b["input_mask"], b["segment_ids"],
      b["masked_lm_positions"]))(params, batch)
  enc = modeling.BertModel(config).apply({"params": params["bert"]}, batch["input_ids"],
                                         batch["input_mask"], batch["segment_ids"])
  return np.asarray(mlm), np.asarray(sop), enc


@pytest.mark.slow
def test_albert_loads_and_matches_reference(albert):
  path, torch_model = albert
  config, params, report = hf_io.load_hf_checkpoint(path)
  assert report.missing == [] and report.unexpected == [], report.summary()
  assert (config.model_type, config.share_parameters, config.embedding_width) == (
      "albert", "all", 32)
  # The normal route (kind detection, init order's loader) gives the same tree.
  loaded = checkpoints.load_any(path)
  assert loaded.kind == "hf" and loaded.config == config
  for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)
  assert "shared_layer" in params["bert"]["encoder"]
  assert params["bert"]["embeddings"]["word_embeddings"].shape == (1000, 32)

  batch = helpers.random_pretraining_batch(np.random.RandomState(0), batch=4, length=32,
                                           max_predictions=6, vocab_size=config.vocab_size)
  sop_labels = torch.tensor(batch["next_sentence_labels"][:, 0]).long()
  ref, ref_enc = _albert_reference(torch_model, batch, labels=_hf_labels(batch),
                                   sentence_order_label=sop_labels)
  mlm, sop, enc = _albert_ours(config, params, batch)
  real = batch["input_mask"].astype(bool)
  diffs = {
      "mlm logits": _max_diff(mlm, _gather(ref.prediction_logits.numpy(),
                                           batch["masked_lm_positions"])),
      "sop logits": _max_diff(sop, ref.sop_logits.numpy()),
      "sequence": _max_diff(enc["sequence_output"], ref_enc.last_hidden_state.numpy(), real),
      "pooled": _max_diff(enc["pooled_output"], ref_enc.pooler_output.numpy()),
  }
  # Losses: transformers' (mean over labelled positions + SOP cross-entropy) from ours; the
  # original's MLM denominator carries + 1e-5, undone here.
  mlm_loss = masked_lm_loss(mlm, batch["masked_lm_ids"], batch["masked_lm_weights"])
  sop_loss = next_sentence_loss(sop, batch["next_sentence_labels"][:, 0])
  count = float(batch["masked_lm_weights"].sum())
  ours_total = float(mlm_loss["loss"]) * (count + 1e-5) / count + float(sop_loss["loss"])
  diffs["loss"] = abs(float(ref.loss) - ours_total)
  print("\nALBERT vs transformers: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
  assert max(diffs.values()) <= TOL, diffs
  assert np.abs(ref_enc.last_hidden_state.numpy()).max() > 0.1  # not vacuous


@pytest.mark.slow
def test_albert_export_loads_in_transformers(albert, tmp_path):
  path, _ = albert
  config, params, _ = hf_io.load_hf_checkpoint(path)
  params = jax.tree.map(lambda x: x * 1.1 + 0.01, params)  # not just the input file again
  out = hf_io.save_hf_checkpoint(params, config, str(tmp_path / "export"))
  written = json.loads(open(os.path.join(out, "config.json")).read())
  assert written["model_type"] == "albert" and written["architectures"] == [
      "AlbertForPreTraining"]
  reloaded, info = transformers.AlbertForPreTraining.from_pretrained(
      out, output_loading_info=True, attn_implementation="eager")
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  reloaded.eval()
  batch = helpers.random_pretraining_batch(np.random.RandomState(1), batch=3, length=20,
                                           max_predictions=4, vocab_size=config.vocab_size)
  ref, ref_enc = _albert_reference(reloaded, batch)
  mlm, sop, enc = _albert_ours(config, params, batch)
  real = batch["input_mask"].astype(bool)
  diffs = {"mlm logits": _max_diff(mlm, _gather(ref.prediction_logits.numpy(),
                                                batch["masked_lm_positions"])),
           "sop logits": _max_diff(sop, ref.sop_logits.numpy()),
           "sequence": _max_diff(enc["sequence_output"], ref_enc.last_hidden_state.numpy(),
                                 real)}
  print("\nALBERT export → transformers: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
  assert max(diffs.values()) <= TOL, diffs

  # The encoder alone is a bare AlbertModel.
  enc_dir = hf_io.save_hf_checkpoint({"bert": params["bert"]}, config, str(tmp_path / "enc"))
  bare = transformers.AlbertModel.from_pretrained(enc_dir, attn_implementation="eager").eval()
  with torch.no_grad():
    ref_bare = bare(input_ids=torch.tensor(batch["input_ids"]),
                    attention_mask=torch.tensor(batch["input_mask"]),
                    token_type_ids=torch.tensor(batch["segment_ids"]))
  assert _max_diff(enc["sequence_output"], ref_bare.last_hidden_state.numpy(), real) <= TOL
  assert _max_diff(enc["pooled_output"], ref_bare.pooler_output.numpy()) <= TOL


@pytest.mark.slow
def test_albert_scanned_is_the_same_model(albert):
  """Scanning the shared layer broadcasts one set of weights into the loop: same tree, same
  outputs."""
  path, _ = albert
  config, params, _ = hf_io.load_hf_checkpoint(path)
  scan_config, scanned, _ = hf_io.load_hf_checkpoint(path, scan_layers=True)
  assert jax.tree.structure(scanned) == jax.tree.structure(params)
  batch = helpers.random_pretraining_batch(np.random.RandomState(2), batch=2, length=16,
                                           max_predictions=3, vocab_size=config.vocab_size)
  a = _albert_ours(config, params, batch)
  b = _albert_ours(scan_config.replace(remat_policy="dots"), scanned, batch)
  assert _max_diff(a[0], b[0]) <= TOL and _max_diff(a[1], b[1]) <= TOL


# ALBERT's TF1 names, by google-research/albert's modeling.py and run_pretraining.py: the shared
# block lives in variable scopes transformer/group_0/inner_group_0 with attention_1/ and ffn_1/,
# the attention LayerNorm is `LayerNorm` and the block's last one `LayerNorm_1`.
_ALBERT_LAYER_TF1 = {
    "attention.query": "attention_1/self/query", "attention.key": "attention_1/self/key",
    "attention.value": "attention_1/self/value", "attention.dense": "attention_1/output/dense",
    "attention.LayerNorm": "LayerNorm", "ffn": "ffn_1/intermediate/dense",
    "ffn_output": "ffn_1/intermediate/output/dense", "full_layer_layer_norm": "LayerNorm_1",
}


def albert_tf1_name(torch_name):
  """`(TF1 name, transpose?)` of a transformers ALBERT tensor, None for what the release does
  not store (the decoder tied to the embeddings)."""
  if torch_name.startswith("predictions.decoder."):
    return None
  if torch_name.startswith("sop_classifier.classifier."):
    leaf = {"weight": "output_weights", "bias": "output_bias"}[torch_name.rsplit(".", 1)[1]]
    return f"cls/seq_relationship/{leaf}", False  # stored (2, hidden)
  if torch_name == "predictions.bias":
    return "cls/predictions/output_bias", False
  stem, leaf = torch_name.rsplit(".", 1)
  m = re.match(r"albert\.encoder\.albert_layer_groups\.0\.albert_layers\.0\.(.+)$", stem)
  if m:
    scope = "bert/encoder/transformer/group_0/inner_group_0/" + _ALBERT_LAYER_TF1[m.group(1)]
  elif stem.startswith("predictions."):
    scope = "cls/predictions/transform/" + stem[len("predictions."):]
  elif stem == "albert.pooler":
    scope = "bert/pooler/dense"
  else:
    scope = stem.replace("albert.", "bert/", 1).replace(".", "/")
  if scope.endswith("_embeddings"):
    return scope, False
  if "LayerNorm" in scope:
    return f"{scope}/{'gamma' if leaf == 'weight' else 'beta'}", False
  return f"{scope}/{'kernel' if leaf == 'weight' else 'bias'}", leaf == "weight"


def write_tf1(prefix, variables):
  """Graph variables saved by `tf.compat.v1.train.Saver`, as the ALBERT code's training did."""
  graph = tf.Graph()
  with graph.as_default():
    assigns, feeds = [], {}
    for name, value in variables.items():
      var = tf.compat.v1.get_variable(name, shape=value.shape, dtype=tf.float32,
                                      initializer=tf.compat.v1.zeros_initializer())
      placeholder = tf.compat.v1.placeholder(tf.float32, value.shape)
      assigns.append(var.assign(placeholder))
      feeds[placeholder] = value
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session(graph=graph) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(assigns, feeds)
      saver.save(sess, prefix, write_meta_graph=False, write_state=False)
  return prefix


@pytest.mark.slow
def test_albert_tf1_import_and_export(albert, tmp_path):
  path, torch_model = albert
  variables = {}
  for key, tensor in torch_model.state_dict().items():
    mapped = albert_tf1_name(key)
    if mapped is not None:
      value = tensor.detach().numpy().astype(np.float32)
      variables[mapped[0]] = np.ascontiguousarray(value.T) if mapped[1] else value
  release = tmp_path / "albert_base"
  release.mkdir()
  write_tf1(str(release / "model.ckpt-best"), variables)
  hf_cfg = torch_model.config
  (release / "albert_config.json").write_text(json.dumps({  # the release's fields
      "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
      "embedding_size": hf_cfg.embedding_size, "hidden_size": hf_cfg.hidden_size,
      "initializer_range": 0.02, "intermediate_size": hf_cfg.intermediate_size,
      "max_position_embeddings": hf_cfg.max_position_embeddings,
      "num_attention_heads": hf_cfg.num_attention_heads,
      "num_hidden_layers": hf_cfg.num_hidden_layers, "num_hidden_groups": 1,
      "net_structure_type": 0, "gap_size": 0, "num_memory_blocks": 0, "inner_group_num": 1,
      "down_scale_factor": 1, "type_vocab_size": hf_cfg.type_vocab_size,
      "vocab_size": hf_cfg.vocab_size}))

  loaded = checkpoints.load_any(str(release))
  assert loaded.kind == "tf1" and loaded.report.missing == [] and not loaded.report.unexpected
  assert loaded.config.model_type == "albert" and loaded.config.hidden_act == "gelu_new"
  batch = helpers.random_pretraining_batch(np.random.RandomState(3), batch=3, length=24,
                                           max_predictions=4, vocab_size=hf_cfg.vocab_size)
  ref, ref_enc = _albert_reference(torch_model, batch)
  mlm, sop, enc = _albert_ours(loaded.config, loaded.params, batch)
  real = batch["input_mask"].astype(bool)
  diffs = {"mlm logits": _max_diff(mlm, _gather(ref.prediction_logits.numpy(),
                                                batch["masked_lm_positions"])),
           "sop logits": _max_diff(sop, ref.sop_logits.numpy()),
           "sequence": _max_diff(enc["sequence_output"], ref_enc.last_hidden_state.numpy(),
                                 real)}
  print("\nALBERT TF1 vs transformers: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
  assert max(diffs.values()) <= TOL, diffs

  # Export: the same variables under the same names, and a config that reads back the same.
  prefix = tf1.save_tf1_checkpoint(loaded.params, loaded.config, str(tmp_path / "out"))
  written = tf1.read_tf1_checkpoint(prefix)
  assert sorted(written) == sorted(variables)
  for name, value in variables.items():
    np.testing.assert_array_equal(written[name], value)
  again = checkpoints.load_any(str(tmp_path / "out"))
  assert again.config == loaded.config
  assert json.loads((tmp_path / "out" / "albert_config.json").read_text())["hidden_act"] == "gelu"

  # ALBERT's variables with a BERT config: named, not read as a BERT with every layer missing.
  bert_config = str(tmp_path / "bert_config.json")
  configuration.get_preset("test").to_json_file(bert_config)
  with pytest.raises(ValueError, match="variables are ALBERT's but its config says "
                                       "model_type='bert'"):
    checkpoints.load_any(str(release), bert_config_file=bert_config)


# ------------------------------------------------------- partial sharing (ALBERT's ablations)
def _small_albert(share):
  return configuration.BertConfig(model_type="albert", vocab_size=200, embedding_size=16,
                                  hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=32,
                                  share_parameters=share, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)


def _count(tree):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


@pytest.mark.slow
@pytest.mark.parametrize("share", ["attention", "ffn"])
def test_partial_sharing_counts_and_accumulates_gradients(share):
  ids = jnp.asarray(np.random.RandomState(0).randint(3, 200, (2, 12)), jnp.int32)
  mask = jnp.ones_like(ids).at[1, 9:].set(0)

  def init(cfg):
    return nn.unbox(modeling.BertModel(cfg, add_pooling_layer=False).init(
        jax.random.PRNGKey(0), ids, mask)["params"])

  none, shared = init(_small_albert("none")), init(_small_albert(share))
  part = {"attention": ("attention",), "ffn": ("intermediate", "output")}[share]
  per_layer = sum(_count(none["encoder"]["layer_0"][p]) for p in part)
  # Shared: the part once instead of once per layer.
  assert _count(shared) == _count(none) - 2 * per_layer
  assert set(shared["encoder"]["shared_layer"]) == set(part)
  for i in range(3):
    assert not set(part) & set(shared["encoder"][f"layer_{i}"])

  # The shared model is the unshared one with the part copied into every layer, and the shared
  # part's gradient is the sum over layers of the copies' gradients.
  tied = jax.tree.map(lambda x: x, none)
  for i in range(3):
    for p in part:
      tied["encoder"][f"layer_{i}"][p] = shared["encoder"]["shared_layer"][p]
    for p in set(none["encoder"]["layer_0"]) - set(part):
      tied["encoder"][f"layer_{i}"][p] = shared["encoder"][f"layer_{i}"][p]
  tied["embeddings"] = shared["embeddings"]
  tied["encoder"]["embedding_hidden_mapping_in"] = shared["encoder"][
      "embedding_hidden_mapping_in"]

  def loss(cfg):
    def f(params):
      out = modeling.BertModel(cfg, add_pooling_layer=False).apply({"params": params}, ids, mask)
      return jnp.sum(jnp.sin(out["sequence_output"]) * mask[..., None])
    return f

  value_shared, g_shared = jax.value_and_grad(loss(_small_albert(share)))(shared)
  value_tied, g_tied = jax.value_and_grad(loss(_small_albert("none")))(tied)
  assert abs(float(value_shared) - float(value_tied)) <= 1e-4
  for p in part:
    summed = jax.tree.map(lambda *g: sum(g), *[g_tied["encoder"][f"layer_{i}"][p]
                                               for i in range(3)])
    for a, b in zip(jax.tree.leaves(g_shared["encoder"]["shared_layer"][p]),
                    jax.tree.leaves(summed)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
  # Every layer's own copy contributes: no single layer's gradient is the whole sum.
  first = jax.tree.leaves(g_tied["encoder"]["layer_0"][part[0]])[0]
  total = jax.tree.leaves(g_shared["encoder"]["shared_layer"][part[0]])[0]
  assert np.abs(np.asarray(total) - np.asarray(first)).max() > 1e-6

  with pytest.raises(ValueError, match="scan_layers=True with share_parameters"):
    _small_albert(share).replace(scan_layers=True)
  # No checkpoint format has names for partial sharing: the export says so.
  with pytest.raises(ValueError, match="share_parameters="):
    hf_io.params_to_hf_state({"bert": shared}, _small_albert(share))


@pytest.mark.mesh
@pytest.mark.slow
@pytest.mark.parametrize("share,scan", [("all", True), ("attention", False)])
def test_shared_layers_shard_on_a_mesh(share, scan):
  """Shared parts keep their logical axis names: sharded init and forward on a (2, 2, 2) mesh
  equal one device, scanned ("all": broadcast into the loop) or not."""
  cfg = _small_albert(share).replace(scan_layers=scan)
  batch = helpers.random_pretraining_batch(np.random.RandomState(5), 8, 16, 3, cfg.vocab_size)
  model = heads.BertForPreTraining(cfg)
  args = (batch["input_ids"], batch["input_mask"], batch["segment_ids"],
          batch["masked_lm_positions"])
  init_fn = lambda rng: model.init(rng, *args)["params"]
  boxed = jax.eval_shape(init_fn, jax.random.PRNGKey(0))
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert len(leaves) == len(jax.tree.leaves(nn.unbox(boxed)))
  rule_names = {name for name, _ in sharding.DEFAULT_LOGICAL_AXIS_RULES}
  for leaf in leaves:
    assert isinstance(leaf, nn.LogicallyPartitioned) and set(leaf.names) <= rule_names, leaf

  mesh = sharding.create_mesh((2, 2, 2))
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  params, param_sh = sharding.init_sharded(init_fn, mesh, rules, jax.random.PRNGKey(0))
  kernel = params["bert"]["encoder"]["shared_layer"]["attention"]["self"]["query"]["kernel"]
  assert kernel.shape == (32, 32) and kernel.sharding.spec == PartitionSpec("fsdp", "model")
  reference = model.apply({"params": jax.device_get(params)}, *args)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    out = jax.jit(lambda p, *a: model.apply({"params": p}, *a))(params, *args)
  assert max(_max_diff(a, b) for a, b in zip(out, reference)) <= TOL


# ------------------------------------------------------------------------------------- RoBERTa
ROBERTA_KW = dict(vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=66, type_vocab_size=1,
                  pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
  cfg = transformers.RobertaConfig(**ROBERTA_KW, attn_implementation="eager")
  torch.manual_seed(0)
  mlm = _perturb(transformers.RobertaForMaskedLM(cfg), 2)
  base = _perturb(transformers.RobertaModel(cfg), 3)
  mlm_path = str(tmp_path_factory.mktemp("hf_roberta_mlm"))
  base_path = str(tmp_path_factory.mktemp("hf_roberta_base"))
  mlm.save_pretrained(mlm_path, safe_serialization=True)
  base.save_pretrained(base_path, safe_serialization=True)
  return mlm_path, mlm, base_path, base


def _roberta_batch(seed, batch=4, length=30, max_predictions=5):
  """RoBERTa rows: <s> (0) first, real ids above the specials, padding id 1 after them."""
  b = helpers.random_pretraining_batch(np.random.RandomState(seed), batch=batch, length=length,
                                       max_predictions=max_predictions, vocab_size=1000,
                                       type_vocab_size=1)
  b["input_ids"][:, 0] = 0
  b["input_ids"][b["input_mask"] == 0] = 1
  assert (b["input_mask"] == 0).any()
  return b


def _torch_inputs(batch):
  return dict(input_ids=torch.tensor(batch["input_ids"]),
              attention_mask=torch.tensor(batch["input_mask"]))


@pytest.mark.slow
def test_roberta_masked_lm_matches_reference(roberta):
  path, torch_model, _, _ = roberta
  config, params, report = hf_io.load_hf_checkpoint(path)
  assert report.missing == ["bert/pooler/dense/kernel", "bert/pooler/dense/bias"]
  assert report.unexpected == [], report.summary()
  assert (config.model_type, config.position_offset, config.type_vocab_size) == ("roberta", 2, 1)
  # The route fill-mask takes: any checkpoint kind → encoder + MLM head.
  mlm_config, mlm_params = checkpoints.load_masked_lm(path)
  assert mlm_config == config

  batch = _roberta_batch(0)
  with torch.no_grad():
    ref = torch_model(**_torch_inputs(batch), labels=_hf_labels(batch))
    ref_seq = torch_model.roberta(**_torch_inputs(batch)).last_hidden_state.numpy()
  logits = heads.BertForMaskedLM(config).apply(
      {"params": mlm_params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
      batch["masked_lm_positions"])
  seq = modeling.BertModel(config, add_pooling_layer=False).apply(
      {"params": mlm_params["bert"]}, batch["input_ids"], batch["input_mask"])
  loss = masked_lm_loss(logits, batch["masked_lm_ids"], batch["masked_lm_weights"])
  count = float(batch["masked_lm_weights"].sum())
  real = batch["input_mask"].astype(bool)
  diffs = {"mlm logits": _max_diff(logits, _gather(ref.logits.numpy(),
                                                   batch["masked_lm_positions"])),
           "sequence": _max_diff(seq["sequence_output"], ref_seq, real),
           "loss": abs(float(ref.loss) - float(loss["loss"]) * (count + 1e-5) / count)}
  print("\nRoBERTa MLM vs transformers: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
  assert max(diffs.values()) <= TOL, diffs


def test_roberta_model_matches_reference(roberta):
  _, _, path, torch_model = roberta
  loaded = checkpoints.load_any(path)  # a bare RobertaModel: no prefix, with pooler
  assert loaded.report.unexpected == [] and loaded.config.model_type == "roberta"
  assert sorted(loaded.report.missing) == sorted(
      r.ours for r in name_tables.name_table(3, model_type="roberta") if r.ours.startswith("cls/"))
  batch = _roberta_batch(1)
  with torch.no_grad():
    ref = torch_model(**_torch_inputs(batch))
  out = modeling.BertModel(loaded.config).apply({"params": loaded.params["bert"]},
                                                batch["input_ids"], batch["input_mask"],
                                                batch["segment_ids"])
  real = batch["input_mask"].astype(bool)
  diffs = {"sequence": _max_diff(out["sequence_output"], ref.last_hidden_state.numpy(), real),
           "pooled": _max_diff(out["pooled_output"], ref.pooler_output.numpy())}
  print("\nRoBERTa model vs transformers: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
  assert max(diffs.values()) <= TOL, diffs


@pytest.mark.slow
def test_roberta_export_loads_in_transformers(roberta, tmp_path):
  path, _, base_path, _ = roberta
  config, params, _ = hf_io.load_hf_checkpoint(path)
  params = jax.tree.map(lambda x: x * 1.1 + 0.01, params)
  out = hf_io.save_hf_checkpoint(params, config, str(tmp_path / "mlm"))
  written = json.loads(open(os.path.join(out, "config.json")).read())
  assert (written["model_type"], written["architectures"], written["pad_token_id"]) == (
      "roberta", ["RobertaForMaskedLM"], 1)
  reloaded, info = transformers.RobertaForMaskedLM.from_pretrained(
      out, output_loading_info=True, attn_implementation="eager")
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  reloaded.eval()
  batch = _roberta_batch(2, batch=3, length=20)
  with torch.no_grad():
    ref = reloaded(**_torch_inputs(batch)).logits.numpy()
  logits = heads.BertForMaskedLM(config).apply(
      {"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
      batch["masked_lm_positions"])
  mlm_diff = _max_diff(logits, _gather(ref, batch["masked_lm_positions"]))

  base_config, base_params, _ = hf_io.load_hf_checkpoint(base_path)
  base_params = jax.tree.map(lambda x: x * 0.9 - 0.01, base_params)
  enc_dir = hf_io.save_hf_checkpoint(base_params, base_config, str(tmp_path / "enc"))
  bare = transformers.RobertaModel.from_pretrained(enc_dir, attn_implementation="eager").eval()
  with torch.no_grad():
    ref_bare = bare(**_torch_inputs(batch))
  ours = modeling.BertModel(base_config).apply({"params": base_params["bert"]},
                                               batch["input_ids"], batch["input_mask"])
  real = batch["input_mask"].astype(bool)
  seq_diff = _max_diff(ours["sequence_output"], ref_bare.last_hidden_state.numpy(), real)
  pool_diff = _max_diff(ours["pooled_output"], ref_bare.pooler_output.numpy())
  print(f"\nRoBERTa export → transformers: mlm logits {mlm_diff:.2e}, sequence {seq_diff:.2e}, "
        f"pooled {pool_diff:.2e}")
  assert max(mlm_diff, seq_diff, pool_diff) <= TOL


@pytest.mark.slow
def test_roberta_packed_row_equals_unpacked(roberta):
  """Packed rows pass positions restarting at 0; the offset applies to them as to any row."""
  _, _, path, _ = roberta
  config, params, _ = hf_io.load_hf_checkpoint(path)
  rng = np.random.RandomState(4)
  a, b = rng.randint(3, 1000, 7), rng.randint(3, 1000, 5)
  a[0] = b[0] = 0
  length = 16
  row = np.ones((1, length), np.int32)
  row[0, :7], row[0, 7:12] = a, b
  packed = modeling.BertModel(config).apply(
      {"params": params["bert"]}, row, (row != 1).astype(np.int32),
      position_ids=np.array([list(range(7)) + list(range(5)) + [0] * 4]),
      sequence_ids=np.array([[1] * 7 + [2] * 5 + [0] * 4]), cls_positions=np.array([[0, 7]]))
  for tokens, start, k in ((a, 0, 0), (b, 7, 1)):
    alone = np.ones((1, length), np.int32)
    alone[0, :len(tokens)] = tokens
    single = modeling.BertModel(config).apply({"params": params["bert"]}, alone,
                                              (alone != 1).astype(np.int32))
    n = len(tokens)
    assert _max_diff(packed["sequence_output"][0, start:start + n],
                     single["sequence_output"][0, :n]) <= TOL
    assert _max_diff(packed["pooled_output"][0, k], single["pooled_output"][0]) <= TOL


# ------------------------------------------------------------------------- configs and bad input
def test_presets_and_hf_configs():
  shapes = {name: (c.num_hidden_layers, c.hidden_size, c.embedding_width, c.num_attention_heads,
                   c.intermediate_size)
            for name, c in configuration.PRESETS.items() if name.startswith("albert")}
  assert shapes == {"albert_base": (12, 768, 128, 12, 3072),
                    "albert_large": (24, 1024, 128, 16, 4096),
                    "albert_xlarge": (24, 2048, 128, 16, 8192),
                    "albert_xxlarge": (12, 4096, 128, 64, 16384)}
  albert_base = configuration.get_preset("albert_base")
  assert albert_base.hidden_act == transformers.AlbertConfig().hidden_act == "gelu_new"
  roberta_base = configuration.get_preset("roberta_base")
  assert (roberta_base.max_position_embeddings, roberta_base.max_sequence_length,
          roberta_base.type_vocab_size) == (514, 512, 1)
  roberta_base.check_sequence_length(512)
  with pytest.raises(ValueError, match="position_offset=2"):
    roberta_base.check_sequence_length(513)
  # Sizes agree with transformers' models of the same configs (built without memory).
  for name, cls in (("albert_base", transformers.AlbertForPreTraining),
                    ("roberta_base", transformers.RobertaForMaskedLM)):
    cfg = configuration.get_preset(name)
    hf_config = transformers.AutoConfig.for_model(**hf_config_io.to_hf_dict(cfg))
    assert type(hf_config).__name__ == cls.__name__.split("For")[0] + "Config"
    with torch.device("meta"):
      reference = cls(hf_config)
    ours = name_tables.expected_shapes(cfg)
    theirs = reference.num_parameters()  # the tied decoder counted once, as ours has it
    head = 2 * (cfg.hidden_size + 1) if name.startswith("roberta") else 0  # NSP, not in HF
    pooler = (cfg.hidden_size + 1) * cfg.hidden_size if name.startswith("roberta") else 0
    assert sum(int(np.prod(s)) for s in ours.values()) == theirs + head + pooler, name
    assert hf_config_io.config_from_dict(hf_config_io.to_hf_dict(cfg)) == cfg
    # Our own run directories keep the family in bert_config.json.
    assert hf_config_io.config_from_dict(json.loads(tf1.original_config_json(cfg))) == cfg
  # A BERT config is written exactly as the original wrote it.
  assert set(configuration.get_preset("base").to_original_dict()) == set(
      configuration.BertConfig.SHAPE_FIELDS) - {"layer_norm_eps"}


def test_unknown_family_and_mismatches_are_refused(albert, tmp_path):
  path, _ = albert
  values = json.loads(open(os.path.join(path, "config.json")).read())
  with pytest.raises(ValueError, match=r"model_type='xlnet'; supported families: bert, "):
    hf_config_io.config_from_dict(dict(values, model_type="xlnet"), source="x.json")
  with pytest.raises(ValueError, match="num_hidden_groups=2, inner_group_num=1"):
    hf_config_io.config_from_dict(dict(values, num_hidden_groups=2), source="x.json")
  # The same tensors read as a wider ALBERT: every mismatch listed.
  other = tmp_path / "other"
  other.mkdir()
  (other / "model.safetensors").write_bytes(open(os.path.join(path, "model.safetensors"),
                                                 "rb").read())
  (other / "config.json").write_text(json.dumps(dict(values, embedding_size=48)))
  with pytest.raises(ValueError) as err:
    hf_io.load_hf_checkpoint(str(other))
  message = str(err.value)
  assert "tensor shapes disagree with the config (model_type=albert)" in message
  assert "albert.embeddings.word_embeddings.weight: checkpoint (1000, 32) vs model (1000, 48)" in (
      message)
  assert "predictions.dense.weight" in message
  # RoBERTa was never released as a TF1 checkpoint: no names to write it under.
  with pytest.raises(ValueError, match="RoBERTa|no TF1 names"):
    tf1.params_to_tf1_state({}, configuration.get_preset("roberta_base"))
