"""Token tagging data (`bert_jax.tasks.tagging.data`): CoNLL files in and out, IOB1/IOB2, and the rows
that label each word on its first piece, with sentence or document context."""

import os
import random
import shutil

import numpy as np
import pytest

from bert_jax.tasks.tagging import data as conll
from bert_jax.text import tokenization
from data_prep import train_tokenizer
from tests import helpers

LABELS = conll.CONLL2003_LABELS

# The first two documents of eng.train in the released layout (IOB1), shortened, and a second
# document where chunks of one type touch: there, and only there, the released files write B-.
RELEASED_LINES = [
    "-DOCSTART- -X- -X- O",       # 1
    "",                           # 2
    "EU NNP B-NP I-ORG",          # 3
    "rejects VBZ B-VP O",         # 4
    "German JJ B-NP I-MISC",      # 5
    "call NN I-NP O",             # 6
    "to TO B-VP O",               # 7
    "boycott VB I-VP O",          # 8
    "British JJ B-NP I-MISC",     # 9
    "lamb NN I-NP O",             # 10
    ". . O O",                    # 11
    "",                           # 12
    "Peter NNP B-NP I-PER",       # 13
    "Blackburn NNP I-NP I-PER",   # 14
    "",                           # 15
    "BRUSSELS NNP B-NP I-LOC",    # 16
    "1996-08-22 CD I-NP O",       # 17
    "",                           # 18
    "",                           # 19
    "",                           # 20
    "-DOCSTART- -X- -X- O",       # 21
    "",                           # 22
    "Japan NNP B-NP I-LOC",       # 23
    "Germany NNP I-NP B-LOC",     # 24
    "and CC O O",                 # 25
    "Spain NNP B-NP I-LOC",       # 26
    "Real NNP B-NP I-ORG",        # 27
    "Madrid NNP I-NP I-ORG",      # 28
    "Barcelona NNP I-NP B-ORG",   # 29
    "signed VBD B-VP O",          # 30 (no newline after it)
]

EXPECTED_IOB2 = [
    ["B-ORG", "O", "B-MISC", "O", "O", "O", "B-MISC", "O", "O"],
    ["B-PER", "I-PER"],
    ["B-LOC", "O"],
    ["B-LOC", "B-LOC", "O", "B-LOC", "B-ORG", "I-ORG", "B-ORG", "O"],
]


def _write(tmp_path, name, content) -> str:
  path = tmp_path / name
  if isinstance(content, str):
    content = content.encode("utf-8")
  path.write_bytes(content)
  return str(path)


@pytest.fixture()
def released_file(tmp_path):
  return _write(tmp_path, "eng.train", "\r\n".join(RELEASED_LINES))


# ---------------------------------------------------------------------------------------------
# Reading


def test_released_layout_reads_sentences_documents_and_converts_iob1_to_iob2(released_file):
  sentences = conll.read_conll(released_file)
  assert [list(s.words) for s in sentences] == [
      ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
      ["Peter", "Blackburn"],
      ["BRUSSELS", "1996-08-22"],
      ["Japan", "Germany", "and", "Spain", "Real", "Madrid", "Barcelona", "signed"]]
  assert [list(s.labels) for s in sentences] == EXPECTED_IOB2
  assert [s.document for s in sentences] == [0, 0, 0, 1]
  assert [s.source for s in sentences] == [f"{released_file}:{n}" for n in (3, 13, 16, 23)]
  assert [list(s.original_labels) for s in sentences] == [
      [line.split()[-1] for line in RELEASED_LINES[a - 1:b]]
      for a, b in ((3, 11), (13, 14), (16, 17), (23, 30))]
  assert conll.detect_scheme(s.original_labels for s in sentences) == "iob1"
  # Any scheme reads the same chunks; naming it changes nothing for a file of that scheme.
  assert conll.read_conll(released_file, scheme="iob1") == sentences


def test_two_column_tab_file_without_docstart_is_one_iob2_document(tmp_path):
  path = _write(tmp_path, "train.txt",
                "\n\nJohn\tB-PER\nSmith\tI-PER\nleft\tO\n\n\n\nParis  B-LOC\n,\tO\n")
  sentences = conll.read_conll(path)
  assert [s.words for s in sentences] == [("John", "Smith", "left"), ("Paris", ",")]
  assert [s.labels for s in sentences] == [("B-PER", "I-PER", "O"), ("B-LOC", "O")]
  assert [s.original_labels for s in sentences] == [s.labels for s in sentences]
  assert [s.document for s in sentences] == [0, 0]
  assert [s.source for s in sentences] == [f"{path}:3", f"{path}:9"]
  assert conll.detect_scheme(s.original_labels for s in sentences) == "iob2"
  assert conll.read_conll(path, scheme="iob2") == sentences


