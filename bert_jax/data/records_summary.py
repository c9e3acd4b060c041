"""What pre-training records say about themselves, checked before a run trains on them: the
`summary.json` data_prep writes beside them (vocabulary size and files, lower-casing, masking
settings, which sentence label they carry), and the largest token id in the records themselves.

A vocabulary too small for the records' ids does not fail: the embedding lookup reads past the
table's end and the loss turns NaN hours later. So the records are read here, and the run is
refused at start with the setting to change.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from typing import Any

from absl import logging

from bert_jax import file_io
from bert_jax.data import input_pipeline, tfrecords
from bert_jax.text import features, masking, vocab_files


def summary(files: list[str]) -> dict[str, Any]:
  """The `summary.json` data_prep wrote beside the records (empty if there is none), with its
  path under "path"."""
  path = file_io.join(os.path.dirname(files[0]), "summary.json")
  if not file_io.exists(path):
    return {}
  try:
    found = json.loads(file_io.read_text(path))
  except ValueError as e:
    raise ValueError(f"{path}: not valid JSON ({e}); it is data_prep's summary of the records "
                     "beside it: rewrite it by running data_prep again, or delete it.") from None
  found["path"] = path
  return found


def records_identity(files: list[str]) -> str:
  """A digest of what a run reads: every file's name, and the summary.json data_prep wrote
  beside them (its settings, seed and counts change with any regeneration), or, for records
  without one, every file's size. Saved with the data position, so that a resume onto records
  rewritten under the same names (another seed, another corpus) is told apart from one onto
  the same records, without reading them (nor, on a bucket, asking the size of every shard
  where data_prep's summary tells)."""
  digest = hashlib.sha256()
  summary_path = file_io.join(os.path.dirname(files[0]), "summary.json") if files else None
  described = bool(summary_path) and file_io.exists(summary_path)
  for path in sorted(files):
    size = "" if described else f"\t{file_io.size(path)}"
    digest.update(f"{os.path.basename(path)}{size}\n".encode("utf-8"))
  if described:
    digest.update(file_io.read_bytes(summary_path))
  return digest.hexdigest()[:16]


def record_shapes(files: list[str]) -> dict[str, tuple[int, str]]:
  """`max_seq_length` and `max_predictions_per_seq` as the records fix them, each with where it
  was read: tokens per row and, for static-masking records, masked-LM slots from the first
  record; for dynamic-masking records the masking budget data_prep was given (its summary.json),
  which its packed rows were packed for. A setting the records leave open is absent."""
  lengths = input_pipeline.record_lengths(files[0])
  found = {}
  if features.INPUT_IDS in lengths:
    found["max_seq_length"] = (lengths[features.INPUT_IDS], f"the records ({files[0]})")
  if features.MASKED_LM_POSITIONS in lengths:
    found["max_predictions_per_seq"] = (lengths[features.MASKED_LM_POSITIONS],
                                        f"the records ({files[0]})")
  else:
    described = summary(files)
    budget = (described.get("settings") or {}).get("max_predictions_per_seq")
    if budget:
      found["max_predictions_per_seq"] = (int(budget), described["path"])
  return found


def max_token_id(path: str, num_records: int = 1000) -> int:
  """The largest token id in the first records of `path` (inputs and masked-LM labels).
  Damaged records are passed over here: the input pipeline names them."""
  tf = file_io.tensorflow()
  largest = 0
  for raw in itertools.islice(tfrecords.iter_records(path, on_damage=lambda damage: None),
                              num_records):
    feature = tf.train.Example.FromString(raw).features.feature
    for name in (features.INPUT_IDS, features.MASKED_LM_IDS):
      if name in feature and feature[name].int64_list.value:
        largest = max(largest, max(feature[name].int64_list.value))
  return largest


def check_vocab_size(size: int, files: list[str]) -> None:
  """Refuses a model vocabulary smaller than the one the records were written with, or than
  the largest id in them, naming the setting and the size that fits."""
  found = summary(files)
  data_vocab = found.get("vocab_size")
  if data_vocab and size < data_vocab:
    raise ValueError(
        f"config.model.vocab_size={size} but the records were written with a vocabulary of "
        f"{data_vocab} entries ({found['path']}): set --config.model.vocab_size={data_vocab} "
        "or leave it unset (it is then read from there).")
  largest = max_token_id(files[0])
  if largest >= size:
    raise ValueError(
        f"{files[0]} holds token id {largest} but config.model.vocab_size={size}: set "
        f"--config.model.vocab_size to the size of the vocabulary the records were written with "
        f"(at least {largest + 1}).")


def vocabulary(data, files: list[str]
               ) -> tuple[vocab_files.VocabularyFiles | None, dict[str, Any]]:
  """The run's vocabulary and the data settings that go with it: `data.vocab_file` /
  `spm_model_file` (and `merges_file`) of a run config's data section, else the files named in
  the records' `summary.json`, with that summary's settings (lower-casing, flavour, masking);
  `(None, settings)` when neither names one."""
  settings = summary(files).get("settings", {})
  if data.vocab_file or data.spm_model_file:
    return vocab_files.VocabularyFiles(
        vocab_file=data.vocab_file or None, spm_model_file=data.spm_model_file or None,
        merges_file=data.get("merges_file") or None, do_lower_case=bool(data.do_lower_case)), {}
  if settings.get("vocab_file") or settings.get("spm_model_file"):
    return vocab_files.VocabularyFiles(
        vocab_file=settings.get("vocab_file"), spm_model_file=settings.get("spm_model_file"),
        merges_file=settings.get("merges_file"), flavour=settings.get("flavour"),
        do_lower_case=bool(settings.get("do_lower_case", data.do_lower_case))), settings
  return None, settings


def masking_config(data, files: list[str], model_type: str | None
                   ) -> masking.MaskingConfig | None:
  """Dynamic-masking records need the vocabulary's special ids; static ones carry masks (None).

  The vocabulary is `vocabulary(data, files)`'s; the masks are drawn as data_prep was asked to
  draw them when the vocabulary comes from its summary (the data section's settings otherwise).
  `model_type` decides how a SentencePiece model reads text.
  """
  if input_pipeline.detect_masking(files[0]) != features.DYNAMIC:
    return None
  found, settings = vocabulary(data, files)
  if found is None:
    raise ValueError(f"{files[0]} holds dynamic-masking records: set config.data.vocab_file "
                     "or config.data.spm_model_file so masks can be drawn.")
  drawn = {**data.to_dict(), **{
      k: settings[k] for k in ("masking_strategy", "max_ngram", "span_p", "max_span_length")
      if k in settings}}
  whole_word = settings.get("do_whole_word_mask", data.whole_word_mask)
  if settings:
    logging.info("Dynamic masking with the vocabulary and masking named in %s.",
                 summary(files).get("path"))
  # Masks need the special ids and word starts, which every family's tokenizer gives.
  tokenizer = found.load(model_type)
  return masking.MaskingConfig.from_tokenizer(
      tokenizer, masked_lm_prob=data.masked_lm_prob,
      max_predictions_per_seq=data.max_predictions_per_seq,
      whole_word_mask=whole_word, per_word_draw=data.per_word_draw,
      strategy=drawn.get("masking_strategy", "token"),
      **{k: drawn.get(k, v) for k, v in (("max_ngram", 3), ("span_p", 0.2),
                                         ("max_span_length", 10))})
