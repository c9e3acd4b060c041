r"""Raw text → pre-training TFRecords (masked LM + next sentence), in parallel and resumable.

The original BERT `create_pretraining_data.py` with its flags and defaults, rebuilt to scale:

    python -m data_prep.create_pretraining_data \
      --input_file='corpus/*.txt' --vocab_file=vocab.txt --do_lower_case \
      --output_dir=gs://bucket/pretrain_128 --num_output_shards=64 --num_workers=16 \
      --max_seq_length=128 --max_predictions_per_seq=20 --masked_lm_prob=0.15 \
      --dupe_factor=10 --random_seed=12345

Input: one sentence per line, a blank line between documents (local paths or gs://). The run
has two steps. (1) Documents are dealt to `--num_output_shards` shards as they stream past (by a
seeded round robin per input file) into local bucket files. (2) Each shard, in its own worker
process: tokenize, build `--dupe_factor` passes of NSP sentence pairs, shuffle the instances,
mask (static) or not (dynamic), and write one TFRecord file. Memory is bounded by one shard per
worker, not by the corpus, and the output depends on the seed and the number of shards only —
never on `--num_workers`. NSP's "random next" segment comes from another document of the same
shard.

Step (2) runs on whole arrays, not per line or per instance: lines are tokenized a block at a
time, the sentence pairs of every document and pass are built together (`instances.py`), and
2048 instances at a time are cut out of the token array, masked (`bert_jax/text/masking.py`),
serialised and framed (`bert_jax/data/tfrecords.py`) with array operations — which is
what makes it tens of times faster per core than the original.

`--masking=static` writes the seven features of the original, masked `--dupe_factor` (10)
times over. `--masking=dynamic` writes each instance once, unmasked, with the word starts that
whole-word masking needs; the input pipeline draws fresh masks each time it reads a record.

`--objective` and `--sequence_mode` pick the successors' recipes (`instances.py`): `sop` is
ALBERT's sentence-order prediction (A and B consecutive text of one document, swapped half of
the time; `next_sentence_labels` 1 = swapped), `none` pairs without a label (kept 0 so the schema
is unchanged); `--sequence_mode=full_sentences` (RoBERTa's FULL-SENTENCES, crossing documents
with a separator token) and `doc_sentences` (within one document) write single segments and go
with `--objective=none` only. `--masking_strategy` picks token, whole-word, n-gram (ALBERT) or
span (SpanBERT) masking (`bert_jax/text/masking.py`). The summary says which label the records
carry (`sentence_objective`). The pair layout comes from the tokenizer: a byte-level BPE
`vocab.json` gives RoBERTa's <s> A </s></s> B </s>.

`--packing` lays several instances back to back in each row (Krell et al. 2021, "Efficient
Sequence Packing without Cross-contamination"): the same instances, masked the same way, in
fewer rows — up to `--max_sequences_per_row` per row, packed per shard by
`bert_jax/data/packing.py`, with the packed features of `bert_jax/text/features.py`. Then
`--max_predictions_per_seq` is the masked-LM budget of a whole row (e.g. 80 at 512): each
instance still gets its own ~15%, and rows are packed so that their predictions fit.

A shard is written under a temporary name and renamed when complete; a rerun with the same
settings skips finished shards (`shard_files.py`). Every shard leaves `<shard>.stats.json`; the
run ends with a summary printed and written to `summary.json` in `--output_dir` (or
`<output_file>.summary.json`; `run_summary.py`). Worker processes die with the command and
report progress to its bars (`workers.py`).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sys
import time
from typing import Any, Callable

if __package__ in (None, ""):  # run as a script: make `bert_jax` / `data_prep` importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top
from absl import app, flags, logging
import numpy as np

from bert_jax.text import features as features_lib
from bert_jax import file_io
from bert_jax.data import packing as packing_lib
from bert_jax.data import tfrecords
from bert_jax.text import masking, tokenization, unknown_tokens
from data_prep import corpus_io, instances as instances_lib, records, run_summary
from data_prep import shard_files, workers
# pylint: enable=g-import-not-at-top

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Command-line flags, defined only when run as a program (importers get none)."""
  # The original's flags, names and defaults.
  flags.DEFINE_string("input_file", None,
                      "Input raw text file, or comma-separated globs (local or gs://): one "
                      "sentence per line, a blank line between documents.")
  flags.DEFINE_string("output_file", None,
                      "Output TFRecord file, or a comma-separated list: one shard per file. "
                      "Alternative to --output_dir.")
  flags.DEFINE_string("vocab_file", None, "The WordPiece vocab.txt the BERT model uses.")
  flags.DEFINE_bool("do_lower_case", True, "Lower-case (and strip accents) for uncased models.")
  flags.DEFINE_bool("do_whole_word_mask", False,
                    "Mask whole words (all of a word's pieces) instead of single pieces.")
  flags.DEFINE_integer("max_seq_length", 128, "Maximum sequence length.")
  flags.DEFINE_integer("max_predictions_per_seq", 20, "Maximum masked-LM predictions per sequence.")
  flags.DEFINE_integer("random_seed", 12345, "Random seed for data generation.")
  flags.DEFINE_integer("dupe_factor", None,
                       "Passes over the data, each with different pairs and masks. Default: 10 for "
                       "--masking=static (the original's), 1 for --masking=dynamic.")
  flags.DEFINE_float("masked_lm_prob", 0.15, "Masked LM probability.")
  flags.DEFINE_float("short_seq_prob", 0.1,
                     "Probability of a shorter target length than the maximum.")
  # Beyond the original.
  flags.DEFINE_string("spm_model_file", None,
                      "A SentencePiece model (from data_prep/train_tokenizer.py) instead of "
                      "--vocab_file.")
  flags.DEFINE_string("merges_file", None, "The merges.txt of a byte-level BPE --vocab_file="
                      "vocab.json (RoBERTa); default: the one beside it.")
  flags.DEFINE_enum("flavour", None, list(tokenization.FLAVOURS),
                    "How the vocabulary is read: albert reads --spm_model_file with ALBERT's "
                    "preprocessing (its released spiece.model / 30k-clean.model); default: "
                    "from the files (a SentencePiece model in BERT's layout).")
  flags.DEFINE_string("output_dir", None,
                      "Directory (local or gs://) for pretrain-XXXXX-of-NNNNN.tfrecord shards.")
  flags.DEFINE_integer("num_output_shards", 8, "Shards to write under --output_dir.")
  flags.DEFINE_integer("num_workers", os.cpu_count() or 1,
                       "Worker processes. Does not change the output.")
  flags.DEFINE_enum("masking", "static", list(features_lib.MASKING_MODES),
                    "static: masks drawn here and written (the original). dynamic: unmasked "
                    "instances; the input pipeline draws masks when it reads them.")
  flags.DEFINE_bool("per_word_draw", False,
                    "With --do_whole_word_mask, draw [MASK]/random/keep once per word instead of "
                    "per piece (the original draws per piece).")
  flags.DEFINE_enum("decode_errors", "strict", list(corpus_io.DECODE_ERRORS),
                    "What to do with bytes that are not UTF-8: stop naming file and line "
                    "(strict), drop them (ignore, what the original did) or use U+FFFD (replace).")
  flags.DEFINE_string("tmp_dir", None,
                      "Local directory for the split step (default: system tmp). A run's "
                      "bert_jax_split_<pid>_* folder there is removed at its end, and one left by "
                      "a killed run is removed by the next run.")
  flags.DEFINE_float("max_unknown_rate", unknown_tokens.MAX_UNKNOWN_RATE,
                     "Stop when more than this share of a shard's word pieces are [UNK]: the "
                     "vocabulary does not fit the text (1 turns the check off).")
  flags.DEFINE_bool("packing", False,
                    "Pack several instances per row (the same instances and masks; less "
                    "padding). --max_predictions_per_seq is then per row, e.g. 80 at 512.")
  flags.DEFINE_integer("max_sequences_per_row", packing_lib.DEFAULT_MAX_SEQUENCES_PER_ROW,
                       "With --packing: at most this many instances per row.")
  flags.DEFINE_bool("progress", True, "Show a progress bar.")
  flags.DEFINE_enum("objective", "nsp", list(instances_lib.OBJECTIVES),
                    "The sentence-level label: nsp (B is a random segment half of the time, the "
                    "original), sop (ALBERT: A and B consecutive, swapped half of the time; label "
                    "1 = swapped) or none (no label; written as 0).")
  flags.DEFINE_enum("sequence_mode", "pairs", list(SEQUENCE_MODES),
                    "pairs: [CLS] A [SEP] B [SEP] (the original). full_sentences (RoBERTa): one "
                    "segment of contiguous sentences up to the length, crossing documents with a "
                    "separator between them. doc_sentences: the same within one document. The "
                    "single-segment modes need --objective=none.")
  flags.DEFINE_enum("masking_strategy", None, list(masking.STRATEGIES),
                    "What a masked unit is: token (default), whole_word (= --do_whole_word_mask), "
                    "ngram (ALBERT: 1..--max_ngram words, P(n) ∝ 1/n) or span (SpanBERT: "
                    "Geometric(--span_p) words clipped at --max_span_length, 80/10/10 per span).")
  flags.DEFINE_integer("max_ngram", 3, "--masking_strategy=ngram: the longest n-gram, in words.")
  flags.DEFINE_float("span_p", 0.2, "--masking_strategy=span: the geometric distribution's p.")
  flags.DEFINE_integer("max_span_length", 10,
                       "--masking_strategy=span: spans are clipped at this many words.")


