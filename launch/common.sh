# shellcheck shell=bash
# Sourced by tpu_pretrain.sh and tpu_finetune.sh; not a program of its own.
#
# What the two launchers share: flag parsing, the life cycle of the TPU VM slice (create it, or
# reuse it, or recreate it after a preemption, directly or through a queued resource), copying
# the code to every worker and installing it with jax[tpu], the pre-flight check of the data and
# the workdir on every worker, starting the trainer through remote_run.sh, the --status / --logs
# / --kill / --stop / --delete actions, and --dry_run, which prints every command instead of
# running it.
#
# Each launcher sets JOB, SCRIPT_VALUE_FLAGS and SCRIPT_BOOL_FLAGS, defines usage,
# validate_script (which sets OUTPUT_DIR and the arrays PREFLIGHT_ARGS and TRAINER_ARGS), and
# then calls launcher_main "$@".
#
# The launchers run on users' own machines, macOS included, whose /bin/bash is 3.2: hence no
# associative arrays, and empty arrays expanded as ${a[@]+"${a[@]}"}, which `set -u` accepts
# there.

readonly LIBTPU_RELEASES=https://storage.googleapis.com/jax-releases/libtpu_releases.html
readonly SRC_TARBALL=bert_jax-src.tar.gz  # the source tarball, in each worker's home directory
readonly RUNS_DIR=bert_jax_runs           # remote_run.sh's logs and pid files, under $HOME

LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$LAUNCH_DIR/.." && pwd)
PROG=$(basename "$0")

COMMON_VALUE_FLAGS="tpu zone project accelerator version service_account queued_resource
  valid_until poll_seconds repo ref remote_dir python jax_version log_worker"
COMMON_BOOL_FLAGS="spot preemptible reserved queued reuse skip_install detach dry_run
  status logs kill stop delete help"
ACTIONS="status logs kill stop delete"

# Every flag is OPT_<name>; these are the defaults.
OPT_tpu="" OPT_zone="" OPT_project="" OPT_accelerator="" OPT_version="" OPT_service_account=""
OPT_queued_resource="" OPT_valid_until="" OPT_poll_seconds=30 OPT_repo="" OPT_ref=""
OPT_remote_dir=bert_jax OPT_python=python3 OPT_jax_version="" OPT_log_worker=0
OPT_spot=0 OPT_preemptible=0 OPT_reserved=0 OPT_queued=0 OPT_reuse=0 OPT_skip_install=0
OPT_detach=0 OPT_dry_run=0 OPT_help=0
# shellcheck disable=SC2034  # read indirectly, as OPT_$action
OPT_status=0 OPT_logs=0 OPT_kill=0 OPT_stop=0 OPT_delete=0
PASSTHROUGH=()
COMPILE_CHECK_ARGS=()

# The part of --help that both launchers share.
common_usage() {
  cat <<EOF
The TPU slice:
  --tpu=NAME              TPU VM name (required)
  --zone=ZONE             e.g. us-central1-a, us-central2-b (required)
  --project=PROJECT       default: gcloud's configured project
  --accelerator=TYPE      v3-8, v3-16, v4-8, v4-64, v5litepod-16, v5p-32, v6e-8, ...
                          (required to launch; the counts are TensorCores for v2/v3/v4/v5p,
                          chips for v5litepod/v6e)
  --version=RUNTIME       TPU software version; default per generation: tpu-ubuntu2204-base
                          (v2, v3, v4), v2-alpha-tpuv5-lite (v5litepod), v2-alpha-tpuv5 (v5p),
                          v2-alpha-tpuv6e (v6e)
  --spot | --preemptible  cheaper capacity that can be reclaimed; re-running the same command
                          recreates a preempted slice and the run resumes from its checkpoint
  --reserved              use the project's reservation
  --service_account=SA    the VMs' service account (default: Compute Engine's default one)
  --queued                create the slice through a queued resource and wait until it is
                          ACTIVE (gcloud compute tpus queued-resources create ... --node-id)
  --queued_resource=ID    the queued resource's name (default: the TPU name); implies --queued
  --valid_until=DURATION  give up waiting after this long, e.g. 6h (queued resources only)
  --poll_seconds=N        how often to poll while waiting (default 30)
  --reuse                 only use an existing slice, never create one

