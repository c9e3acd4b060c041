"""The flags several commands take, defined once: the vocabulary and lower-casing, the
multi-process start-up, and console verbosity. Entry points call `define_*` in their own
`define_flags` (so importers of a command get no flags) and the helpers in `main`."""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable

from absl import flags, logging

FLAGS = flags.FLAGS

# A command is a process of its own that uses no Keras. TensorFlow (tf.data and gfile here)
# imports Keras 3 at start-up, and Keras imports scikit-learn and SciPy: ~2.7 s of CPU in every
# command that reads records. With the legacy switch TensorFlow looks for `tf_keras` instead,
# which is not installed, and goes on. Set here, before any command imports TensorFlow.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

# What a user can cause and fix: bad values, missing or unreadable files, a full disk, a
# diverged run, a damaged checkpoint. Everything else is a defect and keeps its traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, FloatingPointError)


def console_script() -> None:
  """The console scripts `pip install` puts on the PATH (`bert-jax-pretrain`, ...:
  `setup.py`'s `CONSOLE_SCRIPTS`): the command the script's name names, run as `python -m`
  runs it — `bert-jax-X` is `bert_jax.X`, or `data_prep.X` for the data preparation tools."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  import runpy  # pylint: disable=g-import-not-at-top
  name = os.path.splitext(os.path.basename(sys.argv[0]))[0]
  command = name.removeprefix("bert-jax-").replace("-", "_")
  module = next((m for m in (f"bert_jax.{command}", f"data_prep.{command}")
                 if importlib.util.find_spec(m) is not None), None)
  if not name.startswith("bert-jax-") or module is None:
    sys.exit(f"error: {name} names no command of bert_jax (bert-jax-pretrain, ...).")
  runpy.run_module(module, run_name="__main__", alter_sys=True)


def define_vocab_flags(vocab_help: str = "The model's vocabulary: WordPiece vocab.txt, or "
                       "RoBERTa's byte-level BPE vocab.json (default: the one beside the "
                       "checkpoint).") -> None:
  flags.DEFINE_string("vocab_file", None, vocab_help)
  flags.DEFINE_string("merges_file", None, "merges.txt of a byte-level BPE vocab.json (default: "
                      "the one beside it).")
  flags.DEFINE_string("spm_model_file", None, "SentencePiece model (instead of --vocab_file); "
                      "an ALBERT model reads it with ALBERT's preprocessing.")
  flags.DEFINE_bool("do_lower_case", True, "Lower-case the input (uncased models); default: "
                    "what is recorded beside the model, else true.")


def define_dtype_flag() -> None:
  """`--dtype`: what an inference command's model computes in (`inference.compute_config`)."""
  from bert_jax import inference  # pylint: disable=g-import-not-at-top
  flags.DEFINE_enum("dtype", "float32", list(inference.COMPUTE_DTYPES), "What the model "
                    "computes in: float32, or bfloat16 (float32 parameters and outputs).")


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


def prepare_process() -> None:
  """What a command sets before JAX starts its backends: library INFO chatter (Orbax's, JAX's)
  kept out unless --verbosity was given, since progress is printed; off a TPU VM, JAX kept from
  starting the TPU runtime to look for chips (`distributed.skip_absent_tpu`); where a GPU
  plugin is installed, cuDNN's kernels kept out of XLA's command buffers
  (`cudnn_runtime.prepare`; elsewhere XLA_FLAGS stay as they are)."""
  from bert_jax.model import cudnn_runtime  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import distributed  # pylint: disable=g-import-not-at-top
  distributed.skip_absent_tpu()
  if distributed.gpu_plugin_installed():
    cudnn_runtime.prepare()
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)


def vocabulary_from_flags():
  """The vocabulary files the flags name (`vocab_files.VocabularyFiles`), or None."""
  from bert_jax.text import vocab_files  # pylint: disable=g-import-not-at-top
  if FLAGS.vocab_file and FLAGS.spm_model_file:
    raise ValueError("Give one of --vocab_file and --spm_model_file, not both.")
  if FLAGS.merges_file and not FLAGS.vocab_file:
    raise ValueError(f"--merges_file={FLAGS.merges_file} goes with --vocab_file=vocab.json "
                     "(byte-level BPE).")
  from bert_jax import file_io  # pylint: disable=g-import-not-at-top
  for flag in ("vocab_file", "spm_model_file", "merges_file"):
    if FLAGS[flag].value and not file_io.exists(FLAGS[flag].value):
      raise FileNotFoundError(f"--{flag}={FLAGS[flag].value}: no such file.")
  if not (FLAGS.vocab_file or FLAGS.spm_model_file):
    return None
  return vocab_files.VocabularyFiles(vocab_file=FLAGS.vocab_file,
                                     spm_model_file=FLAGS.spm_model_file,
                                     merges_file=FLAGS.merges_file)


def lower_case_from_flags() -> bool | None:
  """--do_lower_case when given, else None (the model's record decides)."""
  return FLAGS.do_lower_case if FLAGS["do_lower_case"].present else None


