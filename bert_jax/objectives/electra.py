"""ELECTRA's replaced-token detection (Clark et al. 2020) as a plug-in of the training core.

A small generator is trained as a masked LM on the records' masks; its samples fill the masked
slots; the discriminator labels every real token replaced or original (a sample equal to the
original counts as original). Both train jointly in the one jitted step:

    loss = generator MLM loss + λ · discriminator loss,   λ = 50 (`disc_weight`)

the MLM term the weighted mean over masked slots (BERT's, `MaskedLm.masked_lm_terms`), the
discriminator's the sigmoid cross-entropy averaged over the batch's real tokens. The sample is
drawn from the generator's softmax (temperature 1) under `stop_gradient`: the discriminator's
loss does not reach the generator through it (the paper's non-adversarial training).

Records: any pre-training records (static or dynamic masks, packed or not); the sentence label
is not read. ELECTRA masks 15% (25% for Large) — the records' `masked_lm_prob` and
`max_predictions_per_seq` — and data_prep's 80/10/10 replacement stands in for ELECTRA's own
masking (which writes [MASK] 85% of the time and keeps the token otherwise); the generator learns
from both alike.

Metrics: the generator's `mlm_loss`/`mlm_accuracy`; `sampled_original` — the share of masked
slots whose sample equals the original token (those count as original); the discriminator's
`disc_loss`, `disc_accuracy` over real tokens, and `disc_precision` / `disc_recall` on the
replaced tokens; `loss`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax.numpy as jnp
from absl import logging

from bert_jax.model import electra, modeling
from bert_jax.model.configuration import BertConfig
from bert_jax.objectives.mlm import MaskedLm
from bert_jax.text import features
from bert_jax.training import perf


@dataclasses.dataclass(frozen=True)
class ReplacedTokenDetection(MaskedLm):
  """Generator MLM + `disc_weight` × replaced-token detection. `temperature` divides the
  generator's logits before sampling (ELECTRA's 1.0)."""
  name: str = "electra"
  disc_weight: float = 50.0
  temperature: float = 1.0
  head_scopes = ("discriminator_predictions", "generator", "generator_predictions")
  loss_parts = ("mlm", "disc")

  def __post_init__(self):
    super().__post_init__()
    if self.disc_weight < 0 or self.temperature <= 0:
      raise ValueError(f"objective electra: disc_weight={self.disc_weight} must be >= 0 and "
                       f"temperature={self.temperature} > 0.")

  def model(self, bert_config: BertConfig) -> electra.ElectraForPreTraining:
    if bert_config.model_type != "electra" or not bert_config.has_generator:
      raise ValueError(
          "objective electra needs an ELECTRA model with a generator (model_type 'electra' "
          "and generator_hidden_size set): use an electra_* preset "
          f"(--config.model.preset=electra_small); got model_type={bert_config.model_type!r}"
          f", generator_hidden_size={bert_config.generator_hidden_size}.")
    logging.info("%s", modeling.attention_kernel_description(bert_config))
    return electra.ElectraForPreTraining(bert_config, self.temperature)

  @property
  def input_names(self) -> tuple[str, ...]:
    names = features.ENCODER_INPUTS + (features.MASKED_LM_POSITIONS, features.MASKED_LM_IDS,
                                       features.MASKED_LM_WEIGHTS)
    if self.packed:
      names += (features.POSITION_IDS, features.SEQUENCE_IDS)
    return names

  def denominators(self, batch):
    out = super().denominators(batch)
    out["disc"] = jnp.sum(batch[features.INPUT_MASK].astype(jnp.float32)) + 1e-6
    return out

  def loss(self, outputs, batch, denominators):
    loss, sums = self.masked_lm_terms(outputs["mlm_logits"], batch, denominators)
    disc = electra.discriminator_loss(outputs["disc_logits"], outputs["disc_labels"],
                                      batch[features.INPUT_MASK])
    weights = batch[features.MASKED_LM_WEIGHTS].astype(jnp.float32)
    same = (outputs["sampled"] == batch[features.MASKED_LM_IDS]).astype(jnp.float32)
    sums.update({f"disc_{k}": v for k, v in disc.items()})
    sums["sampled_original_sum"] = jnp.sum(same * weights)
    return loss + self.disc_weight * disc["loss_sum"] / denominators["disc"], sums

  def summarize(self, sums: Mapping[str, Any]) -> dict[str, float]:
    out = super().summarize(sums)
    if "disc_loss" in out and "mlm_loss" in out:
      out["loss"] = out["mlm_loss"] + self.disc_weight * out["disc_loss"]
    return out

  def summarize_heads(self, sums: Mapping[str, Any]) -> dict[str, float]:
    if "disc_loss_sum" not in sums:
      return {}
    real = max(float(sums["disc_weight_sum"]), 1e-6)
    tp = float(sums["disc_true_positive_sum"])
    out = {"disc_loss": float(sums["disc_loss_sum"]) / real,
           "disc_accuracy": float(sums["disc_correct_sum"]) / real,
           "disc_precision": tp / max(float(sums["disc_predicted_sum"]), 1e-6),
           "disc_recall": tp / max(float(sums["disc_replaced_sum"]), 1e-6),
           "replaced_share": float(sums["disc_replaced_sum"]) / real}
    out["sampled_original"] = (float(sums["sampled_original_sum"])
                               / max(float(sums["mlm_weight_sum"]), 1e-5))
    return out

  def flops_per_step(self, bert_config: BertConfig, batch_size: int) -> float:
    """Both encoders over every token (with their E→H projections), the generator's head at
    the masked slots (2·Hg·E + 2·E·V) and the discriminator's over every token (2H² + 2H)."""
    gen = bert_config.generator_config()
    length = self.max_seq_length
    tokens = batch_size * length
    forward = (perf.encoder_forward_flops(bert_config, batch_size, length)
               + perf.encoder_forward_flops(gen, batch_size, length))
    for cfg in (bert_config, gen):
      if cfg.factorized_embeddings:
        forward += 2 * tokens * cfg.embedding_width * cfg.hidden_size
    e, v, h = gen.embedding_width, gen.vocab_size, bert_config.hidden_size
    forward += batch_size * self.max_predictions_per_seq * (2 * gen.hidden_size * e + 2 * e * v)
    forward += tokens * (2 * h * h + 2 * h)
    return perf.training_flops(forward)

