"""The name table: our parameter paths ↔ Google's TF1 variable names ↔ Hugging Face names.

One row per tensor, with our path, the original TF1 variable name and the Hugging Face (PyTorch)
name, plus how the array is laid out in each (`T` = transposed: PyTorch `Linear.weight` is
(out, in), our and TF1 kernels are (in, out); the TF1 NSP head `cls/seq_relationship/output_weights`
is stored (2, hidden)). The format readers and writers (`hf.py`, `tf1.py`) only apply this
table, through `apply_table` and `params_to_state`, so the formats cannot diverge.

Our parameter tree is the pre-training model's: `{'bert': {...}, 'cls': {...}}`; a bare encoder
is `params['bert']`. Layers are in the unrolled layout (`layer_{i}`); scanned models are
converted with `modeling.stack_layers` / `unstack_layers`.

One table per family (`config.model_type`), all over the same tree of ours:
- BERT: the rows below (TF1: Google's release; Hugging Face: `bert.*`, `cls.*`).
- RoBERTa: BERT's rows under `roberta.*`, the MLM head as `lm_head.*`; no next-sentence head
  and no TF1 release (its TF1 column is empty).
- ALBERT (`share_parameters="all"`): embeddings E wide, the E→H projection, one shared layer
  (TF1 `bert/encoder/transformer/group_0/inner_group_0/...` as google-research/albert's
  `modeling.py` names it; Hugging Face `albert.encoder.albert_layer_groups.0.albert_layers.0.*`),
  `predictions.*` and the sentence-order head (`cls/seq_relationship` in TF1,
  `sop_classifier.classifier` in Hugging Face, `cls/sop_classifier` here).
- DistilBERT: BERT's tensors under `distilbert.transformer.layer.{i}` (`q_lin`, `sa_layer_norm`,
  `ffn.lin1`, ...), no token types or pooler, the masked-LM head as `vocab_transform`,
  `vocab_layer_norm`, `vocab_projector`; no TF1 column.
- ELECTRA: the discriminator's encoder (TF1 `electra/...`, Hugging Face `electra.*`) with its
  E → H projection `embeddings_project`, `discriminator_predictions`, and the generator
  (`generator/...`, `generator_predictions`; in Hugging Face its own directory, whose tensors
  the table names `generator/<name>`), sharing the embedding tables.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import electra, heads, modeling
from bert_jax.model.configuration import BertConfig

# --------------------------------------------------------------------------------- the table
# (ours, tf1, tf1 layout, hugging face, hf layout); "{i}" is the layer index.
_SAME, _T = "", "T"
SAME, T = _SAME, _T  # for the tables built elsewhere (`task_heads.py`)

EMBEDDING_ROWS = (
    ("bert/embeddings/word_embeddings", "bert/embeddings/word_embeddings", _SAME,
     "bert.embeddings.word_embeddings.weight", _SAME),
    ("bert/embeddings/position_embeddings", "bert/embeddings/position_embeddings", _SAME,
     "bert.embeddings.position_embeddings.weight", _SAME),
    ("bert/embeddings/token_type_embeddings", "bert/embeddings/token_type_embeddings", _SAME,
     "bert.embeddings.token_type_embeddings.weight", _SAME),
    ("bert/embeddings/LayerNorm/scale", "bert/embeddings/LayerNorm/gamma", _SAME,
     "bert.embeddings.LayerNorm.weight", _SAME),
    ("bert/embeddings/LayerNorm/bias", "bert/embeddings/LayerNorm/beta", _SAME,
     "bert.embeddings.LayerNorm.bias", _SAME),
)

LAYER_ROWS = (
    ("bert/encoder/layer_{i}/attention/self/query/kernel",
     "bert/encoder/layer_{i}/attention/self/query/kernel", _SAME,
     "bert.encoder.layer.{i}.attention.self.query.weight", _T),
    ("bert/encoder/layer_{i}/attention/self/query/bias",
     "bert/encoder/layer_{i}/attention/self/query/bias", _SAME,
     "bert.encoder.layer.{i}.attention.self.query.bias", _SAME),
    ("bert/encoder/layer_{i}/attention/self/key/kernel",
     "bert/encoder/layer_{i}/attention/self/key/kernel", _SAME,
     "bert.encoder.layer.{i}.attention.self.key.weight", _T),
    ("bert/encoder/layer_{i}/attention/self/key/bias",
     "bert/encoder/layer_{i}/attention/self/key/bias", _SAME,
     "bert.encoder.layer.{i}.attention.self.key.bias", _SAME),
    ("bert/encoder/layer_{i}/attention/self/value/kernel",
     "bert/encoder/layer_{i}/attention/self/value/kernel", _SAME,
     "bert.encoder.layer.{i}.attention.self.value.weight", _T),
    ("bert/encoder/layer_{i}/attention/self/value/bias",
     "bert/encoder/layer_{i}/attention/self/value/bias", _SAME,
     "bert.encoder.layer.{i}.attention.self.value.bias", _SAME),
    ("bert/encoder/layer_{i}/attention/output/dense/kernel",
     "bert/encoder/layer_{i}/attention/output/dense/kernel", _SAME,
     "bert.encoder.layer.{i}.attention.output.dense.weight", _T),
    ("bert/encoder/layer_{i}/attention/output/dense/bias",
     "bert/encoder/layer_{i}/attention/output/dense/bias", _SAME,
     "bert.encoder.layer.{i}.attention.output.dense.bias", _SAME),
    ("bert/encoder/layer_{i}/attention/output/LayerNorm/scale",
     "bert/encoder/layer_{i}/attention/output/LayerNorm/gamma", _SAME,
     "bert.encoder.layer.{i}.attention.output.LayerNorm.weight", _SAME),
    ("bert/encoder/layer_{i}/attention/output/LayerNorm/bias",
     "bert/encoder/layer_{i}/attention/output/LayerNorm/beta", _SAME,
     "bert.encoder.layer.{i}.attention.output.LayerNorm.bias", _SAME),
    ("bert/encoder/layer_{i}/intermediate/dense/kernel",
     "bert/encoder/layer_{i}/intermediate/dense/kernel", _SAME,
     "bert.encoder.layer.{i}.intermediate.dense.weight", _T),
    ("bert/encoder/layer_{i}/intermediate/dense/bias",
     "bert/encoder/layer_{i}/intermediate/dense/bias", _SAME,
     "bert.encoder.layer.{i}.intermediate.dense.bias", _SAME),
    ("bert/encoder/layer_{i}/output/dense/kernel",
     "bert/encoder/layer_{i}/output/dense/kernel", _SAME,
     "bert.encoder.layer.{i}.output.dense.weight", _T),
    ("bert/encoder/layer_{i}/output/dense/bias",
     "bert/encoder/layer_{i}/output/dense/bias", _SAME,
     "bert.encoder.layer.{i}.output.dense.bias", _SAME),
    ("bert/encoder/layer_{i}/output/LayerNorm/scale",
     "bert/encoder/layer_{i}/output/LayerNorm/gamma", _SAME,
     "bert.encoder.layer.{i}.output.LayerNorm.weight", _SAME),
    ("bert/encoder/layer_{i}/output/LayerNorm/bias",
     "bert/encoder/layer_{i}/output/LayerNorm/beta", _SAME,
     "bert.encoder.layer.{i}.output.LayerNorm.bias", _SAME),
)

POOLER_ROWS = (
    ("bert/pooler/dense/kernel", "bert/pooler/dense/kernel", _SAME,
     "bert.pooler.dense.weight", _T),
    ("bert/pooler/dense/bias", "bert/pooler/dense/bias", _SAME, "bert.pooler.dense.bias", _SAME),
)

PRETRAINING_HEAD_ROWS = (
    ("cls/predictions/transform/dense/kernel", "cls/predictions/transform/dense/kernel", _SAME,
     "cls.predictions.transform.dense.weight", _T),
    ("cls/predictions/transform/dense/bias", "cls/predictions/transform/dense/bias", _SAME,
     "cls.predictions.transform.dense.bias", _SAME),
    ("cls/predictions/transform/LayerNorm/scale", "cls/predictions/transform/LayerNorm/gamma",
     _SAME, "cls.predictions.transform.LayerNorm.weight", _SAME),
    ("cls/predictions/transform/LayerNorm/bias", "cls/predictions/transform/LayerNorm/beta",
     _SAME, "cls.predictions.transform.LayerNorm.bias", _SAME),
    ("cls/predictions/output_bias", "cls/predictions/output_bias", _SAME,
     "cls.predictions.bias", _SAME),
    ("cls/seq_relationship/kernel", "cls/seq_relationship/output_weights", _T,
     "cls.seq_relationship.weight", _T),
    ("cls/seq_relationship/bias", "cls/seq_relationship/output_bias", _SAME,
     "cls.seq_relationship.bias", _SAME),
)

# Hugging Face tensors that carry no information of their own: buffers and the tied decoder.
HF_DERIVED = {
    "bert.embeddings.position_ids": None,
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}


# ------------------------------------------------------------------------------------ RoBERTa
def _roberta_rows(rows):
  """BERT's rows with the Hugging Face names under `roberta.` and no TF1 name."""
  return tuple((ours, "", _SAME, hf.replace("bert.", "roberta.", 1), hf_layout)
               for ours, _, _, hf, hf_layout in rows)


