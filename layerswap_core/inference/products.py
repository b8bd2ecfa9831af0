"""The matrix products of generation on the CPU: the output layer a block of rows at a time,
and the linear layers' weights prepacked for oneDNN.

Every decoding step multiplies a few hidden states (one row per token fed) by each weight
matrix. At so few rows torch's default CPU product (MKL's) runs well below its rate on long
prompt passes. Two things help, each inside a ``with`` block, in that thread only; everywhere
else a layer runs ``torch.nn.Linear.forward`` unchanged:

- ``split_head(model)``: the output layer (49,152 x 576 for SmolLM2-135M, 113 MB in float32;
  262,144 x 640 for Gemma-3-270M) takes ``BLOCK`` weight rows at a time. Each logit is still the
  dot product of the same hidden state and weight row: equal bit for bit to the whole product
  (``tests/test_generation.py``).
- ``packed_products(model)``: the linear layers' weights are copied once, for the block, into
  oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``), and products of at
  most ``PACKED_ROWS`` rows run on that copy (``_linear_pointwise``). These products sum in
  another order than MKL's, so logits differ in the last bits (up to about 1.2e-4 on logits up
  to 28; MKL's own move by up to 4e-5 when a pass feeds 4 tokens a row instead of 3); the
  greedy text is
  checked against plain products in ``tests/test_generation.py`` and against lm-eval's own
  command item by item in ``bench/eval_vs_lmeval.py``. A layer's projections that read the same
  input (its query, key and value projections; its gate and up projections:
  ``architectures.SHARED_INPUT_KINDS``) are packed as one stacked weight, and the first of them
  called computes all their products in one (``_Stacked``): each column is the same dot product,
  equal bit for bit to the layer's own packed product. The copy costs memory while the block
  runs: at most ``PACKED_BYTES``, and a quarter of the memory available; the output layer is
  packed first, then the other layers in order while they fit. Longer products (prompt passes) keep MKL's,
  which is as fast there.

Only plain float32 ``nn.Linear`` layers on the CPU change (by a change of class to
``CpuLinear``: same parameters, state dict, pickling and copies). On a GPU one product is
already the fast way. What each buys, measured: docs/performance.md, "Inference kernels:
measured timings".
"""
from __future__ import annotations

import contextlib
import threading

import torch

from ..checkpoints.architectures import SHARED_INPUT_KINDS, get_architecture
from ..memory import memory_available
from .attention import thread_switch

__all__ = ["BLOCK", "PACKED_BYTES", "PACKED_ROWS", "CpuLinear", "packed_products", "split_head"]

BLOCK = 2048             # vocabulary rows per product of the split head
PACKED_ROWS = 256        # most rows (tokens) a product on prepacked weights takes
PACKED_BYTES = 1 << 30   # most bytes of prepacked weights held at once (a copy, for the block)
_PACK_HINT = 32          # the rows oneDNN lays the weights out for (decoding passes: 16-64)
_local = threading.local()   # .on: split head; .packed: {layer: prepacked weight}
_packing = {"ok": None}  # None: not tried in this process; then whether packing works here


class CpuLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose products use this layer's prepacked weight inside
    ``packed_products`` and are split by ``BLOCK`` output rows inside ``split_head`` (this
    thread), and are ``nn.Linear``'s own everywhere else. A layer becomes one by a change of
    class only: same parameters, state dict, pickling and copies."""

    def forward(self, x):
        packed = getattr(_local, "packed", None)
        if packed:
            p = packed.get(self)
            if p is not None and x.numel() <= PACKED_ROWS * self.in_features:
                if type(p) is _Stacked:
                    return p.product(self, x)
                return torch.ops.mkldnn._linear_pointwise(x.contiguous(), p, self.bias,
                                                          "none", [], "")
        w = self.weight
        if (not getattr(_local, "on", False) or w.device.type != "cpu"
                or w.dtype != torch.float32 or w.shape[0] < 2 * BLOCK):
            return super().forward(x)
        b = self.bias
        return torch.cat([torch.nn.functional.linear(x, w[i:i + BLOCK],
                                                     None if b is None else b[i:i + BLOCK])
                          for i in range(0, w.shape[0], BLOCK)], -1)


class _Stacked:
    """Layers that read the same input, their weights stacked (in ``layers``' order) and
    packed as one: the first of them called with an input computes all their products in one,
    and each takes its own columns; the others, called with that same input (the same tensor
    object, held until they all have taken theirs), take theirs without computing. Belongs to
    one ``packed_products`` block, in one thread."""

    def __init__(self, layers: list, packed, bias):
        self.packed, self.bias = packed, bias
        self.columns, start = {}, 0
        for layer in layers:
            self.columns[layer] = (start, start + layer.out_features)
            start += layer.out_features
        self.last = None       # [input, product, the layers still to take their columns]

    def product(self, layer, x):
        last = self.last
        if last is None or last[0] is not x or layer not in last[2]:
            last = self.last = [x, torch.ops.mkldnn._linear_pointwise(
                x.contiguous(), self.packed, self.bias, "none", [], ""), set(self.columns)]
        last[2].discard(layer)
        if not last[2]:
            self.last = None                 # all served: the input and product are let go
        a, b = self.columns[layer]
        return last[1][..., a:b]


def _plain(layer) -> bool:
    """A plain ``nn.Linear`` or already a ``CpuLinear`` (not another subclass, a LoRA wrapper,
    a layer whose forward was replaced)."""
    return type(layer) in (torch.nn.Linear, CpuLinear) and "forward" not in layer.__dict__


def _as_cpu_linear(layer) -> bool:
    """Make ``layer`` a ``CpuLinear`` if it is plain; True if it is one now."""
    if not _plain(layer):
        return False
    layer.__class__ = CpuLinear
    return True


def _output_layer(model):
    get = getattr(model, "get_output_embeddings", None)
    return get() if callable(get) else None


def _switch(model) -> bool:
    """Make ``model``'s output layer a ``CpuLinear``; True if it is one now."""
    head = _output_layer(model)
    return head is not None and _as_cpu_linear(head)


def split_head(model):
    """Within this block (this thread only), ``model``'s output layer on the CPU computes its
    logits ``BLOCK`` vocabulary rows at a time; outside it nothing changes."""
    return thread_switch(_local, _switch(model))


def _pack(weight: torch.Tensor):
    """``weight`` in oneDNN's layout; None where that does not work here (checked once per
    process against torch's own product)."""
    if _packing["ok"] is False:
        return None
    try:
        p = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_HINT)
        if _packing["ok"] is None:
            x = torch.randn(3, weight.shape[1], generator=torch.Generator().manual_seed(0))
            _packing["ok"] = bool(torch.allclose(
                torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""),
                torch.nn.functional.linear(x, weight), rtol=1e-4, atol=1e-4))
        return p if _packing["ok"] else None
    except (RuntimeError, AttributeError, NotImplementedError):
        _packing["ok"] = False
        return None