_CHUNK = 2048  # instances masked and serialised per vectorised step
PAIRS, FULL_SENTENCES, DOC_SENTENCES = SEQUENCE_MODES = instances_lib.SEQUENCE_MODES


# ---------------------------------------------------------------------------------------------
# Settings and file names


def make_settings(input_file: str, vocab_file: str | None = None,
                  spm_model_file: str | None = None, *, do_lower_case: bool = True,
                  do_whole_word_mask: bool = False, per_word_draw: bool = False,
                  max_seq_length: int = 128, max_predictions_per_seq: int = 20,
                  random_seed: int = 12345, dupe_factor: int | None = None,
                  masked_lm_prob: float = 0.15, short_seq_prob: float = 0.1,
                  masking: str = "static", decode_errors: str = "strict",
                  packing: bool = False,
                  max_sequences_per_row: int = packing_lib.DEFAULT_MAX_SEQUENCES_PER_ROW,
                  objective: str = "nsp", sequence_mode: str = PAIRS,
                  masking_strategy: str | None = None, max_ngram: int = 3, span_p: float = 0.2,
                  max_span_length: int = 10, merges_file: str | None = None,
                  flavour: str | None = None) -> dict[str, Any]:
  """Everything that decides the output, with the original's defaults (for use from Python)."""
  if dupe_factor is None:
    dupe_factor = 10 if masking == features_lib.STATIC else 1
  # Packing and the successors' settings only when used: runs with the original's settings keep
  # the settings (and so the shards' stats files) of before.
  packed = {"packing": True, "max_sequences_per_row": max_sequences_per_row} if packing else {}
  if objective != "nsp":
    packed["objective"] = objective
  if sequence_mode != PAIRS:
    packed["sequence_mode"] = sequence_mode
  if merges_file:
    packed["merges_file"] = merges_file
  if flavour:
    packed["flavour"] = flavour
  if masking_strategy == "whole_word":
    do_whole_word_mask, masking_strategy = True, None
  if masking_strategy not in (None, "token"):
    packed["masking_strategy"] = masking_strategy
    packed.update({"max_ngram": max_ngram} if masking_strategy == "ngram" else
                  {"span_p": span_p, "max_span_length": max_span_length})
  return {
      "input_file": input_file,
      "vocab_file": vocab_file,
      "spm_model_file": spm_model_file,
      "do_lower_case": do_lower_case,
      "do_whole_word_mask": do_whole_word_mask,
      "per_word_draw": per_word_draw,
      "max_seq_length": max_seq_length,
      "max_predictions_per_seq": max_predictions_per_seq,
      "random_seed": random_seed,
      "dupe_factor": dupe_factor,
      "masked_lm_prob": masked_lm_prob,
      "short_seq_prob": short_seq_prob,
      "masking": masking,
      "decode_errors": decode_errors,
      **packed,
  }


