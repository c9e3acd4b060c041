"""Joining a multi-process run (Cloud TPU pod slices, GKE, GPU clusters, local test runs).

Called by every entry point before JAX starts its backends; on one machine it does nothing.
"""

from __future__ import annotations

import glob
import os

import jax


def on_tpu_vm() -> bool:
  """TPU chips attached to this machine (the device nodes the TPU runtime itself looks for)."""
  return bool(glob.glob("/dev/accel[0-9]*") or glob.glob("/dev/vfio/[0-9]*"))


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
