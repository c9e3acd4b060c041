"""Cloud TPU slices by the names users type (`v4-32`, `v5p-64`, `v5litepod-16`, `v6e-64`), their
chips, and compile-only devices of their real topology.

With `libtpu` installed (the version jax's `tpu` extra names), `topology_devices("v4-32")` gives
the devices of a 16-chip v4 slice on any machine, CPU-only ones included: a step jitted over a
mesh of them compiles to a real TPU executable (memory, FLOPs, collectives) without a chip. This is
how a config is checked against its pod before the pod is rented (`runs/compile_check.py`).

How names count: v2/v3/v4/v5p types count TensorCores, two per chip; v5litepod (v5e) and v6e
types count chips, one TensorCore each. JAX sees each core of a v2/v3 chip as a device (8 GiB /
16 GiB of HBM each), and one device per v4/v5p chip (megacore: both cores run one program). So a
v3-32 slice is 16 chips and 32 devices, a v4-32 slice 16 chips and 16 devices. The launcher's
`accelerator_info` (launch/common.sh) applies the same rules in the shell; a test keeps them equal.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Sequence

GIB = 2**30


def _gib(value: float) -> int:
  return int(value * GIB)


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU generation's chip: what a roofline needs, and what an hour of it costs.

  `peak_flops` is the dense bfloat16 peak per chip, `hbm_bytes` the HBM of one chip (split between
  the devices of a chip where JAX sees each core), `hbm_bandwidth` bytes/s per chip and
  `ici_bandwidth` the chip's total inter-chip bandwidth in bytes/s (all links, both directions
  summed as Google states it). `usable_hbm_per_device` is the HBM libtpu's compiler offers one
  program per device (its "exceeds available HBM" figure, libtpu 0.0.42), below the chip's HBM by
  what the runtime keeps. `price` is the on-demand list price per chip-hour in USD.
  """
  generation: str          # as in accelerator names: v2, v3, v4, v5p, v5litepod, v6e
  topology_prefix: str     # as libtpu names topologies: v2, v3, v4, v5, v5e, v6e
  device_kind: str         # jax's Device.device_kind
  devices_per_chip: int
  dims: int                # 2D torus (v2, v3, v5e, v6e) or 3D (v4, v5p)
  peak_flops: float
  hbm_bytes: int
  hbm_bandwidth: float
  ici_bandwidth: float
  usable_hbm_per_device: int   # what libtpu's compiler lets one program use
  price: float
  price_note: str
  source: str

  @property
  def hbm_per_device(self) -> int:
    return self.hbm_bytes // self.devices_per_chip


# On-demand list prices per chip-hour (v2/v3 were priced per 8-core device of 4 chips: $4.50 and
# $8.00 an hour; v4 $12.88 per 4-chip v4-8).
_PRICES = ("cloud.google.com/tpu/pricing list prices (us-central1/us-central2/us-east5) as "
           "tabulated in skypilot-org/skypilot-catalog catalogs/v7/gcp/vms.csv, read 2026-11")
_BOOK = "jax-ml/scaling-book tpus.md (ICI per link, one way)"

