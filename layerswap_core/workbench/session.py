"""The workbench session: one visitor's chosen models, as plain data, and the dispatcher its
jobs run on.

``app.py`` only lays out components and calls plain functions of this package; each takes plain
arguments (strings, numbers, a ``MergeConfig``) and returns plain values or plotly figures, so
it is testable without a browser. This module holds the ``Session`` (opened on the Models tab,
``models.open_session``; closed when the visitor leaves), the page's top line, the warm-up of a
session's engine and its probes. Each tab has a module of its own (``models``, ``configure``,
``build``, ``deltas``, ``evaluate``, ``sweep``, ``chat``); what visitors may touch, the limits
and the one-line errors are in ``served``.

Memory model: a ``Session`` is plain data (references, the configuration built, statistics,
results), kept per visitor by ``gr.State`` and freed when they leave (``close_session``). The
live models are engines (``engines.pool``): one ``merge.live.LiveModel`` per trio of models,
shared by every visitor on that trio, bounded in number, lent to one job at a time by the
dispatcher (``engines.dispatch``), which runs them here or on ZeroGPU.
"""
from __future__ import annotations

import atexit
import threading
import uuid
from contextlib import contextmanager
from typing import Any

from ..checkpoints.compatibility import checked_models, open_models
from ..checkpoints.loading import pick_device
from ..engines.dispatch import ZERO_DEVICE, Dispatcher, default as default_dispatcher
from ..engines.jobs import Job, show
from ..evaluation.registry import default_exemplars, load_items
from ..demos import variants as _demo_task  # noqa: F401  (registers the demo-variants task)
from ..engines.pool import Trio
from ..demos import trios as demos
from ..merge import mergekit_yaml
from .served import LIMITS, Progress, WorkbenchError
from ..merge.config import DTYPES
from ..merge.executor import most_output_bytes


ROLES = ("base", "task", "lang")
ROLE_LABELS = {"base": "base", "task": "task expert", "lang": "language expert", "merged": "merged"}
DEMO_REFS = demos.first().refs   # the page's first demo trio (``demos.trios``)


def demo_trio_choices() -> dict[str, str]:
    """The demo trios a click on the Models tab puts in place: key -> button label (one button
    each, from the registry of ``demos.trios``)."""
    return demos.choices()


def demo_trio_refs(key: str) -> dict[str, str]:
    """base, task, lang of a demo trio."""
    return demos.demo(key).refs


def demo_experts() -> list[str]:
    """The demo trios' task and language experts (the Models tab's expert choices)."""
    return list(dict.fromkeys(ref for t in demos.DEMOS.values() for ref in (t.task, t.lang)))


