"""Model selection's rules, without a model: which value is better, what counts as an
evaluation, when patience runs out, and what a checkpoint carries over."""

import math

import pytest

from bert_jax.training import selection as selection_lib


def test_higher_is_better_except_for_losses_and_a_value_that_is_not_a_number_never_wins():
  best = []
  accuracy = selection_lib.Selection("eval_dev/accuracy", patience=2,
                                     on_best=lambda step, state, s: best.append((step, state)))
  assert accuracy.higher_is_better
  assert accuracy.update(10, "s10", {"eval_dev/accuracy": 0.5})
  assert not accuracy.update(20, "s20", {"eval_dev/accuracy": math.nan})
  assert not accuracy.exhausted
  assert not accuracy.update(30, "s30", {"eval_dev/accuracy": 0.5})  # equal is not better
  assert accuracy.exhausted and best == [(10, "s10")]
  assert accuracy.describe() == "best accuracy 0.5000 at step 10"

  loss = selection_lib.Selection("eval/loss")
  assert not loss.higher_is_better
  assert loss.update(1, None, {"eval/loss": math.inf}) is False  # no best from an inf
  assert loss.describe() == "no evaluation of loss yet"
  assert loss.update(2, None, {"eval/loss": 2.0}) and loss.update(3, None, {"eval/loss": 1.0})
  assert not loss.update(4, None, {"eval/loss": 1.5})
  assert (loss.best_step, loss.evaluations_since_best, loss.exhausted) == (3, 1, False)


def test_a_step_counts_once_and_a_checkpoint_carries_the_count_over():
  first = selection_lib.Selection("eval/f1", patience=3)
  first.update(100, None, {"eval/f1": 0.8})
  first.update(200, None, {"eval/f1": 0.7})
  assert not first.update(200, None, {"eval/f1": 0.9})  # a resumed run scoring step 200 again
  assert (first.best_step, first.evaluations_since_best) == (100, 1)
  metadata = {"task": "mrpc", selection_lib.METADATA_KEY: first.record()}
  resumed = selection_lib.Selection("eval/f1", patience=3).restored(metadata)
  assert resumed.record() == first.record()
  # Another metric, or a checkpoint written without evaluation during training: a fresh start.
  other = selection_lib.Selection("eval/exact", patience=3).restored(metadata)
  assert (other.best_step, other.evaluations_since_best) == (None, 0)
  assert selection_lib.Selection("eval/f1").restored({"task": "mrpc"}).best_step is None


def test_an_unknown_metric_and_a_patience_below_one_are_refused_in_words():
  with pytest.raises(ValueError, match=r"eval_metric 'f1' is not among the evaluation's scores "
                                       r"\(accuracy, num_examples\): set --eval_metric"):
    selection_lib.Selection("eval_dev/f1").update(
        5, None, {"eval_dev/accuracy": 1.0, "eval_dev/num_examples": 8})
  with pytest.raises(ValueError, match="patience 0: must be at least 1"):
    selection_lib.Selection("eval/f1", patience=0)
