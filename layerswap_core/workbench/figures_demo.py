"""The demo result's per-template picture (issue #62): a strip of template means.

The statistics are templates, not items (``demos.measure``: the template means, their mean
with a cluster-bootstrap interval, the sign test over them), so the page and the docs show the
units the pooled number averages: one dot per template, sorted, the pooled mean with its 95%
interval as a band, 0, and the counts below and above 0 with the sign test's p. The figure takes
the per-item values it plots, (template, value) or (template, value, fold) records
(``measure.template_records`` of one result, ``measure.pooled_records`` of the cross-fitting's
folds), and every number it draws comes from ``measure.template_groups`` and
``measure.template_stats``, never computed here. A plotly figure in ``figures``' style.
"""
from __future__ import annotations

import textwrap
from collections.abc import Sequence

import plotly.graph_objects as go

from ..demos.measure import template_groups, template_stats
from .figures import PALETTE, layout_figure

# Dots below 0 (the first model makes the gold solution more likely) and above, as the effects
# chart colours its primary statistic; one colour per fold when the records name folds.
BELOW, ABOVE = PALETTE[1], PALETTE[0]
FOLD_COLORS = ("#2E86AB", "#E4572E", "#3BB273", "#E1BC29")
TITLE_WIDTH = 95      # characters a title line holds in the page's and the docs' width
AXIS = "NLL difference per template (nats/token; negative: more likely)"


def _records(records: Sequence[Sequence]) -> list[tuple[int, float, int | None]]:
    out = []
    for r in records:
        if len(r) not in (2, 3):
            raise ValueError(f"a record is (template, value) or (template, value, fold): {r!r}")
        out.append((int(r[0]), float(r[1]), None if len(r) == 2 else r[2]))
    return out


def strip_stats(records: Sequence[Sequence], *, resamples: int = 10_000, seed: int = 0) -> dict:
    """What ``template_strip`` draws, as plain data: ``stats`` (``template_stats`` of the
    records' values by template), ``means`` (``template_groups``: template -> its mean),
    ``order`` (templates by their mean, lowest first) and ``fold_of`` (template -> fold, None
    without folds). A template measured in two folds is refused, as ``pooled_primary`` does."""
    recs = _records(records)
    values, templates = [v for _, v, _ in recs], [t for t, _, _ in recs]
    means = template_groups(values, templates)
    fold_of: dict[int, int | None] = {}
    for t, _, f in recs:
        if fold_of.setdefault(t, f) != f:
            raise ValueError(f"template {t} is measured in two folds")
    return {"stats": template_stats(values, templates, resamples=resamples, seed=seed),
            "means": means, "order": sorted(means, key=lambda t: (means[t], t)),
            "fold_of": fold_of}


def template_strip(records: Sequence[Sequence], *, title: str | None = None,
                   resamples: int = 10_000, seed: int = 0) -> go.Figure:
    """One statistic per template: a dot per template (the mean of its items' values), sorted,
    the pooled mean (the mean of the dots) with its 95% cluster-bootstrap interval as a band,
    0 dotted, and under the title the templates below / above 0 and the sign test's p. Coloured
    by fold when the records name folds (one legend entry per fold), else below / above 0.

    ``records``: per-item (template, value) or (template, value, fold); ``title``: the
    statistic's words (the counts follow on a line of their own); ``resamples``, ``seed``: the
    interval's, as the result that the values come from computed it (``template_stats``). The
    shapes are named "pooled interval", "pooled mean" and "zero"."""
    drawn = strip_stats(records, resamples=resamples, seed=seed)
    st, means, order, fold_of = drawn["stats"], drawn["means"], drawn["order"], drawn["fold_of"]
    labels = {t: f"{t:04d}" for t in order}
    folds = sorted({f for f in fold_of.values() if f is not None})
    fig = go.Figure()
    hover = "template %{y}: %{x:+.4f}<extra>%{fullData.name}</extra>"
    if folds:
        for i, f in enumerate(folds):
            ts = [t for t in order if fold_of[t] == f]
            fig.add_trace(go.Scatter(
                x=[means[t] for t in ts], y=[labels[t] for t in ts], mode="markers",
                name=f"fold {f} ({len(ts)} templates)", hovertemplate=hover,
                marker=dict(size=8, color=FOLD_COLORS[i % len(FOLD_COLORS)])))
    else:
        fig.add_trace(go.Scatter(
            x=[means[t] for t in order], y=[labels[t] for t in order], mode="markers",
            name="template mean", hovertemplate=hover, showlegend=False,
            marker=dict(size=8, color=[BELOW if means[t] < 0 else ABOVE for t in order])))
    fig.add_vrect(x0=st["ci_low"], x1=st["ci_high"], fillcolor="#888", opacity=0.15,
                  line_width=0, name="pooled interval")
    fig.add_vline(x=st["mean"], line_width=2, line_color="#333", name="pooled mean")
    fig.add_vline(x=0, line_width=1, line_color="#999", line_dash="dot", name="zero")
    fig.update_xaxes(title_text=AXIS)
    fig.update_yaxes(title_text="template (sorted by its mean)", type="category",
                     categoryorder="array", categoryarray=[labels[t] for t in order],
                     dtick=1, tickfont_size=10)       # every template named
    counts = (f"mean {st['mean']:+.3f} [95% CI {st['ci_low']:+.3f}, {st['ci_high']:+.3f}] "
              f"(the line and band); {st['lower']} of {st['n_templates']} templates below 0, "
              f"{st['higher']} above, sign test p = {st['sign_p']:.2g}; {st['n_items']} items")
    lines = (textwrap.wrap(title, TITLE_WIDTH) if title else []) + [counts]
    return layout_figure(fig, "<br>".join(lines),
                         max(340, 110 + 20 * len(lines) + 16 * len(order)),
                         margin=dict(t=36 + 22 * len(lines), b=90 if folds else 60),
                         showlegend=bool(folds), title_font_size=14,
                         legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"))
