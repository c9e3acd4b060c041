"""cuDNN's attention dropout kept out of XLA's command buffers: the XLA_FLAGS the commands set,
read the way XLA reads them, and the error a process started otherwise gets."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from bert_jax.model import cudnn_runtime
from bert_jax.model import modeling
from bert_jax.model import target

FLAG = cudnn_runtime.COMMAND_BUFFER_FLAG


@pytest.mark.parametrize("xla_flags, inside", [
    ("", True),                                             # XLA's default list holds CUDNN
    ("--xla_force_host_platform_device_count=8", True),
    (f"{FLAG}=-CUDNN", False),
    (f"{FLAG}=", False),                                     # no command buffers at all
    (f"{FLAG}=FUSION,CUBLAS,CUSTOM_CALL", False),
    (f"{FLAG}=FUSION,cudnn", True),
    (f"{FLAG}=+CUBLASLT", True),                             # a change that keeps CUDNN
    (f"{FLAG}=-CUDNN,+CUDNN", True),                         # changes apply in order
    (f"{FLAG}=-CUDNN {FLAG}=FUSION,CUDNN", True),            # the last occurrence decides
    (f"{FLAG}=FUSION,CUDNN {FLAG}=-CUDNN", False),
])
def test_whether_cudnn_kernels_stay_in_command_buffers(xla_flags, inside):
  assert cudnn_runtime.cudnn_in_command_buffers(xla_flags) is inside


def test_prepare_adds_the_setting_once_and_keeps_a_users_choice():
  environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  cudnn_runtime.prepare(environ)
  assert environ["XLA_FLAGS"] == ("--xla_force_host_platform_device_count=8 "
                                  + cudnn_runtime.CUDNN_OUTSIDE_COMMAND_BUFFERS)
  cudnn_runtime.prepare(environ)
  assert environ["XLA_FLAGS"].count(FLAG) == 1
  assert not cudnn_runtime.cudnn_in_command_buffers(environ["XLA_FLAGS"])
  empty = {}
  cudnn_runtime.prepare(empty)
  assert empty["XLA_FLAGS"] == cudnn_runtime.CUDNN_OUTSIDE_COMMAND_BUFFERS
  users = {"XLA_FLAGS": f"{FLAG}=FUSION,CUDNN"}
  cudnn_runtime.prepare(users)
  assert users["XLA_FLAGS"] == f"{FLAG}=FUSION,CUDNN"  # theirs stands; the check still guards


def test_xla_accepts_the_flags_prepare_writes():
  """XLA parses every flag of XLA_FLAGS when its backends start and stops the process on a value
  it does not know (a misspelt kind would), so the flags must be XLA's own."""
  environ = {"XLA_FLAGS": ""}
  cudnn_runtime.prepare(environ)
  code = "import jax, jax.numpy as jnp; print(float(jnp.arange(4.0).sum()))"
  for xla_flags in (environ["XLA_FLAGS"], f"{FLAG}=-CUDNN_TYPO"):
    env = dict(os.environ, XLA_FLAGS=xla_flags, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    if xla_flags == environ["XLA_FLAGS"]:
      assert done.returncode == 0 and done.stdout.strip() == "6.0", done.stderr[-2000:]
    else:  # the same run with a kind XLA does not know fails: the check above could fail
      assert done.returncode != 0 and "6.0" not in done.stdout


def test_check_names_the_flag_on_gpus_only():
  cudnn_runtime.check_cudnn_dropout("cpu", {"XLA_FLAGS": ""})
  cudnn_runtime.check_cudnn_dropout("tpu", {})
  cudnn_runtime.check_cudnn_dropout("gpu", {"XLA_FLAGS": f"{FLAG}=-CUDNN"})
  with pytest.raises(ValueError, match=r"XLA_FLAGS='--xla_gpu_enable_command_buffer=-CUDNN'"):
    cudnn_runtime.check_cudnn_dropout("gpu", {"XLA_FLAGS": "--xla_gpu_autotune_level=0"})


def test_the_attention_call_site_checks_before_lowering(monkeypatch):
  """On a GPU started with cuDNN's kernels in command buffers, the cuDNN path with dropout
  stops at the check, before JAX's cuDNN lowering is reached; without dropout it needs none."""
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setenv("XLA_FLAGS", "")
  q = jnp.ones((1, 8, 2, 16), jnp.bfloat16)
  mask = jnp.ones((1, 8), jnp.int32)
  with pytest.raises(ValueError, match="command buffers"):
    modeling.dot_product_attention(q, q, q, mask, dropout_rate=0.1, dropout_rng=None,
                                   deterministic=False, implementation="cudnn", cudnn_seed=3)
  monkeypatch.setenv("XLA_FLAGS", cudnn_runtime.CUDNN_OUTSIDE_COMMAND_BUFFERS)
  with pytest.raises(Exception) as raised:  # the check passes; cuDNN is absent on this CPU
    modeling.dot_product_attention(q, q, q, mask, dropout_rate=0.1, dropout_rng=None,
                                   deterministic=False, implementation="cudnn", cudnn_seed=3)
  assert "command buffers" not in str(raised.value)


def test_defaults_choose_cudnn_attention_only_where_its_dropout_runs(monkeypatch, caplog):
  """A GPU process started without the flags the commands set (a notebook's) cannot run cuDNN's
  attention dropout: the defaults of a recent GPU then leave attention to XLA and say how to get
  cuDNN's, instead of choosing a kernel the call site refuses. Without attention dropout, with
  the flags, or compiling ahead of time from a CPU process, cuDNN's attention stays."""
  assert not cudnn_runtime.cudnn_dropout_runs_here("gpu", {"XLA_FLAGS": ""})
  assert cudnn_runtime.cudnn_dropout_runs_here(
      "gpu", {"XLA_FLAGS": cudnn_runtime.CUDNN_OUTSIDE_COMMAND_BUFFERS})
  assert cudnn_runtime.cudnn_dropout_runs_here("cpu", {"XLA_FLAGS": ""})
  base = modeling.get_preset("base").replace(dtype="bfloat16")
  assert target.fused_kernel_fields(base, set(), (9, 0), 128, cudnn_dropout=False) == {
      "layer_norm_implementation": "pallas"}
  assert target.fused_kernel_fields(base, set(), (9, 0), 128, cudnn_dropout=True) == {
      "attention_implementation": "cudnn", "layer_norm_implementation": "pallas"}
  no_dropout = base.replace(attention_probs_dropout_prob=0.0)
  assert target.fused_kernel_fields(no_dropout, set(), (9, 0), 128, cudnn_dropout=False)[
      "attention_implementation"] == "cudnn"
  # This process decides by its own backend and XLA_FLAGS: a CPU process compiling for a GPU
  # chooses cuDNN's; a GPU process without the flags does not, and says why.
  monkeypatch.setenv("XLA_FLAGS", "")
  assert "attention_implementation" in target.fused_kernel_fields(base, set(), (9, 0), 128)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  with caplog.at_level("WARNING"):
    fields = target.fused_kernel_fields(base, set(), (9, 0), 128)
  assert "attention_implementation" not in fields
  assert cudnn_runtime.CUDNN_OUTSIDE_COMMAND_BUFFERS in caplog.text
