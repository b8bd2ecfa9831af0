"""Numbers from environment variables: the one reader of the server's limits and knobs."""
from __future__ import annotations

import os

OFF = ("off", "none", "no", "0", "unlimited")


def env_number(name: str, default, kind: type = float, *, off: bool = False,
               minimum: float | None = None, strict: bool = False):
    """``kind(value)`` of the variable ``name``; unset or blank: ``default``. With ``off`` (a
    limit that can be lifted): "off", "none", "no", "unlimited" and values <= 0 mean None (no
    limit). A value that is not a ``kind`` or is under ``minimum``: ``default``, or with
    ``strict`` a one-line ValueError naming the variable (a setting the server must not guess)."""
    text = os.environ.get(name, "").strip()
    raw = text.lower()
    if not raw:
        return default
    if off and raw in OFF:
        return None
    try:
        value = kind(raw)
    except ValueError:
        if strict:
            want = "a whole number" if kind is int else "a number"
            raise ValueError(f"{name}={text!r}: expected {want}") from None
        return default
    if minimum is not None and value < minimum:
        if strict:
            raise ValueError(f"{name}={text!r}: at least {minimum}")
        return default
    return value if not off or value > 0 else None
