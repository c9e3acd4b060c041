"""How a fine-tuning run computes the checkpoint's model (`finetune_job.compute_config`): the
config's dtype and dropout, and the fused kernels a recent GPU runs where they are left unset."""

from bert_jax.model import configuration
from bert_jax.objectives import distillation
from bert_jax.runs import finetune_config, finetune_job


def _kernels(bert_config, platform="gpu", capability=(9, 0), max_seq_length=128, **fields):
  b = finetune_job.compute_config(finetune_config.make(**fields), bert_config, max_seq_length,
                                  platform, capability)
  return b.attention_implementation, b.layer_norm_implementation


def test_fine_tuning_runs_the_fused_kernels_on_a_recent_gpu_where_the_model_allows():
  """bfloat16 on a CUDA GPU of compute capability 8.0 or newer: cuDNN's attention (its dropout
  inside the kernel) and the fused LayerNorm sites, as pre-training's step runs there; each only
  where the model, the dtype and the length allow it, and a field the config sets stays."""
  base = configuration.get_preset("base")
  fused = ("cudnn", "pallas")
  assert _kernels(base, dtype="bfloat16") == fused
  assert _kernels(base, capability=(8, 0), dtype="float16") == fused
  assert _kernels(base, max_seq_length=384, dtype="bfloat16") == fused  # SQuAD's length
  # The fine-tuning default, float32, and older GPUs, GPUs without a capability, TPUs, CPUs: as
  # configured (XLA's kernels).
  xla = (None, "xla")
  assert _kernels(base) == xla
  assert _kernels(base, capability=(7, 5), dtype="bfloat16") == xla
  assert _kernels(base, capability=None, dtype="bfloat16") == xla
  assert _kernels(base, "tpu", None, dtype="bfloat16") == xla
  assert _kernels(base, "cpu", None, dtype="bfloat16") == xla
  # Set, a field stays as set; the other still takes the fused kernel.
  assert _kernels(base, dtype="bfloat16", attention_implementation="xla") == ("xla", "pallas")
  assert _kernels(base, dtype="bfloat16", layer_norm_implementation="xla") == ("cudnn", "xla")
  # An odd length, or heads cuDNN cannot take (312 / 12 = 26 values): XLA's attention.
  assert _kernels(base, max_seq_length=127, dtype="bfloat16") == (None, "pallas")
  narrow = base.replace(hidden_size=312, intermediate_size=1248)
  assert _kernels(narrow, dtype="bfloat16") == (None, "pallas")
  # ALBERT's shared layers: one attention call site for every layer, so cuDNN's attention only
  # without attention dropout (ALBERT has none).
  albert = configuration.get_preset("albert_base")
  assert albert.attention_probs_dropout_prob == 0
  assert _kernels(albert, dtype="bfloat16") == fused
  assert _kernels(albert.replace(attention_probs_dropout_prob=0.1), dtype="bfloat16") == (
      None, "pallas")


def test_the_config_sets_the_dtype_and_dropout_of_the_checkpoints_model():
  base = configuration.get_preset("base")
  b = finetune_job.compute_config(finetune_config.make(dtype="bfloat16", hidden_dropout_prob=0.2),
                                  base, 128, "cpu")
  assert (b.dtype, b.hidden_dropout_prob) == ("bfloat16", 0.2)
  assert b.replace(dtype="float32", hidden_dropout_prob=0.1) == base
  # Unset, the checkpoint's dropout stays.
  kept = finetune_job.compute_config(finetune_config.make(), base.replace(hidden_dropout_prob=0.3),
                                     128, "gpu", (9, 0))
  assert (kept.dtype, kept.hidden_dropout_prob) == ("float32", 0.3)


def test_a_teacher_whose_heads_cudnn_cannot_take_attends_through_xla():
  """Task distillation computes the teacher as the student; a teacher of heads cuDNN's kernel
  does not take (26 values) then attends through XLA's, the rest as the student."""
  student = configuration.get_preset("base").replace(
      dtype="bfloat16", attention_implementation="cudnn", layer_norm_implementation="pallas")
  teacher = configuration.get_preset("base").replace(hidden_size=312, intermediate_size=1248)
  computed = distillation.teacher_compute_config(teacher, student)
  assert computed.attention_implementation == "xla"
  assert (computed.dtype, computed.layer_norm_implementation) == ("bfloat16", "pallas")
  same_heads = distillation.teacher_compute_config(configuration.get_preset("large"), student)
  assert same_heads.attention_implementation == "cudnn"
