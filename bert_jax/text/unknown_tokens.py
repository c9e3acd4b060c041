"""The unknown-token policy: when a vocabulary's [UNK] rate on a text stops a run.

A damaged `vocab.txt` is refused at load, by file and line (`wordpiece.load_vocab`). One cut
short looks like any other, and so does one meant for another language or casing: its file is
fine, but most words fall apart into [UNK]. So the effect is checked where text is tokenized in
bulk, with whichever tokenizer: `count_unknown` and `check_unknown_rate` (data_prep's shards,
fine-tuning features) stop a run whose word pieces are mostly [UNK], naming the vocabulary and
the rate. The thresholds are one setting for every such place, so a vocabulary is refused the
same way wherever it is used.
"""

from __future__ import annotations

import itertools

import numpy as np
from absl import logging

from bert_jax.text import tokenization

# The share of [UNK] word pieces above which bulk tokenization (pre-training data, fine-tuning
# features) stops: a vocabulary that fits the text leaves well under 1% (BERT's uncased vocabulary
# on English prose: about 0.01%); one cut short or meant for another language or casing leaves
# tens of percent. Between WARN and MAX a warning is logged.
MAX_UNKNOWN_RATE = 0.1
WARN_UNKNOWN_RATE = 0.01
# Below this many pieces a rate says little (one emoji in a short question is 10%): warn only.
MIN_PIECES_TO_REFUSE = 200


def count_unknown(tokenizer: tokenization.Tokenizer, ids) -> tuple[int, int]:
  """(unknown pieces, pieces) in `ids` (an int array of any shape, or lists of ids); [PAD],
  [CLS], [SEP] and [MASK] are not counted, so model inputs can be passed as they are."""
  if isinstance(ids, np.ndarray):
    flat = ids.reshape(-1)
  else:
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64)
  special = np.isin(flat, [tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id,
                           tokenizer.mask_id])
  return int((flat == tokenizer.unk_id).sum()), int(flat.size - special.sum())


def check_unknown_rate(tokenizer: tokenization.Tokenizer, unknown: int, pieces: int, source: str,
                       *, max_rate: float = MAX_UNKNOWN_RATE, override: str = "") -> float:
  """The share of [UNK] among `pieces` word pieces of `source`; logs a warning above
  `WARN_UNKNOWN_RATE` and raises ValueError above `max_rate` (given enough pieces to tell).

  This is how a vocabulary cut short, or one that does not belong to the text (another
  language, cased text with an uncased vocabulary's accents stripped, ...) shows: its file looks
  fine, but most words fall apart into [UNK]. `override` names the setting that lets a run go on
  anyway (it ends the error message).
  """
  rate = unknown / pieces if pieces else 0.0
  if rate <= WARN_UNKNOWN_RATE:
    return rate
  message = (f"{source}: {rate:.1%} of {pieces:,} word pieces are [UNK] with "
             f"{tokenizer.vocab_source} ({tokenizer.vocab_size:,} entries): the vocabulary does "
             "not fit this text (a vocabulary file cut short, or one for other text?)")
  if rate > max_rate and pieces >= MIN_PIECES_TO_REFUSE:
    raise ValueError(message + (f"; {override} to go on anyway." if override else "."))
  logging.warning(message + ".")
  return rate
