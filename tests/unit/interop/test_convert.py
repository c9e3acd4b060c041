"""Checkpoint interop edge cases: prefixes, legacy names, sharded files, mismatches, layouts."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

from bert_jax import file_io
from bert_jax.interop import checkpoints
from bert_jax.interop import hf as hf_io
from bert_jax.interop import hf_config
from bert_jax.interop import names as name_tables
from bert_jax.model import configuration, heads, modeling


@pytest.fixture(scope="module")
def tiny():
  cfg = configuration.get_preset("test", num_hidden_layers=2)
  ids = jnp.zeros((1, 8), jnp.int32)
  params = nn.unbox(heads.BertForPreTraining(cfg).init(
      jax.random.PRNGKey(0), ids, ids, ids, jnp.zeros((1, 2), jnp.int32))["params"])
  params = jax.tree.map(np.asarray, params)
  return cfg, params


def _write(directory, cfg, state):
  directory.mkdir(parents=True, exist_ok=True)
  save_file(state, str(directory / "model.safetensors"))
  (directory / "config.json").write_text(json.dumps(hf_config.to_hf_dict(cfg)))
  return str(directory)


def test_table_covers_every_parameter_exactly_once(tiny):
  cfg, params = tiny
  rows = name_tables.name_table(cfg.num_hidden_layers)
  assert sorted(r.ours for r in rows) == sorted(name_tables.flatten_params(params))
  assert len({r.hf for r in rows}) == len({r.tf1 for r in rows}) == len(rows)


def test_bare_and_prefixed_and_legacy_names_load_the_same(tiny, tmp_path):
  cfg, params = tiny
  state = hf_io.params_to_hf_state(params, cfg)
  # BertModel saved bare (no "bert." prefix, no heads) with pre-2020 LayerNorm gamma/beta names.
  bare = {k[len("bert."):].replace("LayerNorm.weight", "LayerNorm.gamma")
          .replace("LayerNorm.bias", "LayerNorm.beta"): v
          for k, v in state.items() if k.startswith("bert.")}
  bare["embeddings.position_ids"] = np.arange(cfg.max_position_embeddings)[None]
  _, loaded_bare, report = hf_io.load_hf_checkpoint(_write(tmp_path / "bare", cfg, bare))
  assert report.unexpected == []
  assert sorted(report.missing) == sorted(k for k in name_tables.flatten_params(params)
                                          if k.startswith("cls/"))
  np.testing.assert_array_equal(
      loaded_bare["bert"]["encoder"]["layer_1"]["output"]["LayerNorm"]["scale"],
      params["bert"]["encoder"]["layer_1"]["output"]["LayerNorm"]["scale"])

  # Full pre-training checkpoint with the tied decoder written out, plus a classifier head that
  # nothing here reads: reported, not silently dropped.
  full = dict(state)
  full["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
  full["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
  full["classifier.weight"] = np.zeros((2, cfg.hidden_size), np.float32)
  _, loaded_full, report = hf_io.load_hf_checkpoint(_write(tmp_path / "full", cfg, full))
  assert report.missing == [] and report.unexpected == ["classifier.weight"]
  for a, b in zip(jax.tree.leaves(loaded_full), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)
  assert "1 checkpoint tensors unused (classifier.weight)" in report.summary()


def test_untied_decoder_is_reported(tiny, tmp_path):
  cfg, params = tiny
  state = hf_io.params_to_hf_state(params, cfg)
  state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"] + 1
  _, _, report = hf_io.load_hf_checkpoint(_write(tmp_path / "untied", cfg, state))
  assert any("untied decoders are not supported" in u for u in report.unexpected)


def test_sharded_safetensors_index(tiny, tmp_path):
  cfg, params = tiny
  state = hf_io.params_to_hf_state(params, cfg)
  keys = sorted(state)
  d = tmp_path / "sharded"
  d.mkdir()
  halves = {"model-00001-of-00002.safetensors": keys[::2],
            "model-00002-of-00002.safetensors": keys[1::2]}
  for name, names in halves.items():
    save_file({k: state[k] for k in names}, str(d / name))
  (d / "model.safetensors.index.json").write_text(json.dumps(
      {"weight_map": {k: n for n, names in halves.items() for k in names}}))
  (d / "config.json").write_text(json.dumps(hf_config.to_hf_dict(cfg)))
  _, loaded, report = hf_io.load_hf_checkpoint(str(d))
  assert report.missing == []
  assert len(name_tables.flatten_params(loaded)) == len(keys)


def test_shape_mismatches_are_all_listed(tiny, tmp_path):
  cfg, params = tiny
  state = hf_io.params_to_hf_state(params, cfg)
  path = _write(tmp_path / "ckpt", cfg, state)
  # The same tensors against a config with a different vocabulary and FFN width.
  other = cfg.replace(vocab_size=600, intermediate_size=96)
  (tmp_path / "ckpt" / "config.json").write_text(json.dumps(hf_config.to_hf_dict(other)))
  with pytest.raises(ValueError) as err:
    hf_io.load_hf_checkpoint(path)
  message = str(err.value)
  assert "tensor shapes disagree with the config" in message and path in message
  assert "bert.embeddings.word_embeddings.weight: checkpoint (512, 64)" in message
  assert "(600, 64)" in message
  assert "bert.encoder.layer.1.intermediate.dense.weight" in message
  assert "cls.predictions.bias" in message


def test_missing_files_are_named(tmp_path):
  (tmp_path / "config.json").write_text(
      json.dumps(hf_config.to_hf_dict(configuration.get_preset("test"))))
  with pytest.raises(FileNotFoundError, match="no model.safetensors"):
    hf_io.load_hf_checkpoint(str(tmp_path))
  (tmp_path / "pytorch_model.bin").write_bytes(b"")
  with pytest.raises(ValueError, match="only pytorch_model.bin found"):
    hf_io.load_hf_checkpoint(str(tmp_path))


def test_scanned_config_loads_and_exports(tiny, tmp_path):
  cfg, params = tiny
  path = hf_io.save_hf_checkpoint(params, cfg, str(tmp_path / "ckpt"))
  scan_cfg, scanned, _ = hf_io.load_hf_checkpoint(path, scan_layers=True)
  assert scan_cfg.scan_layers
  assert scanned["bert"]["encoder"]["layer"]["attention"]["self"]["query"]["kernel"].shape == (
      2, 64, 64)
  exported = hf_io.params_to_hf_state(scanned, scan_cfg)
  original = hf_io.params_to_hf_state(params, cfg)
  assert exported.keys() == original.keys()
  for k in original:
    np.testing.assert_array_equal(exported[k], original[k])


def test_merge_params_fills_missing_and_rejects_mismatch(tiny):
  cfg, params = tiny
  encoder_only = {"bert": params["bert"]}
  fresh = jax.tree.map(np.zeros_like, params)
  merged = checkpoints.merge_params(fresh, encoder_only)
  np.testing.assert_array_equal(merged["bert"]["pooler"]["dense"]["kernel"],
                                params["bert"]["pooler"]["dense"]["kernel"])
  assert not merged["cls"]["seq_relationship"]["kernel"].any()
  bad = {"bert": {"pooler": {"dense": {"kernel": np.zeros((3, 3))}}}, "extra": np.zeros(1)}
  with pytest.raises(ValueError) as err:
    checkpoints.merge_params(fresh, bad, where="ckpt.safetensors")
  assert "bert/pooler/dense/kernel: ckpt.safetensors (3, 3) vs model (64, 64)" in str(err.value)
  assert "parameters the model does not have: extra" in str(err.value)


def test_atomic_write_leaves_no_partial_file(tmp_path):
  target = tmp_path / "out" / "file.bin"
  file_io.write_bytes_atomic(str(target), b"complete")
  assert target.read_bytes() == b"complete"

  # A write that fails after the temporary file was opened: the old file stays, no debris.
  with pytest.raises(TypeError):
    file_io.write_bytes_atomic(str(target), object())
  assert target.read_bytes() == b"complete"
  assert sorted(p.name for p in target.parent.iterdir()) == ["file.bin"]


def test_checkpoint_manager_accepts_relative_paths(tmp_path, monkeypatch):
  from bert_jax.interop import checkpoint_store
  from bert_jax.training import checkpointing
  monkeypatch.chdir(tmp_path)
  manager = checkpointing.CheckpointManager("relative/ckpts", async_save=False)
  manager.save(1, {"w": np.ones(3, np.float32)}, {"epoch": 0}, {"note": "x"})
  manager.close()
  tree, meta = checkpoint_store.load_params("relative/ckpts", subtree="w")
  np.testing.assert_array_equal(np.asarray(tree), np.ones(3))
  assert meta["note"] == "x" and meta["step"] == 1  # the metadata, and which step was read


def test_metric_writer_on_a_filesystem_without_append(tmp_path):
  """Buckets (gs://) cannot append; the writer rewrites the file. `ram://` takes the same
  tf.io.gfile route as gs:// here."""
  from bert_jax.training import metrics
  path = "ram://metrics_test/run"
  for step in (1, 2):
    writer = metrics.MetricWriter(path, tensorboard=False)
    writer.write(step, {"train/loss": 1.0 / step})
    writer.close()
  rows = [json.loads(l) for l in file_io.read_text(path + "/metrics.jsonl").splitlines()]
  assert [r["step"] for r in rows] == [1, 2] and rows[1]["train/loss"] == 0.5


def test_a_masked_lm_only_export_is_bert_for_masked_lm_and_reads_back_as_documented(tmp_path):
  """A tree without next-sentence head or pooler (MLM-only pre-training) is written as
  `BertForMaskedLM`, whose masked-LM logits are ours; the README's snippet reads it back."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  cfg = configuration.get_preset("test", num_hidden_layers=2, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0)
  ids = np.random.RandomState(0).randint(5, cfg.vocab_size, size=(2, 8)).astype(np.int32)
  mask, segments, positions = np.ones_like(ids), np.zeros_like(ids), np.tile(np.arange(8), (2, 1))
  model = heads.BertForMaskedLM(cfg)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), ids, mask, segments, positions)["params"])
  params = jax.tree.map(lambda x: np.asarray(x) + 0.02, params)
  assert "pooler" not in params["bert"]
  hf_io.save_hf_checkpoint(params, cfg, str(tmp_path))
  assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
  theirs = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path)).eval()
  assert type(theirs).__name__ == "BertForMaskedLM"
  with torch.no_grad():
    logits = theirs(input_ids=torch.tensor(ids).long()).logits.numpy()
  ours = np.asarray(model.apply({"params": params}, ids, mask, segments, positions))
  np.testing.assert_allclose(ours, logits, atol=1e-5)
  # The README's "Using the model from Python".
  config, read, _ = hf_io.load_hf_checkpoint(str(tmp_path))
  encoder = modeling.BertModel(config, add_pooling_layer="pooler" in read["bert"])
  out = encoder.apply({"params": read["bert"]}, ids, mask, segments)
  assert out["sequence_output"].shape == (2, 8, cfg.hidden_size) and "pooled_output" not in out
