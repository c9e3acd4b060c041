"""What a newcomer meets first: contradictory settings refused before anything starts, one-line
errors that name the field and the fix (no tracebacks), the model's vocabulary checked against
the data, and the documented commands working from any directory once the package is installed."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading

import pytest

from bert_jax.objectives import mlm_nsp
from bert_jax.runs import pretraining
from tests import helpers
from tests import pretrain_helpers as ph

VOCAB = os.path.join(helpers.minilm_dir(), "vocab.txt")


@pytest.fixture(scope="module")
def records(tmp_path_factory):
  return ph.write_records(str(tmp_path_factory.mktemp("records")), num_files=2, per_file=16)


def _cli(module: str, *args: str, cwd: str, devices: int = 1) -> subprocess.CompletedProcess:
  env = dict(os.environ, XLA_FLAGS=helpers.xla_flags(devices))
  return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=600)


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
  """The error line of a failed command, checked to come without a traceback."""
  assert proc.returncode != 0, proc.stdout[-2000:]
  assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: "), proc.stderr[-3000:]
  return last


# ------------------------------------------------------------------- settings that contradict
@pytest.mark.parametrize("overrides, message", [
    ({"total_steps": 100, "train_until_step": 200},
     r"config\.train_until_step=200 is past config\.total_steps=100, where the learning-rate "
     r"schedule ends at 0\.0: raise --config\.total_steps or lower --config\.train_until_step"),
    ({"global_batch_size": 0}, r"config\.global_batch_size=0: must be a positive number"),
    ({"optimizer.warmup_steps": 500},
     r"config\.optimizer\.warmup_steps=500 must lie in \[0, total_steps=40\]"),
    ({"data.max_predictions_per_seq": 64},
     r"config\.data\.max_predictions_per_seq=64 must lie in \[1, max_seq_length=32\]"),
    ({"grad_accum_steps": 3}, r"global_batch_size=16 is not divisible by "
                              r"config\.grad_accum_steps=3"),
])
def test_contradictory_settings_are_refused_before_anything_starts(records, tmp_path, overrides,
                                                                   message):
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=message):
    pretraining.train_and_evaluate(ph.run_config(records, **overrides), str(workdir))
  assert not workdir.exists()  # nothing was started, nothing written


def test_missing_workdir_and_train_files_are_named(records, tmp_path):
  with pytest.raises(ValueError, match="--workdir is empty: name the directory"):
    pretraining.train_and_evaluate(ph.run_config(records), "")
  with pytest.raises(ValueError, match=r"config\.data\.train_files is not set: pass "
                                       r"--config\.data\.train_files='DIR/\*\.tfrecord'"):
    pretraining.train_and_evaluate(ph.run_config(""), str(tmp_path / "run"))


# --------------------------------------------------------------------- the data's vocabulary
def test_vocab_size_comes_from_the_data_and_is_checked_against_it(tmp_path):
  pattern = ph.write_records(str(tmp_path / "data"), num_files=2, per_file=8)
  files = sorted(str(p) for p in (tmp_path / "data").glob("train-*.tfrecord"))
  # Without data_prep's summary, the ids in the records are the check: a smaller table would
  # turn into NaN losses (and advice about the learning rate) rather than an error.
  with pytest.raises(ValueError, match=r"train-00000\.tfrecord holds token id \d+ but "
                                       r"config\.model\.vocab_size=256: set "
                                       r"--config\.model\.vocab_size"):
    pretraining.resolve_vocabulary(ph.run_config(pattern, **{"model.vocab_size": 256}), files)
  (tmp_path / "data" / "summary.json").write_text(json.dumps({"vocab_size": ph.VOCAB}))
  unset = pretraining.resolve_vocabulary(ph.run_config(pattern, **{"model.vocab_size": None}),
                                         files)
  assert unset.model.vocab_size == ph.VOCAB
  with pytest.raises(ValueError, match=(
      r"config\.model\.vocab_size=400 but the records were written with a vocabulary of 512 "
      r"entries \(.*summary\.json\): set --config\.model\.vocab_size=512 or leave it unset")):
    pretraining.resolve_vocabulary(ph.run_config(pattern, **{"model.vocab_size": 400}), files)
  # A larger table than the data needs is allowed (vocabularies padded to a multiple of 128).
  assert pretraining.resolve_vocabulary(ph.run_config(pattern, **{"model.vocab_size": 640}),
                                        files).model.vocab_size == 640


def test_sequence_length_and_predictions_come_from_the_records_when_unset(tmp_path):
  """A config that leaves the two shapes unset (the default) takes them from the records, so
  records written at another length train at the first start; a set value is kept (and checked
  against the records, below); with no records, the paper's phase 1."""
  unset = {"data.max_seq_length": None, "data.max_predictions_per_seq": None}
  static = ph.write_records(str(tmp_path / "static"), num_files=1, per_file=4)
  files = [str(tmp_path / "static" / "train-00000.tfrecord")]
  resolved = pretraining.resolve_record_shapes(ph.run_config(static, **unset), files)
  assert (resolved.data.max_seq_length, resolved.data.max_predictions_per_seq) == (ph.SEQ,
                                                                                   ph.PRED)
  kept = pretraining.resolve_record_shapes(ph.run_config(
      static, **{"data.max_seq_length": 64, "data.max_predictions_per_seq": None}), files)
  assert (kept.data.max_seq_length, kept.data.max_predictions_per_seq) == (64, ph.PRED)
  default = pretraining.resolve_record_shapes(ph.run_config(static, **unset))
  assert (default.data.max_seq_length, default.data.max_predictions_per_seq) == (128, 20)
  # Dynamic records: the length from the records, the budget data_prep packed for (its
  # summary.json), else ceil(masked_lm_prob x length).
  dynamic = ph.write_records(str(tmp_path / "dynamic"), num_files=1, per_file=4,
                             masking="dynamic")
  files = [str(tmp_path / "dynamic" / "train-00000.tfrecord")]
  guessed = pretraining.resolve_record_shapes(ph.run_config(dynamic, **unset), files)
  assert (guessed.data.max_seq_length, guessed.data.max_predictions_per_seq) == (ph.SEQ, 5)
  (tmp_path / "dynamic" / "summary.json").write_text(json.dumps(
      {"settings": {"max_predictions_per_seq": 7}}))
  budget = pretraining.resolve_record_shapes(ph.run_config(dynamic, **unset), files)
  assert budget.data.max_predictions_per_seq == 7
  # A whole run started so: tests/unit/runs/test_pretrain.py, records rewritten.


