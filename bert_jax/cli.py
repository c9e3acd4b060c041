"""The flags several commands take, defined once: the vocabulary and lower-casing, the
multi-process start-up, and console verbosity. Entry points call `define_*` in their own
`define_flags` (so importers of a command get no flags) and the helpers in `main`."""

from __future__ import annotations

from absl import flags, logging

FLAGS = flags.FLAGS


def define_vocab_flags(vocab_help: str = "WordPiece vocab.txt of the model.") -> None:
  flags.DEFINE_string("vocab_file", None, vocab_help)
  flags.DEFINE_string("spm_model_file", None, "SentencePiece model (instead of --vocab_file).")
  flags.DEFINE_bool("do_lower_case", True, "Lower-case the input (uncased models).")


def define_distributed_flags() -> None:
  """The flags of a multi-process run outside Cloud TPU (TPU slices are found by themselves)."""
  flags.DEFINE_string("coordinator_address", None,
                      "host:port of process 0 for multi-process runs outside Cloud TPU (TPU VM "
                      "slices are found by themselves).")
  flags.DEFINE_integer("num_processes", None, "Processes in a multi-process run.")
  flags.DEFINE_integer("process_id", None, "This process's index (0-based).")


def initialize_distributed_from_flags() -> None:
  from bert_jax.parallel import distributed  # pylint: disable=g-import-not-at-top
  distributed.initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes,
                                     FLAGS.process_id)


def quiet_unless_verbose() -> None:
  """Progress is printed; keep library INFO chatter out unless --verbosity was given."""
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)


def tokenizer_from_flags():
  """The tokenizer of --vocab_file / --spm_model_file and --do_lower_case."""
  from bert_jax.text import tokenization  # pylint: disable=g-import-not-at-top
  return tokenization.load_tokenizer(vocab_file=FLAGS.vocab_file,
                                     spm_model_file=FLAGS.spm_model_file,
                                     do_lower_case=FLAGS.do_lower_case)
