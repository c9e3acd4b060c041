"""Attention-probability dropout inside a fused kernel, checked on the hardware that runs it.

    python benchmarks/attention_dropout_checks.py --implementation=cudnn [--out=checks.md]

The CPU tests check the Pallas kernel in the TPU interpreter; cuDNN's kernel exists only on a
GPU, and the Pallas kernel's hardware bits only on a TPU. This script runs the same checks through
the one attention call site (`modeling.dot_product_attention`) on whatever device it is given
(`--implementation=pallas` on a CPU runs them in the interpreter):

1. kept fraction and scaling: with values V = identity (head_dim = length), the output *is* the
   dropped probability matrix; the fraction kept is 1 - rate within 5 standard errors and the
   kept entries are the probabilities × 1/(1 - rate);
2. masks change from call to call (cuDNN: its counter advances per execution; Pallas: a new key)
   and from call site to call site (cuDNN: one static seed per layer);
3. the backward pass regenerates the forward's mask: dV equals P̃ᵀ·dO and dQ the explicit
   gradient under the recovered mask, in one execution of forward and backward;
4. padded rows (a row of 50 real tokens beside a row of padding alone, as a batch filled up at
   the end of an epoch holds): without dropout the real row's real positions equal XLA's
   attention; with dropout, forward and backward, every output and gradient is finite.

With `--implementation=pallas` on a GPU (Triton's kernels, `model/triton_attention.py`), also:

5. the compiled kernels against their reference under their own mask (`triton_attention.reference`)
   at BERT's shapes (`--shapes`, batch:length:heads:head_dim): output and dQ, dK, dV; and on
   the joined projection's layout (`joined_flash_attention`), equal to the separate operands';
6. forward + backward timed (`--steps`, `--repeats`; the median) against cuDNN's kernel with
   its dropout, for the default tiling and each of `--tilings`
   (block_q:block_k:backward_block:backward_step:num_warps); `--fastest_out` keeps each
   shape's fastest tiling for the steps the GPU suite times next.
`--triton` runs 5 and 6 off a GPU too, interpreted (6 without cuDNN: the plumbing only).

Each line says PASS or FAIL with its numbers; the exit status is the number of failures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import tpu as pltpu

from bert_jax.model import cudnn_runtime
from bert_jax.model import modeling
from bert_jax.model import triton_attention
from benchmarks import checklist
# pylint: enable=g-import-not-at-top,wrong-import-position

BATCH, HEADS, LENGTH = 2, 2, 128  # head_dim = LENGTH, so that V can be the identity
RATE = 0.1


def _inputs(dtype):
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  shape = (BATCH, LENGTH, HEADS, LENGTH)
  q = jax.random.normal(keys[0], shape, jnp.float32)
  k = jax.random.normal(keys[1], shape, jnp.float32)
  eye = jnp.broadcast_to(jnp.eye(LENGTH)[None, :, None, :], shape)  # v[b, s, n, :] = e_s
  cotangent = jax.random.normal(keys[2], shape, jnp.float32)
  input_mask = jnp.ones((BATCH, LENGTH), jnp.int32)
  return q.astype(dtype), k.astype(dtype), eye.astype(dtype), cotangent.astype(dtype), input_mask


def _attention(implementation, seed_name):
  """Attention with dropout at one call site; for cuDNN the site's static seed is that of a
  layer named `seed_name`, for Pallas the key decides."""
  def attend(q, k, v, input_mask, key):
    return modeling.dot_product_attention(
        q, k, v, input_mask, dropout_rate=RATE, dropout_rng=key, deterministic=False,
        implementation=implementation,
        cudnn_seed=modeling.cudnn_dropout_seed(("bert", "encoder", seed_name)))
  return attend


def _probabilities(q, k):
  """The probabilities without dropout, (b, n, t, s), in float32 from the same inputs."""
  logits = jnp.einsum("btnd,bsnd->bnts", q.astype(jnp.float32), k.astype(jnp.float32))
  return jax.nn.softmax(logits / math.sqrt(q.shape[-1]), axis=-1)


def _dropped(out):
  """The output under V = identity, as (b, n, t, s): the dropped probability matrix."""
  return jnp.swapaxes(out.astype(jnp.float32), 1, 2)


def _triton_checks(args, checks: checklist.Checklist, dtype, tolerance: float) -> None:
  """Checks 5 and 6: Triton's kernels against their reference, then timed against cuDNN's."""
  tilings = [triton_attention.Tiling()] + [
      triton_attention.Tiling.parse(t) for t in args.tilings.split(",") if t]
  fastest = {}
  on_gpu = jax.default_backend() == "gpu"
  seed = jnp.asarray([0x5EED, 0xB127], jnp.uint32)
  for shape in args.shapes.split(","):
    batch, length, heads, head_dim = map(int, shape.split(":"))
    keys = jax.random.split(jax.random.PRNGKey(3), 4)
    q, k, v, cotangent = (jax.random.normal(key, (batch, length, heads, head_dim),
                                            jnp.float32).astype(dtype) for key in keys)
    # Rows of every length from half the row to all of it, right-padded.
    lengths = length // 2 + (np.arange(batch) * (length // 2 + 1)) // max(batch, 1)
    ids = jnp.asarray(np.arange(length)[None, :] < lengths[:, None], jnp.int32)
    real = (ids > 0)[:, :, None, None]

    def step(attend, tiling=None):
      kwargs = {} if tiling is None else dict(tiling=tiling)
      def loss(q, k, v):
        out = attend(q, k, v, ids, dropout_rate=RATE, seed=seed, **kwargs)
        return jnp.sum(jnp.where(real, out.astype(jnp.float32) * cotangent, 0.0)), out
      return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))

    (_, out), grads = step(triton_attention.flash_attention)(q, k, v)
    (_, want), want_grads = step(triton_attention.reference)(q, k, v)
    errors = [float(jnp.linalg.norm(jnp.where(real, a.astype(jnp.float32)
                                              - b.astype(jnp.float32), 0.0))
                    / jnp.linalg.norm(jnp.where(real, b.astype(jnp.float32), 0.0)))
              for a, b in zip((out, *grads), (want, *want_grads))]
    checks.check(max(errors) <= tolerance,
                 f"Triton's kernels at {shape}: output, dQ, dK, dV equal the reference under "
                 f"their mask (relative errors {', '.join(f'{e:.1e}' for e in errors)})")
    # The joined projection's layout (`modeling.joined_projection`): the same kernels reading
    # q, k, v side by side in one operand, and writing their gradients so.
    joined = lambda q, k, v, ids, **kwargs: triton_attention.joined_flash_attention(
        jnp.stack([q, k, v], axis=2), ids, **kwargs)
    (_, joined_out), joined_grads = step(joined)(q, k, v)
    differ = max(float(jnp.linalg.norm(a.astype(jnp.float32) - b.astype(jnp.float32))
                       / jnp.linalg.norm(b.astype(jnp.float32)))
                 for a, b in zip((joined_out, *joined_grads), (out, *grads)))
    checks.check(differ <= tolerance / 10, f"Triton's kernels at {shape} on the joined "
                 f"projection's layout: output and gradients equal the separate operands' "
                 f"(largest relative difference {differ:.1e}; the same arithmetic: 0 expected)")
    cudnn_seed = modeling.cudnn_dropout_seed(("bert", "encoder", "layer_0"))

    def cudnn(q, k, v, ids, dropout_rate, seed):
      del seed
      return modeling.dot_product_attention(q, k, v, ids, dropout_rate=dropout_rate,
                                            dropout_rng=None, deterministic=False,
                                            implementation="cudnn", cudnn_seed=cudnn_seed)
    # Off a GPU (`--triton`) the tilings are timed in the interpreter: numbers of no meaning,
    # the plumbing the same.
    timed = ({"cuDNN": checklist.timed_ms(step(cudnn), (q, k, v), args.steps, args.repeats)}
             if on_gpu else {})
    for tiling in tilings:
      name = str(tiling)
      try:
        timed[f"Triton {name}"] = checklist.timed_ms(
            step(triton_attention.flash_attention, tiling), (q, k, v), args.steps,
            args.repeats)
      except Exception as e:  # pylint: disable=broad-except  # one tiling's failure, recorded
        checks.note(f"- Triton {name} at {shape}: failed ({type(e).__name__}: "
                    f"{str(e).splitlines()[0][:200]})")
    best = min((t for t in timed if t != "cuDNN"), key=timed.get, default=None)
    if best:
      fastest[shape] = dict(tiling=best.split()[-1], ms=timed[best],
                            cudnn_ms=timed.get("cuDNN"))
    checks.note(f"- forward + backward at {shape}, ms: "
                + ", ".join(f"{name} {ms:.3f}" for name, ms in timed.items())
                + (f"; fastest Triton tiling {best}: cuDNN ÷ it = "
                   f"**{timed['cuDNN'] / timed[best]:.2f}×**" if best and on_gpu else ""))
  if args.fastest_out and fastest:
    with open(args.fastest_out, "w", encoding="utf-8") as f:
      json.dump(fastest, f, indent=1)


def main() -> int:
  cudnn_runtime.prepare()  # before JAX starts its backends
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--implementation", default="cudnn", choices=("cudnn", "pallas"))
  parser.add_argument("--out", default=None, help="Also write the lines here (markdown).")
  parser.add_argument("--shapes", default="256:128:12:64,64:512:16:64",
                      help="Triton's kernels (--implementation=pallas on a GPU): the shapes "
                      "checked and timed, batch:length:heads:head_dim, comma-separated.")
  parser.add_argument("--tilings", default="128:64:64:64:4,64:128:64:64:4,128:128:64:64:8,"
                      "64:64:128:64:8,64:64:64:64:8",
                      help="More tilings of Triton's kernels to time, comma-separated "
                      "(triton_attention.Tiling's fields, colon-separated).")
  parser.add_argument("--fastest_out", default=None,
                      help="Write each shape's fastest Triton tiling here (JSON), for the "
                      "steps timed after (accelerator_step.py --attention_tiling).")
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--triton", action="store_true",
                      help="Run checks 5 and 6 (Triton's kernels) even off a GPU, interpreted.")
  args = parser.parse_args()
  dtype = jnp.bfloat16 if jax.default_backend() == "gpu" else jnp.float32
  tolerance = 3e-2 if dtype == jnp.bfloat16 else 1e-4
  q, k, v, cotangent, input_mask = _inputs(dtype)
  probs = _probabilities(q, k)
  checks = checklist.Checklist()
  report = checks.check

  layer_0, layer_1 = _attention(args.implementation, "layer_0"), _attention(args.implementation,
                                                                           "layer_1")
  key_a, key_b = jax.random.PRNGKey(1), jax.random.PRNGKey(2)

  @jax.jit
  def forward_and_backward(q, k, v, key):
    out, vjp = jax.vjp(lambda q, k, v: layer_0(q, k, v, input_mask, key), q, k, v)
    return (out, *vjp(cotangent))

  @jax.jit
  def two_sites(q, k, v, key):
    # Layers' keys differ as the model's `make_rng` makes them (Pallas); cuDNN ignores the key
    # and draws from each site's own static seed.
    return (layer_0(q, k, v, input_mask, key),
            layer_1(q, k, v, input_mask, jax.random.fold_in(key, 1)))

  # 1. fraction and scaling
  out, dq, _, dv = forward_and_backward(q, k, v, key_a)
  dropped = _dropped(out)
  kept = np.asarray(dropped != 0)
  n = kept.size
  fraction = kept.mean()
  report(abs(fraction - (1 - RATE)) <= 5 * math.sqrt(RATE * (1 - RATE) / n),
         f"kept fraction {fraction:.4f} over {n:,} probabilities (expected {1 - RATE:.4f} "
         f"± {5 * math.sqrt(RATE * (1 - RATE) / n):.4f})")
  ratio = np.asarray(dropped)[kept] / np.asarray(probs)[kept]
  report(abs(np.median(ratio) * (1 - RATE) - 1) <= tolerance,
         f"kept probabilities scaled by {np.median(ratio):.4f} (median; expected "
         f"{1 / (1 - RATE):.4f})")

  # 2. masks across calls and call sites
  again = np.asarray(_dropped(forward_and_backward(q, k, v, key_a)[0]) != 0)
  other = np.asarray(_dropped(forward_and_backward(q, k, v, key_b)[0]) != 0)
  if args.implementation == "cudnn":
    report((again != kept).mean() > 0.05,
           f"the same call again draws another mask ({100 * (again != kept).mean():.1f}% of "
           "decisions differ: the kernel's counter advanced)")
  else:
    report((again == kept).all() and (other != kept).mean() > 0.05,
           f"the same key draws the same mask, another key another "
           f"({100 * (other != kept).mean():.1f}% differ)")
  site_0, site_1 = (np.asarray(_dropped(o) != 0) for o in two_sites(q, k, v, key_a))
  report((site_0 != site_1).mean() > 0.05,
         f"two layers draw different masks ({100 * (site_0 != site_1).mean():.1f}% of decisions "
         "differ)")

  # 3. the backward pass's mask is the forward's (same execution)
  g = np.swapaxes(np.asarray(cotangent, np.float32), 1, 2)  # (b, n, t, d)
  p_dropped = np.asarray(dropped)
  dv_expected = np.swapaxes(np.einsum("bnts,bntd->bnsd", p_dropped, g), 1, 2)
  error_v = (np.linalg.norm(np.asarray(dv, np.float32) - dv_expected)
             / np.linalg.norm(dv_expected))
  report(error_v <= tolerance, f"dV = P̃ᵀ·dO under the forward's mask (relative error "
         f"{error_v:.2e})")
  mask = p_dropped != 0
  p = np.asarray(probs)
  d_dropped = np.einsum("bntd,bsnd->bnts", g, np.asarray(v, np.float32))
  d_probs = d_dropped * mask / (1 - RATE)
  d_logits = p * (d_probs - np.sum(d_probs * p, axis=-1, keepdims=True))
  dq_expected = np.einsum("bnts,bsnd->btnd", d_logits,
                          np.asarray(k, np.float32)) / math.sqrt(LENGTH)
  error_q = (np.linalg.norm(np.asarray(dq, np.float32) - dq_expected)
             / np.linalg.norm(dq_expected))
  report(error_q <= 2 * tolerance, f"dQ equals the explicit gradient under the forward's mask "
         f"(relative error {error_q:.2e})")

  # 4. padded rows: a row of 50 real tokens and a row of padding alone
  real = 50
  padded = jnp.asarray(np.arange(LENGTH)[None, :] < np.array([[real], [0]]), jnp.int32)

  def attend(implementation, deterministic):
    return lambda q, k, v: modeling.dot_product_attention(
        q, k, v, padded, dropout_rate=RATE, dropout_rng=key_a, deterministic=deterministic,
        implementation=implementation,
        cudnn_seed=modeling.cudnn_dropout_seed(("bert", "encoder", "layer_0")))
  interpreted = args.implementation == "pallas" and jax.default_backend() == "cpu"
  with (pltpu.force_tpu_interpret_mode() if interpreted  # JAX's kernel without dropout
        else contextlib.nullcontext()):
    fused = jax.jit(attend(args.implementation, True))(q, k, v)
  reference = jax.jit(attend("xla", True))(q, k, v)
  got, want = (np.asarray(x[0, :real], np.float32) for x in (fused, reference))
  error_p = np.linalg.norm(got - want) / np.linalg.norm(want)
  report(error_p <= tolerance, f"a right-padded row's real positions equal XLA's attention "
         f"(relative error {error_p:.2e})")

  @jax.jit
  def padded_step(q, k, v):
    out, vjp = jax.vjp(attend(args.implementation, False), q, k, v)
    return (out, *vjp(cotangent))
  finite = [bool(np.isfinite(np.asarray(x, np.float32)).all()) for x in padded_step(q, k, v)]
  report(all(finite), "a row of padding alone beside it: output and dQ, dK, dV finite, with "
         f"dropout (finite: {finite})")

  if args.implementation == "pallas" and (jax.default_backend() == "gpu" or args.triton):
    _triton_checks(args, checks, dtype, tolerance)

  checks.write(args.out, f"Attention dropout inside the {args.implementation} kernel",
               f"`python benchmarks/attention_dropout_checks.py "
               f"--implementation={args.implementation}`; {BATCH}×{LENGTH} rows, {HEADS} heads, "
               f"rate {RATE}, {jnp.dtype(dtype).name}")
  return checks.failures


if __name__ == "__main__":
  sys.exit(main())
