"""Scoring models on the demo's held-out variants, with paired comparisons.

A task record (``demo_task``, scored by ``tasks.run_task`` like the side-by-side evaluation).
The prompt is the math expert's training format: the question as the only user turn, rendered
by ``prompts.render_chat`` (the chat template, or the trainer's plain lines); greedy decoding
with the GSM8K calculator (``evaluation.calculator``: the result of each ``<<expr=`` note is
filled in, the same for every model); the answer is the number after the last ``####``, else the
last number of the output. Per model: n, correct, accuracy and its 95% Wilson interval; between
two models on the same items: the exact McNemar test (two-sided binomial test on the items exactly
one of them answers correctly).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..progress import Progress, say
from .data import Item, normalize_number
from .prompts import render_chat
from .runner import wilson_interval
from .tasks import Extraction, Task, run_task

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract(output: str) -> str | None:
    """The number after the last ``####``, else the last number in the output."""
    if "####" in output:
        found = NUMBER.findall(output.rsplit("####", 1)[1])[:1]
    else:
        found = NUMBER.findall(output)[-1:]
    return normalize_number(found[0]) if found else None


def demo_task(items: Sequence[Item], *, max_new_tokens: int = 192,
              calculator: bool = True) -> Task:
    """The demo's held-out variants as a task record: the question as the only user turn, the
    answer ``extract``ed (one answer: strict and flexible alike), exact match with the gold."""
    def answers(output: str) -> Extraction:
        found = extract(output)
        return Extraction(found, found)

    return Task("demo variants", list(items),
                lambda it, tokenizer: render_chat(tokenizer, it.question), answers, lambda answer, gold: answer == gold, max_new_tokens=max_new_tokens,
                calculator=calculator)


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided sign-test p-value: a binomial(wins + losses, 1/2) test of ``wins``."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(wins, losses) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def mcnemar_p(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Exact two-sided McNemar p-value of two models' correctness on the same items (the sign
    test on the items exactly one of them answers correctly)."""
    if len(a) != len(b):
        raise ValueError("paired comparison of different item lists")
    return sign_test_p(sum(1 for x, y in zip(a, b) if x and not y),
                       sum(1 for x, y in zip(a, b) if y and not x))


@dataclass
class Scores:
    """One model on one item list: per-item correctness and outputs."""
    model: str
    lang: str
    correct: list[bool]
    outputs: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        n, k = len(self.correct), sum(self.correct)
        lo, hi = wilson_interval(k, n)
        return {"model": self.model, "lang": self.lang, "n": n, "correct": k,
                "accuracy": k / n if n else 0.0, "ci_low": lo, "ci_high": hi}


def score(name: str, model, tokenizer, items: Sequence[Item], *, max_new_tokens: int = 192,
          batch_size: int = 16, calculator: bool = True,
          progress: Progress | None = None) -> Scores:
    """Greedy answers of one model to ``items`` (the demo prompt, the calculator on unless
    ``calculator`` is False), scored against the gold."""
    task = demo_task(items, max_new_tokens=max_new_tokens, calculator=calculator)
    run = run_task(task, model, tokenizer, batch_size=batch_size, progress=progress)
    return Scores(name, items[0].lang if items else "", run.correct, run.outputs)


def score_models(models: dict[str, Callable[[], tuple]], items: Sequence[Item], *,
                 progress: Progress | None = None, **kw) -> list[Scores]:
    """Each model (a function returning (model, tokenizer), called just before its run) on the
    same items, one after another."""
    out = []
    for i, (name, get) in enumerate(models.items()):
        say(progress, i / len(models), f"{name}: {len(items)} {items[0].lang} variants")
        model, tok = get()
        out.append(score(name, model, tok, items, **kw, progress=lambda f, m, i=i, name=name: say(
            progress, (i + f) / len(models), f"{name}: {m}")))   # Cancel between tokens
    return out


def paired(scores: Sequence[Scores], first: str, others: Sequence[str]) -> list[dict]:
    """McNemar comparisons of ``first`` against each of ``others`` (same language)."""
    by = {s.model: s for s in scores}
    a = by[first].correct
    rows = []
    for o in others:
        b = by[o].correct
        rows.append({"model": first, "vs": o, "lang": by[first].lang,
                     "only_model": sum(1 for x, y in zip(a, b) if x and not y),
                     "only_vs": sum(1 for x, y in zip(a, b) if y and not x),
                     "p_value": mcnemar_p(a, b)})
    return rows


def markdown_table(summaries: Sequence[dict], comparisons: Sequence[dict] = ()) -> str:
    """Accuracy per model and language (95% interval, n), then the paired comparisons."""
    langs = sorted({s["lang"] for s in summaries})
    models = list(dict.fromkeys(s["model"] for s in summaries))
    cell = {(s["model"], s["lang"]): s for s in summaries}
    lines = ["| model | " + " | ".join(langs) + " |", "|---|" + "---|" * len(langs)]
    for m in models:
        cells = []
        for lang in langs:
            s = cell.get((m, lang))
            cells.append("" if s is None else f"{s['accuracy']:.1%} [{s['ci_low']:.1%}, "
                                              f"{s['ci_high']:.1%}] ({s['correct']}/{s['n']})")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    if comparisons:
        lines += ["", "| paired (McNemar, exact) | language | only the first right | "
                      "only the second right | p |", "|---|---|---:|---:|---:|"]
        lines += [f"| {c['model']} vs {c['vs']} | {c['lang']} | {c['only_model']} | "
                  f"{c['only_vs']} | {c['p_value']:.3g} |" for c in comparisons]
    return "\n".join(lines)
