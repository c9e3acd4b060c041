"""GLUE readers on files in the official layouts, the metrics against scikit-learn and scipy, the
tfds path on mocked data, GLUE-server prediction files, bad input, and users' own TSV tasks."""

import logging
import os
import warnings

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics

from bert_jax.tasks.classification import metrics as classification
from bert_jax.tasks.classification import data as glue
from bert_jax.tasks.classification.data import Example


def write(path, lines, newline="\n", bom=False):
  """Writes rows (lists of fields, or raw strings) as a TSV file, creating directories."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  text = newline.join(l if isinstance(l, str) else "\t".join(l) for l in lines) + newline
  with open(path, "wb") as f:
    f.write((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
  return path


# -- the official layouts, one task at a time ------------------------------------------------------

def test_cola_train_has_no_header_and_test_has_one(tmp_path):
  d = str(tmp_path)
  first = "Our friends won't buy this analysis, let alone the next one we propose."
  write(f"{d}/train.tsv", [["gj04", "1", "", first],
                           ["gj04", "0", "*", "They drank the pub."],
                           ["cj99", "1", "", 'The "more" you eat, the fatter you get.']])
  write(f"{d}/dev.tsv", [["gj04", "0", "*", "The sailors rode the breeze clear of the rocks."]])
  write(f"{d}/test.tsv", [["index", "sentence"], ["0", "Bill whistled past the house."],
                          ["1", "The car honked its way down the road."]])
  task = glue.get_task("CoLA")
  assert task.read_tsv(d, "train") == [
      Example("train-0", first, None, "1"),
      Example("train-1", "They drank the pub.", None, "0"),
      Example("train-2", 'The "more" you eat, the fatter you get.', None, "1")]
  assert task.read_tsv(d, "dev") == [
      Example("dev-0", "The sailors rode the breeze clear of the rocks.", None, "0")]
  assert task.read_tsv(d, "test") == [Example("0", "Bill whistled past the house.", None, None),
                                      Example("1", "The car honked its way down the road.", None,
                                              None)]


def test_sst2_keeps_unbalanced_quotes_literally(tmp_path):
  d = str(tmp_path)
  # With a quoting reader, the lone " would swallow the following lines into one field.
  write(f"{d}/train.tsv", [["sentence", "label"],
                           ['it \'s a " charming and often affecting journey . ', "1"],
                           ["unflinchingly bleak and desperate ", "0"], ['"', "1"]])
  write(f"{d}/test.tsv", [["index", "sentence"], ["0", "uneasy mishmash of styles and genres ."],
                          ["1", 'this film \'s relationship to tension is the same as " what ?']])
  task = glue.get_task("SST-2")
  assert task.read_tsv(d, "train") == [
      Example("train-0", 'it \'s a " charming and often affecting journey . ', None, "1"),
      Example("train-1", "unflinchingly bleak and desperate ", None, "0"),
      Example("train-2", '"', None, "1")]
  test = task.read_tsv(d, "test")
  assert [e.guid for e in test] == ["0", "1"] and all(e.label is None for e in test)
  assert test[1].text_a.endswith('" what ?')


def test_mrpc_with_byte_order_mark_and_indexed_test_file(tmp_path):
  d = str(tmp_path)
  header = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
  amrozi = ('Amrozi accused his brother , whom he called " the witness " , of deliberately '
            'distorting his evidence .')
  referring = ('Referring to him as only " the witness " , Amrozi accused his brother of '
               'deliberately distorting his evidence .')
  pccw = ("PCCW 's chief operating officer , Mike Butcher , and Alex Arena , the chief financial "
          "officer , will report directly to Mr So .")
  current = ("Current Chief Operating Officer Mike Butcher and Group Chief Financial Officer Alex "
             "Arena will report to So .")
  write(f"{d}/train.tsv", [header, ["1", "702876", "702977", amrozi, referring],
                           ["0", "2108705", "2108831", "Yucaipa owned Dominick 's .",
                            "Yucaipa bought Dominick 's in 1995 ."]],
        bom=True)  # the real train file starts with a UTF-8 byte-order mark
  write(f"{d}/test.tsv", [["index", "#1 ID", "#2 ID", "#1 String", "#2 String"],
                          ["0", "1089874", "1089925", pccw, current]])
  task = glue.get_task("mrpc")
  train = task.read_tsv(d, "train")
  assert [(e.guid, e.label) for e in train] == [("train-0", "1"), ("train-1", "0")]
  assert (train[0].text_a, train[0].text_b) == (amrozi, referring)
  assert task.read_tsv(d, "test") == [Example("0", pccw, current, None)]


STSB_HEADER = ["index", "genre", "filename", "year", "old_index", "source1", "source2",
               "sentence1", "sentence2"]


def test_stsb_float_scores_in_the_last_of_ten_columns(tmp_path):
  d = str(tmp_path)
  write(f"{d}/dev.tsv", [STSB_HEADER + ["score"],
                         ["0", "main-captions", "MSRvid", "2012test", "0000", "none", "none",
                          "A man with a hard hat is dancing.",
                          "A man wearing a hard hat is dancing.", "5.000"],
                         ["1", "main-captions", "MSRvid", "2012test", "0002", "none", "none",
                          "A young child is riding a horse.", "A child is riding a horse.",
                          "4.750"],
                         ["2", "main-news", "headlines", "2015", "0001", "none", "none",
                          "Obama signs up for Obamacare", "Obama joins Obamacare", "0.5"]])
  write(f"{d}/test.tsv", [STSB_HEADER,
                          ["0", "main-captions", "MSRvid", "2012test", "0024", "none", "none",
                           "A girl is styling her hair.", "A girl is brushing her hair."]])
  task = glue.get_task("STS-B")
  assert task.is_regression and task.label_list is None and task.num_labels == 1
  dev = task.read_tsv(d, "dev")
  assert dev[0] == Example("dev-0", "A man with a hard hat is dancing.",
                           "A man wearing a hard hat is dancing.", 5.0)
  assert [e.label for e in dev] == [5.0, 4.75, 0.5]
  assert all(isinstance(e.label, float) for e in dev)
  np.testing.assert_array_equal(task.label_ids(dev), np.float32([5.0, 4.75, 0.5]))
  assert task.read_tsv(d, "test") == [Example("0", "A girl is styling her hair.",
                                               "A girl is brushing her hair.", None)]


QQP_HEADER = ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"]


def qqp_rows(n):
  return [[str(i), str(2 * i + 1), str(2 * i + 2), f"How do I learn topic {i}?",
           f"What is the best way to learn topic {i}?", str(i % 2)] for i in range(n)]


def test_qqp_counts_and_skips_rows_broken_by_a_stray_newline(tmp_path):
  d = str(tmp_path)
  rows = qqp_rows(300)
  # A question with a raw newline in it splits one record over two short lines (4 and 3 fields).
  broken = ["300\t601\t602\tWhy is the sky", "blue?\tWhy is the sky blue during the day?\t0"]
  write(f"{d}/train.tsv", [QQP_HEADER] + rows[:100] + broken + rows[100:])
  task = glue.get_task("QQP")
  train = task.read_tsv(d, "train")
  assert len(train) == 300 and task.skipped_lines["train"] == [102, 103]
  assert train[0] == Example("train-0", "How do I learn topic 0?",
                             "What is the best way to learn topic 0?", "0")
  assert train[100].guid == "train-100"
  # Too many broken rows means the file is not QQP at all.
  write(f"{d}/dev.tsv", [QQP_HEADER] + rows[:20] + broken)
  with pytest.raises(ValueError, match=r"dev\.tsv: 2 of 22 rows have the wrong number"):
    task.read_tsv(d, "dev")
  # The test file: id, question1, question2.
  write(f"{d}/test.tsv", [["id", "question1", "question2"],
                          ["0", "How does the Surface Pro himself 4 compare with iPad Pro?",
                           "Why did Microsoft choose core m3 and not core i3 home Surface Pro 4?"]])
  assert task.read_tsv(d, "test")[0].guid == "0" and task.read_tsv(d, "test")[0].label is None
  # Other tasks refuse a malformed row unless asked to skip it.
  strict = glue.get_task("qqp", skip_malformed=False)
  write(f"{d}/train.tsv", [QQP_HEADER] + rows[:100] + broken + rows[100:])
  with pytest.raises(ValueError, match=r"train\.tsv: line 102: expected 6 tab-separated fields"):
    strict.read_tsv(d, "train")


MNLI_PARSES = ["sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse",
               "sentence2_parse"]
MNLI_TRAIN_HEADER = ["index", "promptID", "pairID", "genre", *MNLI_PARSES, "sentence1",
                     "sentence2", "label1", "gold_label"]
MNLI_DEV_HEADER = ["index", "promptID", "pairID", "genre", *MNLI_PARSES, "sentence1", "sentence2",
                   "label1", "label2", "label3", "label4", "label5", "gold_label"]
MNLI_TEST_HEADER = ["index", "promptID", "pairID", "genre", *MNLI_PARSES, "sentence1",
                    "sentence2"]


def mnli_row(index, premise, hypothesis, labels=()):
  def binary(s):
    return "( " + " ( ".join(s.rstrip(".").split()) + " ) ." + " )" * (len(s.split()) - 1)
  parses = [binary(premise), binary(hypothesis), f"(ROOT (S {premise}))",
            f"(ROOT (S {hypothesis}))"]
  return [str(index), str(63735 + index), f"{63735 + index}n", "fiction", *parses, premise,
          hypothesis, *labels]


CREAM = "Conceptually cream skimming has two basic dimensions - product and geography."
HIERBAS = "Hierbas, ans seco, ans dulce, and frigola are just a few names worth keeping."


def write_mnli(glue_dir):
  d = os.path.join(glue_dir, "MNLI")
  write(f"{d}/train.tsv", [
      MNLI_TRAIN_HEADER,
      mnli_row(0, CREAM, "Product and geography are what make cream skimming work. ",
               ["neutral", "neutral"]),
      mnli_row(1, "you know during the season and i guess at at your level uh you lose them",
               "You lose the things to the following level if the people recall.",
               ["entailment", "entailment"])])
  write(f"{d}/dev_matched.tsv", [
      MNLI_DEV_HEADER,
      mnli_row(0, "The new rights are nice enough", "Everyone really likes the newest benefits ",
               ["neutral", "entailment", "neutral", "neutral", "neutral", "neutral"]),
      mnli_row(1, "This site includes a list of all award winners.",
               "The articles housed on the website are not able to be searched.",
               ["contradiction"] * 6)])
  write(f"{d}/dev_mismatched.tsv", [
      MNLI_DEV_HEADER,
      mnli_row(7, "Your contribution helped make it possible for us to provide an education.",
               "Your contributions were of no help with our students' education.",
               ["contradiction"] * 6)])
  write(f"{d}/test_matched.tsv", [
      MNLI_TEST_HEADER, mnli_row(0, HIERBAS, "Hierbas is a name worth looking out for.")])
  write(f"{d}/test_mismatched.tsv", [
      MNLI_TEST_HEADER,
      mnli_row(0, "What have you decided, what are you going to do?", "So what's your decision?"),
      mnli_row(1, "Sure, that's fine.", "That is okay.")])
  # download_glue_data.py puts the diagnostic set beside the task directories.
  write(f"{glue_dir}/diagnostic/diagnostic.tsv", [
      ["index", "sentence1", "sentence2"],
      ["0", "The cat sat on the mat.", "The cat did not sit on the mat."],
      ["1", "The cat did not sit on the mat.", "The cat sat on the mat."]])
  return d


def test_mnli_many_columns_both_dev_sets_both_test_sets_and_the_diagnostic(tmp_path):
  d = write_mnli(str(tmp_path))
  task = glue.get_task("MNLI")
  assert task.eval_splits == ["dev_matched", "dev_mismatched"]
  assert task.predict_splits == {"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv",
                                 "diagnostic": "AX.tsv"}
  train = task.read_tsv(d, "train")
  assert train[0] == Example("train-0", CREAM,
                             "Product and geography are what make cream skimming work. ", "neutral")
  assert [e.label for e in train] == ["neutral", "entailment"]
  # gold_label is the last of the five annotator labels' columns, not label1.
  assert [(e.guid, e.label) for e in task.read_tsv(d, "dev_matched")] == [
      ("dev_matched-0", "neutral"), ("dev_matched-1", "contradiction")]
  assert [(e.guid, e.label) for e in task.read_tsv(d, "dev_mismatched")] == [
      ("dev_mismatched-7", "contradiction")]
  assert task.read_tsv(d, "test_matched") == [
      Example("0", HIERBAS, "Hierbas is a name worth looking out for.", None)]
  assert [e.text_b for e in task.read_tsv(d, "test_mismatched")] == ["So what's your decision?",
                                                                      "That is okay."]
  assert task.read_tsv(d, "diagnostic") == [
      Example("0", "The cat sat on the mat.", "The cat did not sit on the mat.", None),
      Example("1", "The cat did not sit on the mat.", "The cat sat on the mat.", None)]
  # The diagnostic file may also sit inside the MNLI directory.
  os.rename(f"{tmp_path}/diagnostic/diagnostic.tsv", f"{d}/diagnostic.tsv")
  assert len(task.read_tsv(d, "diagnostic")) == 2
  os.remove(f"{d}/diagnostic.tsv")
  with pytest.raises(FileNotFoundError, match="diagnostic/diagnostic.tsv"):
    task.read_tsv(d, "diagnostic")
  with pytest.raises(ValueError, match="no split 'dev'"):
    task.read_tsv(d, "dev")


@pytest.mark.parametrize("name,header,labels", [
    ("qnli", ["index", "question", "sentence", "label"], ["entailment", "not_entailment"]),
    ("rte", ["index", "sentence1", "sentence2", "label"], ["not_entailment", "entailment"]),
    ("wnli", ["index", "sentence1", "sentence2", "label"], ["1", "0"]),
])
def test_indexed_pair_tasks(tmp_path, name, header, labels):
  d = str(tmp_path)
  write(f"{d}/train.tsv", [header,
                           ["0", "When did the third Digimon series begin?",
                            "Unlike the two seasons before it, Digimon Tamers takes a darker turn.",
                            labels[0]],
                           ["1", "Dana Reeve, the widow of the actor Christopher Reeve, has died.",
                            "Christopher Reeve had an accident.", labels[1]]])
  write(f"{d}/test.tsv", [header[:3],
                          ["0", "What organization is devoted to Jihad against Israel?",
                           "For some decades prior to the First Intifada, the Brotherhood was."]])
  task = glue.get_task(name)
  train = task.read_tsv(d, "train")
  assert [(e.guid, e.label) for e in train] == [("train-0", labels[0]), ("train-1", labels[1])]
  assert train[0].text_a == "When did the third Digimon series begin?"
  assert train[1].text_b == "Christopher Reeve had an accident."
  test = task.read_tsv(d, "test")
  assert test[0].guid == "0" and test[0].label is None
  assert test[0].text_b.startswith("For some decades")


def test_crlf_line_ends_trailing_blank_lines_and_unicode_line_separators(tmp_path):
  d = str(tmp_path)
  # U+2028 and U+0085 occur inside real GLUE sentences; they are not line ends in a TSV.
  write(f"{d}/train.tsv",
        [["sentence", "label"], ["one\u2028two", "1"], ["three\x85four", "0"], ""], newline="\r\n")
  task = glue.get_task("sst2")
  assert task.read_tsv(d, "train") == [Example("train-0", "one\u2028two", None, "1"),
                                       Example("train-1", "three\x85four", None, "0")]
  # A lone carriage return inside a field is no GLUE text: it is reported, not split on.
  path = write(f"{d}/dev.tsv", [["sentence", "label"], ["fine", "1"], ["half\rline", "0"]])
  with pytest.raises(ValueError, match=rf"{path}: line 3: a carriage return"):
    task.read_tsv(d, "dev")


def test_reads_through_tf_io_gfile_for_remote_paths():
  """A `ram://` path goes the way a `gs://` path does: through tf.io.gfile."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  directory = "ram://glue_test/SST-2"
  tf.io.gfile.makedirs(directory)
  with tf.io.gfile.GFile(f"{directory}/dev.tsv", "wb") as f:
    f.write("sentence\tlabel\na gorgeous , witty , seductive movie . \t1\n".encode())
  task = glue.get_task("sst2")
  assert task.read_tsv(directory, "dev") == [
      Example("dev-0", "a gorgeous , witty , seductive movie . ", None, "1")]
  task.write_predictions(f"{directory}/out/SST-2.tsv", [1, 0])
  with tf.io.gfile.GFile(f"{directory}/out/SST-2.tsv") as f:
    assert f.read() == "index\tprediction\n0\t1\n1\t0\n"