def test_label_column_and_unlabelled_files(tmp_path):
  path = _write(tmp_path, "x.txt", "EU I-ORG NNP\nsaid O VBD\n\n-DOCSTART- -X- -X-\n\nHe O PRP\n")
  sentences = conll.read_conll(path, label_column=1)
  assert [s.labels for s in sentences] == [("B-ORG", "O"), ("O",)]
  assert [s.document for s in sentences] == [0, 1]
  unlabelled = conll.read_conll(_write(tmp_path, "raw.txt", "EU\nsaid\n\nHe\n"), label_column=None)
  assert [(s.words, s.labels, s.original_labels) for s in unlabelled] == [
      (("EU", "said"), None, None), (("He",), None, None)]


def test_tag_conversions_round_trip_and_scheme_detection(released_file):
  for sentence in conll.read_conll(released_file):
    assert conll.to_iob1(conll.to_iob2(sentence.original_labels)) == list(sentence.original_labels)
    assert conll.to_iob1(sentence.labels) == list(sentence.original_labels)
    assert conll.to_iob2(sentence.labels) == list(sentence.labels)
  assert conll.to_iob2(["I-PER", "I-PER", "B-PER", "I-LOC", "O", "I-MISC"]) == [
      "B-PER", "I-PER", "B-PER", "B-LOC", "O", "B-MISC"]
  assert conll.to_iob1(["B-PER", "I-PER", "B-PER", "B-LOC", "O", "B-MISC"]) == [
      "I-PER", "I-PER", "B-PER", "I-LOC", "O", "I-MISC"]
  assert conll.detect_scheme([["B-PER", "I-PER"], ["O", "B-LOC", "B-LOC"]]) == "iob2"
  assert conll.detect_scheme([["B-PER", "I-PER"], ["B-ORG", "I-LOC"]]) == "iob1"
  assert conll.detect_scheme([["O"], ["I-LOC"]]) == "iob1"
  assert conll.detect_scheme([]) == "iob2"
  with pytest.raises(ValueError, match="IOBES"):
    conll.to_iob2(["S-PER"])


@pytest.mark.parametrize("content, line, expected", [
    ("EU B-ORG\nrejects\n", 2, "one column"),
    ("EU\nrejects O\n", 1, "one column"),
    ("EU NNP B-NP I-ORG\nrejects VBZ O\n", 2, "3 columns; expected 4"),
    ("EU NNP B-NP I-ORG\n\nrejects VBZ B-VP O extra\n", 3, "5 columns; expected 4"),
    ("EU O\nsaid X\n", 2, "not O, B-TYPE or I-TYPE"),
    ("EU O\nsaid B-\n", 2, "not O, B-TYPE or I-TYPE"),
    ("EU S-ORG\n", 1, "IOBES"),
    ("EU B-ORG\nsaid E-ORG\n", 2, "convert the file to IOB2"),
    (b"EU B-ORG\n\xff\xfe O\n", 2, "UTF-8"),
])
def test_malformed_files_name_path_and_line(tmp_path, content, line, expected):
  path = _write(tmp_path, "bad.txt", content)
  with pytest.raises(ValueError, match=expected) as error:
    conll.read_conll(path)
  assert f"{path}:{line}:" in str(error.value)


def test_unknown_tags_and_wrong_scheme_name_the_line(tmp_path, released_file):
  path = _write(tmp_path, "x.txt", "EU B-ORG\n\nthe O\nfoo B-FOO\n")
  with pytest.raises(ValueError, match=f"{path}:4: the tag 'B-FOO' is not in the label list; "
                     "known labels: O, B-PER, I-PER"):
    conll.read_conll(path, label_list=LABELS)
  iob1 = _write(tmp_path, "y.txt", "the O\nfoo I-FOO\n")
  with pytest.raises(ValueError, match=r"y.txt:2: the tag 'B-FOO' \(written 'I-FOO'\)"):
    conll.read_conll(iob1, label_list=LABELS)
  with pytest.raises(ValueError, match=f"{released_file}:3: .*looks like IOB1"):
    conll.read_conll(released_file, scheme="iob2")
  with pytest.raises(ValueError, match="no sentences"):
    conll.read_conll(_write(tmp_path, "empty.txt", "-DOCSTART- -X- -X- O\n\n\n"))
  with pytest.raises(ValueError, match="x.txt:1: label_column=3 is out of range: the line has "
                                      "2 columns"):
    conll.read_conll(path, label_column=3)
  with pytest.raises(ValueError, match="scheme"):
    conll.read_conll(path, scheme="bio")


