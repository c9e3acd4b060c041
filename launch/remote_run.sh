#!/usr/bin/env bash
# Runs on every worker of a TPU VM slice, started by tpu_pretrain.sh / tpu_finetune.sh through
# `gcloud compute tpus tpu-vm ssh --worker=all`. It owns one training job per worker: the job's
# output goes to ~/bert_jax_runs/JOB.log (appended, so the history of restarts after preemption
# stays in one file) and its pid to ~/bert_jax_runs/JOB.pid, which is what --logs, --status and
# --kill use later, from another SSH connection.
#
#   remote_run.sh --job=pretrain [--detach] [--stream_worker=0|all] [--copy_log_to=gs://...] \
#       [--python=python3] -- python3 -m bert_jax.pretrain ...
#   remote_run.sh --job=pretrain --logs [--lines=N] | --status | --kill
#
# The job always runs under nohup, so a dropped SSH connection does not stop it: on a pod slice
# that would leave the other workers' processes waiting for it. Without --detach this script
# streams the log (worker 0 only, unless --stream_worker=all, so that 8 workers do not interleave
# the same lines) until the job ends, and exits with its status; with --detach it starts itself
# in a session of its own and returns at once. --kill sends SIGTERM, on which the trainers save a
# checkpoint and exit.
set -euo pipefail

readonly PROG=remote_run.sh
RUNS_DIR=${BERT_JAX_RUNS_DIR:-$HOME/bert_jax_runs}
HOST=$(hostname)

die() {
  printf '%s: %s\n' "$HOST" "$*" >&2
  exit 1
}

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p;}' "$0"
}

job=""
action="run"
detach=0
background_child=0
stream_worker=0
copy_log_to=""
python=python3
lines=100
while (($#)); do
  case $1 in
    --job=*) job=${1#*=} ;;
    --detach) detach=1 ;;
    --background_child) background_child=1 ;;
    --stream_worker=*) stream_worker=${1#*=} ;;
    --copy_log_to=*) copy_log_to=${1#*=} ;;
    --python=*) python=${1#*=} ;;
    --lines=*) lines=${1#*=} ;;
    --logs) action="logs" ;;
    --status) action="status" ;;
    --kill) action="kill" ;;
    -h | --help)
      usage
      exit 0
      ;;
    --)
      shift
      break
      ;;
    *) die "$PROG: unknown argument '$1'" ;;
  esac
  shift
done
[[ $job =~ ^[A-Za-z0-9_.-]+$ ]] || die "$PROG: --job=NAME is required (letters, digits, _ . -)"
[[ $lines =~ ^[0-9]+$ ]] || die "$PROG: --lines must be a number, not '$lines'"

LOG=$RUNS_DIR/$job.log
PIDFILE=$RUNS_DIR/$job.pid

# This worker's index in the slice: GKE-style environment first, then the TPU VM metadata server.
worker_id() {
  if [[ -n ${TPU_WORKER_ID:-} ]]; then
    printf '%s' "$TPU_WORKER_ID"
    return
  fi
  curl -fsS -m 5 -H 'Metadata-Flavor: Google' \
    http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number \
    2>/dev/null || printf '?'
}