ROBERTA_HEAD_ROWS = (
    ("cls/predictions/transform/dense/kernel", "", _SAME, "lm_head.dense.weight", _T),
    ("cls/predictions/transform/dense/bias", "", _SAME, "lm_head.dense.bias", _SAME),
    ("cls/predictions/transform/LayerNorm/scale", "", _SAME, "lm_head.layer_norm.weight", _SAME),
    ("cls/predictions/transform/LayerNorm/bias", "", _SAME, "lm_head.layer_norm.bias", _SAME),
    ("cls/predictions/output_bias", "", _SAME, "lm_head.bias", _SAME),
)

# ------------------------------------------------------------------------------------- ALBERT
_ALBERT_LAYER_TF1 = "bert/encoder/transformer/group_0/inner_group_0/"
_ALBERT_LAYER_HF = "albert.encoder.albert_layer_groups.0.albert_layers.0."
_OURS_SHARED = "bert/encoder/shared_layer/"

ALBERT_EMBEDDING_ROWS = tuple(
    (ours, tf1, tf1_layout, hf.replace("bert.", "albert.", 1), hf_layout)
    for ours, tf1, tf1_layout, hf, hf_layout in EMBEDDING_ROWS) + (
    ("bert/encoder/embedding_hidden_mapping_in/kernel",
     "bert/encoder/embedding_hidden_mapping_in/kernel", _SAME,
     "albert.encoder.embedding_hidden_mapping_in.weight", _T),
    ("bert/encoder/embedding_hidden_mapping_in/bias",
     "bert/encoder/embedding_hidden_mapping_in/bias", _SAME,
     "albert.encoder.embedding_hidden_mapping_in.bias", _SAME),
)

