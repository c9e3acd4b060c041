"""Offline data preparation: vocabularies, the demo corpus and pre-training TFRecords."""
