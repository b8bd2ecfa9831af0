"""Per-tensor merge methods: small pure functions, each registered ONCE with what it knows.

Every method takes the input tensors in the order of ``Source.models`` (see ``plan.py``), the
per-model weights and keyword arguments, computes in float32 and returns a float32 tensor; the
executor casts to the output dtype. Methods never open files. ``copy`` is never called for
arithmetic: the executor writes single-source tensors as they are (bit-identical). A method may
also give ``arrays``: the same arithmetic on numpy float32 arrays, bit for bit (tested), which
the disk merge on the CPU uses instead: `layerswap merge` then never imports torch (2.3 s of
start-up, more than a warm copy of a 2 GiB checkpoint takes).

A ``Method`` owns everything the other modules need to know about it: its label in a plan
(``label(source)``), whether it is row-wise (computed in row blocks, ``apply.row_blocks``), its
whole-tensor statistics (``whole_tensor``, e.g. TIES's trim thresholds) and, when it is linear in
the deltas, each model's coefficient (``coefficients(source)``, read by the LoRA path).

``copy`` and ``linear`` (the plans' copies and blends, shared by several merge methods) are
registered here. A merge method's own arithmetic (``task_arithmetic``, ``ties``) is in its file,
``method_<id>.py``, registered with the rest of that method in its one ``declare_method(...)``
declaration (``arithmetic=(tensor_method(...),)``); nothing lists methods by name elsewhere.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence

if TYPE_CHECKING:   # annotations only: torch is imported where it is used (start-up)
    import torch


@dataclass(frozen=True)
class Method:
    """One per-tensor method. ``label(source)``: its text in a plan (the figures' hover, the model
    card); ``row_wise``: its result at each position depends on the inputs at that position only
    (given ``whole_tensor``'s statistics), so it is computed in row blocks of bounded size;
    ``whole_tensor(blocks, numel, experts, **kwargs)``: the whole tensor's statistics, as extra
    keyword arguments that make the result on a row block equal those rows of the result on the
    whole tensor; ``coefficients(source)``: {model: coefficient of its delta from the base} when
    the method is linear in the deltas (None: not linear, no LoRA merge); ``shares(source)``:
    {model: its share of the tensor} where the tensor is a weighted mix of the models (a copy, a
    blend; {}: the method moves the base instead, e.g. task arithmetic), read by the figures;
    ``cell``: its short category in a plan's cells (default: its name; "blend" for linear);
    ``arrays``: ``fn`` on numpy float32 arrays (fresh copies it may overwrite), the same bits."""
    name: str
    fn: Callable[..., torch.Tensor]
    paper: str
    description: str
    label: Callable[[Any], str]
    row_wise: bool = False
    whole_tensor: Callable[..., dict] | None = None
    coefficients: Callable[[Any], dict] | None = None
    shares: Callable[[Any], dict] = lambda source: {}
    cell: str = ""   # its short category in a plan's cells (default: its name)
    arrays: Callable[..., Any] | None = None


METHODS: dict[str, Method] = {}


def tensor_method(name: str, fn: Callable[..., Any], paper: str, description: str, *,
                  label: Callable[[Any], str], row_wise: bool = False,
                  whole_tensor: Callable[..., dict] | None = None,
                  coefficients: Callable[[Any], dict] | None = None,
                  shares: Callable[[Any], dict] = lambda source: {}, cell: str = "",
                  arrays: Callable[..., Any] | None = None) -> Method:
    """One per-tensor method as a record (not registered: ``register`` or a merge method's
    declaration, ``registry.declare_method(arithmetic=...)``, brings it)."""
    return Method(name, fn, paper, description, label, row_wise, whole_tensor, coefficients,
                  shares, cell or name, arrays)


def register(name: str, paper: str, description: str, **kw):
    """Register the decorated function as the per-tensor method ``name`` (``tensor_method``)."""
    def wrap(fn):
        METHODS[name] = tensor_method(name, fn, paper, description, **kw)
        return fn
    return wrap


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown merge method {name!r}; known: {', '.join(METHODS)}")
    return METHODS[name]


def _copy_coefficients(source) -> dict:
    return {} if source.models[0] == "base" else {source.models[0]: 1.0}


@register("copy", "", "the tensor of one model, unchanged",
          label=lambda source: source.models[0], row_wise=True, coefficients=_copy_coefficients,
          shares=lambda source: {source.models[0]: 1.0})
def copy(tensors: Sequence[torch.Tensor], weights=None) -> torch.Tensor:
    (t,) = tensors
    return t


def _linear_label(source) -> str:
    if source.weights is None:
        return "blend (magnitude weights)"
    total = sum(source.weights)
    return "blend " + "/".join(f"{w / total:.2f}" for w in source.weights)


def _linear_coefficients(source) -> dict:
    total = sum(source.weights)
    return {m: w / total for m, w in zip(source.models, source.weights)}


def _linear_shares(source) -> dict:
    """The normalised weights; equal shares while magnitude weights are not resolved."""
    if source.weights is None:
        return {m: 1.0 / len(source.models) for m in source.models}
    return _linear_coefficients(source)


def _linear_total(weights: Sequence[float]) -> float:
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("linear blend: the weights sum to 0")
    return total


def linear_arrays(arrays: Sequence, weights: Sequence[float]):
    """``linear`` on fresh numpy float32 arrays (overwritten): the same float32 products
    (each weight rounded to float32, as torch does with a Python scalar), sums and division, in
    the same order, so the same bits (a product by 1, the default weights, is left out: it is
    the identity on finite values, and a block that is not finite goes to torch)."""
    import numpy as np
    total = _linear_total(weights)
    out = arrays[0]
    if weights[0] != 1:
        out *= np.float32(weights[0])
    for a, w in zip(arrays[1:], weights[1:]):
        if w != 1:
            a *= np.float32(w)
        out += a
    out /= np.float32(total)
    return out


@register("linear", "https://arxiv.org/abs/2203.05482",
          "weighted average sum(w_i * t_i) / sum(w_i) (model soup; layer-swap transition blend)",
          label=_linear_label, row_wise=True, coefficients=_linear_coefficients,
          shares=_linear_shares, cell="blend", arrays=linear_arrays)
def linear(tensors: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    import torch
    total = _linear_total(weights)
    # in place on a float32 copy of each input (a copy even when the input is float32: inputs
    # may be mapped files or the live model's own tensors): the same products and sums as
    # ``w * t.float()``, one allocation fewer per input (1.7x faster in 64 MiB blocks)
    out = tensors[0].to(torch.float32, copy=True).mul_(float(weights[0]))
    for t, w in zip(tensors[1:], weights[1:]):
        out += t.to(torch.float32, copy=True).mul_(float(w))
    return out.div_(total)


def apply(method: str, tensors: Sequence[torch.Tensor], weights, kwargs: dict | None = None) -> torch.Tensor:
    """Run one registered method (float32 result)."""
    return get_method(method).fn(tensors, weights, **(kwargs or {}))


# --------------------------------------------------------------------------- magnitude weights
def row_mean_abs_delta(tensor: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Each row's mean |tensor - base| in float32 (a 1-D tensor is one row)."""
    d = (tensor.float() - base.float()).abs()
    return d.reshape(1, -1).mean(dim=1) if d.dim() == 1 else d.mean(dim=1)


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
        self.add_row_means(expert, row_mean_abs_delta(tensor, base))

    def add_row_means(self, expert: str, row_means: torch.Tensor):
        """Add one tensor's row means (``row_mean_abs_delta``, all its rows at once)."""
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
