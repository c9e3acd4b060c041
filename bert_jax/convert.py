r"""Convert a BERT checkpoint between the kinds this package reads and writes.

    python -m bert_jax.convert --from=uncased_L-12_H-768_A-12/bert_model.ckpt --to=hf_dir \
        --format=hf
    python -m bert_jax.convert --from=WORKDIR --to=exported/bert_model.ckpt --format=tf1
    python -m bert_jax.convert --from=hf_dir --to=our_dir --format=orbax

`--from` is any kind (`interop.checkpoints.checkpoint_kind`): a TF1 prefix or its directory, a
Hugging Face directory, one of our workdirs or Orbax directories. `--format` is `hf`
(`config.json` + `model.safetensors`), `tf1` (Google's layout, `bert_config.json` beside it) or
`orbax` (a workdir that fine-tuning and pre-training read). The vocabulary kept beside the source
(`vocab.txt`, `spm.model` or `vocab.json` + `merges.txt`, with their hashes in
`vocab_record.json`) is copied beside the output, with transformers' tokenizer files for `hf`;
an Orbax source says which step was exported. A fine-tuning output directory is written as its
task's model (`BertForSequenceClassification`, run_classifier.py's names, ...:
`interop/task_heads.py`); to Orbax it keeps its task, so `predict` serves the copy alike.

    python -m bert_jax.convert --from=out/sst2 --to=sst2_int8 --format=orbax --int8

writes the dense kernels as int8 with a scale per output and the embedding tables as int8 with
a scale per row (`model/int8.py`): ~4x smaller weights, which `predict` reads back as an int8
model. The other formats have no int8 BERT.
"""

from __future__ import annotations

from absl import app, flags

from bert_jax import cli
from bert_jax.interop import convert
from bert_jax.tasks import finetuned

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("from", None, "Checkpoint to read (any kind).")
  flags.DEFINE_string("to", None, "Output directory (for tf1 also a prefix such as "
                      "DIR/bert_model.ckpt).")
  flags.DEFINE_enum("format", None, list(convert.FORMATS), "What to write.")
  flags.DEFINE_string("bert_config_file", None, "Config of a TF1 checkpoint that has no "
                      "bert_config.json beside it.")
  flags.DEFINE_bool("int8", False, "With --format=orbax: write the dense kernels (a scale per "
                    "output) and embedding tables (a scale per row) as int8 (~4x smaller; "
                    "bert_jax/model/int8.py), read back by predict as an int8 model.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  for name in ("from", "to", "format"):
    if not FLAGS[name].value:
      raise app.UsageError(f"--{name} is required.")
  cli.prepare_process()
  finetuned.convert(FLAGS["from"].value, FLAGS.to, FLAGS.format, FLAGS.bert_config_file,
                    int8=FLAGS.int8)


if __name__ == "__main__":
  define_flags()
  app.run(cli.one_line_errors(main), flags_parser=cli.parse_flags)
