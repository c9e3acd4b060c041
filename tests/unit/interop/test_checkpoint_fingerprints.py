"""The fingerprints a checkpoint records: numpy's (arrays in this process's memory) and the
device program's (arrays on accelerators or spread over processes) are the same numbers, for
every dtype a state holds, any shape, any mesh; one changed element changes both sums."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bert_jax.interop import checkpoint_fingerprints

RNG = np.random.RandomState(0)


def _arrays():
  return {
      "float32": RNG.randn(33, 17).astype(np.float32),
      "bfloat16": RNG.randn(5, 7, 3).astype(ml_dtypes.bfloat16),
      "float16": RNG.randn(129).astype(np.float16),
      "float8": RNG.randn(8, 16).astype(ml_dtypes.float8_e4m3fn),
      "int32": RNG.randint(-2**31, 2**31 - 1, size=(4, 9), dtype=np.int64).astype(np.int32),
      "uint32": RNG.randint(0, 2**32, size=(11,), dtype=np.uint64).astype(np.uint32),
      "int8": RNG.randint(-128, 128, size=(6, 6)).astype(np.int8),
      "bool": RNG.rand(3, 5) < 0.5,
      "scalar": np.float32(3.25),
      "empty": np.zeros((0, 4), np.float32),
      # More elements than numpy's pass takes at once: the positions go on across passes.
      "chunks": RNG.randn(checkpoint_fingerprints._HOST_CHUNK + 77).astype(np.float32),
  }


def test_numpy_and_the_device_program_agree_on_every_dtype_and_shape():
  arrays = _arrays()
  host = checkpoint_fingerprints.fingerprints(arrays)
  device = checkpoint_fingerprints.fingerprints(arrays, on_devices=True)
  on_device_arrays = checkpoint_fingerprints.fingerprints(jax.device_put(arrays))
  assert sorted(host) == sorted(arrays)
  assert host == device == on_device_arrays
  assert len(set(host.values())) == len(host)  # different arrays, different fingerprints


def test_sixty_four_bit_words_are_split_as_the_device_splits_them():
  with jax.enable_x64(True):
    arrays = {"float64": RNG.randn(7, 3), "int64": RNG.randint(-2**62, 2**62, size=(10,))}
    assert all(checkpoint_fingerprints._supported(a) for a in arrays.values())
    host = checkpoint_fingerprints.fingerprints(arrays)
    assert host == checkpoint_fingerprints.fingerprints(arrays, on_devices=True)
  # The two halves of a word swapped is another fingerprint.
  swapped = {k: v.view(np.uint32)[..., ::-1].copy().view(v.dtype) for k, v in arrays.items()}
  with jax.enable_x64(True):
    assert all(checkpoint_fingerprints.fingerprints(swapped)[k] != host[k] for k in arrays)


@pytest.mark.parametrize("on_devices", [False, True])
def test_one_changed_element_or_a_moved_one_changes_both_sums(on_devices):
  x = RNG.randn(64, 8).astype(np.float32)
  flipped = x.copy()
  flipped.view(np.uint32)[17, 3] ^= 1  # one bit of one element
  moved = x.copy()
  moved[[0, 1]] = moved[[1, 0]]  # the same values at other positions
  prints = [checkpoint_fingerprints.fingerprints({"x": a}, on_devices=on_devices)["x"]
            for a in (x, flipped, moved)]
  for other in prints[1:]:
    assert other[:8] != prints[0][:8] and other[8:] != prints[0][8:]


@pytest.mark.mesh
def test_arrays_sharded_over_a_mesh_have_the_fingerprint_of_the_whole_array():
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
  arrays = {k: v for k, v in _arrays().items() if v.ndim == 2 and v.shape[0] % 4 == 0}
  assert arrays
  sharded = {k: jax.device_put(v, NamedSharding(mesh, P("data"))) for k, v in arrays.items()}
  sharded["replicated"] = jax.device_put(jnp.arange(24.0), NamedSharding(mesh, P()))
  expected = checkpoint_fingerprints.fingerprints(
      {**arrays, "replicated": np.arange(24.0, dtype=np.float32)})
  assert checkpoint_fingerprints.fingerprints(sharded) == expected
  assert checkpoint_fingerprints.fingerprints(sharded, on_devices=True) == expected


def test_the_device_program_is_compiled_ahead_for_what_a_save_will_fingerprint():
  """`compile_ahead` traces and compiles the save's device program (the first save then finds
  it); arrays in host memory need none, so nothing is compiled for them."""
  tree = {"a": jax.device_put(np.arange(6, dtype=np.float32).reshape(2, 3)),
          "b": {"c": jax.device_put(np.ones(5, np.int32))}}
  program = checkpoint_fingerprints._fingerprint_leaves
  before = program._cache_size()
  checkpoint_fingerprints.compile_ahead(tree)  # CPU arrays: numpy's path, nothing to compile
  assert program._cache_size() == before
  checkpoint_fingerprints.compile_ahead(tree, on_devices=True)
  compiled = program._cache_size()
  assert compiled == before + 1
  prints = checkpoint_fingerprints.fingerprints(tree, on_devices=True)  # found, not traced
  assert program._cache_size() == compiled
  assert prints == checkpoint_fingerprints.fingerprints(tree)
