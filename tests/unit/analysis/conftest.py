"""Models the analysis tests share: the packaged MiniLM (real weights) and a tiny classifier
with random weights."""

import os

import flax.linen as nn
import jax
import numpy as np
import pytest

from bert_jax.interop import checkpoints
from bert_jax.model import configuration
from bert_jax.tasks.classification import data as glue
from bert_jax.tasks.classification import objective as sequence_classification
from bert_jax.text import tokenization
from tests import helpers

SEQ = 16


@pytest.fixture(scope="module")
def minilm():
  """`(config, encoder params, tokenizer)` of the packaged all-MiniLM-L6-v2."""
  config, encoder, _ = checkpoints.load_encoder(helpers.minilm_dir())
  tokenizer = tokenization.load_tokenizer(
      vocab_file=os.path.join(helpers.minilm_dir(), "vocab.txt"), do_lower_case=True)
  return config, encoder, tokenizer


@pytest.fixture(scope="module")
def classifier():
  """`(config, objective, model, params, batch)`: a tiny SST-2 classifier (3 layers of 8 heads)
  with random weights, and a batch of 6 random rows of length `SEQ` with labels."""
  config = configuration.get_preset("test", vocab_size=64, max_position_embeddings=SEQ,
                                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                    num_hidden_layers=3)
  objective = sequence_classification.SequenceClassification(glue.get_task("SST-2"), SEQ)
  model = objective.model(config)
  rng = np.random.default_rng(0)
  mask = (np.arange(SEQ)[None, :] < rng.integers(6, SEQ + 1, size=(6, 1))).astype(np.int32)
  batch = {"input_ids": (rng.integers(5, 64, size=(6, SEQ)) * mask).astype(np.int32),
           "input_mask": mask, "segment_ids": np.zeros((6, SEQ), np.int32),
           "label": rng.integers(0, 2, size=6).astype(np.int32),
           "weight": np.ones(6, np.float32)}
  params = model.init(jax.random.PRNGKey(1), batch["input_ids"], batch["input_mask"],
                      batch["segment_ids"])["params"]
  return config, objective, model, jax.tree.map(np.asarray, nn.unbox(params)), batch
