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

Amendment (rule 2), declared in its own commit after rule 1's outcome was seen and before the
unscaled control was measured on the eval items. Rule 1's outcome: S1 -0.051 [-0.065, -0.038],
56 of 66 templates lower, Holm p = 1.4e-08; S2 +0.035 [+0.019, +0.053], 24 of 66, Holm p =
0.036; and the scaled control of fold 1, once scaled (each module's change x2.3-7.4, median
3.5), raises the math expert's English held-out NLL by +1.24 (the Swahili expert's: +0.078): a
broken model, so S1 cannot tell Swahili from "not broken". Added, with everything else as in
rule 1: the same chosen checkpoint *unscaled* (the control that passed the criterion as it
was trained), measured the same way (S3: the measured swap minus the same swap with the
unscaled control; S4: the unscaled control swap minus the math expert), a family of its own
(Holm over S3 and S4; rule 1's S1 and S2 stay as computed), with the same sentences
(``control_verdict(..., "unscaled")``). Both are reported; neither replaces the other.
"""
from __future__ import annotations

from collections.abc import Mapping

from .measure import holm, pooled_records, template_stats

CONTROL_RULE_ID = "control-rule-2 (issue 62)"
CONTROL_ALPHA = 0.05
VERSION = 1
STATISTICS = (
    ("vs-control", "the measured swap (seed 0) minus the same swap with the control's outer "
                   "layers, Swahili question, question-specific"),
    ("control", "the control swap minus the math expert, Swahili question, question-specific"),
)
# the two controls measured, rule 1's (scaled to the language expert's norms) and rule 2's
# (not): how the result names each, and how its declared sentence describes it
CONTROLS = {"scaled": ("scaled to the Swahili expert's norms (rule 1)", "of the same norms"),
            "unscaled": ("as trained, unscaled (rule 2)",
                         "that raise the math expert's English NLL no more")}


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


def control_verdict(s1: dict, control: str = "scaled") -> str:
    """The declared sentence for S1 (``control`` "scaled") or S3 ("unscaled")."""
    said = (f"{s1['mean']:+.3f} [{s1['ci_low']:+.3f}, {s1['ci_high']:+.3f}], {s1['lower']}/"
            f"{s1['n_templates']} templates lower, Holm p = {s1['p_holm']:.2g}")
    if (s1["ci_high"] < 0 or s1["ci_low"] > 0) and s1["p_holm"] < CONTROL_ALPHA:
        way = "gain" if s1["mean"] < 0 else "loss"
        return (f"the Swahili expert's outer layers give a question-specific {way} that an "
                f"English-prose control's {CONTROLS[control][1]} do not: {said}")
    return (f"the Swahili expert's outer layers cannot be told apart from an English-prose "
            f"control's {CONTROLS[control][1]} by this measure: {said}")



def control_result(results: Mapping[str, Mapping[int, dict]],
                   checks: Mapping[int, Mapping[int, dict]], *, rule_commits: Mapping[str, str | None],
                   scaled_checks: Mapping[int, dict] | None = None, resamples: int = 10_000,
                   seed: int = 0) -> dict:
    """The controls' result as data. ``results``: per control of ``CONTROLS`` ("scaled",
    "unscaled"), each fold's result measured with it. Per fold: the checks (step ->
    ``control_check``'s statistics), the chosen checkpoint and the scaled control's own check
    (``scaled_checks``: reported, decides nothing). Per control: per fold its ref, the specs
    and per item the values its pair is made of (the math expert's, the seed-0 swap's and the
    control swap's NLL under the Swahili question and another item's), the pooled pair (S1 and
    S2, or S3 and S4) and the declared sentence. ``rule_commits``: rule -> its commit."""
    first = results[next(iter(results))]
    folds = {str(f): {"checks": {str(s): c for s, c in sorted(checks[f].items())},
                      "checkpoint": choose_checkpoint({s: c["passes"] for s, c in checks[f].items()}),
                      "scaled_check": (scaled_checks or {}).get(f),
                      "refs": {"task": res["refs"]["task"], "lang": res["refs"]["lang"]},
                      "swap": res["swap"]} for f, res in sorted(first.items())}
    controls = {}
    for name, by_fold in results.items():
        measured = {}
        for f, res in sorted(by_fold.items()):
            specs = {s["key"]: s for s in res["specs"]}
            models = sorted({*specs["vs-control"]["models"], specs["vs-control"]["vs"],
                             specs["control"]["vs"]})
            measured[str(f)] = {
                "control": res["refs"]["control"], "specs": [specs["vs-control"], specs["control"]],
                "items": [{"id": it["id"], "template": it["template"], "other": it["other"],
                           "nll": {c: {m: it["nll"][c][m] for m in models}
                                   for c in ("sw", "sw-other")}} for it in res["items"]]}
        effects = control_effects({int(f): v for f, v in measured.items()},
                                  resamples=resamples, seed=seed)
        controls[name] = {"what": CONTROLS[name][0], "folds": measured, "effects": effects,
                          "verdict": control_verdict(effects[0], name)}
    return {"version": VERSION, "rule": CONTROL_RULE_ID, "rule_commits": dict(rule_commits),
            "folds": folds, "controls": controls, "resamples": resamples, "seed": seed}


def control_markdown(out: dict) -> str:
    """Each fold's checks and checkpoint, then per control its declared sentence and pair."""
    commits = ", ".join(f"{r} in `{(c or 'unknown')[:10]}`" for r, c in out["rule_commits"].items())
    lines = [f"**Outer-layer controls** ({commits}; each declared before the control it adds was "
             "measured on the eval items).", ""]
    for f, fold in out["folds"].items():
        checks = ", ".join(
            f"step {s} {c['raise']['control']['mean']:+.3f} "
            f"({'passes' if c['passes'] else 'fails'})" for s, c in fold["checks"].items())
        lang = next(iter(fold["checks"].values()))["raise"]["language expert"]["mean"]
        lines.append(f"- Fold {f}: the control's raise of the math expert's English held-out "
                     f"NLL, before scaling, against the language expert's {lang:+.3f}: {checks}; "
                     f"checkpoint {fold['checkpoint']} chosen{_scaled(fold.get('scaled_check'))}; "
                     f"measured with swap {fold['swap']['bottom']}/{fold['swap']['top']}.")
    for c in out["controls"].values():
        lines += ["", f"The control {c['what']}: {c['verdict']}.", "",
                  "| statistic (both folds pooled, templates as the unit) | mean over templates "
                  "[95% CI] | templates lower / higher | sign p | Holm p |",
                  "|---|---:|---:|---:|---:|"]
        for r in c["effects"]:
            lines.append(f"| {r['label']} | {r['mean']:+.4f} [{r['ci_low']:+.4f}, "
                         f"{r['ci_high']:+.4f}] | {r['lower']}/{r['higher']} of {r['n_templates']}"
                         f" | {r['sign_p']:.2g} | {r['p_holm']:.2g} |")
    return "\n".join(lines)


def _scaled(check: dict | None) -> str:
    if not check:
        return ""
    st = check["raise"]["control"]
    return (f"; scaled to the language expert's norms, it raises that NLL by {st['mean']:+.3f} "
            f"[{st['ci_low']:+.3f}, {st['ci_high']:+.3f}] (reported, decides nothing)")