def settings_from_flags() -> dict[str, Any]:
  return make_settings(
      FLAGS.input_file, FLAGS.vocab_file, FLAGS.spm_model_file,
      do_lower_case=FLAGS.do_lower_case, do_whole_word_mask=FLAGS.do_whole_word_mask,
      per_word_draw=FLAGS.per_word_draw, max_seq_length=FLAGS.max_seq_length,
      max_predictions_per_seq=FLAGS.max_predictions_per_seq, random_seed=FLAGS.random_seed,
      dupe_factor=FLAGS.dupe_factor, masked_lm_prob=FLAGS.masked_lm_prob,
      short_seq_prob=FLAGS.short_seq_prob, masking=FLAGS.masking,
      decode_errors=FLAGS.decode_errors, packing=FLAGS.packing,
      max_sequences_per_row=FLAGS.max_sequences_per_row, objective=FLAGS.objective,
      sequence_mode=FLAGS.sequence_mode, masking_strategy=FLAGS.masking_strategy,
      max_ngram=FLAGS.max_ngram, span_p=FLAGS.span_p, max_span_length=FLAGS.max_span_length,
      merges_file=FLAGS.merges_file, flavour=FLAGS.flavour)


def check_settings(s: dict[str, Any]) -> None:
  if s["max_seq_length"] < 5:
    raise ValueError(f"--max_seq_length={s['max_seq_length']}: needs room for [CLS] A [SEP] B "
                     "[SEP], at least 5.")
  if s["max_predictions_per_seq"] < 1:
    raise ValueError("--max_predictions_per_seq must be at least 1.")
  if not 0.0 < s["masked_lm_prob"] < 1.0:
    raise ValueError(f"--masked_lm_prob={s['masked_lm_prob']}: must lie in (0, 1).")
  if not 0.0 <= s["short_seq_prob"] <= 1.0:
    raise ValueError(f"--short_seq_prob={s['short_seq_prob']}: must lie in [0, 1].")
  if s["dupe_factor"] < 1:
    raise ValueError("--dupe_factor must be at least 1.")
  if s.get("packing") and s["max_sequences_per_row"] < 1:
    raise ValueError("--max_sequences_per_row must be at least 1.")
  objective, mode = s.get("objective", "nsp"), s.get("sequence_mode", PAIRS)
  if objective not in instances_lib.OBJECTIVES:
    raise ValueError(f"--objective={objective}: expected one of "
                     f"{', '.join(instances_lib.OBJECTIVES)}.")
  if mode not in SEQUENCE_MODES:
    raise ValueError(f"--sequence_mode={mode}: expected one of {', '.join(SEQUENCE_MODES)}.")
  if mode != PAIRS and objective != "none":
    raise ValueError(f"--sequence_mode={mode} writes single segments, which have no sentence "
                     f"pair for --objective={objective}: add --objective=none, or use "
                     "--sequence_mode=pairs.")
  strategy = s.get("masking_strategy")
  if strategy is not None and s["do_whole_word_mask"]:
    raise ValueError(f"--do_whole_word_mask with --masking_strategy={strategy}: n-grams and "
                     "spans are of whole words already; drop --do_whole_word_mask.")
  if strategy is not None:
    mask_config(s, vocab_size=1, mask_id=0, cls_id=0, sep_id=0)  # its parameters' checks


