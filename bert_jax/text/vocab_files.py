"""The vocabulary kept beside every model, found beside any model, and checked against it.

A model is only as good as the vocabulary it was trained with: a `vocab.txt` of the same size
from another corpus loads without complaint and turns every input into the wrong ids. So every
pre-training workdir, fine-tuning output and export keeps a copy of its vocabulary plus
`vocab_record.json` (SHA-256 of each file, sizes, the tokenizer's flavour and lower-casing), and
every command that is handed a vocabulary for a model compares it with the kept one.

The files by family, under the names the released models use, so that one of our directories
and a Hugging Face directory are read the same way:

* BERT: WordPiece `vocab.txt` (or a SentencePiece model in BERT's layout, kept as `spm.model`);
* ALBERT: SentencePiece `spiece.model` (Google's TF1 release: `30k-clean.model`);
* RoBERTa: byte-level BPE `vocab.json` + `merges.txt`.

Which tokenizer reads a SentencePiece model (BERT's layout or ALBERT's preprocessing) is the
model's `model_type` (`tokenization.flavour_for`). Lower-casing is the kept record's, else a
Hugging Face `tokenizer_config.json`'s `do_lower_case`, unless the user says otherwise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Sequence

from bert_jax import file_io

RECORD = "vocab_record.json"
# Before the RoBERTa family, the record was `vocab.json`; RoBERTa's vocabulary has that name.
OLD_RECORD = "vocab.json"
# Looked for beside a model, in this order. A SentencePiece model under any other name is found
# when it is the directory's only `*.model`.
WORDPIECE_NAMES = ("vocab.txt",)
SENTENCEPIECE_NAMES = ("spm.model", "spiece.model", "30k-clean.model")
BPE_NAMES = (("vocab.json", "merges.txt"),)
HF_TOKENIZER_CONFIG = "tokenizer_config.json"


@dataclasses.dataclass(frozen=True)
class VocabularyFiles:
  """A model's vocabulary: a WordPiece `vocab.txt`, a SentencePiece model, or a byte-level BPE
  `vocab.json` with its `merges.txt`; and what is known of how it is read."""
  vocab_file: str | None = None
  spm_model_file: str | None = None
  merges_file: str | None = None
  do_lower_case: bool | None = None  # None: not recorded
  flavour: str | None = None  # None: not recorded

  @property
  def main(self) -> str:
    return self.vocab_file or self.spm_model_file or ""

  @property
  def paths(self) -> tuple[str, ...]:
    return tuple(p for p in (self.vocab_file, self.spm_model_file, self.merges_file) if p)

  @property
  def byte_level(self) -> bool:
    return bool(self.merges_file) or (bool(self.vocab_file) and self.vocab_file.endswith(".json"))

  def describe(self) -> str:
    return " + ".join(self.paths)

  def with_merges(self) -> "VocabularyFiles":
    """The same, with the merges.txt beside a vocab.json named when none was given."""
    if self.byte_level and not self.merges_file:
      from bert_jax.text import bpe  # pylint: disable=g-import-not-at-top
      return dataclasses.replace(self, merges_file=bpe.default_merges_file(self.vocab_file))
    return self

  def load(self, model_type: str | None = None, do_lower_case: bool | None = None,
           **kwargs):
    """The tokenizer of these files for a model of `model_type`; `do_lower_case` overrides the
    recorded one (default True, BERT's uncased models)."""
    from bert_jax.text import tokenization  # pylint: disable=g-import-not-at-top
    lower = do_lower_case if do_lower_case is not None else (
        self.do_lower_case if self.do_lower_case is not None else True)
    flavour = tokenization.flavour_for(model_type, self.spm_model_file)
    if flavour is None and self.spm_model_file and self.flavour in ("bert", "albert"):
      flavour = self.flavour
    return tokenization.load_tokenizer(
        vocab_file=self.vocab_file, spm_model_file=self.spm_model_file,
        merges_file=self.merges_file, flavour=flavour, do_lower_case=lower, **kwargs)


def of_tokenizer(tokenizer) -> VocabularyFiles:
  """The files a loaded tokenizer was read from."""
  spm = getattr(tokenizer, "model_file", None)
  return VocabularyFiles(
      vocab_file=None if spm else getattr(tokenizer, "vocab_file", None), spm_model_file=spm,
      merges_file=getattr(tokenizer, "merges_file", None),
      do_lower_case=bool(getattr(tokenizer, "do_lower_case", False)),
      flavour=getattr(tokenizer, "flavour", None))


def sha256(path: str) -> str:
  return hashlib.sha256(file_io.read_bytes(path)).hexdigest()


def _kept_names(files: VocabularyFiles) -> list[tuple[str, str]]:
  """(source, name kept under) for each file."""
  if files.spm_model_file:  # ALBERT's under the name its Hugging Face tokenizer looks for
    return [(files.spm_model_file, "spiece.model" if files.flavour == "albert" else "spm.model")]
  if files.byte_level:
    files = files.with_merges()
    return [(files.vocab_file, "vocab.json"), (files.merges_file, "merges.txt")]
  return [(files.vocab_file, "vocab.txt")]


def keep(files: VocabularyFiles | str, directory: str, **details) -> str:
  """Copies the vocabulary into `directory` under its family's names (`vocab.txt`, `spm.model`
  or ALBERT's `spiece.model`, or `vocab.json` + `merges.txt`) with the record (SHA-256 and bytes of each, where it came from,
  flavour, lower-casing and `details`). Returns the kept main path. Copying a file onto itself
  only (re)writes the record. A plain path is a vocab.txt, a `.model` or a vocab.json."""
  if isinstance(files, str):
    files = (VocabularyFiles(spm_model_file=files) if files.endswith(".model")
             else VocabularyFiles(vocab_file=files))
  record = {"files": {}, "source": files.describe()}
  for key in ("do_lower_case", "flavour"):
    if getattr(files, key) is not None:
      record[key] = getattr(files, key)
  record.update(details)
  kept = []
  for source, name in _kept_names(files):
    target = file_io.join(directory, name)
    data = file_io.read_bytes(source)
    if os.path.abspath(source) != os.path.abspath(target):
      file_io.write_bytes_atomic(target, data)
    record["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    kept.append(target)
  file_io.write_text_atomic(file_io.join(directory, RECORD), json.dumps(record, indent=1) + "\n")
  return kept[0]


def read_record(directory: str) -> dict:
  """The kept record of `directory` ({} if none): today's `vocab_record.json`, or the older
  `vocab.json` record (told apart from RoBERTa's vocabulary by its `sha256` key)."""
  for name in (RECORD, OLD_RECORD):
    path = file_io.join(directory, name)
    if not file_io.exists(path):
      continue
    try:
      record = json.loads(file_io.read_text(path))
    except ValueError:
      continue
    if isinstance(record, dict) and ("files" in record or isinstance(record.get("sha256"), str)):
      return record
  return {}


def _is_bpe_vocab(path: str) -> bool:
  """A RoBERTa `vocab.json` (a token → id object), not an older record of ours."""
  try:
    data = json.loads(file_io.read_text(path))
  except (ValueError, UnicodeDecodeError):
    return True  # let the tokenizer name what is wrong with it
  return isinstance(data, dict) and not isinstance(data.get("sha256"), str)


def _hf_lower_case(directory: str) -> bool | None:
  path = file_io.join(directory, HF_TOKENIZER_CONFIG)
  if not file_io.exists(path):
    return None
  try:
    value = json.loads(file_io.read_text(path)).get("do_lower_case")
  except (ValueError, AttributeError):
    return None
  return value if isinstance(value, bool) else None


def find_beside(directory: str) -> VocabularyFiles | None:
  """The vocabulary in `directory`, if any (see the module docstring for the names)."""
  if not directory or not file_io.isdir(directory):
    return None
  record = read_record(directory)
  lower = record.get("do_lower_case")
  lower = lower if isinstance(lower, bool) else _hf_lower_case(directory)
  flavour = record.get("flavour") if isinstance(record.get("flavour"), str) else None
  found = None
  for name in WORDPIECE_NAMES:
    if file_io.exists(file_io.join(directory, name)):
      found = VocabularyFiles(vocab_file=file_io.join(directory, name))
      break
  if found is None:
    for name in SENTENCEPIECE_NAMES:
      if file_io.exists(file_io.join(directory, name)):
        found = VocabularyFiles(spm_model_file=file_io.join(directory, name))
        break
  if found is None:
    for vocab, merges in BPE_NAMES:
      vocab_path, merges_path = file_io.join(directory, vocab), file_io.join(directory, merges)
      if file_io.exists(vocab_path) and file_io.exists(merges_path) and _is_bpe_vocab(vocab_path):
        found = VocabularyFiles(vocab_file=vocab_path, merges_file=merges_path)
        break
  if found is None:
    models = [n for n in file_io.listdir(directory) if n.endswith(".model")]
    if len(models) == 1:
      found = VocabularyFiles(spm_model_file=file_io.join(directory, models[0]))
  if found is None:
    return None
  return dataclasses.replace(found, do_lower_case=lower, flavour=flavour)


def copy_kept(source_dir: str, target_dir: str) -> str | None:
  """Carries the vocabulary of `source_dir` (and what its record says) to `target_dir`; returns
  the new main path, or None when `source_dir` has none."""
  found = find_beside(source_dir)
  if found is None:
    return None
  return keep(found, target_dir)


def check_same(given: VocabularyFiles | str, kept: VocabularyFiles | str,
               flag: str = "--vocab_file") -> None:
  """Raises ValueError when `given` is not byte-for-byte the vocabulary kept as `kept`."""
  if isinstance(given, str):
    given = VocabularyFiles(vocab_file=given)
  if isinstance(kept, str):
    kept = VocabularyFiles(vocab_file=kept)
  pairs = [(given.main, kept.main)]
  if given.byte_level and kept.byte_level:
    pairs.append((given.with_merges().merges_file, kept.with_merges().merges_file))
  for a_path, b_path in pairs:
    if os.path.abspath(a_path) == os.path.abspath(b_path):
      continue
    a, b = sha256(a_path), sha256(b_path)
    if a != b:
      what = f"{flag}={a_path}" if a_path == given.main else f"{flag}={given.main}: {a_path}"
      raise ValueError(
          f"{what} (sha256 {a[:12]}) is not the vocabulary this model was trained with "
          f"({b_path}, sha256 {b[:12]}): leave {flag} out to use the model's own, or pass that "
          "file.")


def resolve(given: VocabularyFiles | None, directories: Sequence[str], model: str,
            flag: str = "--vocab_file") -> VocabularyFiles:
  """The vocabulary for the model at `model`: `given` (checked against the one beside the
  model, if any), else the one found in the first of `directories` that has one. Raises
  ValueError naming every place looked when there is none."""
  if given is not None:
    for path in given.with_merges().paths:
      if not file_io.exists(path):
        raise ValueError(f"{path} does not exist ({flag}).")
  for directory in directories:
    found = find_beside(directory)
    if found is None:
      continue
    if given is None:
      return found
    check_same(given, found, flag)  # the model's own vocabulary lies there
    return dataclasses.replace(
        given, do_lower_case=given.do_lower_case if given.do_lower_case is not None
        else found.do_lower_case, flavour=given.flavour or found.flavour)
  if given is not None:
    return given
  looked = ", ".join(dict.fromkeys(directories)) or "(no directory)"
  raise ValueError(
      f"No vocabulary for {model}: looked in {looked} for vocab.txt (WordPiece), spm.model / "
      "spiece.model (SentencePiece) or vocab.json + merges.txt (byte-level BPE). Pass the one "
      "the model was trained with: --vocab_file=vocab.txt (or vocab.json) or "
      "--spm_model_file=spiece.model.")
