#!/usr/bin/env bash
# The GPU measurements on one H100/H200, in one command that fits a short rental, most valuable first:
#
#   OUT=/some/dir bash benchmarks/gpu_suite.sh        (from the repository root)
#
# GPU time is short (one run of at most ~9 minutes), so everything runs from this one script, each
# part under `timeout` (a hang costs that part, not the rest), within a total budget
# (SUITE_BUDGET_S, default 565 s: a part is not started with less than two thirds of its cap
# or SUITE_MIN_PART_S = 45 s left, and is cut at what is left). All output is tee'd into
# $OUT/suite.log as it comes; after every part $OUT/results.md (the benchmarks' markdown
# sections), $OUT/results.json (their rows), $OUT/summary.md (ratios, MFU, what ran, failed or
# was skipped) and $OUT/hlo.tar.gz (XLA's autotuning results and the optimized HLO of our steps,
# as much as fits in 14 MiB)
# are rewritten, so a call cut short still returns what finished. Ten files (with
# attention_checks.md, attention_pallas_checks.md, layer_norm_checks.md, head_checks.md and
# fp8_checks.md), small enough to copy back.
#
# Parts (SUITE_PARTS, default all; they run in this order, a later run can take the rest):
#   (checks) attention dropout inside cuDNN's kernel: kept fraction, scaling, masks per call and
#       per layer, backward mask = forward mask (`attention_dropout_checks.py`); the fused
#       dropout + residual + LayerNorm kernels against the reference under their mask, and one
#       BERT-base site forward + backward timed against XLA's (`fused_layer_norm_checks.py`);
#       the masked-LM head's one-pass loss and bfloat16 decoder gradient against their
#       references, the loss timed against log_softmax and a gather (`head_checks.py`);
#       FP8's one-pass quantization kernel against XLA's operations and our FP8 layer against
#       Flax's, each timed with BERT-large's shapes (`fp8_checks.py`); our Triton attention
#       with its dropout through the same checks as cuDNN's, then against its reference at
#       BERT-base's and BERT-large's shapes and timed against cuDNN's, several tilings
#       (`attention_dropout_checks.py --implementation=pallas`)
#   (a) base 256×128: ours paper-cudnn, fast-cudnn, each with 5 more steps profiled (device
#       time by kernel kind and the busiest kernels, `--profile_dir`); the PyTorch peer
#       (`peer_torch.py`, Hugging Face BertForPreTraining, SDPA) eager and compiled, paper recipe
#   (b) large 64×512: ours paper-cudnn, not profiled (profiled, it printed nothing within its
#       140 s on the H200); the peer compiled, paper recipe
#   (e) XLA flags and the layers' layout on base paper-cudnn, one process per setting: default;
#       "stacked" (the layers' parameters and optimizer state stacked, the layers unrolled:
#       `--layers=stacked`); "fusedln" (stacked, each block's dropout + residual + LayerNorm
#       one Triton kernel each way: paper-cudnn-fusedln); "pallas" (fusedln's step with our
#       Triton attention in place of cuDNN's: paper-pallas-fusedln); "everything" (stacked and
#       fusedln with the epilogues, the tanh GELU and pdl, below; profiled as (a) is; without the fused
#       sites if "fusedln" gave no step time); "pdl" (Hopper's
#       programmatic dependent launch: a kernel is let in while the one before drains, which
#       matters for a step of ~1,300 kernels, ~600 of them under 1 MB; off by default in jaxlib
#       0.11.2); "epilogues" (Triton GEMM off, so that every GEMM goes through cuBLASLt, whose
#       epilogues take bias adds, and XLA's dot merger off: on the H200 it joined Q's and K's
#       GEMMs, forward and weight gradient, 3.6 GB of copies per step); the same with GELU's
#       tanh form (paper-cudnn-tanh: bias + GELU in the first feed-forward GEMM's epilogue) and
#       the peer compiled with that GELU (--hidden_act=gelu_new); all of these together
#       ("epilogues_tanh_pdl"); then Triton GEMM off alone, the dot merger off alone
#       ("fusedln"'s step), command buffers off (empty list; "fusedln"'s step, profiled: only
#       there does the trace name each kernel), cuDNN LayerNorm on. Each flag is
#       parsed by jaxlib 0.11.2 (and by 0.10.2, except --xla_gpu_enable_pdl_launch; an unknown
#       one aborts XLA at start: the abort is recorded, the sweep goes on)
#   (c) large 64×512: ours paper-cudnn-fusedln stacked, then with our Triton attention
#       (paper-pallas-fusedln); FP8 matmuls with the fused sites
#       (paper-cudnn-fp8-fusedln stacked, FP8 scales stacked too); large's "everything" (as
#       (e)'s: the fused sites with the epilogues, the tanh GELU and pdl) beside the peer
#       compiled with that GELU; ours paper-cudnn with unrolled, then stacked layers (one
#       process)
#   (d) A/B on base: ours paper-cudnn-f32res, paper-cudnn-bits32 (against (a)'s paper-cudnn)
#       and paper (the explicit path); ours fast-cudnn on large
#   (g) the peer with the MLM head gathered at the masked positions (as ours), eager and
#       compiled, on base
#   (h) int8 inference against bfloat16 on base 256×128 (`int8_speed.py`: Q8BERT-style int8
#       kernels, tables and per-token activations, int8 matmuls with int32 accumulation)
#   (t) fine-tuning steps (`accelerator_step.py --task`), one process each: SQuAD 32×384 on
#       base and on large, GLUE (MNLI) 32×128 on base; XLA's kernels ("paper": what a bfloat16
#       fine-tuning run computed before) against the fused ones it now takes on a recent GPU
#       (paper-cudnn-fusedln) and with our Triton attention (paper-pallas-fusedln, SQuAD);
#       GLUE's also with stacked layers
#   (f) real rows, if .bench_batches/*.npz exist (128_* on base, 512_* on large): ours
#       paper-cudnn-fusedln and paper-pallas-fusedln (stacked layers) and the peer compiled,
#       paper recipe; the summary pairs our faster one with the peer. `python benchmarks/bench_batches.py`
#       writes them from a real corpus (git ignores them: copy the folder along)
# Every run of ours dumps its HLO and prints its kernel counts (`--dump_hlo_dir`).
#
# Times seen on one H200 (jax 0.11.2, torch 2.11; a JAX process starts in ~10 s; compiles:
# base paper-cudnn 34 s, fast-cudnn 24 s, paper 42 s, large paper-cudnn 53 s; torch.compile
# 47 s base, 73 s large; 2 warm-up + 2 × 10 timed steps):
#   (checks) 15 s + over 60 s for the LayerNorm kernels + over 45 s for the heads (both cut
#       there on 2026-11-28, their checks passed and their first timings printed)
#   (a) ours ≈ 150 s, peer eager + compiled 85 s   (b) ours ≈ 75 s, peer 95 s
#   (e) default ≈ 25 s (the compilation cache holds (a)'s paper-cudnn) + 11 × ~50 s + the
#       peer ≈ 60 s ≈ 585 s
#   (c) ≈ 140 + 140 s (large fused sites stacked: 137 s alone, compile 36 s), the peer
#       ≈ 100 s, then 150 + 140 s (FP8: cut at its earlier 130 s cap, now 190 s)
#   (d) ≈ 150 s   (g) ≈ 100 s
# Those times include creating the train state, whose program XLA compiled in about 60 s
# (base) and 140 s (large) for an H200 before its random draws went through JAX's threefry
# kernel (10 and 19 s, compiled on a 2-core machine: RESULTS.md, "The initial state's
# program"); each process's SETUP lines now say what every phase takes.
#   (h) ≈ 40 s   (f) ≈ 140 s per file present   (t) not yet run: ≈ 160 + 260 + 200 s expected
# All of it: ≈ 1,600 s without (f). SUITE_BUDGET_S=565 within a 600 s limit covers (checks), (a),
# (b) and part of (e); the rest needs another run (SUITE_PARTS="e c d g h f"), which leaves out
# the labels a run finished with SUITE_SKIP, e.g. SUITE_SKIP="e-default e-pdl" (its
# summary then has no e-default to compare the other settings with).
#
# SUITE_SMOKE=1 runs the same plumbing on the CPU with the tiny preset, one step, the peer eager
# only (cuDNN variants fail there, which exercises the failure paths). The suite's own settings
# come last on each command line, so they win over a part's.
set -u -o pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-/tmp/gpu_suite_out}
WORK=${SUITE_WORK:-$(mktemp -d /tmp/gpu_suite.XXXXXX)}
BUDGET_S=${SUITE_BUDGET_S:-565}
MIN_PART_S=${SUITE_MIN_PART_S:-45}
PARTS=" ${SUITE_PARTS:-checks a b c d e f g h t} "
SKIP=" ${SUITE_SKIP:-} "
PY=${PYTHON:-$(command -v python3 || command -v python)}
mkdir -p "$OUT" "$WORK/hlo"
LOG=$OUT/suite.log
START=$(date +%s)
: > "$WORK/status.tsv"

