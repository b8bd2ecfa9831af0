"""The app-facing facade: everything the Gradio app does, as plain functions on a ``Session``.

``app.py`` only lays out components and calls these. Every function takes plain arguments
(strings, numbers, a ``MergeConfig``) and returns plain values or plotly figures, so it is
testable without a browser. Errors meant for the page are ``WorkbenchError`` (or another
``ValueError`` subclass from the library) and ``readable_error`` turns any exception into one
short line: the page never shows a stack trace.

Who may touch what: ``served_mode`` decides whether the app serves visitors; ``Access`` then
says which model folders they may name and where saves go (local: any folder; served: embedded
models, Hub ids, folders under the model roots, and named folders under the output root).
Every text the server parses is capped (``LIMITS``) before it is parsed.

Memory model: loaded *source* models (base, experts) are read-only and shared between
sessions through a small process-wide cache (they are the same public weights for everyone);
the merged model, the chosen references, the statistics and the results live in the
``Session`` that ``gr.State`` keeps per visitor.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import tempfile
import functools
import threading
import time
import zipfile
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..checkpoints.models import (DEFAULT_BASE, EMBEDDED_PREFIX, compatibility, describe,
                                  is_adapter, pick_device, resolve)
from ..merge import registry


Progress = Callable[[float, str], None]

ROLES = ("base", "task", "lang")
ROLE_LABELS = {"base": "base", "task": "task expert", "lang": "language expert", "merged": "merged"}
DEMO_REFS = {"base": DEFAULT_BASE, "task": "embedded:smollm2-math-en",
             "lang": "embedded:smollm2-swahili"}
METHOD_LABELS = registry.METHOD_LABELS  # UI label -> MergeConfig.method (the registry's)
PARTITION_CHOICES = ("none (bottom/top sliders)", "A", "B", "C", "custom")
CHAT_EXAMPLES = [
    "Juma ana maembe 12. Anampa dada yake maembe 5. Juma amebaki na maembe mangapi?",
    "Mama alinunua mikate 3 kwa shilingi 400 kila mmoja. Alilipa shilingi ngapi kwa jumla?",
    "রহিমের কাছে ১৫টি আপেল আছে। সে ৭টি আপেল খেয়ে ফেলল। তার কাছে কয়টি আপেল আছে?",
    "একটি বইয়ের দাম ১২০ টাকা। ৩টি বইয়ের দাম কত?",
]


class WorkbenchError(ValueError):
    """A problem to show on the page as one readable sentence."""


class Cancelled(Exception):
    """The visitor pressed Cancel; the work stopped between two steps."""


def readable_error(exc: BaseException) -> str:
    """One line for the page: library errors as they are, anything else with its type."""
    if isinstance(exc, Cancelled):
        return "Cancelled."
    if isinstance(exc, (ValueError, FileNotFoundError, FileExistsError, PermissionError)):
        msg = str(exc) or type(exc).__name__
    elif isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        msg = "out of memory: try fewer questions, shorter answers or a smaller model"
    else:
        msg = f"{type(exc).__name__}: {exc}"
    msg = " ".join(msg.split())
    return msg if len(msg) <= 600 else msg[:597] + "..."


# --------------------------------------------------------------------------- limits
def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class Limits:
    """Work allowed per request, so one visitor cannot exhaust a shared Space.

    Each can be raised with an environment variable LAYERSWAP_MAX_<NAME> (e.g. on a GPU Space).
    """
    eval_questions: int = 20
    shots: int = 8
    new_tokens: int = 256
    chat_chars: int = 2000           # one chat message
    chat_turns: int = 8
    history_chars: int = 24000       # a whole conversation sent back by the page
    request_seconds: int = 120       # one chat request (both answers) stops after this long
    sweep_cells: int = 25
    sweep_items: int = 8
    rules_chars: int = 2000          # custom partition rules
    values_chars: int = 200          # a sweep's x or y values
    ref_chars: int = 512             # a model reference, a local folder path, a Hub repo id
    name_chars: int = 100            # a folder name under the output root (served mode)
    jobs: int = 2                    # heavy jobs (analyze, build, save, evaluate, ...) at once
    plan_jobs: int = 4               # plan redraws at once (they follow every slider move)
    session_seconds: int = 6 * 3600  # an open page keeps its models this long (closed: freed soon)

    @classmethod
    def from_env(cls) -> "Limits":
        return cls(**{f: _env_int(f"LAYERSWAP_MAX_{f.upper()}", getattr(cls, f))
                      for f in cls.__dataclass_fields__})


LIMITS = Limits.from_env()


def capped(name: str, text, limit: int) -> str:
    """``text`` as a string, refused (before any parsing) when longer than ``limit`` characters."""
    text = "" if text is None else str(text)
    if len(text) > limit:
        raise WorkbenchError(f"{name}: at most {limit} characters on this server, got {len(text)}")
    return text


def _bounded(name: str, value, lo: int, hi: int) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise WorkbenchError(f"{name}: expected a whole number, got {value!r}") from None
    if not lo <= v <= hi:
        raise WorkbenchError(f"{name} must be between {lo} and {hi} on this server, got {v}")
    return v


# --------------------------------------------------------------------------- served or local
def served_mode(host: str | None = None, share: bool = False) -> bool:
    """Whether the app serves visitors (who then reach only the folders ``Access`` allows).

    ``LAYERSWAP_SERVED=1`` / ``0`` decides; otherwise served on a Space (``SPACE_ID``), with a
    public share link, or when listening on an address that is not loopback."""
    forced = os.environ.get("LAYERSWAP_SERVED", "").strip().lower()
    if forced in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return forced in ("1", "true", "yes", "on")
    return bool(os.environ.get("SPACE_ID")) or share or not _loopback(host or "127.0.0.1")


def _loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:  # a host name: it may face the network
        return False


@dataclass(frozen=True)
class Access:
    """What the people using the page may touch on this machine.

    Local (one user on their own machine): any folder. Served (visitors over the network): models
    are ``embedded:`` names, Hub ids, folders under ``model_roots`` (``LAYERSWAP_MODEL_DIRS`` and
    the output root) or the references the server preselected (``trusted``); saves are named
    folders under ``output_root`` (``LAYERSWAP_OUTPUT_DIR``, default ``<cache>/outputs``)."""
    served: bool = False
    output_root: Path | None = None
    model_roots: tuple[Path, ...] = ()
    trusted: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, served: bool, trusted=()) -> "Access":
        from ..checkpoints.models import cache_dir

        out = Path(os.environ.get("LAYERSWAP_OUTPUT_DIR") or cache_dir() / "outputs").expanduser()
        dirs = os.environ.get("LAYERSWAP_MODEL_DIRS", "").split(os.pathsep)
        roots = [Path(d).expanduser() for d in dirs if d.strip()]
        return cls(served, out, (*roots, out), frozenset(str(t) for t in trusted))

    def describe(self) -> str:
        """One line for the page."""
        if not self.served:
            return ("Local mode (one user): models and saves may be any folder on this machine "
                    "(LAYERSWAP_SERVED=1 restricts them as for visitors).")
        return ("Served mode: models are embedded, Hub ids or folders under "
                + ", ".join(f"`{r}`" for r in self.model_roots)
                + f"; saves are named folders under `{self.output_root}`.")


LOCAL = Access()
# a Hub repo id: owner/name, dots only inside words (never '.', '..' or a leading dot)
HUB_ID = re.compile(r"[A-Za-z0-9][\w-]*(\.[\w-]+)*/[\w-]+(\.[\w-]+)*", re.ASCII)
REFUSED = ("not available on this server: use an embedded: model, a Hub id (owner/name) or a "
           "folder under the model folders named at the top of the page")


def _within(real: str, root: Path) -> bool:
    top = os.path.realpath(root)
    return os.path.commonpath([real, top]) == top


def vet_reference(ref, access: Access = LOCAL, progress: Progress | None = None) -> str:
    """The reference to use for a model someone named. Local: as given. Served: an ``embedded:``
    name or a trusted reference as given, a Hub id as its downloaded folder (never read as a
    relative path), an absolute path as its real path (links resolved) when that lies under a
    model root; anything else is REFUSED, in the same words whatever exists on the server."""
    ref = capped("model reference", ref, LIMITS.ref_chars).strip()
    if not access.served or ref in access.trusted or ref.startswith(EMBEDDED_PREFIX):
        return ref
    if HUB_ID.fullmatch(ref):
        from ..checkpoints.models import _from_hub
        return str(_from_hub(ref, None if progress is None else lambda m: progress(0.0, m)))
    if os.path.isabs(ref) and ref.isprintable():
        try:
            real = os.path.realpath(ref)
        except (OSError, ValueError):
            real = ""
        if real and any(_within(real, root) for root in access.model_roots):
            return real
    raise WorkbenchError(REFUSED)


def offered_models(access: Access, limit: int = 50) -> list[str]:
    """Model and adapter folders directly under the model roots (the served page lists them)."""
    found = []
    for root in access.model_roots if access.served else ():
        try:
            subs = sorted(p for p in Path(root).iterdir() if p.is_dir())
        except OSError:
            continue
        found += [str(p) for p in subs
                  if (p / "config.json").exists() or (p / "adapter_config.json").exists()]
    return found[:limit]


# --------------------------------------------------------------------------- shared source models
# --------------------------------------------------------------------------- models tab
@dataclass
class ModelsReport:
    refs: dict[str, str]               # what the library resolves (vetted; adapters: dense folders)
    rows: list[list[str]]              # role, reference, architecture, layers, hidden, vocab, dtype, size
    problems: list[str]
    num_layers: int | None = None
    names: dict[str, str] | None = None   # the references as the visitor gave them
    access: Access = LOCAL

    HEADERS = ("role", "model", "architecture", "layers", "hidden", "vocab", "dtype", "size")

    @property
    def ok(self) -> bool:
        return not self.problems

    def markdown(self) -> str:
        if self.ok:
            return (f"**Compatible**: same architecture, shapes and vocabulary "
                    f"({self.num_layers} layers). Ready to configure.")
        return "**Not compatible**:\n" + "\n".join(f"- {p}" for p in self.problems)


def dense_from_adapter(adapter: str, base: str | None, progress: Progress | None = None) -> Path:
    """A PEFT LoRA adapter folder as a dense model folder: merged into its base once (float32,
    so small deltas survive), cached by the identity of both."""
    import hashlib

    from ..checkpoints.models import cache_dir, load_model

    folder = Path(adapter).expanduser().resolve()
    if not base:
        raise WorkbenchError(f"{folder} is a PEFT adapter: give its base model too")
    base_path = resolve(base)
    ident = [str(base_path), *[(f.name, f.stat().st_size, f.stat().st_mtime_ns)
                               for f in sorted(folder.iterdir()) if f.is_file()]]
    key = hashlib.sha1(json.dumps(ident).encode()).hexdigest()[:16]
    out = cache_dir() / "adapters" / f"{folder.name}-{key}"
    if (out / "config.json").exists():
        return out
    import torch

    from ..merge import lora

    _say(progress, 0.1, f"merging the adapter {folder.name} into its base (once)")
    try:
        lora.load_adapter(folder, base_path)
    except lora.AdapterError:
        pass   # DoRA, saved modules...: PEFT below knows more kinds (or says what is wrong)
    else:      # plain LoRA: streamed, bit-identical to PEFT's merge, no model built
        return lora.apply_adapter(base_path, folder, out, dtype=torch.float32)
    from peft import PeftModel

    model, tok = load_model(base_path, device="cpu", dtype=torch.float32)
    try:
        merged = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    except Exception as e:  # noqa: BLE001 - peft raises many types for a bad adapter
        raise WorkbenchError(f"{folder}: cannot apply the adapter to {base}: "
                             f"{readable_error(e)}") from e
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=out.parent))
    merged.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out


def check_models(base: str, task: str, lang: str, progress: Progress | None = None,
                 access: Access = LOCAL) -> ModelsReport:
    """Describe the three models from their headers and check they can be merged.

    Nothing heavy runs: no weights are loaded. ``base`` may be empty (then the methods and
    views that need it say so). Every reference is vetted (``vet_reference``) before anything
    reads the disk. Raises WorkbenchError when a reference cannot be used at all.
    """
    names = {role: capped(f"{ROLE_LABELS[role]} reference", ref, LIMITS.ref_chars).strip()
             for role, ref in (("base", base), ("task", task), ("lang", lang))}
    for role in ("task", "lang"):
        if not names[role]:
            raise WorkbenchError(f"give a {ROLE_LABELS[role]} (an embedded: name, a folder or a Hub id)")
    names = {r: v for r, v in names.items() if v}
    refs = {}
    for role, ref in names.items():
        try:
            refs[role] = vet_reference(ref, access, progress)
        except ValueError as e:
            raise WorkbenchError(f"{ROLE_LABELS[role]}: {readable_error(e)}") from e
    for role in ("task", "lang"):  # PEFT adapters: merged into the base once, then dense
        if is_adapter(refs[role]):
            try:
                refs[role] = str(dense_from_adapter(refs[role], refs.get("base"), progress))
            except ValueError as e:
                raise WorkbenchError(f"{ROLE_LABELS[role]}: {readable_error(e)}") from e
    rows, infos = [], {}
    for i, (role, ref) in enumerate(refs.items()):
        _say(progress, i / (len(refs) + 1), f"reading {ROLE_LABELS[role]} {names[role]}")
        try:
            info = describe(ref, progress=lambda m: _say(progress, i / (len(refs) + 1), m))
        except Exception as e:  # noqa: BLE001 - any unreadable model becomes one message
            raise WorkbenchError(f"{ROLE_LABELS[role]} {names[role]!r}: {readable_error(e)}") from e
        infos[role] = info
        rows.append([ROLE_LABELS[role], names[role], f"{info.model_type} ({info.family})",
                     str(info.num_layers), str(info.hidden_size), str(info.vocab_size), info.dtype,
                     f"{info.num_params / 1e6:.1f} M params, {info.size_bytes / 2**20:.0f} MiB"])
    _say(progress, len(refs) / (len(refs) + 1), "checking compatibility")
    problems = compatibility(refs)
    return ModelsReport(refs, rows, problems, infos["task"].num_layers, names, access)


def unchecked_rows(base, task, lang) -> list[list[str]]:
    """Rows of the models table for references that could not be read (a failed check)."""
    given = {"base": base, "task": task, "lang": lang}
    return [[ROLE_LABELS[role], str(ref or "")[:200], "(not read)", "", "", "", "", ""]
            for role, ref in given.items() if str(ref or "").strip()]


def _say(progress: Progress | None, frac: float, msg: str):
    if progress is not None:
        progress(frac, msg)


# --------------------------------------------------------------------------- session
class Session:
    """One visitor's workbench: chosen models, merge config, merged model, results."""

    def __init__(self, report: ModelsReport):
        if not report.ok:
            raise WorkbenchError("these models cannot be merged: " + "; ".join(report.problems))
        from ..merge.executor import open_inputs

        self.refs = dict(report.refs)
        self.names = dict(report.names or report.refs)
        self.report = report
        self.access = report.access
        # headers only: architecture, output tensor names (tied heads dropped), checks
        inputs = open_inputs(self.refs["task"], self.refs["lang"], self.refs.get("base"))
        self.inputs = inputs                # headers only; the live models map the files
        self.paths = dict(inputs.paths)
        self.arch = inputs.arch
        self.num_layers = self.arch.num_layers
        self.param_names = list(inputs.names)
        self.cancel = threading.Event()
        self.lock = threading.RLock()       # one heavy job per session at a time
        self.running = 0                    # jobs in progress (Cancel says whether one runs)
        self._running_lock = threading.Lock()
        self.tau: float | None = None       # the threshold of the delta views last drawn
        self.stats: dict[str, Any] = {}     # role -> DeltaStats (base vs that expert)
        self.built_config = None            # MergeConfig of the last build (shown on demand)
        self._lives: dict[str, Any] = {}    # slot -> LiveModel (at most two: main, chat pane)
        self._live_lock = threading.Lock()

    @property
    def has_base(self) -> bool:
        return "base" in self.paths

    def begin(self, progress: Progress | None) -> Progress:
        """Start a step of work: forget an old Cancel (unless a ``job`` runs: a Cancel pressed
        since it began counts), and return its guarded progress callback."""
        if not self.running:
            self.cancel.clear()
        return self.guard(progress)

    @contextmanager
    def job(self):
        """Count a job as running while the block runs; a Cancel from before it is forgotten."""
        with self._running_lock:
            if not self.running:
                self.cancel.clear()
            self.running += 1
        try:
            yield self
        finally:
            with self._running_lock:
                self.running -= 1

    def request_cancel(self) -> bool:
        """Ask the running job to stop at its next step; False when no job runs."""
        self.cancel.set()
        return self.running > 0

    def guard(self, progress: Progress | None) -> Progress:
        """A progress callback that also stops the work when Cancel was pressed."""
        def report(frac: float, msg: str):
            if self.cancel.is_set():
                raise Cancelled()
            _say(progress, frac, msg)
        return report

    def live(self, slot: str = "main", progress: Progress | None = None):
        """The session's live model in ``slot`` ("main"; "other" for the second chat pane),
        loaded on first use: one model whose parameters are rewritten to show any role or merge
        from the memory-mapped checkpoints (``live.LiveModel``)."""
        from ..merge.live import LiveModel

        with self._live_lock:
            lm = self._lives.get(slot)
            if lm is None:
                lm = LiveModel(self.inputs, device=pick_device(), progress=progress)
                self._lives[slot] = lm
            return lm

    def model(self, role: str, slot: str = "main"):
        """(model, tokenizer) of the live model in ``slot``, made to show ``role``: "base",
        "task", "lang" or "merged" (the last build). Only tensors whose source changed are
        rewritten; use the model before asking for another role in the same slot."""
        if role == "merged":
            if self.built_config is None:
                raise WorkbenchError("build the merged model first (Build tab)")
            what = self.built_config
        elif role in self.paths:
            what = role
        else:
            raise WorkbenchError(f"no {ROLE_LABELS.get(role, role)} model chosen (Models tab)")
        with self.lock:
            lm = self.live(slot)
            lm.show(what)
            return lm.model, lm.tokenizer

    @property
    def merged(self):
        """(model, tokenizer) showing the last build, or None before a build."""
        return None if self.built_config is None else self.model("merged")

    def close(self) -> None:
        """Free the live models (the mapped checkpoints are page cache, shared)."""
        with self._live_lock:
            self._lives.clear()
        self.built_config = None


