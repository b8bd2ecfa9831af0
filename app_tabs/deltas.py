"""The Deltas tab: where each expert changed (``/analyze``), its thresholds, and the suggested
configuration put on the Configure tab (``/apply_suggestion``)."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from layerswap_core.workbench import session as wb
from layerswap_core.workbench import configure as wb_configure
from layerswap_core.workbench.controls import outside_validated
from layerswap_core.workbench.deltas import delta_views, slider_taus, slider_value, suggest

from .common import Tab, gr_progress, guarded, heavy_slots, ok
from .configure import SLIDERS, ConfigureHandles


@dataclass(frozen=True)
class DeltasHandles:
    """What the Deltas tab gives the others: its plan over the language expert's changes,
    which the Configure tab's plan redraws."""
    plan_overlay: gr.Plot


class DeltasTab(Tab):
    VIEWS = {"deltas_md": "", "heatmaps": None, "overlap": None, "profile": None,
             "suggestion": "", "plan_overlay": None}
    OUTPUTS = {
        "analyze": ("deltas_md", "heatmaps", "overlap", "profile", "suggestion", "threshold",
                    "threshold_lang", "plan_overlay"),
        "rethreshold": ("deltas_md", "heatmaps", "overlap", "profile", "suggestion",
                        "plan_overlay"),
        "apply_suggestion": ("deltas_md", *SLIDERS, "partition"),
    }

    def delta_outputs(self, session, views, v, msg: str) -> dict:
        try:
            overlay = wb_configure.plan_cells_figure(session, self.configure.config(v, session),
                                                     over="lang")
        except ValueError:  # the configuration is invalid: the Configure tab says why
            overlay = None
        return {self.deltas_md: ok(msg), self.heatmaps: views.heatmaps,
                self.overlap: views.overlap, self.profile: views.profile,
                self.suggestion: views.suggestion_text, self.plan_overlay: overlay}

    @guarded("deltas_md")
    def analyze(self, v, progress=gr.Progress()):
        """Statistics (cached) and figures at the data-derived threshold, with the current plan
        drawn over the language expert's changes."""
        session = wb.require(v[self.page.session])
        views = delta_views(session, None, v[self.colour_by], v[self.log_scale],
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
        session = wb.require(v[self.page.session])
        if "task" not in session.stats:
            return gr.skip()
        taus = slider_taus(session, (v[self.threshold], v[self.threshold_lang]))
        views = delta_views(session, taus, v[self.colour_by], v[self.log_scale],
                            matrices_only=v[self.matrices_only])
        return self.delta_outputs(session, views, v,
                                  f"tau = {taus[0]:.2e} (task expert), {taus[1]:.2e} (language "
                                  "expert)")

    @guarded("deltas_md")
    def apply_suggestion(self, v):
        session = wb.require(v[self.page.session])
        s = suggest(session)
        counts = (s.bottom, s.top, s.transition_bottom, s.transition_top)
        outside = outside_validated(dict(zip(SLIDERS, counts)), session.num_layers)
        msg = ok("Suggestion applied on the Configure tab.") + (
            " ⚠ Outside the paper's validated ranges: " + "; ".join(outside) + "."
            if outside else "")
        return {self.deltas_md: msg,
                **{self.configure.sliders[n]: gr.update(value=c) for n, c in zip(SLIDERS, counts)},
                self.configure.partition: gr.update(
                    value=s.partition or wb_configure.PARTITION_CHOICES[0])}

    # ---- layout
    def layout(self) -> DeltasHandles:
        with gr.Tab("Deltas", id="deltas"):
            with gr.Row():
                self.threshold = gr.Slider(
                    -7, 0, value=-3, step=0.01, label="log10 tau, task expert",
                    elem_id="threshold", buttons=[],   # its ↺ went to -3: "Automatic taus"
                    info="rows with mean |delta| above tau count as changed; Analyze sets it "
                         "from this expert's own deltas")
                self.colour_by = gr.Radio(["fraction", "mav"], value="fraction", label="Colour by",
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
        return DeltasHandles(self.plan_overlay)

    # ---- wiring
    def wire(self, demo: gr.Blocks, configure: ConfigureHandles):
        """``configure``: the merge configured (the plan drawn over the deltas) and the
        controls a suggestion sets."""
        self.configure = configure
        self.given = (configure,)
        config = set(configure.inputs)
        views = {self.colour_by, self.log_scale, self.matrices_only}
        self.analyze_btn.click(self.analyze, config | views, self.outputs("analyze"),
                               api_name="analyze", **heavy_slots())
        self.auto_tau_btn.click(self.analyze, config | views, self.outputs("analyze"),
                                api_visibility="private", **heavy_slots())
        # release: the handle let go; input: a value typed into the box (Enter) or dragged
        gr.on([self.threshold.release, self.threshold_lang.release, self.threshold.input,
               self.threshold_lang.input, self.colour_by.change,
               self.log_scale.change, self.matrices_only.change],
              self.rethreshold, config | views | {self.threshold, self.threshold_lang},
              self.outputs("rethreshold"), api_visibility="private", trigger_mode="always_last")
        self.apply_btn.click(self.apply_suggestion, {self.page.session},
                             self.outputs("apply_suggestion"), api_name="apply_suggestion")