# Peak dense bf16 FLOP/s, HBM and HBM bandwidth per chip from Google's page of each generation
# (v2: JAX's pallas/mosaic/tpu_info.py, as no Cloud page for v2 remains). ICI per chip is
# bidirectional over all links: Google states it for v5e (400 GB/s), v5p (1,200) and v6e (800);
# for v2-v4 it is links x per-link bandwidth x 2 (v2's 496 Gbit/s per link from Norrie et al.
# 2021, "The Design Process for Google's Training Chips: TPUv2 and TPUv3").
CHIPS: dict[str, Chip] = {c.generation: c for c in (
    Chip("v2", "v2", "TPU v2", 2, 2, 46e12, 16 * GIB, 716e9, 4 * 62e9 * 2, _gib(7.48),
         4.50 / 4, _PRICES, "JAX jax/_src/pallas/mosaic/tpu_info.py; Norrie et al. 2021"),
    Chip("v3", "v3", "TPU v3", 2, 2, 123e12, 32 * GIB, 900e9, 4 * 100e9 * 2, _gib(15.48),
         8.00 / 4, _PRICES, "https://cloud.google.com/tpu/docs/v3; " + _BOOK),
    Chip("v4", "v4", "TPU v4", 1, 3, 275e12, 32 * GIB, 1200e9, 6 * 45e9 * 2, _gib(30.75),
         12.88 / 4, _PRICES, "https://cloud.google.com/tpu/docs/v4; " + _BOOK),
    Chip("v5litepod", "v5e", "TPU v5 lite", 1, 2, 197e12, 16 * GIB, 819e9, 400e9, _gib(15.75),
         1.20, _PRICES, "https://cloud.google.com/tpu/docs/v5e"),
    # Google's page says 95 GiB; the compiler offers a program 95.74 GiB, so the chip has 96.
    Chip("v5p", "v5", "TPU v5", 1, 3, 459e12, 96 * GIB, 2765e9, 1200e9, _gib(95.74),
         4.20, _PRICES, "https://cloud.google.com/tpu/docs/v5p-training"),
    Chip("v6e", "v6e", "TPU v6 lite", 1, 2, 918e12, 32 * GIB, 1638e9, 800e9, _gib(31.25),
         2.70, _PRICES, "https://cloud.google.com/tpu/docs/v6e"),
)}

_ALIASES = {"v5e": "v5litepod"}
_CORE_COUNTED = ("v2", "v3", "v4", "v5p")   # names count TensorCores (two per chip)


@dataclasses.dataclass(frozen=True)
class Slice:
  """A slice: its name, chip, size and the topology string libtpu compiles for."""
  name: str
  chip: Chip
  chips: int
  devices: int
  hosts: int
  topology: str            # e.g. "v4:2x2x4"
  shape: tuple[int, ...]   # chips along each torus dimension

  @property
  def chips_per_host_bounds(self) -> tuple[int, int, int]:
    return (2, 2, 1) if self.chips >= 4 else (1, self.chips, 1)

  def describe(self) -> str:
    return (f"{self.name}: {self.chips} {self.chip.device_kind} chips, {self.devices} devices, "
            f"{self.hosts} host{'s' if self.hosts > 1 else ''}, topology {self.topology}")


def _shape(chips: int, dims: int) -> tuple[int, ...]:
  """The standard slice shape for a power-of-two chip count: 2x2(x1) for 4 chips, then each
  doubling doubles the last of the shortest dimensions (3D: 2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8,
  ...; 2D: 2x4, 4x4, 4x8, 8x8, 8x16, ...)."""
  if chips < 1 or chips & (chips - 1):
    raise ValueError(f"{chips} chips is not a power of two: name the topology itself, e.g. "
                     f"v4:4x4x12")
  if chips < 4:
    return (1, chips) + (1,) * (dims - 2)
  shape = [2, 2] + [1] * (dims - 2)
  while _prod(shape) < chips:
    smallest = min(shape)
    shape[max(i for i, d in enumerate(shape) if d == smallest)] *= 2
  return tuple(shape)


def _prod(values: Sequence[int]) -> int:
  out = 1
  for v in values:
    out *= int(v)
  return out


