"""The merge room's error for inputs that cannot be merged (``ConfigError``, for configs, lives in
``partition.py``)."""
from __future__ import annotations


class MergeError(ValueError):
    """Inputs that cannot be merged (architecture, shapes, vocabulary, missing tensors,
    non-finite results)."""
