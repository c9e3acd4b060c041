"""bert_jax: BERT pre-training and fine-tuning in JAX/Flax, sharded over device meshes."""

import os as _os

# TensorFlow serves only tf.data / TFRecord / gfile here: keep its start-up chatter and its
# oneDNN numerics notice out of the console. Set before anything imports TensorFlow.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
