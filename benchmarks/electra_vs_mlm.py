"""ELECTRA's claim, checked small: at the same pre-training compute, replaced-token detection
gives a better encoder for fine-tuning than BERT's masked LM (Clark et al. 2020, Table 1:
ELECTRA-Small GLUE 79.9 vs BERT-Small 75.1 at equal FLOPs).

    python benchmarks/electra_vs_mlm.py --workdir=/tmp/electra_vs_mlm --data_dir=data/rt_sst2

Task: Rotten Tomatoes review snippets in the SST-2 layout (`make finetune-example` writes them
to data/rt_sst2; `python -m data_prep.sentiment_tsv`), split by film. Corpus: the training
split's review text, unlabelled (groups of 20 reviews as documents), so that both models see
the same in-domain text and never the dev reviews. An uncased WordPiece vocabulary is trained on
it; data_prep writes dynamic-masking records (FULL-SENTENCES rows, no sentence objective).

Models, one encoder shape for both (4 layers x 128, 2 heads; BERT-Small's shape scaled down):
  mlm      BERT's masked LM alone on that encoder.
  electra  the same encoder as the discriminator, a generator of 1/4 its width (32, 4 layers),
           loss = MLM + 50 x replaced-token detection.
Equal compute: ELECTRA trains `--electra_steps`; the masked LM trains as many steps as give the
same analytic training FLOPs (the objectives' own `flops_per_step`: both models and heads for
ELECTRA), as the paper gave BERT-Small 1.45M steps to ELECTRA-Small's 1M. Both: batch 32 x 64,
the same learning rate, warmup and seeds. Then each encoder is fine-tuned with identical settings
(the package's `finetune`, `--seeds` fine-tuning seeds) and dev accuracy is reported per seed,
with the mean and the difference. Stages whose output exists are not redone.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

from absl import app, flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from benchmarks import stages  # pylint: disable=wrong-import-position

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", "/tmp/electra_vs_mlm", "Corpus, vocabulary, records and runs.")
flags.DEFINE_string("data_dir", "data/rt_sst2", "The SST-2-layout task (train.tsv, dev.tsv).")
flags.DEFINE_integer("electra_steps", 2000, "Pre-training steps of ELECTRA.")
flags.DEFINE_integer("batch_size", 32, "Pre-training batch.")
flags.DEFINE_integer("max_seq_length", 64, "Row length of pre-training and fine-tuning.")
flags.DEFINE_float("learning_rate", 1e-3, "Peak pre-training learning rate (both).")
flags.DEFINE_integer("vocab_size", 4000, "WordPiece vocabulary size.")
flags.DEFINE_list("seeds", ["1", "2", "3"], "Fine-tuning seeds.")
flags.DEFINE_float("finetune_learning_rate", 3e-4, "Fine-tuning learning rate (ELECTRA-Small's).")
flags.DEFINE_float("finetune_epochs", 3.0, "Fine-tuning epochs.")

ENCODER = {"model.hidden_size": 128, "model.num_hidden_layers": 4,
           "model.num_attention_heads": 2, "model.intermediate_size": 512}
MODELS = {
    "mlm": {"objective": "mlm", "model.preset": "L-4_H-128_A-2", **ENCODER},
    "electra": {"objective": "electra", "model.preset": "electra_small", **ENCODER,
                "model.embedding_size": 128, "model.generator_hidden_size": 32,
                "model.generator_num_hidden_layers": 4},
}


# The lines of a stage's output shown on the console (all go to its log).
_SHOWN = ("step ", "eval", "rror", "BERT", "accuracy")


def _run(title: str, args: list[str]) -> float:
  return stages.run_stage(title, args, os.devnull, _SHOWN)


def write_corpus(train_tsv: str, path: str, per_document: int = 20) -> int:
  with open(train_tsv, encoding="utf-8") as f:
    rows = [line.rstrip("\n").split("\t") for line in f][1:]
  sentences = [r[0] for r in rows if r and r[0].strip()]
  docs = ["\n".join(sentences[i:i + per_document])
          for i in range(0, len(sentences), per_document)]
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n\n".join(docs) + "\n")
  return len(sentences)


def prepare(work: str, data_dir: str) -> dict:
  """Corpus, vocabulary and records (each made once): the paths and the lengths."""
  py = sys.executable
  os.makedirs(work, exist_ok=True)
  corpus = os.path.join(work, "reviews.txt")
  n_reviews = write_corpus(os.path.join(data_dir, "train.tsv"), corpus)
  vocab_prefix = os.path.join(work, "vocab")
  vocab = vocab_prefix + ".vocab.txt"
  seq = FLAGS.max_seq_length
  pred = stages.max_predictions(seq)
  if not os.path.exists(vocab):
    _run("vocabulary: uncased WordPiece on the training reviews",
         [py, "-m", "data_prep.train_tokenizer", f"--input_file={corpus}",
          "--model_type=wordpiece", f"--vocab_size={FLAGS.vocab_size}",
          f"--output_prefix={vocab_prefix}"])
  records = os.path.join(work, "records")
  if not os.path.exists(os.path.join(records, "summary.json")):
    _run("records: dynamic masking, FULL-SENTENCES rows, no sentence objective",
         [py, "-m", "data_prep.create_pretraining_data", f"--input_file={corpus}",
          f"--output_dir={records}", f"--vocab_file={vocab}", f"--max_seq_length={seq}",
          f"--max_predictions_per_seq={pred}", "--masking=dynamic", "--objective=none",
          "--sequence_mode=full_sentences", "--short_seq_prob=0", "--num_output_shards=4",
          "--noprogress"])
  return dict(work=work, data_dir=data_dir, vocab=vocab, records=records, seq=seq, pred=pred,
              n_reviews=n_reviews)


def run_config(setup: dict, model: dict, steps: int) -> dict:
  """The pre-training overrides of `configs/pretrain.py:demo` for one model."""
  return {**model, "data.train_files": os.path.join(setup["records"], "*.tfrecord"),
          "data.vocab_file": setup["vocab"], "data.max_seq_length": setup["seq"],
          "data.max_predictions_per_seq": setup["pred"],
          "model.max_position_embeddings": setup["seq"],
          "global_batch_size": FLAGS.batch_size, "total_steps": steps,
          "train_until_step": steps, "optimizer.learning_rate": FLAGS.learning_rate,
          "optimizer.warmup_steps": steps // 10, "eval_every_steps": steps,
          "eval_steps": 10, "log_every_steps": 100, "checkpoint_every_steps": steps}


def pretrain(setup: dict, name: str, model: dict, steps: int) -> tuple[str, float | None]:
  """`python -m bert_jax.pretrain` (once): the workdir and its wall time (None: done before)."""
  run_dir = os.path.join(setup["work"], f"pretrain_{name}")
  if os.path.exists(os.path.join(run_dir, "checkpoints", str(steps))):
    return run_dir, None
  return run_dir, stages.pretrain_demo(sys.executable, run_dir,
                                       run_config(setup, model, steps),
                                       f"{name}: pre-training, {steps} steps", _SHOWN)


def finetune(setup: dict, name: str, init_checkpoint: str, seed: int, **distill) -> float:
  """The package's fine-tuning of `init_checkpoint` on the task (once per name and seed),
  identical settings for every model; `distill`: a teacher (task-time distillation). Returns
  the dev accuracy."""
  from bert_jax.runs import finetune_config  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks.classification import run as classification_run  # pylint: disable=g-import-not-at-top
  from bert_jax.text import tokenization  # pylint: disable=g-import-not-at-top
  out_dir = os.path.join(setup["work"], f"finetune_{name}_seed{seed}")
  result_file = os.path.join(out_dir, "benchmark_result.json")
  if not os.path.exists(result_file):
    print(f"\n=== {name}: fine-tuning on {setup['data_dir']}, seed {seed}", flush=True)
    start = time.time()
    out = classification_run.run(
        finetune_config.make(
            task_name="SST-2", data_dir=setup["data_dir"], init_checkpoint=init_checkpoint,
            bert_config_file=None, output_dir=out_dir, max_seq_length=setup["seq"],
            train_batch_size=32, eval_batch_size=64,
            learning_rate=FLAGS.finetune_learning_rate, num_train_epochs=FLAGS.finetune_epochs,
            warmup_proportion=0.1, do_train=True, do_eval=True, seed=seed, **distill),
        tokenization.load_tokenizer(vocab_file=setup["vocab"], do_lower_case=True))
    with open(result_file, "w") as f:
      json.dump({"accuracy": out["dev"]["accuracy"], "seconds": time.time() - start}, f)
  with open(result_file) as f:
    accuracy = json.load(f)["accuracy"]
  print(f"  {name} seed {seed}: dev accuracy {accuracy:.4f}", flush=True)
  return accuracy


def flops_per_step(setup: dict, model: dict) -> float:
  """The objective's analytic training FLOPs per step for this model (`flops_per_step`)."""
  from bert_jax.runs import pretraining  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(REPO, "configs"))
  import pretrain as pretrain_configs  # pylint: disable=g-import-not-at-top
  config = pretrain_configs.get_config("demo")
  for key, value in run_config(setup, model, 1).items():
    node = config
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = value
  config.model.vocab_size = FLAGS.vocab_size
  return pretraining.objective_from(config).flops_per_step(
      pretraining.bert_config_from(config, "cpu"), FLAGS.batch_size)