def _hosts(chip: Chip, chips: int) -> int:
  # A v2-v5p worker holds 4 chips; v5e/v6e slices of up to 8 chips are one worker, larger ones
  # have 4 chips per worker.
  if chip.generation in ("v5litepod", "v6e") and chips <= 8:
    return 1
  return max(1, chips // 4)


def parse(name: str) -> Slice:
  """`v4-32`, `v5p-64`, `v5litepod-16` (or `v5e-16`), `v6e-64`, `v3-32`, `v2-8`, or a libtpu
  topology such as `v4:4x4x12` for shapes that are not a power of two."""
  text = name.strip().lower()
  topo = re.fullmatch(r"(v2|v3|v4|v5|v5p|v5e|v5litepod|v6e):(\d+(?:x\d+)+)", text)
  if topo:
    prefix = {"v5": "v5p", "v5e": "v5litepod"}.get(topo.group(1), topo.group(1))
    chip = CHIPS[prefix]
    shape = tuple(int(d) for d in topo.group(2).split("x"))
    if len(shape) != chip.dims:
      raise ValueError(f"{name}: {chip.generation} topologies have {chip.dims} dimensions "
                       f"(e.g. {chip.topology_prefix}:{'x'.join(['2'] * chip.dims)})")
    chips = _prod(shape)
    count = chips * 2 if chip.generation in _CORE_COUNTED else chips
    return Slice(f"{chip.generation}-{count}", chip, chips, chips * chip.devices_per_chip,
                 _hosts(chip, chips), f"{chip.topology_prefix}:{topo.group(2)}", shape)
  match = re.fullmatch(r"(v2|v3|v4|v5p|v5e|v5litepod|v6e)-(\d+)", text)
  if not match:
    raise ValueError(f"{name!r} is not a TPU type such as v3-32, v4-32, v5p-64, v5litepod-16, "
                     f"v6e-64 (or a topology such as v4:2x2x4)")
  chip = CHIPS[_ALIASES.get(match.group(1), match.group(1))]
  count = int(match.group(2))
  if chip.generation in _CORE_COUNTED:
    if count < 8 or count % 8:
      raise ValueError(f"{name}: {chip.generation} slices come in multiples of 8 TensorCores "
                       f"(2 per chip), e.g. {chip.generation}-8, {chip.generation}-32")
    chips = count // 2
  else:
    chips = count
  shape = _shape(chips, chip.dims)
  return Slice(f"{chip.generation}-{count}", chip, chips, chips * chip.devices_per_chip,
               _hosts(chip, chips), f"{chip.topology_prefix}:{'x'.join(map(str, shape))}",
               shape)


def quiet_libtpu(slice_: Slice) -> None:
  """Off a TPU VM, libtpu still looks for the VM it runs on when it starts (accelerator type,
  worker hostnames, metadata server) and warns at length when there is none; compiling for a
  topology needs none of them. On a TPU VM the runtime's own settings are left alone."""
  from bert_jax.parallel import distributed  # pylint: disable=g-import-not-at-top
  if distributed.on_tpu_vm():
    return
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", slice_.name)
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  # libtpu takes a machine-wide lock when it loads, for the chips it would drive; there are
  # none, so several processes may compile at once.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def topology_devices(slice_: Slice | str) -> list:
  """Compile-only devices of the slice's real topology (needs the `libtpu` package).

  JAX's persistent compilation cache is turned off for the process: a compile-only client
  writes its executables there but cannot load them back (each later compile would warn and
  compile again), and a full-size model's TPU executable is large. (The switch is read when
  the process first compiles; a process that compiled with the cache before keeps it.)"""
  slice_ = parse(slice_) if isinstance(slice_, str) else slice_
  quiet_libtpu(slice_)
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    topology = topologies.get_topology_desc(
        topology_name=slice_.topology, platform="tpu",
        chip_config_name="megacore" if slice_.chip.devices_per_chip == 1
        and slice_.chip.generation in ("v4", "v5p") else "default",
        chips_per_host_bounds=slice_.chips_per_host_bounds)
  except Exception as e:  # pylint: disable=broad-except
    if not _has_libtpu():
      raise RuntimeError(
          f"compiling for {slice_.name} needs the libtpu package (the version jax's tpu extra "
          f"names): pip install 'jax[tpu]=={_jax_version()}', or `make env` in the "
          f"checkout") from e
    raise
  devices = list(topology.devices)
  if len(devices) != slice_.devices:
    raise RuntimeError(f"{slice_.topology} gave {len(devices)} devices, expected "
                       f"{slice_.devices} for {slice_.name}")
  return devices


def _has_libtpu() -> bool:
  import importlib.util  # pylint: disable=g-import-not-at-top
  return importlib.util.find_spec("libtpu") is not None


def _jax_version() -> str:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.__version__
