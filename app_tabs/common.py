"""What every tab shares: the page's access and visitors, the session's top line, the line on
each tab naming the merge its buttons act on, one-line errors, progress bars and Cancel."""
from __future__ import annotations

import contextvars
import functools
import importlib.util
import os

import gradio as gr

from layerswap_core.evaluation import languages
from layerswap_core.progress import with_eta
from layerswap_core.workbench import saves
from layerswap_core.workbench import session as wb
from layerswap_core.workbench import spaces
from layerswap_core.workbench.controls import acts_on
from layerswap_core.workbench.served import LIMITS, Access, as_text, readable_error

LANGS = languages.choices()   # the one table of languages (evaluation.languages)
# the line on each tab naming the merge its buttons act on (Page attribute -> who)
LABELS = {"build_label": "Build makes", "saves_label": "Save, Zip and Push write",
          "eval_label": "The merged model evaluated", "chat_label": "The merged model here"}
CANCELLING = "■ Cancelling after the current step..."


def ok(msg: str) -> str:
    return f"✔ {msg}"


def warn(exc: BaseException) -> str:
    """Show the error as a toast and return it for the status line (never a stack trace)."""
    msg = as_text(readable_error(exc))   # shown as written: "<lang>" is not an HTML tag
    gr.Warning(msg)
    return f"⚠ {msg}"


def guarded(line: str):
    """Callback decorator: on error the Page's component ``line`` shows one readable line (and
    a toast); every other output keeps its value."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kw):
            try:
                return fn(self, *args, **kw)
            except Exception as e:  # noqa: BLE001 - everything reaches the page as one line
                return {getattr(self, line): warn(e)}
        return wrapper
    return deco


def gr_progress(progress: gr.Progress):
    """Gradio's bar for a library ``progress``: what the job does now and the time left at the
    speed measured during this run, counted down every second between reports
    (``progress.with_eta``). The ticks come from another thread: each call runs in a copy of
    the event's context, where Gradio finds which event's bar to draw."""
    event = contextvars.copy_context()
    return with_eta(lambda frac, msg: event.copy().run(progress, frac, desc=msg), tick=1.0)


def heavy_slots() -> dict:
    """Long jobs (analyze, save, evaluate, sweep, the demo result): the page's heavy slots."""
    return dict(concurrency_id="heavy", concurrency_limit=LIMITS.jobs)


def light_slots() -> dict:
    """Short jobs on the shared engines (a build, a plan) wait at most one step of the job
    holding the engine (engines.dispatch), never behind the heavy slots or the chats."""
    return dict(concurrency_id="light", concurrency_limit=LIMITS.plan_jobs)


def chat_slots() -> dict:
    """Chats stream for up to a request's time: slots of their own, so that a Build never
    waits in Gradio's queue behind answers being streamed (on the engine it goes between two
    tokens: engines.dispatch)."""
    return dict(concurrency_id="chat", concurrency_limit=LIMITS.plan_jobs)


def client_address(request) -> str | None:
    """The address a page or API request came from, as the Space's proxy reports it
    (``saves.client_address``: the first hop of X-Forwarded-For behind a proxy, else the
    connection's address); None without a request."""
    if request is None:
        return None
    client = getattr(request, "client", None)
    headers = getattr(request, "headers", None) or {}
    try:
        forwarded = headers.get("x-forwarded-for")
    except AttributeError:
        forwarded = None
    return saves.client_address(getattr(client, "host", None), forwarded)


