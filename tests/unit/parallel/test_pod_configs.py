"""The paper's configs build for the paper's pods: BERT-base on 16 chips, BERT-large on 64.

Runs in a subprocess with 64 fake CPU devices standing in for the slice (the test session has 8).
"""

import json
import subprocess
import sys

import pytest

from tests import helpers
from tests import pretrain_helpers as ph

SCRIPT = r"""
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "configs"))
import jax
import pretrain as configs
from bert_jax.runs import pretraining
out = {"devices": jax.device_count()}
base = pretraining.compile_train_step(configs.get_config("base"))
out["base"] = {"mesh": base["mesh"], "params": base["num_parameters"],
               "flops": base["compiled_flops_per_device"],
               "analytic": base["analytic_flops_per_step"],
               "bytes": base.get("bytes_per_device"),
               "kernel_spec": str(base["state_shardings"].params["bert"]["encoder"]["layer_0"]
                                  ["intermediate"]["dense"]["kernel"].spec)}
large = pretraining.compile_train_step(configs.get_config("large"), compile_step=False)
text = large["lowered"].as_text()
out["large"] = {"mesh": large["mesh"], "params": large["num_parameters"],
                "partitions": "mhlo.num_partitions = 64" in text}
phase2 = configs.get_config("base_phase2")
out["phase2"] = [phase2.data.max_seq_length, phase2.data.max_predictions_per_seq,
                 phase2.train_until_step, phase2.total_steps, phase2.init_mode]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.e2e
def test_base_compiles_for_16_chips_and_large_lowers_for_64():
  env = helpers.command_env(64)
  proc = subprocess.run([sys.executable, "-c", SCRIPT, ph.REPO], env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
  out = json.loads(line[len("RESULT "):])
  assert out["devices"] == 64
  base = out["base"]
  assert base["mesh"] == {"data": 16, "fsdp": 1, "model": 1}
  assert base["params"] == 110_106_428
  # XLA's count of the compiled step agrees with the analytic count (per device × 16 devices).
  assert abs(base["flops"] * 16 / base["analytic"] - 1) < 0.05, base
  assert base["kernel_spec"] == "P('fsdp', 'model')"
  assert out["large"]["mesh"] == {"data": 64, "fsdp": 1, "model": 1}
  assert out["large"]["params"] > 335_000_000 and out["large"]["partitions"]
  # Phase 2: length 512, the last 10% of the 1M steps, continuing the phase-1 state.
  assert out["phase2"] == [512, 80, 1_000_000, 1_000_000, "continue"]


@pytest.mark.parametrize("coordinator,hostnames,tpu_vm,expected", [
    ("10.0.0.1:1234", "", False, {"coordinator_address": "10.0.0.1:1234", "num_processes": 2,
                                  "process_id": 1}),
    (None, "", True, {}),                  # Cloud TPU VM: the slice comes from TPU metadata
    (None, "w-0,w-1", False, {}),          # GKE TPU pods list their workers
    (None, "w-0", False, None),            # one worker, no TPU chips here: nothing to join
    (None, "", False, None),               # a CPU or single-GPU machine
])
def test_distributed_initialisation_is_called_where_there_is_a_slice(monkeypatch, coordinator,
                                                                      hostnames, tpu_vm,
                                                                      expected):
  from bert_jax.parallel import distributed
  calls = []
  monkeypatch.setattr(distributed.jax.distributed, "initialize",
                      lambda **kwargs: calls.append(kwargs))
  monkeypatch.setattr(distributed, "on_tpu_vm", lambda: tpu_vm)
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", hostnames)
  distributed.initialize_distributed(coordinator, 2 if coordinator else None,
                                   1 if coordinator else None)
  assert calls == ([] if expected is None else [expected])
