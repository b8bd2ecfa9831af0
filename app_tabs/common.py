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
from layerswap_core.workbench import build as wb_build
from layerswap_core.workbench import spaces
from layerswap_core.workbench.controls import acts_on
from layerswap_core.workbench.served import LIMITS, Access, as_text, readable_error

LANGS = languages.choices()   # the one table of languages (evaluation.languages)
# the line on each tab naming the merge its buttons act on (its name -> who); each tab that
# has one gives it to the page (``PageBase.label_lines``)
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
    """Callback decorator: on error the tab's own component ``line`` shows one readable line (and
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


def components(*owners) -> dict:
    """name -> component of each owner (a tab, a handles record; a later owner wins): how
    a tab's declared outputs (``OUTPUTS``, by name) become the components it returns."""
    return {name: c for o in owners for name, c in vars(o).items()
            if isinstance(c, gr.blocks.Block)}


class PageBase:
    """The page's shared part, one object that every tab is given (``Tab.page``): the page's
    access and refs, the components every tab reads and writes (the top line, the session
    state, what a reload keeps), the views of earlier results each tab registers (a new
    session empties them), the lines naming the merge, one-line errors and Cancel."""

    def __init__(self, refs: dict[str, str], access: Access):
        self.refs, self.access = refs, access
        self.engines = spaces.start(refs)   # where jobs run, how many live models fit
        # "Sign in with Hugging Face" on a Space with hf_oauth: true (needs gradio[oauth])
        self.oauth = (access.served and bool(os.environ.get("OAUTH_CLIENT_ID"))
                      and importlib.util.find_spec("itsdangerous") is not None)
        # only with a token and the network, and never with the server's token for visitors
        # (served: with the signed-in visitor's own token, into their own namespace)
        self.can_push = self.oauth or (wb_build.hub_token() is not None and not access.served)
        self.views: dict[str, tuple] = {}   # name -> (component, its empty value)
        self.label_lines: dict[str, gr.Markdown] = {}   # LABELS' name -> its line

    def layout(self, header: str) -> None:
        """The top of the page: its title, the mode, the top line and the state the tabs
        share."""
        gr.Markdown(header)
        gr.Markdown(self.access.describe() + " " + self.engines, elem_id="mode",
                    elem_classes="status")
        if self.oauth:  # served on a Space with hf_oauth: saves and pushes under your account
            gr.LoginButton()
        self.status = gr.Markdown("Loading the models (progress on the Models tab)...",
                                  elem_id="status", elem_classes="status")
        # per visitor; freed soon after the page closes, or LIMITS.session_seconds after picking
        self.session = gr.State(None, time_to_live=LIMITS.session_seconds,
                                delete_callback=wb.close_session)
        # what a reload keeps: the models named and the Configure tab (not the build: a reload
        # is a new session, and the tabs say nothing is built)
        self.kept = gr.BrowserState(None)
        self.reloaded = gr.State(None)   # the Configure settings kept, until they are restored

    def register_views(self, tab) -> None:
        """A tab's views of earlier results (its ``VIEWS``: name -> empty value), emptied by a
        new session; in the order of the page's tabs."""
        own = components(tab)
        self.views.update({name: (own[name], empty) for name, empty in tab.VIEWS.items()})

    @property
    def session_views(self) -> tuple[str, ...]:
        """What a new (or no) session empties, by name: every tab's views, then the lines."""
        return (*self.views, *LABELS)

    def named(self) -> dict:
        """The shared components, the registered views and the lines, by name."""
        return {**components(self), **{n: c for n, (c, _) in self.views.items()},
                **self.label_lines}

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
        return {**{comp: empty() if callable(empty) else empty
                   for comp, empty in self.views.values()},
                **self.labels(None, None)}

    def labels(self, session, config) -> dict:
        """The line on each tab naming the merge its buttons act on: Build the Configure tab's
        ``config`` (None: not valid now), the others the session's build."""
        if session is None:
            return {line: "" for line in self.label_lines.values()}
        labels = dict(LABELS)
        if not self.can_push:   # no Push control on this page
            labels["saves_label"] = "Save and Zip write"
        return {self.label_lines[name]: acts_on(who, session.built_config, config,
                                                session.num_layers,
                                                builds=name == "build_label")
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


class Tab:
    """A tab of the page, its own object: its components (``self.<name>``), callbacks and
    wiring; the page's shared part is ``self.page``. What it needs of another tab comes as
    that tab's handles record (or a component, a callback) passed to its ``wire``; ``OUTPUTS``
    names each event's outputs (the API returns them in that order), ``VIEWS`` its views of
    earlier results with their empty values (a new session empties them)."""
    OUTPUTS: dict[str, tuple[str, ...]] = {}
    VIEWS: dict = {}

    def __init__(self, page: PageBase):
        self.page = page
        self.given: tuple = ()   # the handles records this tab's outputs may name

    def outputs(self, event: str, *more: str) -> list:
        """The components of an event's declared outputs (and ``more`` names): this tab's,
        the page's shared ones and those of the handles records it was given."""
        found = {**components(*self.given), **self.page.named(), **components(self)}
        return [found[name] for name in (*self.OUTPUTS[event], *more)]