# ---------------------------------------------------------------------- one-line CLI errors
@pytest.mark.slow
@pytest.mark.e2e
def test_command_errors_are_one_line_that_names_the_fix(records, tmp_path):
  elsewhere = tmp_path / "elsewhere"  # not the repository: configs/ is found all the same
  elsewhere.mkdir()
  cwd = str(elsewhere)
  pretrain = ("bert_jax.pretrain", "--config=configs/pretrain.py:tiny", "--workdir=w")
  line = _one_line_error(_cli(*pretrain, cwd=cwd))
  assert line == ("error: config.data.train_files is not set: pass "
                  "--config.data.train_files='DIR/*.tfrecord' (the shards data_prep wrote).")
  line = _one_line_error(_cli(*pretrain, f"--config.data.train_files={records}",
                              "--config.total_steps=10", "--config.train_until_step=50",
                              cwd=cwd))
  assert "config.train_until_step=50 is past config.total_steps=10" in line
  line = _one_line_error(_cli(
      *pretrain, f"--config.data.train_files={records}", "--config.model.preset=test",
      f"--config.data.max_seq_length={ph.SEQ}", f"--config.data.max_predictions_per_seq={ph.PRED}",
      "--config.mesh_shape=(3,1,1)", cwd=cwd, devices=8))
  assert line.startswith("error: mesh_shape (3, 1, 1) uses 3 devices but 8 are available: a "
                         "mesh must use every device. Write -1 for one axis"), line
  assert not (elsewhere / "w" / "checkpoints").exists()

  finetune = ("bert_jax.finetune", f"--vocab_file={VOCAB}", "--do_train",
              f"--output_dir={tmp_path / 'out'}", f"--data_dir={tmp_path}")
  line = _one_line_error(_cli(*finetune, "--task_name=SST3", cwd=cwd))
  for name in ("sst2", "mnli", "squad", "squad_v2", "'custom'"):
    assert name in line, line
  line = _one_line_error(_cli(*finetune, "--task_name=SST-2", "--init_checkpoint=", cwd=cwd))
  assert line.startswith("error: --init_checkpoint is empty: name the pre-trained model"), line
  line = _one_line_error(_cli(*finetune, "--task_name=SST-2", "--warmup_proportion=1.5",
                              cwd=cwd))
  assert line == "error: --warmup_proportion=1.5: must lie in [0, 1].", line


