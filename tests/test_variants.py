"""The demo's held-out GSM-Symbolic variants: deterministic, disjoint seed sets, no MGSM item,
English and Swahili paired item by item."""
from __future__ import annotations

import pytest

pytest.importorskip("multilingual_gsm_symbolic")

from layerswap_core.evaluation import variants as V  # noqa: E402
from layerswap_core.evaluation.data import mgsm_overlap_templates, normalize_number  # noqa: E402

FEW = (0, 4, 8, 10, 12)   # fast templates, for the tests that need not see every one


def test_the_template_list_excludes_mgsm_items_and_unusable_templates():
    ts = set(V.templates())
    assert not ts & mgsm_overlap_templates()
    assert not ts & (V.SLOW_TEMPLATES | V.NOT_VALIDATED | V.UNPAIRED_TEMPLATES)
    assert len(ts) >= 50 and set(FEW) <= ts


def test_generation_is_deterministic():
    V._generated.cache_clear()
    V._paired.cache_clear()
    first = V.variant_items("sw", "eval", FEW)
    V._generated.cache_clear()
    V._paired.cache_clear()
    assert V.variant_items("sw", "eval", FEW) == first and first


def test_the_three_sets_are_disjoint_and_paired_across_languages():
    for lang in ("en", "sw"):
        sets = {s: V.variant_items(lang, s, FEW) for s in V.SPLITS}
        texts = {s: [i.question for i in items] for s, items in sets.items()}
        for s, qs in texts.items():
            assert len(qs) == len(set(qs)), s          # no repeat within a set
        for a in V.SPLITS:
            for b in V.SPLITS:
                if a < b:
                    assert not set(texts[a]) & set(texts[b]), (lang, a, b)
    en, sw = V.variant_items("en", "eval", FEW), V.variant_items("sw", "eval", FEW)
    assert [i.id for i in en] == [i.id for i in sw]
    assert [i.answer for i in en] == [i.answer for i in sw]
    assert all(a.question != b.question for a, b in zip(en, sw))   # really translated


def test_at_least_200_eval_variants_per_language_with_numeric_gold():
    for lang in ("en", "sw"):
        items = V.variant_items(lang, "eval")
        assert len(items) >= 200
        assert all(normalize_number(i.answer) == i.answer and i.solution for i in items)
        assert {int(i.id.split("-")[2]) for i in items} <= set(V.templates())


def test_other_languages_and_splits_are_refused():
    with pytest.raises(ValueError, match="swh"):
        V.variant_items("ben", "eval")
    with pytest.raises(ValueError, match="validation"):
        V.variant_items("sw", "test")


def test_the_math_variant_recipe_trains_on_the_train_set_only():
    from layerswap_core.training import recipes

    train = recipes.math_variant_examples("train")
    held = recipes.math_variant_examples("eval")
    asked = {r["messages"][0]["content"] for r in train}
    assert asked == {i.question for i in V.variant_items("en", "train")}
    for split in ("validation", "eval"):
        assert not asked & {i.question for i in V.variant_items("en", split)}
    assert {r["messages"][0]["content"] for r in held} == \
        {i.question for i in V.variant_items("en", "validation")}
    assert all(r["messages"][1]["content"].rsplit("#### ", 1)[1] for r in train)


def test_the_clean_language_recipe_sees_no_evaluated_template():
    from layerswap_core.training import recipes

    allowed = set(recipes.statement_templates())
    assert allowed and not allowed & set(V.templates()) and not allowed & mgsm_overlap_templates()
    if not (recipes.FREEDICT_DIR / "freedict-swh-eng.index").exists():
        pytest.skip("needs the Debian packages dict-freedict-swh-eng and dict-freedict-eng-swh")
    rows = recipes.swahili_clean_examples("train")
    evaluated = {i.question for s in V.SPLITS for i in V.variant_items("sw", s)}
    for r in rows:
        reply = r["messages"][-1]["content"]
        assert "####" not in reply and reply not in evaluated
