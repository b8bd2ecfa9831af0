"""Text generation: batched greedy decoding for evaluation, streaming and chat for the UI.

Batched generation (``generate``) is built for few-shot evaluation, where reading the prompts
costs more than writing short answers: the prompt pass (``prefill``) runs the few-shot prefix
that prompts share once and the rest of each prompt in groups of similar length on top of it,
into one batch KV cache that grows in place. Rows then decode greedily together
(``_refill_decode``): a row that finishes hands its place in the batch to the next prompt, so
ragged answers (chain-of-thought) keep the batch full instead of waiting for the longest one;
once no prompt is left, finished rows leave the batch. Each pass also verifies drafted tokens
(what followed the same tokens earlier in the row: ``_Drafter``), so text that repeats costs
fewer passes; the tokens kept are those of plain greedy decoding. Models whose
generation_config asks for more than an argmax decode through transformers' ``generate``.
Each output is cut at its first stop string. The text equals transformers' own one-prompt-at-a-time greedy output
(tests/test_generation.py checks it).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from collections.abc import Callable, Iterator, Sequence

import torch

from ..checkpoints.tokenizers import encode_prompt
from ..progress import Progress
from .attention import packed_attention, without_cudnn_attention
from .calculator import Calculator
from .products import packed_products, split_head
from .prompts import chat_stop, render_chat


@dataclass
class Generation:
    text: str          # the continuation, cut before the first stop string
    num_tokens: int    # tokens generated up to the stop (or EOS, or the limit)
    stopped: bool      # ended by a stop string or EOS rather than by max_new_tokens


def _pad_id(tokenizer) -> int:
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0


def _eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the earliest stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def _stop_tail(stop: Sequence[str]) -> int:
    """How many last tokens to decode to see any stop string (a token holds >= 1 char or byte)."""
    return 4 * max((len(s) for s in stop), default=0) + 4


class _StopOnStrings:
    """Stopping criterion: a row is done once the text of its last few tokens holds a stop string.

    (transformers' own ``stop_strings`` rebuilds a table over the whole vocabulary on every
    call, ~0.7 s per string on a small CPU; decoding a short tail per step is much cheaper.)
    """

    def __init__(self, tokenizer, stop: Sequence[str], prompt_width: int):
        self.tokenizer, self.stop, self.start = tokenizer, list(stop), prompt_width
        self.tail = _stop_tail(self.stop)
        self.stopped_at: dict[int, int] = {}   # row -> new tokens when its stop string appeared

    def __call__(self, input_ids, scores, **kw):
        new = input_ids[:, self.start:][:, -self.tail:]
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=False)
        hits = [any(s in t for s in self.stop) for t in texts]
        for row, hit in enumerate(hits):
            if hit and row not in self.stopped_at:
                self.stopped_at[row] = input_ids.shape[1] - self.start
        return torch.tensor(hits, dtype=torch.bool, device=input_ids.device)


def _greedy_kwargs(model, tokenizer, max_new_tokens: int, stop: Sequence[str],
                   prompt_width: int, extra=(), calculator=None) -> dict:
    """``model.generate`` keywords: greedy, the stop strings, and the calculator if given."""
    from transformers import LogitsProcessorList, StoppingCriteriaList

    criteria = list(extra)
    stop = [s for s in stop if s]
    if stop:
        criteria.append(_StopOnStrings(tokenizer, stop, prompt_width))
    kw = dict(max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None,
              top_k=None, pad_token_id=_pad_id(tokenizer), eos_token_id=_eos_ids(model, tokenizer),
              stopping_criteria=StoppingCriteriaList(criteria))
    if calculator is not None:
        kw["logits_processor"] = LogitsProcessorList([calculator.logits_processor(prompt_width)])
    return kw


from .lean import plain_argmax  # noqa: E402 - after the helpers prefill imports from here
from .prefill import (  # noqa: E402
    MIN_SHARED_PREFIX, _forward_kwargs, _growing_on, _kv, cache_classes, _plain_cache_ok, _prefill,
    batch_order, layer_shapes, own_kv, shared_prefix)


def _plain_greedy_ok(model) -> bool:
    """Whether greedy decoding of this model is a plain argmax (nothing in its
    generation_config would change the picked tokens)."""
    return plain_argmax(getattr(model, "generation_config", None))


DROP_FINISHED = 0.25   # drop finished rows from the batch once they are this share of it
ARGMAX_BLOCK = 1024    # vocabulary entries per block of ``_argmax``


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(-1)``, the first of equal maxima, found faster on the CPU: the maximum of
    each block of ``ARGMAX_BLOCK`` entries (a vectorized reduction), then the argmax within the
    first block that holds the row's maximum. torch's own argmax compares one entry at a time:
    16 x 3 rows of SmolLM2's 49,152 logits took 2.3 ms, this 0.44 ms (2026-11-27). Elsewhere,
    for a vocabulary that is not a whole number of blocks, and where a row holds NaN: torch's
    own."""
    v = logits.shape[-1]
    if logits.device.type != "cpu" or v % ARGMAX_BLOCK or v < 4 * ARGMAX_BLOCK:
        return logits.argmax(-1)
    blocks = logits.unflatten(-1, (v // ARGMAX_BLOCK, ARGMAX_BLOCK))
    block_max = blocks.amax(-1)
    top = block_max.amax(-1, keepdim=True)
    if torch.isnan(top).any():
        return logits.argmax(-1)
    first = (block_max == top).to(torch.uint8).argmax(-1)      # the first block with the max
    inside = blocks.gather(-2, first[..., None, None].expand(*first.shape, 1, ARGMAX_BLOCK))
    return first * ARGMAX_BLOCK + inside.squeeze(-2).argmax(-1)


def _greedy_decode(model, tokenizer, cache, ids: torch.Tensor, mask: torch.Tensor,
                   max_new_tokens: int, eos: set[int], stop: Sequence[str],
                   calculator=None, each_token=None) -> list[list[int]]:
    """Greedy tokens of each row (up to and including the EOS or the token that completed a
    stop string), from a cache holding all but the last column of ``ids``.

    The same argmax as transformers' greedy ``generate``, but rows that have finished leave
    the batch (once they are a quarter of it), so ragged outputs (chain-of-thought) stop
    paying for the longest one. ``each_token(k)`` is called after the k-th token (a progress
    report: Cancel stops a long batch between two tokens).
    """
    stop = [s for s in stop if s]
    tail = _stop_tail(stop)
    fwd = _forward_kwargs(model)
    out: list[list[int]] = [[] for _ in range(ids.shape[0])]
    live = list(range(ids.shape[0]))      # batch position -> row
    done: set[int] = set()
    cur, mask = ids[:, -1:], mask
    for k in range(max_new_tokens):
        if each_token is not None and k:
            each_token(k)
        pos = mask.sum(-1, keepdim=True) - 1
        logits = model(input_ids=cur, attention_mask=mask, position_ids=pos,
                       past_key_values=cache, use_cache=True, **fwd).logits[:, -1]
        picks = _argmax(logits.float()).tolist()
        for j, row in enumerate(live):
            if row in done:
                continue
            forced = calculator.next_token(out[row]) if calculator is not None else None
            t = picks[j] = forced if forced is not None else picks[j]
            out[row].append(t)
            if t in eos or (stop and any(
                    s in tokenizer.decode(out[row][-tail:], skip_special_tokens=False)
                    for s in stop)):
                done.add(row)
        nxt = torch.tensor(picks, device=ids.device)
        finished = [j for j, row in enumerate(live) if row in done]
        if len(finished) == len(live):
            break
        if finished and len(finished) >= DROP_FINISHED * len(live):
            keep = torch.tensor([j for j, row in enumerate(live) if row not in done],
                                device=ids.device)
            cache.batch_select_indices(keep)
            mask, nxt = mask[keep], nxt[keep]
            live = [row for row in live if row not in done]
        mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], 1)
        cur = nxt[:, None]
    return out