# -- bad input: file and line ----------------------------------------------------------------------

def test_malformed_line_names_file_line_and_the_expected_layout(tmp_path):
  d = str(tmp_path)
  path = write(f"{d}/dev.tsv", [["index", "sentence1", "sentence2", "label"],
                                ["0", "A", "B", "entailment"],
                                ["1", "A", "B extra", "x", "entailment"]])
  with pytest.raises(ValueError) as e:
    glue.get_task("rte").read_tsv(d, "dev")
  message = str(e.value)
  assert f"{path}: line 3:" in message and "expected 4 tab-separated fields" in message
  assert "index, sentence1, sentence2, label" in message and "found 5" in message
  path = write(f"{d}/train.tsv", [["gj04", "1", "", "Fine."], ["gj04", "1", "Missing a column."]])
  with pytest.raises(ValueError, match=rf"{path}: line 2: expected 4 .*CoLA: source, label"):
    glue.get_task("cola").read_tsv(d, "train")


def test_unknown_label_names_file_line_label_and_allowed_labels(tmp_path):
  d = str(tmp_path)
  path = write(f"{d}/train.tsv", [["index", "question", "sentence", "label"],
                                  ["0", "Q?", "S.", "entailment"],
                                  ["1", "Q?", "S.", "contradiction"]])
  with pytest.raises(ValueError) as e:
    glue.get_task("qnli").read_tsv(d, "train")
  assert str(e.value) == (f"{path}: line 3: unknown label 'contradiction'; the qnli labels are "
                          "['entailment', 'not_entailment'].")
  path = write(f"{d}/dev.tsv", [STSB_HEADER + ["score"],
                                ["0", "g", "f", "y", "o", "s", "s", "A.", "B.", "high"]])
  with pytest.raises(ValueError, match=rf"{path}: line 2: the stsb score 'high' is not a finite"):
    glue.get_task("stsb").read_tsv(d, "dev")