# (ours under shared_layer/, TF1 under group_0/inner_group_0/, HF under albert_layers.0., is the
# array a kernel): the one shared block.
_ALBERT_LAYER_PARTS = (
    ("attention/self/query", "attention_1/self/query", "attention.query"),
    ("attention/self/key", "attention_1/self/key", "attention.key"),
    ("attention/self/value", "attention_1/self/value", "attention.value"),
    ("attention/output/dense", "attention_1/output/dense", "attention.dense"),
    ("intermediate/dense", "ffn_1/intermediate/dense", "ffn"),
    ("output/dense", "ffn_1/intermediate/output/dense", "ffn_output"),
)
_ALBERT_LAYER_NORMS = (
    ("attention/output/LayerNorm", "LayerNorm", "attention.LayerNorm"),
    ("output/LayerNorm", "LayerNorm_1", "full_layer_layer_norm"),
)
ALBERT_LAYER_ROWS = tuple(
    row for ours, tf1, hf in _ALBERT_LAYER_PARTS for row in (
        (f"{_OURS_SHARED}{ours}/kernel", f"{_ALBERT_LAYER_TF1}{tf1}/kernel", _SAME,
         f"{_ALBERT_LAYER_HF}{hf}.weight", _T),
        (f"{_OURS_SHARED}{ours}/bias", f"{_ALBERT_LAYER_TF1}{tf1}/bias", _SAME,
         f"{_ALBERT_LAYER_HF}{hf}.bias", _SAME))) + tuple(
    row for ours, tf1, hf in _ALBERT_LAYER_NORMS for row in (
        (f"{_OURS_SHARED}{ours}/scale", f"{_ALBERT_LAYER_TF1}{tf1}/gamma", _SAME,
         f"{_ALBERT_LAYER_HF}{hf}.weight", _SAME),
        (f"{_OURS_SHARED}{ours}/bias", f"{_ALBERT_LAYER_TF1}{tf1}/beta", _SAME,
         f"{_ALBERT_LAYER_HF}{hf}.bias", _SAME)))

