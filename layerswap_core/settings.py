"""Numbers from environment variables: the one reader of the server's limits and knobs."""
from __future__ import annotations

import os

OFF = ("off", "none", "no", "0", "unlimited")


def env_number(name: str, default, kind: type = float, *, off: bool = False):
    """``kind(value)`` of the variable ``name``; unset, blank or unreadable (not a ``kind``):
    ``default``. With ``off`` (a limit that can be lifted): "off", "none", "no", "unlimited" and
    values <= 0 mean None (no limit)."""
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if off and raw in OFF:
        return None
    try:
        value = kind(raw)
    except ValueError:
        return default
    return value if not off or value > 0 else None
