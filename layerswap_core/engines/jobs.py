"""Jobs: plain data in, plain data out, run on one engine held from the plan to the last token.

A ``Job`` names its kind, the ``Trio`` of its engine, the visitor (page) it is for and the
person behind it, what the engine
shows (``what``: a role "base" / "task" / "lang", a merge config as a dict, or for an evaluation
{label: either}), its items (``evaluation.data.Item``) and its settings (generation settings and
the like). Every field pickles: the same job runs in this process or in a ZeroGPU worker.

``run_job(engine, job, progress)`` shows the job's own plan on the engine (only the tensors
whose source changed are rewritten) and runs it; ``stream_job`` does the same for the streaming
kinds (chat), yielding plain dicts. Long evaluations are split (``split``) into chunks of one
model and a few items, each a job of its own, and their results put back together
(``combine``); a short job then waits at most one chunk. Kinds beyond the built-in ones are
registered from above with ``register_kind`` (e.g. the workbench's demo result).
"""
from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Any
from collections.abc import Callable, Iterator

from ..progress import Progress, Tally, pausing
from .pool import Engine, Trio
from ..checkpoints.tokenizers import encode_prompt
from ..inference.chat import chat as generate_chat, chat_prompt
from ..evaluation.runner import (default_exemplars, mean_nll, run_side_by_side, summarize,
                                 task_nll, task_record)
from ..merge.config import MergeConfig

ROLES = ("base", "task", "lang")
DEFAULT_TOKENS_PER_SECOND = 20.0   # before an engine has measured itself (a CPU, batch of one)
# before an engine has measured a scoring job: a gold NLL of a 135M model on a 2-core CPU,
# its configuration shown, took 1.2-1.5 s an item (a 24-configuration sweep of 8 items: 277 s)
DEFAULT_ITEM_SECONDS = 1.5
STARTUP_SECONDS = 10.0             # loading or switching a live model, per job


class JobError(ValueError):
    """A job that cannot run as asked (one line for the page)."""


@dataclass
class Job:
    """One unit of work for one engine (module docstring)."""
    kind: str
    trio: Trio
    visitor: str = ""
    what: Any = None
    items: list = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    # who the visitor is across their pages (a signed-in user's name): one heavy job per person
    # (``engines.dispatch``); empty: the page (``visitor``) is the person
    person: str = ""
    # held to the dispatcher's time budget (LAYERSWAP_MAX_JOB_SECONDS): a served visitor's job;
    # False on one's own machine (local mode), where the page shows the estimate instead
    budgeted: bool = True

    @property
    def scores_only(self) -> bool:
        """Whether the job scores items without generating (a gold NLL)."""
        return self.kind == "nll" or self.settings.get("metric") == "nll"

    @property
    def scored_items(self) -> int:
        """Items this job scores, over all its models or configurations."""
        models = len(self.what) if isinstance(self.what, (dict, list)) else 1
        if "work_items" in self.settings:
            return int(self.settings["work_items"])
        return max(1, len(self.items)) * models

    @property
    def generated_tokens(self) -> int:
        """Upper bound of tokens this job generates (for its duration estimate)."""
        tokens = int(self.settings.get("max_new_tokens", 0) or 0)
        if self.kind == "nll" or self.settings.get("metric") == "nll":
            tokens = 1   # one teacher-forced pass per item, counted as one token
        if self.kind == "chat":
            return tokens
        if "work_items" in self.settings:   # a registered kind says how many answers it makes
            return tokens * int(self.settings["work_items"])
        models = len(self.what) if isinstance(self.what, (dict, list)) else 1
        return tokens * max(1, len(self.items)) * models


