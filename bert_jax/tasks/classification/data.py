"""The nine GLUE tasks and users' own TSV tasks: examples, metrics, and GLUE-server files.

Data comes from either of the two places people keep GLUE:
- the original TSV directory that `download_glue_data.py` writes (`CoLA/train.tsv`,
  `MNLI/dev_matched.tsv`, `diagnostic/diagnostic.tsv`, ...), local or on `gs://`, read with
  `csv.QUOTE_NONE` exactly as the original `run_classifier.py` does — GLUE text contains
  unbalanced quotes that a quoting reader would merge across lines;
- a prepared tensorflow-datasets directory (`glue/sst2`, ...), read without downloading.
Both give the same `Example`s: the label is the label *name* the TSV files use ("0"/"1",
"entailment", ...), whatever integer tfds stores, so a model trained from one source evaluates
on the other and prediction files are the same.

Column positions are taken from each file's own header line by name (the names the official
files use, and the ones tfds reads), and every row must have as many fields as that header: a
row with a missing or extra tab is an error naming the file and line, not a silently shifted
column. The one exception is QQP, whose original processors drop short rows; here those rows are
skipped too, but counted, logged with their line numbers, kept in `Task.skipped_lines`, and
refused outright if more than 1% of a file is malformed (then it is the wrong file, not a few
broken rows). `get_task(name, skip_malformed=True)` extends the same tolerance to any task.
A row whose text field is empty is malformed too: refused by file and line, or skipped likewise.

Users' own TSV files have no fixed header convention; `decide_header` is the one rule (used by
`CustomTsvTask` and by prediction's `read_text_tsv`) for whether a first line is a header, and
it logs what it decided and why.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import sys
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
from absl import logging

from bert_jax import file_io
from bert_jax.tasks.classification import metrics as classification
from bert_jax.text import characters

# More malformed rows than this share of a file means a wrong or corrupt file, never "a few rows".
MAX_SKIPPED_FRACTION = 0.01
# Python's csv module refuses fields over 128 KiB by default; a GLUE-style field can be a whole
# document. Memory bounds it, not an arbitrary limit.
_CSV_FIELD_LIMIT = min(sys.maxsize, 2**31 - 1)


@dataclasses.dataclass(frozen=True)
class Example:
  """One sentence or sentence pair.

  `guid` is "<split>-<index>" for train and eval splits (the file's index column where it has
  one, else the 0-based data row) and the bare index for prediction splits, since that is the
  value the GLUE server expects in the first column of a prediction file.
  """
  guid: str
  text_a: str
  text_b: str | None
  label: str | float | None  # a name from label_list; a float for regression; None if unlabelled


@dataclasses.dataclass(frozen=True)
class TsvLayout:
  """Where a kind of TSV file keeps its fields.

  `header`: "named" — the first line names the columns and the fields are column names (the
  official GLUE files); "skip" — a first line to ignore, fields are 0-based positions; "none" —
  no header, fields are positions (CoLA's train and dev files, users' headerless files); "auto"
  — positions, and `decide_header` tells from the first line whether it is a header. Every
  row must have as many fields as a header; without one, `num_columns`, or when that is None,
  as many as the first line. `label_optional` lets a file leave the label column out or empty.
  """
  header: str
  text_a: str | int
  text_b: str | int | None = None
  label: str | int | None = None
  index: str | int | None = None
  num_columns: int | None = None
  description: str = ""
  label_optional: bool = False


def _open_binary(path: str):
  if file_io.is_remote(path):
    return file_io.tensorflow().io.gfile.GFile(path, "rb")
  return open(path, "rb")  # pylint: disable=consider-using-with


def read_tsv_rows(path: str) -> Iterator[tuple[int, list[str]]]:
  """(line number, fields) for every non-blank line, split on tabs with no quoting at all.

  Lines are split on "\\n" only — GLUE sentences contain characters such as U+2028 and U+0085
  that `str.splitlines` would treat as line ends — and decoded one at a time so that an
  undecodable byte is reported with its line. A UTF-8 byte-order mark at the start (MRPC's
  train file has one) is dropped, and so is a "\\r" before the newline.
  """
  line_number = 0

  def lines(f) -> Iterator[str]:
    nonlocal line_number
    for line_number, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8").rstrip("\n")
      except UnicodeDecodeError as e:
        raise ValueError(f"{path}: line {line_number}: bytes are not valid UTF-8 ({e.reason} at "
                         f"byte {e.start} of the line).") from e
      if "\x00" in line:  # valid UTF-8, but no text has one: a damaged or binary file
        raise ValueError(f"{path}: line {line_number}: a NUL byte at character "
                         f"{line.index(chr(0)) + 1}; the file is damaged or not text.")
      yield line[1:] if line_number == 1 and line.startswith("\ufeff") else line

  if csv.field_size_limit() < _CSV_FIELD_LIMIT:
    csv.field_size_limit(_CSV_FIELD_LIMIT)
  with _open_binary(path) as f:
    # One reader for the whole file (a reader per line costs a third more on MNLI's 393k rows);
    # it pulls one line at a time, so `line_number` is the line each row came from.
    reader = csv.reader(lines(f), delimiter="\t", quoting=csv.QUOTE_NONE)
    while True:
      try:
        fields = next(reader)
      except StopIteration:
        return
      except csv.Error as e:
        reason = ("a carriage return (\\r) inside a field" if "new-line" in str(e) else str(e))
        raise ValueError(f"{path}: line {line_number}: {reason}.") from e
      if fields:  # blank lines (trailing ones, "\r" alone) give no fields
        yield line_number, fields


# Column names of the official GLUE files and the usual names in users' own files: a first line
# made only of these is a header even where no label column tells.
COLUMN_NAMES = frozenset({
    "index", "id", "idx", "guid", "qid", "pairid", "#1 id", "#2 id", "qid1", "qid2", "source",
    "sentence", "sentence1", "sentence2", "sentence_a", "sentence_b", "text", "text_a",
    "text_b", "texts", "question", "question1", "question2", "premise", "hypothesis",
    "#1 string", "#2 string", "passage", "context", "review", "document", "query", "title",
    "label", "labels", "gold_label", "score", "quality", "is_duplicate", "class", "target",
    "sentiment", "category", "prediction", "acceptability", "original mark"})


def parse_has_header(value: Any) -> str | bool:
  """`has_header` as given on a command line or in a config ("auto", true/false, yes/no, 1/0)."""
  if value is None:
    return "auto"
  if isinstance(value, bool):
    return value
  text = str(value).strip().lower()
  if text == "auto":
    return "auto"
  if text in ("true", "yes", "1"):
    return True
  if text in ("false", "no", "0"):
    return False
  raise ValueError(f"has_header={value!r}: use auto, true or false.")


def decide_header(path: str, first: Sequence[str], *, has_header: Any = "auto",
                  label_column: int | None = None, label_list: Sequence[str] | None = None,
                  regression: bool = False) -> bool:
  """Whether the first line (`first`: its fields) of the TSV file `path` is a header.

  The one rule for users' own TSV files, in fine-tuning and in prediction alike. `has_header`
  true or false decides outright; "auto" looks at the line. Where the file has a label column
  and the first line fills it, the line is a header exactly when that value is not a label (a
  label name, or a finite number for regression); otherwise when every field of it is a known
  column name (`COLUMN_NAMES`: "sentence", "text", "label", ...). The decision and its reason
  are logged, so a first line dropped or kept is never a surprise.
  """
  has_header = parse_has_header(has_header)
  name = os.path.basename(path)
  if has_header != "auto":
    logging.info("reading %s: first line %s (has_header=%s)", name,
                 "is a header" if has_header else "is data", has_header)
    return has_header
  value = (first[label_column].strip() if label_column is not None and
           label_column < len(first) else "")
  if value:
    if regression:
      try:
        is_label = math.isfinite(float(value))
      except ValueError:
        is_label = False
      kind = "a score"
    else:
      is_label = value in (label_list or ())
      kind = "a label"
    is_header = not is_label
    reason = (f"its label column {label_column} holds {value!r}, "
              f"{'' if is_label else 'not '}{kind}")
  else:
    fields = [f.strip().lower() for f in first if f.strip()]
    is_header = bool(fields) and all(f in COLUMN_NAMES for f in fields)
    reason = (f"its fields {[f.strip() for f in first]} are "
              f"{'' if is_header else 'not '}column names")
  logging.info("reading %s: first line is %s (%s; pass has_header=true or false to decide "
               "otherwise)", name, "a header" if is_header else "data", reason)
  return is_header


def read_text_tsv(path: str, has_header: Any = "auto", pairs: bool | None = None,
                  labels: Sequence[str] | None = None, regression: bool = False
                  ) -> list[tuple[str, str | None]]:
  """`(text, text_b or None)` per line of a file of `text` or `text<TAB>text_b` lines (blank
  lines, and lines of spaces, skipped), for prediction; whether the first line is a header is
  `decide_header`'s decision, as in fine-tuning.

  What the model reads (`pairs`: sentence pairs or single sentences; None: not known) and its
  outputs (`labels`, or `regression`) tell a file in the training layout: a last column of
  labels (text<TAB>label) is left out of the input, said once, instead of being read as a
  second sentence; pairs given to a single-sentence model are read as pairs, said once."""
  width = None if pairs is None else (2 if pairs else 1)

  def is_label(value: str) -> bool:
    value = value.strip()
    if regression:
      try:
        return math.isfinite(float(value))
      except ValueError:
        return False
    return bool(labels) and value in labels

  inputs: list[tuple[str, str | None]] = []
  first, label_lines, pair_lines = True, 0, []
  for line_number, fields in read_tsv_rows(path):
    if not any(field.strip() for field in fields):
      continue  # a line of spaces is a blank line
    if first:
      first = False
      if decide_header(path, fields, has_header=has_header):
        continue
    if len(fields) == (width or 2) + 1 and is_label(fields[-1]):
      fields, label_lines = fields[:-1], label_lines + 1
    if width == 1 and len(fields) == 2:
      pair_lines.append(line_number)
    if len(fields) > 2:
      raise ValueError(f"{path}: line {line_number}: {len(fields)} tab-separated fields; "
                       "expected text or text<TAB>text_b.")
    if not characters.has_text(fields[0]) or (len(fields) == 2 and
                                                not characters.has_text(fields[1])):
      raise ValueError(f"{path}: line {line_number}: an empty text field; every input needs "
                       "its text.")
    inputs.append((fields[0], fields[1] if len(fields) == 2 else None))
  if not inputs:
    raise ValueError(f"{path}: no input lines.")
  if label_lines:
    logging.warning("reading %s: the last column of %d lines holds %s, as in training files: "
                    "left out of the input.", os.path.basename(path), label_lines,
                    "scores" if regression else "labels")
  if pair_lines:
    logging.warning("reading %s: %d lines hold two texts (e.g. line %d), read as a pair, but the "
                    "model was fine-tuned on single sentences.", os.path.basename(path),
                    len(pair_lines), pair_lines[0])
  return inputs


def _parent_dir(path: str) -> str:
  if file_io.is_remote(path):
    return path.rstrip("/").rsplit("/", 1)[0]
  return os.path.dirname(os.path.normpath(path))


class Task:
  """A sentence(-pair) classification or regression task: its files, labels, metrics and outputs.

  The training entry point needs nothing task-specific beyond this object: `read_tsv` /
  `read_tfds` for examples, `label_list` (or `is_regression`) for the head, `compute_metrics`
  for each of `eval_splits`, and `write_predictions` for each of `predict_splits`.
  """

  def __init__(self, *, name: str, label_list: Sequence[str] | None, metrics: Sequence[str],
               main_metric: str, eval_splits: Sequence[str], predict_splits: Mapping[str, str],
               files: Mapping[str, str | Sequence[str]], labelled_layout: TsvLayout,
               unlabelled_layout: TsvLayout, skip_malformed: bool = False,
               positive_label: str | None = None, tfds_config: str | None = None,
               tfds_splits: Mapping[str, tuple[str, str]] | None = None,
               tfds_text_features: tuple[str, str | None] | None = None,
               tfds_label_names: Sequence[str] | None = None):
    self.name = name
    self.label_list = list(label_list) if label_list is not None else None
    self.is_regression = label_list is None
    self.metrics = tuple(metrics)
    self._main_metric = main_metric
    self.eval_splits = list(eval_splits)
    self.predict_splits = dict(predict_splits)
    self.files = dict(files)
    self.labelled_layout = labelled_layout
    self.unlabelled_layout = unlabelled_layout
    self.skip_malformed = skip_malformed
    self.positive_label = positive_label
    self.tfds_config = tfds_config
    self.tfds_splits = dict(tfds_splits or {})
    self.tfds_text_features = tfds_text_features
    self.tfds_label_names = list(tfds_label_names) if tfds_label_names is not None else None
    # split -> line numbers of the malformed rows the last read of that split skipped.
    self.skipped_lines: dict[str, list[int]] = {}
    if not self.is_regression and len(set(self.label_list)) != len(self.label_list):
      raise ValueError(f"{name}: label_list has duplicates: {self.label_list}.")
    if main_metric not in self._metric_names():
      raise ValueError(f"{name}: main metric {main_metric!r} is not among {self._metric_names()}.")

  def __repr__(self) -> str:
    kind = "regression" if self.is_regression else f"labels={self.label_list}"
    return f"{type(self).__name__}({self.name!r}, {kind})"

  # -- labels --------------------------------------------------------------------------------------

  @property
  def num_labels(self) -> int:
    """Outputs of the head: 1 for regression."""
    return 1 if self.is_regression else len(self.label_list)

  @property
  def main_metric(self) -> str:
    """The number a paper's GLUE table reports for this task; model selection uses it."""
    return self._main_metric

  @property
  def splits(self) -> list[str]:
    return ["train", *self.eval_splits, *self.predict_splits]

  def label_id(self, label: str | float) -> int | float:
    """An example's label as the head's target: the label's index, or the float for regression."""
    if self.is_regression:
      return float(label)
    try:
      return self.label_list.index(label)
    except ValueError:
      raise ValueError(f"{self.name}: unknown label {label!r}; the labels are "
                       f"{self.label_list}.") from None

  def label_ids(self, examples: Sequence[Example]) -> np.ndarray:
    """Targets for labelled examples: int32 indices, or float32 for regression."""
    missing = [e.guid for e in examples if e.label is None]
    if missing:
      raise ValueError(f"{self.name}: {len(missing)} examples have no label (first: "
                       f"{missing[0]}); prediction splits cannot be scored.")
    dtype = np.float32 if self.is_regression else np.int32
    return np.asarray([self.label_id(e.label) for e in examples], dtype)

  # -- TSV -----------------------------------------------------------------------------------------

  def _check_split(self, split: str) -> None:
    if split not in self.splits:
      raise ValueError(f"{self.name} has no split {split!r}; its splits are {self.splits}.")

  def tsv_path(self, data_dir: str, split: str) -> str:
    """The split's file under `data_dir`; where several places are usual, the first that exists."""
    self._check_split(split)
    candidates = self.files.get(split, f"{split}.tsv")
    if isinstance(candidates, str):
      return file_io.join(data_dir, candidates)
    paths = []
    for candidate in candidates:
      base = data_dir
      while candidate.startswith("../"):
        base, candidate = _parent_dir(base), candidate[3:]
      paths.append(file_io.join(base, candidate))
    for path in paths:
      if file_io.exists(path):
        return path
    raise FileNotFoundError(f"{self.name} {split!r}: none of these files exists: "
                            f"{', '.join(paths)}.")

  def read_tsv(self, data_dir: str, split: str) -> list[Example]:
    """The split's examples from the original GLUE directory layout (local or gs://)."""
    path = self.tsv_path(data_dir, split)
    if not file_io.exists(path):
      raise FileNotFoundError(f"{self.name} {split!r}: {path} does not exist (the GLUE layout "
                              f"keeps this split in {os.path.basename(path)}).")
    unlabelled = split in self.predict_splits
    layout = self.unlabelled_layout if unlabelled else self.labelled_layout
    examples, skipped = [], []
    columns = None  # role ("text_a", "label", ...) -> position in a row, from the first line
    expected = None  # the number of fields every row must have
    described = ""  # what those fields are, for error messages
    data_row = 0
    for line_number, fields in read_tsv_rows(path):
      if columns is None:
        columns, expected, described = self._columns(layout, fields, path, line_number)
        header = layout.header
        if header == "auto":
          label = columns.get("label", layout.label if isinstance(layout.label, int) else None)
          header = "skip" if decide_header(
              path, fields, has_header="auto", label_column=label, label_list=self.label_list,
              regression=self.is_regression) else "none"
        if header != "none":
          continue
      if len(fields) != expected:
        message = (f"{path}: line {line_number}: expected {expected} tab-separated fields "
                   f"({described}), found {len(fields)}.")
        if self.skip_malformed:
          skipped.append(line_number)
          continue
        raise ValueError(message)
      empty = [role for role in ("text_a", "text_b")
               if role in columns and not characters.has_text(fields[columns[role]])]
      if empty:
        message = (f"{path}: line {line_number}: the {self._field_name(layout, empty[0])} field "
                   "is empty; every example needs its text.")
        if self.skip_malformed:
          skipped.append(line_number)
          continue
        raise ValueError(message)
      index = fields[columns["index"]] if "index" in columns else str(data_row)
      label = None
      if "label" in columns:
        label = self._parse_label(fields[columns["label"]], path, line_number,
                                  optional=layout.label_optional or unlabelled)
      examples.append(Example(
          guid=index if unlabelled else f"{split}-{index}",
          text_a=fields[columns["text_a"]],
          text_b=fields[columns["text_b"]] if "text_b" in columns else None,
          label=label))
      data_row += 1
    self._report_skipped(path, split, skipped, len(examples))
    if not examples:
      raise ValueError(f"{path}: no examples (an empty file, or only a header).")
    return examples

  @staticmethod
  def _field_name(layout: TsvLayout, role: str) -> str:
    where = getattr(layout, role)
    return repr(where) if isinstance(where, str) else f"{role} (column {where}, 0-based)"

  def _columns(self, layout: TsvLayout, first: list[str], path: str,
               line_number: int) -> tuple[dict[str, int], int, str]:
    """Positions of the fields the layout needs, the field count every row must have, and a
    description of the layout for error messages."""
    wanted = {role: getattr(layout, role) for role in ("text_a", "text_b", "label", "index")
              if getattr(layout, role) is not None}
    if layout.header == "named":
      names = [name.strip() for name in first]
      missing = [name for name in wanted.values() if name not in names]
      if missing:
        raise ValueError(
            f"{path}: line {line_number}: the header has no column {missing[0]!r}; the "
            f"{self.name} layout reads {list(wanted.values())} from it, and it is "
            f"{names}.")
      described = f"the {self.name} header on line {line_number}: {', '.join(names)}"
      return {role: names.index(name) for role, name in wanted.items()}, len(first), described
    expected = layout.num_columns or len(first)
    described = layout.description or ", ".join(
        f"{role} in column {position}" for role, position in wanted.items())
    columns = {}
    for role, position in wanted.items():
      if position < expected:
        columns[role] = position
      elif not (role == "label" and layout.label_optional):
        raise ValueError(f"{path}: line {line_number}: {expected} fields, but the {role} is "
                         f"read from column {position} (0-based; {described}).")
    return columns, expected, described

  def _parse_label(self, raw: str, path: str, line_number: int,
                   optional: bool) -> str | float | None:
    raw = raw.strip()
    if optional and not raw:
      return None
    if self.is_regression:
      try:
        value = float(raw)
      except ValueError:
        value = float("nan")
      if not math.isfinite(value):
        raise ValueError(f"{path}: line {line_number}: the {self.name} score {raw!r} is not a "
                         f"finite number.")
      return value
    if raw not in self.label_list:
      raise ValueError(f"{path}: line {line_number}: unknown label {raw!r}; the {self.name} "
                       f"labels are {self.label_list}.")
    return raw

  def _report_skipped(self, path: str, split: str, skipped: list[int], kept: int) -> None:
    self.skipped_lines[split] = skipped
    if not skipped:
      return
    total = kept + len(skipped)
    shown = ", ".join(map(str, skipped[:10])) + (", ..." if len(skipped) > 10 else "")
    if len(skipped) > MAX_SKIPPED_FRACTION * total:
      raise ValueError(f"{path}: {len(skipped)} of {total} rows have the wrong number of fields "
                       f"or an empty text (lines {shown}): more than "
                       f"{MAX_SKIPPED_FRACTION:.0%}, so this is not the {self.name} layout.")
    logging.warning("%s: skipped %d of %d rows with the wrong number of fields or an empty "
                    "text (lines %s), as the original %s processor skips short rows.", path,
                    len(skipped), total, shown, self.name)

  # -- tfds ----------------------------------------------------------------------------------------

  def read_tfds(self, data_dir: str | None, split: str) -> list[Example]:
    """The split's examples from a prepared tensorflow-datasets directory; never downloads.

    Accepts this task's split names ("dev", "test_matched", "diagnostic") and tfds's own
    ("validation", ...). Examples come in the order of tfds's `idx` (the row in the original
    file), not tfds's shuffled storage order, so prediction files list indices in order.
    """
    if self.tfds_config is None:
      raise ValueError(f"{self.name} has no tensorflow-datasets counterpart; use read_tsv.")
    if split not in self.splits:
      split = {theirs: ours for ours, (config, theirs) in self.tfds_splits.items()
               if config == self.tfds_config}.get(split, split)
    self._check_split(split)
    config, tfds_split = self.tfds_splits.get(split, (self.tfds_config, split))
    tfds = file_io.tensorflow_datasets()
    name = f"glue/{config}"
    try:
      dataset = tfds.load(name, split=tfds_split, data_dir=data_dir, download=False,
                          shuffle_files=False)
    except AssertionError as e:  # tfds's way of saying "not prepared here"
      raise FileNotFoundError(
          f"{name} is not prepared under {data_dir or 'the default tfds data_dir'} ({e}). "
          f"Prepare it once on a machine with internet access: `tfds build {name} "
          f"--data_dir=DIR`, then pass that directory.") from e
    records = sorted(tfds.as_numpy(dataset), key=lambda record: int(record["idx"]))
    unlabelled = split in self.predict_splits
    a_key, b_key = self.tfds_text_features
    examples = []
    for record in records:
      index = str(int(record["idx"]))
      examples.append(Example(
          guid=index if unlabelled else f"{split}-{index}",
          text_a=_text(record[a_key]),
          text_b=_text(record[b_key]) if b_key else None,
          label=self._tfds_label(record["label"], name, split, index)))
    return examples

  def _tfds_label(self, value, name: str, split: str, index: str) -> str | float | None:
    if self.is_regression:
      # tfds stores the score as float32; its shortest repr is the TSV's "3.8", not 3.7999999.
      return float(str(np.float32(value)))
    value = int(value)
    if value == -1:  # tfds's label for unlabelled (test) rows
      return None
    if not 0 <= value < len(self.tfds_label_names):
      raise ValueError(f"{name} {split} idx {index}: label {value} is outside "
                       f"0..{len(self.tfds_label_names) - 1}.")
    return self.tfds_label_names[value]

  # -- metrics -------------------------------------------------------------------------------------

  def _metric_names(self) -> list[str]:
    names = list(self.metrics)
    if "accuracy" in names and "f1" in names:
      names.append("accuracy_and_f1")
    if "pearson" in names and "spearmanr" in names:
      names.append("pearson_and_spearmanr")
    return names

  def compute_metrics(self, predictions, labels) -> dict[str, float]:
    """The task's official metrics from predicted and true label indices (floats if regression).

    MRPC and QQP report F1 of the "1" class and accuracy, STS-B Pearson and Spearman, each pair
    with its mean (the single number the GLUE leaderboard averages). For MNLI call once per
    eval split and prefix the names with the split.
    """
    predictions = self._as_targets(predictions, "predictions")
    labels = self._as_targets(labels, "labels")
    if predictions.shape != labels.shape:
      raise ValueError(f"{self.name}: {len(predictions)} predictions for {len(labels)} labels.")
    if not len(labels):
      raise ValueError(f"{self.name}: no examples to score.")
    positive = self.label_list.index(self.positive_label) if self.positive_label else 1
    functions = {
        "accuracy": classification.accuracy,
        "f1": lambda p, l: classification.f1(p, l, positive=positive),
        "matthews_corr": classification.matthews_corrcoef,
        "pearson": classification.pearson,
        "spearmanr": classification.spearman,
    }
    results = {name: functions[name](predictions, labels) for name in self.metrics}
    if "accuracy_and_f1" in self._metric_names():
      results["accuracy_and_f1"] = (results["accuracy"] + results["f1"]) / 2
    if "pearson_and_spearmanr" in self._metric_names():
      results["pearson_and_spearmanr"] = (results["pearson"] + results["spearmanr"]) / 2
    return results

  def _as_targets(self, values, what: str) -> np.ndarray:
    """Checks values are what the head emits: 1-D label indices in range, or floats."""
    values = np.asarray(values)
    if self.is_regression and values.ndim == 2 and values.shape[1] == 1:
      values = values[:, 0]  # the regression head's (batch, 1) output
    if values.ndim != 1:
      hint = " (take the argmax of the logits first)" if values.ndim == 2 else ""
      raise ValueError(f"{self.name}: {what} must be 1-D; got shape {values.shape}{hint}.")
    if self.is_regression:
      return values.astype(np.float64)
    if values.dtype.kind not in "iub":
      if values.dtype.kind != "f" or not np.all(np.mod(values, 1) == 0):
        raise ValueError(f"{self.name}: {what} must be label indices; got dtype {values.dtype}.")
      values = values.astype(np.int64)
    if len(values) and (values.min() < 0 or values.max() >= len(self.label_list)):
      raise ValueError(f"{self.name}: {what} hold indices outside 0..{len(self.label_list) - 1}.")
    return values.astype(np.int64)

  # -- prediction files ----------------------------------------------------------------------------

  def prediction_path(self, output_dir: str, split: str) -> str:
    """Where `split`'s predictions go: the file name the GLUE server expects for it."""
    if split not in self.predict_splits:
      raise ValueError(f"{self.name}: {split!r} is not a prediction split; those are "
                       f"{list(self.predict_splits)}.")
    return file_io.join(output_dir, self.predict_splits[split])

  def write_predictions(self, path: str, predictions,
                        indices: Sequence[str | int] | None = None) -> None:
    """A GLUE-server file: "index<TAB>prediction", then one row per example, label names.

    `indices` are the first column, normally the prediction examples' guids (their index
    column); by default 0, 1, 2, ..., which is what every official test file uses. Regression
    scores are written with three decimals. The file appears whole or not at all.
    """
    predictions = self._as_targets(predictions, "predictions")
    if indices is None:
      indices = range(len(predictions))
    indices = [str(index) for index in indices]
    if len(indices) != len(predictions):
      raise ValueError(f"{self.name}: {len(predictions)} predictions for {len(indices)} indices.")
    if self.is_regression:
      if not np.all(np.isfinite(predictions)):
        raise ValueError(f"{self.name}: predictions hold NaN or inf; the server rejects them.")
      values = [f"{value:.3f}" for value in predictions]
    else:
      values = [self.label_list[value] for value in predictions]
    lines = ["index\tprediction"] + [f"{i}\t{v}" for i, v in zip(indices, values)]
    file_io.write_text_atomic(path, "\n".join(lines) + "\n")


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)




