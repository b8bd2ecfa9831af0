"""The ``ray`` backend: one Ray actor per worker, each holding one engine (a live model over
memory-mapped checkpoints: actors on one node share the page cache), fed a contiguous run of
the sweep's order. Results come back one configuration at a time, as they finish.

A worker that dies (killed, out of memory, its node lost) loses only the configuration it was
scoring: that configuration goes back to the front of its run, and the rest of the run is taken
over by the first worker that runs out of work (the dead worker's run first, then the tail of
the longest live run). Ray is an optional extra: this is the only module that imports it.
"""
from __future__ import annotations

import os
import uuid
from collections import deque
from collections.abc import Callable

from .order import chunks
from .scoring import SweepWorker

MAX_ATTEMPTS = 3   # a configuration whose worker died this many times stops the sweep
PREFIX = "layerswap-sweep-"   # actor names: PREFIX + run tag + worker number


class RayUnavailable(ValueError):
    pass


def _ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--backend ray needs Ray: pip install -r requirements-ray.txt "
                             "(or pip install 'layerswap[ray]')") from None
    return ray


def connect(address: str | None = None):
    """Ray, initialised: the runtime this process already joined, else ``address`` ("auto", or
    HOST:PORT of a head started with ``ray start --head``), else a new local one. Returns
    (ray, whether this call started the connection)."""
    ray = _ray()
    if ray.is_initialized():
        return ray, False
    # "local": a new runtime even where `ray start` left its address in /tmp/ray
    kw = {"include_dashboard": False} if address is None else {}
    try:
        ray.init(address=address or "local", log_to_driver=False, **kw)
    except ConnectionError as e:
        hint = "" if os.environ.get("RAY_AUTH_MODE") else \
            " (a cluster started with token authentication needs RAY_AUTH_MODE=token here too)"
        raise RayUnavailable(f"cannot reach the Ray cluster at {address}: "
                             f"{str(e).splitlines()[0]}{hint}") from None
    return ray, True


def run_on_ray(jobs: list[dict], worker_args: dict, handle: Callable[[dict], None], *,
               address: str | None = None, workers: int = 2, gpus_per_worker: float = 0.0,
               cpus_per_worker: float = 1.0) -> None:
    """Score ``jobs`` (in order) on ``workers`` actors; ``handle(record)`` as each finishes."""
    ray, started = connect(address)
    actor_cls = ray.remote(SweepWorker)
    tag = uuid.uuid4().hex[:6]
    device = "cuda" if gpus_per_worker > 0 else "cpu"
    threads = max(1, int(cpus_per_worker))
    runs = chunks(jobs, workers)
    actors = [actor_cls.options(name=f"{PREFIX}{tag}-{i}", num_cpus=cpus_per_worker,
                                num_gpus=gpus_per_worker, max_restarts=0).remote(
        **{**worker_args, "device": device}, threads=threads, name=f"{PREFIX}{tag}-{i}")
        for i in range(len(runs))]
    queues = [deque(r) for r in runs]
    alive = [True] * len(actors)
    attempts: dict[str, int] = {}
    inflight: dict = {}   # ref -> (worker index, job)

    def next_job(i: int):
        if queues[i]:
            return queues[i].popleft()
        orphaned = [q for w, q in enumerate(queues) if not alive[w] and q]
        if orphaned:                      # a dead worker's run, continued where it stopped
            return max(orphaned, key=len).popleft()
        others = [q for q in queues if q]
        if others:                        # the tail of the longest live run
            return max(others, key=len).pop()
        return None

    def submit(i: int) -> None:
        job = next_job(i)
        if job is not None:
            inflight[actors[i].run.remote(job)] = (i, job)

    try:
        for i in range(len(actors)):
            submit(i)
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1)
            i, job = inflight.pop(ready[0])
            try:
                record = ray.get(ready[0])
            except ray.exceptions.RayActorError:
                alive[i] = False
                attempts[job["key"]] = attempts.get(job["key"], 0) + 1
                if attempts[job["key"]] >= MAX_ATTEMPTS:
                    raise RuntimeError(f"configuration {job['point']}: its worker died "
                                       f"{MAX_ATTEMPTS} times; stopping") from None
                queues[i].appendleft(job)
                idle = [w for w in range(len(actors)) if alive[w] and
                        not any(w == v[0] for v in inflight.values())]
                if not any(alive):
                    left = sum(len(q) for q in queues)
                    raise RuntimeError(f"all {len(actors)} Ray workers died; {left} "
                                       "configurations not scored (run again to go on)") from None
                for w in idle:            # idle workers take the orphaned run at once
                    submit(w)
                continue
            except ray.exceptions.RayTaskError as e:   # the job itself failed: its own error
                cause = e.cause if getattr(e, "cause", None) is not None else e
                raise ValueError(f"configuration {job['point']}: "
                                 f"{str(cause).strip().splitlines()[-1]}") from None
            handle(record)
            submit(i)
    finally:
        for a in actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 (already dead)
                pass
        if started:
            ray.shutdown()
