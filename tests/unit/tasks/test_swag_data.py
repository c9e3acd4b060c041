"""SWAG and HellaSwag files → examples → pair features → prediction files.

The files are written here in the official layouts (rowanz/swagaf `data/*.csv`, rowanz/hellaswag
`data/*.jsonl`) with the things real copies contain: pandas' unnamed index column, a UTF-8
byte-order mark, "\\r\\n" line ends, quoted fields with commas, doubled quotes and newlines inside,
test files without labels. Every expectation is written out by hand.
"""

import csv
import json
import os
import re

import numpy as np
import pytest

from bert_jax.tasks.multiple_choice import data as swag
from bert_jax.text import bpe, pairs, tokenization
from tests import helpers

HEADER = (",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,"
          "label")

# Physical lines: 1 header, 2 the first record, 3-5 the second (a newline inside each of two quoted
# fields), 6 the third.
TRAIN_CSV = (
    "\ufeff" + HEADER + "\r\n"
    '0,lsmdc1052_Harry_Potter-94857,18313,Students lower their eyes nervously. She,'
    'Students lower their eyes nervously.,She,gold,"pats her shoulder, then says ""hello"".",'
    "turns with two students.,walks slowly towards someone.,wheels around as her dog thunders "
    "out.,2\r\n"
    '1,anetv_dm5WXFiQZUQ,18419,"He rides the motorcycle\ndown the hall. He",'
    '"He rides the motorcycle\ndown the hall.",He,gen,rides it off.,stops.,falls over.,waves.,0'
    "\r\n"
    "2,anetv_x,5,A man sits. The man,A man sits.,The man,gold,stands up.,sits down.,eats.,"
    "sleeps.,3\r\n")

TRAIN_EXPECTED = [
    swag.ChoiceExample(
        example_id="lsmdc1052_Harry_Potter-94857-18313",
        context="Students lower their eyes nervously.", start="She",
        endings=('pats her shoulder, then says "hello".', "turns with two students.",
                 "walks slowly towards someone.", "wheels around as her dog thunders out."),
        label=2, source="{}:2"),
    swag.ChoiceExample(
        example_id="anetv_dm5WXFiQZUQ-18419",
        context="He rides the motorcycle\ndown the hall.", start="He",
        endings=("rides it off.", "stops.", "falls over.", "waves."), label=0, source="{}:3"),
    swag.ChoiceExample(
        example_id="anetv_x-5", context="A man sits.", start="The man",
        endings=("stands up.", "sits down.", "eats.", "sleeps."), label=3, source="{}:6"),
]

TEST_CSV = (
    HEADER + "\n"
    "0,anetv_t1,7,A girl waves. She,A girl waves.,She,gold,smiles.,runs.,jumps.,sits.,\n"
    "1,lsmdc_t2,8,Someone nods. Someone,Someone nods.,Someone,gold,leaves.,stays.,cries.,"
    "laughs.,\n")

HELLASWAG_VAL = [
    {"ind": 24, "activity_label": "Roof shingle removal",
     "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
     "ctx": "A man is sitting on a roof. he",
     "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                 "is holding a rubik's cube.", "starts pulling up roofing on a roof."],
     "source_id": "activitynet~v_-JhWjGDPHMY", "split": "val", "split_type": "indomain",
     "label": 3},
    {"ind": 92, "activity_label": "Home and Garden",
     "ctx_a": "[header] How to clean a sink [title] Rinse the sink.", "ctx_b": "",
     "ctx": "[header] How to clean a sink [title] Rinse the sink.",
     "endings": ["Scrub it.", "Paint it.", "Sell it.", "Eat it."],
     "source_id": "wikihow~1", "split": "val", "split_type": "zeroshot", "label": "0"},
]


def _write(path, text, newline=""):
  with open(path, "w", encoding="utf-8", newline=newline) as f:
    f.write(text)
  return str(path)


def _jsonl(path, items):
  return _write(path, "".join(json.dumps(item) + "\n" for item in items))


def _at(path, line):
  """The start of an error message about `path` at `line`, as a regex."""
  return f"^{re.escape(path)}: line {line}: "


def _with_source(expected, path):
  return [swag.ChoiceExample(e.example_id, e.context, e.start, e.endings, e.label,
                             e.source.format(path)) for e in expected]


# ------------------------------------------------------------------------------------------ SWAG