def test_label_list_from():
  assert conll.label_list_from(["O", "B-PER", "I-PER"]) == ("O", "B-PER", "I-PER")
  assert conll.label_list_from("B-X,O") == ("B-X", "O")
  assert conll.label_list_from(["PER", "LOC"]) == ("O", "B-PER", "I-PER", "B-LOC", "I-LOC")
  assert conll.label_list_from("O, PER") == ("O", "B-PER", "I-PER")
  assert conll.label_list_from(["PER", "ORG", "LOC", "MISC"]) == LABELS
  for items, message in ((["B-PER", "I-PER"], "\"O\".*missing"),
                         (["O", "I-PER"], "I-PER without B-PER"),
                         (["O", "B-PER", "LOC"], "mixes"),
                         (["O", "S-PER"], "IOBES"),
                         (["PER", "PER"], "given twice"),
                         ([], "empty"),
                         (["O"], "only")):
    with pytest.raises(ValueError, match=message):
      conll.label_list_from(items)


def test_read_split_finds_released_and_redistributed_names(tmp_path, released_file):
  directory = os.path.dirname(released_file)
  sentences, path = conll.read_split(directory, "train")
  assert path == released_file and len(sentences) == 4
  _write(tmp_path, "valid.txt", "A B-PER\n")
  sentences, path = conll.read_split(directory, "dev", label_list=LABELS)
  assert path.endswith("valid.txt") and sentences[0].labels == ("B-PER",)
  _write(tmp_path, "test.conll", "A I-LOC\n")
  assert conll.read_split(directory, "test")[0][0].labels == ("B-LOC",)
  other = tmp_path / "other"
  other.mkdir()
  with pytest.raises(FileNotFoundError, match="no dev file; looked for eng.testa, valid.txt.*"
                     "dev.txt.*dev.bio"):
    conll.read_split(str(other), "dev")
  with pytest.raises(ValueError, match="split='validation'"):
    conll.read_split(directory, "validation")


def test_split_words():
  assert conll.split_words('(Reuters) - Mr. Smith\'s firm, Acme Corp., said U.S. stocks '
                           'fell 1,000 points... "Bad" day, didn\'t it? e.g. J. Doe.') == [
      "(", "Reuters", ")", "-", "Mr.", "Smith", "'s", "firm", ",", "Acme", "Corp.", ",", "said",
      "U.S.", "stocks", "fell", "1,000", "points", "...", '"', "Bad", '"', "day", ",", "did",
      "n't", "it", "?", "e.g.", "J.", "Doe", "."]
  assert conll.split_words("  ") == []
  # Words already cut stay as they are.
  assert conll.split_words("Germany 's e-mail -- n't") == ["Germany", "'s", "e-mail", "--", "n't"]


# ---------------------------------------------------------------------------------------------
# Rows


def _sentence(words, labels=None, document=0, source="doc.txt:1"):
  return conll.Sentence(tuple(words), tuple(labels) if labels is not None else None, document,
                        source, tuple(labels) if labels is not None else None)


def _tokens(tokenizer, features, row):
  ids = features.arrays["input_ids"][row]
  return tokenizer.convert_ids_to_tokens(ids[features.arrays["input_mask"][row] == 1])


def test_first_piece_of_each_word_carries_its_label(tokenizer):
  sentence = _sentence(["Kournikova", "beat", "Sampras", "at", "Wimbledon", "."],
                       ["B-PER", "O", "B-PER", "O", "B-LOC", "O"])
  features = conll.convert_to_features([sentence], tokenizer, LABELS, 16)
  assert features.arrays["input_ids"].shape == (1, 16)
  assert _tokens(tokenizer, features, 0) == [
      "[CLS]", "ko", "##urn", "##iko", "##va", "beat", "sam", "##pr", "##as", "at", "wimbledon",
      ".", "[SEP]"]
  assert features.word_index[0].tolist() == [-1, 0, -1, -1, -1, 1, 2, -1, -1, 3, 4, 5, -1,
                                             -1, -1, -1]
  b_per, b_loc = LABELS.index("B-PER"), LABELS.index("B-LOC")
  assert features.arrays["label_ids"][0].tolist() == [0, b_per, 0, 0, 0, 0, b_per, 0, 0, 0,
                                                      b_loc, 0, 0, 0, 0, 0]
  assert features.arrays["label_weights"][0].tolist() == [0, 1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0,
                                                          0, 0, 0]
  assert features.arrays["input_mask"][0].tolist() == [1] * 13 + [0] * 3
  assert features.arrays["input_ids"][0, 13:].tolist() == [0, 0, 0]
  assert features.arrays["segment_ids"].tolist() == [[0] * 16]
  assert features.arrays["weight"].tolist() == [1.0]
  assert features.sentence_index.tolist() == [0] and features.num_words == [6]
  assert features.report["windows"] == 1 and features.report["sentences_split"] == 0


