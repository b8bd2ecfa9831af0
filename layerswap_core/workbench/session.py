"""The workbench session: one visitor's chosen models, and the tabs that make and use it.

``app.py`` only lays out components and calls plain functions of this package; each takes plain
arguments (strings, numbers, a ``MergeConfig``) and returns plain values or plotly figures, so
it is testable without a browser. This module holds the ``Session`` (opened on the Models tab,
closed when the visitor leaves) and the tabs that shape the merge: Models, Configure (a
validated ``MergeConfig`` from the controls, its plan drawn) and Build (in memory, save, push,
zip). The other tabs have a module each (``deltas``, ``evaluate``, ``sweep``, ``chat``); what
visitors may touch, the limits and the one-line errors are in ``served``.

Memory model: a ``Session`` is plain data (references, the configuration built, statistics,
results), kept per visitor by ``gr.State`` and freed when they leave (``close_session``). The
live models are engines (``engines.pool``): one ``merge.live.LiveModel`` per trio of models,
shared by every visitor on that trio, bounded in number, lent to one job at a time by the
dispatcher (``engines.dispatch``), which runs them here or on ZeroGPU.
"""
from __future__ import annotations

import atexit
import functools
import math
import os
import tempfile
import threading
import uuid
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..checkpoints import hub as served_hub
from ..checkpoints.compatibility import (ModelSet, checked_models, open_models,
                                         problems as compatibility_problems)
from ..checkpoints.loading import dense_from_adapter, describe, pick_device
from ..checkpoints.embedded import EMBEDDED_PREFIX, embedded
from ..checkpoints.references import DEFAULT_BASE, check_free_space, is_adapter, is_offline
from ..engines.dispatch import ZERO_DEVICE, Dispatcher, default as default_dispatcher
from ..engines.jobs import Job, show
from ..evaluation.languages import LANGUAGES, language_of
from ..evaluation.registry import default_exemplars, load_items
from ..demos import variants as _demo_task  # noqa: F401  (registers the demo-variants task)
from ..engines.pool import Trio
from ..demos import trios as demos
from ..merge import mergekit_yaml, registry
from ..progress import say as _say
from .served import (HUB_ID, LIMITS, LOCAL, Access, Progress, WorkbenchError, capped,
                     check_replace, hide_paths, output_folder, readable_error, recipe_name,
                     vet_reference)
from ..checkpoints.reading import CheckpointReader
from ..checkpoints.tokenizer_panel import TokenizerPanel, tokenizer_panel
from ..merge.config import DTYPES, MergeConfig
from ..merge.executor import merge_to_folder, model_card, most_output_bytes
from ..merge.plan import build_plan
from . import figures as plots
from . import controls
from .saves import push_target, reserving


ROLES = ("base", "task", "lang")
ROLE_LABELS = {"base": "base", "task": "task expert", "lang": "language expert", "merged": "merged"}
DEMO_REFS = demos.first().refs   # the page's first demo trio (``demos.trios``)
# the bases that ship embedded (the Models tab offers them): the default first, then every other
# embedded model that is not an adapter over one
EMBEDDED_BASES = tuple(dict.fromkeys((DEFAULT_BASE, *(EMBEDDED_PREFIX + name for name, row
                                                      in embedded().items() if row.base is None))))


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
METHOD_LABELS = registry.METHOD_LABELS  # UI label -> MergeConfig.method (the registry's)
PARTITION_CHOICES = ("none (bottom/top sliders)", "A", "B", "C", "custom")


# --------------------------------------------------------------------------- models tab
@dataclass
class ModelsReport:
    refs: dict[str, str]               # what the library resolves (vetted; adapters: dense folders)
    rows: list[list[str]]              # role, reference, architecture, layers, hidden, vocab, dtype, size
    problems: list[str]
    num_layers: int | None = None
    names: dict[str, str] | None = None   # the references as the visitor gave them
    access: Access = LOCAL
    models: ModelSet | None = None        # the opened models (headers), checked once
    notes: tuple[str, ...] = ()           # warnings that do not stop the merge
    tokenizers: TokenizerPanel | None = None   # what differs in tokenizers and chat templates
    recipe: dict[str, str] | None = None  # how recipes name the models (``served.recipe_name``)

    HEADERS = ("role", "model", "architecture", "layers", "hidden", "vocab", "dtype", "size")

    @property
    def ok(self) -> bool:
        return not self.problems

    def markdown(self) -> str:
        panel = ("" if self.tokenizers is None or self.tokenizers.identical
                 else "\n\n" + self.tokenizers.markdown())
        if self.ok:
            return (f"**Compatible**: same architecture, shapes and vocabulary "
                    f"({self.num_layers} layers). Ready to configure."
                    + "".join(f"\n\n⚠ {n}" for n in self.notes) + panel)
        return "**Not compatible**:\n" + "\n".join(f"- {p}" for p in self.problems) + panel


