"""Training-step speed of our `BertForPreTraining` against Hugging Face's `FlaxBertForPreTraining`.

Run it in the benchmark environment (transformers 4.57.6, the last release with Flax models, on
the lock file's jax/flax/numpy):

  make bench-model                                   # creates .venv-bench on first use
  .venv-bench/bin/python benchmarks/model_step.py --configs=tiny,base --steps=10 --warmup=2

What it measures: one full pre-training step, `jax.jit` of value_and_grad of the original loss
(masked-LM cross-entropy at the masked positions + next-sentence cross-entropy) followed by an
AdamW update (global-norm clipping, weight decay on matrices only), dropout on, float32, with the
parameters and optimizer state donated as a training loop does. Both models are built on the same
config and hold the same weights: ours are initialised and converted with
`hf_io.params_to_hf_state` into the peer, and both must give the same loss on the same batch
(without dropout) before anything is timed, so the comparison is between two implementations of
one computation, not between two models. The peer computes vocabulary logits at every position,
as `FlaxBertForPreTraining` does, and the loss gathers the masked positions from them; ours
gathers first and projects only those (that difference is part of what is compared).

Steps alternate between the two models (A, B, B, A, ...) so that a noisy machine slows both
alike; the table reports medians. With `--record` the table, the command, the machine and the
versions are appended to `benchmarks/RESULTS.md`.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import resource
import statistics
import sys
import time
from typing import Any, Callable

from absl import app
from absl import flags

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.interop import hf as hf_io
from bert_jax.interop import hf_config as hf_config_io
from bert_jax.objectives import mlm_nsp
from bert_jax.model import configuration, heads

_CONFIGS = flags.DEFINE_list("configs", ["tiny", "base"], "Presets to benchmark, in order.")
_STEPS = flags.DEFINE_integer(
    "steps", None, "Timed steps per model and config (default: per config, see SHAPES).")
_WARMUP = flags.DEFINE_integer(
    "warmup", None, "Untimed steps per model before timing (default: per config).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed for weights, batch and dropout.")
_PARITY_TOLERANCE = flags.DEFINE_float(
    "parity_tolerance", 1e-4, "Largest |loss difference| accepted between the two models.")
_RECORD = flags.DEFINE_bool("record", True, "Append the results to --results_file.")
_RESULTS_FILE = flags.DEFINE_string(
    "results_file", os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md"),
    "Markdown file that collects benchmark results.")

# Per preset: batch size, sequence length, masked positions, default timed steps and warm-up
# steps. The step counts keep one run of both presets under ~10 minutes on a 2-core CPU, where a
# BERT-base step takes ~2 s; on an accelerator, pass larger --steps.
SHAPES = {
    "tiny": dict(batch=32, length=128, predictions=20, steps=30, warmup=3),
    "base": dict(batch=8, length=128, predictions=20, steps=14, warmup=2),
}
DEFAULT_SHAPE = dict(batch=8, length=128, predictions=20, steps=10, warmup=2)

RESULTS_HEADER = """# Benchmark results