def test_long_sentence_is_split_into_windows_of_whole_words_with_context(tokenizer):
  words = ["Kournikova", "beat", "Sampras", "at", "Wimbledon", "on", "Sunday", "."]
  labels = ["B-PER", "O", "B-PER", "O", "B-LOC", "O", "O", "O"]
  # 13 pieces; rows of 10 hold 8: runs of at most 4 pieces, the rest of each row is context.
  features = conll.convert_to_features([_sentence(words, labels)], tokenizer, LABELS, 10)
  assert features.report["sentences_split"] == 1
  rows = [_tokens(tokenizer, features, i) for i in range(len(features.sentence_index))]
  owned = [[int(w) for w in features.word_index[i] if w >= 0] for i in range(len(rows))]
  assert owned == [[0], [1, 2], [3, 4, 5, 6], [7]]
  assert features.sentence_index.tolist() == [0, 0, 0, 0]
  end = ["[CLS]", "sam", "##pr", "##as", "at", "wimbledon", "on", "sunday", ".", "[SEP]"]
  assert rows == [
      ["[CLS]", "ko", "##urn", "##iko", "##va", "beat", "sam", "##pr", "##as", "[SEP]"],
      ["[CLS]", "##iko", "##va", "beat", "sam", "##pr", "##as", "at", "wimbledon", "[SEP]"],
      end, end]
  # Only the owned words' first pieces are scored.
  for i, first_pieces in enumerate([["ko"], ["beat", "sam"], ["at", "wimbledon", "on", "sunday"],
                                    ["."]]):
    scored = features.arrays["label_weights"][i] == 1
    assert tokenizer.convert_ids_to_tokens(features.arrays["input_ids"][i][scored]) == first_pieces
    assert (features.word_index[i] >= 0).tolist() == scored.tolist()
  tags = conll.words_from_predictions(features, features.arrays["label_ids"], LABELS)
  assert tags == [labels]


def test_document_context_comes_from_neighbours_in_the_same_document_only(tokenizer):
  first_doc = [_sentence(["alpha", "beta"], ["O", "O"], 0, "f.txt:3"),
               _sentence(["gamma"], ["B-PER"], 0, "f.txt:6"),
               _sentence(["delta", "epsilon"], ["O", "O"], 0, "f.txt:8")]
  second_doc = [_sentence(["zebra", "lion"], ["O", "O"], 1, "f.txt:13")]
  sentences = first_doc + second_doc
  features = conll.convert_to_features(sentences, tokenizer, LABELS, 7, document_context=True)
  rows = [_tokens(tokenizer, features, i) for i in range(4)]
  assert features.sentence_index.tolist() == [0, 1, 2, 3]
  assert rows == [
      ["[CLS]", "alpha", "beta", "gamma", "delta", "epsilon", "[SEP]"],
      ["[CLS]", "alpha", "beta", "gamma", "delta", "epsilon", "[SEP]"],
      ["[CLS]", "alpha", "beta", "gamma", "delta", "epsilon", "[SEP]"],
      ["[CLS]", "zebra", "lion", "[SEP]"]]
  assert features.word_index[:, :6].tolist() == [
      [-1, 0, 1, -1, -1, -1], [-1, -1, -1, 0, -1, -1], [-1, -1, -1, -1, 0, 1],
      [-1, 0, 1, -1, -1, -1]]
  # Evenly on both sides: the middle sentence of a longer document gets one piece each side.
  features = conll.convert_to_features(sentences, tokenizer, LABELS, 5, document_context=True)
  assert _tokens(tokenizer, features, 1) == ["[CLS]", "beta", "gamma", "delta", "[SEP]"]
  assert _tokens(tokenizer, features, 3) == ["[CLS]", "zebra", "lion", "[SEP]"]
  # Without document context a sentence that fits gets no context at all.
  features = conll.convert_to_features(sentences, tokenizer, LABELS, 7)
  assert [_tokens(tokenizer, features, i) for i in range(4)] == [
      ["[CLS]", "alpha", "beta", "[SEP]"], ["[CLS]", "gamma", "[SEP]"],
      ["[CLS]", "delta", "epsilon", "[SEP]"], ["[CLS]", "zebra", "lion", "[SEP]"]]
  # Sentences of another file with the same document number are another document.
  other = [_sentence(["omega"], ["O"], 0, "g.txt:1")]
  features = conll.convert_to_features(first_doc[:1] + other, tokenizer, LABELS, 7,
                                       document_context=True)
  assert _tokens(tokenizer, features, 0) == ["[CLS]", "alpha", "beta", "[SEP]"]


