"""ALBERT's pre-training objective: masked-LM + sentence-order prediction (Lan et al. 2020).

SOP replaces BERT's next-sentence prediction: both segments are consecutive text of one
document, and the head tells whether they come in their order or swapped (data_prep
`--objective=sop` writes the label in `next_sentence_labels`, 1 = swapped). The loss, the
packed layout (per-instance labels) and the metrics are the next-sentence objective's
(`mlm_nsp.MaskedLmSentencePair`), named `sop_*`.

The head is ALBERT's `cls/sop_classifier`, so only `model_type="albert"` trains this objective:
the other families' second head is the next-sentence head (`cls/seq_relationship`), and an SOP
classifier stored under that name would later be read as an NSP head. BERT or RoBERTa with
sentence order would need a sentence-order head of their own name; they are refused for now.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bert_jax.model import heads
from bert_jax.model.configuration import BertConfig
from bert_jax.objectives.mlm_nsp import MaskedLmSentencePair


@dataclasses.dataclass(frozen=True)
class MaskedLmSentenceOrder(MaskedLmSentencePair):
  """Masked-LM + sentence-order prediction on the pooled [CLS] (ALBERT)."""
  name: str = "mlm_sop"
  sentence_objective: ClassVar[str] = "sop"
  prefix: ClassVar[str] = "sop"
  positive_sum: ClassVar[str] = "sop_swapped_sum"

  def model(self, bert_config: BertConfig) -> heads.BertForPreTraining:
    if bert_config.model_type != "albert":
      raise ValueError(
          f"objective mlm_sop needs model_type 'albert' (its sentence-order head "
          f"cls/sop_classifier), not {bert_config.model_type!r}: use an albert_* preset "
          "(--config.model.preset=albert_base) or --config.objective=mlm.")
    return super().model(bert_config)