export PYTHONUNBUFFERED=1
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-1}
# Compiles are the suite's largest cost; the cache serves (e)'s default run from (a)'s
# paper-cudnn (XLA_FLAGS are part of the key, so the other settings compile afresh).
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$WORK/jax_cache}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1
# XLA's autotuning results, one file per fusion (the GEMM and Triton configurations the H200
# picked), shared by every part (a later compile reuses what an earlier one measured) and
# returned in hlo.tar.gz: with them a compile without a GPU can take the GPU's choices.
mkdir -p "$WORK/autotune"
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_per_fusion_autotune_cache_dir=$WORK/autotune"

BASE=base LARGE=large LARGE_BATCH=64 CHECK_IMPL=cudnn BASE_LENGTH=128 LARGE_LENGTH=512
# With Triton's GEMMs off, XLA wraps each slice of the stacked layers' weights and the cuBLAS
# GEMM reading it in a "dynamic slice fusion" (108 per BERT-base step), a runtime thunk of its
# own: the stacked "everything" step so built ran 80.5 ms on the H200 with the device idle 39 ms
# of it (its kernels busy 41.4 ms). Off, each slice of the leading axis is a view and each
# GEMM a plain cuBLAS call: 634 → 598 kernels, compiled for the H200 without one.
EPILOGUES="--xla_gpu_enable_triton_gemm=false --xla_disable_hlo_passes=dot-merger"
EPILOGUES+=" --xla_gpu_enable_dynamic_slice_fusion=false"
PDL="--xla_gpu_enable_pdl=true --xla_gpu_enable_pdl_launch=true"
OURS_ARGS=(--steps=10 --repeats=2 --warmup=2)
PEER_ARGS=(--steps=10 --repeats=2 --warmup=3)
INT8_ARGS=(--batch=256 --length=128 --steps=20 --warmup=3)
LN_CHECK_ARGS=(--rows=32768 --width=768)
HEAD_CHECK_ARGS=(--positions=5120 --vocab=30522 --hidden=768)
FP8_CHECK_ARGS=(--rows=32768 --width=1024 --features=4096)
PALLAS_CHECK_ARGS=()
if [[ ${SUITE_SMOKE:-0} == 1 ]]; then
  BASE=tiny LARGE=tiny LARGE_BATCH=4 CHECK_IMPL=pallas BASE_LENGTH=64 LARGE_LENGTH=64
  OURS_ARGS=(--steps=1 --repeats=1 --warmup=1 --batch=tiny=4)
  PEER_ARGS=(--steps=1 --repeats=1 --warmup=1 --batch=tiny=4 --dtype=float32 --device=cpu
             --modes=eager)
  INT8_ARGS=(--batch=4 --length=32 --steps=2 --warmup=1)
  LN_CHECK_ARGS=(--rows=256 --width=64 --check_rows=64 --steps=1 --repeats=1 --tilings=2048:4:8)
  HEAD_CHECK_ARGS=(--positions=64 --vocab=512 --hidden=64 --steps=1 --repeats=1)
  FP8_CHECK_ARGS=(--rows=512 --width=64 --features=256 --check_rows=200 --steps=1 --repeats=1)
  PALLAS_CHECK_ARGS=(--triton --shapes=2:64:2:32 --steps=1 --repeats=1)
