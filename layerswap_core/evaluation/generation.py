"""Text generation: batched greedy decoding for evaluation, streaming and chat for the UI.

Batched generation (``generate``) is built for few-shot evaluation, where reading the prompts
costs more than writing short answers: prompts that start alike are batched together, their
shared prefix is run once (``shared_prefix``), the rest of each prompt in groups of similar
length on top of it (``group_passes``, little compute on padding), and the pieces are
assembled into one batch KV cache that grows in place while all rows decode greedily
(``_greedy_decode``: rows that finish leave the batch; models whose generation_config asks for
more than an argmax decode through transformers' ``generate``); each output is cut at its
first stop string. The text equals transformers' own one-prompt-at-a-time greedy output
(tests/test_generation.py checks it).
``runner.gold_nll`` uses the same prefix sharing and grouping.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

from ..checkpoints.tokenizers import encode_prompt
from ..progress import Progress
from .calculator import Calculator
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


def _forward_kwargs(model) -> dict:
    """``logits_to_keep=1`` where the model takes it: prompt passes need no logits but the last."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}


def _plain_cache_ok(model) -> bool:
    """Whether this model's KV cache is a plain per-layer [batch, heads, seq, dim] store.

    Only then can caches be assembled row by row (sliding-window and hybrid caches cannot).
    """
    import inspect

    try:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        if "position_ids" not in inspect.signature(model.forward).parameters:
            return False
        cache = DynamicCache(config=model.config)
        return all(type(layer) is DynamicLayer for layer in cache.layers)
    except (ImportError, TypeError, ValueError, AttributeError):
        return False


def _kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """(keys, values) per layer of a plain dynamic cache, else None."""
    try:
        from transformers.cache_utils import DynamicLayer
    except ImportError:
        return None
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or layer.keys is None for layer in layers):
        return None
    return [(layer.keys, layer.values) for layer in layers]


def _prefix_cache(model, prefix: list[int], device):
    """KV cache of the shared prefix (batch 1), or None if this model's cache cannot be reused."""
    try:
        out = model(input_ids=torch.tensor([prefix], device=device), use_cache=True,
                    **_forward_kwargs(model))
        cache = out.past_key_values
        if cache is None or not hasattr(cache, "batch_repeat_interleave"):
            return None
        return cache
    except (TypeError, ValueError, NotImplementedError, AttributeError):
        return None