def check_models(base: str, task: str, lang: str, progress: Progress | None = None,
                 access: Access = LOCAL) -> ModelsReport:
    """Describe the three models from their headers and check they can be merged.

    Nothing heavy runs: no weights are loaded. ``base`` may be empty (then the methods and
    views that need it say so). Every reference is vetted (``vet_reference``) before it is read.
    Raises WorkbenchError when a reference cannot be used at all, naming each one that cannot;
    its ``rows`` attribute is the models table with the readable ones described.
    """
    names = {role: capped(f"{ROLE_LABELS[role]} reference", ref, LIMITS.ref_chars).strip()
             for role, ref in (("base", base), ("task", task), ("lang", lang))}
    for role in ("task", "lang"):
        if not names[role]:
            raise WorkbenchError(f"give a {ROLE_LABELS[role]} (an embedded: name, a folder or a Hub id)")
    names = {r: v for r, v in names.items() if v}
    refs, rows, infos, errors, recipe = {}, {}, {}, [], {}
    for i, (role, name) in enumerate(names.items()):   # base first: adapters need it
        label = ROLE_LABELS[role]
        try:
            try:
                ref = vet_reference(name, access, progress)
                # served: the visitor's name for it (an adapter's, not its merge's folder)
                recipe[role] = recipe_name(name, ref, access)
                if role in ("task", "lang") and is_adapter(ref):   # merged into the base once
                    ref = str(dense_from_adapter(ref, refs.get("base"), progress))
                if not access.served:
                    recipe[role] = ref
            except ValueError as e:
                raise WorkbenchError(f"{label}: {readable_error(e)}") from e
            _say(progress, i / (len(names) + 1), f"reading {label} {name}")
            try:
                # a first use builds the model (a conversion, an adapter applied): its own bar
                info = describe(ref, progress=lambda f, m: _say(
                    progress, f, f"{label} ({i + 1} of {len(names)}): {m}"))
            except Exception as e:  # noqa: BLE001 - any unreadable model becomes one message
                if access.served and HUB_ID.fullmatch(name):   # not kept in the served cache
                    served_hub.served_cache().discard(name, ref)
                raise WorkbenchError(f"{label} {name!r}: {readable_error(e)}") from e
        except WorkbenchError as e:   # the others are still read: their rows stay valid
            errors.append(str(e))
            rows[role] = [label, _cell(name), _cell(f"⚠ cannot be read: {readable_error(e)}"),
                          "", "", "", "", ""]   # the whole reason is on the status line
            continue
        refs[role], infos[role] = ref, info
        rows[role] = [label, name, info.architecture,
                      str(info.num_layers), str(info.hidden_size), str(info.vocab_size), info.dtype,
                      f"{info.num_params / 1e6:.1f} M params, {info.size_bytes / 2**20:.0f} MiB"]
    if errors:
        err = WorkbenchError("; ".join(errors))
        err.rows = list(rows.values())   # the table: every reference, read or not
        raise err
    rows = list(rows.values())
    _say(progress, len(refs) / (len(refs) + 1), "checking compatibility")
    # the one check (checkpoints.compatibility), against the task expert; the Session reuses it
    models = open_models({role: refs[role] for role in sorted(refs, key=lambda r: r != "task")})
    found = compatibility_problems(models)
    if access.served:   # each model by its name, never its folder on the server
        folders = {path: recipe[role] for role, path in models.paths.items()}
        found = [hide_paths(p, folders) for p in found]
    note = reading_note(refs.get("base") or refs["task"], names["lang"])
    # tensors no kind rule can address, said before anything is built (issue #65)
    notes = [note] + [f"{role}: {infos[role].warning()}" for role in ("task", "lang", "base")
                      if role in infos and infos[role].warning()]
    notes.append(infos["task"].vision_note())   # a multimodal wrapper's kept vision tower
    return ModelsReport(refs, rows, found, infos["task"].num_layers, names, access, models,
                        tuple(n for n in notes if n), tokenizer_panel(models.paths), recipe)


READING_RATIO = 3.0   # tokens per word in the expert's language over English: a warning above


