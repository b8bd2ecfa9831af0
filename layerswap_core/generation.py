"""Text generation: batched greedy decoding for evaluation, streaming and chat for the UI.

Batched generation left-pads prompts of similar length together (sorted by length, so little
compute goes to padding), decodes greedily and cuts each output at its first stop string.
Batched and one-at-a-time runs give the same text (tests/test_generation.py checks it).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch

Progress = Callable[[float, str], None]


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


def encode(tokenizer, prompt: str) -> list[int]:
    # Prompts are either plain text (lm-eval adds no BOS for causal models either) or
    # chat-templated text that already holds its special tokens.
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


class _StopOnStrings:
    """Stopping criterion: a row is done once the text of its last few tokens holds a stop string.

    (transformers' own ``stop_strings`` rebuilds a table over the whole vocabulary on every
    call, ~0.7 s per string on a small CPU; decoding a short tail per step is much cheaper.)
    """

    def __init__(self, tokenizer, stop: Sequence[str], prompt_width: int):
        self.tokenizer, self.stop, self.start = tokenizer, list(stop), prompt_width
        self.tail = 4 * max(len(s) for s in self.stop) + 4   # tokens hold >= 1 char (or a byte)

    def __call__(self, input_ids, scores, **kw):
        new = input_ids[:, self.start:][:, -self.tail:]
        texts = self.tokenizer.batch_decode(new, skip_special_tokens=False)
        return torch.tensor([any(s in t for s in self.stop) for t in texts], dtype=torch.bool,
                            device=input_ids.device)


def _greedy_kwargs(model, tokenizer, max_new_tokens: int, stop: Sequence[str],
                   prompt_width: int, extra=()) -> dict:
    from transformers import StoppingCriteriaList

    criteria = list(extra)
    stop = [s for s in stop if s]
    if stop:
        criteria.append(_StopOnStrings(tokenizer, stop, prompt_width))
    return dict(max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None,
                top_k=None, pad_token_id=_pad_id(tokenizer), eos_token_id=_eos_ids(model, tokenizer),
                stopping_criteria=StoppingCriteriaList(criteria))


MIN_SHARED_PREFIX = 16   # tokens; below this a shared prefix is not worth a separate pass


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


def _prefix_cache(model, prefix: list[int], device):
    """KV cache of the shared prefix (batch 1), or None if this model's cache cannot be reused."""
    try:
        out = model(input_ids=torch.tensor([prefix], device=device), use_cache=True)
        cache = out.past_key_values
        if cache is None or not hasattr(cache, "batch_repeat_interleave"):
            return None
        return cache
    except (TypeError, ValueError, NotImplementedError, AttributeError):
        return None


@torch.inference_mode()
def generate(model, tokenizer, prompts: Sequence[str], *, max_new_tokens: int = 256,
             stop: Sequence[str] = (), batch_size: int = 16, share_prefix: bool = True,
             progress: Progress | None = None) -> list[Generation]:
    """Greedy continuations of ``prompts`` (in order), ``batch_size`` at a time.

    Prompts are grouped by how they start, then sorted by length, so a batch holds similar
    prompts. Few-shot prompts share their exemplars: with ``share_prefix`` a batch's common
    token prefix is run once and its KV cache shared by all rows (the prompt pass dominates
    evaluation on CPU). Rows are laid out as [prefix | padding | own suffix] with the padding
    masked, so positions stay contiguous; without a shared prefix rows are left-padded.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, not {batch_size}")
    device = next(model.parameters()).device
    pad = _pad_id(tokenizer)
    eos = set(_eos_ids(model, tokenizer))
    encoded = [encode(tokenizer, p) for p in prompts]
    # Prompts that start alike go together (so a batch shares its few-shot prefix), longest first.
    order = sorted(range(len(prompts)),
                   key=lambda i: (tuple(encoded[i][:MIN_SHARED_PREFIX]), -len(encoded[i])))
    results: list[Generation | None] = [None] * len(prompts)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        rows = [encoded[i] for i in idx]
        width = max(len(r) for r in rows)
        n_prefix, cache = 0, None
        if share_prefix and len(rows) > 1:
            # keep >= 1 own token per row: generation starts from a fresh forward pass
            n_prefix = min(common_prefix_len(rows), min(len(r) for r in rows) - 1)
            if n_prefix >= MIN_SHARED_PREFIX:
                cache = _prefix_cache(model, rows[0][:n_prefix], device)
            if cache is None:
                n_prefix = 0
        ids = torch.full((len(idx), width), pad, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, r in enumerate(rows):
            n = len(r)
            ids[row, width - n + n_prefix:] = torch.tensor(r[n_prefix:])
            mask[row, width - n + n_prefix:] = 1
            ids[row, :n_prefix] = torch.tensor(r[:n_prefix])
            mask[row, :n_prefix] = 1
        kw = _greedy_kwargs(model, tokenizer, max_new_tokens, stop, width)
        if cache is not None:
            cache.batch_repeat_interleave(len(idx))
            kw["past_key_values"] = cache
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kw)
        for row, i in enumerate(idx):
            new = out[row, width:].tolist()
            n_tok = next((k + 1 for k, t in enumerate(new) if t in eos), len(new))
            ended_by_eos = bool(new) and new[n_tok - 1] in eos
            while n_tok and new[n_tok - 1] == pad and not ended_by_eos:
                n_tok -= 1   # a row that hit a stop string is padded while the others go on
            text = tokenizer.decode(new[:n_tok], skip_special_tokens=True)
            text, found = cut_at_stop(text, stop)
            results[i] = Generation(text, n_tok, bool(found or ended_by_eos))
        if progress is not None:
            done = min(start + batch_size, len(order))
            progress(done / len(order), f"generated {done}/{len(order)}")
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
                    repetition_penalty: float = 1.0) -> Iterator[str]:
    """Yield the growing continuation of ``prompt`` (cumulative text, for a chat UI).

    Greedy unless ``temperature`` > 0 (then sampled with ``top_p``; seed torch for repeatability).

    Generation runs in a thread feeding a ``TextIteratorStreamer``; closing the iterator early
    (the user pressed stop) ends the thread at its next token.
    """
    from transformers import TextIteratorStreamer

    device = next(model.parameters()).device
    ids = torch.tensor([encode(tokenizer, prompt)], device=device)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True,
                                    timeout=600)
    cancel = _Cancelled()
    kw = _greedy_kwargs(model, tokenizer, max_new_tokens, stop, ids.shape[1], extra=[cancel])
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
    """Prompt text for a conversation: the tokenizer's chat template, or a plain fallback."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if system:
        messages = [{"role": "system", "content": system}, *messages]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # No template (base models): a readable transcript ending where the assistant speaks.
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nAssistant:"


def chat(model, tokenizer, messages: list[dict] | str, *, system: str | None = None,
         max_new_tokens: int = 256, stream: bool = False, temperature: float = 0.0,
         top_p: float = 1.0, repetition_penalty: float = 1.0):
    """Reply of the model to a conversation (list of {"role","content"} or one user message).

    ``stream=True`` returns an iterator of the growing reply (see ``stream_generate``).
    Greedy by default; ``temperature`` > 0 samples (see ``sampling_kwargs``).
    """
    prompt = chat_prompt(tokenizer, messages, system)
    stop = () if getattr(tokenizer, "chat_template", None) else ("\nUser:",)
    replies = stream_generate(model, tokenizer, prompt, max_new_tokens=max_new_tokens, stop=stop,
                              temperature=temperature, top_p=top_p,
                              repetition_penalty=repetition_penalty)
    if stream:
        return replies
    reply = ""
    for reply in replies:
        pass
    return reply