The code on the workers (default: this checkout, as a tarball of git's tracked files including
uncommitted changes to them, copied with tpu-vm scp):
  --repo=URL [--ref=REF]  git clone URL on every worker instead, and check out REF
  --remote_dir=DIR        where the code goes on the workers (default: bert_jax, in home)
  --python=PYTHON         the workers' Python (default: python3)
  --jax_version=X.Y.Z     install jax[tpu]==X.Y.Z instead of the newest jax[tpu]
  --skip_install          the code and packages are already on the workers

The run:
  --detach                start the run on every worker and return at once; without it,
                          the output is streamed until the run ends. Either way the run goes on
                          under nohup: Ctrl-C or a dropped connection stops only the streaming,
                          and --kill stops the run
  --log_worker=N|all      whose output to stream and show with --logs (default: worker 0)
  --dry_run               print each command, prefixed with '+ ', instead of running it; the
                          slice is taken not to exist unless --reuse is given (or
                          BERT_JAX_DRY_RUN_TPU_STATE / BERT_JAX_DRY_RUN_QR_STATE name a state)

Actions on an existing slice (instead of launching; they need --tpu and --zone):
  --status                the slice's state and whether the run is going on each worker
  --logs                  the run's log on --log_worker (followed while the run goes on)
  --kill                  stop the run on every worker (SIGTERM: it saves a checkpoint first)
  --stop                  stop the slice's VMs (gcloud compute tpus tpu-vm stop)
  --delete                delete the slice (and its queued resource with --queued)
EOF
}

die() {
  printf '%s: error: %s\n' "$PROG" "$*" >&2
  exit 1
}

# Mistakes on the command line: exit status 2, like the trainers' flag errors.
usage_error() {
  printf '%s: error: %s\nRun %s --help for the flags.\n' "$PROG" "$*" "$PROG" >&2
  exit 2
}

info() {
  printf '%s: %s\n' "$PROG" "$*" >&2
}

# One argument, quoted for bash (what the workers' login shell is).
q() {
  printf '%q' "$1"
}

