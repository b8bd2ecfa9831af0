"""What a finished sweep shows: the table, the best configuration per language (with its 95%
interval), and a heatmap per language (``DIR/heatmap.html``; also ``.png`` where plotly can
write images, i.e. with kaleido installed)."""
from __future__ import annotations

from pathlib import Path


def score_of(record: dict, lang: str, metric: str) -> float | None:
    s = record["scores"].get(lang)
    return None if s is None else s["nll" if metric == "nll" else "accuracy"]


def best(records: list[dict], lang: str, metric: str) -> dict | None:
    """The best record for ``lang``: highest accuracy / lowest NLL (ties: the first in grid
    order); None when nothing was scored, or when every configuration scored the same (none is
    better)."""
    scored = [r for r in records if score_of(r, lang, metric) is not None]
    if not scored or (len(scored) > 1 and all_tie(scored, lang, metric)):
        return None
    sign = 1 if metric == "nll" else -1
    return min(scored, key=lambda r: sign * score_of(r, lang, metric))


def all_tie(records: list[dict], lang: str, metric: str) -> bool:
    return len({score_of(r, lang, metric) for r in records}) == 1


def point_text(point: dict) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in point.items())


def score_text(s: dict, metric: str) -> str:
    if metric == "nll":
        return f"{s['nll']:.4f} [{s['ci_low']:.4f}, {s['ci_high']:.4f}]"
    return f"{s['accuracy']:.1%} ({s['correct']}/{s['n']}) [{s['ci_low']:.1%}, {s['ci_high']:.1%}]"


def table(records: list[dict], axes: list[str], langs: list[str], metric: str) -> str:
    """One row per configuration: the grid values, each language's score, seconds, worker."""
    head = [*axes, *(f"{lang} {'NLL' if metric == 'nll' else 'acc'}" for lang in langs),
            "seconds", "rewritten"]
    rows = [[*(f"{r['point'][a]:g}" for a in axes),
             *(("-" if score_of(r, lang, metric) is None else
                f"{score_of(r, lang, metric):.4f}" if metric == "nll" else
                f"{score_of(r, lang, metric):.1%}") for lang in langs),
             f"{r['seconds']:.1f}", str(r.get("rewritten", "-"))] for r in records]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(lines)


def best_lines(records: list[dict], langs: list[str], metric: str) -> list[str]:
    what = "lowest gold NLL" if metric == "nll" else "highest accuracy"
    out = []
    for lang in langs:
        scored = [r for r in records if score_of(r, lang, metric) is not None]
        b = best(records, lang, metric)
        if b is None and len(scored) > 1:
            value = score_of(scored[0], lang, metric)
            out.append(f"no configuration is better in {lang}: all {len(scored)} score "
                       + format(value, ".4f" if metric == "nll" else ".1%"))
        elif b is not None:
            out.append(f"best in {lang} ({what}): {point_text(b['point'])}: "
                       f"{score_text(b['scores'][lang], metric)}")
    return out


def score_grid(records: list[dict], grid: dict[str, list], lang: str, metric: str):
    """(x axis, y axis or None, x values, y values, z): the scores of ``lang`` over the last
    axis (x) and the first (y; one row for a 1-D grid), ``z[iy][ix]`` None where nothing was
    scored; with more axes each cell holds the best over the others. The one heatmap grid of
    the CLI's figure and the app's."""
    axes = list(grid)
    xa, ya = axes[-1], (axes[0] if len(axes) > 1 else None)
    xs, ys = grid[xa], (grid[ya] if ya else [0])
    pick = min if metric == "nll" else max
    z = [[None] * len(xs) for _ in ys]
    for r in records:
        v = score_of(r, lang, metric)
        if v is None:
            continue
        ix, iy = xs.index(r["point"][xa]), (ys.index(r["point"][ya]) if ya else 0)
        z[iy][ix] = v if z[iy][ix] is None else pick(z[iy][ix], v)
    return xa, ya, xs, ys, z


