"""Extractive question answering: SQuAD v1.1 and v2.0 (`registry.SQUAD`)."""
