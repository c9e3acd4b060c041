"""Throughput accounting: analytic FLOPs of the encoder and the peak FLOP/s of a device, for MFU.

Objectives add their heads' FLOPs to `encoder_flops`; the loop divides by the device peak. The
usual MFU convention: matmul FLOPs only (2 per multiply-add), backward = 2 × forward.
"""

from __future__ import annotations

import jax

from bert_jax.model.configuration import BertConfig


def encoder_forward_flops(config: BertConfig, batch_size: int, seq_length: int) -> float:
  """Forward matmul FLOPs of the encoder: per layer and token, QKV + output projections 8H²,
  FFN 4HI, attention scores and context 4SH. Embedding lookups and elementwise work are not
  counted. A layer with pruned heads counts the width A·d of its A heads in place of H in the
  attention terms."""
  h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
  attention_width = sum(config.heads_in_layer(layer) for layer in range(layers)) * config.head_dim
  per_token = layers * 4 * h * i + attention_width * (8 * h + 4 * seq_length)
  return float(batch_size * seq_length * per_token)


def training_flops(forward_flops: float) -> float:
  """Forward + backward (twice the forward) of one training step."""
  return 3.0 * forward_flops


# Peak dense bf16 matmul FLOP/s per chip, for MFU. Unknown devices (CPUs) report no MFU.
PEAK_FLOPS = {
    "TPU v2": 45e12, "TPU v3": 123e12, "TPU v4": 275e12, "TPU v5 lite": 197e12,
    "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v5": 459e12, "TPU v6 lite": 918e12,
    "TPU v6e": 918e12, "NVIDIA H100": 989e12, "NVIDIA H200": 989e12, "NVIDIA A100": 312e12,
}


def peak_flops_per_device(device: jax.Device) -> float | None:
  kind = getattr(device, "device_kind", "")
  for name in sorted(PEAK_FLOPS, key=len, reverse=True):
    if kind.startswith(name):
      return PEAK_FLOPS[name]
  return None