def mask_config(s: dict[str, Any], **special_ids) -> masking.MaskingConfig:
  """The masking settings of a run as a `MaskingConfig` (special ids from the tokenizer)."""
  strategy = s.get("masking_strategy")
  extra = {}
  if strategy is not None:
    extra = {"strategy": strategy, "max_ngram": s.get("max_ngram", 3),
             "span_p": s.get("span_p", 0.2), "max_span_length": s.get("max_span_length", 10)}
  try:
    return masking.MaskingConfig(
        **special_ids, masked_lm_prob=s["masked_lm_prob"],
        max_predictions_per_seq=s["max_predictions_per_seq"],
        whole_word_mask=s["do_whole_word_mask"], per_word_draw=s["per_word_draw"], **extra)
  except ValueError as e:
    raise ValueError(f"--masking_strategy={strategy}: {e}") from e


# ---------------------------------------------------------------------------------------------
# Work done in worker processes

_TOKENIZERS: dict[tuple, tokenization.Tokenizer] = {}
def get_tokenizer(settings: dict[str, Any]) -> tokenization.Tokenizer:
  key = (settings["vocab_file"], settings["spm_model_file"], settings["do_lower_case"],
         settings.get("merges_file"), settings.get("flavour"))
  if key not in _TOKENIZERS:
    # Corpus text never makes a special token: a literal "[SEP]" in a line is just text.
    _TOKENIZERS[key] = tokenization.load_tokenizer(
        vocab_file=settings["vocab_file"], spm_model_file=settings["spm_model_file"],
        merges_file=settings.get("merges_file"), flavour=settings.get("flavour"),
        do_lower_case=settings["do_lower_case"], split_special_tokens=True)
  return _TOKENIZERS[key]


