"""The package's structure, checked: data flows one way through the rooms, no command imports
another, and the machinery that must exist once (the step, the loop, the forward pass, the
checkpoints/ resolution) lives in one place."""

import ast
import os
import re

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bert_jax")

# Rooms in the order data flows; a module may import only from its own room or earlier ones.
ORDER = ("file_io", "text", "data", "model", "parallel", "training", "objectives", "tasks",
         "interop", "inference", "runs", "cli")
ENTRY_POINTS = ("pretrain", "finetune", "predict", "convert", "extract_features", "demo")


def _modules():
  for root, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(root, name)
        rel = os.path.relpath(path, PACKAGE)[:-3].replace(os.sep, ".")
        yield rel, path


def _room(module: str) -> str:
  return module.split(".")[0]


def _imports(path: str) -> list[str]:
  """Every bert_jax module `path` imports (at any depth of the file)."""
  out = []
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bert_jax"):
      base = node.module[len("bert_jax"):].lstrip(".")
      if base:
        out.append(base)
      else:  # `from bert_jax import x`: a module, or a name of the package's __init__
        out += [alias.name for alias in node.names
                if os.path.exists(os.path.join(PACKAGE, alias.name + ".py"))
                or os.path.isdir(os.path.join(PACKAGE, alias.name))]
    elif isinstance(node, ast.Import):
      out += [a.name[len("bert_jax."):] for a in node.names if a.name.startswith("bert_jax.")]
  return out


def test_every_room_is_known_and_imports_flow_one_way():
  problems = []
  for module, path in _modules():
    room = _room(module)
    if room == "__init__":
      continue
    assert room in ORDER + ENTRY_POINTS, f"{module}: a room not in the layout"
    if room in ENTRY_POINTS:
      continue
    for imported in _imports(path):
      target = _room(imported)
      if target in ENTRY_POINTS:
        problems.append(f"{module} imports the command {imported}")
      elif ORDER.index(target) > ORDER.index(room):
        problems.append(f"{module} ({room}) imports {imported} ({target}), later in the flow")
  assert not problems, "\n".join(problems)


def test_no_command_imports_another():
  for name in ENTRY_POINTS:
    imported = {_room(m) for m in _imports(os.path.join(PACKAGE, f"{name}.py"))}
    assert not imported & set(ENTRY_POINTS), (name, imported & set(ENTRY_POINTS))


def test_one_step_one_loop_one_forward_pass():
  """`jax.jit` of a model lives in the step builder, the inference library and the sharded
  init; `checkpoints/` is spelled out only where checkpoint kinds are told apart."""
  jit_sites, checkpoint_dirs = {}, []
  for module, path in _modules():
    text = open(path, encoding="utf-8").read()
    count = len(re.findall(r"\bjax\.jit\(", text))
    if count:
      jit_sites[module] = count
    if re.search(r"""["']checkpoints["']""", text):
      checkpoint_dirs.append(module)
  # (training.checkpointing jits the checksum of saved arrays, not a model.)
  assert set(jit_sites) == {"training.step", "training.state", "inference",
                            "parallel.sharding", "training.checkpointing"}, jit_sites
  assert checkpoint_dirs == ["interop.kinds"], checkpoint_dirs
  loops = [m for m, p in _modules() if re.search(r"^def train\(", open(p).read(), re.M)]
  assert loops == ["training.loop"], loops
