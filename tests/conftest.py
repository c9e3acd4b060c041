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
# The tests run on the CPU's fake devices. With libtpu installed (for the ahead-of-time TPU
# compiles), JAX would otherwise probe for a TPU in every process a test starts, seconds each.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# JAX's persistent compilation cache, set before JAX starts so that every subprocess a test runs
# inherits it: the same tiny models compile in many tests, and a second run of the suite finds
# them all. Kept between runs in the repository's .cache/ (ignored by git).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax-tests"))
# Every compile is kept, however quick: a fine-tuning run compiles ~70 small programs (0.2 s
# each on this machine) beside its train step, and they add up over the suite.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# A size limit turns on the cache's file lock, so that the two workers of `make test` and the
# commands they start read and write entries safely side by side.
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))
helpers.repair_compilation_cache(os.environ["JAX_COMPILATION_CACHE_DIR"])


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