def open_session(base: str, task: str, lang: str, progress: Progress | None = None,
                 access: Access = LOCAL) -> tuple[Session | None, ModelsReport]:
    """The report, and a new Session when the models are compatible (else None)."""
    report = check_models(base, task, lang, progress, access)
    return (Session(report) if report.ok else None), report


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


def warm_up(session: Session) -> threading.Thread:
    """Load the session's live model (the task expert) in the background while the visitor looks
    around: the first Build then only rewrites the tensors the merge changes."""
    def load():
        try:
            session.live()
        except Exception:  # noqa: BLE001 - Build reports loading errors where they matter
            return
    thread = threading.Thread(target=load, name="layerswap-warm-up", daemon=True)
    thread.start()
    return thread


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
    for i, line in enumerate((text or "").splitlines()):
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
    from ..merge.config import MergeConfig

    custom_rules = capped("custom rules", custom_rules, LIMITS.rules_chars)
    method_id = METHOD_LABELS.get(method, method)
    part: Any = None
    if method_id == "layer_swap" and partition and partition != PARTITION_CHOICES[0]:
        part = parse_custom_rules(custom_rules) if partition == "custom" else partition
        transition_bottom = transition_top = 0  # a partition replaces the sliders
    numbers = {}
    for name, value in knobs.items():
        knob = registry.KNOBS.get(name)
        if knob is None or knob.kind != "number":
            raise TypeError(f"make_config: {name!r} is not a number knob of a merge method")
        numbers[name] = _number(knob.label or name, value)
    config = MergeConfig(method=method_id, bottom=int(bottom) if bottom is not None else None,
                         top=int(top) if top is not None else None,
                         transition_bottom=int(transition_bottom or 0),
                         transition_top=int(transition_top or 0),
                         w_task=float(w_task), w_lang=float(w_lang),
                         magnitude_weights=bool(magnitude_weights),
                         non_layer=NON_LAYER_CHOICES.get(non_layer, non_layer),
                         partition=part, scale_partition=bool(scale_partition), **numbers,
                         task=session.refs["task"], lang=session.refs["lang"],
                         base=session.refs.get("base"))
    return config.validate(session.num_layers, has_base=session.has_base)