# Prints the pid of the job if it is still running; fails otherwise.
running_pid() {
  local pid
  [[ -f $PIDFILE ]] || return 1
  pid=$(<"$PIDFILE")
  if [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
    printf '%s' "$pid"
  else
    return 1
  fi
}

copy_log() {
  # The workdir outlives the slice; a copy of the log there is what is left to read after the
  # slice is deleted. Best effort: a failed copy must not turn a finished run into a failure.
  [[ -n $copy_log_to ]] || return 0
  if ! "$python" - "$LOG" "$copy_log_to" "$HOST-$job.log" <<'EOF'; then
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
log, directory, name = sys.argv[1:]
tf.io.gfile.makedirs(directory)
tf.io.gfile.copy(log, directory.rstrip("/") + "/" + name, overwrite=True)
EOF
    printf '%s: could not copy %s to %s\n' "$HOST" "$LOG" "$copy_log_to" >&2
  fi
}

run_job() {
  (($#)) || die "$PROG: nothing to run (the command goes after --)"
  mkdir -p "$RUNS_DIR"
  local pid
  if pid=$(running_pid); then
    die "$job is already running here (pid $pid): follow it with --logs or end it with --kill"
  fi
  if ((detach)); then
    local args=(--job="$job" --background_child --copy_log_to="$copy_log_to" --python="$python")
    nohup setsid bash "$0" "${args[@]}" -- "$@" </dev/null >/dev/null 2>&1 &
    # The pid file is written by the child; wait for it so that --status right after works.
    local waited=0
    until running_pid >/dev/null || ((waited >= 20)); do
      sleep 0.5
      waited=$((waited + 1))
    done
    printf '%s: started %s in the background; log: %s\n' "$HOST" "$job" "$LOG"
    return 0
  fi

  local worker offset=0 follower="" rc=0
  worker=$(worker_id)
  if [[ -f $LOG ]]; then
    offset=$(wc -c <"$LOG")
  fi
  printf '==> %s %s (worker %s): %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$HOST" "$worker" \
    "$(printf '%q ' "$@")" >>"$LOG"
  PYTHONUNBUFFERED=1 nohup "$@" >>"$LOG" 2>&1 </dev/null &
  pid=$!
  printf '%s\n' "$pid" >"$PIDFILE"
  # Stopping this script on purpose (Ctrl-C in a terminal on the worker) stops the job the way
  # --kill does.
  trap 'kill -TERM "$pid" 2>/dev/null || true' INT TERM

  if ((!background_child)); then
    if [[ $stream_worker == all || $stream_worker == "$worker" || $worker == "?" ]]; then
      tail -c "+$((offset + 1))" -f --pid="$pid" "$LOG" &
      follower=$!
    else
      printf '%s (worker %s): %s started; its log is %s\n' "$HOST" "$worker" "$job" "$LOG"
    fi
  fi
  # `wait` returns early when a trapped signal arrives; keep waiting for the job's own status.
  while :; do
    rc=0
    wait "$pid" || rc=$?
    kill -0 "$pid" 2>/dev/null || break
  done
  trap - INT TERM
  if [[ -n $follower ]]; then
    wait "$follower" || true
  fi
  rm -f "$PIDFILE"
  printf '==> %s %s: %s exited with status %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$HOST" "$job" \
    "$rc" >>"$LOG"
  copy_log
  if ((rc != 0)); then
    printf '%s (worker %s): %s failed with status %s; log: %s\n' "$HOST" "$worker" "$job" "$rc" \
      "$LOG" >&2
  fi
  return "$rc"
}

show_logs() {
  [[ -f $LOG ]] || die "no log yet: $LOG"
  local pid
  if pid=$(running_pid); then
    tail -n "$lines" -f --pid="$pid" "$LOG"
  else
    tail -n "$lines" "$LOG"
    printf '%s: %s is not running\n' "$HOST" "$job"
  fi
}

show_status() {
  local pid
  if pid=$(running_pid); then
    printf '%s: %s running (pid %s, for %s)\n' "$HOST" "$job" "$pid" \
      "$(ps -o etime= -p "$pid" | tr -d ' ')"
  else
    printf '%s: %s not running\n' "$HOST" "$job"
  fi
  if [[ -f $LOG ]]; then
    tail -n 3 "$LOG" | sed "s/^/$HOST|  /"
  fi
}

kill_job() {
  local pid waited=0
  if ! pid=$(running_pid); then
    printf '%s: %s is not running\n' "$HOST" "$job"
    return 0
  fi
  # SIGTERM, not SIGKILL: the trainers save a checkpoint before they exit.
  kill -TERM "$pid"
  printf '%s: sent SIGTERM to %s (pid %s); it saves a checkpoint and exits\n' "$HOST" "$job" "$pid"
  while kill -0 "$pid" 2>/dev/null && ((waited < 300)); do
    sleep 1
    waited=$((waited + 1))
  done
  if kill -0 "$pid" 2>/dev/null; then
    printf '%s: %s is still saving after %ss; check again with --status\n' "$HOST" "$job" "$waited"
  else
    printf '%s: %s has exited\n' "$HOST" "$job"
  fi
}

case $action in
  run) run_job "$@" ;;
  logs) show_logs ;;
  status) show_status ;;
  kill) kill_job ;;
esac
