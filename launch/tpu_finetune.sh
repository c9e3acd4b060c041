#!/usr/bin/env bash
# Fine-tunes BERT on a Cloud TPU VM slice: the same slice handling, installation and pre-flight
# checks as tpu_pretrain.sh, then `python -m bert_jax.finetune` on all workers with the flags
# given after `--`, unchanged (GLUE and custom TSV tasks, SQuAD, ...). See the README section
# "Pre-train on a TPU pod".
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

JOB=finetune
SCRIPT_VALUE_FLAGS=""
SCRIPT_BOOL_FLAGS=""

# bert_jax.finetune flags that name inputs; each one present is checked on every worker first.
INPUT_FLAGS="data_dir init_checkpoint vocab_file spm_model_file bert_config_file train_file
  predict_file"

usage() {
  cat <<EOF
Usage: $PROG --tpu=NAME --zone=ZONE --accelerator=TYPE [flags] -- BERT_JAX_FINETUNE_FLAGS
       $PROG --tpu=NAME --zone=ZONE --status | --logs | --kill | --stop | --delete

Runs bert_jax.finetune on every worker of a Cloud TPU VM slice with the flags after --, as they
are. --task_name and --output_dir are required among them (--output_dir in gs:// on multi-worker
slices), and every input they name (--data_dir, --init_checkpoint, --vocab_file,
--spm_model_file, --bert_config_file, --train_file, --predict_file) is checked on every worker
before the run starts, as --output_dir is for writing.

$(common_usage)

Example (MRPC from a pre-training workdir, on one v3-8 worker):
  $PROG --tpu=bert-ft --zone=europe-west4-a --accelerator=v3-8 -- \\
      --task_name=MRPC --data_dir=gs://my-bucket/glue/MRPC \\
      --init_checkpoint=gs://my-bucket/bert_base_512 --vocab_file=gs://my-bucket/vocab.txt \\
      --output_dir=gs://my-bucket/mrpc --do_train --do_eval \\
      --max_seq_length=128 --train_batch_size=32 --learning_rate=2e-5 --num_train_epochs=3
EOF
}

validate_script() {
  local output_dir flag value
  passthrough_value task_name >/dev/null ||
    usage_error "--task_name is required after -- (e.g. -- --task_name=MRPC ...)"
  output_dir=$(passthrough_value output_dir) && [[ -n $output_dir ]] ||
    usage_error "--output_dir is required after -- (e.g. -- --output_dir=gs://BUCKET/mrpc ...)"
  if ! passthrough_has do_train && ! passthrough_has do_eval && ! passthrough_has do_predict; then
    usage_error "none of --do_train, --do_eval, --do_predict after --: nothing to run"
  fi
  require_shared_path --output_dir "$output_dir"
  OUTPUT_DIR=$output_dir

  PREFLIGHT_ARGS=()
  for flag in $INPUT_FLAGS; do
    if value=$(passthrough_value "$flag") && [[ -n $value ]]; then
      PREFLIGHT_ARGS+=(--exists="$value")
    fi
  done
  PREFLIGHT_ARGS+=(--writable="$output_dir")
  TRAINER_ARGS=(bert_jax.finetune "${PASSTHROUGH[@]}")
}

launcher_main "$@"