def test_a_command_run_in_the_test_process_leaves_logging_as_it_found_it(tmp_path, caplog):
  """`helpers.run_command` puts back what a command changes: the absl logger's level (set by
  --verbosity's reset as well as by the command) and its flags; a later test's INFO records
  still reach pytest."""
  import logging  # pylint: disable=g-import-not-at-top
  from absl import app, flags, logging as absl_logging  # pylint: disable=g-import-not-at-top
  del app  # imported for its own flags, which every command has
  before = (logging.getLogger("absl").level, set(flags.FLAGS))
  corpus = tmp_path / "empty.txt"
  corpus.write_text("")
  for module, args in (("data_prep.train_tokenizer", (f"--input_file={corpus}",
                                                       f"--output_prefix={tmp_path / 'v'}")),
                       ("bert_jax.finetune", ("--task_name=SST-2",))):
    assert helpers.run_command(module, *args).returncode == 1
    assert (logging.getLogger("absl").level, set(flags.FLAGS)) == before
  caplog.set_level(logging.INFO)
  absl_logging.info("still heard")
  assert "still heard" in caplog.text


def test_a_missing_flag_or_a_config_field_typo_is_one_line(tmp_path):
  """Not absl's whole help with the message last, nor ml_collections' traceback: the message
  and where the flags are listed, on one line."""
  config = f"--config={os.path.join(ph.REPO, 'configs', 'pretrain.py')}:tiny"
  finetune = ("bert_jax.finetune", "--task_name=SST-2", f"--output_dir={tmp_path / 'out'}",
              f"--data_dir={tmp_path}", f"--vocab_file={VOCAB}", "--do_train")
  cases = [
      (("bert_jax.pretrain", config), "error: --workdir is required. --helpshort lists the flags."),
      (("bert_jax.finetune", "--task_name=SST-2", f"--output_dir={tmp_path}"),
       "error: At least one of --do_train, --do_eval, --do_predict. --helpshort lists the flags."),
      (("bert_jax.pretrain", config, f"--workdir={tmp_path}", "--config.data.train_file=x"),
       "error: --config.data.train_file: the config has no field 'train_file' (did you mean "
       "train_files?); --helpfull lists the fields (--config.<name>)."),
      (("bert_jax.pretrain", config, f"--workdir={tmp_path}", "--config.optimiser.b2=0.98"),
       "error: --config.optimiser.b2: the config has no field 'optimiser' (did you mean "
       "optimizer?); --helpfull lists the fields (--config.<name>)."),
      (finetune + ("--eval_every_steps=50",),
       "error: --eval_every_steps scores the dev data while training: add --do_eval (SQuAD: "
       "and a --predict_file with answers)."),
      (finetune + ("--early_stopping_patience=3", "--do_eval"),
       "error: --early_stopping_patience counts evaluations during training: set "
       "--eval_every_steps too."),
      (finetune + ("--do_eval", "--eval_every_steps=10", "--early_stopping_patience=0"),
       "error: --early_stopping_patience=0: must be at least 1 evaluation."),
  ]
  for args, message in cases:
    proc = helpers.run_command(*args)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [message], proc.stderr
  assert not os.listdir(tmp_path)  # refused before anything was written