def split_task(task: dict[str, Any]) -> dict:
  return corpus_io.split_into_buckets(
      task["path"], task["file_index"], task["num_shards"], set(task["shards_wanted"]),
      task["random_seed"], task["bucket_dir"], task["decode_errors"],
      on_bytes=lambda n: workers.report("split", n))


def shard_seeds(random_seed: int, shard: int) -> tuple[np.random.Generator, np.random.Generator]:
  """The shard's two generators: one builds the sentence pairs, one shuffles and masks them."""
  pairs, masks = np.random.SeedSequence([random_seed, shard]).spawn(2)
  return np.random.default_rng(pairs), np.random.default_rng(masks)


def load_shard_documents(bucket_paths: list[str], tokenizer: tokenization.Tokenizer,
                         max_num_tokens: int, stats: dict,
                         on_bytes: Callable[[int], None]) -> instances_lib.Documents:
  """Tokenized documents of one shard; empty lines and empty documents are dropped, as before.

  Blocks of whole documents are tokenized a block at a time, and the documents are put together
  from the per-line token counts with array operations.
  """
  ids_parts, sentence_lengths, document_sizes = [], [], []
  for block in corpus_io.read_bucket_blocks(bucket_paths):
    text = block[:-1] if block.endswith("\n") else block  # its last line is the blank one
    line_chars = np.fromiter(map(len, text.split("\n")), np.int64)
    ids, counts = tokenizer.encode_lines(text)
    unknown, pieces = unknown_tokens.count_unknown(tokenizer, ids)
    stats["unknown_pieces"] += unknown
    stats["pieces"] += pieces
    blank = line_chars == 0
    document_of_line = np.cumsum(blank)
    kept = ~blank & (counts > 0)  # lines that are sentences
    with_tokens, sentences_per_document = np.unique(document_of_line[kept], return_counts=True)
    stats["lines_without_tokens"] += int((~blank & (counts == 0)).sum())
    stats["documents_without_tokens"] += int(
        np.unique(document_of_line[~blank]).size - with_tokens.size)
    stats["sentences"] += int(kept.sum())
    stats["sentences_longer_than_max"] += int((counts[kept] > max_num_tokens).sum())
    stats["single_sentence_documents"] += int((sentences_per_document == 1).sum())
    ids_parts.append(ids)  # lines without tokens add none: these are the sentences back to back
    sentence_lengths.append(counts[kept])
    document_sizes.append(sentences_per_document)
    on_bytes(len(block))
  tokens = np.concatenate(ids_parts) if ids_parts else np.zeros(0, np.int32)
  sentence_lengths = np.concatenate(sentence_lengths) if sentence_lengths else np.zeros(0, int)
  document_sizes = np.concatenate(document_sizes) if document_sizes else np.zeros(0, int)
  stats["documents"] = int(document_sizes.size)
  return instances_lib.Documents(
      tokens.astype(np.int32, copy=False),
      np.concatenate([[0], np.cumsum(sentence_lengths)]).astype(np.int64),
      np.concatenate([[0], np.cumsum(document_sizes)]).astype(np.int64))


