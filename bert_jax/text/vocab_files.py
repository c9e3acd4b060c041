"""The vocabulary kept beside every model this package writes, and the check against it.

A model is only as good as the vocabulary it was trained with: a `vocab.txt` of the same size
from another corpus loads without complaint and turns every input into the wrong ids. So every
pre-training workdir, fine-tuning output and export keeps a copy of its vocabulary (`vocab.txt`
for WordPiece, `spm.model` for SentencePiece) plus `vocab.json` with its SHA-256 and size, and
every command that is handed a vocabulary for a model compares it with the kept one.
"""

from __future__ import annotations

import hashlib
import json
import os

from bert_jax import file_io

KEPT_NAMES = ("vocab.txt", "spm.model")
RECORD = "vocab.json"


def sha256(path: str) -> str:
  return hashlib.sha256(file_io.read_bytes(path)).hexdigest()


def kept_name(source: str, sentencepiece: bool | None = None) -> str:
  """`spm.model` for a SentencePiece model (by default: a `.model` file), else `vocab.txt`."""
  if sentencepiece is None:
    sentencepiece = source.endswith(".model")
  return "spm.model" if sentencepiece else "vocab.txt"


def keep(source: str, directory: str, *, sentencepiece: bool | None = None, **details) -> str:
  """Copies `source` into `directory` (as `vocab.txt` or `spm.model`) with its `vocab.json`
  record (SHA-256, bytes, where it came from, and `details` such as `do_lower_case`). Returns the
  kept path. Copying a file onto itself only (re)writes the record."""
  target = file_io.join(directory, kept_name(source, sentencepiece))
  data = file_io.read_bytes(source)
  if os.path.abspath(source) != os.path.abspath(target):
    file_io.write_bytes_atomic(target, data)
  record = {"file": os.path.basename(target), "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data), "source": source, **details}
  file_io.write_text_atomic(file_io.join(directory, RECORD), json.dumps(record, indent=1) + "\n")
  return target


def find_kept(directory: str) -> str | None:
  """The vocabulary kept in `directory`, if any."""
  for name in KEPT_NAMES:
    path = file_io.join(directory, name)
    if file_io.exists(path):
      return path
  return None


def copy_kept(source_dir: str, target_dir: str) -> str | None:
  """Carries the vocabulary kept in `source_dir` (and its record) to `target_dir`; returns the
  new path, or None when `source_dir` keeps none."""
  found = find_kept(source_dir)
  if found is None:
    return None
  details = {}
  record_path = file_io.join(source_dir, RECORD)
  if file_io.exists(record_path):
    try:
      details = {k: v for k, v in json.loads(file_io.read_text(record_path)).items()
                 if k not in ("file", "sha256", "bytes", "source")}
    except ValueError:
      details = {}
  return keep(found, target_dir, **details)


def check_same(given: str, kept: str, flag: str = "--vocab_file") -> None:
  """Raises ValueError when `given` is not byte-for-byte the vocabulary kept at `kept`."""
  if os.path.abspath(given) == os.path.abspath(kept):
    return
  a, b = sha256(given), sha256(kept)
  if a != b:
    raise ValueError(
        f"{flag}={given} (sha256 {a[:12]}) is not the vocabulary this model was trained with "
        f"({kept}, sha256 {b[:12]}): leave {flag} out to use the model's own, or pass that "
        "file.")
