"""Task data in the official layouts for the downstream tests: CoNLL-2003 (as released:
`-DOCSTART-` lines, four columns, IOB1 tags), SWAG (the swagaf CSV header), SST-2 (GLUE's TSV
files) and SQuAD (the official JSON), small enough to be memorised by a tiny model in a few dozen
epochs, so that a test sees the whole route work."""

from __future__ import annotations

import csv
import io
import json
import os

# Two documents of real-looking news sentences, IOB1 as CoNLL-2003 was released: a chunk starts
# with I- unless it follows a chunk of the same type (then B-: "Rome" after "Paris" below).
CONLL_DOCUMENTS = [
    [
        [("EU", "NNP", "I-NP", "I-ORG"), ("rejects", "VBZ", "I-VP", "O"),
         ("German", "JJ", "I-NP", "I-MISC"), ("call", "NN", "I-NP", "O"),
         ("to", "TO", "I-VP", "O"), ("boycott", "VB", "I-VP", "O"),
         ("British", "JJ", "I-NP", "I-MISC"), ("lamb", "NN", "I-NP", "O"), (".", ".", "O", "O")],
        [("Peter", "NNP", "I-NP", "I-PER"), ("Blackburn", "NNP", "I-NP", "I-PER")],
        [("BRUSSELS", "NNP", "I-NP", "I-LOC"), ("1996-08-22", "CD", "I-NP", "O")],
        [("The", "DT", "I-NP", "O"), ("European", "NNP", "I-NP", "I-ORG"),
         ("Commission", "NNP", "I-NP", "I-ORG"), ("said", "VBD", "I-VP", "O"),
         ("on", "IN", "I-PP", "O"), ("Thursday", "NNP", "I-NP", "O"),
         ("it", "PRP", "B-NP", "O"), ("disagreed", "VBD", "I-VP", "O"),
         ("with", "IN", "I-PP", "O"), ("German", "JJ", "I-NP", "I-MISC"),
         ("advice", "NN", "I-NP", "O"), ("to", "TO", "I-PP", "O"),
         ("consumers", "NNS", "I-NP", "O"), ("to", "TO", "I-VP", "O"),
         ("shun", "VB", "I-VP", "O"), ("British", "JJ", "I-NP", "I-MISC"),
         ("lamb", "NN", "I-NP", "O"), ("until", "IN", "I-SBAR", "O"),
         ("scientists", "NNS", "I-NP", "O"), ("determine", "VBP", "I-VP", "O"),
         ("whether", "IN", "I-SBAR", "O"), ("mad", "JJ", "I-NP", "O"),
         ("cow", "NN", "I-NP", "O"), ("disease", "NN", "I-NP", "O"),
         ("can", "MD", "I-VP", "O"), ("be", "VB", "I-VP", "O"),
         ("transmitted", "VBN", "I-VP", "O"), ("to", "TO", "I-PP", "O"),
         ("sheep", "NN", "I-NP", "O"), (".", ".", "O", "O")],
    ],
    [
        [("Flights", "NNS", "I-NP", "O"), ("from", "IN", "I-PP", "O"),
         ("Paris", "NNP", "I-NP", "I-LOC"), ("Rome", "NNP", "I-NP", "B-LOC"),
         ("and", "CC", "O", "O"), ("Madrid", "NNP", "I-NP", "I-LOC"),
         ("were", "VBD", "I-VP", "O"), ("cancelled", "VBN", "I-VP", "O"), (".", ".", "O", "O")],
        [("Alan", "NNP", "I-NP", "I-PER"), ("Mulally", "NNP", "I-NP", "I-PER"),
         ("of", "IN", "I-PP", "O"), ("Boeing", "NNP", "I-NP", "I-ORG"),
         ("spoke", "VBD", "I-VP", "O"), ("in", "IN", "I-PP", "O"),
         ("New", "NNP", "I-NP", "I-LOC"), ("York", "NNP", "I-NP", "I-LOC"), (".", ".", "O", "O")],
        [("Germany", "NNP", "I-NP", "I-LOC"), ("'s", "POS", "B-NP", "O"),
         ("representative", "NN", "I-NP", "O"), ("to", "TO", "I-PP", "O"),
         ("the", "DT", "I-NP", "O"), ("European", "NNP", "I-NP", "I-ORG"),
         ("Union", "NNP", "I-NP", "I-ORG"), ("'s", "POS", "B-NP", "O"),
         ("veterinary", "JJ", "I-NP", "O"), ("committee", "NN", "I-NP", "O"),
         ("Werner", "NNP", "I-NP", "I-PER"), ("Zwingmann", "NNP", "I-NP", "I-PER"),
         ("said", "VBD", "I-VP", "O"), (".", ".", "O", "O")],
    ],
]