def process_shard(task: dict[str, Any]) -> dict[str, Any]:
  """Tokenize, pair, shuffle, mask and write one shard; returns (and stores) its statistics."""
  started = time.time()
  settings = task["settings"]
  shard_bytes = max(1, task["bucket_bytes"])
  tokenizer = get_tokenizer(settings)
  max_seq_length = settings["max_seq_length"]
  stats = run_summary.new_shard_stats()
  documents = load_shard_documents(task["bucket_paths"], tokenizer, max_seq_length - 3, stats,
                                   on_bytes=lambda n: workers.report("shard", 0.5 * n))
  unknown_tokens.check_unknown_rate(
      tokenizer, stats["unknown_pieces"], stats["pieces"],
      f"{settings['input_file']} (the documents of shard {task['shard']})",
      max_rate=task.get("max_unknown_rate", unknown_tokens.MAX_UNKNOWN_RATE),
      override="pass --max_unknown_rate=1")
  pair_rng, mask_rng = shard_seeds(settings["random_seed"], task["shard"])
  mode = settings.get("sequence_mode", PAIRS)
  pair_separators = tokenizer.pair_separators
  if mode == PAIRS:
    instances, short_targets = instances_lib.build_instances(
        documents, max_seq_length, settings["short_seq_prob"], settings["dupe_factor"],
        pair_rng, objective=settings.get("objective", "nsp"), pair_separators=pair_separators)
    stream = documents.tokens
    stats["document_passes"] = documents.num_documents * settings["dupe_factor"]
  else:  # one target length per row: rows are counted where document passes are for pairs
    instances, short_targets, stream = instances_lib.build_single_segments(
        documents, max_seq_length, settings["short_seq_prob"], settings["dupe_factor"],
        pair_rng, cross_documents=mode == FULL_SENTENCES, sep_id=tokenizer.sep_id)
    stats["document_passes"] = instances.size
  tokens = instances_lib.padded_tokens(stream, max_seq_length)
  stats["short_target_passes"] = short_targets
  del documents, stream
  lengths = instances.lengths(pair_separators)
  stats["instances"] = instances.size
  stats["random_next"] = int(instances.is_random_next.sum())
  stats["slots"] = instances.size * max_seq_length
  stats["tokens"] = int(lengths.sum())
  stats["maskable_tokens"] = int((instances.a_length.astype(np.int64) + instances.b_length).sum())
  order = mask_rng.permutation(instances.size)

  static = settings["masking"] == features_lib.STATIC
  max_predictions = settings["max_predictions_per_seq"]
  packed = bool(settings.get("packing"))
  per_row = settings["max_sequences_per_row"] if packed else None
  schema = features_lib.pretraining_features(max_seq_length, max_predictions,
                                             settings["masking"], per_row)
  masks = mask_config(settings, vocab_size=tokenizer.vocab_size, mask_id=tokenizer.mask_id,
                      cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id)
  if packed:
    # Rows of instances (in the shuffled order, so a row's instances are a random draw among
    # those of their lengths); each step writes the rows of about _CHUNK instances.
    layout = packing_lib.pack(
        lengths[order], max_seq_length, per_row, rng=mask_rng,
        costs=packing_lib.prediction_costs(max_seq_length, settings["masked_lm_prob"],
                                           max_predictions),
        max_cost=max_predictions)
    in_rows, row_starts = packing_lib.row_order(layout)
    steps = [(row_starts[r], row_starts[min(r + max(1, _CHUNK // per_row), layout.num_rows)])
             for r in range(0, layout.num_rows, max(1, _CHUNK // per_row))]
    stats["rows"] = layout.num_rows
    stats["slots"] = layout.num_rows * max_seq_length
  else:
    steps = [(b, min(b + _CHUNK, instances.size)) for b in range(0, instances.size, _CHUNK)]
    stats["rows"] = instances.size
  with records.TFRecordWriter(task["output_path"]) as writer:
    for begin, end in steps:
      if packed:
        which = in_rows[begin:end]
        rows = order[which]
      else:
        rows = order[begin:end]
      batch = instances.features(rows, tokens, max_seq_length, tokenizer.cls_id,
                                 tokenizer.sep_id, pair_separators)
      word_starts = None
      if masks.whole_word_mask or not static:
        word_starts = tokenizer.word_starts(batch["input_ids"]) & batch["input_mask"]
      if static:  # packed or not, each instance is masked on its own
        masked = masking.mask_batch(batch["input_ids"], batch["input_mask"], masks,
                                    mask_rng, word_starts=word_starts)
        _count_masks(stats, masked, tokenizer.mask_id, max_predictions)
        batch.update(masked)
      else:
        batch[features_lib.WORD_STARTS] = word_starts
      if packed:
        first_row = layout.row[which[0]]
        batch = packing_lib.pack_rows(batch, layout.row[which] - first_row, layout.slot[which],
                                      layout.offset[which],
                                      int(layout.row[which[-1]] - first_row + 1), per_row,
                                      max_predictions)
      buffer, ends = tfrecords.encode_examples_flat(
          batch, schema, prefix=tfrecords.frame_header, reserve_after=tfrecords.FRAME_AFTER)
      writer.write_framed(buffer, ends)
      workers.report("shard", 0.5 * shard_bytes * len(rows) / instances.size)
    stats["seconds"] = round(time.time() - started, 3)
    stats["settings"] = settings
    stats["output_path"] = task["output_path"]
    stats["records"] = writer.records_written
    stats["bytes"] = writer.bytes_written
  # Written once the shard is in place: a stats file vouches for a complete shard.
  file_io.write_text_atomic(shard_files.stats_path(task["output_path"]),
                            json.dumps(stats, indent=1))
  if instances.size == 0:
    workers.report("shard", 0.5 * shard_bytes)
  return stats


def _count_masks(stats: dict, masked: dict[str, np.ndarray], mask_id: int,
                 max_predictions: int) -> None:
  weights = masked["masked_lm_weights"] > 0
  rows, length = masked["input_ids"].shape
  new = masked["input_ids"].reshape(-1)[masked["masked_lm_positions"] +
                                        (np.arange(rows) * length)[:, None]]
  labels = masked["masked_lm_ids"]
  to_mask = weights & (new == mask_id)
  kept = weights & ~to_mask & (new == labels)
  stats["masked"] += int(weights.sum())
  stats["masked_to_mask_token"] += int(to_mask.sum())
  stats["masked_kept"] += int(kept.sum())
  stats["masked_to_random_token"] += int((weights & ~to_mask & ~kept).sum())
  stats["instances_at_max_predictions"] += int((weights.sum(axis=1) == max_predictions).sum())


# ---------------------------------------------------------------------------------------------
# Orchestration


def create_pretraining_data(settings: dict[str, Any], output_file: str | None = None,
                            output_dir: str | None = None, num_output_shards: int = 8,
                            num_workers: int = 1, tmp_dir: str | None = None,
                            show_progress: bool = True,
                            max_unknown_rate: float = unknown_tokens.MAX_UNKNOWN_RATE
                            ) -> dict[str, Any]:
  """The whole run; returns the summary (also printed and written beside the output)."""
  started = time.time()
  check_settings(settings)
  paths, summary_path = shard_files.output_paths(output_file, output_dir, num_output_shards)
  num_shards = len(paths)
  tokenizer = get_tokenizer(settings)  # fails early on a missing file or missing specials
  input_files = corpus_io.expand_input_patterns(settings["input_file"])
  shard_files.check_writable(paths)
  done = shard_files.finished_shards(paths, settings)
  shard_files.remove_stale_temporaries(paths)
  todo = [i for i in range(num_shards) if i not in done]
  if done:
    logging.info("%d of %d shards are complete from an earlier run; skipping them.", len(done),
                 num_shards)

  split_stats: list[dict] = []
  shard_stats = dict(done)
  bucket_dir = shard_files.make_split_dir(tmp_dir)
  pool = progress_queue = None
  try:
    if todo:
      pool_size = max(1, min(num_workers, max(len(todo), len(input_files))))
      if pool_size > 1:
        context = multiprocessing.get_context("spawn")
        progress_queue = context.Queue()
        pool = context.Pool(pool_size, initializer=workers.init_worker,
                            initargs=(progress_queue, os.getpid()))
      else:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
      total_bytes = sum(corpus_io.file_size(p) for p in input_files)
      split_tasks = [{"path": p, "file_index": i, "num_shards": num_shards, "shards_wanted": todo,
                      "random_seed": settings["random_seed"], "bucket_dir": bucket_dir,
                      "decode_errors": settings["decode_errors"]}
                     for i, p in enumerate(input_files)]
      bar = workers.Progress(show_progress, total_bytes, "split into shards")
      workers.run_tasks(split_task, split_tasks, pool, progress_queue, bar,
                 lambda task, result: split_stats.append(result))
      bar.close()
      if not sum(s["documents_read"] for s in split_stats):
        raise ValueError(f"--input_file {settings['input_file']}: {len(input_files)} file(s) "
                         "hold no text (only blank lines).")

      shard_tasks = []
      for shard in todo:
        buckets = [corpus_io.bucket_path(bucket_dir, shard, i) for i in range(len(input_files))]
        buckets = [b for b in buckets if os.path.exists(b)]
        shard_tasks.append({"shard": shard, "bucket_paths": buckets, "output_path": paths[shard],
                            "bucket_bytes": sum(os.path.getsize(b) for b in buckets),
                            "settings": settings, "max_unknown_rate": max_unknown_rate})
      bar = workers.Progress(show_progress, sum(t["bucket_bytes"] for t in shard_tasks),
                      f"build {len(shard_tasks)} shard(s), {pool_size} worker(s)")
      made = [0]

      def on_shard(task, result):
        shard_stats[task["shard"]] = result
        made[0] += result["instances"]
        bar.set_postfix(f"{made[0]:,} instances, "
                        f"{made[0] / max(1e-9, time.time() - started):,.0f}/s")

      workers.run_tasks(process_shard, shard_tasks, pool, progress_queue, bar, on_shard)
      bar.close()
  finally:
    if pool is not None:
      pool.terminate()
      pool.join()
    shutil.rmtree(bucket_dir, ignore_errors=True)

  summary = run_summary.summarize(settings, input_files, paths, shard_stats, split_stats, len(done),
                      time.time() - started, num_workers, tokenizer)
  file_io.write_text_atomic(summary_path, json.dumps(summary, indent=1) + "\n")
  run_summary.print_summary(summary, summary_path)
  return summary


def main(argv):
  del argv
  workers.keep_freed_memory()
  try:
    create_pretraining_data(settings_from_flags(), output_file=FLAGS.output_file,
                            output_dir=FLAGS.output_dir,
                            num_output_shards=FLAGS.num_output_shards,
                            num_workers=FLAGS.num_workers, tmp_dir=FLAGS.tmp_dir,
                            show_progress=FLAGS.progress,
                            max_unknown_rate=FLAGS.max_unknown_rate)
  except (ValueError, FileNotFoundError, PermissionError) as e:
    # Bad input or settings: the message names the file, line or flag; a trace adds nothing.
    print(f"create_pretraining_data: error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  flags.mark_flag_as_required("input_file")
  flags.mark_flags_as_mutual_exclusive(["vocab_file", "spm_model_file"], required=True)
  app.run(main)
