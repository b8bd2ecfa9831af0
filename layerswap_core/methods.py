"""Per-tensor merge methods: small pure functions, registered by name with their paper.

Every method takes the input tensors in the order of ``Source.models`` (see ``plan.py``), the
per-model weights and keyword arguments, computes in float32 and returns a float32 tensor; the
executor casts to the output dtype. Methods never open files. ``copy`` is never called for
arithmetic: the executor writes single-source tensors as they are (bit-identical).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch


@dataclass(frozen=True)
class Method:
    name: str
    fn: Callable[..., torch.Tensor]
    paper: str
    description: str


METHODS: dict[str, Method] = {}


def register(name: str, paper: str, description: str):
    def wrap(fn):
        METHODS[name] = Method(name, fn, paper, description)
        return fn
    return wrap


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown merge method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]


@register("copy", "", "the tensor of one model, unchanged")
def copy(tensors: Sequence[torch.Tensor], weights=None) -> torch.Tensor:
    (t,) = tensors
    return t


@register("linear", "https://arxiv.org/abs/2203.05482",
          "weighted average sum(w_i * t_i) / sum(w_i) (model soup; layer-swap transition blend)")
def linear(tensors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("linear blend: the weights sum to 0")
    out = float(weights[0]) * tensors[0].float()
    for t, w in zip(tensors[1:], weights[1:]):
        out += float(w) * t.float()
    return out.div_(total)


@register("task_arithmetic", "https://arxiv.org/abs/2212.04089",
          "base + sum(lambda_i * (t_i - base))")
def task_arithmetic(tensors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    base, experts = tensors[0].float(), tensors[1:]
    out = base.clone()
    for t, lam in zip(experts, weights):
        out += float(lam) * (t.float() - base)
    return out


def trim(delta: torch.Tensor, density: float) -> torch.Tensor:
    """Zero all but the largest-magnitude entries: keep |delta| >= the k-th largest |delta|,
    k = int(density * n) (at least 1). Entries tied with the k-th are all kept (deterministic)."""
    if density >= 1:
        return delta
    mags = delta.abs().reshape(-1)
    k = max(1, int(density * mags.numel()))
    threshold = mags.kthvalue(mags.numel() - k + 1).values
    return delta * (delta.abs() >= threshold)


@register("ties", "https://arxiv.org/abs/2306.01708",
          "TIES: trim each delta to its top-density magnitudes, elect the sign of the summed "
          "deltas, average the deltas that agree with it (disjoint mean), base + lam * mean")
def ties(tensors: Sequence[torch.Tensor], weights: Sequence[float] | None = None, *,
         density: float = 0.2, lam: float = 1.0) -> torch.Tensor:
    base = tensors[0].float()
    weights = weights or [1.0] * (len(tensors) - 1)
    deltas = torch.stack([float(w) * trim(t.float() - base, density)
                          for t, w in zip(tensors[1:], weights)])
    sign = torch.sign(deltas.sum(dim=0))
    agree = (torch.sign(deltas) == sign) & (deltas != 0)
    count = agree.sum(dim=0).clamp_min(1)
    merged = (deltas * agree).sum(dim=0) / count
    return base + float(lam) * merged


def apply(method: str, tensors: Sequence[torch.Tensor], weights, kwargs: dict | None = None) -> torch.Tensor:
    """Run one registered method (float32 result)."""
    return get_method(method).fn(tensors, weights, **(kwargs or {}))


# --------------------------------------------------------------------------- magnitude weights
class MagnitudeAccumulator:
    """Streaming mean row-wise mean-absolute delta from the base, per expert.

    For every 1-D/2-D parameter, each row's mean |expert - base| (a 1-D parameter is one row) is
    added; the expert's magnitude is the mean over all those rows. The magnitude-adjusted weight
    of an expert is the inverse of its magnitude (experts that moved less weigh more).
    """

    def __init__(self, experts: Sequence[str] = ("task", "lang")):
        self.sums = {e: 0.0 for e in experts}
        self.rows = {e: 0 for e in experts}

    @staticmethod
    def eligible(shape) -> bool:
        return len(shape) in (1, 2)

    def add(self, expert: str, tensor: torch.Tensor, base: torch.Tensor):
        if not self.eligible(tensor.shape):
            return
        d = (tensor.float() - base.float()).abs()
        row_means = d.reshape(1, -1).mean(dim=1) if d.dim() == 1 else d.mean(dim=1)
        self.sums[expert] += float(row_means.double().sum())
        self.rows[expert] += row_means.numel()

    def magnitudes(self) -> dict[str, float]:
        return {e: self.sums[e] / self.rows[e] if self.rows[e] else 0.0 for e in self.sums}

    def weights(self) -> tuple[float, ...]:
        mags = self.magnitudes()
        for e, m in mags.items():
            if m <= 0:
                raise ValueError(f"magnitude-adjusted weights: the {e} expert does not differ from the "
                                 "base (mean delta 0), so its inverse weight is undefined")
        return tuple(1.0 / mags[e] for e in self.sums)
