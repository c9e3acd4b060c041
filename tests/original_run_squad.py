"""Drives the original `run_squad.py` (PyPI bert-tensorflow 1.0.4) for the SQuAD tests.

Run as a subprocess with one or more JSON specs, the original imported once. For each: reads the
examples, builds the features with its `convert_examples_to_features`, and with `logits_seed`
also draws logits for every feature and writes its `predictions.json` /
`nbest_predictions.json` / `null_odds.json` with `write_predictions` (which includes
`get_final_text`). Its model code (`bert.modeling`, `bert.optimization`) needs TF1's
`tf.contrib` and is not used here, so those two modules are replaced by empty ones before
`run_squad` is imported.
"""

import json
import sys
import types

import numpy as np


def _original():
  import bert  # noqa: F401  (the package; its submodules are imported below)
  for name in ("modeling", "optimization"):
    sys.modules[f"bert.{name}"] = types.ModuleType(f"bert.{name}")
  from bert import run_squad, tokenization
  return run_squad, tokenization


def main(spec_files):
  run_squad, tokenization = _original()
  for spec_file in spec_files:
    _run(run_squad, tokenization, json.load(open(spec_file)))


def _run(run_squad, tokenization, spec):
  run_squad.FLAGS([
      "run_squad", f"--version_2_with_negative={spec['version_2']}",
      f"--null_score_diff_threshold={spec.get('null_score_diff_threshold', 0.0)}"])
  examples = run_squad.read_squad_examples(spec["input_file"], is_training=spec["is_training"])
  tokenizer = tokenization.FullTokenizer(spec["vocab_file"], do_lower_case=True)
  features = []
  run_squad.convert_examples_to_features(
      examples, tokenizer, spec["max_seq_length"], spec["doc_stride"], spec["max_query_length"],
      spec["is_training"], output_fn=features.append)
  dump = [{"qas_id": examples[f.example_index].qas_id, "input_ids": f.input_ids,
           "input_mask": f.input_mask, "segment_ids": f.segment_ids,
           "start_position": f.start_position, "end_position": f.end_position,
           "max_context": sorted(int(k) for k, v in f.token_is_max_context.items() if v)}
          for f in features]
  with open(spec["output_dir"] + "/features.json", "w") as out:
    json.dump(dump, out)
  if "logits_seed" in spec:
    rng = np.random.default_rng(spec["logits_seed"])
    shape = (len(features), spec["max_seq_length"])
    # Few distinct values: many ties, which both implementations must break the same way.
    start = rng.integers(-8, 8, size=shape).astype(np.float32) / 2
    end = rng.integers(-8, 8, size=shape).astype(np.float32) / 2
    np.savez(spec["output_dir"] + "/logits.npz", start=start, end=end)
    results = [run_squad.RawResult(unique_id=f.unique_id, start_logits=start[i].tolist(),
                                   end_logits=end[i].tolist()) for i, f in enumerate(features)]
    out = spec["output_dir"]
    run_squad.write_predictions(examples, features, results, spec["n_best_size"],
                                spec["max_answer_length"], True, out + "/predictions.json",
                                out + "/nbest_predictions.json", out + "/null_odds.json")


if __name__ == "__main__":
  main(sys.argv[1:])
