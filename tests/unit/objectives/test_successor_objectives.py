"""The successors' pre-training objectives on data_prep's records of Shakespeare: masked-LM alone
(RoBERTa), masked-LM + sentence order (ALBERT), masked-LM + span boundary (SpanBERT).

Each loss equals a hand computation in numpy (the span boundary head's logits too); packed rows
give what their instances give unpacked; the jnp span boundaries are the numpy ones; a tiny run
of each trains, writes its metrics and resumes; records of the wrong sentence objective are
refused; the recipes in configs/pretrain.py build.
"""

import glob
import json
import os
import shutil
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

from bert_jax import objectives
from bert_jax.interop import convert
from bert_jax.data import packing
from bert_jax.model import configuration, modeling
from bert_jax.interop import checkpoints
from bert_jax.interop import hf as hf_io
from bert_jax.objectives import mlm_sbo
from bert_jax.runs import pretraining
from bert_jax.text import features, masking
from bert_jax.training import metrics
from bert_jax.training import step as step_lib
from data_prep import create_pretraining_data as cpd
from data_prep import demo_corpus, train_tokenizer
from tests import pretrain_helpers as ph

SEQ, PRED = 64, 10                   # unpacked rows
ROW_PRED, PER_ROW = 24, 3            # packed rows: the row's prediction budget, instance slots
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=128)
# Each objective's records: data_prep flags of its recipe (shortened rows, many short ones so
# that packed rows hold several instances).
RECORDS = {
    "sop": dict(objective="sop", masking_strategy="ngram", short_seq_prob=0.5),
    "span": dict(objective="none", sequence_mode="doc_sentences", masking_strategy="span",
                 short_seq_prob=0.5),
    "full_dynamic": dict(objective="none", sequence_mode="full_sentences", masking="dynamic",
                         short_seq_prob=0.0),
}
KIND = {"mlm": "span", "mlm_sop": "sop", "mlm_sbo": "span"}


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  """A 1,000-entry WordPiece vocabulary of the corpus (small, so tiny runs are quick) and the
  corpus; returns (vocab_file, vocab_size, corpus_path)."""
  corpus = tmp_path_factory.mktemp("corpus") / "plays.txt"
  corpus.write_text(demo_corpus.corpus_text(max_bytes=60_000), encoding="utf-8")
  vocab_file = train_tokenizer.train_wordpiece([str(corpus)], str(corpus.parent / "wp"),
                                               vocab_size=1000)
  with open(vocab_file, encoding="utf-8") as f:
    return vocab_file, sum(1 for _ in f), str(corpus)


@pytest.fixture(scope="module")
def records(tmp_path_factory, vocab):
  """`records(kind, packed=False)` → the glob of records data_prep wrote (once per kind)."""
  vocab_file, _, corpus = vocab
  written = {}

  def get(kind, packed=False):
    if (kind, packed) not in written:
      directory = tmp_path_factory.mktemp(kind + ("_packed" if packed else ""))
      flags = dict(RECORDS[kind], max_seq_length=SEQ, max_predictions_per_seq=PRED)
      flags.setdefault("masking", "static")
      if flags["masking"] == "static":
        flags["dupe_factor"] = 1
      if packed:
        flags.update(packing=True, max_sequences_per_row=PER_ROW,
                     max_predictions_per_seq=ROW_PRED)
      settings = cpd.make_settings(corpus, vocab_file, **flags)
      cpd.create_pretraining_data(settings, output_dir=str(directory), num_output_shards=2,
                                  num_workers=1, show_progress=False)
      written[kind, packed] = os.path.join(str(directory), "pretrain-*.tfrecord")
    return written[kind, packed]
  return get


def read(pattern, packed=False, rows=None):
  """The records as a batch: int32 (as the pipeline casts) and float32 arrays."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  spec = features.tf_feature_spec(SEQ, ROW_PRED if packed else PRED, features.STATIC,
                                  PER_ROW if packed else None)
  dataset = tf.data.TFRecordDataset(sorted(glob.glob(pattern))).batch(4096).map(
      lambda x: tf.io.parse_example(x, spec))
  parts = [{k: v.numpy() for k, v in batch.items()} for batch in dataset]
  out = {k: np.concatenate([p[k] for p in parts])[:rows] for k in parts[0]}
  return {k: v.astype(np.int32) if v.dtype == np.int64 else v for k, v in out.items()}


def tiny_config(objective_name, vocab_size):
  """A tiny model of the recipe's family: ALBERT (factorized, shared) for sentence order."""
  preset = "albert_base" if objective_name == "mlm_sop" else "test"
  return configuration.get_preset(preset, vocab_size=vocab_size, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, **TINY)


