"""The one progress bar of the `layerswap` commands: tqdm on stderr, driven by the library's
``progress(fraction, message)`` callbacks."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from collections.abc import Iterator

from ..progress import Progress

BAR_FORMAT = "{percentage:3.0f}%|{bar:30}| {elapsed}<{remaining} {desc}"
STEPS = 1000   # resolution of the bar
WIDTH = 60     # characters of the message shown after the bar (its end, where names differ)
# The bar appears once its command has run this long (as tqdm's own ``delay``), showing where
# the work is by then: importing tqdm and making the bar cost 20-30 ms, which a command that
# starts its work at once (a merge's copies) then spends beside its work instead of before it.
DELAY_S = 0.1


@contextmanager
def progress_bar(label: str | None = None, *,
                 leave: bool = True) -> Iterator[Progress]:
    """``progress(fraction, message)`` drawing one bar, closed on leaving (also on errors).
    ``label`` prefixes every message; ``leave=False`` clears the bar when it closes. A command
    that ends within ``DELAY_S`` shows no bar."""
    lock = threading.Lock()
    state = {"bar": None, "fraction": 0.0, "message": ""}

    def draw():   # under the lock, once the bar exists
        text = state["message"]
        text = f"{label}: {text}" if label and text else label or text
        bar = state["bar"]
        bar.set_description_str(text if len(text) <= WIDTH else "..." + text[3 - WIDTH:],
                                refresh=False)
        bar.update(min(max(int(state["fraction"] * STEPS), 0), STEPS) - bar.n)  # tqdm throttles

    def show():
        from tqdm import tqdm   # imported outside the lock (progress calls go on meanwhile)
        with lock:
            state["bar"] = tqdm(total=STEPS, bar_format=BAR_FORMAT, leave=leave)
            draw()
            state["bar"].refresh()   # what was said before it appeared (update throttles)

    def progress(fraction: float, message: str = "") -> None:
        with lock:
            state["fraction"], state["message"] = fraction, message
            if state["bar"] is not None:
                draw()

    timer = threading.Timer(DELAY_S, show)
    timer.daemon = True
    timer.start()
    try:
        yield progress
    finally:
        timer.cancel()
        timer.join()   # a bar being made is made (and then closed); none is made after this
        with lock:
            if state["bar"] is not None:
                state["bar"].close()
