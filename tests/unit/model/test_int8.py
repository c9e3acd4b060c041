"""Int8 inference (`BertConfig.quantization="int8"`, `model/int8.py`): the quantized kernels stand
for the float ones within half a scale step; an int8 dense layer equals the float one within the
bound its scales give; the embedding tables' rows within half a row step, and the int8 tied
decoder within its bound; every model's int8 parameters are its float parameters quantized
(what the int8 model builds and what `quantize_params` writes agree); fill-mask and ELECTRA in
int8 track float32; the packaged MiniLM's int8 classifier tracks its float32 logits on real
sentences; `predict --int8` and the int8 export of `convert` serve a fine-tuned classifier
alike, the export ~4x smaller in kernel bytes; and the refusals are one line each.
"""

import json
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.interop import checkpoints
from bert_jax.interop.names import flatten_params
from bert_jax.model import configuration, electra, heads, int8, modeling
from bert_jax.tasks import pipeline
from bert_jax.text import pairs, tokenization
from bert_jax.training import step as step_lib
from data_prep import demo_corpus
from tests import helpers
from tests.task_helpers import NEGATIVE, POSITIVE

SST = POSITIVE + NEGATIVE  # the 16 sentences the `sst2_model` fixture memorised (1 = positive)


def _tiny(**overrides):
  return configuration.get_preset("test", hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0, **overrides)


@pytest.fixture(scope="module")
def minilm():
  """The packaged all-MiniLM-L6-v2 (real weights), read by the checkpoint loaders: (config
  without dropout, params with `bert/...`)."""
  loaded = checkpoints.load_any(helpers.minilm_dir())
  return (loaded.config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
          loaded.params)


def _dense_layers(params, prefix=""):
  """{path: layer} of every dict holding a `kernel` and a `bias`."""
  out = {}
  for k, v in params.items():
    if isinstance(v, dict):
      if "kernel" in v and "bias" in v:
        out[prefix + k] = v
      out.update(_dense_layers(v, f"{prefix}{k}/"))
  return out


def _at(tree, path):
  for key in path.split("/"):
    tree = tree[key]
  return tree


# ----------------------------------------------------------------------------- the numerics
def test_quantized_kernels_stand_for_the_float_ones_within_half_a_step(minilm):
  config, params = minilm
  quantized = int8.quantize_params(params, config)
  back = int8.dequantize_params(quantized)
  float_layers, int8_layers = _dense_layers(params), _dense_layers(quantized)
  # Every dense layer of the encoder is int8 (6 layers × 6 matrices + the pooler).
  assert sum(int8.SCALE in layer for layer in int8_layers.values()) == 6 * 6 + 1
  for path, layer in int8_layers.items():
    w = np.asarray(float_layers[path]["kernel"])
    q, scale = np.asarray(layer["kernel"]), np.asarray(layer[int8.SCALE])
    assert q.dtype == np.int8 and scale.shape == (w.shape[-1],), path
    # Per output channel: the largest |w| of each column is ±127 steps exactly.
    assert np.all(np.abs(q).max(axis=0) == 127), path
    np.testing.assert_allclose(scale, np.abs(w).max(axis=0) / 127, rtol=1e-6)
    error = np.abs(np.asarray(_at(back, path)["kernel"]) - w)
    assert np.all(error <= scale / 2 * (1 + 1e-5) + 1e-9), path
    assert error.max() > scale.min() / 8  # really rounded
    np.testing.assert_array_equal(layer["bias"], float_layers[path]["bias"])  # biases float
  # LayerNorms are untouched; the kernel bytes are ~4x fewer.
  for leaf, original in zip(jax.tree.leaves(quantized["bert"]["embeddings"]["LayerNorm"]),
                            jax.tree.leaves(params["bert"]["embeddings"]["LayerNorm"])):
    np.testing.assert_array_equal(leaf, original)
  ratio = int8.kernel_bytes(params) / int8.kernel_bytes(quantized)
  assert 3.9 < ratio < 4.0, ratio  # 4x less the float32 scales (one per output column)
  assert jax.tree.structure(back) == jax.tree.structure(params)


