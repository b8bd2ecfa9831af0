"""The one progress callback type of the library: ``progress(fraction, message)``, and the one
estimate of the time left.

Long steps (resolving or building a model, merging, analysing, evaluating, training) take an
optional ``progress``; the CLI draws it as a bar (``cli.progress``), the app as Gradio's bar.
``fraction`` runs from 0 to 1 over the step; ``message`` says what is being done.

Estimates are never constants: ``Rate`` measures the speed of *this* run (fraction, items or
bytes done per second so far) and turns it into "about N min left"; ``with_eta`` puts that
behind every message of a progress callback (the app's bars and the Hub downloads' lines go
through it).
"""
from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass
from collections.abc import Callable

Progress = Callable[[float, str], None]


class Cancelled(Exception):
    """The work was cancelled (a Cancel pressed, the visitor left); it stopped between two
    steps."""


def say(progress: Progress | None, fraction: float, message: str) -> None:
    """Report to ``progress`` (if any), with ``fraction`` kept within 0..1."""
    if progress is not None:
        progress(min(max(fraction, 0.0), 1.0), message)


# --------------------------------------------------------------------------- the job's count
@dataclass(frozen=True)
class Tally:
    """Where one part of a job is in the whole job, in the words the page and the CLI show.

    A job is ``units`` models (or configurations) times ``items`` items; a part (a chunk the
    dispatcher runs on its own, or the whole job) starts at unit ``first_unit`` and item
    ``first_item`` and covers ``part_units`` x ``part_items``. ``text`` counts across the job
    ("model 2 of 4 (task expert): 11 of 32 items answered"); ``fraction`` is within the part
    (the dispatcher places the part in the job)."""
    units: int
    items: int
    unit: str = "model"
    verb: str = "answered"
    first_unit: int = 0
    first_item: int = 0
    part_units: int | None = None
    part_items: int | None = None
    name: str | None = None    # the unit's name, when the part's own label is not the one to show

    def fraction(self, index: int, done: float) -> float:
        """Of the part: ``index`` (its own unit number, from 0) and ``done`` of its items."""
        units = self.part_units or self.units
        items = self.part_items or self.items
        return (index * items + done) / max(1, units * items)

    def text(self, index: int, name: str, done: float, doing: str = "") -> str:
        unit = self.first_unit + index
        count = unit * self.items + self.first_item + int(done + 1e-6)
        head = f"{self.unit} {unit + 1} of {self.units} ({self.name or name})"
        tally = f"{count} of {self.units * self.items} items {self.verb}"
        return f"{head}: {doing} · {tally}" if doing else f"{head}: {tally}"

    def say(self, progress: Progress | None, index: int, name: str, done: float,
            doing: str = "", at: float | None = None) -> None:
        """Report the part's position: ``done`` items of unit ``index`` (the bar at ``at``
        items when the work is not counted in items, e.g. setting up or scoring)."""
        say(progress, self.fraction(index, done if at is None else at),
            self.text(index, name, done, doing))


# --------------------------------------------------------------------------- time left
def left_text(seconds: float) -> str:
    """A time left in words, rounded as an estimate deserves: "a few seconds left" (under
    10 s), "about 40 s left", "about 3 min left", "about 1 h 20 min left"."""
    if seconds < 10:
        return "a few seconds left"
    if seconds < 60:
        return f"about {round(seconds / 5) * 5:.0f} s left"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"about {minutes} min left"
    return f"about {minutes // 60} h {minutes % 60} min left"


class Rate:
    """The speed of one run, measured while it runs: ``update(done)`` with the amount done so
    far (a fraction, items, bytes, steps) returns the seconds left at the speed seen over the
    last ``window`` seconds (over the whole run until then), or None while nothing can be said
    yet (less than ``min_seconds`` since the start, or nothing done).

    The amount must grow: when it falls by more than ``restart`` of the total (a new phase
    starting from 0) the measurement starts again; a smaller step back is ignored. ``clock`` is
    ``time.monotonic`` (a recorded clock in tests).
    """

    def __init__(self, total: float = 1.0, *, window: float = 60.0, min_seconds: float = 3.0,
                 restart: float = 0.05, clock: Callable[[], float] = time.monotonic):
        self.total, self.window, self.min_seconds, self.clock = total, window, min_seconds, clock
        self.restart = restart
        self.samples: list[tuple[float, float]] = []   # (time, done), oldest first

    def reset(self) -> None:
        self.samples.clear()

    def update(self, done: float, now: float | None = None) -> float | None:
        now = self.clock() if now is None else now
        if self.samples and done < self.samples[-1][1]:
            if done < self.samples[-1][1] - self.restart * self.total:
                self.reset()
            else:
                done = self.samples[-1][1]   # a step back within a phase: no progress
        self.samples.append((now, done))
        start = self.samples[0][0]
        # keep the window (and the run's first sample while the run is shorter than it)
        while len(self.samples) > 2 and self.samples[1][0] < now - self.window:
            self.samples.pop(0)
        t0, d0 = self.samples[0]
        if now - start < self.min_seconds or done <= d0 or now <= t0:
            return None
        speed = (done - d0) / (now - t0)
        return max(self.total - done, 0.0) / speed

    def left(self, done: float, now: float | None = None) -> str:
        """``update`` in words ("" while nothing can be said yet)."""
        seconds = self.update(done, now)
        return "" if seconds is None else left_text(seconds)


