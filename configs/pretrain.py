"""Pre-training configs: the paper's BERT-base / BERT-large recipes and small CPU variants.

    python -m bert_jax.pretrain --config=configs/pretrain.py:base --workdir=gs://BUCKET/bert_base \
        --config.data.train_files='gs://BUCKET/data/train-*.tfrecord'

Variants (after the colon):
  base          BERT-base phase 1 (Devlin et al. 2019): 12L/768H, batch 256, length 128, Adam
                1e-4 without bias correction, 10k warmup then linear decay over 1M steps; trains
                the first 900k steps. Mesh (16, 1, 1): the paper's 16 TPU chips, data parallel.
  base_phase2   continues a `base` run (same optimizer state and schedule) for the last 100k
                steps at length 512: --config.init_checkpoint=<phase-1 workdir>.
  large, large_phase2   the same for BERT-large (24L/1024H) on 64 chips.
  tiny          BERT-Tiny (2L/128H) for one CPU or GPU, a few thousand steps.
  demo          what `make demo` runs: BERT-Tiny (2L/128H) on Shakespeare on the CPU, ~8 minutes.
  roberta_base  RoBERTa-base (Liu et al. 2019): masked-LM only (`mlm`) on FULL-SENTENCES rows of
                512 with dynamic masking; batch 8k, Adam β2 0.98, lr 6e-4, 24k warmup, 500k steps.
  albert_base, albert_large   ALBERT (Lan et al. 2020): factorized, shared layers; masked-LM
                with n-gram masking + sentence order (`mlm_sop`); LAMB, batch 4096, lr 0.00176,
                3,125 warmup, 125k steps at length 512, no dropout.
  spanbert_base SpanBERT-base (Joshi et al. 2020): span masking + span boundary objective
                (`mlm_sbo`) on single segments of 512; batch 256, lr 1e-4, ε 1e-8, 10k warmup,
                2.4M steps.
  electra_small, electra_base, electra_large   ELECTRA (Clark et al. 2020): a generator 1/4 as
                wide (1/3 for base) trained as a masked LM, and the discriminator learning which
                tokens it replaced (`electra`: MLM + 50 x replaced-token detection). Small:
                12L/256H/E128, batch 128, lr 5e-4, length 128, 1M steps; Base: batch 256, lr
                2e-4, length 512, 766k steps; Large: batch 2048, lr 2e-4, 400k steps, 25% masked.
                Each recipe's data_prep command is beside it in get_config; records of the
                wrong sentence objective (NSP pairs for mlm_sop, ...) are refused.
  <any>+fast    the fast recipe on top of a variant (`base+fast`, `large_phase2+fast`): no
                attention-probability dropout (as MosaicBERT and ModernBERT train). The paper's
                recipe itself runs fused: by default on GPUs of compute capability 8.0 or newer
                (below), with `--config.model.attention_implementation=pallas` on TPUs (dropout
                inside the kernel; both honour packed rows); on the explicit path the fast
                recipe measured 1.18x the paper's at base/128 and 1.63x at large/512 on an
                H100. Hidden-state dropout stays 0.1.

On a GPU of compute capability 8.0 or newer (A100, H100, H200, ...), the compute fields left
unset take the program measured fastest on the H200 (benchmarks/RESULTS.md): attention dropout
inside cuDNN's flash kernel (`attention_implementation=cudnn`), each block's dropout + residual
add + LayerNorm one Triton kernel each way (`layer_norm_implementation=pallas`) and the stacked
layers run unrolled (`scan_layers=True`, `stack_unrolled=True`); each only where the model
allows it (bfloat16 compute, heads cuDNN takes, unshared layers:
runs/pretraining.platform_defaults). 49.9 ms per BERT-base step at 256 x 128 there, 1.23x
torch.compile's paper recipe (the explicit path with XLA's LayerNorm measured 69.9 ms on an
earlier build). A field set on the command line stays as set:
`--config.model.attention_implementation=xla --config.model.scan_layers=False` is the explicit,
unrolled program, and `attention_implementation=xla` the one whose attention masks a resumed
run draws exactly as an uninterrupted one (cuDNN's start again with the process). Older GPUs,
CPUs and TPUs run as configured.

What to expect — the published results of a model pre-trained with each recipe (read after
fine-tuning it), the wall time its paper reports, and the lower bound on wall time that compiling
the step for today's slices projects (compute at peak plus the gradient all-reduce at ICI speed;
no input or host time; `python -m bert_jax.pretrain --config=configs/pretrain.py:<variant>
--compile_for=v4-32` prints it, and benchmarks/RESULTS.md "TPU slices ahead of time" has the
table for v4-32, v5p-64, v5litepod-16 and v6e-64, with accumulation where a step does not fit):
  base + base_phase2   GLUE test average 79.6, MNLI 84.6/83.4, SQuAD v1.1 dev F1 88.5 (Devlin et
                al. 2019, Tables 1-2). Paper: 4 days on 16 TPU chips (Appendix A.2).
                Bound: 0.06 + 0.02 days on v4-32.
  large + large_phase2   GLUE 82.1, MNLI 86.7/85.9, SQuAD v1.1 F1 90.9. Paper: 4 days on 64
                chips. Bound: 0.20 + 0.08 days on v4-32 (phase 2 with accumulation 2).
  tiny          20,000 steps of 64 sequences, 13x the demo's: hours on 2 CPU cores, minutes
                on a GPU; a check of data and settings on a small model, not one to publish.
  demo          held-out masked-LM accuracy 24.7% against 6.9% for always guessing the most
                frequent masked token (3.6x), in 10.3 minutes on 2 idle CPU cores (RESULTS.md
                "make demo"; 2.5-3.6x across seeds and machines).
  roberta_base  fairseq's RoBERTa-base: dev MNLI 87.6, QNLI 92.8, SST-2 94.8. Bound: 3.7 days
                on v4-32 (accumulation 32), 1.0 day on v5p-64 (accumulation 4).
  albert_base, albert_large   ALBERT v1 (Lan et al. 2020, Table 2): base SQuAD v1.1 F1 89.3,
                MNLI 81.6; large 90.6, 83.5. Bound: 0.40 / 1.37 days on v4-32 (accumulation 8 /
                16), 0.12 / 0.41 on v5p-64.
  spanbert_base Bound: 0.56 days on v4-32, 0.18 on v5p-64 (2.4M steps of 256 x 512).
  electra_small, electra_base, electra_large   GLUE dev 79.9 (Small: 4 days on one V100) and
                85.1 (Base) in Clark et al. 2020, Table 1. Bound: 0.01 / 0.19 / 2.79 days on
                v4-32 (Large with accumulation 16), Large 0.74 on v5p-64.
A bound is the fastest the step could run; measured steps on GPUs reach 36-41% of peak
(benchmarks/RESULTS.md), so expect the wall time to be a few times the bound.

Any field can be changed on the command line: `--config.global_batch_size=512`,
`--config.mesh_shape=-1,1,1` (all devices, data parallel), `--config.model.dtype=bfloat16`,
`--config.model.scan_layers=True --config.model.remat_policy=dots`.
"""