Each section below comes from one script in `benchmarks/` and names the exact command, the
machine (CPU model, cores, accelerator or none), the library versions and the date. Numbers are
the script's output, never edited; interpretation goes into notes under the tables. Every
benchmark runs ours next to a peer doing the same work on the same input, on the same machine in
the same run (the original implementation, or the best-known other one), interleaving the two
where the machine is noisy, and its headline is the ratio peer / ours: above 1, ours is faster.
Absolute numbers from different machines or dates do not compare; ratios within one section do.
Later runs are added below earlier ones, never over them.
"""


# ----------------------------------------------------------------------------------- inputs
def make_batch(rng: np.random.RandomState, batch: int, length: int, predictions: int,
               vocab_size: int) -> dict[str, np.ndarray]:
  """A pre-training batch shaped like the real records, with padding where real data has it.

  Sequences fill 75-100% of `length` (the rest is padding the mask hides); 15% of the real tokens
  are predicted, at most `predictions`, and unused prediction slots have weight 0, as the
  original's TFRecords do. Padding must be there so that both models pay for masking as in
  training, not a best case.
  """
  input_ids = rng.randint(1000, vocab_size, size=(batch, length)).astype(np.int32)
  input_mask = np.zeros((batch, length), np.int32)
  segment_ids = np.zeros((batch, length), np.int32)
  positions = np.zeros((batch, predictions), np.int32)
  ids = np.zeros((batch, predictions), np.int32)
  weights = np.zeros((batch, predictions), np.float32)
  for b in range(batch):
    n = rng.randint(3 * length // 4, length + 1)
    input_mask[b, :n] = 1
    input_ids[b, n:] = 0
    segment_ids[b, rng.randint(n // 4, 3 * n // 4):n] = 1
    k = min(predictions, max(1, int(round(0.15 * n))))
    positions[b, :k] = np.sort(rng.choice(np.arange(1, n), size=k, replace=False))
    ids[b, :k] = input_ids[b, positions[b, :k]]
    weights[b, :k] = 1.0
  return {
      "input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids,
      "masked_lm_positions": positions, "masked_lm_ids": ids, "masked_lm_weights": weights,
      "next_sentence_labels": rng.randint(0, 2, size=(batch,)).astype(np.int32),
  }


# ----------------------------------------------------------------------------------- models
def build_ours(config: configuration.BertConfig, batch: dict, seed: int):
  """Our model, its freshly initialised (unboxed) parameters, and its loss function."""
  model = heads.BertForPreTraining(config)
  init_args = [jnp.asarray(batch[k][:1]) for k in
               ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")]
  params = jax.jit(lambda rng: nn.unbox(model.init(rng, *init_args)["params"]))(
      jax.random.PRNGKey(seed))

  def loss_fn(params, batch, dropout_rng, deterministic):
    mlm_logits, nsp_logits = model.apply(
        {"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
        batch["masked_lm_positions"], deterministic=deterministic, rngs={"dropout": dropout_rng})
    return mlm_nsp.pretraining_loss(mlm_logits, nsp_logits, batch)
  return params, loss_fn


def build_peer(config: configuration.BertConfig, our_params, length: int):
  """`FlaxBertForPreTraining` holding our weights, and its loss with the same formula.

  The weights go through the Hugging Face PyTorch names (`hf_io.params_to_hf_state`) and
  transformers' own PyTorch→Flax renaming, which accepts numpy arrays, so no torch is needed and
  the mapping is the one transformers uses for real checkpoints. Every peer parameter must be
  covered with the right shape: a silently random tensor would make the parity check fail late
  and obscurely, or worse, pass with a different model.
  """
  import transformers
  from transformers.modeling_flax_pytorch_utils import convert_pytorch_state_dict_to_flax
  from flax.traverse_util import flatten_dict

  hf_config = transformers.BertConfig(**hf_config_io.to_hf_dict(config))
  hf_config.tie_word_embeddings = True  # the MLM decoder is the word-embedding table, as ours
  model = transformers.FlaxBertForPreTraining(hf_config, input_shape=(1, length),
                                              seed=0, dtype=jnp.float32)
  state = hf_io.params_to_hf_state(our_params, config)
  params = convert_pytorch_state_dict_to_flax(state, model)
  want = {k: v.shape for k, v in flatten_dict(model.params).items()}
  got = {k: v.shape for k, v in flatten_dict(params).items()}
  problems = sorted(f"{'/'.join(k)}: {'missing' if k not in got else f'{got[k]} vs {want[k]}'}"
                    for k in want if got.get(k) != want[k])
  problems += sorted(f"{'/'.join(k)}: not a parameter of the peer" for k in got if k not in want)
  if problems:
    raise ValueError("Converted weights do not fit FlaxBertForPreTraining:\n  " +
                     "\n  ".join(problems))
  params = jax.tree.map(jnp.asarray, params)

  def loss_fn(params, batch, dropout_rng, deterministic):
    out = model(batch["input_ids"], attention_mask=batch["input_mask"],
                token_type_ids=batch["segment_ids"], params=params,
                dropout_rng=None if deterministic else dropout_rng, train=not deterministic)
    # (batch, length, vocab) → the masked positions, then the same loss as ours.
    mlm_logits = heads.gather_positions(out.prediction_logits, batch["masked_lm_positions"])
    return mlm_nsp.pretraining_loss(mlm_logits, out.seq_relationship_logits, batch)
  return params, loss_fn, transformers.__version__


def make_optimizer() -> optax.GradientTransformation:
  """The original recipe's update (clip to norm 1, AdamW, no decay on biases and LayerNorm),
  identical for both models; it is part of the step a training loop pays for."""
  decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)
  return optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                                 mask=decay_mask))


def make_train_step(loss_fn: Callable, tx: optax.GradientTransformation) -> Callable:
  """value_and_grad + optimizer update, jitted with parameters and optimizer state donated."""
  def step(params, opt_state, batch, rng):
    rng, dropout_rng = jax.random.split(rng)
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, batch, dropout_rng, False)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, rng
  return jax.jit(step, donate_argnums=(0, 1))


# ---------------------------------------------------------------------------------- timing
class Contender:
  """One model's compiled step, its live training state and its measurements."""

  def __init__(self, name: str, loss_fn: Callable, params: Any, batch: dict, seed: int):
    self.name = name
    self.num_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(params))
    self.loss_fn = loss_fn
    self.tx = make_optimizer()
    self.state = (params, self.tx.init(params), jax.random.PRNGKey(seed + 1))
    self.batch = batch
    self.compiled = None
    self.compile_times: list[float] = []
    self.times: list[float] = []
    self.losses: list[float] = []

  def compile(self) -> None:
    """Trace + lower + XLA compile of a fresh `jax.jit` (so no cache is hit), timed apart from
    the steps. Called more than once, in turns with the other model: the first compile in a
    process also pays one-time setup that would otherwise be charged to whichever model went
    first."""
    step = make_train_step(self.loss_fn, self.tx)
    start = time.perf_counter()
    self.compiled = step.lower(*self.state[:2], self.batch, self.state[2]).compile()
    self.compile_times.append(time.perf_counter() - start)
    self.flops, self.temp_bytes = _xla_costs(self.compiled)

  @property
  def compile_s(self) -> float:
    return min(self.compile_times)

  def run(self, timed: bool) -> None:
    params, opt_state, rng = self.state
    start = time.perf_counter()
    params, opt_state, loss, rng = self.compiled(params, opt_state, self.batch, rng)
    jax.block_until_ready((params, opt_state, loss))
    elapsed = time.perf_counter() - start
    self.state = (params, opt_state, rng)
    self.losses.append(float(loss))
    if timed:
      self.times.append(elapsed)