def test_words_without_pieces_get_unk_and_too_long_words_are_cut(tokenizer):
  sentence = _sentence(["EU", "\u200b", "Kournikova"], ["B-ORG", "O", "B-PER"])
  features = conll.convert_to_features([sentence], tokenizer, LABELS, 5)
  assert features.report["empty_words"] == 1
  assert features.report["words_truncated_pieces"] == 1
  rows = [_tokens(tokenizer, features, i) for i in range(len(features.sentence_index))]
  assert ["[CLS]", "ko", "##urn", "##iko", "[SEP]"] in rows
  unk_row = [r for r in rows if "[UNK]" in r]
  assert unk_row and unk_row[0][1:-1] == ["eu", "[UNK]", "ko"]
  assert conll.words_from_predictions(
      features, features.arrays["label_ids"], LABELS) == [list(sentence.labels)]


def test_bad_feature_settings_are_refused(tokenizer):
  with pytest.raises(ValueError, match="doc.txt:7: the tag 'B-FOO' is not in the label list; "
                     "known labels: O, B-PER"):
    conll.convert_to_features([_sentence(["a", "b"], ["O", "B-FOO"], source="doc.txt:7")],
                              tokenizer, LABELS, 16)
  with pytest.raises(ValueError, match="max_seq_length=2"):
    conll.convert_to_features([_sentence(["a"], ["O"])], tokenizer, LABELS, 2)
  with pytest.raises(ValueError, match="2 words but 1 labels"):
    conll.convert_to_features([conll.Sentence(("a", "b"), ("O",), 0, "x:1")], tokenizer, LABELS,
                              16)


def test_unlabelled_sentences_are_not_scored_but_are_mapped(tokenizer):
  features = conll.convert_to_features([_sentence(["Sampras", "won"])], tokenizer, LABELS, 16)
  assert features.arrays["label_weights"].sum() == 0
  assert features.word_index[0, :5].tolist() == [-1, 0, -1, -1, 1]
  predicted = np.zeros((1, 16), np.int64)
  predicted[0, 1] = LABELS.index("I-PER")  # a chunk begun with I-: read as conlleval reads it
  assert conll.words_from_predictions(features, predicted, LABELS) == [["B-PER", "O"]]
  logits = np.eye(len(LABELS))[predicted]
  assert conll.words_from_predictions(features, logits, LABELS) == [["B-PER", "O"]]


def _random_iob2(rng, n):
  tags, previous = [], None
  for _ in range(n):
    kind = rng.choice(["PER", "ORG", "LOC", "MISC", None, None])
    if kind is None:
      tags.append("O")
    elif kind == previous and rng.random() < 0.7:
      tags.append(f"I-{kind}")
    else:
      tags.append(f"B-{kind}")
    previous = kind
  return tags


WORD_LIST = ["EU", "rejects", "German", "call", "Kournikova", "Sampras", "Aravinda",
             "Muralitharan", "Schwarzenegger", ".", ",", "1996-08-22", "U.S.", "Akram", "the",
             "Wimbledon", "lamb", "\u200b", "1996-08-22-1997-09-23-1998", "naïve", "Zürich"]


def _random_sentences(seed, count):
  rng = random.Random(seed)
  sentences, document = [], 0
  for i in range(count):
    if rng.random() < 0.15:
      document += 1
    n = rng.choice([1, 2, 3, 5, 8, 13, 30])
    words = [rng.choice(WORD_LIST) for _ in range(n)]
    sentences.append(_sentence(words, _random_iob2(rng, n), document, f"r.txt:{i * 40 + 1}"))
  return sentences


