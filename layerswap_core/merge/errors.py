"""The merge room's errors: ``ConfigError`` for a configuration that cannot be applied (the
message names the offending field), ``MergeError`` for inputs that cannot be merged."""
from __future__ import annotations


class ConfigError(ValueError):
    """A merge configuration that cannot be applied; the message names the offending field."""


class MergeError(ValueError):
    """Inputs that cannot be merged (architecture, shapes, vocabulary, missing tensors,
    non-finite results)."""
