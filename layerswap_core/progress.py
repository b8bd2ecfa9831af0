"""The one progress callback type of the library: ``progress(fraction, message)``.

Long steps (resolving or building a model, merging, analysing, evaluating, training) take an
optional ``progress``; the CLI draws it as a bar (``cli.progress``), the app as Gradio's bar.
``fraction`` runs from 0 to 1 over the step; ``message`` says what is being done.
"""
from __future__ import annotations

from typing import Callable

Progress = Callable[[float, str], None]


class Cancelled(Exception):
    """The work was cancelled (a Cancel pressed, the visitor left); it stopped between two
    steps."""


def say(progress: Progress | None, fraction: float, message: str) -> None:
    """Report to ``progress`` (if any), with ``fraction`` kept within 0..1."""
    if progress is not None:
        progress(min(max(fraction, 0.0), 1.0), message)
