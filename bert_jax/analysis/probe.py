"""What each layer holds about a word's label: linear probes per layer (Tenney et al. 2019,
"What do you learn from context? Probing for sentence structure in contextualized word
representations"; Liu et al. 2019, "Linguistic Knowledge and Transferability of Contextual
Representations").

The encoder is frozen and run once over labelled sentences; every word is represented, at every
layer (layer 0: the embeddings' output, then each transformer layer), by the vector at its FIRST
word piece, as token tagging reads words. One multinomial logistic regression per layer is
trained on those vectors to predict the word's label (a part-of-speech or entity tag read from a
column of a CoNLL-layout file) and scored on held-out words. The probe is linear on purpose: it
shows what a layer makes linearly readable, not what a strong classifier could still dig out of
it.

A probe's accuracy means little alone, so two baselines come with it: the majority baseline
(every word gets the most frequent training label: what knowing nothing gives) and the word-form
baseline (every word gets the label its form most often had in training, the majority label for
forms never seen: what knowing only the word, out of context, gives). A probe must be able to
fail: on labels shuffled across words it should not beat the majority baseline on held-out words.

Training is deterministic and the same for every layer: features standardised with the training
words' mean and deviation per layer (the layers' scales differ by orders of magnitude, and one
learning rate and one L2 weight should suit all of them), zero initial weights (the problem is
convex: where it starts changes only how long it takes), full-batch Adam for a fixed number of
steps with a small L2 penalty. Nothing is tuned on the held-out words. All layers train as one
problem: their losses are summed, and since Adam updates every weight by its own gradient
history, each layer's probe moves exactly as if it were trained alone.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import io
import json
import math
import time
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax import file_io, inference
from bert_jax.model import configuration, modeling
from bert_jax.tasks.tagging import data as tagging_data
from bert_jax.text import features as feature_names
from bert_jax.training import step as step_lib

WORD_POSITIONS = "word_positions"

# The probe's optimiser, the same for every layer and every file (see the module docstring).
STEPS = 250
LEARNING_RATE = 0.02
L2 = 1e-4
DEV_FRACTION = 0.2
# Steps per jitted call: progress is reported between calls.
_STEPS_PER_CALL = 25


@dataclasses.dataclass(frozen=True)
class LabelledSentence:
  """One sentence's words and their labels; `source` is "path:line" of its first word."""
  words: tuple[str, ...]
  labels: tuple[str, ...]
  source: str


# ---------------------------------------------------------------------------------------------
# Reading


def read_labelled_words(path: str, label_column: int = -1) -> list[LabelledSentence]:
  """The sentences of a CoNLL-layout file, each word with the label in `label_column`, read by
  the layout's one reader (`tasks/tagging/data.read_columns`: one word per line, the word
  first, a blank line after each sentence, `-DOCSTART-` lines skipped; `label_column` counted
  from 0 or from the end; errors name "path:line"). A `.conllu` file is read as Universal
  Dependencies' CoNLL-U (the word its FORM; `label_column=3`: UPOS). Any label is accepted
  (part-of-speech tags, chunk tags, entity tags, dependency relations, anything), where the
  tagging task insists on entity tags."""
  if not file_io.exists(path):
    raise FileNotFoundError(f"{path}: no such file.")
  return [LabelledSentence(r.words, r.labels, f"{path}:{r.lines[0]}")
          for r in tagging_data.read_columns(path, label_column,
                                             conllu=tagging_data.is_conllu(path))]


def first_words(sentences: Sequence[LabelledSentence], max_words: int
                ) -> list[LabelledSentence]:
  """The first whole sentences holding at most `max_words` words (at least one sentence): the
  probes keep every word's vector of every layer in memory (layers x hidden x 4 bytes a word,
  40 KB for BERT-base), so a large file is cut, deterministically, rather than exhausting it."""
  kept, total = [], 0
  for sentence in sentences:
    if kept and total + len(sentence.words) > max_words:
      break
    kept.append(sentence)
    total += len(sentence.words)
  return kept


