"""The masked-LM head's own numerics checked, and timed, on the device that runs them.

    python benchmarks/head_checks.py [--positions=5120] [--vocab=30522] [--hidden=768]
                                     [--out=checks.md]

Both are written for the compiler, so the device's compiler is the one to check them:

1. `mlm.cross_entropy` (one reduction over the float32 logits, softmax's normaliser taken
   online) equals log_softmax at the label, within 1e-5 of the loss, with `jnp.argmax`'s
   prediction and softmax − one-hot as the gradient, for logits of BERT's shape (masked
   positions × vocabulary); forward + backward timed against the two reductions it replaced
   and against log_softmax with a gather;
2. `modeling.float32_einsum`, the tied decoder, in bfloat16 at BERT's shapes: the scores equal
   the plain einsum's, the gradients are autodiff's of the cotangent rounded to bfloat16
   (within bfloat16's rounding), and on a GPU no GEMM of the compiled program reads a float32
   operand (the CPU's compiler widens bfloat16 dots itself).

Checks print PASS or FAIL with their numbers; the exit status is the number of failures.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp

from bert_jax.model import modeling
from bert_jax.objectives import mlm
from bert_jax.parallel import hlo_costs
from benchmarks import checklist
# pylint: enable=g-import-not-at-top,wrong-import-position


def gathered(logits, labels):
  """The loss differentiated as written: log_softmax, and the label's entry gathered."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return (-jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0],
          jnp.argmax(logits, axis=-1))


def _two_pass_forward(logits, labels):
  """`mlm._forward` as it was: the largest logit with its index, then the sum of exponentials
  with the label's logit, two reductions over the logits."""
  x = logits.astype(jnp.float32)
  index = mlm._vocab_index(x)  # pylint: disable=protected-access

  def larger(a, b):
    take_a = (a[0] > b[0]) | ((a[0] == b[0]) & (a[1] < b[1]))
    return jnp.where(take_a, a[0], b[0]), jnp.where(take_a, a[1], b[1])

  peak, top = jax.lax.reduce((x, index), (jnp.array(-jnp.inf, x.dtype), jnp.array(0, jnp.int32)),
                             larger, (x.ndim - 1,))
  exps, picked = jax.lax.reduce(
      (jnp.exp(x - peak[..., None]), jnp.where(index == labels[..., None], x, 0.0)),
      (jnp.array(0, jnp.float32), jnp.array(0, jnp.float32)),
      lambda a, b: (a[0] + b[0], a[1] + b[1]), (x.ndim - 1,))
  lse = jnp.log(exps) + peak
  return (lse - picked, top), lse


