"""The one dispatcher: where jobs run, and who waits for whom.

Placements (``Dispatcher.placement``), the same job code in all three:

* ``"local"`` (a CPU, or a dedicated GPU: ``pick_device``): the ``EnginePool`` of this process.
* ``"zerogpu"`` (a ZeroGPU Space: ``SPACES_ZERO_GPU=true``): every job, or chunk of a job, is
  one call of a function decorated with ``spaces.GPU(duration=<estimate for this job>)``
  (``zero_call``; ``zero_stream`` for chat, a generator: it streams). The call's argument is the
  plain ``Job`` and its result plain data: both are pickled by ``spaces`` on their way to and
  from its forked worker. The engines live in the worker (its own ``EnginePool``, kept while the
  worker is reused); checkpoints named by ``preload`` are loaded at start-up in the main process
  and moved to ``"cuda"`` there, as ZeroGPU expects, so a worker forked later starts with them.

Fair scheduling: one heavy job per person at a time (``Job.person``: a signed-in user, in every
tab they have open; else the page: a second is refused, ``Busy``), at most
``max_waiting`` jobs waiting (``QueueFull``), a duration estimate before a heavy job starts
(``jobs.estimate_seconds`` at the engine's measured speed) refused when over the time budget
(``TooLong``) and enforced while it runs; ``cancel(visitor)`` stops the visitor's job at its next
step, ``leave(visitor)`` also when they close the page (``Job.visitor``: one page session, so
closing one tab stops that tab's jobs, never the same person's jobs in another tab).
Every job yields within seconds: long work (an evaluation, a sweep's configuration,
Reproduce) and chat answers run in steps (``progress.pause_point``: a decoding pass, a batch of
scored items); at each the job's hook (``_pauser``) lends the engine to a waiting job
(``EnginePool.pause``): a more urgent one at once (a Build before a chat step before long
work), an equally urgent one once the job has had its step (``LAYERSWAP_CHUNK_SECONDS``,
default 3 s); then it shows its own model again (only the tensors the other job changed are
rewritten: the outputs are those of an uninterrupted run) and goes on. Time spent lent out is
not counted against the job's time budget. Evaluations are also split in chunks (``jobs.split``)
for the bar and for ZeroGPU, where a job's step is one call and the duration asked for is the
same estimate (``_zero_duration``), at the speed the worker measured.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from collections.abc import Iterator

from ..progress import Cancelled, Progress, cancel_check, pausing
from ..progress import say as _say
from ..settings import env_number
from . import jobs as J
from .pool import EnginePool, Trio

ZERO_GPU = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true")
# the device of the engines in a ZeroGPU worker ("cuda"; the offline emulation in tests/ uses the
# CPU of a machine without a GPU)
ZERO_DEVICE = os.environ.get("LAYERSWAP_ZERO_DEVICE", "cuda")
LIGHT = ("show",)   # job kinds a visitor may run beside their heavy job
# how urgent a job kind is for an engine (lower first; any other kind: long work, 2): a Build
# waits for at most one step of whatever holds the engine
PRIORITY = {"show": 0, "chat": 1}
LONG = 2


def _whose(job: J.Job) -> str:
    """Who a job is for the engine queue's turns (``EnginePool._enqueue``): the person (every
    tab and agent session of one signed-in user or one anonymous client), else the page."""
    return job.person or job.visitor


def priority(job: J.Job) -> int:
    """How urgent ``job`` is for an engine (``PRIORITY``; long work otherwise)."""
    return PRIORITY.get(job.kind, LONG)


class Busy(ValueError):
    """The visitor already has a heavy job running."""


class TooLong(ValueError):
    """A job over the server's time budget."""


@dataclass
class Visitor:
    cancel: threading.Event = field(default_factory=threading.Event)
    running: int = 0     # any jobs running
    left: bool = False


