"""Packed rows on the model side (Krell et al. 2021): several `[CLS] A [SEP] B [SEP]` instances
in one row give, per instance, what each gives alone in a row of its own — MLM and NSP logits,
the losses and the parameter gradients — on one device and on meshes of 8 fake devices; every
attention kernel confines attention to each instance; the unpacked path is what it was.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from bert_jax import objectives
from bert_jax.model import configuration, heads, modeling
from bert_jax.model import dropout as dropout_lib
from bert_jax.objectives import mlm_nsp
from bert_jax.parallel import sharding
from bert_jax.text import features
from bert_jax.training import step as step_lib
from tests import helpers

CLS_ID, SEP_ID = 101, 102
NUM_INSTANCES = 16
UNPACKED_LENGTH, UNPACKED_PREDICTIONS = 32, 4
PACKED_LENGTH, PACKED_PREDICTIONS, SEQUENCES_PER_ROW = 64, 12, 3
# Which instances share a row: full rows, rows with unused slots, a row of one.
ROWS = [[0, 1, 2], [3, 4], [5], [6, 7, 8], [9, 10], [11, 12, 13], [14], [15]]
TOLERANCE = 1e-5


def _max_abs(a, b):
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _random_instances(rng, vocab_size):
  """Instances of different lengths: tokens, segment ids, masked predictions, NSP label."""
  instances = []
  for _ in range(NUM_INSTANCES):
    length = rng.randint(6, PACKED_LENGTH // SEQUENCES_PER_ROW + 1)  # 3 always fit in a row
    len_a = rng.randint(1, length - 3)
    len_b = length - 3 - len_a
    tokens = np.concatenate([[CLS_ID], rng.randint(5, vocab_size, len_a), [SEP_ID],
                             rng.randint(5, vocab_size, len_b), [SEP_ID]])
    segments = np.array([0] * (len_a + 2) + [1] * (len_b + 1))
    maskable = [i for i in range(length) if tokens[i] not in (CLS_ID, SEP_ID)]
    k = rng.randint(1, min(UNPACKED_PREDICTIONS, len(maskable)) + 1)
    positions = np.sort(rng.choice(maskable, size=k, replace=False))
    instances.append(dict(tokens=tokens, segments=segments, positions=positions,
                          ids=rng.randint(5, vocab_size, k), label=rng.randint(0, 2)))
  return instances


def _unpacked_batch(instances):
  """One instance per row, in the original record layout."""
  n = len(instances)
  b = {name: np.zeros((n, UNPACKED_LENGTH), np.int32)
       for name in (features.INPUT_IDS, features.INPUT_MASK, features.SEGMENT_IDS)}
  for name in (features.MASKED_LM_POSITIONS, features.MASKED_LM_IDS):
    b[name] = np.zeros((n, UNPACKED_PREDICTIONS), np.int32)
  b[features.MASKED_LM_WEIGHTS] = np.zeros((n, UNPACKED_PREDICTIONS), np.float32)
  b[features.NEXT_SENTENCE_LABELS] = np.zeros((n, 1), np.int32)
  for i, inst in enumerate(instances):
    length, k = len(inst["tokens"]), len(inst["positions"])
    b[features.INPUT_IDS][i, :length] = inst["tokens"]
    b[features.INPUT_MASK][i, :length] = 1
    b[features.SEGMENT_IDS][i, :length] = inst["segments"]
    b[features.MASKED_LM_POSITIONS][i, :k] = inst["positions"]
    b[features.MASKED_LM_IDS][i, :k] = inst["ids"]
    b[features.MASKED_LM_WEIGHTS][i, :k] = 1.0
    b[features.NEXT_SENTENCE_LABELS][i, 0] = inst["label"]
  return b


def _packed_batch(instances):
  """The same instances packed by hand into `ROWS`: concatenated, positions restarting at 0,
  sequence ids 1..k, each [CLS] position recorded, masked positions shifted by the offset.
  Also returns where each instance went: (row, slot, offset, first prediction slot)."""
  rows = len(ROWS)
  b = {name: np.zeros((rows, PACKED_LENGTH), np.int32)
       for name in (features.INPUT_IDS, features.INPUT_MASK, features.SEGMENT_IDS,
                    features.POSITION_IDS, features.SEQUENCE_IDS)}
  for name in (features.MASKED_LM_POSITIONS, features.MASKED_LM_IDS):
    b[name] = np.zeros((rows, PACKED_PREDICTIONS), np.int32)
  b[features.MASKED_LM_WEIGHTS] = np.zeros((rows, PACKED_PREDICTIONS), np.float32)
  for name in (features.CLS_POSITIONS, features.NEXT_SENTENCE_LABELS):
    b[name] = np.zeros((rows, SEQUENCES_PER_ROW), np.int32)
  b[features.NEXT_SENTENCE_WEIGHTS] = np.zeros((rows, SEQUENCES_PER_ROW), np.float32)
  where = {}
  for r, members in enumerate(ROWS):
    offset = prediction = 0
    for slot, i in enumerate(members):
      inst = instances[i]
      length, k = len(inst["tokens"]), len(inst["positions"])
      span = slice(offset, offset + length)
      b[features.INPUT_IDS][r, span] = inst["tokens"]
      b[features.INPUT_MASK][r, span] = 1
      b[features.SEGMENT_IDS][r, span] = inst["segments"]
      b[features.POSITION_IDS][r, span] = np.arange(length)
      b[features.SEQUENCE_IDS][r, span] = slot + 1
      predictions = slice(prediction, prediction + k)
      b[features.MASKED_LM_POSITIONS][r, predictions] = inst["positions"] + offset
      b[features.MASKED_LM_IDS][r, predictions] = inst["ids"]
      b[features.MASKED_LM_WEIGHTS][r, predictions] = 1.0
      b[features.CLS_POSITIONS][r, slot] = offset
      b[features.NEXT_SENTENCE_LABELS][r, slot] = inst["label"]
      b[features.NEXT_SENTENCE_WEIGHTS][r, slot] = 1.0
      where[i] = (r, slot, offset, prediction)
      offset += length
      prediction += k
    assert offset <= PACKED_LENGTH and prediction <= PACKED_PREDICTIONS
  return b, where


UNPACKED = mlm_nsp.MaskedLmNextSentence(UNPACKED_LENGTH, UNPACKED_PREDICTIONS)
PACKED = objectives.get_objective("mlm_nsp", max_seq_length=PACKED_LENGTH,
                                  max_predictions_per_seq=PACKED_PREDICTIONS, packed=True,
                                  max_sequences_per_row=SEQUENCES_PER_ROW)


@pytest.fixture(scope="module")
def setup():
  cfg = configuration.get_preset("test", hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0)
  instances = _random_instances(np.random.RandomState(0), cfg.vocab_size)
  unpacked = _unpacked_batch(instances)
  packed, where = _packed_batch(instances)
  model = PACKED.model(cfg)
  params = nn.unbox(model.init(jax.random.PRNGKey(0),
                               *(unpacked[k] for k in UNPACKED.input_names))["params"])

  def loss_fn(objective):
    def loss(p, batch):
      outputs = step_lib.apply_model(objective, model, p, batch, deterministic=True)
      return mlm_nsp.pretraining_loss(*outputs, batch)
    return loss

  single = jax.devices()[0]
  params = jax.device_put(params, single)
  reference = jax.jit(jax.value_and_grad(loss_fn(UNPACKED), has_aux=True))(
      params, jax.device_put(unpacked, single))
  outputs = jax.jit(lambda p, b: step_lib.apply_model(UNPACKED, model, p, b,
                                                      deterministic=True))(params, unpacked)
  return dict(cfg=cfg, instances=instances, unpacked=unpacked, packed=packed, where=where,
              model=model, params=params, loss_fn=loss_fn, reference=reference,
              reference_outputs=outputs)


def _assert_same_per_instance(setup, mlm, nsp):
  """Each instance's MLM logits and NSP logits, packed, equal its own unpacked ones."""
  ref_mlm, ref_nsp = setup["reference_outputs"]
  assert nsp.shape == (len(ROWS), SEQUENCES_PER_ROW, 2)
  for i, inst in enumerate(setup["instances"]):
    row, slot, _, first = setup["where"][i]
    k = len(inst["positions"])
    np.testing.assert_allclose(mlm[row, first:first + k], ref_mlm[i, :k], rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(nsp[row, slot], ref_nsp[i], rtol=0, atol=TOLERANCE)


def _assert_same_loss_and_gradients(setup, value, grads):
  (ref_loss, ref_metrics), ref_grads = setup["reference"]
  loss, metrics = value
  assert abs(float(loss) - float(ref_loss)) <= TOLERANCE
  for name in ("mlm_loss", "nsp_loss", "mlm_correct_sum", "mlm_weight_sum", "nsp_correct_sum",
               "nsp_count", "nsp_random_next_sum"):
    assert abs(float(metrics[name]) - float(ref_metrics[name])) <= TOLERANCE, name
  assert float(metrics["nsp_count"]) == NUM_INSTANCES  # real instances, not slots
  assert jax.tree.structure(grads) == jax.tree.structure(ref_grads)
  assert _max_abs(grads, ref_grads) <= TOLERANCE


@pytest.mark.slow
def test_packed_rows_equal_unpacked_instances_on_one_device(setup):
  model, params, packed = setup["model"], setup["params"], setup["packed"]
  mlm, nsp = jax.jit(lambda p, b: step_lib.apply_model(PACKED, model, p, b,
                                                       deterministic=True))(params, packed)
  _assert_same_per_instance(setup, np.asarray(mlm), np.asarray(nsp))
  value, grads = jax.jit(jax.value_and_grad(setup["loss_fn"](PACKED), has_aux=True))(
      params, packed)
  _assert_same_loss_and_gradients(setup, value, grads)

  # Every token's hidden state, not only the predicted ones.
  encoder = modeling.BertModel(setup["cfg"])
  unpacked = setup["unpacked"]
  ref = encoder.apply({"params": params["bert"]}, unpacked["input_ids"], unpacked["input_mask"],
                      unpacked["segment_ids"])["sequence_output"]
  out = encoder.apply({"params": params["bert"]}, packed["input_ids"], packed["input_mask"],
                      packed["segment_ids"], packed["position_ids"],
                      sequence_ids=packed["sequence_ids"],
                      cls_positions=packed["cls_positions"])
  assert out["pooled_output"].shape == (len(ROWS), SEQUENCES_PER_ROW, setup["cfg"].hidden_size)
  for i, inst in enumerate(setup["instances"]):
    row, _, offset, _ = setup["where"][i]
    length = len(inst["tokens"])
    np.testing.assert_allclose(out["sequence_output"][row, offset:offset + length],
                               ref[i, :length], rtol=0, atol=TOLERANCE)


def test_without_sequence_ids_or_restarted_positions_instances_contaminate(setup):
  """The control: the proof above fails when packing is not honoured."""
  model, params, packed = setup["model"], setup["params"], setup["packed"]
  ref_mlm, _ = setup["reference_outputs"]
  i = ROWS[0][1]  # second instance of a full row
  row, _, _, first = setup["where"][i]
  k = len(setup["instances"][i]["positions"])
  for broken in ({features.SEQUENCE_IDS: packed[features.INPUT_MASK]},
                 {features.POSITION_IDS: np.broadcast_to(np.arange(PACKED_LENGTH),
                                                         (len(ROWS), PACKED_LENGTH))}):
    mlm, _ = step_lib.apply_model(PACKED, model, params, dict(packed, **broken),
                                  deterministic=True)
    assert float(jnp.max(jnp.abs(mlm[row, first:first + k] - ref_mlm[i, :k]))) > 1e-3


def test_scanned_rematerialised_layers_carry_the_packing(setup):
  """`nn.scan` broadcasts the sequence ids to every layer, `nn.remat` keeps them."""
  cfg = setup["cfg"].replace(scan_layers=True, remat_policy="dots")
  model = PACKED.model(cfg)
  params = modeling.stack_layers(setup["params"], cfg.num_hidden_layers)
  mlm, nsp = jax.jit(lambda p, b: step_lib.apply_model(PACKED, model, p, b,
                                                       deterministic=True))(params, setup["packed"])
  _assert_same_per_instance(setup, np.asarray(mlm), np.asarray(nsp))


@pytest.mark.mesh
@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (2, 2, 2)])
def test_packed_rows_equal_unpacked_instances_on_a_mesh(setup, mesh_shape):
  model, packed = setup["model"], setup["packed"]
  mesh = sharding.create_mesh(mesh_shape)
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  init_fn = lambda rng: model.init(rng, *(packed[k] for k in PACKED.input_names))["params"]
  params, param_sh = sharding.init_sharded(init_fn, mesh, rules, jax.random.PRNGKey(0))
  assert _max_abs(params, setup["params"]) == 0.0
  batch_sh = sharding.batch_sharding(mesh)
  sharded_batch = jax.device_put(packed, batch_sh)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    forward = jax.jit(lambda p, b: step_lib.apply_model(PACKED, model, p, b, deterministic=True),
                      in_shardings=(param_sh, batch_sh))
    mlm, nsp = forward(params, sharded_batch)
    grad_fn = jax.jit(jax.value_and_grad(setup["loss_fn"](PACKED), has_aux=True),
                      in_shardings=(param_sh, batch_sh), out_shardings=(None, param_sh))
    value, grads = grad_fn(params, sharded_batch)
  _assert_same_per_instance(setup, np.asarray(mlm), np.asarray(nsp))
  _assert_same_loss_and_gradients(setup, value, grads)