def test_quantized_tables_stand_for_the_float_ones_within_half_a_row_step(minilm):
  """Each embedding table int8 with one scale per row (max|row| / 127), every value within
  half its row's step; the float names keep the int8 tables, the scales sit beside them; the
  table bytes are ~4x fewer (MiniLM's word table: 46.9 MB → 11.8 MB)."""
  config, params = minilm
  quantized = int8.quantize_params(params, config)
  back = int8.dequantize_params(quantized)
  tables, scope = params["bert"]["embeddings"], quantized["bert"]["embeddings"]
  for name in int8.TABLES:
    t = np.asarray(tables[name])
    q, scale = np.asarray(scope[name]), np.asarray(scope[name + int8.TABLE_SCALE])
    assert q.dtype == np.int8 and q.shape == t.shape and scale.shape == (t.shape[0],), name
    assert np.all(np.abs(q).max(axis=1) == 127), name  # each row's largest |value|: 127 steps
    np.testing.assert_allclose(scale, np.abs(t).max(axis=1) / 127, rtol=1e-6)
    error = np.abs(np.asarray(back["bert"]["embeddings"][name]) - t)
    assert np.all(error <= scale[:, None] / 2 * (1 + 1e-5) + 1e-9), name
    assert error.max() > scale.min() / 8, name  # really rounded
  assert set(back["bert"]["embeddings"]) == set(tables)  # the scales dropped again
  ratio = int8.table_bytes(params) / int8.table_bytes(quantized)
  assert 3.9 < ratio < 4.0, ratio  # 4x less one float32 scale per row of 384 int8 values
  # A lookup dequantizes only the rows it gathers: the dequantized table's rows, exactly.
  ids = jnp.asarray([[101, 2023, 0], [102, 30521, 7]])
  got = int8.take_rows(jnp.asarray(scope["word_embeddings"]),
                       jnp.asarray(scope["word_embeddings_scale"]), ids)
  np.testing.assert_array_equal(got, np.asarray(back["bert"]["embeddings"]["word_embeddings"])[
      np.asarray(ids)])


def test_int8_attend_equals_the_float_scores_within_the_bound_of_its_scales(minilm):
  """The tied decoder of an int8 model: MiniLM's real hidden states scored against its int8
  word table (30522 rows as the output channels) within `int8.error_bound` of the float scores,
  in int8 with int32 accumulation, and the best-scoring word of each token the same."""
  config, params = minilm
  table = np.asarray(params["bert"]["embeddings"]["word_embeddings"])
  ids = jnp.asarray([[101, 1996, 2332, 1997, 5842, 2003, 2757, 102]])
  hidden = np.asarray(heads.BertModel(config, add_pooling_layer=False).apply(
      {"params": params["bert"]}, ids, jnp.ones_like(ids), jnp.zeros_like(ids))[
          "sequence_output"])[0]
  q, scale = int8.quantize_table(table)
  attend = jax.jit(int8.int8_attend)
  got = np.asarray(attend(jnp.asarray(hidden), jnp.asarray(q), jnp.asarray(scale)))
  want = hidden.astype(np.float64) @ table.T.astype(np.float64)
  bound = int8.error_bound(hidden, table.T)
  error = np.abs(got - want)
  assert np.all(error <= bound * (1 + 1e-4) + 1e-5), (error - bound).max()
  assert (error / bound).max() > 0.05  # the bound is not vacuous
  np.testing.assert_array_equal(np.argmax(got, -1), np.argmax(want, -1))
  text = attend.lower(jnp.asarray(hidden), jnp.asarray(q), jnp.asarray(scale)).as_text()
  assert "xi8>" in text and "xi32>" in text
  with pytest.raises(ValueError, match="the table is float32, expected int8"):
    int8.int8_attend(jnp.asarray(hidden), jnp.asarray(table), jnp.asarray(scale))