def _xla_costs(compiled) -> tuple[float | None, int | None]:
  """FLOPs of one step and XLA's scratch memory (activations kept for the backward pass, logits,
  gradients in flight), from the compiled executable: they explain a time difference where the
  wall clock alone cannot."""
  flops = temp = None
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops = float(cost.get("flops")) if cost and cost.get("flops") is not None else None
  except Exception:  # pylint: disable=broad-except  (not every backend reports costs)
    pass
  try:
    temp = int(compiled.memory_analysis().temp_size_in_bytes)
  except Exception:  # pylint: disable=broad-except
    pass
  return flops, temp


def check_parity(ours_loss: Callable, ours_params, peer_loss: Callable, peer_params,
                 batch: dict, tolerance: float) -> tuple[float, float]:
  """Both models' loss on one batch without dropout; refuses to time two different models."""
  rng = jax.random.PRNGKey(0)
  ours = float(jax.jit(lambda p, b: ours_loss(p, b, rng, True)[0])(ours_params, batch))
  peer = float(jax.jit(lambda p, b: peer_loss(p, b, rng, True)[0])(peer_params, batch))
  if not abs(ours - peer) <= tolerance:
    raise RuntimeError(f"Loss parity failed: ours {ours:.6f} vs peer {peer:.6f} "
                       f"(|diff| {abs(ours - peer):.2e} > {tolerance:.0e}); not timing.")
  return ours, peer


