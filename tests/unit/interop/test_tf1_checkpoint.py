"""Google's original TF1 checkpoints: import against transformers' PyTorch BERT, export back.

No released checkpoint can be fetched here, so each test writes one the way the original code
did (TF1 graph variables saved by `tf.compat.v1.train.Saver`), from the reference model's
PyTorch tensors. The names and layouts come from this file's own rules, not from `convert`'s
table, and the checkpoint carries the optimizer variables (`adam_m`, `adam_v`, `global_step`)
that the released ones do.
"""

import json
import os
import re
import shutil

import jax
import numpy as np
import pytest
import tensorflow as tf
import transformers

from bert_jax.interop import convert
from bert_jax.interop import checkpoints
from bert_jax.interop import hf as hf_io
from bert_jax.interop import names as name_tables
from bert_jax.interop import tf1
from bert_jax.runs import pretraining
from bert_jax.model import heads, modeling
from bert_jax.training import checkpointing, init_order
from tests import helpers
from tests import pretrain_helpers as ph
from tests.unit.interop.reference import PAIRS, SENTENCES, TOL, _encode, _reference

# Fields of the original bert_config.json.
ORIGINAL_CONFIG_FIELDS = ("attention_probs_dropout_prob", "hidden_act", "hidden_dropout_prob",
                          "hidden_size", "initializer_range", "intermediate_size",
                          "max_position_embeddings", "num_attention_heads", "num_hidden_layers",
                          "type_vocab_size", "vocab_size")


# ------------------------------------------------------------ a checkpoint as Google wrote it
def tf1_name(torch_name: str) -> tuple[str, bool] | None:
  """`(TF1 variable name, transpose?)` of a PyTorch BERT tensor, by the release's naming; None
  for tensors the release does not store (a buffer and the decoder tied to the embeddings)."""
  if torch_name.endswith("position_ids") or torch_name.startswith("cls.predictions.decoder."):
    return None
  special = {"cls.predictions.bias": "cls/predictions/output_bias",
             # Stored (2, hidden) in TF1 — the layout of a PyTorch Linear weight, not a kernel.
             "cls.seq_relationship.weight": "cls/seq_relationship/output_weights",
             "cls.seq_relationship.bias": "cls/seq_relationship/output_bias"}
  if torch_name in special:
    return special[torch_name], False
  name = torch_name if torch_name.startswith(("bert.", "cls.")) else "bert." + torch_name
  name = re.sub(r"\.layer\.(\d+)\.", r".layer_\1.", name).replace(".", "/")
  if "/LayerNorm/" in name:
    return name.replace("/weight", "/gamma").replace("/bias", "/beta"), False
  if name.endswith("_embeddings/weight"):
    return name[:-len("/weight")], False
  if name.endswith("/weight"):  # tf.layers.dense kernels are (in, out)
    return name[:-len("weight")] + "kernel", True
  return name, False


def tf1_variables(torch_model) -> dict[str, np.ndarray]:
  out = {}
  for key, tensor in torch_model.state_dict().items():
    mapped = tf1_name(key)
    if mapped is not None:
      value = tensor.detach().numpy().astype(np.float32)
      out[mapped[0]] = np.ascontiguousarray(value.T) if mapped[1] else value
  return out