class Dispatcher:
    """Runs jobs (module docstring). ``pool``: the engines of a local placement (default: a new
    ``EnginePool`` with ``max_waiting``: LAYERSWAP_MAX_QUEUE, default 16); ``job_seconds``: the
    time budget of one heavy job (LAYERSWAP_MAX_JOB_SECONDS, default 1800); ``chunk_items``:
    items per evaluation chunk (LAYERSWAP_CHUNK_ITEMS, default 4)."""

    def __init__(self, pool: EnginePool | None = None, *, placement: str | None = None,
                 max_waiting: int | None = None, per_visitor: int = 1,
                 job_seconds: int | None = None, chunk_items: int | None = None):
        waiting = (max_waiting if max_waiting is not None
                   else env_number("LAYERSWAP_MAX_QUEUE", 16, int))
        self.pool = pool if pool is not None else EnginePool(max_waiting=waiting)
        self.placement = placement or ("zerogpu" if ZERO_GPU else "local")
        if self.placement not in ("local", "zerogpu"):
            raise ValueError(f"placement {self.placement!r}: 'local' or 'zerogpu'")
        self.per_visitor = per_visitor
        self.job_seconds = job_seconds or env_number("LAYERSWAP_MAX_JOB_SECONDS", 1800, int)
        self.chunk_items = chunk_items or env_number("LAYERSWAP_CHUNK_ITEMS", 4, int)
        self.visitors: dict[str, Visitor] = {}
        self.heavy: dict[str, int] = {}       # person -> heavy jobs running
        self.speeds: dict[Trio, float] = {}   # measured tokens per second per trio
        self.item_seconds: dict[Trio, float] = {}   # measured seconds per scored item per trio
        self._lock = threading.Lock()

    # ---- visitors
    def _visitor(self, visitor: str) -> Visitor:
        with self._lock:
            return self.visitors.setdefault(visitor, Visitor())

    @contextmanager
    def claim(self, job: J.Job):
        """The visitor's slot for ``job``: refused (Busy) when they already run a heavy job."""
        v = self._visitor(job.visitor)
        heavy = job.kind not in LIGHT
        person = job.person or job.visitor
        with self._lock:
            if heavy and person and self.heavy.get(person, 0) >= self.per_visitor:
                raise Busy("you already have a job running on this server (in this page or "
                           "another of yours): wait for it to finish, or press Cancel")
            if not v.running:
                v.cancel.clear()           # a Cancel pressed before this job is forgotten
            v.left = False
            v.running += 1
            if heavy and person:
                self.heavy[person] = self.heavy.get(person, 0) + 1
        try:
            yield v
        finally:
            with self._lock:
                v.running -= 1
                if heavy and person:
                    self.heavy[person] -= 1
                    if not self.heavy[person]:
                        del self.heavy[person]
                if not v.running and (v.left or not job.visitor):
                    self.visitors.pop(job.visitor, None)

    def running(self, visitor: str) -> bool:
        v = self.visitors.get(visitor)
        return v is not None and v.running > 0

    def cancel(self, visitor: str) -> bool:
        """Stop the visitor's jobs at their next step; False when none runs."""
        v = self.visitors.get(visitor)
        if v is None:
            return False
        v.cancel.set()
        return v.running > 0

    def leave(self, visitor: str) -> None:
        """The visitor's page closed: its jobs are cancelled (waiting ones leave the queue at
        once, a running one stops at its next step) and what the dispatcher kept for it is
        dropped once they have stopped."""
        with self._lock:
            v = self.visitors.get(visitor)
            if v is None:
                return
            v.cancel.set()
            v.left = True
            if not v.running:
                self.visitors.pop(visitor, None)

    # ---- estimates
    def estimate(self, job: J.Job) -> float:
        loaded = self.placement == "local" and any(e.trio == job.trio for e in self.pool.engines)
        return J.estimate_seconds(job, self.speeds.get(job.trio), self.item_seconds.get(job.trio),
                                  loaded=loaded)

    def _admit(self, job: J.Job) -> float:
        """The job's deadline (monotonic); TooLong when its estimate is over the budget."""
        if job.kind in LIGHT or not job.budgeted:
            return float("inf")
        est = self.estimate(job)
        if est > self.job_seconds:
            raise TooLong(f"this job would take about {est / 60:.0f} min here; this server allows "
                          f"{self.job_seconds / 60:.0f} min per job: use fewer questions or "
                          "shorter answers")
        return time.monotonic() + self.job_seconds

    def _guard(self, v: Visitor, deadline: float, progress: Progress | None) -> Guard:
        return Guard(v, deadline, progress, self.job_seconds)

    def _pauser(self, engine, job: J.Job, guard: Guard):
        """The pause hook of ``job`` while it holds ``engine`` (module docstring)."""
        pool, lease = self.pool, engine.holder
        urgency = priority(job)
        since = [time.monotonic()]

        def hook():
            if guard.visitor.cancel.is_set():
                raise Cancelled()
            wanted = pool.waiting_for(engine)
            if wanted is None or wanted > urgency or (
                    wanted == urgency and time.monotonic() - since[0] < pool.step):
                return
            live = getattr(engine, "live", None)
            plan, label = (live.plan, live.label) if live is not None else (None, None)
            t0 = time.monotonic()
            pool.pause(engine, lease, urgency, _whose(job),
                       lambda f, m: guard(guard.fraction, m), guard.visitor.cancel.is_set)
            guard.deadline += time.monotonic() - t0   # time lent out is not the job's
            if plan is not None and live.plan is not plan:
                live.apply_plan(plan, label)           # its own model again
            guard(guard.fraction, guard.message)
            since[0] = time.monotonic()
        hook.cancelled = guard.visitor.cancel.is_set   # read inside a step (progress.cancel_check)
        return hook

    # ---- running
    @contextmanager
    def hold(self, job: J.Job, progress: Progress | None = None):
        """The visitor's slot for work done in this process without an engine (saving,
        analysing deltas): yields the guarded progress (Cancel, the time budget)."""
        with self.claim(job) as v:
            budget = self.job_seconds if job.budgeted else float("inf")
            yield self._guard(v, time.monotonic() + budget, progress)

    def _estimated(self, job: J.Job) -> J.Job:
        """``job`` carrying its estimate: on ZeroGPU the duration asked for (``_zero_duration``)
        is the estimate this dispatcher admitted it by."""
        return replace(job, settings={**job.settings, "estimate_seconds": self.estimate(job)})

    def _run_one(self, job: J.Job, v: Visitor, guard: Progress, root: Guard):
        if self.placement == "zerogpu":
            guard(0.0, "waiting for the GPU")
            out, speed = zero_call(self._estimated(job))
            if speed:   # measured in the worker: the next estimates are the GPU's
                self.speeds[job.trio] = speed
            return out
        # waiting for or loading the engine happens at the chunk's start on the bar
        with self.pool.checkout(job.trio, _whose(job), lambda f, m: guard(0.0, m),
                                v.cancel.is_set,
                                priority=priority(job)) as engine, \
                pausing(self._pauser(engine, job, root)), \
                stopping_inside_passes(getattr(getattr(engine, "live", None), "model", None)):
            out = J.run_job(engine, job, guard)
            if engine.tokens_per_second:
                self.speeds[job.trio] = engine.tokens_per_second
            if engine.item_seconds:
                self.item_seconds[job.trio] = engine.item_seconds
            return out

    def run(self, job: J.Job, progress: Progress | None = None):
        """Run ``job`` (in chunks for an evaluation) and return its plain result."""
        with self.claim(job) as v:
            guard = self._guard(v, self._admit(job), progress)
            chunks = J.split(job, self.chunk_items)
            # each chunk's share of the bar: its items (a short last chunk, a short share)
            sizes = [max(1, len(c.items)) for c in chunks]
            total = sum(sizes)
            parts = []
            for i, chunk in enumerate(chunks):
                def step(frac, msg, start=sum(sizes[:i]), size=sizes[i]):
                    guard((start + size * frac) / total, msg)
                count = J.tally(chunk)
                name = next(iter(chunk.what)) if isinstance(chunk.what, dict) else "merged"
                step(0.0, count.text(0, name, 0) if "part" in chunk.settings else "starting")
                parts.append(self._run_one(chunk, v, step, guard))
            return J.combine(job, parts)

    def stream(self, job: J.Job, progress: Progress | None = None) -> Iterator:
        """Run a streaming job; the engine is held until the last item (or until the caller
        closes the iterator)."""
        with self.claim(job) as v:
            guard = self._guard(v, self._admit(job), progress)
            if self.placement == "zerogpu":
                guard(0.0, "waiting for the GPU")
                yield from _relay(zero_stream(self._estimated(job)), guard)
                return
            with self.pool.checkout(job.trio, _whose(job), guard, v.cancel.is_set,
                                    priority=priority(job)) as engine:
                yield from _relay(J.stream_job(engine, job, guard,
                                               pause=self._pauser(engine, job, guard)), guard)

    def describe(self) -> str:
        where = {"local": "in this process", "zerogpu": "on ZeroGPU"}[self.placement]
        return f"Jobs run {where}: {self.pool.describe()}."


