"""Looking inside trained models: where heads attend (`attention.py`), which heads matter
(`heads.py`), what each layer holds about a word's label (`probe.py`)."""
