"""Hugging Face Spaces: the same app on a CPU Space, a dedicated GPU and ZeroGPU.

Every job that needs a model (build, evaluate, sweep, chat, the demo result) goes through the one
dispatcher (``engines.dispatch``) as plain data. On a CPU Space or a dedicated GPU it runs in
this process, on an engine of the bounded pool (``pick_device``: "cuda" when a GPU is here). On a
ZeroGPU Space (``SPACES_ZERO_GPU=true``) each job, or chunk of one, is a call of one function
decorated with ``spaces.GPU(duration=<the job's estimate>)``: the ``spaces`` package forks a
worker, pickles the job to it and the result back, and keeps the worker (and the engines built
in it) while it is reused. ``start`` imports ``spaces`` before anything can initialise CUDA and
loads the preselected models' engine at start-up in the main process, on "cuda" (where ZeroGPU
keeps the data on the CPU until a worker moves it to the GPU).

Saving on ZeroGPU: after start-up ZeroGPU deletes the Hub-cache files of the models it moved
(``spaces/zero/mmap.py``: ``~/.cache/huggingface/hub/models--*/blobs/*``), so the streaming
merge cannot re-read a Hub model there. Embedded models and folders outside that cache are not
touched: Save and Download work for them as on a CPU Space.
"""
from __future__ import annotations

import importlib.util

from ..checkpoints.embedded import unbuilt
from ..checkpoints.loading import ZERO_GPU, pick_device
from ..engines import dispatch
from ..engines.pool import Trio

HAVE_SPACES = importlib.util.find_spec("spaces") is not None
GPU = dispatch.gpu   # spaces.GPU where the package is installed (a no-op off ZeroGPU)


def start(refs: dict[str, str]) -> str:
    """Prepare this server for its placement; returns one line for the page saying where jobs
    run and how many live models fit (never how many are loaded now: the line is written once,
    at start-up, and would go stale)."""
    d = dispatch.default()
    if ZERO_GPU:
        import spaces  # noqa: F401 - before anything initialises CUDA
        trio = Trio(refs["task"], refs["lang"], refs.get("base"), device=dispatch.ZERO_DEVICE)
        dispatch.preload(trio)
        pool = dispatch.zero_pool()
    else:
        trio = Trio(refs["task"], refs["lang"], refs.get("base"), device=pick_device())
        pool = d.pool
    where = {"local": "in this process", "zerogpu": "on ZeroGPU"}[d.placement]
    fit = "as many as fit in memory"
    if not unbuilt(trio.task):   # else built on the page's first load, with its progress bar
        try:
            fit = f"at most {pool.bound(trio)}"
        except Exception:  # noqa: BLE001 - a model that cannot be read is reported on pick
            pass
    return (f"Jobs run {where} on shared live models: {fit} loaded at once "
            "(LAYERSWAP_MAX_ENGINES); one heavy job per visitor.")
