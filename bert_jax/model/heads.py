"""Task heads on top of `BertModel`, and their losses.

Pre-training: the masked-LM head (transform → tied decoder + output bias) evaluated only at
`masked_lm_positions` — gathering 20 positions before the vocabulary projection instead of all
128/512 is most of the head's cost saved — and the next-sentence head on the pooled output.
Paths (`cls/predictions/...`, `cls/seq_relationship/...`) follow the original TF1 checkpoint.
Losses are computed in float32 with the original's formulas.

The successors reuse these heads: RoBERTa's LM head (`lm_head`: dense, GELU, LayerNorm, tied
decoder + bias) is BERT's masked-LM head; ALBERT's (`predictions`) is the same with the
transform projecting H to the embedding width E, which the transform reads from the config.
ALBERT's sentence-order head is `SentenceOrderHead` at `cls/sop_classifier`; SpanBERT's span
boundary head is `SpanBoundaryHead` at `cls/pair_target_predictions`.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model.modeling import (BATCH, LENGTH, VOCAB, BertConfig, BertModel, Dropout,
                                     activation_fn, bert_initializer, dense, float32_einsum,
                                     layer_norm)


def gather_positions(sequence: jax.Array, positions: jax.Array) -> jax.Array:
  """(batch, length, hidden) at (batch, num_positions) → (batch, num_positions, hidden)."""
  return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


class MaskedLMTransform(nn.Module):
  """dense → activation → LayerNorm before the tied decoder (`cls/predictions/transform`).

  The dense maps to the embedding width (hidden_size, or ALBERT's E), which the tied decoder
  needs. RoBERTa's `lm_head` applies exact GELU whatever `hidden_act` says; every released
  RoBERTa has `hidden_act="gelu"`, so the two agree.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    x = dense(cfg, cfg.embedding_width, ("embed", "embed_out"), "dense")(x)
    x = activation_fn(cfg.hidden_act)(x)
    return layer_norm(cfg)(x.astype(jnp.float32)).astype(jnp.dtype(cfg.dtype))


class MaskedLMHead(nn.Module):
  """Vocabulary logits at the given positions; the decoder matrix is the word-embedding table."""
  config: BertConfig

  @nn.compact
  def __call__(self, sequence_output, masked_lm_positions, attend):
    x = gather_positions(sequence_output, masked_lm_positions)
    x = MaskedLMTransform(self.config, name="transform")(x)
    bias = self.param("output_bias",
                      nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
                      (self.config.vocab_size,), jnp.dtype(self.config.param_dtype))
    logits = attend(x) + bias.astype(jnp.float32)
    return nn.with_logical_constraint(logits, (BATCH, LENGTH, VOCAB))


class SentenceOrderHead(nn.Module):
  """ALBERT's sentence-order prediction (SOP) classifier: 2 logits from the pooled [CLS]
  (1 = the two segments are swapped). The same shape as the next-sentence head, under its own
  name (`cls/sop_classifier`), so that an NSP head is never read as an SOP head or back."""
  config: BertConfig

  @nn.compact
  def __call__(self, pooled_output):
    cfg = self.config
    pdt = jnp.dtype(cfg.param_dtype)
    kernel = self.param("kernel", nn.with_logical_partitioning(
        bert_initializer(cfg.initializer_range), ("embed", "classes")), (cfg.hidden_size, 2), pdt)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           ("classes",)), (2,), pdt)
    logits = float32_einsum("...h,hc->...c", pooled_output.astype(jnp.dtype(cfg.dtype)), kernel)
    return logits + bias.astype(jnp.float32)


