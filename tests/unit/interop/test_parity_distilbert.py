"""DistilBERT directories in and out: parity with transformers' PyTorch `DistilBertForMaskedLM`."""

from __future__ import annotations

import json
import os

import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax.interop import checkpoints
from bert_jax.interop import hf as hf_io
from bert_jax.interop import hf_config
from bert_jax.model import configuration, heads



def _distilbert(tmp_path):
  torch.manual_seed(0)
  model = transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(
      vocab_size=101, dim=48, n_layers=3, n_heads=4, hidden_dim=80, max_position_embeddings=40,
      dropout=0.0, attention_dropout=0.0, activation="gelu")).eval()
  with torch.no_grad():  # nonzero biases and LayerNorms, so a dropped tensor shows
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  directory = tmp_path / "distilbert"
  model.save_pretrained(directory)
  return model, str(directory)


def test_distilbert_loads_with_the_reference_logits_and_exports_back(tmp_path):
  model, directory = _distilbert(tmp_path)
  config, params, report = hf_io.load_hf_checkpoint(directory)
  assert not report.missing and not report.unexpected, report.summary()
  assert (config.model_type, config.type_vocab_size, config.hidden_size,
          config.num_hidden_layers, config.intermediate_size) == ("distilbert", 0, 48, 3, 80)
  assert "token_type_embeddings" not in params["bert"]["embeddings"]
  rng = np.random.RandomState(0)
  ids = rng.randint(5, 101, (2, 11)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 7:] = 0
  # DistilBERT has no token types: segment ids, whatever they are, change nothing.
  segments = (np.arange(11)[None] >= 5).astype(np.int32).repeat(2, 0)
  positions = np.broadcast_to(np.arange(11), ids.shape).astype(np.int32)
  with torch.no_grad():
    ref = model(torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
  ours = np.asarray(heads.BertForMaskedLM(config).apply(
      {"params": params}, ids, mask, segments, positions))
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], ref[real], atol=1e-5, rtol=1e-5)

  out = hf_io.save_hf_checkpoint(params, config, str(tmp_path / "exported"))
  written = json.loads(open(os.path.join(out, "config.json")).read())
  assert (written["dim"], written["n_layers"], written["hidden_dim"]) == (48, 3, 80)
  again = transformers.DistilBertForMaskedLM.from_pretrained(out).eval()
  want, got = model.state_dict(), again.state_dict()
  assert set(want) == set(got)
  for name in want:
    np.testing.assert_array_equal(got[name].numpy(), want[name].numpy(), err_msg=name)
  # And through the checkpoint resolution every command uses.
  loaded = checkpoints.load_any(out)
  jax.tree.map(np.testing.assert_array_equal, loaded.params, params)


def test_distilbert_configs_are_checked():
  preset = configuration.get_preset("distilbert_base")
  assert (preset.num_hidden_layers, preset.hidden_size, preset.type_vocab_size) == (6, 768, 0)
  with pytest.raises(ValueError, match="type_vocab_size=0 .*distilbert"):
    configuration.get_preset("base", type_vocab_size=0)
  with pytest.raises(ValueError, match="sinusoidal_pos_embds"):
    hf_config.config_from_dict(dict(model_type="distilbert", vocab_size=10, dim=8, n_layers=1,
                                    n_heads=2, hidden_dim=16, sinusoidal_pos_embds=True))
  with pytest.raises(ValueError, match="no TF1"):
    from bert_jax.interop import names
    names.family_table(preset, "tf1")
