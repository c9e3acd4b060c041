"""Fine-tuning tasks as plug-ins of the training core.

`glue.py`, `squad.py`, `squad_eval.py` and `classification.py` know the data: file formats,
labels, windows, post-processing, metrics and prediction files. `sequence_classification.py`
and `question_answering.py` make them objectives of the core (`training/objective.py`): the model
on the encoder, the batch features, the loss and metric sums.
"""
