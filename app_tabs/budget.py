"""What fits the job budget, on the Evaluate and Sweep tabs: their sliders' maxima at the speed
measured on the visitor's models, and the estimate of each run as its controls stand."""
from __future__ import annotations

import gradio as gr

from layerswap_core.workbench import session as wb
from layerswap_core.workbench.evaluate import evaluation_caps, evaluation_line
from layerswap_core.workbench.served import as_text, readable_error
from layerswap_core.workbench.sweep import sweep_caps, sweep_line

from .evaluate import EvaluateHandles
from .sweep import SweepHandles


class Budget:
    """The Evaluate and Sweep tabs' maxima and estimates, over their handles."""

    def __init__(self, session: gr.State, evaluate: EvaluateHandles, sweep: SweepHandles):
        self.session, self.evaluate, self.sweep = session, evaluate, sweep

    def estimates(self, v) -> dict:
        """The Evaluate and Sweep tabs' estimates, as their controls stand now."""
        e, s = self.evaluate, self.sweep
        session = v[self.session]
        try:
            return {e.eval_estimate: as_text(evaluation_line(
                        session, v[e.n_items], v[e.eval_tokens], v[e.roles])),
                    s.sweep_estimate: as_text(sweep_line(
                        session, v[s.axes], v[s.xs], v[s.ys], v[s.sweep_n],
                        v[s.sweep_metric]))}
        except Exception as ex:  # noqa: BLE001 - a line, no toast: it follows the sliders
            return {e.eval_estimate: "⚠ " + as_text(readable_error(ex)),
                    s.sweep_estimate: ""}

    def limits(self, v) -> dict:
        """The sliders' maxima at the speed measured on the visitor's models (once their
        warm-up has measured it): what the page offers, the server runs; and the estimates."""
        e, s = self.evaluate, self.sweep
        session = v[self.session]
        if session is None:
            return self.estimates(v)
        wb.measured_speed(session, wait=60)
        (n, t), items = evaluation_caps(session), sweep_caps(session)
        values = {e.n_items: min(int(v[e.n_items]), n),
                  e.eval_tokens: min(int(v[e.eval_tokens]), t),
                  s.sweep_n: min(int(v[s.sweep_n]), items)}
        # a slider needs its maximum above its minimum: one at its minimum is held there
        out = {c: gr.update(maximum=max(hi, lo + step), value=values[c], interactive=hi > lo)
               for c, lo, step, hi in ((e.n_items, 1, 1, n), (e.eval_tokens, 8, 8, t),
                                       (s.sweep_n, 1, 1, items))}
        return {**out, **self.estimates({**v, **values})}

    def wire(self, jobs) -> None:
        """The maxima follow the speed measured on the models picked, and every job in ``jobs``
        (each measures it again); the estimates follow every control."""
        e, s = self.evaluate, self.sweep
        budget = {self.session, e.n_items, e.eval_tokens, e.roles, s.axes, s.xs, s.ys,
                  s.sweep_n, s.sweep_metric}
        lines = [e.eval_estimate, s.sweep_estimate]
        quiet = dict(api_visibility="private", show_progress="hidden", concurrency_limit=None)
        maxima = [e.n_items, e.eval_tokens, s.sweep_n, *lines]
        # (never two at once for a page: an event that read a slider before its maximum was
        # lowered would be refused by Gradio)
        for event in jobs:
            event.then(self.limits, budget, maxima, **quiet)
        # the visitor's own moves only (input: a drag, a typed value): a change made by
        # ``limits`` itself could be read half-applied, with a value over its new maximum
        gr.on([c.input for c in (e.n_items, e.eval_tokens, e.roles, s.sweep_n,
                                 s.sweep_metric, s.axes, s.xs, s.ys)],
              self.estimates, budget, lines, trigger_mode="always_last", **quiet)
