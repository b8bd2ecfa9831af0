"""The Chat tab: one streamed answer per pane, from a conversation the page sends back.

Every check that costs nothing runs first (message length, history shape and size, turns); then
one streaming job (``engines.jobs``, kind "chat") holds an engine from showing the model to the
last token: the prompt keeps the newest turns that fit the model's context
(``engines.jobs.fit_context``); a request stops at its deadline.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from collections.abc import Iterator

from ..engines.jobs import context_tokens, fit_context  # noqa: F401  (the chat's context rules)
from ..evaluation import languages
from ..evaluation.languages import LANGUAGES
from .served import LIMITS, WorkbenchError, bounded, capped, limits_for
from .session import Session, dispatcher

# Examples per language of the language expert come from the one table of languages
# (``evaluation.languages``: ``chat_examples``, ``english_twins``, the ``words`` that name it):
# a language's examples show only when the language expert is in that language.
def language_of(ref: str | None) -> str | None:
    """The language a model reference names ("sw", "bn") among those with chat examples, or
    None."""
    return languages.language_of(ref)


def example_languages() -> list[str]:
    """The language codes that have chat examples (the Chat tab lays out a set for each and
    shows the one of the language expert in use)."""
    return [code for code, row in LANGUAGES.items() if row.chat_examples]


def examples_code(lang_ref: str | None) -> str:
    """The code of the example set shown for a language expert (Swahili, the demo's language,
    where the reference names none we have)."""
    return language_of(lang_ref) or "sw"


def chat_examples(lang_ref: str | None) -> tuple[str, list[str]]:
    """(language name, examples) for a language expert: its language's examples; Swahili (the
    demo's language) when the reference names no language we have examples for."""
    row = LANGUAGES[examples_code(lang_ref)]
    return row.name, list(row.chat_examples)


def english_twins(lang_ref: str | None) -> list[str]:
    """The English versions of the language's examples (empty where we have none)."""
    return list(LANGUAGES[language_of(lang_ref) or "sw"].english_twins)


def check_chat_message(message: str, history: list | None) -> str:
    """The message to send, after the checks that cost nothing (length, empty, turns)."""
    text = capped("message", message, LIMITS.chat_chars).strip()
    if not text:
        raise WorkbenchError("type a message first")
    if len(plain_history(history)) // 2 >= LIMITS.chat_turns:
        raise WorkbenchError(f"this conversation has {LIMITS.chat_turns} turns; press Clear to "
                             "start again")
    return text


def _plain_text(content) -> str | None:
    """A turn's text: a string, or Gradio's list of text parts; None for anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        parts = [p if isinstance(p, str) else p.get("text") if isinstance(p, dict)
                 and p.get("type", "text") == "text" else None for p in content]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)
    return None


def plain_history(history: list | None) -> list[dict]:
    """The conversation the page sent back as [{"role", "content": str}], checked: plain-text
    turns alternating user, assistant (as chat templates expect), LIMITS.history_chars in all."""
    if not history:
        return []
    if not isinstance(history, (list, tuple)):
        raise WorkbenchError("chat history: expected a list of turns; press Clear to start again")
    out, total = [], 0
    for i, turn in enumerate(history):
        role = turn.get("role") if isinstance(turn, dict) else None
        if role not in ("user", "assistant"):
            raise WorkbenchError(f"chat history: only user and assistant turns are accepted, not "
                                 f"{str(role)[:20]!r}; press Clear to start again")
        if role != ("user", "assistant")[i % 2]:
            raise WorkbenchError("chat history: turns must alternate user, assistant; press Clear "
                                 "to start again")
        text = _plain_text(turn.get("content"))
        if text is None:
            raise WorkbenchError(f"chat history: turn {i + 1} is not plain text; press Clear to "
                                 "start again")
        total += len(text)
        if total > LIMITS.history_chars:
            raise WorkbenchError(f"this conversation is longer than {LIMITS.history_chars} "
                                 "characters; press Clear to start again")
        out.append({"role": role, "content": text})
    if len(out) % 2:
        raise WorkbenchError("chat history: the last question has no answer; press Clear to start "
                             "again")
    return out


@dataclass
class ChatReply:
    history: list[dict]       # the pane: the earlier turns, the question, the answer so far
    dropped: int = 0          # earliest turns left out of the prompt to fit the context window
    stopped: bool = False     # the request's time ran out: the answer is cut short

    def note(self) -> str:
        notes = []
        if self.dropped:
            notes.append(f"{self.dropped} earlier turn{'s' if self.dropped > 1 else ''} left out "
                         "to fit the model's context")
        if self.stopped:
            notes.append(f"stopped: this server allows {LIMITS.request_seconds} s per request")
        return "; ".join(notes)


def chat_turn(session: Session, message: str, history: list[dict] | None, role: str = "merged",
              max_new_tokens: int = 128, temperature: float = 0.0,
              repetition_penalty: float = 1.0, deadline: float | None = None
              ) -> Iterator[ChatReply]:
    """Stream one answer (greedy unless temperature > 0): yields the reply, answer growing.
    The GSM8K calculator fills in the result of every ``<<expr=`` note the model writes (as in
    the demo's evaluation; ``inference.calculator``).

    The prompt keeps the newest turns that fit the model's context; generation stops at
    ``deadline`` (``time.monotonic()``; default LIMITS.request_seconds from now)."""
    text = check_chat_message(message, history)
    max_new_tokens = bounded("max new tokens", max_new_tokens, 1,
                             limits_for(session.access).new_tokens)
    turns = plain_history(history)
    what = session.what(role)
    deadline = time.monotonic() + LIMITS.request_seconds if deadline is None else deadline
    answer = {"role": "assistant", "content": ""}
    reply = ChatReply(turns + [{"role": "user", "content": text}, answer])
    job = session.job("chat", what, turns=turns, text=text, max_new_tokens=max_new_tokens,
                      temperature=float(temperature),
                      repetition_penalty=float(repetition_penalty), deadline=deadline,
                      calculator=True)
    stream = dispatcher().stream(job)
    try:
        for out in stream:
            answer["content"] = out["content"]
            reply.dropped, reply.stopped = out["dropped"], out["stopped"]
            if not reply.stopped or out["content"]:
                yield reply
    finally:
        stream.close()  # the engine goes back at once, even when the page stops listening
    if not answer["content"].strip():
        answer["content"] = ("(no answer: the time ran out)" if reply.stopped
                             else "(no answer: the model stopped at once)")
    yield reply
