"""Fingerprints of the arrays a checkpoint holds, and the `checksums` item that records them.

A committed checkpoint step can still be damaged afterwards (a disk error, a partial copy, a bit
flip on the way to a bucket), and compressed array data does not always fail to decode: it can
decode into other numbers. So every save records, per array, its shape, dtype and a fingerprint
of its exact bits (two 32-bit sums of a mixing hash of each element's bits and its position,
computed on the devices where the arrays live, so nothing is gathered to a host and the result
does not depend on the mesh), and digests of the `data` and `meta` items; a read computes the
same of what it read back (`interop/checkpoint_store.py`).

Arrays that already sit in this process's memory (host arrays, and arrays on the CPU backend's
devices that this process holds whole) are fingerprinted by numpy, with the same arithmetic: a
device program over the whole state costs seconds of tracing and compiling at a run's first
save and at each restore, which numpy does not need there.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

CHECKSUMS_FORMAT = 1


def _key_name(path) -> str:
  return "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def flat_leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
  """`{"params/bert/...": leaf}`: the names arrays have in the checksum record and in
  messages, under `prefix` (a subtree read on its own keeps its place in the whole tree)."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    name = _key_name(path)
    out["/".join(p for p in (prefix, name) if p)] = leaf
  return out


_SEEDS = (0x243F6A88, 0x85A308D3)


def _mix(h):
  """murmur3's 32-bit finaliser: a bijection, so a changed input always changes the output."""
  h = h ^ (h >> 16)
  h = h * np.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * np.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _words(x):
  """The bits of `x` as uint32 words (narrower types widened, 64-bit ones split in two)."""
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
  return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _leaf_fingerprint(x):
  words = _words(x)
  position = jnp.zeros(words.shape, jnp.uint32)
  stride = 1
  for dim in reversed(range(words.ndim)):
    position = position + (jax.lax.broadcasted_iota(jnp.uint32, words.shape, dim)
                           * np.uint32(stride % 2**32))
    stride *= words.shape[dim]
  # Sums modulo 2**32 are exact and do not depend on the order of the reduction, hence not on
  # the mesh; each element's term is a bijection of its bits, so changing any one element
  # always changes both sums, and changing several goes unseen with odds of 2**-64.
  return jnp.stack([jnp.sum(_mix(words ^ _mix(position ^ np.uint32(seed))), dtype=jnp.uint32)
                    for seed in _SEEDS])


_fingerprint_leaves = jax.jit(lambda leaves: jnp.stack([_leaf_fingerprint(x) for x in leaves]))

# Elements per numpy pass: bounds the host path's temporaries (a few times 4 MiB) for any size.
_HOST_CHUNK = 1 << 20


def _host_words(x: np.ndarray) -> np.ndarray:
  """`_words` in numpy: a 64-bit element's two words in memory order, as bitcast_convert_type
  gives them."""
  if x.dtype == np.bool_:
    return x.astype(np.uint32)
  unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}[x.dtype.itemsize]
  return np.ascontiguousarray(x).view(unsigned)


def _host_leaf_fingerprint(x: np.ndarray) -> np.ndarray:
  """`_leaf_fingerprint` in numpy: the same two sums, modulo 2**32 (numpy's uint32 arithmetic
  wraps as XLA's does); the position is the element's row-major index among the words."""
  words = _host_words(x).reshape(-1)
  sums = np.zeros(len(_SEEDS), np.uint32)
  for start in range(0, words.size, _HOST_CHUNK):
    chunk = words[start:start + _HOST_CHUNK].astype(np.uint32)
    position = (np.arange(start, start + chunk.size, dtype=np.uint64) % 2**32).astype(np.uint32)
    # Array (not scalar) additions: numpy wraps those silently, as XLA does.
    sums += np.array([np.sum(_mix(chunk ^ _mix(position ^ np.uint32(seed))), dtype=np.uint32)
                      for seed in _SEEDS], np.uint32)
  return sums


def _in_host_memory(leaf) -> bool:
  """A numpy array, or a jax.Array on CPU devices that this process holds whole."""
  if not isinstance(leaf, jax.Array):
    return True
  return leaf.is_fully_addressable and all(d.platform == "cpu" for d in leaf.sharding.device_set)