def _check_rows(tokenizer, sentences, features, max_seq_length, document_context):
  """Checks every row against the rules, from the words' pieces encoded here one by one."""
  budget = max_seq_length - 2
  pieces = {}
  for word in {w for s in sentences for w in s.words}:
    ids = tokenizer.encode(tokenizer.word_prefix + word) or [tokenizer.unk_id]
    pieces[word] = ids[:budget]
  # Each sentence's stream of context: itself, or its whole document.
  streams, offsets = {}, {}
  for i, sentence in enumerate(sentences):
    key = (sentence.document,) if document_context else (sentence.document, i)
    stream = streams.setdefault(key, [])
    offsets[i] = (key, [])
    for word in sentence.words:
      offsets[i][1].append(len(stream))
      stream.extend(pieces[word])
  owned_count = [np.zeros(len(s.words), int) for s in sentences]
  for row in range(len(features.sentence_index)):
    s = int(features.sentence_index[row])
    key, starts = offsets[s]
    stream = streams[key]
    ids = features.arrays["input_ids"][row]
    length = int(features.arrays["input_mask"][row].sum())
    assert features.arrays["input_mask"][row, :length].all() and not ids[length:].any()
    inputs = ids[:length].tolist()
    assert inputs[0] == tokenizer.cls_id and inputs[-1] == tokenizer.sep_id
    positions = np.nonzero(features.word_index[row] >= 0)[0]
    owned = features.word_index[row, positions]
    assert owned.tolist() == list(range(owned[0], owned[-1] + 1))  # a run of whole words
    owned_count[s][owned] += 1
    first = starts[owned[0]]
    last = first + sum(len(pieces[sentences[s].words[w]]) for w in owned)
    left = positions[0] - 1
    right = length - 2 - left - (last - first)
    assert inputs[1:-1] == stream[first - left:last + right]
    for position, word in zip(positions, owned):
      assert inputs[position] == pieces[sentences[s].words[word]][0]
      assert features.arrays["label_ids"][row, position] == LABELS.index(sentences[s].labels[word])
    # The row is as full as the stream allows, its context as even as the stream allows.
    room = budget - (last - first)
    assert left + right == min(room, first + len(stream) - last)
    assert abs(left - right) <= 1 or left == first or right == len(stream) - last
    scored = features.arrays["label_weights"][row]
    assert scored[positions].tolist() == [1.0] * len(positions) and scored.sum() == len(positions)
  for counts in owned_count:
    assert counts.tolist() == [1] * len(counts)  # every word owned by exactly one row


@pytest.mark.parametrize("max_seq_length", [5, 8, 12, 16, 64])
@pytest.mark.parametrize("document_context", [False, True])
def test_every_word_is_predicted_once_and_perfect_predictions_give_the_gold_tags(
    tokenizer, max_seq_length, document_context):
  sentences = _random_sentences(max_seq_length, 300)
  features = conll.convert_to_features(sentences, tokenizer, LABELS, max_seq_length,
                                       document_context=document_context, progress=False)
  _check_rows(tokenizer, sentences, features, max_seq_length, document_context)
  tags = conll.words_from_predictions(features, features.arrays["label_ids"], LABELS)
  assert tags == [list(s.labels) for s in sentences]
  assert features.report["words"] == sum(len(s.words) for s in sentences)
  assert features.report["empty_words"] == sum(s.words.count("\u200b") for s in sentences)
  if max_seq_length <= 12:
    assert features.report["sentences_split"] > 0 and features.report["words_truncated_pieces"] > 0
  # A corrupted mapping is caught, not silently mis-aligned.
  broken = conll.TaggingFeatures(features.arrays, features.sentence_index,
                                 features.word_index.copy(), features.num_words, features.report)
  row, position = np.argwhere(broken.word_index >= 0)[0]
  broken.word_index[row, position] = -1
  with pytest.raises(AssertionError, match="unpredicted"):
    conll.words_from_predictions(broken, features.arrays["label_ids"], LABELS)


# ---------------------------------------------------------------------------------------------
# Other tokenizers, and the reference implementation of word-split inputs


CORPUS = ("EU rejects German call to boycott British lamb. Peter Blackburn reported from "
          "Brussels on Thursday. The European Commission said on Thursday it disagreed with "
          "German advice to consumers to shun British lamb until scientists determine whether "
          "mad cow disease can be transmitted to sheep.\n") * 20


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  directory = tmp_path_factory.mktemp("tok")
  corpus = directory / "corpus.txt"
  corpus.write_text(CORPUS, encoding="utf-8")
  vocab_file, merges_file = train_tokenizer.train_byte_level_bpe(
      [str(corpus)], str(directory / "rb"), 400)
  spm_model = train_tokenizer.train_sentencepiece([str(corpus)], str(directory / "sp"),
                                                  "unigram", 60)
  return vocab_file, merges_file, spm_model


