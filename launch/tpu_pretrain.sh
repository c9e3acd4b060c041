#!/usr/bin/env bash
# Pre-trains BERT on a Cloud TPU VM slice: creates the slice (or reuses it, or recreates it after
# a preemption), installs this code with jax[tpu] on every worker, checks on every worker that
# the data can be read and the workdir written, then runs `python -m bert_jax.pretrain` on all
# workers at once. Before creating the slice it compiles the run's step for the slice's topology
# on this machine (launch/preflight.py --compile_for), so a config that does not fit its chips
# is refused before they are paid for. Re-running the same command resumes the run from the checkpoint in the
# workdir. See the README section "Pre-train on a TPU pod".
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

JOB=pretrain
SCRIPT_VALUE_FLAGS="config data eval_data workdir"
SCRIPT_BOOL_FLAGS="skip_compile_check"
OPT_config="" OPT_data="" OPT_eval_data="" OPT_workdir="" OPT_skip_compile_check=0

# The devices each variant of configs/pretrain.py lays its mesh over (0: any number). The test
# suite checks this table against the config file.
config_mesh_devices() {
  case $1 in
    base | base_phase2) echo 16 ;;
    large | large_phase2) echo 64 ;;
    tiny | demo) echo 0 ;;
    *) return 1 ;;
  esac
}

usage() {
  cat <<EOF
Usage: $PROG --tpu=NAME --zone=ZONE --accelerator=TYPE --config=CONFIG \\
           --data='gs://BUCKET/data/*.tfrecord' --workdir=gs://BUCKET/run [flags] \\
           [-- extra bert_jax.pretrain flags]
       $PROG --tpu=NAME --zone=ZONE --status | --logs | --kill | --stop | --delete

Pre-trains BERT with bert_jax.pretrain on every worker of a Cloud TPU VM slice. Running the same
command again after a preemption or a crash recreates the slice if needed and resumes from the
last checkpoint in the workdir.

The run:
  --config=CONFIG         configs/pretrain.py:VARIANT, or just the variant: base, base_phase2,
                          large, large_phase2, tiny, demo (required)
  --data=GLOBS            the TFRecords of data_prep/create_pretraining_data.py, as
                          comma-separated globs (--config.data.train_files; required)
  --eval_data=GLOBS       held-out TFRecords (--config.data.eval_files)
  --workdir=DIR           checkpoints, TensorBoard and metrics; gs:// on multi-worker slices
                          (required)
  --skip_compile_check    do not compile the step for the slice here before creating it
                          (the check needs this checkout's environment with libtpu: make env;
                          \$LOCAL_PYTHON, default .venv/bin/python or python3)
  -- FLAGS                passed to bert_jax.pretrain as they are, e.g.
                          -- --config.global_batch_size=512 --config.mesh_shape=-1,1,1
                          --config.init_checkpoint=gs://BUCKET/phase1_run

$(common_usage)

Example (BERT-base as in the paper, on a 16-device v3 slice):
  $PROG --tpu=bert-base --zone=europe-west4-a --accelerator=v3-16 --spot \\
      --config=base --data='gs://my-bucket/data128/*.tfrecord' \\
      --workdir=gs://my-bucket/bert_base --detach
EOF
}

validate_script() {
  [[ -n $OPT_config ]] || usage_error "--config is required (e.g. --config=base or \
--config=configs/pretrain.py:large)"
  [[ -n $OPT_data ]] || usage_error "--data=GLOBS is required (e.g. \
--data='gs://BUCKET/data128/*.tfrecord')"
  [[ -n $OPT_workdir ]] || usage_error "--workdir is required (e.g. --workdir=gs://BUCKET/run)"

  local config=$OPT_config file variant needed
  if [[ $config != *[:/]* && $config != *.py ]]; then
    config=configs/pretrain.py:$config
  fi
  file=${config%%:*}
  variant=""
  if [[ $config == *:* ]]; then
    variant=${config#*:}
  fi
  if [[ -z $OPT_repo && ! -f $REPO_ROOT/$file ]]; then
    usage_error "--config=$OPT_config: there is no $file in $REPO_ROOT (a path in the checkout)"
  fi
  if [[ $file == configs/pretrain.py ]]; then
    needed=$(config_mesh_devices "${variant:-base}") ||
      usage_error "--config=$OPT_config: configs/pretrain.py has the variants base, \
base_phase2, large, large_phase2, tiny, demo"
    # A mesh that does not fit the slice fails only after minutes of installing and compiling.
    if ((needed && needed != DEVICES)) && ! passthrough_has config.mesh_shape; then
      usage_error "--config=$OPT_config lays its mesh over $needed devices, and a \
$OPT_accelerator slice has $DEVICES. Choose a slice with $needed devices, or add \
'-- --config.mesh_shape=-1,1,1' (data parallel over all $DEVICES; check that the batch \
divides)"
    fi
  fi

  if [[ $OPT_data == */ ]]; then
    usage_error "--data=$OPT_data is a directory; give the files, e.g. \
--data='${OPT_data}*.tfrecord'"
  fi
  local flag
  for flag in workdir config config.data.train_files config.data.eval_files; do
    if passthrough_has "$flag"; then
      usage_error "--$flag after -- : give it to $PROG itself (--config, --data, --eval_data, \
--workdir)"
    fi
  done
  require_shared_path --workdir "$OPT_workdir"
  if ((HOSTS > 1)); then
    [[ $OPT_data == gs://* ]] || usage_error "--data=$OPT_data: the $HOSTS workers of \
$OPT_accelerator share no disk; use a gs:// path"
  fi
  OUTPUT_DIR=$OPT_workdir

  PREFLIGHT_ARGS=(--glob="$OPT_data")
  TRAINER_ARGS=(bert_jax.pretrain --config="$config" --workdir="$OPT_workdir"
    --config.data.train_files="$OPT_data")
  if [[ -n $OPT_eval_data ]]; then
    PREFLIGHT_ARGS+=(--glob="$OPT_eval_data")
    TRAINER_ARGS+=(--config.data.eval_files="$OPT_eval_data")
  fi
  # Inputs named among the pass-through flags are checked too: a phase-2 run's phase-1 workdir,
  # the vocabulary of dynamic-masking records.
  local value
  for flag in config.init_checkpoint config.data.vocab_file config.data.spm_model_file; do
    if value=$(passthrough_value "$flag") && [[ -n $value ]]; then
      PREFLIGHT_ARGS+=(--exists="$value")
    fi
  done
  PREFLIGHT_ARGS+=(--writable="$OPT_workdir")
  TRAINER_ARGS+=(${PASSTHROUGH[@]+"${PASSTHROUGH[@]}"})
  # Before any chip is rented: the exact step compiled here for the slice's real topology.
  if ((!OPT_skip_compile_check)); then
    COMPILE_CHECK_ARGS=(--config="$config" ${PASSTHROUGH[@]+"${PASSTHROUGH[@]}"})
  fi
}

launcher_main "$@"
