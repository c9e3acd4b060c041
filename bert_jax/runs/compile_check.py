"""Does a pre-training config fit a TPU slice or a GPU machine, and how fast could it run there?
Answered on any machine, before a chip is rented: the exact production step is compiled for the
slice's real topology (libtpu's compile-only devices) or the GPUs' description (JAX's CUDA
plugin, `parallel/gpu_targets`) and the executable is read.

    python -m bert_jax.pretrain --config=configs/pretrain.py:large --compile_for=v4-128
    python -m bert_jax.pretrain --config=configs/pretrain.py:base --compile_for=h100,h100x8 \
        --config.mesh_shape=-1,1,1

prints per-device HBM use against what the compiler lets a program use (and refuses, with the
fix, when the step does not fit), the step's matmul FLOPs beside the analytic count and XLA's
own, each collective per step with its bytes, the HBM traffic of its kernels by kind (matmuls,
fused attention, collectives, and the elementwise and reduction kernels around them; by part
of the step in the report's `parts`), and a roofline projection of step time, MFU, days and
cost to train the recipe.

The roofline is a bound on speed, not a prediction: the step's matmul FLOPs at the chip's peak
bf16 FLOP/s plus its collectives at the chip's full ICI (a GPU's: NVLink) bandwidth, nothing
overlapped (`parallel/hlo_costs` reads both from the compiled HLO, loops counted). The HBM
traffic it estimates is printed beside the bound, with its time at peak bandwidth, and left out
of it: for scanned layers it overstates what the program moves. On a GPU, where kernels run one
after another, the elementwise and reduction kernels' share of that traffic bounds the time the
step spends outside its matmuls: what fusing them can save. Chip figures and prices are in
`parallel/tpu_slices` and `parallel/gpu_targets`, each with its source.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from typing import Any

import ml_collections

from bert_jax.parallel import gpu_targets
from bert_jax.parallel import hlo_costs
from bert_jax.parallel import tpu_slices
from bert_jax.runs import pretraining
from bert_jax.training import metrics

GIB = 2**30


class DoesNotFit(ValueError):
  """The step needs more HBM than the slice's devices have; the message says what to change."""


