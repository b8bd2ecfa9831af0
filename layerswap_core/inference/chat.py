"""Streaming generation and chat for the UI: one prompt, greedy or sampled, through
transformers' ``generate`` in a thread (closing the stream ends it), with the GSM8K calculator on
request; conversations rendered by ``prompts.render_chat``.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

import torch

from ..checkpoints.tokenizers import encode_prompt
from ..progress import pause_hook, pausing
from .attention import without_cudnn_attention
from .calculator import Calculator
from .products import split_head
from .prompts import chat_stop, render_chat
from .stops import cut_at_stop, greedy_kwargs

__all__ = ["chat", "chat_prompt", "sampling_kwargs", "stream_generate"]


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
                    repetition_penalty: float = 1.0, calculator: bool = False,
                    pause: Callable[[], None] | None = None) -> Iterator[str]:
    """Yield the growing continuation of ``prompt`` (cumulative text, for a chat UI).

    Greedy unless ``temperature`` > 0 (then sampled with ``top_p``; seed torch for repeatability).
    ``calculator``: fill in the result of every ``<<expr=`` note (``calculator``).
    ``pause``: the pause hook of the generation's steps (``progress.pause_point``; default:
    the caller's thread's, ``progress.pause_hook``).

    Generation runs in a thread feeding a ``TextIteratorStreamer``; closing the iterator early
    (the user pressed stop) ends the thread at its next token.
    """
    from transformers import TextIteratorStreamer

    device = next(model.parameters()).device
    ids = torch.tensor([encode_prompt(tokenizer, prompt)], device=device)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True,
                                    timeout=600)
    cancel = _Cancelled()
    kw = greedy_kwargs(model, tokenizer, max_new_tokens, stop, ids.shape[1], extra=[cancel],
                        calculator=Calculator(tokenizer) if calculator else None)
    kw.update(sampling_kwargs(temperature, top_p, repetition_penalty))
    errors: list[BaseException] = []
    hook = pause if pause is not None else pause_hook()   # the steps in the thread pause too

    def run():
        try:
            with pausing(hook), torch.inference_mode(), split_head(model), \
                    without_cudnn_attention(device):
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
         top_p: float = 1.0, repetition_penalty: float = 1.0, calculator: bool = False,
         pause: Callable[[], None] | None = None):
    """Reply of the model to a conversation (list of {"role","content"} or one user message).

    ``stream=True`` returns an iterator of the growing reply (see ``stream_generate``).
    Greedy by default; ``temperature`` > 0 samples (see ``sampling_kwargs``); ``calculator``
    fills in GSM8K ``<<expr=result>>`` notes.
    """
    prompt = chat_prompt(tokenizer, messages, system)
    stop = chat_stop(tokenizer)
    replies = stream_generate(model, tokenizer, prompt, max_new_tokens=max_new_tokens, stop=stop,
                              temperature=temperature, top_p=top_p,
                              repetition_penalty=repetition_penalty, calculator=calculator,
                              pause=pause)
    if stream:
        return replies
    reply = ""
    for reply in replies:  # noqa: B007 - the last one is the answer
        pass
    return reply