class _Slots:
    """The decoding batch of ``_refill_decode``: ``n`` rows of one KV cache (``GrowingLayer``s),
    every row laid out as [shared prefix | padding | own prompt tokens | generated], right-aligned
    at the cache's length ``L``; ``mask`` has one more column, the current token's."""

    def __init__(self, n_prefix: int, prefix_kv, capacity: int, room: int, classes: tuple):
        self.n_prefix, self.prefix_kv, self.capacity, self.room = n_prefix, prefix_kv, capacity, room
        self.cache_cls, self.grow = classes[0], _growing_on(classes[1])   # ``cache_classes``
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
        # leave holes, ``_refill_decode``), in order
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

    def admit(self, slots: Sequence[int], kvs: Sequence[list], n: int) -> bool:
        """Put rows into these batch slots (``n`` slots in all), from the keys and values of
        their own prompt tokens (all but their last; ``prefill.own_kv``). False when there is
        nothing to lay the cache out from (no shared prefix, no own tokens)."""
        lengths = [kv[0][0].shape[1] if kv else 0 for kv in kvs]
        need = self.n_prefix + max(lengths, default=0)
        if self.cache is not None and need > self.L:
            self.relayout(need)
        if self.cache is None:
            like = layer_shapes(kvs, self.prefix_kv)
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