@dataclasses.dataclass
class Report:
  """What a compile for one slice or GPU machine found (per device unless named otherwise)."""
  config_name: str
  slice: tpu_slices.Slice | gpu_targets.Machine
  mesh: dict[str, int]
  batch_per_device: int
  seq_length: int
  grad_accum_steps: int
  num_parameters: int
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  code_bytes: int
  xla_flops: float          # per device per step, XLA's cost analysis (loop bodies once)
  matmul_flops: float       # per device per step, the HLO's dots with loops' trip counts
  analytic_flops: float     # whole step, all devices
  hbm_traffic: float        # bytes per device per step moved by the program's instructions
  collectives: dict[str, dict[str, float]]
  steps: int
  compile_seconds: float
  traffic: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
  parts: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)  # by step part
  custom_calls: dict[str, int] = dataclasses.field(default_factory=dict)  # per target, per step
  hlo_text: str = dataclasses.field(default="", repr=False)  # the program; not in as_dict

  @property
  def custom_kernels(self) -> int:
    """Fused attention kernel calls per step: Pallas (Mosaic) on TPUs, cuDNN's on GPUs."""
    return sum(n for target, n in self.custom_calls.items()
               if hlo_costs.is_attention_target(target))

  @property
  def hbm_bytes(self) -> int:
    """Peak HBM of the step per device: live arguments, outputs that do not reuse them, the
    temporaries and the program."""
    return (self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
            + self.code_bytes)

  @property
  def hbm_capacity(self) -> int:
    """What the compiler lets one program use per device (the chip's HBM less the runtime's)."""
    return self.slice.chip.usable_hbm_per_device

  @property
  def fits(self) -> bool:
    return self.hbm_bytes <= self.hbm_capacity

  @property
  def largest_batch_per_device(self) -> int:
    """The per-device batch at which HBM would be full, assuming (as holds for a train step)
    that the temporaries grow in proportion to the batch and the state does not: an estimate
    from one compile, to be confirmed by compiling that batch. A step with no temporaries in
    HBM (a small one, whose intermediates a TPU's compiler keeps in on-chip memory) shows no
    growth to extrapolate: the batch compiled is the estimate where it fits, 0 where not."""
    fixed = self.hbm_bytes - self.temp_bytes
    micro = self.batch_per_device / self.grad_accum_steps
    per_example = self.temp_bytes / max(micro, 1)
    if per_example <= 0:
      return self.batch_per_device if self.fits else 0
    return int((self.hbm_capacity - fixed) // per_example)

  # --------------------------------------------------------------------------- the roofline
  @property
  def compute_seconds(self) -> float:
    # A fused attention kernel's matmuls are not HLO dots: with one, the analytic count is the
    # floor.
    chip = self.slice.chip
    flops = max(self.matmul_flops, self.analytic_flops / self.slice.devices)
    return flops / (chip.peak_flops / chip.devices_per_chip)

  @property
  def hbm_seconds(self) -> float:
    chip = self.slice.chip
    return self.hbm_traffic / (chip.hbm_bandwidth / chip.devices_per_chip)

  @property
  def wire_bytes(self) -> float:
    return sum(c["wire_bytes"] for c in self.collectives.values())

  @property
  def collective_seconds(self) -> float:
    # A device sends on all of its chip's links at once: half the bidirectional total.
    chip = self.slice.chip
    return self.wire_bytes / (chip.ici_bandwidth / 2 / chip.devices_per_chip)

  @property
  def step_seconds(self) -> float:
    """A lower bound: the matmuls at peak and the collectives at full ICI bandwidth, nothing
    overlapped. HBM traffic is reported beside it, not in it: its estimate from the HLO
    overstates a scanned step's (`hlo_costs.hbm_bytes`)."""
    return self.compute_seconds + self.collective_seconds

  @property
  def mfu(self) -> float:
    peak = self.slice.chips * self.slice.chip.peak_flops
    return self.analytic_flops / (peak * self.step_seconds) if self.analytic_flops else math.nan

  @property
  def days(self) -> float:
    return self.steps * self.step_seconds / 86400

  @property
  def chip_hours(self) -> float:
    return self.days * 24 * self.slice.chips

  @property
  def cost(self) -> float:
    price = self.slice.chip.price
    return self.chip_hours * price if price is not None else math.nan

  @property
  def other_bytes(self) -> float:
    """HBM bytes per step of the kernels that are neither matmuls, fused attention nor
    collectives: the elementwise and reduction work (LayerNorm, dropout, residual adds, casts,
    the loss, the optimizer update)."""
    return self.traffic.get("other", {}).get("bytes", 0.0)

  @property
  def other_seconds(self) -> float:
    chip = self.slice.chip
    return self.other_bytes / (chip.hbm_bandwidth / chip.devices_per_chip)

  def as_dict(self) -> dict[str, Any]:
    out = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("slice", "hlo_text")}
    out.update(slice=self.slice.name, topology=self.slice.topology, chips=self.slice.chips,
               devices=self.slice.devices, hbm_bytes=self.hbm_bytes,
               hbm_capacity=self.hbm_capacity, fits=self.fits,
               largest_batch_per_device=self.largest_batch_per_device,
               compute_seconds=self.compute_seconds, hbm_seconds=self.hbm_seconds,
               collective_seconds=self.collective_seconds, step_seconds=self.step_seconds,
               mfu=self.mfu, days=self.days, chip_hours=self.chip_hours, cost=self.cost,
               custom_kernels=self.custom_kernels,
               other_bytes=self.other_bytes, other_seconds=self.other_seconds)
    return out

  def lines(self) -> list[str]:
    s, chip = self.slice, self.slice.chip
    gpu = isinstance(s, gpu_targets.Machine)
    unit = "GPU" if gpu else "chip"
    per = unit if chip.devices_per_chip == 1 else "device (one core; two per chip)"
    link = "NVLink" if gpu else "ICI"
    kernels = "fused attention" if gpu else "Pallas"
    mesh = " x ".join(f"{k} {v}" for k, v in self.mesh.items())
    out = [
        f"{self.config_name} compiled for {s.describe()}",
        f"  mesh {mesh}; {self.batch_per_device} sequences of {self.seq_length} per device per "
        f"step" + (f" in {self.grad_accum_steps} micro-batches" if self.grad_accum_steps > 1
                   else "") + f"; {self.num_parameters / 1e6:.1f}M parameters; compiled in "
        f"{self.compile_seconds:.0f} s" + (f"; {self.custom_kernels} {kernels} kernel calls"
                                             if self.custom_kernels else ""),
        f"  HBM per {per}: {self.hbm_bytes / GIB:.2f} of {self.hbm_capacity / GIB:.2f} GiB usable "
        f"({self.hbm_bytes / self.hbm_capacity:.0%}): state and batch "
        f"{(self.argument_bytes) / GIB:.2f}, temporaries {self.temp_bytes / GIB:.2f}, program "
        f"{self.code_bytes / GIB:.2f} GiB; largest batch per device that fits ~"
        f"{self.largest_batch_per_device}",
        f"  FLOPs per device per step: matmuls {self.matmul_flops:.3e} (the compiled HLO, loops "
        f"counted), analytic {self.analytic_flops / s.devices:.3e}, XLA's cost analysis "
        + (f"{self.xla_flops:.3e}" if not math.isnan(self.xla_flops) else "none (the GPU "
           "compiler gives none without a device)")
        + (" (it counts a scanned loop's body once)"
           if self.xla_flops < 0.9 * self.matmul_flops else "")
        + (f"; the {kernels} kernels' matmuls are outside the HLO count" if self.custom_kernels
           else ""),
    ]
    if self.collectives:
      parts = [f"{k} x{int(v['count'])} {v['bytes'] / 2**20:.1f} MiB over up to "
               f"{int(v['max_group'])} devices" for k, v in sorted(self.collectives.items())]
      out.append("  collectives per step: " + "; ".join(parts))
    else:
      out.append("  collectives per step: none")
    out += [
        f"  roofline ({chip.peak_flops / 1e12:.0f} TFLOP/s bf16, {chip.hbm_bandwidth / 1e9:.0f} "
        f"GB/s HBM, {chip.ici_bandwidth / 1e9:.0f} GB/s {link} per {unit}): compute "
        f"{self.compute_seconds * 1e3:.1f} ms + collectives {self.collective_seconds * 1e3:.1f} "
        f"ms -> step >= {self.step_seconds * 1e3:.1f} ms, MFU <= {self.mfu:.0%}; HBM traffic "
        f"~{self.hbm_traffic / 1e9:.1f} GB per device, {self.hbm_seconds * 1e3:.1f} ms at peak "
        f"bandwidth (an estimate, high for scanned layers)",
    ]
    if self.traffic:
      kind = lambda k: (f"{int(self.traffic[k]['count'])} {k} "
                        f"{self.traffic[k]['bytes'] / 1e9:.1f} GB")
      out.append(
          "  kernels per step and the HBM they move: " + ", ".join(
              kind(k) for k in ("matmul", "attention", "collective", "other")
              if self.traffic.get(k, {}).get("count")) + f"; the other (elementwise and "
          f"reduction) kernels take >= {self.other_seconds * 1e3:.1f} ms at peak bandwidth")
    train = (f"  to train: {self.steps:,} steps >= {self.days:.1f} days on {s.chips} {unit}"
             f"{'s' if s.chips > 1 else ''}, "
             f"{self.chip_hours:,.0f} {unit}-hours")
    if chip.price is not None:
      train += f", ${self.cost:,.0f} at ${chip.price:.2f} per chip-hour (on demand)"
    out.append(train)
    return out