def test_undecodable_bytes_name_file_and_line(tmp_path):
  path = tmp_path / "train.tsv"
  path.write_bytes(b"sentence\tlabel\nfine\t1\ncaf\xe9 latin-1\t0\n")
  with pytest.raises(ValueError, match=rf"{path}: line 3: bytes are not valid UTF-8"):
    glue.get_task("sst2").read_tsv(str(tmp_path), "train")


def test_a_nul_byte_names_file_line_and_place(tmp_path):
  """Valid UTF-8 but no text holds one (a damaged copy, a binary file renamed): refused where it
  is, as the vocabulary reader refuses it, not read into a sentence."""
  path = tmp_path / "train.tsv"
  path.write_bytes(b"sentence\tlabel\nfine\t1\nbro\x00ken\t0\n")
  with pytest.raises(ValueError, match=rf"{path}: line 3: a NUL byte at character 4; the file "
                                       "is damaged or not text"):
    glue.get_task("sst2").read_tsv(str(tmp_path), "train")


def test_wrong_file_for_the_task_is_caught_at_the_header(tmp_path):
  d = str(tmp_path)
  path = write(f"{d}/train.tsv", [["sentence", "label"], ["an SST-2 file", "1"]])
  with pytest.raises(ValueError, match=rf"{path}: line 1: the header has no column 'question'"):
    glue.get_task("qnli").read_tsv(d, "train")


