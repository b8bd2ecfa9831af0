"""The prompt pass of batched evaluation, shared by ``generation.generate`` (and its decoding
loop, ``decoding.refill_decode``) and ``evaluation.runner.gold_nll``: prompts that start alike are batched together (``batch_order``), their
shared prefix (the few-shot exemplars) is run once (``shared_prefix``), the rest of each prompt
in groups of similar length on top of it (``group_passes``, little compute on padding), and the
pieces are assembled into one batch KV cache that grows in place (``GrowingLayer``,
``prefill_cache``).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

from .attention import packed_attention
from .lean import LeanCache, LeanLayer
from .products import split_head

__all__ = ["MIN_SHARED_PREFIX", "PREFILL_MAX_TOKENS", "PREFILL_SLACK", "batch_order",
           "cache_classes", "common_prefix_len", "forward_kwargs", "group_passes",
           "growing_layer_class", "growing_on", "kv_layers", "layer_shapes", "own_kv",
           "plain_cache_ok", "prefill_cache", "prefill_groups", "shared_prefix"]


MIN_SHARED_PREFIX = 16   # tokens; below this a shared prefix is not worth a separate pass


def batch_order(seqs: Sequence[Sequence[int]]) -> list[int]:
    """Indices of ``seqs`` in batching order: those that start alike together (so a batch
    shares its few-shot prefix), longest first."""
    return sorted(range(len(seqs)), key=lambda i: (tuple(seqs[i][:MIN_SHARED_PREFIX]), -len(seqs[i])))


def common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix all sequences share."""
    if not seqs:
        return 0
    n = min(len(s) for s in seqs)
    first = seqs[0]
    for k in range(n):
        if any(s[k] != first[k] for s in seqs):
            return k
    return n


def forward_kwargs(model) -> dict:
    """``logits_to_keep=1`` where the model takes it: prompt passes need no logits but the last."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}


def plain_cache_ok(model) -> bool:
    """Whether this model's KV cache is a plain per-layer [batch, heads, seq, dim] store.

    Only then can caches be assembled row by row (sliding-window and hybrid caches cannot).
    """
    import inspect

    if getattr(model, "lean", False):
        return True
    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        if "position_ids" not in inspect.signature(model.forward).parameters:
            return False
        cache = DynamicCache(config=model.config)
        return all(type(layer) is DynamicLayer for layer in cache.layers)
    except (ImportError, TypeError, ValueError, AttributeError):
        return False


def kv_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """(keys, values) per layer of a plain dynamic cache, else None."""
    if isinstance(cache, LeanCache):
        plain = LeanLayer
    else:
        try:
            from transformers.cache_utils import DynamicLayer as plain
        except ImportError:
            return None
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not plain or layer.keys is None for layer in layers):
        return None
    return [(layer.keys, layer.values) for layer in layers]


def _prefix_cache(model, prefix: list[int], device):
    """KV cache of the shared prefix (batch 1), or None if this model's cache cannot be reused."""
    try:
        out = model(input_ids=torch.tensor([prefix], device=device), use_cache=True,
                    **forward_kwargs(model))
        cache = out.past_key_values
        if cache is None or not hasattr(cache, "batch_repeat_interleave"):
            return None
        return cache
    except (TypeError, ValueError, NotImplementedError, AttributeError):
        return None


def cache_classes(model) -> tuple[type, type]:
    """(cache class, its plain layer class) for ``model``'s passes: transformers'
    ``DynamicCache`` and ``DynamicLayer``, or ``lean.LeanCache`` and ``LeanLayer`` for a
    ``LeanLlama`` (whose runs never import transformers)."""
    if getattr(model, "lean", False):
        return LeanCache, LeanLayer
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    return DynamicCache, DynamicLayer


def growing_layer_class(model=None):
    """``GrowingLayer`` for ``model``'s caches (transformers' without a model)."""
    return growing_on(cache_classes(model)[1])