def write_tf1(prefix: str, variables: dict[str, np.ndarray], slots_for=(), extra=None) -> str:
  """Saves `variables` like the original run_pretraining.py: graph variables and a Saver, with
  AdamWeightDecay's `{name}/adam_m`, `{name}/adam_v` for `slots_for` and a `global_step`.
  `extra` variables (e.g. a fine-tuned classifier) are saved as well."""
  rng = np.random.RandomState(7)
  values = dict(variables)
  for name in slots_for:
    for slot in ("adam_m", "adam_v"):
      values[f"{name}/{slot}"] = rng.normal(size=variables[name].shape).astype(np.float32)
  values.update(extra or {})
  graph = tf.Graph()
  with graph.as_default():
    assigns, feeds = [], {}
    for name, value in values.items():
      var = tf.compat.v1.get_variable(name, shape=value.shape, dtype=tf.as_dtype(value.dtype),
                                      initializer=tf.compat.v1.zeros_initializer())
      placeholder = tf.compat.v1.placeholder(var.dtype.base_dtype, value.shape)
      assigns.append(var.assign(placeholder))
      feeds[placeholder] = value
    step = tf.compat.v1.train.get_or_create_global_step()
    assigns.append(step.assign(100000))
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session(graph=graph) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(assigns, feeds)
      saver.save(sess, prefix, write_meta_graph=False, write_state=False)
  return prefix


def write_original_config(directory: str, hf_config, **changes) -> None:
  values = {k: getattr(hf_config, k) for k in ORIGINAL_CONFIG_FIELDS}
  values.update(changes)
  with open(os.path.join(directory, "bert_config.json"), "w") as f:
    json.dump(values, f, indent=2)


def stored(prefix: str) -> dict[str, np.ndarray]:
  reader = tf.train.load_checkpoint(prefix)
  return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def is_slot(name: str) -> bool:
  return name == "global_step" or name.endswith(("/adam_m", "/adam_v"))


# A run_classifier.py fine-tuning head: nothing here reads it, so it must be reported.
CLASSIFIER = {"output_weights": np.full((2, 384), 0.5, np.float32),
              "output_bias": np.zeros(2, np.float32)}


@pytest.fixture(scope="module")
def minilm_tf1(minilm, tmp_path_factory):
  """MiniLM as an `uncased_L-6_H-384_A-12/` release directory."""
  path, _, torch_model, _, _, _ = minilm
  directory = str(tmp_path_factory.mktemp("uncased_L-6_H-384_A-12"))
  variables = tf1_variables(torch_model)
  # Moments for a few variables keep the file small; the release has them for all.
  slots = ["bert/embeddings/LayerNorm/gamma", "bert/encoder/layer_0/attention/self/query/kernel",
           "bert/pooler/dense/bias"]
  write_tf1(os.path.join(directory, "bert_model.ckpt"), variables, slots, CLASSIFIER)
  write_original_config(directory, torch_model.config)
  shutil.copy(os.path.join(path, "vocab.txt"), directory)
  return directory, variables, slots


@pytest.fixture(scope="module")
def pretraining_tf1(random_pretraining_checkpoint, tmp_path_factory):
  """The random `BertForPreTraining` (MLM + NSP heads) as a release directory, moments for
  every variable as run_pretraining.py leaves them."""
  _, torch_model = random_pretraining_checkpoint
  directory = str(tmp_path_factory.mktemp("tf1_pretraining"))
  variables = tf1_variables(torch_model)
  prefix = write_tf1(os.path.join(directory, "bert_model.ckpt"), variables, list(variables))
  write_original_config(directory, torch_model.config)
  with open(os.path.join(directory, "vocab.txt"), "w") as f:
    f.write("".join(f"tok{i}\n" for i in range(torch_model.config.vocab_size)))
  return directory, prefix, variables, torch_model


