"""TIES-merging (https://arxiv.org/abs/2306.01708), declared once: each delta trimmed to its
top-density magnitudes per tensor, signs elected, the agreeing deltas averaged
(``methods.ties``, as mergekit's ``ties`` computes it); mergekit's ``ties`` out and in (the two
experts weighed alike)."""
from __future__ import annotations

from . import methods
from .mergekit_parts import number, refuse, task_vectors
from .registry import Knob, Source, lambda_knob, merge_method


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


merge_method(
    "ties", "TIES",
    knobs=(Knob("ties_density", "number", 0.2, lo=0.0, hi=1.0, lo_open=True, step=0.05,
                label="TIES density (0-1]", short="TIES density",
                note=" (the fraction of each delta kept)",
                help="TIES: fraction of each delta kept, per tensor (0 < d <= 1)"),
           lambda_knob("ties_lambda", "TIES: scale of the merged delta (-100..100)",
                       "TIES lambda", "TIES lambda")),
    arithmetic=(methods.tensor_method(
        "ties", methods.ties, "https://arxiv.org/abs/2306.01708",
        "TIES: trim each delta to its top-density magnitudes (per tensor), elect the sign of "
        "the summed deltas (a zero sum counts as positive, as in mergekit), average the deltas "
        "that agree with it (disjoint mean), base + lam * mean",
        label=lambda source: f"ties d={dict(source.args).get('density', 0.2)}",
        row_wise=True, whole_tensor=methods.ties_thresholds),),
    sources=lambda config, names, arch, blend: dict.fromkeys(names, Source(
        "ties", ("base", "task", "lang"), (1.0, 1.0),
        (("density", float(config.ties_density)), ("lam", float(config.ties_lambda))))),
    describe=lambda config, num_layers: f"TIES: density {config.ties_density:g}, "
                                        f"lambda {config.ties_lambda:g}",
    needs_base=True, to_mergekit=_to_mergekit, from_mergekit=_from_mergekit,
    mergekit_reads="ties")
