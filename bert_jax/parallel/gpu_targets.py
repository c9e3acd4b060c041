"""NVIDIA GPUs by the names users type (`h100`, `h200`, `a100`, `h100x8`), and compile-only
devices for them on any machine.

With JAX's CUDA plugin at hand (`compiler_dir()`; its compiler needs no GPU and no driver, and
of NVIDIA's libraries only `ptxas`, from `nvidia-cuda-nvcc-cu12` in the `aot` extra, and cuDNN,
whose version JAX reads before it lowers attention to cuDNN's kernel),
`topology_devices("h100x8")` gives eight devices of an eight-GPU H100 machine: a step jitted over
a mesh of them compiles to the GPU executable itself (its kernels, memory, NCCL collectives)
without a GPU. XLA's GPU compiler takes the device's description from a `GpuTargetConfigProto`
instead of a live device; `target_config` writes it from the figures below, which are NVIDIA's
data-sheet numbers as XLA's own device specs (`xla/backends/gpu/target_config/specs`) record
them. What a compile without the device cannot do is autotune: GEMMs take the compiler's default
(Triton) kernels rather than the fastest of cuBLAS and Triton that a GPU would time, so kernel
counts and bytes moved are the real program's, GEMM choice aside.

`usable_hbm_per_device` is what a JAX program may use of a GPU: JAX preallocates
XLA_PYTHON_CLIENT_MEM_FRACTION (default 0.75) of its memory for its allocator.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys

GIB = 2**30
_SPECS = ("NVIDIA data sheets (H100 SXM5, H200 SXM, A100 SXM4 80GB) as recorded in XLA's "
          "xla/backends/gpu/target_config/specs; peak dense bf16 without sparsity")


@dataclasses.dataclass(frozen=True)
class Gpu:
  """One GPU model: what a roofline needs and what its compiler is told about it.

  Field names follow `tpu_slices.Chip` where `runs.compile_check` reads them: `peak_flops` is
  dense bfloat16 FLOP/s, `hbm_bandwidth` bytes/s, `ici_bandwidth` the GPU's NVLink bandwidth
  in bytes/s, both directions summed as NVIDIA states it. No on-demand price is kept: GPU
  prices vary by provider and machine shape more than TPU list prices do."""
  generation: str          # the name users type: h100, h200, a100
  device_kind: str         # jax's Device.device_kind
  peak_flops: float
  hbm_bytes: int
  hbm_bandwidth: float
  ici_bandwidth: float
  sms: int
  clock_ghz: float
  l2_bytes: int
  shared_memory_per_sm: int
  shared_memory_per_block_optin: int
  compute_capability: tuple[int, int]
  fp32_units_per_sm: int
  source: str = _SPECS
  devices_per_chip: int = 1
  price: float | None = None

  @property
  def usable_hbm_per_device(self) -> int:
    fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75"))
    return int(self.hbm_bytes * fraction)

  def target_config(self, cuda_runtime: tuple[int, int] | None = None) -> str:
    """The `GpuTargetConfigProto` (text format) XLA's GPU compiler reads instead of a device.
    cuDNN is described as 9.10, which has every fused-attention feature the model uses
    (dropout inside the kernel, masks, its backward).

    `cuda_runtime` (major, minor) is the CUDA runtime a GPU machine would report. XLA reads
    some decisions from it: without one it takes the runtime for older than CUDA 12, and
    rewrites no matmul into cuBLASLt's FP8 GEMM (it computes FP8 operands in bfloat16
    instead), so a compile of the FP8 step would not be the program a GPU runs.
    `topology_devices` passes the CUDA plugin's."""
    major, minor = self.compute_capability
    runtime = ([f"runtime_version {{ major: {cuda_runtime[0]} minor: {cuda_runtime[1]} "
                "patch: 0 }"] if cuda_runtime else [])
    return "\n".join([
        "gpu_device_info {",
        "  threads_per_block_limit: 1024", "  threads_per_warp: 32",
        "  shared_memory_per_block: 49152",
        f"  shared_memory_per_core: {self.shared_memory_per_sm}",
        "  threads_per_core_limit: 2048", f"  core_count: {self.sms}",
        f"  fpus_per_core: {self.fp32_units_per_sm}",
        "  block_dim_limit_x: 2147483647", "  block_dim_limit_y: 65535",
        "  block_dim_limit_z: 65535",
        f"  memory_bandwidth: {int(self.hbm_bandwidth)}", f"  l2_cache_size: {self.l2_bytes}",
        f"  clock_rate_ghz: {self.clock_ghz}", f"  device_memory_size: {self.hbm_bytes}",
        f"  shared_memory_per_block_optin: {self.shared_memory_per_block_optin}",
        f"  cuda_compute_capability {{ major: {major} minor: {minor} }}",
        "  registers_per_core_limit: 65536", "  registers_per_block_limit: 65536",
        "}",
        'platform_name: "CUDA"',
        "dnn_version_info { major: 9 minor: 10 patch: 0 }",
        *runtime,
        f'device_description_str: "{self.device_kind}"',
    ]) + "\n"


