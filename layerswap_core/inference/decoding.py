"""The decoding loop of batched greedy generation (``generation.generate``): rows decode
together from one batch KV cache (``Slots``), and a row that finishes hands its place to the
next prompt (``refill_decode``), so ragged answers (chain-of-thought) keep the batch full; once
no prompt is left, finished rows leave the batch. Each pass also verifies drafted tokens (what
followed the same tokens earlier in the row: ``Drafter``), so text that repeats costs fewer
passes; the tokens kept are those of plain greedy decoding.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..progress import pause_point
from .attention import packed_attention
from .prefill import (MIN_SHARED_PREFIX, cache_classes, forward_kwargs, growing_on, layer_shapes,
                      own_kv)
from .products import split_head
from .stops import stop_tail

__all__ = ["LOOKAHEAD", "PASS_OVERHEAD_TOKENS", "Drafter", "Slots", "pass_width", "prefix_groups",
           "refill_decode"]


class Slots:
    """The decoding batch of ``refill_decode``: ``n`` rows of one KV cache (``GrowingLayer``s),
    every row laid out as [shared prefix | padding | own prompt tokens | generated], right-aligned
    at the cache's length ``L``; ``mask`` has one more column, the current token's."""

    def __init__(self, n_prefix: int, prefix_kv, capacity: int, room: int, classes: tuple):
        self.n_prefix, self.prefix_kv, self.capacity, self.room = n_prefix, prefix_kv, capacity, room
        self.cache_cls, self.grow = classes[0], growing_on(classes[1])   # ``cache_classes``
        self.cache = None
        self.mask: torch.Tensor | None = None
        self.L = 0

    def _allocate(self, like, n: int, length: int) -> None:
        grow = self.grow
        self.capacity = max(self.capacity, length + 1)
        bufs = [(k.new_zeros((n, k.shape[1], self.capacity, k.shape[3])),
                 v.new_zeros((n, v.shape[1], self.capacity, v.shape[3]))) for k, v in like]
        for (K, V), (pk, pv) in zip(bufs, self.prefix_kv):
            K[:, :, :self.n_prefix] = pk[0]
            V[:, :, :self.n_prefix] = pv[0]
        self.cache = self.cache_cls()
        self.cache.layers = [grow(K, V, length) for K, V in bufs]
        self.L = length
        self.mask = torch.zeros((n, length + 1), dtype=torch.long, device=bufs[0][0].device)
        self.mask[:, :self.n_prefix] = 1

    def relayout(self, length: int) -> None:
        """Move every row's own columns so they end at column ``length``, without holes (to
        make room for a longer prompt, or to compact the cache once it is full); the values do
        not change."""
        grow = self.grow
        # a row's own columns: those its mask keeps (drafted tokens that were not accepted
        # leave holes, ``refill_decode``), in order
        cols = [torch.nonzero(self.mask[b, self.n_prefix:self.L]).flatten() + self.n_prefix
                for b in range(self.mask.shape[0])]
        own = [len(c) for c in cols]
        self.capacity = max(self.capacity, length + self.room)
        layers = []
        for layer in self.cache.layers:
            K, V = layer.keys, layer.values
            own_k = [K[b][:, c] for b, c in enumerate(cols)]      # copies, taken first
            own_v = [V[b][:, c] for b, c in enumerate(cols)]
            if (layer._kbuf.shape[-2] >= self.capacity and K.data_ptr() == layer._kbuf.data_ptr()
                    and V.data_ptr() == layer._vbuf.data_ptr()):
                K2, V2 = layer._kbuf, layer._vbuf                  # room enough: in place
            else:
                K2 = K.new_empty((K.shape[0], K.shape[1], self.capacity, K.shape[3]))
                V2 = V.new_empty((V.shape[0], V.shape[1], self.capacity, V.shape[3]))
                K2[:, :, :self.n_prefix], V2[:, :, :self.n_prefix] = K[:, :, :self.n_prefix], \
                    V[:, :, :self.n_prefix]
            # the padding before each row's own columns is attended (masked): it must be finite;
            # columns past ``length`` are written by a pass before anything attends to them
            K2[:, :, self.n_prefix:length] = 0
            V2[:, :, self.n_prefix:length] = 0
            for b, c in enumerate(cols):
                if len(c):
                    K2[b, :, length - len(c):length] = own_k[b]
                    V2[b, :, length - len(c):length] = own_v[b]
            layers.append(grow(K2, V2, length))
        self.cache = self.cache_cls()
        self.cache.layers = layers
        mask = self.mask.new_zeros((self.mask.shape[0], length + 1))
        mask[:, :self.n_prefix] = 1
        for b, e in enumerate(own):
            mask[b, length - e:] = 1
        self.mask, self.L = mask, length

    def advance(self, step: int) -> None:
        """The cache now ends ``step`` columns further on: what a pass wrote beyond them is
        left out of every layer (and written over by the next pass)."""
        self.L += step
        for layer in self.cache.layers:
            if layer.keys.shape[-2] != self.L:
                layer.keys = layer._kbuf[:, :, :self.L]
                layer.values = layer._vbuf[:, :, :self.L]

    def admit(self, slots: Sequence[int], kvs: Sequence[list], n: int, like=None) -> bool:
        """Put rows into these batch slots (``n`` slots in all), from the keys and values of
        their own prompt tokens (all but their last; ``prefill.own_kv``). ``like``: per layer,
        keys and values to shape the first cache like (``prefill.layer_shapes``; default: the
        rows' own, else the shared prefix's). False when there is nothing to lay the cache out
        from (no shared prefix, no own tokens, no ``like``)."""
        lengths = [kv[0][0].shape[1] if kv else 0 for kv in kvs]
        need = self.n_prefix + max(lengths, default=0)
        if self.cache is not None and need > self.L:
            self.relayout(need)
        if self.cache is None:
            like = like or layer_shapes(kvs, self.prefix_kv)
            if not like:
                return False        # nothing to attend to before the first tokens: no layout
            self._allocate(like, n, need)
        for slot, kv, m in zip(slots, kvs, lengths):
            for (k, v), layer in zip(kv, self.cache.layers):
                layer.keys[slot, :, self.L - m:self.L] = k
                layer.values[slot, :, self.L - m:self.L] = v
            self.mask[slot] = 0
            self.mask[slot, :self.n_prefix] = 1
            self.mask[slot, self.L - m:] = 1
        return True


def prefix_groups(order: Sequence[int], encoded: Sequence[Sequence[int]]) -> list[list[int]]:
    """``order`` (``batch_order``) cut into runs of prompts that start alike (their first
    ``MIN_SHARED_PREFIX`` tokens), each decoded as one refilled batch over its shared prefix."""
    groups: list[list[int]] = []
    for i in order:
        if groups and encoded[groups[-1][0]][:MIN_SHARED_PREFIX] == encoded[i][:MIN_SHARED_PREFIX]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class Drafter:
    """Prompt-lookup drafts for one row: the tokens that followed the latest earlier occurrence
    of the row's last ``n`` tokens (n = 3, then 2, then 1) in its prompt and output, continued
    periodically past the end (a row that repeats itself is drafted its own loop); and how
    often this row's drafted tokens turned out right lately (``rate``)."""

    N_MAX = 3
    DECAY = 0.7          # weight of the earlier passes in ``rate`` at each new one

    def __init__(self, tokens: Sequence[int]):
        self.tokens: list[int] = []
        self.seen: list[dict] = [{} for _ in range(self.N_MAX + 1)]   # n -> {n-gram: next pos}
        self.right, self.tried = 0.0, 0.0
        for t in tokens:
            self.append(t)

    def append(self, token: int) -> None:
        end = len(self.tokens)             # the n-grams ending here are followed by ``token``
        self.tokens.append(token)
        for n in range(1, min(self.N_MAX, end) + 1):
            self.seen[n][tuple(self.tokens[end - n:end])] = end

    def draft(self, k: int) -> list[int]:
        if k < 1:
            return []
        for n in range(min(self.N_MAX, len(self.tokens)), 0, -1):
            at = self.seen[n].get(tuple(self.tokens[-n:]))
            if at is not None:
                period = len(self.tokens) - at
                return [self.tokens[at + i % period] for i in range(k)]
        return []

    @property
    def rate(self) -> float:
        """Chance that a drafted token is right given the ones before it were (geometric)."""
        return (self.right + 1) / (self.tried + 2)

    def record(self, drafted: int, kept: int) -> None:
        if drafted:
            self.right = self.DECAY * self.right + kept
            self.tried = self.DECAY * self.tried + kept + (kept < drafted)