fi

note() { echo "$*" | tee -a "$LOG"; }
elapsed() { echo $(( $(date +%s) - START )); }
want() { [[ $PARTS == *" $1 "* ]]; }

LAST_RC=0
# run <label> <cap_s> <command...>: under timeout min(cap, budget left). The cap is about 1.5×
# the part's usual time, so a part is skipped rather than started with less than two thirds of
# its cap (or MIN_PART_S) left: cut mid-compile, it would cost its time and return nothing.
run() {
  local label=$1 cap=$2; shift 2
  if [[ $SKIP == *" $label "* ]]; then
    note "### LEFT OUT $label (SUITE_SKIP)"
    printf '%s\tskipped\t0\tleft out (SUITE_SKIP)\n' "$label" >> "$WORK/status.tsv"
    LAST_RC=skipped
    return 0
  fi
  local left=$(( BUDGET_S - $(elapsed) )) need=$(( cap * 2 / 3 ))
  (( need < MIN_PART_S )) && need=$MIN_PART_S
  if (( left < need )); then
    note "### SKIPPED $label: ${left}s of the ${BUDGET_S}s budget left"
    printf '%s\tskipped\t0\t\n' "$label" >> "$WORK/status.tsv"
    LAST_RC=skipped
    return 0
  fi
  local limit=$(( cap < left ? cap : left ))
  note "### $label (at $(elapsed)s, limit ${limit}s, XLA_FLAGS='${XLA_FLAGS:-}'): $*"
  local t0=$(date +%s)
  timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  LAST_RC=${PIPESTATUS[0]}
  local took=$(( $(date +%s) - t0 )) why=""
  case $LAST_RC in
    0) why=ok ;; 124|137) why="timed out at ${limit}s" ;; 134) why="aborted (SIGABRT)" ;;
    139) why="crashed (SIGSEGV)" ;; *) why="exit $LAST_RC" ;;
  esac
  note "### $label: $why after ${took}s"
  printf '%s\t%s\t%s\t%s\n' "$label" "$LAST_RC" "$took" "$why" >> "$WORK/status.tsv"
  collect
}

