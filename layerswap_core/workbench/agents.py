"""Tools for agents (the app's MCP server): the workbench's steps as typed, documented functions.

An agent starts with ``check_models``, which returns a ``session`` id (Hub models not here yet:
their pre-flight first, the page's gate (``preflight.preflight_gate``), and a download only when
asked, ``download=true``, after a compatible one); every later tool names
that session, the agent's own workbench (like a page's ``Session``: its models, its last build).
The id is a capability, unguessable as the page's session is. ``app.py`` registers each method
of ``AgentTools.tools()`` as an API endpoint (``gr.api``), which ``launch(mcp_server=True)``
lists as an MCP tool: the name, the docstring's first paragraph and its ``Args:`` lines are what
the agent reads.

Served mode applies to agents exactly as to the page: each agent session is a visitor of its
own (``Access.for_visitor``: references vetted, saves in its own folder under the output root
within the save quotas), its jobs run under the dispatcher's rules (one heavy job at a time, the
time budget, the queue), every number is bounded by ``LIMITS`` and every text capped before it
is parsed. At most ``LIMITS.agent_sessions`` are open at once, and
``LIMITS.agent_sessions_per_client`` per client (``CLIENT``: the caller's address, which the
app sets for each call; its sessions also share one save quota and one heavy job with that
address's pages). One left idle for ``LIMITS.agent_idle_seconds`` is closed as a page that
closes is (its jobs cancelled, its anonymous saves removed): that is also how the session of a
client that went away ends, since gradio's MCP server is stateless. A call whose client goes
while it runs is cancelled (the app wraps the MCP server's tool-call handler:
``app_tabs.agents.cancel_on_disconnect``).
Errors are one line (``readable_error``).
"""
from __future__ import annotations

import contextvars
import json
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from ..checkpoints import hub
from ..merge.config import FIELDS, MergeConfig, load_yaml
from . import saves
from . import session as wb
from . import build as wb_build
from . import configure as wb_configure
from . import models as wb_models
from .controls import outside_validated
from .deltas import analyze_deltas, auto_thresholds, suggest, suggestion_text
from .evaluate import evaluate_roles, evaluation_note
from .preflight import preflight_gate
from .served import HUB_ID, LIMITS, LOCAL, Access, WorkbenchError, capped, readable_error
from ..analysis.suggest import delta_story
from ..evaluation.registry import choices
from ..demos import variants as _demo_task  # noqa: F401  (registers the demo-variants task)

# the calling client's person (``saves.person``: its address as the Space's proxy reports it, or
# a signed-in user), set by the app around each tool call; None: unknown (a script, local)
CLIENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("agent_client", default=None)
MODEL_KEYS = ("task", "lang", "base")   # a session's models: never taken from a config
ROLE_NAMES = {"base": "base", "task": "task", "lang": "lang", "merged": "merged"}


@dataclass
class Running:
    """One tool call at work, as ``job_status`` shows it."""
    tool: str
    started: float = field(default_factory=time.monotonic)
    fraction: float = 0.0
    message: str = "starting"

    def report(self, fraction: float, message: str) -> None:
        self.fraction, self.message = float(fraction), str(message)

    def as_dict(self) -> dict:
        return {"tool": self.tool, "progress": round(self.fraction, 3), "message": self.message,
                "seconds": round(time.monotonic() - self.started, 1)}


@dataclass
class AgentSession:
    """An agent's workbench: the page's ``Session``, this visitor's access, and its jobs."""
    session: wb.Session | None    # None: a check_models on this session found no usable models
    access: Access
    used: float = field(default_factory=time.monotonic)
    running: list[Running] = field(default_factory=list)
    last: dict | None = None      # the last finished tool call: {"tool", "outcome", "seconds"}
    client: str | None = None     # the person who opened it (``CLIENT``)


def _json(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False)