# ------------------------------------------------------------------------------ import
@pytest.mark.slow
def test_minilm_encoder_from_tf1_matches_reference(minilm, minilm_tf1):
  _, tokenizer, torch_model, _, _, _ = minilm
  directory, variables, slots = minilm_tf1
  prefix = os.path.join(directory, "bert_model.ckpt")
  config, encoder, origin = checkpoints.load_encoder(prefix)
  assert origin.startswith(f"TF1 checkpoint {prefix}") and "output_weights" in origin
  assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (6, 384, 30522)
  # The directory names the same checkpoint.
  _, from_dir, _ = checkpoints.load_encoder(directory)
  for a, b in zip(jax.tree.leaves(from_dir), jax.tree.leaves(encoder)):
    np.testing.assert_array_equal(a, b)

  pairs = tokenizer([a for a, _ in PAIRS], [b for _, b in PAIRS], padding=True,
                    return_tensors="np")
  assert pairs["token_type_ids"].max() == 1  # the second segment's embedding is exercised
  for ids, mask, types in (_encode(tokenizer, SENTENCES), (
      pairs["input_ids"], pairs["attention_mask"], pairs["token_type_ids"])):
    ref = _reference(torch_model, {"input_ids": ids, "input_mask": mask, "segment_ids": types})
    ours = modeling.BertModel(config).apply({"params": encoder}, ids, mask, types)
    real = mask.astype(bool)
    seq = np.abs(np.asarray(ours["sequence_output"]) - ref.last_hidden_state.numpy())[real]
    pooled = np.abs(np.asarray(ours["pooled_output"]) - ref.pooler_output.numpy())
    assert seq.max() <= TOL and pooled.max() <= TOL, (seq.max(), pooled.max())
    assert np.abs(ref.last_hidden_state.numpy()).max() > 0.1

  # Every stored variable is accounted for: weights used, moments skipped, classifier reported.
  _, _, report = tf1.load_tf1_checkpoint(directory)
  assert report.unexpected == ["output_bias", "output_weights"]
  assert sorted(report.skipped) == sorted(
      ["global_step"] + [f"{s}/{m}" for s in slots for m in ("adam_m", "adam_v")])
  assert sorted(report.missing) == sorted(r[0] for r in name_tables.PRETRAINING_HEAD_ROWS)
  assert "7 optimizer variables skipped" in report.summary()
  assert sorted(tf1.read_tf1_checkpoint(prefix)) == sorted([*variables, *CLASSIFIER])
  assert len(tf1.read_tf1_checkpoint(prefix, include_optimizer_variables=True)) == (
      len(variables) + len(CLASSIFIER) + 7)

  # An encoder without heads is not a pre-training model.
  with pytest.raises(ValueError, match=r"no pre-training heads \(cls/\*"):
    checkpoints.load_pretraining_model(prefix)


