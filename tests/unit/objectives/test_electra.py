"""ELECTRA: the replaced-token-detection objective, its parity with transformers' PyTorch
`ElectraForPreTraining` / `ElectraForMaskedLM`, Google's TF1 names, training and fine-tuning."""

from __future__ import annotations

import functools
import json
import os
import re
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from bert_jax import objectives
from bert_jax.interop import checkpoints
from bert_jax.interop import hf as hf_io
from bert_jax.interop import tf1 as tf1_io
from bert_jax.model import configuration, electra, heads
from bert_jax.runs import finetune_config, pretraining
from bert_jax.tasks.classification import run as classification_run
from bert_jax.text import tokenization
from bert_jax.training import metrics
from bert_jax.training import step as step_lib
from bert_jax.objectives.mlm import masked_lm_loss
from tests import pretrain_helpers as ph


VOCAB, HIDDEN, EMBED, GEN = 97, 48, 24, 32


def _hf_pair(tmp_path, seed=0):
  """Random `ElectraForPreTraining` + `ElectraForMaskedLM` sharing their embedding tables (as
  ELECTRA trains them), saved as the discriminator's directory with `generator/` inside."""
  torch.manual_seed(seed)
  common = dict(vocab_size=VOCAB, embedding_size=EMBED, max_position_embeddings=40,
                type_vocab_size=2, hidden_act="gelu", hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12)
  disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(
      hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
      **common)).eval()
  gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
      hidden_size=GEN, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
      **common)).eval()
  with torch.no_grad():  # nonzero biases and LayerNorms, so a dropped tensor shows
    for p in list(disc.parameters()) + list(gen.parameters()):
      p.add_(0.05 * torch.randn_like(p))
    gen.electra.embeddings.load_state_dict(disc.electra.embeddings.state_dict())
  directory = tmp_path / "electra_hf"
  disc.save_pretrained(directory)
  gen.save_pretrained(directory / "generator")
  return disc, gen, str(directory)


def _inputs(batch=3, length=12, seed=1):
  rng = np.random.RandomState(seed)
  ids = rng.randint(5, VOCAB, (batch, length)).astype(np.int32)
  mask = np.ones((batch, length), np.int32)
  mask[0, 9:] = 0
  segments = (np.arange(length)[None] >= 6).astype(np.int32).repeat(batch, 0)
  return ids, mask, segments


def _apply(config, params, method, *args):
  return np.asarray(electra.ElectraForPreTraining(config).apply(
      {"params": params}, *args, method=getattr(electra.ElectraForPreTraining, method)))


def test_a_lone_generator_directory_is_the_masked_lm_it_is_and_a_lone_discriminator_fine_tunes(
    tmp_path):
  """How ELECTRA's generators are published: an `ElectraForMaskedLM` directory of its own reads
  as that masked LM (fill-mask gives transformers' logits); the discriminator's directory alone
  gives the encoder fine-tuning starts from."""
  from bert_jax.tasks import finetuned  # pylint: disable=g-import-not-at-top
  disc, gen, directory = _hf_pair(tmp_path)
  lone = str(tmp_path / "generator_alone")
  gen.save_pretrained(lone)
  info = finetuned.inspect_checkpoint(lone)
  assert info.mode == "fill_mask"
  config, params = finetuned.load_fill_mask_model(info)
  assert (config.hidden_size, config.num_hidden_layers) == (GEN, 3)
  ids, mask, segments = _inputs()
  positions = np.tile(np.arange(ids.shape[1]), (ids.shape[0], 1)).astype(np.int32)
  ours = np.asarray(heads.BertForMaskedLM(config).apply({"params": params}, ids, mask, segments,
                                                        positions))
  with torch.no_grad():
    theirs = gen(input_ids=torch.tensor(ids).long(), attention_mask=torch.tensor(mask).long(),
                 token_type_ids=torch.tensor(segments).long()).logits.numpy()
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], theirs[real], atol=1e-5)
  # The discriminator alone (no generator/ beside it): its encoder, as fine-tuning reads it.
  alone = str(tmp_path / "discriminator_alone")
  disc.save_pretrained(alone)
  config, encoder, _ = checkpoints.load_encoder(alone)
  assert config.model_type == "electra" and config.hidden_size == HIDDEN
  np.testing.assert_array_equal(
      encoder["embeddings"]["word_embeddings"],
      disc.electra.embeddings.word_embeddings.weight.detach().numpy())