def test_official_swag_csv_reads_back_exactly(tmp_path):
  path = _write(tmp_path / "train.csv", TRAIN_CSV)
  examples = swag.read_swag_csv(path)
  assert examples == _with_source(TRAIN_EXPECTED, path)
  assert examples[0].choices == ('She pats her shoulder, then says "hello".',
                                 "She turns with two students.",
                                 "She walks slowly towards someone.",
                                 "She wheels around as her dog thunders out.")


def test_unlabelled_test_csv_and_startphrase_form(tmp_path):
  path = _write(tmp_path / "test.csv", TEST_CSV)
  assert swag.read_swag_csv(path) == [
      swag.ChoiceExample("anetv_t1-7", "A girl waves.", "She",
                         ("smiles.", "runs.", "jumps.", "sits."), None, f"{path}:2"),
      swag.ChoiceExample("lsmdc_t2-8", "Someone nods.", "Someone",
                         ("leaves.", "stays.", "cries.", "laughs."), None, f"{path}:3"),
  ]
  # Only the startphrase: it is sentence A whole, the ending alone sentence B; ids are the
  # 0-based data rows; no label column means unlabelled. (The byte-order mark sits on a column
  # that is read this time.)
  short = _write(tmp_path / "short.csv",
                 "\ufeffstartphrase,ending0,ending1,ending2\n"
                 "A dog barks. The dog,runs.,sleeps.,\"eats, then naps.\"\n"
                 "\n"
                 "The sun sets. It,gets dark.,rises.,explodes.\n")
  examples = swag.read_swag_csv(short)
  assert examples == [
      swag.ChoiceExample("0", "A dog barks. The dog", "", ("runs.", "sleeps.", "eats, then naps."),
                         None, f"{short}:2"),
      swag.ChoiceExample("1", "The sun sets. It", "", ("gets dark.", "rises.", "explodes."),
                         None, f"{short}:4"),
  ]
  assert examples[0].choices == ("runs.", "sleeps.", "eats, then naps.")


def _replace_third_record(new):
  records = TRAIN_CSV.split("\r\n")  # header, three records (the second spans two lines), ""
  records[3] = new
  return "\r\n".join(records)


@pytest.mark.parametrize("bad_third_record, message", [
    ("2,anetv_x,5,A man sits. The man,A man sits.,The man,gold,stands up.,sits down.,eats.,"
     "sleeps.,4", r"line 6: the label is '4'; expected .* integer from 0 to 3"),
    ("2,anetv_x,5,A man sits. The man,A man sits.,The man,gold,stands up.,sits down.,eats.,"
     "sleeps.,two", r"line 6: the label is 'two'"),
    ("2,anetv_x,5,A man sits. The man,A man sits.,The man,gold,stands up.,sits down.,eats.,"
     "sleeps.", r"line 6: 11 fields, but the header on line 1 names 12 columns"),
    ("2,anetv_x,5,A man sits. The man,A man sits.,The man,gold,stands up., ,eats.,sleeps.,1",
     r"line 6: the ending1 column is empty"),
    ("2,anetv_x,5,A man sits. The man,,The man,gold,stands up.,sits down.,eats.,sleeps.,1",
     r"line 6: the sent1 column is empty"),
    ("2,anetv_x,5,A man sits. The man,A man sits.,The man,gold,stands up.,sits down.,eats.,"
     "sleeps.,", r"line 6: no label, but line 2 has one"),
    ('2,anetv_x,5,"A man sits." The man,A man sits.,The man,gold,a,b,c,d,1',
     r"line 6: not valid CSV: .*record that starts on line 6"),
    ('2,anetv_x,5,"A man sits. The man,A man sits.,The man,gold,a,b,c,d,1',
     r"line \d+: not valid CSV: the quoted field opened in the record that starts on line 6 is "
     r"never closed"),
])
def test_bad_swag_rows_are_named_by_file_and_physical_line(tmp_path, bad_third_record, message):
  path = _write(tmp_path / "train.csv", _replace_third_record(bad_third_record))
  with pytest.raises(ValueError, match=f"^{re.escape(path)}: {message}"):
    swag.read_swag_csv(path)


def test_labels_after_unlabelled_rows_are_refused(tmp_path):
  lines = TEST_CSV.split("\n")
  lines[2] += "1"  # the second record gets a label
  path = _write(tmp_path / "test.csv", "\n".join(lines))
  with pytest.raises(ValueError, match=f"^{re.escape(path)}: line 3: a label, but line 2 has none"):
    swag.read_swag_csv(path)


