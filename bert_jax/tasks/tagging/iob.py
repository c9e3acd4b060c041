"""CoNLL tag schemes with nothing but the standard library: IOB1 (CoNLL-2003 as released: a
chunk begins with I-, or with B- right after a chunk of its own type) and IOB2 (every chunk
begins with B-), conversions between them, the scheme a file is written in, and tags from entity
spans. The fine-tuner's reader and writer (`data.py`) and data_prep's silver-NER corpus builder,
which runs in spaCy's own environment, share these rules.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

DOCSTART = "-DOCSTART-"
SCHEMES = ("iob1", "iob2")

TAG_RE = re.compile(r"([BI])-(\S+)")
IOBES_RE = re.compile(r"[ESLU]-\S+")


def split_tag(tag: str) -> tuple[str, str | None]:
  """("O", None) or (prefix, type) of a B-X / I-X tag; ValueError for anything else."""
  if tag == "O":
    return "O", None
  match = TAG_RE.fullmatch(tag)
  if match is None:
    raise ValueError(bad_tag_message(tag))
  return match.group(1), match.group(2)


def bad_tag_message(tag: str) -> str:
  if IOBES_RE.fullmatch(tag):
    return (f"the tag {tag!r} is IOBES/BILOU (E-, S-, L-, U- prefixes), which is not supported: "
            "convert the file to IOB2 (B-X begins a chunk, I-X continues it) first.")
  return f"the tag {tag!r} is not O, B-TYPE or I-TYPE."


def to_iob2(tags: Iterable[str]) -> list[str]:
  """The same chunks in IOB2 (every chunk begins with B-); the input may be IOB1 or IOB2.

  An I-X that does not continue a chunk of type X (after O, another type, or at the start)
  begins a chunk, as conlleval reads it.
  """
  out, previous = [], None
  for tag in tags:
    prefix, kind = split_tag(tag)
    if prefix == "I" and previous != kind:
      prefix = "B"
    out.append("O" if kind is None else f"{prefix}-{kind}")
    previous = kind
  return out


def to_iob1(tags: Iterable[str]) -> list[str]:
  """The same chunks in IOB1 (a chunk begins with I-, or with B- right after a chunk of its
  own type); the input may be IOB1 or IOB2."""
  out, previous = [], None
  for tag in to_iob2(tags):
    prefix, kind = split_tag(tag)
    if prefix == "B" and previous != kind:
      prefix = "I"
    out.append("O" if kind is None else f"{prefix}-{kind}")
    previous = kind
  return out


def chunk_initial_i(tags: Sequence[str]) -> int | None:
  """The position of the first I-X that begins a chunk (IOB1's way), or None."""
  previous = None
  for position, tag in enumerate(tags):
    prefix, kind = split_tag(tag)
    if prefix == "I" and previous != kind:
      return position
    previous = kind
  return None


def detect_scheme(sentences_tags: Iterable[Sequence[str]]) -> str:
  """"iob1" when some chunk begins with I- (an I-X not right after a B-X or I-X), else "iob2"."""
  for tags in sentences_tags:
    if tags is not None and chunk_initial_i(tags) is not None:
      return "iob1"
  return "iob2"


def from_spans(length: int, spans: Iterable[tuple[int, int, str]], scheme: str = "iob1"
               ) -> list[str]:
  """The tags of a sentence of `length` words whose chunks are `spans` ([start, end), type),
  in `scheme`; spans must lie inside the sentence and not overlap."""
  if scheme not in SCHEMES:
    raise ValueError(f"scheme={scheme!r}: expected one of {SCHEMES}.")
  tags = ["O"] * length
  previous_end = -1
  for start, end, kind in sorted(spans):
    if not 0 <= start < end <= length:
      raise ValueError(f"Span {(start, end, kind)} is outside a sentence of {length} words.")
    if start < previous_end:
      raise ValueError(f"Span {(start, end, kind)} overlaps the span ending at {previous_end}.")
    tags[start] = "B-" + kind
    for i in range(start + 1, end):
      tags[i] = "I-" + kind
    previous_end = end
  return to_iob1(tags) if scheme == "iob1" else tags