def _number(name: str, value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise WorkbenchError(f"{name}: expected a number, got {value!r}") from None


def ranges_note(session: Session) -> str:
    """The paper's validated b / u / t ranges for this depth, as a line beside the sliders."""
    from ..merge.config import validated_ranges
    return validated_ranges(session.num_layers).note


def default_config(session: Session):
    from ..merge.config import MergeConfig
    return MergeConfig.default_for(session.num_layers, task=session.refs["task"],
                                   lang=session.refs["lang"], base=session.refs.get("base"))


def plan(session: Session, config):
    """The merge plan (pure data: no tensors read)."""
    from ..merge.plan import build_plan
    return build_plan(config, session.param_names, session.arch)


def plan_view(session: Session, config) -> tuple[Any, str]:
    """(layer-stack figure, plan summary text) for a config. Reads no tensors: runs on every
    slider move."""
    from . import figures as plots
    p = plan(session, config)
    return plots.layer_stack_figure(p.layer_rows(), non_layer=p.global_sources()), p.summary_text()


def plan_cells_figure(session: Session, config, over: str | None = None,
                      tau: float | None = None):
    """Source of every (layer, module) cell; ``over`` = "task"/"lang" draws the plan over that
    expert's delta heatmap (Analyze first) at threshold ``tau`` (default: the one last drawn on
    the Deltas tab). Reads no tensors."""
    from . import figures as plots
    p = plan(session, config)
    stats = None
    if over is not None:
        if over not in session.stats:
            raise WorkbenchError("analyze the deltas first (Deltas tab)")
        stats = session.stats[over]
        tau = tau if tau is not None else session.tau
    return plots.plan_heatmap(p.cells(), session.num_layers, stats=stats, tau=tau)


# --------------------------------------------------------------------------- deltas tab
def delta_stats(session: Session, progress: Progress | None = None) -> dict[str, Any]:
    """DeltaStats of each expert against the base (computed once per session; cached on disk)."""
    from ..analysis.deltas import delta_stats as compute

    if not session.has_base:
        raise WorkbenchError("the delta views need the base model (Models tab)")
    guard = session.begin(progress)
    for i, role in enumerate(("task", "lang")):
        if role not in session.stats:
            guard(i / 2, f"delta statistics of the {ROLE_LABELS[role]}")
            session.stats[role] = compute(
                session.paths["base"], session.paths[role], label=ROLE_LABELS[role],
                progress=lambda f, m, i=i: guard((i + f) / 2, m))
    return session.stats


@dataclass
class DeltaViews:
    thresholds: tuple[float, float]  # tau of the task and of the language expert
    heatmaps: Any          # side-by-side heatmaps of both experts
    overlap: Any           # where both changed strongly
    profile: Any           # per-layer delta mass
    suggestion: Any        # analysis.Suggestion
    suggestion_text: str


def delta_views(session: Session, threshold: float | tuple[float, float] | None = None,
                metric: str = "fraction", log_scale: bool = False,
                progress: Progress | None = None, matrices_only: bool = False) -> DeltaViews:
    """Figures for the Deltas tab. ``threshold``: one tau for both experts, a (task, lang) pair
    (the paper used a threshold per expert), or None (``analysis.auto_threshold`` for both).
    ``matrices_only``: only the seven 2-D matrices the paper plots. Moving a threshold re-uses
    the stored statistics (no tensor reads)."""
    from . import figures as plots
    from ..analysis.deltas import auto_threshold

    stats = delta_stats(session, progress)
    task, lang = stats["task"], stats["lang"]
    if threshold is None:
        taus = (auto_threshold(task, lang),) * 2
    elif isinstance(threshold, (tuple, list)):
        taus = tuple(float(t) for t in threshold)
    else:
        taus = (float(threshold),) * 2
    if not all(t > 0 for t in taus) or len(taus) != 2:
        raise WorkbenchError(f"the thresholds must be two positive numbers, got {threshold}")
    session.tau = taus[1]  # the plan is drawn over the language expert's changes
    metric = "frac_rows_above" if metric == "fraction" else "mean_row_mav"
    only = bool(matrices_only)
    heat = plots.side_by_side_heatmaps(task, lang, metric=metric, tau=taus, log=bool(log_scale),
                                       matrices_only=only)
    overlap = plots.overlap_heatmap(task, lang, tau=taus, matrices_only=only)
    suggestion = suggest(session)
    profile = plots.layer_profile_figure([task, lang], suggestion=suggestion)
    return DeltaViews(taus, heat, overlap, profile, suggestion, suggestion_text(suggestion))


def suggest(session: Session):
    """analysis.Suggestion from the stored statistics (Analyze first)."""
    from ..analysis.suggest import suggest_config
    if "task" not in session.stats or "lang" not in session.stats:
        raise WorkbenchError("analyze the deltas first (Deltas tab)")
    return suggest_config(session.stats["task"], session.stats["lang"], session.num_layers)


def suggestion_text(s) -> str:
    head = (f"**Suggested configuration**: bottom {s.bottom}, top {s.top}, transitions "
            f"{s.transition_bottom}/{s.transition_top}"
            + (f", partition {s.partition}" if s.partition else ""))
    return head + ("\n\n" + s.explanation if s.explanation else "")


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
    """Merge in memory: the session's live model is made the merge of ``config``, rewriting only
    the parameters whose source changed since it last showed something."""
    return _recompose(session, config, session.begin(progress))


def _recompose(session: Session, config, guard: Progress) -> BuildResult:
    with session.lock:
        t0 = time.perf_counter()
        guard(0.05, "loading the live model")
        lm = session.live(progress=lambda f, m: guard(0.05 + 0.25 * f, m))
        res = lm.show(config, progress=lambda f, m: guard(0.3 + 0.7 * f, m))
        session.built_config = config
        return BuildResult(time.perf_counter() - t0, res.rewritten, res.total,
                           lm.plan.summary_text())


_FOLDER_NAME = re.compile(r"\w[\w.-]*")


def output_folder(access: Access, folder) -> Path:
    """Where a save goes. Served: a plain name (no '/', '\\', '..', leading '.') for a folder
    directly under the output root, never a link out of it. Local: any path."""
    limit = LIMITS.name_chars if access.served else LIMITS.ref_chars
    text = capped("output folder", folder, limit).strip()
    if not text:
        raise WorkbenchError("give a name for the output folder" if access.served
                             else "give an output folder")
    if not access.served:
        return Path(text).expanduser()
    if not _FOLDER_NAME.fullmatch(text) or ".." in text:
        raise WorkbenchError(f"output folder {text!r}: give a name (letters, digits, '-', '_', "
                             "'.'), not a path; it is saved in this server's output folder")
    root = access.output_root
    root.mkdir(parents=True, exist_ok=True)
    out = root / text
    if out.is_symlink() or os.path.realpath(out) != os.path.join(os.path.realpath(root), text):
        raise WorkbenchError(f"output folder {text!r} is a link out of the output folder: "
                             "not writing there")
    return out


def check_replace(out: Path, overwrite: bool) -> None:
    """An existing folder is replaced only with overwrite, and only when it is a layerswap
    output (it has its layerswap.yaml): never a model, a cache or anything else."""
    target = Path(out).expanduser()
    if not (target.exists() or target.is_symlink()):
        return
    if not overwrite:
        raise WorkbenchError(f"{target} already exists: tick Overwrite to replace it")
    if not target.is_dir() or not (target / "layerswap.yaml").is_file():
        raise WorkbenchError(f"{target} is not a layerswap output (no layerswap.yaml): "
                             "not replacing it")


def save(session: Session, config, folder: str, overwrite: bool = False,
         progress: Progress | None = None) -> Path:
    """Stream the merge to a folder on the server (sharded safetensors, config, card): a name
    under the output root when serving visitors, any folder locally (``output_folder``)."""
    return _merge_into(session, config, output_folder(session.access, folder), bool(overwrite),
                       progress)


def _merge_into(session: Session, config, out: Path, overwrite: bool,
                progress: Progress | None) -> Path:
    from ..merge.executor import merge_to_folder

    from ..checkpoints.models import check_free_space

    check_replace(out, overwrite)
    check_free_space(Path(out).parent, session.inputs.readers["task"].nbytes(),
                     f"saving the merge to {out}")
    guard = session.begin(progress)
    with session.lock:
        return merge_to_folder(config, session.refs["task"], session.refs["lang"],
                               session.refs.get("base"), out, overwrite=overwrite, progress=guard)


def hub_token() -> str | None:
    """A Hugging Face token from the environment, when the Hub may be used at all."""
    from ..checkpoints.models import is_offline
    if is_offline():
        return None
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")


def push_to_hub(session: Session, config, repo_id: str, private: bool = True,
                progress: Progress | None = None) -> str:
    """Merge into a temporary folder and upload it to a Hub model repo; returns its URL."""
    repo_id = capped("repo id", repo_id, LIMITS.ref_chars).strip()
    if session.access.served:
        raise WorkbenchError("pushing would use this server's Hub token: not offered to visitors")
    token = hub_token()
    if token is None:
        raise WorkbenchError("pushing needs the network and a token: set HF_TOKEN and unset "
                             "HF_HUB_OFFLINE")
    if not HUB_ID.fullmatch(repo_id):
        raise WorkbenchError(f"repo id {repo_id!r}: expected owner/name")
    from huggingface_hub import HfApi

    guard = session.begin(progress)
    with tempfile.TemporaryDirectory(prefix="layerswap-push-") as tmp:
        out = _merge_into(session, config, Path(tmp) / "merged", False,
                          progress=lambda f, m: guard(0.8 * f, m))
        guard(0.8, f"uploading to {repo_id}")
        api = HfApi(token=token)
        api.create_repo(repo_id, private=bool(private), exist_ok=True)
        api.upload_folder(folder_path=str(out), repo_id=repo_id,
                          commit_message="layerswap merge")
    return f"https://huggingface.co/{repo_id}"


def close_session(session: Session | None) -> None:
    """Free a visitor's merged model (called when their session expires)."""
    if session is not None:
        session.cancel.set()
        session.close()
        session.stats.clear()


def export_zip(session: Session, config, out_dir: str | None = None) -> Path:
    """A zip with the merge config (layerswap.yaml) and a model card (README.md)."""
    from ..merge.executor import model_card, open_inputs

    inputs = open_inputs(session.refs["task"], session.refs["lang"], session.refs.get("base"))
    card = model_card(config, plan(session, config), inputs, 0.0)
    card = card.replace("\nMerged in 0.0 s.\n", "\n")  # not merged yet: a recipe
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="layerswap-"))
    path = out_dir / "layerswap-merge.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("layerswap.yaml", config.to_yaml())
        z.writestr("README.md", card)
    return path