@pytest.mark.slow
def test_hf_electra_pair_loads_with_the_reference_logits_and_losses_and_exports_back(tmp_path):
  disc, gen, directory = _hf_pair(tmp_path)
  config, params, report = hf_io.load_hf_checkpoint(directory)
  assert not report.missing and not report.unexpected, report.summary()
  assert config.model_type == "electra" and config.embedding_size == EMBED
  assert (config.generator_hidden_size, config.generator_num_hidden_layers) == (GEN, 3)
  assert not config.has_pooler and "pooler" not in params["bert"]
  ids, mask, segments = _inputs()
  t = lambda a: torch.tensor(np.asarray(a), dtype=torch.long)

  # The discriminator: one logit per token, and ELECTRA's loss over the real tokens.
  labels = (np.random.RandomState(2).rand(*ids.shape) < 0.3).astype(np.int32)
  with torch.no_grad():
    ref = disc(t(ids), attention_mask=t(mask), token_type_ids=t(segments), labels=t(labels))
  ours = _apply(config, params, "discriminate", ids, mask, segments)
  np.testing.assert_allclose(ours, ref.logits.numpy(), atol=1e-5, rtol=1e-5)
  sums = electra.discriminator_loss(jnp.asarray(ours), labels, mask)
  np.testing.assert_allclose(float(sums["loss_sum"] / sums["weight_sum"]), ref.loss.item(),
                             rtol=1e-5)

  # The generator: masked-LM logits (every position asked for) and its loss on masked slots.
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(np.int32)
  targets = np.where(np.random.RandomState(3).rand(*ids.shape) < 0.2, ids, -100)
  targets[:, 1] = ids[:, 1]
  with torch.no_grad():
    ref = gen(t(ids), attention_mask=t(mask), token_type_ids=t(segments), labels=t(targets))
  ours = _apply(config, params, "generate", ids, mask, segments, positions)
  np.testing.assert_allclose(ours, ref.logits.numpy(), atol=1e-5, rtol=1e-5)
  mlm = masked_lm_loss(jnp.asarray(ours), np.maximum(targets, 0),
                             (targets >= 0).astype(np.float32))
  np.testing.assert_allclose(float(mlm["loss_sum"] / mlm["weight_sum"]), ref.loss.item(),
                             rtol=1e-5)

  # Scanned layers (the TPU default): both encoders stacked, each with its own depth; the same
  # stacked weights run unrolled too (`stack_unrolled`).
  scanned_config, scanned, _ = hf_io.load_hf_checkpoint(directory, scan_layers=True)
  assert scanned["generator"]["encoder"]["layer"]["output"]["dense"]["kernel"].shape[0] == 3
  for stacked_config in (scanned_config, scanned_config.replace(stack_unrolled=True)):
    np.testing.assert_allclose(
        _apply(stacked_config, scanned, "generate", ids, mask, segments, positions), ours,
        atol=1e-5)
    np.testing.assert_allclose(
        _apply(stacked_config, scanned, "discriminate", ids, mask, segments),
        _apply(config, params, "discriminate", ids, mask, segments), atol=1e-5)

  # Exported back: transformers reads both directories, tensor for tensor.
  out = hf_io.save_hf_checkpoint(params, config, str(tmp_path / "exported"))
  again_disc = transformers.ElectraForPreTraining.from_pretrained(out).eval()
  again_gen = transformers.ElectraForMaskedLM.from_pretrained(os.path.join(out, "generator"))
  for before, after in ((disc, again_disc), (gen, again_gen.eval())):
    want, got = before.state_dict(), after.state_dict()
    assert set(want) == set(got)
    for name in want:
      np.testing.assert_array_equal(got[name].numpy(), want[name].numpy(), err_msg=name)