LOOKAHEAD = 16             # most drafted tokens a row may verify in one pass (``refill_decode``)
PASS_OVERHEAD_TOKENS = 64  # a pass costs about this many tokens' worth beyond its width
                           # (measured on a 2-core CPU, SmolLM2-135M, 16 rows: a pass of width 5
                           # costs about 1.9x one of width 1, width 17 about 4.2x)


def pass_width(drafts: Sequence[Sequence[int]], rates: Sequence[float]) -> int:
    """How many tokens per row the next pass feeds (1 + drafted): the width that gives the most
    expected tokens per cost, where a row's drafted tokens hold with its ``rate`` each, in a
    row, and a pass of width w over n rows costs ``PASS_OVERHEAD_TOKENS`` + n * w."""
    longest = max((len(d) for d in drafts), default=0)
    best, best_gain = 1, 0.0
    for width in range(1, longest + 2):
        expected = 0.0
        for d, p in zip(drafts, rates):
            m = min(width - 1, len(d))
            expected += (1 - p ** (m + 1)) / (1 - p)
        gain = expected / (PASS_OVERHEAD_TOKENS + len(drafts) * width)
        if gain > best_gain:
            best, best_gain = width, gain
    return best


def refill_decode(model, tokenizer, rows: Sequence[Sequence[int]], n_slots: int, n_prefix: int,
                   prefix_kv, pad: int, device, max_new_tokens: int, eos: set[int],
                   stop: Sequence[str], calculator=None,
                   on_finish: Callable[[int], None] | None = None,
                   capacity: int | None = None, lookahead: int = 0) -> list[list[int]] | None:
    """Greedy tokens of each row (prompts sharing their first ``n_prefix`` tokens, whose KV is
    ``prefix_kv``), decoded ``n_slots`` at a time with continuous refilling: a row that
    finishes hands its place in the batch to the next prompt (its own tokens run on top of the
    shared prefix and written into the cache at the current column), so the batch stays full
    and a long answer no longer holds a whole batch of finished rows; once no prompt is left,
    finished rows leave the batch. The waiting prompts' own tokens are run up to ``n_slots``
    prompts ahead, several in one pass (``prefill.own_kv``), rather than one pass per refill.
    Each row's tokens equal its own greedy decoding (argmax of the same positions and keys);
    None when this model's cache cannot be laid out this way.
    ``capacity``: cache columns allocated at first (default: room for the longest prompt and
    twice ``max_new_tokens``); a full cache is compacted (``Slots.relayout``).

    ``lookahead`` > 0 (not with a calculator): each row also feeds up to that many drafted
    tokens (``Drafter``: what followed the same few tokens earlier in its prompt or output) in
    the same pass, and keeps every draft that equals the model's own argmax at its place plus
    the argmax after the last one kept: the tokens of plain greedy decoding, several per pass
    where the text repeats (numbers copied from the question, a looping answer). The keys and
    values of drafts that were not kept stay in the cache, masked out, until it is compacted.
    """
    if max_new_tokens < 1:
        return [[] for _ in rows]
    stop = [s for s in stop if s]
    tail = stop_tail(stop)
    fwd = forward_kwargs(model)
    if calculator is not None:
        lookahead = 0
    own = [list(r[n_prefix:len(r) - 1]) for r in rows]
    queue = list(range(len(rows)))[::-1]              # pop() -> next row, in the given order
    first = [queue.pop() for _ in range(min(n_slots, len(rows)))]
    longest = max(len(o) for o in own)
    if capacity is None:
        capacity = n_prefix + longest + 2 * max_new_tokens + 2
    slots = Slots(n_prefix, prefix_kv, capacity, room=max_new_tokens + lookahead + 2,
                   classes=cache_classes(model))
    # the own tokens' keys and values of the next prompts are computed in groups, up to
    # ``n_slots`` prompts ahead of the places they will take: one pass for several refills
    ahead: dict[int, list] = {}

    def prompt_kv(needed: Sequence[int]) -> list | None:
        missing = [i for i in needed if i not in ahead]
        if missing:
            upcoming = [i for i in reversed(queue) if i not in ahead][:n_slots]
            batch = missing + upcoming
            kvs = own_kv(model, [own[i] for i in batch], n_prefix, prefix_kv, pad, device)
            if kvs is None:
                return None
            ahead.update(zip(batch, kvs))
        return [ahead.pop(i) for i in needed]

    kvs = prompt_kv(first)
    if kvs is None:
        return None
    like = None
    if not layer_shapes(kvs, prefix_kv):
        # nothing before the rows' first tokens (no shared prefix, prompts of one token): the
        # cache is shaped like that of a pass over one pad token, and starts empty
        like = layer_shapes(own_kv(model, [[pad]], 0, [], pad, device) or [], [])
    if not slots.admit(list(range(len(first))), kvs, len(first), like):
        return None
    live = list(first)                               # batch position -> row
    cur = torch.tensor([rows[i][-1] for i in first], device=device)
    out: list[list[int]] = [[] for _ in rows]
    drafters: dict[int, Drafter] = {}
    done: set[int] = set()

    def finished_by(row: int, t: int) -> bool:
        return t in eos or len(out[row]) >= max_new_tokens or bool(stop and any(
            s in tokenizer.decode(out[row][-tail:], skip_special_tokens=False) for s in stop))

    while live:
        pause_point()   # a waiting job may take the engine between two passes (dispatch)
        drafts: list[list[int]] = [[] for _ in live]
        if lookahead:
            rates = [0.0] * len(live)
            for j, row in enumerate(live):
                if row not in done:
                    if row not in drafters:
                        drafters[row] = Drafter(rows[row])
                    room = max_new_tokens - len(out[row]) - 1
                    drafts[j] = drafters[row].draft(min(lookahead, room))
                    rates[j] = drafters[row].rate
            width = pass_width(drafts, rates)
            drafts = [d[:width - 1] for d in drafts]
        q = 1 + max(len(d) for d in drafts)
        if slots.L + q > slots.capacity:             # full: compact every row to the right
            slots.relayout(n_prefix + max(int(x) for x in
                                          slots.mask[:, n_prefix:slots.L].sum(-1).tolist()))
        pos = slots.mask.sum(-1, keepdim=True) - 1
        if q == 1:
            ids, mask = cur[:, None], slots.mask
        else:
            ids = torch.full((len(live), q), pad, dtype=torch.long, device=device)
            ids[:, 0] = cur
            fed = torch.zeros((len(live), q - 1), dtype=slots.mask.dtype, device=device)
            for j, d in enumerate(drafts):
                if d:
                    ids[j, 1:1 + len(d)] = torch.tensor(d, device=device)
                    fed[j, :len(d)] = 1
            mask = torch.cat([slots.mask, fed], 1)
            pos = pos + torch.arange(q, device=device)
        kw = dict(fwd)
        if q > 1 and kw:
            kw["logits_to_keep"] = q
        with packed_attention(model), split_head(model):
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos,
                           past_key_values=slots.cache, use_cache=True, **kw).logits[:, -q:]
        picks = logits.float().argmax(-1).tolist()
        kept = [0] * len(live)                        # drafted tokens each row keeps
        finished = []
        for j, row in enumerate(live):
            if row in done:
                finished.append(j)
                continue
            forced = calculator.next_token(out[row]) if calculator is not None else None
            t = picks[j][0] = forced if forced is not None else picks[j][0]
            out[row].append(t)
            ended = finished_by(row, t)
            d = drafts[j]
            while not ended and kept[j] < len(d) and d[kept[j]] == t:
                kept[j] += 1                           # the draft was the argmax: its pass holds
                t = picks[j][kept[j]]                  # the argmax after it
                out[row].append(t)
                ended = finished_by(row, t)
            if lookahead:
                drafter = drafters[row]
                drafter.record(len(d), kept[j])
                for token in out[row][len(drafter.tokens) - len(rows[row]):]:
                    drafter.append(token)
            picks[j] = [t]
            if ended:
                done.add(row)
                drafters.pop(row, None)
                finished.append(j)
                if on_finish is not None:
                    on_finish(len(done))
        # the cache keeps the pass's columns up to the longest run of drafts any row kept (the
        # columns after it, drafts no row kept, are written over by the next pass); a row's
        # drafts not kept within them are masked out for good
        step = 1 + max(kept)
        mask = mask[:, :slots.L + step]
        if step > 1:
            fed = mask[:, slots.L + 1:]
            for j in range(len(live)):
                fed[j, kept[j]:] = 0
        slots.advance(step)
        slots.mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], 1)
        cur = torch.tensor([p[0] for p in picks], device=device)
        if len(finished) == len(live) and not queue:
            break
        if queue and finished:                       # refill the finished rows' places
            take = finished[:len(queue)]
            new = [queue.pop() for _ in take]
            kvs = prompt_kv(new)
            if kvs is None or not slots.admit(take, kvs, len(live)):
                return None
            for j, i in zip(take, new):
                live[j] = i
                cur[j] = rows[i][-1]
            finished = finished[len(take):]
        # no prompt left: finished rows leave at once (with drafts one costs the pass's whole
        # width; measured against leaving later: docs/performance.md, "Inference kernels")
        if finished and not queue:
            gone = set(finished)
            keep = [j for j in range(len(live)) if j not in gone]
            idx = torch.tensor(keep, device=device)
            slots.cache.batch_select_indices(idx)
            slots.mask, cur = slots.mask[idx], cur[idx]
            live = [live[j] for j in keep]
    return out
