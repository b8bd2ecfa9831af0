"""Attention for decoding several tokens at once over a long cache, without copying it.

Models with grouped-query attention (several query heads per key/value head, as SmolLM2 and
Llama 3) attend through transformers' ``sdpa`` function, which repeats every key and value head
for its query heads (``repeat_kv``) whenever more than one new token comes with a mask: a copy
of the whole KV cache per layer and pass. That is the case of verifying drafted tokens
(``decoding.refill_decode``) and of prompt passes on top of a shared prefix. ``packed_sdpa``
instead folds the query heads that share a key/value head into one longer query block (the
mask repeated for each), so the cache is read once and never copied. It only does so inside
``packed_attention`` (``decoding.refill_decode``'s passes, ``prefill.group_passes``);
everywhere else, and for anything it does not handle, it hands the call to transformers' own
``sdpa``. The arithmetic is the same softmax(QK^T)V per query row.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading

import torch

__all__ = ["NAME", "lean_attention", "packed_attention", "packed_sdpa", "thread_switch",
           "without_cudnn_attention"]

NAME = "layerswap_sdpa"
_local = threading.local()     # .on: packed attention asked for in this thread


def packed_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0,
                scaling=None, is_causal=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    q_len = query.shape[2]
    if (not getattr(_local, "on", False) or groups <= 1 or q_len <= 1
            or attention_mask is None or attention_mask.dim() != 4
            or attention_mask.shape[1] != 1 or dropout
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("cache") is not None or key.shape[1] * groups != query.shape[1]):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    return _folded(query, key, value, attention_mask, groups, scaling), None


def _folded(query, key, value, mask, groups: int, scaling) -> torch.Tensor:
    """Attention with the query heads of each key/value head folded into one block and the
    pass's mask repeated for them (``_pass_mask``); [batch, q_len, heads, dim], contiguous."""
    b, h, q_len, d = query.shape
    q = query.reshape(b, key.shape[1], groups * q_len, d)      # heads of one group, one block
    out = torch.nn.functional.scaled_dot_product_attention(
        q, key, value, attn_mask=_pass_mask(mask, groups, query.dtype), scale=scaling)
    return out.reshape(b, h, q_len, d).transpose(1, 2).contiguous()


def lean_attention(query, key, value, mask, groups: int, scaling: float) -> torch.Tensor:
    """Attention of ``lean.LeanLlama``: inside ``packed_attention``, ``packed_sdpa``'s folded
    query heads; elsewhere the same calls as transformers' ``sdpa_attention_forward`` (no
    dropout, no position bias, a causal decoder): the key/value heads shared through
    ``enable_gqa`` without a mask, one query token packed per key/value head, else the keys and
    values repeated per query head. Returns [batch, q_len, heads, dim], contiguous."""
    q_len = query.shape[2]
    if (getattr(_local, "on", False) and groups > 1 and q_len > 1 and mask is not None
            and mask.dim() == 4 and mask.shape[1] == 1 and key.shape[1] * groups == query.shape[1]):
        return _folded(query, key, value, mask, groups, scaling)
    kw = {}
    if groups > 1:
        if (os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA", "0") == "1"
                or (mask is None and key.shape[-1] == value.shape[-1] <= 256)):
            kw["enable_gqa"] = True
        elif q_len == 1:
            b, h, _, d = query.shape
            query = query.reshape(b, h // groups, groups, d)
        else:
            b, kvh, n, d = key.shape
            key = key[:, :, None].expand(b, kvh, groups, n, d).reshape(b, kvh * groups, n, d)
            value = value[:, :, None].expand(b, kvh, groups, n, value.shape[-1]).reshape(
                b, kvh * groups, n, value.shape[-1])
    is_causal = q_len > 1 and mask is None
    if is_causal and key.shape[2] > q_len:
        key, value = key[:, :, :q_len], value[:, :, :q_len]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=0.0, scale=scaling, is_causal=is_causal, **kw)
    out = out.reshape(out.shape[0], -1, q_len, value.shape[-1])
    return out.transpose(1, 2).contiguous()


