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
settings skips finished shards. Every shard leaves `<shard>.stats.json`; the run ends with a
summary printed and written to `summary.json` in `--output_dir` (or `<output_file>.summary.json`).
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import queue as queue_lib
import shutil
import signal
import sys
import tempfile
import threading
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
from data_prep import corpus_io, instances as instances_lib, records
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
PAIRS, FULL_SENTENCES, DOC_SENTENCES = "pairs", "full_sentences", "doc_sentences"
SEQUENCE_MODES = (PAIRS, FULL_SENTENCES, DOC_SENTENCES)


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


def output_paths(output_file: str | None, output_dir: str | None,
                 num_output_shards: int) -> tuple[list[str], str]:
  """The shard files and the summary file."""
  if bool(output_file) == bool(output_dir):
    raise ValueError("Give exactly one of --output_file (comma-separated files) and "
                     "--output_dir (with --num_output_shards).")
  if output_file:
    paths = [p.strip() for p in output_file.split(",") if p.strip()]
    if len(set(paths)) != len(paths):
      raise ValueError("--output_file lists the same file twice.")
    return paths, paths[0] + ".summary.json"
  if num_output_shards < 1:
    raise ValueError("--num_output_shards must be at least 1.")
  paths = [file_io.join(output_dir, f"pretrain-{i:05d}-of-{num_output_shards:05d}.tfrecord")
           for i in range(num_output_shards)]
  return paths, file_io.join(output_dir, "summary.json")


def _directory(path: str) -> str:
  return path.rsplit("/", 1)[0] if file_io.is_remote(path) else (os.path.dirname(path) or ".")


def check_writable(paths: list[str]) -> None:
  """Fails before any work if an output directory cannot be created or written."""
  for directory in sorted({_directory(p) for p in paths}):
    probe = file_io.join(directory, f".write-test-{os.getpid()}")
    try:
      file_io.makedirs(directory)
      file_io.write_bytes_atomic(probe, b"")
      if file_io.is_remote(probe):
        import tensorflow as tf  # pylint: disable=g-import-not-at-top
        tf.io.gfile.remove(probe)
      else:
        os.remove(probe)
    except Exception as e:  # pylint: disable=broad-except
      raise PermissionError(f"Cannot write to output directory {directory}: {e}") from e


def stats_path(shard_path: str) -> str:
  return shard_path + ".stats.json"


def finished_shards(paths: list[str], settings: dict[str, Any]) -> dict[int, dict]:
  """Shards already complete from an earlier run with the same settings (their stats)."""
  done = {}
  for index, path in enumerate(paths):
    if not (file_io.exists(path) and file_io.exists(stats_path(path))):
      continue
    stats = json.loads(file_io.read_text(stats_path(path)))
    size = _file_size(path)
    if "bytes" in stats and size != stats["bytes"]:
      logging.warning("%s has %d bytes but was written with %d (cut short or altered): writing "
                      "it again.", path, size, stats["bytes"])
      continue
    if stats.get("settings") != settings:
      differing = sorted(k for k in set(settings) | set(stats.get("settings", {}))
                         if settings.get(k) != stats.get("settings", {}).get(k))
      raise ValueError(f"{path} exists from a run with other settings (differing: "
                       f"{', '.join(differing)}). Delete it or write somewhere else.")
    done[index] = stats
  return done


def _file_size(path: str) -> int:
  if file_io.is_remote(path):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.io.gfile.stat(path).length
  return os.path.getsize(path)


def remove_stale_temporaries(paths: list[str]) -> None:
  """Half-written shards of an interrupted run (`<shard>.tmp-<pid>`) go before a rerun."""
  for directory in sorted({_directory(p) for p in paths}):
    if file_io.is_remote(directory):
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      names = [p for p in tf.io.gfile.glob(directory + "/*.tmp-*")]
      for name in names:
        if any(os.path.basename(name).startswith(os.path.basename(p) + ".tmp-") for p in paths):
          tf.io.gfile.remove(name)
      continue
    if not os.path.isdir(directory):
      continue
    shard_names = {os.path.basename(p) for p in paths}
    for name in os.listdir(directory):
      base = name.split(".tmp-")[0]
      if records.is_temporary_name(name) and (base in shard_names or
                                              base[:-len(".stats.json")] in shard_names):
        os.remove(os.path.join(directory, name))


