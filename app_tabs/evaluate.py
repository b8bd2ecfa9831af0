"""The Evaluate tab: the merged model and its sources scored side by side (``/evaluate``), every
question readable in full; the demo result below it (``demo``)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradio as gr
import pandas as pd

from layerswap_core.evaluation import registry
from layerswap_core.workbench import session as wb
from layerswap_core.workbench.demo import trio_in_use
from layerswap_core.workbench.evaluate import (SUMMARY_HEADERS, EvalResult, data_default,
                                               evaluate_roles, evaluation_note)
from layerswap_core.workbench.served import limits_for, as_text

from .common import LANGS, Tab, gr_progress, guarded, heavy_slots, ok
from .models import ModelsHandles


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


# Model work is a plain-data job of the one dispatcher (layerswap_core.engines): in this
# process on a CPU or a dedicated GPU, in a spaces.GPU worker on ZeroGPU.
def run_evaluate(session, args: tuple, progress) -> EvalResult:
    return evaluate_roles(session, *args, progress=progress)


@dataclass(frozen=True)
class EvaluateHandles:
    """What the Evaluate tab gives the others: its status line (a build empties it), the
    words and language the demo trio in use sets, and the controls and estimate line of the
    job budget (``budget``)."""
    eval_md: gr.Markdown
    eval_expectations: gr.Markdown
    eval_lang: gr.Dropdown
    n_items: gr.Slider
    eval_tokens: gr.Slider
    roles: gr.CheckboxGroup
    eval_estimate: gr.Markdown


class EvaluateTab(Tab):
    VIEWS = {"eval_md": "", "summary": lambda: pd.DataFrame(columns=SUMMARY_HEADERS),
             "bars": None, "items_table": lambda: pd.DataFrame()}
    OUTPUTS = {"evaluate": ("eval_md", "summary", "bars", "items_table")}

    @guarded("eval_md")
    def evaluate(self, v, progress=gr.Progress()):
        session = wb.require(v[self.page.session])
        roles = tuple(r for r, label in wb.ROLE_LABELS.items() if label in v[self.roles])
        args = (v[self.source], v[self.eval_lang], v[self.n_items], v[self.shots], v[self.cot],
                roles, v[self.eval_tokens], v[self.chat_template])
        res = run_evaluate(session, args, gr_progress(progress))
        return {self.eval_md: ok(evaluation_note(res)),
                self.summary: res.summary_rows, self.bars: res.figure,
                self.items_table: pd.DataFrame(res.rows, columns=res.headers)}

    def show_item(self, v, evt: gr.SelectData):
        """Clicking a row of the per-question table shows that question and every model's raw
        output in full."""
        table = v[self.items_table]
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if table is None or not hasattr(table, "iloc") or not 0 <= row < len(table):
            return {self.item_details: ""}
        return {self.item_details: item_markdown(table.columns, table.iloc[row].tolist())}

    # ---- layout
    def layout(self, foot: Callable[[], None]) -> EvaluateHandles:
        """``foot``: what the tab shows at its foot (the demo result: ``DemoSection.layout``)."""
        limits = limits_for(self.page.access)
        with gr.Tab("Evaluate", id="evaluate"):
            trio = trio_in_use(self.page.refs)   # the demo trio in use: its words, its language
            # what a demo-sized model can and cannot do, and which number to watch
            self.eval_expectations = gr.Markdown(trio.eval_note, elem_id="eval-expectations")
            self.eval_label = gr.Markdown(elem_id="eval-acts-on")
            source, note = data_default()   # offline without MGSM: GSM-Symbolic, and how to get MGSM
            gr.Markdown(as_text(note), visible=bool(note), elem_id="mgsm-note")
            with gr.Row():
                self.source = gr.Radio(registry.source_choices("eval"),
                                       value=source, label="Data")
                self.eval_lang = gr.Dropdown(LANGS, value=trio.defaults["eval_lang"],
                                             label="Language", elem_id="eval-lang")
                self.n_items = gr.Slider(1, limits.eval_questions, value=2, step=1,
                                         label="Questions", elem_id="n-items")
                self.shots = gr.Slider(0, limits.shots, value=2, step=1, label="Shots",
                                       elem_id="shots")
            with gr.Row():  # made in the API's parameter order
                self.cot = gr.Checkbox(False, label="Chain of thought", min_width=160)
                self.roles = gr.CheckboxGroup(list(wb.ROLE_LABELS.values()),
                                              value=list(wb.ROLE_LABELS.values()), label="Models",
                                              elem_id="eval-roles")
                with gr.Column(min_width=160):
                    self.eval_tokens = gr.Slider(8, limits.new_tokens, value=64, step=8,
                                                 label="Max new tokens", elem_id="eval-tokens")
                    self.chat_template = gr.Checkbox(False, label="Chat template")
            # the estimate as the sliders stand; their maxima fit this server's job budget
            self.eval_estimate = gr.Markdown(elem_id="eval-estimate")
            with gr.Row():
                self.eval_btn = gr.Button("Evaluate", variant="primary", elem_id="eval-btn")
                self.eval_cancel = gr.Button("Cancel", variant="stop", elem_id="eval-cancel")
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
            foot()   # the demo result, in its accordion at the foot of the tab
        self.page.label_lines["eval_label"] = self.eval_label
        return EvaluateHandles(self.eval_md, self.eval_expectations, self.eval_lang,
                               self.n_items, self.eval_tokens, self.roles, self.eval_estimate)

    # ---- wiring
    def wire(self, demo: gr.Blocks, models: ModelsHandles):
        """Returns the evaluation's event (the maxima follow it: ``Budget.wire``). ``models``:
        its button (new models: no details of an old question)."""
        self.page.wire_run(self.eval_btn, self.eval_md, self.eval_cancel)
        # a run cancelled or failed leaves no table of an earlier one
        self.eval_btn.click(lambda: (pd.DataFrame(columns=SUMMARY_HEADERS), None, pd.DataFrame()),
                            None, [self.summary, self.bars, self.items_table], queue=False,
                            api_visibility="private")
        evaluated = self.eval_btn.click(self.evaluate, {self.page.session, self.source,
                                                        self.eval_lang, self.n_items, self.shots,
                                                        self.cot, self.roles, self.eval_tokens,
                                                        self.chat_template},
                                        self.outputs("evaluate"), api_name="evaluate",
                                        **heavy_slots())
        self.items_table.select(self.show_item, {self.items_table}, [self.item_details],
                                api_visibility="private")
        for button in (self.eval_btn, models.pick_btn):  # a new table or new models: no details
            button.click(lambda: "", None, [self.item_details], api_visibility="private")
        return evaluated
