"""The demo result: base, math expert, language expert, layer swaps and a uniform soup on the
held-out GSM-Symbolic variants (``evaluation.variants``), per item, with paired statistics.

The headline is graded (``evaluation.demo_result.reading_nll``): per held-out eval item, the NLL
of the English worked solution (and of its answer tokens) after the *Swahili* question, for
every model. Beside it, two controls: the same measure after the *English* question (what the
models do without any Swahili to read), and each layer swap with its outer layers taken from the
*base* instead of the language expert ("outer layers from the base": does the language expert's
bottom/top add anything the base's do not?). Greedy accuracy is a secondary column, on
``accuracy_n`` of the items (0: not run).

One live model shows every model in turn (``merge.live``). The best layer swap of a small sweep
is chosen on the ``validation`` variants (lowest mean NLL of the same measure), never on the
``eval`` items it is then measured on. ``bench/demo_result.py`` and the app's "Reproduce the demo
result" button both call ``reproduce_demo_result``; the shipped result stores every per-item
value, and ``evaluation.demo_result.summarize`` recomputes its statistics from them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path

import torch

from ..engines.jobs import register_kind
from ..progress import Progress, say
from ..analysis.deltas import delta_stats
from ..analysis.suggest import delta_story, suggest_config
from ..checkpoints.embedded import ASSETS
from ..evaluation.demo_result import (Scores, markdown_table, paired, paired_table,
                                       reading_nll, reading_table, reading_target, score,
                                       summarize)
from ..evaluation.prompts import render_chat
from ..evaluation.variants import SPLIT_SEEDS, variant_items
from ..merge.config import MergeConfig
from ..merge.live import LiveModel
from ..merge.registry import Source
from .figures import reading_chart

SWEEP = ((2, 1), (3, 1), (4, 2), (5, 2), (6, 2), (8, 2))   # (bottom, top) layer counts tried
QUESTIONS = {"sw": "Swahili question", "en": "English question (control)"}
RESULT_FILE = "demo_result.json"   # the measured result, shipped beside the demo experts
DEFAULT, BEST, SOUP = "layer swap (default)", "layer swap (best on validation)", "uniform soup"
EXPERTS = ("math expert", "language expert")
REVERTED = " with the base's outer layers"   # control (b): suffix of a swap's name


def spread(items: list, n: int) -> list:
    """``n`` items evenly spaced over the list (all when ``n`` >= its length): the variant lists
    are in template order, so a spread sample covers every template, a prefix only the first."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def best_of(sweep: list[dict]) -> dict:
    """The sweep's best row: lowest mean validation NLL, the smaller swap on ties."""
    return min(sweep, key=lambda r: (r["nll"], r["bottom"] + r["top"]))


def suggestion(refs: dict) -> dict:
    """What the Deltas tab suggests for these experts (``analysis.suggest_config``) and its
    one-sentence story, to report beside the sweep's choice."""

    task = delta_stats(refs["base"], refs["task"], label="math expert")
    lang = delta_stats(refs["base"], refs["lang"], label="language expert")
    s = suggest_config(task, lang, task.num_layers)
    return {**s.merge_config_kwargs(), "story": delta_story(task, lang)}


def outer_from_base(live, config):
    """The plan of a layer swap with the base's layers where the language expert's would be
    (control (b): the swap's precondition)."""

    plan = live.plan_for(config)
    lang, base = Source.copy("lang"), Source.copy("base")
    sources = {n: base if s == lang and live.arch.classify(n).layer is not None else s
               for n, s in plan.sources.items()}
    return dataclasses.replace(plan, sources=sources)


def comparisons(models: list[str]) -> list[tuple[str, str]]:
    """(model, vs) pairs reported: each merge against each expert and the soup; each
    base-outer-layers control against its swap and the math expert."""
    pairs = []
    for m in (DEFAULT, BEST, SOUP):
        pairs += [(m, vs) for vs in (*EXPERTS, SOUP) if vs != m]
    for m in (DEFAULT, BEST):
        pairs += [(m + REVERTED, m), (m + REVERTED, "math expert")]
    return [(a, b) for a, b in pairs if a in models and b in models]