def _prefix_groups(order: Sequence[int], encoded: Sequence[Sequence[int]]) -> list[list[int]]:
    """``order`` (``batch_order``) cut into runs of prompts that start alike (their first
    ``MIN_SHARED_PREFIX`` tokens), each decoded as one refilled batch over its shared prefix."""
    groups: list[list[int]] = []
    for i in order:
        if groups and encoded[groups[-1][0]][:MIN_SHARED_PREFIX] == encoded[i][:MIN_SHARED_PREFIX]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


class _Drafter:
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


LOOKAHEAD = 16             # most drafted tokens a row may verify in one pass (``_refill_decode``)
PACK_AFTER_STEPS = 64      # ``generate`` packs weights (about 0.4 s for SmolLM2-135M, 2-3
                           # passes) only where at least this many decoding steps may follow
PASS_OVERHEAD_TOKENS = 64  # a pass costs about this many tokens' worth beyond its width
                           # (measured on a 2-core CPU, SmolLM2-135M, 16 rows: a pass of width 5
                           # costs about 1.9x one of width 1, width 17 about 4.2x)


def _pass_width(drafts: Sequence[Sequence[int]], rates: Sequence[float]) -> int:
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


def _refill_decode(model, tokenizer, rows: Sequence[Sequence[int]], n_slots: int, n_prefix: int,
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
    twice ``max_new_tokens``); a full cache is compacted (``_Slots.relayout``).

    ``lookahead`` > 0 (not with a calculator): each row also feeds up to that many drafted
    tokens (``_Drafter``: what followed the same few tokens earlier in its prompt or output) in
    the same pass, and keeps every draft that equals the model's own argmax at its place plus
    the argmax after the last one kept: the tokens of plain greedy decoding, several per pass
    where the text repeats (numbers copied from the question, a looping answer). The keys and
    values of drafts that were not kept stay in the cache, masked out, until it is compacted.
    """
    if max_new_tokens < 1:
        return [[] for _ in rows]
    stop = [s for s in stop if s]
    tail = _stop_tail(stop)
    fwd = _forward_kwargs(model)
    if calculator is not None:
        lookahead = 0
    own = [list(r[n_prefix:len(r) - 1]) for r in rows]
    queue = list(range(len(rows)))[::-1]              # pop() -> next row, in the given order
    first = [queue.pop() for _ in range(min(n_slots, len(rows)))]
    longest = max(len(o) for o in own)
    if capacity is None:
        capacity = n_prefix + longest + 2 * max_new_tokens + 2
    slots = _Slots(n_prefix, prefix_kv, capacity, room=max_new_tokens + lookahead + 2,
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
    if kvs is None or not slots.admit(list(range(len(first))), kvs, len(first)):
        return None
    live = list(first)                               # batch position -> row
    cur = torch.tensor([rows[i][-1] for i in first], device=device)
    out: list[list[int]] = [[] for _ in rows]
    drafters: dict[int, _Drafter] = {}
    done: set[int] = set()

    def finished_by(row: int, t: int) -> bool:
        return t in eos or len(out[row]) >= max_new_tokens or bool(stop and any(
            s in tokenizer.decode(out[row][-tail:], skip_special_tokens=False) for s in stop))

    while live:
        drafts: list[list[int]] = [[] for _ in live]
        if lookahead:
            rates = [0.0] * len(live)
            for j, row in enumerate(live):
                if row not in done:
                    if row not in drafters:
                        drafters[row] = _Drafter(rows[row])
                    room = max_new_tokens - len(out[row]) - 1
                    drafts[j] = drafters[row].draft(min(lookahead, room))
                    rates[j] = drafters[row].rate
            width = _pass_width(drafts, rates)
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
        picks = _argmax(logits.float()).tolist()
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
        # width; English CoT n=32, alternating 4 runs each, 2026-11-26: 54.9 s against 57.5 s
        # for leaving at DROP_FINISHED, medians, outputs identical; within the run-to-run spread)
        if finished and not queue:
            gone = set(finished)
            keep = [j for j in range(len(live)) if j not in gone]
            idx = torch.tensor(keep, device=device)
            slots.cache.batch_select_indices(idx)
            slots.mask, cur = slots.mask[idx], cur[idx]
            live = [live[j] for j in keep]
    return out


@torch.inference_mode()
def generate(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int = 256,
             stop: Sequence[str] = (), batch_size: int = 16, share_prefix: bool = True,
             split_prefill: bool = True, refill: bool = True, calculator: bool = False,
             lookahead: int = LOOKAHEAD, packed: bool = True,
             progress: Progress | None = None) -> list[Generation]:
    """Greedy continuations of ``prompts`` (in order), ``batch_size`` at a time.

    Prompts are grouped by how they start, then sorted by length, so a batch holds similar
    prompts. Rows are laid out as [shared prefix | padding | own tokens] with the padding
    masked, so positions stay contiguous, and decoded together. With ``refill`` (plain caches
    and plain argmax decoding) the batch is refilled as it goes: a row that finishes hands its
    place to the next prompt, so a long answer does not keep ``batch_size - 1`` finished rows
    waiting (``_refill_decode``); without it, or once no prompt is left, finished rows leave the
    batch.

    The prompt pass dominates evaluation on CPU, so it avoids wasted work: with
    ``share_prefix`` a batch's common token prefix (the few-shot exemplars) is run once, and
    with ``split_prefill`` the rows' own tokens are run in groups of similar length on top of
    it instead of one batch padded to the longest row. Each may be turned off (for
    comparison; the text is the same); models whose KV cache is not a plain per-layer store
    (sliding-window, hybrid) use a padded batch. With ``calculator`` the result of every
    ``<<expr=`` note is filled in (``evaluation.calculator``). ``lookahead``: drafted tokens a
    refilled row may verify per pass (prompt lookup, ``_refill_decode``; 0 turns it off; the
    text is the same). ``packed``: on the CPU, the decoding passes' products run on weights
    prepacked for oneDNN (``products.packed_products``: faster at a few rows, equal to torch's
    own products up to the order of summation) where at least ``PACK_AFTER_STEPS`` decoding
    steps may follow; False keeps torch's own products throughout.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, not {batch_size}")
    kw = dict(max_new_tokens=max_new_tokens, stop=stop, batch_size=batch_size,
              share_prefix=share_prefix, split_prefill=split_prefill, refill=refill,
              calculator=calculator, lookahead=lookahead, progress=progress)
    packed = packed and max_new_tokens * -(-len(prompts) // batch_size) >= PACK_AFTER_STEPS
    with (packed_products(model) if packed else contextlib.nullcontext()), \
            without_cudnn_attention(next(model.parameters()).device):
        return _generate(model, tokenizer, prompts, **kw)


def _generate(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int,
              stop: Sequence[str], batch_size: int, share_prefix: bool, split_prefill: bool,
              refill: bool, calculator: bool, lookahead: int,
              progress: Progress | None) -> list[Generation]:
    device = next(model.parameters()).device
    pad = _pad_id(tokenizer)
    eos = set(_eos_ids(model, tokenizer))
    split_prefill = split_prefill and _plain_cache_ok(model)
    own_loop = _plain_greedy_ok(model)
    # an empty prompt continues from the start-of-text token (as lm-eval does with empty contexts)
    start_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else pad
    calc = Calculator(tokenizer) if calculator else None
    encoded = [encode_prompt(tokenizer, p) or [start_id] for p in prompts]
    order = batch_order(encoded)
    results: list[Generation | None] = [None] * len(prompts)
    answered = 0

    def finish(i: int, new: list[int], end: int) -> None:
        n_eos = next((k + 1 for k, t in enumerate(new) if t in eos), None)
        n_tok = min(end, n_eos) if n_eos is not None else end
        ended_by_eos = n_eos is not None and n_eos == n_tok
        text, found = cut_at_stop(tokenizer.decode(new[:n_tok], skip_special_tokens=True), stop)
        results[i] = Generation(text, n_tok, bool(found or ended_by_eos))

    def answered_now(k: int) -> None:
        if progress is not None:
            progress(k / len(order), f"{k} of {len(order)} items answered")

    pending = order
    if refill and split_prefill and own_loop:
        pending = []
        for group in _prefix_groups(order, encoded):
            rows = [encoded[i] for i in group]
            n_prefix, cache = shared_prefix(model, rows, device) if share_prefix else (0, None)
            prefix_kv = _kv(cache) if cache is not None else []
            base = answered
            new_tokens = None if prefix_kv is None else _refill_decode(
                model, tokenizer, rows, batch_size, n_prefix, prefix_kv, pad, device,
                max_new_tokens, eos, stop, calc, on_finish=lambda k: answered_now(base + k),
                lookahead=lookahead)
            if new_tokens is None:
                pending += group
                continue
            for i, new in zip(group, new_tokens):
                finish(i, new, len(new))
            answered += len(group)
    for start in range(0, len(pending), batch_size):
        idx = pending[start:start + batch_size]
        rows = [encoded[i] for i in idx]
        width = max(len(r) for r in rows)
        # keep >= 1 own token per row: generation starts from a fresh forward pass
        n_prefix, cache = shared_prefix(model, rows, device) if share_prefix else (0, None)
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, r in enumerate(rows):
            n = len(r)
            ids[row, width - n + n_prefix:] = torch.tensor(r[n_prefix:])
            mask[row, width - n + n_prefix:] = 1
            ids[row, :n_prefix] = torch.tensor(r[:n_prefix])
            mask[row, :n_prefix] = 1
        filled = _prefill(model, rows, n_prefix, cache, width, pad, device,
                          room=max_new_tokens + 1) if split_prefill else None
        if filled is None and getattr(model, "lean", False):
            filled = cache_classes(model)[0]()   # every row one token: nothing before it
        if filled is not None and own_loop:
            def each_token(k, start=start, n=len(idx)):   # every 8 tokens: progress, Cancel
                if progress is not None and k % 8 == 0:
                    progress((start + n * k / max_new_tokens) / len(order),
                             f"{start} of {len(order)} items answered (token {k})")
            with split_head(model):
                new_tokens = _greedy_decode(model, tokenizer, filled, ids.to(device),
                                            mask.to(device), max_new_tokens, eos, stop, calc,
                                            each_token)
            ends = [len(new) for new in new_tokens]
        else:
            kw = _greedy_kwargs(model, tokenizer, max_new_tokens, stop, width, calculator=calc)
            if filled is not None:
                kw["past_key_values"] = filled
            elif cache is not None:
                cache.batch_repeat_interleave(len(idx))
                kw["past_key_values"] = cache
            with split_head(model):
                out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                     **kw)
            stopper = next((c for c in kw["stopping_criteria"] if isinstance(c, _StopOnStrings)),
                           None)
            stopped_at = stopper.stopped_at if stopper is not None else {}
            new_tokens = [out[row, width:].tolist() for row in range(len(idx))]
            # a row ends where its stop string appeared (or at the limit); after that it is
            # padded, possibly with the EOS id, while the other rows go on
            ends = [stopped_at.get(row, len(new)) for row, new in enumerate(new_tokens)]
        for row, i in enumerate(idx):
            finish(i, new_tokens[row], ends[row])
        answered += len(idx)
        answered_now(answered)
    return results  # type: ignore[return-value]