# ours <label> <cap_s> <config> <variants> [args...]: our step; if the process dies (an XLA
# abort takes the whole process), the variants after the one that died run in a new process.
ours() {
  local label=$1 cap=$2 config=$3 variants=$4; shift 4
  run "$label" "$cap" "$PY" benchmarks/accelerator_step.py --configs="$config" \
    --variants="$variants" --out="$WORK/$label.md" --json_out="$WORK/$label.json" \
    --dump_hlo_dir="$WORK/hlo/$label" "$@" "${OURS_ARGS[@]}"
  case $LAST_RC in 0|1|124|137|skipped) return 0 ;; esac
  local rest
  rest=$("$PY" - "$WORK/$label.json" "$variants" <<'EOF'
import json, sys
try:
  with open(sys.argv[1]) as f:
    done = json.load(f)
  seen = {r["variant"] for r in done["results"]} | {x.split()[1] for x in done["failures"]}
except (OSError, ValueError, KeyError, IndexError):
  seen = set()
left = [v for v in sys.argv[2].split(",") if v not in seen]
print(",".join(left[1:]))  # left[0] is the one that took the process down
EOF
)
  if [[ -n $rest ]]; then
    ours "$label-rest" "$cap" "$config" "$rest" "$@"
  fi
}

# measured <label>: whether a run of ours under that label gave at least one step time.
measured() {
  "$PY" - "$WORK/$1.json" <<'EOF'
import json, sys
try:
  with open(sys.argv[1]) as f:
    sys.exit(0 if json.load(f)["results"] else 1)
except (OSError, ValueError, KeyError):
  sys.exit(1)
EOF
}

# with_fused_sites <label> <variant> <fallback>: prints <variant>, or <fallback> (without the
# fused LayerNorm sites) where the run <label> of the fused sites took place here and gave no
# step time (their kernels failed on this GPU), so that one failure does not cost two settings.
with_fused_sites() {
  if [[ $SKIP != *" $1 "* ]] && ! measured "$1"; then
    note "### $1 gave no step time: $3 runs instead of $2" >&2
    echo "$3"
  else
    echo "$2"
  fi
}

# peer <label> <cap_s> [args...]: the PyTorch peer.
peer() {
  local label=$1 cap=$2; shift 2
  run "$label" "$cap" "$PY" benchmarks/peer_torch.py --out="$WORK/$label.md" \
    --json_out="$WORK/$label.json" "$@" "${PEER_ARGS[@]}"
}

