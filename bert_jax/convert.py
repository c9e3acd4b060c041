r"""Convert a BERT checkpoint between the kinds this package reads and writes.

    python -m bert_jax.convert --from=uncased_L-12_H-768_A-12/bert_model.ckpt --to=hf_dir \
        --format=hf
    python -m bert_jax.convert --from=WORKDIR --to=exported/bert_model.ckpt --format=tf1
    python -m bert_jax.convert --from=hf_dir --to=our_dir --format=orbax

`--from` is any kind (`interop.checkpoints.checkpoint_kind`): a TF1 prefix or its directory, a
Hugging Face directory, one of our workdirs or Orbax directories. `--format` is `hf`
(`config.json` + `model.safetensors`), `tf1` (Google's layout, `bert_config.json` beside it) or
`orbax` (a workdir that fine-tuning and pre-training read). The vocabulary kept beside the source
(`vocab.txt` or `spm.model`, with its hash in `vocab.json`) is copied beside the output; an Orbax
source says which step was exported.
"""

from __future__ import annotations

import os

from absl import app, flags

from bert_jax import cli
from bert_jax.interop import checkpoints, hf, tf1
from bert_jax.text import vocab_files

FLAGS = flags.FLAGS
FORMATS = ("hf", "tf1", "orbax")


def define_flags() -> None:
  flags.DEFINE_string("from", None, "Checkpoint to read (any kind).")
  flags.DEFINE_string("to", None, "Output directory (for tf1 also a prefix such as "
                      "DIR/bert_model.ckpt).")
  flags.DEFINE_enum("format", None, list(FORMATS), "What to write.")
  flags.DEFINE_string("bert_config_file", None, "Config of a TF1 checkpoint that has no "
                      "bert_config.json beside it.")


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


def convert(source: str, target: str, output_format: str,
            bert_config_file: str | None = None) -> str:
  """Reads `source` (any kind), writes `target` in `output_format`; returns what was written.
  Prints what was read (the load report, or the step of an Orbax checkpoint)."""
  if output_format not in FORMATS:
    raise ValueError(f"format={output_format!r}; expected one of {', '.join(FORMATS)}.")
  loaded = checkpoints.load_any(source, bert_config_file)
  detail = loaded.report.summary() if loaded.report else (
      f"{loaded.location} step {loaded.step}" if loaded.step is not None else loaded.location)
  print(f"read {checkpoints.KIND_NAMES[loaded.kind]}: {detail}")
  params = checkpoints.in_layout(loaded.params, loaded.config, False)
  if "teacher" in params:  # a distillation workdir: the model is the student; the teacher is
    params = {k: v for k, v in params.items() if k != "teacher"}  # its own checkpoint
    print("left out teacher/* (the distillation teacher: convert its own checkpoint)")
  config = loaded.config.replace(scan_layers=False)
  if output_format in ("hf", "tf1"):
    params = without_pretraining_only_heads(params)
  if output_format == "hf":
    written = hf.save_hf_checkpoint(params, config, target)
  elif output_format == "tf1":
    written = tf1.save_tf1_checkpoint(params, config, target)
  else:
    written = checkpoints.save_orbax_params(params, config, target)
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
  else:
    print(f"no vocabulary (vocab.txt, spm.model / spiece.model, vocab.json + merges.txt) "
          f"beside {source}: give the model's own to "
          "whatever reads the export (predict --vocab_file=...).")
  print(f"wrote {output_format}: {written}")
  return written


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  for name in ("from", "to", "format"):
    if not FLAGS[name].value:
      raise app.UsageError(f"--{name} is required.")
  convert(FLAGS["from"].value, FLAGS.to, FLAGS.format, FLAGS.bert_config_file)


if __name__ == "__main__":
  define_flags()
  app.run(cli.one_line_errors(main), flags_parser=cli.parse_flags)
