"""Which kind of checkpoint a path is: Google's TF1 checkpoint, a Hugging Face directory, or
one of our Orbax run directories — decided from what lies at the path, never guessed."""

from __future__ import annotations

import glob
import os
import re

from bert_jax import file_io

# The sub-directory of a run directory that holds its Orbax checkpoints.
CHECKPOINTS = "checkpoints"

# A checkpoint's own files: `prefix.index` and `prefix.data-00000-of-00001`.
_TF1_FILE_SUFFIX = re.compile(r"\.(index|data-\d+-of-\d+)$")

_tf = file_io.tensorflow  # only to read a TF1 `checkpoint` state file


def _glob(pattern_dir: str, pattern: str) -> list[str]:
  if file_io.is_remote(pattern_dir):
    return file_io.glob(file_io.join(pattern_dir, pattern))
  return file_io.glob(os.path.join(glob.escape(pattern_dir), pattern))


def tf1_prefix(path: str) -> str | None:
  """The checkpoint prefix that `path` names (the prefix itself, or its `.index` / `.data-*`
  file, a common slip when pasting a path), else None."""
  for candidate in dict.fromkeys((path, _TF1_FILE_SUFFIX.sub("", path))):
    if file_io.exists(candidate + ".index"):
      return candidate
  return None


def tf1_prefixes_in(directory: str) -> list[str]:
  """Prefixes of the TF1 checkpoints directly in `directory`: the one that a `checkpoint` state
  file names (TF1 training output), else every `*.index` (Google's release has no state file)."""
  if file_io.exists(file_io.join(directory, "checkpoint")):
    try:
      latest = _tf().train.latest_checkpoint(directory)
    except Exception:  # pylint: disable=broad-except  # not a state file: fall back to *.index
      latest = None
    if latest:
      return [latest]
  return sorted(p[:-len(".index")] for p in _glob(directory, "*.index"))


KIND_NAMES = {"tf1": "a TF1 checkpoint", "hf": "a Hugging Face directory",
              "orbax": "an Orbax checkpoint (our workdir or checkpoint directory)"}

_HF_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")

_LOOKED_FOR = (
    "  TF1 (Google's release): PATH.index, i.e. PATH is a checkpoint prefix such as "
    ".../bert_model.ckpt; or a directory with one *.index file (or a 'checkpoint' file)\n"
    "  Hugging Face: a directory with " + ", ".join(_HF_FILES) + "\n"
    "  Orbax (our runs): a directory with checkpoints/ (a workdir) or numbered step directories")


def _is_hf_dir(path: str) -> bool:
  return any(file_io.exists(file_io.join(path, f)) for f in _HF_FILES)


def _is_orbax_dir(path: str) -> bool:
  """A workdir (checkpoints/) or a CheckpointManager directory (step directories 0, 100, ...)."""
  if file_io.isdir(file_io.join(path, CHECKPOINTS)):
    return True
  return any(n.isdigit() and file_io.isdir(file_io.join(path, n))
             for n in file_io.listdir(path))


def checkpoint_kind(path: str) -> tuple[str, str]:
  """Which kind of checkpoint `path` is, and where it is exactly: `("tf1", prefix)`,
  `("hf", directory)` or `("orbax", directory)`.

  Only what lies directly at `path` counts, nothing is searched for below it:
    tf1    `path.index` exists (`path` is the prefix; its `.index`/`.data-*` file also works), or
           `path` is a directory with exactly one `*.index`, or a `checkpoint` state file;
    hf     a directory with model.safetensors, its sharded index, or pytorch_model.bin;
    orbax  a directory with `checkpoints/` or numbered step directories.
  A directory matching two kinds, several TF1 checkpoints or none of the kinds is an error that
  says what was found and what was looked for, rather than a guess.
  """
  path = str(path)
  if len(path) > 1 and path.endswith("/") and not path.endswith("://"):
    path = path.rstrip("/")
  prefix = tf1_prefix(path)
  if prefix is not None:
    return "tf1", prefix
  if not file_io.exists(path):
    raise FileNotFoundError(f"{path} does not exist (nor does {path}.index). Looked for:\n"
                            + _LOOKED_FOR)
  if not file_io.isdir(path):
    raise ValueError(f"{path} is a file, not a checkpoint this package reads. Looked for:\n"
                     + _LOOKED_FOR)
  found = []
  tf1_found = tf1_prefixes_in(path)
  if len(tf1_found) > 1:
    raise ValueError(f"{path} holds several TF1 checkpoints ({', '.join(tf1_found)}); pass the "
                     f"prefix of one, e.g. {tf1_found[-1]}.")
  if tf1_found:
    found.append(("tf1", tf1_found[0]))
  if _is_hf_dir(path):
    found.append(("hf", path))
  if _is_orbax_dir(path):
    found.append(("orbax", path))
  if len(found) == 1:
    return found[0]
  if not found:
    raise ValueError(f"{path} is not a checkpoint this package reads. Looked for:\n"
                     + _LOOKED_FOR)
  raise ValueError(f"{path} holds more than one kind of checkpoint ("
                   + "; ".join(f"{KIND_NAMES[k]}: {w}" for k, w in found)
                   + "). Pass a TF1 checkpoint by its prefix, or keep the kinds in separate "
                   "directories.")
