"""Fine-tuned models out to transformers and TF1: every task head of every family that has a
transformers class is written as that class, whose PyTorch forward pass gives our logits; the
heads without one are refused naming the difference; BERT's classifier and SQuAD head take the
names of Google's run_classifier.py and run_squad.py."""

import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax.interop import hf, hf_config, task_heads, tf1
from bert_jax.model import heads

TOL = 1e-5
SIZES = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=40, hidden_dropout_prob=0.0,
             attention_probs_dropout_prob=0.0)
HF_CONFIGS = {
    "bert": lambda: transformers.BertConfig(**SIZES),
    "albert": lambda: transformers.AlbertConfig(embedding_size=16, hidden_act="gelu_new", **SIZES),
    "roberta": lambda: transformers.RobertaConfig(type_vocab_size=1, pad_token_id=1, **SIZES),
    "electra": lambda: transformers.ElectraConfig(embedding_size=16, **SIZES),
    "distilbert": lambda: transformers.DistilBertConfig(
        vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=40,
        dropout=0.0, attention_dropout=0.0),
}
SUPPORTED = {
    task_heads.SEQUENCE_CLASSIFICATION: ("bert", "albert", "roberta"),
    task_heads.QUESTION_ANSWERING: tuple(HF_CONFIGS),
    task_heads.TOKEN_CLASSIFICATION: tuple(HF_CONFIGS),
    task_heads.MULTIPLE_CHOICE: ("bert", "albert", "roberta"),
}
AUTO = {task_heads.SEQUENCE_CLASSIFICATION: transformers.AutoModelForSequenceClassification,
        task_heads.QUESTION_ANSWERING: transformers.AutoModelForQuestionAnswering,
        task_heads.TOKEN_CLASSIFICATION: transformers.AutoModelForTokenClassification,
        task_heads.MULTIPLE_CHOICE: transformers.AutoModelForMultipleChoice}
BATCH, LENGTH, CHOICES = 3, 11, 4


def _config(family):
  return hf_config.config_from_dict(HF_CONFIGS[family]().to_dict())


def _module(head, config, num_labels):
  return {task_heads.SEQUENCE_CLASSIFICATION: lambda: heads.BertForSequenceClassification(
              config, num_labels),
          task_heads.QUESTION_ANSWERING: lambda: heads.BertForQuestionAnswering(config),
          task_heads.TOKEN_CLASSIFICATION: lambda: heads.BertForTokenClassification(
              config, num_labels),
          task_heads.MULTIPLE_CHOICE: lambda: heads.BertForMultipleChoice(config)}[head]()


