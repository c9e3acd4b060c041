"""Multiple choice: SWAG (the BERT paper's fourth benchmark) and HellaSwag, read from their files.

BERT fine-tunes on SWAG (Zellers et al. 2018) by pairing the given sentence with each possible
continuation: for every example, one input per ending, `[CLS] context [SEP] continuation [SEP]`,
one score per input from the pooled [CLS] vector and a softmax over the endings. This module is
the data side of that: the files, the pairs, their features, the metric and the prediction files;
`multiple_choice.py` makes it an objective of the training core.

SWAG's CSV files (`train.csv`, `val.csv`, `test.csv` of rowanz/swagaf `data/`) have the header
`,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label`
(the first, unnamed column is the pandas index they were written with; test.csv leaves `label`
empty). `startphrase` is `sent1 + " " + sent2`: `sent1` is a whole sentence, `sent2` the start of
the next one ("Someone", "The man"), which every ending continues. As in the original BERT SWAG
runner and the SWAG baselines, sentence A is `sent1` and sentence B is `sent2 + " " + ending`.
Columns are found by name, so the index column, extra columns and any order are fine; the endings
are `ending0`, `ending1`, ... as many as the header names in a row (at least two).

- Copies that keep only `startphrase` and the endings (no `sent1`/`sent2`) cannot be split back
  reliably (where sent1 ends is not marked), so there sentence A is the whole startphrase and
  each sentence B is the ending alone: the same words, only the [SEP] falls elsewhere.
- `train_full.csv` / `val_full.csv` are the annotation records (`gold-ending`, `distractor-0` to
  `distractor-3`, of which the fourth is often empty, and their ordinal types), not the
  benchmark; they are refused with a message pointing at `train.csv` / `val.csv`.
- The files are real CSV: quoted fields with commas, doubled quotes and newlines inside, "\\r\\n"
  line ends and a UTF-8 byte-order mark are all read. Every error names the file and the
  physical line where the record starts (a record with a newline inside a quoted field spans
  several lines): missing columns (with the header found), a row whose field count is not the
  header's, an empty context or ending, a label that is not an integer below the number of
  endings, and a file that labels some rows and not others.

HellaSwag's JSONL files (`hellaswag_{train,val,test}.jsonl` of rowanz/hellaswag `data/`) hold per
line `ind`, `activity_label`, `ctx_a`, `ctx_b`, `ctx`, `endings` (4), `label` (not in test),
`split`, `split_type`, `source_id`. `ctx` is `ctx_a + " " + ctx_b` where `ctx_b` (ActivityNet's
unfinished noun phrase) is not empty. HellaSwag's own BERT baseline pairs `ctx_a` (A) with
`ctx_b + " " + ending` (B), exactly SWAG's layout, and so does this reader; where `ctx_a` is
empty or absent, A is the whole `ctx` and B the ending alone (the baseline's fallback). A label
given as a string of digits (as exported by some dataset libraries) is accepted.

Features are `pairs.encode_examples` of the flattened (context, continuation) pairs, reshaped to
(examples, endings, max_seq_length): every tokenizer family's layout ([CLS] A [SEP] B [SEP],
RoBERTa's <s> A </s></s> B </s>) and the original's longest-first truncation come from there.
That truncation drops one token at a time from the longer side, A on a tie; transformers'
`truncation="longest_first"` agrees except when both sides end up sharing an odd number of places
after a tie, where it gives the extra token to B when B was at least as long as A at first.

Prediction files are CSV, one row per example in the order of the input file:
`id,pred,prob0,...` (the example id, the predicted ending, each ending's probability). SWAG's
leaderboard read a `pred` column per test row in file order (rowanz/swagaf `csv_predict.py`
writes `,pred` with the row index); `write_submission` writes that exact form, and HellaSwag's
(`annot_id,ending0,...,ending3` probabilities with ids `test-0`, `test-1`, ..., its
`bertlarge-example-submission.csv`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import sys
from typing import Any, Iterator, Sequence

import numpy as np

from bert_jax import file_io
from bert_jax.tasks import registry
from bert_jax.text import characters, pairs, unknown_tokens

TASKS = registry.MULTIPLE_CHOICE.names
SPLITS = ("train", "dev", "test")
# The file names each split is looked for under, in order (local directory or gs://).
SPLIT_FILES = {
    "swag": {"train": ("train.csv",), "dev": ("val.csv",), "test": ("test.csv",)},
    "hellaswag": {"train": ("hellaswag_train.jsonl", "train.jsonl"),
                  "dev": ("hellaswag_val.jsonl", "val.jsonl"),
                  "test": ("hellaswag_test.jsonl", "test.jsonl")},
}
_SPLIT_ALIASES = {"val": "dev", "validation": "dev", "eval": "dev"}
SWAG_HEADER = ("video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
               "ending0", "ending1", "ending2", "ending3", "label")
# Columns of SWAG's annotation form (train_full.csv / val_full.csv), recognised to be refused.
_SWAG_FULL_COLUMNS = ("gold-ending", "distractor-0")
# Python's csv module refuses fields over 128 KiB by default; memory bounds them here.
_CSV_FIELD_LIMIT = min(sys.maxsize, 2**31 - 1)


@dataclasses.dataclass(frozen=True)
class ChoiceExample:
  """A context and its candidate endings; input j is (context, `choices[j]`)."""
  example_id: str  # SWAG: "<video-id>-<fold-ind>" (else the data row from 0); HellaSwag: `ind`
  context: str  # sentence A
  start: str  # the start of the continuation shared by every ending ("" if none)
  endings: tuple[str, ...]  # the candidate endings; the same number for every example of a file
  label: int | None  # index of the right ending; None when unlabelled (test files)
  source: str  # "path:line"

  @property
  def choices(self) -> tuple[str, ...]:
    """Sentence B of each input: the shared start, a space, the ending."""
    return tuple(continuation(self.start, ending) for ending in self.endings)


def continuation(start: str, ending: str) -> str:
  """Sentence B for one ending: `start + " " + ending`, without spaces at either end."""
  return (start + " " + ending).strip()


# -------------------------------------------------------------------------------------- SWAG CSV


def _physical_lines(text: str) -> Iterator[str]:
  """`text` cut after each "\\n" only (a lone "\\r" or U+2028 inside a field is not a line end),
  so that the csv reader's line count is the line number an editor shows."""
  start = 0
  while start < len(text):
    end = text.find("\n", start)
    if end < 0:
      yield text[start:]
      return
    yield text[start:end + 1]
    start = end + 1


