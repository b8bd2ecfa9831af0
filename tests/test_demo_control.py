"""The outer-layer control's declared rule (``demos.control``, issue #62): the checkpoint chosen
by the control checks alone, S1 and S2 pooled over the folds with templates as the unit, and
the sentence each outcome prints."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerswap_core.demos import control as C
from layerswap_core.demos import measure as D

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("passes, chosen", [
    ({4: True, 8: True, 12: False, 16: True}, 8),      # the first failure ends the scan
    ({8: True, 4: True}, 8),                            # order of the mapping does not matter
    ({4: False, 8: True}, None),                        # the first fails: no control
    ({4: True}, 4),
])
def test_the_checkpoint_is_the_last_that_passes_before_the_first_failure(passes, chosen):
    assert C.choose_checkpoint(passes) == chosen


def test_s1_and_s2_pool_each_folds_paired_differences_with_templates_as_the_unit():
    """Fold 1's shipped items with its seed-1 swap standing in for a control, and the same
    items under other template numbers standing in for fold 2: S1 and S2 are the template
    statistics of the per-item differences computed here directly, Holm over the two."""
    res = json.loads((ROOT / "assets" / "experts" / "demo_result.json").read_text())
    seed0, seed1 = "swap 5/2, language expert seed 0", "swap 5/2, language expert seed 1"
    specs = D.effect_specs([seed0], control=seed1)
    moved = [{**it, "template": it["template"] + 1000} for it in res["items"]]
    folds = {1: {"items": res["items"], "specs": specs}, 2: {"items": moved, "specs": specs}}
    rows = C.control_effects(folds, resamples=500)
    assert [r["key"] for r in rows] == ["vs-control", "control"]

    def direct(a, b):
        values = [(it["nll"]["sw"][a][0] - it["nll"]["sw"][b][0])
                  - (it["nll"]["sw-other"][a][0] - it["nll"]["sw-other"][b][0])
                  for it in res["items"] + moved]
        return D.template_stats(values, [it["template"] for it in res["items"] + moved],
                                resamples=500)

    for row, (a, b) in zip(rows, ((seed0, seed1), (seed1, D.MATH))):
        want = direct(a, b)
        for k in ("mean", "ci_low", "ci_high", "lower", "higher", "n_templates", "sign_p"):
            assert row[k] == pytest.approx(want[k]), (row["key"], k)
        assert row["n_templates"] == 2 * res["n_templates"]
    assert [r["p_holm"] for r in rows] == pytest.approx(D.holm([r["sign_p"] for r in rows]))


@pytest.mark.parametrize("ci, p_holm, told", [
    ((-0.03, -0.01), 0.01, True), ((-0.03, -0.01), 0.08, False), ((-0.03, 0.01), 0.01, False),
])
def test_each_control_outcome_prints_its_declared_sentence(ci, p_holm, told):
    s1 = {"mean": -0.02, "ci_low": ci[0], "ci_high": ci[1], "lower": 40, "higher": 26,
          "n_templates": 66, "p_holm": p_holm}
    for control, words in (("scaled", "of the same norms"),
                           ("unscaled", "that raise the math expert's English NLL no more")):
        said = C.control_verdict(s1, control)
        assert "40/66 templates lower" in said and words in said
        assert ("give a question-specific gain" in said) == told
        assert ("cannot be told apart" in said) == (not told)


# --------------------------------------------------------------------------- the shipped controls
def _shipped() -> dict:
    return json.loads((ROOT / "assets" / "experts" / "demo_control.json").read_text())


def test_the_shipped_controls_follow_their_rule_and_recompute_from_their_items():
    """Each fold's checkpoint is the rule's over its recorded checks (each check passes exactly
    when the control's raise is at most the language expert's); each control's pair and
    sentence recompute from its per-item values; the math expert's and the swap's values are
    the shipped fold results' to the last digit (only the control was measured again)."""
    out = _shipped()
    assert out["rule"] == C.CONTROL_RULE_ID and set(out["controls"]) == set(C.CONTROLS)
    for fold in out["folds"].values():
        for check in fold["checks"].values():
            r = check["raise"]
            assert check["passes"] == (r["control"]["mean"] <= r["language expert"]["mean"])
        assert fold["checkpoint"] == C.choose_checkpoint(
            {int(s): c["passes"] for s, c in fold["checks"].items()})
        assert fold["checkpoint"] is not None
    shipped = {1: "demo_result.json", 2: "demo_result_fold2.json"}
    for name, control in out["controls"].items():
        again = C.control_effects({int(f): v for f, v in control["folds"].items()},
                                  resamples=out["resamples"], seed=out["seed"])
        for a, b in zip(again, control["effects"], strict=True):
            for k in ("mean", "ci_low", "ci_high", "lower", "higher", "n_templates", "sign_p",
                      "p_holm"):
                assert a[k] == pytest.approx(b[k]), (name, a["key"], k)
        assert control["verdict"] == C.control_verdict(again[0], name)
        for f, file in shipped.items():
            res = json.loads((ROOT / "assets" / "experts" / file).read_text())
            by_id = {it["id"]: it for it in res["items"]}
            items = control["folds"][str(f)]["items"]
            assert [it["id"] for it in items] == [it["id"] for it in res["items"]]
            for it in items:
                for cond, row in it["nll"].items():
                    for model, values in row.items():
                        if "English-control" not in model:
                            assert values == by_id[it["id"]]["nll"][cond][model], (f, model)


def test_each_control_rule_was_declared_before_the_result():
    """Rule 1 and its amendment (rule 2) each precede the commit that shipped the controls'
    result, rule 1 before rule 2, and the file was not there when either was declared."""
    import shutil
    import subprocess

    from layerswap_core.demos.measure import rule_commit

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = _shipped()
    rules = out["rule_commits"]
    assert rules["control-rule-1"] == rule_commit(rule="control-rule-1 (issue 62)",
                                                  module="control")
    assert rules["control-rule-2"] == rule_commit(rule=C.CONTROL_RULE_ID, module="control")

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)

    path = "assets/experts/demo_control.json"
    commit = git("log", "-1", "--format=%H", "--", path).stdout.strip()
    assert commit
    assert git("merge-base", "--is-ancestor", rules["control-rule-1"],
               rules["control-rule-2"]).returncode == 0
    assert rules["control-rule-1"] != rules["control-rule-2"]
    for rule in rules.values():
        assert commit != rule and git("merge-base", "--is-ancestor", rule, commit).returncode == 0
        assert git("cat-file", "-e", f"{rule}:{path}").returncode != 0, "there before the rule"


def test_the_docs_carry_the_controls_and_the_readme_quotes_them_field_by_field():
    from test_demo_result_stats import quoted

    out = _shipped()
    docs = (ROOT / "docs" / "demo.md").read_text()
    assert C.control_markdown(out) in docs
    readme = (ROOT / "README.md").read_text()
    para = readme[readme.index("**What the demo shows"):].split("\n\n", 1)[0]
    for control in out["controls"].values():
        for row in control["effects"]:
            assert quoted(row) in para, quoted(row)
    for fold in out["folds"].values():
        assert f"{fold['scaled_check']['raise']['control']['mean']:+.2f}" in para
