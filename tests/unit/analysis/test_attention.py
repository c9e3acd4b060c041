"""Attention maps and per-head statistics (`bert_jax.analysis.attention`, `analyze attention`):
transformers' own attentions on the packaged MiniLM, every kernel the same maps, the statistics
recomputed by hand, the PNGs readable, mistakes one line."""

import json
import os

import numpy as np
import pytest
import torch
import transformers
from jax.experimental.pallas import tpu as pltpu

from bert_jax.analysis import attention
from tests import helpers

TEXTS = ["The cat sat on the mat, and then it slept.", "Where is the station? Go left."]
PAIR = ("A man plays a guitar.", "Someone makes music.")


def test_maps_equal_transformers_attentions_for_texts_and_pairs(minilm):
  config, encoder, tokenizer = minilm
  maps = attention.attention_maps(config, encoder, tokenizer, [*TEXTS, PAIR[0]],
                                  [None, None, PAIR[1]], max_seq_length=32)
  reference = transformers.BertModel.from_pretrained(helpers.minilm_dir(),
                                                     attn_implementation="eager").eval()
  for ids, probs, text_b in zip(maps.ids, maps.probabilities, [None, None, PAIR[1]]):
    segments = np.zeros_like(ids)
    if text_b is not None:  # the pair's second segment starts after the first [SEP]
      segments[np.argmax(ids == tokenizer.sep_id) + 1:] = 1
    with torch.no_grad():
      out = reference(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([segments]),
                      output_attentions=True)
    theirs = np.stack([a[0].numpy() for a in out.attentions])  # (layers, heads, n, n)
    assert probs.shape == theirs.shape == (6, 12, len(ids), len(ids))
    np.testing.assert_allclose(probs, theirs, atol=1e-5)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
  assert maps.tokens[0][0] == "[CLS]" and maps.tokens[0][-1] == "[SEP]"


def test_every_kernel_and_a_block_shared_by_every_layer_give_their_maps(minilm):
  """The maps come from the reference probabilities, not from the kernel the model runs."""
  config, encoder, tokenizer = minilm
  base = attention.attention_maps(config, encoder, tokenizer, TEXTS[:1], max_seq_length=128)
  for implementation in ("xla", "pallas"):  # Pallas's block: rows of 128; off TPU interpreted
    with pltpu.force_tpu_interpret_mode():
      other = attention.attention_maps(config.replace(attention_implementation=implementation),
                                       encoder, tokenizer, TEXTS[:1], max_seq_length=128)
    np.testing.assert_allclose(other.probabilities[0], base.probabilities[0], atol=1e-5)
  # ALBERT-style: one block for every layer, each application's maps in order.
  shared = config.replace(share_parameters="all", num_hidden_layers=3)
  params = {**encoder, "encoder": {"shared_layer": encoder["encoder"]["layer_0"]}}
  maps = attention.attention_maps(shared, params, tokenizer, TEXTS[:1], max_seq_length=24)
  assert maps.probabilities[0].shape[0] == 3
  np.testing.assert_allclose(maps.probabilities[0][0], base.probabilities[0][0], atol=1e-6)
  assert not np.allclose(maps.probabilities[0][1], maps.probabilities[0][0], atol=1e-3)


def test_statistics_equal_a_direct_count_and_files_are_written(minilm, tmp_path):
  config, encoder, tokenizer = minilm
  maps = attention.attention_maps(config, encoder, tokenizer, TEXTS, max_seq_length=32)
  stats = attention.head_statistics(maps, tokenizer)
  # By hand, layer 2 head 5, over both texts' tokens.
  totals = dict.fromkeys(attention.MEASURES, 0.0)
  count = 0
  for tokens, probs in zip(maps.tokens, maps.probabilities):
    p = probs[2, 5]
    for i in range(len(tokens)):
      row = p[i]
      totals["cls"] += sum(row[j] for j, t in enumerate(tokens) if t == "[CLS]")
      totals["sep"] += sum(row[j] for j, t in enumerate(tokens) if t == "[SEP]")
      totals["punctuation"] += sum(row[j] for j, t in enumerate(tokens) if t in ",.?")
      totals["previous"] += row[i - 1] if i > 0 else 0.0
      totals["next"] += row[i + 1] if i + 1 < len(tokens) else 0.0
      totals["entropy"] -= sum(x * np.log(x) for x in row if x > 0)
      count += 1
  for measure in attention.MEASURES:
    assert stats[measure][2, 5] == pytest.approx(totals[measure] / count, abs=1e-6), measure
  assert stats["cls"].shape == (6, 12)
  # Shares lie in [0, 1]; the five targets never add to more than one.
  for measure in attention.MEASURES[:-1]:
    assert (stats[measure] >= 0).all() and (stats[measure] <= 1 + 1e-6).all()

  import matplotlib.image  # pylint: disable=g-import-not-at-top
  paths = attention.plot_example(maps, 1, str(tmp_path))
  paths += attention.write_statistics(stats, str(tmp_path), 2, count)
  assert len(paths) == 6 + 2
  for path in paths:
    if path.endswith(".png"):
      image = matplotlib.image.imread(path)
      assert image.ndim == 3 and image.shape[0] > 100 and image.std() > 0.01, path
  saved = json.load(open(tmp_path / "head_statistics.json"))
  assert saved["tokens"] == count and saved["cls"][2][5] == pytest.approx(stats["cls"][2, 5])


def test_the_command_writes_its_files_and_refuses_mistakes_in_one_line(tmp_path):
  out = tmp_path / "out"
  proc = helpers.run_command("bert_jax.analyze", "attention",
                             f"--checkpoint={helpers.minilm_dir()}", f"--text={TEXTS[0]}",
                             f"--text={PAIR[0]} ||| {PAIR[1]}", f"--output_dir={out}",
                             "--max_seq_length=32", "--plot_examples=0")
  assert proc.returncode == 0, proc.stderr
  assert sorted(os.listdir(out)) == ["head_statistics.json", "head_statistics.png"]
  assert "2 inputs" in proc.stdout and "layer head" in proc.stdout
  for args, message in [
      ((), "error: Give the texts to look at: --text (repeatable) or --input_file."),
      (("--text=a", f"--input_file={tmp_path}/x.txt"),
       "error: Give the texts to look at: --text (repeatable) or --input_file."),
  ]:
    proc = helpers.run_command("bert_jax.analyze", "attention",
                               f"--checkpoint={helpers.minilm_dir()}",
                               f"--output_dir={tmp_path / 'o2'}", *args)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(message), \
        proc.stderr
  proc = helpers.run_command("bert_jax.analyze", "shrink", f"--checkpoint={tmp_path}",
                             f"--output_dir={tmp_path}")
  line = proc.stderr.strip().splitlines()[-1]
  assert proc.returncode == 1 and line.startswith("error: Name one analysis: attention, heads")
  assert "(got shrink)." in line
  proc = helpers.run_command("bert_jax.analyze", "attention", f"--checkpoint={tmp_path}",
                             f"--output_dir={tmp_path}", "--text=a", "--task_name=SST-2")
  assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(
      "error: --task_name is for `analyze heads`, not `analyze attention`.")