def _csv_records(path: str) -> Iterator[tuple[int, list[str]]]:
  """(line where the record starts, fields) for every non-blank CSV record of `path`."""
  text = file_io.read_text(path)
  if text.startswith("\ufeff"):
    text = text[1:]
  if csv.field_size_limit() < _CSV_FIELD_LIMIT:
    csv.field_size_limit(_CSV_FIELD_LIMIT)
  # strict: a stray character after a closing quote, or a quote never closed, is an error
  # instead of a record silently merged with the lines after it.
  reader = csv.reader(_physical_lines(text), strict=True)
  while True:
    first_line = reader.line_num + 1
    try:
      fields = next(reader)
    except StopIteration:
      return
    except csv.Error as e:
      if "unexpected end of data" in str(e):
        reason = (f"the quoted field opened in the record that starts on line {first_line} is "
                  "never closed (a missing '\"')")
      else:
        reason = (f"{e} (in the record that starts on line {first_line}; a '\"' inside a quoted "
                  "field is written twice)")
      raise ValueError(f"{path}: line {reader.line_num}: not valid CSV: {reason}.") from e
    if fields:  # a blank line gives no fields
      yield first_line, fields


def _missing_columns_error(path: str, line: int, missing: Sequence[str],
                           names: Sequence[str]) -> ValueError:
  return ValueError(
      f"{path}: line {line}: the header has no column {', '.join(missing)}; a SWAG file starts "
      f"with a header naming the endings ending0, ending1, ... and either sent1 and sent2 or "
      f"startphrase (the official files: {','.join(SWAG_HEADER)}); found "
      f"{','.join(names) or 'an empty line'}.")


def _parse_label(value: Any, num_endings: int, where: str) -> int | None:
  """An ending index from a CSV field or a JSON value; None for an empty field or null."""
  if value is None or (isinstance(value, str) and not value.strip()):
    return None
  if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
    label = int(value.strip())
  elif isinstance(value, int) and not isinstance(value, bool):
    label = value
  else:
    label = None
  if label is None or not 0 <= label < num_endings:
    raise ValueError(f"{where}: the label is {value!r}; expected the index of the right ending, "
                     f"an integer from 0 to {num_endings - 1}.")
  return label


class _LabelConsistency:
  """A file labels every example or none: a few unlabelled rows in a training file would
  otherwise train silently as "ending 0 is right"."""

  def __init__(self, path: str):
    self.path = path
    self.first_labelled: int | None = None
    self.first_unlabelled: int | None = None

  def see(self, label: int | None, line: int) -> None:
    if label is None and self.first_unlabelled is None:
      self.first_unlabelled = line
    if label is not None and self.first_labelled is None:
      self.first_labelled = line
    if self.first_labelled is not None and self.first_unlabelled is not None:
      raise ValueError(
          f"{self.path}: line {line}: {'no label' if label is None else 'a label'}, but line "
          f"{self.first_labelled if label is None else self.first_unlabelled} "
          f"{'has one' if label is None else 'has none'}; a file labels all of its examples "
          "(train, dev) or none (test).")


