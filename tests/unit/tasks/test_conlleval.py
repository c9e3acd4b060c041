"""The CoNLL scorer: entity boundaries on hand-made hard cases, scores against seqeval's default
(conlleval-compatible) mode on those cases and on a few thousand random taggings, the cases where
seqeval and conlleval disagree, the 2004 script's rule table, raw mode, the input file format and
its errors, the printed report and the command line."""

import json
import random
import warnings

import pytest
from seqeval.metrics import classification_report, f1_score, precision_score, recall_score
from seqeval.metrics.sequence_labeling import get_entities

from bert_jax.tasks.tagging import metrics as conlleval
from bert_jax.tasks.tagging.metrics import (chunks, end_of_chunk, evaluate, evaluate_conll_file,
                                      split_tag, start_of_chunk)

TYPES = ("PER", "ORG", "LOC", "MISC")


# -- tags and entity boundaries --------------------------------------------------------------------

@pytest.mark.parametrize("tag, expected", [
    ("B-PER", ("B", "PER")),
    ("I-MISC-X", ("I", "MISC-X")),  # the script splits at the first hyphen only
    ("O", ("O", "")),
    ("PER", ("PER", "")),           # no hyphen: all prefix, no type
    ("-PER", ("", "PER")),
    ("B-", ("B", "")),
    ("B-0", ("B", "")),             # Perl reads the type "0" as false, i.e. as no type
])
def test_split_tag(tag, expected):
  assert split_tag(tag) == expected


