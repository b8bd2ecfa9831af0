"""The demo result reproduced: does a layer swap read the question better than the math expert?

The measure (``demos.measure``): per held-out eval variant, the teacher-forced NLL of the item's
*English* worked solution after its own question in the trio's language (``demos.trios``:
Swahili, Bengali), and after that language's question of *another* template's item of similar
length (the mismatched-question control, ``mismatched_partners``); the same after the English
questions. A swap that starts English solutions better whatever was asked gains in both; only
what it gains after its own question and not after another one depends on reading the
question. So the primary statistic
(``effect_specs``, declared before the run) is that question-specific difference of the chosen
swap against the math expert after the trio's question, pooled over the language expert's
seeds, with templates as the unit. The first ``FIRST_K`` solution tokens are stored apart from
the rest; the answer tokens only where the solution does not already write the answer.

Models: the math expert; the swap chosen on the *validation* variants (the same primary
measure, the math expert itself, "no swap", among the choices) with each seed's language
expert; the app's default swap (first seed); and a control for the outer layers that can fail:
the chosen swap with the outer layers of an expert trained the same way on English text
(``demos.recipes.english_control_examples``), its change scaled to the language expert's
norm. The bench passes the seeds and the control; the app's Reproduce button runs the first
seed alone on a few items.

One live model per language expert shows every model in turn (``merge.live``); a model with
the weights of one already measured is measured once (``weights_fingerprint``), and a
measurement found in ``measured`` (the bench's resume file, keyed by the weights' digest) is
not run again.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from collections.abc import Callable, Sequence

import torch

from ..progress import Progress, say
from ..analysis.deltas import delta_stats
from ..analysis.suggest import delta_story, suggest_config
from ..inference.prompts import render_chat
from ..merge.config import MergeConfig
from ..merge.live import LiveModel
from .measure import (FIRST_K, MATH, OTHER, PARTS, answer_is_copied, condition_label,
                      condition_means, condition_names, conditions, effect_specs, effects_table,
                      item_effects, language_name, means_table, mismatched_partners, reading_nll,
                      reading_target, rule_items, summarize_effects, template_stats)
from .folds import FOLDS
from .trios import DEMOS, DemoTrio, demo
from .variants import SPLIT_SEEDS

SWEEP = ((0, 0), (2, 1), (3, 1), (4, 2), (5, 2), (6, 2), (8, 2))   # (bottom, top); 0/0: no swap
VERSION = 3
CONTROL = "English-control outer layers"


def swap_name(b: int, u: int, outer: str) -> str:
    """A swap's model name: its layer counts and whose outer layers it takes."""
    return f"swap {b}/{u}, {outer}"


def spread(items: list, n: int) -> list:
    """``n`` items evenly spaced over the list (all when ``n`` >= its length): the variant lists
    are in template order, so a spread sample covers every template, a prefix only the first."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def template_of(item) -> int:
    return int(item.id.split("-")[2])


def best_of(sweep: list[dict]) -> dict:
    """The sweep's choice: the lowest question-specific effect on validation (0 for no swap),
    the smaller swap on ties."""
    return min(sweep, key=lambda r: (r["effect"], r["bottom"] + r["top"]))


def suggestion(refs: dict) -> dict:
    """What the Deltas tab suggests for these experts (``analysis.suggest_config``) and its
    one-sentence story, to report beside the sweep's choice."""

    task = delta_stats(refs["base"], refs["task"], label="math expert")
    lang = delta_stats(refs["base"], refs["lang"], label="language expert")
    s = suggest_config(task, lang, task.num_layers)
    return {**s.merge_config_kwargs(), "story": delta_story(task, lang)}


