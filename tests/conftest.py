"""Test-wide setup: fake CPU devices (set before JAX initialises, `--fake-devices`), quiet
TensorFlow, and the fixtures several test files share."""

import os

from tests import helpers

# How many fake CPU devices the tests' JAX sees: `--fake-devices` (pytest_configure below, which
# runs before any test module imports JAX). Tests of sharding are marked `mesh` and need 8; every
# other test runs as well on one, where a tiny model's step is ~4x faster than split over 8 fake
# devices on 2 cores. `make test` runs the `mesh` tests on 8 and the rest on 1; a plain `pytest`
# runs everything on 8.
MESH_DEVICES = helpers.MESH_DEVICES

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No Keras at TensorFlow's start-up, as in the commands (bert_jax/cli.py says why), for the
# test processes and every process they start.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# The tests run on the CPU's fake devices. With libtpu installed (for the ahead-of-time TPU
# compiles), JAX would otherwise probe for a TPU in every process a test starts, seconds each.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# JAX's persistent compilation cache, set before JAX starts so that every subprocess a test runs
# inherits it: the same tiny models compile in many tests, and a second run of the suite finds
# them all. Kept between runs in the repository's .cache/ (ignored by git).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax-tests"))
# Every compile is kept, however quick: a fine-tuning run compiles ~70 small programs (0.2 s
# each on this machine) beside its train step, and they add up over the suite.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# No size limit: with one, JAX takes a file lock and lists every entry of the cache before each
# write (0.6 s at ~4,000 entries, the other worker waiting), which made a run that fills the
# cache slower than none. Without it two workers may write the same entry at once; an entry
# read half-written fails to load, and JAX then warns and compiles it again.


import collections  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402

import filelock  # noqa: E402
import pytest  # noqa: E402  (after the environment above, which must precede any JAX import)


def pytest_addoption(parser):
  parser.addoption(
      "--fake-devices", type=int, default=MESH_DEVICES,
      help=f"fake CPU devices of the tests' JAX (default {MESH_DEVICES}); tests marked mesh "
           f"need {MESH_DEVICES}, the others run on any number (fastest on 1).")
  parser.addoption(
      "--files-marking", metavar="MARKER", default=None,
      help="import only the test files that mention pytest.mark.MARKER (with -m MARKER: the "
           "same tests, without importing every other file in every worker).")


def pytest_configure(config):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " +
                             helpers.xla_flags(config.getoption("fake_devices"))).strip()


def pytest_ignore_collect(collection_path, config):
  """`--files-marking=mesh` (the first pass of `make test`): test files that never name the
  marker are not imported; each worker would otherwise import all of them (seconds) for the few
  files that hold `mesh` tests."""
  marker = config.getoption("files_marking")
  if marker and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
    return f"mark.{marker}" not in collection_path.read_text(encoding="utf-8")
  return None


@pytest.hookimpl(trylast=True)  # after `-m` and `-k` have deselected what they leave out
def pytest_collection_modifyitems(config, items):
  """Heaviest files first (a test marked slow weighs 10, any other 1), each file's tests in
  their own order: the workers of `make test` take whole files in this order, and a heavy file
  started last would run alone at the end."""
  weight = collections.Counter()
  for item in items:
    weight[item.path] += 10 if item.get_closest_marker("slow") else 1
  first = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
  items.sort(key=lambda item: (-weight[item.path], first[item.path]))
  devices = config.getoption("fake_devices")
  mesh = [item.nodeid for item in items if item.get_closest_marker("mesh")]
  if mesh and devices < MESH_DEVICES:
    raise pytest.UsageError(
        f"{len(mesh)} selected tests are marked mesh and need --fake-devices={MESH_DEVICES} "
        f"(this run has {devices}), e.g. {mesh[0]}; leave them out with -m 'not mesh'.")


@pytest.fixture(scope="module")
def tokenizer():
  """The uncased WordPiece tokenizer of the packaged MiniLM (BERT's 30,522-entry vocab.txt)."""
  from bert_jax.text import tokenization
  from tests import helpers
  return tokenization.load_tokenizer(
      vocab_file=os.path.join(helpers.minilm_dir(), "vocab.txt"), do_lower_case=True)


@pytest.fixture(scope="module")
def bert_config_file(tmp_path_factory):
  """A tiny BERT (the `test` preset) over that vocabulary, without dropout, as a config file."""
  from bert_jax.model import configuration
  path = tmp_path_factory.mktemp("cfg") / "bert_config.json"
  configuration.get_preset("test", vocab_size=30522, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0).to_json_file(str(path))
  return str(path)


