"""A layer-swap configuration suggested by the delta statistics of a task and a language expert.

``suggest_config`` turns the per-layer delta profiles (``DeltaStats.layer_profile``) of the two
experts into bottom/top/transition layer counts and, where it fits, a partition, with a
plain-language explanation (see its docstring for the formula).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Iterable

import numpy as np

from ..checkpoints.architectures import ATTENTION_KINDS, MLP_KINDS
from .deltas import DeltaStats
from ..merge.errors import ConfigError
from ..merge.partition import Partition


# Knobs of the suggestion formula (see suggest_config), in units of a uniform layer's share 1/L.
LAYER_COST = 0.1        # a swapped layer must add at least this much language advantage
AMBIGUOUS = 0.25        # |advantage| below this: neither expert dominates -> transition layer
SHARED = 0.5            # ... provided both experts changed it at least this much (else: task)
ELIGIBLE = 0.5          # the language expert changed a swapped layer at least this much
ATTENTION_RATIO = 1.5   # language expert this much more attention-heavy in the middle -> partition A
# attention share: the attention projections (not the q/k norms) against the MLP's
ATTENTION_PROJECTIONS = tuple(k for k in ATTENTION_KINDS if k != "norm_qk")


@dataclass
class Suggestion:
    bottom: int
    top: int
    transition_bottom: int
    transition_top: int
    partition: str | None
    explanation: str
    advantage: list[float] = field(default_factory=list)  # per layer: lang share - task share
    protected: list[int] = field(default_factory=list)    # the task expert's strongest layers

    def merge_config_kwargs(self) -> dict:
        """Keyword arguments for ``config.MergeConfig`` (plain ints / None)."""
        return {"bottom": self.bottom, "top": self.top, "transition_bottom": self.transition_bottom,
                "transition_top": self.transition_top, "partition": self.partition}


def _spans(layers: list[int]) -> str:
    if not layers:
        return "none"
    out, start = [], layers[0]
    for a, b in zip(layers, layers[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


def _kind_mass(stats: DeltaStats, layers: Iterable[int], group: tuple[str, ...]) -> float:
    keep = set(layers)
    return sum(s.mass for s in stats.tensors if s.layer in keep and s.kind in group)


def suggest_config(task_stats: DeltaStats, lang_stats: DeltaStats,
                   num_layers: int | None = None) -> Suggestion:
    """A layer-swap configuration from the per-layer delta profiles of the two experts.

    With m(l) the total delta mass of layer l (``layer_profile``) and p(l) = m(l) / sum m each
    expert's share of its own change (so experts trained with different learning rates compare),
    the language advantage is a(l) = p_lang(l) - p_task(l). In units of u = 1/L:

    1. protected: the task expert's k = max(1, round(L/8)) layers of largest p_task never swap;
    2. bottom b maximises  sum_{l<b} a(l) - 0.1 u b  over b <= L/2 (ties: the smaller b), the
       block stopping before a protected layer or one the language expert barely changed
       (p_lang < 0.5 u); top u likewise over the last layers. The 0.1 u cost per layer keeps
       near-zero advantages out; the 0.5 u floor keeps out layers that neither expert changed
       much (their shares differ only because the experts' totals do);
    3. transition layers: the layers right after the bottom block (right before the top block)
       that both experts changed (p_lang, p_task >= 0.5 u) and neither dominates (|a(l)| <
       0.25 u), at most max(1, L/8) on each side, never protected, always leaving at least one
       pure task layer;
    4. partition "A" (all attention to the language expert) when, over the middle layers, the
       language expert's attention share of its attention+MLP change is >= 1.5x the task
       expert's; then transitions are 0 (a partition replaces them), else None.
    """
    L = int(num_layers or task_stats.num_layers)
    if lang_stats.num_layers != task_stats.num_layers or L != task_stats.num_layers:
        raise ValueError(f"the experts have {task_stats.num_layers} and {lang_stats.num_layers} "
                         f"layers, and num_layers is {L}: they must agree")
    m_task, m_lang = task_stats.layer_profile(), lang_stats.layer_profile()
    if m_task.sum() <= 0 or m_lang.sum() <= 0:
        who = "task" if m_task.sum() <= 0 else "language"
        raise ValueError(f"the {who} expert does not differ from the base in any layer: "
                         "nothing to suggest from")
    p_task, p_lang = m_task / m_task.sum(), m_lang / m_lang.sum()
    adv = p_lang - p_task
    unit = 1.0 / L
    k = max(1, round(L / 8))
    protected = sorted(int(i) for i in np.argsort(-p_task, kind="stable")[:k])

    def best_block(order: list[int]) -> int:
        best, best_n, total = 0.0, 0, 0.0
        for n, l in enumerate(order, start=1):
            if l in protected or p_lang[l] < ELIGIBLE * unit:
                break
            total += adv[l] - LAYER_COST * unit
            if total > best + 1e-12:
                best, best_n = total, n
        return best_n

    b = best_block(list(range(L // 2)))
    u = best_block(list(range(L - 1, L - 1 - L // 2, -1)))
    while b + u >= L:  # keep at least one task layer (only possible for L <= 2)
        u, b = (u - 1, b) if u >= b else (u, b - 1)

    cap = max(1, L // 8)

    def transitions(order: Iterable[int], room: int) -> int:
        n = 0
        for l in order:
            if n >= min(cap, room) or l in protected or abs(adv[l]) >= AMBIGUOUS * unit \
                    or min(p_lang[l], p_task[l]) < SHARED * unit:
                break
            n += 1
        return n

    room = L - b - u - 1  # layers that may become transitions, keeping one task layer
    tb = transitions(range(b, L - u), room)
    tu = transitions(range(L - u - 1, b + tb - 1, -1), room - tb)
    middle = list(range(b, L - u))
    def att_share(st):
        a, m = _kind_mass(st, middle, ATTENTION_PROJECTIONS), _kind_mass(st, middle, MLP_KINDS)
        return a / (a + m) if a + m > 0 else 0.0

    share_task, share_lang = att_share(task_stats), att_share(lang_stats)
    attention_heavy = share_lang > 0 and share_lang >= ATTENTION_RATIO * share_task
    partition = "A" if attention_heavy and _preset_fits("A", L) else None
    if partition:
        tb = tu = 0

    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    lang_layers = list(range(b)) + list(range(L - u, L))
    text = ["Each expert's change is measured per layer as its share of the expert's total delta "
            "mass (sum of |expert - base|), so experts trained with different strengths compare."]
    if lang_layers:
        gain = float(adv[lang_layers].sum())
        text.append(f"The language expert changed layers {_spans(lang_layers)} most relative to the "
                    f"task expert: they hold {pct(p_lang[lang_layers].sum())} of its change but only "
                    f"{pct(p_task[lang_layers].sum())} of the task expert's (advantage "
                    f"{pct(gain)}), so bottom = {b} and top = {u} layers come from the language expert.")
    else:
        text.append("No bottom or top layers changed more in the language expert than in the task "
                    "expert (relative to each expert's total), so no layers are swapped.")
    text.append(f"The task expert's strongest layers ({_spans(protected)}, "
                f"{pct(p_task[protected].sum())} of its change) stay with the task expert.")
    if tb or tu:
        where = "next to the swapped blocks" if lang_layers else "at the bottom and top edges"
        text.append(f"{tb} bottom and {tu} top transition layer(s) {where} changed "
                    f"about equally in both experts (|advantage| < {AMBIGUOUS:g}/L), so they are "
                    "blended.")
    if partition:
        text.append(f"In the middle layers the language expert's change is attention-heavy "
                    f"({pct(share_lang)} of its attention+MLP change vs {pct(share_task)} for the "
                    f"task expert), so partition A (all attention to the language expert) is "
                    f"suggested; it replaces the layer counts above.")
    elif attention_heavy:
        text.append(f"In the middle layers the language expert's change is attention-heavy "
                    f"({pct(share_lang)} vs {pct(share_task)}), but the published partition A "
                    f"(first 6 + last 2 layers) does not fit {L} layers, so it is not suggested.")
    text.append("(This suggestion is layerswap's own heuristic over the delta statistics, not a "
                "rule from the papers.)")
    return Suggestion(int(b), int(u), int(tb), int(tu), partition, " ".join(text),
                      [float(x) for x in adv], protected)


def _preset_fits(name: str, num_layers: int) -> bool:
    """Whether a partition preset, in its published absolute layers, fits this depth."""
    try:
        Partition.preset(name, num_layers)
    except ConfigError:
        return False
    return True


# --------------------------------------------------------------------------- the story in words
THIRDS = ("bottom", "middle", "top")
EVEN_SHARE = 0.40  # no third holds more than this share of an expert's change: "spread evenly"


def _where(profile: np.ndarray) -> tuple[str, float, int, str]:
    """(third holding most of the change or "spread", its share, the peak layer, the third
    the peak layer is in)."""
    total = float(profile.sum())
    if total <= 0:
        return "spread", 0.0, 0, THIRDS[0]
    cuts = np.array_split(np.arange(len(profile)), 3)
    shares = [float(profile[c].sum()) / total for c in cuts]
    i = int(np.argmax(shares))
    peak = int(np.argmax(profile))
    peak_third = next(THIRDS[k] for k, c in enumerate(cuts) if peak in c)
    return (THIRDS[i] if shares[i] > EVEN_SHARE else "spread"), shares[i], peak, peak_third


def profile_overlap(task, lang) -> float:
    """How alike the two experts' per-layer profiles are: the sum over layers of the smaller of
    their shares of their own total change (1: the same layers, 0: disjoint layers)."""
    p, q = task.layer_profile(), lang.layer_profile()
    if p.sum() <= 0 or q.sum() <= 0:
        return 0.0
    return float(np.minimum(p / p.sum(), q / q.sum()).sum())


def delta_story(task, lang) -> str:
    """One sentence: where each expert changed most against the base and whether the two
    overlap (per-layer delta mass, ``DeltaStats.layer_profile``)."""
    def part(stats) -> str:
        where, share, peak, peak_third = _where(stats.layer_profile())
        if where == "spread":
            return (f"{stats.label} spread its change over all layers (no third holds more than "
                    f"{EVEN_SHARE:.0%}; peak layer {peak}, in the {peak_third} third)")
        if peak_third != where:   # the most-changed layer need not lie in the most-changed third
            return (f"{stats.label} changed most in the {where} third ({share:.0%}), though its "
                    f"single most-changed layer, {peak}, is in the {peak_third} third")
        return f"{stats.label} changed most in the {where} third ({share:.0%}, peak layer {peak})"

    ov = profile_overlap(task, lang)
    verdict = ("so swapping layers keeps most of both" if ov < 0.5 else
               "so a layer swap trades one expert's changes for the other's wherever it cuts")
    return f"{part(task)}; {part(lang)}; their layer profiles overlap {ov:.0%}, {verdict}."