SPLIT_DIR_PREFIX = "bert_jax_split_"


def make_split_dir(tmp_dir: str | None) -> str:
  """A fresh local folder for the split step, `bert_jax_split_<pid>_*`; the folders that runs
  killed before their cleanup left there (their process is gone) are removed first, so a rerun
  after `kill -9` leaves no copy of the corpus behind."""
  base = tmp_dir or tempfile.gettempdir()
  os.makedirs(base, exist_ok=True)
  for name in os.listdir(base):
    if not name.startswith(SPLIT_DIR_PREFIX):
      continue
    pid = name[len(SPLIT_DIR_PREFIX):].split("_", 1)[0]
    if pid.isdigit() and int(pid) != os.getpid() and not file_io.pid_alive(int(pid)):
      logging.info("Removing %s, left by an interrupted run (process %s).", name, pid)
      shutil.rmtree(os.path.join(base, name), ignore_errors=True)
  return tempfile.mkdtemp(prefix=f"{SPLIT_DIR_PREFIX}{os.getpid()}_", dir=base)


# ---------------------------------------------------------------------------------------------
# Work done in worker processes

_TOKENIZERS: dict[tuple, tokenization.Tokenizer] = {}
_PROGRESS_QUEUE = None


def _init_worker(progress_queue, parent_pid: int) -> None:
  global _PROGRESS_QUEUE
  die_with_parent(parent_pid)
  _PROGRESS_QUEUE = progress_queue
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one core per worker
  keep_freed_memory()


def die_with_parent(parent_pid: int) -> None:
  """Ends this worker when the command that started it dies, even by `kill -9` (which gives the
  pool no chance to stop its workers): on Linux the kernel sends SIGKILL (PR_SET_PDEATHSIG),
  elsewhere a thread watches the parent process id."""
  try:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1  # from <sys/prctl.h>
    watched = libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) == 0
  except (OSError, AttributeError):
    watched = False
  if os.getppid() != parent_pid:  # the parent died before the line above took effect
    os._exit(1)  # pylint: disable=protected-access
  if watched:
    return

  def watch():
    while os.getppid() == parent_pid:
      time.sleep(1.0)
    os._exit(1)  # pylint: disable=protected-access

  threading.Thread(target=watch, daemon=True, name="watch-parent").start()


def keep_freed_memory() -> None:
  """Has glibc keep freed memory for reuse instead of handing it back to the kernel at once.

  Every step of 2048 instances allocates and frees the same large numpy temporaries (several
  MB each); by default glibc unmaps them, and the kernel then zero-fills fresh pages for the next
  step: on the benchmark that was about 0.2 s of system time in a run of about 2.4 s CPU. The
  largest step still bounds the memory, so the peak stays what it was. Done in this program's
  own processes only (the command line and its workers); a no-op without glibc.
  """
  try:
    libc = ctypes.CDLL("libc.so.6")
  except OSError:
    return
  m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt parameters, from <malloc.h>
  libc.mallopt(m_mmap_threshold, 1 << 26)
  libc.mallopt(m_trim_threshold, 1 << 28)


def _report(kind: str, amount: float) -> None:
  if _PROGRESS_QUEUE is not None:
    _PROGRESS_QUEUE.put((kind, amount))


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
      on_bytes=lambda n: _report("split", n))


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


def new_shard_stats() -> dict[str, Any]:
  keys = ("documents", "sentences", "lines_without_tokens", "documents_without_tokens",
          "single_sentence_documents", "sentences_longer_than_max", "document_passes",
          "short_target_passes", "instances", "tokens", "maskable_tokens", "masked",
          "masked_to_mask_token", "masked_to_random_token", "masked_kept",
          "instances_at_max_predictions", "random_next", "slots", "rows", "pieces",
          "unknown_pieces")
  return {k: 0 for k in keys}