# --------------------------------------------------------------------------- session
class Session:
    """One visitor's workbench as plain data: the chosen references, the merge config last
    built, the statistics and results. It pickles and holds no model, lock or open file: the
    live models are engines shared by every visitor on the same models
    (``engines.pool.EnginePool``), and everything that needs one is a job run by the one
    dispatcher (``engines.dispatch``) under this session's ``id``."""

    def __init__(self, report, visitor: str | None = None):
        # report: the Models tab's check (``models.ModelsReport``)
        if not report.ok:
            raise WorkbenchError("these models cannot be merged: " + "; ".join(report.problems))
        # the visitor's page for the dispatcher (``visitor``: the page session, so that closing
        # the page stops its jobs; without one, this session alone); the person behind it (the
        # access's person: a signed-in user, else one client address, in every tab and agent
        # session) has one heavy job at a time
        self.id = visitor or uuid.uuid4().hex
        self.planned = None   # the merge config the Configure tab's diagram shows (last valid)
        self.person = report.access.person or report.access.namespace or self.id
        self.refs = dict(report.refs)
        self.names = dict(report.names or report.refs)
        # how recipes (layerswap.yaml, card, mergekit.yaml, configs) name the models: served,
        # as the visitor named them (owner/name@commit), never the server's folders
        self.recipe = dict(report.recipe or report.refs)
        self.access = report.access
        # headers only: architecture, output tensor names (tied heads dropped), checked once by
        # models.check_models (the Models tab)
        inputs = report.models or open_models(
            {role: self.refs[role] for role in ("task", "lang", "base") if role in self.refs})
        # the check's result as plain data: save and zip reuse it while the folders are unchanged
        self.checked = checked_models(inputs) if report.models is not None else None
        # what a save writes at most, by output dtype (None: the task model's own)
        self.save_bytes = {d: most_output_bytes(inputs, dtype=d) for d in (None, *DTYPES)}
        self.paths = {role: str(p) for role, p in inputs.paths.items()}
        self.arch = inputs.arch
        self.num_layers = self.arch.num_layers
        self.param_names = list(inputs.names)
        self.opened = mergekit_yaml.Opened.of(inputs)   # for the zip's mergekit.yaml
        self.device = pick_device()
        self.kind_params: dict[int, dict[str, int]] | None = None  # configure.layer_kind_params
        self.tau: float | None = None       # the threshold of the delta views last drawn
        self.stats: dict[str, Any] = {}     # role -> DeltaStats (base vs that expert)
        self.closed = False   # other models were picked (or the visitor left): its jobs stopped
        self.built_config = None            # MergeConfig of the last build (shown on demand)

    @property
    def checkpoint_bytes(self) -> int:
        """What a save in the task model's own dtypes writes, at most."""
        return self.save_bytes[None]

    @property
    def has_base(self) -> bool:
        return "base" in self.paths

    @property
    def trio(self) -> Trio:
        """The engine this session's jobs run on (shared with every visitor on these models)."""
        zero = dispatcher().placement == "zerogpu"
        return Trio(self.refs["task"], self.refs["lang"], self.refs.get("base"),
                    device=ZERO_DEVICE if zero else self.device)

    def built(self):
        """The configuration last built: the one merged model Save, Zip, Push, Evaluate and
        Chat act on, whatever the Configure tab shows since."""
        if self.built_config is None:
            raise WorkbenchError("build the merged model first (Build tab)")
        return self.built_config

    def what(self, role: str):
        """What a job shows for ``role``: "base", "task", "lang", or "merged" (the last build,
        as a config dict)."""
        if role == "merged":
            return self.built().to_dict()
        if role in self.paths:
            return role
        raise WorkbenchError(f"no {ROLE_LABELS.get(role, role)} model chosen (Models tab)")

    def job(self, kind: str, what=None, items=(), **settings) -> Job:
        """A plain-data job of this visitor on this session's engine."""
        return Job(kind, self.trio, self.id, what, list(items), settings, person=self.person,
                   budgeted=self.access.served)


def dispatcher() -> Dispatcher:
    """The server's one dispatcher (``engines.dispatch.default``)."""
    return default_dispatcher()


def cancel(session: Session | None) -> bool:
    """Ask the session's running job to stop at its next step; False when none runs."""
    return session is not None and dispatcher().cancel(session.id)


def running(session: Session | None) -> bool:
    """Whether a job of this session's visitor runs now (nothing is asked of it)."""
    return session is not None and dispatcher().running(session.id)


@contextmanager
def showing(session: Session, role: str, progress: Progress | None = None):
    """(model, tokenizer) of an engine showing ``role`` for the block, held by nobody else
    meanwhile (in this process: the local placement). For scripts and tests."""
    d = dispatcher()
    what = session.what(role)
    with d.pool.checkout(session.trio, session.id, progress) as engine:
        show(engine, what, progress)
        yield engine.live.model, engine.live.tokenizer


def close_session(session: Session | None) -> None:
    """The visitor left (their page closed, their session expired): their jobs are cancelled,
    their place in the queue given up, their results dropped."""
    if session is not None:
        session.closed = True
        dispatcher().leave(session.id)
        session.stats.clear()
        session.built_config = None