def init_params(objective, model, batch):
  return nn.unbox(model.init(jax.random.PRNGKey(0),
                             *(batch[k] for k in objective.input_names))["params"])


def cross_entropy(logits, labels):
  """Per-row -log softmax(logits)[label], in float64."""
  logits = np.asarray(logits, np.float64)
  picked = np.take_along_axis(logits, labels[..., None].astype(np.int64), -1)[..., 0]
  return scipy.special.logsumexp(logits, axis=-1) - picked


def hand_span_boundary_logits(cfg, params, batch):
  """SpanBERT's pair-target head in numpy: boundaries from `text.masking`, the outputs at
  them and the offset's embedding → (Linear, GELU, LayerNorm) × 2 → tied decoder + bias."""
  sequence = np.asarray(modeling.BertModel(cfg, add_pooling_layer=False).apply(
      {"params": params["bert"]}, batch["input_ids"], batch["input_mask"],
      batch["segment_ids"])["sequence_output"], np.float64)
  left, right, offset = masking.span_boundaries(batch["masked_lm_positions"],
                                                batch["masked_lm_weights"])
  head = jax.tree.map(lambda a: np.asarray(a, np.float64),
                      params["cls"]["pair_target_predictions"])
  rows = np.arange(len(sequence))[:, None]
  table = head["position_embeddings"]
  x = np.concatenate([sequence[rows, left], sequence[rows, right],
                      table[np.minimum(offset, len(table) - 1)]], -1)

  def layer(x, linear, norm):
    y = x @ linear["kernel"] + linear["bias"]
    y = 0.5 * y * (1 + scipy.special.erf(y / np.sqrt(2)))  # exact GELU ("gelu")
    mean, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
    return (y - mean) / np.sqrt(var + cfg.layer_norm_eps) * norm["scale"] + norm["bias"]

  mlp = head["mlp_layer_norm"]
  x = layer(layer(x, mlp["linear1"], mlp["layer_norm1"]), mlp["linear2"], mlp["layer_norm2"])
  words = np.asarray(params["bert"]["embeddings"]["word_embeddings"], np.float64)
  return x @ words.T + head["bias"]


# ------------------------------------------------------------------------------ the losses


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlm", "mlm_sop", "mlm_sbo"])
def test_loss_equals_hand_computation(records, vocab, name):
  batch = read(records(KIND[name]), rows=8)
  objective = objectives.get_objective(name, max_seq_length=SEQ, max_predictions_per_seq=PRED)
  cfg = tiny_config(name, vocab[1])
  model = objective.model(cfg)
  params = init_params(objective, model, batch)
  outputs = step_lib.apply_model(objective, model, params, batch, deterministic=True)
  loss, sums = objective.loss(outputs, batch, objective.denominators(batch))

  weights = batch["masked_lm_weights"].astype(np.float64)
  ids = batch["masked_lm_ids"]
  mlm_logits = outputs if name == "mlm" else outputs[0]
  mlm = np.sum(weights * cross_entropy(mlm_logits, ids)) / (weights.sum() + 1e-5)
  expected = {"mlm_loss": mlm}
  if name == "mlm_sop":
    labels = batch["next_sentence_labels"][:, 0]
    assert set(labels) == {0, 1}
    expected["sop_loss"] = np.mean(cross_entropy(outputs[1], labels))
    assert "sop_classifier" in params["cls"] and "seq_relationship" not in params["cls"]
  if name == "mlm_sbo":
    hand_logits = hand_span_boundary_logits(cfg, params, batch)
    real = weights > 0
    np.testing.assert_allclose(np.asarray(outputs[1])[real], hand_logits[real], rtol=0,
                               atol=2e-4)
    expected["sbo_loss"] = (np.sum(weights * cross_entropy(hand_logits, ids))
                            / (weights.sum() + 1e-5))
  if name == "mlm":
    assert set(params["cls"]) == {"predictions"} and "pooler" not in params["bert"]
  assert float(loss) == pytest.approx(sum(expected.values()), rel=1e-5)

  summary = objective.summarize(jax.device_get(sums))
  for key, value in expected.items():
    assert summary[key] == pytest.approx(value, rel=1e-4), key
  assert summary["loss"] == pytest.approx(sum(expected.values()), rel=1e-4)
  if name == "mlm_sop":
    swapped = float(np.mean(labels))
    assert summary["sop_majority_baseline"] == pytest.approx(max(swapped, 1 - swapped))
    assert 0 <= summary["sop_accuracy"] <= 1
  if name == "mlm_sbo":
    assert 0 <= summary["sbo_accuracy"] <= 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlm", "mlm_sop", "mlm_sbo"])
