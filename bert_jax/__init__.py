"""bert_jax: BERT pre-training and fine-tuning in JAX/Flax, sharded over device meshes."""

import os as _os

# TensorFlow serves only tf.data / TFRecord / gfile here: keep its start-up chatter and its
# oneDNN numerics notice out of the console. Set before anything imports TensorFlow.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def configs_dir() -> str:
  """The folder of the run configs (`configs/` of a checkout, or the installed
  `bert_jax.configs`), so that `--config=configs/pretrain.py:demo` works from any directory."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  checkout = _os.path.join(_os.path.dirname(_os.path.dirname(_os.path.abspath(__file__))),
                           "configs")
  if _os.path.isfile(_os.path.join(checkout, "pretrain.py")):
    return checkout
  spec = importlib.util.find_spec("bert_jax.configs")
  return list(spec.submodule_search_locations)[0] if spec else checkout