def _original_name(hf_name: str, generator: bool) -> str | None:
  """A Hugging Face ELECTRA tensor's variable in google-research/electra's checkpoints, by
  that code's scopes (`electra/` discriminator, `generator/` generator, shared
  `electra/embeddings`, `dense_1` for the discriminator's output layer, `output_bias`): written
  here from those scopes, independently of the package's name table."""
  name = hf_name
  if generator:
    if name.startswith("electra.embeddings.") or name == "generator_lm_head.weight":
      return None  # the shared tables: stored once, under electra/embeddings
    name = name.replace("electra.", "generator.", 1)
  name = name.replace("generator_lm_head.bias", "generator_predictions.output_bias")
  name = name.replace("dense_prediction", "dense_1")
  name = re.sub(r"layer\.(\d+)\.", r"layer_\1.", name)
  name = re.sub(r"LayerNorm\.weight$", "LayerNorm.gamma", name)
  name = re.sub(r"LayerNorm\.bias$", "LayerNorm.beta", name)
  name = re.sub(r"\.weight$", ".kernel", name) if "embeddings." not in name or "project" in name \
      else re.sub(r"\.weight$", "", name)
  return name.replace(".", "/")


def test_google_tf1_electra_checkpoint_reads_through_the_name_table(tmp_path):
  disc, gen, directory = _hf_pair(tmp_path)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  variables = {}
  for model, is_gen in ((disc, False), (gen, True)):
    for key, value in model.state_dict().items():
      name = _original_name(key, is_gen)
      if name is None or key.endswith(("position_ids", "token_type_ids")):
        continue
      array = value.numpy()
      variables[name] = array.T if name.endswith("kernel") else array
  variables["global_step"] = np.asarray(1000, np.int64)
  variables["generator/encoder/layer_0/output/dense/kernel/adam_m"] = np.zeros((64, GEN),
                                                                               np.float32)
  ckpt_dir = tmp_path / "electra_small"
  ckpt_dir.mkdir()
  prefix = str(ckpt_dir / "electra_small")
  names = sorted(variables)
  tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                    tensors=[tf.constant(variables[n]) for n in names])
  # ELECTRA's releases carry no config: a BERT-style one of the discriminator is enough.
  bert_config = tmp_path / "bert_config.json"
  bert_config.write_text(json.dumps(dict(
      vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=96, hidden_act="gelu", hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0, max_position_embeddings=40, type_vocab_size=2,
      initializer_range=0.02)))
  config, params, report = tf1_io.load_tf1_checkpoint(prefix, str(bert_config))
  assert not report.missing and not report.unexpected, report.summary()
  assert len(report.skipped) == 2
  assert (config.model_type, config.embedding_size, config.generator_hidden_size,
          config.generator_num_hidden_layers, config.generator_intermediate_size) == (
              "electra", EMBED, GEN, 3, 64)
  _, from_hf, _ = hf_io.load_hf_checkpoint(directory)
  jax.tree.map(np.testing.assert_array_equal, params, from_hf)
  # Written back under the same original names and values.
  written = tf1_io.read_tf1_checkpoint(tf1_io.save_tf1_checkpoint(params, config,
                                                                  str(tmp_path / "out")))
  weights = {k: v for k, v in variables.items() if not tf1_io.is_tf1_optimizer_variable(k)}
  assert set(written) == set(weights)
  for name, value in weights.items():
    np.testing.assert_array_equal(written[name], value, err_msg=name)


