"""The one chat-prompt renderer: a conversation -> the text a model reads, beside
``checkpoints.tokenizers.encode_prompt`` (text -> token ids, BOS rule).

The tokenizer's chat template where it has one; without one (base models), one plain fallback:
``role: content`` lines, ending with ``assistant: `` where the model is to answer, the format
the trainer writes its examples in (``training.sft_data``), so a template-less expert is asked
the way it was taught. Chat (``chat.chat``), the demo's scoring (``demos.measure``),
lm-eval-style multi-turn few-shot prompts (``evaluation.runner.build_prompt``) and the trainer
all render through ``render_chat``.
"""
from __future__ import annotations

__all__ = ["PLAIN_STOP", "chat_stop", "has_chat_template", "render_chat"]

# Where a reply of a template-less model ends: the next plain user line.
PLAIN_STOP = ("\nuser:",)


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_chat(tokenizer, messages: list[dict] | str, *, generation_prompt: bool = True,
                system: str | None = None) -> str:
    """The text of a conversation (a list of {"role", "content"}, or one user message) as
    ``tokenizer``'s chat template renders it (``generation_prompt``: ending where the assistant
    speaks next), else as plain ``role: content`` lines (``assistant: `` last with
    ``generation_prompt``). ``system``: a system message put first."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if system:
        messages = [{"role": "system", "content": system}, *messages]
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=generation_prompt)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return text + ("assistant: " if generation_prompt else "")


def chat_stop(tokenizer) -> tuple[str, ...]:
    """Stop strings of a chat reply: none with a template (its end-of-turn token ends it), the
    next plain user line without one."""
    return () if has_chat_template(tokenizer) else PLAIN_STOP
