"""The Sweep tab: a grid of configurations scored on a few fixed items (``/sweep``); a row of
its table loads that configuration on the Configure tab."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr
import pandas as pd

from layerswap_core.evaluation import registry
from layerswap_core.merge.config import validated_ranges
from layerswap_core.workbench import session as wb
from layerswap_core.workbench import configure as wb_configure
from layerswap_core.workbench.evaluate import data_default
from layerswap_core.workbench.served import LIMITS, limits_for, as_text
from layerswap_core.workbench.sweep import SWEEP_AXES, sweep_grid

from .common import LANGS, Tab, gr_progress, guarded, heavy_slots, ok
from .configure import SLIDERS, SWAP_LABEL, ConfigureHandles

TABLE_HEADERS = ["bottom", "top", "score"]


@dataclass(frozen=True)
class SweepHandles:
    """What the Sweep tab gives the others: the grid's value boxes (a pick sets them), the
    controls its estimate and maxima read, its language (the demo trio's default), its
    estimate line, and the default grid for models just picked."""
    axes: gr.Radio
    xs: gr.Textbox
    ys: gr.Textbox
    sweep_lang: gr.Dropdown
    sweep_n: gr.Slider
    sweep_metric: gr.Radio
    sweep_estimate: gr.Markdown
    show_models: Callable    # session -> the default grid's updates


class SweepTab(Tab):
    VIEWS = {"sweep_md": "", "sweep_plot": None,
             "sweep_table": lambda: pd.DataFrame(columns=TABLE_HEADERS)}
    OUTPUTS = {"sweep": ("sweep_md", "sweep_plot", "sweep_table", "status"),
               "load_sweep_row": ("sweep_md", *SLIDERS, "method", "partition")}

    @guarded("sweep_md")
    def sweep(self, v, progress=gr.Progress()):
        session = wb.require(v[self.page.session])
        config = self.configure.config(v, session)
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
                **self.page.banner(session)}

    def load_sweep_row(self, v, evt: gr.SelectData):
        """Clicking a sweep table row puts that configuration on the sliders (a plain layer swap)."""
        fx, fy = SWEEP_AXES[v[self.axes]]
        rows = v[self.sweep_table]
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        values = rows.values.tolist()[row] if hasattr(rows, "values") else rows[row]
        x, y = int(values[0]), int(values[1])
        return {self.sweep_md: ok(f"Loaded {fx} = {x}, {fy} = {y} on the Configure tab; build it "
                                  "on the Build tab."),
                self.configure.sliders[fx]: gr.update(value=x),
                self.configure.sliders[fy]: gr.update(value=y),
                self.configure.method: gr.update(value=SWAP_LABEL),
                self.configure.partition: gr.update(value=wb_configure.PARTITION_CHOICES[0])}

    def show_models(self, session) -> dict:
        """Models just picked: the default grid is the paper's validated range at their
        depth."""
        r = validated_ranges(session.num_layers)
        return {self.xs: ",".join(map(str, r.bottom)), self.ys: ",".join(map(str, r.top))}

    # ---- layout
    def layout(self) -> SweepHandles:
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
                self.sweep_source = gr.Radio(registry.source_choices("sweep", first="gsm-symbolic"),
                                             value="gsm-symbolic", label="Data")
                self.sweep_lang = gr.Dropdown(LANGS, value="sw", label="Language")
                self.sweep_n = gr.Slider(1, limits_for(self.page.access).sweep_items, value=4,
                                         step=1, label="Items", elem_id="sweep-n")
                self.sweep_metric = gr.Radio([("gold NLL", "nll"), ("accuracy", "accuracy")],
                                             value="nll", label="Score")
                self.sweep_shots = gr.Slider(0, LIMITS.shots, value=0, step=1, label="Shots",
                                             info="MGSM: its 8 standard exemplars, in order; GSM-Symbolic: "
                                                  "training templates, never the scored ones",
                                             elem_id="sweep-shots")
            self.sweep_estimate = gr.Markdown(elem_id="sweep-estimate")
            with gr.Row():
                self.sweep_btn = gr.Button("Run sweep", variant="primary", elem_id="sweep-btn")
                self.sweep_cancel = gr.Button("Cancel", variant="stop", elem_id="sweep-cancel")
            self.sweep_md = gr.Markdown(elem_id="sweep-status")
            self.sweep_plot = gr.Plot(label="Score per configuration")
            self.sweep_table = gr.Dataframe(headers=TABLE_HEADERS, interactive=False,
                                            label="Configurations, best first (click to load)")
        return SweepHandles(self.axes, self.xs, self.ys, self.sweep_lang, self.sweep_n,
                            self.sweep_metric, self.sweep_estimate, self.show_models)

    # ---- wiring
    def wire(self, demo: gr.Blocks, configure: ConfigureHandles):
        """Returns the sweep's event (the maxima follow it: ``Budget.wire``). ``configure``:
        the merge configured (the sweep's other settings) and the controls a row sets."""
        self.configure = configure
        self.given = (configure,)
        self.page.wire_run(self.sweep_btn, self.sweep_md, self.sweep_cancel)
        # a run cancelled or failed leaves no table of an earlier one
        self.sweep_btn.click(lambda: (None, pd.DataFrame(columns=TABLE_HEADERS)),
                             None, [self.sweep_plot, self.sweep_table], queue=False,
                             api_visibility="private")
        swept = self.sweep_btn.click(self.sweep, set(configure.inputs) | {
            self.axes, self.xs, self.ys, self.sweep_source, self.sweep_lang, self.sweep_n,
            self.sweep_metric, self.sweep_shots}, self.outputs("sweep"), api_name="sweep",
            **heavy_slots())
        # the value boxes are named by the fields they sweep
        self.axes.change(lambda a: [gr.update(label=f"{f.replace('_', ' ')} values ({hint})")
                                    for f, hint in zip(SWEEP_AXES[a], ("e.g. 0,2,4 or 0-6:2",
                                                                       "e.g. 0,1,2"))],
                         self.axes, [self.xs, self.ys], api_visibility="private")
        self.sweep_table.select(self.load_sweep_row, {self.axes, self.sweep_table},
                                self.outputs("load_sweep_row"), api_visibility="private")
        return swept