def test_replacements_labels_and_the_loss_follow_electra():
  ids = jnp.asarray([[2, 7, 103, 9, 103, 3, 0, 0]])
  positions = jnp.asarray([[2, 4, 1, 0]])
  originals = jnp.asarray([[8, 10, 7, 0]])
  weights = jnp.asarray([[1.0, 1.0, 1.0, 0.0]])  # slot 2: a "kept" token; slot 3: padding
  sampled = jnp.asarray([[8, 11, 12, 55]])
  corrupted, labels = electra.replace_masked(ids, positions, originals, weights, sampled)
  # Slot 0 sampled its original (labelled original), slot 1 and 2 were replaced, the padding
  # slot (position 0, [CLS]) left alone.
  assert corrupted.tolist() == [[2, 12, 8, 9, 11, 3, 0, 0]]
  assert labels.tolist() == [[0, 1, 0, 0, 1, 0, 0, 0]]

  objective = objectives.get_objective("electra", max_seq_length=8, max_predictions_per_seq=4)
  rng = np.random.RandomState(0)
  mlm_logits = jnp.asarray(rng.randn(1, 4, 13), jnp.float32)
  disc_logits = jnp.asarray(rng.randn(1, 8), jnp.float32)
  batch = {"input_ids": ids, "input_mask": (ids > 0).astype(jnp.int32),
           "masked_lm_positions": positions, "masked_lm_ids": originals,
           "masked_lm_weights": weights}
  outputs = {"mlm_logits": mlm_logits, "sampled": sampled, "disc_logits": disc_logits,
             "disc_labels": labels}
  loss, sums = objective.loss(outputs, batch, objective.denominators(batch))
  log_probs = jax.nn.log_softmax(mlm_logits)[0]
  mlm = -sum(log_probs[j, int(originals[0, j])] for j in range(3)) / (3 + 1e-5)
  x, y, real = np.asarray(disc_logits[0]), np.asarray(labels[0]), np.arange(8) < 6
  bce = np.log1p(np.exp(-x)) * y + np.log1p(np.exp(x)) * (1 - y)
  np.testing.assert_allclose(float(loss), float(mlm) + 50 * bce[real].mean(), rtol=1e-5)
  summary = objective.summarize(jax.tree.map(float, sums))
  predicted = x > 0
  assert summary["sampled_original"] == pytest.approx(1 / 3)
  assert summary["disc_accuracy"] == pytest.approx(np.mean(predicted[real] == y[real]))
  tp = np.sum(predicted[real] & (y[real] == 1))
  assert summary["disc_recall"] == pytest.approx(tp / 2)
  assert summary["disc_precision"] == pytest.approx(tp / max(predicted[real].sum(), 1e-6))
  assert summary["loss"] == pytest.approx(summary["mlm_loss"] + 50 * summary["disc_loss"])


@pytest.mark.slow
def test_no_gradient_reaches_the_generator_through_the_sample():
  config = configuration.get_preset("electra_test", hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0)
  objective = objectives.get_objective("electra", max_seq_length=16, max_predictions_per_seq=4)
  model = objective.model(config)
  rng = np.random.RandomState(0)
  batch = {"input_ids": rng.randint(5, 512, (2, 16)).astype(np.int32),
           "input_mask": np.ones((2, 16), np.int32), "segment_ids": np.zeros((2, 16), np.int32),
           "masked_lm_positions": np.asarray([[1, 2, 5, 9]] * 2, np.int32),
           "masked_lm_ids": rng.randint(5, 512, (2, 4)).astype(np.int32),
           "masked_lm_weights": np.ones((2, 4), np.float32)}
  params = nn.unbox(model.init(jax.random.PRNGKey(0),
                               *(batch[k] for k in objective.input_names))["params"])

  # Compiled (one program per loss part), not run op by op.
  @functools.partial(jax.jit, static_argnums=1)
  def part(params, which):
    out = step_lib.apply_model(objective, model, params, batch, deterministic=True)
    _, sums = objective.loss(out, batch, objective.denominators(batch))
    return sums[which]

  def largest(tree):
    return [float(np.abs(g).max()) for g in jax.tree.leaves(jax.device_get(tree))]

  grad = jax.jit(jax.grad(part), static_argnums=1)
  disc_grads = grad(params, "disc_loss_sum")
  for scope in ("generator", "generator_predictions"):
    assert all(g == 0.0 for g in largest(disc_grads[scope]))
  assert any(g > 0 for g in largest(disc_grads["bert"]))
  gen_grads = grad(params, "mlm_loss_sum")
  assert all(g == 0.0 for g in largest(gen_grads["discriminator_predictions"]))
  assert any(g > 0 for g in largest(gen_grads["generator"]))
  # Evaluation samples with a fixed key: the same parameters give the same metrics.
  assert float(part(params, "disc_loss_sum")) == float(part(params, "disc_loss_sum"))


