"""The Configure tab: the merge method and its controls, the plan they make (``/plan``)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr

from layerswap_core.merge import registry
from layerswap_core.merge.config import validated_ranges
from layerswap_core.workbench import session as wb
from layerswap_core.workbench import configure as wb_configure
from layerswap_core.workbench import controls
from layerswap_core.workbench.controls import CONTROLS, control_states, ignored_text, since_build
from layerswap_core.workbench.served import LIMITS, as_text

from .common import LABELS, Tab, guarded, ok, warn

WIDGETS = {"number": gr.Number, "slider": gr.Slider, "checkbox": gr.Checkbox, "choice": gr.Radio,
           "text": gr.Textbox}
SLIDERS = ("bottom", "top", "transition_bottom", "transition_top")
# The registered methods' knobs the tab does not lay out itself (a row of controls per method,
# each the widget its declaration asks for: ``controls.control_spec``)
METHOD_KNOBS = controls.method_controls()
NUMBER_KNOBS = tuple(k for knobs in METHOD_KNOBS.values() for k in knobs)
# Configure-tab controls beyond the sliders, as MergeConfig fields (make_config's keywords)
MORE_CONFIG = ("non_layer", "scale_partition", *NUMBER_KNOBS)
SWAP_LABEL = registry.MERGE_METHODS["layer_swap"].label
KNOB = registry.KNOBS  # the knobs' labels, defaults and bounds
# the Configure tab's controls (its attributes) a page reload restores (``ModelsTab.remember``)
KEPT_CONTROLS = ("method", *SLIDERS, "w_task", "w_lang", "magnitude", "partition", "rules",
                 *MORE_CONFIG)


@dataclass(frozen=True)
class ConfigureHandles:
    """What the Configure tab gives the other tabs: the controls a sweep row or a suggestion
    sets, the views a new pick draws, every control by name (what a reload keeps), the inputs
    and the reader of the merge configured here, and the updates for newly picked models."""
    method: gr.Radio
    bottom: gr.Slider
    top: gr.Slider
    transition_bottom: gr.Slider
    transition_top: gr.Slider
    partition: gr.Radio
    config_md: gr.Markdown
    diagram: gr.Plot
    plan_text: gr.Code
    plan_cells: gr.Plot
    sliders: dict            # SLIDERS' name -> slider
    controls: dict           # KEPT_CONTROLS' name -> control
    inputs: frozenset        # the session and every control (``ConfigureTab.config_inputs``)
    config: Callable         # (v, session) -> the MergeConfig configured (``ConfigureTab.config``)
    show_models: Callable    # session -> updates for models just picked


class ConfigureTab(Tab):
    VIEWS = {"config_md": "", "diagram": None, "plan_text": "", "plan_cells": None}
    OUTPUTS = {"plan": ("config_md", "diagram", "plan_text", "plan_cells", "plan_overlay",
                        *LABELS)}

    def config_inputs(self) -> set:
        """The session and every control of the tab: the inputs of whatever reads the merge
        configured here (the plan, Analyze, Build, Sweep, what a reload keeps)."""
        return {self.page.session, *self.controls.values()}

    def config(self, v: dict, session):
        """The MergeConfig on the Configure tab (validated)."""
        c = self.controls
        return wb_configure.make_config(session, v[self.method], *(v[c[s]] for s in SLIDERS),
                                        v[self.w_task], v[self.w_lang], v[self.magnitude], v[self.partition],
                                        v[self.rules], **{f: v[c[f]] for f in MORE_CONFIG})

    def slider_updates(self, session) -> dict:
        """Every layer slider bounded by the model's depth, at the scaled defaults, with the
        paper's validated range beside it."""
        counts = wb_configure.default_config(session).layer_counts(session.num_layers)
        r = validated_ranges(session.num_layers)
        ranges = (r.bottom, r.top, r.transition, r.transition)
        note = "" if r.published else " (scaled by layerswap's own rule)"
        return {self.controls[s]: gr.update(maximum=session.num_layers, value=c,
                                            info=f"validated in the paper: {set(v)}{note}")
                for s, c, v in zip(SLIDERS, counts, ranges)}

    def show_models(self, session) -> dict:
        """Models just picked: the sliders bounded by their depth, the default merge's plan
        drawn, and the lines naming it."""
        config = wb_configure.default_config(session)
        fig, text = wb_configure.plan_view(session, config)
        return {**self.slider_updates(session),
                self.config_md: ok(config.describe(session.num_layers)), self.diagram: fig,
                self.plan_text: text,
                self.plan_cells: wb_configure.plan_cells_figure(session, config),
                **self.page.labels(session, config)}

    @guarded("config_md")
    def update_plan(self, v):
        session = wb.require(v[self.page.session])
        try:
            config = self.config(v, session)
        except Exception as e:  # noqa: BLE001 - not valid: said here, and on the tabs it feeds
            shown = session.planned   # the diagram keeps the last valid plan: say which
            still = (f" The diagram and plan still show {shown.describe(session.num_layers)}."
                     if shown is not None else "")
            return {self.config_md: warn(e) + still, **self.page.labels(session, None)}
        fig, text = wb_configure.plan_view(session, config)
        changed = since_build(session.built_config, config, session.num_layers)
        out = {self.config_md: ok(config.describe(session.num_layers))
               + (f"\n\n⚠ {changed}" if changed else ""), self.diagram: fig,
               self.plan_text: text,
               self.plan_cells: wb_configure.plan_cells_figure(session, config),
               **self.page.labels(session, config)}
        if "lang" in session.stats:  # analyzed: the plan over the deltas follows the sliders too
            out[self.plan_overlay] = wb_configure.plan_cells_figure(session, config, over="lang")
        return out

    def control_components(self) -> dict:
        names = {"magnitude_weights": "magnitude", "rules": "rules"}
        return {name: self.controls[names.get(name, name)]
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

    # ---- layout
    def knob_controls(self):
        """One control per knob of the registered methods, a row per method, as the knob's
        declaration asks (``controls.control_spec``: widget, default, bounds, label)."""
        self.knob_rows, knob_controls = {}, {}
        for method_id, knobs in METHOD_KNOBS.items():
            if not knobs:
                continue
            # shown when their method is chosen (control_updates)
            with gr.Row(visible=False) as self.knob_rows[method_id]:
                for name in knobs:
                    spec = controls.control_spec(name)
                    knob_controls[name] = WIDGETS[spec.widget](**spec.kwargs())
        return knob_controls

    def layout(self) -> ConfigureHandles:
        L0 = 30  # the embedded default's depth; pick_models re-bounds the sliders
        with gr.Tab("Configure", id="configure"):
            with gr.Row():
                with gr.Column(scale=2):
                    self.method = gr.Radio(list(wb_configure.METHOD_LABELS), value=SWAP_LABEL,
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
                    self.partition = gr.Radio(list(wb_configure.PARTITION_CHOICES),
                                              value=wb_configure.PARTITION_CHOICES[0],
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
                            list(wb_configure.NON_LAYER_CHOICES),
                            value=next(iter(wb_configure.NON_LAYER_CHOICES)),
                            label=KNOB["non_layer"].label,
                            info="Algorithm 1 averages them (weights above); or take them from "
                                 "one expert", elem_id="non-layer")
                        self.scale_partition = gr.Checkbox(False,
                                                           label=KNOB["scale_partition"].label)
                    # made in the same order; visible with their method
                    knobs = self.knob_controls()
                    self.ignored_md = gr.Markdown(elem_id="ignored-controls")
                with gr.Column(scale=3):
                    self.config_md = gr.Markdown(elem_id="config-status")
                    self.diagram = gr.Plot(label="Layer stack", elem_id="diagram")
                    self.plan_text = gr.Code(label="Plan", language=None, elem_id="plan-text")
                    with gr.Accordion("Source of every module", open=False):
                        self.plan_cells = gr.Plot(show_label=False)
        self.sliders = {"bottom": self.bottom, "top": self.top,
                        "transition_bottom": self.transition_bottom,
                        "transition_top": self.transition_top}
        self.controls = {"method": self.method, **self.sliders, "w_task": self.w_task,
                         "w_lang": self.w_lang, "magnitude": self.magnitude,
                         "partition": self.partition, "rules": self.rules,
                         "non_layer": self.non_layer, "scale_partition": self.scale_partition,
                         **knobs}
        assert set(self.controls) == set(KEPT_CONTROLS)
        return ConfigureHandles(
            self.method, self.bottom, self.top, self.transition_bottom, self.transition_top,
            self.partition, self.config_md, self.diagram, self.plan_text, self.plan_cells,
            dict(self.sliders), dict(self.controls), frozenset(self.config_inputs()),
            self.config, self.show_models)

    # ---- wiring
    def wire(self, demo: gr.Blocks, plan_overlay: gr.Plot):
        """``plan_overlay``: the Deltas tab's plan over the language expert's changes (the
        plan redraws it once the deltas are analyzed)."""
        self.plan_overlay = plan_overlay
        config = self.config_inputs()
        gr.on([c.change for c in config - {self.page.session}], self.update_plan, config,
              self.outputs("plan"), api_name="plan", show_progress="hidden",
              trigger_mode="always_last", concurrency_limit=LIMITS.plan_jobs)
        controls = [*self.control_components().values(), *self.knob_rows.values(), self.ignored_md]
        for trigger in (self.method.change, self.partition.change, demo.load):
            trigger(self.control_updates, {self.method, self.partition}, controls,
                    api_visibility="private", show_progress="hidden")