@functools.lru_cache(maxsize=16)
def _tokens_per_word(tokenizer_json: str, mtime: float, code: str) -> tuple[float, float]:
    """(language, English) tokens per word of a language's chat examples and their English
    twins under one tokenizer file; one load per file and language (a 262k-token
    tokenizer.json takes 1-4 s to load on this CPU)."""
    from tokenizers import Tokenizer   # lazy: only a language with examples needs it

    tok = Tokenizer.from_file(tokenizer_json)
    row = LANGUAGES[code]
    return tuple(sum(len(tok.encode(t, add_special_tokens=False).ids) for t in texts)
                 / sum(len(t.split()) for t in texts)
                 for texts in (row.chat_examples, row.english_twins))


def reading_note(base_folder, lang_ref: str) -> str | None:
    """A warning where the base's tokenizer reads the language expert's language badly: its
    chat examples take READING_RATIO times the tokens per word of their English twins or more
    (SmolLM2-135M spends 6.4 per Bengali word, 1.3 per English one); None otherwise or where
    the language or the tokenizer file is unknown."""
    code = language_of(lang_ref)
    row = LANGUAGES.get(code) if code else None
    path = Path(base_folder) / "tokenizer.json"
    if row is None or not row.english_twins or not path.is_file():
        return None
    lang, en = _tokens_per_word(str(path), path.stat().st_mtime, code)
    if lang < READING_RATIO * en:
        return None
    return (f"this base reads {row.name} at {lang:.1f} tokens per word ({en:.1f} for the same "
            f"problems in English): its models see {row.name} text in small pieces and often "
            f"answer it badly; a base whose tokenizer covers {row.name} reads it better")


TABLE_CELL_CHARS = 80   # a table cell's text: a long reference or reason keeps the columns on screen


def _cell(text: str) -> str:
    text = str(text)
    return text if len(text) <= TABLE_CELL_CHARS else text[:TABLE_CELL_CHARS - 1] + "…"


def unchecked_rows(base, task, lang) -> list[list[str]]:
    """Rows of the models table for references that could not be read (a failed check)."""
    given = {"base": base, "task": task, "lang": lang}
    return [[ROLE_LABELS[role], _cell(str(ref or "")), "(not read)", "", "", "", "", ""]
            for role, ref in given.items() if str(ref or "").strip()]


# --------------------------------------------------------------------------- session
class Session:
    """One visitor's workbench as plain data: the chosen references, the merge config last
    built, the statistics and results. It pickles and holds no model, lock or open file: the
    live models are engines shared by every visitor on the same models
    (``engines.pool.EnginePool``), and everything that needs one is a job run by the one
    dispatcher (``engines.dispatch``) under this session's ``id``."""

    def __init__(self, report: ModelsReport, visitor: str | None = None):
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
        # check_models (the models tab)
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
        self.kind_params: dict[int, dict[str, int]] | None = None  # see layer_kind_params
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


def open_session(base: str, task: str, lang: str, progress: Progress | None = None,
                 access: Access = LOCAL, visitor: str | None = None
                 ) -> tuple[Session | None, ModelsReport]:
    """The report, and a new Session when the models are compatible (else None); ``visitor``:
    the page it is for (``Session``)."""
    report = check_models(base, task, lang, progress, access)
    return (Session(report, visitor) if report.ok else None), report


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


