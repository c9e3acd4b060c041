"""Pre-training objectives: plug-ins of the training core (`training/objective.py`).

Each declares its model (encoder + heads), the batch features it reads and its metrics, and
returns loss and metric sums; the core's one step and one loop do the rest. A run config names
its objective (`config.objective`):

  mlm_nsp   BERT: masked-LM + next-sentence prediction (records of data_prep --objective=nsp)
  mlm_sop   ALBERT: masked-LM + sentence-order prediction (--objective=sop; model_type albert)
  mlm       RoBERTa: masked-LM alone (any records; the sentence label is not read)
  mlm_sbo   SpanBERT: masked-LM + the span boundary objective (any records; span masking)
  electra   ELECTRA: generator masked-LM + replaced-token detection (any records; electra_*)
  distill   DistilBERT: a student masked LM taught by a fixed teacher checkpoint (any records;
            config.distillation, configs/distill.py)
"""

from __future__ import annotations

from bert_jax.objectives.distillation import Distillation
from bert_jax.objectives.electra import ReplacedTokenDetection
from bert_jax.objectives.mlm import MaskedLm
from bert_jax.objectives.mlm_nsp import MaskedLmNextSentence
from bert_jax.objectives.mlm_sbo import MaskedLmSpanBoundary
from bert_jax.objectives.mlm_sop import MaskedLmSentenceOrder

OBJECTIVES = {"mlm_nsp": MaskedLmNextSentence, "mlm_sop": MaskedLmSentenceOrder,
              "mlm": MaskedLm, "mlm_sbo": MaskedLmSpanBoundary,
              "electra": ReplacedTokenDetection, "distill": Distillation}


def get_objective(name: str, **settings):
  """The objective called `name`, built with `settings` (sequence lengths, ...)."""
  if name not in OBJECTIVES:
    raise ValueError(f"Unknown objective {name!r}; known: {', '.join(sorted(OBJECTIVES))}.")
  return OBJECTIVES[name](**settings)
