"""The Evaluate tab: the chosen models side by side on the first items of a data set.

One job (``engines.jobs``, kind "evaluate") runs the roles on an engine shared with the other
visitors on these models, in chunks of one model and a few items (``engines.jobs.split``), so
another visitor's short job waits at most one chunk; ``evaluation.runner`` does the prompting,
generation and scoring.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .served import Progress, WorkbenchError, bounded, limits_for
from .session import ROLE_LABELS, Session, dispatcher
from ..evaluation.data import mgsm_help, mgsm_reachable
from ..evaluation.registry import (by_label, default_exemplars, load_items, task_spec,
                                   training_overlap)
from ..demos import variants as _demo_task  # noqa: F401  (registers the demo-variants task)
from ..evaluation.runner import SideBySideResult, summary_cells
from . import figures as plots


@dataclass
class EvalResult:
    headers: list[str]
    rows: list[list]
    summary_rows: list[list]
    figure: Any
    raw: Any = None


# --------------------------------------------------------------------------- what fits the budget
# Caps leave a fifth of the time budget for a server slower than last measured: what the page
# offers is admitted (``engines.dispatch``) after a job measured a speed up to 20% lower.
HEADROOM = 0.8
DEFAULT_ROLES = ("base", "task", "lang", "merged")


def session_roles(session: Session) -> tuple[str, ...]:
    """The models the Evaluate tab can run on this session (no base: three)."""
    return tuple(r for r in DEFAULT_ROLES if r != "base" or session.has_base)


def evaluation_seconds(session: Session, n: int, max_new_tokens: int,
                       roles: tuple[str, ...] = DEFAULT_ROLES) -> float:
    """The dispatcher's estimate of an evaluation of ``n`` questions, ``max_new_tokens`` each,
    over ``roles``, at the speed measured on the session's models (the number it admits the
    job by, and asks ZeroGPU for)."""
    job = session.job("evaluate", {r: r for r in roles}, [None] * int(n),
                      max_new_tokens=int(max_new_tokens))
    return dispatcher().estimate(job)


def evaluation_caps(session: Session) -> tuple[int, int]:
    """(questions, max new tokens): the Evaluate sliders' maxima on this server. Every model
    at both maxima is estimated within ``HEADROOM`` of the job budget; the server's limits
    (``LIMITS``) scaled down together when it is not."""
    limits = limits_for(session.access)
    questions, tokens = limits.eval_questions, limits.new_tokens
    if not session.access.served:   # one's own machine: no job budget (the estimate is shown)
        return questions, tokens
    roles, budget = session_roles(session), HEADROOM * dispatcher().job_seconds
    for percent in range(100, 0, -1):
        n = max(1, questions * percent // 100)
        t = max(8, tokens * percent // 100 // 8 * 8)    # the slider's steps of 8
        if evaluation_seconds(session, n, t, roles) <= budget:
            return n, t
    return 1, 8


def minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def speed_words(session: Session, scoring: bool = False) -> str:
    """The measured speed an estimate rests on: tokens per second for generation, seconds per
    scored item for a gold-NLL job (``scoring``)."""
    if scoring:
        per = dispatcher().item_seconds.get(session.trio)
        if per is None:
            return "at an assumed speed: none measured on these models yet"
        return f"at {per:.2f} s per scored item, measured on these models here"
    speed = dispatcher().speeds.get(session.trio)
    if speed is None:
        return "at an assumed speed: none measured on these models yet"
    return f"at {speed:.1f} tokens/s, measured on these models here"


def estimate_line(seconds: float, session: Session, scoring: bool = False) -> str:
    """The estimate of a job before it runs, against the server's budget (one line)."""
    budget = dispatcher().job_seconds
    speed = speed_words(session, scoring)
    if not session.access.served:
        return f"About {minutes(seconds)} ({speed})."
    if seconds > budget:
        return (f"⚠ About {minutes(seconds)} ({speed}): over the "
                f"{minutes(budget)} this server allows per job.")
    return f"About {minutes(seconds)} ({speed}); this server allows {minutes(budget)} per job."


def evaluation_line(session: Session | None, n, max_new_tokens, roles) -> str:
    """The Evaluate tab's estimate as the sliders stand (``roles`` by role or label)."""
    if session is None:
        return ""
    labels = {label: role for role, label in ROLE_LABELS.items()}
    roles = tuple(labels.get(r, r) for r in roles or ())
    if not roles:
        return "Choose at least one model."
    return estimate_line(evaluation_seconds(session, n, max_new_tokens, roles), session)