# --------------------------------------------------------------------------- evaluate tab
@dataclass
class EvalResult:
    headers: list[str]
    rows: list[list]
    summary_rows: list[list]
    figure: Any
    raw: Any = None


def evaluate(session: Session, source: str = "mgsm", lang: str = "sw", n: int = 2, shots: int = 2,
             cot: bool = False, roles: tuple[str, ...] = ("base", "task", "lang", "merged"),
             max_new_tokens: int = 64, chat_template: bool = False,
             progress: Progress | None = None) -> EvalResult:
    """Side-by-side evaluation of the chosen models on the first ``n`` items."""
    from . import figures as plots
    from ..evaluation.data import load_items
    from ..evaluation.runner import run_side_by_side

    n = _bounded("number of questions", n, 1, LIMITS.eval_questions)
    shots = _bounded("shots", shots, 0, LIMITS.shots)
    max_new_tokens = _bounded("max new tokens", max_new_tokens, 1, LIMITS.new_tokens)
    if not roles:
        raise WorkbenchError("choose at least one model to evaluate")
    guard = session.begin(progress)
    with session.lock:
        # one live model shows each role in turn (callables: run_side_by_side asks just in time)
        models = {ROLE_LABELS[r]: functools.partial(session.model, r) for r in roles}
        available = load_items(source, lang)
        result = run_side_by_side(models, available[:n], shots=shots, cot=bool(cot),
                                  chat_template=bool(chat_template),
                                  max_new_tokens=max_new_tokens, progress=guard)
        result.config["items_available"] = len(available)
    headers, rows = _table(result)
    return EvalResult(headers, rows, _summary_rows(result), plots.accuracy_bars(result.summary),
                      result)