# Rewrites $OUT's results, summary and HLO archive from what the parts wrote so far.
collect() {
  "$PY" - "$WORK" "$OUT" "$BUDGET_S" "$(elapsed)" <<'EOF' 2>&1 | tee -a "$LOG" | tail -n 0
import glob, json, os, sys, tarfile
work, out, budget, elapsed = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
order = [line.split("\t")[0] for line in open(os.path.join(work, "status.tsv")) if line.strip()]
status = [line.rstrip("\n").split("\t") for line in open(os.path.join(work, "status.tsv"))
          if line.strip()]
rows, failures, sections = [], [], []
for label in order:
  path = os.path.join(work, label + ".json")
  if os.path.exists(path):
    try:
      with open(path) as f:
        data = json.load(f)
    except ValueError:
      continue
    rows += [{"impl": "jax", **r, "part": label} for r in data.get("results", [])]
    failures += [f"{label}: {x}" for x in data.get("failures", [])]
  md = os.path.join(work, label + ".md")
  if os.path.exists(md):
    sections.append(f"<!-- {label} -->\n" + open(md).read())
with open(os.path.join(out, "results.json"), "w") as f:
  json.dump({"results": rows, "failures": failures}, f, indent=1)
with open(os.path.join(out, "results.md"), "w") as f:
  f.write("\n\n".join(sections) + "\n")

def ms(r):
  return 1000 * r["step_s"]

def mfu(r):
  return f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "n/a"

def tokens(r):
  s = r["shape"]
  return s["batch"] * s["length"] * s["real"] / r["step_s"]

def what(r):
  if r["impl"] == "jax":
    layers = r.get("layers", "unrolled")
    task = "" if r.get("task", "pretrain") == "pretrain" else f" ({r['task']} fine-tuning)"
    tiling = f", attention tiling {r['attention_tiling']}" if r.get("attention_tiling") else ""
    return (f"ours {r['variant']}" + ("" if layers == "unrolled" else f", {layers} layers")
            + tiling + task)
  return f"peer {r['recipe']} {r['mode']} (MLM head {r['mlm']})"

def grouped(rows, key):
  """(key, its rows) for each value of `key(row)`, in the order rows first show it."""
  groups = {}
  for r in rows:
    groups.setdefault(key(r), []).append(r)
  return groups.items()

def compiled_peer(rows):
  return [r for r in rows if r["impl"] == "torch" and r["recipe"] == "paper"
          and r["mode"] == "compile" and r["mlm"] == "full"]

lines = [f"# GPU suite summary ({elapsed}s of a {budget}s budget)", ""]
device = next((r.get("device") for r in rows if r.get("device")), "unknown device")
lines += [f"Device: {device}.", "",
          "## Ours paper-cudnn against the peer compiled, paper recipe (real rows: our fastest)",
          "", "| config | rows | ours ms | ours MFU | peer ms | peer MFU "
          "| peer / ours (step time) |", "|---|---|---|---|---|---|---|"]
pretraining = [r for r in rows if r.get("task", "pretrain") == "pretrain"]
finetuning = [r for r in rows if r.get("task", "pretrain") != "pretrain"]
main = [r for r in pretraining if not r["part"].startswith(("e-", "f-"))]
real_rows = [r for r in pretraining if r["part"].startswith("f-")]
for part_rows in (main, real_rows):
  for key, same in grouped(part_rows, lambda r: (r["name"], r["shape"]["batch"],
                                                 r["shape"]["length"], r["shape"]["packed"],
                                                 r["shape"]["real"])):
    if part_rows is real_rows:  # real rows: our fastest paper-recipe step on them
      o = sorted((r for r in same if r["impl"] == "jax" and r["variant"].startswith("paper")),
                 key=ms)[:1]
    else:
      o = [r for r in same if r["impl"] == "jax" and r["variant"] == "paper-cudnn"
           and r.get("layers", "unrolled") == "unrolled"]
    p = compiled_peer(same)
    if not o and not p:
      continue
    layout = "packed" if key[3] else f"{100 * key[4]:.0f}% real"
    if part_rows is real_rows and o:
      layout += f" ({what(o[0])})"
    o_ms = f"{ms(o[0]):.1f}" if o else "—"
    p_ms = f"{ms(p[0]):.1f}" if p else "—"
    ratio = f"**{ms(p[0]) / ms(o[0]):.2f}×**" if o and p else "—"
    lines.append(f"| {key[0]} | {key[1]} × {key[2]}, {layout} | {o_ms} | "
                 f"{mfu(o[0]) if o else '—'} | {p_ms} | {mfu(p[0]) if p else '—'} | {ratio} |")
if lines[-1].startswith("|---"):
  lines.append("| (no pair measured yet) | | | | | | |")

# Our fastest step of the paper's recipe on full-length rows (any layout, flags or fused sites;
# FP8 apart), against the peer compiled with the same GELU: the headline of the run.
lines += ["", "## Our fastest paper-recipe step against the peer compiled with the same GELU",
          "", "| config | rows | GELU | ours: part, variant | ours ms | ours MFU | peer ms "
          "| peer MFU | peer / ours (step time) |", "|---|---|---|---|---|---|---|---|---|"]
full = [r for r in pretraining if not r["part"].startswith("f-")]
for key, same in grouped(full, lambda r: (r["name"], r["shape"]["batch"], r["shape"]["length"],
                                          r["hidden_act"])):
  o = sorted((r for r in same if r["impl"] == "jax" and r["variant"].startswith("paper")
              and "fp8" not in r["variant"]), key=ms)
  p = compiled_peer(same)
  if not o and not p:
    continue
  who = f"{o[0]['part']}, {what(o[0])[5:]}" if o else "—"
  ratio = f"**{ms(p[0]) / ms(o[0]):.2f}×**" if o and p else "—"
  lines.append(f"| {key[0]} | {key[1]} × {key[2]} | {key[3]} | {who} | "
               f"{f'{ms(o[0]):.1f}' if o else '—'} | {mfu(o[0]) if o else '—'} | "
               f"{f'{ms(p[0]):.1f}' if p else '—'} | {mfu(p[0]) if p else '—'} | {ratio} |")
if lines[-1].startswith("|---"):
  lines.append("| (no pair measured yet) | | | | | | | | |")
if finetuning:
  # Fine-tuning's step with XLA's kernels ("paper") against the fused ones.
  lines += ["", "## Fine-tuning steps: XLA's kernels against the fused ones", "",
            "| config | task | rows | layers | XLA's kernels ms (MFU) | fused ms (MFU) "
            "| XLA's / fused |", "|---|---|---|---|---|---|---|"]
  for key, same in grouped(finetuning, lambda r: (r["name"], r["task"], r["shape"]["batch"],
                                                  r["shape"]["length"], r["layers"])):
    xla = [r for r in same if r["variant"] == "paper"]
    fused = [r for r in same if r["variant"] != "paper"]
    cell = lambda r: f"{ms(r[0]):.1f} ({mfu(r[0])})" if r else "—"
    ratio = f"**{ms(xla[0]) / ms(fused[0]):.2f}×**" if xla and fused else "—"
    lines.append(f"| {key[0]} | {key[1]} | {key[2]} × {key[3]} | {key[4]} | {cell(xla)} | "
                 f"{cell(fused)} | {ratio} |")
lines += ["", "## Every run", "", "| part | config | rows | run | compile / first step (s) | "
          "step ms | real tokens/s | MFU | peak GiB |", "|---|---|---|---|---|---|---|---|---|"]
for r in rows:
  s = r["shape"]
  first = r.get("compile_s", r.get("first_step_s"))
  mem = f"{r['memory']:.1f}" if r.get("memory") is not None else "n/a"
  lines.append(f"| {r['part']} | {r['name']} | {s['batch']} × {s['length']} | {what(r)} | "
               f"{first:.1f} | {ms(r):.1f} | {tokens(r):,.0f} | {mfu(r)} | {mem} |")
sweep = {r["part"]: r for r in rows if r["part"].startswith("e-")}
base = sweep.get("e-default")
flag_parts = [s for s in status if s[0].startswith("e-")]
if flag_parts:
  lines += ["", "## XLA flags and GELU's form (base, one process each)", ""]
  for s in flag_parts:
    r = sweep.get(s[0])
    if r is None:  # aborted at start (an unknown flag), failed, timed out or skipped
      why = [x.split(": ", 1)[1] for x in failures if x.startswith(s[0] + ": ")]
      why = why or [s[3] if len(s) > 3 and s[3] else s[1]]
      lines.append(f"- {s[0]}: no result ({why[0]})")
      continue
    vs = f", {ms(r) / ms(base):.3f}× the default's step time" if base else ""
    first = r.get("compile_s", r.get("first_step_s"))
    lines.append(f"- {s[0]} ({what(r)}): {ms(r):.1f} ms, MFU {mfu(r)}, compile / first step "
                 f"{first:.0f} s{vs}")
  peer_tanh = sweep.get("e-peer_tanh")
  for label, r in sweep.items():
    if peer_tanh and r["impl"] == "jax" and "-tanh" in r["variant"]:
      lines.append(f"- GELU's tanh form on both sides: peer compiled ÷ ours ({label[2:]}) = "
                   f"**{ms(peer_tanh) / ms(r):.2f}×**")
profiled = [r for r in rows if r.get("profile") and "error" not in r["profile"]]
if profiled:
  lines += ["", "## Where our device time goes (`--profile_dir`, ms per step)", ""]
  for r in profiled:
    p = r["profile"]
    kinds = ", ".join(f"{k} {v:.1f}" for k, v in p["kinds_ms"].items())
    top = "; ".join(f"{t['group']} {t['ms']:.1f}" for t in p["top"][:6])
    lines.append(f"- {r['part']} {r['name']} {r['variant']}: step {p['step_ms']:.1f}, kernels "
                 f"busy {p['busy_ms']:.1f}; {kinds}. Most: {top}")
hlo = [r for r in rows if r.get("hlo")]
if hlo:
  lines += ["", "## Kernels of our steps (`--dump_hlo_dir`)", ""]
  lines += [f"- {r['part']} {r['name']} {r['variant']}: {r['hlo']}" for r in hlo]
lines += ["", "## Parts", ""]
lines += [f"- {s[0]}: {s[3] if len(s) > 3 and s[3] else s[1]}"
          + (f" ({s[2]} s)" if len(s) > 2 and s[2] not in ("", "0") else "") for s in status]
lines += [f"- Failed: {x}" for x in failures]
with open(os.path.join(out, "summary.md"), "w") as f:
  f.write("\n".join(lines) + "\n")

# The HLO dumps, most valuable first, as many as fit under the 16 MiB a returned file may have
# (HLO text compresses about tenfold; a sixth is assumed). Rebuilt only when a dump was added.
dumps = sorted((p for p in glob.glob(os.path.join(work, "hlo", "*", "*.hlo.txt"))
                if p.split(os.sep)[-2] in order),
               key=lambda p: (order.index(p.split(os.sep)[-2]), p))
archive, signature = os.path.join(out, "hlo.tar.gz"), os.path.join(work, "hlo.signature")
autotune = sorted(glob.glob(os.path.join(work, "autotune", "**", "*"), recursive=True))
autotune = [p for p in autotune if os.path.isfile(p)]
listing = "\n".join(f"{p} {os.path.getsize(p)}" for p in autotune + dumps)
if listing and (not os.path.exists(signature) or open(signature).read() != listing):
  with open(archive + ".tmp", "wb") as raw:
    with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1) as tar:
      if autotune:  # small, and first: what a compile without a GPU needs to match the GPU's
        tar.add(os.path.join(work, "autotune"), arcname="autotune")
      for path in dumps:
        if raw.tell() + os.path.getsize(path) / 6 > 14 * 2**20:
          continue
        tar.add(path, arcname=os.path.relpath(path, os.path.join(work, "hlo")))
  os.replace(archive + ".tmp", archive)
  with open(signature, "w") as f:
    f.write(listing)