def main(argv):
  del argv
  setup = prepare(os.path.abspath(FLAGS.workdir), os.path.abspath(FLAGS.data_dir))
  from bert_jax.training import metrics  # pylint: disable=g-import-not-at-top
  per_step = {name: flops_per_step(setup, model) for name, model in MODELS.items()}
  steps = {"electra": FLAGS.electra_steps,
           "mlm": round(FLAGS.electra_steps * per_step["electra"] / per_step["mlm"])}
  print(f"\n=== equal compute: {per_step['electra'] / 1e9:.2f} vs {per_step['mlm'] / 1e9:.2f} "
        f"GFLOPs per step -> ELECTRA {steps['electra']} steps, masked LM {steps['mlm']} steps "
        f"({steps['electra'] * per_step['electra'] / 1e12:.2f} TFLOPs each)", flush=True)

  results = {}
  for name, model in MODELS.items():
    run_dir, seconds = pretrain(setup, name, model, steps[name])
    logged = metrics.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    last = [r for r in logged if "train/loss" in r][-1]
    accuracies = [finetune(setup, name, run_dir, int(seed)) for seed in FLAGS.seeds]
    results[name] = dict(steps=steps[name], gflops_per_step=per_step[name] / 1e9,
                         seconds=seconds, accuracies=accuracies,
                         mean=statistics.mean(accuracies),
                         stdev=statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
                         last={k: v for k, v in last.items() if k.startswith("train/")})
  with open(os.path.join(setup["work"], "results.json"), "w") as f:
    json.dump(results, f, indent=2)

  print(f"\n### ELECTRA vs masked LM at equal pre-training FLOPs "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"{setup['n_reviews']} training reviews as corpus; dev {setup['data_dir']}/dev.tsv)\n")
  print("| pre-training | steps | GFLOPs/step | dev accuracy per seed | mean ± sd |")
  print("|---|---:|---:|---|---|")
  for name, r in results.items():
    seeds = ", ".join(f"{a:.4f}" for a in r["accuracies"])
    print(f"| {name} | {r['steps']} | {r['gflops_per_step']:.2f} | {seeds} | "
          f"{r['mean']:.4f} ± {r['stdev']:.4f} |")
  wins = sum(a > b for a, b in zip(results["electra"]["accuracies"],
                                   results["mlm"]["accuracies"]))
  print(f"\nELECTRA - MLM: {100 * (results['electra']['mean'] - results['mlm']['mean']):+.2f} "
        f"points of dev accuracy (mean over {len(FLAGS.seeds)} fine-tuning seeds); ELECTRA "
        f"ahead on {wins} of {len(FLAGS.seeds)} seeds.")


if __name__ == "__main__":
  app.run(main)