def weights_fingerprint(model) -> str:
    """A digest of every parameter and buffer of ``model`` (names and bytes): two models shown
    in turn with equal digests compute the same function, so one measurement serves both."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().data)
    return h.hexdigest()


def _item_record(item) -> dict:

    _, split, template, k = item.id.split("-")
    return {"id": item.id, "template": int(template), "seed": SPLIT_SEEDS[split] + int(template),
            "variant": int(k), "gold": item.answer, "nll": {}}


def reproduce_demo_result(refs: dict, n: int = 264, n_validation: int = 33,
                          accuracy_n: int = 0, progress: Progress | None = None,
                          max_new_tokens: int = 192, dtype=None, live=None,
                          resamples: int = 10_000, seed: int = 0) -> dict:
    """The demo result as data (module docstring): ``items`` (per eval item: id, template,
    seed, variant, gold; ``nll[question][model] = [solution, answer]``; outputs and correctness
    where accuracy ran), ``means`` and ``paired`` (``summarize``), the validation ``sweep`` and
    the ``best`` swap, ``accuracy`` (None, or per-model summaries and McNemar tests),
    ``markdown`` and ``seconds``. ``n``: eval items (spread over the templates);
    ``n_validation``: validation items of the sweep. ``dtype``: the live model's (default:
    ``merge.live.live_dtype``). ``live``: a ``LiveModel`` over these refs to use (an engine's);
    default: one made here."""

    t0 = time.time()
    if live is None:
        live = LiveModel.from_refs(refs["task"], refs["lang"], refs.get("base"), dtype=dtype)
    has_base = bool(refs.get("base"))
    L = live.arch.num_layers
    common = dict(task=refs["task"], lang=refs["lang"], base=refs.get("base"))
    tok = live.tokenizer

    def sets(split: str, k: int):
        by = {q: spread(variant_items(q, split), k) for q in ("sw", "en")}
        assert [i.id for i in by["sw"]] == [i.id for i in by["en"]], "unpaired variant sets"
        return by

    val, ev = sets("validation", n_validation), sets("eval", n)
    sweeps = [(b, u) for b, u in SWEEP if b + u < L]
    n_passes = 2 * (6 - (not has_base)) + 2 * has_base   # (model, question) pairs measured
    # in teacher-forced passes; a greedy answer (6 models, 2 languages) costs about 8 of them
    work = len(sweeps) * len(val["sw"]) + n_passes * len(ev["sw"]) + 8 * accuracy_n * 12
    done = [0]

    def measure(items_q: dict, q: str, label: str) -> list[tuple[float, float]]:
        en = items_q["en"]
        prompts = [render_chat(tok, it.question) for it in items_q[q]]
        k = len(prompts)
        res = reading_nll(live.model, tok, prompts, [reading_target(it) for it in en],
                          [it.answer for it in en], progress=lambda f, m: say(
                              progress, (done[0] + f * k) / work, f"{label}: {m}"))
        done[0] += k
        return res

    # the sweep, on validation items: the headline measure (Swahili question), solution NLL
    sweep = []
    for b, u in sweeps:
        live.show(MergeConfig(bottom=b, top=u, **common))
        vals = [v[0] for v in measure(val, "sw", f"sweep on validation: bottom {b}, top {u}")]
        sweep.append({"bottom": b, "top": u, "n": len(vals), "nll": sum(vals) / len(vals)})
    best = best_of(sweep)
    default = MergeConfig.default_for(L, **common)
    chosen = MergeConfig(bottom=best["bottom"], top=best["top"], **common)
    shows = model_shows(common, default, chosen, controls=True)   # none without a base
    records = [_item_record(it) for it in ev["en"]]
    seen: dict[str, str] = {}            # weights digest -> the first model shown with them
    same_weights: dict[str, str] = {}    # model -> an earlier model with bit-equal weights
    for name, what in shows.items():
        if isinstance(what, tuple):
            live.apply_plan(outer_from_base(live, what[1]), name)
        else:
            live.show(what)
        twin = seen.setdefault(weights_fingerprint(live.model), name)
        if twin != name:
            same_weights[name] = twin
        for q in QUESTIONS:
            if REVERTED in name and q != "sw":   # control (b) is of the headline measure only
                continue
            if twin != name and records and q in records[0]["nll"] and twin in records[0]["nll"][q]:
                for r in records:                # the same function: measured once
                    r["nll"][q][name] = list(r["nll"][q][twin])
                done[0] += len(records)
                continue
            for r, v in zip(records, measure(ev, q, f"{name}, {QUESTIONS[q]}")):
                r["nll"].setdefault(q, {})[name] = [v[0], v[1]]
    accuracy = None
    if accuracy_n:
        accuracy = run_accuracy(live, shows, ev, records, accuracy_n, max_new_tokens,
                                lambda m: say(progress, done[0] / work, m),
                                lambda k: done.__setitem__(0, done[0] + 8 * k), same_weights)
    pairs = comparisons(list(shows))
    stats = summarize(records, pairs, list(QUESTIONS), resamples=resamples, seed=seed)
    res = {"version": 2, "n": len(records), "n_validation": len(val["sw"]),
           "questions": QUESTIONS, "models": list(shows), "comparisons": pairs,
           "resamples": resamples, "seed": seed, "items": records, **stats,
           "sweep": sweep, "best": {"bottom": best["bottom"], "top": best["top"]},
           "same_weights": same_weights,
           "default": {"bottom": default.bottom, "top": default.top},
           "suggestion": suggestion(refs) if has_base else None, "accuracy": accuracy,
           "dtype": str(live.dtype).removeprefix("torch."),
           "seconds": round(time.time() - t0, 1)}
    res["markdown"] = result_markdown(res)
    return res


def model_shows(common: dict, default: MergeConfig, chosen: MergeConfig, *,
                controls: bool = False) -> dict:
    """The models of the demo result, name -> what the live model shows (a role, a merge
    config, or ("reverted", config) for a swap with the base's outer layers, the ``controls``);
    without a base, no base row and no controls."""
    shows = {"base": "base", "math expert": "task", "language expert": "lang", DEFAULT: default,
             BEST: chosen, SOUP: MergeConfig(method="soup", **common)}
    if not common.get("base"):
        shows.pop("base")
    elif controls:
        shows[DEFAULT + REVERTED] = ("reverted", default)
        shows[BEST + REVERTED] = ("reverted", chosen)
    return shows


def run_accuracy(live, shows: dict, ev: dict, records: list[dict], accuracy_n: int,
                 max_new_tokens: int, tell=None, advance=None,
                 same_weights: dict | None = None) -> dict:
    """Greedy accuracy (secondary) of every model but the base-outer-layers controls on
    ``accuracy_n`` of the eval items (spread), per question language: per-item outputs and
    correctness into ``records``, and the summaries with McNemar tests of each swap against each
    expert. ``tell(message)`` before each model, ``advance(items)`` after it. A model of
    ``same_weights`` (model -> an earlier one with bit-equal weights) is scored by copying."""

    acc_items = {q: spread(ev[q], accuracy_n) for q in QUESTIONS}
    at = {r["id"]: r for r in records}
    summaries, tests = [], []
    for q in QUESTIONS:
        scores = []
        for name, what in shows.items():
            if REVERTED in name:
                continue
            if tell:
                tell(f"accuracy: {name}, {len(acc_items[q])} {q} items")
            twin = next((t for t in scores if t.model == (same_weights or {}).get(name)), None)
            if twin is not None:   # the same function: scored once
                s = Scores(name, twin.lang, list(twin.correct), list(twin.outputs))
            else:
                live.show(what)
                s = score(name, live.model, live.tokenizer, acc_items[q],
                          max_new_tokens=max_new_tokens)
            if advance:
                advance(len(acc_items[q]))
            scores.append(s)
            summaries.append(s.summary())
            for it, out, ok in zip(acc_items[q], s.outputs, s.correct):
                at[it.id].setdefault("accuracy", {}).setdefault(q, {})[name] = {
                    "output": out, "correct": ok}
        for swap in (DEFAULT, BEST):
            tests += paired(scores, swap, list(EXPERTS))
    return {"n": len(acc_items["sw"]), "max_new_tokens": max_new_tokens,
            "summaries": summaries, "comparisons": tests}


def add_accuracy(res: dict, refs: dict, accuracy_n: int, max_new_tokens: int = 192,
                 dtype=None, progress: Progress | None = None) -> dict:
    """A stored result with the accuracy column (re)measured: the same items, the same default
    and chosen swaps (``res["default"]``, ``res["best"]``), nothing else rerun."""

    t0 = time.time()
    live = LiveModel.from_refs(refs["task"], refs["lang"], refs.get("base"), dtype=dtype)
    common = dict(task=refs["task"], lang=refs["lang"], base=refs.get("base"))
    shows = model_shows(common, MergeConfig(**res["default"], **common),
                        MergeConfig(**res["best"], **common))
    ids = [r["id"] for r in res["items"]]
    ev = {}
    for q in QUESTIONS:
        by_id = {it.id: it for it in variant_items(q, "eval")}
        ev[q] = [by_id[i] for i in ids]
    for r in res["items"]:
        r.pop("accuracy", None)
    done, total = [0], len(QUESTIONS) * len(shows) * min(accuracy_n, len(ids))
    res["accuracy"] = run_accuracy(live, shows, ev, res["items"], accuracy_n, max_new_tokens,
                                   lambda m: say(progress, done[0] / max(1, total), m),
                                   lambda k: done.__setitem__(0, done[0] + k),
                                   res.get("same_weights"))
    res["seconds"] = round(res["seconds"] + time.time() - t0, 1)
    res["markdown"] = result_markdown(res)
    return res


def result_markdown(res: dict) -> str:
    """The headline table (mean NLL per model, both questions), then the paired comparisons of
    the headline measure and its controls."""

    acc = res.get("accuracy") or {}
    text = reading_table(res["means"], res["questions"], acc.get("summaries", ()))
    text += "\n\n" + paired_table(res["paired"], res["questions"])
    if acc:
        text += "\n\nAccuracy (secondary; greedy, GSM8K calculator, on " \
                f"{acc['n']} of the items, evenly spaced over the templates):\n\n" + \
                markdown_table(acc["summaries"], acc["comparisons"])
    return text


def measured_demo_result(path: str | Path | None = None) -> dict | None:
    """The shipped measurement (``bench/demo_result.py --json``), with its markdown tables
    rebuilt from the stored statistics; None when none is shipped (or an older format)."""

    p = Path(path) if path else ASSETS / RESULT_FILE
    if not p.is_file():
        return None
    res = json.loads(p.read_text())
    if res.get("version") != 2:
        return None
    res["comparisons"] = [tuple(c) for c in res["comparisons"]]
    res["markdown"] = result_markdown(res)
    return res


def _row(res: dict, model: str, vs: str, question: str = "sw", target: str = "solution"):
    return next((r for r in res["paired"] if (r["model"], r["vs"], r["question"], r["target"])
                 == (model, vs, question, target)), None)


def _said(r: dict | None) -> str:
    return "" if r is None else (
        f"{r['mean_difference']:+.3f} (95% CI {r['ci_low']:+.3f} to {r['ci_high']:+.3f}; lower "
        f"on {r['lower']} of {r['n']} items, sign test p = {r['sign_p']:.2g})")


def headline(res: dict) -> str:
    """The one sentence of what the result shows, with its measured numbers, whichever way they
    go: the default swap against the math expert on the headline measure, then the two
    controls."""
    main = _row(res, DEFAULT, "math expert")
    if main is None:
        return ""
    d = res["default"]
    text = (f"On {res['n']} held-out variants, the default layer swap (bottom {d['bottom']}, top "
            f"{d['top']}) minus the math expert, in mean NLL per token of the English worked "
            f"solution after the Swahili question: {_said(main)}")
    en = _row(res, DEFAULT, "math expert", "en")
    if en:
        text += f"; the same after the English question (control): {_said(en)}"
    rev = _row(res, DEFAULT + REVERTED, DEFAULT)
    if rev:
        text += (f"; the swap with the base's outer layers instead of the language expert's, "
                 f"minus the swap: {_said(rev)}")
    b = res.get("best") or {}
    best_sw, best_en = _row(res, BEST, "math expert"), _row(res, BEST, "math expert", "en")
    if best_sw and (b.get("bottom"), b.get("top")) != (d["bottom"], d["top"]):
        text += (f". The swap chosen on the validation variants (bottom {b['bottom']}, top "
                 f"{b['top']}) minus the math expert: {_said(best_sw)} after the Swahili question"
                 + (f", {_said(best_en)} after the English one" if best_en else ""))
    text += ". Negative: a lower NLL, the better reading."
    same = _row(res, DEFAULT + REVERTED, "math expert")
    if same and same["lower"] == same["higher"] == 0:
        text += (" With these experts a swap with the base's outer layers is the math expert "
                 "itself (the math expert's outer layers are the base's).")
    return text


def sweep_markdown(res: dict) -> str:
    """The sweep on the validation variants and the suggestion of the delta analysis, in words."""
    rows = " · ".join(f"b={r['bottom']} u={r['top']}: {r['nll']:.4f}" for r in res["sweep"])
    best = res["best"]
    text = (f"Sweep on {res['n_validation']} validation variants (mean NLL of the English "
            f"solution after the Swahili question; never the eval items): {rows}; best bottom "
            f"{best['bottom']}, top {best['top']}.")
    s = res.get("suggestion")
    if s:
        text += (f" The Deltas tab suggests bottom {s['bottom']}, top {s['top']}, transitions "
                 f"{s['transition_bottom']}/{s['transition_top']}"
                 + (f", partition {s['partition']}" if s.get("partition") else "") + ".")
    return text


def measured_markdown() -> str:
    """The Evaluate tab's account of the shipped measurement."""
    res = measured_demo_result()
    if res is None:
        return "No measured demo result is shipped with this install."
    acc = res.get("accuracy")
    return (f"**Measured** with `python bench/demo_result.py --n {res['n']} --n-validation "
            f"{res['n_validation']}`" + (f" (accuracy on {acc['n']} of the items)" if acc else "")
            + f", {res['seconds'] / 60:.0f} min on a shared 2-core CPU, {res['dtype']}. "
            + headline(res) + "\n\nMean NLL (nats/token, lower is better) of the English "
            "worked solution, and of its answer tokens, after each question; 95% bootstrap "
            f"intervals ({res['resamples']} resamples, seed {res['seed']}):\n\n"
            + res["markdown"] + "\n\n" + sweep_markdown(res))


def result_chart(res: dict):
    """The headline chart: each merge's mean per-item NLL difference against the math expert,
    with 95% intervals, after the Swahili question and after the English one (control a); the
    swaps with the base's outer layers are bars of their own (control b). The base and the
    language expert, ten times further off, are left to the tables: on one axis with them the
    merges' differences would not show."""

    models = [m for m in res["models"] if m not in ("math expert", "base", "language expert")]
    return reading_chart(res["paired"], "math expert", models, res["questions"],
                         title=f"English solution NLL minus the math expert's, per item "
                         f"({res['n']} held-out variants; 95% bootstrap intervals; base and "
                         f"language expert in the tables)")


def measured_chart():
    """``result_chart`` of the shipped result; None when none is shipped."""
    res = measured_demo_result()
    return None if res is None else result_chart(res)


def _demo_result_job(engine, job, progress=None) -> dict:
    """The "demo_result" job kind: ``reproduce_demo_result`` on the job's engine (settings: n,
    n_validation, accuracy_n, max_new_tokens)."""
    settings = {k: v for k, v in job.settings.items() if k != "work_items"}
    return reproduce_demo_result(job.trio.refs, live=engine.live, progress=progress, **settings)


register_kind("demo_result", _demo_result_job)