def test_missing_columns_and_other_forms_are_refused(tmp_path):
  no_sent2 = _write(tmp_path / "a.csv", "video-id,sent1,ending0,ending1,label\nv,S.,a,b,0\n")
  with pytest.raises(ValueError, match=(_at(no_sent2, 1) + "the header has no column sent2; "
                                        r".*found video-id,sent1,ending0,ending1,label\.$")):
    swag.read_swag_csv(no_sent2)
  one_ending = _write(tmp_path / "b.csv", "startphrase,ending0,label\nA b.,c,0\n")
  with pytest.raises(ValueError, match=_at(one_ending, 1) + "the header has no column ending1;"):
    swag.read_swag_csv(one_ending)
  # A headerless file: its first data line is reported as the header it is not.
  headerless = _write(tmp_path / "c.csv", TRAIN_CSV.split("\r\n", 1)[1])
  with pytest.raises(ValueError, match=(_at(headerless, 1) + "the header has no column "
                                        r"ending0, ending1, sent1, sent2 \(or startphrase\);")):
    swag.read_swag_csv(headerless)
  full = _write(tmp_path / "train_full.csv",
                "video-id,fold-ind,startphrase,gold-ending,distractor-0,distractor-1,"
                "distractor-2,distractor-3,gold-source,gold-type,distractor-0-type,"
                "distractor-1-type,distractor-2-type,distractor-3-type,sent1,sent2\n"
                "v,1,A b. C,d,e,f,g,,gold,pos,unl,unl,unl,,A b.,C\n")
  with pytest.raises(ValueError, match=(_at(full, 1) + "this is SWAG's annotation form .* "
                                        "train.csv / val.csv / test.csv")):
    swag.read_swag_csv(full)
  empty = _write(tmp_path / "empty.csv", "")
  with pytest.raises(ValueError, match=f"^{re.escape(empty)}: the file is empty"):
    swag.read_swag_csv(empty)
  only_header = _write(tmp_path / "header.csv", HEADER + "\n")
  with pytest.raises(ValueError, match=f"^{re.escape(only_header)}: no examples after the header"):
    swag.read_swag_csv(only_header)


# ------------------------------------------------------------------------------------- HellaSwag


def test_hellaswag_jsonl_reads_back_exactly(tmp_path):
  path = _jsonl(tmp_path / "hellaswag_val.jsonl", HELLASWAG_VAL)
  assert swag.read_hellaswag_jsonl(path) == [
      swag.ChoiceExample("24", "A man is sitting on a roof.", "he",
                         ("is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
                          "is holding a rubik's cube.", "starts pulling up roofing on a roof."),
                         3, f"{path}:1"),
      swag.ChoiceExample("92", "[header] How to clean a sink [title] Rinse the sink.", "",
                         ("Scrub it.", "Paint it.", "Sell it.", "Eat it."), 0, f"{path}:2"),
  ]
  # A test line has no label; an empty ctx_a falls back to the whole ctx with the ending alone.
  item = dict(HELLASWAG_VAL[0], ctx_a="", split="test")
  del item["label"]
  test = _write(tmp_path / "hellaswag_test.jsonl", "\ufeff" + json.dumps(item) + "\r\n")
  assert swag.read_hellaswag_jsonl(test) == [swag.ChoiceExample(
      "24", "A man is sitting on a roof. he", "", tuple(item["endings"]), None, f"{test}:1")]


