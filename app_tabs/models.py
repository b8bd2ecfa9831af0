"""The Models tab: the base and the two experts checked and put in use (``/pick_models``), the
visitor's Hub downloads (served), and what a page reload keeps (this browser's localStorage)."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr

from layerswap_core.workbench import saves
from layerswap_core.workbench import session as wb
from layerswap_core.workbench import models as wb_models
from layerswap_core.workbench.preflight import (download_gate, download_line, preflight_gate,
                                                 preflight_markdown)
from layerswap_core.workbench.served import LIMITS, offered_models

from .common import Tab, gr_progress, guarded, ok, warn
from .configure import KEPT_CONTROLS, SLIDERS, ConfigureHandles
from .sweep import SweepHandles

# the demo trios' experts (``demos.trios``: one record per trio)
EXPERT_CHOICES = wb.demo_experts()


@dataclass(frozen=True)
class ModelsHandles:
    """What the Models tab gives the others: the three model lists, its button (a new check
    empties what showed the old models), and the lists refreshed with the visitor's saves
    (served: ``own_saves``)."""
    base: gr.Dropdown
    task: gr.Dropdown
    lang: gr.Dropdown
    pick_btn: gr.Button
    own_saves: Callable


class ModelsTab(Tab):
    VIEWS: dict = {}   # the tab's table and line show the check just made
    # then every view of earlier results, emptied (``PageBase.session_views``)
    OUTPUTS = {"pick_models": ("status", "models_md", "models_table", "session", *SLIDERS, "xs",
                               "ys", "download_btn")}

    @guarded("models_md")
    def pick_models(self, v, request: gr.Request, profile: gr.OAuthProfile | None,
                    progress=gr.Progress()):
        """Check the models and use them; Hub models not here yet get their pre-flight first
        (metadata only), and nothing large is downloaded until "Download and use"."""
        return self._pick(v, request, profile, progress, download=False)

    @guarded("models_md")
    def download_models(self, v, request: gr.Request, profile: gr.OAuthProfile | None,
                        progress=gr.Progress()):
        """"Download and use": the pick, its Hub models downloaded."""
        return self._pick(v, request, profile, progress, download=True)

    def _pick(self, v, request, profile, progress, download: bool):
        refs = (v[self.base], v[self.task], v[self.lang])
        old = v[self.page.session]
        # a failed check keeps the session in use (its models, its build); none: none
        kept = self.page.no_session() if old is None else {}
        still = ("" if old is None else "\n\nStill in use, unchanged: the models and merge on "
                 "the top line.")
        access = self.page.visitor(request, profile)
        if download:   # the explicit step (the API's too): only after a compatible pre-flight
            refused = download_gate(*refs, access, gr_progress(progress))
            gate = None if refused is None else (refused, [])
        else:
            gate = preflight_gate(*refs, access, gr_progress(progress))
        if gate is not None:   # Hub models to download: their metadata first, nothing large
            pf, missing = gate
            md = preflight_markdown(pf, access)
            if not pf.ok:   # the table names these references, never an earlier pick's
                gr.Warning("These models cannot be merged; see the Models tab.")
                return {self.models_md: "⚠ " + md + still,
                        self.models_table: wb_models.unchecked_rows(*refs),
                        self.download_btn: gr.update(visible=False)}
            return {self.models_md: ok(md + "\n\n" + download_line(pf, missing)) + still,
                    self.download_btn: gr.update(visible=True)}
        hidden = {self.download_btn: gr.update(visible=False)}
        try:
            session, report = wb_models.open_session(*refs, gr_progress(progress), access,
                                                     visitor=self.page.page_id(request))
        except Exception as e:  # noqa: BLE001 - a reference that cannot be used at all
            return {**kept, **hidden, self.models_md: warn(e) + still,
                    self.models_table: getattr(e, "rows", None) or wb_models.unchecked_rows(*refs)}
        if session is None:
            gr.Warning("These models cannot be merged; see the list on the Models tab.")
            return {**kept, **hidden, self.models_md: "⚠ " + report.markdown() + still,
                    self.models_table: report.rows}
        wb.close_session(old)  # nothing runs on models no longer selected
        wb.warm_up(session)  # load the models in the background while the visitor looks around
        return {**self.page.cleared(), **hidden, self.page.session: session,
                **self.page.banner(session), self.models_md: ok(report.markdown()),
                self.models_table: report.rows, **self.configure.show_models(session),
                **self.sweep.show_models(session)}

    def demo_trio(self, lang: str) -> dict:
        """The three dropdowns set to a demo trio (the check follows: one click), and the last
        check's line gone (the conversion's bar shows alone: issue #61)."""
        trio = wb.demo_trio_refs(lang)
        return {self.base: trio["base"], self.task: trio["task"], self.lang: trio["lang"],
                self.models_md: ""}

    # ---- what a page reload keeps (this browser's localStorage)
    def remember(self, v) -> dict:
        """The models in use (as the visitor named them) and the Configure tab's controls."""
        session, before = v[self.page.session], v[self.page.kept] or {}
        refs = dict(session.names) if session is not None else before.get("refs", {})
        controls = self.configure.controls
        return {self.page.kept: {"refs": refs,
                                 "config": {name: v[controls[name]] for name in KEPT_CONTROLS}}}

    def restore_models(self, v) -> dict:
        """The models this browser last used on the Models tab; its Configure settings held
        for ``restore_config`` (the check's new sliders are remembered meanwhile)."""
        kept = v[self.page.kept] or {}
        refs = kept.get("refs") or {}
        lists = {"base": self.base, "task": self.task, "lang": self.lang}
        return {**{lists[role]: refs[role] for role in wb.ROLES if refs.get(role)},
                self.page.reloaded: kept.get("config") or {}}

    def restore_config(self, v) -> dict:
        """The Configure tab as this browser left it, once its models are checked again (the
        sliders are bounded by their depth: a value they refuse leaves the defaults)."""
        saved = v[self.page.reloaded] or {}
        session = v[self.page.session]
        if session is None or not saved:
            return gr.skip()
        if any(not 0 <= int(saved.get(s) or 0) <= session.num_layers for s in SLIDERS):
            return gr.skip()
        controls = self.configure.controls
        return {controls[name]: saved[name] for name in KEPT_CONTROLS if name in saved}

    # ---- served: the visitor's own saves and Hub downloads
    def own_saves(self, request: gr.Request, profile: gr.OAuthProfile | None):
        """The model lists with the visitor's own saves (served: nobody else's)."""
        # by their names: a visitor picks their own save by name (no server path on the page)
        mine = [os.path.basename(p) for p in saves.own_saves(self.page.visitor(request, profile))]
        offered = offered_models(self.page.access)
        return [gr.update(choices=[*first, *mine, *offered]) for first in
                (list(wb_models.EMBEDDED_BASES), EXPERT_CHOICES, EXPERT_CHOICES)]

    def hub_status(self, request: gr.Request, profile: gr.OAuthProfile | None):
        """The visitor's Hub downloads in words (nothing changes when there are none)."""
        jobs = saves.downloads(self.page.visitor(request, profile))
        if not jobs:
            return gr.skip()
        return "; ".join(("⏳ " if j.running else "⚠ " if j.error else "✔ ") + j.line()
                         for j in jobs)

    def cancel_download(self, request: gr.Request, profile: gr.OAuthProfile | None):
        names = saves.cancel_downloads(self.page.visitor(request, profile))
        return ("■ Cancelled: " + ", ".join(names)) if names else "Nothing is downloading."

    # ---- layout
    def layout(self) -> ModelsHandles:
        access, refs = self.page.access, self.page.refs
        offered = offered_models(access)
        where = ("a folder under the model folders above" if access.served
                 else "a local folder")
        with gr.Tab("Models", id="models"):
            gr.Markdown(f"Each model is `embedded:NAME`, {where}, or a Hub id (`owner/name`, "
                        "needs the network); an expert may also be a PEFT adapter folder over the "
                        "base. Checking reads headers only.")
            with gr.Row():
                gr.Markdown("Demo trios, one click each:", elem_id="demo-trios-label")
                self.trio_btns = {lang: gr.Button(label, size="sm", elem_id=f"trio-{lang}")
                                  for lang, label in wb.demo_trio_choices().items()}
            with gr.Row():
                self.base = gr.Dropdown([*wb_models.EMBEDDED_BASES, *offered], value=refs["base"],
                                        allow_custom_value=True, label="Base model",
                                        elem_id="base-ref")
                self.task = gr.Dropdown([*EXPERT_CHOICES, *offered], value=refs["task"],
                                        allow_custom_value=True, label="Task expert (math)",
                                        elem_id="task-ref")
                self.lang = gr.Dropdown([*EXPERT_CHOICES, *offered], value=refs["lang"],
                                        allow_custom_value=True, label="Language expert",
                                        elem_id="lang-ref")
            self.pick_btn = gr.Button("Check and use these models", variant="primary",
                                      elem_id="pick")
            # Hub models not here yet: shown once their pre-flight (metadata only) passed
            self.download_btn = gr.Button("Download and use", visible=False, elem_id="download")
            self.models_md = gr.Markdown(elem_id="models-status")
            # served: Hub downloads run in the background; their progress shows above
            self.hub_cancel = gr.Button("Cancel download", size="sm", visible=access.served)
            self.hub_timer = gr.Timer(3, active=access.served)
            self.models_table = gr.Dataframe(headers=list(wb_models.ModelsReport.HEADERS),
                                             interactive=False, elem_id="models-table",
                                             label="Models (read from headers, no weights loaded)")
        return ModelsHandles(self.base, self.task, self.lang, self.pick_btn, self.own_saves)

    # ---- wiring
    def wire(self, demo: gr.Blocks, configure: ConfigureHandles, sweep: SweepHandles) -> list:
        """The check's events (the button's, a reload's, a demo trio's), returned: what shows
        the models in use follows them (``app.py``). ``configure``: the Configure tab (a pick
        bounds its sliders and draws its plan; a reload keeps its controls); ``sweep``: the
        Sweep tab (its default grid follows the models' depth)."""
        self.configure, self.sweep = configure, sweep
        self.given = (configure, sweep)
        page = self.page
        outputs = self.outputs("pick_models", *page.session_views)
        models = {self.base, self.task, self.lang, page.session}
        lists = [self.base, self.task, self.lang]
        kept = [configure.controls[name] for name in KEPT_CONTROLS]
        remember = (self.remember, set(configure.inputs) | {page.kept}, [page.kept])
        # the bar (a first use converts the embedded models) on the Models tab's status, never
        # over the top line's text; that status emptied first, so that the bar is drawn alone,
        # not over the last check's "Compatible" (#61)
        def emptied(button):   # the status emptied, then the check
            return button.click(lambda: "", None, [self.models_md], queue=False,
                                show_progress="hidden", api_visibility="private")

        picked = [emptied(self.pick_btn).then(self.pick_models, models, outputs,
                                              api_name="pick_models",
                                              concurrency_limit=LIMITS.jobs,
                                              show_progress_on=[self.models_md])]
        picked[0].then(*remember, api_visibility="private")
        # a reload: the models and Configure settings this browser last used, then the check
        picked.append(demo.load(self.restore_models, {page.kept}, [*lists, page.reloaded],
                                api_visibility="private", queue=False).then(
            self.pick_models, models, outputs, api_visibility="private",
            show_progress_on=[self.models_md]))
        picked[1].then(self.restore_config, {page.session, page.reloaded}, kept,
                       api_visibility="private")
        # "Download and use" (Hub models not here yet, their pre-flight passed)
        picked.append(emptied(self.download_btn).then(
            self.download_models, models, outputs, api_name="download_models",
            concurrency_limit=LIMITS.jobs, show_progress_on=[self.models_md]))
        picked[-1].then(*remember, api_visibility="private")
        for lang, btn in self.trio_btns.items():   # a demo trio: the dropdowns, then the check
            trio = btn.click(lambda lang=lang: self.demo_trio(lang), None,
                             [*lists, self.models_md],
                             api_visibility="private", queue=False).then(
                self.pick_models, models, outputs, api_visibility="private",
                concurrency_limit=LIMITS.jobs, show_progress_on=[self.models_md])
            trio.then(*remember, api_visibility="private")
            picked.append(trio)
        # what a reload keeps follows the Configure tab's controls too
        gr.on([c.change for c in configure.inputs - {page.session}], *remember,
              api_visibility="private", show_progress="hidden", trigger_mode="always_last",
              queue=False)
        # served: the visitor's own saves in the model lists; downloads' progress; cleanup
        if page.access.served:
            demo.load(self.own_saves, None, lists, api_visibility="private")
            self.hub_timer.tick(self.hub_status, None, [self.models_md], show_progress="hidden",
                                api_visibility="private", concurrency_limit=None)
            self.hub_cancel.click(self.cancel_download, None, [self.models_md],
                                  api_name="cancel_download")
        demo.unload(page.end_visit)
        return picked