@functools.cache
def growing_on(base: type):
    class GrowingLayer(base):
        """A plain KV cache layer that appends in place into spare capacity.

        ``DynamicLayer`` concatenates on every step, copying the whole batch cache each time;
        with 16 rows of a few hundred tokens that copy costs more than the attention. Here
        ``keys``/``values`` are views of larger buffers; anything that replaces them (crop,
        beam reordering) is picked up and re-buffered on the next update.
        """

        def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int):
            super().__init__()
            self._kbuf, self._vbuf = keys, values
            self.keys, self.values = keys[:, :, :length], values[:, :, :length]
            self.dtype, self.device = keys.dtype, keys.device
            self.is_initialized = True

        def _rebuffer(self, capacity: int) -> None:
            length = self.keys.shape[-2]
            for name in ("keys", "values"):
                old = getattr(self, name)
                buf = old.new_empty((*old.shape[:2], capacity, old.shape[3]))
                buf[:, :, :length] = old
                setattr(self, "_kbuf" if name == "keys" else "_vbuf", buf)
                setattr(self, name, buf[:, :, :length])

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            """Keep only these rows (decoding drops finished ones), spare room included. Rows
            kept in their order move up in place (their filled columns only), else are copied."""
            length = self.keys.shape[-2]
            keep = indices.tolist()
            if (all(a < b for a, b in zip(keep, keep[1:])) and keep and keep[0] >= 0
                    and self.keys.data_ptr() == self._kbuf.data_ptr()):
                for i, j in enumerate(keep):
                    if i != j:
                        self._kbuf[i, :, :length] = self._kbuf[j, :, :length]
                        self._vbuf[i, :, :length] = self._vbuf[j, :, :length]
                self._kbuf, self._vbuf = self._kbuf[:len(keep)], self._vbuf[:len(keep)]
            else:
                self._kbuf, self._vbuf = self._kbuf[indices], self._vbuf[indices]
            self.keys, self.values = self._kbuf[:, :, :length], self._vbuf[:, :, :length]

        def update(self, key_states, value_states, *args, **kwargs):
            length, n = self.keys.shape[-2], key_states.shape[-2]
            if (self.keys.data_ptr() != self._kbuf.data_ptr()
                    or self.keys.shape[0] != self._kbuf.shape[0]
                    or length + n > self._kbuf.shape[-2]):
                self._rebuffer(2 * (length + n))
            self._kbuf[:, :, length:length + n] = key_states
            self._vbuf[:, :, length:length + n] = value_states
            self.keys = self._kbuf[:, :, :length + n]
            self.values = self._vbuf[:, :, :length + n]
            return self.keys, self.values

    return GrowingLayer


PREFILL_SLACK = 0.125      # padding a prompt-pass group may waste, as a share of its real tokens
PREFILL_MAX_TOKENS = 4096  # tokens (rows x width) in one prompt-pass group


def prefill_groups(lengths: Sequence[int], slack: float = PREFILL_SLACK,
                   max_tokens: int = PREFILL_MAX_TOKENS) -> list[list[int]]:
    """Indices of ``lengths`` (> 0 only) grouped so each group pads to its longest row
    wasting at most ``slack`` of its tokens, and holds at most ``max_tokens`` padded tokens."""
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    total = 0
    for i in order:
        n = lengths[i]   # ascending: n is the widest of the group it joins
        if groups:
            g = groups[-1]
            padded = (len(g) + 1) * n
            if padded <= (1 + slack) * (total + n) and padded <= max_tokens:
                g.append(i)
                total += n
                continue
        groups.append([i])
        total = n
    return groups


def shared_prefix(model, rows: Sequence[Sequence[int]], device, min_own: int = 1):
    """(length, KV cache) of the token prefix all ``rows`` share, leaving each row at least
    ``min_own`` tokens of its own; (0, None) when there is none worth a pass or the model's
    cache cannot be reused."""
    if len(rows) < 2:
        return 0, None
    n = min(common_prefix_len(rows), min(len(r) for r in rows) - min_own)
    if n < MIN_SHARED_PREFIX:
        return 0, None
    cache = _prefix_cache(model, list(rows[0][:n]), device)
    return (n, cache) if cache is not None else (0, None)


