"""A checkpoint of any kind read and written as another (`python -m bert_jax.convert`): the
params put in one layout, what the target format has no names for left out (and said), the
vocabulary copied beside the output."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from bert_jax import file_io
from bert_jax.interop import checkpoints, hf, hf_tokenizer, model_card, task_heads, tf1
from bert_jax.model import int8 as int8_lib
from bert_jax.model import pruning
from bert_jax.text import vocab_files

FORMATS = ("hf", "tf1", "orbax")

# Heads that only pre-training uses and that the released formats have no names for: written
# to Orbax, left out of Hugging Face and TF1 exports (SpanBERT's released checkpoints are the
# encoder and masked-LM head as well).
PRETRAINING_ONLY_HEADS = {"pair_target_predictions": "SpanBERT's span-boundary head"}


def without_pretraining_only_heads(params: dict) -> dict:
  """`params` without `cls/<head>` for each of `PRETRAINING_ONLY_HEADS`, saying what went."""
  heads_ = params.get("cls", {})
  dropped = [name for name in PRETRAINING_ONLY_HEADS if name in heads_]
  if not dropped:
    return params
  for name in dropped:
    print(f"left out cls/{name} ({PRETRAINING_ONLY_HEADS[name]}: pre-training only, no name "
          "in this format; --format=orbax keeps it)")
  return {**params, "cls": {k: v for k, v in heads_.items() if k not in dropped}}


def check_int8_format(output_format: str, int8: bool) -> None:
  """An int8 export is int8 kernels and tables with their scales (`model/int8.py`), which only
  our Orbax layout holds: Hugging Face's and Google's formats have no int8 BERT."""
  if int8 and output_format != "orbax":
    raise ValueError(f"--int8 needs --format=orbax: the {output_format} format has no int8 "
                     "BERT (int8 kernels with their scales); export the float model there.")


def convert(source: str, target: str, output_format: str,
            bert_config_file: str | None = None, head: task_heads.Head | None = None,
            int8: bool = False, metadata: Mapping[str, Any] | None = None) -> str:
  """Reads `source` (any kind), writes `target` in `output_format`; returns what was written.
  Prints what was read (the load report, or the step of an Orbax checkpoint). `head`: the task
  head of a fine-tuned `source`, written as its task class (`task_heads.py`). `int8` (Orbax
  only): the dense kernels and embedding tables quantized (`model/int8.py`), the sizes
  printed. `metadata`: what an Orbax output records beside its weights (a fine-tuned run's task
  and settings). An int8 source written to another format is written as the float values its
  kernels and tables stand for."""
  if output_format not in FORMATS:
    raise ValueError(f"format={output_format!r}; expected one of {', '.join(FORMATS)}.")
  check_int8_format(output_format, int8)
  loaded = checkpoints.load_any(source, bert_config_file)
  detail = loaded.report.summary() if loaded.report else (
      f"{loaded.location} step {loaded.step}" if loaded.step is not None else loaded.location)
  print(f"read {checkpoints.KIND_NAMES[loaded.kind]}: {detail}")
  params = checkpoints.in_layout(loaded.params, loaded.config, False)
  if "teacher" in params:  # a distillation workdir: the model is the student; the teacher is
    params = {k: v for k, v in params.items() if k != "teacher"}  # its own checkpoint
    print("left out teacher/* (the distillation teacher: convert its own checkpoint)")
  config = loaded.config.replace(scan_layers=False)
  if config.quantization == "int8" and output_format != "orbax":
    config, params = config.replace(quantization="none"), int8_lib.dequantize_params(params)
    print("int8 kernels and tables written as the float32 values they stand for (this format "
          "has no int8)")
  if output_format in ("hf", "tf1"):
    params = without_pretraining_only_heads(params)
    if config.pruned_heads is not None:
      config, params = pruning.restore_heads(params, config)
      print(f"{sum(map(len, loaded.config.pruned_heads))} pruned heads written back as zero "
            "heads (this format has no pruned layers; the outputs are the pruned model's)")
  if output_format == "hf":
    written = hf.save_hf_checkpoint(params, config, target, head)
  elif output_format == "tf1":
    written = tf1.save_tf1_checkpoint(params, config, target, head)
  else:
    if int8:
      counts = (int8_lib.kernel_bytes, int8_lib.table_bytes, int8_lib.parameter_bytes)
      before = [count(params) for count in counts]
      config, params = int8_lib.quantize_model(config, params)
      after = [count(params) for count in counts]
      print(f"int8: dense kernels {before[0] / 1e6:.2f} MB -> {after[0] / 1e6:.2f} MB "
            f"({before[0] / max(after[0], 1):.2f}x smaller, scales included); embedding tables "
            f"{before[1] / 1e6:.2f} MB -> {after[1] / 1e6:.2f} MB "
            f"({before[1] / max(after[1], 1):.2f}x smaller); all parameters "
            f"{before[2] / 1e6:.2f} MB -> {after[2] / 1e6:.2f} MB")
    written = checkpoints.save_orbax_params(params, config, target, metadata)
  # The vocabulary travels with the weights: every consumer of a checkpoint needs both.
  source_dir = tf1.dirname(loaded.location) if loaded.kind == "tf1" else source
  target_dir = tf1.dirname(written) if output_format == "tf1" else written
  candidates = [source_dir or "."]
  if loaded.kind == "orbax":  # a checkpoints/ folder or one of its steps: the run dir above
    candidates += [os.path.dirname(loaded.location.rstrip("/")),
                   os.path.dirname(os.path.dirname(loaded.location.rstrip("/")))]
  kept = next((k for k in (vocab_files.copy_kept(c, target_dir or ".") for c in candidates
                           if c) if k), None)
  if kept:
    print(f"copied the vocabulary: {kept}")
    if output_format == "hf":
      try:
        print(f"wrote {hf_tokenizer.write(target_dir, config)} for transformers' AutoTokenizer")
      except ValueError as e:
        print(f"no tokenizer_config.json: {e}; give transformers the tokenizer yourself.")
  else:
    print(f"no vocabulary (vocab.txt, spm.model / spiece.model, vocab.json + merges.txt) "
          f"beside {source}: give the model's own to "
          "whatever reads the export (predict --vocab_file=...).")
  if output_format == "hf":
    architecture = json.loads(file_io.read_text(file_io.join(written, "config.json")))[
        "architectures"][0]
    origin = f"{checkpoints.KIND_NAMES[loaded.kind]} {loaded.location}" + (
        f" (step {loaded.step})" if loaded.step is not None else "")
    kept_files = vocab_files.find_beside(target_dir) if kept else None
    card = model_card.write(written, config, architecture, origin, head,
                            model_card.run_directory(candidates) if loaded.kind == "orbax"
                            else None, kept_files.do_lower_case if kept_files else None)
    print(f"wrote the model card: {card}")
  print(f"wrote {output_format}: {written}")
  return written
