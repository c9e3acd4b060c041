"""Which platform a program is being built for, where the model's choices depend on it."""

from __future__ import annotations

import jax


def target_platform() -> str:
  """The platform the program is built for: the devices of the mesh in context (a TPU topology
  compiled for ahead of time from a CPU machine is "tpu"), else the default backend."""
  device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
  return device.platform if device is not None else jax.default_backend()
