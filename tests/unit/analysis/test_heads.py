"""Head gates and importance (`bert_jax.analysis.heads`): gates of one change nothing, a gate
of zero removes exactly its head, and the importance is the derivative a finite difference
measures."""

import jax
import numpy as np
import pytest

from bert_jax.analysis import heads as heads_lib
from bert_jax.model import modeling
from bert_jax.training import step as step_lib

def _logits(objective, model, params, batch, gates=None):
  state = None if gates is None else {modeling.HEAD_GATES: heads_lib.gates_tree(params, gates)}
  return np.asarray(step_lib.apply_model(objective, model, params, batch, deterministic=True,
                                         model_state=state))


def _loss(objective, model, params, batch, gates):
  outputs = step_lib.apply_model(
      objective, model, params, batch, deterministic=True,
      model_state={modeling.HEAD_GATES: heads_lib.gates_tree(params, gates)})
  return float(objective.loss(outputs, batch, objective.denominators(batch))[0])


def test_gates_of_one_change_nothing_and_a_zero_gate_removes_its_head(classifier):
  config, objective, model, params, batch = classifier
  paths = heads_lib.gate_paths(params)
  assert [p[-3] for p in paths] == ["layer_0", "layer_1", "layer_2"]
  ones = np.ones((3, config.num_attention_heads), np.float32)
  plain = _logits(objective, model, params, batch)
  np.testing.assert_array_equal(_logits(objective, model, params, batch, ones), plain)
  # Head 1 of layer 1 removed = its slice of the output projection's input set to zero.
  gates = ones.copy()
  gates[1, 1] = 0.0
  dim = config.hidden_size // config.num_attention_heads
  cut = jax.tree.map(np.copy, params)
  output = cut["bert"]["encoder"]["layer_1"]["attention"]["output"]["dense"]["kernel"]
  output[dim:2 * dim] = 0.0
  np.testing.assert_allclose(_logits(objective, model, params, batch, gates),
                             _logits(objective, model, cut, batch), atol=1e-6)
  assert not np.allclose(_logits(objective, model, params, batch, gates), plain, atol=1e-4)
  tree = heads_lib.gates_tree(params, gates)
  np.testing.assert_array_equal(np.asarray(heads_lib.gates_array(tree, params)), gates)
  stacked = modeling.stack_layers(params, 3)  # the scanned layout: one stack, no layer order
  with pytest.raises(ValueError, match="head gates need unrolled layers"):
    heads_lib.gate_paths(stacked)


def test_importance_is_the_absolute_derivative_of_the_loss(classifier):
  config, objective, model, params, batch = classifier
  raw = heads_lib.head_importance(objective, model, config, params, [batch], normalize=False)
  assert raw.shape == (3, config.num_attention_heads)
  ones = np.ones_like(raw, np.float32)
  eps = 1e-2
  for layer, head in [(0, 0), (1, 1), (2, 0)]:
    up, down = ones.copy(), ones.copy()
    up[layer, head] += eps
    down[layer, head] -= eps
    finite = (_loss(objective, model, params, batch, up)
              - _loss(objective, model, params, batch, down)) / (2 * eps)
    assert raw[layer, head] == pytest.approx(abs(finite), rel=2e-2, abs=1e-5), (layer, head)
  # Two batches: the mean of each one's absolute derivative; normalised rows have unit norm.
  other = dict(batch, label=1 - batch["label"])
  both = heads_lib.head_importance(objective, model, config, params, [batch, other],
                                   normalize=False)
  alone = heads_lib.head_importance(objective, model, config, params, [other], normalize=False)
  np.testing.assert_allclose(both, (raw + alone) / 2, rtol=1e-5)
  normalized = heads_lib.head_importance(objective, model, config, params, [batch])
  np.testing.assert_allclose(np.linalg.norm(normalized, axis=1), 1.0, rtol=1e-6)