def estimate_seconds(job: Job, tokens_per_second: float | None = None,
                     item_seconds: float | None = None, loaded: bool = False) -> float:
    """Seconds ``job`` should take: a job that only scores (gold NLL), its items at the seconds
    per item measured on the engine (the model shown included: a sweep's configurations), with
    no start-up when its engine is ``loaded``; else its tokens at the engine's measured speed
    plus start-up."""
    if job.scores_only:
        startup = 0.0 if loaded else STARTUP_SECONDS
        return startup + job.scored_items * (item_seconds or DEFAULT_ITEM_SECONDS)
    rate = tokens_per_second or DEFAULT_TOKENS_PER_SECOND
    return STARTUP_SECONDS + job.generated_tokens / rate


# --------------------------------------------------------------------------- showing
def shown(what) -> Any:
    """What ``LiveModel.show`` takes for a job's ``what``: a role, or a MergeConfig."""
    if isinstance(what, str):
        if what not in ROLES:
            raise JobError(f"unknown model {what!r}: one of {', '.join(ROLES)} or a merge config")
        return what
    if isinstance(what, dict):
        return MergeConfig.from_dict(what)
    raise JobError(f"a job shows a role or a merge config, not {type(what).__name__}")


def show(engine: Engine, what, progress: Progress | None = None):
    """Make the engine's live model show ``what`` (only changed tensors rewritten)."""
    return engine.live.show(shown(what), progress=progress)


def _show_job(engine: Engine, job: Job, progress: Progress | None) -> dict:
    res = show(engine, job.what, progress)
    plan = engine.live.plan
    return {"label": res.label, "rewritten": res.rewritten, "total": res.total,
            "seconds": res.seconds, "summary": plan.summary_text() if plan is not None else "",
            "pid": os.getpid()}   # the process that holds the engine (a ZeroGPU worker's)


# --------------------------------------------------------------------------- evaluation
def tally(job: Job) -> Tally:
    """Where ``job`` is in the job it was split from (``split`` puts it in ``settings["part"]``);
    a job not split is a whole: its models (or configurations) times its items."""
    part = job.settings.get("part")
    if part is not None:
        return Tally(**part)
    units = len(job.what) if isinstance(job.what, (dict, list)) else 1
    return Tally(units, len(job.items))


def _evaluate_job(engine: Engine, job: Job, progress: Progress | None) -> dict:
    """Side-by-side evaluation (``evaluation.runner.run_side_by_side``) of the models in
    ``job.what`` ({label: role or config dict}), each shown on the engine just before its run
    (the tensors it rewrites counted on the bar)."""
    s = job.settings
    if not job.items:
        raise JobError("no items to evaluate")
    count = tally(job)

    def model_of(index, label, what):
        def get():
            show(engine, what, lambda f, m: count.say(
                progress, index, label, 0, f"setting up the model ({f:.0%})"))
            return engine.live.model, engine.live.tokenizer
        return get

    models = {label: model_of(i, label, w) for i, (label, w) in enumerate(job.what.items())}
    t0 = time.perf_counter()
    res = run_side_by_side(models, job.items, shots=s.get("shots", 0), cot=bool(s.get("cot")),
                           chat_template=bool(s.get("chat_template")),
                           max_new_tokens=s.get("max_new_tokens"),
                           batch_size=s.get("batch_size", 16), exemplars=s.get("exemplars"),
                           with_nll=s.get("with_nll", True), device=None, progress=progress,
                           tally=count)
    engine.measured(job.generated_tokens, time.perf_counter() - t0)
    return {"rows": res.rows, "summary": res.summary, "config": res.config}


