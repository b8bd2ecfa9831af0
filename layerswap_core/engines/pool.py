"""Engines and the bounded pool that lends them out, one job at a time.

An ``Engine`` is one ``merge.live.LiveModel`` over a ``Trio`` (task, language and base
references, dtype, device): one private copy of a checkpoint, whose parameters are rewritten to
show any role or merge (only the tensors whose source changed). Visitors on the same trio share
engines: a job checks one out (``EnginePool.checkout``), shows its own plan on it, runs, and
gives it back; nobody else touches it in between, so a Build never rewrites parameters under a
running chat.

The pool holds at most ``max_engines`` (``LAYERSWAP_MAX_ENGINES``; by default as many as fit in
the free memory of the device with a margin, ``fitting_engines``). A job whose trio has no idle
engine waits in one queue and sees its position; when the pool is full,
the idle engine used least recently is evicted to make room. A waiting job can be cancelled.

Jobs are served by priority, then in order of arrival: a Build (0) before a chat step (1)
before long work (2). A job that holds an engine hands it over at its pause points
(``pause``, called by the dispatcher's hook at ``progress.pause_point``) and queues again for
the same engine: at once when a more urgent job waits, after its step (a few seconds) when an
equally urgent one does. Nobody waits for more than about one step behind any number of long
jobs.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from collections.abc import Callable, Iterator

from ..progress import Cancelled, Progress
from ..progress import say as _say
from ..checkpoints.reading import CheckpointReader
from ..memory import memory_available
from ..settings import env_number
from ..checkpoints.references import resolve
from ..merge.live import LiveModel, live_dtype

DTYPES = ("float32", "bfloat16", "float16")
MARGIN = 1.5          # an engine is counted as its parameters' bytes times this (activations)
MAX_DEFAULT = 8       # never more engines by default, however much memory there is
STEP_SECONDS = 3.0    # a job's turn on a shared engine while others wait (LAYERSWAP_CHUNK_SECONDS)
# one engine is loaded at a time: transformers' loading (its meta-device context) is not
# thread-safe, and two loads at once would only compete for the same disk and memory
_LOADING = threading.Lock()


class QueueFull(ValueError):
    """The server's queue is full: the job was refused (one line for the page)."""


@dataclass(frozen=True)
class Trio:
    """What an engine is made of: the three references, the live dtype and the device.
    ``dtype`` None: ``merge.live.live_dtype`` decides (float32 for a small model on a CPU)."""
    task: str
    lang: str
    base: str | None = None
    dtype: str | None = None
    device: str = "cpu"

    def __post_init__(self):
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"engine dtype {self.dtype!r}: one of {', '.join(DTYPES)}")

    @property
    def refs(self) -> dict[str, str]:
        refs = {"task": self.task, "lang": self.lang}
        if self.base:
            refs["base"] = self.base
        return refs

    def describe(self) -> str:
        over = f" over {self.base}" if self.base else ""
        return f"{self.task} + {self.lang}{over} ({self.dtype or 'auto'}, {self.device})"


class Engine:
    """One live model over a trio (``merge.live.LiveModel``), and what it measured."""

    def __init__(self, trio: Trio, progress: Progress | None = None):
        import torch

        self.trio = trio
        dtype = getattr(torch, trio.dtype) if trio.dtype else None
        self.live = LiveModel.from_refs(trio.task, trio.lang, trio.base, device=trio.device,
                                        dtype=dtype, progress=progress)
        self.busy = False
        self.holder: object | None = None   # the lease of the job holding it (``checkout``)
        self.paused = 0                     # jobs that lent it and wait to get it back
        self.last_used = time.monotonic()
        self.jobs = 0
        self.tokens_per_second: float | None = None   # measured by generation jobs
        # seconds per item scored without generating (a gold NLL), the model shown included
        self.item_seconds: float | None = None
        self.lent: dict[object, float] = {}     # lease -> seconds lent out at pause points

    def measured(self, tokens: int, seconds: float) -> None:
        """Fold one generation's speed into the estimate (tokens asked for, per second); the
        time the measuring job (the engine's holder) lent the engine out is not its own."""
        seconds -= self.lent.pop(self.holder, 0.0)
        if tokens > 0 and seconds > 0:
            rate = tokens / seconds
            old = self.tokens_per_second
            self.tokens_per_second = rate if old is None else 0.5 * (old + rate)

    def measured_items(self, items: int, seconds: float) -> None:
        """Fold one scoring job's time into the seconds per scored item (``measured``'s rule:
        the time lent out is not the job's): a sweep scored by gold NLL is estimated by it."""
        seconds -= self.lent.pop(self.holder, 0.0)
        if items > 0 and seconds > 0:
            per = seconds / items
            old = self.item_seconds
            self.item_seconds = per if old is None else 0.5 * (old + per)

    def nbytes(self) -> int:
        return self.live.resident_bytes()