# --------------------------------------------------------------------------- attention kernels
def _attention_inputs(seed=0, batch=2, length=128, heads=2, head_dim=64):
  """Random q/k/v and two rows: three instances + padding, and one instance + padding."""
  q, k, v = (jax.random.normal(key, (batch, length, heads, head_dim), jnp.float32)
             for key in jax.random.split(jax.random.PRNGKey(seed), 3))
  sequence_ids = np.zeros((batch, length), np.int32)
  sequence_ids[0, :40], sequence_ids[0, 40:90], sequence_ids[0, 90:110] = 1, 2, 3
  sequence_ids[1:, :100] = 1  # the other rows: one instance
  input_mask = (sequence_ids > 0).astype(np.int32)
  return q, k, v, input_mask, sequence_ids


def _attention(q, k, v, input_mask, sequence_ids=None, implementation=None, dropout_rate=0.0,
               dropout_rng=None):
  return modeling.dot_product_attention(
      q, k, v, input_mask, dropout_rate=dropout_rate, dropout_rng=dropout_rng,
      deterministic=dropout_rate == 0.0, implementation=implementation,
      sequence_ids=sequence_ids)


def _real(x, input_mask):
  """Outputs at real query positions only: padding rows are defined by no kernel alike."""
  return jnp.where(input_mask[:, :, None, None] > 0, x, 0.0)


