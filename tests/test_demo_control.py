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