def test_missing_and_empty_files(tmp_path):
  d = str(tmp_path)
  with pytest.raises(FileNotFoundError, match="train.tsv"):
    glue.get_task("rte").read_tsv(d, "train")
  write(f"{d}/train.tsv", [["index", "sentence1", "sentence2", "label"]])
  with pytest.raises(ValueError, match="no examples"):
    glue.get_task("rte").read_tsv(d, "train")


# -- metrics against scikit-learn and scipy --------------------------------------------------------

def _random_cases():
  rng = np.random.default_rng(0)
  for n in (2, 3, 7, 50, 1001):
    for classes in (2, 3):
      labels = rng.integers(0, classes, n)
      noisy = np.where(rng.random(n) < 0.3, rng.integers(0, classes, n), labels)
      yield noisy, labels
      yield rng.integers(0, classes, n), labels


EDGE_CASES = [
    (np.zeros(10, int), np.zeros(10, int)),      # one class on both sides
    (np.ones(10, int), np.ones(10, int)),
    (np.zeros(10, int), np.r_[np.zeros(5, int), np.ones(5, int)]),  # a constant prediction
    (np.r_[np.zeros(5, int), np.ones(5, int)], np.ones(10, int)),   # constant labels
    (np.r_[0, 1, 0, 1], np.r_[1, 0, 1, 0]),      # all wrong
    (np.r_[0, 1, 1, 0], np.r_[0, 1, 1, 0]),      # all right
    (np.r_[1], np.r_[1]),
]


def test_accuracy_f1_and_matthews_match_sklearn():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # sklearn warns on the degenerate cases it scores 0
    for predictions, labels in [*_random_cases(), *EDGE_CASES]:
      assert classification.accuracy(predictions, labels) == pytest.approx(
          sklearn.metrics.accuracy_score(labels, predictions), abs=1e-12)
      assert classification.matthews_corrcoef(predictions, labels) == pytest.approx(
          sklearn.metrics.matthews_corrcoef(labels, predictions), abs=1e-12)
      if max(predictions.max(), labels.max()) <= 1:
        assert classification.f1(predictions, labels) == pytest.approx(
            sklearn.metrics.f1_score(labels, predictions), abs=1e-12)


def test_matthews_does_not_overflow_on_large_sets():
  rng = np.random.default_rng(1)
  labels = rng.integers(0, 2, 400_000)
  predictions = np.where(rng.random(400_000) < 0.2, 1 - labels, labels)
  assert classification.matthews_corrcoef(predictions, labels) == pytest.approx(
      sklearn.metrics.matthews_corrcoef(labels, predictions), abs=1e-12)


def _same(ours, theirs):
  if np.isnan(theirs):
    return np.isnan(ours)
  return ours == pytest.approx(theirs, abs=1e-10)