@pytest.mark.slow
def test_pallas_flash_attention_equals_xla_with_sequence_ids_and_padding():
  q, k, v, input_mask, sequence_ids = _attention_inputs()
  cotangent = jax.random.normal(jax.random.PRNGKey(9), q.shape)
  for ids in (sequence_ids, None):  # packed, and plain padding
    def loss(q, k, v, implementation, ids=ids):
      out = _attention(q, k, v, input_mask, ids, implementation)
      return jnp.sum(_real(out, input_mask) * cotangent), out
    with pltpu.force_tpu_interpret_mode():
      (_, pallas), pallas_grads = jax.jit(
          jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True),
          static_argnums=3)(q, k, v, "pallas")
    (_, xla), xla_grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True),
                                  static_argnums=3)(q, k, v, "xla")
    assert _max_abs(_real(pallas, input_mask), _real(xla, input_mask)) <= TOLERANCE
    assert _max_abs(pallas_grads, xla_grads) <= TOLERANCE
  # The comparison can fail: attention across instances is another answer.
  assert _max_abs(_real(_attention(q, k, v, input_mask, None, "xla"), input_mask),
                  _real(_attention(q, k, v, input_mask, sequence_ids, "xla"), input_mask)) > 0.1


@pytest.mark.slow
def test_pallas_model_equals_xla_model_on_packed_rows():
  cfg = configuration.get_preset("test", hidden_size=128, num_attention_heads=2,
                                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  assert cfg.head_dim == 64
  objective = mlm_nsp.MaskedLmNextSentence(128, 8, packed=True, max_sequences_per_row=3)
  _, _, _, input_mask, sequence_ids = _attention_inputs()
  rng = np.random.RandomState(1)
  batch = objective.example_batch(2)
  batch.update(input_ids=np.where(input_mask > 0, rng.randint(5, cfg.vocab_size, (2, 128)), 0),
               input_mask=input_mask, sequence_ids=sequence_ids,
               segment_ids=rng.randint(0, 2, (2, 128)) * input_mask)
  starts = np.array([[0] * 40 + [40] * 50 + [90] * 38, [0] * 128])  # each instance's offset
  batch["position_ids"] = np.where(input_mask > 0, np.arange(128) - starts, 0).astype(np.int32)
  batch["cls_positions"] = np.array([[0, 40, 90], [0, 0, 0]], np.int32)
  batch["masked_lm_positions"] = rng.randint(0, 100, (2, 8)).astype(np.int32)
  xla_model = heads.BertForPreTraining(cfg.replace(attention_implementation="xla"))
  params = xla_model.init(jax.random.PRNGKey(0), *(batch[n] for n in objective.input_names))
  xla = xla_model.apply(params, *(batch[n] for n in objective.input_names))
  with pltpu.force_tpu_interpret_mode():
    pallas = jax.jit(heads.BertForPreTraining(cfg.replace(attention_implementation="pallas")).apply)(
        params, *(batch[n] for n in objective.input_names))
  assert _max_abs(pallas, xla) <= TOLERANCE


@pytest.mark.mesh
def test_pallas_attention_under_a_mesh_runs_per_device():
  """Under a mesh the kernel runs in `shard_map` on each device's rows and heads. Numbers on a
  one-device mesh (the interpreter can stall when several fake CPU devices run kernels at
  once); the split itself on (2, 2, 2), traced."""
  q, k, v, input_mask, sequence_ids = _attention_inputs(batch=4, heads=2)
  cotangent = jax.random.normal(jax.random.PRNGKey(9), q.shape)

  def loss(q, k, v, implementation):
    out = _attention(q, k, v, input_mask, sequence_ids, implementation)
    return jnp.sum(_real(out, input_mask) * cotangent), out
  grad_fn = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
  (_, xla), xla_grads = jax.jit(grad_fn, static_argnums=3)(q, k, v, "xla")
  rules = sharding.DEFAULT_LOGICAL_AXIS_RULES
  one_device = sharding.create_mesh((1, 1, 1), jax.devices()[:1])
  with jax.set_mesh(one_device), nn.logical_axis_rules(rules), pltpu.force_tpu_interpret_mode():
    (_, out), grads = jax.jit(grad_fn, static_argnums=3)(q, k, v, "pallas")
  assert _max_abs(_real(out, input_mask), _real(xla, input_mask)) <= TOLERANCE
  assert _max_abs(grads, xla_grads) <= TOLERANCE
  with jax.set_mesh(sharding.create_mesh((2, 2, 2))), nn.logical_axis_rules(rules), \
       pltpu.force_tpu_interpret_mode():
    jaxpr = jax.make_jaxpr(lambda q, k, v: _attention(q, k, v, input_mask, sequence_ids,
                                                      "pallas"))(q, k, v)
  mapped = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "shard_map"]
  assert len(mapped) == 1
  spec = jax.sharding.PartitionSpec(("data", "fsdp"), None, "model", None)
  assert tuple(mapped[0].params["in_specs"][:3]) == (spec,) * 3
  assert mapped[0].params["out_specs"] == (spec,)