def _text_field(fields: list[str], column: dict[str, int], name: str, where: str) -> str:
  value = fields[column[name]]
  if not characters.has_text(value):
    raise ValueError(f"{where}: the {name} column is empty; every example needs its context and "
                     "all of its endings.")
  return value


def read_swag_csv(path: str) -> list[ChoiceExample]:
  """The examples of a SWAG CSV file (local or gs://), in file order; see the module docstring
  for the columns read and the errors raised."""
  records = _csv_records(path)
  try:
    header_line, header = next(records)
  except StopIteration:
    raise ValueError(f"{path}: the file is empty; expected a header line "
                     f"({','.join(SWAG_HEADER)}) and one example per line.") from None
  names = [name.strip() for name in header]
  column = {}
  for position, name in enumerate(names):
    if name:
      column.setdefault(name, position)
  if all(name in column for name in _SWAG_FULL_COLUMNS) and "ending0" not in column:
    raise ValueError(
        f"{path}: line {header_line}: this is SWAG's annotation form (train_full.csv / "
        "val_full.csv: gold-ending, distractor-0..3 and their types), which has no fixed set of "
        "endings; multiple choice reads the shuffled benchmark files train.csv / val.csv / "
        f"test.csv, with the columns {','.join(SWAG_HEADER)}.")
  num_endings = 0
  while f"ending{num_endings}" in column:
    num_endings += 1
  missing = [f"ending{i}" for i in range(num_endings, 2)]
  split_context = "sent1" in column or "sent2" in column
  if split_context:
    missing += [name for name in ("sent1", "sent2") if name not in column]
  elif "startphrase" not in column:
    missing += ["sent1", "sent2 (or startphrase)"]
  if missing:
    raise _missing_columns_error(path, header_line, missing, names)
  has_ids = "video-id" in column and "fold-ind" in column
  labels = _LabelConsistency(path)
  examples = []
  for line, fields in records:
    if len(fields) != len(names):
      raise ValueError(
          f"{path}: line {line}: {len(fields)} fields, but the header on line {header_line} "
          f"names {len(names)} columns ({','.join(names)}); a field holding a comma, quote or "
          "newline must be quoted.")
    where = f"{path}: line {line}"
    if split_context:
      context = _text_field(fields, column, "sent1", where)
      start = fields[column["sent2"]]
    else:
      context, start = _text_field(fields, column, "startphrase", where), ""
    endings = tuple(_text_field(fields, column, f"ending{j}", where) for j in range(num_endings))
    label = (_parse_label(fields[column["label"]], num_endings, where)
             if "label" in column else None)
    labels.see(label, line)
    video, fold = ((fields[column["video-id"]].strip(), fields[column["fold-ind"]].strip())
                   if has_ids else ("", ""))
    example_id = f"{video}-{fold}" if video and fold else str(len(examples))
    examples.append(ChoiceExample(example_id=example_id, context=context, start=start,
                                  endings=endings, label=label, source=f"{path}:{line}"))
  if not examples:
    raise ValueError(f"{path}: no examples after the header on line {header_line}.")
  return examples


# --------------------------------------------------------------------------------- HellaSwag JSONL


def _describe(value: Any) -> str:
  names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
           list: "a list", dict: "a JSON object", type(None): "null"}
  return names.get(type(value), type(value).__name__)


