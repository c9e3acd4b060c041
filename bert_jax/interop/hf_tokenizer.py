"""The tokenizer files of a Hugging Face export: `tokenizer_config.json` and
`special_tokens_map.json` beside the copied vocabulary, so that transformers' `AutoTokenizer`
reads it as the model was trained: the family's tokenizer, its special tokens, the lower-casing
the vocabulary's record keeps (a cased model read lower-cased turns `Linux` into `linux`,
silently), and the longest input the position table takes.

WordPiece vocabularies also get `tokenizer.json`, the tokenizer's own pipeline as the
`tokenizers` library saves it, read by transformers' generic fast tokenizer: transformers'
`BertTokenizer` builds its own from `vocab.txt` and turns words of 101–200 characters into
[UNK], where the original (and this package) splits them. RoBERTa's and ALBERT's files are read
by transformers' own classes, which split text as this package does.

A SentencePiece model in BERT's layout (`spm.model`) has no transformers tokenizer that reads it
as this package does; the export says so and writes none.
"""

from __future__ import annotations

import json

from bert_jax import file_io
from bert_jax.model.configuration import BertConfig
from bert_jax.text import vocab_files

CONFIG_NAME = vocab_files.HF_TOKENIZER_CONFIG
SPECIAL_TOKENS_NAME = "special_tokens_map.json"

_WORDPIECE_SPECIALS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                       "cls_token": "[CLS]", "mask_token": "[MASK]"}
_SPECIALS = {
    "wordpiece": _WORDPIECE_SPECIALS,
    "albert": {"bos_token": "[CLS]", "eos_token": "[SEP]", "unk_token": "<unk>",
               "sep_token": "[SEP]", "pad_token": "<pad>", "cls_token": "[CLS]",
               "mask_token": "[MASK]"},
    "roberta": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>",
                "pad_token": "<pad>", "cls_token": "<s>", "mask_token": "<mask>"},
}
TOKENIZER_JSON = "tokenizer.json"


def tokenizer_config(files: vocab_files.VocabularyFiles, config: BertConfig) -> dict | None:
  """transformers' `tokenizer_config.json` for the model's vocabulary `files`; None where no
  transformers tokenizer reads them as this package does (SentencePiece in BERT's layout)."""
  lower = files.do_lower_case if files.do_lower_case is not None else True  # as `load` reads
  max_length = config.max_position_embeddings - config.position_offset
  if files.byte_level:
    kind, values = "roberta", {"tokenizer_class": "RobertaTokenizer", "add_prefix_space": False,
                               "errors": "replace"}
  elif files.spm_model_file:
    if files.flavour != "albert" and config.model_type != "albert":
      return None
    kind, values = "albert", {"tokenizer_class": "AlbertTokenizer", "do_lower_case": lower,
                              "keep_accents": False, "remove_space": True}
  else:  # the pipeline is tokenizer.json's; the fields say what it does
    kind, values = "wordpiece", {
        "tokenizer_class": "PreTrainedTokenizerFast", "do_lower_case": lower,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"]}
  return {**values, **_SPECIALS[kind], "model_max_length": max_length}


def write(directory: str, config: BertConfig) -> str:
  """Writes the tokenizer files beside the vocabulary kept in `directory`; returns what it
  wrote, for the message. ValueError, and nothing written, where transformers would not read
  the vocabulary as this package does (or it is not one a tokenizer loads)."""
  files = vocab_files.find_beside(directory)
  if files is None:
    raise ValueError(f"no vocabulary in {directory}")
  values = tokenizer_config(files, config)
  if values is None:
    raise ValueError("transformers has no tokenizer that reads a SentencePiece model in BERT's "
                     "layout as this package does")
  specials = {k: v for k, v in values.items() if k.endswith("_token")}
  if not (files.byte_level or files.spm_model_file):
    tokenizer = files.load(config.model_type)  # refuses a vocabulary without its specials
    file_io.write_text_atomic(file_io.join(directory, TOKENIZER_JSON),
                              tokenizer.tokenizers_json())
  file_io.write_text_atomic(file_io.join(directory, CONFIG_NAME),
                            json.dumps(values, indent=2, sort_keys=True) + "\n")
  file_io.write_text_atomic(file_io.join(directory, SPECIAL_TOKENS_NAME),
                            json.dumps(specials, indent=2, sort_keys=True) + "\n")
  return (f"{CONFIG_NAME} ({values['tokenizer_class']}"
          + (f" over {TOKENIZER_JSON}" if values["tokenizer_class"] == "PreTrainedTokenizerFast"
             else "")
          + (f", do_lower_case={values['do_lower_case']}" if "do_lower_case" in values else "")
          + f", model_max_length={values['model_max_length']})")