class SpanBoundaryHead(nn.Module):
  """SpanBERT's span boundary objective (SBO; Joshi et al. 2020, "SpanBERT"): each masked token
  of a span predicted from the encoder outputs at the two boundary tokens around the span
  (`left`, `right`: positions) and a learned embedding of its `offset` within the span — with
  no look at the token's own output, so the span's content has to be carried to its edges.

  As SpanBERT's `BertPairTargetPredictionHead`: concat(left, right, offset embedding) →
  Linear → GELU → LayerNorm → Linear → GELU → LayerNorm (`mlp_layer_norm`), then the tied word
  embeddings as decoder with a bias of its own. Names follow SpanBERT's
  (`cls.pair_target_predictions...`), so its checkpoints map by a table. The second linear
  maps to the embedding width (hidden_size but for ALBERT's E), which the tied decoder needs.
  The offset table has SpanBERT's `max_targets` (15) rows: spans are drawn in words (up to 10),
  offsets count tokens; offsets past the last row share it.
  Returns float32 logits (batch, num_positions, vocab).
  """
  config: BertConfig
  max_targets: int = 15               # rows of the offset table (SpanBERT's --max-pair-targets)
  position_embedding_size: int = 200  # its width (--pair-positional-embedding-size)

  @nn.compact
  def __call__(self, sequence_output, left, right, offset, attend):
    cfg = self.config
    compute = jnp.dtype(cfg.dtype)
    table = self.param("position_embeddings", nn.with_logical_partitioning(
        bert_initializer(cfg.initializer_range), ("position", "embed_out")),
        (self.max_targets, self.position_embedding_size), jnp.dtype(cfg.param_dtype))
    offset = jnp.clip(offset.astype(jnp.int32), 0, self.max_targets - 1)
    x = jnp.concatenate([gather_positions(sequence_output, left).astype(compute),
                         gather_positions(sequence_output, right).astype(compute),
                         jnp.take(table, offset, axis=0).astype(compute)], axis=-1)
    x = _SpanBoundaryMlp(cfg, name="mlp_layer_norm")(x)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           ("vocab",)),
                      (cfg.vocab_size,), jnp.dtype(cfg.param_dtype))
    logits = attend(x) + bias.astype(jnp.float32)
    return nn.with_logical_constraint(logits, (BATCH, LENGTH, VOCAB))


class _SpanBoundaryMlp(nn.Module):
  """SpanBERT's `MLPWithLayerNorm`: two (Linear → activation → LayerNorm) layers; the input
  dimension (2H + offset width) is left unsharded, as it need not divide the mesh."""
  config: BertConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    act = activation_fn(cfg.hidden_act)
    x = dense(cfg, cfg.hidden_size, ("embed_out", "embed"), "linear1")(x)
    x = layer_norm(cfg, "layer_norm1")(act(x).astype(jnp.float32)).astype(jnp.dtype(cfg.dtype))
    x = dense(cfg, cfg.embedding_width, ("embed", "embed_out"), "linear2")(x)
    return layer_norm(cfg, "layer_norm2")(act(x).astype(jnp.float32)).astype(
        jnp.dtype(cfg.dtype))


class BertForPreTraining(nn.Module):
  """`BertModel` + masked-LM + next-sentence heads (the paper's pre-training model).

  Returns `(mlm_logits (batch, max_predictions, vocab), nsp_logits (batch, 2))`, float32.
  For `model_type="albert"` the second output is the sentence-order head's logits
  (`cls/sop_classifier`); the other families have the next-sentence head
  (`cls/seq_relationship`).

  Packed rows (Krell et al. 2021: several `[CLS] A [SEP] B [SEP]` instances per row, so that
  short instances do not pay for padding) also pass `position_ids`, `sequence_ids` and
  `cls_positions` (batch, k): attention stays inside each instance, and the next-sentence head
  reads each instance's [CLS], so `nsp_logits` is (batch, k, 2). `masked_lm_positions` are
  positions in the row.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions,
               position_ids=None, sequence_ids=None, cls_positions=None,
               deterministic: bool = True):
    bert = BertModel(self.config, name="bert")
    out = bert(input_ids, input_mask, segment_ids, position_ids, deterministic=deterministic,
               sequence_ids=sequence_ids, cls_positions=cls_positions)
    return _PreTrainingHeads(self.config, name="cls")(
        out["sequence_output"].astype(jnp.dtype(self.config.dtype)), out["pooled_output"],
        masked_lm_positions, bert.attend)


class BertForMaskedLM(nn.Module):
  """`BertModel` (no pooler) + the masked-LM head alone, as transformers' `BertForMaskedLM`.

  What fill-in-the-[MASK] needs, so that a checkpoint without a next-sentence head (the
  commonest kind after MLM-only training) serves it. Same parameter paths as
  `BertForPreTraining` (`bert/...`, `cls/predictions/...`). Returns the MLM logits.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions,
               deterministic: bool = True):
    bert = BertModel(self.config, add_pooling_layer=False, name="bert")
    out = bert(input_ids, input_mask, segment_ids, deterministic=deterministic)
    return _PreTrainingHeads(self.config, next_sentence=False, name="cls")(
        out["sequence_output"].astype(jnp.dtype(self.config.dtype)), None, masked_lm_positions,
        bert.attend)


