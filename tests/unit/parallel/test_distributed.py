"""Which platforms a command starts: off a TPU VM, JAX with libtpu installed (the `aot` extra)
is kept from starting the TPU runtime to look for chips (seconds, and lines of libtpu warnings
on every command); a command run that way prints its own lines only."""

import os
import subprocess
import sys

from absl import logging as absl_logging
import pytest

from bert_jax.parallel import distributed
from tests import helpers


@pytest.mark.parametrize("on_tpu, has_libtpu, plugins, expected", [
    (False, True, [], "cpu"),
    (False, True, ["xla_cuda12"], "cuda,cpu"),
    (False, True, ["xla_cuda13", "xla_cuda12"], "cuda,cpu"),
    (False, True, ["xla_rocm7"], "rocm,cpu"),
    (False, True, ["someone_elses_accelerator"], None),  # not ours to rule out
    (True, True, [], None),  # a TPU VM: JAX's own choice, the TPU first
    (False, False, [], None),  # no libtpu: nothing to skip
])
def test_platforms_off_a_tpu_vm(on_tpu, has_libtpu, plugins, expected):
  assert distributed.platforms_off_tpu(on_tpu, has_libtpu, plugins) == expected


@pytest.mark.e2e
def test_a_command_off_a_tpu_vm_prints_its_own_lines_only(tmp_path):
  """No JAX_PLATFORMS: libtpu is installed and this is no TPU VM; `convert` says what it read
  and wrote, and nothing from libtpu, JAX or Orbax."""
  assert not distributed.on_tpu_vm()
  source = tmp_path / "hf_in"
  proc = subprocess.run(
      [sys.executable, "-m", "bert_jax.convert", f"--from={helpers.minilm_dir()}",
       f"--to={source}", "--format=orbax"],
      env={k: v for k, v in helpers.command_env().items() if k != "JAX_PLATFORMS"},
      capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stderr.strip() == "", proc.stderr[-3000:]
  assert [line.split(":")[0].split(" ")[0] for line in proc.stdout.splitlines()] == [
      "read", "copied", "wrote"], proc.stdout
  assert os.path.isdir(source)


@pytest.mark.parametrize("plugins, gpu", [
    ([], False), (["xla_cuda12"], True), (["jax_rocm7_plugin"], True),
    (["someone_elses_accelerator"], False),
])
def test_commands_set_the_cudnn_flag_only_where_a_gpu_can_start(monkeypatch, plugins, gpu):
  """`cli.prepare_process` keeps cuDNN's kernels out of XLA's command buffers where a GPU
  plugin is installed, and leaves XLA_FLAGS alone on CPU and TPU machines."""
  from bert_jax import cli  # pylint: disable=g-import-not-at-top
  from bert_jax.model import cudnn_runtime  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(distributed, "installed_plugins", lambda: plugins)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # the platform choice is not under test here
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
  assert distributed.gpu_plugin_installed() is gpu
  verbosity = absl_logging.get_verbosity()
  try:
    cli.prepare_process()
  finally:  # it quiets absl's logging, as a command wants; the tests after this one do not
    absl_logging.set_verbosity(verbosity)
  expected = "--xla_force_host_platform_device_count=2"
  if gpu:
    expected += " " + cudnn_runtime.CUDNN_OUTSIDE_COMMAND_BUFFERS
  assert os.environ["XLA_FLAGS"] == expected
