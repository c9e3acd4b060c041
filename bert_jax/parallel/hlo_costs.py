"""What a compiled step does per step, read from its optimized HLO text: matmul FLOPs, HBM
traffic, and each collective (which, how often, how many bytes, over how many devices).

Why not `Compiled.cost_analysis()` alone: on TPUs it counts the body of a loop once, so a step
with scanned layers (the TPU default) reports about one layer's FLOPs and bytes, and it says
nothing about communication. Here every instruction is weighted by how many times a step runs
its computation: while loops' trip counts (XLA's `known_trip_count`, or the bound of the
`i < N` compare in the loop condition) multiplied down the call graph. FLOPs are those of the
dot and convolution instructions (inside fusions too); HBM bytes are the operands and results
of the instructions the program runs (fusions, not what they fuse), which is how XLA's own
analysis counts them; collectives are the gradient all-reduce of data parallelism, FSDP's
all-gathers and reduce-scatters, and whatever else a sharding adds.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterable

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1,
                "f8e5m2fnuz": 1, "f8e4m3fnuz": 1, "s4": 0.5, "u4": 0.5,
                "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
                "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8,
                "c128": 16}
# dtype[dims]{layout}: the layout (optional) carries the memory space, `S(n)`.
_ARRAY = re.compile(r"\b(" + "|".join(sorted(_DTYPE_BYTES, key=len, reverse=True))
                    + r")\[([0-9,]*)\](\{[^}]*\})?")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s+([a-z][a-z0-9\-]*)\((.*)$")
_CALLEES = re.compile(r"\b(?:to_apply|calls|body|condition|true_computation|"
                      r"false_computation)=%?([\w.\-]+)|"
                      r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')


@dataclasses.dataclass
class Collective:
  """One collective instruction: `bytes` is the size of its result (per device), `group` the
  number of devices it spans, `count` how many times a step runs it."""
  kind: str
  bytes: float
  group: int
  count: int
  name: str

  @property
  def wire_bytes(self) -> float:
    """Bytes each device sends per execution with ring algorithms (the bandwidth term)."""
    n = max(self.group, 1)
    if n == 1:
      return 0.0
    if self.kind == "all-reduce":
      return 2 * (n - 1) / n * self.bytes
    if self.kind == "all-gather":
      return (n - 1) / n * self.bytes
    if self.kind == "reduce-scatter":
      return (n - 1) * self.bytes
    if self.kind == "all-to-all":
      return (n - 1) / n * self.bytes
    return self.bytes  # collective-permute: each device sends its operand once


def _array_bytes(shape_text: str) -> float:
  total = 0.0
  for dtype, dims, _ in _ARRAY.findall(shape_text):
    total += _elements(dims) * _DTYPE_BYTES[dtype]
  return total


def _hbm_array_bytes(shape_text: str) -> float:
  """Bytes of the arrays that live in HBM: memory space 0. XLA's memory-space assignment marks
  arrays it placed elsewhere (on-chip memories, host) with `S(n)` in their layout."""
  total = 0.0
  for dtype, dims, layout in _ARRAY.findall(shape_text):
    if not (layout and re.search(r"S\([1-9]\d*\)", layout)):
      total += _elements(dims) * _DTYPE_BYTES[dtype]
  return total


def _elements(dims: str) -> int:
  size = 1
  for d in dims.split(","):
    if d:
      size *= int(d)
  return size


def _dims(shape_text: str) -> list[int]:
  match = _ARRAY.search(shape_text)
  return [int(d) for d in match.group(2).split(",") if d] if match else []


def _element_type(shape_text: str) -> str:
  """The element type of the first array in a shape ("bf16"), "?" where there is none."""
  match = _ARRAY.search(shape_text)
  return match.group(1) if match else "?"


@dataclasses.dataclass
class Instruction:
  name: str
  shape: str   # the result's shape text
  op: str
  rest: str    # operands and attributes


@dataclasses.dataclass
class Module:
  """An HLO module's computations, and how many times a step runs each of them."""
  computations: dict[str, list[Instruction]]
  entry: str
  multipliers: dict[str, int]
  fused: set[str]       # computations that run inside an instruction (fusions, reducers)
  _index: dict[str, tuple[dict[str, Instruction], dict[str, list[tuple[Instruction, int]]]]] = \
      dataclasses.field(default_factory=dict, repr=False, compare=False)

  def shapes(self, computation: str) -> dict[str, str]:
    return {i.name: i.shape for i in self.computations[computation]}

  def index(self, computation: str
            ) -> tuple[dict[str, Instruction], dict[str, list[tuple[Instruction, int]]]]:
    """`computation`'s instructions by name, and each one's users with the operand position
    it takes there (built once per computation)."""
    if computation not in self._index:
      instrs = self.computations[computation]
      users: dict[str, list[tuple[Instruction, int]]] = {}
      for i in instrs:
        for pos, o in enumerate(_operands(i)):
          users.setdefault(o, []).append((i, pos))
      self._index[computation] = {i.name: i for i in instrs}, users
    return self._index[computation]

  def instructions(self):
    """Every instruction of the computations a step runs."""
    for name, instrs in self.computations.items():
      if self.multipliers.get(name):
        yield from instrs