def hold_out(sentences: Sequence[LabelledSentence], fraction: float = DEV_FRACTION,
             seed: int = 0) -> tuple[list[LabelledSentence], list[LabelledSentence]]:
  """(train, held out): `fraction` of the sentences, drawn with `seed`, held out whole (words
  of one sentence never fall on both sides); both keep the file's order."""
  if len(sentences) < 2:
    where = sentences[0].source.rsplit(":", 1)[0] if sentences else "the training file"
    raise ValueError(f"{where}: only {len(sentences)} sentence{'' if sentences else 's'}; "
                     "holding out words for scoring needs at least 2 (or give a dev file).")
  count = min(len(sentences) - 1, max(1, round(fraction * len(sentences))))
  held = set(np.random.default_rng(seed).permutation(len(sentences))[:count].tolist())
  return ([s for i, s in enumerate(sentences) if i not in held],
          [s for i, s in enumerate(sentences) if i in held])


def label_list_of(sentences: Sequence[LabelledSentence], where: str) -> tuple[str, ...]:
  """The training labels, most frequent first (ties by name); at least two, or a probe has
  nothing to tell apart."""
  counts = collections.Counter(label for s in sentences for label in s.labels)
  labels = tuple(sorted(counts, key=lambda label: (-counts[label], label)))
  if len(labels) < 2:
    raise ValueError(f"{where}: every word has the label {labels[0]!r}; a probe needs at least "
                     "2 different labels (is label_column the right column?).")
  return labels


# ---------------------------------------------------------------------------------------------
# Word vectors


class FirstPieceStates(nn.Module):
  """The encoder (no pooler) returning, per row, the hidden states of every layer at the given
  positions: (batch, positions, layers + 1, width). Gathered inside the forward pass so that
  only the words' vectors, not every position's, leave the device. Parameters at `bert/...`.

  ALBERT's embeddings are narrower than its layers; every layer is padded with zeros to the
  widest, which changes no linear probe (weights on a zero feature get no gradient but their L2
  penalty, and stay zero)."""
  config: configuration.BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, word_positions,
               deterministic: bool = True):
    out = modeling.BertModel(self.config, add_pooling_layer=False, collect_hidden_states=True,
                             name="bert")(input_ids, input_mask, segment_ids,
                                          deterministic=deterministic)
    states = out["hidden_states"]
    width = max(h.shape[-1] for h in states)
    index = word_positions[..., None].astype(jnp.int32)
    gathered = [jnp.take_along_axis(h, index, axis=1) for h in states]
    gathered = [jnp.pad(g, ((0, 0), (0, 0), (0, width - g.shape[-1]))) for g in gathered]
    return jnp.stack(gathered, axis=2)


@dataclasses.dataclass
class WordVectors:
  """(layers + 1, words, width) float32, words in file order; and how the rows were built
  (`tagging_data.TaggingFeatures.report`: sentences split into windows, pieces cut, [UNK]s)."""
  vectors: np.ndarray
  report: dict


