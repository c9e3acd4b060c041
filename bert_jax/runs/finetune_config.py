"""The fine-tuning config every `--config` file starts from (`configs/glue.py`,
`configs/squad.py` edit it), and the default of `python -m bert_jax.finetune`.

Fields carry the names of the original `run_classifier.py` / `run_squad.py` flags; those flags
keep working and, when given, override the config. `None` means "the task's default" (e.g.
`max_seq_length` is 128 for GLUE, 384 for SQuAD).

`packing` (`--packing`, off by default) lays several examples back to back in each row of
`max_seq_length` (Krell et al. 2021, as pre-training's packed rows), at most
`packing_max_sequences_per_row` per row, with attention kept inside each example. Why: GLUE
sentences fill a fraction of 128 tokens, so most of an unpacked batch is padding. A step still
trains on `train_batch_size` examples in the same order, with the loss averaged over examples;
only the number of rows changes (rounded up to a power of two). Classification results equal
unpacked ones; SQuAD's softmax then runs over each window's own tokens, without the padding the
original's also covered. The start-up lines report the packing efficiency.
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({
      # What to run (the original flags).
      # GLUE name, custom, squad, squad_v2, conll2003, tagging, swag, hellaswag
      "task_name": config_dict.placeholder(str),
      "data_dir": config_dict.placeholder(str),
      "data_format": "auto",                       # auto | tsv | tfds
      "init_checkpoint": config_dict.placeholder(str),
      "bert_config_file": config_dict.placeholder(str),
      "output_dir": config_dict.placeholder(str),
      "do_train": False,
      "do_eval": False,
      "do_predict": False,
      "max_seq_length": config_dict.placeholder(int),  # None: 128, or 384 for SQuAD
      "train_batch_size": 32,
      "eval_batch_size": 8,
      "predict_batch_size": 8,
      "learning_rate": 5e-5,
      "num_train_epochs": 3.0,
      "warmup_proportion": 0.1,
      "seed": 12345,
      # custom TSV tasks (and tagging tasks: their tags, or entity types)
      "label_list": config_dict.placeholder(list),
      "regression": False,
      "text_a_column": 0,
      "text_b_column": config_dict.placeholder(int),
      "label_column": 1,
      "has_header": "auto",          # auto: decided from the first line (and logged)
      # SQuAD
      "train_file": config_dict.placeholder(str),
      "predict_file": config_dict.placeholder(str),
      "version_2_with_negative": False,
      "doc_stride": 128,
      "max_query_length": 64,
      "n_best_size": 20,
      "max_answer_length": 30,
      "null_score_diff_threshold": 0.0,
      # Token tagging (conll2003, or `tagging` with --label_list over files in that layout).
      "tagging_scheme": "auto",      # auto | iob1 | iob2: how the files' tags are written
      "document_context": False,     # fill each window with the sentences around it (paper)
      "feature_based": False,        # frozen encoder + BiLSTM on concatenated layers (Table 7)
      "feature_layers": (-1, -2, -3, -4),  # the hidden states it concatenates (-1: last layer)
      "lstm_size": 768,              # units per direction of each of its two BiLSTM layers
      # Beyond the original flags.
      "mesh_shape": (-1, 1, 1),
      "logical_axis_rules": None,
      "dtype": "float32",            # compute dtype of the encoder (bfloat16 on TPU)
      # The attention and LayerNorm kernels (`BertConfig` fields). None: the platform's choice
      # (`runs/finetune_job.compute_config`): with a bfloat16 or float16 dtype on a CUDA GPU of
      # compute capability 8.0 or newer, cuDNN's flash attention (its dropout inside the kernel)
      # and one Triton kernel per dropout + residual + LayerNorm site, as pre-training runs
      # there; "xla" keeps XLA's.
      "attention_implementation": config_dict.placeholder(str),
      "layer_norm_implementation": config_dict.placeholder(str),
      "weight_decay": 0.01,
      "grad_clip_norm": 1.0,
      "bias_correction": False,      # the released BERT optimizer has none
      # Layer-wise learning-rate decay (ELECTRA): layer i of L learns at rate ·
      # decay^(L + 1 - i), embeddings at decay^(L + 2), the head at the full rate. 0.0: off;
      # ELECTRA fine-tunes with 0.8 (base) and 0.9 (large).
      "layerwise_lr_decay": 0.0,
      # Task-time distillation (GLUE-style tasks): a fine-tuned teacher (the --output_dir of its
      # fine-tuning run) teaches the model being fine-tuned: loss = alpha · T² · soft
      # cross-entropy(student/T, teacher/T) + (1 - alpha) · the task's loss. T 2.0 and alpha
      # 0.5 are DistilBERT's task distillation (run_squad_w_distillation.py); TinyBERT used T 1.
      "teacher_checkpoint": config_dict.placeholder(str),
      "distill_temperature": 2.0,
      "distill_alpha": 0.5,
      "hidden_dropout_prob": config_dict.placeholder(float),  # None: the checkpoint's value
      "grad_accum_steps": 1,
      "log_every_steps": 50,
      "checkpoint_every_steps": 1000,
      # Evaluation during training (see `runs/finetune_job.py`): the dev data scored every so
      # many steps (None: once, after training), the best model by `eval_metric` (None: the
      # task's own, e.g. MRPC's F1, CoLA's Matthews correlation, SQuAD's F1) kept in
      # <output_dir>/best, and training ended after `early_stopping_patience` evaluations
      # without improvement (None: never).
      "eval_every_steps": config_dict.placeholder(int),
      "eval_metric": config_dict.placeholder(str),
      "early_stopping_patience": config_dict.placeholder(int),
      "keep_best": True,
      "shuffle_seed_offset": 0,
      "packing": False,              # several examples per row (see the docstring)
      "packing_max_sequences_per_row": 8,
  })


def make(**fields) -> ml_collections.ConfigDict:
  """The default config with `fields` set: how a library caller describes a run (a name the
  config lacks is refused, as a misspelt flag would be)."""
  config = get_config()
  unknown = sorted(set(fields) - set(config.keys()))
  if unknown:
    raise ValueError(f"Not fine-tuning settings: {', '.join(unknown)} (see "
                     "bert_jax/runs/finetune_config.py).")
  config.update(fields)
  return config


# The command line of `finetune` (and of `analyze heads`, which reads tasks the same way): the
# original flags and ours, (name, kind, help). Their defaults are the config's.
ORIGINAL_FLAGS = (
    ("task_name", "string", "GLUE task (CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI), "
                            "'squad' / 'squad_v2', 'conll2003' (or 'tagging' with "
                            "--label_list), 'swag' / 'hellaswag', or 'custom' with "
                            "--label_list."),
    ("data_dir", "string", "The task's directory (GLUE TSV files, CoNLL files, SWAG CSV or "
                           "HellaSwag JSONL files) or a tfds data_dir."),
    ("data_format", "string", "auto (the task's files if the directory holds them, else "
                              "tensorflow-datasets), tsv (GLUE), conll (tagging) or tfds."),
    ("bert_config_file", "string", "bert_config.json (default: the checkpoint's)."),
    ("init_checkpoint", "string", "Pre-trained encoder: our workdir/checkpoint, a Hugging Face "
                                  "directory, or a TF1 checkpoint prefix (.../bert_model.ckpt) "
                                  "or its directory."),
    ("output_dir", "string", "Checkpoints, metrics, predictions."),
    ("max_seq_length", "integer", "Maximum total input length in tokens (128; SQuAD 384)."),
    ("train_batch_size", "integer", "Training batch size (32)."),
    ("eval_batch_size", "integer", "Evaluation batch size (8)."),
    ("predict_batch_size", "integer", "Prediction batch size (8)."),
    ("learning_rate", "float", "Peak learning rate of Adam (5e-5)."),
    ("num_train_epochs", "float", "Training epochs (3)."),
    ("warmup_proportion", "float", "Fraction of steps with linear warmup (0.1)."),
    ("do_train", "bool", "Fine-tune."),
    ("do_eval", "bool", "Evaluate on the dev split(s)."),
    ("do_predict", "bool", "Write predictions for the test split(s) (SQuAD: --predict_file)."),
    ("seed", "integer", "Seed for the head's init, dropout and shuffling (12345)."),
    ("label_list", "list", "custom task: the labels (omit with --regression); tagging: the "
                           "tags (O,B-PER,I-PER,...) or the entity types (PER,LOC,...)."),
    ("regression", "bool", "custom task: one real-valued output."),
    ("text_a_column", "integer", "custom task: column of the first text (0)."),
    ("text_b_column", "integer", "custom task: column of the second text, if any."),
    ("label_column", "integer", "custom task: column of the label (1)."),
    ("has_header", "string", "custom task: whether the TSV files start with a header line: "
                             "auto (decided from the first line, and said), true or false."),
    ("train_file", "string", "SQuAD: official training JSON (train-v1.1.json)."),
    ("predict_file", "string", "SQuAD: JSON to predict (dev-v1.1.json); scored when it has "
                               "answers."),
    ("version_2_with_negative", "bool", "SQuAD 2.0: questions may have no answer."),
    ("doc_stride", "integer", "SQuAD: distance between context windows, in tokens (128)."),
    ("max_query_length", "integer", "SQuAD: question tokens kept (64)."),
    ("n_best_size", "integer", "SQuAD: candidates per question in nbest_predictions.json (20)."),
    ("max_answer_length", "integer", "SQuAD: longest answer, in tokens (30)."),
    ("null_score_diff_threshold", "float", "SQuAD 2.0: predict no answer when null score - best "
                                           "score exceeds this (eval_results.json reports the "
                                           "best threshold on dev) (0)."),
    # Not original flags: evaluation during training and early stopping.
    ("eval_every_steps", "integer", "Score the dev data every this many training steps (with "
                                    "--do_eval) and keep the best model in <output_dir>/best "
                                    "(default: once, after training)."),
    ("eval_metric", "string", "The dev score that picks the best model, as eval_results.json "
                              "names it (default: the task's own: accuracy, f1, "
                              "matthews_corr, pearson, ...)."),
    ("early_stopping_patience", "integer", "Stop training after this many evaluations "
                                           "(--eval_every_steps) without a better "
                                           "--eval_metric (default: never)."),
    # Not original flags: the one switch of sequence packing, and ELECTRA's layer-wise decay.
    ("packing", "bool", "Pack several examples into each row of --max_seq_length (same "
                        "examples per step, fewer rows; see finetune_config)."),
    ("layerwise_lr_decay", "float", "Layer-wise learning-rate decay (ELECTRA): each layer "
                                    "down from the head learns at this factor of the rate of "
                                    "the one above; 0 is off (0; ELECTRA: 0.8 base, 0.9 "
                                    "large)."),
    ("teacher_checkpoint", "string", "Distil a fine-tuned teacher (the --output_dir of its "
                                     "fine-tuning run on this task) into the model being "
                                     "fine-tuned (GLUE-style tasks)."),
    ("distill_temperature", "float", "Temperature T of the teacher's and student's softmax "
                                     "(2.0, DistilBERT's task distillation)."),
    ("distill_alpha", "float", "Weight of the teacher's soft targets (x T²); 1 - alpha goes "
                               "to the labels (0.5)."),
    # Token tagging (conll2003, or `tagging` over CoNLL-layout files with --label_list).
    ("tagging_scheme", "string", "tagging: how the files write their tags: auto (detected: "
                                 "IOB1 as CoNLL-2003 was released, or IOB2), iob1 or iob2."),
    ("document_context", "bool", "tagging: fill each window with the sentences around it in "
                                 "its document (the paper's setting); else the sentence alone."),
    ("feature_based", "bool", "tagging: the paper's feature-based variant (Table 7): the "
                              "encoder frozen, --feature_layers concatenated into a two-layer "
                              "BiLSTM and a linear classifier."),
    ("feature_layers", "list", "tagging, --feature_based: hidden states to concatenate, -1 the "
                               "last layer (-1,-2,-3,-4: the last four, the paper's best)."),
    ("lstm_size", "integer", "tagging, --feature_based: units per direction of each BiLSTM "
                             "layer (768)."),
)
