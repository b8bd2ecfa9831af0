"""TIES-merging (https://arxiv.org/abs/2306.01708), declared once: each delta trimmed to its
top-density magnitudes per tensor, signs elected, the agreeing deltas averaged
(``ties`` below, as mergekit's ``ties`` computes it, with its whole-tensor trim thresholds); mergekit's ``ties`` out and in (the two
experts weighed alike)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING
from collections.abc import Callable, Iterable, Sequence

from . import methods
from .mergekit_parts import number, refuse, task_vectors
from .registry import Knob, Source, lambda_knob, declare_method

if TYPE_CHECKING:   # annotations only: torch is imported where it is used (start-up)
    import torch


def trim_threshold(delta: torch.Tensor, density: float) -> torch.Tensor | None:
    """The magnitude ``trim`` keeps ``delta``'s entries at or above: the k-th largest |delta| of
    the WHOLE tensor, k = int(density * n) (at least 1); None when density >= 1 (nothing trimmed).
    Computed once per tensor, so that the trim can then be applied to row blocks."""
    if density >= 1:
        return None
    return kth_largest(delta.abs().reshape(-1), density)


def kth_largest(mags: torch.Tensor, density: float) -> torch.Tensor:
    """The k-th largest value of the flat ``mags``, k = int(density * n) (at least 1)."""
    k = max(1, int(density * mags.numel()))
    return mags.kthvalue(mags.numel() - k + 1).values


def trim(delta: torch.Tensor, density: float, threshold: torch.Tensor | None = None) -> torch.Tensor:
    """Zero all but the largest-magnitude entries of ONE tensor (trimming is per tensor, as in
    mergekit): keep |delta| >= the k-th largest |delta|, k = int(density * n) (at least 1).
    Entries tied with the k-th are all kept (deterministic; mergekit keeps exactly k).
    ``threshold``: that k-th value when ``delta`` is a row block of the tensor (``trim_threshold``
    of the whole delta); computed from ``delta`` itself when not given."""
    if density >= 1:
        return delta
    if threshold is None:
        threshold = trim_threshold(delta, density)
    return delta * (delta.abs() >= threshold)


def check_ties_args(density: float, lam: float):
    """ValueError unless 0 < density <= 1 and lam is finite."""
    if isinstance(density, bool) or not isinstance(density, (int, float)) or \
            not 0 < density <= 1:
        raise ValueError(f"TIES density must be in (0, 1], got {density!r}")
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam):
        raise ValueError(f"TIES lambda must be a finite number, got {lam!r}")


def ties(tensors: Sequence[torch.Tensor], weights: Sequence[float] | None = None, *,
         density: float = 0.2, lam: float = 1.0,
         thresholds: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
    """TIES-merging of one tensor, as mergekit's ``ties`` computes it (consensus "sum").

    Each expert's delta from the base is trimmed within this tensor (``trim``), times its weight;
    the elected sign is that of the summed deltas, with a sum of exactly 0 counting as positive
    (mergekit: ``(sum >= 0) * 2 - 1``); the merged delta is the weighted mean of the nonzero
    deltas of the elected sign (divided by the sum of their weights; 0 where none agrees).
    """
    import torch
    check_ties_args(density, lam)
    base = tensors[0].float()
    weights = list(weights or [1.0] * (len(tensors) - 1))
    thresholds = list(thresholds or [None] * (len(tensors) - 1))
    deltas = torch.stack([float(w) * trim(t.float() - base, density, thr)
                          for t, w, thr in zip(tensors[1:], weights, thresholds)])
    elected = torch.where(deltas.sum(dim=0) >= 0, 1.0, -1.0)
    agree = torch.sign(deltas) == elected  # a zero delta has sign 0: never agrees
    w = torch.tensor(weights, dtype=torch.float32, device=base.device)
    w = w.reshape(-1, *[1] * base.dim())
    divisor = (w * agree).sum(dim=0)
    divisor[divisor == 0] = 1
    merged = (deltas * agree).sum(dim=0) / divisor
    return base + float(lam) * merged


def ties_thresholds(blocks: Callable[[], Iterable[Sequence[torch.Tensor]]], numel: int,
                    experts: int, density: float = 0.2, **_) -> dict:
    """{"thresholds": each expert's trim threshold over the WHOLE tensor} (``trim_threshold``).

    ``blocks()`` yields the inputs (base first) of each row block of the tensor, in order; the
    magnitudes |expert - base| of one expert at a time are gathered in one float32 buffer (the
    size of the tensor), so no other whole-tensor copy is held."""
    import torch
    if density >= 1 or numel == 0:
        return {}
    thresholds = []
    for k in range(1, experts + 1):
        mags, pos = None, 0
        for part in blocks():
            d = (part[k].float() - part[0].float()).abs().reshape(-1)
            if mags is None:
                mags = torch.empty(numel, dtype=torch.float32, device=d.device)
            mags[pos:pos + d.numel()] = d
            pos += d.numel()
        thresholds.append(kth_largest(mags, density))
        del mags
    return {"thresholds": thresholds}


def _to_mergekit(config, plan, paths, notes) -> dict:
    if config.ties_density < 1:
        notes.append("TIES: an entry whose |delta| ties with its tensor's trim threshold is "
                     "kept by layerswap (all tied entries), by mergekit only within exactly k "
                     "= int(density * n) entries: such entries can differ, all others are "
                     "bit-identical")
    return dict(merge_method="ties", base_model=paths["base"],
                parameters={"normalize": True, "lambda": config.ties_lambda},
                models=[{"model": paths[r], "parameters": {"weight": 1.0,
                                                           "density": config.ties_density}}
                        for r in ("task", "lang")])


def _from_mergekit(doc: dict, num_layers) -> dict | None:
    """``ties`` of two models of one weight and density, normalized."""
    read = task_vectors(doc) if doc.get("merge_method") == "ties" else None
    if read is None:
        return None
    task, lang, base, shared, p, w = read
    lam = number(shared, "lambda", "ties", 1.0)
    d = [number(pp, "density", "ties", 1.0) for pp in p]
    if d[0] != d[1] or w[0] != w[1] or w[0] <= 0:
        refuse("ties with different weights or densities per model: layerswap's TIES weighs the "
               "two experts alike")
    if not shared.get("normalize", True):
        refuse("ties with normalize: false has no layerswap counterpart")
    return dict(method="ties", ties_density=d[0], ties_lambda=lam, task=task, lang=lang,
                base=base)


DECLARED = (declare_method(
    "ties", "TIES",
    knobs=(Knob("ties_density", "number", 0.2, lo=0.0, hi=1.0, lo_open=True, step=0.05,
                label="TIES density (0-1]", short="TIES density",
                note=" (the fraction of each delta kept)",
                help="TIES: fraction of each delta kept, per tensor (0 < d <= 1)"),
           lambda_knob("ties_lambda", "TIES: scale of the merged delta (-100..100)",
                       "TIES lambda", "TIES lambda")),
    arithmetic=(methods.tensor_method(
        "ties", ties, "https://arxiv.org/abs/2306.01708",
        "TIES: trim each delta to its top-density magnitudes (per tensor), elect the sign of "
        "the summed deltas (a zero sum counts as positive, as in mergekit), average the deltas "
        "that agree with it (disjoint mean), base + lam * mean",
        label=lambda source: f"ties d={dict(source.args).get('density', 0.2)}",
        row_wise=True, whole_tensor=ties_thresholds),),
    sources=lambda config, names, arch, blend: dict.fromkeys(names, Source(
        "ties", ("base", "task", "lang"), (1.0, 1.0),
        (("density", float(config.ties_density)), ("lam", float(config.ties_lambda))))),
    describe=lambda config, num_layers: f"TIES: density {config.ties_density:g}, "
                                        f"lambda {config.ties_lambda:g}",
    needs_base=True, to_mergekit=_to_mergekit, from_mergekit=_from_mergekit,
    mergekit_reads="ties",
    mergekit_fused_experts="mergekit trims each layer's fused tensor of all its experts, "
                           "layerswap each expert's own tensor"),)
