"""FP8's one-pass quantization kernel and dense layer, checked and timed on the device.

    python benchmarks/fp8_checks.py [--rows=32768] [--width=1024] [--features=4096] [--out=f.md]

The CPU tests run the kernel in Pallas' interpreter; Triton compiles it only for a GPU (FP8
conversions need compute capability 8.9 or newer). Here, on whatever device JAX has (a CPU
interprets):

1. the kernel (`fp8.quantize`, "pallas") writes what XLA's operations ("xla") compute for a
   bfloat16 (rows, width) operand, in float8_e4m3fn and float8_e5m2, with a scale that clips:
   both layouts to the bit, the largest |value| exactly, the column sums within 1e-5 relative;
   and with the feed-forward's GELU applied by the kernel, against XLA's quantization of the
   model's GELU: FP8 values that differ in at most one element in a thousand (the kernel's
   erfc is its own), the largest |value| within 1%;
2. `fp8.Fp8Dense` forward and backward against Flax's `Dense` with `Fp8DirectDotGeneralOp`
   (same variables, the output's gradient a fixed array): the six new FP8 variables to the
   bit, the output and the input's and kernel's gradients within 1% of their largest value
   (the two programs' FP8 GEMMs may sum in other orders); the bias gradient within 1e-5
   relative of the exact column sums of the output's bfloat16 gradient (ours sums in float32;
   Flax's error is printed beside it);
3. timed, median of `--repeats` runs of `--steps`: the kernel against XLA's quantization of the
   same operand (both layouts and the largest |value|), and one dense layer (rows × width →
   features, bfloat16 activations: BERT-large's first feed-forward layer at 64 × 512 by
   default) forward + backward as ours, as Flax's FP8 layer and in bfloat16.

Checks print PASS or FAIL with their numbers; the exit status is the number of failures.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import fp8, modeling
from benchmarks import checklist
# pylint: enable=g-import-not-at-top,wrong-import-position

FORMATS = (jnp.float8_e4m3fn, jnp.float8_e5m2)
STATE = "_overwrite_with_gradient"


def _layers(features):
  inits = dict(kernel_init=nn.initializers.normal(0.05), bias_init=nn.initializers.normal(0.1))
  return {"ours": fp8.Fp8Dense(features, dtype=jnp.bfloat16, **inits),
          "flax_fp8": nn.Dense(features, dtype=jnp.bfloat16,
                               dot_general_cls=nn.Fp8DirectDotGeneralOp, **inits),
          "bfloat16": nn.Dense(features, dtype=jnp.bfloat16, **inits)}


def _step(layer):
  """`step(variables, x, cotangent)`: forward + backward of `layer` whose output's gradient is
  `cotangent` (an argument, not a constant of the program): the gradients of the variables
  (FP8's new values among them) and of the input."""
  def loss(variables, x, cotangent):
    return jnp.sum(layer.apply(variables, x).astype(jnp.float32) * cotangent)
  return jax.jit(jax.grad(loss, argnums=(0, 1)))


def _relative(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rows", type=int, default=32768, help="BERT-large 64×512: 32768.")
  parser.add_argument("--width", type=int, default=1024)
  parser.add_argument("--features", type=int, default=4096)
  parser.add_argument("--check_rows", type=int, default=4096)
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default=None, help="Also write the lines here (markdown).")
  args = parser.parse_args()
  checks = checklist.Checklist()
  report = checks.check
  keys = jax.random.split(jax.random.PRNGKey(0), 4)

  # 1. The kernel against XLA's operations.
  x = (jax.random.normal(keys[0], (args.check_rows, args.width)) * 4).astype(jnp.bfloat16)
  for q_dtype in FORMATS:
    # A scale under which the largest values clip: the format's range covers 2 of the 16-ish.
    scale = jnp.asarray([2.0 / float(jnp.finfo(q_dtype).max)], jnp.float32)
    got, want = (jax.jit(lambda x, s, impl=impl: fp8.quantize(
        x, s, q_dtype, column_sums=True, implementation=impl))(x, scale)
                 for impl in ("pallas", "xla"))
    bits = lambda a: np.asarray(a).view(np.uint8)
    same = (np.array_equal(bits(got.q), bits(want.q))
            and np.array_equal(bits(got.q_t), bits(want.q_t)))
    differ = int(np.sum(bits(got.q) != bits(want.q)))
    report(same, f"{jnp.dtype(q_dtype).name}: the kernel's FP8 values, as they are and "
           f"transposed, are XLA's to the bit ({differ:,} of {x.size:,} differ)")
    report(float(got.amax) == float(want.amax),
           f"{jnp.dtype(q_dtype).name}: largest |value| {float(got.amax)} (XLA's "
           f"{float(want.amax)})")
    error = _relative(got.column_sums, want.column_sums)
    report(error <= 1e-5, f"{jnp.dtype(q_dtype).name}: column sums within {error:.1e} of XLA's")

  # 1b. GELU applied by the kernel (the feed-forward's second layer) against the model's.
  scale = jnp.asarray([2.0 / float(jnp.finfo(jnp.float8_e4m3fn).max)], jnp.float32)
  got = jax.jit(lambda x, s: fp8.quantize(x, s, jnp.float8_e4m3fn, activation="gelu",
                                          implementation="pallas"))(x, scale)
  want = jax.jit(lambda x, s: fp8.quantize(modeling.gelu(x, False), s, jnp.float8_e4m3fn,
                                           implementation="xla"))(x, scale)
  differ = float(np.mean(np.asarray(got.q).view(np.uint8) != np.asarray(want.q).view(np.uint8)))
  report(differ <= 1e-3, f"GELU applied in the kernel: its FP8 values differ from those of "
         f"the model's GELU quantized by XLA in a fraction {differ:.1e} of elements (its erfc "
         "is its own)")
  report(abs(float(got.amax) - float(want.amax)) <= 1e-2 * float(want.amax),
         f"GELU applied in the kernel: largest |value| {float(got.amax)} (XLA's "
         f"{float(want.amax)})")

  # 2. The layer against Flax's.
  layers = _layers(args.features)
  x = jax.random.normal(keys[1], (args.check_rows, args.width), jnp.float32) * 2
  cotangent = jax.random.normal(keys[2], (args.check_rows, args.features), jnp.float32)
  variables = layers["flax_fp8"].init(keys[3], x)
  (ours, ours_x), (theirs, theirs_x) = (
      _step(layers[name])(variables, x, cotangent) for name in ("ours", "flax_fp8"))
  outputs = [jax.jit(layers[name].apply)(variables, x) for name in ("ours", "flax_fp8")]
  state_same = all(
      np.array_equal(np.asarray(value), np.asarray(theirs[STATE][fp8.STATE_NAME][name]))
      for name, value in ours[STATE][fp8.STATE_NAME].items())
  report(state_same, "the six new FP8 variables (scales and histories) are Flax's to the bit")
  for name, a, b in (("output", *outputs), ("input gradient", ours_x, theirs_x),
                     ("kernel gradient", ours["params"]["kernel"], theirs["params"]["kernel"])):
    error = _relative(a, b)
    report(error <= 1e-2, f"{name} within {error:.1e} of Flax's layer (of its largest value)")
  exact = np.asarray(cotangent.astype(jnp.bfloat16), np.float64).sum(axis=0)
  errors = [_relative(grads["params"]["bias"], exact) for grads in (ours, theirs)]
  report(errors[0] <= 1e-5, f"bias gradient within {errors[0]:.1e} of the exact column sums "
         f"of the output's bfloat16 gradient (Flax's layer: {errors[1]:.1e})")

  # 3. Timings.
  operand = (jax.random.normal(keys[0], (args.rows, args.width)) * 4).astype(jnp.bfloat16)
  scale = jnp.asarray([0.01], jnp.float32)
  moved = operand.size * (2 + 1 + 1) / 1e9  # bfloat16 read, two FP8 layouts written
  times = {}
  for impl in ("pallas", "xla"):
    fn = jax.jit(lambda x, s, impl=impl: (lambda q: (q.q, q.q_t, q.amax))(
        fp8.quantize(x, s, jnp.float8_e4m3fn, implementation=impl)))
    times[impl] = checklist.timed_ms(fn, (operand, scale), args.steps, args.repeats)
  rate = moved / times["pallas"]
  checks.note(f"- quantizing a {args.rows}×{args.width} bfloat16 operand (both layouts and its "
              f"largest |value|): the kernel {times['pallas']:.3f} ms ({rate:.2f} TB/s on its "
              f"{moved:.2f} GB), XLA's operations {times['xla']:.3f} ms "
              f"(**{times['xla'] / times['pallas']:.2f}×** the kernel's)")
  x = operand.astype(jnp.float32)
  cotangent = jax.random.normal(keys[2], (args.rows, args.features), jnp.bfloat16)
  variables = layers["flax_fp8"].init(keys[3], x)
  plain = {"params": variables["params"]}
  layer_ms = {name: checklist.timed_ms(_step(layer),
                                       (plain if name == "bfloat16" else variables, x,
                                        cotangent), args.steps, args.repeats)
              for name, layer in layers.items()}
  flops = 6 * args.rows * args.width * args.features
  checks.note(f"- one dense layer {args.rows}×{args.width} → {args.features}, forward + "
              f"backward: ours {layer_ms['ours']:.3f} ms ({flops / layer_ms['ours'] / 1e9:.0f} "
              f"TFLOP/s), Flax's FP8 layer {layer_ms['flax_fp8']:.3f} ms "
              f"(**{layer_ms['flax_fp8'] / layer_ms['ours']:.2f}×** ours), bfloat16 "
              f"{layer_ms['bfloat16']:.3f} ms (**{layer_ms['bfloat16'] / layer_ms['ours']:.2f}×**"
              f" ours)")

  checks.write(args.out, "FP8's one-pass quantization and dense layer",
               f"`python benchmarks/fp8_checks.py --rows={args.rows} --width={args.width} "
               f"--features={args.features}`; checks on {args.check_rows} rows")
  return checks.failures


if __name__ == "__main__":
  sys.exit(main())
