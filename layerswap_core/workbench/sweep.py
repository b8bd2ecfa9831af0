"""The Sweep tab: a grid search over two layer counts, each cell recomposed in memory and scored
on a small fixed item set (gold-solution NLL or accuracy). The sweep is the CLI's
(``sweeps.runner.run_sweep``: its grid and impossible cells, its order, its result keys and
scoring, ``sweeps.report``'s heatmap grid), without a results folder; its backend sends each
configuration as a job (kind ``SWEEP_KIND``) to the dispatcher, on an engine shared with the
other visitors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import time
from contextlib import nullcontext
from dataclasses import replace

from .served import LIMITS, Progress, WorkbenchError, bounded, capped, limits_for
from .session import Session, dispatcher
from ..engines.jobs import register_kind, tally
from ..evaluation.registry import load_items
from ..demos import variants as _demo_task  # noqa: F401  (registers the demo-variants task)
from ..merge.partition import ConfigError
from ..sweeps.grid import axis_values, expand
from ..sweeps.report import score_grid
from ..sweeps.backends import Backend, register_backend
from ..sweeps.runner import MODEL_FIELDS, SweepRequest, run_sweep
from ..sweeps.scoring import EvalSettings, SweepWorker
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
    """The Sweep tab's values of one axis, sorted: the sweeps' one axis reader
    (``sweeps.grid.axis_values`` with the model's depth ``hi``: '0,2,4', '0-8:2', 'first 3',
    'all'), after the length cap of a visitor's text."""
    try:
        return sorted(axis_values(capped(name, text, LIMITS.values_chars), name, "count",
                                  depth=hi))
    except ConfigError as e:
        raise WorkbenchError(str(e)) from None


def _scoring(metric: str) -> dict:
    """A sweep job's settings for its score: the gold NLL teacher-forced, or 64-token answers."""
    return {"metric": "nll"} if metric == "nll" else {"max_new_tokens": 64, "with_nll": False}


SWEEP_KIND = "sweep-configuration"   # one configuration of a sweep (``_sweep_config_job``)


def sweep_seconds(session: Session, cells: int, n: int, metric: str = "nll") -> float:
    """The dispatcher's estimate of a sweep of ``cells`` configurations on ``n`` items (as one
    job: its start-up counted once)."""
    job = session.job(SWEEP_KIND, [None] * int(cells), [None] * int(n), **_scoring(metric))
    return dispatcher().estimate(job)


def sweep_caps(session: Session) -> int:
    """The most items the Sweep slider offers on this server: the largest grid scored by
    accuracy (the slower score) is estimated within ``HEADROOM`` of the job budget."""
    limits = limits_for(session.access)
    if not session.access.served:   # one's own machine: no job budget (the estimate is shown)
        return limits.sweep_items
    budget = HEADROOM * dispatcher().job_seconds
    for n in range(limits.sweep_items, 1, -1):
        if sweep_seconds(session, limits.sweep_cells, n, "accuracy") <= budget:
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
    cap = limits_for(session.access).sweep_cells
    if cells > cap:   # said before Run, not after
        return f"⚠ {cells} configurations: this server allows {cap} per sweep."
    return f"{cells} configurations. " + estimate_line(sweep_seconds(session, cells, n, metric),
                                                       session, scoring=metric == "nll")


def _sweep_config_job(engine, job, progress: Progress | None) -> dict:
    """One configuration of a sweep scored on the engine the dispatcher lends, by the sweeps'
    own worker (``sweeps.scoring.SweepWorker``: show the configuration, ``score_model``):
    ``job.what`` is the sweeps' job (key, point, config), ``settings["eval"]`` the
    ``EvalSettings`` as a dict and ``settings["eval_items"]`` language -> (items, exemplars).
    Returns the sweeps' result record."""
    s = job.settings
    count, n_items = tally(job), len(job.items)
    label = s["part"]["name"]
    worker = SweepWorker({}, s["eval"], s["eval_items"], checkout=lambda: nullcontext(engine.live))
    t0 = time.perf_counter()
    count.say(progress, 0, label, 0, "setting up the model")
    record = worker.run(job.what, progress=lambda f, m: count.say(progress, 0, label, f * n_items))
    if s["eval"]["metric"] != "nll":   # generation measured the engine's speed
        engine.measured(job.generated_tokens, time.perf_counter() - t0)
    else:                              # the seconds per scored item, this configuration shown
        engine.measured_items(n_items, time.perf_counter() - t0)
    count.say(progress, 0, label, n_items)
    return record


register_kind(SWEEP_KIND, _sweep_config_job)


@dataclass(frozen=True)
class DispatcherOptions:
    """The app's sweep backend's options: whose engine, which score, whose bar."""
    session: Any
    metric: str = "nll"
    progress: Any = None