@pytest.mark.slow
def test_pretraining_heads_from_tf1_match_reference(pretraining_tf1):
  directory, prefix, variables, torch_model = pretraining_tf1
  config, params, report = tf1.load_tf1_checkpoint(prefix)
  assert report.missing == [] and report.unexpected == []
  assert len(report.skipped) == 2 * len(variables) + 1
  config_dir, params_dir = checkpoints.load_pretraining_model(directory)
  assert config_dir == config
  for a, b in zip(jax.tree.leaves(params_dir), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)

  batch = helpers.random_pretraining_batch(np.random.RandomState(0), batch=4, length=32,
                                           max_predictions=6, vocab_size=config.vocab_size)
  ref = _reference(torch_model, batch)
  ref_mlm = np.take_along_axis(ref.prediction_logits.numpy(),
                               batch["masked_lm_positions"][..., None], axis=1)
  mlm, nsp = heads.BertForPreTraining(config).apply(
      {"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
      batch["masked_lm_positions"])
  mlm_diff = np.abs(np.asarray(mlm) - ref_mlm).max()
  nsp_diff = np.abs(np.asarray(nsp) - ref.seq_relationship_logits.numpy()).max()
  print(f"\nTF1 heads: max|Δ| mlm {mlm_diff:.2e} nsp {nsp_diff:.2e}")
  assert mlm_diff <= TOL and nsp_diff <= TOL
  assert np.abs(ref.seq_relationship_logits.numpy()).max() > 0.05

  # The scanned layout loads the same values.
  _, scanned, _ = tf1.load_tf1_checkpoint(prefix, scan_layers=True)
  assert scanned["bert"]["encoder"]["layer"]["output"]["dense"]["kernel"].shape == (3, 128, 64)
  np.testing.assert_array_equal(
      modeling.unstack_layers(scanned, 3)["bert"]["encoder"]["layer_2"]["output"]["dense"]["bias"],
      variables["bert/encoder/layer_2/output/dense/bias"])


# ------------------------------------------------------------------------------ export
def test_export_equals_the_original_checkpoint(pretraining_tf1, tmp_path):
  directory, prefix, variables, _ = pretraining_tf1
  config, params, _ = tf1.load_tf1_checkpoint(prefix)
  scan_config, scanned, _ = tf1.load_tf1_checkpoint(prefix, scan_layers=True)
  original = {k: v for k, v in stored(prefix).items() if not is_slot(k)}
  assert original.keys() == variables.keys()
  for name, (tree, cfg) in {"unrolled": (params, config), "scanned": (scanned, scan_config)
                            }.items():
    out = tf1.save_tf1_checkpoint(params=tree, config=cfg, path=str(tmp_path / name))
    assert out == str(tmp_path / name / "bert_model.ckpt")
    exported = stored(out)
    assert sorted(exported) == sorted(original), name
    for key, value in original.items():
      assert exported[key].dtype == np.float32 and exported[key].shape == value.shape, key
      np.testing.assert_array_equal(exported[key], value, err_msg=f"{name}: {key}")
    written = json.loads((tmp_path / name / "bert_config.json").read_text())
    assert written == json.loads(open(os.path.join(directory, "bert_config.json")).read())

  # What the original code does with --init_checkpoint: variables built by name and shape, then
  # tf.train.init_from_checkpoint, which refuses any name or shape it cannot match.
  graph = tf.Graph()
  with graph.as_default():
    built = {n: tf.compat.v1.get_variable(n, shape=v.shape, dtype=tf.float32)
             for n, v in original.items()}
    tf.compat.v1.train.init_from_checkpoint(str(tmp_path / "unrolled" / "bert_model.ckpt"),
                                            {n: n for n in built})
    with tf.compat.v1.Session(graph=graph) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      got = sess.run(built)
  for name, value in original.items():
    np.testing.assert_array_equal(got[name], value)

  # An explicit prefix is written as given; unknown parameters are refused, not dropped.
  assert tf1.save_tf1_checkpoint(params, config, str(tmp_path / "x" / "model.ckpt-7")) == str(
      tmp_path / "x" / "model.ckpt-7")
  assert (tmp_path / "x" / "model.ckpt-7.index").exists()
  with pytest.raises(ValueError, match="No TF1 name for parameters: extra/kernel"):
    tf1.save_tf1_checkpoint({**params, "extra": {"kernel": np.zeros(2)}}, config,
                                str(tmp_path / "y"))


@pytest.mark.slow
@pytest.mark.e2e
def test_command_line_conversions(pretraining_tf1, tmp_path, capsys):
  directory, prefix, variables, torch_model = pretraining_tf1
  convert.convert(prefix, str(tmp_path / "hf"), "hf")
  out = capsys.readouterr().out
  assert f"{2 * len(variables) + 1} optimizer variables skipped" in out, out
  # This vocabulary has no special tokens: the weights leave, without tokenizer files, said.
  assert "no tokenizer_config.json: " in out and "lacks the special token(s)" in out, out
  assert not (tmp_path / "hf" / "tokenizer_config.json").exists()
  reloaded = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "hf"))
  ref_state = torch_model.state_dict()
  for key, value in reloaded.state_dict().items():
    np.testing.assert_array_equal(value.numpy(), ref_state[key].numpy(), err_msg=key)
  assert (tmp_path / "hf" / "vocab.txt").read_text() == open(
      os.path.join(directory, "vocab.txt")).read()

  convert.convert(str(tmp_path / "hf"), str(tmp_path / "tf1"), "tf1")
  back = stored(str(tmp_path / "tf1" / "bert_model.ckpt"))
  assert sorted(back) == sorted(variables)
  for key, value in variables.items():
    np.testing.assert_array_equal(back[key], value, err_msg=key)

  # The command itself (absl flags), as users type it.
  proc = helpers.run_command("bert_jax.convert", f"--from={directory}",
                             f"--to={tmp_path / 'workdir'}", "--format=orbax")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"wrote orbax: {tmp_path / 'workdir'}" in proc.stdout
  assert checkpoints.checkpoint_kind(str(tmp_path / "workdir"))[0] == "orbax"
  config, params = checkpoints.load_pretraining_model(str(tmp_path / "workdir"))
  np.testing.assert_array_equal(params["cls"]["seq_relationship"]["kernel"],
                                variables["cls/seq_relationship/output_weights"].T)
  _, encoder, origin = checkpoints.load_encoder(str(tmp_path / "workdir"))
  np.testing.assert_array_equal(encoder["embeddings"]["word_embeddings"],
                                variables["bert/embeddings/word_embeddings"])