@pytest.mark.slow
@pytest.mark.e2e
def test_model_fields_and_the_fast_recipe_are_set_from_the_command_line(tmp_path):
  """Unset model fields are typed placeholders: the command line can set them (a None field of
  an ml_collections config cannot be overridden)."""
  args = ("bert_jax.pretrain", "--config=configs/pretrain.py:tiny+fast", "--workdir=w",
          "--compile_only", "--config.model.num_hidden_layers=1",
          "--config.model.attention_implementation=xla", "--config.model.vocab_size=1000")
  proc = _cli(*args, cwd=str(tmp_path))
  assert proc.returncode == 0, proc.stderr[-3000:]
  # BERT-Tiny with one layer and 1,000 words (194k embedding, 198k layer, 34k head parameters);
  # the preset's two layers and 30,522 words would be 4.4M.
  assert "0.4M parameters" in proc.stdout, proc.stdout + proc.stderr[-2000:]
  line = _one_line_error(_cli(*args[:2], "--config=configs/pretrain.py:tiny+slow",
                              "--workdir=w", cwd=str(tmp_path)))
  assert "Unknown modifier 'slow'" in line


# ------------------------------------------------------------ commands from any directory
@pytest.mark.slow
@pytest.mark.e2e
def test_an_installed_package_runs_its_commands_from_any_directory(tmp_path):
  """A wheel of the package (not the checkout) holds `data_prep` and the run configs, so the
  README's `python -m data_prep...` and `--config=configs/pretrain.py:...` work anywhere."""
  source = tmp_path / "source"
  source.mkdir()
  for name in ("setup.py", "README.md"):
    shutil.copy(os.path.join(ph.REPO, name), source / name)
  for name in ("bert_jax", "data_prep", "configs"):
    shutil.copytree(os.path.join(ph.REPO, name), source / name,
                    ignore=shutil.ignore_patterns("__pycache__"))
  subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                  "-w", str(tmp_path / "wheel"), str(source)], check=True, capture_output=True,
                 timeout=600)
  (wheel,) = (tmp_path / "wheel").glob("bert_jax-*.whl")
  site = tmp_path / "site"
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                  str(site), str(wheel)], check=True, capture_output=True, timeout=600)
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  env = dict(os.environ, PYTHONPATH=str(site))
  where = subprocess.run(
      [sys.executable, "-c", "import bert_jax, data_prep; print(bert_jax.__file__); "
       "print(data_prep.__file__); print(bert_jax.configs_dir())"],
      cwd=elsewhere, env=env, capture_output=True, text=True, check=True).stdout.split()
  assert all(path.startswith(str(site)) for path in where), where
  assert os.path.isfile(os.path.join(where[2], "pretrain.py"))

  corpus = elsewhere / "corpus.txt"
  corpus.write_text("\n\n".join("the king and the queen went to the castle . "
                                f"it was day {i} of the war ." for i in range(200)))
  proc = subprocess.run([sys.executable, "-m", "data_prep.train_tokenizer",
                         f"--input_file={corpus}", "--model_type=wordpiece", "--vocab_size=200",
                         "--output_prefix=wp"], cwd=elsewhere, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (elsewhere / "wp.vocab.txt").exists()
  proc = subprocess.run([sys.executable, "-m", "bert_jax.pretrain",
                         "--config=configs/pretrain.py:tiny", "--workdir=w"], cwd=elsewhere,
                        env=env, capture_output=True, text=True, timeout=600)
  assert "error: config.data.train_files is not set" in _one_line_error(proc)


@pytest.mark.e2e
def test_console_scripts_and_a_checkout_folder_named_like_the_package(tmp_path):
  """`make env` installs the commands on the PATH (bert-jax-pretrain, ...), and a folder named
  bert_jax in the working directory (a checkout, run from its parent) does not shadow the
  installed package: `python -m bert_jax.X` and the scripts work from there."""
  (tmp_path / "bert_jax" / "bert_jax").mkdir(parents=True)
  (tmp_path / "bert_jax" / "setup.py").write_text("")
  env = {k: v for k, v in helpers.command_env().items() if k != "PYTHONPATH"}
  bin_dir = os.path.dirname(sys.executable)
  runs = {
      "python -m": [sys.executable, "-m", "bert_jax.convert", "--helpshort"],
      "bert-jax-convert": [os.path.join(bin_dir, "bert-jax-convert"), "--helpshort"],
      "bert-jax-train-tokenizer": [os.path.join(bin_dir, "bert-jax-train-tokenizer"),
                                   "--helpshort"],
  }
  for name, command in runs.items():
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, (name, proc.stderr)
    assert "--from" in proc.stdout or "--output_prefix" in proc.stdout, (name, proc.stdout)
  proc = subprocess.run([os.path.join(bin_dir, "bert-jax-convert"), "--format=hf"], cwd=tmp_path,
                        env=env, capture_output=True, text=True, timeout=300)
  assert _one_line_error(proc) == "error: --from is required. --helpshort lists the flags."


# ------------------------------------------------------------------------ baselines beside
def test_next_sentence_accuracy_comes_with_its_majority_baseline():
  """58% next-sentence accuracy means nothing when 58% of the pairs are 'random next'."""
  sums = {"nsp_loss_sum": 6.9, "nsp_correct_sum": 58.0, "nsp_count": 100.0,
          "nsp_random_next_sum": 58.0}
  out = mlm_nsp.MaskedLmNextSentence().summarize(sums)
  assert out["nsp_accuracy"] == pytest.approx(0.58)
  assert out["nsp_majority_baseline"] == pytest.approx(0.58)
  assert mlm_nsp.MaskedLmNextSentence().summarize(
      dict(sums, nsp_random_next_sum=30.0))["nsp_majority_baseline"] == pytest.approx(0.70)


@pytest.mark.slow
@pytest.mark.e2e
def test_a_demo_stopped_with_ctrl_c_says_so_and_how_to_resume(plays_corpus, tmp_path):
  workdir = tmp_path / "demo"
  # A tenth of the demo's corpus, put where the demo writes it: the demo takes a step it finds
  # done as done, and the vocabulary and records follow in a tenth of the time.
  workdir.mkdir()
  shutil.copy(plays_corpus, workdir / "corpus.txt")
  proc = subprocess.Popen(
      [sys.executable, "-m", "bert_jax.demo", f"--workdir={workdir}", "--steps=100000",
       "--dupe_factor=1", "--num_shards=2", "--vocab_size=1000"], cwd=str(tmp_path),
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  # Ctrl-C once the training loop has taken its first step (it says so on the console).
  lines = []

  def read():
    for line in proc.stdout:
      lines.append(line)
  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  helpers.wait_until(lambda: proc.poll() is not None or any(
      line.startswith("first step (compilation included)") for line in list(lines)),
                     "the first training step", poll_s=0.5)
  proc.send_signal(signal.SIGINT)
  proc.wait(timeout=300)
  reader.join(timeout=60)
  output = "".join(lines)
  assert proc.returncode == 1, output[-3000:]
  assert "Traceback" not in output and "=== done" not in output, output[-3000:]
  assert "=== stopped early, at step" in output and "of 100000" in output, output[-3000:]
  assert "Run the same command again (make demo) to resume where it stopped." in output
  assert (workdir / "pretrain" / "checkpoints").is_dir()