def tokenizer_from_flags(model: str | None = None, bert_config_file: str | None = None):
  """The tokenizer of the model at `model` (a checkpoint of any kind; None: a model trained from
  scratch with `bert_config_file`): the vocabulary flags' files, checked against the vocabulary
  beside the model, else that vocabulary; read as the model's family reads it (`model_type`)."""
  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import checkpoints
  from bert_jax.text import vocab_files
  given = vocabulary_from_flags()
  model_type = (checkpoints.read_config(model, bert_config_file).model_type
                if model or bert_config_file else None)
  flag = "--spm_model_file" if FLAGS.spm_model_file else "--vocab_file"
  if model:
    files = vocab_files.resolve(given, checkpoints.vocabulary_directories(model), model, flag)
  elif given is None:
    raise ValueError("Give the vocabulary: --vocab_file=vocab.txt (or vocab.json), or "
                     "--spm_model_file=spiece.model.")
  else:
    files = given
  return files.load(model_type, lower_case_from_flags())


def _user_errors() -> tuple[type[BaseException], ...]:
  # pylint: disable=g-import-not-at-top
  from bert_jax.interop import checkpoint_errors
  from bert_jax.training import workdir_lock
  return USER_ERRORS + (checkpoint_errors.CheckpointError, workdir_lock.WorkdirInUseError)


def one_line_errors(main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
  """Wraps an absl `main` so that a user error prints `error: <message>` and exits 1, instead
  of a traceback; `--verbosity=1` (or any verbosity given) shows the traceback as well. A
  missing or misused flag (`app.UsageError`) prints its message and where help is, not absl's
  whole help with the message last."""
  @functools.wraps(main)
  def wrapped(argv):
    from absl import app  # pylint: disable=g-import-not-at-top
    try:
      return main(argv)
    except KeyboardInterrupt:
      sys.exit("stopped (Ctrl-C).")
    except app.UsageError as e:  # a flag missing or misused: the message, not the whole help
      sys.exit(f"error: {str(e).rstrip('.')}. --helpshort lists the flags.")
    except Exception as e:  # pylint: disable=broad-except
      if not isinstance(e, _user_errors()) or FLAGS["verbosity"].present:
        raise
      sys.exit(f"error: {e}")
  return wrapped


def resolve_config_argument(argv: list[str], default_dir: str) -> list[str]:
  """`--config=configs/pretrain.py:demo` names a file of this package's `configs/` folder:
  when that path does not exist where the command runs, use the installed copy, so documented
  commands work from any directory."""
  out = []
  for arg in argv:
    if arg.startswith("--config=") and not arg.startswith("--config.") :
      value = arg[len("--config="):]
      path, colon, variant = value.partition(":")
      if not os.path.exists(path) and path.startswith("configs" + os.sep):
        installed = os.path.join(default_dir, os.path.basename(path))
        if os.path.exists(installed):
          arg = f"--config={installed}{colon}{variant}"
    out.append(arg)
  return out


def check_config_argument(argv: list[str]) -> None:
  """Builds the `--config=FILE:VARIANT` config once before absl does, so that a file that is
  missing or a variant the file refuses ends in one line, not in absl's parse-error traceback."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  for arg in argv:
    if not arg.startswith("--config=") or arg.startswith("--config."):
      continue
    value = arg[len("--config="):]
    path, _, variant = value.partition(":")
    if not os.path.isfile(path):
      sys.exit(f"error: --config={value}: no such file {path} (the configs are configs/pretrain.py,"
               " configs/glue.py and configs/squad.py).")
    spec = importlib.util.spec_from_file_location("_checked_config", path)
    module = importlib.util.module_from_spec(spec)
    try:
      spec.loader.exec_module(module)
      module.get_config(*([variant] if variant else []))
    except (ValueError, KeyError, TypeError) as e:
      sys.exit(f"error: --config={value}: {e}")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parser for every command (`app.run(..., flags_parser=cli.parse_flags)`):
  `--config=configs/...` found from any directory and checked first, then the usual parse."""
  from bert_jax import configs_dir  # pylint: disable=g-import-not-at-top
  argv = resolve_config_argument(list(argv), configs_dir())
  check_config_argument(argv[1:])
  try:
    return FLAGS(argv)
  except flags.Error as e:
    sys.exit(f"error: {e}\nPass --helpshort or --helpfull to see help on flags.")
  except (AttributeError, KeyError) as e:  # ml_collections: a --config.<path> it does not have
    sys.exit(f"error: {unknown_config_field(argv, e)}")


def unknown_config_field(argv: list[str], error: BaseException) -> str:
  """One line for a `--config.<path>` override that names no field of the config, from
  ml_collections' error (the missing key and, when it has one, its suggestion)."""
  import re  # pylint: disable=g-import-not-at-top
  text = str(error).replace("\\'", "'")
  names = re.findall(r"'([A-Za-z_][\w]*)'", text)
  suggestion = re.search(r'Did you mean "([\w]+)"', text)
  key = names[0] if names else None
  given = next((a.split("=", 1)[0] for a in argv if a.startswith("--config.") and key and
                re.search(rf"\.{re.escape(key)}[.=]", a.split("=", 1)[0] + "=")), None)
  where = given or "a --config.* override"
  return (f"{where}: the config has no field {key!r}"
          + (f" (did you mean {suggestion.group(1)}?)" if suggestion else "")
          + "; --helpfull lists the fields (--config.<name>).")