# ------------------------------------------------------------------------------ errors
def test_shape_mismatches_are_listed_together(pretraining_tf1, tmp_path):
  _, _, variables, torch_model = pretraining_tf1
  bad = dict(variables)
  bad["cls/seq_relationship/output_weights"] = np.zeros((3, 64), np.float32)
  directory = str(tmp_path / "bad")
  os.makedirs(directory)
  prefix = write_tf1(os.path.join(directory, "bert_model.ckpt"), bad)
  write_original_config(directory, torch_model.config, vocab_size=600)
  with pytest.raises(ValueError) as err:
    tf1.load_tf1_checkpoint(prefix)
  message = str(err.value)
  assert prefix in message and "tensor shapes disagree with the config" in message
  assert "cls/seq_relationship/output_weights: checkpoint (3, 64) vs model (2, 64)" in message
  assert "bert/embeddings/word_embeddings: checkpoint (1000, 64) vs model (600, 64)" in message
  assert "cls/predictions/output_bias: checkpoint (1000,) vs model (600,)" in message


def test_paths_of_no_known_kind_say_what_was_looked_for(pretraining_tf1, tmp_path):
  _, prefix, _, _ = pretraining_tf1
  missing = str(tmp_path / "nowhere" / "bert_model.ckpt")
  with pytest.raises(FileNotFoundError) as err:
    checkpoints.load_encoder(missing)
  assert missing in str(err.value) and "model.safetensors" in str(err.value)

  (tmp_path / "empty").mkdir()
  (tmp_path / "empty" / "notes.txt").write_text("x")
  for load in (checkpoints.load_encoder, checkpoints.load_pretraining_model):
    with pytest.raises(ValueError) as err:
      load(str(tmp_path / "empty"))
    message = str(err.value)
    assert f"{tmp_path / 'empty'} is not a checkpoint this package reads" in message
    for looked_for in ("bert_model.ckpt", ".index", "model.safetensors", "checkpoints/"):
      assert looked_for in message, looked_for
  with pytest.raises(ValueError, match="is a file"):
    checkpoints.checkpoint_kind(str(tmp_path / "empty" / "notes.txt"))

  # Two TF1 checkpoints and no state file: which one is meant cannot be guessed.
  tiny = {"bert/embeddings/word_embeddings": np.zeros((2, 2), np.float32)}
  two = tmp_path / "two"
  two.mkdir()
  for step in (10, 20):
    write_tf1(str(two / f"model.ckpt-{step}"), tiny)
  with pytest.raises(ValueError, match=r"several TF1 checkpoints .*model\.ckpt-10.*model\.ckpt-20"):
    checkpoints.checkpoint_kind(str(two))
  # With the state file that TF1 training writes, the latest one is meant.
  (two / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-20"\n'
                                  'all_model_checkpoint_paths: "model.ckpt-10"\n'
                                  'all_model_checkpoint_paths: "model.ckpt-20"\n')
  assert checkpoints.checkpoint_kind(str(two)) == ("tf1", str(two / "model.ckpt-20"))

  # A directory holding two kinds is refused, naming both.
  both = tmp_path / "both"
  shutil.copytree(os.path.dirname(prefix), both)
  config, params, _ = tf1.load_tf1_checkpoint(prefix)
  hf_io.save_hf_checkpoint(params, config, str(both))
  with pytest.raises(ValueError, match="more than one kind of checkpoint") as err:
    checkpoints.checkpoint_kind(str(both))
  assert "a TF1 checkpoint" in str(err.value) and "a Hugging Face directory" in str(err.value)
  assert checkpoints.checkpoint_kind(str(both / "bert_model.ckpt")) == (
      "tf1", str(both / "bert_model.ckpt"))
  hf_only = tmp_path / "hf_only"
  shutil.copytree(both, hf_only, ignore=shutil.ignore_patterns("bert_model.ckpt*"))
  with pytest.raises(ValueError, match="expected a TF1 checkpoint, found a Hugging Face"):
    tf1.read_tf1_checkpoint(str(hf_only))

  # The prefix's own files name it too; a checkpoint without bert_config.json needs one given.
  assert checkpoints.checkpoint_kind(prefix + ".index") == ("tf1", prefix)
  assert checkpoints.checkpoint_kind(prefix + ".data-00000-of-00001") == ("tf1", prefix)
  with pytest.raises(FileNotFoundError, match=r"no bert_config.json beside the checkpoint"):
    checkpoints.load_encoder(str(two))
  with pytest.raises(ValueError, match="tensor shapes disagree"):
    checkpoints.load_encoder(str(two), os.path.join(os.path.dirname(prefix), "bert_config.json"))