# The arguments as one line of shell words that reproduce them exactly.
shell_join() {
  (($#)) || return 0
  local out
  printf -v out '%q ' "$@"
  printf '%s' "${out% }"
}

# Runs a command, or with --dry_run prints it (on stdout, so that it can be piped or checked).
# Real runs print it too, on stderr, so that the log of a launch shows what was done.
run() {
  if ((OPT_dry_run)); then
    printf '+ %s\n' "$(shell_join "$@")"
    return 0
  fi
  printf '+ %s\n' "$(shell_join "$@")" >&2
  "$@"
}

# A read-only gcloud query: sets QUERY_OUT and QUERY_ERR and returns gcloud's status. In a dry run
# the command is printed and $1 stands for its output (empty: the resource does not exist).
gcloud_query() {
  local dry_output=$1 err_file rc=0
  shift
  if ((OPT_dry_run)); then
    printf '+ %s\n' "$(shell_join gcloud "$@")"
    QUERY_OUT=$dry_output
    QUERY_ERR="NOT_FOUND (dry run)"
    [[ -n $dry_output ]]
    return
  fi
  err_file=$(mktemp)
  QUERY_OUT=$(gcloud "$@" 2>"$err_file") || rc=$?
  QUERY_ERR=$(<"$err_file")
  rm -f "$err_file"
  return "$rc"
}

is_one_of() {
  local word
  for word in $2; do
    [[ $1 == "$word" ]] && return 0
  done
  return 1
}

parse_flags() {
  local value_flags="$COMMON_VALUE_FLAGS $SCRIPT_VALUE_FLAGS"
  local bool_flags="$COMMON_BOOL_FLAGS $SCRIPT_BOOL_FLAGS"
  local arg flag name value has_value
  while (($#)); do
    arg=$1
    shift
    case $arg in
      --)
        PASSTHROUGH=("$@")
        break
        ;;
      -h) flag=--help has_value=0 ;;
      --*=*) flag=${arg%%=*} value=${arg#*=} has_value=1 ;;
      --*) flag=$arg value="" has_value=0 ;;
      *) usage_error "unexpected argument '$arg' (flags for the trainer go after --)" ;;
    esac
    name=${flag#--}
    name=${name//-/_}  # --queued-resource works like --queued_resource, as in gcloud
    if is_one_of "$name" "$value_flags"; then
      if ((!has_value)); then
        if (($# == 0)) || [[ $1 == --* ]]; then
          usage_error "$flag needs a value ($flag=VALUE)"
        fi
        value=$1
        shift
      fi
      printf -v "OPT_$name" '%s' "$value"
    elif is_one_of "$name" "$bool_flags"; then
      ((!has_value)) || usage_error "$flag takes no value"
      printf -v "OPT_$name" '%s' 1
    else
      usage_error "unknown flag $flag"
    fi
  done
}

# Sets ACC_GEN, ACC_COUNT, CHIPS, DEVICES (JAX devices), HOSTS (workers) and DEFAULT_VERSION from
# an accelerator type. v2/v3/v4/v5p types count TensorCores: v2/v3 have two per chip and JAX sees
# each core; v4/v5p fuse a chip's two cores into one device (megacore). v5litepod/v6e types count
# chips. A v2-v5p worker holds 4 chips; v5litepod/v6e slices of up to 8 chips are one worker and
# larger ones have 4 chips per worker.
accelerator_info() {
  local re='^(v2|v3|v4|v5p|v5litepod|v6e)-([0-9]+)$'
  if [[ $1 =~ ^v5e-([0-9]+)$ ]]; then
    usage_error "--accelerator=$1: v5e slices are called v5litepod-N \
(e.g. v5litepod-${BASH_REMATCH[1]})"
  fi
  [[ $1 =~ $re ]] || usage_error "--accelerator=$1 is not a TPU type such as v3-8, v4-64, \
v5litepod-16, v5p-32 or v6e-8"
  ACC_GEN=${BASH_REMATCH[1]}
  ACC_COUNT=$((10#${BASH_REMATCH[2]}))
  case $ACC_GEN in
    v2 | v3 | v4 | v5p)
      if ((ACC_COUNT < 8 || ACC_COUNT % 8)); then
        usage_error "--accelerator=$1: $ACC_GEN slices come in multiples of 8 TensorCores"
      fi
      CHIPS=$((ACC_COUNT / 2))
      HOSTS=$((ACC_COUNT / 8))
      if [[ $ACC_GEN == v2 || $ACC_GEN == v3 ]]; then
        DEVICES=$ACC_COUNT
      else
        DEVICES=$CHIPS
      fi
      ;;
    v5litepod | v6e)
      ((ACC_COUNT >= 1)) || usage_error "--accelerator=$1 has no chips"
      CHIPS=$ACC_COUNT
      DEVICES=$ACC_COUNT
      if ((ACC_COUNT <= 8)); then
        HOSTS=1
      else
        HOSTS=$((ACC_COUNT / 4))
      fi
      ;;
  esac
  case $ACC_GEN in
    v2 | v3 | v4) DEFAULT_VERSION=tpu-ubuntu2204-base ;;
    v5litepod) DEFAULT_VERSION=v2-alpha-tpuv5-lite ;;
    v5p) DEFAULT_VERSION=v2-alpha-tpuv5 ;;
    v6e) DEFAULT_VERSION=v2-alpha-tpuv6e ;;
  esac
}