def word_vectors(config: configuration.BertConfig, encoder_params: Any, tokenizer,
                 sentences: Sequence[LabelledSentence], max_seq_length: int = 128,
                 batch_size: int = 32, desc: str = "words", progress: bool = True
                 ) -> WordVectors:
  """Every word's vector at every layer, read at its first word piece.

  Rows are built as the tagging task builds them (`tagging_data.convert_to_features`): each
  word encoded on its own; a sentence longer than a row is cut into windows of whole words with
  the sentence's other words around them as context, so no word is dropped (a word longer than
  a row keeps its first pieces; the report counts both)."""
  config.check_sequence_length(max_seq_length, "--max_seq_length")
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size} (--batch_size): must be 1 or more.")
  config = config.replace(scan_layers=False)
  tagged = [tagging_data.Sentence(s.words, None, i, s.source) for i, s in enumerate(sentences)]
  feats = tagging_data.convert_to_features(tagged, tokenizer, (), max_seq_length,
                                           progress=progress)
  offsets = np.concatenate([[0], np.cumsum([len(s.words) for s in sentences])]).astype(np.int64)
  num_words = int(offsets[-1])
  owned = feats.word_index >= 0
  per_row = owned.sum(1)
  slots = max(1, int(per_row.max(initial=1)))
  num_rows = len(feats.sentence_index)
  positions = np.zeros((num_rows, slots), np.int32)
  targets = np.full((num_rows, slots), -1, np.int64)
  for row in range(num_rows):
    where = np.flatnonzero(owned[row])
    positions[row, :len(where)] = where
    targets[row, :len(where)] = (offsets[feats.sentence_index[row]]
                                 + feats.word_index[row, where])
  assert np.array_equal(np.sort(targets[targets >= 0]), np.arange(num_words)), "a word not read"

  model = FirstPieceStates(config)
  predictor = inference.Predictor(model, feature_names.ENCODER_INPUTS + (WORD_POSITIONS,))
  params = predictor.place({"bert": {k: v for k, v in encoder_params.items() if k != "pooler"}})
  width = max(config.hidden_size, config.embedding_width)
  vectors = np.zeros((config.num_hidden_layers + 1, num_words, width), np.float32)
  arrays = {**{k: feats.arrays[k] for k in feature_names.ENCODER_INPUTS},
            WORD_POSITIONS: positions}
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  starts = range(0, num_rows, batch_size)
  for start in tqdm(starts, desc=desc, unit="batch", leave=False,
                    disable=not progress or len(starts) < 2 or jax.process_index() != 0):
    rows = {k: v[start:start + batch_size] for k, v in arrays.items()}
    states = np.asarray(predictor(params, rows, batch_size, progress=False))
    batch_targets = targets[start:start + batch_size]
    valid = batch_targets >= 0
    if states.shape[-1] != width:
      raise ValueError(f"the encoder gave vectors of width {states.shape[-1]}; its config says "
                       f"{width}.")
    vectors[:, batch_targets[valid]] = states[valid].transpose(1, 0, 2)
  return WordVectors(vectors, dict(feats.report))


# ---------------------------------------------------------------------------------------------
# Probes


def _probe_loss(params, features, labels, l2):
  """Summed over layers: mean cross-entropy of each layer's probe plus its L2 penalty."""
  logits = jnp.einsum("lnh,lhc->lnc", features, params["kernel"]) + params["bias"][:, None]
  per_word = optax.softmax_cross_entropy_with_integer_labels(
      logits, jnp.broadcast_to(labels, logits.shape[:2]))
  return jnp.sum(per_word.mean(-1) + l2 * jnp.sum(params["kernel"] ** 2, axis=(1, 2)))


@functools.lru_cache(maxsize=None)
def _adam_steps(learning_rate: float):
  """The probes' full-batch Adam steps (`training/step.make_full_batch_steps`), compiled once
  per learning rate and step count however many probes are trained."""
  return step_lib.make_full_batch_steps(_probe_loss, optax.adam(learning_rate))