# --------------------------------------------------------------------------- configure tab
def parse_custom_rules(text: str) -> list[dict]:
    """Custom partition rules, one per line: ``LAYERS [: KINDS]`` -> language expert.

    e.g. ``first 6, last 2 : mlp`` or ``all : attention`` or ``0-3``; lines starting with # are
    ignored. The rest of the parameters go to the task expert.
    """
    rules = []
    for line in (text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        layers, _, kinds = line.partition(":")
        rule = {"layers": layers.strip() or "all"}
        if kinds.strip():
            rule["kinds"] = kinds.strip()
        rules.append(rule)
    if not rules:
        raise WorkbenchError("custom partition: write at least one rule, e.g. 'first 6, last 2 : mlp'")
    return rules


NON_LAYER_CHOICES = {"blend (average, as in Algorithm 1)": "blend", "task expert": "task",
                     "language expert": "lang"}


def make_config(session: Session, method: str = "layer swap", bottom: int | None = None,
                top: int | None = None, transition_bottom: int = 0, transition_top: int = 0,
                w_task: float = 1.0, w_lang: float = 1.0, magnitude_weights: bool = False,
                partition: str = PARTITION_CHOICES[0], custom_rules: str = "", *,
                non_layer: str = "blend", scale_partition: bool = False, **knobs):
    """A validated MergeConfig from the Configure tab's controls (labels as shown there);
    ``knobs``: the other number knobs of the registered methods by name (lambda_task,
    ties_density, ...: ``registry.KNOBS``)."""
    custom_rules = capped("custom rules", custom_rules, LIMITS.rules_chars)
    method_id = METHOD_LABELS.get(method, method)
    part: Any = None
    if method_id == "layer_swap" and partition and partition != PARTITION_CHOICES[0]:
        part = parse_custom_rules(custom_rules) if partition == "custom" else partition
        transition_bottom = transition_top = 0  # a partition replaces the sliders
    numbers = {}
    for name, value in knobs.items():
        if name not in registry.KNOBS or name in controls.CONTROLS:
            raise TypeError(f"make_config: {name!r} is not a knob of a merge method's own row")
        try:   # the control's value as its field (a number, a checkbox, a choice)
            numbers[name] = controls.field_value(name, value)
        except ValueError as e:
            raise WorkbenchError(str(e)) from None
    config = MergeConfig(method=method_id, bottom=int(bottom) if bottom is not None else None,
                         top=int(top) if top is not None else None,
                         transition_bottom=int(transition_bottom or 0),
                         transition_top=int(transition_top or 0),
                         w_task=float(w_task), w_lang=float(w_lang),
                         magnitude_weights=bool(magnitude_weights),
                         non_layer=NON_LAYER_CHOICES.get(non_layer, non_layer),
                         partition=part, scale_partition=bool(scale_partition), **numbers,
                         task=session.recipe["task"], lang=session.recipe["lang"],
                         base=session.recipe.get("base"))
    return config.validate(session.num_layers, has_base=session.has_base)


def default_config(session: Session):
    return MergeConfig.default_for(session.num_layers, task=session.recipe["task"],
                                   lang=session.recipe["lang"], base=session.recipe.get("base"))


def merge_plan(session: Session, config):
    """The ``MergePlan`` of ``config`` over the session's models (pure data: no tensors read)."""
    return build_plan(config, session.param_names, session.arch)


def plan_view(session: Session, config) -> tuple[Any, str]:
    """(layer-stack figure, plan summary text) for a config. Reads no tensors: runs on every
    slider move."""
    p = merge_plan(session, config)
    fig = plots.layer_stack_figure(p.layer_rows(), non_layer=p.non_layer_sources(),
                                   kind_params=layer_kind_params(session))
    session.planned = config   # what the Configure tab shows (an invalid config then names it)
    return fig, p.summary_text()


def layer_kind_params(session: Session) -> dict[int, dict[str, int]]:
    """layer -> module kind -> parameter count, from the task expert's headers (computed once
    per session): the layer diagram splits a mixed layer by parameters."""
    if session.kind_params is None:
        out: dict[int, dict[str, int]] = {}
        with CheckpointReader(session.paths["task"]) as reader:
            for name in session.param_names:
                info = session.arch.classify(name)
                if info.layer is not None:
                    kinds = out.setdefault(info.layer, {})
                    kinds[info.kind] = kinds.get(info.kind, 0) + math.prod(reader.shape(name))
        session.kind_params = out
    return session.kind_params


def plan_cells_figure(session: Session, config, over: str | None = None,
                      tau: float | None = None):
    """Source of every (layer, module) cell; ``over`` = "task"/"lang" draws the plan over that
    expert's delta heatmap (Analyze first) at threshold ``tau`` (default: the one last drawn on
    the Deltas tab). Reads no tensors."""
    p = merge_plan(session, config)
    stats = None
    if over is not None:
        if over not in session.stats:
            raise WorkbenchError("analyze the deltas first (Deltas tab)")
        stats = session.stats[over]
        tau = tau if tau is not None else session.tau
    return plots.plan_heatmap(p.cells(), session.num_layers, stats=stats, tau=tau)


# --------------------------------------------------------------------------- build tab
@dataclass
class BuildResult:
    seconds: float
    changed: int            # tensors written into the merged model
    total: int
    summary: str

    def markdown(self) -> str:
        return (f"**Built in memory** in {self.seconds:.2f} s ({self.changed} of {self.total} "
                f"tensors recomputed).\n\n```\n{self.summary}\n```")


def build(session: Session, config, progress: Progress | None = None) -> BuildResult:
    """Merge in memory: an engine over the session's models is made the merge of ``config``
    (rewriting only the parameters whose source changed since it last showed something; a
    non-finite merge is refused there), and the session remembers ``config`` as its build."""
    res = dispatcher().run(session.job("show", config.to_dict()), progress)
    session.built_config = config
    return BuildResult(res["seconds"], res["rewritten"], res["total"], res["summary"])


def save(session: Session, config, folder: str, overwrite: bool = False,
         progress: Progress | None = None, *, access: Access | None = None) -> Path:
    """Stream the merge to a folder on the server (sharded safetensors, config, card): a name
    in the visitor's folder under the output root when serving visitors (``access``: theirs,
    ``Access.for_visitor``), within the save quotas (``saves.reserving``); any folder locally
    (``output_folder``)."""
    access = access or session.access
    out = output_folder(access, folder)
    check_replace(out, bool(overwrite))
    need = session.save_bytes[config.dtype]
    with reserving(access, out, need):
        return _merge_into(session, config, out, bool(overwrite), progress, need)


def _merge_into(session: Session, config, out: Path, overwrite: bool,
                progress: Progress | None, need: int) -> Path:
    """The merge streamed to ``out`` (at most ``need`` bytes), from the models as the Models
    tab checked them."""
    check_replace(out, overwrite)
    served = session.access.served
    check_free_space(Path(out).parent, need,
                     f"saving the merge to {Path(out).name if served else out}",
                     shown="the output folder" if served else None)
    if served and progress is not None:   # its lines without the server's folders
        progress = functools.partial(_hidden, progress)
    with dispatcher().hold(session.job("save"), progress) as guard:
        return merge_to_folder(config, session.refs["task"], session.refs["lang"],
                               session.refs.get("base"), out, overwrite=overwrite, progress=guard,
                               checked=session.checked,
                               names=session.recipe if served else None)


def _hidden(progress: Progress, fraction: float, message: str):
    return progress(fraction, hide_paths(message))


def hub_token() -> str | None:
    """A Hugging Face token from the environment, when the Hub may be used at all."""
    if is_offline():
        return None
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")


def push_to_hub(session: Session, config, repo_id: str, private: bool = True,
                progress: Progress | None = None, *, visitor_token: str | None = None,
                visitor: str | None = None) -> str:
    """Merge into a temporary folder and upload it to a Hub model repo; returns its URL.
    Served: only with the signed-in visitor's own token (``visitor_token``, user ``visitor``)
    into their own namespace (``saves.push_target``), never the server's token."""
    repo_id = capped("repo id", repo_id, LIMITS.ref_chars).strip()
    if session.access.served:
        repo_id = push_target(repo_id, visitor_token, visitor)
        token = None if is_offline() else visitor_token
    else:
        token = hub_token()
    if token is None:
        raise WorkbenchError("pushing needs the network and a token: set HF_TOKEN and unset "
                             "HF_HUB_OFFLINE")
    if not HUB_ID.fullmatch(repo_id):
        raise WorkbenchError(f"repo id {repo_id!r}: expected owner/name")
    from huggingface_hub import HfApi

    guard = progress or (lambda f, m: None)
    with tempfile.TemporaryDirectory(prefix="layerswap-push-") as tmp:
        out = _merge_into(session, config, Path(tmp) / "merged", False,
                          lambda f, m: guard(0.8 * f, m), session.save_bytes[config.dtype])
        guard(0.8, f"uploading to {repo_id}")
        api = HfApi(token=token)
        api.create_repo(repo_id, private=bool(private), exist_ok=True)
        api.upload_folder(folder_path=str(out), repo_id=repo_id,
                          commit_message="layerswap merge")
    return f"https://huggingface.co/{repo_id}"


def export_zip(session: Session, config, out_dir: str | None = None) -> Path:
    """A zip with the merge config (layerswap.yaml) and a model card (README.md), from the
    session's models as the Models tab checked them (no model file is read again)."""
    refs = {role: session.recipe[role] for role in ("task", "lang", "base") if role in session.refs}
    config = replace(config, **{role: refs.get(role) for role in ("task", "lang", "base")})
    card = model_card(config, merge_plan(session, config), refs, 0.0)
    card = card.replace("\nMerged in 0.0 s.\n", "\n")  # not merged yet: a recipe
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="layerswap-"))
    path = out_dir / "layerswap-merge.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("layerswap.yaml", config.to_yaml())
        z.writestr("README.md", card)
        z.writestr(*mergekit_yaml.mergekit_file(  # or why not; served: names, not folders
            config, session.opened, folders=not session.access.served))
    return path