def _packable(model) -> list[list]:
    """``model``'s plain float32 linear layers on the CPU, the output layer first, in lists of
    one, or of several that read the same input (``architectures.SHARED_INPUT_KINDS``: one
    decoder layer's query, key and value projections, and its gate and up projections) and can
    be stacked: all of the group found, the same input width, all with biases or none."""
    if not torch.backends.mkldnn.is_available():
        return []
    head = _output_layer(model)
    fit = [m for m in [head] + [m for m in model.modules() if m is not head]
           if _plain(m) and m.weight.device.type == "cpu" and m.weight.dtype == torch.float32]
    stacks = _shared_inputs(model, set(fit))
    out, seen = [], set()
    for m in fit:
        if m not in seen:
            group = stacks.get(m, [m])
            seen.update(group)
            out.append(group)
    return out


def _shared_inputs(model, fit: set) -> dict:
    """Each layer of ``fit`` that can be stacked -> its group (``_packable``)."""
    config = getattr(model, "config", None)
    try:
        arch = get_architecture(config.to_dict())
    except (AttributeError, ValueError):
        return {}
    found: dict = {}                               # (layer, parent, group) -> {kind: module}
    for name, m in model.named_modules():
        if m not in fit:
            continue
        info = arch.classify(name + ".weight")
        for g, kinds in enumerate(SHARED_INPUT_KINDS):
            if info.layer is not None and info.kind in kinds:
                found.setdefault((info.layer, name.rpartition(".")[0], g), {})[info.kind] = m
    stacks: dict = {}
    for (_, _, g), members in found.items():
        group = [members[k] for k in SHARED_INPUT_KINDS[g] if k in members]
        if (len(group) == len(SHARED_INPUT_KINDS[g])
                and len({m.in_features for m in group}) == 1
                and len({m.bias is None for m in group}) == 1):
            stacks.update({m: group for m in group})
    return stacks


@contextlib.contextmanager
def packed_products(model, budget: int | None = None):
    """Within this block (this thread only), products of at most ``PACKED_ROWS`` rows by
    ``model``'s float32 linear layers on the CPU run on a prepacked copy of their weights
    (the output layer first, then the others while ``budget`` bytes last: by default
    ``PACKED_BYTES`` or a quarter of the available memory, the smaller); outside it nothing
    changes. Yields how many layers were packed."""
    if getattr(_local, "packed", None):
        yield len(_local.packed)
        return
    if budget is None:
        available = memory_available()
        budget = PACKED_BYTES if available is None else min(PACKED_BYTES, available // 4)
    packed: dict = {}
    with torch.no_grad():
        for group in _packable(model):
            size = sum(m.weight.numel() * m.weight.element_size() for m in group)
            if size > budget:
                continue
            weight = (group[0].weight if len(group) == 1
                      else torch.cat([m.weight for m in group]))
            p = _pack(weight.detach())
            if p is None:
                break
            if len(group) > 1:
                p = _Stacked(group, p, None if group[0].bias is None
                             else torch.cat([m.bias for m in group]).detach())
            for layer in group:
                _as_cpu_linear(layer)
                packed[layer] = p
            budget -= size
    _local.packed = packed
    try:
        yield len(packed)
    finally:
        _local.packed = None
