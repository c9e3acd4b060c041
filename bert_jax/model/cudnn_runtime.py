"""What XLA's GPU runtime must be told, before JAX starts its backends, for cuDNN's attention.

cuDNN's fused attention with dropout cannot be recorded into a CUDA graph. By default XLA
records runs of kernels, cuDNN's among them, into command buffers (CUDA graphs) and replays
them; recording a cuDNN graph that draws dropout masks stops the process with
`Check failed: local_device_ordinal.has_value()` in `CudnnGraph::PackOperands` (seen with
jax 0.11.2 on an H200, on the paper recipe's step with attention_implementation="cudnn"; the
attention checks, programs of a few kernels, ran). With cuDNN's kernels left out of
command buffers (`--xla_gpu_enable_command_buffer=-CUDNN`: every other kind stays in) the same
step runs (benchmarks/RESULTS.md, the GPU run of the paper recipe).

XLA reads XLA_FLAGS once, when its backends start, so the commands call `prepare` first thing
(`cli.prepare_process`), and the attention call site (`modeling._cudnn_attention`) checks the
setting (`check_cudnn_dropout`), so that a process started otherwise (a notebook, a script of
the user's) gets this explanation instead of the abort.
"""

from __future__ import annotations

import os
from typing import Mapping, MutableMapping

COMMAND_BUFFER_FLAG = "--xla_gpu_enable_command_buffer"
_ALL_BUT_CUDNN = "-CUDNN"  # the default kinds, less cuDNN's
CUDNN_OUTSIDE_COMMAND_BUFFERS = f"{COMMAND_BUFFER_FLAG}={_ALL_BUT_CUDNN}"


def xla_flag_value(xla_flags: str, flag: str) -> str | None:
  """The value XLA_FLAGS `xla_flags` give `flag` ("--xla_..."; its last occurrence decides), or
  None where they do not set it."""
  value = None
  for token in xla_flags.split():
    if token.startswith(flag + "="):
      value = token.split("=", 1)[1].strip("'\"")
  return value


def default_xla_flag(flag: str, value: str,
                     environ: MutableMapping[str, str] = os.environ) -> None:
  """Appends `flag=value` to XLA_FLAGS unless they set `flag` already (the user's choice
  stands). Effective only before JAX starts its backends."""
  flags = environ.get("XLA_FLAGS", "")
  if xla_flag_value(flags, flag) is None:
    environ["XLA_FLAGS"] = f"{flags} {flag}={value}".strip()


def cudnn_in_command_buffers(xla_flags: str) -> bool:
  """Whether XLA_FLAGS `xla_flags` leave cuDNN's kernels in command buffers, as XLA's default
  does. The flag's value is a list of command kinds: either the kinds themselves (CUDNN among
  them or not; empty: no command buffers at all), or changes to the default list (`+KIND`,
  `-KIND`), applied in order."""
  value = xla_flag_value(xla_flags, COMMAND_BUFFER_FLAG)
  if value is None:
    return True
  kinds = [kind.strip().upper() for kind in value.split(",") if kind.strip()]
  if not any(kind[0] in "+-" for kind in kinds):
    return "CUDNN" in kinds
  included = True
  for kind in kinds:
    if kind.lstrip("+-") == "CUDNN":
      included = not kind.startswith("-")
  return included


def prepare(environ: MutableMapping[str, str] = os.environ) -> None:
  """Keeps cuDNN's kernels out of XLA's command buffers, unless XLA_FLAGS already chooses the
  command buffers' kinds (the user's choice stands; `check_cudnn_dropout` still guards it).
  Effective only before JAX starts its backends; harmless off GPUs, whose compilers ignore
  GPU flags."""
  default_xla_flag(COMMAND_BUFFER_FLAG, _ALL_BUT_CUDNN, environ)


def cudnn_dropout_runs_here(platform: str | None = None,
                            environ: Mapping[str, str] = os.environ) -> bool:
  """Whether a process of `platform` (None: this process's default backend) with `environ`'s
  XLA_FLAGS can run cuDNN's attention dropout: anywhere but on a GPU whose XLA_FLAGS leave
  cuDNN's kernels in command buffers (which `check_cudnn_dropout` refuses). A program compiled
  ahead of time for a GPU from a CPU process runs in another process: True."""
  if platform is None:
    import jax  # only once the backends may start: after `prepare`
    platform = jax.default_backend()
  return platform != "gpu" or not cudnn_in_command_buffers(environ.get("XLA_FLAGS", ""))


def check_cudnn_dropout(platform: str,
                        environ: MutableMapping[str, str] = os.environ) -> None:
  """Raises ValueError, before anything is compiled, where cuDNN's attention dropout would run
  on a GPU inside a command buffer and stop the process."""
  if cudnn_dropout_runs_here(platform, environ):
    return
  raise ValueError(
      "attention_implementation='cudnn' with attention dropout needs cuDNN's kernels kept out "
      "of XLA's command buffers (CUDA graphs), where XLA stops the process on recording them. "
      f"Start the process with XLA_FLAGS='{CUDNN_OUTSIDE_COMMAND_BUFFERS}' (the bert_jax "
      "commands set it themselves), or set attention_probs_dropout_prob=0 or another "
      f"attention_implementation. XLA_FLAGS now: {environ.get('XLA_FLAGS', '')!r}.")