GPUS: dict[str, Gpu] = {g.generation: g for g in (
    Gpu("h100", "NVIDIA H100 80GB HBM3", 989.4e12, 84942979072, 3.35e12, 900e9, 132, 1.98,
        50 * 2**20, 233472, 232448, (9, 0), 128),
    Gpu("h200", "NVIDIA H200", 989.4e12, 150754820096, 4.8e12, 900e9, 132, 1.98,
        60 * 2**20, 233472, 232448, (9, 0), 128),
    Gpu("a100", "NVIDIA A100-SXM4-80GB", 312e12, 85198045184, 2.039e12, 600e9, 108, 1.41,
        40 * 2**20, 167936, 166912, (8, 0), 64),
)}


def compute_capability(device) -> tuple[int, int] | None:
  """A CUDA GPU's compute capability, (major, minor): the device's own (`Device.
  compute_capability`, "9.0" on a CUDA device), else that of the GPU model its `device_kind`
  names in `GPUS` (the compile-only devices of `topology_devices`); None for any other device
  (CPUs, TPUs, ROCm GPUs, a GPU that says neither)."""
  found = getattr(device, "compute_capability", None)
  if isinstance(found, str):
    major, _, minor = found.partition(".")
    if major.isdigit() and (minor or "0").isdigit():
      return int(major), int(minor or 0)
  kind = getattr(device, "device_kind", None)
  for gpu in GPUS.values():
    if gpu.device_kind == kind:
      return gpu.compute_capability
  return None


@dataclasses.dataclass(frozen=True)
class Machine:
  """GPUs of one model in one machine (NVLink between all of them), as `runs.compile_check`
  reads a TPU slice: `chip`, `chips`, `devices`, `hosts`, `topology`."""
  name: str
  chip: Gpu
  chips: int
  hosts: int = 1

  @property
  def devices(self) -> int:
    return self.chips

  @property
  def topology(self) -> str:
    # XLA's GPU topology: partitions x hosts per partition x devices per host.
    return f"1x{self.hosts}x{self.chips // self.hosts}"

  def describe(self) -> str:
    return (f"{self.name}: {self.chips} {self.chip.device_kind} GPU{'s' if self.chips > 1 else ''}"
            f" on {self.hosts} host{'s' if self.hosts > 1 else ''} (compiled without one)")


_NAME = re.compile(r"(h100|h200|a100)(?:x(\d+))?")


def is_gpu(name: str) -> bool:
  return bool(_NAME.fullmatch(name.strip().lower()))


def parse(name: str) -> Machine:
  """`h100` (one GPU), `h100x8` (eight in one machine), likewise `h200`, `a100`."""
  text = name.strip().lower()
  match = _NAME.fullmatch(text)
  if not match:
    raise ValueError(f"{name!r} is not a GPU machine such as {', '.join(GPUS)} or h100x8")
  count = int(match.group(2) or 1)
  if count not in (1, 2, 4, 8):
    raise ValueError(f"{name}: a machine holds 1, 2, 4 or 8 GPUs (NVLink between all of them)")
  return Machine(text, GPUS[match.group(1)], count)


COMPILER_DIR_ENV = "BERT_JAX_GPU_COMPILER"


def compiler_dir() -> str:
  """Where JAX's CUDA plugin is kept apart from site-packages (`make env` installs it in
  `.venv/gpu-compiler`, from requirements/gpu_compiler.txt): JAX loads a plugin it finds in
  site-packages at every start and, on a machine without a GPU, logs that it found none; from
  here it is loaded only by a compile for a GPU. $BERT_JAX_GPU_COMPILER names another folder."""
  return os.environ.get(COMPILER_DIR_ENV) or os.path.join(sys.prefix, "gpu-compiler")


def _topology(machine: Machine):
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  config = machine.chip.target_config(cuda_runtime())
  return topologies.get_topology_desc(platform="cuda", topology=machine.topology,
                                      target_config=config)


def _plugin_module(name: str):
  """The CUDA plugin's module `name` (`_versions`, `_prng`), of whichever plugin JAX has: the
  CUDA 13 one or the CUDA 12 one."""
  import importlib  # pylint: disable=g-import-not-at-top
  for plugin in ("jax_cuda13_plugin", "jax_cuda12_plugin"):
    try:
      return importlib.import_module(f"{plugin}.{name}")
    except ModuleNotFoundError:
      continue
  raise ModuleNotFoundError(f"no JAX CUDA plugin with {name} (jax_cuda13_plugin, "
                            f"jax_cuda12_plugin) on the path")


def cuda_runtime() -> tuple[int, int] | None:
  """(major, minor) of the CUDA runtime the plugin was built with (12090: 12.9), which its
  wheels bring to a GPU machine: what the runtime there reports. None without the plugin on
  the path (`find_plugin`), where no compile for a GPU can run either (and says why)."""
  try:
    version = _plugin_module("_versions").cuda_runtime_build_version()
  except ModuleNotFoundError:
    return None
  return version // 1000, version % 1000 // 10