def test_byte_level_bpe_rows_equal_transformers_word_split_inputs(trained, tmp_path):
  import transformers  # pylint: disable=g-import-not-at-top
  vocab_file, merges_file, _ = trained
  tokenizer = tokenization.load_tokenizer(vocab_file=vocab_file, merges_file=merges_file)
  assert tokenizer.word_prefix == " "
  # Under their released names, as transformers finds them in a model directory.
  shutil.copy(vocab_file, tmp_path / "vocab.json")
  shutil.copy(merges_file, tmp_path / "merges.txt")
  reference = transformers.RobertaTokenizerFast.from_pretrained(str(tmp_path),
                                                                add_prefix_space=True)
  assert len(reference) == tokenizer.vocab_size
  words = ["EU", "rejects", "German", "call", "to", "Schwarzenegger", "lamb", ".", "Zürich"]
  sentence = _sentence(words, ["B-ORG", "O", "B-MISC", "O", "O", "B-PER", "O", "O", "B-LOC"])
  features = conll.convert_to_features([sentence], tokenizer, LABELS, 64)
  encoded = reference(words, is_split_into_words=True)
  length = len(encoded["input_ids"])
  assert features.arrays["input_ids"][0, :length].tolist() == encoded["input_ids"]
  assert features.arrays["input_mask"][0].sum() == length
  first = tokenizer.convert_ids_to_tokens(features.arrays["input_ids"][0, :2])
  assert first[0] == "<s>" and first[1].startswith("Ġ")  # the space a word follows: "ĠE..."
  _check_first_pieces(features, encoded.word_ids())
  assert conll.words_from_predictions(
      features, features.arrays["label_ids"], LABELS) == [list(sentence.labels)]


def _check_first_pieces(features, word_ids):
  first = {}
  for position, word in enumerate(word_ids):
    if word is not None:
      first.setdefault(word, position)
  mapped = {int(w): p for p, w in enumerate(features.word_index[0]) if w >= 0}
  assert mapped == first


def test_wordpiece_rows_equal_transformers_word_split_inputs(tokenizer, tmp_path):
  import transformers  # pylint: disable=g-import-not-at-top
  shutil.copy(os.path.join(helpers.minilm_dir(), "vocab.txt"), tmp_path)
  reference = transformers.BertTokenizerFast.from_pretrained(str(tmp_path))
  assert len(reference) == 30522
  words = ["Kournikova", "beat", "Sampras", "at", "1996-08-22", "in", "Zürich", "U.S.", "(",
           "Muralitharan", ")"]
  features = conll.convert_to_features([_sentence(words, ["O"] * len(words))], tokenizer,
                                       LABELS, 64)
  encoded = reference(words, is_split_into_words=True)
  length = len(encoded["input_ids"])
  assert features.arrays["input_ids"][0, :length].tolist() == encoded["input_ids"]
  assert not features.arrays["input_ids"][0, length:].any()
  _check_first_pieces(features, encoded.word_ids())


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece"])
def test_other_tokenizers_predict_every_word_once(trained, kind):
  vocab_file, merges_file, spm_model = trained
  tokenizer = (tokenization.load_tokenizer(vocab_file=vocab_file, merges_file=merges_file)
               if kind == "bpe" else tokenization.load_tokenizer(spm_model_file=spm_model))
  sentences = _random_sentences(7, 60)
  for document_context in (False, True):
    features = conll.convert_to_features(sentences, tokenizer, LABELS, 12,
                                         document_context=document_context,
                                         max_unknown_rate=1.0)
    _check_rows(tokenizer, sentences, features, 12, document_context)
    assert conll.words_from_predictions(
        features, features.arrays["label_ids"], LABELS) == [list(s.labels) for s in sentences]


def test_a_vocabulary_that_does_not_fit_is_refused(trained):
  _, _, spm_model = trained
  tokenizer = tokenization.load_tokenizer(spm_model_file=spm_model)
  sentences = [_sentence(["日本語のテキスト", "中文"] * 60, ["O"] * 120)]
  with pytest.raises(ValueError, match="are \\[UNK\\]"):
    conll.convert_to_features(sentences, tokenizer, LABELS, 64)


# ---------------------------------------------------------------------------------------------
# Writing predictions


def _read_lines(path):
  with open(path, encoding="utf-8") as f:
    return f.read().split("\n")


