"""Sentence and sentence-pair classification and regression: the nine GLUE tasks and your own
TSV tasks (`registry.CLASSIFICATION`)."""