# -- the nine GLUE tasks ---------------------------------------------------------------------------

_BINARY = ["0", "1"]
_NLI = ["contradiction", "entailment", "neutral"]  # the original run_classifier.py order
_RTE = ["entailment", "not_entailment"]
_TFDS_SPLIT_NAMES = {"train": "train", "dev": "validation", "test": "test"}


def _pair_layouts(text_a: str, text_b: str, label: str, index: str | None,
                  test_index: str = "index") -> dict[str, TsvLayout]:
  return dict(labelled_layout=TsvLayout("named", text_a, text_b, label, index),
              unlabelled_layout=TsvLayout("named", text_a, text_b, None, test_index))


_GLUE: dict[str, dict[str, Any]] = {
    # CoLA train/dev: no header; source, label, the original author's "*" mark, sentence.
    "cola": dict(
        server_file="CoLA.tsv", label_list=_BINARY, metrics=("matthews_corr", "accuracy"),
        main_metric="matthews_corr", tfds_text_features=("sentence", None),
        tfds_label_names=_BINARY,
        labelled_layout=TsvLayout("none", text_a=3, label=1, num_columns=4,
                                  description="CoLA: source, label, original mark, sentence"),
        unlabelled_layout=TsvLayout("named", text_a="sentence", index="index")),
    "sst2": dict(
        server_file="SST-2.tsv", label_list=_BINARY, metrics=("accuracy",),
        main_metric="accuracy", tfds_text_features=("sentence", None), tfds_label_names=_BINARY,
        labelled_layout=TsvLayout("named", text_a="sentence", label="label"),
        unlabelled_layout=TsvLayout("named", text_a="sentence", index="index")),
    "mrpc": dict(
        server_file="MRPC.tsv", label_list=_BINARY, metrics=("accuracy", "f1"), main_metric="f1",
        tfds_text_features=("sentence1", "sentence2"), tfds_label_names=_BINARY,
        **_pair_layouts("#1 String", "#2 String", "Quality", index=None)),
    "stsb": dict(
        server_file="STS-B.tsv", label_list=None, metrics=("pearson", "spearmanr"),
        main_metric="spearmanr", tfds_text_features=("sentence1", "sentence2"),
        **_pair_layouts("sentence1", "sentence2", "score", index="index")),
    "qqp": dict(
        server_file="QQP.tsv", label_list=_BINARY, metrics=("accuracy", "f1"), main_metric="f1",
        skip_malformed=True, tfds_text_features=("question1", "question2"),
        tfds_label_names=_BINARY,
        **_pair_layouts("question1", "question2", "is_duplicate", index="id", test_index="id")),
    "mnli": dict(
        label_list=_NLI, metrics=("accuracy",), main_metric="accuracy",
        eval_splits=["dev_matched", "dev_mismatched"],
        predict_splits={"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv",
                        "diagnostic": "AX.tsv"},
        files={"diagnostic": ("diagnostic.tsv", "diagnostic/diagnostic.tsv", "AX.tsv",
                              "../diagnostic/diagnostic.tsv")},
        tfds_splits={"dev_matched": ("mnli", "validation_matched"),
                     "dev_mismatched": ("mnli", "validation_mismatched"),
                     "test_matched": ("mnli", "test_matched"),
                     "test_mismatched": ("mnli", "test_mismatched"),
                     "diagnostic": ("ax", "test")},
        tfds_text_features=("premise", "hypothesis"),
        tfds_label_names=["entailment", "neutral", "contradiction"],
        **_pair_layouts("sentence1", "sentence2", "gold_label", index="index")),
    "qnli": dict(
        server_file="QNLI.tsv", label_list=_RTE, metrics=("accuracy",), main_metric="accuracy",
        tfds_text_features=("question", "sentence"), tfds_label_names=_RTE,
        **_pair_layouts("question", "sentence", "label", index="index")),
    "rte": dict(
        server_file="RTE.tsv", label_list=_RTE, metrics=("accuracy",), main_metric="accuracy",
        tfds_text_features=("sentence1", "sentence2"), tfds_label_names=_RTE,
        **_pair_layouts("sentence1", "sentence2", "label", index="index")),
    # tfds names WNLI's classes (not_entailment, entailment); the files and the server say 0/1.
    "wnli": dict(
        server_file="WNLI.tsv", label_list=_BINARY, metrics=("accuracy",), main_metric="accuracy",
        tfds_text_features=("sentence1", "sentence2"), tfds_label_names=_BINARY,
        **_pair_layouts("sentence1", "sentence2", "label", index="index")),
}