def evaluation_note(res: EvalResult) -> str:
    """What the numbers are: how many items out of the data set, and the exemplars used."""
    c = res.raw.config
    total = res.raw.config.get("items_available")
    sample = (f"the first {c['n']} of {total} items: a sample, not the benchmark's score"
              if total and c["n"] < total else f"{c['n']} items")
    shots = f"{c['shots']}-shot ({c.get('exemplar_source', 'no exemplars')})" if c["shots"] \
        else "0-shot"
    return f"Evaluated {c['data']} {c['lang']}: {sample}, {shots}, {c['format']} answers."


def _table(result) -> tuple[list[str], list[list]]:
    """One row per question: gold, each model's extracted answer with a mark, then the outputs."""
    models = result.models
    headers = ["#", "question", "gold", *models, *(f"{m}: output" for m in models)]
    rows = []
    for i, r in enumerate(result.rows):
        outs = [r["models"][m] for m in models]
        rows.append([i + 1, r["question"], r["gold"],
                     *(f"{o['answer'] or '-'} {'✓' if o['correct'] else '✗'}" for o in outs),
                     *(o["output"].strip() for o in outs)])
    return headers, rows


SUMMARY_HEADERS = ["model", "accuracy", "95% CI", "strict", "gold NLL", "n"]


def _summary_rows(result) -> list[list]:
    return [[s["model"], f"{s['accuracy']:.2f}", f"[{s['ci_low']:.2f}, {s['ci_high']:.2f}]",
             f"{s['strict_accuracy']:.2f}",
             "" if s.get("mean_gold_nll") is None else f"{s['mean_gold_nll']:.3f}", s["n"]]
            for s in result.summary]