def peak_rss_gib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def benchmark_config(name: str, seed: int) -> dict[str, Any]:
  """Builds, checks, compiles and times both models on one preset."""
  shape = SHAPES.get(name, DEFAULT_SHAPE)
  steps = _STEPS.value if _STEPS.value is not None else shape["steps"]
  warmup = _WARMUP.value if _WARMUP.value is not None else shape["warmup"]
  config = configuration.get_preset(name)
  np_batch = make_batch(np.random.RandomState(seed), shape["batch"], shape["length"],
                        shape["predictions"], config.vocab_size)
  batch = jax.device_put(np_batch)

  ours_params, ours_loss = build_ours(config, np_batch, seed)
  peer_params, peer_loss, _ = build_peer(config, ours_params, shape["length"])
  loss_ours, loss_peer = check_parity(ours_loss, ours_params, peer_loss, peer_params, batch,
                                      _PARITY_TOLERANCE.value)
  print(f"[{name}] loss without dropout on the same batch: ours {loss_ours:.6f}, "
        f"Hugging Face {loss_peer:.6f}, |diff| {abs(loss_ours - loss_peer):.2e}", flush=True)

  ours = Contender("bert_jax", ours_loss, ours_params, batch, seed)
  peer = Contender("HF FlaxBertForPreTraining", peer_loss, peer_params, batch, seed)
  del ours_params, peer_params  # donated to the first step
  for c in (ours, peer, peer, ours):
    c.compile()
  for c in (ours, peer):
    print(f"[{name}] {c.name}: {c.num_params / 1e6:.2f} M parameters, compiled in "
          f"{' / '.join(f'{t:.1f}' for t in c.compile_times)} s", flush=True)

  start = time.perf_counter()
  for i in range(warmup + steps):
    order = (ours, peer) if i % 2 == 0 else (peer, ours)
    for c in order:
      c.run(timed=i >= warmup)
  print(f"[{name}] {warmup} + {steps} steps per model in {time.perf_counter() - start:.0f} s",
        flush=True)
  for c in (ours, peer):
    if not np.isfinite(c.losses[-1]):
      raise RuntimeError(f"{c.name}: loss became {c.losses[-1]} during the benchmark.")
  return dict(name=name, config=config, shape=shape, steps=steps, warmup=warmup,
              loss_ours=loss_ours, loss_peer=loss_peer, contenders=(ours, peer),
              peak_rss_gib=peak_rss_gib())


# --------------------------------------------------------------------------------- reporting
# The machine's 1-minute load when the run began: other work on a small machine slows both models
# and widens the spread, so the record says whether the run had the machine to itself.
_LOAD_AT_START = [0.0]


def machine_description() -> str:
  cpu = "unknown CPU"
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    cpu = platform.processor() or cpu
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  mem = ""
  try:
    with open("/proc/meminfo", encoding="utf-8") as f:
      kib = int(f.readline().split()[1])
    mem = f", {kib / 2**20:.0f} GiB RAM"
  except (OSError, ValueError, IndexError):
    pass
  if jax.default_backend() == "cpu":
    accel = "no accelerator (JAX on CPU)"
  else:
    accel = f"{jax.device_count()} × {jax.devices()[0].device_kind}"
  return f"{cpu}, {cores} cores{mem}, {accel}, {platform.system()} {platform.machine()}"


def _fmt_gflops(flops):
  return f"{flops / 1e9:,.0f}" if flops is not None else "n/a"


def _fmt_mib(nbytes):
  return f"{nbytes / 2**20:,.0f}" if nbytes is not None else "n/a"