def conll_text(documents=CONLL_DOCUMENTS) -> str:
  """The CoNLL-2003 file layout: a `-DOCSTART-` line and a blank line before each document, a
  blank line after each sentence."""
  lines = []
  for document in documents:
    lines += ["-DOCSTART- -X- -X- O", ""]
    for sentence in document:
      lines += [" ".join(token) for token in sentence] + [""]
  return "\n".join(lines) + "\n"


def conll_dir(path, names=("train.txt", "valid.txt", "test.txt")) -> str:
  """A task directory whose train, dev and test files all hold `CONLL_DOCUMENTS` (a tiny model
  memorises them, so perfect dev and test scores show that the route is right)."""
  os.makedirs(path, exist_ok=True)
  for name in names:
    with open(os.path.join(path, name), "w", encoding="utf-8") as f:
      f.write(conll_text())
  return str(path)


def gold_tags() -> list[list[str]]:
  return [[token[3] for token in sentence] for document in CONLL_DOCUMENTS
          for sentence in document]


# Contexts with four endings each; the right one continues the scene (Shakespeare's lines).
SWAG_EXAMPLES = [
    ("Romeo climbs the orchard wall.", "He",
     ["sees a light break through yonder window.", "eats a bowl of soup.",
      "reads the newspaper.", "starts the car."], 0),
    ("Hamlet holds the skull in his hand.", "He",
     ["orders a pizza.", "speaks to it of poor Yorick.", "plays tennis.", "paints the fence."], 1),
    ("The witches stir the cauldron.", "They",
     ["file their taxes.", "go shopping.", "chant double, double toil and trouble.",
      "drive to work."], 2),
    ("Lear stands on the heath in the storm.", "He",
     ["checks his email.", "mows the lawn.", "buys a ticket.",
      "cries blow, winds, and crack your cheeks."], 3),
    ("Juliet wakes in the tomb beside Romeo.", "She",
     ["takes his dagger.", "bakes a cake.", "calls a taxi.", "waters the plants."], 0),
    ("Macbeth sees a dagger before him.", "He",
     ["brushes his teeth.", "asks whether it is a dagger he sees.", "sings a song.",
      "feeds the cat."], 1),
]


def swag_csv(examples=SWAG_EXAMPLES, labelled: bool = True) -> str:
  """The swagaf `data/*.csv` layout (its header, quoted where needed); test files leave the
  label empty."""
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
                   "ending0", "ending1", "ending2", "ending3", "label"])
  for i, (sent1, sent2, endings, label) in enumerate(examples):
    writer.writerow([i, f"play{i}", i, f"{sent1} {sent2}", sent1, sent2, "gold", *endings,
                     label if labelled else ""])
  return out.getvalue()


def swag_dir(path) -> str:
  """train.csv and val.csv with `SWAG_EXAMPLES` (memorised), test.csv without labels."""
  os.makedirs(path, exist_ok=True)
  for name, labelled in (("train.csv", True), ("val.csv", True), ("test.csv", False)):
    with open(os.path.join(path, name), "w", encoding="utf-8") as f:
      f.write(swag_csv(labelled=labelled))
  return str(path)