def masked_lm_params(params: dict) -> dict:
  """The part of a pre-training tree that `BertForMaskedLM` reads: the encoder without its
  pooler, and `cls/predictions` (no next-sentence head)."""
  return {"bert": {k: v for k, v in params["bert"].items() if k != "pooler"},
          "cls": {"predictions": params["cls"]["predictions"]}}


class _PreTrainingHeads(nn.Module):
  """The `cls/...` scope of the original checkpoint: `predictions` and `seq_relationship`."""
  config: BertConfig
  next_sentence: bool = True

  @nn.compact
  def __call__(self, sequence_output, pooled_output, masked_lm_positions, attend):
    mlm_logits = MaskedLMHead(self.config, name="predictions")(
        sequence_output, masked_lm_positions, attend)
    if not self.next_sentence:
      return mlm_logits
    if self.config.model_type == "albert":
      return mlm_logits, SentenceOrderHead(self.config, name="sop_classifier")(pooled_output)
    nsp_logits = dense(self.config, 2, ("embed", "classes"), "seq_relationship")(
        pooled_output.astype(jnp.dtype(self.config.dtype))).astype(jnp.float32)
    return mlm_logits, nsp_logits


# ------------------------------------------------------------------------- fine-tuning heads
class BertForSequenceClassification(nn.Module):
  """`BertModel` + dropout + a dense layer on the pooled [CLS] vector (`run_classifier.py`).

  `num_labels` classes, or one output for regression (STS-B). Returns float32 logits
  (batch, num_labels). Serves GLUE and any custom single-sentence or sentence-pair task.

  Packed rows (fine-tuning with `packing`) also pass `position_ids`, `sequence_ids` and
  `cls_positions` (batch, k), as `BertForPreTraining` does: the logits are then
  (batch, k, num_labels), one per packed example, each from its own [CLS].
  """
  config: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, position_ids=None, sequence_ids=None,
               cls_positions=None, deterministic: bool = True):
    cfg = self.config
    out = BertModel(cfg, name="bert")(input_ids, input_mask, segment_ids, position_ids,
                                      deterministic=deterministic, sequence_ids=sequence_ids,
                                      cls_positions=cls_positions)
    pooled = Dropout(cfg.hidden_dropout_prob, cfg.dropout_bits)(out["pooled_output"],
                                                                deterministic=deterministic)
    logits = dense(cfg, self.num_labels, ("embed", "classes"), "classifier")(
        pooled.astype(jnp.dtype(cfg.dtype)))
    return logits.astype(jnp.float32)


class BertForQuestionAnswering(nn.Module):
  """`BertModel` + a dense layer giving each token a start and an end logit (`run_squad.py`).

  Returns float32 `(start_logits, end_logits)`, each (batch, length). No pooler: nothing reads
  it, so it is neither computed nor trained. Positions are not masked, as in the original —
  post-processing only ever picks context tokens, and the loss's softmax runs over every
  position, padding included, exactly as the paper's models were trained.

  Packed rows also pass `position_ids` and `sequence_ids`; the logits are then per position of
  the row, and the loss confines each window's softmax to its own tokens
  (`question_answering.SquadSpans`).
  """
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, position_ids=None, sequence_ids=None,
               deterministic: bool = True):
    cfg = self.config
    out = BertModel(cfg, add_pooling_layer=False, name="bert")(
        input_ids, input_mask, segment_ids, position_ids, deterministic=deterministic,
        sequence_ids=sequence_ids)
    logits = dense(cfg, 2, ("embed", "classes"), "qa_outputs")(
        out["sequence_output"].astype(jnp.dtype(cfg.dtype))).astype(jnp.float32)
    return logits[..., 0], logits[..., 1]


class BertForTokenClassification(nn.Module):
  """`BertModel` + dropout + a dense layer giving every token `num_labels` logits (the paper's
  NER fine-tuning, Section 4.3 / 5.3: the first piece of each word is classified; which
  positions count is the loss's business: the tagging objective's).

  Returns float32 logits (batch, length, num_labels). No pooler: nothing reads it. The head is
  `classifier`, as transformers' `BertForTokenClassification` names it.
  """
  config: BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True):
    cfg = self.config
    out = BertModel(cfg, add_pooling_layer=False, name="bert")(
        input_ids, input_mask, segment_ids, deterministic=deterministic)
    x = Dropout(cfg.hidden_dropout_prob, cfg.dropout_bits)(out["sequence_output"],
                                                           deterministic=deterministic)
    return dense(cfg, self.num_labels, ("embed", "classes"), "classifier")(
        x.astype(jnp.dtype(cfg.dtype))).astype(jnp.float32)