# --------------------------------------------------------------------------- sweep tab
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
    """'0,2,4' or '0-4' or '0-8:2' -> sorted ints within 0..hi."""
    out: set[int] = set()
    for part in capped(name, text, LIMITS.values_chars).replace(" ", "").split(","):
        if not part:
            continue
        rng, _, step = part.partition(":")
        lo_s, dash, hi_s = rng.partition("-")
        try:
            lo = int(lo_s)
            top = int(hi_s) if dash else lo
            st = int(step) if step else 1
        except ValueError:
            raise WorkbenchError(f"{name}: cannot read {part!r} (use e.g. 0,2,4 or 0-6:2)") from None
        if st <= 0 or top < lo:
            raise WorkbenchError(f"{name}: {part!r} is an empty range")
        if lo < 0 or top > hi:  # checked before the range is built
            raise WorkbenchError(f"{name}: {lo if lo < 0 else top} is outside 0..{hi}")
        out.update(range(lo, top + 1, st))
    if not out:
        raise WorkbenchError(f"{name}: give at least one value")
    return sorted(out)


def sweep(session: Session, base_config, axes: str = "bottom / top", x_values: str = "0,2,4",
          y_values: str = "0,1,2", source: str = "gsm-symbolic", lang: str = "sw", n: int = 4,
          shots: int = 0, metric: str = "nll", progress: Progress | None = None) -> SweepResult:
    """Score a grid of configurations on a small fixed item set by in-memory recomposition."""
    from dataclasses import replace

    from . import figures as plots
    from ..evaluation.data import load_items
    from ..evaluation.runner import run_side_by_side
    from ..merge.partition import ConfigError

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
    n = _bounded("sweep questions", n, 1, LIMITS.sweep_items)
    items = load_items(source, lang, n)
    if metric == "nll" and not all(it.solution for it in items):
        raise WorkbenchError("gold NLL needs worked solutions: use GSM-Symbolic, or score by accuracy")
    guard = session.begin(progress)
    scores: list[list[float | None]] = [[None] * len(xs) for _ in ys]
    rows = []
    total = len(xs) * len(ys)
    for iy, y in enumerate(ys):
        for ix, x in enumerate(xs):
            try:
                cfg = replace(base_config, method="layer_swap", partition=None, **{fx: x, fy: y})
                cfg.validate(session.num_layers, has_base=session.has_base)
            except ConfigError:
                continue  # impossible cell (more swapped layers than the model has): empty
            done = (iy * len(xs) + ix) / total
            guard(done, f"{fx} {x}, {fy} {y}")
            with session.lock:  # the live model shows the cell; the visitor's build stays
                lm = session.live()
                lm.show(cfg, progress=lambda f, m: guard(done, m))
                # NLL needs one forward pass per item; generation is cut to 1 token
                res = run_side_by_side({"merged": (lm.model, lm.tokenizer)}, items, shots=shots,
                                       max_new_tokens=1 if metric == "nll" else 64,
                                       with_nll=metric == "nll",
                                       progress=lambda f, m: guard(done + f / total, m))
            s = res.summary[0]
            scores[iy][ix] = s["mean_gold_nll"] if metric == "nll" else s["accuracy"]
            if scores[iy][ix] is not None:
                rows.append([x, y, round(scores[iy][ix], 4)])
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