@functools.cache
def _growing_layer_class():
    from transformers.cache_utils import DynamicLayer

    class GrowingLayer(DynamicLayer):
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
            """Keep only these rows (decoding drops finished ones), spare room included."""
            length = self.keys.shape[-2]
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
    prefix's (keys, values) per layer (``_kv``), or [] with no prefix. Each group is laid out
    right-aligned, [padding | tokens], on top of the prefix, with positions counted from
    ``n_prefix``. ``keep(members)`` says how many last positions need logits (default 1).
    Yields (members, group width, model output); the output's cache holds the group's keys
    and values after the prefix's.
    """
    from transformers import DynamicCache

    fwd = _forward_kwargs(model)
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
        past = DynamicCache(ddp_cache_data=[(k.expand(len(members), -1, -1, -1),
                                             v.expand(len(members), -1, -1, -1))
                                            for k, v in prefix_kv]) if prefix_kv else DynamicCache()
        kw = dict(fwd)
        if keep is not None and kw:
            kw["logits_to_keep"] = keep(members)
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device),
                    position_ids=pos.to(device), past_key_values=past, use_cache=True, **kw)
        yield members, gw, out


def _prefill(model, rows: list[list[int]], n_prefix: int, prefix, width: int, pad: int,
             device, room: int = 0):
    """KV cache of every row but its last token, laid out as [prefix | padding | own tokens].

    Rows are run in groups of similar length (``group_passes``) on top of the shared prefix,
    so the prompt pass wastes little compute on padding; the caches are then assembled into
    one batch whose last column ``generate`` runs first, with ``room`` spare columns for the
    tokens to come. Returns None when the model's cache is not a plain one (the caller then
    lets ``generate`` do a padded pass).
    """
    from transformers import DynamicCache

    prefix_kv = _kv(prefix) if prefix is not None else []
    if prefix_kv is None:
        return None
    own = [r[n_prefix:len(r) - 1] for r in rows]     # tokens each row needs before generation
    span = width - 1                                   # cache length: all columns but the last
    assembled: list[tuple[torch.Tensor, torch.Tensor]] = []

    def place(kv_group, members, group_width):
        if not assembled:    # allocate the batch cache, shaped like this model's layers
            for k, v in kv_group:
                assembled.append((k.new_zeros((len(rows), k.shape[1], span + room, k.shape[3])),
                                  v.new_zeros((len(rows), v.shape[1], span + room, v.shape[3]))))
        end = n_prefix + group_width
        for (k, v), (K, V) in zip(kv_group, assembled):
            for j, b in enumerate(members):
                n = len(own[b])
                K[b, :, span - n:span] = k[j, :, end - n:end]
                V[b, :, span - n:span] = v[j, :, end - n:end]

    for members, gw, out in group_passes(model, own, n_prefix, prefix_kv, pad, device):
        kv = _kv(out.past_key_values)
        if kv is None:
            return None
        place(kv, members, gw)
    if not assembled:                # no row has tokens before its last one
        if not prefix_kv:
            return None
        place(prefix_kv, [], 0)
    for (K, V), pk in zip(assembled, prefix_kv):
        K[:, :, :n_prefix] = pk[0]
        V[:, :, :n_prefix] = pk[1]
    grow = _growing_layer_class()
    cache = DynamicCache()
    cache.layers = [grow(K, V, span) for K, V in assembled]
    return cache


# generation_config fields that change what greedy decoding picks, with their neutral values:
# a model whose config sets one of them decodes through transformers' generate, which applies it
_NOT_PLAIN_ARGMAX = {
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "bad_words_ids": None, "min_length": 0,
    "min_new_tokens": None, "suppress_tokens": None, "begin_suppress_tokens": None,
    "forced_bos_token_id": None, "forced_eos_token_id": None, "sequence_bias": None,
    "exponential_decay_length_penalty": None, "guidance_scale": None, "watermarking_config": None,
    "num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None, "dola_layers": None,
    "stop_strings": None, "max_time": None, "token_healing": False,
}


def _plain_greedy_ok(model) -> bool:
    """Whether greedy decoding of this model is a plain argmax (nothing in its
    generation_config would change the picked tokens)."""
    gc = getattr(model, "generation_config", None)
    return gc is None or all(getattr(gc, key, None) in (neutral, None)
                             for key, neutral in _NOT_PLAIN_ARGMAX.items())


DROP_FINISHED = 0.25   # drop finished rows from the batch once they are this share of it


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
        picks = logits.float().argmax(-1).tolist()
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


@torch.inference_mode()
def generate(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int = 256,
             stop: Sequence[str] = (), batch_size: int = 16, share_prefix: bool = True,
             split_prefill: bool = True, calculator: bool = False,
             progress: Progress | None = None) -> list[Generation]:
    """Greedy continuations of ``prompts`` (in order), ``batch_size`` at a time.

    Prompts are grouped by how they start, then sorted by length, so a batch holds similar
    prompts. Rows are laid out as [shared prefix | padding | own tokens] with the padding
    masked, so positions stay contiguous, and decoded together; finished rows leave the batch.

    The prompt pass dominates evaluation on CPU, so it avoids wasted work: with
    ``share_prefix`` a batch's common token prefix (the few-shot exemplars) is run once, and
    with ``split_prefill`` the rows' own tokens are run in groups of similar length on top of
    it instead of one batch padded to the longest row. Either may be turned off (for
    comparison; the text is the same); models whose KV cache is not a plain per-layer store
    (sliding-window, hybrid) use a padded batch. With ``calculator`` the result of every
    ``<<expr=`` note is filled in (``evaluation.calculator``).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, not {batch_size}")
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
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
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
        if filled is not None and own_loop:
            def each_token(k, start=start, n=len(idx)):   # every 8 tokens: progress, Cancel
                if progress is not None and k % 8 == 0:
                    progress((start + n * k / max_new_tokens) / len(order),
                             f"{start} of {len(order)} items answered (token {k})")
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
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kw)
            stopper = next((c for c in kw["stopping_criteria"] if isinstance(c, _StopOnStrings)),
                           None)
            stopped_at = stopper.stopped_at if stopper is not None else {}
            new_tokens = [out[row, width:].tolist() for row in range(len(idx))]
            # a row ends where its stop string appeared (or at the limit); after that it is
            # padded, possibly with the EOS id, while the other rows go on
            ends = [stopped_at.get(row, len(new)) for row, new in enumerate(new_tokens)]
        for row, i in enumerate(idx):
            new = new_tokens[row]
            n_eos = next((k + 1 for k, t in enumerate(new) if t in eos), None)
            n_tok = min(ends[row], n_eos) if n_eos is not None else ends[row]
            ended_by_eos = n_eos is not None and n_eos == n_tok
            text = tokenizer.decode(new[:n_tok], skip_special_tokens=True)
            text, found = cut_at_stop(text, stop)
            results[i] = Generation(text, n_tok, bool(found or ended_by_eos))
        if progress is not None:
            done = min(start + batch_size, len(order))
            progress(done / len(order), f"{done} of {len(order)} items answered")
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
            with torch.inference_mode():
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
    for reply in replies:
        pass
    return reply