# SST-2: sixteen sentences a tiny model memorises (the GLUE tests and the commands that serve
# the fine-tuned model).
POSITIVE = ["a moving and beautiful film", "funny , warm and wise", "a triumph of acting",
            "great fun from start to finish", "a smart and tender story", "simply wonderful",
            "an absolute delight", "brilliant and touching"]
NEGATIVE = ["a dull and lifeless mess", "tedious , boring and long", "a waste of good actors",
            "painfully unfunny", "the plot makes no sense", "flat and forgettable",
            "an ugly , stupid movie", "badly written and worse acted"]


def sst2_dir(path, dev_size=None):
  """An SST-2 directory in the official layout; dev = the training sentences (odd count)."""
  os.makedirs(path, exist_ok=True)
  rows = [(s, 1) for s in POSITIVE] + [(s, 0) for s in NEGATIVE]
  with open(os.path.join(path, "train.tsv"), "w") as f:
    f.write("sentence\tlabel\n" + "".join(f"{s}\t{l}\n" for s, l in rows))
  dev = rows[:dev_size] if dev_size else rows
  with open(os.path.join(path, "dev.tsv"), "w") as f:
    f.write("sentence\tlabel\n" + "".join(f"{s}\t{l}\n" for s, l in dev))
  with open(os.path.join(path, "test.tsv"), "w") as f:
    f.write("index\tsentence\n" + "".join(f"{i}\t{s}\n" for i, (s, _) in enumerate(rows[:5])))
  return str(path)


# Hand-checked: every answer below is the text at its answer_start.
CONTEXT_1 = ("Super Bowl 50 was an American football game to determine the champion of the "
             "National Football League (NFL) for the 2015 season. The American Football "
             "Conference (AFC) champion Denver Broncos defeated the National Football Conference "
             "(NFC) champion Carolina Panthers 24–10 to earn their third Super Bowl title.")
CONTEXT_2 = ("Beyoncé Giselle Knowles-Carter (born September 4, 1981) is an American singer.\u00a0"
             "She rose to fame in the late 1990s as lead singer of Destiny's Child. Café  Zürich\t"
             "serves 東京 tea for $5.99 — cheap!")
OFFICIAL = {
    "version": "1.1",
    "data": [
        {"title": "Super_Bowl_50", "paragraphs": [{"context": CONTEXT_1, "qas": [
            {"id": "q1", "question": "Which NFL team won Super Bowl 50?",
             "answers": [{"text": "Denver Broncos", "answer_start": 177}]},
            {"id": "q2", "question": "What was the final score?",
             "answers": [{"text": "24–10", "answer_start": 267}]},
            {"id": "q3", "question": "Which league's champion did the game determine?",
             "answers": [{"text": "National Football League", "answer_start": 77}]}]}]},
        {"title": "Beyoncé", "paragraphs": [{"context": CONTEXT_2, "qas": [
            {"id": "q4", "question": "When was Beyoncé born?",
             "answers": [{"text": "September 4, 1981", "answer_start": 37}]},
            {"id": "q5", "question": "Which group did she lead?",
             "answers": [{"text": "Destiny's Child", "answer_start": 132}]},
            {"id": "q6", "question": "Where is the café?",
             "answers": [{"text": "Zürich", "answer_start": 155}]},
            {"id": "q7", "question": "What does the tea cost?",
             "answers": [{"text": "$5.99", "answer_start": 180}]}]}]},
    ],
}


def overfit_set():
  """Eight questions on two contexts, one of them unanswerable (SQuAD 2.0)."""
  data = json.loads(json.dumps(OFFICIAL))
  data["version"] = "v2.0"
  data["data"][1]["paragraphs"][0]["qas"].append(
      {"id": "q8", "question": "How many moons does Jupiter have?", "answers": [],
       "is_impossible": True})
  for article in data["data"]:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        qa.setdefault("is_impossible", False)
  return data