def _nll_job(engine: Engine, job: Job, progress: Progress | None) -> dict:
    """The gold NLL of ``job.items`` on the model ``job.what`` (a role or a config dict), without
    generating (``evaluation.runner.task_nll`` over the items' task record):
    {"summary": [{"model", "n", "mean_gold_nll"}], "nlls": one per item}."""
    s = job.settings
    if not job.items:
        raise JobError("no items to score")
    exemplars = s.get("exemplars")
    if exemplars is None:
        exemplars = default_exemplars(job.items, s.get("shots", 0), cot=bool(s.get("cot")))
    task = task_record(job.items, exemplars, cot=bool(s.get("cot")),
                       chat_template=bool(s.get("chat_template")))
    if task.target is None:
        raise JobError("gold NLL needs worked solutions: use GSM-Symbolic items")
    label = job.what if isinstance(job.what, str) else "merged"
    count = tally(job)
    t0 = time.perf_counter()
    show(engine, job.what, lambda f, m: count.say(progress, 0, label, 0,
                                                 f"setting up the model ({f:.0%})"))
    count.say(progress, 0, label, 0, "scoring the worked solutions")
    nlls = task_nll(task, engine.live.model, engine.live.tokenizer,
                    batch_size=s.get("batch_size", 16),
                    scored=lambda n: count.say(progress, 0, label, n,
                                               "scoring the worked solutions"))
    engine.measured_items(len(job.items), time.perf_counter() - t0)
    count.say(progress, 0, label, len(job.items))
    return {"summary": [{"model": label, "n": len(nlls), "mean_gold_nll": mean_nll(nlls)}],
            "nlls": nlls}


def split(job: Job, chunk_items: int) -> list[Job]:
    """An evaluation as chunks of one model and at most ``chunk_items`` items (same prompts,
    same exemplars and batches of that size: the outputs do not depend on the chunking when the
    batch size is the chunk size). Other kinds: the job itself (a sweep sends each
    configuration as a job of its own: ``workbench.sweep``). Each chunk knows where it is in the
    job (``settings["part"]``, read by ``tally``)."""
    n = len(job.items)
    if job.kind != "evaluate" or not isinstance(job.what, dict):
        return [job]
    return [replace(job, what={label: what}, items=job.items[i:i + chunk_items],
                    settings={**job.settings, "batch_size": chunk_items, "part": dict(
                        units=len(job.what), items=n, first_unit=mi, first_item=i,
                        part_units=1, part_items=len(job.items[i:i + chunk_items]))})
            for mi, (label, what) in enumerate(job.what.items())
            for i in range(0, n, chunk_items)]


def combine(job: Job, parts: list[dict]) -> dict:
    """The results of ``split(job)``'s chunks as one evaluation result (summaries recomputed)."""
    if job.kind != "evaluate" or len(parts) == 1:
        return parts[0]

    per_model = len(parts) // len(job.what)   # chunks per model, in item order
    rows = [{"id": r["id"], "question": r["question"], "gold": r["gold"], "models": {}}
            for part in parts[:per_model] for r in part["rows"]]
    summary = []
    for li, label in enumerate(job.what):
        outs = []
        start = 0
        for part in parts[li * per_model:(li + 1) * per_model]:
            for j, r in enumerate(part["rows"]):
                rows[start + j]["models"][label] = r["models"][label]
                outs.append(r["models"][label])
            start += len(part["rows"])
        nlls = [o["gold_nll"] for o in outs]
        summary.append(summarize(label, [o["correct"] for o in outs],
                                 [o["strict_correct"] for o in outs],
                                 None if all(x is None for x in nlls) else nlls))
    config = dict(parts[0]["config"])
    config["n"] = len(rows)
    config["models"] = {label: "in-memory" for label in job.what}
    return {"rows": rows, "summary": summary, "config": config}


# --------------------------------------------------------------------------- chat
def context_tokens(model) -> int | None:
    """The model's context window in tokens (None when its config does not say)."""
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return getattr(cfg, "max_position_embeddings", None)