@pytest.mark.slow
@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_tiny_electra_run_trains_resumes_and_fine_tunes_from_the_discriminator(
    tmp_path, masking):
  files = ph.write_records(str(tmp_path / "records"), masking=masking)
  files_batch = ph.helpers.random_pretraining_batch(np.random.RandomState(5), 2, ph.SEQ,
                                                    ph.PRED, ph.VOCAB)
  overrides = {"model.preset": "electra_test", "model.vocab_size": ph.VOCAB,
               "train_until_step": 4, "total_steps": 12, "checkpoint_every_steps": 1000}
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                             + [f"w{i}" for i in range(ph.VOCAB - 5)]) + "\n")
  if masking == "dynamic":
    overrides.update({"data.vocab_file": str(vocab), "data.packing": True,
                      "data.max_sequences_per_row": 2})
  workdir = str(tmp_path / "electra")
  first = pretraining.train_and_evaluate(ph.run_config(files, objective="electra", **overrides),
                                         workdir)
  assert first["step"] == 4
  log = os.path.join(workdir, "metrics.jsonl")
  logged = len(metrics.read_jsonl(log))
  overrides["train_until_step"] = 6
  resumed = pretraining.train_and_evaluate(
      ph.run_config(files, objective="electra", **overrides), workdir)
  rows = metrics.read_jsonl(log)
  assert resumed["step"] == 6
  # The second run went on from the first one's checkpoint at step 4.
  assert [r["step"] for r in rows[logged:] if "train/loss" in r] == [6]
  last = [r for r in rows if "train/loss" in r][-1]
  for name in ("mlm_loss", "mlm_accuracy", "disc_loss", "disc_accuracy", "disc_precision",
               "disc_recall", "sampled_original"):
    assert np.isfinite(last[f"train/{name}"]) and np.isfinite(resumed[f"eval/{name}"])
  assert 0.05 < last["train/replaced_share"] < 0.25  # ~15% of tokens masked, most replaced
  assert last["train/loss"] == pytest.approx(last["train/mlm_loss"]
                                             + 50 * last["train/disc_loss"], rel=1e-4)

  # Fine-tuning reads the discriminator: the encoder at `bert`, no generator.
  config, encoder, _ = checkpoints.load_encoder(workdir)
  assert config.model_type == "electra" and config.generator_hidden_size == 32
  trained = checkpoints.load_any(workdir).params
  jax.tree.map(np.testing.assert_array_equal, encoder, trained["bert"])
  exported = hf_io.save_hf_checkpoint(trained, config, str(tmp_path / "hf"))
  assert os.path.exists(os.path.join(exported, "generator", "model.safetensors"))
  transformers.ElectraForPreTraining.from_pretrained(exported)
  # Fill-in-the-[MASK] reads the generator as a plain masked LM: the same logits.
  gen_config, masked_lm = checkpoints.load_masked_lm(workdir)
  assert gen_config.hidden_size == 32 and gen_config.embedding_size == 32
  ids, mask, segments = (np.asarray(files_batch[k][:2]) for k in ("input_ids", "input_mask",
                                                                     "segment_ids"))
  slots = np.asarray(files_batch["masked_lm_positions"][:2])
  np.testing.assert_allclose(
      np.asarray(heads.BertForMaskedLM(gen_config).apply({"params": masked_lm}, ids, mask,
                                                         segments, slots)),
      _apply(config, trained, "generate", ids, mask, segments, slots), atol=1e-5)
  if masking == "dynamic":
    return
  # A GLUE-format task from the workdir, with ELECTRA's layer-wise learning-rate decay; the
  # sentence vector is the [CLS] output (no pooler).
  data = tmp_path / "sst2"
  data.mkdir()
  rows = [("w11 w12 w13 w14", 1), ("w21 w22 w23 w24", 0), ("w15 w12 w16", 1),
          ("w25 w22 w26", 0)] * 2
  for split in ("train", "dev"):
    (data / f"{split}.tsv").write_text(
        "sentence\tlabel\n" + "".join(f"{s}\t{l}\n" for s, l in rows))
  out = classification_run.run(
      finetune_config.make(
          task_name="SST-2", layerwise_lr_decay=0.8, data_dir=str(data),
          output_dir=str(tmp_path / "sst2_out"), init_checkpoint=workdir, bert_config_file=None,
          max_seq_length=16, train_batch_size=8, eval_batch_size=8, learning_rate=1e-3,
          num_train_epochs=30, warmup_proportion=0.1, do_train=True, do_eval=True),
      tokenization.load_tokenizer(vocab_file=str(vocab), do_lower_case=True))
  assert out["dev"]["accuracy"] == 1.0
  finetuned = checkpoints.load_any(str(tmp_path / "sst2_out")).params
  assert "pooler" not in finetuned["bert"] and "generator" not in finetuned


