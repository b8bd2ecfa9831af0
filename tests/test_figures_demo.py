"""The demo result's per-template picture (issue #62): built from the shipped per-item values,
one dot per template, its pooled mean and interval ``demos.measure``'s own, a colour per fold."""
from __future__ import annotations

import numpy as np
import pytest

from layerswap_core.demos import measure as M
from layerswap_core.demos.reproduce import effect, measured_demo_result
from layerswap_core.workbench.demo import (MIN_STRIP_TEMPLATES, folds_template_chart,
                                           rerun_template_chart, template_chart)
from layerswap_core.demos.trios import demo
from layerswap_core.workbench.figures_demo import template_strip


def shapes(fig) -> dict:
    return {s.name: s for s in fig.layout.shapes}


@pytest.mark.parametrize("trio, templates", [("sw", 33), ("bn", 23)])
def test_the_shipped_result_per_template(trio, templates):
    """A dot per template of the primary (33 for Swahili), sorted; the pooled mean and the band
    are ``template_stats``' of the same per-item values, i.e. the shipped primary row."""
    res = measured_demo_result(trio=trio)
    spec = next(s for s in res["specs"] if s["key"] == "primary")
    fig = template_chart(res)
    assert len(fig.data) == 1
    dots = np.array(fig.data[0].x)
    assert len(dots) == len(set(fig.data[0].y)) == templates
    assert list(dots) == sorted(dots)
    values = M.item_effects(res["items"], spec["models"], spec["vs"], spec["question"],
                            spec.get("part", "solution"), spec["specific"])
    st = M.template_stats(values, [it["template"] for it in res["items"]],
                          resamples=res["resamples"], seed=res["seed"])
    s = shapes(fig)
    assert s["pooled mean"].x0 == st["mean"] == effect(res, "primary")["mean"]
    assert (s["pooled interval"].x0, s["pooled interval"].x1) == (st["ci_low"], st["ci_high"])
    assert s["zero"].x0 == 0
    assert float(dots.mean()) == pytest.approx(st["mean"], abs=1e-12)
    assert int((dots < 0).sum()) == st["lower"] and int((dots > 0).sum()) == st["higher"]
    title = fig.layout.title.text
    assert f"{st['lower']} of {templates} templates below 0, {st['higher']} above" in title
    assert f"sign test p = {st['sign_p']:.2g}" in title and f"mean {st['mean']:+.3f}" in title


def test_two_folds_two_colours():
    """Toy per-item values of two folds: a trace and a colour per fold, the pooled mean over
    all templates, and a template claimed by both folds refused."""
    records = [(1, -0.2, 1), (1, -0.4, 1), (2, 0.1, 1), (3, -0.1, 2), (4, 0.3, 2), (4, 0.1, 2),
               (5, -0.05, 2)]
    fig = template_strip(records, resamples=200)
    assert [t.name for t in fig.data] == ["fold 1 (2 templates)", "fold 2 (3 templates)"]
    colours = {t.marker.color for t in fig.data}
    assert len(colours) == 2 and fig.layout.showlegend
    st = M.template_stats([v for _, v, _ in records], [t for t, _, _ in records], resamples=200)
    assert shapes(fig)["pooled mean"].x0 == st["mean"]
    assert sorted(x for t in fig.data for x in t.x) == sorted(
        M.template_groups([v for _, v, _ in records], [t for t, _, _ in records]).values())
    # the y axis runs in the order of the means, across folds
    assert list(fig.layout.yaxis.categoryarray) == ["0001", "0003", "0005", "0002", "0004"]
    with pytest.raises(ValueError, match="two folds"):
        template_strip(records + [(1, 0.0, 2)])


def test_the_folds_picture_pools_as_the_declared_rule_does():
    """The cross-fitting's figure plots ``pooled_records`` and draws ``pooled_primary``'s mean."""
    res = measured_demo_result(trio="sw")
    spec = next(s for s in res["specs"] if s["key"] == "primary")
    moved = [{**it, "template": it["template"] + 10_000} for it in res["items"]]
    other = {**res, "items": moved}
    fig = folds_template_chart({1: res, 2: other})
    pooled = M.pooled_primary({1: res["items"], 2: moved}, {1: spec, 2: spec},
                              resamples=res["resamples"], seed=res["seed"])
    assert len(fig.data) == 2 and sum(len(t.x) for t in fig.data) == pooled["n_templates"] == 66
    assert shapes(fig)["pooled mean"].x0 == pooled["mean"]


def test_a_small_rerun_shows_the_shipped_picture_labelled():
    res = measured_demo_result(trio="sw")
    by_template: dict = {}
    for it in res["items"]:
        by_template.setdefault(it["template"], it)
    few = list(by_template.values())[:MIN_STRIP_TEMPLATES - 1]
    small = {**res, "items": few, "n": len(few), "n_templates": len(few)}
    fig = rerun_template_chart(small, demo("sw"))
    assert len(fig.data[0].x) == 33
    assert "too few for the picture" in fig.layout.title.text.replace("<br>", " ")
    enough = list(by_template.values())[:MIN_STRIP_TEMPLATES]
    fig = rerun_template_chart({**res, "items": enough, "n": len(enough),
                                "n_templates": len(enough)}, demo("sw"))
    assert len(fig.data[0].x) == MIN_STRIP_TEMPLATES and "This rerun" in fig.layout.title.text