def test_packed_rows_equal_their_instances_unpacked(records, vocab, name):
  rows = read(records(KIND[name], packed=True), packed=True)
  # The rows of most instances first (rows of several instances, and rows of one).
  chosen = np.argsort(-rows["next_sentence_weights"].sum(1), kind="stable")[:8]
  rows = {k: v[chosen] for k, v in rows.items()}
  assert rows["next_sentence_weights"].sum(1).max() > 1
  instances, *_ = packing.unpack_rows(rows, ROW_PRED)
  unpacked_objective = objectives.get_objective(name, max_seq_length=SEQ,
                                                max_predictions_per_seq=ROW_PRED)
  packed_objective = objectives.get_objective(name, max_seq_length=SEQ,
                                              max_predictions_per_seq=ROW_PRED, packed=True,
                                              max_sequences_per_row=PER_ROW)
  model = packed_objective.model(tiny_config(name, vocab[1]))
  params = init_params(unpacked_objective, model, instances)

  def loss_fn(objective):
    def loss(p, batch):
      outputs = step_lib.apply_model(objective, model, p, batch, deterministic=True)
      return objective.loss(outputs, batch, objective.denominators(batch))
    return jax.jit(jax.value_and_grad(loss, has_aux=True))

  (ref_loss, ref_sums), ref_grads = loss_fn(unpacked_objective)(params, instances)
  (loss, sums), grads = loss_fn(packed_objective)(params, rows)
  assert abs(float(loss) - float(ref_loss)) <= 1e-5
  assert set(sums) == set(ref_sums)
  for key in sums:
    assert float(sums[key]) == pytest.approx(float(ref_sums[key]), rel=1e-5, abs=1e-5), key
  if name == "mlm_sop":
    assert float(sums["sop_count"]) == len(instances["input_ids"])  # instances, not slots
  assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(grads),
                                                            jax.tree.leaves(ref_grads))) <= 1e-5


@pytest.mark.slow
def test_span_boundaries_in_jnp_are_the_numpy_ones(records):
  for packed in (False, True):
    batch = read(records("span", packed=packed), packed=packed)
    positions, weights = batch["masked_lm_positions"], batch["masked_lm_weights"]
    expected = masking.span_boundaries(positions, weights)
    got = jax.jit(mlm_sbo.span_boundaries)(positions, weights)
    for e, g in zip(expected, got):
      np.testing.assert_array_equal(np.asarray(g), e)
    # [CLS] and [SEP] are never masked, so every boundary already lies in its own instance.
    sequence_ids = batch["sequence_ids"] if packed else batch["input_mask"]
    left, right = mlm_sbo.within_sequences(got[0], got[1], positions, sequence_ids)
    np.testing.assert_array_equal(np.asarray(left), expected[0])
    np.testing.assert_array_equal(np.asarray(right), expected[1])
    assert (expected[2][weights > 0] > 0).any()  # spans longer than one token are there

  # Random runs, any leading shape, and weight-0 slots in between.
  rng = np.random.default_rng(0)
  positions = np.sort(rng.choice(60, size=(3, 4, 12)), axis=-1) + 1
  weights = (rng.random((3, 4, 12)) < 0.8).astype(np.float32)
  for e, g in zip(masking.span_boundaries(positions, weights),
                  mlm_sbo.span_boundaries(jnp.asarray(positions), jnp.asarray(weights))):
    np.testing.assert_array_equal(np.asarray(g), e)

  # A run at the edge of its instance keeps its boundaries inside it: instance 1 is positions
  # 0-3, instance 2 is 4-7; run 2..3 would have its right boundary at 4, run 4..5 its left at 3.
  sequence_ids = jnp.asarray([[1, 1, 1, 1, 2, 2, 2, 2, 0, 0]])
  positions, weights = jnp.asarray([[2, 3, 4, 5]]), jnp.ones((1, 4))
  left, right, _ = mlm_sbo.span_boundaries(positions, weights)
  assert left.tolist() == [[1, 1, 1, 1]] and right.tolist() == [[6, 6, 6, 6]]  # one run
  left, right = mlm_sbo.within_sequences(left, right, positions, sequence_ids)
  assert left.tolist() == [[1, 1, 4, 4]] and right.tolist() == [[3, 3, 6, 6]]