def process_shard(task: dict[str, Any]) -> dict[str, Any]:
  """Tokenize, pair, shuffle, mask and write one shard; returns (and stores) its statistics."""
  started = time.time()
  settings = task["settings"]
  shard_bytes = max(1, task["bucket_bytes"])
  tokenizer = get_tokenizer(settings)
  max_seq_length = settings["max_seq_length"]
  stats = new_shard_stats()
  documents = load_shard_documents(task["bucket_paths"], tokenizer, max_seq_length - 3, stats,
                                   on_bytes=lambda n: _report("shard", 0.5 * n))
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
      _report("shard", 0.5 * shard_bytes * len(rows) / instances.size)
    stats["seconds"] = round(time.time() - started, 3)
    stats["settings"] = settings
    stats["output_path"] = task["output_path"]
    stats["records"] = writer.records_written
    stats["bytes"] = writer.bytes_written
  # Written once the shard is in place: a stats file vouches for a complete shard.
  file_io.write_text_atomic(stats_path(task["output_path"]), json.dumps(stats, indent=1))
  if instances.size == 0:
    _report("shard", 0.5 * shard_bytes)
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


class _Progress:
  """A tqdm bar fed from worker processes through a queue (or directly, in-process)."""

  def __init__(self, enabled: bool, total: float, description: str, unit: str = "B"):
    self.bar = None
    if enabled:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      self.bar = tqdm(total=total, desc=description, unit=unit, unit_scale=True,
                      dynamic_ncols=True, smoothing=0.1)

  def update(self, amount: float) -> None:
    if self.bar is not None:
      self.bar.update(amount)

  def set_postfix(self, text: str) -> None:
    if self.bar is not None:
      self.bar.set_postfix_str(text)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()


def _run_tasks(function, tasks: list[dict], pool, progress_queue, progress: _Progress,
               on_result: Callable[[dict, Any], None]) -> None:
  """Runs tasks in the pool (or here, without one), feeding progress, failing fast."""
  global _PROGRESS_QUEUE
  if pool is None:

    class _Direct:  # in-process: progress goes straight to the bar
      put = staticmethod(lambda item: progress.update(item[1]))

    _PROGRESS_QUEUE = _Direct()
    try:
      for task in tasks:
        on_result(task, function(task))
    finally:
      _PROGRESS_QUEUE = None
    return
  pending = {id(task): (task, pool.apply_async(function, (task,))) for task in tasks}
  while pending:
    try:
      while True:
        progress.update(progress_queue.get(timeout=0.2)[1])
    except queue_lib.Empty:
      pass
    for key, (task, result) in list(pending.items()):
      if result.ready():
        on_result(task, result.get())  # re-raises a worker's error here
        del pending[key]
  try:
    while True:
      progress.update(progress_queue.get_nowait()[1])
  except queue_lib.Empty:
    pass