def _two_passes(logits, labels):
  """`mlm.cross_entropy` (the same backward) with `_two_pass_forward` while it is traced."""
  kept = mlm._forward  # pylint: disable=protected-access
  mlm._forward = _two_pass_forward  # pylint: disable=protected-access
  try:
    return mlm.cross_entropy(logits, labels)
  finally:
    mlm._forward = kept  # pylint: disable=protected-access


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--positions", type=int, default=5120,
                      help="Masked positions: BERT-base 256 × 20 = 5120.")
  parser.add_argument("--vocab", type=int, default=30522)
  parser.add_argument("--hidden", type=int, default=768)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default=None, help="Also write the lines here (markdown).")
  args = parser.parse_args()
  checks = checklist.Checklist()
  report = checks.check
  keys = jax.random.split(jax.random.PRNGKey(0), 6)

  # 1. The loss.
  logits = jax.random.normal(keys[0], (args.positions, args.vocab), jnp.float32) * 3
  labels = jax.random.randint(keys[1], (args.positions,), 0, args.vocab)
  weights = jax.random.uniform(keys[2], (args.positions,))

  def loss_and_grad(form):
    def weighted(z):
      loss, top = form(z, labels)
      return jnp.sum(weights * loss), (loss, top)
    return jax.jit(jax.value_and_grad(weighted, has_aux=True))

  ours, two_passes, as_written = map(loss_and_grad, (mlm.cross_entropy, _two_passes, gathered))
  (_, (loss, top)), grad = ours(logits)
  (_, (want, want_top)), want_grad = as_written(logits)
  error = float(jnp.max(jnp.abs(loss - want) / jnp.abs(want)))
  report(error <= 1e-5, f"the loss equals log_softmax at the label over {args.positions:,} × "
         f"{args.vocab:,} logits (max relative error {error:.1e})")
  report(bool(jnp.all(top == want_top)), "the prediction is jnp.argmax's")
  error = float(jnp.max(jnp.abs(grad - want_grad)) / jnp.max(jnp.abs(want_grad)))
  report(error <= 1e-5, f"the gradient is log_softmax's (max error {error:.1e} of its largest "
         "value)")
  (_, (loss, _)), _ = two_passes(logits)
  error = float(jnp.max(jnp.abs(loss - want) / jnp.abs(want)))
  report(error <= 1e-5, f"so does the two-pass form timed beside it ({error:.1e})")
  one_ms, two_ms, gathered_ms = (checklist.timed_ms(form, (logits,), args.steps, args.repeats)
                                 for form in (ours, two_passes, as_written))
  checks.note(f"- loss forward + backward: {one_ms:.3f} ms in one pass; {two_ms:.3f} ms in two "
              f"(**{two_ms / one_ms:.2f}×**); {gathered_ms:.3f} ms as log_softmax and a gather "
              f"({gathered_ms / one_ms:.2f}×)")

  # 2. The tied decoder in bfloat16.
  x = jax.random.normal(keys[3], (args.positions, args.hidden), jnp.float32).astype(jnp.bfloat16)
  table = jax.random.normal(keys[4], (args.vocab, args.hidden), jnp.float32) * 0.02
  cotangent = jax.random.normal(keys[5], (args.positions, args.vocab), jnp.float32)
  spec = "...h,vh->...v"

  def scores_and_gradients(x, table):
    scores, vjp = jax.vjp(lambda x, t: modeling.float32_einsum(spec, x, t), x, table)
    return scores, *vjp(cotangent)

  decoder = jax.jit(scores_and_gradients).lower(x, table).compile()  # run and read: one compile
  scores, d_x, d_table = decoder(x, table)
  plain = jnp.einsum(spec, x, table.astype(jnp.bfloat16), preferred_element_type=jnp.float32)
  error = float(jnp.max(jnp.abs(scores - plain)) / jnp.max(jnp.abs(plain)))
  report(error <= 1e-6, f"the decoder's scores are the plain einsum's (max error {error:.1e})")
  rounded = cotangent.astype(jnp.bfloat16).astype(jnp.float32)
  exact = functools.partial(jnp.einsum, precision=jax.lax.Precision.HIGHEST)  # not TF32
  want_x = exact("nv,vh->nh", rounded, table.astype(jnp.bfloat16).astype(jnp.float32))
  want_table = exact("nv,nh->vh", rounded, x.astype(jnp.float32))
  for name, got, want, bound in (("x", d_x, want_x, 1e-2), ("table", d_table, want_table, 1e-4)):
    error = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want)) / jnp.max(jnp.abs(want)))
    report(error <= bound, f"the gradient of {name} is the rounded cotangent's (max error "
           f"{error:.1e} of its largest value; {got.dtype})")
  if jax.default_backend() == "gpu":
    types = hlo_costs.matmul_operand_types(hlo_costs.parse(decoder.as_text()))
    report(bool(types) and not hlo_costs.float32_matmuls(types),
           f"no GEMM of the decoder's program reads a float32 operand ({types})")
  checks.write(args.out, "The masked-LM head's numerics", " ".join(sys.argv))
  return checks.failures


if __name__ == "__main__":
  sys.exit(main())