def heatmap_trace(xs, ys, z, *, x_label: str, y_label: str, score_label: str = "score",
                  fmt: str = ".3f", lower_is_better: bool = False, coloraxis: str | None = None):
    """The one drawing of a sweep's grid (the CLI's figure and the app's): (a plotly Heatmap,
    the best cell (row, column) or None). ``z[i][j]`` is the score of (ys[i], xs[j]), None or
    NaN where nothing was scored; cells show their score (``fmt``), the best one (highest, or
    lowest with ``lower_is_better``: an NLL) starred; ``coloraxis``: a shared colour axis (the
    CLI's figure, one panel per language), else a colour bar of its own."""
    import numpy as np
    import plotly.graph_objects as go

    z = np.array([[np.nan if v is None else v for v in row] for row in z],
                 dtype=float).reshape(len(ys), len(xs))
    text = [["" if not np.isfinite(v) else format(v, fmt) for v in row] for row in z]
    pick = np.nanargmin if lower_is_better else np.nanargmax
    best = np.unravel_index(pick(z), z.shape) if np.isfinite(z).any() else None
    if best is not None:
        text[best[0]][best[1]] = "★ " + text[best[0]][best[1]]
    colours = ({"coloraxis": coloraxis} if coloraxis else
               {"colorscale": "Viridis_r" if lower_is_better else "Viridis",
                "colorbar": {"title": {"text": score_label, "side": "right"},
                             "tickformat": fmt if fmt.endswith("%") else None}})
    trace = go.Heatmap(z=z, x=[str(v) for v in xs], y=[str(v) for v in ys], text=text,
                       texttemplate="%{text}", xgap=2, ygap=2, **colours,
                       hovertemplate=(f"{y_label} %{{y}}<br>{x_label} %{{x}}<br>{score_label} "
                                      f"%{{z:{fmt}}}<extra></extra>"))
    return trace, best


def outline_best(fig, best, **where) -> None:
    """A white frame around the best cell (category axes: cells at integer positions)."""
    if best is not None:
        i, j = best
        fig.add_shape(type="rect", x0=j - 0.5, x1=j + 0.5, y0=i - 0.5, y1=i + 0.5,
                      line=dict(color="white", width=3), **where)


def heatmap_figure(records: list[dict], grid: dict[str, list], langs: list[str], metric: str):
    """One heatmap per language over the first two axes (one row for a 1-D grid); with more
    axes each cell shows the best over the others (``score_grid``, ``heatmap_trace``)."""
    from plotly.subplots import make_subplots

    axes = list(grid)
    fig = make_subplots(rows=1, cols=len(langs), subplot_titles=list(langs),
                        horizontal_spacing=0.12)
    for col, lang in enumerate(langs, start=1):
        xa, ya, xs, ys, z = score_grid(records, grid, lang, metric)
        trace, best = heatmap_trace(xs, ys, z, x_label=xa, y_label=ya or "", score_label=metric,
                                    fmt=".4f", lower_is_better=metric == "nll",
                                    coloraxis="coloraxis")
        fig.add_trace(trace, row=1, col=col)
        outline_best(fig, best, row=1, col=col)
        fig.update_xaxes(title_text=xa, type="category", row=1, col=col)
        fig.update_yaxes(title_text=ya or "", type="category", row=1, col=col)
    scale = "Viridis_r" if metric == "nll" else "Viridis"
    more = f" (best over {', '.join(axes[1:-1])})" if len(axes) > 2 else ""
    fig.update_layout(coloraxis={"colorscale": scale,
                                 "colorbar": {"title": "gold NLL" if metric == "nll" else
                                              "accuracy"}},
                      title=f"sweep: {metric} per configuration{more}",
                      height=380, width=max(480, 420 * len(langs)))
    return fig


def write_heatmap(records: list[dict], grid: dict[str, list], langs: list[str], metric: str,
                  folder: str | Path) -> list[Path]:
    """``heatmap.html`` (self-contained), and ``heatmap.png`` when plotly can write images."""
    fig = heatmap_figure(records, grid, langs, metric)
    folder = Path(folder)
    html = folder / "heatmap.html"
    tmp = html.with_name("heatmap.html.tmp")
    fig.write_html(str(tmp), include_plotlyjs=True, full_html=True)
    tmp.replace(html)
    out = [html]
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return out
    try:
        fig.write_image(str(folder / "heatmap.png"))
        out.append(folder / "heatmap.png")
    except Exception:  # noqa: BLE001 (no browser for kaleido): the html stands
        pass
    return out