def test_int8_fill_mask_and_electra_track_float():
  """Whole models through their int8 tables: a masked LM's scores at the masked slots (lookup
  and tied decoder) track float32 and rank the same best words; ELECTRA's generator, which
  reads the discriminator's tables through `BertModel.embed` and `attend`, and its
  discriminator run in int8 and track float32. Tiny random models, trained-like tables (rows of
  different norms)."""
  config = _tiny()
  ids, mask, seg = _ids(2, 16)
  slots = jnp.asarray([[1, 5, 9], [2, 6, 12]], jnp.int32)

  def compare(build, apply, config):
    params = jax.device_get(nn.unbox(build(config).init(
        {"params": jax.random.PRNGKey(0), "sample": jax.random.PRNGKey(1)}, *apply[1])[
            "params"]))
    emb = params["bert"]["embeddings"]
    rng = np.random.RandomState(1)
    emb["word_embeddings"] = emb["word_embeddings"] * rng.uniform(
        0.3, 3.0, (emb["word_embeddings"].shape[0], 1)).astype(np.float32)
    int8_config, quantized = int8.quantize_model(config, params)
    assert quantized["bert"]["embeddings"]["word_embeddings"].dtype == np.int8
    return (apply[0](build(config), params), apply[0](build(int8_config), quantized))

  mlm = (lambda m, p: np.asarray(m.apply({"params": p}, ids, mask, seg, slots)),
         (ids, mask, seg, slots))
  float_scores, int8_scores = compare(heads.BertForMaskedLM, mlm, config)
  relative = np.linalg.norm(int8_scores - float_scores) / np.linalg.norm(float_scores)
  assert 0 < relative < 0.05, relative
  assert np.mean(np.argmax(int8_scores, -1) == np.argmax(float_scores, -1)) >= 5 / 6

  electra_config = config.replace(model_type="electra", embedding_size=32,
                                  generator_hidden_size=32)
  build = electra.ElectraForPreTraining
  run = (lambda m, p: (np.asarray(m.apply({"params": p}, ids, mask, seg, slots,
                                          method=m.generate)),
                       np.asarray(m.apply({"params": p}, ids, mask, seg, method=m.discriminate))),
         (ids, mask, seg, slots, slots, jnp.ones((2, 3), jnp.float32)))
  (float_gen, float_disc), (int8_gen, int8_disc) = compare(build, run, electra_config)
  for f, q in ((float_gen, int8_gen), (float_disc, int8_disc)):
    assert np.all(np.isfinite(q)) and not np.array_equal(f, q)
    relative = np.linalg.norm(q - f) / np.linalg.norm(f)
    assert relative < 0.1, relative


def _outlier_rows(rng, rows, width):
  """Activations as BERT's: mostly N(0, 1), a few columns ~15x larger (outlier features)."""
  x = rng.normal(size=(rows, width)).astype(np.float32)
  x[:, rng.choice(width, 3, replace=False)] *= 15.0
  x[0] = 0.0  # an all-zero row (scale 1, output = bias)
  return x