def fixes(config: ml_collections.ConfigDict, batch_per_device: int,
          fitting_batch: int | None = None) -> str:
  """What to change when a step does not fit: accumulation first (the same step, smaller
  micro-batches), then recomputation, then FSDP."""
  accum = int(config.grad_accum_steps)
  micro = max(batch_per_device // accum, 1)
  options = []
  if micro > 1:
    target = fitting_batch if fitting_batch and 0 < fitting_batch < micro else micro // 2
    steps = next(a for a in range(accum + 1, batch_per_device + 1)
                 if batch_per_device % a == 0 and batch_per_device // a <= target) \
        if target >= 1 else batch_per_device
    options.append(f"--config.grad_accum_steps={steps} (micro-batches of "
                   f"{batch_per_device // steps} sequences per device: the same step)")
  if config.model.get("remat_policy", "none") == "none":
    options.append("--config.model.remat_policy=dots (recompute activations in the backward "
                   "pass)")
  if int(config.mesh_shape[1]) == 1:
    options.append("--config.mesh_shape=1,-1,1 (FSDP: parameters and optimizer state sharded "
                   "over the devices)")
  options.append("a slice with more HBM per device")
  return "; or ".join(options)


def check(config: ml_collections.ConfigDict, accelerator: str, config_name: str = "config",
          steps: int | None = None) -> Report:
  """Compiles the config's train step for the named TPU slice or GPU machine and reads the
  executable.

  The config's mesh must cover the slice (`mesh_shape` with a -1, or one whose product is the
  slice's device count). Raises `DoesNotFit` when the step needs more HBM than a device has.
  """
  gpu = gpu_targets.is_gpu(accelerator)
  slice_ = gpu_targets.parse(accelerator) if gpu else tpu_slices.parse(accelerator)
  config = pretraining.with_records_settings(config)
  shape = [int(d) for d in config.mesh_shape]
  if -1 not in shape and math.prod(shape) != slice_.devices:
    raise ValueError(
        f"config.mesh_shape={tuple(shape)} lays the step over {math.prod(shape)} devices and "
        f"{slice_.name} has {slice_.devices}: add --config.mesh_shape=-1,1,1 (data parallel "
        f"over all of them) or choose a slice of {math.prod(shape)} devices")
  devices = (gpu_targets if gpu else tpu_slices).topology_devices(slice_)
  start = time.perf_counter()
  try:
    out = pretraining.compile_train_step(config, devices=devices)
  except Exception as e:  # pylint: disable=broad-except
    if not _out_of_memory(e):
      raise
    used = _used_bytes(str(e))
    batch, capacity = _batch_per_device(config, slice_), slice_.chip.usable_hbm_per_device
    need = f"needs {used / GIB:.2f} GiB" if used else "does not fit"
    raise DoesNotFit(
        f"{config_name} {need} per device on {slice_.name}, which has "
        f"{capacity / GIB:.2f} GiB per device. Try "
        f"{fixes(config, batch, _fitting_batch(config, batch, used, capacity))}. (XLA: "
        f"{_first_line(e)})") from None
  seconds = time.perf_counter() - start
  mesh = out["mesh"]
  memory = out["memory"]
  text = out["compiled"].as_text()
  module = hlo_costs.parse(text)
  report = Report(
      config_name=config_name, slice=slice_, mesh=mesh,
      batch_per_device=int(config.global_batch_size) // _data_parallel(mesh),
      seq_length=int(config.data.max_seq_length),
      grad_accum_steps=int(config.grad_accum_steps),
      num_parameters=out["num_parameters"],
      argument_bytes=int(memory.argument_size_in_bytes),
      output_bytes=int(memory.output_size_in_bytes),
      alias_bytes=int(memory.alias_size_in_bytes),
      temp_bytes=int(memory.temp_size_in_bytes),
      code_bytes=int(memory.generated_code_size_in_bytes),
      xla_flops=out["compiled_flops_per_device"],
      matmul_flops=hlo_costs.matmul_flops(module),
      analytic_flops=float(out["analytic_flops_per_step"] or 0.0),
      hbm_traffic=hlo_costs.hbm_bytes(module),
      collectives=hlo_costs.summarize(hlo_costs.collectives(module, slice_.devices)),
      steps=int(config.train_until_step if steps is None else steps),
      compile_seconds=seconds,
      traffic=hlo_costs.traffic_by_kind(module), parts=hlo_costs.traffic_by_part(module),
      custom_calls=hlo_costs.custom_calls(module), hlo_text=text)
  if not report.fits:
    raise DoesNotFit(
        f"{config_name} needs {report.hbm_bytes / GIB:.2f} GiB per device on {slice_.name} "
        f"(state and batch {report.argument_bytes / GIB:.2f}, temporaries "
        f"{report.temp_bytes / GIB:.2f}, program {report.code_bytes / GIB:.2f}), more than "
        f"the {report.hbm_capacity / GIB:.2f} GiB a program may use. About "
        f"{max(report.largest_batch_per_device, 0)} sequences per device fit. Try "
        f"{fixes(config, report.batch_per_device, report.largest_batch_per_device)}.")
  return report


def _out_of_memory(error: Exception) -> bool:
  text = str(error)
  return "RESOURCE_EXHAUSTED" in text or "Ran out of memory" in text


def _used_bytes(text: str) -> float | None:
  match = (re.search(r"Used ([0-9.]+)([KMGT])", text)
           or re.search(r"required for [^(]*\(([0-9.]+)([KMGT])\)", text))
  if not match:
    return None
  return float(match.group(1)) * {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[match.group(2)]


def _first_line(error: Exception) -> str:
  text = str(error).strip()
  return text.splitlines()[0][:300] if text else type(error).__name__


def _data_parallel(mesh: dict[str, int]) -> int:
  return mesh.get("data", 1) * mesh.get("fsdp", 1)


def _batch_per_device(config: ml_collections.ConfigDict, slice_: tpu_slices.Slice) -> int:
  shape = [int(d) for d in config.mesh_shape]
  known = math.prod(d for d in shape if d != -1)
  full = [slice_.devices // known if d == -1 else d for d in shape]
  return int(config.global_batch_size) // max(full[0] * full[1], 1)


def _fitting_batch(config: ml_collections.ConfigDict, batch: int, used: float | None,
                   capacity: int) -> int | None:
  """A micro-batch that should fit when XLA only said how much the whole one needs (memory
  taken as proportional to the micro-batch, which overestimates what the state needs)."""
  if not used:
    return None
  micro = batch // int(config.grad_accum_steps)
  return max(int(micro * capacity / used), 1)


def check_slices(config, accelerators, config_name: str, steps: int) -> None:
  """`pretrain --compile_for=A,B`: the check of each slice, logged; any slice that does not fit
  fails the run after all were checked."""
  refused = []
  if any(gpu_targets.is_gpu(a) for a in accelerators):
    gpu_targets.find_plugin()  # before anything starts JAX's backends
  for accelerator in accelerators:
    metrics.log(f"compiling {config_name} for {accelerator} (a minute or a few for a full-size "
                f"model)...")
    try:
      report = check(config, accelerator, config_name=config_name, steps=steps)
    except DoesNotFit as e:
      refused.append(f"{accelerator}: {e}")
      metrics.log(f"DOES NOT FIT {accelerator}: {e}")
      continue
    for line in report.lines():
      metrics.log(line)
  if refused:
    raise ValueError("the step does not fit " + "; ".join(refused))
