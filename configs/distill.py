"""Pre-training distillation (DistilBERT, Sanh et al. 2019): a 6-layer student of BERT-base's
width taught by a fixed teacher (objective `distill`, `bert_jax/objectives/distillation.py`).

    python -m bert_jax.pretrain --config=configs/distill.py --workdir=gs://BUCKET/distilbert \
        --config.distillation.teacher_checkpoint=gs://BUCKET/bert_base \
        --config.data.train_files='gs://BUCKET/data512/train-*.tfrecord'

The teacher is any checkpoint `interop.checkpoints.load_any` reads — one of our pre-training
workdirs, a Hugging Face BERT directory (`bert-base-uncased`), a TF1 checkpoint with its
bert_config.json — of any size, with the student's vocabulary. Its weights go into the
`teacher` scope of the run's parameters when the run starts (a resumed run restores them from
its own checkpoint), and the optimizer never changes them (`optimizer.frozen_scopes`). The
student's parameters are a plain BERT masked LM's: export, fine-tune and predict from the
workdir as from any pre-training run.

The DistilBERT recipe (paper, Section 3, and the released `examples/research_projects/
distillation` training script), and what of it this config reproduces:

  reproduced      student 6 layers of BERT-base's width 768, 12 heads, without token-type
                  embeddings (preset distilbert_base: model_type distilbert, exported as
                  transformers' DistilBertForMaskedLM); initialised from the teacher by taking
                  one layer out of two (`student_init=teacher_every_other_layer`: layer i <- 2i;
                  embeddings and the masked-LM head copied, the token-type table left out); loss
                  5 x T² x soft cross-entropy + 2 x masked LM + 1 x cosine of the last hidden
                  states, T = 2; masked LM only, no next-sentence prediction; masks drawn anew
                  each time a row is read (dynamic masking: data_prep --masking=dynamic
                  --objective=none); Adam, lr 5e-4, ε 1e-6, no weight decay, gradient clipping
                  5.0, 5% warmup then linear decay; batches of ~4K sequences of up to 512 tokens
                  (4,096 here, through gradient accumulation where memory is short:
                  --config.grad_accum_steps); 3 epochs of BooksCorpus + English Wikipedia
                  (~3.3B words, ~4.3B WordPiece tokens: 3 x 4.3B / (4,096 x 512) ≈ 6,150 steps
                  at full rows; set total_steps from your data's count).
  not reproduced  The released extraction took teacher layers 0, 2, 4, 7, 9, 11 (layer i <- 2i
                  here gives 0, 2, 4, 6, 8, 10). The script's `mlm_smoothing` (masking rare
                  tokens more often, by frequency^-0.7) is not reproduced: masks are drawn
                  uniformly, as BERT does. The paper trained on 8 x 16GB V100 for about 90
                  hours; nothing here depends on the hardware. A student with token types is
                  `--config.model.preset=L-6_H-768_A-12`.

Records: the teacher's vocabulary, one segment per row (no NSP pairs), dynamic masking:
    python -m data_prep.create_pretraining_data --input_file='corpus/*.txt' \
      --vocab_file=uncased_L-12_H-768_A-12/vocab.txt --output_dir=gs://BUCKET/data512 \
      --masking=dynamic --objective=none --max_seq_length=512 --max_predictions_per_seq=80
"""

import importlib.util
import os

import ml_collections
from ml_collections.config_dict import placeholder


def _pretrain_configs():
  """configs/pretrain.py, read beside this file (whatever the working directory is)."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pretrain.py")
  spec = importlib.util.spec_from_file_location("bert_jax_configs_pretrain", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def distillation_settings() -> ml_collections.ConfigDict:
  """`config.distillation`: the teacher and the loss (DistilBERT's values)."""
  return ml_collections.ConfigDict({
      # The teacher: a pre-training workdir, a Hugging Face BERT directory or a TF1 checkpoint
      # (required; its config is read from the same place).
      "teacher_checkpoint": placeholder(str),
      # Without a checkpoint, the teacher's size preset ("base") for `--compile_for` checks
      # made before the teacher exists; a run needs teacher_checkpoint.
      "teacher_preset": "",
      "temperature": 2.0,      # T, on both the student's and the teacher's logits
      "alpha_ce": 5.0,         # x T² x soft cross-entropy at the masked positions
      "alpha_mlm": 2.0,        # x the masked-LM loss
      "alpha_cos": 1.0,        # x (1 - cosine) of the last hidden states (equal widths)
      # "teacher_every_other_layer" (DistilBERT: layer i <- 2i, embeddings and head copied;
      # same width) or "scratch".
      "student_init": "teacher_every_other_layer",
  })


def distilbert(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """DistilBERT's settings on top of a pre-training config (see the module docstring)."""
  config.objective = "distill"
  config.distillation = distillation_settings()
  config.model.preset = "distilbert_base"
  config.data.max_seq_length = 512
  config.data.max_predictions_per_seq = 80
  config.data.masked_lm_prob = 0.15
  config.global_batch_size = 4096
  config.total_steps = config.train_until_step = 6_150
  config.optimizer.update(name="adamw", learning_rate=5e-4, warmup_steps=300, weight_decay=0.0,
                          b1=0.9, b2=0.999, eps=1e-6, bias_correction=True,
                          grad_clip_norm=5.0)
  config.log_every_steps = 50
  config.eval_every_steps = 1000
  config.checkpoint_every_steps = 500
  config.mesh_shape = (-1, 1, 1)
  return config


def get_config(variant: str = "distilbert") -> ml_collections.ConfigDict:
  """`distilbert` (the default): DistilBERT's recipe on configs/pretrain.py's BERT-base
  config; `<variant>+fast` as there."""
  name, plus, modifier = variant.partition("+")
  if name != "distilbert":
    raise ValueError(f"Unknown variant {variant!r}: distilbert (optionally +fast).")
  return distilbert(_pretrain_configs().get_config("base" + plus + modifier))