# (name, tags of one sentence, its entities written out by hand)
CHUNK_CASES = [
    ("iob1: I I B I is two entities", ["I-PER", "I-PER", "B-PER", "I-PER"],
     [("PER", 0, 1), ("PER", 2, 3)]),
    ("iob2", ["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),
    ("I- after O starts an entity", ["O", "I-ORG", "I-ORG", "O"], [("ORG", 1, 2)]),
    ("I- after B- and O", ["B-PER", "O", "I-PER"], [("PER", 0, 0), ("PER", 2, 2)]),
    ("I-LOC after I-PER: a change of type", ["B-PER", "I-PER", "I-LOC", "I-LOC"],
     [("PER", 0, 1), ("LOC", 2, 3)]),
    ("I- of another type after B-", ["B-PER", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 1)]),
    ("B- after B-", ["B-PER", "B-PER", "B-PER"], [("PER", 0, 0), ("PER", 1, 1), ("PER", 2, 2)]),
    ("B- ends an I- run", ["I-ORG", "I-ORG", "B-ORG"], [("ORG", 0, 1), ("ORG", 2, 2)]),
    ("iobes", ["S-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-ORG", "O"],
     [("PER", 0, 0), ("PER", 1, 1), ("LOC", 2, 4), ("ORG", 5, 5)]),
    ("E- then B- of the same type", ["B-LOC", "E-LOC", "B-LOC", "E-LOC"],
     [("LOC", 0, 1), ("LOC", 2, 3)]),
    ("S- then I-", ["S-PER", "I-PER"], [("PER", 0, 0), ("PER", 1, 1)]),
    ("ioe1: E- ends, I- starts again", ["I-NP", "E-NP", "I-NP", "O"],
     [("NP", 0, 1), ("NP", 2, 2)]),
    ("ioe2", ["I-NP", "E-NP", "E-NP", "O", "E-VP"], [("NP", 0, 1), ("NP", 2, 2), ("VP", 4, 4)]),
    ("bracket tags are one-token entities", ["O", "[-NP", "]-NP", "O"],
     [("NP", 1, 1), ("NP", 2, 2)]),
    ("an entity at the end of the sentence", ["O", "O", "B-MISC", "I-MISC"], [("MISC", 2, 3)]),
    ("a one-token entity at the end", ["O", "I-LOC"], [("LOC", 1, 1)]),
    ("hyphens inside the type", ["B-MISC-X", "I-MISC-X", "I-MISC"],
     [("MISC-X", 0, 1), ("MISC", 2, 2)]),
    ("untyped tags make untyped entities", ["B", "I", "O"], [("", 0, 1)]),
    ("all O", ["O", "O", "O"], []),
    ("empty sentence", [], []),
]


@pytest.mark.parametrize("name, tags, expected", CHUNK_CASES, ids=[c[0] for c in CHUNK_CASES])
def test_chunks_by_hand(name, tags, expected):
  del name
  assert chunks(tags) == expected


def test_chunks_refuses_a_string():
  with pytest.raises(TypeError, match="one sentence as a list"):
    chunks("B-PER")


# The 2004-01-26 script's rules, transcribed pair by pair from its endOfChunk/startOfChunk.
SCRIPT_2004_END = {("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"),
                   ("E", "O")}
SCRIPT_2004_START = {("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"),
                     ("O", "E")}


def script_2004_end(prev_tag, tag, prev_type, type_):
  return ((prev_tag, tag) in SCRIPT_2004_END or prev_tag in ("[", "]")
          or (prev_tag not in ("O", ".") and prev_type != type_))


def script_2004_start(prev_tag, tag, prev_type, type_):
  return ((prev_tag, tag) in SCRIPT_2004_START or tag in ("[", "]")
          or (tag not in ("O", ".") and prev_type != type_))


def test_rules_are_the_2004_scripts_wherever_it_has_rules():
  """The IOBES additions change only pairs with S- and E- followed by B-, which the 2004 script
  never meant to see; everywhere else (IOB1, IOB2, IOE1, IOE2, brackets, '.') it is unchanged."""
  prefixes = ["B", "I", "O", "E", "[", "]", ".", "X"]
  types = ["", "PER", "LOC"]
  for prev_tag in prefixes:
    for tag in prefixes:
      if (prev_tag, tag) == ("E", "B"):
        continue
      for prev_type in types:
        for type_ in types:
          args = (prev_tag, tag, prev_type, type_)
          assert end_of_chunk(*args) == script_2004_end(*args), args
          assert start_of_chunk(*args) == script_2004_start(*args), args
  # Where they differ, the 2004 script reads IOBES wrongly: S-PER S-PER is one entity for it.
  assert not script_2004_end("S", "S", "PER", "PER") and end_of_chunk("S", "S", "PER", "PER")
  assert chunks(["S-PER", "S-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
  assert not script_2004_end("E", "B", "LOC", "LOC") and end_of_chunk("E", "B", "LOC", "LOC")


# -- scores on hand-made cases ---------------------------------------------------------------------

# (name, gold sentences, predicted sentences, (found_gold, found_predicted, correct_chunks,
#  tokens, correct_tokens)) -- every count worked out by hand.
SCORE_CASES = [
    ("identical iob2", [["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "B-LOC"]],
     (2, 2, 2, 4, 4)),
    # Same entities in another scheme: perfect entity scores, half the tags differ.
    ("iob2 gold, iob1 prediction", [["B-PER", "I-PER", "O", "B-LOC"]],
     [["I-PER", "I-PER", "O", "I-LOC"]], (2, 2, 2, 4, 2)),
    ("right span, wrong type", [["B-PER", "I-PER", "O"]], [["B-ORG", "I-ORG", "O"]],
     (1, 1, 0, 3, 1)),
    ("prediction ends early", [["B-LOC", "I-LOC", "I-LOC", "O"]], [["B-LOC", "I-LOC", "O", "O"]],
     (1, 1, 0, 4, 3)),
    ("prediction starts late", [["B-LOC", "I-LOC", "I-LOC", "O"]],
     [["O", "B-LOC", "I-LOC", "O"]], (1, 1, 0, 4, 2)),
    ("prediction runs on", [["B-PER", "O"]], [["B-PER", "I-PER"]], (1, 1, 0, 2, 1)),
    ("prediction splits an entity", [["B-PER", "I-PER", "I-PER"]], [["B-PER", "I-PER", "B-PER"]],
     (1, 2, 0, 3, 2)),
    ("type change inside a predicted entity", [["B-PER", "I-PER"]], [["B-PER", "I-LOC"]],
     (1, 2, 0, 2, 1)),
    ("ill-formed I- after O matches a B-", [["O", "B-ORG", "I-ORG"]], [["O", "I-ORG", "I-ORG"]],
     (1, 1, 1, 3, 2)),
    ("entity at the end of a sentence", [["O", "B-PER", "I-PER"], ["B-LOC"]],
     [["O", "B-PER", "I-PER"], ["B-LOC"]], (2, 2, 2, 4, 4)),
    ("nothing predicted", [["B-PER", "O"], ["B-LOC", "I-LOC"]], [["O", "O"], ["O", "O"]],
     (2, 0, 0, 4, 1)),
    ("no entities at all", [["O", "O"], ["O"]], [["O", "O"], ["O"]], (0, 0, 0, 3, 3)),
    ("only spurious entities", [["O", "O"]], [["B-MISC", "O"]], (0, 1, 0, 2, 1)),
    ("iobes", [["S-PER", "B-LOC", "E-LOC", "O"]], [["S-PER", "B-LOC", "I-LOC", "E-LOC"]],
     (2, 2, 1, 4, 2)),
    ("empty sentences", [[], ["B-PER"], []], [[], ["B-PER"], []], (1, 1, 1, 1, 1)),
]


def seqeval_scores(gold, predicted):
  """seqeval in its default mode, which follows conlleval: micro P/R/F1 and per-type report."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # its "undefined metric" warnings for empty denominators
    return (precision_score(gold, predicted), recall_score(gold, predicted),
            f1_score(gold, predicted),
            classification_report(gold, predicted, output_dict=True, zero_division=0))


def seqeval_entities(tags):
  """seqeval's entity spans of one sentence, without its warnings about unusual tags."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return [tuple(c) for c in get_entities(list(tags))]


def assert_matches_seqeval(scores, gold, predicted):
  precision, recall, f1, report = seqeval_scores(gold, predicted)
  assert scores.precision == pytest.approx(precision, abs=1e-12)
  assert scores.recall == pytest.approx(recall, abs=1e-12)
  assert scores.f1 == pytest.approx(f1, abs=1e-12)
  per_type = {k: v for k, v in report.items() if not k.endswith(" avg")}
  assert set(per_type) == set(scores.per_type)
  for type_, theirs in per_type.items():
    ours = scores.per_type[type_]
    assert ours["precision"] == pytest.approx(theirs["precision"], abs=1e-12), type_
    assert ours["recall"] == pytest.approx(theirs["recall"], abs=1e-12), type_
    assert ours["f1"] == pytest.approx(theirs["f1-score"], abs=1e-12), type_
    assert ours["found_gold"] == theirs["support"], type_


@pytest.mark.parametrize("name, gold, predicted, counts", SCORE_CASES,
                         ids=[c[0] for c in SCORE_CASES])
def test_scores_by_hand_and_against_seqeval(name, gold, predicted, counts):
  del name
  scores = evaluate(gold, predicted)
  found_gold, found_predicted, correct, tokens, correct_tokens = counts
  assert (scores.found_gold, scores.found_predicted, scores.correct_chunks, scores.tokens,
          scores.correct_tokens) == counts
  precision = correct / found_predicted if found_predicted else 0.0
  recall = correct / found_gold if found_gold else 0.0
  assert scores.precision == pytest.approx(precision, abs=1e-15)
  assert scores.recall == pytest.approx(recall, abs=1e-15)
  assert scores.f1 == pytest.approx(
      2 * precision * recall / (precision + recall) if correct else 0.0, abs=1e-15)
  assert scores.accuracy == pytest.approx(correct_tokens / tokens)
  assert_matches_seqeval(scores, gold, predicted)


def test_per_type_counts_by_hand():
  scores = evaluate([["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]],
                    [["B-ORG", "I-ORG", "O", "B-LOC"], ["B-ORG", "O"]])
  assert list(scores.per_type) == ["LOC", "ORG", "PER"]
  assert scores.per_type["LOC"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0,
                                    "found_predicted": 1, "found_gold": 1, "correct": 1}
  assert scores.per_type["ORG"] == {"precision": 0.5, "recall": 1.0, "f1": pytest.approx(2 / 3),
                                    "found_predicted": 2, "found_gold": 1, "correct": 1}
  assert scores.per_type["PER"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0,
                                    "found_predicted": 0, "found_gold": 1, "correct": 0}


# Brackets and untyped tags are outside what seqeval reads as the script does (see
# test_where_seqeval_and_conlleval_disagree).
SEQEVAL_CHUNK_CASES = [c for c in CHUNK_CASES
                       if not any(t.startswith(("[", "]")) or t in ("B", "I") for t in c[1])]


@pytest.mark.parametrize("name, tags, expected", SEQEVAL_CHUNK_CASES,
                         ids=[c[0] for c in SEQEVAL_CHUNK_CASES])
def test_chunk_cases_against_seqeval(name, tags, expected):
  """Each hand-made sentence: seqeval's spans, and scores against itself and two corruptions."""
  del name
  assert seqeval_entities(tags) == expected
  shifted = ["O"] + list(tags[:-1]) if tags else []
  retyped = [t.replace("PER", "ORG") for t in tags]
  for predicted in (list(tags), shifted, retyped):
    assert_matches_seqeval(evaluate([tags], [predicted]), [list(tags)], [predicted])


def test_sentence_boundaries_end_entities():
  gold = [["B-PER", "I-PER"], ["I-PER", "O"]]
  scores = evaluate(gold, gold)
  assert (scores.found_gold, scores.correct_chunks) == (2, 2)
  # The same tags as one sentence hold one entity, so a prediction joined across the boundary
  # is wrong against the two sentences.
  flat = [["B-PER", "I-PER", "I-PER", "O"]]
  assert evaluate(flat, flat).found_gold == 1
  two_sentences_as_one = evaluate([["B-PER", "I-PER", "B-PER", "O"]], flat)
  assert (two_sentences_as_one.found_gold, two_sentences_as_one.correct_chunks) == (2, 0)
  assert_matches_seqeval(scores, gold, gold)


# -- seqeval on random taggings --------------------------------------------------------------------

def random_sentence(rng, style, length):
  """Tags of one sentence: well-formed IOB2 or IOB1, or each tag drawn at random (ill-formed)."""
  if style == "random":
    return [rng.choice(["O"] + [f"{p}-{t}" for p in "BI" for t in TYPES]) for _ in range(length)]
  if style == "iobes":
    return [rng.choice(["O"] + [f"{p}-{t}" for p in "BIES" for t in TYPES])
            for _ in range(length)]
  tags, prev_type = [], None
  while len(tags) < length:
    if rng.random() < 0.5:
      tags.append("O")
      prev_type = None
      continue
    type_ = rng.choice(TYPES)
    size = min(rng.randint(1, 3), length - len(tags))
    first = "B" if style == "iob2" or type_ == prev_type else "I"
    tags += [f"{first}-{type_}"] + [f"I-{type_}"] * (size - 1)
    prev_type = type_
  return tags


def corrupt(rng, tags, rate):
  """A prediction: the gold tags with some replaced at random, some retyped, some I-/B- swapped."""
  out = []
  for tag in tags:
    r = rng.random()
    if r < rate:
      tag = rng.choice(["O"] + [f"{p}-{t}" for p in "BI" for t in TYPES])
    elif r < 1.5 * rate and tag != "O":
      tag = tag[:2] + rng.choice(TYPES)
    elif r < 2 * rate and tag[:2] in ("B-", "I-"):
      tag = ("I-" if tag[0] == "B" else "B-") + tag[2:]
    out.append(tag)
  return out


def test_random_taggings_match_seqeval():
  """~3,600 random sentences in 300 small corpora: IOB2, IOB1, ill-formed IOB and IOBES."""
  rng = random.Random(20031)
  sentences = 0
  for corpus in range(300):
    style = ("iob2", "iob1", "random", "iobes")[corpus % 4]
    gold = [random_sentence(rng, style, rng.randint(0, 14)) for _ in range(rng.randint(1, 20))]
    if style == "iobes":
      predicted = [random_sentence(rng, "iobes", len(g)) if rng.random() < 0.5 else list(g)
                   for g in gold]
    else:
      predicted = [corrupt(rng, g, rate=rng.choice([0.0, 0.05, 0.2, 0.6])) for g in gold]
    sentences += len(gold)
    scores = evaluate(gold, predicted)
    assert_matches_seqeval(scores, gold, predicted)
    # The script's running count equals matching spans, on these tag sets, sentence by sentence.
    for sentence in gold + predicted:
      assert chunks(sentence) == seqeval_entities(sentence)
    gold_spans = {(i,) + c for i, s in enumerate(gold) for c in chunks(s)}
    predicted_spans = {(i,) + c for i, s in enumerate(predicted) for c in chunks(s)}
    assert scores.correct_chunks == len(gold_spans & predicted_spans)
    assert (scores.found_gold, scores.found_predicted) == (len(gold_spans), len(predicted_spans))
    assert scores.tokens == sum(map(len, gold))
    assert scores.correct_tokens == sum(a == b for g, p in zip(gold, predicted)
                                        for a, b in zip(g, p))
  assert sentences > 3000


# -- where seqeval's default mode and conlleval differ ---------------------------------------------

def test_where_seqeval_and_conlleval_disagree():
  """seqeval 1.2.2 is not the script outside {O, B-X, I-X, E-X, S-X}; conlleval's counts here
  are worked out by hand from the script's rules (and seqeval's shown to differ)."""
  # 1. A tag without a hyphen is all prefix for the script and never an entity; seqeval takes
  #    its first letter as the prefix ("PER" -> "P" + type "ER") and finds an entity.
  gold = predicted = [["PER", "O"]]
  scores = evaluate(gold, predicted)
  assert (scores.found_gold, scores.found_predicted, scores.f1) == (0, 0, 0.0)
  assert seqeval_scores(gold, predicted)[2] == 1.0
  # 2. Bracket tags: the script's `[` and `]` are one-token entities, and an I- after `[` of the
  #    same type starts nothing (it is in no entity); seqeval has no bracket rules and reads both
  #    "[-NP ]-NP" and "[-NP I-NP" as one two-token entity, a perfect match.
  gold, predicted = [["[-NP", "]-NP"]], [["[-NP", "I-NP"]]
  assert chunks(gold[0]) == [("NP", 0, 0), ("NP", 1, 1)]
  assert chunks(predicted[0]) == [("NP", 0, 0)]
  scores = evaluate(gold, predicted)
  assert (scores.found_gold, scores.found_predicted, scores.correct_chunks) == (2, 1, 1)
  assert (scores.precision, scores.recall, scores.f1) == (1.0, 0.5, pytest.approx(2 / 3))
  assert seqeval_entities(gold[0]) == [("NP", 0, 1)]
  assert seqeval_scores(gold, predicted)[2] == 1.0
  # 3. A type spelled "0" is no type in the Perl script, so "B-0" and "B-" are the same tag;
  #    seqeval types them "0" and "_" and finds no match.
  gold, predicted = [["B-0", "O"]], [["B-", "O"]]
  scores = evaluate(gold, predicted)
  assert (scores.found_gold, scores.found_predicted, scores.correct_chunks) == (1, 1, 1)
  assert scores.correct_tokens == 2
  assert seqeval_scores(gold, predicted)[2] == 0.0
  # 4. B- after a "." of the same type starts nothing for the script (its pairs list B- after
  #    B-, I-, O, E-, S- only), so B-PER .-PER B-PER is one entity; seqeval starts one at any B-.
  tags = ["B-PER", ".-PER", "B-PER"]
  assert chunks(tags) == [("PER", 0, 2)]
  assert seqeval_entities(tags) == [("PER", 2, 2)]
  scores = evaluate([tags], [["B-PER", "I-PER", "I-PER"]])
  assert (scores.found_gold, scores.found_predicted, scores.correct_chunks) == (1, 1, 1)


# -- raw mode --------------------------------------------------------------------------------------

def test_raw_mode_makes_every_tag_one_entity():
  gold, predicted = [["PER", "O", "LOC", "LOC"]], [["PER", "O", "LOC", "O"]]
  scores = evaluate(gold, predicted, raw=True)
  # LOC LOC is two entities in raw mode (B-LOC B-LOC).
  assert (scores.found_gold, scores.found_predicted, scores.correct_chunks) == (3, 2, 2)
  assert (scores.precision, scores.recall) == (1.0, pytest.approx(2 / 3))
  # Without -r the same tags have no prefixes the rules know, and no entities at all.
  scores = evaluate(gold, predicted)
  assert (scores.found_gold, scores.found_predicted, scores.correct_tokens) == (0, 0, 3)
  # -o names the outside tag of raw input.
  scores = evaluate([["NONE", "PER"]], [["NONE", "PER"]], raw=True, outside_tag="NONE")
  assert (scores.found_gold, scores.correct_chunks, list(scores.per_type)) == (1, 1, ["PER"])


# -- bad arguments ---------------------------------------------------------------------------------

def test_evaluate_names_the_sentence_whose_lengths_differ():
  with pytest.raises(ValueError, match=r"sentence 1 has 2 gold tags but 3 predicted tags"):
    evaluate([["O"], ["B-PER", "O"]], [["O"], ["B-PER", "O", "O"]])
  with pytest.raises(ValueError, match=r"2 gold sentences but 1 predicted"):
    evaluate([["O"], ["O"]], [["O"]])
  with pytest.raises(ValueError, match=r"gold sentence 0 is the string 'B-PER'"):
    evaluate(["B-PER", "O"], ["B-PER", "O"])


# -- the file format -------------------------------------------------------------------------------

CONLL_FILE = """\
-DOCSTART- -X- -X- O O O

EU NNP B-NP B-ORG B-ORG B-ORG
rejects VBZ B-VP O O O
German JJ B-NP B-MISC B-MISC B-MISC
call NN I-NP O O O
. . O O O O

Peter NNP B-NP B-PER B-PER B-PER
Blackburn NNP I-NP I-PER I-PER O

-DOCSTART- -X- -X- O O O

BRUSSELS NNP B-NP B-LOC B-LOC B-ORG
1996-08-22 CD I-NP O O O
"""
CONLL_SENTENCES = (  # the gold (5th) and predicted (6th) columns, by sentence
    [["B-ORG", "O", "B-MISC", "O", "O"], ["B-PER", "I-PER"], ["B-LOC", "O"]],
    [["B-ORG", "O", "B-MISC", "O", "O"], ["B-PER", "O"], ["B-ORG", "O"]],
)


def test_conll_file_with_docstart_and_blank_lines(tmp_path):
  path = tmp_path / "predictions.txt"
  path.write_text(CONLL_FILE, encoding="utf-8")
  scores = evaluate_conll_file(str(path))
  # By hand: gold ORG MISC PER LOC, predicted ORG MISC PER(one token) ORG; 2 correct.
  assert (scores.tokens, scores.found_gold, scores.found_predicted, scores.correct_chunks,
          scores.correct_tokens) == (9, 4, 4, 2, 7)
  assert scores == evaluate(*CONLL_SENTENCES)
  assert evaluate_conll_file(path) == scores  # a pathlib.Path
  assert evaluate_conll_file(CONLL_FILE.splitlines()) == scores
  crlf = tmp_path / "crlf.txt"
  crlf.write_bytes(CONLL_FILE.replace("\n", "\r\n").encode("utf-8"))
  assert evaluate_conll_file(str(crlf)) == scores
  # Tabs separate columns too, and so does a two-column file of bare tags.
  assert evaluate_conll_file(CONLL_FILE.replace(" ", "\t").splitlines()) == scores
  bare = ["" if not l.split() or l.startswith("-DOCSTART-") else " ".join(l.split()[-2:])
          for l in CONLL_FILE.splitlines()]
  assert evaluate_conll_file(bare) == scores
  # The Perl script's own boundary "-X-" in the first column, and the script's reading of
  # -DOCSTART- lines as tokens (two more O/O tokens, both right).
  assert evaluate_conll_file(CONLL_FILE.replace("-DOCSTART-", "-X-").splitlines()) == scores
  as_tokens = evaluate_conll_file(str(path), docstart_is_boundary=False)
  assert (as_tokens.tokens, as_tokens.correct_tokens) == (11, 9)
  assert as_tokens.correct_chunks == scores.correct_chunks


def test_conll_file_errors_name_file_and_line(tmp_path):
  path = tmp_path / "bad.txt"
  path.write_text("EU B-ORG B-ORG\nrejects O O\n\nlonely\n", encoding="utf-8")
  with pytest.raises(ValueError, match=rf"{path}:4: a token line needs at least 2 columns"):
    evaluate_conll_file(str(path))
  path.write_text("-DOCSTART- O\n\nEU NNP B-ORG B-ORG\nrejects O O\n", encoding="utf-8")
  with pytest.raises(ValueError, match=rf"{path}:4: 3 columns, but line 3 has 4"):
    evaluate_conll_file(str(path))
  path.write_bytes(b"EU B-ORG B-ORG\nrejects O \xff\n")
  with pytest.raises(ValueError, match=rf"{path}:2: bytes are not valid UTF-8"):
    evaluate_conll_file(str(path))
  with pytest.raises(ValueError, match=r"<lines>:2: 2 columns, but line 1 has 3"):
    evaluate_conll_file(["a O O", "O O"])


# -- the report ------------------------------------------------------------------------------------

def test_report_layout_by_hand():
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "B-MISC", "I-MISC"]]
  predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O", "B-MISC", "O"]]
  # Tokens 8, right 6 (75%). Gold PER LOC ORG MISC; predicted PER ORG ORG MISC; right PER, ORG.
  # ORG: 1 of 2 predicted right, its 1 gold entity found: 50% / 100% / F1 2*50*100/150 = 66.67.
  expected = (
      "processed 8 tokens with 4 phrases; found: 4 phrases; correct: 2.\n"
      "accuracy:  75.00%; precision:  50.00%; recall:  50.00%; FB1:  50.00\n"
      "              LOC: precision:   0.00%; recall:   0.00%; FB1:   0.00  0\n"
      "             MISC: precision:   0.00%; recall:   0.00%; FB1:   0.00  1\n"
      "              ORG: precision:  50.00%; recall: 100.00%; FB1:  66.67  2\n"
      "              PER: precision: 100.00%; recall: 100.00%; FB1: 100.00  1\n")
  scores = evaluate(gold, predicted)
  assert scores.report() == expected
  assert scores.accuracy == 0.75 and scores.f1 == 0.5
  assert json.loads(json.dumps(scores.as_dict())) == scores.as_dict()
  assert scores.as_dict()["per_type"]["ORG"]["found_predicted"] == 2


def test_report_without_tokens_and_with_untyped_entities():
  # No tokens: the script prints its first line only.
  assert evaluate([], []).report() == (
      "processed 0 tokens with 0 phrases; found: 0 phrases; correct: 0.\n")
  # Untyped entities found in gold and prediction: the script's duplicate filter keeps the empty
  # name twice (it is false in Perl), so its line is printed twice.
  assert evaluate([["B", "O"]], [["B", "O"]]).report() == (
      "processed 2 tokens with 1 phrases; found: 1 phrases; correct: 1.\n"
      "accuracy: 100.00%; precision: 100.00%; recall: 100.00%; FB1: 100.00\n"
      "                 : precision: 100.00%; recall: 100.00%; FB1: 100.00  1\n"
      "                 : precision: 100.00%; recall: 100.00%; FB1: 100.00  1\n")


def test_command_line(tmp_path, capsys):
  path = tmp_path / "predictions.txt"
  path.write_text(CONLL_FILE, encoding="utf-8")
  assert conlleval.main([str(path)]) == 0
  assert capsys.readouterr().out == evaluate(*CONLL_SENTENCES).report()
  assert conlleval.main([str(path), "--json"]) == 0
  assert json.loads(capsys.readouterr().out)["correct_chunks"] == 2
  path.write_text("word B-PER\nlonely\n", encoding="utf-8")
  assert conlleval.main([str(path)]) == 1
  assert f"{path}:2:" in capsys.readouterr().err