EOF
}

note "### gpu_suite.sh: parts${PARTS}, budget ${BUDGET_S}s, out $OUT, $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu \
  --format=csv,noheader 2>&1 | tee -a "$LOG"
"$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
# Versions from the installed distributions' metadata: importing torch and JAX here would cost
# seconds of GPU time.
import platform
from importlib import metadata
names = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax",
         "orbax-checkpoint", "numpy", "torch", "transformers", "nvidia-cudnn-cu13")
versions = []
for name in names:
  try:
    versions.append(f"{name} {metadata.version(name)}")
  except metadata.PackageNotFoundError:
    pass
print(f"Python {platform.python_version()}; " + ", ".join(versions))
EOF

if want checks; then
  # Correctness first (~30 s): cuDNN's in-kernel attention dropout keeps the right fraction,
  # changes masks per call and per layer, and its backward regenerates the forward's mask.
  run checks 90 "$PY" benchmarks/attention_dropout_checks.py --implementation="$CHECK_IMPL" \
    --out="$OUT/attention_checks.md"
  run checks-layer-norm 90 "$PY" benchmarks/fused_layer_norm_checks.py "${LN_CHECK_ARGS[@]}" \
    --out="$OUT/layer_norm_checks.md"
  run checks-heads 75 "$PY" benchmarks/head_checks.py "${HEAD_CHECK_ARGS[@]}" \
    --out="$OUT/head_checks.md"
  run checks-fp8 75 "$PY" benchmarks/fp8_checks.py "${FP8_CHECK_ARGS[@]}" \
    --out="$OUT/fp8_checks.md"
  # Our Triton attention with its dropout: checks 1-4 through the model's call site, then the
  # kernels against their reference at BERT-base's and BERT-large's shapes, and timed against
  # cuDNN's (several tilings).
  run checks-pallas 120 "$PY" benchmarks/attention_dropout_checks.py --implementation=pallas \
    "${PALLAS_CHECK_ARGS[@]}" --out="$OUT/attention_pallas_checks.md" \
    --fastest_out="$WORK/attention_tilings.json"