def results_table(results: list[dict]) -> str:
  rows = ["| config | batch × seq (masked) | model | params | compile (s, best of 2) "
          "| median step (s) [min–max] | steps/s | tokens/s | XLA GFLOP/step | XLA temp (MiB) "
          "| HF / ours |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in results:
    ours, peer = r["contenders"]
    s = r["shape"]
    median_ours = statistics.median(ours.times)
    paired = statistics.median(p / o for p, o in zip(peer.times, ours.times))
    for c in (ours, peer):
      median = statistics.median(c.times)
      ratio = f"**{median / median_ours:.2f}×** ({paired:.2f}×)" if c is peer else ""
      rows.append(
          f"| {r['name']} | {s['batch']} × {s['length']} ({s['predictions']}) | {c.name} | "
          f"{c.num_params / 1e6:.1f} M | {c.compile_s:.1f} | {median:.3f} "
          f"[{min(c.times):.3f}–{max(c.times):.3f}] | {1 / median:.2f} | "
          f"{s['batch'] * s['length'] / median:,.0f} | {_fmt_gflops(c.flops)} | "
          f"{_fmt_mib(c.temp_bytes)} | {ratio} |")
  return "\n".join(rows)


def report(results: list[dict]) -> str:
  import transformers
  flags_used = ([f"--configs={','.join(r['name'] for r in results)}"] +
                ([f"--steps={_STEPS.value}"] if _STEPS.value is not None else []) +
                ([f"--warmup={_WARMUP.value}"] if _WARMUP.value is not None else []) +
                ([f"--seed={_SEED.value}"] if _SEED.value else []))
  command = " ".join([os.path.relpath(sys.executable), "benchmarks/model_step.py"] + flags_used)
  defaults = flags_used == [f"--configs={','.join(_CONFIGS.default)}"]
  make_form = ("make bench-model" if defaults else
               f"make bench-model BENCH_ARGS='{' '.join(flags_used)}'")
  steps = ", ".join(f"{r['name']}: {r['warmup']} warm-up + {r['steps']} timed" for r in results)
  parity = "; ".join(f"{r['name']}: ours {r['loss_ours']:.6f} vs HF {r['loss_peer']:.6f} "
                     f"(|diff| {abs(r['loss_ours'] - r['loss_peer']):.1e})" for r in results)
  lines = [
      f"## Pre-training step: bert_jax vs Hugging Face FlaxBertForPreTraining "
      f"({datetime.date.today().isoformat()})",
      "",
      f"- Command: `{command}` (what `{make_form}` runs)",
      f"- Machine: {machine_description()}",
      f"- Versions: Python {platform.python_version()}, jax {jax.__version__}, jaxlib "
      f"{importlib.metadata.version('jaxlib')}, "
      f"flax {flax.__version__}, optax {optax.__version__}, transformers "
      f"{transformers.__version__}, numpy {np.__version__}",
      f"- Date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}; 1-minute "
      f"load average {_LOAD_AT_START[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end "
      f"(above ~0.1 something else was running); process niceness {os.nice(0)}.",
      "- Step: jit(value_and_grad(MLM at masked positions + NSP loss)) + clip + AdamW, dropout "
      "0.1 on, float32, params/optimizer state donated; same config, weights and batch for both; "
      f"steps alternate between the models ({steps} per model).",
      f"- Loss parity before timing (dropout off, same batch): {parity}.",
      f"- Peak RSS of the benchmark process (both models, all configs so far): "
      f"{results[-1]['peak_rss_gib']:.1f} GiB.",
      "",
      results_table(results),
      "",
      "HF / ours: ratio of the median step times (in brackets: the median of the per-round "
      "ratios, each from two steps run back to back, which load that comes and goes disturbs "
      "less). tokens/s counts every position of the padded batch (batch × seq). XLA GFLOP/step "
      "and XLA temp (MiB) are the compiled step's own cost and scratch-memory estimates.",
      "",
  ]
  return "\n".join(lines)


def append_results(path: str, section: str) -> None:
  """Adds `section` at the end, and the explanatory header at the top if the file lacks it.

  Other benchmarks append their own sections to the same file; everything already there is kept.
  """
  existing = ""
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      existing = f.read()
  if not existing.startswith(RESULTS_HEADER.splitlines()[0]):
    existing = RESULTS_HEADER + "\n" + existing.lstrip("\n")
  if not existing.endswith("\n\n"):
    existing = existing.rstrip("\n") + "\n\n"
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(existing + section)
  os.replace(tmp, path)


def main(argv):
  del argv
  unknown = [c for c in _CONFIGS.value if c not in configuration.PRESETS]
  if unknown:
    raise app.UsageError(f"Unknown --configs {unknown}; known: {sorted(configuration.PRESETS)}")
  _LOAD_AT_START[0] = os.getloadavg()[0]
  print(f"Machine: {machine_description()}; load average {_LOAD_AT_START[0]:.2f}", flush=True)
  results = [benchmark_config(name, _SEED.value) for name in _CONFIGS.value]
  section = report(results)
  print("\n" + section)
  if _RECORD.value:
    append_results(_RESULTS_FILE.value, section)
    print(f"Appended to {_RESULTS_FILE.value}")


if __name__ == "__main__":
  app.run(main)