ALBERT_POOLER_ROWS = (
    ("bert/pooler/dense/kernel", "bert/pooler/dense/kernel", _SAME, "albert.pooler.weight", _T),
    ("bert/pooler/dense/bias", "bert/pooler/dense/bias", _SAME, "albert.pooler.bias", _SAME),
)

ALBERT_HEAD_ROWS = (
    ("cls/predictions/transform/dense/kernel", "cls/predictions/transform/dense/kernel", _SAME,
     "predictions.dense.weight", _T),
    ("cls/predictions/transform/dense/bias", "cls/predictions/transform/dense/bias", _SAME,
     "predictions.dense.bias", _SAME),
    ("cls/predictions/transform/LayerNorm/scale", "cls/predictions/transform/LayerNorm/gamma",
     _SAME, "predictions.LayerNorm.weight", _SAME),
    ("cls/predictions/transform/LayerNorm/bias", "cls/predictions/transform/LayerNorm/beta",
     _SAME, "predictions.LayerNorm.bias", _SAME),
    ("cls/predictions/output_bias", "cls/predictions/output_bias", _SAME, "predictions.bias",
     _SAME),
    ("cls/sop_classifier/kernel", "cls/seq_relationship/output_weights", _T,
     "sop_classifier.classifier.weight", _T),
    ("cls/sop_classifier/bias", "cls/seq_relationship/output_bias", _SAME,
     "sop_classifier.classifier.bias", _SAME),
)


# --------------------------------------------------------------------------------- DistilBERT
# transformers' DistilBERT (Sanh et al. 2019): BERT's layer under other names, no token types,
# no pooler, no TF1 release. (ours under layer_{i}/, theirs under transformer.layer.{i}.)
_DISTILBERT_LAYER_PARTS = (
    ("attention/self/query", "attention.q_lin"), ("attention/self/key", "attention.k_lin"),
    ("attention/self/value", "attention.v_lin"), ("attention/output/dense", "attention.out_lin"),
    ("intermediate/dense", "ffn.lin1"), ("output/dense", "ffn.lin2"),
)
_DISTILBERT_LAYER_NORMS = (("attention/output/LayerNorm", "sa_layer_norm"),
                           ("output/LayerNorm", "output_layer_norm"))
DISTILBERT_EMBEDDING_ROWS = tuple(
    (ours, "", _SAME, hf.replace("bert.", "distilbert.", 1), hf_layout)
    for ours, _, _, hf, hf_layout in EMBEDDING_ROWS if "token_type" not in ours)
DISTILBERT_LAYER_ROWS = tuple(
    row for ours, theirs in _DISTILBERT_LAYER_PARTS for row in (
        (f"bert/encoder/layer_{{i}}/{ours}/kernel", "", _SAME,
         f"distilbert.transformer.layer.{{i}}.{theirs}.weight", _T),
        (f"bert/encoder/layer_{{i}}/{ours}/bias", "", _SAME,
         f"distilbert.transformer.layer.{{i}}.{theirs}.bias", _SAME))) + tuple(
    row for ours, theirs in _DISTILBERT_LAYER_NORMS for row in (
        (f"bert/encoder/layer_{{i}}/{ours}/scale", "", _SAME,
         f"distilbert.transformer.layer.{{i}}.{theirs}.weight", _SAME),
        (f"bert/encoder/layer_{{i}}/{ours}/bias", "", _SAME,
         f"distilbert.transformer.layer.{{i}}.{theirs}.bias", _SAME)))
DISTILBERT_HEAD_ROWS = (
    ("cls/predictions/transform/dense/kernel", "", _SAME, "vocab_transform.weight", _T),
    ("cls/predictions/transform/dense/bias", "", _SAME, "vocab_transform.bias", _SAME),
    ("cls/predictions/transform/LayerNorm/scale", "", _SAME, "vocab_layer_norm.weight", _SAME),
    ("cls/predictions/transform/LayerNorm/bias", "", _SAME, "vocab_layer_norm.bias", _SAME),
    ("cls/predictions/output_bias", "", _SAME, "vocab_projector.bias", _SAME),
)