import ml_collections
from ml_collections.config_dict import placeholder


def get_config(variant: str = "base") -> ml_collections.ConfigDict:
  variant, plus, modifier = variant.partition("+")
  if plus and modifier != "fast":
    raise ValueError(f"Unknown modifier {modifier!r} in {variant}+{modifier}: only '+fast'.")
  config = ml_collections.ConfigDict()

  # The encoder: a size preset from bert_jax/model/configuration.py plus field overrides.
  config.model = ml_collections.ConfigDict({
      "preset": "base",
      # Fields of BertConfig; unset (None) keeps the preset's value. Placeholders, so that the
      # command line can set them (--config.model.hidden_size=512).
      # None: the vocabulary size data_prep recorded in the records' summary.json (else the
      # preset's 30522). A size below the data's is refused.
      "vocab_size": placeholder(int),
      "hidden_size": placeholder(int),
      "num_hidden_layers": placeholder(int),
      "num_attention_heads": placeholder(int),
      "intermediate_size": placeholder(int),
      "max_position_embeddings": placeholder(int),
      "type_vocab_size": placeholder(int),
      "hidden_act": placeholder(str),
      "initializer_range": placeholder(float),
      "embedding_size": placeholder(int),
      # ELECTRA's generator (electra_* presets): its width and depth.
      "generator_hidden_size": placeholder(int),
      "generator_num_hidden_layers": placeholder(int),
      "dtype": "bfloat16",           # compute dtype; parameters stay float32
      # None: scanned on TPUs (compiles ~2x faster), unrolled on CPUs and GPUs, where the
      # scanned step measured 1.05-1.10x (CPU) and 1.45x (H100) slower: see
      # runs/pretraining.platform_defaults; stacked and run unrolled on the GPUs that run
      # the fused program (above). Checkpoints load into either layout; a run resuming from
      # its own checkpoint keeps that checkpoint's layout (its optimizer state's) when unset.
      "scan_layers": placeholder(bool),
      # With scan_layers: the stacked layout run unrolled (one optimizer kernel per stacked
      # leaf; BertConfig.stack_unrolled). None: False, except on the fused program's GPUs.
      "stack_unrolled": placeholder(bool),
      "remat_policy": "none",
      "attention_implementation": placeholder(str),
      # Bits per dropout decision (16: two per random word) and the bfloat16 residual stream
      # with float32 LayerNorm statistics: BertConfig's defaults unless set.
      "dropout_bits": placeholder(int),
      "low_precision_layer_norm": placeholder(bool),
      # "pallas": each block's dropout + residual add + LayerNorm as one GPU kernel each way
      # (BertConfig.layer_norm_implementation). None: "xla", except on the fused program's
      # GPUs.
      "layer_norm_implementation": placeholder(str),
      # "fp8": the dense layers' matmuls in FP8 with delayed scaling (Hopper GPUs; unrolled,
      # unshared layers). None: BertConfig's "none".
      "quantization": placeholder(str),
      "hidden_dropout_prob": 0.1,
      "attention_probs_dropout_prob": 0.1,
  })

  config.data = ml_collections.ConfigDict({
      "train_files": "",             # comma-separated globs of TFRecord shards (local or gs://)
      "eval_files": "",              # held-out shards; empty: hold out the last training shards
      # None: the records' own (their rows' length; the masked-LM slots of static records, or
      # data_prep's budget for dynamic ones, from its summary.json), said in the log; 128 and
      # 20 (the paper's phase 1) where no records are read. A value set here is checked against
      # the records.
      "max_seq_length": placeholder(int),
      "max_predictions_per_seq": placeholder(int),
      "shuffle_buffer_size": 10000,
      # Only for dynamic-masking records (data_prep --masking=dynamic): masks are drawn here.
      "vocab_file": "",
      "spm_model_file": "",
      "merges_file": "",  # byte-level BPE: default, the merges.txt beside vocab_file=vocab.json
      "do_lower_case": True,
      "masked_lm_prob": 0.15,
      "whole_word_mask": False,
      "per_word_draw": False,
      # What a masked unit is: "token" (the original), "whole_word" (= whole_word_mask), "ngram"
      # (ALBERT: 1..max_ngram words, P(n) ∝ 1/n) or "span" (SpanBERT: Geometric(span_p) words
      # clipped at max_span_length, 80/10/10 per span). Static records carry their masks.
      "masking_strategy": "token",
      "max_ngram": 3,
      "span_p": 0.2,
      "max_span_length": 10,
      # Pack several instances into each row as dynamic-masking records are read (attention
      # kept within each; Krell et al. 2021), up to max_sequences_per_row. Records written
      # with data_prep --packing are packed already and read as they are.
      "packing": False,
      "max_sequences_per_row": 3,
      # Damaged records (a shard cut short, a bad checksum) stop the run with the file and byte
      # offset; True skips them instead and counts what was skipped.
      "skip_corrupt_records": False,
  })

  config.optimizer = ml_collections.ConfigDict({
      "name": "adamw",               # or "lamb" for very large batches
      "learning_rate": 1e-4,
      "warmup_steps": 10000,
      "weight_decay": 0.01,
      "b1": 0.9,
      "b2": 0.999,
      "eps": 1e-6,
      "bias_correction": False,      # the released BERT optimizer has none
      "grad_clip_norm": 1.0,
      "power": 1.0,
      "end_learning_rate": 0.0,
  })

  config.global_batch_size = 256
  config.grad_accum_steps = 1        # micro-batches per step (same result, less memory)
  config.total_steps = 1_000_000     # length of the learning-rate schedule
  config.train_until_step = 900_000  # where this phase stops (phase 1: 90% at length 128)
  config.seed = 12345
  config.objective = "mlm_nsp"       # bert_jax/objectives: what the model learns
  # The objective's own settings beyond the lengths (electra: disc_weight, temperature).
  config.objective_settings = ml_collections.ConfigDict()

  # Initialisation when the workdir holds no checkpoint of its own (resuming always wins):
  # a workdir or checkpoint directory of an earlier phase. init_mode "continue" takes the whole
  # state (optimizer, step, schedule) and only the data changes; "params" takes the weights only.
  config.init_checkpoint = ""
  config.init_mode = "continue"

  config.log_every_steps = 100
  config.eval_every_steps = 10000
  config.eval_steps = 100
  config.checkpoint_every_steps = 5000
  config.max_checkpoints_to_keep = 3
  config.tensorboard = True

  config.mesh_shape = (16, 1, 1)     # (data, fsdp, model); -1 = the remaining devices
  config.logical_axis_rules = None   # None: bert_jax.sharding.DEFAULT_LOGICAL_AXIS_RULES

  if variant in ("base", "base_phase2"):
    pass
  elif variant in ("large", "large_phase2"):
    config.model.preset = "large"
    config.mesh_shape = (64, 1, 1)
  elif variant == "tiny":
    config.model.preset = "tiny"
    config.model.dtype = "float32"
    config.global_batch_size = 64
    config.total_steps = config.train_until_step = 20000
    config.optimizer.learning_rate = 5e-4
    config.optimizer.warmup_steps = 1000
    config.mesh_shape = (-1, 1, 1)
    config.log_every_steps = 50
    config.eval_every_steps = 1000
    config.eval_steps = 20
    config.checkpoint_every_steps = 1000
  elif variant == "demo":
    # `make demo`: about 8 minutes of training on two CPU cores. BERT-Tiny, not a wider model:
    # early in training the number of updates matters most, and on the CPU a step's cost is
    # proportional to its tokens, so small batches give the most updates (batch 16: 6,000
    # steps). No dropout (a few epochs of a 0.8M-parameter model do not overfit) and a larger
    # initialisation range and learning rate than BERT-base's reach context sooner. Masked-LM
    # alone, without next-sentence prediction (RoBERTa's finding, and here a large one): the
    # model first sits on a word-frequency plateau (~15%), and with NSP's loss beside it left
    # it only near step 3,400-5,000 depending on the seed (or not at all); without, near step
    # 2,800 for both seeds tried. See the demo section of benchmarks/RESULTS.md.
    config.objective = "mlm"
    config.model.preset = "tiny"
    config.model.dtype = "float32"
    config.model.max_position_embeddings = 128
    config.model.hidden_dropout_prob = 0.0
    config.model.attention_probs_dropout_prob = 0.0
    config.model.initializer_range = 0.06
    config.data.max_seq_length = 128
    config.data.max_predictions_per_seq = 20
    config.global_batch_size = 16
    config.total_steps = config.train_until_step = 6000
    config.optimizer.learning_rate = 1e-3
    config.optimizer.warmup_steps = 300
    config.optimizer.bias_correction = True
    config.mesh_shape = (-1, 1, 1)
    config.log_every_steps = 200
    config.eval_every_steps = 2000
    config.eval_steps = 40
    config.checkpoint_every_steps = 2000
  elif variant == "roberta_base":
    # Liu et al. 2019, Table 9 (BERT-base shape, 500k steps at batch 8k): no NSP (objective
    # "mlm"), FULL-SENTENCES rows of up to 512 tokens, masks drawn anew each epoch. Records:
    #   python -m data_prep.create_pretraining_data --input_file='corpus/*.txt' \
    #     --vocab_file=roberta/vocab.json --output_dir=gs://BUCKET/roberta512 --masking=dynamic \
    #     --objective=none --sequence_mode=full_sentences --short_seq_prob=0 \
    #     --max_seq_length=512 --max_predictions_per_seq=80
    config.model.preset = "roberta_base"
    config.objective = "mlm"
    config.data.max_seq_length = 512
    config.data.max_predictions_per_seq = 80
    config.data.masking_strategy = "token"
    config.data.do_lower_case = False     # byte-level BPE keeps case
    config.global_batch_size = 8192
    config.total_steps = config.train_until_step = 500_000
    config.optimizer.update(learning_rate=6e-4, warmup_steps=24_000, weight_decay=0.01,
                            b1=0.9, b2=0.98, eps=1e-6, bias_correction=True,
                            grad_clip_norm=0.0)  # Table 9: "gradient clipping 0.0"
    config.mesh_shape = (-1, 1, 1)
  elif variant in ("albert_base", "albert_large"):
    # Lan et al. 2020, Section 4.1: LAMB, batch 4096, learning rate 0.00176, 125k steps, length
    # 512 (10% shorter), n-gram masking (n <= 3, P(n) ∝ 1/n), sentence-order prediction; the
    # released v2 configs train without dropout; warmup 3,125 steps (run_pretraining.py).
    # Records (ALBERT's 30k SentencePiece vocabulary):
    #   python -m data_prep.create_pretraining_data --input_file='corpus/*.txt' \
    #     --spm_model_file=albert/30k-clean.model --flavour=albert \
    #     --output_dir=gs://BUCKET/albert512 --objective=sop --masking_strategy=ngram --max_ngram=3 \
    #     --max_seq_length=512 --max_predictions_per_seq=20
    config.model.preset = variant
    config.model.hidden_dropout_prob = 0.0
    config.model.attention_probs_dropout_prob = 0.0
    config.objective = "mlm_sop"
    config.data.max_seq_length = 512
    config.data.max_predictions_per_seq = 20
    config.data.masking_strategy = "ngram"
    config.data.max_ngram = 3
    config.global_batch_size = 4096
    config.total_steps = config.train_until_step = 125_000
    config.optimizer.update(name="lamb", learning_rate=0.00176, warmup_steps=3125,
                            weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6, bias_correction=True)
    config.mesh_shape = (-1, 1, 1)
  elif variant == "spanbert_base":
    # Joshi et al. 2020 (and pretraining/README.md of facebookresearch/SpanBERT): span masking
    # (Geometric(0.2) words, at most 10, 80/10/10 per span) and the span boundary objective
    # (objective "mlm_sbo"), single segments of up to 512 tokens without NSP, short_seq_prob 0;
    # Adam with decoupled weight decay 0.01, ε 1e-8, lr 1e-4, warmup 10k then linear decay,
    # 2.4M steps of 256 sequences, gradient clipping 1.0, dropout 0.1. Records (cased BERT
    # WordPiece vocabulary):
    #   python -m data_prep.create_pretraining_data --input_file='corpus/*.txt' \
    #     --vocab_file=cased_L-12_H-768_A-12/vocab.txt --do_lower_case=False \
    #     --output_dir=gs://BUCKET/spanbert512 --masking=dynamic --objective=none \
    #     --sequence_mode=doc_sentences --short_seq_prob=0 --masking_strategy=span \
    #     --span_p=0.2 --max_span_length=10 --max_seq_length=512 --max_predictions_per_seq=80
    config.objective = "mlm_sbo"
    config.data.max_seq_length = 512
    config.data.max_predictions_per_seq = 80
    config.data.masking_strategy = "span"
    config.data.span_p = 0.2
    config.data.max_span_length = 10
    config.data.do_lower_case = False
    config.total_steps = config.train_until_step = 2_400_000
    config.optimizer.update(learning_rate=1e-4, warmup_steps=10_000, weight_decay=0.01,
                            b1=0.9, b2=0.999, eps=1e-8, bias_correction=True,
                            grad_clip_norm=1.0)
    config.mesh_shape = (-1, 1, 1)
  elif variant in ("electra_small", "electra_base", "electra_large"):
    # Clark et al. 2020, Table 6 (and google-research/electra configure_pretraining.py): the
    # generator masked-LM + replaced-token detection (objective "electra", loss = MLM + 50 x
    # discriminator), generator 1/4 of the discriminator's width (1/3 for Base), embeddings
    # shared; Adam without bias correction (BERT's optimizer), weight decay 0.01, ε 1e-6,
    # 10k warmup then linear decay, dropout 0.1, 15% of tokens masked (25% for Large) with
    # max_predictions_per_seq = int((mask_prob + 0.005) x length) as ELECTRA computes it.
    #   Small: 12L/256H, E = 128, batch 128, lr 5e-4, length 128, 1M steps.
    #   Base:  12L/768H, batch 256, lr 2e-4, length 512, 766k steps.
    #   Large: 24L/1024H, batch 2048, lr 2e-4, length 512, 400k steps, 25% masked.
    # Records (BERT's uncased WordPiece vocabulary; any sentence objective, it is not read):
    #   python -m data_prep.create_pretraining_data --input_file='corpus/*.txt' \
    #     --vocab_file=uncased_L-12_H-768_A-12/vocab.txt --output_dir=gs://BUCKET/electra128 \
    #     --masking=dynamic --objective=none --max_seq_length=128 --max_predictions_per_seq=19
    # Fine-tuning starts from the discriminator (the workdir's `bert` scope), with ELECTRA's
    # layer-wise learning-rate decay: finetune --layerwise_lr_decay=0.8 (Base; 0.9 Large).
    size = variant.split("_")[1]
    length, mask_prob = (128, 0.15) if size == "small" else (512, 0.25 if size == "large"
                                                             else 0.15)
    config.model.preset = variant
    config.objective = "electra"
    config.objective_settings.update(disc_weight=50.0, temperature=1.0)
    config.data.max_seq_length = length
    config.data.masked_lm_prob = mask_prob
    config.data.max_predictions_per_seq = int((mask_prob + 0.005) * length)
    config.global_batch_size = {"small": 128, "base": 256, "large": 2048}[size]
    config.total_steps = config.train_until_step = {"small": 1_000_000, "base": 766_000,
                                                    "large": 400_000}[size]
    config.optimizer.update(learning_rate=5e-4 if size == "small" else 2e-4,
                            warmup_steps=10_000, weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6,
                            bias_correction=False, grad_clip_norm=1.0)
    config.mesh_shape = (-1, 1, 1)
  else:
    raise ValueError(f"Unknown variant {variant!r}: base, base_phase2, large, large_phase2, "
                     "tiny, demo, roberta_base, albert_base, albert_large, spanbert_base, "
                     "electra_small, electra_base, electra_large.")

  if modifier == "fast":
    config.model.attention_probs_dropout_prob = 0.0

  if variant.endswith("_phase2"):
    config.data.max_seq_length = 512
    config.data.max_predictions_per_seq = 80
    config.train_until_step = config.total_steps
  return config
