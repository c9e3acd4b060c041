"""Checks, on a TPU VM worker, that a run's inputs are readable and its output directory writable.

    python3 launch/preflight.py --glob='gs://BUCKET/data128/*.tfrecord' \
        --exists=gs://BUCKET/vocab.txt --writable=gs://BUCKET/bert_base

    python3 launch/preflight.py --compile_for=v4-32 -- --config=configs/pretrain.py:base

tpu_pretrain.sh and tpu_finetune.sh run this on every worker before the trainer, because the
commonest way to lose an hour of a pod slice is a run that compiles for minutes and then finds
that the bucket path has a typo, or that the VMs' service account (not the user's own account,
which may well have access) cannot read the data or write the workdir. Every problem is reported
at once, naming the path and the account, and the exit status is 1 if there is any.

With `--compile_for`, it first compiles the trainer's exact step for that slice's real topology
on this machine (`python -m bert_jax.pretrain --compile_for`, libtpu without a TPU): the launcher
runs that before it creates the slice, so a config that does not fit its chips, or does not
build, costs minutes on a laptop instead of a pod.

Paths go through `bert_jax.file_io`: gs:// by `tf.io.gfile` (gsutil is not on every TPU VM
image; TensorFlow is a dependency of the package), local paths by plain Python, so TensorFlow is
only imported where a bucket is involved.
"""

from __future__ import annotations

import argparse
import glob
import os
import socket
import subprocess
import sys
import urllib.request
import uuid

# Run as a script from the checkout: the package beside it does the file access.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bert_jax import file_io  # pylint: disable=g-import-not-at-top,wrong-import-position

_METADATA = ("http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/"
             "default/email")


def service_account() -> str | None:
  """The identity the VM reaches Cloud Storage with: its service account, from the metadata
  server (None off Google Cloud, where the local credentials are used)."""
  request = urllib.request.Request(_METADATA, headers={"Metadata-Flavor": "Google"})
  try:
    with urllib.request.urlopen(request, timeout=3) as response:
      return response.read().decode().strip()
  except Exception:  # pylint: disable=broad-except
    return None


def _first_line(error: Exception) -> str:
  text = str(getattr(error, "message", "") or error).strip()
  return text.splitlines()[0] if text else type(error).__name__


def check_glob(patterns: str) -> list[str]:
  """Each comma-separated pattern must match at least one file (not only a directory)."""
  problems = []
  for pattern in [p.strip() for p in patterns.split(",") if p.strip()]:
    try:
      matched = file_io.glob(pattern)
      directories = [m for m in matched if file_io.isdir(m)]
    except Exception as e:  # pylint: disable=broad-except
      problems.append(f"cannot list {pattern}: {_first_line(e)}")
      continue
    if not matched:
      problems.append(f"no files match {pattern}")
    elif len(directories) == len(matched):
      problems.append(f"{pattern} names a directory, not files: give a glob such as "
                      f"{pattern.rstrip('/')}/*.tfrecord")
    else:
      print(f"  ok: {len(matched) - len(directories)} files match {pattern}")
  return problems


def check_exists(path: str) -> list[str]:
  """A file or directory (a checkpoint, a vocabulary, a GLUE task directory) must exist, or be
  the prefix of a TF1 checkpoint (`bert_model.ckpt` is `bert_model.ckpt.index` and `.data-*`)."""
  try:
    found = file_io.exists(path) or bool(
        file_io.glob((path if file_io.is_remote(path) else glob.escape(path)) + ".*"))
  except Exception as e:  # pylint: disable=broad-except
    return [f"cannot read {path}: {_first_line(e)}"]
  if not found:
    return [f"{path} does not exist"]
  print(f"  ok: {path} exists")
  return []


def check_writable(directory: str) -> list[str]:
  """Creates the directory, writes a probe object into it, reads it back and deletes it."""
  probe = file_io.join(directory, f".preflight-{socket.gethostname()}-{uuid.uuid4().hex[:8]}")
  payload = b"bert_jax preflight probe\n"
  try:
    file_io.makedirs(directory)
    file_io.write_bytes_atomic(probe, payload)
    ok = file_io.read_bytes(probe) == payload
    file_io.remove(probe)
  except Exception as e:  # pylint: disable=broad-except
    return [f"cannot write to {directory}: {_first_line(e)}"]
  if not ok:
    return [f"{directory}: a probe object read back different from what was written"]
  print(f"  ok: {directory} is writable")
  return []


def check_compile(accelerator: str, trainer_flags: list[str]) -> list[str]:
  """Compiles the trainer's step for the slice (output shown as it comes); a problem if the step
  does not fit or does not build."""
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  command = [sys.executable, "-m", "bert_jax.pretrain", f"--compile_for={accelerator}",
             *trainer_flags]
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  print(f"  compiling the step for {accelerator} on this machine...", flush=True)
  proc = subprocess.run(command, cwd=repo, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, check=False)
  lines = [l for l in proc.stdout.splitlines() if l.strip()]
  for line in lines:
    print(f"    {line}")
  if proc.returncode == 0:
    return []
  last = next((l for l in reversed(lines) if l.startswith("error:")), lines[-1] if lines else "")
  return [f"the step does not fit or build for {accelerator}: {last}"]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--glob", action="append", default=[],
                      help="comma-separated glob patterns that must each match files")
  parser.add_argument("--exists", action="append", default=[],
                      help="a file or directory that must exist")
  parser.add_argument("--writable", action="append", default=[],
                      help="a directory that must be writable (created if missing)")
  parser.add_argument("--compile_for", default="",
                      help="a TPU type (v4-32, v5p-64, ...): compile the trainer's step for it "
                           "here first; the trainer's flags follow --")
  argv = sys.argv[1:] if argv is None else list(argv)
  trainer_flags = argv[argv.index("--") + 1:] if "--" in argv else []
  args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
  if args.compile_for and not trainer_flags:
    parser.error("--compile_for needs the trainer's flags after --, e.g. -- "
                 "--config=configs/pretrain.py:base")

  host = socket.gethostname()
  print(f"preflight on {host}:")
  problems = []
  if args.compile_for:
    problems += check_compile(args.compile_for, trainer_flags)
  for patterns in args.glob:
    problems += check_glob(patterns)
  for path in args.exists:
    problems += check_exists(path)
  for directory in args.writable:
    problems += check_writable(directory)
  if not problems:
    return 0

  paths = args.glob + args.exists + args.writable
  lines = [f"preflight on {host} FAILED; nothing was started:"] + [f"  - {p}" for p in problems]
  if any(file_io.is_remote(p) for p in paths):
    account = service_account()
    buckets = sorted({p.split("://", 1)[1].split("/", 1)[0] for p in paths if file_io.is_remote(p)})
    if account is None:
      lines.append("Check the paths and that the credentials of this machine can use them.")
      buckets = []
    else:
      lines += [
          f"The TPU VMs use Cloud Storage as the service account {account}, not as your own",
          "account. Check the paths, then give that service account access, e.g.",
      ]
    for bucket in buckets:
      lines.append(f"  gcloud storage buckets add-iam-policy-binding gs://{bucket} "
                   f"--member=serviceAccount:{account} --role=roles/storage.objectUser")
    if buckets:
      lines.append("(roles/storage.objectViewer is enough for buckets that are only read.)")
  print("\n".join(lines), file=sys.stderr)
  return 1


if __name__ == "__main__":
  sys.exit(main())
