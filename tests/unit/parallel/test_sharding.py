"""Sharding on 8 fake CPU devices: every mesh shape computes what one device computes."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from bert_jax.model import configuration, heads
from bert_jax.objectives import mlm_nsp
from bert_jax.parallel import sharding
from tests import helpers

pytestmark = pytest.mark.mesh

MESHES = [(8, 1, 1), (2, 2, 2), (1, 1, 8), (1, 8, 1)]


def _max_abs(a, b):
  """Largest elementwise difference between two trees (gathered to the host)."""
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_eight_fake_devices():
  assert jax.device_count() == 8


@pytest.fixture(scope="module")
def setup():
  cfg = configuration.get_preset("test")
  batch = helpers.random_pretraining_batch(np.random.RandomState(0), 8, 32, 5, cfg.vocab_size)
  model = heads.BertForPreTraining(cfg)

  def init_fn(rng):
    return model.init(rng, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                      batch["masked_lm_positions"])["params"]

  def loss_fn(params, b):
    mlm, nsp = model.apply({"params": params}, b["input_ids"], b["input_mask"],
                           b["segment_ids"], b["masked_lm_positions"], deterministic=False,
                           rngs={"dropout": jax.random.PRNGKey(7)})
    return mlm_nsp.pretraining_loss(mlm, nsp, b)[0]

  ref_params = nn.unbox(init_fn(jax.random.PRNGKey(0)))
  single = jax.devices()[0]
  ref_params = jax.device_put(ref_params, single)
  ref_out = jax.jit(lambda p, b: model.apply({"params": p}, b["input_ids"], b["input_mask"],
                                             b["segment_ids"], b["masked_lm_positions"]))(
      ref_params, jax.device_put(batch, single))
  ref_loss, ref_grads = jax.jit(jax.value_and_grad(loss_fn))(ref_params, batch)
  return model, batch, init_fn, loss_fn, ref_params, ref_out, ref_loss, ref_grads


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", MESHES)
def test_sharded_forward_and_gradients_equal_one_device(setup, mesh_shape):
  model, batch, init_fn, loss_fn, ref_params, ref_out, ref_loss, ref_grads = setup
  mesh = sharding.create_mesh(mesh_shape)
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  params, param_sh = sharding.init_sharded(init_fn, mesh, rules, jax.random.PRNGKey(0))
  # Sharded init writes the same values as the single-device init.
  assert _max_abs(params, ref_params) == 0.0
  # Parameters really are split where the mesh has more than one device on an axis.
  kernel = params["bert"]["encoder"]["layer_0"]["intermediate"]["dense"]["kernel"]
  assert kernel.sharding.spec == PartitionSpec("fsdp", "model")
  n_shards = mesh.shape["fsdp"] * mesh.shape["model"]
  assert kernel.addressable_shards[0].data.size == kernel.size // n_shards

  batch_sh = sharding.batch_sharding(mesh)
  sharded_batch = jax.device_put(batch, batch_sh)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    forward = jax.jit(lambda p, b: model.apply({"params": p}, b["input_ids"], b["input_mask"],
                                               b["segment_ids"], b["masked_lm_positions"]),
                      in_shardings=(param_sh, batch_sh))
    mlm, nsp = forward(params, sharded_batch)
    grad_fn = jax.jit(jax.value_and_grad(loss_fn), in_shardings=(param_sh, batch_sh),
                      out_shardings=(None, param_sh))
    loss, grads = grad_fn(params, sharded_batch)
  assert _max_abs((mlm, nsp), ref_out) <= 1e-5
  assert abs(float(loss) - float(ref_loss)) <= 1e-5
  assert _max_abs(grads, ref_grads) <= 1e-5


def test_every_parameter_has_a_partition_spec(setup):
  _, _, init_fn, _, _, _, _, _ = setup
  boxed = jax.eval_shape(init_fn, jax.random.PRNGKey(0))
  leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert len(leaves) == len(jax.tree.leaves(nn.unbox(boxed)))
  for leaf in leaves:
    assert isinstance(leaf, nn.LogicallyPartitioned), leaf
    assert len(leaf.names) == leaf.value.ndim
    assert all(name is not None for name in leaf.names)
  # Every logical name used has a rule (so nothing is silently replicated by omission).
  used = {name for leaf in leaves for name in leaf.names}
  assert used <= {name for name, _ in sharding.DEFAULT_LOGICAL_AXIS_RULES}


@pytest.mark.parametrize("stack_unrolled", [False, True])
def test_scanned_model_shards_the_stacked_layers(stack_unrolled):
  cfg = configuration.get_preset("test", scan_layers=True, stack_unrolled=stack_unrolled,
                                 remat_policy="dots")
  batch = helpers.random_pretraining_batch(np.random.RandomState(1), 8, 16, 3, cfg.vocab_size)
  model = heads.BertForPreTraining(cfg)
  init_fn = lambda rng: model.init(rng, batch["input_ids"], batch["input_mask"],
                                   batch["segment_ids"], batch["masked_lm_positions"])["params"]
  mesh = sharding.create_mesh((2, 2, 2))
  params, _ = sharding.init_sharded(init_fn, mesh, sharding.DEFAULT_LOGICAL_AXIS_RULES,
                                    jax.random.PRNGKey(0))
  kernel = params["bert"]["encoder"]["layer"]["intermediate"]["dense"]["kernel"]
  assert kernel.shape == (2, 64, 128)
  assert kernel.sharding.spec == PartitionSpec(None, "fsdp", "model")


def test_create_mesh_shapes_and_errors():
  assert dict(sharding.create_mesh((-1, 2, 1)).shape) == {"data": 4, "fsdp": 2, "model": 1}
  assert dict(sharding.create_mesh((1, 1, 1), jax.devices()[:1]).shape) == {
      "data": 1, "fsdp": 1, "model": 1}
  with pytest.raises(ValueError, match=r"uses 12 devices but 8 are available: a mesh must use "
                                       r"every device\. Write -1"):
    sharding.create_mesh((3, 2, 2))
  with pytest.raises(ValueError, match="at most one entry may be -1"):
    sharding.create_mesh((-1, -1, 2))
  with pytest.raises(ValueError, match="must have 3 entries"):
    sharding.create_mesh((8, 1))
  with pytest.raises(ValueError, match="not divisible by the 4 data-parallel shards"):
    sharding.check_batch_divisible(6, sharding.create_mesh((2, 2, 2)))


@pytest.mark.slow
def test_indivisible_dimension_is_replicated_with_a_warning(caplog):
  """BERT's 30522-word vocabulary on an 8-way model axis still loads (replicated there)."""
  cfg = configuration.get_preset("test", vocab_size=510)
  model = heads.BertForPreTraining(cfg)
  ids = jnp.zeros((8, 8), jnp.int32)
  init_fn = lambda rng: model.init(rng, ids, ids, ids, jnp.zeros((8, 2), jnp.int32))["params"]
  mesh = sharding.create_mesh((1, 1, 8))
  with caplog.at_level("WARNING"):
    params, _ = sharding.init_sharded(init_fn, mesh, sharding.DEFAULT_LOGICAL_AXIS_RULES,
                                      jax.random.PRNGKey(0))
  # (the size-1 fsdp axis stays in the spec; it splits nothing)
  assert params["bert"]["embeddings"]["word_embeddings"].sharding.spec == PartitionSpec(
      None, "fsdp")
  assert params["bert"]["encoder"]["layer_0"]["intermediate"]["dense"]["kernel"].sharding.spec == (
      PartitionSpec("fsdp", "model"))
  assert "word_embeddings: dimension 0 of size 510 is not divisible" in caplog.text


def test_mesh_and_rules_from_an_ml_collections_config():
  import ml_collections
  config = ml_collections.ConfigDict({"mesh_shape": (2, -1, 2),
                                      "logical_axis_rules": [["activation_batch", ["data", "fsdp"]],
                                                             ["mlp", "model"], ["embed", None]]})
  mesh, rules = sharding.mesh_from_config(config)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "model": 2}
  assert rules[0] == ("activation_batch", ("data", "fsdp")) and rules[2] == ("embed", None)
  mesh, rules = sharding.mesh_from_config(ml_collections.ConfigDict())
  assert dict(mesh.shape) == {"data": 8, "fsdp": 1, "model": 1}
  assert rules == sharding.DEFAULT_LOGICAL_AXIS_RULES


def test_rules_from_config_accepts_lists():
  rules = sharding.rules_from_config([["embed", ["fsdp", "model"]], ["mlp", None]])
  assert rules == (("embed", ("fsdp", "model")), ("mlp", None))
  assert sharding.rules_from_config(None) == sharding.DEFAULT_LOGICAL_AXIS_RULES