def read_hellaswag_jsonl(path: str) -> list[ChoiceExample]:
  """The examples of a HellaSwag JSONL file (local or gs://), one JSON object a line, in file
  order; see the module docstring for the fields read and how the pair is formed."""
  text = file_io.read_text(path)
  if text.startswith("\ufeff"):
    text = text[1:]
  labels = _LabelConsistency(path)
  examples: list[ChoiceExample] = []
  first_count: tuple[int, int] | None = None  # (number of endings, line) of the first example
  for line, raw in enumerate(text.split("\n"), start=1):
    if not raw.strip():
      continue
    where = f"{path}: line {line}"
    try:
      item = json.loads(raw)
    except json.JSONDecodeError as e:
      raise ValueError(f"{where}: not valid JSON ({e.msg} at column {e.colno}); a JSONL file "
                       "holds one JSON object per line.") from e
    if not isinstance(item, dict):
      raise ValueError(f"{where}: {_describe(item)}; expected a JSON object with the fields "
                       "ind, ctx_a, ctx_b, ctx, endings, label.")
    missing = [f for f in ("ind", "endings") if f not in item]
    if "ctx_a" not in item and "ctx" not in item:
      missing.append("ctx_a (or ctx)")
    if missing:
      raise ValueError(f"{where}: no field {', '.join(missing)}; a HellaSwag line has ind, "
                       f"ctx_a, ctx_b, ctx, endings and (except in test files) label; found "
                       f"{', '.join(item) or 'none'}.")
    for name in ("ctx_a", "ctx_b", "ctx"):
      if name in item and not isinstance(item[name], str):
        raise ValueError(f"{where}: {name} is {_describe(item[name])}; expected a string.")
    ind = item["ind"]
    if isinstance(ind, bool) or not isinstance(ind, (int, str)) or str(ind) == "":
      raise ValueError(f"{where}: ind is {ind!r}; expected the example's id (an integer).")
    endings = item["endings"]
    if (not isinstance(endings, list) or len(endings) < 2 or
        not all(isinstance(e, str) for e in endings)):
      raise ValueError(f"{where}: endings is {_describe(endings)} "
                       f"{endings!r:.80}; expected a list of at least two strings.")
    for j, ending in enumerate(endings):
      if not characters.has_text(ending):
        raise ValueError(f"{where}: endings[{j}] is empty; every ending needs its text.")
    if first_count is None:
      first_count = (len(endings), line)
    elif len(endings) != first_count[0]:
      raise ValueError(f"{where}: {len(endings)} endings, but line {first_count[1]} has "
                       f"{first_count[0]}; every example of a file has the same number.")
    ctx_a = item.get("ctx_a", "")
    if characters.has_text(ctx_a):
      context, start = ctx_a, item.get("ctx_b", "")
    else:
      context, start = item.get("ctx", ""), ""
    if not characters.has_text(context):
      raise ValueError(f"{where}: ctx_a and ctx are empty; every example needs its context.")
    label = _parse_label(item.get("label"), len(endings), where)
    labels.see(label, line)
    examples.append(ChoiceExample(example_id=str(ind), context=context, start=start,
                                  endings=tuple(endings), label=label, source=f"{path}:{line}"))
  if not examples:
    raise ValueError(f"{path}: no examples (an empty file).")
  return examples


# ---------------------------------------------------------------------------------------- splits


def split_path(task_name: str, data_dir: str, split: str) -> str:
  """The file of `split` ("train", "dev" or "test"; "val" means "dev") under `data_dir`: the
  first of `SPLIT_FILES` that exists."""
  task = task_name.lower()
  if task not in SPLIT_FILES:
    raise ValueError(f"task_name={task_name!r}: multiple choice reads {', '.join(TASKS)}.")
  split = _SPLIT_ALIASES.get(split, split)
  if split not in SPLITS:
    raise ValueError(f"{task}: no split {split!r}; the splits are {', '.join(SPLITS)}.")
  candidates = [file_io.join(data_dir, name) for name in SPLIT_FILES[task][split]]
  for path in candidates:
    if file_io.exists(path):
      return path
  raise FileNotFoundError(f"{task} {split!r}: none of these files exists: "
                          f"{', '.join(candidates)}.")


def read_split(task_name: str, data_dir: str, split: str) -> tuple[list[ChoiceExample], str]:
  """The examples of one split and the file they came from; train and dev must be labelled."""
  path = split_path(task_name, data_dir, split)
  reader = read_swag_csv if path.endswith(".csv") else read_hellaswag_jsonl
  examples = reader(path)
  if _SPLIT_ALIASES.get(split, split) != "test" and examples[0].label is None:
    raise ValueError(f"{path}: the examples have no labels; the {split} split is trained or "
                     "scored on them (only test files may leave them out).")
  return examples, path


# -------------------------------------------------------------------------------------- features


def _source_file(examples: Sequence[ChoiceExample]) -> str:
  return examples[0].source.rsplit(":", 1)[0]


