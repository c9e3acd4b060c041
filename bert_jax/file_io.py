"""Reading and writing files on local disks and on `gs://` alike.

Local paths use plain Python so that library code does not pay TensorFlow's import time for a
JSON file; any path with a scheme (`gs://`, `s3://`, ...) goes through `tf.io.gfile`, which is
what Cloud TPU VMs use to reach buckets. Writes go to a temporary name and are renamed when
complete, so a reader never sees a half-written file as if it were whole.
"""

from __future__ import annotations

import os
import uuid


def is_remote(path: str) -> bool:
  return "://" in str(path)


def tensorflow():
  """TensorFlow, imported on first use (it takes seconds) and kept off JAX's accelerator.

  The one place the package imports it: quiet logging, no oneDNN rewrites, and no GPU for
  TensorFlow, which would otherwise reserve the memory JAX needs.
  """
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:
    pass  # TensorFlow was initialised earlier, with its devices hidden then
  return tf


def tensorflow_datasets():
  """tensorflow-datasets, after `tensorflow()` has set TensorFlow up."""
  tensorflow()
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return tfds


def _gfile():
  return tensorflow().io.gfile


def exists(path: str) -> bool:
  return _gfile().exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return _gfile().isdir(path) if is_remote(path) else os.path.isdir(path)


def size(path: str) -> int:
  """Bytes in the file (gs:// from its metadata, nothing read)."""
  return _gfile().stat(path).length if is_remote(path) else os.path.getsize(path)


def listdir(path: str) -> list[str]:
  """Entry names (no trailing "/" on remote directories)."""
  return ([n.rstrip("/") for n in _gfile().listdir(path)] if is_remote(path)
          else os.listdir(path))


def glob(pattern: str) -> list[str]:
  if is_remote(pattern):
    return list(_gfile().glob(pattern))
  import glob as glob_lib  # pylint: disable=g-import-not-at-top
  return glob_lib.glob(pattern)


def remove(path: str) -> None:
  if is_remote(path):
    _gfile().remove(path)
  else:
    os.remove(path)


def rename(src: str, dst: str) -> None:
  """Replaces `dst` (an atomic rename on local disks; copy-and-delete on object stores)."""
  if is_remote(dst):
    _gfile().rename(src, dst, overwrite=True)
  else:
    os.replace(src, dst)


def join(*parts: str) -> str:
  if is_remote(parts[0]):
    return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts))
  return os.path.join(*parts)


def read_bytes(path: str) -> bytes:
  if is_remote(path):
    with _gfile().GFile(path, "rb") as f:
      return f.read()
  with open(path, "rb") as f:
    return f.read()


def read_text(path: str) -> str:
  data = read_bytes(path)
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data[:e.start].count(b"\n") + 1
    raise ValueError(f"{path}: line {line}: bytes are not valid UTF-8 ({e.reason}).") from e


def makedirs(path: str) -> None:
  if is_remote(path):
    _gfile().makedirs(path)
  else:
    os.makedirs(path, exist_ok=True)


def write_bytes_atomic(path: str, data: bytes) -> None:
  """Writes `data` under a temporary name in the same directory, then renames it into place."""
  directory = os.path.dirname(path) if not is_remote(path) else path.rsplit("/", 1)[0]
  if directory:
    makedirs(directory)
  tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
  if is_remote(path):
    gfile = _gfile()
    with gfile.GFile(tmp, "wb") as f:
      f.write(data)
    gfile.rename(tmp, path, overwrite=True)
    return
  try:
    with open(tmp, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_text_atomic(path: str, text: str) -> None:
  write_bytes_atomic(path, text.encode("utf-8"))


def pid_alive(pid: int) -> bool:
  """Whether process `pid` of this machine is running (a zombie is not; another user's is):
  whether the owner of a lock or of a temporary output is still there to finish it."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
        return False  # exited, not yet reaped by its parent
  except (OSError, IndexError):
    pass
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process: alive
    return True
  except OSError:
    return False
  return True