def parse(hlo_text: str) -> Module:
  comps: dict[str, list[Instruction]] = {}
  entry, current = "", None
  for line in hlo_text.splitlines():
    if current is None:
      header = _HEADER.match(line)
      if header and not line.startswith((" ", "\t")):
        current = header.group(1)
        comps[current] = []
        if line.startswith("ENTRY"):
          entry = current
      continue
    if line.strip() == "}":
      current = None
      continue
    instr = _INSTR.match(line)
    if instr:
      name = line.split("=", 1)[0].replace("ROOT", "").strip().lstrip("%")
      comps[current].append(Instruction(name, instr.group(1), instr.group(2), instr.group(3)))
  fused = set()
  for instrs in comps.values():
    for i in instrs:
      if i.op == "fusion" or i.op.endswith("-start") or i.op in KINDS or i.op in (
          "reduce", "reduce-window", "scatter", "select-and-scatter", "sort", "map"):
        fused.update(c for c in _callees(i.rest) if c in comps)
  return Module(comps, entry, _multipliers(comps, entry), fused)


def _callees(rest: str) -> list[str]:
  out = []
  for single, many in _CALLEES.findall(rest):
    out += [single] if single else [c.strip().lstrip("%") for c in many.split(",")]
  return out


def _trip_count(instr: Instruction, comps: dict[str, list[Instruction]]) -> int:
  """A while loop's iterations: XLA's annotation, else N of the condition's `i < N`."""
  known = _TRIP.search(instr.rest)
  if known:
    return int(known.group(1))
  condition = re.search(r"\bcondition=%?([\w.\-]+)", instr.rest)
  lines = comps.get(condition.group(1), []) if condition else []
  constants = {i.name: re.match(r"(-?\d+)\)", i.rest) for i in lines if i.op == "constant"}
  for i in lines:
    if i.op == "compare" and "direction=LT" in i.rest:
      for operand in re.findall(r"%([\w.\-]+)", i.rest.split(")")[0]):
        if constants.get(operand):
          return int(constants[operand].group(1))
  return 1


def _multipliers(comps: dict[str, list[Instruction]], entry: str) -> dict[str, int]:
  """How many times a step runs each computation (trip counts multiplied down the call graph;
  a computation called from several places takes the largest)."""
  mult: dict[str, int] = {}
  stack = [(entry, 1)] if entry else []
  while stack:
    name, m = stack.pop()
    if mult.get(name, 0) >= m or name not in comps:
      continue
    mult[name] = m
    for instr in comps[name]:
      body = re.search(r"\bbody=%?([\w.\-]+)", instr.rest) if instr.op == "while" else None
      trips = _trip_count(instr, comps) if body else 1
      for callee in _callees(instr.rest):
        stack.append((callee, m * (trips if body and callee == body.group(1) else 1)))
  return mult