@pytest.fixture(scope="session")
def plays_corpus(tmp_path_factory):
  """400 kB of Shakespeare's plays (the text data_prep/demo_corpus.py ships) as one file: what
  the tokenizers of every family are trained on in the tests."""
  from data_prep import demo_corpus
  path = tmp_path_factory.mktemp("plays") / "plays.txt"
  path.write_text(demo_corpus.corpus_text(max_bytes=400_000), encoding="utf-8")
  return str(path)


def _once(tmp_path_factory, worker_id: str, name: str, build) -> dict:
  """`build(directory)` run once per test run, however many pytest workers ask: the first
  builds under a file lock in the run's shared temporary directory, the others wait and
  read what it recorded (a JSON-able dict)."""
  root = tmp_path_factory.getbasetemp()
  if worker_id != "master":  # each worker has its own basetemp inside the run's
    root = root.parent
  directory = root / name
  record = root / f"{name}.json"
  with filelock.FileLock(str(root / f"{name}.lock")):
    if record.exists():
      return json.loads(record.read_text())
    shutil.rmtree(directory, ignore_errors=True)  # a build that failed half-way
    result = build(directory)
    record.write_text(json.dumps(result))
  return result


@pytest.fixture(scope="session")
def sst2_model(tmp_path_factory, worker_id):
  """A tiny classifier (the `test` preset, no dropout) fine-tuned through the library call of
  `finetune` until it has memorised the 16 SST-2 sentences: 13 dev rows (not a multiple of the
  eval batch of 8), test predictions written. Trained once per test run, for the GLUE and `predict`
  tests: `{"out", "data", "results"}` (the run's eval_results.json)."""
  def build(directory):
    from bert_jax.model import configuration
    from bert_jax.runs import finetune_config
    from bert_jax.tasks.classification import run as classification_run
    from bert_jax.text import tokenization
    from tests import task_helpers
    directory.mkdir(parents=True)
    config_file = str(directory / "bert_config.json")
    configuration.get_preset("test", vocab_size=30522, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0).to_json_file(config_file)
    data = task_helpers.sst2_dir(directory / "sst2", dev_size=13)
    out = str(directory / "out")
    classification_run.run(finetune_config.make(
        task_name="SST-2", data_dir=data, init_checkpoint=None, bert_config_file=config_file,
        output_dir=out, max_seq_length=16, train_batch_size=16, eval_batch_size=8,
        learning_rate=1e-3, num_train_epochs=100, warmup_proportion=0.1, do_train=True,
        do_eval=True, do_predict=True), tokenization.load_tokenizer(
            vocab_file=os.path.join(helpers.minilm_dir(), "vocab.txt"), do_lower_case=True))
    return {"out": out, "data": data,
            "results": json.loads(open(os.path.join(out, "eval_results.json")).read())}
  return _once(tmp_path_factory, worker_id, "sst2_model", build)


@pytest.fixture(scope="session")
def squad_v2_model(tmp_path_factory, worker_id):
  """A tiny BERT fine-tuned through the command line on eight SQuAD 2.0 questions (one
  unanswerable, `task_helpers.overfit_set`) until it has memorised them, predictions written
  for the same file. Trained once per test run, for the SQuAD and `predict` tests:
  `{"out", "data_file"}`."""
  def build(directory):
    from bert_jax.model import configuration
    from tests import task_helpers
    directory.mkdir(parents=True)
    data_file = directory / "train-v2.0.json"
    data_file.write_text(json.dumps(task_helpers.overfit_set(), ensure_ascii=False))
    config_file = str(directory / "bert_config.json")
    configuration.get_preset("test", vocab_size=30522, attention_probs_dropout_prob=0.0
                             ).to_json_file(config_file)
    out = str(directory / "out")
    proc = helpers.run_command(
        "bert_jax.finetune", "--task_name=squad", "--version_2_with_negative",
        f"--train_file={data_file}", f"--predict_file={data_file}",
        f"--bert_config_file={config_file}",
        f"--vocab_file={os.path.join(helpers.minilm_dir(), 'vocab.txt')}",
        f"--output_dir={out}", "--do_train", "--do_predict", "--max_seq_length=64",
        "--doc_stride=32", "--max_query_length=16", "--train_batch_size=4",
        "--predict_batch_size=8", "--learning_rate=1e-3", "--num_train_epochs=200",
        "--config.hidden_dropout_prob=0.0")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {"out": out, "data_file": str(data_file)}
  return _once(tmp_path_factory, worker_id, "squad_v2_model", build)