class BertFeatureBasedTagger(nn.Module):
  """The paper's feature-based NER (Section 5.3, Table 7): the encoder is frozen and only
  *read* — the token vectors of `feature_layers` (default the last four hidden layers,
  concatenated, the paper's best: 96.1 dev F1 against 96.4 fine-tuned) feed a randomly
  initialised two-layer BiLSTM of 768 units per direction, then a linear classifier.

  The encoder runs deterministically under `stop_gradient` (no dropout, no gradient): the
  objective also freezes the `bert` scope in the optimizer, so the encoder's weights never move
  and carry no Adam state. The LSTMs read each row's real tokens only (`seq_lengths` from the
  mask), so padding changes nothing. Head parameters live under `tagger`.
  """
  config: BertConfig
  num_labels: int
  feature_layers: tuple[int, ...] = (-1, -2, -3, -4)
  lstm_size: int = 768
  lstm_layers: int = 2

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True):
    cfg = self.config
    out = BertModel(cfg, add_pooling_layer=False, collect_hidden_states=True, name="bert")(
        input_ids, input_mask, segment_ids, deterministic=True)
    hidden = out["hidden_states"]
    features = jnp.concatenate([hidden[i] for i in self.feature_layers], axis=-1)
    return _BiLstmTagger(cfg, self.num_labels, self.lstm_size, self.lstm_layers, name="tagger")(
        jax.lax.stop_gradient(features), input_mask, deterministic)


def check_feature_layers(config: BertConfig, feature_layers) -> tuple[int, ...]:
  """`feature_layers` as indices into the hidden states (0 = the embeddings' output, -1 = the
  last layer); a clear error for a model that has fewer."""
  total = config.num_hidden_layers + 1
  layers = tuple(int(i) for i in feature_layers)
  bad = [i for i in layers if not -total <= i < total]
  if not layers or bad:
    raise ValueError(f"feature_layers={list(layers)}: the model has {config.num_hidden_layers} "
                     f"layers, so hidden states -{total}..{total - 1} (0 and -{total} are the "
                     "embeddings' output); pass fewer layers with --feature_layers.")
  return layers


class _BiLstmTagger(nn.Module):
  """Stacked bidirectional LSTMs (outputs of both directions concatenated) → linear."""
  config: BertConfig
  num_labels: int
  lstm_size: int
  lstm_layers: int

  @nn.compact
  def __call__(self, features, input_mask, deterministic: bool):
    cfg = self.config
    lengths = jnp.sum(input_mask.astype(jnp.int32), axis=-1)
    x = features.astype(jnp.float32)
    for i in range(self.lstm_layers):
      # The cells are named here, in this scope: the parameters are `forward_<i>/...` and
      # `backward_<i>/...` (the RNN wrappers hold none).
      x = nn.Bidirectional(nn.RNN(nn.OptimizedLSTMCell(self.lstm_size, name=f"forward_{i}")),
                           nn.RNN(nn.OptimizedLSTMCell(self.lstm_size, name=f"backward_{i}")))(
                               x, seq_lengths=lengths)
      x = Dropout(cfg.hidden_dropout_prob, cfg.dropout_bits)(x, deterministic=deterministic)
    return nn.Dense(self.num_labels, kernel_init=bert_initializer(cfg.initializer_range),
                    name="classifier")(x).astype(jnp.float32)


class BertForMultipleChoice(nn.Module):
  """One score per (context, ending) pair from the pooled [CLS] vector, as the paper's SWAG
  model (Section 4.4) and transformers' `BertForMultipleChoice`: the (batch, choices, length)
  inputs run through the encoder as batch × choices rows, dropout, a dense layer to one output
  (`classifier`), back to (batch, choices) float32 logits; the softmax over choices is the
  loss's. ELECTRA, without a pooler, reads its [CLS] output, as for classification.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True):
    cfg = self.config
    batch, choices, length = input_ids.shape
    rows = lambda x: x.reshape(batch * choices, length)
    out = BertModel(cfg, name="bert")(rows(input_ids), rows(input_mask), rows(segment_ids),
                                      deterministic=deterministic)
    pooled = Dropout(cfg.hidden_dropout_prob, cfg.dropout_bits)(out["pooled_output"],
                                                                deterministic=deterministic)
    logits = dense(cfg, 1, ("embed", "classes"), "classifier")(pooled.astype(jnp.dtype(cfg.dtype)))
    return logits.astype(jnp.float32).reshape(batch, choices)