def test_pearson_and_spearman_match_scipy_with_ties_and_constants():
  rng = np.random.default_rng(2)
  cases = []
  for n in (2, 3, 10, 200):
    x = rng.normal(size=n)
    cases += [(x, 0.5 * x + rng.normal(size=n)), (x, -x), (x, x ** 3)]
    # STS-B gold scores repeat a lot (0.0, 0.2, ..., 5.0): heavy ties on one or both sides.
    ties = np.round(rng.uniform(0, 5, n) * 5) / 5
    cases += [(rng.normal(size=n), ties), (np.round(ties), ties), (ties, ties)]
  cases += [(np.ones(5), np.arange(5.0)), (np.arange(5.0), np.full(5, 2.5)),
            (np.r_[1.0, np.nan, 3.0], np.r_[1.0, 2.0, 3.0])]
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # scipy warns on constant input and returns NaN
    for x, y in cases:
      assert _same(classification.pearson(x, y), scipy.stats.pearsonr(x, y)[0]), (x, y)
      assert _same(classification.spearman(x, y), scipy.stats.spearmanr(x, y)[0]), (x, y)


def test_average_ranks_match_scipy():
  rng = np.random.default_rng(3)
  for values in (rng.integers(0, 4, 30), rng.normal(size=30), np.ones(4), np.r_[3, 1, 2, 1]):
    np.testing.assert_array_equal(classification.average_ranks(values),
                                  scipy.stats.rankdata(values, method="average"))


def test_every_tasks_metrics_and_main_metric():
  rng = np.random.default_rng(4)
  labels = rng.integers(0, 2, 101)
  predictions = np.where(rng.random(101) < 0.25, 1 - labels, labels)
  acc = sklearn.metrics.accuracy_score(labels, predictions)
  f1 = sklearn.metrics.f1_score(labels, predictions)
  expected = {
      "cola": {"matthews_corr": sklearn.metrics.matthews_corrcoef(labels, predictions),
               "accuracy": acc},
      "sst2": {"accuracy": acc}, "qnli": {"accuracy": acc}, "rte": {"accuracy": acc},
      "wnli": {"accuracy": acc},
      "mrpc": {"accuracy": acc, "f1": f1, "accuracy_and_f1": (acc + f1) / 2},
      "qqp": {"accuracy": acc, "f1": f1, "accuracy_and_f1": (acc + f1) / 2},
  }
  main = {"cola": "matthews_corr", "sst2": "accuracy", "qnli": "accuracy", "rte": "accuracy",
          "wnli": "accuracy", "mrpc": "f1", "qqp": "f1"}
  for name, want in expected.items():
    task = glue.get_task(name)
    got = task.compute_metrics(predictions, labels)
    assert got == pytest.approx(want, abs=1e-12), name
    assert task.main_metric == main[name] and all(isinstance(v, float) for v in got.values())
  mnli_labels = rng.integers(0, 3, 99)
  mnli_predictions = np.where(rng.random(99) < 0.3, rng.integers(0, 3, 99), mnli_labels)
  assert glue.get_task("mnli").compute_metrics(mnli_predictions, mnli_labels) == pytest.approx(
      {"accuracy": sklearn.metrics.accuracy_score(mnli_labels, mnli_predictions)})
  scores = rng.uniform(0, 5, 57)
  predicted = scores + rng.normal(size=57)
  pearson = scipy.stats.pearsonr(predicted, scores)[0]
  spearman = scipy.stats.spearmanr(predicted, scores)[0]
  stsb = glue.get_task("stsb")
  assert stsb.compute_metrics(predicted[:, None], scores) == pytest.approx(
      {"pearson": pearson, "spearmanr": spearman,
       "pearson_and_spearmanr": (pearson + spearman) / 2})
  assert stsb.main_metric == "spearmanr"


def test_compute_metrics_rejects_what_is_not_label_indices():
  task = glue.get_task("mnli")
  with pytest.raises(ValueError, match="argmax"):
    task.compute_metrics(np.zeros((4, 3)), [0, 1, 2, 0])
  with pytest.raises(ValueError, match="outside 0..2"):
    task.compute_metrics([0, 1, 3], [0, 1, 2])
  with pytest.raises(ValueError, match="3 predictions for 2 labels"):
    task.compute_metrics([0, 1, 2], [0, 1])
  with pytest.raises(ValueError, match="no examples"):
    task.compute_metrics([], [])


# -- tfds ------------------------------------------------------------------------------------------

def test_tfds_mock_data_sst2(tmp_path):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  task = glue.get_task("sst2")
  with tfds.testing.mock_data(num_examples=7):
    dev = task.read_tfds(str(tmp_path), "dev")
    assert task.read_tfds(str(tmp_path), "validation") == dev  # tfds's own split name
  assert len(dev) == 7
  assert all(e.guid.startswith("dev-") and e.label in ("0", "1") and e.text_b is None
             and isinstance(e.text_a, str) for e in dev)
  indices = [int(e.guid.split("-")[1]) for e in dev]
  assert indices == sorted(indices)


