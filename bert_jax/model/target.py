"""Which platform a program is being built for, where the model's choices depend on it, the
fused kernels a GPU of a given compute capability runs when a run leaves them unset (one rule
for pre-training and fine-tuning), and how a custom kernel runs in a program split over devices
(each device's shard in `shard_map`: the attention, LayerNorm and FP8 kernels)."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
from absl import logging

from bert_jax.model import configuration, cudnn_runtime

# The GPUs that run the fused kernels by default: cuDNN's flash attention and Pallas' Triton
# kernels need Ampere (compute capability 8.0) or newer.
FUSED_GPU_CAPABILITY = (8, 0)


def target_platform() -> str:
  """The platform the program is built for: the devices of the mesh in context (a TPU topology
  compiled for ahead of time from a CPU machine is "tpu"), else the default backend."""
  device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
  return device.platform if device is not None else jax.default_backend()


def is_fused_gpu(platform: str, capability: tuple[int, int] | None) -> bool:
  """Whether a device of `platform` and CUDA compute `capability` (None: not a CUDA GPU) runs
  the fused kernels by default."""
  return (platform == "gpu" and capability is not None
          and tuple(capability) >= FUSED_GPU_CAPABILITY)


def cudnn_heads_fit(config: configuration.BertConfig,
                    capability: tuple[int, int] | None = None) -> bool:
  """Whether cuDNN's flash attention takes the heads of `config`: a multiple of 8 values, up to
  128 (256 on Hopper, compute capability 9.0; None: any Ampere or newer GPU)."""
  limit = 256 if capability is not None and tuple(capability) >= (9, 0) else 128
  return config.head_dim % 8 == 0 and config.head_dim <= limit


def fused_kernel_fields(config: configuration.BertConfig, given: set[str],
                        capability: tuple[int, int] | None,
                        max_seq_length: int | None = None,
                        cudnn_dropout: bool | None = None) -> dict[str, Any]:
  """The kernel fields left unset (not in `given`) that a CUDA GPU of compute `capability`
  (`is_fused_gpu`) runs with, as `BertConfig.replace` arguments; `config` is the model with its
  layers' layout decided. Each only where the model allows it:

  - `attention_implementation="cudnn"` (attention dropout inside cuDNN's flash kernel): a
    bfloat16 or float16 compute dtype, heads cuDNN takes (`cudnn_heads_fit`) in the model and
    its ELECTRA generator, an even sequence length (`max_seq_length`; packed rows reach cuDNN as
    a bias), and, when attention dropout is on, unshared layers outside a scanned loop (cuDNN's
    dropout needs one call site per layer, as `BertConfig` enforces) and a process that can
    run its dropout (`cudnn_dropout`; None: `cudnn_runtime.cudnn_dropout_runs_here`, false in a
    GPU process started without the XLA_FLAGS the commands set, such as a notebook's: there
    XLA's attention runs, and a line says how to get cuDNN's);
  - `layer_norm_implementation="pallas"` (each block's dropout + residual add + LayerNorm one
    Triton kernel each way): the low-precision LayerNorm of a bfloat16 or float16 model.
  """
  narrow = config.dtype in ("bfloat16", "float16")
  models = [config] + ([config.generator_config()] if config.has_generator else [])
  heads_fit = all(cudnn_heads_fit(m, capability) for m in models)
  one_site_per_layer = config.share_parameters == "none" and not config.scanned_loop
  fields: dict[str, Any] = {}
  if ("attention_implementation" not in given and narrow and heads_fit
      and (max_seq_length is None or max_seq_length % 2 == 0)
      and (one_site_per_layer or config.attention_probs_dropout_prob == 0)):
    if cudnn_dropout is None:
      cudnn_dropout = cudnn_runtime.cudnn_dropout_runs_here()
    if cudnn_dropout or config.attention_probs_dropout_prob == 0:
      fields["attention_implementation"] = "cudnn"
    else:
      logging.warning("Attention runs XLA's kernel: cuDNN's, with its dropout, needs this "
                      "process started with XLA_FLAGS='%s' (the bert_jax commands set it); "
                      "attention_implementation='pallas' (our Triton kernels, dropout inside) "
                      "needs no flag.", cudnn_runtime.CUDNN_OUTSIDE_COMMAND_BUFFERS)
  if ("layer_norm_implementation" not in given and narrow
      and config.low_precision_layer_norm):
    fields["layer_norm_implementation"] = "pallas"
  return fields


# --------------------------------------------- custom kernels in a program split over devices
def dividing_mesh_axes(mesh, shape: tuple[int, ...], logical: tuple[str | None, ...]
                       ) -> list[tuple[str, ...] | None]:
  """Per axis of an activation of `shape`, the mesh axes its logical name maps to under the
  rules in context where they divide it, else None (kept whole): a kernel's `shard_map` specs."""
  axes = []
  for size, names in zip(shape, nn.logical_to_mesh_axes(logical)):
    names = () if names is None else (names,) if isinstance(names, str) else tuple(names)
    ways = math.prod(mesh.shape[n] for n in names)
    axes.append(names if names and size % ways == 0 else None)
  return axes


def per_shard(kernel: Callable[..., jax.Array], operands: tuple, in_specs: tuple, out_spec,
              split: Sequence[tuple[str, ...] | None]) -> jax.Array:
  """`kernel(*operands, shard)` on each device's shard (`shard_map` over the mesh in context:
  XLA cannot partition a Pallas kernel). `shard` is the device's index over the mesh axes in
  `split` (per array axis, as `dividing_mesh_axes` gives them; None: not split), the ones its
  rows are split over, for a kernel that draws random bits to fold into its seed (None where
  nothing is split)."""
  split = tuple(n for names in split if names for n in names)

  def sharded(*operands):
    return kernel(*operands, jax.lax.axis_index(split) if split else None)

  return jax.shard_map(sharded, mesh=jax.sharding.get_abstract_mesh(), in_specs=in_specs,
                       out_specs=out_spec, check_vma=False)(*operands)
