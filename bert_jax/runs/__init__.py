"""Runs: a pre-training run and a fine-tuning run, each data + model + the init order
(`training/init_order.py`) + the one loop (`training/loop.py`). Entry points call these."""