def test_pallas_refuses_a_length_its_blocks_do_not_tile():
  q, k, v, input_mask, sequence_ids = _attention_inputs(length=96)
  with pytest.raises(ValueError, match="multiple of 128"):
    _attention(q, k, v, input_mask, sequence_ids, "pallas")


def test_explicit_path_equals_xla_with_sequence_ids():
  q, k, v, input_mask, sequence_ids = _attention_inputs(length=48, head_dim=8)
  sequence_ids[0, 40:] = 0
  input_mask = (sequence_ids > 0).astype(np.int32)
  explicit = modeling._explicit_attention(  # pylint: disable=protected-access
      q, k, v, modeling.attention_mask(input_mask, sequence_ids), 0.0, jax.random.PRNGKey(0))
  xla = _attention(q, k, v, input_mask, sequence_ids, "xla")
  assert _max_abs(_real(explicit, input_mask), _real(xla, input_mask)) <= TOLERANCE


def test_attention_with_dropout_stays_inside_each_instance():
  """The paper's recipe (probability dropout, explicit path): changing one instance's keys and
  values changes nothing of another instance's outputs in the same row."""
  q, k, v, input_mask, sequence_ids = _attention_inputs(length=48, head_dim=8)
  other = sequence_ids == 2
  k2 = jnp.where(other[:, :, None, None], k + 1.0, k)
  v2 = jnp.where(other[:, :, None, None], v * 3.0, v)
  rng = jax.random.PRNGKey(5)
  a = _attention(q, k, v, input_mask, sequence_ids, dropout_rate=0.1, dropout_rng=rng)
  b = _attention(q, k2, v2, input_mask, sequence_ids, dropout_rate=0.1, dropout_rng=rng)
  first = (sequence_ids == 1)[:, :, None, None]
  assert float(jnp.max(jnp.abs(jnp.where(first, a - b, 0.0)))) == 0.0
  assert float(jnp.max(jnp.abs(jnp.where(other[:, :, None, None], a - b, 0.0)))) > 0.1


