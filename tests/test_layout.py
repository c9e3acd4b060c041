"""The package's structure, checked: data flows one way through the rooms, no command imports
another, and the machinery that must exist once (the step, the loop, the forward pass, the
checkpoints/ resolution) lives in one place."""

import ast
import os
import re

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bert_jax")

# Rooms in the order data flows; a module may import only from its own room or earlier ones.
# `interop` comes before `training`: the init order reads checkpoints of every kind through
# interop's format readers. `tasks` comes after `runs`: a task kind's package holds its run and
# its predictions beside its data and objective (`tasks/registry.py`). `analysis` looks inside
# trained models, of any task.
ORDER = ("file_io", "text", "data", "model", "parallel", "interop", "training", "objectives",
         "inference", "runs", "tasks", "analysis", "cli")
ENTRY_POINTS = ("pretrain", "finetune", "predict", "convert", "extract_features", "analyze",
                "demo")


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


def test_entry_points_hold_flags_and_a_library_call():
  """An entry point defines its flags and `main`; every other function it defines reads the
  flags (maps them onto the library), and none is a library function that others would import
  from a command."""
  import ast  # pylint: disable=g-import-not-at-top
  problems = []
  for name in ENTRY_POINTS:
    tree = ast.parse(open(os.path.join(PACKAGE, f"{name}.py"), encoding="utf-8").read())
    for node in tree.body:
      if isinstance(node, ast.ClassDef):
        problems.append(f"{name}.{node.name}: a class in an entry point")
      elif isinstance(node, ast.FunctionDef) and node.name not in ("main", "define_flags"):
        reads_flags = any(isinstance(n, ast.Name) and n.id == "FLAGS" for n in ast.walk(node))
        if not (reads_flags or node.name.startswith("_")):
          problems.append(f"{name}.{node.name}: a library function in an entry point")
  assert not problems, "\n".join(problems)


def test_a_task_is_named_once():
  """Task names live in `tasks/registry.py`: no other module spells a tagging, SQuAD or
  multiple-choice task name as a set of names to match against."""
  from bert_jax.tasks import registry  # pylint: disable=g-import-not-at-top
  assert {registry.find(n).name for n in ("squad_v2", "squad v1.1", "conll2003", "ner",
                                          "hellaswag", "SST-2", "custom")} == {
      "squad", "tagging", "multiple_choice", "classification"}
  spelled = []
  for module, path in _modules():
    if module == "tasks.registry":
      continue
    text = open(path, encoding="utf-8").read()
    if re.search(r"""\(\s*["']conll2003["'],\s*["']tagging["']|\(\s*["']swag["'],\s*["']hellaswag["']"""
                 r"""|["']squad_v1\.1["']\s*:""", text):
      spelled.append(module)
  assert not spelled, spelled
  # Every kind is a package of the same rooms.
  for kind in registry.KINDS:
    for room in ("data", "objective", "run", "predict"):
      assert os.path.exists(os.path.join(PACKAGE, "tasks", kind.name, f"{room}.py")), (kind, room)


def test_every_package_directory_ships():
  """Every folder of modules is a package (`__init__.py`), which `setup.py`'s `find_packages`
  needs to put it in the wheel: without one the checkout imports it and an install does not."""
  missing = [os.path.relpath(root, PACKAGE) for root, dirs, files in os.walk(PACKAGE)
             if "__pycache__" not in root and any(f.endswith(".py") for f in files)
             and "__init__.py" not in files]
  assert not missing, missing


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
  # (interop.checkpoint_fingerprints jits the checksum of saved arrays, not a model.)
  assert set(jit_sites) == {"training.step", "training.state", "inference",
                            "parallel.sharding", "interop.checkpoint_fingerprints"}, jit_sites
  # Gradients, of a model's loss or of a probe's over fixed features, in the step module only.
  grad_sites = [m for m, p in _modules()
                if re.search(r"\bjax\.(grad|value_and_grad)\(", open(p, encoding="utf-8").read())]
  assert grad_sites == ["training.step"], grad_sites
  assert checkpoint_dirs == ["interop.kinds"], checkpoint_dirs
  loops = [m for m, p in _modules() if re.search(r"^def train\(", open(p).read(), re.M)]
  assert loops == ["training.loop"], loops


def test_tests_mirror_the_package():
  """A test file lives under tests/unit/<room>/ (a room of the package, or `data_prep`, the
  offline preparation beside it) or tests/e2e/ (files whose tests mostly run commands); no test
  file sits loose beside the shared helpers, and no test module imports another."""
  tests = os.path.dirname(os.path.abspath(__file__))
  rooms = set(ORDER) | {"data_prep"}
  found = []
  for root, _, files in os.walk(tests):
    for name in files:
      if name.startswith("test_") and name.endswith(".py"):
        rel = os.path.relpath(os.path.join(root, name), tests).split(os.sep)
        found.append(rel)
        if rel == ["test_layout.py"]:
          continue
        assert (len(rel) == 3 and rel[0] == "unit" and rel[1] in rooms) or \
            (len(rel) == 2 and rel[0] == "e2e"), "/".join(rel)
        source = open(os.path.join(root, name), encoding="utf-8").read()
        assert not re.search(r"^\s*from tests(\.\w+)*\.test_\w+ import|^\s*from tests(\.\w+)* "
                             r"import .*\btest_\w+", source, re.M), (
            f"{'/'.join(rel)} imports another test module: shared pieces belong in "
            "tests/helpers.py, tests/task_helpers.py, a room's helper module or a conftest.py "
            "fixture")
  assert len(found) > 40
