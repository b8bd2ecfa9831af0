"""The Sweep tab: a grid search over two layer counts, each cell recomposed in memory and scored
on a small fixed item set (gold-solution NLL or accuracy)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .served import LIMITS, Progress, WorkbenchError, bounded, capped
from .session import Session


@dataclass
class SweepResult:
    axes: tuple[str, str]
    xs: list[int]
    ys: list[int]
    scores: list[list[float | None]]   # scores[iy][ix]; None: impossible configuration
    metric: str
    figure: Any
    rows: list[list]                   # x, y, score, best first (the table the visitor clicks)

    @property
    def best(self) -> list | None:
        """[x, y, score] of the best configuration (lowest NLL, highest accuracy), if any."""
        return self.rows[0] if self.rows else None


SWEEP_AXES = {"bottom / top": ("bottom", "top"),
              "transition bottom / top": ("transition_bottom", "transition_top")}


def parse_values(text: str, name: str, hi: int) -> list[int]:
    """'0,2,4', '0-4' or '0-8:2' -> sorted ints within 0..hi (layer counts: 0 up to the depth).

    Each item is read by the merge's one layer parser (``partition.parse_layers`` over ``hi + 1``
    values: bounds checked before any range is built, so 'first 3' and 'all' work too);
    ``:STEP`` then keeps every STEP-th value of that item."""
    from ..merge.partition import ConfigError, parse_layers

    out: set[int] = set()
    for part in capped(name, text, LIMITS.values_chars).split(","):
        part = part.strip()
        if not part:
            continue
        rng, _, step = part.partition(":")
        try:
            every = int(step) if step.strip() else 1
            values = sorted(parse_layers(rng, hi + 1)) if rng.strip() else []
        except (ValueError, ConfigError):  # ConfigError is a ValueError: one message for both
            values = []
        if not values or every < 1:
            raise WorkbenchError(f"{name}: {part!r} is not a value or range within 0..{hi} "
                                 "(use e.g. 0,2,4 or 0-6:2)")
        out.update(values[::every])
    if not out:
        raise WorkbenchError(f"{name}: give at least one value")
    return sorted(out)


def sweep_grid(session: Session, base_config, axes: str = "bottom / top",
               x_values: str = "0,2,4", y_values: str = "0,1,2", source: str = "gsm-symbolic",
               lang: str = "sw", n: int = 4, shots: int = 0, metric: str = "nll",
               progress: Progress | None = None) -> SweepResult:
    """Score a grid of configurations on a small fixed item set by in-memory recomposition
    (the library's ``sweeps.runner.run_sweep`` on this session's live model)."""
    from contextlib import contextmanager
    from dataclasses import replace

    from . import figures as plots
    from ..evaluation.data import load_items
    from ..sweeps.runner import run_sweep, sweep_request
    from ..sweeps.scoring import EvalSettings

    if metric not in ("nll", "accuracy"):
        raise WorkbenchError(f"sweep score: 'nll' or 'accuracy', got {metric!r}")
    if axes not in SWEEP_AXES:
        raise WorkbenchError(f"sweep over {axes!r}? choose one of {', '.join(SWEEP_AXES)}")
    fx, fy = SWEEP_AXES[axes]
    xs = parse_values(x_values, fx.replace("_", " "), session.num_layers)
    ys = parse_values(y_values, fy.replace("_", " "), session.num_layers)
    if len(xs) * len(ys) > LIMITS.sweep_cells:
        raise WorkbenchError(f"{len(xs)} x {len(ys)} = {len(xs) * len(ys)} configurations; this "
                             f"server allows {LIMITS.sweep_cells} per sweep")
    n = bounded("sweep questions", n, 1, LIMITS.sweep_items)
    items = load_items(source, lang, n)
    if metric == "nll" and not all(it.solution for it in items):
        raise WorkbenchError("gold NLL needs worked solutions: use GSM-Symbolic, or score by accuracy")
    guard = session.begin(progress)

    @contextmanager
    def checkout():  # the live model shows one cell at a time; the visitor's build stays
        with session.lock:
            yield session.live()

    fixed = {k: v for k, v in replace(base_config, partition=None).to_dict().items()
             if k not in ("method", "task", "lang", "base")}
    # NLL needs one forward pass per item (generation cut to 1 token); accuracy: 64 tokens
    request = sweep_request(session.paths["task"], session.paths["lang"], {fy: ys, fx: xs},
                            base=session.paths.get("base"), fixed=fixed,
                            eval=EvalSettings(source, (lang,), n, shots, metric,
                                              max_new_tokens=64), order="snake")
    try:
        outcome = run_sweep(request, checkout=checkout, progress=guard)
    except ValueError as e:   # a config error of every cell, or none fits: one line
        raise WorkbenchError(str(e)) from None
    scores: list[list[float | None]] = [[None] * len(xs) for _ in ys]
    rows = []
    for rec in outcome.records():   # grid order; impossible cells stay empty
        x, y = rec["point"][fx], rec["point"][fy]
        s = rec["scores"][lang]
        scores[ys.index(y)][xs.index(x)] = s["nll"] if metric == "nll" else s["accuracy"]
        rows.append([x, y, round(scores[ys.index(y)][xs.index(x)], 4)])
    guard(1.0, "done")
    # best first (ties keep grid order): lowest NLL, highest accuracy
    rows.sort(key=lambda r: r[2] if metric == "nll" else -r[2])
    if metric == "nll":  # the figure stars the highest score: plot -NLL
        fig = plots.sweep_heatmap(xs, ys, [[None if v is None else -v for v in r] for r in scores],
                                  x_label=fx.replace("_", " "), y_label=fy.replace("_", " "),
                                  score_label="-gold NLL (higher is better)", fmt=".3f")
    else:
        fig = plots.sweep_heatmap(xs, ys, scores, x_label=fx.replace("_", " "),
                                  y_label=fy.replace("_", " "), score_label="accuracy")
    return SweepResult((fx, fy), xs, ys, scores, metric, fig, rows)


