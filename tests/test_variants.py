"""The demo's held-out GSM-Symbolic variants: deterministic, disjoint seed sets, no MGSM item,
English and Swahili paired item by item."""
from __future__ import annotations

import pytest

pytest.importorskip("multilingual_gsm_symbolic")

from layerswap_core.demos import variants as V  # noqa: E402
from layerswap_core.evaluation.data import mgsm_overlap_templates, normalize_number  # noqa: E402

FEW = (0, 4, 8, 10, 12, 14)   # fast templates (evaluated: 0, 8, 12; trained: 4, 10, 14)


def test_the_template_list_excludes_mgsm_items_and_unusable_templates():
    ts = set(V.templates())
    assert not ts & mgsm_overlap_templates()
    assert not ts & (V.SLOW_TEMPLATES | V.NOT_VALIDATED | V.UNPAIRED_TEMPLATES)
    assert len(ts) >= 50 and set(FEW) <= ts


def _fresh(lang, template, split):
    """The package's engine, bypassing every cache and the shipped file."""
    return V._generated.__wrapped__(lang, template, V.SPLIT_SEEDS[split] + template,
                                    V.PER_TEMPLATE[split])


def test_generation_is_deterministic_and_the_shipped_file_is_what_it_generates():
    assert V._shipped(), "the shipped variants file is missing or stale: run layerswap demo-variants"
    for lang in V.LANGS:
        for split in V.SPLITS:
            for t in [t for t in FEW if t in V.split_templates(split)][:2]:
                first = _fresh(lang, t, split)
                assert first and _fresh(lang, t, split) == first
                assert V._rows(lang, t, split) == first, (lang, split, t)
    assert len(V._shipped()) == sum(V.variant_language(lang).has(t) for lang in V.LANGS
                                    for s in V.SPLITS for t in V.split_templates(s))


def test_a_stale_variants_file_is_ignored(tmp_path, monkeypatch):
    """A file made with another package version (or other seeds) is not read: the variants
    are generated instead."""
    import gzip
    import json

    data = json.loads(gzip.decompress(V.VARIANTS_FILE.read_bytes()))
    data["stamp"]["package"] = "multilingual-gsm-symbolic==0.0.1"
    data["rows"]["swh/eval/0000"] = [["not a question", "no", "0"]]
    stale = tmp_path / "variants.json.gz"
    stale.write_bytes(gzip.compress(json.dumps(data).encode()))
    monkeypatch.setattr(V, "VARIANTS_FILE", stale)
    V._shipped.cache_clear()
    try:
        assert V._shipped() == {}
        assert V._rows("swh", 0, "eval") == _fresh("swh", 0, "eval")
    finally:
        monkeypatch.undo()
        V._shipped.cache_clear()


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
        V.variant_items("deu", "eval")
    with pytest.raises(ValueError, match="validation"):
        V.variant_items("sw", "test")


def test_the_math_variant_recipe_trains_on_the_train_set_only():
    from layerswap_core.demos import recipes

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
    from layerswap_core.demos import recipes

    allowed = set(recipes.statement_templates())
    assert allowed and not allowed & set(V.templates()) and not allowed & mgsm_overlap_templates()
    if not (recipes.FREEDICT_DIR / "freedict-swh-eng.index").exists():
        pytest.skip("needs the Debian packages dict-freedict-swh-eng and dict-freedict-eng-swh")
    rows = recipes.swahili_clean_examples("train")
    evaluated = {i.question for s in V.SPLITS for i in V.variant_items("sw", s)}
    for r in rows:
        reply = r["messages"][-1]["content"]
        assert "####" not in reply and reply not in evaluated


def test_mcnemar_and_answer_extraction():
    from math import comb

    from layerswap_core.demos.measure import extract, mcnemar_p

    a = [True] * 7 + [False] * 2 + [True] * 5
    b = [False] * 7 + [True] * 2 + [True] * 5          # 7 vs 2 discordant, 5 concordant
    expected = 2 * sum(comb(9, k) for k in range(3)) / 2 ** 9
    assert mcnemar_p(a, b) == pytest.approx(expected) == pytest.approx(mcnemar_p(b, a))
    assert mcnemar_p([True, False], [True, False]) == 1.0
    assert extract("3 apples + 4 = 7 #### 1,200 then 5") == "1200"
    assert extract("so 3 and then 12.") == "12" and extract("no number") is None


def test_a_spread_sample_covers_every_template():
    from layerswap_core.demos.variants import variant_items
    from layerswap_core.demos.reproduce import spread

    items = variant_items("sw", "validation")
    template = lambda it: it.id.split("-")[2]
    assert {template(it) for it in spread(items, 66)} == {template(it) for it in items}
    assert len(spread(items, 66)) == 66 == len({it.id for it in spread(items, 66)})
    assert spread(items, 10 ** 6) == items and spread(items, 5)[0] == items[0]
