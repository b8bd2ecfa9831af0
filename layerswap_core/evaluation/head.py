"""The output layer (LM head) taken a block of vocabulary rows at a time, on CPU.

Every decoding step multiplies a few hidden states by the output layer: a 49,152 x 576 matrix
for SmolLM2-135M (113 MB in float32), 262,144 x 640 for Gemma-3-270M (671 MB). On a CPU,
torch's product of so few rows by so tall a matrix runs far below the rate the same kernel
reaches on the model's other layers, and its second thread barely helps (measured on this
project's 2-core AMD EPYC, 32 rows: 30 GFLOPS for the whole SmolLM2 head against about 70 for
the 1536 x 576 MLP matrices). Taken ``BLOCK`` weight rows at a time it runs faster: the Gemma
head at 16 rows in 113 ms instead of 197 ms. Each logit is still the dot product of the same
hidden state and weight row; ``tests/test_generation.py`` checks that the logits are equal bit
for bit on the embedded model.

``split_head(model)`` turns it on for the forward passes inside the block, in this thread only
(the decoding passes of ``generation``, its calls to transformers' ``generate``, and
``prefill.group_passes``); everywhere else the layer runs ``torch.nn.Linear.forward``
unchanged. Only a plain float32 ``nn.Linear`` head on the CPU is split: on a GPU one product is
already the fast way.
"""
from __future__ import annotations

import threading

import torch

from .attention import thread_switch

BLOCK = 2048            # vocabulary rows per product
_local = threading.local()   # .on: split products asked for in this thread


class SplitLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose products are split by ``BLOCK`` output rows inside
    ``split_head`` (this thread), and are ``nn.Linear``'s own everywhere else. A head becomes
    one by a change of class only: same parameters, state dict, pickling and copies."""

    def forward(self, x):
        w = self.weight
        if (not getattr(_local, "on", False) or w.device.type != "cpu"
                or w.dtype != torch.float32 or w.shape[0] < 2 * BLOCK):
            return super().forward(x)
        b = self.bias
        return torch.cat([torch.nn.functional.linear(x, w[i:i + BLOCK],
                                                     None if b is None else b[i:i + BLOCK])
                          for i in range(0, w.shape[0], BLOCK)], -1)


def _switch(model) -> bool:
    """Make ``model``'s output layer a ``SplitLinear`` if it is a plain ``nn.Linear`` (not a
    subclass, a LoRA wrapper, a layer with hooks that replace its forward); True if it is one
    now."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if type(head) is SplitLinear:
        return True
    if type(head) is not torch.nn.Linear or "forward" in head.__dict__:
        return False
    head.__class__ = SplitLinear
    return True


def split_head(model):
    """Within this block (this thread only), ``model``'s output layer on the CPU computes its
    logits ``BLOCK`` vocabulary rows at a time; outside it nothing changes."""
    return thread_switch(_local, _switch(model))
