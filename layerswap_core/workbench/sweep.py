"""The Sweep tab: a grid search over two layer counts, each cell recomposed in memory and scored
on a small fixed item set (gold-solution NLL or accuracy). The sweep is one job of kind "sweep"
(``engines.jobs``): a chunk per configuration, on an engine shared with the other visitors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .served import LIMITS, Progress, WorkbenchError, bounded, capped
from .session import Session, dispatcher
from ..evaluation.registry import default_exemplars, load_items
from ..merge.partition import ConfigError, parse_layers
from .evaluate import HEADROOM, estimate_line
from . import figures as plots


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
    def columns(self) -> list[str]:
        """The table's headers: the swept fields and the score, as the figure names them."""
        return [self.axes[0].replace("_", " "), self.axes[1].replace("_", " "),
                "gold NLL (lower is better)" if self.metric == "nll" else "accuracy"]

    @property
    def best(self) -> list | None:
        """[x, y, score] of the best configuration (lowest NLL, highest accuracy); None when
        none was scored or all scored the same (none is better: ``tied``)."""
        return self.rows[0] if self.rows and not self.tied else None

    @property
    def tied(self) -> bool:
        """Two or more configurations scored, all the same."""
        return len(self.rows) > 1 and len({r[2] for r in self.rows}) == 1


SWEEP_AXES = {"bottom / top": ("bottom", "top"),
              "transition bottom / top": ("transition_bottom", "transition_top")}


def parse_values(text: str, name: str, hi: int) -> list[int]:
    """'0,2,4', '0-4' or '0-8:2' -> sorted ints within 0..hi (layer counts: 0 up to the depth).

    Each item is read by the merge's one layer parser (``partition.parse_layers`` over ``hi + 1``
    values: bounds checked before any range is built, so 'first 3' and 'all' work too);
    ``:STEP`` then keeps every STEP-th value of that item."""
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


def _scoring(metric: str) -> dict:
    """A sweep job's settings for its score: the gold NLL teacher-forced, or 64-token answers."""
    return {"metric": "nll"} if metric == "nll" else {"max_new_tokens": 64, "with_nll": False}


def sweep_seconds(session: Session, cells: int, n: int, metric: str = "nll") -> float:
    """The dispatcher's estimate of a sweep of ``cells`` configurations on ``n`` items."""
    job = session.job("sweep", [None] * int(cells), [None] * int(n), **_scoring(metric))
    return dispatcher().estimate(job)


def sweep_caps(session: Session) -> int:
    """The most items the Sweep slider offers on this server: the largest grid scored by
    accuracy (the slower score) is estimated within ``HEADROOM`` of the job budget."""
    budget = HEADROOM * dispatcher().job_seconds
    for n in range(LIMITS.sweep_items, 1, -1):
        if sweep_seconds(session, LIMITS.sweep_cells, n, "accuracy") <= budget:
            return n
    return 1


def sweep_line(session: Session | None, axes: str, x_values: str, y_values: str, n,
               metric: str) -> str:
    """The Sweep tab's estimate as its grid and sliders stand (the grid's own error, if any)."""
    if session is None:
        return ""
    try:
        fx, fy = SWEEP_AXES.get(axes, SWEEP_AXES["bottom / top"])
        cells = (len(parse_values(x_values, fx.replace("_", " "), session.num_layers))
                 * len(parse_values(y_values, fy.replace("_", " "), session.num_layers)))
    except WorkbenchError as e:
        return f"⚠ {e}"
    return f"{cells} configurations. " + estimate_line(sweep_seconds(session, cells, n, metric),
                                                       session)


def sweep_grid(session: Session, base_config, axes: str = "bottom / top",
               x_values: str = "0,2,4", y_values: str = "0,1,2", source: str = "gsm-symbolic",
               lang: str = "sw", n: int = 4, shots: int = 0, metric: str = "nll",
               progress: Progress | None = None) -> SweepResult:
    """Score a grid of configurations on a small fixed item set by in-memory recomposition."""
    from dataclasses import replace

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
    cells, configs, labels = [], [], []
    for iy, y in enumerate(ys):
        for ix, x in enumerate(xs):
            try:
                cfg = replace(base_config, method="layer_swap", partition=None, **{fx: x, fy: y})
                cfg.validate(session.num_layers, has_base=session.has_base)
            except ConfigError:
                continue  # impossible cell (more swapped layers than the model has): empty
            cells.append((iy, ix))
            configs.append(cfg.to_dict())
            labels.append(f"{fx.replace('_', ' ')} {x}, {fy.replace('_', ' ')} {y}")
    scores: list[list[float | None]] = [[None] * len(xs) for _ in ys]
    rows = []
    # one job, a chunk per configuration: the engine shows each cell in turn (another
    # visitor's short job waits at most one cell); the NLL is teacher-forced, no generation
    scoring = _scoring(metric)
    summaries = dispatcher().run(session.job(
        "sweep", configs, items, shots=shots, exemplars=default_exemplars(items, shots, cot=False),
        labels=labels, **scoring), progress) if configs else []
    for (iy, ix), s in zip(cells, summaries):
        scores[iy][ix] = s["mean_gold_nll"] if metric == "nll" else s["accuracy"]
        if scores[iy][ix] is not None:
            rows.append([xs[ix], ys[iy], round(scores[iy][ix], 4)])
    # best first (ties keep grid order): lowest NLL, highest accuracy
    rows.sort(key=lambda r: r[2] if metric == "nll" else -r[2])
    if metric == "nll":  # the NLL as the table shows it; the lowest is starred and brightest
        fig = plots.sweep_heatmap(xs, ys, [[None if v is None else v for v in r] for r in scores],
                                  x_label=fx.replace("_", " "), y_label=fy.replace("_", " "),
                                  score_label="gold NLL (lower is better)", fmt=".3f",
                                  lower_is_better=True)
    else:
        fig = plots.sweep_heatmap(xs, ys, scores, x_label=fx.replace("_", " "),
                                  y_label=fy.replace("_", " "), score_label="accuracy")
    return SweepResult((fx, fy), xs, ys, scores, metric, fig, rows)


