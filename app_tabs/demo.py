"""The demo result, at the foot of the Evaluate tab: the shipped measurement, its story, and
the button that reruns it on a sample for the models picked (``/demo_result``)."""
from __future__ import annotations

import gradio as gr

from layerswap_core.workbench import session as wb
from layerswap_core.workbench.demo import (chosen_words, headline, measured_chart,
                                            measured_demo_result, measured_markdown, result_chart,
                                            sweep_markdown)
from layerswap_core.workbench.served import LIMITS

from .common import PageBase, gr_progress, guarded, heavy_slots, ok


def run_demo_result(session, n: int, progress) -> dict:
    """The demo result's measure on ``n`` held-out items and half as many validation items
    (2-11) for choosing the swap: 4 teacher-forced passes per item and model (math expert, the
    chosen swap, the default swap), 2 per validation item and swap (7 choices), each counted as
    8 generated tokens for the job's estimate. A plain-data job of the one dispatcher."""
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


class DemoSection(PageBase):
    VIEWS: dict = {}   # a rerun's result stays: it names the models it measured
    OUTPUTS = {"demo_result": ("demo_md", "demo_plot")}

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

    # ---- layout (inside the Evaluate tab)
    def layout_demo(self):
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

    # ---- wiring
    def wire_demo(self, demo: gr.Blocks):
        """Returns the rerun's event (the maxima follow it: ``wire_budget``)."""
        self.wire_run(self.demo_btn, self.demo_md, self.demo_cancel)
        self.demo_btn.click(lambda: None, None, [self.demo_plot], queue=False,
                            api_visibility="private")
        return self.demo_btn.click(self.demo_result, {self.session, self.demo_n},
                                   self.outputs("demo_result"), api_name="demo_result",
                                   **heavy_slots())
