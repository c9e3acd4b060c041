"""Fine-tuning tasks as plug-ins of the training core, one package per kind of task.

Each kind — `classification/` (GLUE and your TSVs), `squad/`, `tagging/`, `multiple_choice/` —
has the same rooms: `data.py` knows the files (formats, labels, windows, post-processing,
prediction files), `objective.py` makes the task an objective of the core
(`training/objective.py`: the model on the encoder, the batch features, the loss and metric
sums), `metrics.py` scores it, `run.py` is its fine-tuning run and `predict.py` applies a
fine-tuned model to new inputs. `registry.py` is the one place a task is named and dispatches
`finetune` and `predict` to its kind; `finetuned.py` reads a fine-tuned model back for
prediction; `distillation.py` wraps a classifier with a fine-tuned teacher.
"""
