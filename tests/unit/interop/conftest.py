"""The reference checkpoints the interop tests read: the packaged all-MiniLM-L6-v2 (real
weights) and a randomly initialised BertForPreTraining with every tensor perturbed."""

import pytest
import torch
import transformers

from bert_jax.interop import hf as hf_io
from tests import helpers


@pytest.fixture(scope="module")
def minilm():
  path = helpers.minilm_dir()
  tokenizer = transformers.BertTokenizer.from_pretrained(path)
  assert tokenizer.vocab_size == 30522, "reference tokenizer did not read vocab.txt"
  torch_model = transformers.BertModel.from_pretrained(path, attn_implementation="eager").eval()
  config, params, report = hf_io.load_hf_checkpoint(path)
  return path, tokenizer, torch_model, config, params, report


@pytest.fixture(scope="module")
def random_pretraining_checkpoint(tmp_path_factory):
  torch.manual_seed(0)
  hf_config = transformers.BertConfig(
      vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
      intermediate_size=128, max_position_embeddings=64, type_vocab_size=2,
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
  model = transformers.BertForPreTraining(hf_config).eval()
  # Random init leaves biases and LayerNorms at 0/1; perturb everything so that every tensor
  # (and every transpose in the name table) matters.
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  path = str(tmp_path_factory.mktemp("hf_pretraining"))
  model.save_pretrained(path, safe_serialization=True)
  return path, model
