"""Every plotly figure of the project: delta heatmaps, merge plan views, profiles, results.

Functions take plain data (``analysis.DeltaStats``, plan cells/rows, lists of dicts) and return a
``plotly.graph_objects.Figure``; nothing here reads tensors or files. Heatmaps put layer 0 at the
bottom (as in the layer-swapping paper) and module kinds on the x axis in
``architectures.LAYER_KIND_ORDER``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..checkpoints.architectures import ATTENTION_KINDS, LAYER_KIND_ORDER, MLP_KINDS, NORM_KINDS
from ..merge.registry import Source
from ..sweeps.report import heatmap_trace, outline_best

# One colour per source, used by every figure (language expert warm, task expert cool).
COLORS = {"lang": "#E4572E", "task": "#2E86AB", "base": "#A0A0A0", "blend": "#9B5DE5",
          "other": "#F2C14E", "mixed": "#6C757D"}
SOURCE_NAMES = {"lang": "language expert", "task": "task expert", "base": "base model",
                "blend": "blend", "mixed": "mixed"}
METRIC_TITLES = {"frac_rows_above": "fraction of rows with MAV > τ",
                 "mean_row_mav": "mean row MAV of Δ", "max_row_mav": "max row MAV of Δ",
                 "mass": "Σ|Δ| (delta mass)"}
KIND_LABELS = {"attn_q": "attn q", "attn_k": "attn k", "attn_v": "attn v", "attn_o": "attn o",
               "attn_qkv": "attn qkv", "norm_qk": "q/k norm", "mlp_gate": "mlp gate",
               "mlp_up": "mlp up", "mlp_gate_up": "mlp gate+up", "mlp_down": "mlp down",
               "norm_attn": "attn norm", "norm_attn_post": "attn post-norm",
               "norm_mlp": "mlp norm", "norm_mlp_post": "mlp post-norm", "other": "other",
               "attn_kv": "attn kv", "attn_sinks": "attn sinks", "moe_router": "moe router",
               "moe_experts": "moe experts", "moe_shared": "moe shared"}


# The 2-D projection matrices of a decoder layer, the seven the layer-swapping paper plots
# (q, k, v, o, gate, up, down), plus the fused forms some families have instead (qkv, gate+up),
# latent attention's kv and a MoE block's router, experts and shared experts.
MATRIX_KINDS = tuple(k for k in LAYER_KIND_ORDER
                     if k in ATTENTION_KINDS + MLP_KINDS and k not in NORM_KINDS + ("attn_sinks",))


def heatmap_height(num_layers: int) -> int:
    """Pixels for a layer-per-row figure: readable rows for 30+ layers, bounded for 80."""
    return int(min(1400, max(360, 160 + 20 * num_layers)))


def _kind_label(k: str) -> str:
    return KIND_LABELS.get(k, k)


def layout_figure(fig: go.Figure, title: str, height: int, margin: dict | None = None,
                  **kw) -> go.Figure:
    """The page's style of every figure: the title at the left, the height, white template."""
    fig.update_layout(title=dict(text=title, x=0.01, xanchor="left"), height=height,
                      margin={**dict(l=60, r=20, t=60, b=60), **(margin or {})},
                      template="plotly_white", **kw)
    return fig


# --------------------------------------------------------------------------- delta heatmaps
def _heatmap_trace(stats, metric: str, tau: float, log: bool, kinds, coloraxis: str | None,
                   name: str) -> go.Heatmap:
    layers, kinds, z = stats.grid(metric, tau, kinds)
    # Hover shows every metric of the cell, whatever the colour shows.
    extra = {m: stats.grid(m, tau, kinds)[2] for m in ("frac_rows_above", "mean_row_mav",
                                                       "max_row_mav")}
    custom = np.stack([extra["frac_rows_above"], extra["mean_row_mav"], extra["max_row_mav"]], -1)
    shown = z
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            shown = np.where(z > 0, np.log10(np.where(z > 0, z, 1)), np.nan)
    tr = go.Heatmap(
        z=shown, x=[_kind_label(k) for k in kinds], y=layers, customdata=custom, name=name,
        hovertemplate=("<b>%{fullData.name}</b><br>layer %{y}, %{x}<br>"
                       f"rows with MAV > {tau:.3g}: %{{customdata[0]:.1%}}<br>"
                       "mean row MAV: %{customdata[1]:.3g}<br>max row MAV: %{customdata[2]:.3g}"
                       "<extra></extra>"),
        xgap=1, ygap=1)
    if coloraxis:
        tr.update(coloraxis=coloraxis)
    return tr