class AgentTools:
    """The agent tools over one server's ``access`` (local or served)."""

    def __init__(self, access: Access = LOCAL):
        self.access = access
        self.sessions: dict[str, AgentSession] = {}
        self._lock = threading.Lock()

    def tools(self) -> list:
        """The tools, in the order an agent uses them."""
        return [self.check_models, self.delta_summary, self.suggest_configuration,
                self.layer_plan, self.build_and_save, self.quick_evaluate, self.job_status,
                self.cancel_job, self.close_session]

    # ---- sessions
    def _visitor(self, token: str, client: str | None = None) -> Access:
        """The access of the agent session ``token``: a visitor of its own (its namespace: a
        keyed digest of the id, as a page session's) whose quotas are its client's when served
        (locally each session is its own, as each tab is)."""
        return self.access.for_visitor(saves.visitor_namespace(None, "agent:" + token),
                                       client if self.access.served else None)

    def _models(self, session: str) -> tuple[AgentSession, wb.Session]:
        """The agent session and its workbench ``Session`` (refused when it has no models)."""
        entry = self._get(session)
        if entry.session is None:
            raise WorkbenchError("this session has no compatible models (or they are still "
                                 "downloading): call check_models with it")
        return entry, entry.session

    def _get(self, session: str) -> AgentSession:
        self.expire()
        token = capped("session", session, 64).strip()
        with self._lock:
            entry = self.sessions.get(token)
            if entry is None:
                raise WorkbenchError("unknown or expired session: call check_models first")
            entry.used = time.monotonic()
            return entry

    def expire(self, now: float | None = None) -> list[str]:
        """Close the sessions idle for longer than ``LIMITS.agent_idle_seconds`` (none with a
        tool call at work); their ids."""
        now = time.monotonic() if now is None else now
        with self._lock:
            idle = [t for t, e in self.sessions.items()
                    if not e.running and now - e.used > LIMITS.agent_idle_seconds]
            gone = [self.sessions.pop(t) for t in idle]
        for entry in gone:
            self._close(entry)
        return idle

    @staticmethod
    def _close(entry: AgentSession) -> None:
        wb.close_session(entry.session)
        saves.end_visit(entry.access.namespace, entry.access)

    @contextmanager
    def _working(self, entry: AgentSession, tool: str):
        """Shows the call in ``job_status`` while it runs; its outcome after."""
        job = Running(tool)
        with self._lock:
            entry.running.append(job)
        outcome = "done"
        try:
            yield job.report
        except BaseException as e:
            outcome = readable_error(e)
            raise
        finally:
            with self._lock:
                entry.running.remove(job)
                entry.used = time.monotonic()
                entry.last = {"tool": tool, "outcome": outcome,
                              "seconds": round(time.monotonic() - job.started, 1)}

    def _config(self, entry: AgentSession, config) -> MergeConfig:
        """The merge config an agent gave (a mapping, or its YAML/JSON text; empty: the
        default), over the session's models, validated for their depth."""
        s = entry.session
        if isinstance(config, str):
            config = load_yaml(capped("config", config, LIMITS.rules_chars), "config") or {}
        if config is None:
            config = {}
        if not isinstance(config, dict):
            raise WorkbenchError(f"config: expected a mapping of merge fields, got "
                                 f"{type(config).__name__}")
        capped("config", json.dumps(config, default=str), LIMITS.rules_chars)
        models = sorted(set(config) & set(MODEL_KEYS))
        if models:
            raise WorkbenchError(f"config: leave out {', '.join(models)}: the models are the "
                                 "session's (check_models)")
        given = MergeConfig.from_dict(config)
        refs = {k: s.recipe.get(k) for k in MODEL_KEYS}   # as named, never a server folder
        return replace(given, **refs).validate(s.num_layers, has_base=s.has_base)

    # ---- the tools
    def check_models(self, base: str = wb.DEMO_REFS["base"], task: str = wb.DEMO_REFS["task"],
                     lang: str = wb.DEMO_REFS["lang"], session: str = "",
                     download: bool = False) -> str:
        """Check that a base model and two experts fine-tuned from it can be merged, and open a session on them (headers only: no weights are loaded). Hub models not on this server yet are first checked from their metadata alone (the pre-flight: nothing large downloaded); call again with download=true to fetch them.

        Args:
            base: the common base model: an embedded:NAME, a Hub id (owner/name) or a folder this server allows; may be empty (then the delta views and base-needing methods are unavailable).
            task: the task expert (e.g. math in English), same forms as base.
            lang: the language expert (e.g. Swahili), same forms as base.
            session: empty: a new session; an id check_models returned: that session's models are replaced (its saves stay, and may be picked as models).
            download: false: Hub models not here yet get their pre-flight only (no session opens until they are here); true: after a compatible pre-flight, download them (in the background on a shared server: the answer's downloading says how far; call again with its session until the models are here; cancel_job stops the download).

        Returns:
            JSON: session (the id every other tool takes; null when not compatible or waiting for download=true), compatible, layers, models (one row per model: role, model, architecture, layers, hidden, vocab, dtype, size), problems, default_config; before a download: preflight (one line each: the models, sizes, the download and memory estimate) and download (the Hub models it would fetch, GB); while downloading: downloading (one line per model).
        """
        if session:
            old = self._get(session)
            token, access = session.strip(), old.access
        else:
            self.expire()
            client = CLIENT.get()
            self._room(client)
            token = uuid.uuid4().hex
            access = self._visitor(token, client)
        gate = preflight_gate(base, task, lang, access)
        if gate is not None:   # Hub models to download: the page's gate, the same words
            pf, missing = gate
            if not pf.ok or not download:
                return _json({"session": session.strip() or None, "compatible": pf.ok,
                              "layers": None, "models": [],
                              "problems": [] if pf.ok else [pf.refusal],
                              "preflight": pf.lines(),
                              "download": {"models": missing,
                                           "gb": round(pf.download_bytes / 10 ** 9, 3)}})
        else:   # a download check_models started: asked again while it runs
            missing = _downloading((base, task, lang), access)
        pending = self._download(missing, access) if download or gate is None else []
        if pending:   # on their way: a session to ask again with (or cancel)
            if not session:
                with self._lock:
                    full = self._full(client)
                    if full:
                        saves.cancel_downloads(access)
                        raise WorkbenchError(full)
                    self.sessions[token] = AgentSession(None, access, client=client)
            return _json({"session": token, "compatible": True, "layers": None,
                          "models": [], "problems": [], "downloading": pending})
        opened, report = wb_models.open_session(base, task, lang, access=access)
        rows = [dict(zip(wb_models.ModelsReport.HEADERS, row)) for row in report.rows]
        out = {"session": None, "compatible": report.ok, "layers": report.num_layers,
               "models": rows, "problems": report.problems}
        if session:   # the old models are no longer used, whatever the check found
            wb.close_session(old.session)
            old.session = opened     # None: the session stays (its saves too), without models
            out["session"] = token
        if opened is None:
            return _json(out)
        if not session:
            with self._lock:
                full = self._full(client)
                if full:
                    wb.close_session(opened)
                    raise WorkbenchError(full)
                self.sessions[token] = AgentSession(opened, access, client=client)
            out["session"] = token
        out["default_config"] = _plain_config(wb_configure.default_config(opened))
        return _json(out)

    @staticmethod
    def _download(missing: list[str], access: Access) -> list[str]:
        """Start (or go on with) the served downloads of ``missing``: one line per model still
        on its way (none: all here). Locally the check itself downloads them."""
        if not access.served:
            return []
        pending = []
        for repo in missing:
            try:
                hub.served_fetch(repo, access.namespace or "")
            except hub.Pending as e:
                pending.append(str(e))
        return pending

    def _room(self, client: str | None) -> None:
        with self._lock:
            full = self._full(client)
        if full:
            raise WorkbenchError(full)

    def _full(self, client: str | None) -> str:
        """Why no session may open now (the server's or this client's sessions at their cap;
        the client's cap on a served page only), else "". Under the lock."""
        if len(self.sessions) >= LIMITS.agent_sessions:
            return (f"this server has {LIMITS.agent_sessions} agent sessions open: close one "
                    "(close_session) or try again later")
        mine = sum(e.client == client for e in self.sessions.values())
        if self.access.served and client and mine >= LIMITS.agent_sessions_per_client:
            return (f"your address has {mine} agent sessions open, the most this server allows "
                    "per client (LAYERSWAP_MAX_AGENT_SESSIONS_PER_CLIENT): close one "
                    f"(close_session), or one left idle closes after "
                    f"{LIMITS.agent_idle_seconds // 60} min")
        return ""

    def delta_summary(self, session: str) -> str:
        """Where each expert changed the base: one sentence, each expert's data-derived threshold and its share of the change per layer (reads every tensor once; cached).

        Args:
            session: the id check_models returned.

        Returns:
            JSON: story (one sentence), tau (each expert's threshold), layer_share (per expert, each layer's share of its total change, bottom layer first), suggestion (one paragraph).
        """
        entry, s = self._models(session)
        with self._working(entry, "delta_summary") as progress:
            stats = analyze_deltas(s, progress)
        task, lang = stats["task"], stats["lang"]
        tau_task, tau_lang = auto_thresholds(task, lang)
        shares = {}
        for role, st in (("task", task), ("lang", lang)):
            prof = st.layer_profile()
            total = float(prof.sum()) or 1.0
            shares[role] = [round(float(v) / total, 4) for v in prof]
        return _json({"story": delta_story(task, lang),
                      "tau": {"task": tau_task, "lang": tau_lang},
                      "layer_share": shares,
                      "suggestion": suggestion_text(suggest(s), s.num_layers)})

    def suggest_configuration(self, session: str) -> str:
        """Suggest a layer swap for these experts from their deltas (analyses them first when delta_summary has not).

        Args:
            session: the id check_models returned.

        Returns:
            JSON: config (merge fields to pass to layer_plan, build_and_save), explanation, outside_validated (the layer counts outside the paper's validated ranges; empty when inside).
        """
        entry, s = self._models(session)
        with self._working(entry, "suggest_configuration") as progress:
            analyze_deltas(s, progress)
        sug = suggest(s)
        config = {"method": "layer_swap", **sug.merge_config_kwargs()}
        counts = {k: config[k] for k in ("bottom", "top", "transition_bottom", "transition_top")}
        return _json({"config": config, "explanation": sug.explanation,
                      "outside_validated": outside_validated(counts, s.num_layers)})

    def layer_plan(self, session: str, config: dict | str | None = None) -> str:
        """The layer plan of a merge configuration: which model every layer comes from (reads no tensors).

        Args:
            session: the id check_models returned.
            config: merge fields as a mapping (or its YAML/JSON text, e.g. a saved layerswap.yaml without the model keys); empty: the default layer swap. FIELDS

        Returns:
            JSON: config (all fields), describe (one line), layers (per layer: its source), plan (the plan as text).
        """
        entry, s = self._models(session)
        cfg = self._config(entry, config)
        plan = wb_configure.merge_plan(s, cfg)
        return _json({"config": _plain_config(cfg), "describe": cfg.describe(s.num_layers),
                      "layers": [{"layer": r.layer, "source": r.text()}
                                 for r in plan.layer_rows()],
                      "plan": plan.summary_text()})

    def build_and_save(self, session: str, config: dict | str | None = None, folder: str = "",
                       overwrite: bool = False) -> str:
        """Build the merged model in memory (then quick_evaluate can score it) and, with a folder, save it there as safetensors with its layerswap.yaml and model card.

        Args:
            session: the id check_models returned.
            config: merge fields as a mapping (or its YAML/JSON text); empty: the default layer swap. FIELDS
            folder: where to save; empty: build in memory only. On a shared server: a plain name (letters, digits, '-', '_', '.'), saved in this session's own folder within the server's quotas; locally: a name under the output folder or an absolute path.
            overwrite: replace an existing folder (only one layerswap saved).

        Returns:
            JSON: built (one line), seconds, tensors_recomputed, tensors, saved_to (null when not saved), config_yaml.
        """
        entry, s = self._models(session)
        cfg = self._config(entry, config)
        folder = capped("folder", folder, LIMITS.ref_chars).strip()
        with self._working(entry, "build_and_save") as progress:
            res = wb_build.build(s, cfg, progress)
            out = (wb_build.save(s, cfg, folder, bool(overwrite), progress, access=entry.access)
                   if folder else None)
        return _json({"built": cfg.describe(s.num_layers), "seconds": round(res.seconds, 2),
                      "tensors_recomputed": res.changed, "tensors": res.total,
                      # served: by its name (the server's folders are not the agent's)
                      "saved_to": None if out is None else
                      out.name if entry.access.served else str(out),
                      "config_yaml": cfg.to_yaml()})

    def quick_evaluate(self, session: str, models: list[str] | None = None,
                       data: str = "gsm-symbolic", language: str = "sw", questions: int = 2,
                       shots: int = 0, max_new_tokens: int = 32,
                       chain_of_thought: bool = False) -> str:
        """Score models side by side on the first few questions of a data set (bounded by the server's limits): accuracy with its 95% interval and the gold solution's NLL.

        Args:
            session: the id check_models returned.
            models: which models, from base, task, lang and merged (the last build_and_save); default: task and merged.
            data: gsm-symbolic (ships with layerswap) or mgsm (downloaded on first use when online).
            language: a language code of the data set, e.g. sw, bn, te, th, ja, zh, ru, fr, de, es, en.
            questions: how many questions (the first ones; at most the server's limit, 20 by default).
            shots: worked examples before each question (0 to the server's limit, 8 by default).
            max_new_tokens: the longest answer (at most the server's limit, 256 by default).
            chain_of_thought: answer with a worked solution (else the number directly).

        Returns:
            JSON: summary (per model: accuracy, 95% CI, strict accuracy, gold NLL, n), note (what was evaluated), items (per question: gold and each model's answer).
        """
        entry, s = self._models(session)
        names = [capped("model", m, 20).strip() for m in (models or ["task", "merged"])][:4]
        unknown = [m for m in names if m not in ROLE_NAMES]
        if unknown or not names:
            raise WorkbenchError(f"models: choose from {', '.join(ROLE_NAMES)}, got "
                                 f"{', '.join(unknown) or 'none'}")
        if "merged" in names and s.built_config is None:
            raise WorkbenchError("build the merged model first (build_and_save)")
        data = capped("data", data, 20).strip().lower()
        if data not in choices("eval"):
            raise WorkbenchError(f"data: {' or '.join(choices('eval'))}, got {data!r}")
        language = capped("language", language, 10).strip()
        with self._working(entry, "quick_evaluate") as progress:
            res = evaluate_roles(s, data, language, questions, shots, bool(chain_of_thought),
                                 tuple(dict.fromkeys(names)), max_new_tokens, False, progress)
        keys = ("model", "accuracy", "ci95", "strict", "gold_nll", "n")
        items = [{"question": r["question"], "gold": r["gold"],
                  "answers": {m: {"answer": o["answer"], "correct": o["correct"]}
                              for m, o in r["models"].items()}} for r in res.raw.rows]
        return _json({"summary": [dict(zip(keys, row)) for row in res.summary_rows],
                      "note": evaluation_note(res), "items": items})

    def job_status(self, session: str) -> str:
        """What the session's tool calls are doing now (call it beside a long build or evaluation), and how the last one ended.

        Args:
            session: the id check_models returned.

        Returns:
            JSON: running (per call at work: tool, progress 0-1, message, seconds), last (tool, outcome, seconds), built (the merge built in memory, or null).
        """
        entry = self._get(session)
        s = entry.session
        with self._lock:
            running = [j.as_dict() for j in entry.running]
            last = entry.last
        built = s is not None and s.built_config is not None
        return _json({"running": running, "last": last,
                      "built": s.built_config.describe(s.num_layers) if built else None})

    def cancel_job(self, session: str) -> str:
        """Ask the session's running job to stop at its next step (its own call then ends with "Cancelled."), and its Hub downloads to stop.

        Args:
            session: the id check_models returned.

        Returns:
            JSON: cancelled (whether a job was running), message.
        """
        entry = self._get(session)
        stopped = wb.cancel(entry.session)
        stopped = bool(saves.cancel_downloads(entry.access)) or stopped   # check_models' download
        return _json({"cancelled": stopped,
                      "message": "Cancelling after the current step." if stopped
                      else "Nothing is running."})

    def close_session(self, session: str) -> str:
        """Close a session: its jobs are cancelled, its models and results freed, and on a shared server its saves removed.

        Args:
            session: the id check_models returned.

        Returns:
            JSON: closed (true).
        """
        entry = self._get(session)
        with self._lock:
            self.sessions.pop(capped("session", session, 64).strip(), None)
        self._close(entry)
        return _json({"closed": True})


def _downloading(refs, access: Access) -> list[str]:
    """The Hub ids among ``refs`` the served cache is downloading now."""
    if not access.served:
        return []
    jobs = hub.served_cache().jobs
    return [r for r in dict.fromkeys((x or "").strip() for x in refs)
            if HUB_ID.fullmatch(r) and r not in access.trusted
            and jobs.get(r) is not None and jobs[r].running]


def _plain_config(cfg: MergeConfig) -> dict:
    """The config's fields without the model references (the session's)."""
    return {k: v for k, v in cfg.to_dict().items() if k not in MODEL_KEYS}


def _fields_line() -> str:
    """The merge fields an agent may give, from the one declaration (``merge.config.FIELDS``)."""
    return "Fields: " + "; ".join(f"{k.name} ({k.help})" if k.help else k.name
                                  for k in FIELDS.values() if k.name not in MODEL_KEYS) + "."


for _tool in (AgentTools.layer_plan, AgentTools.build_and_save):
    _tool.__doc__ = _tool.__doc__.replace(" FIELDS", " " + " ".join(_fields_line().split()))
