r"""Fine-tuning configs for token tagging: CoNLL-2003 named entities as the paper ran them
(Section 5.3: each word tagged at its first piece, with the maximal document context), and the
feature-based variant of its Table 7.

    python -m bert_jax.finetune --config=configs/tagging.py:conll2003 --data_dir=conll2003 \
        --init_checkpoint=cased_L-12_H-768_A-12/bert_model.ckpt --output_dir=out/ner

    python -m bert_jax.finetune --config=configs/tagging.py:feature_based --data_dir=conll2003 \
        --init_checkpoint=cased_L-12_H-768_A-12/bert_model.ckpt --output_dir=out/ner_features

`--data_dir` holds the released files (`eng.train`, `eng.testa`, `eng.testb`; IOB1 tags, read
as they are) or `train.txt`, `valid.txt`, `test.txt`, or is a prepared tensorflow-datasets
directory of `conll2003`. Your own tag set in the same layout: `--task_name=tagging
--label_list=PER,LOC,...`.

Expected results (the paper's Table 3 and 7; a cased vocabulary, as the paper's NER models):
BERT-base test F1 about 92.4 (dev 96.4), BERT-large 92.8 (dev 96.6); feature-based with the
last four layers concatenated, dev F1 about 96.1 (BERT-base). The paper does not give its NER
hyperparameters; these are its fine-tuning grid's usual point (learning rate 5e-5, batch 32,
4 epochs, length 128). A BERT-base run takes on the order of 20 minutes on a Cloud TPU; on a CPU
only toy sets are practical. The original flags override any field, as does
`--config.<field>=<value>`.
"""

from bert_jax.runs import finetune_config

VARIANTS = ("conll2003", "feature_based")


def get_config(variant: str = "conll2003"):
  if variant not in VARIANTS:
    raise ValueError(f"Unknown tagging variant {variant!r}; known: {', '.join(VARIANTS)}.")
  config = finetune_config.get_config()
  config.task_name = "conll2003"
  config.max_seq_length = 128
  config.document_context = True
  config.train_batch_size = 32
  config.learning_rate = 5e-5
  config.num_train_epochs = 4.0
  config.warmup_proportion = 0.1
  config.do_train = config.do_eval = config.do_predict = True
  if variant == "feature_based":
    # Only the BiLSTM and the classifier train, so a larger rate than fine-tuning's.
    config.feature_based = True
    config.feature_layers = (-1, -2, -3, -4)
    config.lstm_size = 768
    config.learning_rate = 1e-3
  return config