@pytest.mark.parametrize("line, message", [
    ('{"ind": 5, "ctx_a": "A.", "endings": ["a", "b"], "label": 0', r"not valid JSON"),
    ('[1, 2]', r"a list; expected a JSON object"),
    ('{"ind": 5, "ctx_a": "A.", "label": 0}', r"no field endings; .*found ind, ctx_a, label"),
    ('{"ctx_b": "he", "endings": ["a", "b"]}', r"no field ind, ctx_a \(or ctx\)"),
    ('{"ind": 5, "ctx_a": "A.", "endings": "a b", "label": 0}',
     r"endings is a string 'a b'; expected a list of at least two strings"),
    ('{"ind": 5, "ctx_a": "A.", "endings": ["a", 7], "label": 0}',
     r"endings is a list \['a', 7\]; expected a list of .*strings"),
    ('{"ind": 5, "ctx_a": "A.", "endings": ["a", ""], "label": 0}', r"endings\[1\] is empty"),
    ('{"ind": 5, "ctx_a": "A.", "endings": ["a", "b"], "label": 0}',
     r"2 endings, but line 1 has 4"),
    ('{"ind": 5, "ctx_a": "A.", "endings": ["a", "b", "c", "d"], "label": 4}',
     r"the label is 4; expected .* from 0 to 3"),
    ('{"ind": 5, "ctx_a": "A.", "endings": ["a", "b", "c", "d"], "label": true}',
     r"the label is True"),
    ('{"ind": 5, "ctx_a": "A.", "endings": ["a", "b", "c", "d"]}', r"no label, but line 1 has"),
    ('{"ind": 5, "ctx_a": " ", "ctx": "", "endings": ["a", "b", "c", "d"], "label": 1}',
     r"ctx_a and ctx are empty"),
])
def test_bad_hellaswag_lines_are_named_by_file_and_line(tmp_path, line, message):
  # Line 1 is good, line 2 blank (skipped, still counted), line 3 the bad one.
  path = _write(tmp_path / "hellaswag_train.jsonl",
                json.dumps(HELLASWAG_VAL[0]) + "\n\n" + line + "\n")
  with pytest.raises(ValueError, match=f"^{re.escape(path)}: line 3: {message}"):
    swag.read_hellaswag_jsonl(path)


# ---------------------------------------------------------------------------------------- splits


def test_read_split_finds_each_layout_and_names_what_it_looked_for(tmp_path):
  swag_dir, hella_dir = tmp_path / "swag", tmp_path / "hella"
  swag_dir.mkdir()
  hella_dir.mkdir()
  train = _write(swag_dir / "train.csv", TRAIN_CSV)
  examples, path = swag.read_split("swag", str(swag_dir), "train")
  assert path == train and examples == _with_source(TRAIN_EXPECTED, train)
  test = _write(swag_dir / "test.csv", TEST_CSV)
  examples, path = swag.read_split("SWAG", str(swag_dir), "test")
  assert path == test and [e.label for e in examples] == [None, None]
  with pytest.raises(FileNotFoundError, match=("swag 'dev': none of these files exists: " +
                                              re.escape(str(swag_dir / "val.csv")))):
    swag.read_split("swag", str(swag_dir), "dev")
  # An unlabelled file is no dev set.
  _write(swag_dir / "val.csv", TEST_CSV)
  with pytest.raises(ValueError, match=r"val.csv: the examples have no labels; the dev split"):
    swag.read_split("swag", str(swag_dir), "dev")

  # HellaSwag under its own names, and under the short names some copies use.
  val = _jsonl(hella_dir / "val.jsonl", HELLASWAG_VAL)
  examples, path = swag.read_split("hellaswag", str(hella_dir), "dev")
  assert path == val and [e.example_id for e in examples] == ["24", "92"]
  own = _jsonl(hella_dir / "hellaswag_val.jsonl", HELLASWAG_VAL[:1])
  assert swag.read_split("hellaswag", str(hella_dir), "val")[1] == own
  with pytest.raises(FileNotFoundError, match=(
      "hellaswag 'train': none of these files exists: " +
      re.escape(f"{hella_dir / 'hellaswag_train.jsonl'}, {hella_dir / 'train.jsonl'}."))):
    swag.read_split("hellaswag", str(hella_dir), "train")
  with pytest.raises(ValueError, match=r"task_name='cosmos': multiple choice reads swag, hella"):
    swag.read_split("cosmos", str(hella_dir), "train")
  with pytest.raises(ValueError, match=r"no split 'extra'"):
    swag.read_split("swag", str(swag_dir), "extra")


# -------------------------------------------------------------------------------------- features


def _example(context, start, endings, label=0, example_id="x"):
  return swag.ChoiceExample(example_id, context, start, tuple(endings), label, "mem:1")