fi
# The fastest tiling checks-pallas found for rows of length $1 (nothing if it has not run): the
# steps with our attention are timed with it.
attention_tiling() {
  [[ -f $WORK/attention_tilings.json ]] || return 0
  "$PY" - "$WORK/attention_tilings.json" "$1" <<'EOF2'
import json, sys
fastest = json.load(open(sys.argv[1]))
print(next((f"--attention_tiling={v['tiling']}" for shape, v in fastest.items()
            if shape.split(":")[1] == sys.argv[2]), ""))
EOF2
}
if want a; then
  ours a-ours 170 "$BASE" paper-cudnn,fast-cudnn --profile_dir="$WORK/profile"
  peer a-peer 160 --configs="$BASE" --recipes=paper --modes=eager,compile --mlm=full
fi
if want b; then
  ours b-ours 140 "$LARGE" paper-cudnn --batch="$LARGE=$LARGE_BATCH"
  peer b-peer 200 --configs="$LARGE" --batch="$LARGE=$LARGE_BATCH" --recipes=paper \
    --modes=compile --mlm=full
fi
if want e; then
  # The commands keep cuDNN's kernels out of command buffers (`cudnn_runtime.prepare`, which
  # leaves an explicit --xla_gpu_enable_command_buffer alone): "default" is that setting.
  # sweep label|variant|flags-added|layers|more-args...: one process of ours per setting
  # (layers: accelerator_step.LAYOUTS, unrolled where empty; more args for accelerator_step).
  sweep() {
    local setting name variant extra layers more
    for setting in "$@"; do
      IFS='|' read -r name variant extra layers more <<< "$setting"
      # shellcheck disable=SC2086  # `more` is words of arguments
      XLA_FLAGS="${XLA_FLAGS:-} $extra" ours "e-$name" 110 "$BASE" "$variant" \
        --layers="${layers:-unrolled}" $more
    done
  }
  # The likeliest gains first: the layers' parameters stacked and run unrolled (~450 fewer
  # optimizer and weight-cast kernels of ~1,300), everything that the compiled program says
  # saves together, then each alone: programmatic dependent launch (the gaps between kernels);
  # GEMMs through cuBLASLt with XLA's dot merger off (epilogues take the bias adds; no copies
  # out of merged GEMMs), then the same with GELU's tanh form, which cuBLASLt's epilogue
  # computes inside the first feed-forward GEMM, beside the peer compiled with that GELU; then
  # each other flag alone.
  sweep "default|paper-cudnn||" "stacked|paper-cudnn||stacked" \
    "fusedln|paper-cudnn-fusedln||stacked" \
    "pallas|paper-pallas-fusedln||stacked|$(attention_tiling "$BASE_LENGTH")"
  everything=$(with_fused_sites e-fusedln paper-cudnn-tanh-fusedln paper-cudnn-tanh)
  sweep "everything|$everything|$EPILOGUES $PDL|stacked|--profile_dir=$WORK/profile-e" \
    "pdl|paper-cudnn|$PDL|" \
    "epilogues|paper-cudnn|$EPILOGUES|" "epilogues_tanh|paper-cudnn-tanh|$EPILOGUES|"
  peer e-peer_tanh 120 --configs="$BASE" --recipes=paper --modes=compile --mlm=full \
    --hidden_act=gelu_new
  # The dot merger and command buffers on "fusedln"'s step. On the H200 the merger joined Q's
  # and K's GEMMs, forward and weight gradient, and the cuBLAS GEMMs the autotuner chose then
  # needed a slice copied out and a concatenation in (3.6 GB per BERT-base step); the fused
  # sites' copies now keep those two apart, so this times the pass off elsewhere. Without
  # command buffers, the profile names every kernel (in them, JAX 0.11.2's trace gives the
  # command buffer's name whatever --xla_enable_command_buffers_during_profiling says).
  fused=$(with_fused_sites e-fusedln paper-cudnn-fusedln paper-cudnn)
  sweep "epilogues_tanh_pdl|paper-cudnn-tanh|$EPILOGUES $PDL" \
    "triton_gemm|paper-cudnn|--xla_gpu_enable_triton_gemm=false" \
    "dot_merger|$fused|--xla_disable_hlo_passes=dot-merger|stacked" \
    "command_buffer|$fused|--xla_gpu_enable_command_buffer=|stacked|--profile_dir=$WORK/profile-cb" \
    "cudnn_layer_norm|paper-cudnn|--xla_gpu_enable_cudnn_layer_norm=true"
