"""The character classes of BERT's text cleanup, and what "empty" means for an input text.

The original BERT tokenizer drops NUL, U+FFFD and control or format characters, reads any
whitespace as a space, splits punctuation off and CJK ideographs apart. The WordPiece tokenizer
is built on these classes, and the task readers (classification, multiple choice, SQuAD) ask
the same question of their inputs with them (`has_text`: is anything left to tokenize?),
whatever the tokenizer, so that a text made only of invisible characters is refused alike.
"""

from __future__ import annotations

import unicodedata


def has_text(text: str) -> bool:
  """Whether `text` keeps a character after the tokenizer's cleaning (which drops whitespace,
  control and format characters such as U+200B, NUL and U+FFFD): what "empty" means for an
  input text."""
  return any(not (is_whitespace(c) or is_control(c) or ord(c) in (0, 0xFFFD)) for c in text)


def is_whitespace(char: str) -> bool:
  # \t, \n and \r are control characters to Unicode, but text means them as spaces.
  if char in " \t\n\r":
    return True
  return unicodedata.category(char) == "Zs"


def is_control(char: str) -> bool:
  if char in "\t\n\r":
    return False
  return unicodedata.category(char) in ("Cc", "Cf")


def is_punctuation(char: str) -> bool:
  cp = ord(char)
  # Every non-alphanumeric ASCII character counts, also "^ $ `" which Unicode calls symbols.
  if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
    return True
  return unicodedata.category(char).startswith("P")


def is_cjk(cp: int) -> bool:
  """CJK Unified Ideographs (not Hangul or kana, which separate words with spaces)."""
  return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or
          0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or
          0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)