# --------------------------------------------------------------------------- chat tab
def check_chat_message(message: str, history: list | None) -> str:
    """The message to send, after the checks that cost nothing (length, empty, turns)."""
    text = capped("message", message, LIMITS.chat_chars).strip()
    if not text:
        raise WorkbenchError("type a message first")
    if len(plain_history(history)) // 2 >= LIMITS.chat_turns:
        raise WorkbenchError(f"this conversation has {LIMITS.chat_turns} turns; press Clear to "
                             "start again")
    return text


def _plain_text(content) -> str | None:
    """A turn's text: a string, or Gradio's list of text parts; None for anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = [p if isinstance(p, str) else p.get("text") if isinstance(p, dict)
                 and p.get("type", "text") == "text" else None for p in content]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)
    return None


def plain_history(history: list | None) -> list[dict]:
    """The conversation the page sent back as [{"role", "content": str}], checked: plain-text
    turns alternating user, assistant (as chat templates expect), LIMITS.history_chars in all."""
    if not history:
        return []
    if not isinstance(history, (list, tuple)):
        raise WorkbenchError("chat history: expected a list of turns; press Clear to start again")
    out, total = [], 0
    for i, turn in enumerate(history):
        role = turn.get("role") if isinstance(turn, dict) else None
        if role not in ("user", "assistant"):
            raise WorkbenchError(f"chat history: only user and assistant turns are accepted, not "
                                 f"{str(role)[:20]!r}; press Clear to start again")
        if role != ("user", "assistant")[i % 2]:
            raise WorkbenchError("chat history: turns must alternate user, assistant; press Clear "
                                 "to start again")
        text = _plain_text(turn.get("content"))
        if text is None:
            raise WorkbenchError(f"chat history: turn {i + 1} is not plain text; press Clear to "
                                 "start again")
        total += len(text)
        if total > LIMITS.history_chars:
            raise WorkbenchError(f"this conversation is longer than {LIMITS.history_chars} "
                                 "characters; press Clear to start again")
        out.append({"role": role, "content": text})
    if len(out) % 2:
        raise WorkbenchError("chat history: the last question has no answer; press Clear to start "
                             "again")
    return out


def context_tokens(model) -> int | None:
    """The model's context window in tokens (None when its config does not say)."""
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(cfg, "max_position_embeddings", None)