# ------------------------------------------------------------------------ the unpacked path
def test_unpacked_attention_is_unchanged():
  q, k, v, input_mask, _ = _attention_inputs(length=48, head_dim=8)
  key_mask = input_mask[:, None, None, :].astype(bool)
  fused = jax.nn.dot_product_attention(q, k, v, mask=key_mask, implementation="xla")
  np.testing.assert_array_equal(_attention(q, k, v, input_mask, implementation="xla"), fused)
  # None on the CPU: the explicit softmax (faster there), the same numbers to float32 rounding.
  default = _attention(q, k, v, input_mask)
  np.testing.assert_allclose(default, fused, atol=1e-6, rtol=1e-5)
  logits = jnp.einsum("btnd,bsnd->bnts", q, k, preferred_element_type=jnp.float32) / np.sqrt(8)
  np.testing.assert_array_equal(default, jnp.einsum(
      "bnts,bsnd->btnd", jax.nn.softmax(jnp.where(key_mask, logits, -1e9), axis=-1), v))
  # Probability dropout: the formula the explicit path has always computed.
  rng = jax.random.PRNGKey(3)
  logits = jnp.einsum("btnd,bsnd->bnts", q, k, preferred_element_type=jnp.float32) / np.sqrt(8)
  probs = jax.nn.softmax(jnp.where(key_mask, logits, -1e9), axis=-1)
  # (The mask is drawn with 16 bits per decision: keep where the draw is >= round(0.1 * 2^16).)
  keep, keep_prob = dropout_lib.keep_mask(rng, probs.shape, 0.1, 16)
  assert keep_prob == 1 - 6554 / 65536
  expected = jnp.einsum("bnts,bsnd->btnd", jnp.where(keep, probs * (1 / keep_prob), 0.0), v)
  np.testing.assert_array_equal(
      _attention(q, k, v, input_mask, dropout_rate=0.1, dropout_rng=rng), expected)


