"""The cross-fitted demo result (issue #62): the two folds' results pooled by the rule declared
before fold 2 was evaluated (``measure``: ``RULE_ID``, ``pooled_primary``, ``cross_fit_verdict``).

Each fold's result is ``reproduce.reproduce_demo_result(..., fold=f, rounds=2)`` on its own
trio (the fold's math and language experts): its eval items are the rule's (``rule_items``),
on the templates its experts never saw. Here the per-item values of both are pooled, templates
as the unit: the primary exactly as declared, and every secondary statistic both folds measured
(the same keys of ``measure.effect_specs``), their sign-test p-values Holm-adjusted together.
Each fold's own statistics stay in its result and decide nothing.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping

from .measure import (RULE_ID, RULE_ITEMS_PER_TEMPLATE, cross_fit_verdict, holm_secondaries,
                      pooled_primary, pooled_records, template_stats)
from .reproduce import measured_demo_result

VERSION = 1


def complete_rounds(res: dict) -> int:
    """How many of the rule's rounds a fold's result measured whole."""
    return int(res.get("rounds") or 0)


def pooled_effects(results: Mapping[int, dict], *, resamples: int = 10_000,
                   seed: int = 0) -> list[dict]:
    """Per statistic that every fold measured (by key, each fold with its own models), its
    per-item values pooled over the folds with templates as the unit; the primary is
    ``pooled_primary``'s, the others' sign p Holm-adjusted together."""
    specs = {f: {s["key"]: s for s in res["specs"]} for f, res in results.items()}
    measured = {f: {e["key"] for e in res["effects"]} for f, res in results.items()}
    keys = [k for k in specs[min(specs)] if all(k in measured[f] for f in results)]
    items = {f: r["items"] for f, r in results.items()}
    rows = []
    for key in keys:
        by_fold = {f: specs[f][key] for f in results}
        if key == "primary":
            st = pooled_primary(items, by_fold, resamples=resamples, seed=seed)
        else:
            records = pooled_records(items, by_fold)
            st = template_stats([v for _, v, _ in records], [t for t, _, _ in records],
                                resamples=resamples, seed=seed)
        first = specs[min(specs)][key]
        rows.append({"key": key, "label": pooled_label(key, results), "question":
                     first["question"], "part": first.get("part", "solution"),
                     "specific": first["specific"], "primary": key == "primary",
                     **{k: v for k, v in st.items() if k not in ("rule", "folds")}})
    return holm_secondaries(rows)


def pooled_label(key: str, results: Mapping[int, dict]) -> str:
    """A pooled statistic's words: each fold's own label with the fold's swap named generally
    ("each fold's measured swap")."""
    first = next(s for s in results[min(results)]["specs"] if s["key"] == key)
    label = first["label"]
    what = results[min(results)]["swap"]["what"]
    seeds = f"{what} ({len(results[min(results)]['refs']['seeds'])} seeds pooled)"
    for old in (seeds, what):
        label = label.replace(old, "each fold's measured swap")
    return re.sub(r"\bswap \d+/\d+,", "each fold's measured swap,", label)


def crossfit_result(results: Mapping[int, dict], *, rule_commit: str | None,
                    resamples: int = 10_000, seed: int = 0) -> dict:
    """The pooled result as data: the rule, its commit, each fold's trio, items, choice and
    primary, the pooled statistics and the declared sentence."""
    rounds = min(complete_rounds(r) for r in results.values())
    effects = pooled_effects(results, resamples=resamples, seed=seed)
    primary = next((e for e in effects if e["primary"]), None)
    folds = {}
    for f, res in sorted(results.items()):
        own = next(e for e in res["effects"] if e["key"] == "primary")
        folds[str(f)] = {"n": res["n"], "n_templates": res["n_templates"],
                         "templates": sorted({it["template"] for it in res["items"]}),
                         "refs": res["refs"], "chosen": res["chosen"], "swap": res["swap"],
                         "sweep": res["sweep"], "rounds": res.get("rounds"),
                         "primary": {k: own[k] for k in ("mean", "ci_low", "ci_high", "lower",
                                                         "higher", "n_templates", "sign_p")}}
    return {"version": VERSION, "rule": RULE_ID, "rule_commit": rule_commit,
            "items_per_template": RULE_ITEMS_PER_TEMPLATE, "rounds": rounds,
            "lang": results[min(results)].get("lang", "sw"),
            "n": sum(r["n"] for r in results.values()),
            "n_templates": sum(r["n_templates"] for r in results.values()),
            "folds": folds, "effects": effects, "primary": primary,
            "verdict": cross_fit_verdict(primary, rounds=rounds, folds_measured=len(results)),
            "resamples": resamples, "seed": seed}


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else "<1e-4"


def crossfit_markdown(out: dict) -> str:
    """The declared sentence, each fold's own primary, and the pooled table (primary first)."""
    lines = [f"**Cross-fitted result** ({out['rule']}; declared in commit "
             f"`{(out['rule_commit'] or 'unknown')[:10]}`, before fold 2 was evaluated): on "
             f"{out['n']} held-out variants of {out['n_templates']} templates, each measured by "
             f"the fold whose experts never saw its template, {out['rounds']} per template: "
             f"{out['verdict']}.", ""]
    for f, fold in out["folds"].items():
        p = fold["primary"]
        seeds = len(fold["refs"].get("seeds") or {}) or 1
        lines.append(f"- Fold {f} ({fold['n_templates']} templates, {fold['n']} items, swap "
                     f"{fold['swap']['bottom']}/{fold['swap']['top']} "
                     f"{'chosen on validation' if fold['chosen'] else 'by default: validation chose no swap'}"
                     f", {seeds} language-expert seed{'s' if seeds > 1 else ''}): "
                     f"{p['mean']:+.4f} [{p['ci_low']:+.4f}, {p['ci_high']:+.4f}], "
                     f"{p['lower']}/{p['n_templates']} templates lower, sign p = "
                     f"{_p(p['sign_p'])} (reported; decides nothing)")
    lines += ["", "| statistic (both folds pooled, templates as the unit) | mean over templates "
              "[95% CI] | templates lower / higher | sign p | Holm p |",
              "|---|---:|---:|---:|---:|"]
    for r in out["effects"]:
        name = ("**primary**: " if r["primary"] else "") + r["label"]
        lines.append(f"| {name} | {r['mean']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] | "
                     f"{r['lower']}/{r['higher']} of {r['n_templates']} | {_p(r['sign_p'])} | "
                     f"{'(primary)' if r['primary'] else _p(r['p_holm'])} |")
    return "\n".join(lines)


def measured_crossfit(trio) -> tuple[dict, dict[int, dict]] | None:
    """The shipped cross-fitted result of a demo trio (``trios.DemoTrio.crossfit_file``) and
    each fold's shipped result (fold -> result); None when the trio has none shipped."""
    path = trio.crossfit_path
    if path is None or not path.is_file():
        return None
    out = json.loads(path.read_text())
    if out.get("version") != VERSION:
        return None
    folds = {}
    for f in [1, *trio.folds]:
        res = measured_demo_result(trio.fold_result_path(f), trio=trio.key)
        if res is None:
            return None
        folds[f] = res
    return out, folds


def crossfit_headline(out: dict) -> str:
    """One sentence: what the declared rule says, on how many templates."""
    return (f"Cross-fitted over {out['n_templates']} templates ({out['n']} held-out variants, "
            f"each measured by the fold whose experts never saw its template; the rule declared "
            f"before fold 2 was evaluated), the swap minus the math expert after the item's own "
            f"Swahili question minus after another item's: {out['verdict']}.")
