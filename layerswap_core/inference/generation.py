"""Batched greedy generation for evaluation (streaming and chat for the UI: ``chat``).

Batched generation (``generate``) is built for few-shot evaluation, where reading the prompts
costs more than writing short answers: the prompt pass (``prefill``) runs the few-shot prefix
that prompts share once and the rest of each prompt in groups of similar length on top of it,
into one batch KV cache that grows in place. Rows then decode greedily together
(``decoding.refill_decode``): a row that finishes hands its place in the batch to the next prompt, so
ragged answers (chain-of-thought) keep the batch full instead of waiting for the longest one;
once no prompt is left, finished rows leave the batch. Each pass also verifies drafted tokens
(what followed the same tokens earlier in the row: ``decoding.Drafter``), so text that repeats costs
fewer passes; the tokens kept are those of plain greedy decoding. Models whose
generation_config asks for more than an argmax decode through transformers' ``generate``.
Each output is cut at its first stop string (``stops``). The text equals transformers' own
one-prompt-at-a-time greedy output (tests/test_generation.py checks it).
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..checkpoints.tokenizers import encode_prompt
from ..progress import Progress
from .attention import without_cudnn_attention
from .calculator import Calculator
from .decoding import LOOKAHEAD, prefix_groups, refill_decode
from .lean import plain_argmax
from .prefill import (batch_order, kv_layers, plain_cache_ok, prefill_cache,
                      shared_prefix)
from .products import packed_products, split_head
from .stops import StopOnStrings, cut_at_stop, eos_ids, greedy_kwargs, pad_id

__all__ = ["PACK_AFTER_STEPS", "Generation", "cut_at_stop", "generate", "generate_one",
           "plain_greedy_ok"]


@dataclass
class Generation:
    text: str          # the continuation, cut before the first stop string
    num_tokens: int    # tokens generated up to the stop (or EOS, or the limit)
    stopped: bool      # ended by a stop string or EOS rather than by max_new_tokens


def plain_greedy_ok(model) -> bool:
    """Whether greedy decoding of this model is a plain argmax (nothing in its
    generation_config would change the picked tokens)."""
    return plain_argmax(getattr(model, "generation_config", None))


PACK_AFTER_STEPS = 64      # ``generate`` packs weights (about 0.4 s for SmolLM2-135M, 2-3
                           # passes) only where at least this many decoding steps may follow


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
    waiting (``decoding.refill_decode``); without it (for comparison), batch after batch of
    ``batch_size`` prompts through the same loop, nothing refilled; once no prompt is left,
    finished rows leave the batch.

    The prompt pass dominates evaluation on CPU, so it avoids wasted work: with
    ``share_prefix`` a batch's common token prefix (the few-shot exemplars) is run once, and
    with ``split_prefill`` the rows' own tokens are run in groups of similar length on top of
    it instead of one batch padded to the longest row. Each may be turned off (for
    comparison; the text is the same); models whose KV cache is not a plain per-layer store
    (sliding-window, hybrid), or whose generation_config asks for more than an argmax, use a
    padded batch through transformers' ``generate``; a lean model (``lean.LeanLlama``, which has
    no ``generate``) always splits its prompt pass. With ``calculator`` the result of every
    ``<<expr=`` note is filled in (``calculator``). ``lookahead``: drafted tokens a
    row may verify per pass (prompt lookup, ``decoding.refill_decode``; 0 turns it off; the
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
    pad = pad_id(tokenizer)
    eos = set(eos_ids(model, tokenizer))
    # a lean model has no ``generate`` (the padded fallback): it always runs the split prompt
    # pass and the refilled loop
    split_prefill = (split_prefill or getattr(model, "lean", False)) and plain_cache_ok(model)
    own_loop = split_prefill and plain_greedy_ok(model)
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
    if own_loop:
        pending = []
        # with ``refill`` each run of prompts that start alike is one refilled batch; without
        # it, batch after batch of ``batch_size`` prompts, nothing refilled
        runs = prefix_groups(order, encoded) if refill else [
            order[s:s + batch_size] for s in range(0, len(order), batch_size)]
        for group in runs:
            rows = [encoded[i] for i in group]
            n_prefix, cache = shared_prefix(model, rows, device) if share_prefix else (0, None)
            prefix_kv = kv_layers(cache) if cache is not None else []
            base = answered
            new_tokens = None if prefix_kv is None else refill_decode(
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
        filled = prefill_cache(model, rows, n_prefix, cache, width, pad, device,
                               room=max_new_tokens + 1) if split_prefill else None
        kw = greedy_kwargs(model, tokenizer, max_new_tokens, stop, width, calculator=calc)
        if filled is not None:
            kw["past_key_values"] = filled
        elif cache is not None:
            cache.batch_repeat_interleave(len(idx))
            kw["past_key_values"] = cache
        with split_head(model):
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kw)
        stopper = next((c for c in kw["stopping_criteria"] if isinstance(c, StopOnStrings)), None)
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