def fit_context(model, tok, turns: list[dict], text: str, max_new_tokens: int
                ) -> tuple[list[dict], int]:
    """The newest turns that fit the model's context with the new message and an answer of
    ``max_new_tokens``; also how many earlier turns (question + answer) were left out."""
    context = context_tokens(model)
    question = {"role": "user", "content": text}
    for dropped in range(len(turns) // 2 + 1):
        messages = turns[2 * dropped:] + [question]
        prompt_tokens = len(encode_prompt(tok, chat_prompt(tok, messages)))
        if context is None or prompt_tokens + max_new_tokens <= context:
            return messages, dropped
    raise JobError(f"the message and a {max_new_tokens}-token answer do not fit the model's "
                   f"context ({context} tokens): shorten the message or the answer")


def _chat_job(engine: Engine, job: Job, progress: Progress | None,
              pause: Callable[[], None] | None = None) -> Iterator[dict]:
    """One streamed answer: {"content" so far, "dropped" turns, "stopped" at the deadline}.
    ``settings``: turns, text, max_new_tokens, temperature, repetition_penalty, deadline (a
    ``time.monotonic()`` value: the same clock in a forked worker). ``pause``: the hook of the
    generation's steps (the dispatcher's: it may lend the engine between two tokens)."""
    s = job.settings
    show(engine, job.what, progress)
    model, tok = engine.live.model, engine.live.tokenizer
    # the chat template renders here, between two yields: in this thread, under the job's hook
    # (a Cancel stops a running render: ``prompts``)
    with pausing(pause) if pause is not None else nullcontext():
        messages, dropped = fit_context(model, tok, list(s.get("turns", [])), s["text"],
                                        int(s["max_new_tokens"]))
    deadline = float(s.get("deadline", time.monotonic() + 120))
    out = {"content": "", "dropped": dropped, "stopped": time.monotonic() >= deadline}
    if out["stopped"]:
        yield dict(out)
        return
    t0, count = time.perf_counter(), 0
    with pausing(pause) if pause is not None else nullcontext():
        stream = generate_chat(model, tok, messages, max_new_tokens=int(s["max_new_tokens"]),
                               stream=True, temperature=float(s.get("temperature", 0.0)),
                               repetition_penalty=float(s.get("repetition_penalty", 1.0)),
                               calculator=bool(s.get("calculator", True)), pause=pause)
    try:
        for so_far in stream:
            out["content"] = so_far
            count += 1
            yield dict(out)
            if time.monotonic() >= deadline:
                out["stopped"] = True
                yield dict(out)
                break
    finally:
        stream.close()  # ends the generation thread at its next token
        engine.measured(count, time.perf_counter() - t0)


# --------------------------------------------------------------------------- kinds
KINDS: dict[str, Callable[[Engine, Job, Progress | None], Any]] = {
    "show": _show_job, "evaluate": _evaluate_job, "nll": _nll_job}
STREAMING: dict[str, Callable[[Engine, Job, Progress | None], Iterator]] = {"chat": _chat_job}


def register_kind(name: str, fn: Callable, *, streaming: bool = False) -> None:
    """A job kind defined above this room (it gets the engine, the job and a progress)."""
    (STREAMING if streaming else KINDS)[name] = fn


def run_job(engine: Engine, job: Job, progress: Progress | None = None):
    """Run a (non-streaming) job on an engine the caller holds; its result is plain data."""
    fn = KINDS.get(job.kind)
    if fn is None:
        raise JobError(f"unknown job kind {job.kind!r}" + (" (a streaming kind: stream_job)"
                                                           if job.kind in STREAMING else ""))
    return fn(engine, job, progress)


def stream_job(engine: Engine, job: Job, progress: Progress | None = None,
               pause: Callable[[], None] | None = None) -> Iterator:
    """Run a streaming job on an engine the caller holds for the whole iteration (``pause``:
    the hook of its steps, for a kind that takes one; the thread-local one,
    ``progress.pausing``, does not follow a generator across the threads that resume it)."""
    fn = STREAMING.get(job.kind)
    if fn is None:
        raise JobError(f"{job.kind!r} is not a streaming job kind")
    return fn(engine, job, progress, pause=pause) if pause is not None else fn(engine, job,
                                                                               progress)
