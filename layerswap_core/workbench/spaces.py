"""Hugging Face Spaces glue: ``GPU`` is ``spaces.GPU`` when the ``spaces`` package exists.

On a ZeroGPU Space, ``spaces.GPU`` attaches a GPU to the decorated call (in a forked worker);
everywhere else the decorator is a no-op, so the app runs unchanged on a laptop or in CI.

What ZeroGPU expects (read from the ``spaces`` package's source; never run here: no ``spaces``
package, no GPU): models are loaded at start-up and moved with ``.to("cuda")`` in the main
process, where ``spaces`` keeps their data on the CPU behind stand-in CUDA tensors; a decorated
call runs in a worker forked from the main process, which moves those tensors to the real GPU,
and the call's arguments and results are *pickled* on their way to and from the worker (which
is reused between calls while idle). So a decorated function must take and return plain values
(references, a ``MergeConfig``, numbers, text, results), not a ``workbench.Session``: a session
holds locks, open safetensors handles and live models, and does not pickle. Models a session
creates after start-up exist in a worker only if it was forked after they were made; work done
to them inside the worker (a role shown, a build) is lost when the worker ends.
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
