"""Joining a multi-process run (Cloud TPU pod slices, GKE, GPU clusters, local test runs).

Called by every entry point before JAX starts its backends; on one machine it does nothing.
"""

from __future__ import annotations

import functools
import glob
import os
from typing import Sequence

import jax


def on_tpu_vm() -> bool:
  """TPU chips attached to this machine (the device nodes the TPU runtime itself looks for)."""
  return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


# The GPU platforms, as JAX's plugin modules for them are named (xla_cuda12, jax_rocm7_plugin).
_GPU_PLATFORMS = ("cuda", "rocm")


def platforms_off_tpu(on_tpu: bool, has_libtpu: bool, plugins: Sequence[str]) -> str | None:
  """The platforms for JAX to start off a TPU VM where libtpu is installed (this package's `aot`
  extra, for compiling TPU programs ahead of time): JAX would otherwise start the TPU runtime
  to look for chips, which costs seconds and prints lines of libtpu warnings. None (JAX's own
  choice) on a TPU VM, without libtpu, or with a plugin this does not know."""
  if on_tpu or not has_libtpu:
    return None
  platforms = []
  for name in plugins:
    known = _gpu_platforms(name)
    if not known:
      return None
    platforms += known
  return ",".join(dict.fromkeys(platforms + ["cpu"]))


def _gpu_platforms(plugin: str) -> list[str]:
  """The GPU platforms a JAX plugin's name says it starts (none for any other plugin)."""
  return [platform for platform in _GPU_PLATFORMS if platform in plugin]


@functools.cache
def installed_plugins() -> tuple[str, ...]:
  """The names of the JAX plugins installed (entry points and `jax_plugins` modules), read
  once per process."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  import pkgutil  # pylint: disable=g-import-not-at-top
  plugins = [e.name for e in importlib.metadata.entry_points(group="jax_plugins")]
  try:
    import jax_plugins  # pylint: disable=g-import-not-at-top
    plugins += [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
  except ImportError:
    pass
  return tuple(plugins)


def gpu_plugin_installed() -> bool:
  """Whether JAX can start a GPU backend here (a CUDA or ROCm plugin is installed)."""
  return any(_gpu_platforms(name) for name in installed_plugins())


def skip_absent_tpu() -> None:
  """`platforms_off_tpu` applied, where the user chose no platform (JAX_PLATFORMS); called by
  the commands before JAX starts its backends."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  if os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms:
    return
  chosen = platforms_off_tpu(on_tpu_vm(), importlib.util.find_spec("libtpu") is not None,
                             installed_plugins())
  if chosen:
    jax.config.update("jax_platforms", chosen)


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None,
                           process_id: int | None = None) -> None:
  """Joins a multi-process run before JAX starts its backends.

  Given a coordinator, with those arguments (GPU clusters, local test runs). On Cloud TPU VMs
  `jax.distributed.initialize()` reads the slice from the TPU metadata (one worker or many),
  and the coordination service it starts is what Orbax's multi-host checkpoints and the
  preemption notice rely on; on GKE the worker list comes from `TPU_WORKER_HOSTNAMES`.
  Elsewhere (a CPU or a single GPU machine) there is nothing to join.
  """
  if coordinator_address:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
    return
  hostnames = [h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]
  if len(hostnames) > 1 or on_tpu_vm():
    jax.distributed.initialize()