def _inputs(config, head, seed=0):
  """Real tokens (no padding id among them) then padding, and two segments where the family
  has token types."""
  rng = np.random.RandomState(seed)
  shape = (BATCH, CHOICES, LENGTH) if head == task_heads.MULTIPLE_CHOICE else (BATCH, LENGTH)
  ids = rng.randint(3, config.vocab_size, size=shape).astype(np.int32)
  lengths = rng.randint(LENGTH // 2, LENGTH + 1, size=shape[:-1])
  mask = (np.arange(LENGTH) < lengths[..., None]).astype(np.int32)
  pad = 1 if config.model_type == "roberta" else 0
  ids = np.where(mask == 1, ids, pad)
  segments = np.zeros_like(ids)
  if config.type_vocab_size > 1:
    segments = ((np.arange(LENGTH) >= 4) & (mask == 1)).astype(np.int32)
  return ids, mask, segments


def _ours(head, family, num_labels=3):
  """Our task model with random weights, every tensor perturbed (so none can be dropped or
  transposed unseen), and its float32 outputs."""
  config = _config(family)
  ids, mask, segments = _inputs(config, head)
  module = _module(head, config, num_labels)
  params = nn.unbox(module.init(jax.random.PRNGKey(0), ids, mask, segments)["params"])
  leaves, tree = jax.tree_util.tree_flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
  params = jax.tree_util.tree_unflatten(tree, [
      x + 0.05 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])
  outputs = module.apply({"params": params}, ids, mask, segments, deterministic=True)
  return config, params, (ids, mask, segments), outputs


def _theirs(directory, head, family, inputs):
  model = AUTO[head].from_pretrained(directory, attn_implementation="eager").eval()
  ids, mask, segments = (torch.tensor(np.asarray(x)).long() for x in inputs)
  kwargs = {} if family == "distilbert" else {"token_type_ids": segments}
  with torch.no_grad():
    out = model(input_ids=ids, attention_mask=mask, **kwargs)
  return model, out


@pytest.mark.parametrize("head, family", [(h, f) for h, families in SUPPORTED.items()
                                          for f in families])
def test_transformers_class_on_the_export_gives_our_outputs(head, family, tmp_path):
  labels = ("neg", "neutral", "pos")
  config, params, inputs, ours = _ours(head, family)
  hf.save_hf_checkpoint(params, config, str(tmp_path), task_heads.Head(head, labels))
  written = json.load(open(tmp_path / "config.json"))
  assert written["architectures"] == [task_heads.hf_class(task_heads.Head(head), config)]
  model, out = _theirs(str(tmp_path), head, family, inputs)
  assert type(model).__name__ == written["architectures"][0]
  real = np.asarray(inputs[1]).astype(bool)
  if head == task_heads.QUESTION_ANSWERING:
    for mine, theirs in zip(ours, (out.start_logits, out.end_logits)):
      np.testing.assert_allclose(np.asarray(mine)[real], theirs.numpy()[real], atol=TOL)
  elif head == task_heads.TOKEN_CLASSIFICATION:
    np.testing.assert_allclose(np.asarray(ours)[real], out.logits.numpy()[real], atol=TOL)
    assert model.config.id2label == dict(enumerate(labels))
  else:
    np.testing.assert_allclose(np.asarray(ours), out.logits.numpy(), atol=TOL)
  if head == task_heads.SEQUENCE_CLASSIFICATION:
    assert model.config.id2label == dict(enumerate(labels))
    assert model.config.label2id == {l: i for i, l in enumerate(labels)}
    assert model.config.problem_type == "single_label_classification"


def test_a_regression_head_says_so():
  fields = task_heads.hf_config_fields(task_heads.Head(task_heads.SEQUENCE_CLASSIFICATION), 1)
  assert fields["problem_type"] == "regression" and fields["id2label"] == {"0": "LABEL_0"}
  with pytest.raises(ValueError, match="2 label names"):
    task_heads.hf_config_fields(task_heads.Head(task_heads.TOKEN_CLASSIFICATION, ("a", "b")), 3)


@pytest.mark.parametrize("family, words", [("distilbert", "relu(pre_classifier"),
                                           ("electra", "GELU")])
@pytest.mark.parametrize("head", [task_heads.SEQUENCE_CLASSIFICATION,
                                  task_heads.MULTIPLE_CHOICE])
def test_heads_transformers_computes_otherwise_are_refused_naming_the_difference(
    head, family, words, tmp_path):
  config, params, _, _ = _ours(head, family)
  with pytest.raises(ValueError, match=r"No Hugging Face class") as error:
    hf.save_hf_checkpoint(params, config, str(tmp_path), task_heads.Head(head))
  assert words in str(error.value) and "--format=orbax" in str(error.value)
  assert not os.listdir(tmp_path)  # nothing half-written


@pytest.mark.parametrize("head, family, names", [
    (task_heads.SEQUENCE_CLASSIFICATION, "bert", ("output_weights", "output_bias")),
    (task_heads.SEQUENCE_CLASSIFICATION, "albert", ("output_weights", "output_bias")),
    (task_heads.QUESTION_ANSWERING, "bert", ("cls/squad/output_weights", "cls/squad/output_bias")),
])
def test_tf1_export_names_the_head_as_googles_scripts_do(head, family, names, tmp_path):
  """run_classifier.py: logits = pooled · output_weightsᵀ + output_bias, output_weights
  (labels, hidden); run_squad.py the same under cls/squad/ over every token."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  config, params, inputs, _ = _ours(head, family, num_labels=3)
  prefix = tf1.save_tf1_checkpoint(params, config, str(tmp_path), task_heads.Head(head))
  reader = tf.train.load_checkpoint(prefix)
  scope = task_heads.HEAD_SCOPES[head]
  weights, bias = (reader.get_tensor(n) for n in names)
  np.testing.assert_array_equal(weights, np.asarray(params[scope]["kernel"]).T)
  np.testing.assert_array_equal(bias, np.asarray(params[scope]["bias"]))
  encoder_names = set(reader.get_variable_to_shape_map()) - set(names)
  assert encoder_names and all(n.startswith("bert/") for n in encoder_names)
  # Read back as the encoder it fine-tuned: every encoder tensor found, the head left over.
  _, loaded, report = tf1.load_tf1_checkpoint(prefix)
  assert not [m for m in report.missing if m.startswith("bert/") and "pooler" not in m]
  assert sorted(report.unexpected) == sorted(names)
  np.testing.assert_array_equal(loaded["bert"]["embeddings"]["word_embeddings"],
                                params["bert"]["embeddings"]["word_embeddings"])


def test_tf1_has_no_names_for_other_heads(tmp_path):
  config, params, _, _ = _ours(task_heads.TOKEN_CLASSIFICATION, "bert")
  with pytest.raises(ValueError, match="run_classifier.py"):
    tf1.save_tf1_checkpoint(params, config, str(tmp_path),
                            task_heads.Head(task_heads.TOKEN_CLASSIFICATION))


def test_an_unknown_head_is_refused():
  with pytest.raises(ValueError, match="sequence_classification"):
    task_heads.Head("span_ranking")
