"""What fits the job budget, on the Evaluate and Sweep tabs: their sliders' maxima at the speed
measured on the visitor's models, and the estimate of each run as its controls stand."""
from __future__ import annotations

import gradio as gr

from layerswap_core.workbench import session as wb
from layerswap_core.workbench.evaluate import evaluation_caps, evaluation_line
from layerswap_core.workbench.served import as_text, readable_error
from layerswap_core.workbench.sweep import sweep_caps, sweep_line

from .common import PageBase


class BudgetMixin(PageBase):
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

    def wire_budget(self, jobs) -> None:
        """The maxima follow the speed measured on the models picked, and every job in ``jobs``
        (each measures it again); the estimates follow every control."""
        budget = {self.session, self.n_items, self.eval_tokens, self.roles, self.axes, self.xs,
                  self.ys, self.sweep_n, self.sweep_metric}
        lines = [self.eval_estimate, self.sweep_estimate]
        quiet = dict(api_visibility="private", show_progress="hidden", concurrency_limit=None)
        maxima = [self.n_items, self.eval_tokens, self.sweep_n, *lines]
        # (never two at once for a page: an event that read a slider before its maximum was
        # lowered would be refused by Gradio)
        for event in jobs:
            event.then(self.limits, budget, maxima, **quiet)
        # the visitor's own moves only (input: a drag, a typed value): a change made by
        # ``limits`` itself could be read half-applied, with a value over its new maximum
        gr.on([c.input for c in (self.n_items, self.eval_tokens, self.roles, self.sweep_n,
                                 self.sweep_metric, self.axes, self.xs, self.ys)],
              self.estimates, budget, lines, trigger_mode="always_last", **quiet)