def distilbert_table(num_layers: int, pretraining_heads: bool = True) -> list[Row]:
  rows = list(DISTILBERT_EMBEDDING_ROWS)
  rows += [tuple(c.format(i=i) for c in r) for i in range(num_layers)
           for r in DISTILBERT_LAYER_ROWS]
  rows += DISTILBERT_HEAD_ROWS if pretraining_heads else ()
  return [Row(*r) for r in rows]


# ------------------------------------------------------------------------------------ ELECTRA
# Hugging Face keeps ELECTRA's two models in two directories (`ElectraForPreTraining`, the
# discriminator; `ElectraForMaskedLM`, the generator). In this table a tensor of the generator's
# directory is named `generator/<its name there>`; `hf.py` splits and joins the two.
HF_GENERATOR = "generator/"


def _electra_rows(rows, ours_scope: str, tf1_scope: str, hf_prefix: str):
  """BERT's rows moved: ours under `ours_scope`, TF1 under `tf1_scope`, HF under `hf_prefix`."""
  return tuple((ours.replace("bert/", ours_scope, 1), tf1.replace("bert/", tf1_scope, 1),
                tf1_layout, hf.replace("bert.", hf_prefix, 1), hf_layout)
               for ours, tf1, tf1_layout, hf, hf_layout in rows)


def _projection_rows(ours_scope: str, tf1_scope: str, hf_prefix: str):
  """The E → H projection of one ELECTRA model (`embeddings_project`)."""
  return tuple(
      (f"{ours_scope}encoder/embedding_hidden_mapping_in/{leaf}",
       f"{tf1_scope}embeddings_project/{leaf}", _SAME,
       f"{hf_prefix}embeddings_project.{'weight' if leaf == 'kernel' else 'bias'}",
       _T if leaf == "kernel" else _SAME) for leaf in ("kernel", "bias"))


ELECTRA_EMBEDDING_ROWS = _electra_rows(EMBEDDING_ROWS, "bert/", "electra/", "electra.")
ELECTRA_DISCRIMINATOR_HEAD_ROWS = (
    ("discriminator_predictions/dense/kernel", "discriminator_predictions/dense/kernel", _SAME,
     "discriminator_predictions.dense.weight", _T),
    ("discriminator_predictions/dense/bias", "discriminator_predictions/dense/bias", _SAME,
     "discriminator_predictions.dense.bias", _SAME),
    ("discriminator_predictions/dense_prediction/kernel",
     "discriminator_predictions/dense_1/kernel", _SAME,
     "discriminator_predictions.dense_prediction.weight", _T),
    ("discriminator_predictions/dense_prediction/bias", "discriminator_predictions/dense_1/bias",
     _SAME, "discriminator_predictions.dense_prediction.bias", _SAME),
)
_GEN_HF = HF_GENERATOR + "generator_predictions."
ELECTRA_GENERATOR_HEAD_ROWS = (
    ("generator_predictions/transform/dense/kernel", "generator_predictions/dense/kernel",
     _SAME, _GEN_HF + "dense.weight", _T),
    ("generator_predictions/transform/dense/bias", "generator_predictions/dense/bias", _SAME,
     _GEN_HF + "dense.bias", _SAME),
    ("generator_predictions/transform/LayerNorm/scale", "generator_predictions/LayerNorm/gamma",
     _SAME, _GEN_HF + "LayerNorm.weight", _SAME),
    ("generator_predictions/transform/LayerNorm/bias", "generator_predictions/LayerNorm/beta",
     _SAME, _GEN_HF + "LayerNorm.bias", _SAME),
    ("generator_predictions/output_bias", "generator_predictions/output_bias", _SAME,
     HF_GENERATOR + "generator_lm_head.bias", _SAME),
)
# The generator directory's copies of the shared tables, and its decoder tied to them.
ELECTRA_GENERATOR_SHARED = {
    HF_GENERATOR + hf: hf for _, _, _, hf, _ in ELECTRA_EMBEDDING_ROWS}
