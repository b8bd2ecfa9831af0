"""The outer-layer control of the cross-fitted Swahili result (issue #62): does *Swahili* in the
swapped outer layers give the question-specific effect, or would any training of them?

The rule below was declared in a commit of its own before any control was measured on the eval
items (``CONTROL_RULE_ID``; the result file records that commit). Before it, the control
checks of fold 1's prose control at steps 8 (passes), 16 and 40 (both fail) had been seen, and
no demo statistic of any control.

* **Control expert, per fold**: recipe ``english-prose-control`` (``folds.TRAININGS``:
  ``fold1-control-v2``, ``fold2-control-v2``: English prose, the Swahili expert's flags, a
  checkpoint every 4 steps).
* **Its checkpoint** (``choose_checkpoint``), by issue #62's criterion alone (never by a demo
  statistic): the saved checkpoints are checked from the first upward with
  ``heldout.control_check`` (the control's outer layers, swapped into the fold's math expert,
  may raise its English held-out NLL by no more than the fold's language expert's outer layers
  do); the control is the last checkpoint before the first that fails. If the first fails,
  the fold has no control, and there is no control statistic.
* **Then** its change is scaled to the fold's language expert's norms, module by module
  (``checkpoints.adapters.scale_to_norms``), as the criterion says (checked before scaling);
  the scaled control's own check is reported and decides nothing.
* **Measured**: each fold's measured swap (the one its validation chose) with the control's
  outer layers, on the fold's rule items, under every question condition
  (``bench/demo_result.py --control``, resuming the fold's measurements: every other model's
  values are the shipped ones).
* **Statistics** (``control_result``), both folds pooled with templates as the unit, as the
  primary is, in a family of their own (the declared result's statistics and their Holm
  adjustment stay as shipped): S1, the measured swap with the language expert (seed 0 of each
  fold: fold 1's other two seeds have no control beside them) minus the same swap with the
  control, Swahili question, question-specific; S2, the control swap minus the math expert,
  the same measure. The cluster-bootstrap 95% interval (10,000 resamples, seed 0), the exact
  sign test over template means, Holm over S1 and S2.
* **Sentences** (``control_verdict``): S1 supports "Swahili outer layers, not any outer-layer
  training" only when its interval excludes 0 and its Holm p < 0.05; otherwise the control
  cannot be told apart from the Swahili expert by this measure, and the words say so.
"""
from __future__ import annotations

from collections.abc import Mapping

from .measure import holm, pooled_records, template_stats

CONTROL_RULE_ID = "control-rule-1 (issue 62)"
CONTROL_ALPHA = 0.05
VERSION = 1
STATISTICS = (
    ("vs-control", "the measured swap (seed 0) minus the same swap with the control's outer "
                   "layers, Swahili question, question-specific"),
    ("control", "the control swap minus the math expert, Swahili question, question-specific"),
)


def choose_checkpoint(passes: Mapping[int, bool]) -> int | None:
    """The declared checkpoint: checked from the first step upward, the last that passes before
    the first that fails (``passes``: step -> the check's outcome; the steps checked must run
    without a gap from the first saved one up to the first failure, or to the last). None when
    the first fails."""
    chosen = None
    for step in sorted(passes):
        if not passes[step]:
            return chosen
        chosen = step
    return chosen


def control_effects(results: Mapping[int, dict], *, resamples: int = 10_000,
                    seed: int = 0) -> list[dict]:
    """S1 and S2 (``STATISTICS``) from each fold's result measured with its control (the
    result's ``vs-control`` and ``control`` specs), pooled over the folds, Holm over the two."""
    items = {f: r["items"] for f, r in results.items()}
    rows = []
    for key, label in STATISTICS:
        by_fold = {f: next(s for s in r["specs"] if s["key"] == key) for f, r in results.items()}
        records = pooled_records(items, by_fold)
        rows.append({"key": key, "label": label, **template_stats(
            [v for _, v, _ in records], [t for t, _, _ in records],
            resamples=resamples, seed=seed)})
    for row, p in zip(rows, holm([r["sign_p"] for r in rows])):
        row["p_holm"] = p
    return rows


