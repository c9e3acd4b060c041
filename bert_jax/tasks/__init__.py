"""Fine-tuning tasks: reading each task's data, scoring predictions, writing prediction files.

Modules here know file formats and metrics, not models: `finetune.py` turns their examples into
features and their metrics into reports.
"""
