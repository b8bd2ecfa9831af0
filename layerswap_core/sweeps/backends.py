"""Where a sweep's configurations are scored: one record per backend in one mapping.

``BACKENDS`` maps a name to a ``Backend``: its description, its options as a dataclass of its
own (``SweepRequest.backend_options`` is checked against it, so a request carries no other
backend's fields), how many workers it cuts the visiting order into, and ``run(jobs,
worker_args, handle, options, checkout, progress)``, which scores the jobs in order (as
``scoring.SweepWorker(**worker_args).run`` does) and hands each record to ``handle``.

Built in: ``local`` (one worker in this process, on the engine ``checkout`` lends) and
``ray`` (one actor per worker, ``ray_backend``, imported only when used). A caller registers
its own with ``register_backend`` (the app's: each configuration a job of its dispatcher,
``workbench.sweep``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ..progress import Progress, say
from .scoring import SweepWorker


@dataclass(frozen=True)
class Backend:
    """One way to score a sweep's jobs (module docstring)."""
    name: str
    description: str
    options: type                                   # a dataclass: the backend's own options
    run: Callable[..., None]
    workers: Callable[[Any], int] = lambda options: 1   # runs the visiting order is cut into

    def parse(self, given: dict | None) -> Any:
        """The options record from a request's ``backend_options`` (unknown names refused)."""
        given = dict(given or {})
        known = {f.name for f in fields(self.options)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise ValueError(f"backend {self.name}: no option {', '.join(unknown)}"
                             + (f"; it takes {', '.join(sorted(known))}" if known else
                                "; it takes none"))
        return self.options(**given)


BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"backend: one of {', '.join(BACKENDS)}, not {name!r}") from None


# --------------------------------------------------------------------------- local
@dataclass(frozen=True)
class LocalOptions:
    """The local backend has no options: one worker, on this process's engine."""


def _run_local(jobs: list[dict], worker_args: dict, handle, options: LocalOptions, *,
               checkout: Callable | None = None, progress: Progress | None = None) -> None:
    worker = SweepWorker(**worker_args, checkout=checkout)
    total = len(jobs)
    for i, job in enumerate(jobs):
        handle(worker.run(job, progress=None if progress is None else (
            lambda f, m, i=i: say(progress, (i + f) / total, m))))


register_backend(Backend("local", "one engine in this process", LocalOptions, _run_local))


# --------------------------------------------------------------------------- Ray
@dataclass(frozen=True)
class RayOptions:
    """``address``: a Ray cluster (``auto`` or HOST:PORT of `ray start --head`; None: a new
    local runtime); ``workers`` actors, each with one engine and these GPUs and CPUs."""
    address: str | None = None
    workers: int = 1
    gpus_per_worker: float = 0.0
    cpus_per_worker: float = 1.0

    def __post_init__(self):
        if int(self.workers) < 1:
            raise ValueError(f"workers must be at least 1, not {self.workers}")


def _run_ray(jobs: list[dict], worker_args: dict, handle, options: RayOptions, *,
             checkout: Callable | None = None, progress: Progress | None = None) -> None:
    # lazy: the Ray backend adds 0.002 s to `layerswap`'s start (-X importtime)
    from .ray_backend import run_on_ray
    run_on_ray(jobs, worker_args, handle, address=options.address, workers=options.workers,
               gpus_per_worker=options.gpus_per_worker, cpus_per_worker=options.cpus_per_worker)


register_backend(Backend("ray", "one actor per worker", RayOptions, _run_ray,
                         workers=lambda options: options.workers))