# ------------------------------------------------------------------------------ pre-training
def test_pretraining_init_checkpoint_takes_tf1_weights(pretraining_tf1, tmp_path):
  """`init_checkpoint=.../bert_model.ckpt` with `init_mode="params"`, into a scanned model."""
  _, prefix, variables, torch_model = pretraining_tf1
  hf = torch_model.config
  config = ph.run_config("unused", **{
      "model.vocab_size": hf.vocab_size, "model.hidden_size": hf.hidden_size,
      "model.num_hidden_layers": hf.num_hidden_layers,
      "model.num_attention_heads": hf.num_attention_heads,
      "model.intermediate_size": hf.intermediate_size,
      "model.max_position_embeddings": hf.max_position_embeddings,
      "model.scan_layers": True, "init_checkpoint": prefix, "init_mode": "params"})
  run = pretraining.build(config)
  ckpt = checkpointing.CheckpointManager(str(tmp_path / "checkpoints"), async_save=False)
  init = init_order.initial_state(
      run.objective, run.model, run.tx, run.mesh, run.rules,
      batch_size=config.global_batch_size, seed=config.seed, checkpoints=ckpt,
      init_checkpoint=config.init_checkpoint, init_mode=config.init_mode)
  state, origin = init.state, init.origin
  assert origin == f"weights from {prefix}" and int(state.step) == 0
  params = jax.device_get(state.params)
  np.testing.assert_array_equal(
      params["bert"]["encoder"]["layer"]["attention"]["self"]["query"]["kernel"][1],
      variables["bert/encoder/layer_1/attention/self/query/kernel"])
  np.testing.assert_array_equal(params["cls"]["seq_relationship"]["kernel"],
                                variables["cls/seq_relationship/output_weights"].T)

  config.init_mode = "continue"
  with pytest.raises(ValueError, match=r"is a TF1 checkpoint.*init_mode='params'"):
    init_order.initial_state(
        run.objective, run.model, run.tx, run.mesh, run.rules,
        batch_size=config.global_batch_size, seed=config.seed, checkpoints=ckpt,
        init_checkpoint=config.init_checkpoint, init_mode=config.init_mode)
  ckpt.close()
