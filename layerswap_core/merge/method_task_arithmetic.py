"""Task arithmetic (https://arxiv.org/abs/2212.04089), declared once: base + lambda_task *
(task - base) + lambda_lang * (lang - base) for every tensor (``task_arithmetic`` below, the
scaled deltas summed first, as mergekit does); mergekit's ``task_arithmetic`` out and in."""
from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Sequence

from . import methods
from .mergekit_parts import number, refuse, task_vectors
from .registry import Source, lambda_knob, declare_method

if TYPE_CHECKING:   # annotations only: torch is imported where it is used (start-up)
    import torch


def task_arithmetic(tensors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    import torch
    base, experts = tensors[0].float(), tensors[1:]
    # the scaled deltas summed first, then added to the base: mergekit's order of additions,
    # so a merge written as a mergekit YAML (merge/mergekit_yaml.py) gives the same bits
    total = None
    for t, lam in zip(experts, weights):
        d = t.to(torch.float32, copy=True).sub_(base).mul_(float(lam))   # lam * (t - base)
        total = d if total is None else total.add_(d)
    return base.clone() if total is None else total.add_(base)


def _to_mergekit(config, plan, paths, notes) -> dict:
    return dict(merge_method="task_arithmetic", base_model=paths["base"],
                parameters={"normalize": False},
                models=[{"model": paths["task"], "parameters": {"weight": config.lambda_task}},
                        {"model": paths["lang"], "parameters": {"weight": config.lambda_lang}}])


def _from_mergekit(doc: dict, num_layers) -> dict | None:
    """``task_arithmetic`` of two models, not sparsified: the lambdas are their weights (times
    ``lambda``, over their sum with ``normalize``)."""
    read = task_vectors(doc) if doc.get("merge_method") == "task_arithmetic" else None
    if read is None:
        return None
    task, lang, base, shared, p, w = read
    lam = number(shared, "lambda", "task_arithmetic", 1.0)
    if any(number(pp, "density", "task_arithmetic", 1.0) != 1 for pp in p):
        refuse("task_arithmetic with density < 1 (sparsified) has no layerswap counterpart")
    scale = lam / (sum(w) if shared.get("normalize", False) and abs(sum(w)) >= 1e-8 else 1)
    return dict(method="task_arithmetic", lambda_task=w[0] * scale, lambda_lang=w[1] * scale,
                task=task, lang=lang, base=base)


DECLARED = (declare_method(
    "task_arithmetic", "task arithmetic",
    knobs=(lambda_knob("lambda_task", "task arithmetic scale of the task delta (-100..100)",
                       "task arithmetic: lambda task", "lambda task"),
           lambda_knob("lambda_lang", "task arithmetic scale of the language delta (-100..100)",
                       "lambda lang", "lambda lang")),
    arithmetic=(methods.tensor_method(
        "task_arithmetic", task_arithmetic, "https://arxiv.org/abs/2212.04089",
        "base + sum(lambda_i * (t_i - base)) (the scaled deltas summed first, as mergekit does)",
        row_wise=True,
        label=lambda source: "task arithmetic " + "/".join(f"{w:g}"
                                                            for w in source.weights or ()),
        coefficients=lambda source: dict(zip(source.models[1:], source.weights))),),
    sources=lambda config, names, arch, blend: dict.fromkeys(names, Source(
        "task_arithmetic", ("base", "task", "lang"),
        (float(config.lambda_task), float(config.lambda_lang)))),
    describe=lambda config, num_layers: f"task arithmetic: lambda task {config.lambda_task:g}, "
                                        f"lang {config.lambda_lang:g}",
    needs_base=True, linear=True, to_mergekit=_to_mergekit, from_mergekit=_from_mergekit,
    mergekit_reads="task_arithmetic"),)