@pytest.mark.slow
@pytest.mark.parametrize("dropout", [False, True])
def test_unpacked_pretraining_matches_the_stored_expectation(dropout):
  """Loss and NSP logits as computed before packing existed (same batch, init and rng)."""
  expected = {
      False: (6.957367420196533, [[-0.03615191951394081, 0.005760869011282921],
                                  [-0.0046976529993116856, -0.014071084558963776],
                                  [-0.024009212851524353, -0.014791150577366352],
                                  [-0.007037760224193335, 0.0022688983008265495]]),
      # Dropout's masks as `model/dropout.py` draws them (16-bit decisions; until 2026-11-26
      # flax's Dropout drew them, with other masks and so other numbers: loss 6.96387).
      True: (6.9395623207092285, [[-0.045271191745996475, 0.000253182603046298],
                                  [-0.013209620490670204, -0.004132484085857868],
                                  [-0.02373817190527916, -0.014368947595357895],
                                  [-0.001095145009458065, 0.0035936261992901564]]),
  }[dropout]
  cfg = configuration.get_preset("test")
  batch = helpers.random_pretraining_batch(np.random.RandomState(0), 4, 32, 5, cfg.vocab_size)
  model = heads.BertForPreTraining(cfg)
  inputs = [batch[n] for n in UNPACKED.input_names]
  params = nn.unbox(model.init(jax.random.PRNGKey(0), *inputs)["params"])
  mlm, nsp = jax.jit(lambda p: model.apply({"params": p}, *inputs, deterministic=not dropout,
                                           rngs={"dropout": jax.random.PRNGKey(3)}))(params)
  loss, _ = mlm_nsp.pretraining_loss(mlm, nsp, batch)
  assert abs(float(loss) - expected[0]) <= 1e-5
  np.testing.assert_allclose(nsp, expected[1], rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------ the objective
def test_packed_objective_layout_and_counts():
  assert PACKED.packed and PACKED.max_sequences_per_row == SEQUENCES_PER_ROW
  assert PACKED.input_names == UNPACKED.input_names + (
      features.POSITION_IDS, features.SEQUENCE_IDS, features.CLS_POSITIONS)
  spec = PACKED.batch_spec(8)
  for name in (features.INPUT_IDS, features.POSITION_IDS, features.SEQUENCE_IDS):
    assert spec[name].shape == (8, PACKED_LENGTH) and spec[name].dtype == np.int32
  assert spec[features.MASKED_LM_POSITIONS].shape == (8, PACKED_PREDICTIONS)
  for name in (features.CLS_POSITIONS, features.NEXT_SENTENCE_LABELS):
    assert spec[name].shape == (8, SEQUENCES_PER_ROW) and spec[name].dtype == np.int32
  assert spec[features.NEXT_SENTENCE_WEIGHTS].dtype == np.float32
  assert set(PACKED.example_batch(8)) == set(spec)
  # Unpacked layout: the record schema, as before.
  assert UNPACKED.batch_spec(8) == mlm_nsp.batch_spec_from_schema(
      features.pretraining_features(UNPACKED_LENGTH, UNPACKED_PREDICTIONS), 8)
  packed, _ = _packed_batch(_random_instances(np.random.RandomState(0), 512))
  assert float(PACKED.denominators(packed)["nsp"]) == NUM_INSTANCES
  # NSP (pooler + classifier) is counted per instance slot.
  cfg = configuration.get_preset("test")
  h = cfg.hidden_size
  one_per_row = mlm_nsp.MaskedLmNextSentence(PACKED_LENGTH, PACKED_PREDICTIONS)
  extra = PACKED.flops_per_step(cfg, 8) - one_per_row.flops_per_step(cfg, 8)
  assert extra == pytest.approx(3 * 8 * (SEQUENCES_PER_ROW - 1) * (2 * h * h + 4 * h))


def test_attention_kernel_is_named_and_checked():
  cfg = configuration.get_preset("test")
  assert "dropout p=0.1" in modeling.attention_kernel_description(cfg)
  fast = cfg.replace(attention_probs_dropout_prob=0.0, attention_implementation="pallas")
  assert modeling.attention_kernel_description(fast) == (
      "attention: Pallas TPU flash attention (segment ids)")
  # cuDNN's masks do not resume exactly, and the run's first lines say so.
  cudnn = cfg.replace(attention_implementation="cudnn")
  assert "a resumed run draws other attention masks" in (
      modeling.attention_kernel_description(cudnn))
  assert "resumed" not in modeling.attention_kernel_description(
      cudnn.replace(attention_probs_dropout_prob=0.0))
  with pytest.raises(ValueError, match="attention_implementation='flash'"):
    cfg.replace(attention_implementation="flash")
