"""Test-wide setup: 8 fake CPU devices (set before JAX initialises), quiet TensorFlow, and the
fixtures several test files share."""

import os

from tests import helpers

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + helpers.xla_flags(8)).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import pytest  # noqa: E402  (after the environment above, which must precede any JAX import)


@pytest.fixture(scope="module")
def tokenizer():
  """The uncased WordPiece tokenizer of the packaged MiniLM (BERT's 30,522-entry vocab.txt)."""
  from bert_jax.text import tokenization
  from tests import helpers
  return tokenization.load_tokenizer(
      vocab_file=os.path.join(helpers.minilm_dir(), "vocab.txt"), do_lower_case=True)


@pytest.fixture(scope="module")
def bert_config_file(tmp_path_factory):
  """A tiny BERT (the `test` preset) over that vocabulary, without dropout, as a config file."""
  from bert_jax.model import configuration
  path = tmp_path_factory.mktemp("cfg") / "bert_config.json"
  configuration.get_preset("test", vocab_size=30522, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0).to_json_file(str(path))
  return str(path)
