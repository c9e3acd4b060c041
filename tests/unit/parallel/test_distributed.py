"""Which platforms a command starts: off a TPU VM, JAX with libtpu installed (the `aot` extra)
is kept from starting the TPU runtime to look for chips (seconds, and lines of libtpu warnings
on every command); a command run that way prints its own lines only."""

import os
import subprocess
import sys

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