def _colorbar(metric: str, log: bool, zmin=None, zmax=None) -> dict:
    title = METRIC_TITLES.get(metric, metric)
    cb: dict = {"title": {"text": ("log₁₀ " if log else "") + title, "side": "right"}}
    if metric == "frac_rows_above":
        cb["tickformat"] = ".0%"
    if log and zmin is not None and zmax is not None and np.isfinite([zmin, zmax]).all():
        ticks = _log_ticks(zmin, zmax)
        cb.update(tickvals=[v for v, _ in ticks], ticktext=[t for _, t in ticks])
    return cb


def _log_ticks(lo: float, hi: float) -> list[tuple[float, str]]:
    """(log10 value, label) ticks within [lo, hi]: the powers of ten, and 2x and 5x them too
    when fewer than three powers fall inside (a range within one decade had a single tick)."""
    decades = range(math.floor(lo), math.ceil(hi) + 1)
    within = [(float(k), f"1e{k}") for k in decades if lo <= k <= hi]
    if len(within) >= 3:
        return within
    return [(k + math.log10(m), f"{m}e{k}") for k in decades for m in (1, 2, 5)
            if lo <= k + math.log10(m) <= hi]


def _range(zs: Iterable[np.ndarray], metric: str, log: bool) -> tuple[float, float]:
    if metric == "frac_rows_above" and not log:
        return 0.0, 1.0
    vals = np.concatenate([z[np.isfinite(z)].ravel() for z in zs] or [np.zeros(0)])
    if log:
        vals = vals[vals > 0]
        vals = np.log10(vals) if len(vals) else vals
    if len(vals) == 0:
        return 0.0, 1.0
    lo, hi = float(vals.min()), float(vals.max())
    return (lo, hi) if hi > lo else (lo - 0.5, hi + 0.5)


def _matrix_kinds(kinds: Sequence[str]) -> list[str]:
    return [k for k in kinds if k in MATRIX_KINDS]


def _two_taus(first, second, tau) -> tuple[float, float]:
    """Per-expert thresholds: a pair (either may be None: that expert's own default) or one
    value for both (None: the first expert's default for both, so the panels compare)."""
    if isinstance(tau, (tuple, list)):
        if len(tau) != 2:
            raise ValueError(f"give one threshold or one per expert (2), not {len(tau)}")
        return first.tau(tau[0]), second.tau(tau[1])
    t = first.tau(tau)
    return t, t


def _tau_note(metric: str, tau: float) -> str:
    return f" (τ = {tau:.3g})" if metric == "frac_rows_above" else ""


def delta_heatmap(stats, metric: str = "frac_rows_above", tau: float | None = None,
                  log: bool = False, title: str | None = None, kinds: Sequence[str] | None = None,
                  zrange: tuple[float, float] | None = None,
                  matrices_only: bool = False) -> go.Figure:
    """Layer (y, 0 at the bottom) x module kind heatmap of one expert's delta.

    metric: "frac_rows_above" (of threshold tau; the published view), "mean_row_mav",
    "max_row_mav" or "mass"; ``log`` colours by log10 (for MAVs spanning decades).
    ``matrices_only``: only the 2-D projection matrices (``MATRIX_KINDS``), as the paper plots.
    """
    tau = stats.tau(tau)
    if matrices_only:
        kinds = _matrix_kinds(kinds if kinds is not None else stats.kinds())
    tr = _heatmap_trace(stats, metric, tau, log, kinds, None, stats.label)
    lo, hi = zrange or _range([stats.grid(metric, tau, kinds)[2]], metric, log)
    tr.update(zmin=lo, zmax=hi, colorscale="Viridis", colorbar=_colorbar(metric, log, lo, hi))
    fig = go.Figure(tr)
    what = METRIC_TITLES.get(metric, metric) + _tau_note(metric, tau)
    layout_figure(fig, title or f"{stats.label}: {what}", heatmap_height(stats.num_layers))
    fig.update_xaxes(title_text="module", tickangle=-35)
    fig.update_yaxes(title_text="layer", dtick=1 if stats.num_layers <= 40 else 2)
    return fig