def generate_one(model, tokenizer, prompt: str, **kw) -> str:
    return generate(model, tokenizer, [prompt], batch_size=1, **kw)[0].text


# --------------------------------------------------------------------------- streaming and chat
class _Cancelled:
    """Stopping criterion that ends generation when the consumer stops reading the stream."""

    def __init__(self):
        self.event = threading.Event()

    def __call__(self, input_ids, scores, **kw):
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool,
                          device=input_ids.device)


def sampling_kwargs(temperature: float = 0.0, top_p: float = 1.0,
                    repetition_penalty: float = 1.0) -> dict:
    """generate() overrides for chat: temperature 0 keeps greedy decoding."""
    if temperature < 0 or not 0 < top_p <= 1 or repetition_penalty <= 0:
        raise ValueError(f"generation settings out of range: temperature {temperature} (>= 0), "
                         f"top_p {top_p} (0-1], repetition penalty {repetition_penalty} (> 0)")
    kw: dict = {}
    if temperature > 0:
        kw.update(do_sample=True, temperature=float(temperature), top_p=float(top_p))
    if repetition_penalty != 1.0:
        kw["repetition_penalty"] = float(repetition_penalty)
    return kw


def stream_generate(model, tokenizer, prompt: str, *, max_new_tokens: int = 256,
                    stop: Sequence[str] = (), temperature: float = 0.0, top_p: float = 1.0,
                    repetition_penalty: float = 1.0, calculator: bool = False) -> Iterator[str]:
    """Yield the growing continuation of ``prompt`` (cumulative text, for a chat UI).

    Greedy unless ``temperature`` > 0 (then sampled with ``top_p``; seed torch for repeatability).
    ``calculator``: fill in the result of every ``<<expr=`` note (``evaluation.calculator``).

    Generation runs in a thread feeding a ``TextIteratorStreamer``; closing the iterator early
    (the user pressed stop) ends the thread at its next token.
    """
    from transformers import TextIteratorStreamer

    device = next(model.parameters()).device
    ids = torch.tensor([encode_prompt(tokenizer, prompt)], device=device)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True,
                                    timeout=600)
    cancel = _Cancelled()
    kw = _greedy_kwargs(model, tokenizer, max_new_tokens, stop, ids.shape[1], extra=[cancel],
                        calculator=Calculator(tokenizer) if calculator else None)
    kw.update(sampling_kwargs(temperature, top_p, repetition_penalty))
    errors: list[BaseException] = []

    def run():
        try:
            with torch.inference_mode(), split_head(model), without_cudnn_attention(device):
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), streamer=streamer,
                               **kw)
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer below
            errors.append(e)
            streamer.end()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    text = ""
    try:
        for piece in streamer:
            text += piece
            shown, found = cut_at_stop(text, stop)
            yield shown
            if found:
                break
    finally:
        cancel.event.set()
        thread.join()
    if errors:
        raise errors[0]