ELECTRA_GENERATOR_SHARED[HF_GENERATOR + "generator_lm_head.weight"] = (
    "electra.embeddings.word_embeddings.weight")


def electra_table(config: BertConfig) -> list[Row]:
  """ELECTRA's rows: the shared embeddings, the discriminator (`electra/...` in TF1,
  `electra.*` in its Hugging Face directory) and, when the config has one, the generator
  (`generator/...` in TF1, `generator/electra.*` here for its directory), each with its E → H
  projection where its width differs from the embeddings'."""
  rows = list(ELECTRA_EMBEDDING_ROWS)
  if config.factorized_embeddings:
    rows += _projection_rows("bert/", "electra/", "electra.")
  rows += [r for i in range(config.num_hidden_layers) for r in _electra_rows(
      [tuple(c.format(i=i) for c in r) for r in LAYER_ROWS], "bert/", "electra/", "electra.")]
  rows += ELECTRA_DISCRIMINATOR_HEAD_ROWS
  if config.has_generator:
    gen = config.generator_config()
    hf = HF_GENERATOR + "electra."
    if gen.factorized_embeddings:
      rows += _projection_rows("generator/", "generator/", hf)
    rows += [r for i in range(gen.num_hidden_layers) for r in _electra_rows(
        [tuple(c.format(i=i) for c in r) for r in LAYER_ROWS], "generator/", "generator/", hf)]
    rows += ELECTRA_GENERATOR_HEAD_ROWS
  return [Row(*r) for r in rows]


@dataclasses.dataclass(frozen=True)
class Family:
  """How one model family is named in Hugging Face checkpoints: the prefix of its encoder,
  the prefixes of its heads (a bare encoder is saved without the encoder prefix), and the
  tensors that carry nothing of their own (buffers; the decoder tied to the embeddings)."""
  hf_prefix: str
  hf_head_prefixes: tuple[str, ...]
  hf_derived: Mapping[str, str | None]
  has_tf1: bool


FAMILIES = {
    "bert": Family("bert.", ("cls.",), HF_DERIVED, True),
    "roberta": Family("roberta.", ("lm_head.",), {
        "roberta.embeddings.position_ids": None,
        "roberta.embeddings.token_type_ids": None,
        "lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
        "lm_head.decoder.bias": "lm_head.bias",
    }, False),
    "albert": Family("albert.", ("predictions.", "sop_classifier."), {
        "albert.embeddings.position_ids": None,
        "albert.embeddings.token_type_ids": None,
        "predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
        "predictions.decoder.bias": "predictions.bias",
    }, True),
    "electra": Family("electra.", ("discriminator_predictions.", "generator_predictions.",
                                   "generator_lm_head.", HF_GENERATOR), {
        "electra.embeddings.position_ids": None,
        "electra.embeddings.token_type_ids": None,
        HF_GENERATOR + "electra.embeddings.position_ids": None,
        HF_GENERATOR + "electra.embeddings.token_type_ids": None,
        **ELECTRA_GENERATOR_SHARED,
    }, True),
    "distilbert": Family("distilbert.", ("vocab_transform.", "vocab_layer_norm.",
                                         "vocab_projector."), {
        "distilbert.embeddings.position_ids": None,
        "vocab_projector.weight": "distilbert.embeddings.word_embeddings.weight",
    }, False),
}


@dataclasses.dataclass(frozen=True)
class Row:
  ours: str
  tf1: str
  tf1_layout: str
  hf: str
  hf_layout: str


def name_table(num_layers: int, pooler: bool = True, pretraining_heads: bool = True,
               model_type: str = "bert") -> list[Row]:
  """The table of `model_type` expanded for a model with `num_layers` layers (ALBERT's one
  shared layer has one set of rows whatever the depth)."""
  if model_type == "albert":
    rows = [Row(*r) for r in ALBERT_EMBEDDING_ROWS + ALBERT_LAYER_ROWS]
    rows += [Row(*r) for r in ALBERT_POOLER_ROWS] if pooler else []
    rows += [Row(*r) for r in ALBERT_HEAD_ROWS] if pretraining_heads else []
    return rows
  rows = [Row(*r) for r in EMBEDDING_ROWS]
  for i in range(num_layers):
    rows += [Row(*(c.format(i=i) for c in r)) for r in LAYER_ROWS]
  if pooler:
    rows += [Row(*r) for r in POOLER_ROWS]
  if pretraining_heads:
    rows += [Row(*r) for r in PRETRAINING_HEAD_ROWS]
  if model_type == "roberta":
    heads_rows = [Row(*r) for r in ROBERTA_HEAD_ROWS] if pretraining_heads else []
    return [Row(*r) for r in _roberta_rows(
        [dataclasses.astuple(r) for r in rows if not r.ours.startswith("cls/")])] + heads_rows
  if model_type != "bert":
    raise ValueError(f"No name table for model_type={model_type!r}; known: "
                     f"{', '.join(FAMILIES)}.")
  return rows


