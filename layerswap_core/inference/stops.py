"""Where a generated text ends: stop strings (cut, and watched for while transformers'
``generate`` runs), the EOS ids, the pad id, and the keywords of a greedy ``model.generate`` call
(shared by batched generation's fallback and streaming chat).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ..progress import pause_point

__all__ = ["StopOnStrings", "cut_at_stop", "eos_ids", "greedy_kwargs", "pad_id", "stop_tail"]


def pad_id(tokenizer) -> int:
    if tokenizer.pad_token_id is not None:
        return tokenizer.pad_token_id
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0


def eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id if model.generation_config is not None else None
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the earliest stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def stop_tail(stop: Sequence[str]) -> int:
    """How many last tokens to decode to see any stop string (a token holds >= 1 char or byte)."""
    return 4 * max((len(s) for s in stop), default=0) + 4


class StopOnStrings:
    """Stopping criterion: a row is done once the text of its last few tokens holds a stop string.

    (transformers' own ``stop_strings`` rebuilds a table over the whole vocabulary on every
    call, ~0.7 s per string on a small CPU; decoding a short tail per step is much cheaper.)
    """

    def __init__(self, tokenizer, stop: Sequence[str], prompt_width: int):
        self.tokenizer, self.stop, self.start = tokenizer, list(stop), prompt_width
        self.tail = stop_tail(self.stop)
        self.stopped_at: dict[int, int] = {}   # row -> new tokens when its stop string appeared

    def __call__(self, input_ids, scores, **kw):
        new = input_ids[:, self.start:][:, -self.tail:]
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=False)
        hits = [any(s in t for s in self.stop) for t in texts]
        for row, hit in enumerate(hits):
            if hit and row not in self.stopped_at:
                self.stopped_at[row] = input_ids.shape[1] - self.start
        return torch.tensor(hits, dtype=torch.bool, device=input_ids.device)


class PausePoint:
    """A stopping criterion that never stops: each step of ``generate`` is a pause point
    (``progress.pause_point``: a waiting job may take the engine between two steps)."""

    def __call__(self, input_ids, scores, **kw):
        pause_point()
        return torch.zeros((input_ids.shape[0],), dtype=torch.bool, device=input_ids.device)


def greedy_kwargs(model, tokenizer, max_new_tokens: int, stop: Sequence[str],
                   prompt_width: int, extra=(), calculator=None) -> dict:
    """``model.generate`` keywords: greedy, the stop strings, and the calculator if given."""
    from transformers import LogitsProcessorList, StoppingCriteriaList

    criteria = [PausePoint(), *extra]
    stop = [s for s in stop if s]
    if stop:
        criteria.append(StopOnStrings(tokenizer, stop, prompt_width))
    kw = dict(max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None,
              top_k=None, pad_token_id=pad_id(tokenizer), eos_token_id=eos_ids(model, tokenizer),
              stopping_criteria=StoppingCriteriaList(criteria))
    if calculator is not None:
        kw["logits_processor"] = LogitsProcessorList([calculator.logits_processor(prompt_width)])
    return kw