def test_predictions_are_written_in_conlleval_layout_and_in_the_files_scheme(
    tokenizer, released_file, tmp_path):
  sentences = conll.read_conll(released_file)
  scheme = conll.detect_scheme(s.original_labels for s in sentences)
  features = conll.convert_to_features(sentences, tokenizer, LABELS, 8, document_context=True)
  predicted = conll.words_from_predictions(features, features.arrays["label_ids"], LABELS)
  assert predicted == EXPECTED_IOB2
  # One mistake: "Germany" tagged as continuing "Japan" (one chunk instead of two).
  predicted[3][1] = "I-LOC"
  out = str(tmp_path / "out" / "predictions.txt")
  conll.write_predictions(out, sentences, predicted, scheme=scheme)
  lines = _read_lines(out)
  assert lines[:13] == [
      "EU I-ORG I-ORG", "rejects O O", "German I-MISC I-MISC", "call O O", "to O O",
      "boycott O O", "British I-MISC I-MISC", "lamb O O", ". O O", "",
      "Peter I-PER I-PER", "Blackburn I-PER I-PER", ""]
  assert lines[13:] == [
      "BRUSSELS I-LOC I-LOC", "1996-08-22 O O", "", "-DOCSTART- O O", "",
      "Japan I-LOC I-LOC", "Germany B-LOC I-LOC", "and O O", "Spain I-LOC I-LOC",
      "Real I-ORG I-ORG", "Madrid I-ORG I-ORG", "Barcelona B-ORG B-ORG", "signed O O", "", ""]
  assert all(len(line.split()) == 3 for line in lines if line)
  # Both columns read back as tags of the same chunks.
  gold = conll.read_conll(out, label_column=1)
  guess = conll.read_conll(out, label_column=2)
  assert [s.labels for s in gold] == [s.labels for s in sentences]
  assert [s.document for s in gold] == [0, 0, 0, 1]
  assert [list(s.labels) for s in guess] == predicted
  # In IOB2 the same prediction is written with B- at every chunk start.
  conll.write_predictions(out, sentences, predicted, scheme="iob2")
  assert _read_lines(out)[18:20] == ["Japan I-LOC B-LOC", "Germany B-LOC I-LOC"]
  assert not [n for n in os.listdir(tmp_path / "out") if n != "predictions.txt"]


def test_unlabelled_sentences_are_written_with_o_as_gold(tmp_path):
  sentences = [_sentence(["Sampras", "won"]), _sentence(["Again"], source="doc.txt:4")]
  out = str(tmp_path / "p.txt")
  conll.write_predictions(out, sentences, [["B-PER", "O"], ["O"]])
  assert _read_lines(out) == ["Sampras O B-PER", "won O O", "", "Again O O", "", ""]
  with pytest.raises(ValueError, match="2 words but 1 predicted"):
    conll.write_predictions(out, sentences, [["O"], ["O"]])
  with pytest.raises(ValueError, match="whitespace"):
    conll.write_predictions(out, [_sentence(["a b"])], [["O"]])


# ---------------------------------------------------------------------------------------------
# tensorflow-datasets


def _prepare_tfds(root, splits):
  """Writes a prepared `conll2003` directory as `tfds build` would leave it: TFRecord shards of
  serialized examples and the dataset's metadata."""
  from bert_jax import file_io  # pylint: disable=g-import-not-at-top
  tf, tfds = file_io.tensorflow(), file_io.tensorflow_datasets()
  builder = tfds.builder("conll2003", data_dir=root)
  features = builder.info.features
  os.makedirs(builder.data_dir)
  for split, examples in splits.items():
    path = os.path.join(builder.data_dir, f"conll2003-{split}.tfrecord-00000-of-00001")
    with tf.io.TFRecordWriter(path) as writer:
      for words, tags in examples:
        writer.write(features.serialize_example({
            "tokens": words, "pos": ["NN"] * len(words), "chunks": ["O"] * len(words),
            "ner": tags}))
  tfds.folder_dataset.write_metadata(data_dir=builder.data_dir, features=features)


def test_read_tfds_from_a_prepared_directory(tmp_path):
  root = str(tmp_path / "tfds")
  _prepare_tfds(root, {
      "train": [(["EU", "rejects", "German", "call"], ["B-ORG", "O", "B-MISC", "O"])],
      "dev": [(["Peter", "Blackburn"], ["B-PER", "I-PER"]),
              (["Zürich", "and", "Bern"], ["B-LOC", "O", "B-LOC"])],
  })
  sentences = conll.read_tfds(root, "dev")
  assert sorted((s.words, s.labels) for s in sentences) == [
      (("Peter", "Blackburn"), ("B-PER", "I-PER")),
      (("Zürich", "and", "Bern"), ("B-LOC", "O", "B-LOC"))]
  assert all(s.original_labels == s.labels for s in sentences)
  assert sorted(s.document for s in sentences) == [0, 1]  # each sentence its own document
  assert conll.read_tfds(root, "validation") == sentences
  assert [s.words for s in conll.read_tfds(root, "train")] == [("EU", "rejects", "German", "call")]
  with pytest.raises(FileNotFoundError, match="tfds build conll2003"):
    conll.read_tfds(str(tmp_path / "nothing"), "train")
  with pytest.raises(ValueError, match="split='eval'"):
    conll.read_tfds(root, "eval")