def mav_heatmap(stats, log: bool = True, **kw) -> go.Figure:
    """Mean row MAV per cell, log colour scale by default."""
    return delta_heatmap(stats, "mean_row_mav", log=log, **kw)


def _union_kinds(*stats) -> list[str]:
    present = {k for s in stats for k in s.kinds()}
    return [k for k in LAYER_KIND_ORDER if k in present] + sorted(present - set(LAYER_KIND_ORDER))


def side_by_side_heatmaps(first, second, metric: str = "frac_rows_above",
                          tau: float | tuple[float | None, float | None] | None = None,
                          log: bool = False, title: str | None = None,
                          matrices_only: bool = False) -> go.Figure:
    """Two experts' heatmaps next to each other with one shared colour scale.

    ``tau``: one threshold for both (the first's default unless given: the same threshold
    makes the panels comparable), or one per expert, ``(tau_first, tau_second)``, as the
    layer-swapping paper did (1.9e-5 and 1.0e-5 for its two experts). Each panel's title
    names its threshold. ``matrices_only``: only the 2-D projection matrices (``MATRIX_KINDS``).
    """
    taus = _two_taus(first, second, tau)
    kinds = _union_kinds(first, second)
    if matrices_only:
        kinds = _matrix_kinds(kinds)
    lo, hi = _range([s.grid(metric, t, kinds)[2] for s, t in zip((first, second), taus)],
                    metric, log)
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=tuple(s.label + _tau_note(metric, t)
                                             for s, t in zip((first, second), taus)))
    for col, (st, t) in enumerate(zip((first, second), taus), start=1):
        fig.add_trace(_heatmap_trace(st, metric, t, log, kinds, "coloraxis", st.label), 1, col)
    fig.update_layout(coloraxis=dict(colorscale="Viridis", cmin=lo, cmax=hi,
                                     colorbar=_colorbar(metric, log, lo, hi)))
    what = METRIC_TITLES.get(metric, metric) + (_tau_note(metric, taus[0]) if taus[0] == taus[1]
                                                 else "")
    layout_figure(fig, title or f"Where each expert changed: {what}",
                  heatmap_height(max(first.num_layers, second.num_layers)))
    fig.update_xaxes(title_text="module", tickangle=-35)
    fig.update_yaxes(title_text="layer", dtick=1 if first.num_layers <= 40 else 2, col=1)
    return fig


def overlap_heatmap(task, lang, tau: float | tuple[float | None, float | None] | None = None,
                    title: str | None = None, matrices_only: bool = False) -> go.Figure:
    """Cells both experts changed strongly: min of their fractions of rows above tau.

    A high value means both fine-tunings moved the same weights, so whichever expert a merge
    takes there, the other's change is lost (or, blended, they interfere). ``tau`` and
    ``matrices_only`` as in ``side_by_side_heatmaps`` (each expert's fraction at its own tau).
    """
    tau_task, tau_lang = _two_taus(task, lang, tau)
    kinds = _union_kinds(task, lang)
    if matrices_only:
        kinds = _matrix_kinds(kinds)
    layers, _, ft = task.grid("frac_rows_above", tau_task, kinds)
    _, _, fl = lang.grid("frac_rows_above", tau_lang, kinds)
    both = np.fmin(ft, fl)
    fig = go.Figure(go.Heatmap(
        z=both, x=[_kind_label(k) for k in kinds], y=layers, zmin=0, zmax=1,
        colorscale="Reds", customdata=np.stack([ft, fl], -1), xgap=1, ygap=1,
        colorbar={"title": {"text": "both changed (min fraction)", "side": "right"},
                  "tickformat": ".0%"},
        hovertemplate=("layer %{y}, %{x}<br>both: %{z:.1%}<br>"
                       f"{task.label}: %{{customdata[0]:.1%}}<br>{lang.label}: %{{customdata[1]:.1%}}"
                       "<extra></extra>")))
    taus = (f"τ = {tau_task:.3g}" if tau_task == tau_lang else
            f"τ = {tau_task:.3g} for {task.label}, {tau_lang:.3g} for {lang.label}")
    # the taus on a line of their own
    layout_figure(fig, title or
                  f"Interference risk: rows changed by both experts<br><sup>{taus}</sup>",
                  heatmap_height(task.num_layers), margin=dict(t=80))
    fig.update_xaxes(title_text="module", tickangle=-35)
    fig.update_yaxes(title_text="layer", dtick=1 if task.num_layers <= 40 else 2)
    return fig