def group_passes(model, seqs: Sequence[Sequence[int]], n_prefix: int, prefix_kv, pad: int,
                 device, keep: Callable[[list[int]], int] | None = None):
    """Run sequences that continue a shared prefix, in groups of similar length.

    ``seqs`` are the tokens after the prefix (empty ones are skipped); ``prefix_kv`` the
    prefix's (keys, values) per layer (``kv_layers``), or [] with no prefix. Each group is laid out
    right-aligned, [padding | tokens], on top of the prefix, with positions counted from
    ``n_prefix``. ``keep(members)`` says how many last positions need logits (default 1).
    Yields (members, group width, model output); the output's cache holds the group's keys
    and values after the prefix's.
    """
    cache_cls = cache_classes(model)[0]
    fwd = forward_kwargs(model)
    for members in prefill_groups([len(s) for s in seqs]):
        gw = max(len(seqs[b]) for b in members)
        ids = torch.full((len(members), gw), pad, dtype=torch.long)
        mask = torch.zeros((len(members), n_prefix + gw), dtype=torch.long)
        mask[:, :n_prefix] = 1
        pos = torch.zeros((len(members), gw), dtype=torch.long)
        for j, b in enumerate(members):
            n = len(seqs[b])
            ids[j, gw - n:] = torch.tensor(list(seqs[b]))
            mask[j, n_prefix + gw - n:] = 1
            pos[j, gw - n:] = torch.arange(n_prefix, n_prefix + n)
        past = cache_cls(ddp_cache_data=[(k.expand(len(members), -1, -1, -1),
                                          v.expand(len(members), -1, -1, -1))
                                         for k, v in prefix_kv]) if prefix_kv else cache_cls()
        kw = dict(fwd)
        if keep is not None and kw:
            kw["logits_to_keep"] = keep(members)
        with packed_attention(model), split_head(model):
            out = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                        position_ids=pos.to(device), past_key_values=past, use_cache=True, **kw)
        yield members, gw, out


def own_kv(model, seqs: Sequence[Sequence[int]], n_prefix: int, prefix_kv, pad: int, device):
    """The keys and values of each sequence's own tokens (those after the shared prefix): per
    sequence, per layer, (keys, values) of shape [heads, len(seq), dim], copied out of the group
    passes (``group_passes``) so the rest of each pass's cache is freed. None when this model's
    cache is not a plain one."""
    result: list = [None] * len(seqs)
    for members, gw, out in group_passes(model, seqs, n_prefix, prefix_kv, pad, device):
        kv = kv_layers(out.past_key_values)
        if kv is None:
            return None
        end = n_prefix + gw
        for j, b in enumerate(members):
            m = len(seqs[b])
            result[b] = [(k[j, :, end - m:end].clone(), v[j, :, end - m:end].clone())
                         for k, v in kv]
    return [r if r is not None else [] for r in result]   # [] : no own tokens


def layer_shapes(kvs: Sequence[list], prefix_kv) -> list:
    """Per layer, a (keys, values) pair [1, heads, columns, dim] to shape a batch cache like:
    the first row's own keys and values (``own_kv``), else the shared prefix's; [] when there
    are neither."""
    return next(([(k[None], v[None]) for k, v in kv] for kv in kvs if kv), prefix_kv)


def prefill_cache(model, rows: list[list[int]], n_prefix: int, prefix, width: int, pad: int,
             device, room: int = 0):
    """KV cache of every row but its last token, laid out as [prefix | padding | own tokens].

    Rows are run in groups of similar length (``group_passes``) on top of the shared prefix,
    so the prompt pass wastes little compute on padding; the caches are then assembled into
    one batch whose last column ``generate`` runs first, with ``room`` spare columns for the
    tokens to come. Returns None when the model's cache is not a plain one (the caller then
    lets ``generate`` do a padded pass).
    """
    prefix_kv = kv_layers(prefix) if prefix is not None else []
    if prefix_kv is None:
        return None
    own = [r[n_prefix:len(r) - 1] for r in rows]     # tokens each row needs before generation
    kvs = own_kv(model, own, n_prefix, prefix_kv, pad, device)
    if kvs is None:
        return None
    like = layer_shapes(kvs, prefix_kv)
    if not like:                     # no prefix and no row has tokens before its last one
        return None
    span = width - 1                                   # cache length: all columns but the last
    assembled = [(k.new_zeros((len(rows), k.shape[1], span + room, k.shape[3])),
                  v.new_zeros((len(rows), v.shape[1], span + room, v.shape[3])))
                 for k, v in like]
    for b, kv in enumerate(kvs):
        for (k, v), (K, V) in zip(kv, assembled):
            K[b, :, span - k.shape[1]:span] = k
            V[b, :, span - v.shape[1]:span] = v
    for (K, V), pk in zip(assembled, prefix_kv):
        K[:, :, :n_prefix] = pk[0]
        V[:, :, :n_prefix] = pk[1]
    cache_cls, plain = cache_classes(model)
    grow = growing_on(plain)
    cache = cache_cls()
    cache.layers = [grow(K, V, span) for K, V in assembled]
    return cache
