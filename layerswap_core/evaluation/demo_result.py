"""Scoring models on the demo's held-out variants, with paired comparisons.

The headline is graded and per item (``reading_nll``): the teacher-forced NLL of the *English*
worked solution (``reading_target``: the solution, then ``#### N``) after the item's question in
the math expert's chat format, over the whole target and over its answer-bearing tokens (the
final number after ``####``), with the one NLL ``tasks.token_nll``. Each model's per-item values
are compared pairwise (``paired_stats``: the exact sign test, a paired t test and a bootstrap
95% interval of the mean per-item difference, fixed seed); ``summarize`` recomputes every such
figure from the per-item values alone (the stored result is checked that way).

Accuracy (secondary) is a task record (``demo_task``, scored by ``tasks.run_task`` like the side-by-side evaluation).
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

import numpy as np
import torch

from ..checkpoints.tokenizers import encode_continuation, encode_prompt
from ..progress import Progress, say
from .attention import without_cudnn_attention
from .data import Item, normalize_number
from .prompts import render_chat
from .runner import wilson_interval
from .tasks import Extraction, Task, run_task, token_nll

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


# --------------------------------------------------------------------------- the graded measure
def reading_target(item: Item) -> str:
    """The gold continuation of the reading measure: the item's worked solution and its final
    line, exactly as the math expert was trained to write them."""
    return f"{item.solution}\n#### {item.answer}"


def answer_tokens(tokenizer, target_ids: Sequence[int], answer: str) -> int:
    """How many of the target's last tokens carry the final answer: the fewest whose text
    contains ``answer`` (the target is tokenized whole, as in training)."""
    for k in range(1, len(target_ids) + 1):
        if answer in tokenizer.decode(list(target_ids[-k:])):
            return k
    return len(target_ids)


def reading_nll(model, tokenizer, prompts: Sequence[str], targets: Sequence[str],
                answers: Sequence[str], *, token_budget: int = 2048,
                progress: Progress | None = None) -> list[tuple[float, float]]:
    """Per item, (mean NLL per token of the whole target, mean NLL per token of its answer
    tokens) after its prompt, teacher forced. Items are batched by length (left-padded, at most
    ``token_budget`` tokens a batch, one forward pass each); only target positions get logits."""
    pairs = [(encode_prompt(tokenizer, p), encode_continuation(tokenizer, t))
             for p, t in zip(prompts, targets)]
    n_answer = [answer_tokens(tokenizer, t, a) for (_, t), a in zip(pairs, answers)]
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
    batches, batch = [], []
    for i in order:
        width = len(pairs[i][0]) + len(pairs[i][1])
        if batch and (len(batch) + 1) * width > token_budget:
            batches.append(batch)
            batch = []
        batch.append(i)
    if batch:
        batches.append(batch)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out: list[tuple[float, float]] = [(math.nan, math.nan)] * len(pairs)
    done = 0
    with torch.inference_mode(), without_cudnn_attention(device):
        for idx in batches:
            say(progress, done / max(1, len(pairs)), f"{done}/{len(pairs)} items")
            seqs = [pairs[i][0] + pairs[i][1] for i in idx]
            width = max(map(len, seqs))
            ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for row, s in enumerate(seqs):
                ids[row, width - len(s):] = torch.tensor(s)
                mask[row, width - len(s):] = 1
            keep = max(len(pairs[i][1]) for i in idx) + 1
            inputs = dict(input_ids=ids.to(device), attention_mask=mask.to(device),
                          position_ids=(mask.cumsum(1) - 1).clamp(min=0).to(device),
                          use_cache=False)
            try:
                logits = model(**inputs, logits_to_keep=keep).logits
            except TypeError:  # a model class without logits_to_keep
                logits = model(**inputs).logits[:, -keep:]
            for row, i in enumerate(idx):
                t = torch.tensor(pairs[i][1], device=logits.device)
                pred = logits[row, keep - 1 - len(t):keep - 1]
                k = n_answer[i]
                out[i] = (float(token_nll(pred, t)) / len(t),
                          float(token_nll(pred[-k:], t[-k:])) / k)
            done += len(idx)
    say(progress, 1.0, f"{len(pairs)} items")
    return out


def student_t_p(t: float, df: int) -> float:
    """Two-sided p-value of Student's t with ``df`` degrees of freedom (the regularized
    incomplete beta function I_x(df/2, 1/2), x = df / (df + t^2), by its continued fraction)."""
    if df <= 0 or math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    x, a, b = df / (df + t * t), df / 2, 0.5
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):   # the continued fraction converges on the other side
        return 1.0 - _betainc(b, a, 1.0 - x)
    return _betainc(a, b, x)


def _betainc(a: float, b: float, x: float) -> float:
    """I_x(a, b) by Lentz's continued fraction (valid for x < (a + 1) / (a + b + 2))."""
    if x <= 0.0:
        return 0.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        if i == 0:
            num = 1.0
        elif i % 2 == 0:
            num = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            num = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + num / c
        c = c if abs(c) > tiny else tiny
        f *= c * d
        if abs(1.0 - c * d) < 1e-14:
            break
    return front * (f - 1.0)