# The value of a trainer flag among the pass-through arguments (--name=value or --name value,
# with one or two dashes, as absl accepts them); fails when it is absent. The last one wins.
passthrough_value() {
  local i arg found=1 result=""
  local n=${#PASSTHROUGH[@]}
  for ((i = 0; i < n; i++)); do
    arg=${PASSTHROUGH[i]}
    case $arg in
      --"$1"=* | -"$1"=*)
        result=${arg#*=}
        found=0
        ;;
      --"$1" | -"$1")
        if ((i + 1 < n)); then
          result=${PASSTHROUGH[i + 1]}
          found=0
        fi
        ;;
    esac
  done
  printf '%s' "$result"
  return "$found"
}

# Whether the pass-through arguments set a trainer flag at all (booleans included).
passthrough_has() {
  local arg
  for arg in ${PASSTHROUGH[@]+"${PASSTHROUGH[@]}"}; do
    case $arg in
      --"$1" | -"$1" | --"$1"=* | -"$1"=*) return 0 ;;
    esac
  done
  return 1
}

# A path every worker writes must be in a bucket on a multi-host slice: the workers share no disk.
require_shared_path() {
  local flag=$1 path=$2
  if [[ $path == gs://* ]]; then
    return 0
  fi
  if ((HOSTS > 1)); then
    usage_error "$flag=$path: a $OPT_accelerator slice has $HOSTS workers, which share no disk; \
use a gs:// path"
  fi
  info "note: $flag=$path is on the VM's own disk and goes when the slice is deleted"
}

validate_common() {
  local action option count=0
  for action in $ACTIONS; do
    option=OPT_$action
    if ((${!option})); then
      ACTION=$action
      count=$((count + 1))
    fi
  done
  ((count <= 1)) || usage_error "--status, --logs, --kill, --stop and --delete are one at a time"
  ((count == 1)) || ACTION=launch

  [[ -n $OPT_tpu ]] || usage_error "--tpu=NAME is required"
  [[ $OPT_tpu =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] ||
    usage_error "--tpu=$OPT_tpu: TPU names are lower-case letters, digits and '-', starting \
with a letter"
  [[ -n $OPT_zone ]] || usage_error "--zone=ZONE is required (e.g. --zone=us-central2-b)"
  if [[ -n $OPT_queued_resource ]]; then
    OPT_queued=1
  fi
  QR=${OPT_queued_resource:-$OPT_tpu}
  if ((OPT_spot && OPT_preemptible)); then
    usage_error "--spot and --preemptible exclude each other"
  fi
  if ((OPT_queued && OPT_preemptible)); then
    usage_error "--preemptible is not available for queued resources; use --spot"
  fi
  if [[ -n $OPT_valid_until ]] && ((!OPT_queued)); then
    usage_error "--valid_until needs --queued"
  fi
  [[ $OPT_poll_seconds =~ ^[1-9][0-9]*$ ]] ||
    usage_error "--poll_seconds=$OPT_poll_seconds is not a positive number"
  [[ $OPT_log_worker == all || $OPT_log_worker =~ ^[0-9]+$ ]] ||
    usage_error "--log_worker=$OPT_log_worker: a worker number or 'all'"
  [[ -z $OPT_ref || -n $OPT_repo ]] || usage_error "--ref needs --repo"
  # The code directory is replaced on every install, so it must not be home or anything above.
  if [[ ! $OPT_remote_dir =~ ^[A-Za-z0-9_][A-Za-z0-9_./-]*$ || /$OPT_remote_dir/ == */../* ||
    /$OPT_remote_dir/ == */./* ]]; then
    usage_error "--remote_dir=$OPT_remote_dir: a directory under the workers' home, like bert_jax"
  fi

  LOCATION=(--zone="$OPT_zone")
  if [[ -n $OPT_project ]]; then
    LOCATION+=(--project="$OPT_project")
  fi
  REMOTE_DIR_Q=$(q "$OPT_remote_dir")
  PYTHON_Q=$(q "$OPT_python")

  [[ $ACTION == launch ]] || return 0
  [[ -n $OPT_accelerator ]] ||
    usage_error "--accelerator=TYPE is required (e.g. --accelerator=v3-16)"
  accelerator_info "$OPT_accelerator"
  VERSION=${OPT_version:-$DEFAULT_VERSION}
}

# The command line that reaches this slice again, for the hints printed after a launch.
self_command() {
  local args=("$0" --tpu="$OPT_tpu" --zone="$OPT_zone")
  if [[ -n $OPT_project ]]; then
    args+=(--project="$OPT_project")
  fi
  if ((OPT_queued)); then
    args+=(--queued_resource="$QR")
  fi
  shell_join "${args[@]}" "$@"
}

tpu_ssh() {
  local worker=$1 command=$2
  run gcloud compute tpus tpu-vm ssh "$OPT_tpu" "${LOCATION[@]}" --worker="$worker" \
    --command="$command"
}

# --- the slice -------------------------------------------------------------------------------

# Sets TPU_STATE (empty if there is no such TPU) and TPU_ACCEL.
tpu_state() {
  local dry=${BERT_JAX_DRY_RUN_TPU_STATE:-}
  if [[ -z $dry ]] && ((OPT_reuse)); then
    dry=READY
  fi
  if [[ -n $dry ]]; then
    dry="$dry $OPT_accelerator"
  fi
  if gcloud_query "$dry" compute tpus tpu-vm describe "$OPT_tpu" "${LOCATION[@]}" \
    --format='value(state,acceleratorType)'; then
    read -r TPU_STATE TPU_ACCEL <<<"$QUERY_OUT"
  elif [[ $QUERY_ERR == *NOT_FOUND* || $QUERY_ERR == *"not found"* ]]; then
    TPU_STATE="" TPU_ACCEL=""
  else
    die "cannot look up TPU $OPT_tpu: $QUERY_ERR"
  fi
}

# Sets QR_STATE (empty if there is no such queued resource).
qr_state() {
  local dry=${BERT_JAX_DRY_RUN_QR_STATE:-}
  if [[ -z $dry ]] && ((OPT_reuse)); then
    dry=ACTIVE
  fi
  if gcloud_query "$dry" compute tpus queued-resources describe "$QR" "${LOCATION[@]}" \
    --format='value(state.state)'; then
    QR_STATE=$QUERY_OUT
  elif [[ $QUERY_ERR == *NOT_FOUND* || $QUERY_ERR == *"not found"* ]]; then
    QR_STATE=""
  else
    die "cannot look up queued resource $QR: $QUERY_ERR"
  fi
}

create_tpu() {
  local args=(--accelerator-type="$OPT_accelerator" --version="$VERSION")
  if ((OPT_spot)); then
    args+=(--spot)
  fi
  if ((OPT_preemptible)); then
    args+=(--preemptible)
  fi
  if ((OPT_reserved)); then
    args+=(--reserved)
  fi
  if [[ -n $OPT_service_account ]]; then
    args+=(--service-account="$OPT_service_account")
  fi
  run gcloud compute tpus tpu-vm create "$OPT_tpu" "${LOCATION[@]}" "${args[@]}" ||
    die "creating $OPT_tpu failed (see above). Without capacity in $OPT_zone, --queued waits \
for it; or try another zone."
}

create_queued_resource() {
  local args=(--node-id="$OPT_tpu" --accelerator-type="$OPT_accelerator"
    --runtime-version="$VERSION")
  if ((OPT_spot)); then
    args+=(--spot)
  fi
  if ((OPT_reserved)); then
    args+=(--reserved)
  fi
  if [[ -n $OPT_valid_until ]]; then
    args+=(--valid-until-duration="$OPT_valid_until")
  fi
  if [[ -n $OPT_service_account ]]; then
    args+=(--service-account="$OPT_service_account")
  fi
  run gcloud compute tpus queued-resources create "$QR" "${LOCATION[@]}" "${args[@]}" ||
    die "creating queued resource $QR failed (see above)"
}

delete_tpu() {
  run gcloud compute tpus tpu-vm delete "$OPT_tpu" "${LOCATION[@]}" --quiet ||
    die "deleting $OPT_tpu failed (see above)"
}

delete_queued_resource() {
  # --force deletes the TPU the request holds along with the request.
  run gcloud compute tpus queued-resources delete "$QR" "${LOCATION[@]}" --force --quiet ||
    die "deleting queued resource $QR failed (see above)"
}

wait_queued_resource_active() {
  local last=""
  info "waiting for queued resource $QR to become ACTIVE (polling every ${OPT_poll_seconds}s)"
  while :; do
    if ((OPT_dry_run)); then
      gcloud_query ACTIVE compute tpus queued-resources describe "$QR" "${LOCATION[@]}" \
        --format='value(state.state)' || true
      return 0
    fi
    qr_state
    if [[ $QR_STATE != "$last" ]]; then
      info "queued resource $QR: ${QR_STATE:-gone}"
      last=$QR_STATE
    fi
    case $QR_STATE in
      ACTIVE) return 0 ;;
      ACCEPTED | WAITING_FOR_RESOURCES | PROVISIONING | CREATING) sleep "$OPT_poll_seconds" ;;
      *) die "queued resource $QR is ${QR_STATE:-gone}: gcloud compute tpus queued-resources \
describe $QR ${LOCATION[*]}" ;;
    esac
  done
}

wait_tpu_ready() {
  local last=""
  while :; do
    if ((OPT_dry_run)); then
      return 0
    fi
    tpu_state
    if [[ $TPU_STATE != "$last" ]]; then
      info "TPU $OPT_tpu: ${TPU_STATE:-gone}"
      last=$TPU_STATE
    fi
    case $TPU_STATE in
      READY) return 0 ;;
      CREATING | STARTING | RESTARTING | REPAIRING) sleep "$OPT_poll_seconds" ;;
      *) die "TPU $OPT_tpu is ${TPU_STATE:-gone} instead of READY" ;;
    esac
  done
}

ensure_slice_with_queued_resource() {
  qr_state
  case $QR_STATE in
    ACTIVE)
      info "reusing queued resource $QR (ACTIVE)"
      return 0
      ;;
    "")
      ((!OPT_reuse)) || die "--reuse: there is no queued resource $QR in $OPT_zone"
      create_queued_resource
      ;;
    ACCEPTED | WAITING_FOR_RESOURCES | PROVISIONING | CREATING)
      info "queued resource $QR already exists ($QR_STATE)"
      ;;
    SUSPENDING | SUSPENDED | FAILED)
      ((!OPT_reuse)) || die "queued resource $QR is $QR_STATE; run again without --reuse to \
replace it"
      info "queued resource $QR is $QR_STATE (preempted or failed): replacing it; the run \
resumes from its workdir"
      delete_queued_resource
      create_queued_resource
      ;;
    *) die "queued resource $QR is $QR_STATE; try again when that is over" ;;
  esac
  wait_queued_resource_active
}

ensure_slice() {
  info "$OPT_accelerator: $CHIPS chips, $DEVICES JAX devices, $HOSTS worker(s); runtime $VERSION"
  if ((OPT_queued)); then
    ensure_slice_with_queued_resource
    return
  fi
  tpu_state
  case $TPU_STATE in
    READY)
      if [[ -n $TPU_ACCEL && $TPU_ACCEL != "$OPT_accelerator" ]]; then
        die "TPU $OPT_tpu exists as $TPU_ACCEL, not $OPT_accelerator: delete it (--delete) or \
choose another --tpu"
      fi
      info "reusing TPU $OPT_tpu (READY)"
      ;;
    "")
      ((!OPT_reuse)) || die "--reuse: there is no TPU $OPT_tpu in $OPT_zone"
      create_tpu
      ;;
    PREEMPTED | TERMINATED)
      ((!OPT_reuse)) || die "TPU $OPT_tpu is $TPU_STATE; run again without --reuse to recreate it"
      info "TPU $OPT_tpu is $TPU_STATE: deleting and creating it again; the run resumes from \
its workdir"
      delete_tpu
      create_tpu
      ;;
    STOPPED)
      run gcloud compute tpus tpu-vm start "$OPT_tpu" "${LOCATION[@]}" ||
        die "starting $OPT_tpu failed (see above)"
      ;;
    CREATING | STARTING | RESTARTING | REPAIRING)
      wait_tpu_ready
      ;;
    *) die "TPU $OPT_tpu is $TPU_STATE; try again when that is over, or --delete it" ;;
  esac
}

# --- the code ----------------------------------------------------------------------------------

install_code() {
  local fetch pip_spec="jax[tpu]" guard
  # Replacing the code under a run that is still going would break it (and the new run could not
  # have the TPU anyway): refuse while any job's pid is alive.
  guard="for f in $RUNS_DIR/*.pid; do if [ -e \"\$f\" ] && kill -0 \"\$(cat \"\$f\")\" \
2>/dev/null; then echo \"\$(hostname): a run is still going (\$f): follow it with --logs or end \
it with --kill\" >&2; exit 3; fi; done"
  if [[ -n $OPT_repo ]]; then
    fetch="git clone --quiet $(q "$OPT_repo") $REMOTE_DIR_Q"
    if [[ -n $OPT_ref ]]; then
      fetch+=" && git -C $REMOTE_DIR_Q checkout --quiet $(q "$OPT_ref")"
    fi
  else
    ship_local_source
    fetch="mkdir -p $REMOTE_DIR_Q && tar -xzf $SRC_TARBALL -C $REMOTE_DIR_Q && rm -f $SRC_TARBALL"
  fi
  if [[ -n $OPT_jax_version ]]; then
    pip_spec="jax[tpu]==$OPT_jax_version"
  fi
  tpu_ssh all "$guard; rm -rf $REMOTE_DIR_Q && $fetch && cd $REMOTE_DIR_Q && $PYTHON_Q -m pip \
install $(q "$pip_spec") . -f $LIBTPU_RELEASES" ||
    die "installing on the workers failed (see above)"
}

# git archive of the checkout's tracked files; `git stash create` adds uncommitted changes to
# them without touching the working tree or the stash.
ship_local_source() {
  local treeish=HEAD tmp tarball
  if ((OPT_dry_run)); then
    tarball=${TMPDIR:-/tmp}/bert_jax-src.XXXXXX/$SRC_TARBALL
  else
    git -C "$REPO_ROOT" rev-parse --git-dir >/dev/null 2>&1 ||
      die "$REPO_ROOT is not a git checkout: use --repo=URL to clone the code on the workers"
    treeish=$(git -C "$REPO_ROOT" stash create)
    if [[ -n $treeish ]]; then
      info "including uncommitted changes to tracked files (untracked files are not copied)"
    else
      treeish=HEAD
    fi
    tmp=$(mktemp -d)
    # shellcheck disable=SC2064  # expand now: $tmp is local and gone by the time of EXIT
    trap "rm -rf $(q "$tmp")" EXIT
    tarball=$tmp/$SRC_TARBALL
  fi
  run git -C "$REPO_ROOT" archive --format=tar.gz --output="$tarball" "$treeish" ||
    die "git archive failed"
  run gcloud compute tpus tpu-vm scp "$tarball" "$OPT_tpu:$SRC_TARBALL" "${LOCATION[@]}" \
    --worker=all || die "copying the code to the workers failed (see above)"
}

# The step compiled for the slice on this machine, before the slice exists (scripts that set
# COMPILE_CHECK_ARGS: the trainer's flags). Needs the checkout's environment with libtpu.
compile_check() {
  ((${#COMPILE_CHECK_ARGS[@]})) || return 0
  local python=${LOCAL_PYTHON:-}
  if [[ -z $python ]]; then
    python=python3
    if [[ -x $REPO_ROOT/.venv/bin/python ]]; then
      python=$REPO_ROOT/.venv/bin/python
    fi
  fi
  info "compiling the step for $OPT_accelerator on this machine (--skip_compile_check skips)"
  run "$python" "$REPO_ROOT/launch/preflight.py" --compile_for="$OPT_accelerator" -- \
    "${COMPILE_CHECK_ARGS[@]}" ||
    die "the step does not fit or build for $OPT_accelerator (see above); no slice was \
created. The check runs in this checkout's environment (make env, or LOCAL_PYTHON=...); \
--skip_compile_check goes ahead without it"
}

preflight() {
  local checks
  checks=$(shell_join "${PREFLIGHT_ARGS[@]}")
  tpu_ssh all "cd $REMOTE_DIR_Q && $PYTHON_Q launch/preflight.py $checks" ||
    die "the pre-flight check failed on at least one worker (see above); nothing was started"
}

start_run() {
  local args=(--job="$JOB" --python="$OPT_python" --stream_worker="$OPT_log_worker"
    --copy_log_to="${OUTPUT_DIR%/}/logs")
  if ((OPT_detach)); then
    args+=(--detach)
  fi
  tpu_ssh all "cd $REMOTE_DIR_Q && bash launch/remote_run.sh $(shell_join "${args[@]}") -- \
$(shell_join "$OPT_python" -m "${TRAINER_ARGS[@]}")" || {
    info "the run failed or was interrupted on at least one worker; its log: \
$(self_command --logs)"
    exit 1
  }
}

# --- actions -----------------------------------------------------------------------------------

remote_run_action() {
  local worker=$1
  shift
  tpu_ssh "$worker" "bash $REMOTE_DIR_Q/launch/remote_run.sh --job=$JOB $*"
}

do_action() {
  case $1 in
    status)
      if ((OPT_queued)); then
        run gcloud compute tpus queued-resources describe "$QR" "${LOCATION[@]}" || true
      fi
      run gcloud compute tpus tpu-vm describe "$OPT_tpu" "${LOCATION[@]}" \
        --format='yaml(name,state,health,acceleratorType,runtimeVersion,schedulingConfig)' ||
        die "no TPU $OPT_tpu in $OPT_zone"
      remote_run_action all --status
      ;;
    logs) remote_run_action "$OPT_log_worker" --logs ;;
    kill) remote_run_action all --kill ;;
    stop) run gcloud compute tpus tpu-vm stop "$OPT_tpu" "${LOCATION[@]}" ;;
    delete)
      if ((OPT_queued)); then
        delete_queued_resource
      else
        delete_tpu
      fi
      ;;
  esac
}

launcher_main() {
  parse_flags "$@"
  if ((OPT_help)); then
    usage
    exit 0
  fi
  validate_common
  if [[ $ACTION != launch ]]; then
    if ((${#PASSTHROUGH[@]})); then
      usage_error "--$ACTION takes no trainer flags after --"
    fi
    do_action "$ACTION"
    return
  fi
  validate_script
  compile_check
  ensure_slice
  if ((!OPT_skip_install)); then
    install_code
  fi
  preflight
  start_run
  if ((OPT_detach)); then
    info "started on every worker. Follow it: $(self_command --logs); stop it: \
$(self_command --kill); delete the slice: $(self_command --delete)"
  fi
  info "TensorBoard: tensorboard --logdir=${OUTPUT_DIR%/}/tensorboard"
}
