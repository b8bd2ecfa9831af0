"""Hugging Face Spaces glue: ``GPU`` is ``spaces.GPU`` when the ``spaces`` package exists.

On a ZeroGPU Space, ``spaces.GPU`` attaches a GPU to the decorated call (in a forked worker);
everywhere else the decorator is a no-op, so the app runs unchanged on a laptop or in CI.
"""
from __future__ import annotations

import importlib.util

from ..checkpoints.loading import ZERO_GPU  # noqa: F401  (one definition: loading.pick_device reads it too)

HAVE_SPACES = importlib.util.find_spec("spaces") is not None


def GPU(fn=None, *, duration: int = 120):  # noqa: N802 - same name as spaces.GPU
    """Decorator: ``@GPU`` or ``@GPU(duration=...)``; a no-op without the spaces package."""
    if not HAVE_SPACES:
        return fn if fn is not None else (lambda f: f)
    import spaces  # imported only on a Space: it patches CUDA initialisation there

    if fn is not None:
        return spaces.GPU(fn)
    return spaces.GPU(duration=duration)