def _quietly(fn):
  """fn() with the C++ libraries' start-up lines (a CUDA plugin with no driver says so, three
  times) kept off the console; an error carries them as a note."""
  import tempfile  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryFile() as log:
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    try:
      return fn()
    except Exception as e:  # pylint: disable=broad-except
      log.seek(0)
      e.add_note(log.read().decode(errors="replace")[-2000:])
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def _plugin_found() -> bool:
  """Whether JAX's CUDA plugin is importable (`jax_plugins`, its namespace, may not exist)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  try:
    return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
  except ModuleNotFoundError:
    return False


def find_plugin() -> str:
  """Puts `compiler_dir()` on the path where JAX's CUDA plugin is not installed otherwise, and
  starts JAX's backends (which is when JAX registers the plugins it finds) with the plugin's
  start-up lines kept off the console. To be called before anything else starts JAX in a
  process that compiles for GPUs; returns the folder."""
  import jax  # pylint: disable=g-import-not-at-top
  folder = compiler_dir()
  if (not _plugin_found() and os.path.isdir(os.path.join(folder, "jax_plugins"))
      and folder not in sys.path):
    sys.path.append(folder)
  # The plugin checks the CUDA driver it would run on; off a GPU machine there is none.
  if not os.path.exists("/proc/driver/nvidia"):
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  _quietly(jax.devices)
  return folder


def topology_devices(machine: Machine | str) -> list:
  """Compile-only devices of the machine's GPUs.

  Needs JAX's CUDA plugin: in `compiler_dir()`, or installed with jax on a GPU machine. JAX
  looks for plugins once, when it first starts a backend, so the folder is put on the path
  before that; a process whose JAX already started without it (one that ran something on the
  CPU first) is told to compile in a fresh process, as `pretrain --compile_for` does.
  """
  machine = parse(machine) if isinstance(machine, str) else machine
  import jax  # pylint: disable=g-import-not-at-top
  # As for TPUs: a compile-only client cannot load executables back from the cache.
  jax.config.update("jax_enable_compilation_cache", False)
  folder = find_plugin()
  try:
    topology = _quietly(lambda: _topology(machine))
  except NotImplementedError as e:
    if not _plugin_found():
      raise RuntimeError(
          f"compiling for {machine.name} needs JAX's CUDA plugin, which is not in {folder}: "
          f"`make env` in the checkout puts it there, or: pip install --no-deps --target "
          f"{folder} -r requirements/gpu_compiler.txt (jax-cuda12-plugin=={jax.__version__})"
          ) from e
    raise RuntimeError(
        f"compiling for {machine.name}: this process started JAX before its CUDA plugin was "
        f"on the path, and JAX looks for plugins once; compile in a fresh process (as "
        f"`python -m bert_jax.pretrain --compile_for={machine.name}` does)") from e
  _hand_over_library_versions()
  _register_prng_kernels()
  devices = list(topology.devices)
  if len(devices) != machine.devices:
    raise RuntimeError(f"{machine.topology} gave {len(devices)} devices, expected "
                       f"{machine.devices} for {machine.name}")
  return devices


def _hand_over_library_versions() -> None:
  """JAX looks for the CUDA plugin's library-version module once, when it is imported, and asks
  it for cuDNN's version before it lowers attention to cuDNN's kernel. Found only later (from
  `compiler_dir()`), the module is handed to the two places that read it; a test compiles
  cuDNN attention this way, so a JAX that moves them fails there."""
  from jax._src import lib as jax_lib  # pylint: disable=g-import-not-at-top
  from jax._src.cudnn import fused_attention_stablehlo  # pylint: disable=g-import-not-at-top
  if jax_lib.cuda_versions is not None and fused_attention_stablehlo.cuda_versions is not None:
    return
  versions = _plugin_module("_versions")
  for module in (jax_lib, fused_attention_stablehlo):
    if getattr(module, "cuda_versions", None) is None:
      module.cuda_versions = versions


def _register_prng_kernels() -> None:
  """JAX registers the CUDA plugin's random-number kernels (threefry as one CUDA kernel, which
  the initial state's program calls: `training.state.lower_initial_state`) when it is
  imported. Found only later (from `compiler_dir()`), they are registered here as JAX would
  have, so that a compile for a GPU finds them; once per process."""
  import jax  # pylint: disable=g-import-not-at-top
  from jaxlib import gpu_prng  # pylint: disable=g-import-not-at-top
  if getattr(gpu_prng, "_cuda_prng", None) is not None:
    return
  module = _plugin_module("_prng")
  for name, value in module.registrations().items():
    jax.ffi.register_ffi_target(name, value, platform="CUDA",
                                api_version=int(name.endswith("_ffi")))
  gpu_prng._cuda_prng = module  # pylint: disable=protected-access