# ------------------------------------------------------------------------ runs and recipes


def run_config(train_files, name, **overrides):
  config = ph.run_config(train_files, objective=name, **{
      "model.vocab_size": None, "data.max_seq_length": SEQ,  # vocab_size: from summary.json
      "data.max_predictions_per_seq": PRED, "train_until_step": 3, "total_steps": 12,
      # A checkpoint where each run stops only; one layer: the run, not the model, is tested.
      "checkpoint_every_steps": 1000, "eval_steps": 1, "log_every_steps": 1,
      **{f"model.{k}": v for k, v in TINY.items()}, "model.num_hidden_layers": 1,
      **overrides})
  if name == "mlm_sop":
    config.model.preset = "albert_base"
  return config


@pytest.mark.slow
@pytest.mark.parametrize("name,kind,packed", [("mlm", "full_dynamic", False),
                                              ("mlm_sop", "sop", False),
                                              ("mlm_sbo", "span", True)])
def test_tiny_run_trains_and_resumes(records, tmp_path, name, kind, packed):
  overrides = {"data.max_predictions_per_seq": ROW_PRED} if packed else {}
  workdir = str(tmp_path / name)
  first = pretraining.train_and_evaluate(run_config(records(kind, packed), name, **overrides),
                                         workdir)
  log = os.path.join(workdir, "metrics.jsonl")
  logged = len(metrics.read_jsonl(log))
  assert first["step"] == 3
  resumed = pretraining.train_and_evaluate(
      run_config(records(kind, packed), name, train_until_step=5, **overrides), workdir)
  assert resumed["step"] == 5
  rows = metrics.read_jsonl(log)
  # The second run went on from the first one's checkpoint at step 3.
  assert [r["step"] for r in rows[logged:] if "train/loss" in r] == [5]
  head = {"mlm": None, "mlm_sop": "sop", "mlm_sbo": "sbo"}[name]
  names = {"mlm_loss", "mlm_accuracy"} | ({f"{head}_loss", f"{head}_accuracy"} if head else set())
  if name == "mlm_sop":
    names.add("sop_majority_baseline")
  last = [r for r in rows if "train/loss" in r][-1]
  assert {f"train/{n}" for n in names} <= set(last)
  assert not any(k.startswith("train/nsp") for k in last)
  evaluated = [r for r in rows if "eval/mlm_loss" in r][-1]
  assert {f"eval/{n}" for n in names} <= set(evaluated)
  assert all(np.isfinite(r["train/loss"]) for r in rows if "train/loss" in r)
  if name == "mlm_sbo":  # exported as SpanBERT released its models: encoder and masked-LM head
    assert "pair_target_predictions" in checkpoints.load_any(workdir).params["cls"]
    exported = convert.convert(workdir, str(tmp_path / "hf"), "hf")
    stored = hf_io.read_hf_state(exported)
    assert stored and not any("pair_target" in k for k in stored)
    _, params = checkpoints.load_masked_lm(exported)
    _, trained = checkpoints.load_masked_lm(workdir)
    np.testing.assert_array_equal(
        params["cls"]["predictions"]["output_bias"], trained["cls"]["predictions"]["output_bias"])


