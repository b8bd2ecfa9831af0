"""``run_sweep``: the one entry point of a sweep (``layerswap sweep`` and the app's Sweep tab).

The request -> the grid's cells (impossible ones set aside) -> their plans -> the order that
rewrites the fewest tensors -> the result keys (models' fingerprints, configuration, items,
generation settings) -> the configurations not done yet, scored by a backend of
``backends.BACKENDS`` (``local``: one worker in this process, on the engine its ``checkout``
lends; ``ray``: one actor per worker; the app's registers its dispatcher), with its options
in ``request.backend_options``. Every finished configuration is appended to
``DIR/results.jsonl`` at once.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from collections.abc import Callable

from ..merge.config import MergeConfig
from ..progress import Progress
from ..progress import say as _say
from .backends import backend as backend_of
from .grid import Cell, expand
from .order import OrderReport, choose_order, plan_codes
from .scoring import EvalSettings, load_eval_items
from .store import SweepStore, checkpoint_fingerprint, items_digest, result_key
from ..checkpoints.references import resolve
from ..merge.executor import open_inputs
from ..merge.plan import build_plan

MODEL_FIELDS = ("task", "lang", "base")


@dataclass
class SweepRequest:
    """Everything a sweep is (written to ``DIR/sweep.yaml``)."""
    task: str
    lang: str
    grid: dict[str, list]
    base: str | None = None
    config: dict = field(default_factory=dict)   # fixed MergeConfig fields (method included)
    eval: EvalSettings = field(default_factory=EvalSettings)
    out: str | None = None
    order: str = "auto"
    backend: str = "local"
    backend_options: dict = field(default_factory=dict)   # checked by the backend's record
    device: str = "auto"

    @property
    def refs(self) -> dict:
        return {r: str(v) for r, v in (("task", self.task), ("lang", self.lang),
                                       ("base", self.base)) if v is not None}

    def base_config(self) -> MergeConfig:
        fixed = {k: v for k, v in self.config.items() if k not in MODEL_FIELDS}
        return MergeConfig.from_dict(fixed)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["eval"] = self.eval.to_dict()
        return d


@dataclass
class SweepOutcome:
    """The cells, their results (grid order; previously done ones included) and the costs."""
    request: SweepRequest
    cells: list[Cell]
    impossible: list[tuple[Cell, str]]
    results: dict[str, dict]          # key -> record
    keys: list[str]                   # per cell
    order: OrderReport
    scored: int                       # configurations scored by this run
    reused: int                       # found done in results.jsonl

    @property
    def complete(self) -> bool:
        return all(k in self.results for k in self.keys)

    def records(self) -> list[dict]:
        """The results in grid order (cells not scored yet left out)."""
        return [self.results[k] for k in self.keys if k in self.results]


class SweepStopped(Exception):
    """Raised by ``on_result`` to stop a sweep early (what finished is kept)."""


def _job(cell: Cell, key: str) -> dict:
    config = {k: v for k, v in cell.config.to_dict().items() if k not in MODEL_FIELDS}
    return {"key": key, "point": dict(cell.point), "config": config}


def prepare(request: SweepRequest, progress: Progress | None = None):
    """The cells, impossible cells, order, eval items and jobs of a request (reads headers and
    a few MiB of each checkpoint; no engine)."""
    # lazy: merge.live adds 0.015 s to `layerswap`'s start (-X importtime; --help never needs it)
    from ..merge.live import role_plan

    chosen = backend_of(request.backend)
    options = chosen.parse(request.backend_options)
    settings = request.eval.check()
    _say(progress, 0.0, "reading the models' headers")
    inputs = open_inputs(request.task, request.lang, request.base)
    arch, names = inputs.arch, list(inputs.names)
    base = request.base_config()
    cells, impossible = expand(request.grid, base, arch.num_layers, "base" in inputs.paths)
    if not cells:
        why = impossible[0][1] if impossible else "the grid is empty"
        raise ValueError(f"no configuration of the grid fits these models ({why})")
    plans = [build_plan(c.config, names, arch) for c in cells]
    codes, start = plan_codes(plans, role_plan("task", names, arch))
    order = choose_order(codes, [c.index for c in cells], request.order, start,
                         chosen.workers(options))
    _say(progress, 0.3, "loading the items")
    eval_items = load_eval_items(settings)
    _say(progress, 0.6, "fingerprinting the models")
    # results kept in a folder are keyed by content; a sweep without one (the app's) by path
    prints = {role: checkpoint_fingerprint(resolve(ref)) if request.out else str(resolve(ref))
              for role, ref in request.refs.items()}
    digests = {lang: items_digest(*pair) for lang, pair in eval_items.items()}
    keys = [result_key(prints, _job(c, "")["config"], digests, settings.key()) for c in cells]
    return cells, impossible, order, eval_items, keys


def run_sweep(request: SweepRequest, *, checkout: Callable | None = None,
              progress: Progress | None = None, on_result: Callable[[dict], None] | None = None,
              limit: int | None = None,
              on_start: Callable[[SweepOutcome, int], None] | None = None) -> SweepOutcome:
    """Score every configuration of ``request`` not already in its results file (module
    docstring). ``checkout``: the local backend's engine lender (``with checkout() as
    engine``; default: one engine of this process, ``scoring.engine_checkout``);
    ``on_result(record)`` is called as each configuration finishes (raise ``SweepStopped`` to
    stop); ``limit``: score at most this many now; ``on_start(outcome, n)`` once the order is
    known, before the ``n`` configurations to score now. ``progress(fraction, message)`` follows
    configurations done."""
    cells, impossible, order, eval_items, keys = prepare(request, progress)
    store = SweepStore(request.out) if request.out else None
    results = store.open() if store else {}
    if store:
        store.write_request(request.to_dict())
    done_before = {k: results[k] for k in keys if k in results}
    jobs = [_job(cells[i], keys[i]) for i in order.order if keys[i] not in done_before]
    if limit is not None:
        jobs = jobs[:max(0, limit)]
    outcome = SweepOutcome(request, cells, impossible, dict(done_before), keys, order, 0,
                           len(done_before))
    total = len(jobs)
    if on_start is not None:
        on_start(outcome, total)

    def handle(record: dict) -> None:
        if store:
            store.append(record)
        outcome.results[record["key"]] = record
        outcome.scored += 1
        _say(progress, outcome.scored / max(1, total),
             f"{outcome.scored}/{total} configurations")
        if on_result is not None:
            on_result(record)

    if not jobs:
        return outcome
    worker_args = dict(refs=request.refs, settings=request.eval.to_dict(), eval_items=eval_items,
                       device=request.device)
    chosen = backend_of(request.backend)
    try:
        chosen.run(jobs, worker_args, handle, chosen.parse(request.backend_options),
                   checkout=checkout, progress=progress)
    except SweepStopped:
        pass
    return outcome


def sweep_request(task, lang, grid, *, base=None, method: str = "layer_swap", fixed=None,
                  **kw) -> SweepRequest:
    """A request from Python values (``grid`` as parsed by ``grid.parse_grid``)."""
    config = dict(fixed or {})
    config["method"] = method
    settings = kw.pop("eval", None) or EvalSettings()
    return SweepRequest(str(task), str(lang), grid, None if base is None else str(base),
                        config, settings, **kw)