def featurize(examples: Sequence[ChoiceExample], tokenizer,
              max_seq_length: int) -> dict[str, np.ndarray]:
  """`input_ids`, `input_mask`, `segment_ids` (examples, endings, max_seq_length) int32,
  `label` (examples,) int32 (0 where unlabelled) and `weight` (examples,) float32 ones."""
  if not examples:
    raise ValueError("No multiple-choice examples to featurize.")
  num_endings = len(examples[0].endings)
  for example in examples:
    if len(example.endings) != num_endings:
      raise ValueError(f"{example.source}: {len(example.endings)} endings, but "
                       f"{examples[0].source} has {num_endings}; the examples of one batch of "
                       "features have the same number.")
  if max_seq_length < 3 + tokenizer.pair_separators:
    raise ValueError(f"max_seq_length={max_seq_length}: a pair needs "
                     f"{2 + tokenizer.pair_separators} special tokens and room for text.")
  texts_a = [e.context for e in examples for _ in range(num_endings)]
  texts_b = [choice for e in examples for choice in e.choices]
  flat = pairs.encode_examples(tokenizer, texts_a, texts_b, max_seq_length)
  shape = (len(examples), num_endings, max_seq_length)
  feats = {name: values.reshape(shape) for name, values in flat.items()}
  # A vocabulary that does not fit the text turns it into [UNK]s: said, not trained on.
  unknown_tokens.check_unknown_rate(tokenizer, *unknown_tokens.count_unknown(
      tokenizer, feats["input_ids"]), f"{_source_file(examples)} examples")
  feats["label"] = np.asarray([e.label if e.label is not None else 0 for e in examples],
                              np.int32)
  feats["weight"] = np.ones(len(examples), np.float32)
  return feats


# ----------------------------------------------------------------------------- metric and files


def accuracy(predicted: np.ndarray, labels: np.ndarray) -> float:
  """The share of examples whose predicted ending is the right one; `predicted` is the ending
  indices (examples,) or per-ending scores (examples, endings), of which the highest counts."""
  predicted, labels = np.asarray(predicted), np.asarray(labels)
  if predicted.ndim == 2:
    predicted = predicted.argmax(axis=-1)
  if predicted.shape != labels.shape or labels.ndim != 1:
    raise ValueError(f"accuracy: predictions of shape {predicted.shape} for labels of shape "
                     f"{labels.shape}; expected one per example.")
  if not labels.size:
    raise ValueError("accuracy: no examples.")
  return float(np.mean(predicted == labels))


def _check_probabilities(examples: Sequence[ChoiceExample] | None, probabilities) -> np.ndarray:
  probabilities = np.asarray(probabilities)
  if not np.issubdtype(probabilities.dtype, np.floating):
    probabilities = probabilities.astype(np.float64)
  if probabilities.ndim != 2:
    raise ValueError(f"probabilities of shape {probabilities.shape}; expected (examples, "
                     "endings).")
  if examples is not None:
    expected = (len(examples), len(examples[0].endings) if examples else 0)
    if probabilities.shape != expected:
      raise ValueError(f"probabilities of shape {probabilities.shape} for {expected[0]} "
                       f"examples of {expected[1]} endings; expected {expected}.")
  return probabilities


def _csv_text(rows: Sequence[Sequence[str]]) -> str:
  buffer = io.StringIO()
  csv.writer(buffer, lineterminator="\n").writerows(rows)
  return buffer.getvalue()


def write_predictions(path: str, examples: Sequence[ChoiceExample],
                      probabilities: np.ndarray) -> None:
  """`id,pred,prob0,...`: per example (in order) its id, the predicted ending and each ending's
  probability, each written in the fewest digits that read back as the same value."""
  probabilities = _check_probabilities(examples, probabilities)
  header = ["id", "pred"] + [f"prob{j}" for j in range(probabilities.shape[1])]
  rows = [header]
  for example, row in zip(examples, probabilities):
    rows.append([example.example_id, str(int(np.argmax(row)))] + [str(p) for p in row])
  file_io.write_text_atomic(path, _csv_text(rows))


def write_submission(path: str, task_name: str, probabilities: np.ndarray,
                     split: str = "test") -> None:
  """The leaderboard form of a split's predictions (rows in file order): SWAG's `,pred` (row
  index, predicted ending), HellaSwag's `annot_id,ending0,...` (`<split>-<row>`, probabilities)."""
  task = task_name.lower()
  probabilities = _check_probabilities(None, probabilities)
  if task == "swag":
    rows = [["", "pred"]] + [[str(i), str(int(np.argmax(row)))]
                             for i, row in enumerate(probabilities)]
  elif task == "hellaswag":
    split = "val" if _SPLIT_ALIASES.get(split, split) == "dev" else split
    rows = [["annot_id"] + [f"ending{j}" for j in range(probabilities.shape[1])]]
    rows += [[f"{split}-{i}"] + [str(p) for p in row] for i, row in enumerate(probabilities)]
  else:
    raise ValueError(f"task_name={task_name!r}: submissions are written for {', '.join(TASKS)}.")
  file_io.write_text_atomic(path, _csv_text(rows))