@pytest.mark.parametrize("source", ["minilm", "random"])
def test_int8_dense_equals_the_float_dense_within_the_bound_of_its_scales(source, minilm):
  """|int8 − float| <= s_x/2 Σ|w| + s_w/2 Σ|x| + k s_x s_w / 4 per output (`int8.error_bound`),
  for a real MiniLM matrix and a random one, computed by the layer `modeling.dense` builds."""
  rng = np.random.RandomState(0)
  if source == "minilm":
    layer = minilm[1]["bert"]["encoder"]["layer_0"]["intermediate"]["dense"]
    w, b = np.asarray(layer["kernel"]), np.asarray(layer["bias"])
  else:
    w = (rng.normal(size=(96, 48)) * 0.02).astype(np.float32)
    w[:, 5] *= 10.0  # a wide column beside narrow ones: per-channel scales keep both
    b = rng.normal(size=(48,)).astype(np.float32)
  x = _outlier_rows(rng, 24, w.shape[0]).reshape(2, 12, w.shape[0])
  config = _tiny(quantization="int8")
  q, scale = int8.quantize_kernel(w)
  dense = modeling.dense(config, w.shape[1], ("embed", "mlp"), "dense")
  assert isinstance(dense, int8.Int8Dense)
  got = np.asarray(dense.apply({"params": {"kernel": q, int8.SCALE: scale, "bias": b}},
                               jnp.asarray(x)))
  want = x.astype(np.float64) @ w.astype(np.float64) + b
  bound = int8.error_bound(x, w)
  error = np.abs(got - want)
  assert np.all(error <= bound * (1 + 1e-4) + 1e-5), (error - bound).max()
  # The bound is not vacuous (the error reaches a fair part of it) and the zero row is exact.
  real = bound > 0  # every row but the zero one
  assert (error[real] / bound[real]).max() > 0.05, (error[real] / bound[real]).max()
  np.testing.assert_allclose(got[0, 0], b, rtol=1e-6, atol=1e-6)
  # The float layer of the same config without int8 is the plain product.
  plain = modeling.dense(_tiny(), w.shape[1], ("embed", "mlp"), "dense")
  np.testing.assert_allclose(plain.apply({"params": {"kernel": w, "bias": b}}, jnp.asarray(x)),
                             want, rtol=1e-4, atol=1e-3)


def test_int8_matmul_accumulates_in_int32():
  x = jnp.ones((2, 8), jnp.float32)
  kernel, scale = jnp.ones((8, 32), jnp.int8), jnp.ones((32,), jnp.float32)
  text = jax.jit(lambda x: int8.int8_matmul(x, kernel, scale)).lower(x).as_text()
  assert "xi8>" in text and "xi32>" in text, text  # int8 operands, int32 result
  with pytest.raises(ValueError, match="the kernel is float32, expected int8"):
    int8.int8_matmul(x, jnp.ones((8, 32)), scale)


# ----------------------------------------------------------- models: dense() ↔ quantize_params
def _ids(batch=2, length=10):
  rng = np.random.RandomState(0)
  return (jnp.asarray(rng.randint(5, 500, (batch, length)), jnp.int32),
          jnp.ones((batch, length), jnp.int32), jnp.zeros((batch, length), jnp.int32))


def _models():
  ids, mask, seg = _ids()
  slots = jnp.zeros((2, 3), jnp.int32)
  choice = tuple(a.reshape(1, 2, -1) for a in (ids, mask, seg))
  return {
      "pretraining": (lambda c: heads.BertForPreTraining(c), (ids, mask, seg, slots)),
      "pretraining_scanned": (lambda c: heads.BertForPreTraining(c.replace(scan_layers=True)),
                              (ids, mask, seg, slots)),
      "albert": (lambda c: heads.BertForPreTraining(c.replace(
          model_type="albert", embedding_size=32, share_parameters="all")),
                 (ids, mask, seg, slots)),
      "electra": (lambda c: electra.ElectraForPreTraining(c.replace(
          model_type="electra", embedding_size=32, generator_hidden_size=32)),
                  (ids, mask, seg, slots, slots, jnp.ones((2, 3), jnp.float32))),
      "masked_lm": (lambda c: heads.BertForMaskedLM(c), (ids, mask, seg, slots)),
      "classifier": (lambda c: heads.BertForSequenceClassification(c, 3), (ids, mask, seg)),
      "classifier_20": (lambda c: heads.BertForSequenceClassification(c, 20), (ids, mask, seg)),
      "qa": (lambda c: heads.BertForQuestionAnswering(c), (ids, mask, seg)),
      "tagger": (lambda c: heads.BertForTokenClassification(c, 5), (ids, mask, seg)),
      "feature_tagger": (lambda c: heads.BertFeatureBasedTagger(c, 5, (-1, -2), lstm_size=16,
                                                                lstm_layers=1),
                         (ids, mask, seg)),
      "choice": (lambda c: heads.BertForMultipleChoice(c), choice),
  }