def create_pretraining_data(settings: dict[str, Any], output_file: str | None = None,
                            output_dir: str | None = None, num_output_shards: int = 8,
                            num_workers: int = 1, tmp_dir: str | None = None,
                            show_progress: bool = True,
                            max_unknown_rate: float = unknown_tokens.MAX_UNKNOWN_RATE
                            ) -> dict[str, Any]:
  """The whole run; returns the summary (also printed and written beside the output)."""
  started = time.time()
  check_settings(settings)
  paths, summary_path = output_paths(output_file, output_dir, num_output_shards)
  num_shards = len(paths)
  tokenizer = get_tokenizer(settings)  # fails early on a missing file or missing specials
  input_files = corpus_io.expand_input_patterns(settings["input_file"])
  check_writable(paths)
  done = finished_shards(paths, settings)
  remove_stale_temporaries(paths)
  todo = [i for i in range(num_shards) if i not in done]
  if done:
    logging.info("%d of %d shards are complete from an earlier run; skipping them.", len(done),
                 num_shards)

  split_stats: list[dict] = []
  shard_stats = dict(done)
  bucket_dir = make_split_dir(tmp_dir)
  pool = progress_queue = None
  try:
    if todo:
      workers = max(1, min(num_workers, max(len(todo), len(input_files))))
      if workers > 1:
        context = multiprocessing.get_context("spawn")
        progress_queue = context.Queue()
        pool = context.Pool(workers, initializer=_init_worker,
                            initargs=(progress_queue, os.getpid()))
      else:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
      total_bytes = sum(corpus_io.file_size(p) for p in input_files)
      split_tasks = [{"path": p, "file_index": i, "num_shards": num_shards, "shards_wanted": todo,
                      "random_seed": settings["random_seed"], "bucket_dir": bucket_dir,
                      "decode_errors": settings["decode_errors"]}
                     for i, p in enumerate(input_files)]
      bar = _Progress(show_progress, total_bytes, "split into shards")
      _run_tasks(split_task, split_tasks, pool, progress_queue, bar,
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
      bar = _Progress(show_progress, sum(t["bucket_bytes"] for t in shard_tasks),
                      f"build {len(shard_tasks)} shard(s), {workers} worker(s)")
      made = [0]

      def on_shard(task, result):
        shard_stats[task["shard"]] = result
        made[0] += result["instances"]
        bar.set_postfix(f"{made[0]:,} instances, "
                        f"{made[0] / max(1e-9, time.time() - started):,.0f}/s")

      _run_tasks(process_shard, shard_tasks, pool, progress_queue, bar, on_shard)
      bar.close()
  finally:
    if pool is not None:
      pool.terminate()
      pool.join()
    shutil.rmtree(bucket_dir, ignore_errors=True)

  summary = summarize(settings, input_files, paths, shard_stats, split_stats, len(done),
                      time.time() - started, num_workers, tokenizer)
  file_io.write_text_atomic(summary_path, json.dumps(summary, indent=1) + "\n")
  print_summary(summary, summary_path)
  return summary


def summarize(settings, input_files, paths, shard_stats, split_stats, skipped, seconds,
              num_workers, tokenizer) -> dict[str, Any]:
  total = new_shard_stats()
  for stats in shard_stats.values():
    for key in total:
      total[key] += stats.get(key, 0)

  def ratio(a, b):
    return round(a / b, 6) if b else None

  # Shards from before rows were counted: one row per instance.
  total["rows"] = sum(s.get("rows", s["instances"]) for s in shard_stats.values())

  summary: dict[str, Any] = {
      "input_files": len(input_files),
      "input_bytes": sum(s["bytes"] for s in split_stats) if split_stats else None,
      "input_lines_not_utf8": sum(s["bad_lines"] for s in split_stats) if split_stats else None,
      "documents": total["documents"],
      "sentences": total["sentences"],
      "single_sentence_documents": total["single_sentence_documents"],
      "documents_without_tokens_dropped": total["documents_without_tokens"],
      "lines_without_tokens_dropped": total["lines_without_tokens"],
      "sentences_longer_than_max": total["sentences_longer_than_max"],
      "instances": total["instances"],
      "tokens": total["tokens"],
      # What next_sentence_labels mean: nsp (1 = B is random), sop (1 = A and B swapped) or
      # none (always 0); and how many are 1.
      "sentence_objective": settings.get("objective", "nsp"),
      "sequence_mode": settings.get("sequence_mode", PAIRS),
      "masking_strategy": settings.get("masking_strategy") or (
          "whole_word" if settings["do_whole_word_mask"] else "token"),
      "random_next_fraction": (ratio(total["random_next"], total["instances"])
                               if settings.get("objective", "nsp") == "nsp" else None),
      "swapped_fraction": (ratio(total["random_next"], total["instances"])
                           if settings.get("objective") == "sop" else None),
      "short_target_fraction": ratio(total["short_target_passes"], total["document_passes"]),
      "padding_fraction": ratio(total["slots"] - total["tokens"], total["slots"]),
      # Real tokens / row tokens, packed or not (unpacked: 1 - padding_fraction), so the two
      # compare; and instances per row (1 unpacked).
      "packing_efficiency": ratio(total["tokens"], total["slots"]),
      "sequences_per_row": ratio(total["instances"], total["rows"]),
      "rows": total["rows"],
      "mean_tokens_per_instance": ratio(total["tokens"], total["instances"]),
      "unknown_piece_fraction": ratio(total["unknown_pieces"], total["pieces"]),
  }
  if settings["masking"] == features_lib.STATIC:
    summary.update({
        "masked_fraction": ratio(total["masked"], total["maskable_tokens"]),
        "masked_per_instance": ratio(total["masked"], total["instances"]),
        "instances_at_max_predictions": ratio(total["instances_at_max_predictions"],
                                              total["instances"]),
        "mask_token_fraction": ratio(total["masked_to_mask_token"], total["masked"]),
        "random_token_fraction": ratio(total["masked_to_random_token"], total["masked"]),
        "kept_token_fraction": ratio(total["masked_kept"], total["masked"]),
    })
  warnings = []
  if total["documents"] and total["single_sentence_documents"] > 0.5 * total["documents"]:
    warnings.append(f"{total['single_sentence_documents']:,} of {total['documents']:,} documents "
                    "have one sentence: is the input one sentence per line with a blank line "
                    "between documents? NSP needs sentences to pair.")
  few = sorted(i for i, s in shard_stats.items() if s["documents"] < 2)
  if few and settings.get("objective", "nsp") == "nsp":
    warnings.append(f"shard(s) {few[:10]} hold fewer than 2 documents, so 'random next' "
                    "segments come from the same document: use fewer --num_output_shards.")
  if total["sentences"] and total["sentences_longer_than_max"] > 0.05 * total["sentences"]:
    warnings.append(f"{total['sentences_longer_than_max']:,} sentences are longer than "
                    f"max_seq_length - 3 = {settings['max_seq_length'] - 3} tokens and get cut: "
                    "are lines sentences, or whole paragraphs?")
  summary.update({
      "seconds": round(seconds, 2),
      "instances_per_second": round(total["instances"] / seconds, 1) if seconds else None,
      "num_workers": num_workers,
      "shards": len(paths),
      "shards_skipped_as_complete": skipped,
      "vocab_size": tokenizer.vocab_size,
      "output_files": paths,
      # Per shard file (by name): what the input pipeline checks each file against.
      "records_per_file": {os.path.basename(paths[i]): stats.get("records", stats["instances"])
                           for i, stats in sorted(shard_stats.items())},
      "bytes_per_file": {os.path.basename(paths[i]): stats["bytes"]
                         for i, stats in sorted(shard_stats.items()) if "bytes" in stats},
      "settings": settings,
      "warnings": warnings,
  })
  return summary


def print_summary(summary: dict[str, Any], summary_path: str) -> None:
  lines = [f"Wrote {summary['instances']:,} instances to {summary['shards']} shard(s) "
           f"in {summary['seconds']:,.1f} s ({summary['instances_per_second'] or 0:,.0f} "
           "instances/s)."]
  for key in ("documents", "sentences", "tokens", "masked_fraction", "random_next_fraction",
              "swapped_fraction",
              "short_target_fraction", "padding_fraction", "packing_efficiency",
              "sequences_per_row"):
    if summary.get(key) is not None:
      value = summary[key]
      lines.append(f"  {key:24s} {value:,.4f}" if isinstance(value, float) else
                   f"  {key:24s} {value:,}")
  for warning in summary["warnings"]:
    lines.append(f"  warning: {warning}")
  lines.append(f"Summary: {summary_path}")
  print("\n".join(lines), flush=True)


def main(argv):
  del argv
  keep_freed_memory()
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