class PageBase:
    """The page's shared part; ``app.Page`` adds the tabs (``TABS``), the outputs of every
    event (``OUTPUTS``) and what a new session empties (``SESSION_VIEWS``)."""
    TABS: tuple[type, ...] = ()
    OUTPUTS: dict[str, tuple[str, ...]] = {}
    SESSION_VIEWS: tuple[str, ...] = ()

    def __init__(self, refs: dict[str, str], access: Access):
        self.refs, self.access = refs, access
        self.engines = spaces.start(refs)   # where jobs run, how many live models fit
        # "Sign in with Hugging Face" on a Space with hf_oauth: true (needs gradio[oauth])
        self.oauth = (access.served and bool(os.environ.get("OAUTH_CLIENT_ID"))
                      and importlib.util.find_spec("itsdangerous") is not None)

    def outputs(self, event: str) -> list:
        return [getattr(self, name) for name in self.OUTPUTS[event]]

    # ---- the visitor
    def visitor(self, request: gr.Request | None, profile=None) -> Access:
        """The page's access for this visitor: their namespace (signed-in user, else the page
        session) holds their saves, downloads and temporary files; their person (signed-in
        user, else the client's address: ``client_address``) has the save quota and the one
        heavy job (``workbench.saves``)."""
        user = getattr(profile, "username", None)
        session_id = getattr(request, "session_hash", None)
        if not (self.access.served or user or session_id):
            return self.access   # local, called without a page session (a script)
        # served: an anonymous visitor is their client address; locally every tab is its own
        address = client_address(request) if self.access.served else None
        return self.access.for_visitor(saves.visitor_namespace(user, session_id),
                                       saves.person(user, address))

    @staticmethod
    def page_id(request: gr.Request | None) -> str | None:
        """The page session, as the dispatcher knows it (its jobs stop when it closes)."""
        session_id = getattr(request, "session_hash", None)
        return saves.visitor_namespace(None, session_id) if session_id else None

    def end_visit(self, request: gr.Request, profile: gr.OAuthProfile | None):
        """The page was closed (its heartbeat ended, seconds ago): its jobs stop at their next
        step, the visitor's downloads and temporary files go (and an anonymous visitor's saves,
        which nobody can reach any more)."""
        wb.leave(self.page_id(request))
        access = self.visitor(request, profile)
        saves.end_visit(access.namespace, access)

    # ---- derived views
    def cleared(self) -> dict:
        """Every view of earlier results, empty (a new session has none): each tab's VIEWS."""
        return {**{getattr(self, name): empty() if callable(empty) else empty
                   for tab in self.TABS for name, empty in getattr(tab, "VIEWS", {}).items()},
                **self.labels(None, None)}

    def labels(self, session, config) -> dict:
        """The line on each tab naming the merge its buttons act on: Build the Configure tab's
        ``config`` (None: not valid now), the others the session's build."""
        if session is None:
            return {getattr(self, name): "" for name in LABELS}
        labels = dict(LABELS)
        if not getattr(self, "can_push", True):   # no Push control on this page
            labels["saves_label"] = "Save and Zip write"
        return {getattr(self, name): acts_on(who, session.built_config, config,
                                             session.num_layers, builds=name == "build_label")
                for name, who in labels.items()}

    def banner(self, session) -> dict:
        text = wb.banner(session)
        return {self.status: ok(text) if session is not None else f"⚠ {text}"}

    def no_session(self) -> dict:
        return {**self.cleared(), self.session: None, **self.banner(None)}

    # ---- Cancel
    def cancel_into(self, line):
        """A Cancel button's two callbacks. The first only writes the note on ``line``; the
        second, started by the page once that note is on screen, asks the job to stop. The job's
        own outcome is produced after that request, so it always lands after the note: a job
        told to stop while the note was still on its way could otherwise finish first and
        leave "Cancelling..." on screen for good."""
        def note(v):
            if not wb.running(v[self.session]):
                gr.Info("Nothing is running.")
                return gr.skip()
            return {line: CANCELLING}

        def cancel(v):
            if wb.cancel(v[self.session]) or not str(v[line] or "").startswith(CANCELLING):
                return gr.skip()
            # the job ended on its own between the note and the request
            return {line: "■ Nothing to cancel: the job had already finished."}
        return note, cancel

    def wire_run(self, button, line, cancel_button) -> None:
        """A run's button starts without the previous run's message (outside the queue: at
        once); its Cancel asks the job to stop between two steps, and the job then writes its
        own outcome (Gradio's cancels= would drop that last update and leave "Cancelling..." on
        screen): the note goes first, the request after it (``cancel_into``)."""
        button.click(lambda: "", None, [line], queue=False, api_visibility="private")
        self.wire_cancel(cancel_button, line)

    def wire_cancel(self, button, line) -> None:
        note, cancel = self.cancel_into(line)
        button.click(note, {self.session}, [line], api_visibility="private").then(
            cancel, {self.session, line}, [line], api_visibility="private")
