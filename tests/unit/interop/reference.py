"""What the parity tests of this room share: the sentences and pairs they encode, the tolerance,
and the reference (transformers' PyTorch model) applied to a batch in our layout."""

import torch

TOL = 1e-5

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "BERT reads text in both directions at once.",
    "Unaffable, naïve café-goers didn't pay €5!",
    "Short.",
]
PAIRS = [
    ("Where is the station?", "It is two streets north of the old market square, near the river."),
    ("A man is playing a guitar.", "Someone plays music."),
]


def _reference(torch_model, batch, **kwargs):
  """The reference model on a batch in our layout (no gradients)."""
  with torch.no_grad():
    return torch_model(input_ids=torch.tensor(batch["input_ids"]),
                       attention_mask=torch.tensor(batch["input_mask"]),
                       token_type_ids=torch.tensor(batch["segment_ids"]), **kwargs)


def _encode(tokenizer, texts):
  enc = tokenizer(texts, padding=True, return_tensors="np")
  return enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]