def family_table(config: BertConfig, column: str) -> list[Row]:
  """The table for `config`, after checking that the format can express the model at all:
  the released families only (ALBERT with every layer shared, BERT and RoBERTa unshared and
  unfactorized), and TF1 only for the families that released TF1 checkpoints."""
  family = config.model_type
  factorized_families = ("albert", "electra")
  expected_share = "all" if family == "albert" else "none"
  problems = []
  if config.share_parameters != expected_share:
    problems.append(f"share_parameters={config.share_parameters!r} (a {family} checkpoint "
                    f"has {expected_share!r})")
  if family not in factorized_families and config.factorized_embeddings:
    problems.append(f"embedding_size={config.embedding_size} != hidden_size (only ALBERT "
                    "and ELECTRA checkpoints have factorized embeddings)")
  if column == "tf1" and not FAMILIES[family].has_tf1:
    problems.append(f"{family} has no TF1 checkpoint format (no TF1 release)")
  if problems:
    fmt = "TF1" if column == "tf1" else "Hugging Face"
    raise ValueError(f"model_type={family!r}: no {fmt} names for this model: "
                     + "; ".join(problems) + ".")
  if family == "electra":
    return electra_table(config)
  if family == "distilbert":
    return distilbert_table(config.num_hidden_layers)
  return name_table(config.num_hidden_layers, model_type=family)


def _to_layout(array: np.ndarray, layout: str) -> np.ndarray:
  return np.ascontiguousarray(array.T) if layout == _T else array


# ------------------------------------------------------------------------- tree <-> flat paths
def flatten_params(params: Mapping) -> dict[str, np.ndarray]:
  """{'bert': {'embeddings': {...}}} → {'bert/embeddings/...': array}."""
  flat = {}

  def visit(prefix, tree):
    for key, value in tree.items():
      path = f"{prefix}/{key}" if prefix else str(key)
      if isinstance(value, Mapping):
        visit(path, value)
      else:
        flat[path] = value
  visit("", params)
  return flat


