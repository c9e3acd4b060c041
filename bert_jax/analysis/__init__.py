"""Looking inside trained models: where heads attend (`attention.py`), which heads matter
(`heads.py`)."""