def data_default() -> tuple[str, str]:
    """The data set the Evaluate and Sweep tabs start on, and a one-line note (plain text).

    MGSM when it is on this machine or can be downloaded (online); else GSM-Symbolic, which
    ships with the package, and the note says how to get MGSM."""
    if mgsm_reachable():
        return "mgsm", ""
    return "gsm-symbolic", f"GSM-Symbolic is selected because {mgsm_help()}."


def evaluate_roles(session: Session, source: str = "mgsm", lang: str = "sw", n: int = 2,
                   shots: int = 2, cot: bool = False,
                   roles: tuple[str, ...] = ("base", "task", "lang", "merged"),
                   max_new_tokens: int = 64, chat_template: bool = False,
                   progress: Progress | None = None) -> EvalResult:
    """Side-by-side evaluation of the chosen models on the first ``n`` items."""
    limits = limits_for(session.access)
    n = bounded("number of questions", n, 1, limits.eval_questions)
    shots = bounded("shots", shots, 0, limits.shots)
    max_new_tokens = bounded("max new tokens", max_new_tokens, 1, limits.new_tokens)
    if not roles:
        raise WorkbenchError("choose at least one model to evaluate")
    what = {ROLE_LABELS[r]: session.what(r) for r in roles}
    spec = task_spec(source)
    if spec.prepare is not None:   # MGSM on first use online: downloaded, and the page says so
        spec.prepare(lambda msg: progress and progress(0.0, msg))
    available = load_items(source, lang)
    items = available[:n]
    exemplars = default_exemplars(items, shots, cot=bool(cot))  # once, for every chunk
    job = session.job("evaluate", what, items, shots=shots, cot=bool(cot),
                      chat_template=bool(chat_template), max_new_tokens=max_new_tokens,
                      exemplars=exemplars, with_nll=True)
    result = SideBySideResult(**dispatcher().run(job, progress))
    result.config["items_available"] = len(available)
    result.config["training"] = training_notes(session, roles, items)
    headers, rows = _table(result)
    return EvalResult(headers, rows, _summary_rows(result), plots.accuracy_bars(result.summary),
                      result)


def training_notes(session: Session, roles, items) -> list[tuple[bool, str]]:
    """(clean, sentence) per evaluated model whose card says which GSM-Symbolic templates it
    was trained on (``registry.training_overlap``: the sentence ``layerswap eval`` prints); the
    merged model holds the experts' layers, so it inherits what theirs say."""
    said = {r: training_overlap(ROLE_LABELS[r], path, items)
            for r, path in session.paths.items()}
    notes = [said[r] for r in roles if said.get(r)]
    dirty = [ROLE_LABELS[r] for r in ("task", "lang") if said.get(r) and not said[r].clean]
    if "merged" in roles and dirty:
        notes.append((False, f"merged: it holds layers of the {' and the '.join(dirty)}, so "
                             "the templates named for them are not a clean test for it either."))
    return [tuple(n) for n in notes]


def evaluation_note(res: EvalResult) -> str:
    """What the numbers are: how many items out of the data set, and the exemplars used."""
    c = res.raw.config
    total = res.raw.config.get("items_available")
    sample = (f"the first {c['n']} of {total} items: a sample, not the benchmark's score"
              if total and c["n"] < total else f"{c['n']} items")
    shots = f"{c['shots']}-shot ({c.get('exemplar_source', 'no exemplars')})" if c["shots"] \
        else "0-shot"
    text = f"Evaluated {c['data']} {c['lang']}: {sample}, {shots}, {c['format']} answers."
    spec = by_label(c["data"])
    if spec is not None and spec.note:   # MGSM: its licence, and why gold NLL is blank
        text += " " + spec.note
    for clean, sentence in c.get("training", ()):
        text += "\n\n" + ("" if clean else "⚠ ") + sentence
    return text


def _table(result) -> tuple[list[str], list[list]]:
    """One row per question: gold and each model's extracted answer with a mark first (every
    model visible without scrolling), then the question and the outputs."""
    models = result.models
    headers = ["#", "gold", *models, "question", *(f"{m}: output" for m in models)]
    rows = []
    for i, r in enumerate(result.rows):
        outs = [r["models"][m] for m in models]
        rows.append([i + 1, r["gold"],
                     *(f"{o['answer'] or '-'} {'✓' if o['correct'] else '✗'}" for o in outs),
                     r["question"],
                     *(o["output"].strip() for o in outs)])
    return headers, rows


SUMMARY_HEADERS = ["model", "accuracy", "95% CI", "strict", "gold NLL", "n"]


def _summary_rows(result) -> list[list]:
    """The CLI's table cells (``runner.summary_cells``), one row per model."""
    return [[s["model"], *summary_cells(s)[:-1], s["n"]] for s in result.summary]