def _layers(model) -> list:
    """The modules a pass runs one after another, each a fraction of it: every decoder layer
    (the members of the model's ``nn.ModuleList``s) and the output layer."""
    import torch

    layers = [m for lst in model.modules() if isinstance(lst, torch.nn.ModuleList) for m in lst]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return layers + ([head] if isinstance(head, torch.nn.Module) else [])


@contextmanager
def stopping_inside_passes(model):
    """Within this block, each pass of ``model`` checks, before each of its layers, whether the
    work of the thread running it was cancelled (``progress.cancel_check``: its pause hook's
    ``cancelled``, the one mechanism a chat template's render reads too) and raises Cancelled:
    Cancel lands within one decoder layer of a long prompt pass instead of at the pause point
    after it (a gold-NLL pass of up to ``inference.prefill.PREFILL_MAX_TOKENS`` tokens takes
    seconds, many more on a loaded CPU). The hooks only read a flag, so batches and outputs are
    bit for bit those of an unhooked run; a pass run by another thread (a job the engine is lent
    to at a pause point) is checked against that thread's own work. ``model`` None: nothing is
    installed."""
    if model is None:
        yield
        return

    def check(module, args):
        cancelled = cancel_check()
        if cancelled is not None and cancelled():
            raise Cancelled()

    handles = [m.register_forward_pre_hook(check) for m in _layers(model)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class Guard:
    """A job's progress callback that stops it (Cancelled when its visitor cancelled or left,
    TooLong past its deadline: ``deadline`` moves on by the time the job lends its engine) and
    remembers where the bar was (``fraction``, ``message``: what a pause reports)."""

    def __init__(self, visitor: Visitor, deadline: float, progress: Progress | None,
                 job_seconds: float):
        self.visitor, self.deadline, self.progress = visitor, deadline, progress
        self.job_seconds = job_seconds
        self.fraction, self.message = 0.0, "starting"

    def __call__(self, frac: float, msg: str) -> None:
        if self.visitor.cancel.is_set():
            raise Cancelled()
        if time.monotonic() > self.deadline:
            raise TooLong(f"stopped: this server allows {self.job_seconds / 60:.0f} min "
                          "per job")
        self.fraction, self.message = frac, msg
        _say(self.progress, frac, msg)


# --------------------------------------------------------------------------- ZeroGPU
# The worker's engines: a forked worker starts with a copy of this pool (the engines `preload`
# made in the main process at start-up) and keeps it while ZeroGPU reuses the worker.
_ZERO_POOL = EnginePool(max_waiting=64)


def zero_pool() -> EnginePool:
    """The engines of this process's ZeroGPU worker (``spaces.start`` describes them)."""
    return _ZERO_POOL


def _relay(source: Iterator, guard: Progress) -> Iterator:
    """The items of a streaming job, each passing ``guard`` (Cancel, the time budget); the
    source is closed however the caller stops."""
    try:
        for item in source:
            guard(0.5, "streaming")
            yield item
    finally:
        source.close()


def preload(trio: Trio) -> None:
    """Load ``trio``'s engine at start-up, in this (main) process: on ZeroGPU its tensors are
    moved to the GPU by ``spaces`` when a worker starts."""
    with _ZERO_POOL.checkout(trio):
        pass


def _zero_duration(job: J.Job) -> int:
    """The duration ZeroGPU is asked for: the estimate the dispatcher admitted the job by, at
    the speed it measured (``Dispatcher.estimate``; at least 15 s)."""
    est = job.settings.get("estimate_seconds")
    return int(max(15, est if est is not None else J.estimate_seconds(job)))


def _zero_call_task(job: J.Job):
    """The job's result, and the engine's measured speed (for the next estimates)."""
    with _ZERO_POOL.checkout(job.trio, job.visitor) as engine:
        return J.run_job(engine, job), engine.tokens_per_second


def _zero_stream_task(job: J.Job):
    with _ZERO_POOL.checkout(job.trio, job.visitor) as engine:
        yield from J.stream_job(engine, job)


_decorated: dict[str, object] = {}


def gpu(fn=None, *, duration=None):
    """``spaces.GPU(fn, duration=...)`` when the spaces package is installed (a no-op off
    ZeroGPU); ``fn`` itself without it. Also as ``@gpu(duration=...)``."""
    if fn is None:
        return lambda f: gpu(f, duration=duration)
    try:
        import spaces
    except ImportError:
        return fn
    return spaces.GPU(fn, duration=duration)


def zero_call(job: J.Job):
    """Run a job in the ZeroGPU worker (one decorated function: one worker cache): its result
    and the worker engine's measured speed."""
    if "call" not in _decorated:
        _decorated["call"] = gpu(_zero_call_task, duration=_zero_duration)
    return _decorated["call"](job)


def zero_stream(job: J.Job) -> Iterator:
    """Stream a job from the ZeroGPU worker."""
    if "stream" not in _decorated:
        _decorated["stream"] = gpu(_zero_stream_task, duration=_zero_duration)
    return _decorated["stream"](job)


# --------------------------------------------------------------------------- the server's one
_default: Dispatcher | None = None
_default_lock = threading.Lock()


def default() -> Dispatcher:
    """This process's dispatcher (made on first use, from the environment)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Dispatcher()
        return _default
