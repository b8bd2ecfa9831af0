"""The Deltas tab: where each expert changed against the base, and the swap that suggests.

The statistics are computed once per session (``analyze_deltas``, cached on disk by
``analysis.deltas``); moving a threshold redraws the figures from them without reading tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .served import Progress, WorkbenchError
from .session import ROLE_LABELS, Session, dispatcher
from ..analysis.deltas import auto_threshold, delta_stats
from ..analysis.suggest import delta_story, suggest_config
from . import figures as plots
from .controls import outside_validated


def analyze_deltas(session: Session, progress: Progress | None = None) -> dict[str, Any]:
    """DeltaStats of each expert against the base (computed once per session; cached on disk)."""
    if not session.has_base:
        raise WorkbenchError("the delta views need the base model (Models tab)")
    if all(role in session.stats for role in ("task", "lang")):
        return session.stats
    with dispatcher().hold(session.job("analyze"), progress) as guard:
        for i, role in enumerate(("task", "lang")):
            if role not in session.stats:
                guard(i / 2, f"delta statistics of the {ROLE_LABELS[role]}")
                session.stats[role] = delta_stats(
                    session.paths["base"], session.paths[role], label=ROLE_LABELS[role],
                    progress=lambda f, m, i=i: guard((i + f) / 2, m))
    return session.stats


@dataclass
class DeltaViews:
    thresholds: tuple[float, float]  # tau of the task and of the language expert
    heatmaps: Any          # side-by-side heatmaps of both experts
    overlap: Any           # where both changed strongly
    profile: Any           # per-layer delta mass
    suggestion: Any        # analysis.Suggestion
    suggestion_text: str   # the story in one sentence, then the suggested configuration
    story: str = ""        # analysis.suggest.delta_story: where each expert changed, overlap


def auto_thresholds(task, lang) -> tuple[float, float]:
    """Each expert's own data-derived tau (``analysis.auto_threshold`` of that expert alone).

    One tau for both would sit between two experts whose deltas differ by orders of magnitude
    (the demo's: about 10x), so one map would be all 0% or all 100%; each expert's own tau lies
    between its quiet and its busy tensors, so both maps show where that expert changed most."""
    return auto_threshold(task), auto_threshold(lang)


def slider_value(tau: float) -> float:
    """A tau as its threshold slider shows it: log10, on the slider's 0.01 steps."""
    return round(math.log10(tau), 2)


def slider_taus(session: Session, values) -> tuple[float, float]:
    """The (task, language) taus of the two threshold sliders (log10 values). A slider still
    at its expert's automatic tau (as Analyze put it there, rounded to the slider's steps)
    means that tau exactly: moving one slider never nudges the other expert's tau."""
    auto = auto_thresholds(session.stats["task"], session.stats["lang"])
    return tuple(a if round(float(v), 2) == slider_value(a) else 10 ** float(v)
                 for v, a in zip(values, auto))


def map_contrast(views: DeltaViews) -> tuple[float, float]:
    """Per heatmap: the largest minus the smallest cell, in the colour's units (for a fraction
    map, 0.2 = 20 percentage points)."""
    import numpy as np
    out = []
    for tr in views.heatmaps.data[:2]:
        z = np.asarray(tr.z, dtype=float)
        z = z[np.isfinite(z)]
        out.append(float(z.max() - z.min()) if z.size else 0.0)
    return tuple(out)


def delta_views(session: Session, threshold: float | tuple[float, float] | None = None,
                metric: str = "fraction", log_scale: bool = True,
                progress: Progress | None = None, matrices_only: bool = False) -> DeltaViews:
    """Figures for the Deltas tab. ``threshold``: one tau for both experts, a (task, lang) pair
    (the paper used a threshold per expert), or None (each expert's own, ``auto_thresholds``).
    ``log_scale`` applies to the MAV colouring only (fractions are shown as they are).
    ``matrices_only``: only the seven 2-D matrices the paper plots. Moving a threshold re-uses
    the stored statistics (no tensor reads)."""
    stats = analyze_deltas(session, progress)
    task, lang = stats["task"], stats["lang"]
    if threshold is None:
        taus = auto_thresholds(task, lang)
    elif isinstance(threshold, (tuple, list)):
        taus = tuple(float(t) for t in threshold)
    else:
        taus = (float(threshold),) * 2
    if not all(t > 0 for t in taus) or len(taus) != 2:
        raise WorkbenchError(f"the thresholds must be two positive numbers, got {threshold}")
    session.tau = taus[1]  # the plan is drawn over the language expert's changes
    metric = "frac_rows_above" if metric == "fraction" else "mean_row_mav"
    only = bool(matrices_only)
    log = bool(log_scale) and metric == "mean_row_mav"
    heat = plots.side_by_side_heatmaps(task, lang, metric=metric, tau=taus, log=log,
                                       matrices_only=only)
    overlap = plots.overlap_heatmap(task, lang, tau=taus, matrices_only=only)
    suggestion = suggest(session)
    profile = plots.layer_profile_figure([task, lang], suggestion=suggestion)
    story = delta_story(task, lang)
    text = (f"**What the deltas say:** {story}\n\n{maps_note(metric, taus)}\n\n"
            f"{suggestion_text(suggestion, session.num_layers)}")
    return DeltaViews(taus, heat, overlap, profile, suggestion, text, story)


def maps_note(metric: str, taus: tuple[float, float]) -> str:
    """How to read the two maps at these thresholds (one line)."""
    if metric == "mean_row_mav":
        return ("The maps colour each matrix by its mean row change (one colour scale for both "
                "experts, so they compare in size).")
    if taus[0] == taus[1]:
        return f"Each cell: the share of the matrix's rows that changed more than tau = {taus[0]:.2g}."
    return (f"Each cell: the share of the matrix's rows that changed more than that expert's own "
            f"tau (task expert {taus[0]:.2g}, language expert {taus[1]:.2g}): each map shows "
            "where its expert changed most; colour by MAV to compare their sizes.")


def suggest(session: Session):
    """analysis.Suggestion from the stored statistics (Analyze first)."""
    if "task" not in session.stats or "lang" not in session.stats:
        raise WorkbenchError("analyze the deltas first (Deltas tab)")
    return suggest_config(session.stats["task"], session.stats["lang"], session.num_layers)


def suggestion_text(s, num_layers: int | None = None) -> str:
    head = (f"**Suggested configuration**: bottom {s.bottom}, top {s.top}, transitions "
            f"{s.transition_bottom}/{s.transition_top}"
            + (f", partition {s.partition}" if s.partition else ""))
    counts = {"bottom": s.bottom, "top": s.top, "transition_bottom": s.transition_bottom,
              "transition_top": s.transition_top}
    outside = outside_validated(counts, num_layers) if num_layers else []
    if outside:
        head += (" (⚠ outside the paper's validated ranges: " + "; ".join(outside)
                 + "; layerswap's heuristic, not validated)")
    return head + ("\n\n" + s.explanation if s.explanation else "")