def _pass_mask(mask: torch.Tensor, groups: int, dtype: torch.dtype) -> torch.Tensor:
    """``mask`` [b, 1, q, keys] repeated for the ``groups`` query heads folded into one block
    ([b, 1, groups * q, keys]) and, if boolean, made the additive mask that scaled-dot-product
    attention makes of it on every call (0 where a key is seen, -inf where not: the same
    attention bit for bit, ``tests/test_generation.py``). Made once per pass: every layer of a
    pass gets the same mask object, and the last one made is kept (this thread, until the
    ``packed_attention`` block ends). On SmolLM2's decoding passes (16 rows x 3 tokens, about
    500 keys) the conversion took 0.2 ms of each layer's 1.9 ms of attention."""
    kept = getattr(_local, "mask", None)
    if kept is not None and kept[0] is mask and kept[1] == groups and kept[2] == dtype:
        return kept[3]
    b, _, q_len, keys = mask.shape
    folded = mask.expand(b, groups, q_len, keys).reshape(b, 1, groups * q_len, keys)
    if folded.dtype == torch.bool:
        folded = torch.zeros(folded.shape, dtype=dtype, device=folded.device).masked_fill_(
            ~folded, float("-inf"))
    _local.mask = (mask, groups, dtype, folded)
    return folded


@functools.cache
def _register() -> bool:
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False
    AttentionInterface.register(NAME, packed_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return True


def _switch(model) -> bool:
    """Route a model that attends with transformers' ``sdpa`` through ``packed_sdpa``, which
    hands every call to ``sdpa`` unchanged outside ``packed_attention``; True if it now does."""
    if getattr(model, "lean", False):
        return True                            # lean.LeanLlama attends through lean_attention
    config = getattr(model, "config", None)
    current = getattr(config, "_attn_implementation", None)
    if current == NAME:
        return True
    if current != "sdpa" or not _register():
        return False
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError, TypeError, ImportError):
        return False
    return getattr(model.config, "_attn_implementation", None) == NAME


@contextlib.contextmanager
def thread_switch(local: threading.local, on: bool):
    """Within this block, in this thread, ``local.on`` is true if ``on`` or if it already was;
    as it was after."""
    before = getattr(local, "on", False)
    local.on = on or before
    try:
        yield
    finally:
        local.on = before


@contextlib.contextmanager
def packed_attention(model):
    """Within this block (this thread only), ``model``'s multi-token passes with a mask attend
    through ``packed_sdpa``; outside it nothing changes, bit for bit."""
    try:
        with thread_switch(_local, _switch(model)):
            yield
    finally:
        if not getattr(_local, "on", False):
            _local.mask = None                 # the outermost block ends: its pass's mask goes


class _Blocks:
    """Open ``without_cudnn_attention`` blocks, all threads together, and the setting from
    before the first one opened."""
    lock = threading.Lock()
    open = 0
    before = True


@contextlib.contextmanager
def without_cudnn_attention(device):
    """On CUDA, within this block, scaled-dot-product attention does not use cuDNN's backend
    (flash, memory-efficient and plain attention remain); elsewhere a no-op.

    In half precision PyTorch prefers cuDNN's attention on Hopper GPUs (seen in bfloat16 on an
    H200), and cuDNN makes a plan for every new shape: decoding meets a new cache length at
    every step (timings on an H200: docs/performance.md, "Inference kernels: measured
    timings"). PyTorch's switch is process-wide, so other threads' attention also goes without cuDNN while
    a block is open; blocks nest and overlap across threads, and the setting from before the
    first returns when the last closes.
    """
    if torch.device(device).type != "cuda":
        yield
        return
    with _Blocks.lock:
        if _Blocks.open == 0:
            _Blocks.before = torch.backends.cuda.cudnn_sdp_enabled()
            torch.backends.cuda.enable_cudnn_sdp(False)
        _Blocks.open += 1
    try:
        yield
    finally:
        with _Blocks.lock:
            _Blocks.open -= 1
            if _Blocks.open == 0:
                torch.backends.cuda.enable_cudnn_sdp(_Blocks.before)