def _controlled_glue(records_by_source, requested):
  """An `as_dataset_fn` serving given records per (config, split) and noting each request."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def as_dataset(self, split, **unused_kwargs):
    source = (self.builder_config.name, str(split))
    requested.append(source)
    records = records_by_source[source]
    return tf.data.Dataset.from_tensor_slices(
        {key: [record[key] for record in records] for key in records[0]})
  return as_dataset


def test_tfds_mnli_splits_label_names_and_unlabelled_test_rows(tmp_path):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  def nli(*rows):
    return [{"premise": p, "hypothesis": h, "label": label, "idx": idx}
            for idx, p, h, label in rows]

  records = {
      ("mnli", "train"): nli((1, "P1", "H1", 2), (0, "P0", "H0", 0)),
      ("mnli", "validation_matched"): nli((0, "Pm", "Hm", 1), (1, "Pm2", "Hm2", 2)),
      ("mnli", "validation_mismatched"): nli((0, "Pmm", "Hmm", 0)),
      ("mnli", "test_matched"): nli((1, "T1", "U1", -1), (0, "T0", "U0", -1)),
      ("mnli", "test_mismatched"): nli((0, "Tm", "Um", -1)),
      ("ax", "test"): nli((0, "The cat sat.", "The cat did not sit.", -1)),
  }
  requested = []
  task = glue.get_task("mnli")
  with tfds.testing.mock_data(as_dataset_fn=_controlled_glue(records, requested)):
    d = str(tmp_path)
    # tfds orders MNLI's classes entailment, neutral, contradiction; the names are what count.
    assert task.read_tfds(d, "train") == [Example("train-0", "P0", "H0", "entailment"),
                                          Example("train-1", "P1", "H1", "contradiction")]
    assert [e.label for e in task.read_tfds(d, "dev_matched")] == ["neutral", "contradiction"]
    assert task.read_tfds(d, "dev_mismatched") == [
        Example("dev_mismatched-0", "Pmm", "Hmm", "entailment")]
    assert task.read_tfds(d, "test_matched") == [Example("0", "T0", "U0", None),
                                                 Example("1", "T1", "U1", None)]
    assert task.read_tfds(d, "test_mismatched") == [Example("0", "Tm", "Um", None)]
    assert task.read_tfds(d, "diagnostic") == [
        Example("0", "The cat sat.", "The cat did not sit.", None)]
  assert requested == [("mnli", "train"), ("mnli", "validation_matched"),
                       ("mnli", "validation_mismatched"), ("mnli", "test_matched"),
                       ("mnli", "test_mismatched"), ("ax", "test")]


@pytest.mark.parametrize("name,config,keys,tfds_labels,labels", [
    ("rte", "rte", ("sentence1", "sentence2"), [0, 1], ["entailment", "not_entailment"]),
    ("qqp", "qqp", ("question1", "question2"), [1, 0], ["1", "0"]),
    # tfds calls WNLI's classes (not_entailment, entailment), stored as the file's 0 and 1.
    ("wnli", "wnli", ("sentence1", "sentence2"), [1, 0], ["1", "0"]),
    ("stsb", "stsb", ("sentence1", "sentence2"), [3.8, 0.2], [3.8, 0.2]),
])
def test_tfds_pair_tasks(tmp_path, name, config, keys, tfds_labels, labels):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  a, b = keys
  dtype = np.float32 if name == "stsb" else np.int64
  records = {(config, "validation"): [
      {a: "first a", b: "first b", "label": dtype(tfds_labels[0]), "idx": 0},
      {a: "second a", b: "second b", "label": dtype(tfds_labels[1]), "idx": 1}]}
  with tfds.testing.mock_data(as_dataset_fn=_controlled_glue(records, [])):
    examples = glue.get_task(name).read_tfds(str(tmp_path), "dev")
  assert examples == [Example("dev-0", "first a", "first b", labels[0]),
                      Example("dev-1", "second a", "second b", labels[1])]


def test_tfds_unprepared_directory_says_how_to_prepare(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"glue/rte is not prepared under .*tfds build"):
    glue.get_task("rte").read_tfds(str(tmp_path), "dev")


# -- prediction files ------------------------------------------------------------------------------

def test_prediction_files_in_the_glue_server_format(tmp_path):
  out = str(tmp_path / "out")
  expected_files = {"cola": "CoLA.tsv", "sst2": "SST-2.tsv", "mrpc": "MRPC.tsv",
                    "stsb": "STS-B.tsv", "qqp": "QQP.tsv", "qnli": "QNLI.tsv", "rte": "RTE.tsv",
                    "wnli": "WNLI.tsv"}
  for name, file_name in expected_files.items():
    task = glue.get_task(name)
    assert task.predict_splits == {"test": file_name}
    assert task.prediction_path(out, "test") == os.path.join(out, file_name)
  qnli = glue.get_task("qnli")
  qnli.write_predictions(qnli.prediction_path(out, "test"), np.array([1, 0, 1]))
  assert open(f"{out}/QNLI.tsv").read() == (
      "index\tprediction\n0\tnot_entailment\n1\tentailment\n2\tnot_entailment\n")
  stsb = glue.get_task("STS-B")
  stsb.write_predictions(f"{out}/STS-B.tsv", np.float32([4.86, 0.1234, 5.0]))
  assert open(f"{out}/STS-B.tsv").read() == "index\tprediction\n0\t4.860\n1\t0.123\n2\t5.000\n"
  mnli = glue.get_task("mnli")
  for split, file_name, predictions in [("test_matched", "MNLI-m.tsv", [0, 1, 2]),
                                        ("test_mismatched", "MNLI-mm.tsv", [2]),
                                        ("diagnostic", "AX.tsv", [1, 1])]:
    mnli.write_predictions(mnli.prediction_path(out, split), predictions)
  assert open(f"{out}/MNLI-m.tsv").read() == (
      "index\tprediction\n0\tcontradiction\n1\tentailment\n2\tneutral\n")
  assert open(f"{out}/MNLI-mm.tsv").read() == "index\tprediction\n0\tneutral\n"
  assert open(f"{out}/AX.tsv").read() == "index\tprediction\n0\tentailment\n1\tentailment\n"
  assert sorted(os.listdir(out)) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv", "QNLI.tsv",
                                     "STS-B.tsv"]  # no temporary files left behind


def test_prediction_file_indices_come_from_the_test_examples(tmp_path):
  d = str(tmp_path)
  write(f"{d}/test.tsv", [["id", "question1", "question2"], ["7", "A?", "B?"], ["3", "C?", "D?"]])
  task = glue.get_task("qqp")
  test = task.read_tsv(d, "test")
  task.write_predictions(f"{d}/QQP.tsv", [1, 0], indices=[e.guid for e in test])
  assert open(f"{d}/QQP.tsv").read() == "index\tprediction\n7\t1\n3\t0\n"
  with pytest.raises(ValueError, match="2 predictions for 1 indices"):
    task.write_predictions(f"{d}/QQP.tsv", [1, 0], indices=["7"])
  with pytest.raises(ValueError, match="outside 0..1"):
    task.write_predictions(f"{d}/QQP.tsv", [2, 0])
  with pytest.raises(ValueError, match="NaN"):
    glue.get_task("stsb").write_predictions(f"{d}/STS-B.tsv", [1.0, float("nan")])
  with pytest.raises(ValueError, match="not a prediction split"):
    task.prediction_path(d, "dev")


# -- names and users' own tasks --------------------------------------------------------------------

@pytest.mark.parametrize("spelling,name", [
    ("SST-2", "sst2"), ("sst2", "sst2"), ("sst-2", "sst2"), ("STS-B", "stsb"), ("sts_b", "stsb"),
    ("MNLI", "mnli"), ("MNLI-mm", "mnli"), ("CoLA", "cola"), ("QQP", "qqp"), ("WNLI", "wnli"),
    ("MRPC", "mrpc"), ("QNLI", "qnli"), ("RTE", "rte"),
])
def test_get_task_accepts_the_usual_spellings(spelling, name):
  task = glue.get_task(spelling)
  assert task.name == name and isinstance(task, glue.Task)


def test_get_task_unknown_name_lists_the_tasks():
  with pytest.raises(ValueError, match="unknown task 'sst5'.*cola, sst2, mrpc"):
    glue.get_task("sst5")


def test_custom_tsv_task_single_sentence_with_header(tmp_path):
  d = str(tmp_path)
  write(f"{d}/train.tsv", [["label", "review"], ["fresh", "A gripping, beautifully made film."],
                           ["rotten", "Ninety minutes of nothing."]])
  write(f"{d}/dev.tsv", [["label", "review"], ["rotten", "Dull."]])
  write(f"{d}/test.tsv", [["label", "review"], ["", "Unseen one."], ["fresh", "Labelled one."]])
  task = glue.get_task("custom", label_list=["rotten", "fresh"], text_a_column=1, label_column=0)
  assert isinstance(task, glue.CustomTsvTask) and task.num_labels == 2
  assert task.read_tsv(d, "train") == [
      Example("train-0", "A gripping, beautifully made film.", None, "fresh"),
      Example("train-1", "Ninety minutes of nothing.", None, "rotten")]
  assert task.read_tsv(d, "dev") == [Example("dev-0", "Dull.", None, "rotten")]
  assert task.read_tsv(d, "test") == [Example("0", "Unseen one.", None, None),
                                      Example("1", "Labelled one.", None, "fresh")]
  np.testing.assert_array_equal(task.label_ids(task.read_tsv(d, "train")), [1, 0])
  metrics = task.compute_metrics([1, 0, 0, 1], [1, 0, 1, 1])
  assert set(metrics) == {"accuracy", "f1", "matthews_corr", "accuracy_and_f1"}
  assert metrics["f1"] == pytest.approx(sklearn.metrics.f1_score([1, 0, 1, 1], [1, 0, 0, 1]))
  task.write_predictions(task.prediction_path(d, "test"), [0, 1])
  assert open(f"{d}/custom.tsv").read() == "index\tprediction\n0\trotten\n1\tfresh\n"
  write(f"{d}/dev.tsv", [["label", "review"], ["meh", "Unsure."]])
  with pytest.raises(ValueError,
                     match=r"dev\.tsv: line 2: unknown label 'meh'.*\['rotten', 'fresh'\]"):
    task.read_tsv(d, "dev")


def test_custom_tsv_task_headerless_pairs_and_regression(tmp_path):
  d = str(tmp_path)
  write(f"{d}/train.tsv", [["q1", "How old is the universe?", "What is the cosmos' age?", "yes"],
                           ["q2", "Who wrote Hamlet?", "When was Hamlet first staged?", "no"]])
  task = glue.CustomTsvTask(["no", "yes"], text_a_column=1, text_b_column=2, label_column=3,
                            index_column=0, skip_header=False, name="paraphrase")
  assert task.read_tsv(d, "train") == [
      Example("train-q1", "How old is the universe?", "What is the cosmos' age?", "yes"),
      Example("train-q2", "Who wrote Hamlet?", "When was Hamlet first staged?", "no")]
  write(f"{d}/train.tsv", [["q1", "A", "B", "yes"], ["q2", "A", "B"]])
  with pytest.raises(ValueError, match=r"train\.tsv: line 2: expected 4 tab-separated fields"):
    task.read_tsv(d, "train")
  write(f"{d}/dev.tsv", [["score", "s1", "s2"], ["4.5", "A dog runs.", "A dog is running."],
                         ["1", "A cat.", "A car."]])
  regression = glue.CustomTsvTask(regression=True, text_a_column=1, text_b_column=2,
                                  label_column=0)
  assert [e.label for e in regression.read_tsv(d, "dev")] == [4.5, 1.0]
  assert set(regression.compute_metrics([4.0, 2.0, 3.0], [4.5, 1.0, 2.0])) == {
      "pearson", "spearmanr", "pearson_and_spearmanr"}
  with pytest.raises(ValueError, match="either label_list"):
    glue.CustomTsvTask(["a", "b"], regression=True)
  with pytest.raises(ValueError, match="either label_list"):
    glue.CustomTsvTask([], regression=False)
  assert glue.CustomTsvTask([], regression=True).is_regression  # an unset list flag is empty
  with pytest.raises(ValueError, match="must differ"):
    glue.CustomTsvTask(["a", "b"], text_a_column=1, label_column=1)


# -- one header rule for users' TSV files; empty texts; long fields -------------------------------

def test_custom_tsv_header_is_detected_not_assumed(tmp_path, caplog):
  """A headerless file keeps its first line (it was silently dropped by a skip-the-header
  default), a file with a header loses exactly that line, and the decision is logged."""
  caplog.set_level(logging.INFO)
  d = str(tmp_path)
  task = glue.get_task("custom", label_list=["rotten", "fresh"], text_a_column=1, label_column=0)
  write(f"{d}/train.tsv", [["fresh", "A gripping film."], ["rotten", "Dull."]])
  assert [e.text_a for e in task.read_tsv(d, "train")] == ["A gripping film.", "Dull."]
  assert ("reading train.tsv: first line is data (its label column 0 holds 'fresh', a label"
          in caplog.text)
  write(f"{d}/train.tsv", [["label", "review"], ["fresh", "A gripping film."]])
  assert [e.text_a for e in task.read_tsv(d, "train")] == ["A gripping film."]
  assert ("reading train.tsv: first line is a header (its label column 0 holds 'label', not a "
          "label" in caplog.text)
  # The test file may leave labels out: column names tell a header there.
  write(f"{d}/test.tsv", [["label", "review"], ["", "Unseen."]])
  assert [e.text_a for e in task.read_tsv(d, "test")] == ["Unseen."]
  write(f"{d}/test.tsv", [["", "Unseen."], ["", "Also unseen."]])
  assert len(task.read_tsv(d, "test")) == 2
  # Regression: a first line whose score is not a number is a header.
  scores = glue.CustomTsvTask(regression=True, text_a_column=1, label_column=0)
  write(f"{d}/dev.tsv", [["score", "text"], ["4.5", "Good."]])
  assert [e.label for e in scores.read_tsv(d, "dev")] == [4.5]
  write(f"{d}/dev.tsv", [["3.0", "Fine."], ["4.5", "Good."]])
  assert [e.label for e in scores.read_tsv(d, "dev")] == [3.0, 4.5]
  # Said outright, the flag wins: a header read as data is an unknown label on line 1.
  write(f"{d}/train.tsv", [["label", "review"], ["fresh", "A gripping film."]])
  strict = glue.CustomTsvTask(["rotten", "fresh"], text_a_column=1, label_column=0,
                              has_header=False)
  with pytest.raises(ValueError, match=r"train\.tsv: line 1: unknown label 'label'"):
    strict.read_tsv(d, "train")
  assert len(glue.CustomTsvTask(["rotten", "fresh"], text_a_column=1, label_column=0,
                                has_header="true").read_tsv(d, "train")) == 1
  assert glue.CustomTsvTask(["a", "b"], skip_header=False).has_header is False  # older spelling
  assert glue.parse_has_header("Auto") == "auto" and glue.parse_has_header("no") is False
  with pytest.raises(ValueError, match=r"has_header='maybe': use auto, true or false"):
    glue.parse_has_header("maybe")


def test_prediction_inputs_follow_the_same_header_rule(tmp_path):
  d = str(tmp_path)
  path = write(f"{d}/inputs.tsv", [["sentence"], ["A gripping film."], ["Dull."]])
  assert glue.read_text_tsv(path) == [("A gripping film.", None), ("Dull.", None)]
  path = write(f"{d}/inputs.tsv", [["A gripping film."], ["Dull."]])
  assert glue.read_text_tsv(path) == [("A gripping film.", None), ("Dull.", None)]
  path = write(f"{d}/inputs.tsv", [["premise", "hypothesis"], ["A man sleeps.", "He rests."]],
               bom=True)
  assert glue.read_text_tsv(path) == [("A man sleeps.", "He rests.")]
  assert glue.read_text_tsv(path, has_header=False)[0] == ("premise", "hypothesis")
  assert glue.decide_header(path, ["sentence", "label"]) is True
  assert glue.decide_header(path, ["Sentence one here", "label"]) is False
  path = write(f"{d}/inputs.tsv", [["a", "b", "c"]])
  with pytest.raises(ValueError, match=r"inputs\.tsv: line 1: 3 tab-separated fields; expected "
                                       r"text or text<TAB>text_b"):
    glue.read_text_tsv(path)
  path = write(f"{d}/inputs.tsv", [["Fine."], [" "], ["\tHe rests."]])
  with pytest.raises(ValueError, match=r"inputs\.tsv: line 3: an empty text field"):
    glue.read_text_tsv(path)


def test_an_empty_sentence_is_an_error_naming_file_and_line(tmp_path):
  d = str(tmp_path)
  write(f"{d}/train.tsv", [["sentence", "label"], ["Fine film.", "1"], [" ", "0"]])
  with pytest.raises(ValueError, match=r"train\.tsv: line 3: the 'sentence' field is empty; "
                                       r"every example needs its text\.$"):
    glue.get_task("sst2").read_tsv(d, "train")
  write(f"{d}/dev.tsv", [["q1", "How old is it?", "", "yes"]])
  pairs = glue.CustomTsvTask(["no", "yes"], text_a_column=1, text_b_column=2, label_column=3,
                             index_column=0)
  with pytest.raises(ValueError, match=r"dev\.tsv: line 1: the text_b \(column 2, 0-based\) "
                                       r"field is empty"):
    pairs.read_tsv(d, "dev")
  # QQP skips (and counts) malformed rows as its original processor did; an empty one is one.
  rows = qqp_rows(200)
  write(f"{d}/train.tsv", [QQP_HEADER] + rows[:50] + [["999", "1", "2", "Why?", "", "0"]]
        + rows[50:])
  task = glue.get_task("qqp")
  assert len(task.read_tsv(d, "train")) == 200 and task.skipped_lines["train"] == [52]


def test_a_field_of_200k_characters_is_read(tmp_path):
  import csv  # pylint: disable=g-import-not-at-top
  default = csv.field_size_limit(131072)  # Python's own default, as in a fresh process
  try:
    d = str(tmp_path)
    long_text = "word " * 40_000
    write(f"{d}/train.tsv", [["sentence", "label"], [long_text, "1"]])
    assert glue.get_task("sst2").read_tsv(d, "train")[0].text_a == long_text
  finally:
    csv.field_size_limit(max(default, csv.field_size_limit()))
