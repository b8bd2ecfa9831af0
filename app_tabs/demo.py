"""The demo result, at the foot of the Evaluate tab: the shipped measurement, its story, and
the button that reruns it on a sample for the models picked (``/demo_result``)."""
from __future__ import annotations

import gradio as gr

from layerswap_core.workbench import session as wb
from layerswap_core.demos.reproduce import chosen_words, headline, sweep_markdown
from layerswap_core.workbench.demo import (demo_story, measured_chart, measured_markdown,
                                            measured_template_chart, rerun_template_chart,
                                            result_chart, trio_in_use)
from layerswap_core.workbench.served import limits_for, Cancelled

from .chat import ChatHandles
from .common import Tab, gr_progress, guarded, heavy_slots, ok
from .evaluate import EvaluateHandles
from .sweep import SweepHandles


def run_demo_result(session, n: int, progress) -> dict:
    """The demo result's measure on ``n`` held-out items and half as many validation items
    (2-11) for choosing the swap, in the question language of the trio in use: 4
    teacher-forced passes per item and model (math expert, the chosen swap, the default swap),
    2 per validation item and swap (7 choices), each counted as 8 generated tokens for the
    job's estimate. A plain-data job of the one dispatcher."""
    n_validation = max(2, min(n // 2, 11))
    job = session.job("demo_result", n=n, n_validation=n_validation, max_new_tokens=8,
                      work_items=12 * n + 14 * n_validation,
                      lang=trio_in_use(session_refs(session)).language)
    return wb.dispatcher().run(job, progress)


def session_refs(session) -> dict:
    """The models in use as the visitor named them (``embedded:...``), else as resolved."""
    return {**session.refs, **(session.names or {})}


def accordion_label(trio) -> str:
    return (f"The demo result: does a layer swap read the {trio.language_name} question "
            "better? (held-out GSM-Symbolic variants)")


def slider_label(trio) -> str:
    return ("Held-out variants to rerun (math expert and swaps, own and another item's "
            f"question, {trio.language_name} and English)")


class DemoSection(Tab):
    # another trio (or other models) picked: the last rerun's result and its line go
    VIEWS = {"demo_md": "", "demo_plot": None}
    OUTPUTS = {"demo_result": ("demo_md", "demo_plot", "demo_templates")}

    @guarded("demo_md")
    def demo_result(self, v, progress=gr.Progress()):
        """The demo's measure on a sample of the held-out variants, for the models picked (the
        embedded demo by default), labelled with its item counts."""
        n = int(v[self.demo_n])
        session = wb.require(v[self.page.session])
        try:
            res = run_demo_result(session, n, gr_progress(progress))
        except Cancelled:
            if getattr(session, "closed", False):   # other models were picked: their page shows no line of this run
                return {self.demo_md: "", self.demo_plot: None}
            raise
        return {self.demo_md: (f"{ok('Done')} in {res['seconds']:.0f} s: {res['n']} held-out "
                               f"variants of {res['n_templates']} templates (a sample, spread "
                               f"over the templates); {chosen_words(res)}. {headline(res)}"
                               f"\n\n" + res["markdown"] + "\n\n" + sweep_markdown(res)),
                self.demo_plot: result_chart(res), self.demo_templates: rerun_template_chart(
                    res, trio_in_use(session_refs(session)))}

    # ---- the trio in use: its words and defaults on every tab
    def trio_views(self) -> list:
        return [self.demo_accordion, self.demo_story, self.demo_chart, self.demo_templates,
                self.demo_measured, self.demo_n, self.chat.chat_expectations,
                self.evaluate.eval_expectations, self.evaluate.eval_lang, self.sweep.sweep_lang]

    def show_trio(self, v) -> dict:
        """What the page says and defaults to for the demo trio in use (``demos.trios``): the
        Reproduce story, chart and tables, Chat's and Evaluate's notes, and the Evaluate and
        Sweep languages (nothing changes without a session)."""
        session = v[self.page.session]
        if session is None:
            return gr.skip()
        trio = trio_in_use(session_refs(session))
        return {self.demo_accordion: gr.update(label=accordion_label(trio)),
                self.demo_story: demo_story(trio), self.demo_chart: measured_chart(trio),
                self.demo_templates: measured_template_chart(trio),
                self.demo_measured: measured_markdown(trio),
                self.demo_n: gr.update(label=slider_label(trio)),
                self.chat.chat_expectations: trio.chat_expectations,
                self.evaluate.eval_expectations: trio.eval_note,
                self.evaluate.eval_lang: trio.defaults["eval_lang"],
                self.sweep.sweep_lang: trio.defaults["sweep_lang"]}

    # ---- layout (inside the Evaluate tab)
    def layout(self) -> None:
        trio = trio_in_use(self.page.refs)
        with gr.Accordion(accordion_label(trio), open=True) as self.demo_accordion:
            self.demo_story = gr.Markdown(demo_story(trio), elem_id="demo-story")
            self.demo_chart = gr.Plot(measured_chart(trio), elem_id="demo-chart",
                                      show_label=False)
            # the primary statistic per template: the units it averages, not only the mean
            self.demo_templates = gr.Plot(measured_template_chart(trio), elem_id="demo-templates",
                                          show_label=False)
            with gr.Accordion("The measured tables", open=False):
                self.demo_measured = gr.Markdown(measured_markdown(trio), elem_id="demo-measured")
            with gr.Row():
                self.demo_n = gr.Slider(2, limits_for(self.page.access).eval_questions,
                                        value=8, step=1,
                                        label=slider_label(trio), elem_id="demo-n")
                self.demo_btn = gr.Button("Reproduce the demo result", elem_id="demo-btn")
                self.demo_cancel = gr.Button("Cancel", variant="stop", elem_id="demo-cancel")
            self.demo_plot = gr.Plot(show_label=False, elem_id="demo-plot")
            self.demo_md = gr.Markdown(elem_id="demo-result")

    # ---- wiring
    def wire(self, demo: gr.Blocks, picked: list, evaluate: EvaluateHandles, chat: ChatHandles,
             sweep: SweepHandles):
        """Returns the rerun's event (the maxima follow it: ``Budget.wire``). After each event
        in ``picked`` (new models), the words and defaults of the demo trio in use on the
        Evaluate, Chat and Sweep tabs (``show_trio``)."""
        self.evaluate, self.chat, self.sweep = evaluate, chat, sweep
        self.page.wire_run(self.demo_btn, self.demo_md, self.demo_cancel)
        self.demo_btn.click(lambda: None, None, [self.demo_plot], queue=False,
                            show_progress="hidden", api_visibility="private")
        for event in picked:
            event.then(self.show_trio, {self.page.session}, self.trio_views(),
                       api_visibility="private", queue=False, show_progress="hidden")
        return self.demo_btn.click(self.demo_result, {self.page.session, self.demo_n},
                                   self.outputs("demo_result"), api_name="demo_result",
                                   # one bar, on the result's line (not also over the plots)
                                   show_progress_on=[self.demo_md], **heavy_slots())
