"""ELECTRA's pre-training model (Clark et al. 2020, "ELECTRA: Pre-training Text Encoders as
Discriminators Rather Than Generators"): a small masked-LM generator and the discriminator it
trains, in one module so that one jitted step runs both.

The generator fills the masked positions with tokens sampled from its own distribution; the
discriminator reads the result and labels every real token replaced or original. The two share
the embedding tables (word, position, token type and their LayerNorm: ELECTRA's tied
`electra/embeddings` scope); each projects them to its own width when the widths differ.

Parameter paths (the name table maps them to Google's TF1 names and to Hugging Face's
`ElectraForPreTraining` + `ElectraForMaskedLM`):
  bert/embeddings/...                      shared tables (TF1 `electra/embeddings`)
  bert/encoder/embedding_hidden_mapping_in E → H of the discriminator (`electra/embeddings_project`)
  bert/encoder/layer_{i}/...               the discriminator (`electra/encoder/layer_{i}`)
  discriminator_predictions/{dense,dense_prediction}
  generator/encoder/...                    the generator's projection and layers
  generator_predictions/...                its masked-LM head (decoder tied to the shared table)
The discriminator is an ordinary encoder at `bert`, so fine-tuning and feature extraction read
it as any BERT; the generator is dropped there.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.model import heads, modeling
from bert_jax.model.configuration import BertConfig

# The discriminator logit's axis: one output, never sharded.
_ONE = "classes"


class DiscriminatorHead(nn.Module):
  """dense → activation → dense to one logit per token (`discriminator_predictions`): the
  logit says "this token was replaced"."""
  config: BertConfig

  @nn.compact
  def __call__(self, sequence_output):
    cfg = self.config
    x = modeling.dense(cfg, cfg.hidden_size, ("embed", "embed_out"), "dense")(sequence_output)
    x = modeling.activation_fn(cfg.hidden_act)(x)
    x = modeling.dense(cfg, 1, ("embed", _ONE), "dense_prediction")(x)
    return x[..., 0].astype(jnp.float32)


class GeneratorEncoder(nn.Module):
  """The generator's encoder (`generator/encoder`), fed the shared embeddings' output."""
  config: BertConfig  # the generator's own (`BertConfig.generator_config()`)

  @nn.compact
  def __call__(self, embedded, input_mask, deterministic: bool, sequence_ids=None):
    encoder = modeling.encoder_class(self.config)(self.config, name="encoder")
    out, _ = encoder(embedded, input_mask, deterministic, sequence_ids)
    return out


def replace_masked(input_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights, sampled):
  """The discriminator's input: `input_ids` with every masked slot of weight > 0 holding
  `sampled`, and the labels (1 = the token differs from the original). The original tokens
  are first put back (`masked_lm_ids`), so a slot whose sample equals the original — or a
  record's "10% unchanged" slot — is labelled original, as in ELECTRA."""
  input_ids = jnp.asarray(input_ids)
  batch = jnp.arange(input_ids.shape[0])[:, None]
  positions = masked_lm_positions.astype(jnp.int32)
  real = masked_lm_weights > 0
  original = input_ids.at[batch, positions].set(
      jnp.where(real, masked_lm_ids.astype(input_ids.dtype), input_ids[batch, positions]))
  corrupted = original.at[batch, positions].set(
      jnp.where(real, sampled.astype(input_ids.dtype), original[batch, positions]))
  return corrupted, (corrupted != original).astype(jnp.int32)


class ElectraForPreTraining(nn.Module):
  """Generator + discriminator. `config` is the discriminator's, with the `generator_*` fields.

  `__call__` samples replacements from the generator (the "sample" RNG stream; no gradient
  flows through the sample) and returns a dict: `mlm_logits` (batch, P, vocab) of the
  generator at the masked slots, `sampled` (batch, P), `disc_logits` (batch, length) and
  `disc_labels` (batch, length). `generate` and `discriminate` run one half each.
  `temperature` divides the generator's logits before sampling (ELECTRA's 1.0).
  """
  config: BertConfig
  temperature: float = 1.0

  def setup(self):
    cfg = self.config
    self.bert = modeling.BertModel(cfg, add_pooling_layer=False)
    self.discriminator_predictions = DiscriminatorHead(cfg)
    if cfg.has_generator:
      gen = cfg.generator_config()
      self.generator = GeneratorEncoder(gen)
      self.generator_predictions = heads.MaskedLMHead(gen)

  def generate(self, input_ids, input_mask, segment_ids, masked_lm_positions,
               position_ids=None, sequence_ids=None, deterministic: bool = True):
    """The generator's masked-LM logits at `masked_lm_positions` (float32)."""
    embedded = self.bert.embed(input_ids, segment_ids, position_ids, deterministic)
    out = self.generator(embedded, input_mask, deterministic, sequence_ids)
    return self.generator_predictions(out, masked_lm_positions, self.bert.attend)

  def discriminate(self, input_ids, input_mask, segment_ids, position_ids=None,
                   sequence_ids=None, deterministic: bool = True):
    """One replaced-token logit per position (float32)."""
    out = self.bert(input_ids, input_mask, segment_ids, position_ids,
                    deterministic=deterministic, sequence_ids=sequence_ids)
    return self.discriminator_predictions(
        out["sequence_output"].astype(jnp.dtype(self.config.dtype)))

  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids,
               masked_lm_weights, position_ids=None, sequence_ids=None,
               deterministic: bool = True):
    mlm_logits = self.generate(input_ids, input_mask, segment_ids, masked_lm_positions,
                               position_ids, sequence_ids, deterministic)
    sampled = jax.random.categorical(self.make_rng("sample"),
                                     jax.lax.stop_gradient(mlm_logits) / self.temperature)
    corrupted, labels = replace_masked(input_ids, masked_lm_positions, masked_lm_ids,
                                       masked_lm_weights, sampled)
    disc_logits = self.discriminate(corrupted, input_mask, segment_ids, position_ids,
                                    sequence_ids, deterministic)
    return {"mlm_logits": mlm_logits, "sampled": sampled, "disc_logits": disc_logits,
            "disc_labels": labels}


def discriminator_loss(logits, labels, weights) -> dict[str, jax.Array]:
  """Sums of ELECTRA's sigmoid cross-entropy over the positions of weight 1 (real tokens),
  and of the counts its accuracy, precision and recall are made of."""
  weights = weights.astype(jnp.float32)
  labels_f = labels.astype(jnp.float32)
  losses = jnp.maximum(logits, 0) - logits * labels_f + jnp.log1p(jnp.exp(-jnp.abs(logits)))
  predicted = (logits > 0).astype(jnp.float32)
  return {"loss_sum": jnp.sum(losses * weights),
          "weight_sum": jnp.sum(weights),
          "correct_sum": jnp.sum((predicted == labels_f) * weights),
          "predicted_sum": jnp.sum(predicted * weights),
          "replaced_sum": jnp.sum(labels_f * weights),
          "true_positive_sum": jnp.sum(predicted * labels_f * weights)}


def generator_as_masked_lm(config: BertConfig, params: dict) -> tuple[BertConfig, dict]:
  """ELECTRA's generator as a plain masked LM (`heads.BertForMaskedLM` of the generator's
  config): the shared embedding tables, the generator's encoder (its E → H projection is where
  a factorized encoder keeps one) and its head. What fill-in-the-[MASK] uses of an ELECTRA
  model: the discriminator predicts no tokens."""
  tree = {"bert": {"embeddings": params["bert"]["embeddings"],
                   "encoder": params["generator"]["encoder"]},
          "cls": {"predictions": params["generator_predictions"]}}
  return config.generator_config(), tree
