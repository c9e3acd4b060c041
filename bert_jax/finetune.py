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
from bert_jax.runs import finetune_config
from bert_jax.tasks import registry

FLAGS = flags.FLAGS

# The original flags: (name, kind, help). Their defaults are the config's.
ORIGINAL_FLAGS = (
    ("task_name", "string", "GLUE task (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI), "
                            "'squad' / 'squad_v2', 'conll2003' (or 'tagging' with "
                            "--label_list), 'swag' / 'hellaswag', or 'custom' with "
                            "--label_list."),
    ("data_dir", "string", "The task's directory (GLUE TSV files, CoNLL files, SWAG CSV or "
                           "HellaSwag JSONL files) or a tfds data_dir."),
    ("data_format", "string", "auto (the task's files if the directory holds them, else "
                              "tensorflow-datasets), tsv (GLUE), conll (tagging) or tfds."),
    ("bert_config_file", "string", "bert_config.json (default: the checkpoint's)."),
    ("init_checkpoint", "string", "Pre-trained encoder: our workdir/checkpoint, a Hugging Face "
                                  "directory, or a TF1 checkpoint prefix (.../bert_model.ckpt) "
                                  "or its directory."),
    ("output_dir", "string", "Checkpoints, metrics, predictions."),
    ("max_seq_length", "integer", "Maximum total input length in tokens (128; SQuAD 384)."),
    ("train_batch_size", "integer", "Training batch size (32)."),
    ("eval_batch_size", "integer", "Evaluation batch size (8)."),
    ("predict_batch_size", "integer", "Prediction batch size (8)."),
    ("learning_rate", "float", "Peak learning rate of Adam (5e-5)."),
    ("num_train_epochs", "float", "Training epochs (3)."),
    ("warmup_proportion", "float", "Fraction of steps with linear warmup (0.1)."),
    ("do_train", "bool", "Fine-tune."),
    ("do_eval", "bool", "Evaluate on the dev split(s)."),
    ("do_predict", "bool", "Write predictions for the test split(s) (SQuAD: --predict_file)."),
    ("seed", "integer", "Seed for the head's init, dropout and shuffling (12345)."),
    ("label_list", "list", "custom task: the labels (omit with --regression); tagging: the "
                           "tags (O,B-PER,I-PER,...) or the entity types (PER,LOC,...)."),
    ("regression", "bool", "custom task: one real-valued output."),
    ("text_a_column", "integer", "custom task: column of the first text (0)."),
    ("text_b_column", "integer", "custom task: column of the second text, if any."),
    ("label_column", "integer", "custom task: column of the label (1)."),
    ("has_header", "string", "custom task: whether the TSV files start with a header line: "
                             "auto (decided from the first line, and said), true or false."),
    ("train_file", "string", "SQuAD: official training JSON (train-v1.1.json)."),
    ("predict_file", "string", "SQuAD: JSON to predict (dev-v1.1.json); scored when it has "
                               "answers."),
    ("version_2_with_negative", "bool", "SQuAD 2.0: questions may have no answer."),
    ("doc_stride", "integer", "SQuAD: distance between context windows, in tokens (128)."),
    ("max_query_length", "integer", "SQuAD: question tokens kept (64)."),
    ("n_best_size", "integer", "SQuAD: candidates per question in nbest_predictions.json (20)."),
    ("max_answer_length", "integer", "SQuAD: longest answer, in tokens (30)."),
    ("null_score_diff_threshold", "float", "SQuAD 2.0: predict no answer when null score - best "
                                           "score exceeds this (eval_results.json reports the "
                                           "best threshold on dev) (0)."),
    # Not original flags: evaluation during training and early stopping.
    ("eval_every_steps", "integer", "Score the dev data every this many training steps (with "
                                    "--do_eval) and keep the best model in <output_dir>/best "
                                    "(default: once, after training)."),
    ("eval_metric", "string", "The dev score that picks the best model, as eval_results.json "
                              "names it (default: the task's own: accuracy, f1, "
                              "matthews_corr, pearson, ...)."),
    ("early_stopping_patience", "integer", "Stop training after this many evaluations "
                                           "(--eval_every_steps) without a better "
                                           "--eval_metric (default: never)."),
    # Not original flags: the one switch of sequence packing, and ELECTRA's layer-wise decay.
    ("packing", "bool", "Pack several examples into each row of --max_seq_length (same "
                        "examples per step, fewer rows; see finetune_config)."),
    ("layerwise_lr_decay", "float", "Layer-wise learning-rate decay (ELECTRA): each layer "
                                    "down from the head learns at this factor of the rate of "
                                    "the one above; 0 is off (0; ELECTRA: 0.8 base, 0.9 "
                                    "large)."),
    ("teacher_checkpoint", "string", "Distil a fine-tuned teacher (the --output_dir of its "
                                     "fine-tuning run on this task) into the model being "
                                     "fine-tuned (GLUE-style tasks)."),
    ("distill_temperature", "float", "Temperature T of the teacher's and student's softmax "
                                     "(2.0, DistilBERT's task distillation)."),
    ("distill_alpha", "float", "Weight of the teacher's soft targets (x T²); 1 - alpha goes "
                               "to the labels (0.5)."),
    # Token tagging (conll2003, or `tagging` over CoNLL-layout files with --label_list).
    ("tagging_scheme", "string", "tagging: how the files write their tags: auto (detected: "
                                 "IOB1 as CoNLL-2003 was released, or IOB2), iob1 or iob2."),
    ("document_context", "bool", "tagging: fill each window with the sentences around it in "
                                 "its document (the paper's setting); else the sentence alone."),
    ("feature_based", "bool", "tagging: the paper's feature-based variant (Table 7): the "
                              "encoder frozen, --feature_layers concatenated into a two-layer "
                              "BiLSTM and a linear classifier."),
    ("feature_layers", "list", "tagging, --feature_based: hidden states to concatenate, -1 the "
                               "last layer (-1,-2,-3,-4: the last four, the paper's best)."),
    ("lstm_size", "integer", "tagging, --feature_based: units per direction of each BiLSTM "
                             "layer (768)."),
)


def define_flags() -> None:
  """The original run_classifier.py / run_squad.py flags, defined only when run as a program."""
  config_flags.DEFINE_config_file("config", finetune_config.__file__,
                                  "Fine-tuning config (configs/glue.py:<task>, "
                                  "configs/squad.py:<v1|v2>).", lock_config=True)
  for name, kind, help_text in ORIGINAL_FLAGS:
    getattr(flags, f"DEFINE_{kind}")(name, None, help_text)
  cli.define_vocab_flags()
  cli.define_distributed_flags()


def config_from_flags():
  """The config file's settings with every original flag that was given on top."""
  config = FLAGS.config
  for name, _, _ in ORIGINAL_FLAGS:
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
  cli.quiet_unless_verbose()
  cli.initialize_distributed_from_flags()
  registry.run_from_config(
      config, cli.tokenizer_from_flags(config.init_checkpoint, config.bert_config_file))


if __name__ == "__main__":
  define_flags()
  app.run(cli.one_line_errors(main), flags_parser=cli.parse_flags)
