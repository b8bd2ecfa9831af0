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

import time
from typing import Callable

Progress = Callable[[float, str], None]


class Cancelled(Exception):
    """The work was cancelled (a Cancel pressed, the visitor left); it stopped between two
    steps."""


def say(progress: Progress | None, fraction: float, message: str) -> None:
    """Report to ``progress`` (if any), with ``fraction`` kept within 0..1."""
    if progress is not None:
        progress(min(max(fraction, 0.0), 1.0), message)


# --------------------------------------------------------------------------- time left
def left_text(seconds: float) -> str:
    """A time left in words, rounded as an estimate deserves: "about 40 s left",
    "about 3 min left", "about 1 h 20 min left"."""
    if seconds < 60:
        return f"about {max(5, round(seconds / 5) * 5):.0f} s left"
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


def with_eta(progress: Progress | None, *, clock: Callable[[], float] = time.monotonic,
             **rate) -> Progress | None:
    """``progress`` with the measured time left behind each message ("... · about 3 min
    left"), from the fractions reported so far (``Rate``)."""
    if progress is None:
        return None
    r = Rate(1.0, clock=clock, **rate)

    def report(fraction: float, message: str) -> None:
        left = r.left(fraction) if fraction < 1.0 else ""
        progress(fraction, f"{message} · {left}" if left else message)
    return report
