"""The fused dropout + residual + LayerNorm kernels checked and timed on the device that runs them.

    python benchmarks/fused_layer_norm_checks.py [--rows=32768] [--width=768] [--out=checks.md]

The CPU tests run the kernels in Pallas' interpreter; Triton compiles them only for a GPU. Here,
on whatever device JAX has (a CPU interprets):

1. float32, forward and the gradients of all five inputs equal `modeling.residual_layer_norm` of
   the input dropped with the kernels' own mask (`pallas_layer_norm.keep_mask`, computed by
   XLA), within 1e-4 relative;
2. the kept fraction is the quantised rate within 5 standard errors, and the backward kernel
   drops the forward's elements (the input's gradient is zero exactly there);
3. the output as four copies (`uses=4`, as a block's output goes to the next block): the
   gradients of all five inputs are those of one output whose gradient is the copies' sum,
   added inside the backward kernel, within 1e-5 relative;
4. at one block site of BERT (rows × width, bfloat16 in and out), the time of forward +
   backward through the kernels against XLA's form of the same site (the dense bias add,
   `dropout.dropout`, `modeling.residual_layer_norm` as the GPU step builds it), median of
   `--repeats` runs of `--steps` each, for the default tiling and each of `--tilings`
   (block_elements:num_warps:backward_programs).

Checks print PASS or FAIL with their numbers; the exit status is the number of failures.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import dropout, modeling, pallas_layer_norm
from benchmarks import checklist
# pylint: enable=g-import-not-at-top,wrong-import-position

RATE = 0.1
EPS = 1e-12
SEED = np.array([20261128, 7], np.uint32)


def _inputs(rows, width, dtype):
  keys = jax.random.split(jax.random.PRNGKey(0), 6)
  big = [jax.random.normal(k, (rows, width), jnp.float32).astype(dtype) for k in keys[:3]]
  small = [jax.random.normal(k, (width,), jnp.float32) for k in keys[3:]]
  x, residual, cotangent = big
  dense_bias, scale, bias = small
  return x, dense_bias, residual, scale, bias, cotangent


def _fused(x, dense_bias, residual, scale, bias, seed,
           tiling: pallas_layer_norm.Tiling = pallas_layer_norm.Tiling()):
  return pallas_layer_norm.dropout_residual_layer_norm(
      x, dense_bias, residual, scale, bias, rate=RATE, seed=seed, epsilon=EPS,
      out_dtype=x.dtype, tiling=tiling)


def _xla(x, dense_bias, residual, scale, bias, key):
  """The same site as the XLA path of the GPU step computes it."""
  y = x + dense_bias.astype(x.dtype)
  y = dropout.dropout(y, RATE, key)
  return modeling.residual_layer_norm(y, residual, scale, bias, EPS, x.dtype,
                                      jax.default_backend() == "gpu")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rows", type=int, default=32768, help="BERT-base 256×128: 32768.")
  parser.add_argument("--width", type=int, default=768)
  parser.add_argument("--check_rows", type=int, default=4096)
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--tilings", default="1024:4:1024,4096:4:1024,4096:8:1024,2048:8:1024,"
                      "2048:4:512,2048:4:2048", help="More tilings to time, comma-separated: "
                      "block_elements:num_warps:backward_programs.")
  parser.add_argument("--out", default=None, help="Also write the lines here (markdown).")
  args = parser.parse_args()
  checks = checklist.Checklist()
  report = checks.check

  # 1. and 2.: float32 against the reference under the kernels' mask.
  x, dense_bias, residual, scale, bias, cotangent = _inputs(args.check_rows, args.width,
                                                            jnp.float32)
  keep, keep_prob = pallas_layer_norm.keep_mask(SEED, x.shape, RATE)

  def reference(x, dense_bias, residual, scale, bias):
    dropped = jnp.where(keep, (x + dense_bias) / keep_prob, 0.0)
    return modeling.residual_layer_norm(dropped, residual, scale, bias, EPS, jnp.float32)

  @jax.jit
  def both(*operands):
    out, vjp = jax.vjp(lambda *o: _fused(*o, SEED), *operands)
    out_ref, vjp_ref = jax.vjp(reference, *operands)
    return (out, *vjp(cotangent)), (out_ref, *vjp_ref(cotangent))

  got, want = both(x, dense_bias, residual, scale, bias)
  for name, a, b in zip(("output", "d_x", "d_dense_bias", "d_residual", "d_scale", "d_bias"),
                        got, want):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    error = np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30)
    report(error <= 1e-4, f"{name} equals the reference under the kernels' mask (max error "
           f"{error:.1e} of its largest value)")
  kept = np.asarray(keep)
  n = kept.size
  bound = 5 * np.sqrt(keep_prob * (1 - keep_prob) / n)
  report(abs(kept.mean() - keep_prob) <= bound,
         f"kept fraction {kept.mean():.4f} over {n:,} elements (expected {keep_prob:.4f} ± "
         f"{bound:.4f})")
  d_x = np.asarray(got[1])
  report(bool((d_x[~kept] == 0).all() and (d_x[kept] != 0).all()),
         "the backward kernel drops the forward's elements (d_x is zero exactly there)")

  # 3.: four copies, their gradients added in the backward kernel.
  cotangents = [jax.random.normal(k, x.shape, jnp.float32)
                for k in jax.random.split(jax.random.PRNGKey(4), 4)]

  @jax.jit
  def copies(*operands):
    fused = lambda uses: lambda *o: pallas_layer_norm.dropout_residual_layer_norm(
        *o, rate=RATE, seed=SEED, epsilon=EPS, out_dtype=jnp.float32, uses=uses)
    _, vjp = jax.vjp(fused(4), *operands)
    _, vjp_one = jax.vjp(fused(1), *operands)
    return vjp(tuple(cotangents)), vjp_one(sum(cotangents))

  got, want = copies(x, dense_bias, residual, scale, bias)
  errors = [np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))
            / max(np.max(np.abs(np.asarray(b, np.float64))), 1e-30) for a, b in zip(got, want)]
  report(max(errors) <= 1e-5, "four copies' gradients added in the backward kernel: the five "
         f"inputs' gradients are those of their sum (max error {max(errors):.1e})")

  # 4.: one site forward + backward, kernels against XLA, bfloat16.
  operands = _inputs(args.rows, args.width, jnp.bfloat16)
  key = jax.random.PRNGKey(3)

  def step(site, randomness):
    def loss(*o):
      return jnp.sum(site(*o, randomness).astype(jnp.float32) * operands[-1].astype(
          jnp.float32))
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))

  xla_ms = checklist.timed_ms(step(_xla, key), operands[:5], args.steps, args.repeats)
  moved = 8 * args.rows * args.width * 2 / 1e9  # 4 reads + 4 writes of bf16 (rows, width)
  tilings = [pallas_layer_norm.Tiling()] + [
      pallas_layer_norm.Tiling(*map(int, t.split(":"))) for t in args.tilings.split(",") if t]
  checks.note(f"- one site forward + backward, {args.rows}×{args.width} bfloat16: XLA "
              f"{xla_ms:.3f} ms; the kernels (block elements, warps, backward programs; the "
              f"first is the default):")
  for tiling in tilings:
    fused = lambda *o, tiling=tiling: _fused(*o, tiling=tiling)
    try:
      fused_ms = checklist.timed_ms(step(fused, jnp.asarray(SEED)), operands[:5], args.steps,
                                    args.repeats)
    except Exception as e:  # pylint: disable=broad-except
      checks.note(f"  - {tiling}: failed ({type(e).__name__}: {str(e)[:160]})")
    else:
      checks.note(f"  - {tiling.block_elements}, {tiling.num_warps}, "
                  f"{tiling.backward_programs}: {fused_ms:.3f} ms (**{xla_ms / fused_ms:.2f}×** "
                  f"XLA's; its 8 arrays, {moved:.2f} GB, at {moved / fused_ms:.2f} TB/s)")

  checks.write(args.out, "Fused dropout + residual + LayerNorm",
               f"`python benchmarks/fused_layer_norm_checks.py --rows={args.rows} "
               f"--width={args.width}`; rate {RATE}, checks on {args.check_rows} rows in float32")
  return checks.failures


if __name__ == "__main__":
  sys.exit(main())