# --------------------------------------------------------------------------- merge plan views
_SHORT = {"task": "T", "lang": "L", "base": "B", "blend": "½", "mixed": "±"}


def _source_key(value: str) -> str:
    """'task' | 'lang' | 'base' | 'blend' | 'mixed' | 'other' (any other method name)."""
    v = str(value)
    if v in COLORS:
        return v
    return "blend" if v.startswith("blend") else "other"


def plan_heatmap(cells: Mapping[tuple[int, str], str], num_layers: int | None = None,
                 stats=None, metric: str = "frac_rows_above", tau: float | None = None,
                 title: str | None = None) -> go.Figure:
    """Which source every (layer, kind) cell takes under a merge plan.

    ``cells``: ``MergePlan.cells()``, i.e. (layer, kind) -> "task" | "lang" | "base" | "blend"
    | method name | "mixed". Without ``stats`` the cells are coloured by source; with an
    expert's ``stats`` they are coloured by its delta metric and the source is written in each
    cell (T/L/B/½), so one sees what the plan keeps and what it drops.
    """
    L = num_layers if num_layers is not None else (max((l for l, _ in cells), default=-1) + 1)
    present = {k for _, k in cells}
    kinds = [k for k in LAYER_KIND_ORDER if k in present] + sorted(present - set(LAYER_KIND_ORDER))
    col = {k: j for j, k in enumerate(kinds)}
    label = np.full((L, len(kinds)), "", dtype=object)
    for (l, k), v in cells.items():
        if 0 <= l < L:
            label[l, col[k]] = v
    keys = np.vectorize(lambda v: _source_key(v) if v else "")(label) if label.size else label
    text = np.vectorize(lambda v: _SHORT.get(_source_key(v), "·") if v else "")(label) \
        if label.size else label
    x = [_kind_label(k) for k in kinds]
    if stats is not None:
        tau = stats.tau(tau)
        _, _, z = stats.grid(metric, tau, kinds)
        z = z[:L]
        lo, hi = _range([z], metric, False)
        tr = go.Heatmap(z=z, x=x, y=list(range(L)), text=text, texttemplate="%{text}",
                        customdata=label, colorscale="Viridis", zmin=lo, zmax=hi, xgap=1, ygap=1,
                        colorbar=_colorbar(metric, False),
                        hovertemplate=("layer %{y}, %{x}<br>source: %{customdata}<br>"
                                       f"{stats.label} {METRIC_TITLES.get(metric, metric)}: "
                                       "%{z:.3g}<extra></extra>"))
        fig = go.Figure(tr)
        default_title = f"Merge plan over {stats.label}'s delta (T task, L language, ½ blend)"
    else:
        order = [k for k in ("lang", "blend", "task", "base", "mixed", "other")
                 if (keys == k).any()] or ["task"]
        idx = {k: i for i, k in enumerate(order)}
        z = np.vectorize(lambda k: idx.get(k, np.nan) if k else np.nan, otypes=[float])(keys) \
            if keys.size else np.zeros((L, 0))
        n = len(order)
        scale = []  # discrete colour bands, one per source
        for i, k in enumerate(order):
            scale += [[i / n, COLORS[k]], [(i + 1) / n, COLORS[k]]]
        tr = go.Heatmap(z=z, x=x, y=list(range(L)), text=text, texttemplate="%{text}",
                        customdata=label, colorscale=scale, zmin=-0.5, zmax=n - 0.5,
                        xgap=1, ygap=1,
                        colorbar=dict(title={"text": "source"}, tickvals=list(range(n)),
                                      ticktext=[SOURCE_NAMES.get(k, k) for k in order]),
                        hovertemplate="layer %{y}, %{x}<br>source: %{customdata}<extra></extra>")
        fig = go.Figure(tr)
        default_title = "Merge plan: source of every layer and module"
    layout_figure(fig, title or default_title, heatmap_height(L))
    fig.update_xaxes(title_text="module", tickangle=-35)
    fig.update_yaxes(title_text="layer", dtick=1 if L <= 40 else 2)
    return fig