fi
if want c; then
  # Large's best program first (fused sites), then FP8 with them, then with the epilogues, the
  # tanh GELU and pdl (as (e)'s "everything") beside the peer compiled with the same GELU;
  # then the layouts.
  ours c-large-fusedln 190 "$LARGE" paper-cudnn-fusedln --layers=stacked \
    --batch="$LARGE=$LARGE_BATCH"
  # shellcheck disable=SC2046  # the tiling is one word or none
  ours c-large-pallas 190 "$LARGE" paper-pallas-fusedln --layers=stacked \
    --batch="$LARGE=$LARGE_BATCH" $(attention_tiling "$LARGE_LENGTH")
  fp8=$(with_fused_sites c-large-fusedln paper-cudnn-fp8-fusedln paper-cudnn-fp8)
  ours c-fp8 190 "$LARGE" "$fp8" --layers=stacked --batch="$LARGE=$LARGE_BATCH"
  everything=$(with_fused_sites c-large-fusedln paper-cudnn-tanh-fusedln paper-cudnn-tanh)
  XLA_FLAGS="${XLA_FLAGS:-} $EPILOGUES $PDL" ours c-large-everything 190 "$LARGE" \
    "$everything" --layers=stacked --batch="$LARGE=$LARGE_BATCH"
  peer c-peer_tanh 200 --configs="$LARGE" --batch="$LARGE=$LARGE_BATCH" --recipes=paper \
    --modes=compile --mlm=full --hidden_act=gelu_new
  # At large the stacked layout saves twice the kernels (24 layers): both layouts in one
  # process, so that the pair shares a machine whatever part (b) ran on.
  ours c-large-layouts 210 "$LARGE" paper-cudnn --layers=unrolled,stacked \
    --batch="$LARGE=$LARGE_BATCH"
fi
if want d; then
  ours d-ab 150 "$BASE" paper-cudnn-f32res,paper-cudnn-bits32,paper
  ours d-large-fast 110 "$LARGE" fast-cudnn --batch="$LARGE=$LARGE_BATCH"
fi
if want g; then
  peer g-peer-gathered 160 --configs="$BASE" --recipes=paper --modes=eager,compile --mlm=gathered
fi
if want h; then
  run h-int8 90 "$PY" benchmarks/int8_speed.py --preset="$BASE" --dtype=bfloat16 \
    --out="$WORK/h-int8.md" "${INT8_ARGS[@]}"
fi
if want t; then
  # Fine-tuning's step before (XLA's kernels) and now (cuDNN's attention, the fused sites).
  # With our Triton attention too (any length: SQuAD's 384 included).
  ours t-squad-base 190 "$BASE" paper,paper-cudnn-fusedln,paper-pallas-fusedln --task=squad
  ours t-squad-large 280 "$LARGE" paper,paper-cudnn-fusedln,paper-pallas-fusedln --task=squad
  # GLUE's step also with the layers stacked and run unrolled, as pre-training runs them on a
  # recent GPU: compiled for an H200 without one, that halves the kernels outside the matmuls
  # (777 -> 359 at base) for the same bytes, and GLUE's short step has more kernels than time.
  ours t-glue-base 240 "$BASE" paper,paper-cudnn-fusedln --task=glue --layers=unrolled,stacked
fi
if want f; then
  for batch_file in .bench_batches/*.npz; do
    [[ -e $batch_file ]] || { note "### (f): no .bench_batches/*.npz here"; break; }
    stem=$(basename "$batch_file" .npz)
    case $stem in 512*) config=$LARGE ;; *) config=$BASE ;; esac
    # Today's default program and the same with our attention, which takes packed rows'
    # segment ids as they are (cuDNN's reads them as a (batch, 1, length, length) bias).
    ours "f-ours-$stem" 180 "$config" paper-cudnn-fusedln,paper-pallas-fusedln --layers=stacked \
      --batch_file="$batch_file"
    peer "f-peer-$stem" 150 --configs="$config" --recipes=paper --modes=compile --mlm=full \
      --batch_file="$batch_file"
  done
fi

collect
note "### done at $(elapsed)s"
cat "$OUT/summary.md"