def control_verdict(s1: dict) -> str:
    """The declared sentence for S1."""
    said = (f"{s1['mean']:+.3f} [{s1['ci_low']:+.3f}, {s1['ci_high']:+.3f}], {s1['lower']}/"
            f"{s1['n_templates']} templates lower, Holm p = {s1['p_holm']:.2g}")
    if (s1["ci_high"] < 0 or s1["ci_low"] > 0) and s1["p_holm"] < CONTROL_ALPHA:
        way = "gain" if s1["mean"] < 0 else "loss"
        return (f"the Swahili expert's outer layers give a question-specific {way} that an "
                f"English-prose control's of the same norms do not: {said}")
    return (f"the Swahili expert's outer layers cannot be told apart from an English-prose "
            f"control's of the same norms by this measure: {said}")


def control_result(results: Mapping[int, dict], checks: Mapping[int, Mapping[int, dict]], *,
                   rule_commit: str | None, resamples: int = 10_000, seed: int = 0) -> dict:
    """The control's result as data: per fold the checks (step -> ``control_check``'s
    statistics), the chosen checkpoint, the refs, and per item the values S1 and S2 are made
    of (the math expert's, the seed-0 swap's and the control swap's NLL under the Swahili
    question and another item's); the pooled S1 and S2 and the declared sentence."""
    folds = {}
    for f, res in sorted(results.items()):
        specs = {s["key"]: s for s in res["specs"]}
        models = sorted({*specs["vs-control"]["models"], specs["vs-control"]["vs"],
                         specs["control"]["vs"]})
        conds = ("sw", "sw-other")
        chosen = choose_checkpoint({s: c["passes"] for s, c in checks[f].items()})
        folds[str(f)] = {
            "checks": {str(s): c for s, c in sorted(checks[f].items())}, "checkpoint": chosen,
            "refs": {"task": res["refs"]["task"], "lang": res["refs"]["lang"],
                     "control": res["refs"]["control"]},
            "swap": res["swap"], "specs": [specs["vs-control"], specs["control"]],
            "items": [{"id": it["id"], "template": it["template"], "other": it["other"],
                       "nll": {c: {m: it["nll"][c][m] for m in models} for c in conds}}
                      for it in res["items"]]}
    effects = control_effects({int(f): {"items": v["items"], "specs": v["specs"]}
                               for f, v in folds.items()}, resamples=resamples, seed=seed)
    return {"version": VERSION, "rule": CONTROL_RULE_ID, "rule_commit": rule_commit,
            "folds": folds, "effects": effects, "verdict": control_verdict(effects[0]),
            "resamples": resamples, "seed": seed}


def control_markdown(out: dict) -> str:
    """The declared sentence, each fold's checks and checkpoint, and S1 and S2."""
    lines = [f"**Outer-layer control** ({out['rule']}; declared in commit "
             f"`{(out['rule_commit'] or 'unknown')[:10]}`, before any control was measured on "
             f"the eval items): {out['verdict']}.", ""]
    for f, fold in out["folds"].items():
        checks = ", ".join(
            f"step {s} {c['raise']['control']['mean']:+.3f} "
            f"({'passes' if c['passes'] else 'fails'})" for s, c in fold["checks"].items())
        lang = next(iter(fold["checks"].values()))["raise"]["language expert"]["mean"]
        lines.append(f"- Fold {f}: the control's raise of the math expert's English held-out "
                     f"NLL, before scaling, against the language expert's {lang:+.3f}: {checks}; "
                     f"checkpoint {fold['checkpoint']} chosen, scaled to the language expert's "
                     f"norms, measured with swap {fold['swap']['bottom']}/{fold['swap']['top']}.")
    lines += ["", "| statistic (both folds pooled, templates as the unit) | mean over templates "
              "[95% CI] | templates lower / higher | sign p | Holm p |", "|---|---:|---:|---:|---:|"]
    for r in out["effects"]:
        lines.append(f"| {r['label']} | {r['mean']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}] "
                     f"| {r['lower']}/{r['higher']} of {r['n_templates']} | {r['sign_p']:.2g} | "
                     f"{r['p_holm']:.2g} |")
    return "\n".join(lines)