def _row_dict(row, kind_params: Mapping[str, int] | None = None) -> dict:
    """A layer row as {"layer", "source", "w_task", "w_lang", "label"}.

    Accepts plain dicts in that form or ``plan.LayerRow`` objects, whose weights are read from
    their ``Source``s (``Source.shares``: a blend's own weights, 1 for a copy, none for methods
    that move the base). kind_params: parameters of each module kind in this layer, so that a
    mixed layer's shares are shares of its parameters (without it, each kind counts once).
    """
    if isinstance(row, Mapping):
        d = dict(row)
        src = _source_key(d.get("source", "other"))
        w_task = d.get("w_task", 1.0 if src == "task" else 0.0)
        w_lang = d.get("w_lang", 1.0 if src == "lang" else 0.0)
        return {"layer": int(d["layer"]), "source": src, "w_task": float(w_task),
                "w_lang": float(w_lang), "label": str(d.get("label", src))}
    kinds = dict(row.sources)
    sizes = [float((kind_params or {}).get(k, 1)) for k in kinds]
    return _sources_row(int(row.layer), str(row.label), list(kinds.values()), row.text(), sizes)


def _sources_row(layer: int, label: str, kind_sources: Sequence[Sequence], text: str,
                 sizes: Sequence[float] | None = None) -> dict:
    """The row dict of a layer (or the non-layer parameters) whose module kinds come from
    ``kind_sources`` (one tuple of ``Source``s per kind; ``sizes``: one weight per kind, default
    1 each): each expert's share is the size-weighted mean of the kinds' shares, a kind's share
    the mean of its sources' ``shares``."""
    kinds = [tuple(k) for k in kind_sources if k] or [()]
    sizes = list(sizes) if sizes and len(sizes) == len(kinds) else [1.0] * len(kinds)
    total = sum(sizes) or 1.0

    def share(model: str) -> float:
        return sum(size * sum(src.shares.get(model, 0.0) for src in srcs) / max(1, len(srcs))
                   for srcs, size in zip(kinds, sizes)) / total

    every = {src for srcs in kinds for src in srcs}
    key = "mixed" if label == "mixed" or len(every) != 1 else _source_key(next(iter(every)).cell)
    return {"layer": layer, "source": key, "w_task": share("task"), "w_lang": share("lang"),
            "label": text}


NON_LAYER_Y = -1  # the non-layer parameters' bar sits below layer 0


def _non_layer_row(non_layer: Mapping) -> dict:
    """One row for the parameters outside the layers: name -> ``Source``
    (``MergePlan.non_layer_sources()``; a bare model name "task"/"lang"/"base" is a copy)."""
    sources = {n: Source.copy(s) if isinstance(s, str) else s for n, s in non_layer.items()}
    by_label: dict[str, list[str]] = {}
    for name, src in sources.items():
        by_label.setdefault(src.label, []).append(name.removesuffix(".weight"))
    text = "; ".join(f"{lab}: {', '.join(names)}" for lab, names in by_label.items())
    label = next(iter(by_label)) if len(by_label) == 1 else "mixed"
    row = _sources_row(NON_LAYER_Y, label, [(src,) for src in sources.values()], text)
    return {**row, "short": label}