@dataclasses.dataclass
class Probes:
  """One linear classifier per layer over standardised features: kernel (layers, width,
  labels), bias (layers, labels), and the training words' mean and deviation (layers, width)."""
  kernel: np.ndarray
  bias: np.ndarray
  mean: np.ndarray
  scale: np.ndarray

  def predict(self, vectors: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """(layers, words) label indices."""
    out = []
    for start in range(0, vectors.shape[1], chunk):
      x = (vectors[:, start:start + chunk] - self.mean[:, None]) / self.scale[:, None]
      logits = np.einsum("lnh,lhc->lnc", x, self.kernel) + self.bias[:, None]
      out.append(logits.argmax(-1))
    return np.concatenate(out, axis=1) if out else np.zeros((len(self.kernel), 0), np.int64)


def train_probes(vectors: np.ndarray, labels: np.ndarray, num_labels: int, *,
                 steps: int = STEPS, learning_rate: float = LEARNING_RATE, l2: float = L2,
                 progress: bool = True) -> Probes:
  """One multinomial logistic regression per layer (see the module docstring), all layers at
  once: `vectors` (layers, words, width), `labels` (words,) indices below `num_labels`."""
  if vectors.shape[1] != len(labels):
    raise ValueError(f"{vectors.shape[1]} words' vectors for {len(labels)} labels.")
  if steps < 1:
    raise ValueError(f"steps={steps}: a probe needs at least one training step.")
  mean = vectors.mean(axis=1)
  scale = vectors.std(axis=1)
  scale = np.where(scale > 1e-6, scale, 1.0).astype(np.float32)
  features = jnp.asarray((vectors - mean[:, None]) / scale[:, None], jnp.float32)
  layers, _, width = vectors.shape
  params = {"kernel": jnp.zeros((layers, width, num_labels), jnp.float32),
            "bias": jnp.zeros((layers, num_labels), jnp.float32)}
  opt_state = optax.adam(learning_rate).init(params)
  adam_steps = _adam_steps(learning_rate)
  labels = jnp.asarray(labels, jnp.int32)
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  with tqdm(total=steps, desc="probes", unit="step", leave=False,
            disable=not progress or jax.process_index() != 0) as bar:
    done = 0
    while done < steps:
      count = min(_STEPS_PER_CALL, steps - done)
      params, opt_state = adam_steps(params, opt_state, count, features, labels, l2)
      jax.block_until_ready(params)
      done += count
      bar.update(count)
  params = jax.device_get(params)
  if not all(np.isfinite(v).all() for v in params.values()):
    raise FloatingPointError("a probe's weights are not finite: the features hold NaN or inf.")
  return Probes(np.asarray(params["kernel"]), np.asarray(params["bias"]), mean.astype(np.float32),
                scale)


# ---------------------------------------------------------------------------------------------
# The whole analysis


@dataclasses.dataclass
class ProbeResult:
  """Accuracy per layer (0: the embeddings' output) on held-out and on training words, beside
  the baselines; `details`: counts and settings, written to the JSON as they are."""
  accuracy: list[float]
  train_accuracy: list[float]
  majority_baseline: float
  majority_label: str
  word_baseline: float
  labels: tuple[str, ...]
  details: dict


def baselines(train: Sequence[LabelledSentence], dev: Sequence[LabelledSentence],
              majority_label: str) -> tuple[float, float]:
  """(majority, word form) accuracy on `dev` (see the module docstring)."""
  by_form: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for sentence in train:
    for word, label in zip(sentence.words, sentence.labels):
      by_form[word][label] += 1
  form_label = {w: min(c, key=lambda label: (-c[label], label)) for w, c in by_form.items()}
  gold = [label for s in dev for label in s.labels]
  guessed = [form_label.get(w, majority_label) for s in dev for w in s.words]
  majority = sum(label == majority_label for label in gold) / len(gold)
  word = sum(g == label for g, label in zip(guessed, gold)) / len(gold)
  return majority, word


def probe_layers(config: configuration.BertConfig, encoder_params: Any, tokenizer,
                 train: Sequence[LabelledSentence], dev: Sequence[LabelledSentence], *,
                 train_source: str = "training file", max_seq_length: int = 128,
                 batch_size: int = 32, steps: int = STEPS, learning_rate: float = LEARNING_RATE,
                 l2: float = L2, progress: bool = True) -> ProbeResult:
  """Probes for every layer trained on `train`'s words and scored on `dev`'s."""
  if not dev:
    raise ValueError("no held-out sentences to score the probes on.")
  labels = label_list_of(train, train_source)
  index = {label: i for i, label in enumerate(labels)}
  train_y = np.asarray([index[label] for s in train for label in s.labels], np.int32)
  dev_y = np.asarray([index.get(label, -1) for s in dev for label in s.labels], np.int32)
  started = time.perf_counter()
  train_x = word_vectors(config, encoder_params, tokenizer, train, max_seq_length, batch_size,
                         desc="train words", progress=progress)
  dev_x = word_vectors(config, encoder_params, tokenizer, dev, max_seq_length, batch_size,
                       desc="dev words", progress=progress)
  encoded = time.perf_counter()
  probes = train_probes(train_x.vectors, train_y, len(labels), steps=steps,
                        learning_rate=learning_rate, l2=l2, progress=progress)
  trained = time.perf_counter()
  accuracy = (probes.predict(dev_x.vectors) == dev_y[None]).mean(1)
  train_accuracy = (probes.predict(train_x.vectors) == train_y[None]).mean(1)
  majority, word = baselines(train, dev, labels[0])
  details = {
      "train_sentences": len(train), "train_words": int(len(train_y)),
      "dev_sentences": len(dev), "dev_words": int(len(dev_y)),
      "dev_words_with_unseen_labels": int((dev_y < 0).sum()),
      "sentences_split_into_windows": int(train_x.report["sentences_split"]
                                          + dev_x.report["sentences_split"]),
      "words_with_pieces_cut": int(train_x.report["words_truncated_pieces"]
                                   + dev_x.report["words_truncated_pieces"]),
      "max_seq_length": max_seq_length,
      "probe": {"kind": "multinomial logistic regression on standardised features",
                "optimizer": "adam, full batch", "steps": steps, "learning_rate": learning_rate,
                "l2": l2},
      "seconds": {"encoding": round(encoded - started, 2),
                  "probe_training": round(trained - encoded, 2)},
  }
  return ProbeResult([float(a) for a in accuracy], [float(a) for a in train_accuracy],
                     float(majority), labels[0], float(word), labels, details)


def to_json(result: ProbeResult, **extra) -> dict:
  """What `probe.json` holds: one accuracy per layer (index 0: the embeddings' output)."""
  return {**extra, "layers": list(range(len(result.accuracy))),
          "accuracy": result.accuracy, "train_accuracy": result.train_accuracy,
          "majority_baseline": result.majority_baseline,
          "majority_label": result.majority_label, "word_form_baseline": result.word_baseline,
          "labels": list(result.labels), **result.details}


def results_table(result: ProbeResult) -> str:
  """One line per layer, then the baselines, as people read it."""
  lines = ["         layer  dev accuracy  train accuracy"]
  for layer, (dev, train) in enumerate(zip(result.accuracy, result.train_accuracy)):
    name = "0 (embeddings)" if layer == 0 else str(layer)
    lines.append(f"{name:>14}  {dev:12.4f}  {train:14.4f}")
  lines.append(f"majority baseline ({result.majority_label!r} for every word): "
               f"{result.majority_baseline:.4f}")
  lines.append(f"word-form baseline (each form's most frequent training label): "
               f"{result.word_baseline:.4f}")
  return "\n".join(lines)


def write_results(result: ProbeResult, output_dir: str, title: str = "",
                  **extra) -> list[str]:
  """`probe.json` (`to_json`, with `extra` fields first) and `probe.png` (accuracy against
  layer, the baselines as lines); returns the paths."""
  json_path = file_io.join(output_dir, "probe.json")
  file_io.write_text_atomic(json_path, json.dumps(to_json(result, **extra), indent=1) + "\n")
  plt = _pyplot()
  layers = list(range(len(result.accuracy)))
  fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(layers) + 3.0), 4.0))
  ax.plot(layers, result.accuracy, marker="o", label="probe, held-out words")
  ax.plot(layers, result.train_accuracy, marker=".", linestyle=":", color="tab:blue", alpha=0.6,
          label="probe, training words")
  ax.axhline(result.word_baseline, color="tab:green", linestyle="--",
             label="word-form baseline")
  ax.axhline(result.majority_baseline, color="tab:red", linestyle="--",
             label=f"majority baseline ({result.majority_label})")
  ax.set_xticks(layers)
  ax.set_xticklabels(["emb"] + [str(i) for i in layers[1:]])
  ax.set_xlabel("layer")
  ax.set_ylabel("accuracy")
  low = min(result.majority_baseline, *result.accuracy, *result.train_accuracy)
  ax.set_ylim(max(0.0, math.floor(low * 10) / 10 - 0.05), 1.01)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8, loc="lower right")
  if title:
    ax.set_title(title, fontsize=9)
  fig.tight_layout()
  png_path = file_io.join(output_dir, "probe.png")
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=110)
  plt.close(fig)
  file_io.write_bytes_atomic(png_path, buffer.getvalue())
  return [json_path, png_path]


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt
