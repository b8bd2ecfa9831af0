"""The one progress bar of the `layerswap` commands: tqdm on stderr, driven by the library's
``progress(fraction, message)`` callbacks."""
from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Iterator

from ..progress import Progress

BAR_FORMAT = "{percentage:3.0f}%|{bar:30}| {elapsed}<{remaining} {desc}"
STEPS = 1000   # resolution of the bar
WIDTH = 60     # characters of the message shown after the bar (its end, where names differ)


@contextmanager
def progress_bar(label: str | None = None, *,
                 leave: bool = True) -> Iterator[Progress]:
    """``progress(fraction, message)`` drawing one bar, closed on leaving (also on errors).
    ``label`` prefixes every message; ``leave=False`` clears the bar when it closes."""
    from tqdm import tqdm

    bar = tqdm(total=STEPS, bar_format=BAR_FORMAT, leave=leave)

    def progress(fraction: float, message: str = "") -> None:
        text = f"{label}: {message}" if label and message else label or message
        bar.set_description_str(text if len(text) <= WIDTH else "..." + text[3 - WIDTH:],
                                refresh=False)
        bar.update(min(max(int(fraction * STEPS), 0), STEPS) - bar.n)  # tqdm throttles redraws

    try:
        yield progress
    finally:
        bar.close()