def layer_stack_figure(rows: Sequence, title: str | None = None,
                       names: Mapping[str, str] | None = None,
                       non_layer: Mapping | None = None,
                       kind_params: Mapping[int, Mapping[str, int]] | None = None) -> go.Figure:
    """The layer stack as in the published figure: one bar per layer, layer 0 at the bottom,
    coloured by source; blended (transition) layers split by their weights.

    rows: ``MergePlan.layer_rows()`` or dicts {"layer", "source", "w_task", "w_lang", "label"}.
    names: display names for "task"/"lang" (e.g. the model names).
    non_layer: ``MergePlan.non_layer_sources()`` (name -> Source): one more bar, "non-layer",
    below layer 0 says where the embeddings, final norm and LM head come from.
    kind_params: layer -> module kind -> parameter count (``layer_kind_params``): a layer whose
    modules come from several sources is split by parameter count, not by module count.
    """
    names = {**SOURCE_NAMES, **(names or {})}
    kind_params = kind_params or {}
    rs = sorted((_row_dict(r, kind_params.get(getattr(r, "layer", None))) for r in rows),
                key=lambda r: r["layer"])
    extra = [_non_layer_row(non_layer)] if non_layer else []
    layers = [r["layer"] for r in rs]
    w_lang, w_task, w_other = [], [], []
    for r in extra + rs:
        total = r["w_task"] + r["w_lang"]
        if total > 0:
            w_lang.append(r["w_lang"] / total)
            w_task.append(r["w_task"] / total)
            w_other.append(0.0)
        else:
            w_lang.append(0.0)
            w_task.append(0.0)
            w_other.append(1.0)
    hover = [f"non-layer parameters: {r['label']}" for r in extra] + \
        [f"layer {r['layer']}: {r['label']}" for r in rs]
    ys = [r["layer"] for r in extra] + layers
    fig = go.Figure()
    for key, ws, lab in (("lang", w_lang, names["lang"]), ("task", w_task, names["task"]),
                         ("base", w_other, "other (base / method)")):
        if not any(ws):
            continue
        fig.add_trace(go.Bar(
            y=ys, x=ws, orientation="h", name=lab, marker_color=COLORS[key],
            marker_line=dict(color="white", width=1), customdata=hover,
            text=[f"{w:.0%}" if 0 < w < 1 else "" for w in ws], textposition="inside",
            hovertemplate="%{customdata}<br>" + lab + ": %{x:.0%}<extra></extra>"))
    # Zone labels on the right, one per run of equal rows ("language expert ×6", "blend ...").
    for r in extra:  # "non-layer: blend 0.50/0.50 (embeddings, final norm, LM head)"
        src = r["source"]
        what = names.get(src, src) if src in ("task", "lang", "base") else r["short"]
        fig.add_annotation(x=1.01, xref="paper", xanchor="left", y=r["layer"],   # two lines:
                           text=f"non-layer: {what}<br>(embeddings, final norm, LM head)",
                           showarrow=False, font=dict(size=11, color=COLORS.get(src, "#444")))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1]["label"] == rs[i]["label"]:
            j += 1
        src = rs[i]["source"]
        text = names.get(src, src) if src in ("task", "lang", "base") else rs[i]["label"]
        fig.add_annotation(x=1.01, xref="paper", xanchor="left", y=(layers[i] + layers[j]) / 2,
                           text=f"{text} ×{j - i + 1}" if j > i else text, showarrow=False,
                           font=dict(size=11, color=COLORS.get(src, "#444")))
        i = j + 1
    fig.update_layout(barmode="stack", bargap=0.08, legend=dict(orientation="h", y=-0.08))
    fig.update_xaxes(range=[0, 1], tickformat=".0%", title_text="share of the layer's weights",
                     showgrid=False)
    fig.update_yaxes(title_text="layer", dtick=1 if len(layers) <= 40 else 2,
                     range=[min(ys, default=0) - 0.5, (max(layers) if layers else 0) + 0.5])
    if extra:
        step = 1 if len(layers) <= 40 else 2
        ticks = [NON_LAYER_Y] + layers[::step]
        fig.update_yaxes(tickmode="array", tickvals=ticks,
                         ticktext=["non-layer"] + [str(t) for t in ticks[1:]])
    return layout_figure(fig, title or "Layer stack of the merged model", heatmap_height(len(ys)),
                         margin=dict(r=260 if extra else 200))