def chat_prompt(tokenizer, messages: list[dict] | str, system: str | None = None) -> str:
    """Prompt text for a conversation (``prompts.render_chat``: the tokenizer's chat template,
    or the one plain fallback)."""
    return render_chat(tokenizer, messages, system=system)


def chat(model, tokenizer, messages: list[dict] | str, *, system: str | None = None,
         max_new_tokens: int = 256, stream: bool = False, temperature: float = 0.0,
         top_p: float = 1.0, repetition_penalty: float = 1.0, calculator: bool = False):
    """Reply of the model to a conversation (list of {"role","content"} or one user message).

    ``stream=True`` returns an iterator of the growing reply (see ``stream_generate``).
    Greedy by default; ``temperature`` > 0 samples (see ``sampling_kwargs``); ``calculator``
    fills in GSM8K ``<<expr=result>>`` notes.
    """
    prompt = chat_prompt(tokenizer, messages, system)
    stop = chat_stop(tokenizer)
    replies = stream_generate(model, tokenizer, prompt, max_new_tokens=max_new_tokens, stop=stop,
                              temperature=temperature, top_p=top_p,
                              repetition_penalty=repetition_penalty, calculator=calculator)
    if stream:
        return replies
    reply = ""
    for reply in replies:  # noqa: B007 - the last one is the answer
        pass
    return reply