def leave(visitor: str | None) -> None:
    """The visitor's page closed: its jobs stop at their next step and give up their places
    (``Dispatcher.leave``), whatever ``gr.State`` still holds for it."""
    if visitor:
        dispatcher().leave(visitor)


def banner(session: Session | None) -> str:
    """The page's top line, derived from the session alone (never a leftover message)."""
    if session is None:
        return "No models in use: pick compatible models on the Models tab."
    n = session.names
    models = f"{n['task']} + {n['lang']}" + (f" over {n['base']}" if "base" in n else "")
    built = ("built in memory (" + session.built_config.describe(session.num_layers) + ")"
             if session.built_config is not None
             else "not built yet (Build tab)")
    return f"Models: {models} ({session.num_layers} layers). Merged model: {built}."


_WARMING: dict[Trio, threading.Thread] = {}   # trio -> its warm-up, while it runs


def warm_up(session: Session) -> threading.Thread | None:
    """Load the engine of the session's models in the background when none is loaded yet (in
    this process): the first Build then only rewrites the tensors the merge changes. Then,
    when the dispatcher has no speed for these models yet, one small evaluation measures it
    (``speed_probe``), and one small scoring job the seconds per scored item
    (``scoring_probe``): the caps and estimates on the page are this server's from the start."""
    d = dispatcher()
    trio = session.trio
    loaded = any(e.trio == trio for e in d.pool.engines)
    if d.placement != "local" or (loaded and trio in d.speeds and trio in d.item_seconds) \
            or trio in _WARMING:
        return None

    def load():
        try:
            with d.pool.checkout(trio):
                pass
            if trio not in d.speeds:
                d.run(speed_probe(session))
            if trio not in d.item_seconds:
                d.run(scoring_probe(session))
        except Exception:  # noqa: BLE001 - Build reports loading errors where they matter
            return
        finally:
            _WARMING.pop(trio, None)
    thread = threading.Thread(target=load, name="layerswap-warm-up", daemon=True)
    _WARMING[trio] = thread
    thread.start()
    return thread


@atexit.register
def _join_warm_ups(timeout: float = 120.0) -> None:
    """At exit, wait (up to ``timeout`` s each) for the warm-ups still running: the interpreter
    ending while a daemon thread is inside torch aborts the process ("terminate called without
    an active exception", exit status 134), e.g. a test run whose last test picked models."""
    for thread in list(_WARMING.values()):
        thread.join(timeout)


def speed_probe(session: Session) -> Job:
    """The server's own job (no visitor: it takes nobody's slot) that measures the engine's
    speed: one chunk of an evaluation of the task expert at the page's most shots (the longest
    prompts, so the measured speed errs on the slow side), 16 tokens per answer."""
    items = load_items("gsm-symbolic", "en")[:4]
    return Job("evaluate", session.trio, "", {"task": "task"}, items,
               {"shots": LIMITS.shots, "max_new_tokens": 16, "with_nll": False,
                "exemplars": default_exemplars(items, LIMITS.shots, cot=False)})


def scoring_probe(session: Session) -> Job:
    """The server's own job measuring the seconds per item of scoring without generating (the
    Sweep tab's default, gold NLL): four GSM-Symbolic items scored on the task expert, as the
    Sweep tab's defaults would (Swahili, no shots)."""
    return Job("nll", session.trio, "", "task", load_items("gsm-symbolic", "sw")[:4], {"shots": 0})


def measured_speed(session: Session, wait: float = 0.0) -> float | None:
    """Tokens per second the dispatcher measured on the session's models (None: not yet),
    after waiting up to ``wait`` seconds for their warm-up's measurement."""
    thread = _WARMING.get(session.trio)
    if thread is not None and wait > 0:
        thread.join(wait)
    return dispatcher().speeds.get(session.trio)


def require(session: Session | None) -> Session:
    if session is None:
        raise WorkbenchError("pick compatible models first (Models tab)")
    return session