class Eta:
    """A progress callback with the measured time left behind each message (``with_eta``).

    Between two reports the estimate counts down with the time passed (``tick``: the last
    message again, "about 40 s left" becoming "about 35 s left"); once it has run out while
    the step goes on, the message says how long this step has run instead. The CLI's bar
    counts on its own; the app ticks once a second (``start_ticking``)."""

    def __init__(self, progress: Progress, *, clock: Callable[[], float] = time.monotonic,
                 **rate):
        self.progress, self.clock = progress, clock
        self.rate = Rate(1.0, clock=clock, **rate)
        self.last: tuple[float, str, float | None, float] | None = None  # frac, msg, left, at
        self.finished = False

    def __call__(self, fraction: float, message: str) -> None:
        now = self.clock()
        left = self.rate.update(fraction, now) if fraction < 1.0 else None
        self.last = (fraction, message, left, now)
        self.progress(fraction, self.text(message, left, 0.0))

    @staticmethod
    def text(message: str, left: float | None, since: float) -> str:
        """``message`` with the time left ``since`` seconds after it was measured as ``left``."""
        if left is None:
            return message
        if left - since > 0:
            return f"{message} · {left_text(left - since)}"
        return f"{message} · still working ({since:.0f} s on this step)"

    def tick(self) -> None:
        """The last message again, its estimate counted down (nothing before an estimate)."""
        if self.last is None or self.finished:
            return
        fraction, message, left, at = self.last
        if left is not None:
            self.progress(fraction, self.text(message, left, self.clock() - at))

    def start_ticking(self, every: float = 1.0) -> None:
        """Tick every ``every`` seconds from a daemon thread, until this callback is dropped
        (the job that held it ended) or ``finished``."""
        ref = weakref.ref(self)
        del self   # the thread holds only the weak reference

        def loop():
            while True:
                time.sleep(every)
                eta = ref()
                if eta is None or eta.finished:
                    return
                if eta.clock() - eta.last[3] >= every if eta.last else False:
                    eta.tick()
                del eta
        threading.Thread(target=loop, name="layerswap-eta", daemon=True).start()


def with_eta(progress: Progress | None, *, clock: Callable[[], float] = time.monotonic,
             tick: float | None = None, **rate) -> Eta | None:
    """``progress`` with the measured time left behind each message ("... · about 3 min
    left"), from the fractions reported so far (``Rate``); ``tick``: count the estimate down
    every so many seconds between reports (``Eta.start_ticking``)."""
    if progress is None:
        return None
    eta = Eta(progress, clock=clock, **rate)
    if tick:
        eta.start_ticking(tick)
    return eta


# --------------------------------------------------------------------------- pause points
_pausing = threading.local()


def pause_point() -> None:
    """A point between two steps of long work (a decoding pass, a batch of scored items) where
    the work may hand the engine it holds to a waiting job and take it back (the hook that
    ``engines.dispatch`` installs with ``pausing``: a step is a few seconds,
    LAYERSWAP_CHUNK_SECONDS). Where no hook is installed nothing happens. May raise Cancelled
    (the visitor cancelled or left while the work waited for its engine)."""
    hook = getattr(_pausing, "hook", None)
    if hook is not None:
        hook()


def pause_hook() -> Callable[[], None] | None:
    """This thread's pause hook: work that continues in a thread of its own (a streamed chat's
    generation) installs it there with ``pausing``."""
    return getattr(_pausing, "hook", None)


def cancel_check() -> Callable[[], bool] | None:
    """Whether this thread's work was cancelled (its visitor cancelled or left), as its pause
    hook knows it (the dispatcher's hook carries it as ``hook.cancelled``): for a step that may
    stop but must not lend the engine meanwhile (a chat template's render). None: nobody can
    cancel this work."""
    return getattr(pause_hook(), "cancelled", None)


class pausing:
    """``with pausing(hook):`` the pause points of this thread call ``hook()`` (None: nothing)."""

    def __init__(self, hook: Callable[[], None] | None):
        self.hook = hook

    def __enter__(self):
        self.old = getattr(_pausing, "hook", None)
        _pausing.hook = self.hook
        return self

    def __exit__(self, *exc):
        _pausing.hook = self.old
        return False