def fit_context(model, tok, turns: list[dict], text: str, max_new_tokens: int
                ) -> tuple[list[dict], int]:
    """The newest turns that fit the model's context with the new message and an answer of
    ``max_new_tokens``; also how many earlier turns (question + answer) were left out."""
    from ..evaluation.generation import chat_prompt, encode

    context = context_tokens(model)
    question = {"role": "user", "content": text}
    for dropped in range(len(turns) // 2 + 1):
        messages = turns[2 * dropped:] + [question]
        prompt_tokens = len(encode(tok, chat_prompt(tok, messages)))
        if context is None or prompt_tokens + max_new_tokens <= context:
            return messages, dropped
    raise WorkbenchError(f"the message and a {max_new_tokens}-token answer do not fit the model's "
                         f"context ({context} tokens): shorten the message or the answer")


@dataclass
class ChatReply:
    history: list[dict]       # the pane: the earlier turns, the question, the answer so far
    dropped: int = 0          # earliest turns left out of the prompt to fit the context window
    stopped: bool = False     # the request's time ran out: the answer is cut short

    def note(self) -> str:
        notes = []
        if self.dropped:
            notes.append(f"{self.dropped} earlier turn{'s' if self.dropped > 1 else ''} left out "
                         "to fit the model's context")
        if self.stopped:
            notes.append(f"stopped: this server allows {LIMITS.request_seconds} s per request")
        return "; ".join(notes)


def chat(session: Session, message: str, history: list[dict] | None, role: str = "merged",
         max_new_tokens: int = 128, temperature: float = 0.0, repetition_penalty: float = 1.0,
         deadline: float | None = None) -> Iterator[ChatReply]:
    """Stream one answer (greedy unless temperature > 0): yields the reply, answer growing.

    The prompt keeps the newest turns that fit the model's context; generation stops at
    ``deadline`` (``time.monotonic()``; default LIMITS.request_seconds from now)."""
    from ..evaluation.generation import chat as generate_chat

    text = check_chat_message(message, history)
    max_new_tokens = _bounded("max new tokens", max_new_tokens, 1, LIMITS.new_tokens)
    turns = plain_history(history)
    model, tok = session.model(role)
    messages, dropped = fit_context(model, tok, turns, text, max_new_tokens)
    deadline = time.monotonic() + LIMITS.request_seconds if deadline is None else deadline
    answer = {"role": "assistant", "content": ""}
    reply = ChatReply(turns + [{"role": "user", "content": text}, answer], dropped,
                      stopped=time.monotonic() >= deadline)
    if not reply.stopped:
        stream = generate_chat(model, tok, messages, max_new_tokens=max_new_tokens, stream=True,
                               temperature=float(temperature),
                               repetition_penalty=float(repetition_penalty))
        try:
            for so_far in stream:
                answer["content"] = so_far
                yield reply
                if time.monotonic() >= deadline:
                    reply.stopped = True
                    break
        finally:
            stream.close()  # ends the generation thread at its next token
    if not answer["content"].strip():
        answer["content"] = ("(no answer: the time ran out)" if reply.stopped
                             else "(no answer: the model stopped at once)")
    yield reply