@pytest.mark.parametrize("name", sorted(_models()))
def test_every_models_int8_parameters_are_its_float_parameters_quantized(name):
  """What the int8 model builds (`modeling.dense`, `BertEmbeddings`) and what `quantize_params`
  writes are the same tree (paths, shapes, dtypes) for every model of the package, which the
  int8 model takes: the embedding tables int8 with their row scales; logit layers narrower than
  16, the feature-based tagger's BiLSTM and classifier, and LayerNorms stay float. (Shapes
  only: traced, not computed; the numerics are above.)"""
  build, inputs = _models()[name]
  rngs = {"params": jax.random.PRNGKey(0), "sample": jax.random.PRNGKey(1)}
  float_model, int8_model = build(_tiny()), build(_tiny(quantization="int8"))
  shapes = lambda model: jax.eval_shape(lambda: nn.unbox(model.init(rngs, *inputs)["params"]))
  params = jax.tree.map(lambda s: np.ones(s.shape, s.dtype), shapes(float_model))
  quantized = int8.quantize_params(params, float_model.config)
  spec = lambda tree: {path: (tuple(np.shape(a)), jnp.dtype(a.dtype).name)
                       for path, a in flatten_params(tree).items()}
  assert spec(quantized) == spec(shapes(int8_model))
  int8_paths = {p for p, layer in _dense_layers(quantized).items() if int8.SCALE in layer}
  assert int8_paths and not any(p.startswith("tagger") for p in int8_paths)
  float_paths = set(_dense_layers(quantized)) - int8_paths
  assert all(np.shape(_at(quantized, p)["kernel"])[-1] < 16 or p.startswith("tagger")
             for p in float_paths), float_paths
  assert any(p.endswith("classifier") for p in int8_paths) == (name == "classifier_20")
  tables = quantized["bert"]["embeddings"]
  assert tables["word_embeddings"].dtype == np.int8 and "word_embeddings_scale" in tables
  # Quantizing twice changes nothing; the int8 model takes the quantized tree.
  assert spec(int8.quantize_params(quantized, int8_model.config)) == spec(quantized)
  jax.eval_shape(lambda p: int8_model.apply({"params": p}, *inputs,
                                            rngs={"sample": jax.random.PRNGKey(2)}), quantized)


# --------------------------------------------------------------------- MiniLM: int8 vs float32
@pytest.fixture(scope="module")
def minilm_logits(minilm):
  """A sentiment classifier on the packaged MiniLM (its sentence vector, then a nearest-centroid
  head: the mean float sentence vectors of the 8 negative and 8 positive SST sentences), applied
  in float32 and in int8 to 64 real sentences: the 16 SST ones and 48 lines of Shakespeare (text
  the head was not built from, so close calls)."""
  config, params = minilm
  tokenizer = tokenization.load_tokenizer(
      vocab_file=os.path.join(helpers.minilm_dir(), "vocab.txt"), do_lower_case=True)
  plays = [s for s in demo_corpus.split_sentences(demo_corpus.corpus_text(max_bytes=30_000))
           if len(s.split()) > 3][:48]
  sentences = SST + plays
  feats = pairs.encode_examples(tokenizer, sentences, [None] * len(sentences), 48)
  inputs = [jnp.asarray(feats[k]) for k in ("input_ids", "input_mask", "segment_ids")]
  pooled = np.asarray(jax.jit(lambda p: heads.BertModel(config).apply({"params": p}, *inputs)[
      "pooled_output"])(params["bert"]))
  # Nearest centroid: argmax_k x·c_k − |c_k|²/2, written about the centroids' mean m (same
  # argmax): kernel c_k − m, bias −(c_k − m)·m, so the two logits are ± one margin.
  centroids = np.stack([pooled[8:16].mean(0), pooled[:8].mean(0)], axis=1)  # (neg, pos)
  middle = centroids.mean(axis=1, keepdims=True)
  kernel = centroids - middle
  tree = {"bert": params["bert"],
          "classifier": {"kernel": kernel, "bias": -(middle[:, 0] @ kernel)}}

  def logits(cfg, p):
    return np.asarray(jax.jit(lambda p: heads.BertForSequenceClassification(cfg, 2).apply(
        {"params": p}, *inputs))(p))
  int8_config, int8_params = int8.quantize_model(config, tree)
  return logits(config, tree), logits(int8_config, int8_params)