def test_records_of_another_sentence_objective_are_refused(records, tmp_path):
  sop_files = records("sop")
  workdir = str(tmp_path / "refused")
  with pytest.raises(ValueError) as refused:
    pretraining.train_and_evaluate(run_config(sop_files, "mlm_nsp"), workdir)
  message = str(refused.value)
  assert "\n" not in message and "mlm_nsp" in message and "'sop'" in message
  assert "--config.objective=mlm_sop" in message and "--objective=nsp" in message
  assert not os.path.exists(workdir)  # refused before anything was written

  # The same records, said to be NSP pairs: mlm_sop refuses them.
  nsp_dir = tmp_path / "nsp"
  nsp_dir.mkdir()
  for path in glob.glob(sop_files):
    shutil.copy(path, nsp_dir)
  summary = json.loads(open(os.path.join(os.path.dirname(sop_files), "summary.json")).read())
  summary["sentence_objective"] = "nsp"
  (nsp_dir / "summary.json").write_text(json.dumps(summary))
  with pytest.raises(ValueError, match=r"--config.objective=mlm_nsp, or rewrite the records "
                                       r"with data_prep --objective=sop"):
    pretraining.train_and_evaluate(run_config(str(nsp_dir / "*.tfrecord"), "mlm_sop"), workdir)

  # Objectives that do not read the label take any records.
  files = glob.glob(sop_files)
  for name in ("mlm", "mlm_sbo"):
    pretraining.check_records_objective(run_config(sop_files, name), files)
  # Sentence order needs ALBERT's head: another family is refused in one line.
  with pytest.raises(ValueError, match="needs model_type 'albert'.*--config.objective=mlm"):
    objectives.get_objective("mlm_sop").model(configuration.get_preset("test"))


def pretrain_configs():
  sys.path.insert(0, os.path.join(ph.REPO, "configs"))
  try:
    import pretrain  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)
  return pretrain


RECIPES = {
    # objective, family, masking, batch, lr, steps, warmup, optimizer, b2, eps, dropout
    "roberta_base": ("mlm", "roberta", "token", 8192, 6e-4, 500_000, 24_000, "adamw", 0.98,
                     1e-6, 0.1),
    "albert_base": ("mlm_sop", "albert", "ngram", 4096, 0.00176, 125_000, 3125, "lamb", 0.999,
                    1e-6, 0.0),
    "albert_large": ("mlm_sop", "albert", "ngram", 4096, 0.00176, 125_000, 3125, "lamb", 0.999,
                     1e-6, 0.0),
    "spanbert_base": ("mlm_sbo", "bert", "span", 256, 1e-4, 2_400_000, 10_000, "adamw", 0.999,
                      1e-8, 0.1),
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(RECIPES))
def test_recipes_build(variant):
  (objective, family, strategy, batch, lr, steps, warmup, opt, b2, eps,
   dropout) = RECIPES[variant]
  config = pretrain_configs().get_config(variant)
  assert (config.objective, config.data.masking_strategy, config.global_batch_size,
          config.total_steps, config.train_until_step, config.data.max_seq_length) == (
              objective, strategy, batch, steps, steps, 512)
  o = config.optimizer
  assert (o.name, o.learning_rate, o.warmup_steps, o.b2, o.eps, o.weight_decay) == (
      opt, lr, warmup, b2, eps, 0.01)
  assert config.model.hidden_dropout_prob == config.model.attention_probs_dropout_prob == dropout
  full = pretraining.bert_config_from(config)
  assert full.model_type == family and full.num_hidden_layers in (12, 24)

  # The same recipe, shrunk, builds its train step (lowered, not compiled).
  config.model.update(vocab_size=512, dtype="float32", **TINY)
  config.global_batch_size = 16
  config.data.max_seq_length, config.data.max_predictions_per_seq = SEQ, PRED
  out = pretraining.compile_train_step(config, compile_step=False)
  heads_scope = out["state_shardings"].params["cls"]
  expected = {"mlm": {"predictions"}, "mlm_sop": {"predictions", "sop_classifier"},
              "mlm_sbo": {"predictions", "pair_target_predictions"}}[objective]
  assert set(heads_scope) == expected
  assert out["analytic_flops_per_step"] > 0