def test_features_are_the_pair_encoding_of_each_choice(tokenizer):
  long_context = ("The orchestra tuned their instruments while the conductor walked slowly "
                  "across the wide stage toward the podium under bright lights")
  examples = [
      _example("Students lower their eyes nervously.", "She",
               ['pats her shoulder, then says "hello".', "turns with two students.",
                "walks slowly towards someone.", "wheels around."], label=2),
      _example(long_context, "He", ["bows.", "raises the baton and waits for silence.",
                                    "sits.", "leaves."], label=1),
      _example("A man sits.", "", ["stands up.", "sits down.", "eats.", "sleeps."], label=None),
  ]
  # Sentence B of each choice, written out.
  choices = [['She pats her shoulder, then says "hello".', "She turns with two students.",
              "She walks slowly towards someone.", "She wheels around."],
             ["He bows.", "He raises the baton and waits for silence.", "He sits.", "He leaves."],
             ["stands up.", "sits down.", "eats.", "sleeps."]]
  length = 16  # the second example's pairs need truncating
  feats = swag.featurize(examples, tokenizer, length)
  assert set(feats) == {"input_ids", "input_mask", "segment_ids", "label", "weight"}
  for name in ("input_ids", "input_mask", "segment_ids"):
    assert feats[name].shape == (3, 4, length) and feats[name].dtype == np.int32
  np.testing.assert_array_equal(feats["label"], np.array([2, 1, 0], np.int32))
  assert feats["label"].dtype == np.int32
  np.testing.assert_array_equal(feats["weight"], np.ones(3, np.float32))
  assert feats["weight"].dtype == np.float32
  for i, example in enumerate(examples):
    for j, choice in enumerate(choices[i]):
      one = pairs.encode_examples(tokenizer, [example.context], [choice], length)
      for name in ("input_ids", "input_mask", "segment_ids"):
        np.testing.assert_array_equal(feats[name][i, j], one[name][0], err_msg=f"{name} {i},{j}")
  # Every row starts with [CLS] and holds exactly two [SEP]; the long context was cut.
  assert (feats["input_ids"][:, :, 0] == tokenizer.cls_id).all()
  assert ((feats["input_ids"] == tokenizer.sep_id).sum(-1) == 2).all()
  assert feats["input_mask"][1].sum(-1).tolist() == [length] * 4


def test_wordpiece_rows_equal_transformers_pair_encoding(tokenizer):
  from transformers import BertTokenizerFast  # pylint: disable=g-import-not-at-top
  reference = BertTokenizerFast.from_pretrained(helpers.minilm_dir())
  assert reference.vocab_size == 30522
  length = 23
  examples = [
      _example("Someone opens the door.", "Someone", ["walks in.", "shuts it again, quietly."]),
      # Only the long context is cut to fit.
      _example("A woman in a red coat stands at the edge of the crowded platform and watches "
               "the train pull slowly into the station", "She", ["boards.", "waves goodbye."]),
      # Both sides are long: they are cut to 10 pieces each (an even number of places; on an odd
      # one, transformers gives the extra piece to B where B was the longer, the original to A).
      _example("One two three four five six seven eight nine ten eleven twelve thirteen",
               "then", ["red blue green black white pink grey gold teal navy plum lime rose"
                        " sand", "up down"]),
  ]
  feats = swag.featurize(examples, tokenizer, length)
  for i, example in enumerate(examples):
    for j, ending in enumerate(example.endings):
      expected = reference(example.context, f"{example.start} {ending}",
                           truncation="longest_first", max_length=length, padding="max_length")
      assert feats["input_ids"][i, j].tolist() == expected["input_ids"], (i, j)
      assert feats["segment_ids"][i, j].tolist() == expected["token_type_ids"], (i, j)
      assert feats["input_mask"][i, j].tolist() == expected["attention_mask"], (i, j)
  assert feats["input_mask"][1].sum(-1).tolist() == [length, length]
  assert feats["segment_ids"][2, 0].tolist() == [0] * (1 + 10 + 1) + [1] * (10 + 1)


