"""The Evaluate tab: the chosen models side by side on the first items of a data set.

One job (``engines.jobs``, kind "evaluate") runs the roles on an engine shared with the other
visitors on these models, in chunks of one model and a few items (``engines.jobs.split``), so
another visitor's short job waits at most one chunk; ``evaluation.runner`` does the prompting,
generation and scoring.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .served import LIMITS, Progress, WorkbenchError, bounded
from .session import ROLE_LABELS, Session, dispatcher


@dataclass
class EvalResult:
    headers: list[str]
    rows: list[list]
    summary_rows: list[list]
    figure: Any
    raw: Any = None


def evaluate_roles(session: Session, source: str = "mgsm", lang: str = "sw", n: int = 2,
                   shots: int = 2, cot: bool = False,
                   roles: tuple[str, ...] = ("base", "task", "lang", "merged"),
                   max_new_tokens: int = 64, chat_template: bool = False,
                   progress: Progress | None = None) -> EvalResult:
    """Side-by-side evaluation of the chosen models on the first ``n`` items."""
    from . import figures as plots
    from ..evaluation.data import load_items
    from ..evaluation.runner import SideBySideResult, default_exemplars

    n = bounded("number of questions", n, 1, LIMITS.eval_questions)
    shots = bounded("shots", shots, 0, LIMITS.shots)
    max_new_tokens = bounded("max new tokens", max_new_tokens, 1, LIMITS.new_tokens)
    if not roles:
        raise WorkbenchError("choose at least one model to evaluate")
    what = {ROLE_LABELS[r]: session.what(r) for r in roles}
    available = load_items(source, lang)
    items = available[:n]
    exemplars = default_exemplars(items, shots, cot=bool(cot))  # once, for every chunk
    job = session.job("evaluate", what, items, shots=shots, cot=bool(cot),
                      chat_template=bool(chat_template), max_new_tokens=max_new_tokens,
                      exemplars=exemplars, with_nll=True)
    result = SideBySideResult(**dispatcher().run(job, progress))
    result.config["items_available"] = len(available)
    headers, rows = _table(result)
    return EvalResult(headers, rows, _summary_rows(result), plots.accuracy_bars(result.summary),
                      result)


def evaluation_note(res: EvalResult) -> str:
    """What the numbers are: how many items out of the data set, and the exemplars used."""
    c = res.raw.config
    total = res.raw.config.get("items_available")
    sample = (f"the first {c['n']} of {total} items: a sample, not the benchmark's score"
              if total and c["n"] < total else f"{c['n']} items")
    shots = f"{c['shots']}-shot ({c.get('exemplar_source', 'no exemplars')})" if c["shots"] \
        else "0-shot"
    return f"Evaluated {c['data']} {c['lang']}: {sample}, {shots}, {c['format']} answers."


def _table(result) -> tuple[list[str], list[list]]:
    """One row per question: gold, each model's extracted answer with a mark, then the outputs."""
    models = result.models
    headers = ["#", "question", "gold", *models, *(f"{m}: output" for m in models)]
    rows = []
    for i, r in enumerate(result.rows):
        outs = [r["models"][m] for m in models]
        rows.append([i + 1, r["question"], r["gold"],
                     *(f"{o['answer'] or '-'} {'✓' if o['correct'] else '✗'}" for o in outs),
                     *(o["output"].strip() for o in outs)])
    return headers, rows


SUMMARY_HEADERS = ["model", "accuracy", "95% CI", "strict", "gold NLL", "n"]


def _summary_rows(result) -> list[list]:
    return [[s["model"], f"{s['accuracy']:.2f}", f"[{s['ci_low']:.2f}, {s['ci_high']:.2f}]",
             f"{s['strict_accuracy']:.2f}",
             "" if s.get("mean_gold_nll") is None else f"{s['mean_gold_nll']:.3f}", s["n"]]
            for s in result.summary]