def test_minilm_int8_logits_track_float32_and_the_decisions_agree(minilm_logits):
  """Measured: relative error 0.086 of the logits, 62 of 64 argmaxes the same (the two that
  differ are the closest calls, float margins of 0.0006 and 0.0013 against a typical margin
  error of 0.003), the 16 SST sentences classified as in float32. Bounds: relative error 0.15,
  at least 60 of 64 agreeing, every SST decision the same."""
  float_logits, int8_logits = minilm_logits
  assert not np.array_equal(float_logits, int8_logits)  # really computed in int8
  relative = np.linalg.norm(int8_logits - float_logits) / np.linalg.norm(float_logits)
  assert relative <= 0.15, relative
  agree = np.argmax(int8_logits, 1) == np.argmax(float_logits, 1)
  assert agree.sum() >= 60, agree.sum()
  labels = np.array([1] * 8 + [0] * 8)
  assert np.array_equal(np.argmax(float_logits[:16], 1), labels)  # the head works in float32
  assert np.array_equal(np.argmax(int8_logits[:16], 1), labels)   # and in int8


# ------------------------------------------------------------- predict --int8 and the export
def _predict(checkpoint, *flags):
  proc = helpers.run_command("bert_jax.predict", f"--checkpoint={checkpoint}", "--json",
                             *[f"--text={t}" for t in SST], *flags)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _convert(source, target, *flags):
  return helpers.run_command("bert_jax.convert", f"--from={source}", f"--to={target}", *flags)


def _bytes_on_disk(directory):
  return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(directory)
             for f in files)


def test_predict_int8_and_the_int8_export_classify_as_the_float_model(sst2_model, tmp_path):
  """The tiny fine-tuned classifier (`sst2_model`: the 16 SST sentences memorised): `predict
  --int8` gives every label of float32 (its accuracy, 1.0, kept) with probabilities within
  0.05; `convert --format=orbax --int8` writes ~4x fewer kernel bytes than the float export
  (which keeps the task: predict still classifies it), records quantization='int8', and
  `predict` reads it back, without --int8, with exactly the logits of --int8 on the float
  checkpoint."""
  out = sst2_model["out"]
  float_results = _predict(out)
  int8_results = _predict(out, "--int8")
  labels = ["1"] * 8 + ["0"] * 8
  assert [r["label"] for r in float_results] == labels
  assert [r["label"] for r in int8_results] == labels
  for f, q in zip(float_results, int8_results):
    for label in f["probabilities"]:
      assert abs(f["probabilities"][label] - q["probabilities"][label]) <= 0.05
  assert any(f["probabilities"] != q["probabilities"]
             for f, q in zip(float_results, int8_results))  # really int8

  float_dir, int8_dir = str(tmp_path / "float"), str(tmp_path / "int8")
  assert _convert(out, float_dir, "--format=orbax").returncode == 0
  proc = _convert(out, int8_dir, "--format=orbax", "--int8")
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert "int8: dense kernels" in proc.stdout and "x smaller" in proc.stdout, proc.stdout
  float_tree = checkpoints.load_any(float_dir)
  int8_tree = checkpoints.load_any(int8_dir)
  assert float_tree.config.quantization == "none" and int8_tree.config.quantization == "int8"
  assert json.load(open(os.path.join(int8_dir, "bert_config.json")))["quantization"] == "int8"
  ratio = int8.kernel_bytes(float_tree.params) / int8.kernel_bytes(int8_tree.params)
  assert 3.7 < ratio < 4.0, ratio  # hidden 64: the scales are 1/64 of the int8 bytes
  assert _bytes_on_disk(int8_dir) < _bytes_on_disk(float_dir)
  # Both copies keep the task; the float one serves exactly as the run, the int8 one as --int8.
  assert _predict(float_dir) == float_results
  assert _predict(int8_dir) == int8_results
  assert _predict(int8_dir, "--int8") == int8_results  # already int8: nothing changes