def _supported(x) -> bool:
  """Whole-byte numbers and booleans (not 4-bit types; 64-bit ones only where JAX has them)."""
  dtype = np.dtype(x.dtype)
  if dtype == np.bool_:
    return True
  if jnp.issubdtype(dtype, jnp.floating):
    bits = jnp.finfo(dtype).bits
  elif jnp.issubdtype(dtype, jnp.integer):
    bits = jnp.iinfo(dtype).bits
  else:
    return False
  return bits == 8 * dtype.itemsize and (bits <= 32 or jax.config.jax_enable_x64)


def _to_host(x) -> np.ndarray:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(x.addressable_data(0))  # a reduction's result: replicated everywhere
  return np.asarray(x)


def fingerprints(tree: Any, prefix: str = "", on_devices: bool = False) -> dict[str, str]:
  """`{leaf name: 16 hex digits}` of every array in `tree`, computed where the arrays are
  (device arrays on their devices; arrays in this process's memory by numpy, unless
  `on_devices`: then by the device program on their devices, host arrays on the default one).
  Every process must call it for a tree of arrays spread over several processes, as for a
  save."""
  leaves, groups = _split(tree, prefix, on_devices)
  on_device = {name for names in groups.values() for name in names}
  out = {name: _hex(_host_leaf_fingerprint(np.asarray(leaf))) for name, leaf in leaves.items()
         if name not in on_device}
  for names, sums in _run_groups(leaves, groups):
    out.update((name, _hex(s)) for name, s in zip(names, sums))
  return out


def compile_ahead(tree: Any, on_devices: bool = False) -> None:
  """Runs the device program over `tree` once, discarding the sums, so that it is compiled
  before training and not at the first save, where the compile would stop training for seconds
  and widen the window a preemption loses. Arrays in host memory take numpy's path: nothing to
  compile (`on_devices`: the device program for them as well). Every process must call it for
  a tree of arrays spread over several processes."""
  leaves, groups = _split(tree, "", on_devices)
  for _ in _run_groups(leaves, groups):
    pass  # compiled and run; the sums are not wanted yet


def _split(tree: Any, prefix: str, on_devices: bool
           ) -> tuple[dict[str, Any], dict[Any, list[str]]]:
  """The arrays of `tree` by name, and the names the device program fingerprints, one group
  per set of devices (a mesh's arrays; host arrays on the default device): arrays held on
  accelerators or across processes, or every array with `on_devices`."""
  leaves = {name: leaf for name, leaf in flat_leaves(tree, prefix).items()
            if hasattr(leaf, "dtype") and hasattr(leaf, "shape") and _supported(leaf)}
  groups: dict[Any, list[str]] = {}
  for name, leaf in leaves.items():
    if on_devices or not _in_host_memory(leaf):
      key = frozenset(leaf.sharding.device_set) if isinstance(leaf, jax.Array) else None
      groups.setdefault(key, []).append(name)
  return leaves, groups


def _run_groups(leaves: dict[str, Any], groups: dict[Any, list[str]]):
  """Yields `(names, sums)` of each group, computed by the device program where they live."""
  for names in groups.values():
    inputs = [leaves[n] if isinstance(leaves[n], jax.Array) else jnp.asarray(leaves[n])
              for n in names]
    yield names, _to_host(_fingerprint_leaves(inputs))


def _hex(sums) -> str:
  return "".join(f"{int(v):08x}" for v in sums)


def json_digest(obj: Any) -> str:
  """A digest of `obj` as it reads back from JSON (tuples become lists, and so on)."""
  canonical = json.dumps(json.loads(json.dumps(obj)), sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def checksum_record(state_tree: Any, data_position: Any, metadata: Any) -> dict[str, Any]:
  """The `checksums` item of a save: per array its shape, dtype and fingerprint; digests of
  the `data` and `meta` items."""
  state_tree = jax.tree.map(lambda x: x if hasattr(x, "shape") else np.asarray(x), state_tree)
  prints = fingerprints(state_tree)
  leaves = {}
  for name, leaf in flat_leaves(state_tree).items():
    leaves[name] = {"shape": list(leaf.shape), "dtype": str(np.dtype(leaf.dtype)),
                    "fingerprint": prints.get(name)}
  return {"format": CHECKSUMS_FORMAT, "leaves": leaves, "data": json_digest(data_position),
          "meta": json_digest(metadata)}