def bootstrap_ci(values: Sequence[float], *, resamples: int = 10_000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (``resamples`` resamples with
    replacement, numpy's generator seeded with ``seed``: the same interval every run)."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), size=(resamples, len(v)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def paired_stats(a: Sequence[float], b: Sequence[float], *, resamples: int = 10_000,
                 seed: int = 0) -> dict:
    """``a`` against ``b`` item by item (lower is better for an NLL): n, the mean per-item
    difference a - b with its bootstrap 95% interval, the items where ``a`` is lower / higher,
    the exact sign-test p, the paired t and its two-sided p."""
    if len(a) != len(b):
        raise ValueError("paired comparison of different item lists")
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    n = len(d)
    lower, higher = int((d < 0).sum()), int((d > 0).sum())
    mean = float(d.mean()) if n else math.nan
    sd = float(d.std(ddof=1)) if n > 1 else math.nan
    # undefined (None, JSON null) when every difference is the same, e.g. two identical models
    t = mean / (sd / math.sqrt(n)) if n > 1 and sd > 0 else None
    lo, hi = bootstrap_ci(d, resamples=resamples, seed=seed)
    return {"n": n, "mean_difference": mean, "ci_low": lo, "ci_high": hi, "lower": lower,
            "higher": higher, "sign_p": sign_test_p(lower, higher), "t": t,
            "t_p": student_t_p(t, n - 1) if t is not None else None}


TARGETS = ("solution", "answer")   # the two NLLs stored per item: [whole target, answer tokens]


def summarize(items: Sequence[dict], comparisons: Sequence[tuple[str, str]],
              questions: Sequence[str], *, resamples: int = 10_000, seed: int = 0) -> dict:
    """Every statistic of the demo result from its per-item values alone: ``means`` (per
    question, target and model: the mean NLL and its bootstrap 95% interval) and ``paired``
    (per question and target, each (model, vs) of ``comparisons``: ``paired_stats``).
    ``items``: the result's per-item records, ``item["nll"][question][model] = [solution,
    answer]``."""
    means, rows = [], []
    for q in questions:
        models = list(items[0]["nll"][q]) if items else []
        for ti, target in enumerate(TARGETS):
            col = {m: [it["nll"][q][m][ti] for it in items] for m in models}
            for m in models:
                lo, hi = bootstrap_ci(col[m], resamples=resamples, seed=seed)
                means.append({"question": q, "target": target, "model": m,
                              "mean": float(np.mean(col[m])), "ci_low": lo, "ci_high": hi})
            for m, vs in comparisons:
                if m in col and vs in col:
                    rows.append({"question": q, "target": target, "model": m, "vs": vs,
                                 **paired_stats(col[m], col[vs], resamples=resamples, seed=seed)})
    return {"means": means, "paired": rows}


def _p(p: float) -> str:
    return "n/a" if p is None or math.isnan(p) else (f"{p:.2g}" if p >= 1e-4 else "<1e-4")


def reading_table(means: Sequence[dict], questions: dict[str, str],
                  accuracy: Sequence[dict] = ()) -> str:
    """Mean NLL per model (rows) for each question and target (columns), 95% intervals; the
    greedy accuracy beside it where it was run."""
    cols = [(q, t) for q in questions for t in TARGETS]
    cell = {(m["model"], m["question"], m["target"]): m for m in means}
    models = list(dict.fromkeys(m["model"] for m in means))
    acc = {(s["model"], s["lang"]): s for s in accuracy}
    acc_langs = list(dict.fromkeys(s["lang"] for s in accuracy))
    head = [f"{questions[q]}: {'solution' if t == 'solution' else 'answer tokens'}"
            for q, t in cols] + [f"accuracy ({lang})" for lang in acc_langs]
    lines = ["| model | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for m in models:
        cells = []
        for q, t in cols:
            c = cell.get((m, q, t))
            cells.append("" if c is None else f"{c['mean']:.3f} [{c['ci_low']:.3f}, "
                                              f"{c['ci_high']:.3f}]")
        for lang in acc_langs:
            s = acc.get((m, lang))
            cells.append("" if s is None else f"{s['correct']}/{s['n']}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_table(rows: Sequence[dict], questions: dict[str, str]) -> str:
    """The paired comparisons: mean per-item difference (negative: the first model gives the
    gold lower NLL) with its bootstrap 95% interval, items lower / higher, sign-test and t p."""
    lines = ["| first vs second | question | target | mean difference [95% CI] | first lower "
             "/ higher | sign p | t p |", "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} vs {r['vs']} | {questions.get(r['question'], r['question'])}"
                     f" | {r['target']} | {r['mean_difference']:+.4f} [{r['ci_low']:+.4f}, "
                     f"{r['ci_high']:+.4f}] | {r['lower']}/{r['higher']} | {_p(r['sign_p'])} | "
                     f"{_p(r['t_p'])} |")
    return "\n".join(lines)