# --------------------------------------------------------------------------- profiles
def layer_profile_figure(stats: Sequence | Mapping, normalize: bool = True,
                         suggestion=None, title: str | None = None) -> go.Figure:
    """Total delta mass per layer, one line per expert.

    ``normalize``: each expert's share of its own total (comparable across experts trained
    with different strengths; what ``suggest_config`` uses). ``suggestion`` (an
    ``analysis.Suggestion``) shades the layers it gives the language expert.
    """
    items = list(stats.items()) if isinstance(stats, Mapping) else [(s.label, s) for s in stats]
    fig = go.Figure()
    L = 0
    palette = [COLORS["task"], COLORS["lang"], "#3BB273", "#7768AE", "#E1BC29"]
    for i, (name, st) in enumerate(items):
        prof = st.layer_profile()
        L = max(L, len(prof))
        y = prof / prof.sum() if normalize and prof.sum() > 0 else prof
        key = name if name in COLORS else None
        fig.add_trace(go.Scatter(
            x=list(range(len(prof))), y=y, mode="lines+markers", name=name,
            line=dict(color=COLORS[key] if key else palette[i % len(palette)], width=2),
            customdata=prof,
            hovertemplate=(f"{name}<br>layer %{{x}}<br>"
                           + ("share %{y:.1%}<br>" if normalize else "")
                           + "Σ|Δ| %{customdata:.4g}<extra></extra>")))
    if suggestion is not None and L:
        spans = [(0, suggestion.bottom), (L - suggestion.top, L)]
        for lo, hi in spans:
            if hi > lo:
                fig.add_vrect(x0=lo - 0.5, x1=hi - 0.5, fillcolor=COLORS["lang"], opacity=0.12,
                              line_width=0, annotation_text="swap", annotation_position="top left")
        tb, tu = suggestion.transition_bottom, suggestion.transition_top
        for lo, hi in ((suggestion.bottom, suggestion.bottom + tb),
                       (L - suggestion.top - tu, L - suggestion.top)):
            if hi > lo:
                fig.add_vrect(x0=lo - 0.5, x1=hi - 0.5, fillcolor=COLORS["blend"], opacity=0.12,
                              line_width=0)
    fig.update_xaxes(title_text="layer", dtick=1 if L <= 40 else 2, range=[-0.5, L - 0.5])
    fig.update_yaxes(title_text="share of the expert's total Σ|Δ|" if normalize else "Σ|Δ|",
                     tickformat=".0%" if normalize else None, rangemode="tozero")
    return layout_figure(fig, title or "Delta mass per layer", 380, hovermode="x unified",
                         legend=dict(orientation="h", y=1.02, yanchor="bottom", x=1,
                                     xanchor="right"))


# --------------------------------------------------------------------------- results
_ROLE_WORDS = (("base", ("base",)), ("task", ("task", "math")), ("lang", ("lang", "language")),
               ("blend", ("merge", "swap", "soup", "ties", "arithmetic")))
PALETTE = ("#3BB273", "#7768AE", "#E1BC29", "#4D9DE0", "#E15554")


def _model_color(row: Mapping, index: int) -> str:
    """Colour of a model: its "role" key (base/task/lang/merged) if given, else words in its
    name, else a palette colour by position."""
    role = str(row.get("role", "")).lower()
    if role in COLORS:
        return COLORS[role]
    if role == "merged":
        return COLORS["blend"]
    name = str(row.get("model", "")).lower()
    for key, words in _ROLE_WORDS:
        if any(w in name for w in words):
            return COLORS[key]
    return PALETTE[index % len(PALETTE)]


def accuracy_bars(summary: Sequence[Mapping], title: str | None = None,
                  ylabel: str = "accuracy") -> go.Figure:
    """Accuracy per model with 95% confidence intervals.

    summary: dicts {"model", "accuracy", "ci_low", "ci_high", "n"} (fractions in 0..1), with
    an optional "role" ("base" | "task" | "lang" | "merged") that picks the colour.
    """
    models = [str(r["model"]) for r in summary]
    acc = np.array([float(r["accuracy"]) for r in summary])
    lo = np.array([float(r.get("ci_low", r["accuracy"])) for r in summary])
    hi = np.array([float(r.get("ci_high", r["accuracy"])) for r in summary])
    n = [int(r.get("n", 0)) for r in summary]
    colors = [_model_color(r, i) for i, r in enumerate(summary)]
    fig = go.Figure(go.Bar(
        x=models, y=acc, marker_color=colors,
        error_y=dict(type="data", symmetric=False, array=np.maximum(hi - acc, 0),
                     arrayminus=np.maximum(acc - lo, 0), thickness=1.5, width=6),
        text=[f"{a:.1%}" for a in acc], textposition="outside", cliponaxis=False,
        customdata=np.stack([lo, hi, n], -1) if len(acc) else None,
        hovertemplate=("%{x}<br>accuracy %{y:.1%}<br>95% CI [%{customdata[0]:.1%}, "
                       "%{customdata[1]:.1%}]<br>n = %{customdata[2]:d}<extra></extra>")))
    top = float(max(hi.max() if len(hi) else 0, acc.max() if len(acc) else 0))
    fig.update_yaxes(title_text=ylabel, tickformat=".0%", range=[0, min(1.0, top * 1.15 + 0.05)])
    fig.update_xaxes(title_text="model")
    return layout_figure(fig, title or "Accuracy with 95% confidence intervals", 400,
                         showlegend=False)