def unflatten_params(flat: Mapping[str, np.ndarray]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return tree

@dataclasses.dataclass
class LoadReport:
  """What a conversion found. `missing` are our parameters the checkpoint lacks (left to the
  caller's initialisation); `unexpected` are checkpoint tensors nothing here reads."""
  source: str
  missing: list[str] = dataclasses.field(default_factory=list)
  unexpected: list[str] = dataclasses.field(default_factory=list)
  # Training state stored beside the weights (TF1 optimizer moments, global_step): not weights,
  # so not `unexpected`, but counted so that a summary accounts for every stored tensor.
  skipped: list[str] = dataclasses.field(default_factory=list)

  def summary(self) -> str:
    parts = [f"{self.source}:"]
    parts.append(f"{len(self.missing)} parameters not in the checkpoint" +
                 (f" ({', '.join(sorted(self.missing)[:6])}{' ...' if len(self.missing) > 6 else ''})"
                  if self.missing else ""))
    parts.append(f"{len(self.unexpected)} checkpoint tensors unused" +
                 (f" ({', '.join(sorted(self.unexpected)[:6])}{' ...' if len(self.unexpected) > 6 else ''})"
                  if self.unexpected else ""))
    if self.skipped:
      parts.append(f"{len(self.skipped)} optimizer variables skipped")
    return " ".join(parts)


def apply_table(state: Mapping[str, np.ndarray], config: BertConfig, column: str,
                 source: str) -> tuple[dict, LoadReport, set[str]]:
  """Stored tensors named by the table's `column` ("hf" or "tf1") → our tree, plus what was
  missing and which stored names were read. The one place where the table is applied to a
  checkpoint, so the two formats cannot diverge in what they check.

  Shapes are checked against `config` (in the checkpoint's own layout, so that the message
  shows the shapes as they are stored); every mismatch is listed in one error.
  """
  rows = family_table(config, column)
  expected = expected_shapes(config)
  report = LoadReport(source)
  flat, errors, used = {}, [], set()
  for row in rows:
    name, layout = getattr(row, column), getattr(row, column + "_layout")
    if name not in state:
      report.missing.append(row.ours)
      continue
    stored = np.asarray(state[name])
    used.add(name)
    want = expected[row.ours][::-1] if layout == _T else expected[row.ours]
    if tuple(stored.shape) != want:
      errors.append(f"  {name}: checkpoint {tuple(stored.shape)} vs model {want}")
      continue
    flat[row.ours] = _to_layout(stored, layout).astype(np.float32)
  if errors:
    raise ValueError(f"{source}: tensor shapes disagree with the config "
                     f"(model_type={config.model_type}):\n" + "\n".join(errors))
  params = unflatten_params(flat)
  if config.scan_layers and any("encoder" in scope for scope in params.values()):
    params = modeling.stack_layers(params, config.num_hidden_layers)
  return params, report, used


def params_to_state(params: Mapping, config: BertConfig, column: str,
                    format_name: str, rows: list[Row] | None = None) -> dict[str, np.ndarray]:
  """Our tree (scanned or not) → the table's `column` names and layouts, numpy float32.
  Parameters without a row are an error rather than left out, so an export is never silently
  partial. `rows`: another table than the family's (a fine-tuned model's, `task_heads.py`)."""
  params = to_numpy(params)
  if any("layer" in scope.get("encoder", {}) for scope in params.values()
         if isinstance(scope, Mapping)):
    params = modeling.unstack_layers(params, config.num_hidden_layers)
  flat = flatten_params(params)
  rows = family_table(config, column) if rows is None else rows
  state = {}
  for row in rows:
    if row.ours in flat:
      state[getattr(row, column)] = _to_layout(np.asarray(flat[row.ours], np.float32),
                                               getattr(row, column + "_layout"))
  unknown = sorted(set(flat) - {r.ours for r in rows})
  if unknown:
    raise ValueError(f"No {format_name} name for parameters: {', '.join(unknown)} "
                     f"(model_type={config.model_type})")
  return state


def to_numpy(tree):
  if isinstance(tree, Mapping):
    return {k: to_numpy(v) for k, v in tree.items()}
  return np.asarray(tree)


def expected_shapes(config: BertConfig) -> dict[str, tuple[int, ...]]:
  """Shape of every parameter of the pre-training model in the unrolled layout, from the model
  itself (eval_shape), so the table and the modules cannot drift apart unnoticed."""
  return dict(_expected_shapes(config.replace(scan_layers=False, remat_policy="none")))


@functools.lru_cache(maxsize=16)
def _expected_shapes(cfg: BertConfig) -> dict[str, tuple[int, ...]]:
  """`expected_shapes`, traced once per configuration in a process (a reader of several
  checkpoints of one model, and a conversion that reads what it wrote, ask again)."""
  ids = jnp.zeros((1, 8), jnp.int32)
  if cfg.model_type == "electra":
    slots = jnp.zeros((1, 2), jnp.int32)
    model = electra.ElectraForPreTraining(cfg)
    method = None if cfg.has_generator else electra.ElectraForPreTraining.discriminate
    inputs = (ids, ids, ids, slots, slots, slots) if cfg.has_generator else (ids, ids, ids)
    abstract = jax.eval_shape(lambda: nn.unbox(model.init(
        {"params": jax.random.PRNGKey(0), "sample": jax.random.PRNGKey(0)}, *inputs,
        method=method)["params"]))
    return {k: tuple(v.shape) for k, v in flatten_params(abstract).items()}
  abstract = jax.eval_shape(
      lambda: nn.unbox(heads.BertForPreTraining(cfg).init(
          jax.random.PRNGKey(0), ids, ids, ids, jnp.zeros((1, 2), jnp.int32))["params"]))
  return {k: tuple(v.shape) for k, v in flatten_params(abstract).items()}

