"""The notebooks in notebooks/: stored without outputs, and run top to bottom with tiny settings.

Each notebook is executed by a Jupyter kernel on this interpreter (a kernelspec written to a
temporary JUPYTER_PATH), with BERT_JAX_SMOKE_TEST=1 and a temporary working directory, the way a
user runs it; then a few of its outputs are checked for substance.
"""

import json
import os
import re
import sys

import nbclient
import nbformat
import pytest

from tests import helpers

REPO = helpers.REPO
NOTEBOOKS = os.path.join(REPO, "notebooks")
KERNEL = "bert-jax-test-python"
CELL_TIMEOUT_S = 600


def _notebook_paths():
  return sorted(os.path.join(NOTEBOOKS, n) for n in os.listdir(NOTEBOOKS) if n.endswith(".ipynb"))


@pytest.mark.parametrize("path", _notebook_paths(), ids=os.path.basename)
def test_notebook_is_stored_clean(path):
  """No outputs, execution counts or widget state in git; valid nbformat 4."""
  nb = nbformat.read(path, as_version=4)
  nbformat.validate(nb)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert cell.outputs == [], f"{cell.id} has outputs"
      assert cell.execution_count is None, f"{cell.id} has an execution count"
    assert not {"execution", "collapsed", "scrolled"} & set(cell.metadata), cell.id
  assert "widgets" not in nb.metadata
  assert nb.metadata.kernelspec.name == "python3"


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
  """A kernelspec that starts this very interpreter, and the environment the kernel inherits."""
  spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL
  spec_dir.mkdir(parents=True)
  (spec_dir / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "bert_jax tests", "language": "python"}))
  monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
  monkeypatch.setenv("BERT_JAX_SMOKE_TEST", "1")
  monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
  monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")
  # Two host devices: the notebooks' data-parallel mesh spans more than one device, as on a TPU.
  monkeypatch.setenv("XLA_FLAGS", helpers.xla_flags(2))
  workdir = tmp_path / "work"
  workdir.mkdir()
  return workdir


def _execute(name: str, workdir) -> dict:
  """Runs the notebook in `workdir`; returns {cell id: (stdout + stderr text, output types)}."""
  nb = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)", id="interpreter"))
  client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=CELL_TIMEOUT_S,
                                   resources={"metadata": {"path": str(workdir)}})
  client.execute()
  cells = {}
  for cell in nb.cells:
    if cell.cell_type != "code":
      continue
    text, kinds = [], set()
    for out in cell.outputs:
      if out.output_type == "stream":
        text.append(out.text)
      elif out.output_type in ("display_data", "execute_result"):
        kinds.update(out.data)
        text.append(out.data.get("text/plain", ""))
    cells[cell.id] = ("".join(text), kinds)
  assert os.path.realpath(cells["interpreter"][0].strip()) == os.path.realpath(sys.executable)
  return cells


@pytest.mark.slow
@pytest.mark.e2e
def test_finetune_glue_notebook(kernel_env):
  cells = _execute("finetune_glue_tpu.ipynb", kernel_env)
  assert "bert_jax is already installed" in cells["install"][0]
  assert "2 cpu device(s)" in cells["devices"][0]
  assert "mesh (2, 1, 1), compute dtype float32" in cells["devices"][0]
  assert "smoke test: True" in cells["parameters"][0]
  assert "64 training examples" in cells["data"][0]
  assert "Hugging Face" in cells["model"][0]
  accuracy = re.search(r"dev accuracy: ([01]\.\d{4})", cells["eval-results"][0])
  assert accuracy, cells["eval-results"][0]
  assert "dev: 20 examples" in cells["eval-results"][0]
  assert "image/png" in cells["loss-plot"][1]
  predictions = cells["predict"][0].strip().splitlines()
  assert len(predictions) == 4 and all(re.search(r"negative \d+\.\d%, positive \d+\.\d%", l)
                                       for l in predictions), predictions
  saved = json.loads((kernel_env / "finetune_output" / "eval_results.json").read_text())
  assert saved["dev"]["num_examples"] == 20
  assert f"{saved['dev']['accuracy']:.4f}" == accuracy.group(1)
  lines = (kernel_env / "finetune_output" / "SST-2.tsv").read_text().splitlines()
  assert lines[0] == "index\tprediction" and len(lines) == 5


@pytest.mark.slow
@pytest.mark.e2e
def test_inspect_pretraining_notebook(kernel_env):
  cells = _execute("inspect_pretraining.ipynb", kernel_env)
  assert "bert_jax checkout:" in cells["install"][0]
  assert "2 cpu device(s)" in cells["devices"][0]
  assert "smoke test: True" in cells["parameters"][0]
  assert "2,000 tokens" in cells["corpus"][0]
  assert re.search(r"Wrote [\d,]+ instances to 2 shard\(s\)", cells["records"][0])
  decoded = cells["decode"][0]
  assert "⟨[MASK]⟩" in decoded and "original A:" in decoded and "original B:" in decoded
  # Every predicted position is listed with the original token; most of them show [MASK].
  rows = re.findall(r"^\s+\d+  (\S+)\s+(\S+)\s+(\[MASK\]|kept|random token)$", decoded, re.M)
  assert len(rows) >= 2 and all(kind != "[MASK]" or seen == "[MASK]" for seen, _, kind in rows)
  stats = re.search(r"of those \[MASK\] ([\d.]+)%, random token ([\d.]+)%, kept ([\d.]+)%",
                    cells["stats"][0])
  assert stats and 70 < float(stats.group(1)) < 90, cells["stats"][0]
  assert "step 60/60" in cells["pretrain"][0]
  assert re.search(r"held-out masked-LM accuracy \d+\.\d%", cells["loss-curve"][0])
  assert re.search(r"\[MASK\] #1: \S+ \d+\.\d%", cells["fill-mask"][0])
  for cell in ("stats", "loss-curve", "fill-mask", "attention"):
    assert "image/png" in cells[cell][1], cell
  rows = [json.loads(line) for line in
          (kernel_env / "pretraining_inspect" / "pretrain" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows if "train/loss" in r] == list(range(10, 61, 10))