def test_electra_presets_and_recipes_are_the_papers():
  small = configuration.get_preset("electra_small")
  gen = small.generator_config()
  assert (small.hidden_size, small.embedding_size, small.num_attention_heads) == (256, 128, 4)
  assert (gen.hidden_size, gen.num_attention_heads, gen.intermediate_size,
          gen.num_hidden_layers, gen.embedding_width) == (64, 1, 256, 12, 128)
  base, large = configuration.get_preset("electra_base"), configuration.get_preset("electra_large")
  assert base.generator_config().hidden_size == 256 and not base.factorized_embeddings
  assert large.generator_config().hidden_size == 256 and large.num_hidden_layers == 24
  sys.path.insert(0, os.path.join(ph.REPO, "configs"))
  try:
    import pretrain  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.pop(0)
  recipe = {v: pretrain.get_config(v) for v in ("electra_small", "electra_base", "electra_large")}
  assert [(c.global_batch_size, c.optimizer.learning_rate, c.data.max_seq_length,
           c.data.masked_lm_prob, c.data.max_predictions_per_seq, c.total_steps)
          for c in recipe.values()] == [(128, 5e-4, 128, 0.15, 19, 1_000_000),
                                        (256, 2e-4, 512, 0.15, 79, 766_000),
                                        (2048, 2e-4, 512, 0.25, 130, 400_000)]
  objective = pretraining.objective_from(recipe["electra_small"])
  assert objective.disc_weight == 50.0
  # The step's FLOPs count both models: more than the discriminator's masked-LM alone.
  mlm = objectives.get_objective("mlm", max_seq_length=128, max_predictions_per_seq=19)
  assert objective.flops_per_step(small, 128) > mlm.flops_per_step(small, 128)
  with pytest.raises(ValueError, match="electra_small"):
    objective.model(configuration.get_preset("test"))
  with pytest.raises(ValueError, match="generator fields are for model_type='electra'"):
    configuration.get_preset("test", generator_hidden_size=32)
