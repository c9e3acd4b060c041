"""Looking inside trained models: where heads attend (`attention.py`)."""