GLUE_TASKS = tuple(_GLUE)

_ALIASES = {"mnlim": "mnli", "mnlimm": "mnli", "mnlimatched": "mnli", "mnlimismatched": "mnli"}


def _glue_task(name: str, **overrides) -> Task:
  spec = dict(_GLUE[name])
  server_file = spec.pop("server_file", None)
  spec.setdefault("eval_splits", ["dev"])
  spec.setdefault("predict_splits", {"test": server_file})
  spec.setdefault("files", {})
  spec.setdefault("tfds_splits", {split: (name, tfds_split)
                                  for split, tfds_split in _TFDS_SPLIT_NAMES.items()})
  spec.update(overrides)
  return Task(name=name, tfds_config=name, **spec)


class CustomTsvTask(Task):
  """A user's own single-sentence or sentence-pair task in `{train,dev,test}.tsv` files.

  Columns are 0-based positions; every row of a file must have as many fields as its first
  line. Whether that first line is a header is `decide_header`'s rule (`has_header`: "auto",
  the default, or true/false), the one prediction uses too. The test file may leave the label
  column out or empty (then examples are unlabelled) or fill it in. With two labels, F1 (of `label_list[1]`) and Matthews correlation are reported
  besides accuracy; a regression task reports Pearson and Spearman.
  """

  def __init__(self, label_list: Sequence[str] | None = None, *, regression: bool = False,
               text_a_column: int = 0, text_b_column: int | None = None,
               label_column: int = 1, index_column: int | None = None,
               has_header: bool | str = "auto", skip_header: bool | None = None,
               name: str = "custom", main_metric: str | None = None,
               skip_malformed: bool = False):
    # `skip_header` is the older spelling of has_header=true/false.
    has_header = parse_has_header(has_header if skip_header is None else skip_header)
    label_list = list(label_list) if label_list else None  # an empty list flag means "none"
    if regression == (label_list is not None):
      raise ValueError("give either label_list (classification) or regression=True.")
    if label_list is not None and len(label_list) < 2:
      raise ValueError(f"a classification task needs at least two labels; got {label_list}.")
    columns = [text_a_column, text_b_column, label_column, index_column]
    if any(column is not None and column < 0 for column in columns):
      raise ValueError(f"column indices are 0-based and non-negative; got {columns}.")
    used = [column for column in columns if column is not None]
    if len(set(used)) != len(used):
      raise ValueError(f"text, label and index columns must differ; got {columns}.")
    if regression:
      metrics = ("pearson", "spearmanr")
    elif len(label_list) == 2:
      metrics = ("accuracy", "f1", "matthews_corr")
    else:
      metrics = ("accuracy",)
    self.has_header = has_header
    header = "auto" if has_header == "auto" else ("skip" if has_header else "none")
    layout = dict(header=header, text_a=text_a_column,
                  text_b=text_b_column, label=label_column, index=index_column)
    super().__init__(
        name=name, label_list=label_list, metrics=metrics,
        main_metric=main_metric or ("pearson" if regression else "accuracy"),
        eval_splits=["dev"], predict_splits={"test": f"{name}.tsv"}, files={},
        labelled_layout=TsvLayout(**layout),
        unlabelled_layout=TsvLayout(**layout, label_optional=True),
        skip_malformed=skip_malformed)


def get_task(name: str, **kwargs) -> Task:
  """A task by any usual spelling ("SST-2", "sst2", "STS-B", "MNLI", "mnli-mm"); "custom" takes
  CustomTsvTask's arguments. Keyword arguments override a GLUE task's settings
  (`skip_malformed=True`, say)."""
  key = "".join(ch for ch in name.lower() if ch.isalnum())
  key = _ALIASES.get(key, key)
  if key == "custom":
    return CustomTsvTask(**kwargs)
  if key not in _GLUE:
    raise ValueError(f"unknown task {name!r}; the GLUE tasks are {', '.join(GLUE_TASKS)}, and "
                     f"'custom' reads your own TSV files.")
  return _glue_task(key, **kwargs)
