"""The PyTorch peer of `accelerator_step.py`: Hugging Face's `BertForPreTraining`, same rows.

    python benchmarks/peer_torch.py --configs=base,large --batch=large=64 \
        --recipes=paper --modes=eager,compile --mlm=full,gathered

Our step's MFU means little without the number a PyTorch user gets from the same hardware, so
this times the step such a user would write, on the shapes and rows of `accelerator_step.py`:

* the model: `transformers.BertForPreTraining` built from a `BertConfig` equal to our preset of
  the same name (vocabulary 30522, base 12/768/12/3072, large 24/1024/16/4096, tiny 2/128 for
  the CPU test), `attn_implementation="sdpa"` (torch's fused attention, which keeps attention
  dropout inside its flash kernel), float32 parameters, bfloat16 autocast;
* the recipe: `paper` (dropout 0.1 on hidden states and attention probabilities) or `fast`
  (attention dropout 0, as `fast-*` in `accelerator_step.py`);
* the step: MLM + NSP loss, backward, global-norm clipping at 1.0, the paper's AdamW (lr 1e-4,
  betas 0.9/0.999, eps 1e-6, weight decay 0.01 on everything but LayerNorm parameters and
  biases, `fused=True` on CUDA) and a linear warmup then linear decay of the learning rate.
  torch's AdamW corrects the moments' bias and ours (the released BERT optimizer) does not: the
  arithmetic per parameter is the same, the updates differ slightly in the first steps;
* `--mlm=full` is what `BertForPreTraining` does: the MLM head (transform + 30522-way decoder)
  runs over *every* position and the loss reads the masked ones (labels -100 elsewhere), so it
  executes far more head FLOPs than ours, which gathers the masked positions first;
  `--mlm=gathered` gathers them before the head, as we do, to show the comparison both ways;
* `--modes`: `eager`, and `compile` (`torch.compile` of the model and loss in its default mode;
  the optimizer step stays eager, as fused AdamW is already one kernel per tensor group).

Timing: `--warmup` steps, then `--repeats` times `--steps` steps dispatched back to back with one
`torch.cuda.synchronize()` at the end; the median per-step time is reported, with the first
step's wall time (compilation included in `compile` mode) and `torch.cuda.max_memory_allocated`.
MFU uses *our* analytic count (`MaskedLmNextSentence.flops_per_step`, useful work: the head at
the masked positions only) over `training.perf.PEAK_FLOPS`; the FLOPs the peer executes (its
full-width head included) are a separate column.

Rows: `accelerator_step.random_batch` with the same seed (full-length random rows, so every token
is useful), or the arrays of `--batch_file` (the input pipeline's .npz, as `accelerator_step.py`
reads it). Real unpacked rows get a (batch, 1, 1, keys) boolean mask; packed rows a
block-diagonal (batch, 1, queries, keys) mask from `sequence_ids`, their `position_ids`, and NSP on
each instance's [CLS] (`cls_positions`), so packed rows train the same objective as ours. A mask
keeps SDPA off its flash kernel (which takes none), as padding or packing would for any user.
Full rows must reach SDPA with no mask under `torch.compile` too: the model's attention is
HF's own `sdpa_attention_forward`, registered as `sdpa_unmasked` (see `ATTN_IMPLEMENTATION`).

Command-line flags are argparse, not absl: importing `accelerator_step` (for its rows and shapes)
defines absl flags of the same names. JAX is imported only for our FLOP count and the rows, on
the CPU, so it never takes GPU memory from torch.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import types

# Before anything imports JAX: bert_jax is here for FLOP counts and rows, never for a device.
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers.integrations import sdpa_attention as hf_sdpa

from benchmarks import accelerator_step
from bert_jax.model import configuration
from bert_jax.objectives import mlm_nsp
from bert_jax.text import features
from bert_jax.training import perf
# pylint: enable=g-import-not-at-top,wrong-import-position

SHAPES = accelerator_step.SHAPES

# HF's own SDPA attention (`sdpa_attention_forward`, same kernels and dropout) under a name with no
# mask builder: `masking_utils` then returns the 4-D masks `to_torch` builds as they are and None
# for full rows. Under "sdpa", transformers (5.17: `_ignore_bidirectional_mask_sdpa` refuses to
# skip while `is_tracing()`, i.e. whenever dynamo compiles) materialises an all-True
# (B, 1, L, L) mask expanded with stride 0 along keys, so compiled SDPA gets an attn_mask:
# no flash, and no mem-efficient either (CUDA needs attn_mask.stride(-1) == 1), only math.
ATTN_IMPLEMENTATION = "sdpa_unmasked"
transformers.AttentionInterface.register(
    ATTN_IMPLEMENTATION, hf_sdpa.sdpa_attention_forward)

# Dropout of the two recipes `accelerator_step.VARIANTS` times (hidden dropout 0.1 in both).
RECIPES = {
    "paper": dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
    "fast": dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0),
}
MLM_HEADS = ("full", "gathered")
MODES = ("eager", "compile")

# The paper's optimizer, as `accelerator_step.run_one` configures ours.
LEARNING_RATE, WARMUP_STEPS, TOTAL_STEPS = 1e-4, 100, 10000
WEIGHT_DECAY, EPS, BETAS, CLIP_NORM = 0.01, 1e-6, (0.9, 0.999), 1.0
EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "bias")


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--configs", default="base,large", help="Presets, in order (tiny, base, large).")
  p.add_argument("--recipes", default="paper", help="paper and/or fast.")
  p.add_argument("--mlm", default="full", help="full (HF's head over every position) and/or "
                 "gathered (the head at the masked positions only, as ours).")
  p.add_argument("--modes", default="eager,compile", help="eager and/or compile.")
  p.add_argument("--batch", default="", help="Per-config batch overrides, e.g. large=64.")
  p.add_argument("--steps", type=int, default=20, help="Steps per timed repeat.")
  p.add_argument("--repeats", type=int, default=3, help="Timed repeats (median reported).")
  p.add_argument("--warmup", type=int, default=3, help="Untimed steps first (the first one "
                 "compiles in compile mode).")
  p.add_argument("--dtype", default="bfloat16", help="Autocast dtype (bfloat16 or float32 for "
                 "none); parameters stay float32.")
  p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
  p.add_argument("--batch_file", default=None, help="A real batch (.npz of the input "
                 "pipeline's arrays, packed or not); its shape overrides the preset's.")
  p.add_argument("--hidden_act", default=None, help="The feed-forward activation (default: the "
                 "preset's, gelu); gelu_new is the tanh form, as ours `paper-cudnn-tanh`.")
  p.add_argument("--seed", type=int, default=0, help="Rows (as accelerator_step) and weights.")
  p.add_argument("--out", default=None, help="Also write the markdown section here (after "
                 "every run).")
  p.add_argument("--json_out", default=None, help="Also write the results as JSON here.")
  args = p.parse_args(argv)
  for name, allowed in (("recipes", RECIPES), ("mlm", MLM_HEADS), ("modes", MODES),
                        ("configs", SHAPES)):
    values = [v for v in getattr(args, name).split(",") if v]
    unknown = [v for v in values if v not in allowed]
    if unknown:
      p.error(f"--{name}: unknown {', '.join(unknown)}; expected {', '.join(allowed)}.")
    setattr(args, name, values)
  if args.warmup < 1:
    p.error("--warmup must be at least 1 (the first step is reported apart).")
  return args


def hf_config(name: str, recipe: str, hidden_act: str | None = None
              ) -> tuple[configuration.BertConfig, transformers.BertConfig]:
  """Our preset and Hugging Face's `BertConfig` of the same shape, recipe and activation (both
  spell the tanh GELU `gelu_new`)."""
  overrides = dict(RECIPES[recipe], **({"hidden_act": hidden_act} if hidden_act else {}))
  ours = configuration.get_preset(name, **overrides)
  theirs = transformers.BertConfig(
      vocab_size=ours.vocab_size, hidden_size=ours.hidden_size,
      num_hidden_layers=ours.num_hidden_layers, num_attention_heads=ours.num_attention_heads,
      intermediate_size=ours.intermediate_size, hidden_act=ours.hidden_act,
      hidden_dropout_prob=ours.hidden_dropout_prob,
      attention_probs_dropout_prob=ours.attention_probs_dropout_prob,
      max_position_embeddings=ours.max_position_embeddings,
      type_vocab_size=ours.type_vocab_size, initializer_range=ours.initializer_range,
      layer_norm_eps=ours.layer_norm_eps, attn_implementation=ATTN_IMPLEMENTATION)
  return ours, theirs


def load_rows(args, name: str, batch_size: int, vocab_size: int) -> dict[str, np.ndarray]:
  if args.batch_file:
    with np.load(args.batch_file, allow_pickle=False) as stored:
      return {k: stored[k] for k in stored.files}
  shape = SHAPES[name]
  return accelerator_step.random_batch(np.random.RandomState(args.seed), batch_size,
                                       shape["length"], shape["predictions"], vocab_size)


def to_torch(np_batch: dict[str, np.ndarray], device: str) -> dict[str, torch.Tensor]:
  """The model's inputs, the labels of both MLM heads, and the attention mask.

  Full rows get no mask at all (SDPA then runs its flash kernel, as a user with unpadded rows
  would); real rows a boolean mask that SDPA broadcasts; packed rows the block-diagonal one, with
  each padding query seeing itself so that no row of the softmax is empty (an empty row gives
  NaN in SDPA, and NaN times a zero gradient still poisons the weights' gradients).
  """
  t = lambda k, dtype=torch.long: torch.as_tensor(np_batch[k]).to(device=device, dtype=dtype)
  ids = np_batch[features.INPUT_IDS]
  batch, length = ids.shape
  positions = np_batch[features.MASKED_LM_POSITIONS].astype(np.int64)
  weights = np_batch[features.MASKED_LM_WEIGHTS].astype(np.float32)
  labels = np.full((batch, length), -100, np.int64)  # HF's labels: -100 where nothing is masked
  rows, slots = np.nonzero(weights > 0)
  labels[rows, positions[rows, slots]] = np_batch[features.MASKED_LM_IDS][rows, slots]
  out = {
      "input_ids": t(features.INPUT_IDS), "token_type_ids": t(features.SEGMENT_IDS),
      "labels": torch.as_tensor(labels, device=device),
      "positions": torch.as_tensor(positions, device=device),
      "masked_ids": t(features.MASKED_LM_IDS), "weights": t(features.MASKED_LM_WEIGHTS,
                                                            torch.float32),
      "nsp_labels": t(features.NEXT_SENTENCE_LABELS),
  }
  real = np_batch[features.INPUT_MASK].astype(bool)
  if features.SEQUENCE_IDS in np_batch:
    seq = np_batch[features.SEQUENCE_IDS]
    same = (seq[:, :, None] == seq[:, None, :]) & (seq[:, None, :] != 0)
    same |= np.eye(length, dtype=bool)[None]
    out["attention_mask"] = torch.as_tensor(same[:, None], device=device)
    out["position_ids"] = t(features.POSITION_IDS)
    out["cls_positions"] = t(features.CLS_POSITIONS)
    out["nsp_weights"] = t(features.NEXT_SENTENCE_WEIGHTS, torch.float32)
  elif not real.all():
    out["attention_mask"] = torch.as_tensor(real[:, None, None, :], device=device)
  return out


class PretrainingLoss(torch.nn.Module):
  """MLM + NSP loss of a `BertForPreTraining`, the part that `torch.compile` compiles.

  `full`: the model's own forward (both heads over the whole sequence) and the loss it computes
  from `labels` and `next_sentence_label`, written out so that the MLM part can be reported
  alone. `gathered`: the encoder, the masked positions gathered, the same head modules on them,
  and our loss (weighted sum over `sum(weights) + 1e-5`).
  """

  def __init__(self, model: transformers.BertForPreTraining, mlm: str, autocast_dtype):
    super().__init__()
    self.model, self.mlm, self.autocast_dtype = model, mlm, autocast_dtype

  def forward(self, batch: dict[str, torch.Tensor]):
    with torch.autocast(batch["input_ids"].device.type, dtype=self.autocast_dtype or torch.float32,
                        enabled=self.autocast_dtype is not None):
      return self._loss(batch)

  def _loss(self, batch):
    model, vocab = self.model, self.model.config.vocab_size
    inputs = dict(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                  attention_mask=batch.get("attention_mask"),
                  position_ids=batch.get("position_ids"))
    packed = "cls_positions" in batch
    if self.mlm == "full" and not packed:
      out = model(**inputs)
      mlm = F.cross_entropy(out.prediction_logits.view(-1, vocab), batch["labels"].view(-1))
      nsp = F.cross_entropy(out.seq_relationship_logits.view(-1, 2), batch["nsp_labels"].view(-1))
      return mlm + nsp, mlm.detach(), nsp.detach()
    encoded = model.bert(**inputs)
    hidden = encoded.last_hidden_state
    if self.mlm == "full":
      logits = model.cls.predictions(hidden)
      mlm = F.cross_entropy(logits.view(-1, vocab), batch["labels"].view(-1))
    else:
      index = batch["positions"][..., None].expand(-1, -1, hidden.shape[-1])
      logits = model.cls.predictions(torch.gather(hidden, 1, index))
      per_position = F.cross_entropy(logits.reshape(-1, vocab).float(),
                                     batch["masked_ids"].reshape(-1), reduction="none")
      weights = batch["weights"].reshape(-1)
      mlm = (per_position * weights).sum() / (weights.sum() + 1e-5)
    if packed:  # NSP on each instance's [CLS], through the model's own pooler
      index = batch["cls_positions"][..., None].expand(-1, -1, hidden.shape[-1])
      pooler = model.bert.pooler
      pooled = pooler.activation(pooler.dense(torch.gather(hidden, 1, index)))
      per_instance = F.cross_entropy(model.cls.seq_relationship(pooled).reshape(-1, 2).float(),
                                     batch["nsp_labels"].reshape(-1), reduction="none")
      weights = batch["nsp_weights"].reshape(-1)
      nsp = (per_instance * weights).sum() / weights.sum().clamp(min=1.0)
    else:
      nsp = F.cross_entropy(model.cls.seq_relationship(encoded.pooler_output),
                            batch["nsp_labels"].view(-1))
    return mlm + nsp, mlm.detach(), nsp.detach()


def build_optimizer(model: torch.nn.Module, device: str):
  """The paper's AdamW with its weight-decay exclusions, and the warmup + linear decay."""
  decay, no_decay = [], []
  for name, param in model.named_parameters():  # tied weights appear once
    (no_decay if any(f in name for f in EXCLUDE_FROM_WEIGHT_DECAY) else decay).append(param)
  opt = torch.optim.AdamW(
      [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
      lr=LEARNING_RATE, betas=BETAS, eps=EPS, fused=device == "cuda")

  def factor(step: int) -> float:  # as optimizer.learning_rate_schedule, power 1
    if step < WARMUP_STEPS:
      return step / WARMUP_STEPS
    return max(0.0, 1.0 - step / TOTAL_STEPS)
  return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def _sync(device: str) -> None:
  if device == "cuda":
    torch.cuda.synchronize()


def executed_flops(ours: configuration.BertConfig, objective, batch: int, mlm: str) -> float:
  """What the peer computes: our analytic count, plus the head at every unmasked position when
  the head runs over the whole sequence (transform 2H² and decoder 2HV per token, times 3)."""
  analytic = objective.flops_per_step(ours, batch)
  if mlm != "full":
    return analytic
  h, v = ours.hidden_size, ours.vocab_size
  extra = batch * (objective.max_seq_length - objective.max_predictions_per_seq)
  return analytic + perf.training_flops(extra * (2 * h * h + 2 * h * v))


def device_name(device: str) -> str:
  if device == "cuda":
    return torch.cuda.get_device_name()
  return platform.processor() or platform.machine()


def run_one(args, name: str, recipe: str, mlm: str, mode: str, batch_size: int) -> dict:
  ours, theirs = hf_config(name, recipe, args.hidden_act)
  np_batch = load_rows(args, name, batch_size, ours.vocab_size)
  batch_size, length = np_batch[features.INPUT_IDS].shape
  predictions = np_batch[features.MASKED_LM_IDS].shape[1]
  packing = {}
  if features.SEQUENCE_IDS in np_batch:
    packing = {"packed": True, "max_sequences_per_row": np_batch[features.CLS_POSITIONS].shape[1]}
  objective = mlm_nsp.MaskedLmNextSentence(length, predictions, **packing)
  real = float(np.mean(np_batch[features.INPUT_MASK]))
  device = args.device
  gc.collect()  # the previous run's model, optimizer and graphs, before the peak is reset
  if device == "cuda":
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
  torch.manual_seed(args.seed)
  model = transformers.BertForPreTraining(theirs).to(device).train()
  autocast = None if args.dtype == "float32" else getattr(torch, args.dtype)
  loss_module = PretrainingLoss(model, mlm, autocast)
  forward = torch.compile(loss_module) if mode == "compile" else loss_module
  opt, schedule = build_optimizer(model, device)
  params = [p for p in model.parameters() if p.requires_grad]
  batch = to_torch(np_batch, device)

  def step():
    opt.zero_grad(set_to_none=True)
    loss, mlm_loss, nsp_loss = forward(batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
    opt.step()
    schedule.step()
    return loss.detach(), mlm_loss, nsp_loss

  start = time.perf_counter()
  first = step()
  first = [float(x) for x in first]  # synchronises
  _sync(device)
  first_step_s = time.perf_counter() - start
  for _ in range(args.warmup - 1):
    step()
  _sync(device)
  times = []
  for _ in range(args.repeats):
    _sync(device)
    start = time.perf_counter()
    for _ in range(args.steps):
      last = step()
    _sync(device)
    times.append((time.perf_counter() - start) / args.steps)
  last = [float(x) for x in last]
  median = statistics.median(times)
  analytic = objective.flops_per_step(ours, batch_size)
  peak = perf.peak_flops_per_device(types.SimpleNamespace(device_kind=device_name(device)))
  result = dict(
      impl="torch", name=name, recipe=recipe, mlm=mlm, mode=mode, hidden_act=ours.hidden_act,
      shape=dict(batch=batch_size, length=length, predictions=predictions, real=real,
                 packed=bool(packing)),
      first_step_s=first_step_s, step_s=median, spread=(min(times), max(times)),
      analytic=analytic, executed=executed_flops(ours, objective, batch_size, mlm), peak=peak,
      mfu=(analytic / median / peak) if peak else None,
      memory=(torch.cuda.max_memory_allocated() / 2**30) if device == "cuda" else None,
      losses=(first[0], last[0]), first_mlm=first[1], first_nsp=first[2], last_mlm=last[1],
      device=device_name(device))
  if mode == "compile":
    torch._dynamo.reset()  # pylint: disable=protected-access
  return result


def _row(r: dict, batch_file: str | None) -> str:
  s = r["shape"]
  tokens = s["batch"] * s["length"] * s["real"] / r["step_s"]
  mfu = f"**{100 * r['mfu']:.1f}%**" if r["mfu"] is not None else "n/a"
  mem = f"{r['memory']:.1f}" if r["memory"] is not None else "n/a"
  layout = "packed" if s["packed"] else ("real" if batch_file else "random")
  dropout = RECIPES[r["recipe"]]["attention_probs_dropout_prob"]
  return (f"| {r['name']} | {s['batch']} × {s['length']} ({s['predictions']}) {layout}, "
          f"{100 * s['real']:.0f}% real | HF sdpa {r['recipe']} (attn dropout {dropout:g}, "
          f"{r.get('hidden_act', 'gelu')}), "
          f"MLM head {r['mlm']} | {r['mode']} | {r['first_step_s']:.1f} | "
          f"{1000 * r['step_s']:.1f} ({1000 * r['spread'][0]:.1f}–{1000 * r['spread'][1]:.1f}) | "
          f"{tokens:,.0f} | {r['analytic'] / 1e12:.2f} | {r['executed'] / 1e12:.2f} | "
          f"{r['analytic'] / r['step_s'] / 1e12:.0f} | {mfu} | {mem} | "
          f"{r['losses'][0]:.3f} → {r['losses'][1]:.3f} |")


def report(args, results: list[dict], failures: list[str]) -> str:
  name = device_name(args.device)
  peak = perf.peak_flops_per_device(types.SimpleNamespace(device_kind=name))
  cuda = (f", CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
          if args.device == "cuda" else "")
  lines = [
      f"## PyTorch peer: Hugging Face BertForPreTraining on {name} "
      f"({datetime.date.today().isoformat()})", "",
      f"- Command: `python benchmarks/peer_torch.py {' '.join(sys.argv[1:])}`",
      f"- Machine: {name}, {os.cpu_count()} CPU cores, {platform.system()} {platform.machine()}; "
      f"torch {torch.__version__}{cuda}, transformers {transformers.__version__}; autocast "
      f"{args.dtype}, parameters float32",
      f"- Peak used for MFU: {peak / 1e12:.0f} TFLOP/s dense bf16" if peak else
      "- Peak: unknown device, no MFU",
      "- Step: `BertForPreTraining` (SDPA attention), MLM + NSP, backward, clipping 1.0, fused "
      "AdamW (lr 1e-4, wd 0.01 off LayerNorm/bias, eps 1e-6), warmup + linear decay; "
      + (f"the rows of `{args.batch_file}`." if args.batch_file else
         "full-length random rows (`accelerator_step.random_batch`, same seed)."),
      "- First step: wall time of step 1 (torch.compile's compilation in `compile` mode). MFU "
      "and achieved TFLOP/s count our analytic FLOPs (MLM head at the masked positions only); "
      "executed TFLOP/step adds the head at every other position where `MLM head full`.", "",
      "| config | batch × seq (masked) | peer | mode | first step (s) | step ms (min–max) "
      "| real tokens/s | analytic TFLOP/step | executed TFLOP/step | achieved TFLOP/s | MFU "
      "| peak GiB | loss first → last |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  lines += [_row(r, args.batch_file) for r in results]
  lines += [""] + [f"- Failed: {f}" for f in failures] + ([""] if failures else [])
  return "\n".join(lines)


def _write(args, results, failures) -> None:
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      f.write(report(args, results, failures))
  if args.json_out:
    with open(args.json_out, "w", encoding="utf-8") as f:
      json.dump({"results": results, "failures": failures}, f, indent=1)


def main(argv=None) -> int:
  args = parse_args(argv)
  overrides = dict(item.split("=") for item in args.batch.split(",") if item)
  results, failures = [], []
  for name in args.configs:
    batch_size = int(overrides.get(name, SHAPES[name]["batch"]))
    for recipe in args.recipes:
      for mlm in args.mlm:
        for mode in args.modes:
          try:
            r = run_one(args, name, recipe, mlm, mode, batch_size)
          except Exception as e:  # pylint: disable=broad-except
            # One run failing (out of memory, a compile error) must not lose the others.
            failures.append(f"{name} {recipe} {mlm} {mode}: {type(e).__name__}: "
                            f"{(str(e).splitlines() or [''])[0][:300]}")
            print(f"FAILED {failures[-1]}", flush=True)
            gc.collect()
            if args.device == "cuda":
              torch.cuda.empty_cache()
            _write(args, results, failures)
            continue
          if not math.isfinite(r["losses"][1]):
            failures.append(f"{name} {recipe} {mlm} {mode}: loss is {r['losses'][1]}")
          results.append(r)
          print(_row(r, args.batch_file), flush=True)
          _write(args, results, failures)
  section = report(args, results, failures)
  print("\n" + section, flush=True)
  _write(args, results, failures)
  return 0 if results and not failures else 1


if __name__ == "__main__":
  sys.exit(main())