def sweep_heatmap(x_values: Sequence, y_values: Sequence, scores, x_label: str = "top layers u",
                  y_label: str = "bottom layers b", title: str | None = None,
                  score_label: str = "score", fmt: str = ".1%",
                  lower_is_better: bool = False) -> go.Figure:
    """Scores of a grid sweep (e.g. bottom b x top u) in the page's style; ``scores[i][j]`` is
    for (y_values[i], x_values[j]); None/NaN marks configurations not run or impossible. The
    cells are the sweeps' one drawing (``sweeps.report.heatmap_trace``: the best cell, highest
    or with ``lower_is_better`` lowest, starred and outlined)."""
    trace, best = heatmap_trace(x_values, y_values, scores, x_label=x_label, y_label=y_label,
                                score_label=score_label, fmt=fmt,
                                lower_is_better=lower_is_better)
    fig = go.Figure(trace)
    outline_best(fig, best)
    fig.update_xaxes(title_text=x_label, type="category")
    fig.update_yaxes(title_text=y_label, type="category")
    return layout_figure(fig, title or f"Sweep: {score_label} by {y_label} and {x_label}",
                         max(320, 120 + 40 * len(y_values)))


def effects_chart(rows: Sequence[Mapping], title: str | None = None) -> go.Figure:
    """The demo's statistics as horizontal bars: each mean over templates with its 95%
    cluster-bootstrap interval (negative: the first model makes the gold solution more likely),
    the primary one first and in its own colour.

    rows: {"label", "mean", "ci_low", "ci_high", "n_templates", "sign_p", "p_holm",
    "primary"} (``demos.measure.summarize_effects``)."""
    rows = list(rows)[::-1]                     # plotly draws the first category at the bottom
    mean = np.array([r["mean"] for r in rows])
    lo, hi = np.array([r["ci_low"] for r in rows]), np.array([r["ci_high"] for r in rows])
    labels = [("PRIMARY: " if r["primary"] else "") + r["label"] for r in rows]
    fig = go.Figure(go.Bar(
        x=mean, y=labels, orientation="h",
        marker_color=[PALETTE[1] if r["primary"] else PALETTE[0] for r in rows],
        error_x=dict(type="data", symmetric=False, array=np.maximum(hi - mean, 0),
                     arrayminus=np.maximum(mean - lo, 0), thickness=1.5, width=4),
        customdata=np.stack([lo, hi, [r["n_templates"] for r in rows],
                             [r["sign_p"] for r in rows], [r["p_holm"] for r in rows]], -1)
        if rows else None,
        hovertemplate=("%{y}<br>mean over templates %{x:+.4f}<br>95% CI [%{customdata[0]:+.4f}, "
                       "%{customdata[1]:+.4f}]<br>%{customdata[2]:d} templates, sign test p = "
                       "%{customdata[3]:.2g} (Holm %{customdata[4]:.2g})<extra></extra>")))
    fig.add_vline(x=0, line_width=1, line_color="#555")
    fig.update_xaxes(title_text="NLL difference (nats/token; negative: more likely)")
    fig.update_yaxes(automargin=True)
    return layout_figure(fig, title or "Demo statistics (95% cluster-bootstrap intervals)",
                         max(320, 90 + 28 * len(rows)))