def _run_on_dispatcher(jobs: list[dict], worker_args: dict, handle, options: DispatcherOptions,
                       *, checkout=None, progress=None) -> None:
    """The app's sweep backend (``sweeps.backends``, "dispatcher"): each configuration, in the
    sweep's order, one job of the dispatcher on the session's engine (another visitor's short
    job waits at most one configuration; cancel stops between configurations)."""
    _on_dispatcher(options.session, options.metric, options.progress)(jobs, worker_args, handle)


register_backend(Backend("dispatcher", "each configuration a job of the app's dispatcher",
                         DispatcherOptions, _run_on_dispatcher))


def _on_dispatcher(session: Session, metric: str, progress: Progress | None):
    """Score the jobs on the session's engine, one dispatcher job per configuration."""
    def score(jobs: list[dict], worker_args: dict, handle) -> None:
        items = [it for its, _ in worker_args["eval_items"].values() for it in its]
        # the visitor's claim held across the sweep (a light job: no heavy slot), so that a
        # Cancel pressed between two configurations' jobs is seen, not cleared by the next one
        with dispatcher().hold(session.job("show", "sweep")) as between:
            for k, job in enumerate(jobs):
                between(k / len(jobs), "")       # Cancel, the time budget: stop here
                _score_one(k, job, jobs, items, worker_args, handle)

    def _score_one(k, job, jobs, items, worker_args, handle) -> None:
        label = ", ".join(f"{a.replace('_', ' ')} {v}" for a, v in reversed(job["point"].items()))
        part = dict(units=len(jobs), items=len(items), unit="configuration",
                    verb="scored" if metric == "nll" else "answered", first_unit=k,
                    part_units=1, name=label)
        # the bar over the whole sweep: configuration k's own 0..1 placed in its share, so it
        # moves per item and its time left counts the sweep (it restarted at 0 per configuration)
        whole = None if progress is None else (
            lambda f, m: progress((k + min(max(f, 0.0), 1.0)) / len(jobs), m))
        handle(dispatcher().run(session.job(
            SWEEP_KIND, job, items, eval=worker_args["settings"],
            eval_items=worker_args["eval_items"], work_items=len(items), part=part,
            **_scoring(metric)), whole))
    return score


def sweep_grid(session: Session, base_config, axes: str = "bottom / top",
               x_values: str = "0,2,4", y_values: str = "0,1,2", source: str = "gsm-symbolic",
               lang: str = "sw", n: int = 4, shots: int = 0, metric: str = "nll",
               progress: Progress | None = None) -> SweepResult:
    """Score a grid of configurations on a small fixed item set by in-memory recomposition: the
    sweeps' grid, order and runner (``sweeps.runner.run_sweep``, no results folder), each
    configuration a job of the dispatcher; the heatmap's grid is the CLI's
    (``sweeps.report.score_grid``)."""
    if metric not in ("nll", "accuracy"):
        raise WorkbenchError(f"sweep score: 'nll' or 'accuracy', got {metric!r}")
    if axes not in SWEEP_AXES:
        raise WorkbenchError(f"sweep over {axes!r}? choose one of {', '.join(SWEEP_AXES)}")
    fx, fy = SWEEP_AXES[axes]
    xs = parse_values(x_values, fx.replace("_", " "), session.num_layers)
    ys = parse_values(y_values, fy.replace("_", " "), session.num_layers)
    limits = limits_for(session.access)
    if len(xs) * len(ys) > limits.sweep_cells:
        raise WorkbenchError(f"{len(xs)} x {len(ys)} = {len(xs) * len(ys)} configurations; this "
                             f"server allows {limits.sweep_cells} per sweep")
    n = bounded("sweep questions", n, 1, limits.sweep_items)
    items = load_items(source, lang, n)
    if metric == "nll" and not all(it.solution for it in items):
        raise WorkbenchError("gold NLL needs worked solutions: use GSM-Symbolic, or score by accuracy")
    grid = {fy: ys, fx: xs}   # the sweeps' grid: rows (y) the first axis, columns (x) the last
    base = replace(base_config, method="layer_swap", partition=None)
    records: list[dict] = []
    if expand(grid, base, session.num_layers, session.has_base)[0]:   # any possible cell
        settings = EvalSettings(source, (lang,), n, shots, metric, False,
                                None if metric == "nll" else 64)
        config = {k: v for k, v in base.to_dict().items() if k not in MODEL_FIELDS}
        request = SweepRequest(session.paths["task"], session.paths["lang"], grid,
                               session.paths.get("base"), config, settings,
                               backend="dispatcher", backend_options=dict(
                                   session=session, metric=metric, progress=progress))
        records = run_sweep(request).records()
    scores: list[list[float | None]] = score_grid(records, grid, lang, metric)[4]
    rows = [[xs[ix], ys[iy], round(v, 4)] for iy, row in enumerate(scores)
            for ix, v in enumerate(row) if v is not None]
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