# Every other mode, on a tiny random model written as its fine-tuning run would write it (the
# task and settings recorded beside the weights): the load is common, so `--int8` serves all.
_MODES = {
    "qa": (lambda c: heads.BertForQuestionAnswering(c), 1,
           {"task": "squad v1.1", "max_seq_length": 64, "doc_stride": 32,
            "max_query_length": 16},
           ["--question=Who led Ford?",
            "--context=Alan Mulally ran Boeing's airplane business before he led Ford."]),
    "tag": (lambda c: heads.BertForTokenClassification(c, 3), 1,
            {"task": "conll2003", "label_list": ["O", "B-PER", "I-PER"], "max_seq_length": 32},
            ["--text=Alan Mulally of Boeing spoke in New York ."]),
    "choose": (lambda c: heads.BertForMultipleChoice(c), 2,
               {"task": "swag", "num_choices": 2, "max_seq_length": 32},
               ["--context=Romeo climbs the orchard wall.", "--ending=He sees a light.",
                "--ending=He reads the paper."]),
    "fill_mask": (lambda c: heads.BertForPreTraining(c), 0, None,
                  ["--text=the [MASK] of denmark", "--top_k=3"]),
}


@pytest.mark.parametrize("mode", sorted(_MODES))
def test_predict_int8_serves_every_mode(mode, tmp_path):
  build, choices, metadata, flags = _MODES[mode]
  config = _tiny(vocab_size=30522)
  ids = jnp.ones((1, choices, 8) if choices > 1 else (1, 8), jnp.int32)
  extra = (jnp.zeros((1, 2), jnp.int32),) if mode == "fill_mask" else ()
  params = jax.jit(lambda: nn.unbox(build(config).init(jax.random.PRNGKey(0), ids, ids, ids * 0,
                                                       *extra)["params"]))()
  directory = str(tmp_path / mode)
  checkpoints.save_orbax_params(jax.device_get(params), config, directory,
                                {**metadata, "do_lower_case": True} if metadata else None)
  shutil.copy(os.path.join(helpers.minilm_dir(), "vocab.txt"), directory)
  proc = helpers.run_command("bert_jax.predict", f"--checkpoint={directory}", "--json", "--int8",
                             *flags)
  assert proc.returncode == 0, proc.stderr[-4000:]
  (result,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  if mode == "qa":
    assert result["answer"] in "Alan Mulally ran Boeing's airplane business before he led Ford."
  elif mode == "tag":
    assert len(result["tags"]) == len(result["words"]) == 9
  elif mode == "choose":
    assert sum(result["probabilities"]) == pytest.approx(1.0)
  else:
    assert len(result["predictions"]) == 1 and len(result["predictions"][0]) == 3
  # The model behind it is the int8 one.
  loaded = pipeline.load(directory, int8=True)
  tree = loaded.params if mode == "fill_mask" else loaded.finetuned.params
  assert loaded.config.quantization == "int8" and int8.is_quantized(tree)


def test_int8_refusals_are_one_line(sst2_model, tmp_path):
  for fmt in ("hf", "tf1"):
    proc = _convert(sst2_model["out"], str(tmp_path / fmt), f"--format={fmt}", "--int8")
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"--int8 needs --format=orbax: the {fmt} format has no int8" \
        in lines[0], proc.stderr
    assert not os.path.exists(tmp_path / fmt)
  # Training an int8 model: refused where every training step is built.
  model = heads.BertForSequenceClassification(_tiny(quantization="int8"), 2)
  with pytest.raises(ValueError, match=r"quantization='int8' is for inference only"):
    step_lib.make_train_step(objective=None, model=model, tx=None, schedule=None)
  assert "\n" not in int8.TRAINING_ERROR