def engine_bytes(trio: Trio) -> int:
    """Bytes one engine over ``trio`` holds (its parameters in the live dtype), from headers."""
    import torch

    with CheckpointReader(resolve(trio.task)) as reader:
        dtype = getattr(torch, trio.dtype) if trio.dtype else live_dtype(reader, trio.device)
        return reader.numel() * torch.empty((), dtype=dtype).element_size()


def free_bytes(device: str = "cpu") -> int:
    """Memory free for engines on ``device``: the GPU's free memory, or MemAvailable."""
    if str(device).startswith("cuda"):
        import torch
        if torch.cuda.is_available():
            return int(torch.cuda.mem_get_info()[0])
    available = memory_available()
    return 4 << 30 if available is None else available


def fitting_engines(per_engine: int, free: int, margin: float = MARGIN) -> int:
    """How many engines of ``per_engine`` bytes fit in ``free`` bytes with ``margin`` (at least
    one, at most MAX_DEFAULT): an 8B trio in bf16 (16 GB) in a 70 GiB ZeroGPU slice: 3."""
    return max(1, min(MAX_DEFAULT, int(free // max(1, per_engine * margin))))


def per_trio_from_env() -> int:
    return max(1, env_number("LAYERSWAP_ENGINES_PER_TRIO", 1, int))


def max_engines_from_env() -> int | None:
    """LAYERSWAP_MAX_ENGINES (a whole number >= 1; None when unset: what fits)."""
    return env_number("LAYERSWAP_MAX_ENGINES", None, int, minimum=1, strict=True)


@dataclass(eq=False)
class Ticket:
    """A job waiting for an engine."""
    trio: Trio
    visitor: str = ""        # whose job: the queue takes turns between visitors (``_enqueue``)
    engine: Engine | None = None
    build: bool = False
    arrived: float = field(default_factory=time.monotonic)
    # 0 a Build, 1 a chat step, 2 long work (an evaluation, a sweep, Reproduce): lower first
    priority: int = 2
    lease: object = field(default_factory=object)   # the checkout this ticket is for
    pinned: Engine | None = None   # a paused job waits for the engine it lent, no other


class EnginePool:
    """At most ``max_engines`` engines (module docstring). ``max_engines`` None: from
    LAYERSWAP_MAX_ENGINES, else what fits (``fitting_engines``) for the first trio asked for.
    ``max_waiting``: jobs allowed to wait at once (more are refused with QueueFull).
    ``per_trio``: engines over one trio at most (LAYERSWAP_ENGINES_PER_TRIO, default 1: jobs on
    the same models take turns on one engine, so memory does not grow with visitors).
    ``factory(trio, progress)`` makes an engine (``Engine``; tests may count calls).
    ``step``: the seconds a job keeps an engine before it hands it to an equally urgent job at
    its next pause point (LAYERSWAP_CHUNK_SECONDS, default 3; a more urgent job gets it at the
    next pause point)."""

    def __init__(self, max_engines: int | None = None, max_waiting: int = 16,
                 factory: Callable[[Trio, Progress | None], Engine] = Engine,
                 per_trio: int | None = None, step: float | None = None):
        self.max_engines = max_engines if max_engines is not None else max_engines_from_env()
        self.per_trio = per_trio if per_trio is not None else per_trio_from_env()
        self.max_waiting = max_waiting
        self.factory = factory
        self.engines: list[Engine] = []
        self.waiting: deque[Ticket] = deque()
        self.building = 0
        self.building_trios: list[Trio] = []
        self.peak = 0          # the most engines held (or being built) at once
        self.built = 0
        self.evicted = 0
        self.step = step if step is not None else max(
            0.0, env_number("LAYERSWAP_CHUNK_SECONDS", STEP_SECONDS, float))
        self.handovers = 0     # engines lent at a pause point
        self._cond = threading.Condition()

    # ---- bound
    def bound(self, trio: Trio) -> int:
        if self.max_engines is None:
            self.max_engines = fitting_engines(engine_bytes(trio), free_bytes(trio.device))
        return self.max_engines

    def describe(self) -> str:
        n = self.max_engines
        held = len(self.engines)
        limit = f"at most {n}" if n is not None else "as many as fit in memory"
        return (f"{held} live model{'s' if held != 1 else ''} loaded ({limit}; "
                f"{len(self.waiting)} job{'s' if len(self.waiting) != 1 else ''} waiting)")

    # ---- lending
    def _grant(self) -> None:
        """Give engines (or the right to build one) to waiting tickets in the queue's order
        (``_enqueue``); a ticket never overtakes an earlier one of its own trio. Under the lock."""
        blocked: set[Trio] = set()
        for t in list(self.waiting):
            if t.trio in blocked:
                continue
            if t.pinned is not None:     # a paused job: its own engine, when it is free
                if t.pinned.busy:
                    blocked.add(t.trio)
                    continue
                t.engine = t.pinned
                t.engine.busy = True
                t.engine.holder = t.lease
                t.engine.paused -= 1
                self.waiting.remove(t)
                continue
            idle = [e for e in self.engines if not e.busy and e.trio == t.trio]
            same = sum(e.trio == t.trio for e in self.engines) + self.building_trios.count(t.trio)
            if idle:
                # an engine lent by a paused job goes to others only while it waits
                t.engine = max(idle, key=lambda e: e.last_used)
                t.engine.busy = True
                t.engine.holder = t.lease
            elif same >= self.per_trio:
                blocked.add(t.trio)      # wait for one of this trio's engines
                continue
            elif len(self.engines) + self.building < (self.max_engines or 1):
                t.build = True
            else:
                victims = [e for e in self.engines if not e.busy and not e.paused]
                if not victims:
                    blocked.add(t.trio)
                    continue
                victim = min(victims, key=lambda e: e.last_used)
                self.engines.remove(victim)   # its memory goes with the last reference
                self.evicted += 1
                t.build = True
            if t.build:
                self.building += 1
                self.building_trios.append(t.trio)
                self.peak = max(self.peak, len(self.engines) + self.building)
            self.waiting.remove(t)
        self._cond.notify_all()

    def position(self, ticket: Ticket) -> int:
        """1 for the next job served; 0 once it has an engine."""
        with self._cond:
            try:
                return self.waiting.index(ticket) + 1
            except ValueError:
                return 0

    def _enqueue(self, ticket: Ticket) -> None:
        """Behind every waiting ticket more urgent than ``ticket``, ahead of the less urgent;
        among the equally urgent, round robin between visitors (``Ticket.visitor``): a visitor
        with n tickets of this priority waiting already puts this one in round n, behind every
        ticket of rounds 0 to n. A visitor with one job waiting is served after at most one
        job of each other visitor, however many those queue. Under the lock."""
        mine = sum(t.priority == ticket.priority and t.visitor == ticket.visitor
                   for t in self.waiting)
        rounds: dict[str, int] = {}
        at = len(self.waiting)
        for i, t in enumerate(self.waiting):
            if t.priority < ticket.priority:
                continue
            if t.priority > ticket.priority:
                at = i
                break
            rounds[t.visitor] = rounds.get(t.visitor, -1) + 1
            if rounds[t.visitor] > mine:
                at = i
                break
        self.waiting.insert(at, ticket)

    def _wait(self, ticket: Ticket, progress: Progress | None,
              cancelled: Callable[[], bool] | None, doing: str) -> None:
        """Wait until ``ticket`` is served, its place (and the wait it means: ``step`` per
        job ahead) told to ``progress``; Cancelled when ``cancelled()``. Under the lock."""
        said = None
        while ticket.engine is None and not ticket.build:
            if cancelled is not None and cancelled():
                self.waiting.remove(ticket)
                if ticket.pinned is not None:
                    ticket.pinned.paused -= 1
                self._grant()
                raise Cancelled()
            pos = self.waiting.index(ticket) + 1
            if pos != said:
                said = pos
                _say(progress, 0.0, f"{doing}: number {pos} in the queue"
                     + (f", about {pos * self.step:.0f} s" if self.step else ""))
            self._cond.wait(0.2)

    @contextmanager
    def checkout(self, trio: Trio, visitor: str = "", progress: Progress | None = None,
                 cancelled: Callable[[], bool] | None = None, short: bool = False,
                 priority: int | None = None) -> Iterator[Engine]:
        """An engine over ``trio`` for the block, held by nobody else until it ends (except
        while the block lends it at a pause point: ``pause``). Waits (its position reported to
        ``progress``) while none is free; ``cancelled()`` true while waiting raises Cancelled;
        QueueFull when ``max_waiting`` jobs wait already. ``priority``: 0 a Build, 1 a chat
        step, 2 long work (default; ``short``: 1): a job queues behind the jobs as urgent as it
        or more and ahead of the others."""
        self.bound(trio)
        ticket = Ticket(trio, visitor, priority=priority if priority is not None
                        else (1 if short else 2))
        with self._cond:
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(f"the server's queue is full ({len(self.waiting)} jobs waiting): "
                                "try again in a minute")
            self._enqueue(ticket)
            self._grant()
            self._wait(ticket, progress, cancelled, "waiting for a free model")
        engine = ticket.engine
        if engine is None:   # the right to build one
            try:
                _say(progress, 0.0, "loading the live model")
                with _LOADING:
                    engine = self.factory(trio, progress)
            except BaseException:
                with self._cond:
                    self.building -= 1
                    self.building_trios.remove(trio)
                    self._grant()
                raise
            engine.busy = True
            engine.holder = ticket.lease
            with self._cond:
                self.building -= 1
                self.building_trios.remove(trio)
                self.engines.append(engine)
                self.built += 1
        try:
            yield engine
        finally:
            with self._cond:
                engine.lent.pop(ticket.lease, None)
                if engine.holder is ticket.lease:   # not lent out by a pause that was cancelled
                    engine.busy = False
                    engine.holder = None
                    engine.jobs += 1
                    engine.last_used = time.monotonic()
                self._grant()

    def waiting_for(self, engine: Engine) -> int | None:
        """The most urgent priority among the jobs waiting for ``engine``'s trio (None: none
        waits)."""
        with self._cond:
            return min((t.priority for t in self.waiting if t.trio == engine.trio),
                       default=None)

    def pause(self, engine: Engine, lease: object, priority: int, visitor: str = "",
              progress: Progress | None = None,
              cancelled: Callable[[], bool] | None = None) -> None:
        """Lend ``engine`` (held under ``lease``) to the jobs waiting for its trio and wait for
        it back, queued as a job of ``priority`` (behind those as urgent, ahead of the others).
        On return the caller holds it again; what it showed may have changed (the caller shows
        its own model again). Cancelled while waiting: the engine stays with the others."""
        with self._cond:
            if engine.holder is not lease:
                raise RuntimeError("pause: the engine is not held by this job")
            ticket = Ticket(engine.trio, visitor, priority=priority, lease=lease, pinned=engine)
            engine.paused += 1
            self.handovers += 1
            engine.busy = False
            engine.holder = None
            engine.last_used = time.monotonic()
            self._enqueue(ticket)
            self._grant()
            t0 = time.monotonic()
            self._wait(ticket, progress, cancelled, "paused for another visitor's job")
            engine.lent[lease] = engine.lent.get(lease, 0.0) + time.monotonic() - t0

    def clear(self) -> None:
        """Drop every idle engine (busy ones stay until their job ends, and so do those a
        paused job waits to get back)."""
        with self._cond:
            self.engines = [e for e in self.engines if e.busy or e.paused]
