"""Reading the raw corpus: input globs, documents, and the split of documents into shards.

Input is the original BERT format: one sentence per line, a blank line between documents.
Documents are dealt to output shards as they stream past (round robin from a seeded offset per
input file), written to one local bucket file per (shard, input file), so that each shard can
then be processed on its own, in parallel and in memory bounded by the shard. Which shard a
document lands in depends only on the seed, the number of shards and its place in its file —
never on how many processes do the work.
"""

from __future__ import annotations

import glob as pyglob
import os
from typing import Callable, Iterator

import numpy as np

from bert_jax import file_io

DECODE_ERRORS = ("strict", "ignore", "replace")
_READ_BLOCK = 1 << 22  # bytes read (and decoded) at a time


def expand_input_patterns(spec: str) -> list[str]:
  """Comma-separated globs (local or gs://) → files, in pattern order, sorted within a pattern."""
  files: list[str] = []
  for pattern in (p.strip() for p in spec.split(",")):
    if not pattern:
      continue
    if file_io.is_remote(pattern):
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      matched = sorted(tf.io.gfile.glob(pattern))
    else:
      matched = sorted(p for p in pyglob.glob(os.path.expanduser(pattern)) if os.path.isfile(p))
    if not matched:
      raise FileNotFoundError(f"--input_file: {pattern!r} matches no file.")
    files.extend(m for m in matched if m not in files)
  if not files:
    raise FileNotFoundError("--input_file names no file.")
  return files


def _open_binary(path: str):
  if file_io.is_remote(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.io.gfile.GFile(path, "rb")
  return open(path, "rb")  # pylint: disable=consider-using-with


def file_size(path: str) -> int:
  if file_io.is_remote(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.io.gfile.stat(path).length
  return os.path.getsize(path)


def iter_documents(path: str, decode_errors: str = "strict", stats: dict | None = None,
                   on_bytes: Callable[[int], None] | None = None) -> Iterator[list[str]]:
  """Documents of one input file as lists of stripped, non-empty lines.

  Bytes that are not UTF-8 stop the run with the file and line (the original dropped them
  silently); `decode_errors="ignore"` or `"replace"` lets them through and counts the lines.
  The file is read and decoded in blocks of whole lines; only a block that holds bytes that are
  not UTF-8 is gone through line by line, to find them.
  """
  if decode_errors not in DECODE_ERRORS:
    raise ValueError(f"decode_errors must be one of {DECODE_ERRORS}, not {decode_errors!r}.")
  stats = stats if stats is not None else {}
  for key in ("bytes", "lines", "bad_lines"):
    stats.setdefault(key, 0)
  document: list[str] = []
  lines_before = 0  # lines of the file before the current block

  def decode(block: bytes) -> list[str]:
    raw_lines = block.split(b"\n")
    if not raw_lines[-1]:  # the block ends with a newline
      raw_lines.pop()
    stats["lines"] += len(raw_lines)
    stats["bytes"] += len(block)
    try:
      return block.decode("utf-8").split("\n")[:len(raw_lines)]
    except UnicodeDecodeError:
      pass
    lines = []
    for number, raw in enumerate(raw_lines, start=lines_before + 1):
      try:
        lines.append(raw.decode("utf-8"))
      except UnicodeDecodeError as e:
        if decode_errors == "strict":
          raise ValueError(
              f"{path}: line {number}: bytes are not valid UTF-8 ({e.reason} at byte "
              f"{e.start} of the line: {raw[max(0, e.start - 10):e.start + 10]!r}). Fix the "
              "file, or pass --decode_errors=ignore to drop such bytes (what the original "
              "script did) or --decode_errors=replace.") from None
        stats["bad_lines"] += 1
        lines.append(raw.decode("utf-8", errors=decode_errors))
    return lines

  with _open_binary(path) as f:
    carry: list[bytes] = []  # the start of a line that goes on in the next read
    while True:
      chunk = f.read(_READ_BLOCK)
      cut = chunk.rfind(b"\n") + 1
      if chunk and not cut:
        carry.append(chunk)
        continue
      block = b"".join(carry) + chunk[:cut] if chunk else b"".join(carry)
      carry = [chunk[cut:]] if chunk else []
      if block:
        lines = decode(block)
        lines_before += len(lines)
        for line in lines:
          line = line.strip()
          if line:
            document.append(line)
          elif document:
            yield document
            document = []
        if on_bytes is not None:
          on_bytes(len(block))
      if not chunk:
        break
  if document:
    yield document


def shard_offset(random_seed: int, file_index: int, num_shards: int) -> int:
  """Where the round robin of documents over shards starts for one input file."""
  state = np.random.SeedSequence([random_seed, file_index, 0x5EED]).generate_state(1)[0]
  return int(state) % num_shards


def bucket_path(bucket_dir: str, shard: int, file_index: int) -> str:
  return os.path.join(bucket_dir, f"shard-{shard:05d}", f"file-{file_index:05d}.txt")


def split_into_buckets(path: str, file_index: int, num_shards: int, shards_wanted: set[int],
                       random_seed: int, bucket_dir: str, decode_errors: str = "strict",
                       on_bytes: Callable[[int], None] | None = None) -> dict:
  """Deals the documents of one input file to shard buckets; returns the file's counts.

  Only shards in `shards_wanted` are written (a rerun skips finished shards), but every document
  is still counted against its shard so that the deal is the same as in a full run.
  """
  stats: dict = {}
  buffers: dict[int, list[str]] = {}
  buffered = 0

  def flush():
    nonlocal buffered
    for shard, texts in buffers.items():
      target = bucket_path(bucket_dir, shard, file_index)
      os.makedirs(os.path.dirname(target), exist_ok=True)
      with open(target, "a", encoding="utf-8") as f:
        f.write("".join(texts))
    buffers.clear()
    buffered = 0

  offset = shard_offset(random_seed, file_index, num_shards)
  documents = 0
  for document in iter_documents(path, decode_errors, stats, on_bytes):
    shard = (offset + documents) % num_shards
    documents += 1
    if shard in shards_wanted:
      text = "\n".join(document) + "\n\n"
      buffers.setdefault(shard, []).append(text)
      buffered += len(text)
      if buffered > 1 << 24:
        flush()
  flush()
  stats["documents_read"] = documents
  return stats


def read_bucket_blocks(paths: list[str], block_chars: int = 1 << 20) -> Iterator[str]:
  """A shard's documents back from its bucket files (written by `split_into_buckets`), as
  blocks of about `block_chars` characters that hold whole documents: lines separated by "\n",
  a blank line after each document. Blocks let the tokenizer work on many lines at once.
  (Only "\n" ends a line, as in the input: a "\r" inside a line stays there, as whitespace.)"""
  for path in paths:
    with open(path, encoding="utf-8", newline="") as f:
      pending: list[str] = []  # the start of a document that goes on in the next read
      while True:
        chunk = f.read(block_chars)
        if not chunk:
          break
        tail = pending[-1][-1:] if pending else ""  # a blank line may span two reads
        cut = (tail + chunk).rfind("\n\n")
        if cut < 0:
          pending.append(chunk)
          continue
        cut += 2 - len(tail)
        yield "".join(pending) + chunk[:cut]
        pending = [chunk[cut:]]
      rest = "".join(pending)
      if rest.strip("\n"):
        yield rest