def _matmuls(module: Module, library_calls: bool = False):
  """(instruction, times a step runs it, its computation's shapes) for every dot and
  convolution a step runs, in or out of fusions, and with `library_calls` the library GEMM
  calls too."""
  for comp, instrs in module.computations.items():
    times = module.multipliers.get(comp, 0)
    if not times:
      continue
    shapes = None
    for i in instrs:
      if i.op in ("dot", "convolution") or (
          library_calls and i.op == "custom-call" and _GEMM_TARGET.search(i.rest)):
        shapes = shapes or module.shapes(comp)
        yield i, times, shapes


def matmul_flops(module: Module) -> float:
  """2 x multiply-adds of every dot and convolution a step runs."""
  total = 0.0
  for i, times, shapes in _matmuls(module):
    out = _elements(",".join(map(str, _dims(i.shape))))
    operands = _operands(i)
    if i.op == "dot":
      contracting = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", i.rest)
      lhs = _dims(shapes.get(operands[0], "")) if operands else []
      inner = 1
      for d in (contracting.group(1).split(",") if contracting else []):
        if d and int(d) < len(lhs):
          inner *= lhs[int(d)]
    else:
      # Each output element takes (kernel elements / output features) x (taps that meet
      # data / window) multiply-adds. TPU layouts write matmuls as convolutions whose windows
      # run over a batch dim of a dilated or padded input: there one tap per window meets
      # data (taps = min(window, input extent, window / dilation) per spatial dim).
      labels = re.search(r"dim_labels=(\w+)_(\w+)->", i.rest)
      lhs = _dims(shapes.get(operands[0], "")) if operands else []
      rhs = _dims(shapes.get(operands[1], "")) if len(operands) > 1 else []
      if not labels or len(rhs) != len(labels.group(2)) or "o" not in labels.group(2) \
          or len(lhs) != len(labels.group(1)):
        continue
      lhs_labels, rhs_labels = labels.groups()
      inner = _elements(",".join(map(str, rhs))) / rhs[rhs_labels.index("o")]
      window = re.search(r"window=\{size=([0-9x]+)", i.rest)
      dilate = re.search(r"lhs_dilate=([0-9x]+)", i.rest)
      sizes = [int(w) for w in window.group(1).split("x")] if window else []
      dilations = [int(d) for d in dilate.group(1).split("x")] if dilate else [1] * len(sizes)
      for d, (size, dilation) in enumerate(zip(sizes, dilations)):
        extent = lhs[lhs_labels.index(str(d))] if str(d) in lhs_labels else size
        inner *= min(size, extent, -(-size // dilation)) / size
    total += 2.0 * out * inner * times
  return total


_NO_TRAFFIC = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call",
               "conditional", "after-all", "partition-id", "replica-id", "opt-barrier",
               "iota"}


def hbm_bytes(module: Module) -> float:
  """HBM bytes read and written by the instructions the program runs (not inside fusions).
  An estimate: for a step with scanned layers it still counts loop-carried buffers a compiled
  TPU program keeps on chip or aliases (BERT-base: 14.7 GB scanned against 6.1 GB unrolled).

  Only arrays in HBM count (memory space 0): what XLA placed on chip moves at on-chip speed. A
  slice reads its result's worth of its operand; an async start moves its operand into its
  result. A fusion that only slices one layer out of a stacked parameter (a scanned loop's
  dynamic-slice) reads that slice, and one that writes a layer into a stacked buffer in place
  (dynamic-update-slice) writes that layer: both count what they touch, not the whole stack.
  """
  return sum(moved for _, _, moved in instruction_traffic(module))


def instruction_traffic(module: Module):
  """(computation, instruction, HBM bytes per step) for each instruction the program runs
  outside fusions: the terms `hbm_bytes` adds up."""
  touched = {}
  for comp, instrs in module.computations.items():
    times = module.multipliers.get(comp, 0)
    if not times or comp in module.fused:
      continue
    shapes = module.shapes(comp)
    for i in instrs:
      if i.op in _NO_TRAFFIC or i.op.endswith("-done"):
        continue
      operands = _operands(i)
      base = i.op[:-len("-start")] if i.op.endswith("-start") else i.op
      parts = _top_level(i.shape)
      result = parts[1] if i.op.endswith("-start") and len(parts) > 1 else i.shape
      if base in ("slice", "dynamic-slice"):
        source = shapes.get(operands[0], "") if operands else ""
        read = _array_bytes(result) if _hbm_array_bytes(source) else 0.0
        yield comp, i, (read + _hbm_array_bytes(result)) * times
        continue
      sizes = [_hbm_array_bytes(shapes.get(o, "")) for o in operands]
      fused = _callees(i.rest)[:1] if i.op == "fusion" else []
      written = _hbm_array_bytes(_without_gemm_workspace(module, i, result))
      if fused and fused[0] in module.computations:
        if fused[0] not in touched:
          touched[fused[0]] = _sliced_parameters(module, fused[0])
        reads, updates = touched[fused[0]]
        sizes = [min(reads.get(k, size), size) for k, size in enumerate(sizes)]
        outputs = _top_level(result)
        if len(updates) == len(outputs):  # outputs updated in place write only the update
          written = sum(_hbm_array_bytes(out) if update is None else
                        min(update, _hbm_array_bytes(out))
                        for out, update in zip(outputs, updates))
      yield comp, i, (written + sum(sizes)) * times


def _without_gemm_workspace(module: Module, instr: Instruction, result: str) -> str:
  """A result's shape without the scratch a library GEMM returns beside its output (the
  trailing `s8[n]` of its tuple, which cuBLAS uses as it needs, not an array it writes): a GEMM
  call, or a fusion of one with the slices of its operands, whose scratch XLA sizes 8x."""
  parts = _top_level(result)
  if len(parts) > 1 and parts[-1].startswith("s8[") and _calls_library_gemm(module, instr):
    return ", ".join(parts[:-1])
  return result


def _calls_library_gemm(module: Module, instr: Instruction) -> bool:
  """A library GEMM call (cuBLAS), or a fusion with one inside (XLA's `dynamic_slice_fusion`: a
  GEMM reading its operands' slices in place)."""
  if instr.op == "fusion":
    return _computation_does(module, (_callees(instr.rest) or [""])[0], ())
  return instr.op == "custom-call" and _GEMM_TARGET.search(instr.rest) is not None


# What a kernel is, for `traffic_by_kind`: matrix multiplications (dots, convolutions, library
# GEMM calls, Triton GEMM fusions), attention kernels (cuDNN's fused attention, Pallas/Mosaic
# kernels), collectives, and everything else: elementwise and reduction kernels (LayerNorm,
# dropout, residual adds, casts, the optimizer update), copies and transposes.
_GEMM_TARGET = re.compile(r'custom_call_target="[^"]*(?:gemm|matmul|cublas)[^"]*"', re.I)
_ATTENTION_NAME = r'__cudnn\$fmha[^"]*|tpu_custom_call'
_ATTENTION_TARGET = re.compile(f'custom_call_target="(?:{_ATTENTION_NAME})"')


def is_attention_target(target: str) -> bool:
  """Whether a custom-call target is a fused attention kernel: cuDNN's on GPUs, a Pallas
  (Mosaic) kernel on TPUs."""
  return re.fullmatch(_ATTENTION_NAME, target) is not None


_CUDNN_FUSION = re.compile(r'"kind":"__cudnn\$fusion"')


def _computation_does(module: Module, name: str, ops: tuple[str, ...], depth: int = 0) -> bool:
  """Whether computation `name`, or a fusion nested in it, runs one of `ops` or calls a library
  GEMM (`_calls_library_gemm`)."""
  for i in module.computations.get(name, []):
    if i.op in ops or (i.op == "custom-call" and _calls_library_gemm(module, i)):
      return True
    if i.op == "fusion" and depth < 8 and any(
        _computation_does(module, c, ops, depth + 1) for c in _callees(i.rest)[:1]):
      return True
  return False


def kernel_kind(module: Module, instr: Instruction) -> str:
  """"matmul", "attention", "collective" or "other" for an instruction the program runs."""
  base = instr.op[:-len("-start")] if instr.op.endswith("-start") else instr.op
  if base in KINDS:
    return "collective"
  if instr.op in ("dot", "convolution") or _GEMM_TARGET.search(instr.rest):
    return "matmul"
  if _ATTENTION_TARGET.search(instr.rest) or _CUDNN_FUSION.search(instr.rest):
    return "attention"
  if instr.op == "fusion" and _computation_does(module, (_callees(instr.rest) or [""])[0],
                                                ("dot", "convolution")):
    return "matmul"
  return "other"


def custom_calls(module: Module) -> dict[str, int]:
  """How many times a step runs each custom-call target (cuDNN attention, library GEMMs,
  Pallas kernels)."""
  out: dict[str, int] = {}
  for comp, instrs in module.computations.items():
    times = module.multipliers.get(comp, 0)
    for i in instrs:
      target = re.search(r'custom_call_target="([^"]+)"', i.rest) if times else None
      if i.op == "custom-call" and target:
        out[target.group(1)] = out.get(target.group(1), 0) + times
  return out


def pallas_kernels(hlo_text: str) -> dict[str, int]:
  """How many calls of each Pallas kernel a program's text holds, by name (`fp8_quantize`,
  `dropout_residual_layer_norm_fwd`, `flash_attention_dropout_bwd`): they share one Triton
  custom-call target, and their name is the scope their op_name gives before `pallas_call`."""
  out: dict[str, int] = {}
  for line in hlo_text.splitlines():
    if 'custom_call_target="__gpu$xla.gpu.triton"' not in line:
      continue
    for op in OP_NAME.findall(line):
      if op.endswith("/pallas_call"):
        name = op.rsplit("/", 2)[-2]
        out[name] = out.get(name, 0) + 1
  return out


def matmul_operand_types(module: Module) -> dict[str, int]:
  """How many matmuls a step runs per pair of operand element types ("bf16 x bf16"): the dots
  (in or out of fusions: a Triton GEMM's dot reads what its fusion converted) and the library
  GEMM calls, each as the types of its first two operands. A float32 pair in a bfloat16 step
  is a GEMM at half the rate or less."""
  out: dict[str, int] = {}
  for i, times, shapes in _matmuls(module, library_calls=True):
    key = " x ".join(_element_type(shapes.get(o, "")) for o in _operands(i)[:2])
    out[key] = out.get(key, 0) + times
  return out


def float32_matmuls(operand_types: dict[str, int]) -> int:
  """Of `matmul_operand_types`' count, the matmuls with a float32 operand."""
  return sum(n for pair, n in operand_types.items() if "f32" in pair.split(" x "))


def _traffic_by(module: Module, key: Callable[[Instruction], str],
                keys: Iterable[str] = ()) -> dict[str, dict[str, float]]:
  """Per `key` of the instructions the program runs (`keys` listed even where none has it):
  instructions run per step ("count") and the HBM bytes they move."""
  out = {k: {"count": 0, "bytes": 0.0} for k in keys}
  for comp, instr, moved in instruction_traffic(module):
    entry = out.setdefault(key(instr), {"count": 0, "bytes": 0.0})
    entry["count"] += module.multipliers.get(comp, 1)
    entry["bytes"] += moved
  return out


def traffic_by_kind(module: Module) -> dict[str, dict[str, float]]:
  """Per kernel kind: instructions run per step ("count") and the HBM bytes they move."""
  return _traffic_by(module, lambda instr: kernel_kind(module, instr),
                     ("matmul", "attention", "collective", "other"))


# The op_name metadata of an instruction's line: the traced function's path.
OP_NAME = re.compile(r'op_name="([^"]*)"')
# The model's parts, by the module path JAX writes into each instruction's op_name metadata
# (`jit(train_step)/transpose(jvp(BertForPreTraining))/bert/encoder/layer_3/output/LayerNorm/..`),
# first match wins: the LayerNorm sites with their residual adds, dropout's bits and masks,
# attention's core (cuDNN's kernels, or the explicit scores and softmax), the four projections
# around it, the feed-forward block (its two GEMMs and GELU), the heads with the loss, the
# embeddings.
_COMPONENTS = (
    ("layer norm", re.compile(r"LayerNorm")),
    ("dropout", re.compile(r"/dropout", re.I)),
    # The joined projection (`modeling.joined_projection`) runs in a method: its op_names read
    # ".../attention/self/self._joined/query_key_value/...".
    ("attention", re.compile(r"dot_product_attention|"
                             r"/attention/self/(?!query/|key/|value/)(?!.*/query_key_value/)")),
    ("q, k, v, output projections",
     re.compile(r"/self/(?:query|key|value)/|/query_key_value/|/attention/output/dense/|"
                r"/attention/fan_out/")),
    ("feed-forward", re.compile(r"/intermediate/|/output/dense/")),
    ("heads and loss", re.compile(r"/cls/|/pooler/|jvp\((?:jit\([\w]+\))?\)")),
    ("embeddings", re.compile(r"embed")),
)


def op_name(instr: Instruction, module: Module) -> str:
  """The op_name metadata of an instruction of `module` ("" where XLA kept none); a fusion that
  XLA made without one (a GEMM fused with its operands' slices) takes its root's."""
  match = OP_NAME.search(instr.rest)
  if match or instr.op != "fusion":
    return match.group(1) if match else ""
  called = module.computations.get((_callees(instr.rest) or [""])[0], [])
  return op_name(called[-1], module) if called else ""


def model_part(name: str) -> str:
  """Which part of a training step an instruction with this op_name serves: "optimizer" for
  what runs outside the differentiated function (the update, clipping, the schedule), else
  "forward: <component>" or "backward: <component>" (`_COMPONENTS`, "other" where none
  matches); "unnamed" without an op_name. Kernels keep the op_name of their fusion's root, so a
  kernel fusing two parts counts as one."""
  if not name:
    return "unnamed"
  if "jvp(" not in name:
    return "optimizer"
  phase = "backward" if "transpose(" in name else "forward"
  component = next((c for c, pattern in _COMPONENTS if pattern.search(name)), "other")
  return f"{phase}: {component}"


def traffic_by_part(module: Module) -> dict[str, dict[str, float]]:
  """Per part of the step (`model_part`): instructions run per step ("count") and the HBM
  bytes they move, largest first."""
  out = _traffic_by(module, lambda instr: model_part(op_name(instr, module)))
  return dict(sorted(out.items(), key=lambda kv: -kv[1]["bytes"]))


def _sliced_parameters(module: Module, computation: str
                       ) -> tuple[dict[int, float], list[float | None]]:
  """For a fused computation: {parameter index: bytes read} for parameters that are only
  sliced (`_parameter_read`) or only the in-place target of a dynamic-update-slice (0), and
  per output (the root, or each element of a tuple root) the bytes an in-place
  dynamic-update-slice writes (None: the whole output)."""
  instrs = module.computations[computation]
  by_name = module.index(computation)[0]
  reads = {}
  for i in instrs:
    if i.op == "parameter" and re.match(r"\d+", i.rest):
      read = _parameter_read(module, computation, i.name)
      if read is not None:
        reads[int(re.match(r"(\d+)", i.rest).group(1))] = read

  def update_bytes(instr: Instruction | None) -> float | None:
    if instr is None or instr.op != "dynamic-update-slice":
      return None
    operands = _operands(instr)
    return _array_bytes(by_name[operands[1]].shape) if len(operands) > 1 and \
        operands[1] in by_name else None

  root = instrs[-1] if instrs else None
  if root is not None and root.op == "tuple":
    return reads, [update_bytes(by_name.get(o)) for o in _operands(root)]
  return reads, [update_bytes(root)]


_ELEMENTWISE = frozenset((
    "abs", "add", "and", "bitcast", "compare", "convert", "divide", "exponential", "maximum",
    "minimum", "multiply", "negate", "not", "or", "rsqrt", "select", "sqrt", "subtract", "xor"))


def _elements_of(shape_text: str) -> int:
  return sum(_elements(dims) for _, dims, _ in _ARRAY.findall(shape_text))


def _parameter_read(module: Module, computation: str, name: str, depth: int = 0
                    ) -> float | None:
  """Bytes of parameter `name` (or of an instruction computed from it) that `computation`
  reads when it only slices it: directly, after elementwise work, or inside nested fusions;
  None when it may read all of it."""
  total = 0.0
  by_name, users_of = module.index(computation)
  users = users_of.get(name, [])
  if not users or depth > 8:
    return None
  shape = by_name[name].shape if name in by_name else None
  for user, pos in users:
    if user.op in ("dynamic-slice", "slice") and pos == 0:
      total += _array_bytes(user.shape)
    elif user.op in _ELEMENTWISE and shape and _elements_of(user.shape) == _elements_of(shape):
      # Elementwise work on its way to a slice (the LayerNorm's shift by the row's first
      # value): only the sliced elements are read, in this operand's type.
      read = _parameter_read(module, computation, user.name, depth + 1)
      if read is None:
        return None
      total += read * _array_bytes(shape) / max(_array_bytes(user.shape), 1)
    elif user.op == "dynamic-update-slice" and pos == 0:
      continue
    elif user.op == "fusion" and _callees(user.rest):
      inner = _callees(user.rest)[0]
      param = next((i.name for i in module.computations.get(inner, [])
                    if i.op == "parameter" and re.match(rf"{pos}\)", i.rest)), None)
      read = _parameter_read(module, inner, param, depth + 1) if param else None
      if read is None:
        return None
      total += read
    else:
      return None
  return total


def _operands(instr: Instruction) -> list[str]:
  return re.findall(r"%([\w.\-]+)", instr.rest.split("), ")[0])


def _group_size(line: str, num_devices: int) -> int:
  """Devices per replica group, from any of XLA's spellings of `replica_groups`."""
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
  if mesh:  # mesh['axis_0'=4,'axis_1'=2] {'axis_0'}: the named axes form a group
    sizes = dict(re.findall(r"'([^']+)'=(\d+)", mesh.group(1)))
    size = 1
    for name in re.findall(r"'([^']+)'", mesh.group(2)):
      size *= int(sizes.get(name, 1))
    return size
  iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
  if iota:  # [groups,size]<=[...]
    return int(iota.group(2))
  explicit = re.search(r"replica_groups=\{\{([^}]*)\}", line)
  if explicit:
    return len([x for x in explicit.group(1).split(",") if x.strip()])
  if "source_target_pairs=" in line:
    return 2
  return num_devices  # replica_groups={} : every device


def collectives(module: Module, num_devices: int) -> list[Collective]:
  """Every collective a step runs, async pairs counted once (at their `-start`)."""
  found = []
  for comp, instrs in module.computations.items():
    times = module.multipliers.get(comp, 0)
    if not times:
      continue
    for i in instrs:
      base = i.op[:-len("-start")] if i.op.endswith("-start") else i.op
      if base not in KINDS:
        continue
      shape = i.shape
      if i.op.endswith("-start"):
        # An async start's result holds (operands, results, ...): take the results.
        parts = _top_level(shape)
        shape = parts[1] if len(parts) > 1 and base != "all-reduce" else parts[0]
      found.append(Collective(base, _array_bytes(shape), _group_size(i.rest, num_devices),
                              times, i.name))
  return found


def _top_level(shape: str) -> list[str]:
  """The elements of a tuple shape `(a, (b, c), d)` at depth one."""
  text = shape.strip()
  if not text.startswith("("):
    return [text]
  parts, depth, start = [], 0, 1
  for i, ch in enumerate(text):
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    if ch == "," and depth == 1:
      parts.append(text[start:i])
      start = i + 1
  parts.append(text[start:-1])
  return [p.strip() for p in parts if p.strip()]


def summarize(found: Iterable[Collective]) -> dict[str, dict[str, float]]:
  """Per kind: executions per step, result bytes per step, wire bytes per step (per device)."""
  out: dict[str, dict[str, float]] = {}
  for c in found:
    entry = out.setdefault(c.kind, {"count": 0, "bytes": 0.0, "wire_bytes": 0.0,
                                    "max_group": 0})
    entry["count"] += c.count
    entry["bytes"] += c.count * c.bytes
    entry["wire_bytes"] += c.count * c.wire_bytes
    entry["max_group"] = max(entry["max_group"], c.group)
  return out