def test_byte_level_bpe_gets_robertas_pair_layout(tmp_path):
  vocab = {token: i for i, token in enumerate(list(bpe.SPECIAL_TOKENS) + bpe.byte_symbols())}
  vocab_file = tmp_path / "vocab.json"
  vocab_file.write_text(json.dumps(vocab), encoding="utf-8")
  (tmp_path / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
  roberta = tokenization.load_tokenizer(vocab_file=str(vocab_file))
  assert roberta.pair_separators == 2
  feats = swag.featurize([_example("Hi.", "", ["yo", "ok!"])], roberta, 12)
  s, e = roberta.cls_id, roberta.sep_id
  byte = lambda text: [vocab[bpe.byte_symbols()[b]] for b in text.encode()]
  assert feats["input_ids"][0, 0].tolist() == [s, *byte("Hi."), e, e, *byte("yo"), e, 0, 0, 0]
  assert feats["input_ids"][0, 1].tolist() == [s, *byte("Hi."), e, e, *byte("ok!"), e, 0, 0]
  assert feats["segment_ids"][0, 1].tolist() == [0] * 6 + [1] * 4 + [0] * 2
  assert feats["input_mask"][0, 1].tolist() == [1] * 10 + [0] * 2


def test_featurize_refuses_mixed_ending_counts_and_unknown_text(tmp_path, tokenizer):
  examples = [_example("A.", "", ["a", "b"]),
              swag.ChoiceExample("y", "B.", "", ("a", "b", "c"), 0, "other.csv:7")]
  with pytest.raises(ValueError, match=r"other.csv:7: 3 endings, but mem:1 has 2"):
    swag.featurize(examples, tokenizer, 16)
  with pytest.raises(ValueError, match=r"No multiple-choice examples"):
    swag.featurize([], tokenizer, 16)
  # A vocabulary that lacks the words of the text: its [UNK]s stop the features.
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "."]) + "\n",
                   encoding="utf-8")
  narrow = tokenization.load_tokenizer(vocab_file=str(vocab), do_lower_case=True)
  words = "the quick brown fox jumps over a lazy dog again and again ."
  many = [swag.ChoiceExample(str(i), words, "then", ("it runs far away .", "it sleeps ."), 0,
                             f"{tmp_path}/train.csv:{i + 2}") for i in range(10)]
  with pytest.raises(ValueError, match=(r"train.csv examples: .*% of .* word pieces are \[UNK\] "
                                        r"with vocab.txt")):
    swag.featurize(many, narrow, 32)


# -------------------------------------------------------------------------- metric and outputs


def test_accuracy_from_indices_or_scores():
  labels = np.array([0, 2, 1, 3])
  assert swag.accuracy(np.array([0, 2, 0, 0]), labels) == 0.5
  scores = np.array([[0.9, 0.1, 0, 0], [0, 0, 1, 0], [0, 0.2, 0.8, 0], [0, 0, 0, 5.0]])
  assert swag.accuracy(scores, labels) == 0.75
  with pytest.raises(ValueError, match=r"predictions of shape \(3,\) for labels of shape \(4,\)"):
    swag.accuracy(np.array([0, 1, 2]), labels)


def test_write_predictions_round_trip(tmp_path):
  examples = [swag.ChoiceExample(i, "c", "", ("a", "b", "c"), None, f"t.csv:{n}")
              for n, i in enumerate(["anetv_a-1", 'odd, "id"', "lsmdc_b-3"], start=2)]
  probabilities = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25], [1e-9, 2e-9, 0.999999998]],
                           np.float32)
  path = str(tmp_path / "out" / "predictions.csv")
  swag.write_predictions(path, examples, probabilities)
  assert os.listdir(tmp_path / "out") == ["predictions.csv"]  # nothing half-written left
  with open(path, newline="", encoding="utf-8") as f:
    rows = list(csv.reader(f))
  assert rows[0] == ["id", "pred", "prob0", "prob1", "prob2"]
  assert [r[0] for r in rows[1:]] == ["anetv_a-1", 'odd, "id"', "lsmdc_b-3"]
  assert [r[1] for r in rows[1:]] == ["1", "0", "2"]
  read = np.array([[np.float32(v) for v in r[2:]] for r in rows[1:]], np.float32)
  np.testing.assert_array_equal(read, probabilities)  # exact: float32 written in full
  assert rows[1][2:] == ["0.1", "0.7", "0.2"]  # and no longer than needed
  with pytest.raises(ValueError, match=r"probabilities of shape \(3, 2\) for 3 examples of 3 "
                                       r"endings"):
    swag.write_predictions(path, examples, probabilities[:, :2])


def test_leaderboard_submissions(tmp_path):
  probabilities = np.array([[0.1, 0.2, 0.6, 0.1], [0.7, 0.1, 0.1, 0.1]], np.float32)
  swag_path = str(tmp_path / "swag.csv")
  swag.write_submission(swag_path, "swag", probabilities)
  with open(swag_path, encoding="utf-8") as f:
    assert f.read() == ",pred\n0,2\n1,0\n"
  hella_path = str(tmp_path / "hellaswag.csv")
  swag.write_submission(hella_path, "hellaswag", probabilities)
  with open(hella_path, encoding="utf-8") as f:
    assert f.read() == ("annot_id,ending0,ending1,ending2,ending3\n"
                        "test-0,0.1,0.2,0.6,0.1\ntest-1,0.7,0.1,0.1,0.1\n")
