r"""Fine-tuning on GLUE, your own TSV tasks, SQuAD, CoNLL-2003 tagging and SWAG, with the flags
of the original `run_classifier.py` and `run_squad.py`.

    python -m bert_jax.finetune --task_name=MRPC --data_dir=glue/MRPC \
        --init_checkpoint=PRETRAIN_WORKDIR_OR_HF_DIR --vocab_file=vocab.txt --do_lower_case \
        --output_dir=out/mrpc --do_train --do_eval --do_predict \
        --max_seq_length=128 --train_batch_size=32 --learning_rate=2e-5 --num_train_epochs=3

    python -m bert_jax.finetune --task_name=squad [--version_2_with_negative] \
        --train_file=train-v1.1.json --predict_file=dev-v1.1.json \
        --init_checkpoint=... --vocab_file=vocab.txt --output_dir=out/squad --do_train --do_predict \
        --max_seq_length=384 --doc_stride=128 --train_batch_size=32 --learning_rate=3e-5 \
        --num_train_epochs=2

    python -m bert_jax.finetune --task_name=conll2003 --data_dir=conll2003 \
        --init_checkpoint=... --output_dir=out/ner --do_train --do_eval --do_predict \
        --document_context [--feature_based] --max_seq_length=128 --learning_rate=5e-5

    python -m bert_jax.finetune --task_name=swag --data_dir=swagaf/data \
        --init_checkpoint=... --output_dir=out/swag --do_train --do_eval \
        --train_batch_size=16 --learning_rate=2e-5 --num_train_epochs=3

    python -m bert_jax.finetune --config=configs/glue.py:mrpc --data_dir=glue/MRPC \
        --init_checkpoint=... --vocab_file=vocab.txt --output_dir=out/mrpc

Every setting is a field of a config (`--config=configs/glue.py:<task>`, `configs/squad.py:v1`,
`configs/tagging.py:conll2003`, `configs/swag.py`;
by default `bert_jax/runs/finetune_config.py`); the original flags keep their names and, when
given, override it, as does `--config.<field>=<value>`. `--init_checkpoint` is one of our
pre-training workdirs (or its `checkpoints/`), a Hugging Face BERT directory or Google's TF1
checkpoint (`bert_config.json` beside it is read unless `--bert_config_file` is given); the
encoder is loaded and the task's head starts from its initialisation. A run whose
`--output_dir` already holds its checkpoint resumes it (or, finished, evaluates it).
This module only parses flags; `bert_jax.tasks.registry` names the task's kind, whose
`run.py` is the run (`tasks/classification`, `squad`, `tagging`, `multiple_choice`).
"""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from bert_jax import cli
from bert_jax.runs import finetune_config, finetune_job
from bert_jax.tasks import registry
from bert_jax.text import vocab_files

FLAGS = flags.FLAGS

def define_flags() -> None:
  """The original run_classifier.py / run_squad.py flags, defined only when run as a program."""
  config_flags.DEFINE_config_file("config", finetune_config.__file__,
                                  "Fine-tuning config (configs/glue.py:<task>, "
                                  "configs/squad.py:<v1|v2>).", lock_config=True)
  for name, kind, help_text in finetune_config.ORIGINAL_FLAGS:
    getattr(flags, f"DEFINE_{kind}")(name, None, help_text)
  cli.define_vocab_flags()
  cli.define_distributed_flags()


def config_from_flags():
  """The config file's settings with every original flag that was given on top."""
  config = FLAGS.config
  for name, _, _ in finetune_config.ORIGINAL_FLAGS:
    if FLAGS[name].present:
      value = FLAGS[name].value
      if name == "feature_layers":
        try:
          value = tuple(int(i) for i in value)
        except ValueError:
          raise app.UsageError(f"--feature_layers={','.join(value)}: expected layer indices "
                               "such as -1,-2,-3,-4.") from None
      config[name] = value
  return config


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = config_from_flags()
  for name in ("task_name", "output_dir"):
    if not config[name]:
      raise app.UsageError(f"--{name} is required.")
  if not (config.do_train or config.do_eval or config.do_predict):
    raise app.UsageError("At least one of --do_train, --do_eval, --do_predict.")
  cli.prepare_process()
  cli.initialize_distributed_from_flags()
  # The model the run reads: the output directory's own when it holds one with its vocabulary
  # (a finished run, evaluated again), else --init_checkpoint; the vocabulary is beside it.
  out = config.output_dir
  model = out if finetune_job.recorded(out) and vocab_files.find_beside(out) else None
  registry.run_from_config(
      config, cli.tokenizer_from_flags(model or config.init_checkpoint, config.bert_config_file))


if __name__ == "__main__":
  define_flags()
  app.run(cli.one_line_errors(main), flags_parser=cli.parse_flags)