def weights_fingerprint(model) -> str:
    """A digest of every parameter and buffer of ``model`` (names and bytes): two models shown
    in turn with equal digests compute the same function, so one measurement serves both.
    SHA-256 (OpenSSL's, 1.5 GB/s here against BLAKE2b's 0.6: the demo model's 540 MB of
    float32 weights are hashed after every change the measure shows)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().data)
    return h.hexdigest()


def _item_record(item, partner, lang: str = "sw") -> dict:
    _, split, template, k = item.id.split("-")
    return {"id": item.id, "template": int(template), "seed": SPLIT_SEEDS[split] + int(template),
            "variant": int(k), "gold": item.answer, "other": partner.id,
            "answer_copied": answer_is_copied(item), "nll": {c: {} for c in conditions(lang)}}


class _Measurer:
    """Teacher-forced passes of one item set under every condition, counted against the job's
    total, each (weights, condition) measured once."""

    def __init__(self, items: dict, partners: list[int], split: str, tell: Callable,
                 measured: dict, on_measured: Callable | None):
        self.items, self.partners, self.split = items, partners, split
        self.tell, self.measured, self.on_measured = tell, measured, on_measured

    def run(self, live, cond: str, what: str, digest: str) -> list[list]:
        key = f"{digest}|{self.split}|{cond}|" + hashlib.blake2b(
            " ".join(i.id for i in self.items["en"]).encode(), digest_size=8).hexdigest()
        q = cond.removesuffix(OTHER)
        asked = self.items[q] if cond == q else [self.items[q][p] for p in self.partners]
        en = self.items["en"]
        if key not in self.measured:
            tok = live.tokenizer
            self.measured[key] = reading_nll(
                live.model, tok, [render_chat(tok, it.question) for it in asked],
                [reading_target(it) for it in en],
                [None if answer_is_copied(it) else it.answer for it in en],
                progress=lambda f, m: self.tell(len(en), f, f"{what}, after "
                                                f"{_with_article(condition_label(cond))}: {m}"))
            if self.on_measured:
                self.on_measured(key, self.measured[key])
        self.tell(len(en), 1.0, None)
        return self.measured[key]


def reproduce_demo_result(refs: dict, n: int = 8, n_validation: int = 4,
                          progress: Progress | None = None, dtype=None, live=None,
                          seeds: dict[str, str] | None = None, control: str | None = None,
                          measured: dict | None = None, on_measured: Callable | None = None,
                          resamples: int = 10_000, seed: int = 0, lang: str = "sw",
                          validation_swaps: Sequence[tuple[int, int]] = SWEEP, fold: int = 1,
                          rounds: int | None = None, limit: int | None = None) -> dict:
    """The demo result as data (module docstring). ``refs``: base, task, lang (the first seed);
    ``lang``: the question language (``"sw"``, or ``"bn"`` for the Gemma trio);
    ``seeds``: more language experts, label -> reference (the bench's other seeds);
    ``control``: the control expert's reference. ``n``: eval items, ``n_validation``:
    validation items (each spread over the templates). ``live``: a ``LiveModel`` over ``refs``
    (an engine's); default: one made here. ``measured``/``on_measured``: stored measurements by
    key and a callback for each new one (the bench's resume file). ``validation_swaps``: the
    (bottom, top) swaps validation chooses among ((0, 0): no swap), the published ``SWEEP``
    unless a caller (a test re-measuring shipped items) needs fewer. ``fold``: whose halves of
    the templates (``demos.folds``: fold 1 is the shipped trio's); ``rounds``: measure the
    cross-fitted rule's eval items (``measure.rule_items``: the first ``rounds`` rounds, each
    the r-th item of every template) instead of ``n`` spread ones; ``limit``: only the first
    ``limit`` of those (a rerun of a few shipped items: their own-question values are the
    shipped ones, their partners are drawn among the few)."""

    t0 = time.time()
    common = dict(task=refs["task"], base=refs.get("base"))
    if live is None:
        live = LiveModel.from_refs(refs["task"], refs["lang"], refs.get("base"), dtype=dtype)
    langs = {"seed 0": refs["lang"], **(seeds or {})}
    L = live.arch.num_layers
    measured = {} if measured is None else measured

    the_fold = FOLDS[fold]

    def sets(split: str, k: int, in_rounds: int | None = None):
        # validation leaves out the templates the language expert's checkpoint was chosen on
        skip = set(the_fold.proxy_templates()) if split == "validation" else set()
        # the language's variants may cover fewer templates (Bengali: 41): English follows them
        asked = [i for i in the_fold.variant_items(lang, split) if template_of(i) not in skip]
        if in_rounds:   # the declared rule's items: round r, the r-th item of every template
            ids = [i.id for rnd in rule_items(asked)[:in_rounds] for i in rnd][:limit]
        else:           # ``k`` items spread over the templates
            ids = [i.id for i in spread(asked, k)]
        by_id = {i.id: i for i in asked}
        en = {i.id: i for i in the_fold.variant_items("en", split) if i.id in by_id}
        by = {lang: [by_id[i] for i in ids], "en": [en[i] for i in ids]}
        return by, mismatched_partners(by[lang], template_of)

    (val, val_pairs), (ev, ev_pairs) = (sets("validation", n_validation),
                                        sets("eval", n, rounds))
    sweep_cfgs = [(b, u) for b, u in validation_swaps if b + u < L]
    n_models = 2 + len(langs) + bool(control)          # math, a swap per seed, default, control
    work = 2 * len(sweep_cfgs) * len(val[lang]) + 4 * n_models * len(ev[lang])
    done = [0]

    def tell(k: int, frac: float, message: str | None):
        if message is None:
            done[0] += k
            return
        say(progress, min(1.0, (done[0] + frac * k) / work),
            f"{message} · pass {done[0] + round(frac * k)} of {work}")

    val_m = _Measurer(val, val_pairs, "validation", tell, measured, on_measured)
    ev_m = _Measurer(ev, ev_pairs, "eval", tell, measured, on_measured)

    # the sweep, on validation items: the primary measure for each swap, no swap among them
    live.show("task")
    math_digest = weights_fingerprint(live.model)
    val_math = {c: val_m.run(live, c, "validation: math expert (no swap)", math_digest)
                for c in (lang, lang + OTHER)}
    sweep = []
    templates = [template_of(i) for i in val[lang]]
    for b, u in sweep_cfgs:
        if (b, u) == (0, 0):
            vals = val_math
        else:
            live.show(MergeConfig(bottom=b, top=u, lang=refs["lang"], **common))
            digest = weights_fingerprint(live.model)
            vals = {c: val_m.run(live, c, f"validation: swap bottom {b}, top {u}", digest)
                    for c in (lang, lang + OTHER)}
        rows = [{"nll": {c: {"m": vals[c][i], MATH: val_math[c][i]} for c in vals}}
                for i in range(len(templates))]
        effect = template_stats(item_effects(rows, ["m"], MATH, lang), templates,
                                resamples=200, seed=seed)["mean"]
        sweep.append({"bottom": b, "top": u, "n": len(templates),
                      "n_templates": len(set(templates)), "effect": effect,
                      "nll": sum(v[0] for v in vals[lang]) / len(templates)})
    best = best_of(sweep)
    chosen = None if (best["bottom"], best["top"]) == (0, 0) else (best["bottom"], best["top"])
    default = MergeConfig.default_for(L, lang=refs["lang"], **common)

    records = [_item_record(it, ev[lang][p], lang) for it, p in zip(ev["en"], ev_pairs)]
    seen: dict[str, str] = {}            # weights digest -> the first model shown with them
    same_weights: dict[str, str] = {}    # model -> an earlier model with bit-equal weights
    models: list[str] = []

    def measure_model(name: str, lv):
        digest = weights_fingerprint(lv.model)
        twin = seen.setdefault(digest, name)
        if twin != name:
            same_weights[name] = twin
        models.append(name)
        for c in records[0]["nll"]:
            for r, v in zip(records, ev_m.run(lv, c, name, digest)):
                r["nll"][c][name] = v

    # the swap measured: the one chosen on validation, else (no swap chosen) the app's default
    b, u = chosen or (default.bottom, default.top)
    live.show("task")
    measure_model(MATH, live)
    swaps = []
    for label, ref in langs.items():
        lv = live if ref == refs["lang"] else LiveModel.from_refs(
            refs["task"], ref, refs.get("base"), dtype=live.dtype)
        lv.show(MergeConfig(bottom=b, top=u, lang=ref, **common))
        swaps.append(swap_name(b, u, f"language expert {label}"))
        measure_model(swaps[-1], lv)
        if ref == refs["lang"] and chosen and chosen != (default.bottom, default.top):
            lv.show(default)
            measure_model(swap_name(default.bottom, default.top, f"language expert {label}"), lv)
        if lv is not live:
            del lv
    if control:
        lv = LiveModel.from_refs(refs["task"], control, refs.get("base"), dtype=live.dtype)
        lv.show(MergeConfig(bottom=b, top=u, lang=control, **common))
        measure_model(swap_name(b, u, CONTROL), lv)
        del lv
    live.show("task")
    what = (f"the swap chosen on validation ({b}/{u})" if chosen else
            f"the default swap ({b}/{u}; validation chose no swap)")
    specs = effect_specs(swaps, swap_name(b, u, CONTROL) if control else None,
                         swap_name(default.bottom, default.top, "language expert seed 0"),
                         what=what, lang=lang)
    res = {"version": VERSION, "lang": lang, "fold": fold, "rounds": rounds, "n": len(records), "n_templates": len({r["template"] for r in
                                                                     records}),
           "n_validation": len(val[lang]), "validation_ids": [i.id for i in val[lang]],
           "first_k": FIRST_K, "parts": list(PARTS),
           "conditions": condition_names(lang), "refs": {**refs, "seeds": langs, "control": control},
           "models": models, "chosen": None if chosen is None else
           {"bottom": chosen[0], "top": chosen[1]},
           "default": {"bottom": default.bottom, "top": default.top}, "sweep": sweep,
           "swap": {"bottom": b, "top": u, "what": what},
           "specs": specs, "same_weights": same_weights, "resamples": resamples, "seed": seed,
           "answers_copied": sum(r["answer_copied"] for r in records), "items": records,
           "effects": summarize_effects(records, specs, resamples=resamples, seed=seed),
           "means": condition_means(records, resamples=resamples, seed=seed),
           "dtype": str(live.dtype).removeprefix("torch."),
           "suggestion": suggestion(refs) if refs.get("base") else None,
           "seconds": round(time.time() - t0, 1)}
    res["markdown"] = result_markdown(res)
    return res


def recompute(res: dict) -> dict:
    """A stored result's statistics again from its per-item values (the shipped file is
    checked that way)."""
    return {"effects": summarize_effects(res["items"], res["specs"],
                                         resamples=res["resamples"], seed=res["seed"]),
            "means": condition_means(res["items"], resamples=res["resamples"], seed=res["seed"])}


def result_markdown(res: dict) -> str:
    """The statistics (primary first), then the mean NLL of each model after each question."""
    return (effects_table(res["effects"]) + "\n\nMean NLL per token of the English worked "
            "solution (mean over templates, 95% cluster-bootstrap intervals):\n\n"
            + means_table(res["means"]))


def trio_of_language(lang: str) -> DemoTrio:
    """The first demo trio whose questions are in ``lang``."""
    found = next((t for t in DEMOS.values() if t.language == lang), None)
    if found is None:
        raise ValueError(f"no demo trio in {lang!r}")
    return found


def measured_demo_result(path: str | Path | None = None, lang: str = "sw",
                         trio: str | None = None) -> dict | None:
    """The shipped measurement (``bench/demo_result.py --json``) of the demo trio ``trio``
    (a key of ``demos.trios``; default: the first in ``lang``), with its markdown rebuilt from
    the stored statistics; None when none is shipped (or an older format)."""
    record = demo(trio) if trio else trio_of_language(lang)
    p = Path(path) if path else record.result_path
    if not p.is_file():
        return None
    res = json.loads(p.read_text())
    if res.get("version") != VERSION:
        return None
    res["markdown"] = result_markdown(res)
    return res


def effect(res: dict, key: str) -> dict | None:
    return next((r for r in res["effects"] if r["key"] == key), None)


def _said(r: dict) -> str:
    return (f"{r['mean']:+.3f} nats/token (95% CI {r['ci_low']:+.3f} to {r['ci_high']:+.3f}; "
            f"lower in {r['lower']} of {r['n_templates']} templates, sign test p = "
            f"{r['sign_p']:.2g}" + ("" if r["primary"] else f", Holm p = {r['p_holm']:.2g}")
            + ")")


def chosen_words(res: dict) -> str:
    c = res["chosen"]
    where = f"on {res['n_validation']} validation items"
    return (f"no swap (the math expert) was best {where}" if c is None else
            f"the swap chosen {where} (bottom {c['bottom']}, top {c['top']})")


def verdict(res: dict) -> str:
    """Whether the primary statistic shows a question-specific reading gain, in words. The rule,
    declared with the statistic: both the cluster-bootstrap interval and the template sign test
    (p < 0.05) must exclude zero; where only one does, the words say which."""
    p = effect(res, "primary")
    if p is None:
        return ""
    ci = p["ci_high"] < 0 or p["ci_low"] > 0
    sign = p["sign_p"] < 0.05
    way = "gain" if p["mean"] < 0 else "loss"
    if ci and sign:
        return f"a question-specific reading {way}"
    if ci:
        return (f"a question-specific reading {way} that the interval supports and the template "
                f"sign test does not (p = {p['sign_p']:.2g}): not established by the rule "
                f"declared before the run")
    if sign:
        return (f"a question-specific reading {way} that the template sign test supports and "
                f"the interval does not: not established by the rule declared before the run")
    return "no question-specific reading effect that this measure can tell from zero"


def headline(res: dict) -> str:
    """What the result shows, with its measured numbers, whichever way they go: the primary
    statistic and its verdict, then the English question, the control expert and the first
    tokens."""
    p = effect(res, "primary")
    if p is None:
        return ""
    seeds = len(res["refs"].get("seeds") or {}) or 1
    swap = (f"{chosen_words(res)}, no swap among the choices," if res["chosen"] else
            f"{res['swap']['what']} ({chosen_words(res)})")
    lang = res.get("lang", "sw")
    name = language_name(lang)
    text = (f"On {res['n']} held-out variants of {res['n_templates']} templates, {swap} minus "
            f"the math expert, in English "
            f"solution NLL after the item's own {name} question minus after another item's "
            f"({seeds} language-expert seed{'s' if seeds > 1 else ''}"
            f"{' pooled' if seeds > 1 else ''}; the primary statistic): {_said(p)}: "
            f"{verdict(res)}.")
    en = effect(res, "english")
    if en:
        text += f" After the English question: {_said(en)}."
    m, first = effect(res, f"matched-{lang}"), effect(res, "first-matched")
    if m and first:
        text += (f" Without the mismatched control (own {name} question only) the swap's "
                 f"difference is {m['mean']:+.3f}; over the first {res['first_k']} solution "
                 f"tokens alone it is {first['mean']:+.3f}.")
    ctl = effect(res, "control")
    if ctl:
        text += (f" The same swap with the outer layers of an English-trained control expert: "
                 f"{_said(ctl)}.")
    text += (f" The answer tokens are not a measure here: the solution already writes the answer "
             f"in {res['answers_copied']} of {res['n']} items.")
    return text


def sweep_markdown(res: dict) -> str:
    """The sweep on the validation variants and the suggestion of the delta analysis, in words."""
    rows = " · ".join(f"b={r['bottom']} u={r['top']}: {r['effect']:+.4f}" for r in res["sweep"])
    text = (f"Sweep on {res['n_validation']} validation variants (question-specific NLL effect "
            f"against the math expert after the {language_name(res.get('lang', 'sw'))} question, "
            f"mean over templates; b=0 u=0 "
            f"is the math expert, no swap; never the eval items): {rows}; "
            f"{chosen_words(res)}.")
    s = res.get("suggestion")
    if s:
        text += (f" The Deltas tab suggests bottom {s['bottom']}, top {s['top']}, transitions "
                 f"{s['transition_bottom']}/{s['transition_top']}"
                 + (f", partition {s['partition']}" if s.get("partition") else "") + ".")
    return text


def _with_article(words: str) -> str:
    """"its own Swahili question", "another item's Swahili question" (the bar's words): never
    "the another item's"."""
    if words.startswith("own "):
        return f"its {words}"
    return words if words.startswith(("another", "the ")) else f"the {words}"
