"""MGSM TSV and GSM-Symbolic loaders: real files, malformed rows, splits, language codes."""
from __future__ import annotations

import tomllib

import pytest

from layerswap_core.evaluation import data
from layerswap_core.evaluation.data import (DataError, find_mgsm_dir, gsm_symbolic_items,
                                            load_mgsm, normalize_number, parse_symbolic_toml,
                                            read_mgsm_tsv, symbolic_root)
from layerswap_core.evaluation.registry import load_items


def test_mgsm_tsv_loads_all_rows_and_normalises_answers():
    """On the suite's MGSM-format fixture (tests/mgsm_fixture.py): every MGSM code path."""
    items = load_mgsm("sw")
    assert len(items) == 250
    assert items[0].source == "mgsm" and items[0].lang == "sw" and items[0].id == "mgsm-sw-000"
    assert items[0].origin == 0 and items[249].origin == 249
    _same_problems_in_every_language_with_canonical_answers()


def test_real_mgsm_files_are_the_benchmark(real_mgsm):
    """MGSM's own content (where ../shared or $LAYERSWAP_MGSM_DIR has it): 250 rows a
    language, the first Swahili problem, the same problems in every language."""
    items = load_mgsm("sw")
    assert len(items) == 250 and items[0].question.startswith("Bata wa Janet hutaga mayai 16")
    assert items[0].answer == "18"
    _same_problems_in_every_language_with_canonical_answers()


def _same_problems_in_every_language_with_canonical_answers():
    # answers written with thousands commas in the file ("2,125") are canonical numbers
    raw = [line.split("\t")[1].strip() for line in
           (find_mgsm_dir() / "mgsm_en.tsv").read_text(encoding="utf-8").splitlines()]
    en = load_mgsm("en")
    assert any("," in r for r in raw)
    assert all(it.answer == r.replace(",", "") for it, r in zip(en, raw))
    # the same 250 GSM8K problems in every language
    assert [it.answer for it in load_mgsm("bn")] == [it.answer for it in en]


def test_language_codes_map_between_mgsm_and_package():
    assert load_items("mgsm", "swh", 3) == load_items("mgsm", "sw", 3)
    assert gsm_symbolic_items("sw") == gsm_symbolic_items("swh")
    assert gsm_symbolic_items("te")[0].lang == "te"


@pytest.mark.parametrize("content, line, message", [
    ("q1\t1\nq2 without tab\n", 2, "expected 2 tab-separated columns"),
    ("q1\t1\nq2\tabc\n", 2, "is not a number"),
    ("q1\t1\tx\n", 1, "found 3"),
    ("q1\t1\n\nq3\t\n", 3, "is not a number"),
    ("\t5\n", 1, "empty question"),
])
def test_malformed_tsv_rows_name_file_and_line(tmp_path, content, line, message):
    path = tmp_path / "mgsm_xx.tsv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=message) as err:
        read_mgsm_tsv(path)
    assert f"{path}:{line}:" in str(err.value)


def test_mgsm_dir_from_option_env_and_missing(tmp_path, monkeypatch):
    (tmp_path / "mgsm_sw.tsv").write_text("Swali moja?\t1,000\nSwali mbili?\t2.0\n", encoding="utf-8")
    assert [it.answer for it in load_mgsm("sw", tmp_path)] == ["1000", "2"]
    monkeypatch.setenv(data.MGSM_ENV, str(tmp_path))
    assert len(load_items("mgsm", "sw")) == 2
    with pytest.raises(DataError, match="mgsm_bn.tsv not found; languages in .*: sw"):
        load_mgsm("bn")
    monkeypatch.setenv(data.MGSM_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="does not exist"):
        load_mgsm("sw")


def test_gsm_symbolic_splits_respect_templates_and_ignore_flag():
    folder = symbolic_root() / "swh" / "symbolic"
    flags = {int(p.stem): bool(tomllib.loads(p.read_text(encoding="utf-8")).get("ignore"))
             for p in folder.glob("*.toml")}
    train, evals = gsm_symbolic_items("sw", "train"), gsm_symbolic_items("sw", "eval")
    numbers = lambda items: {int(it.id.rsplit("-", 1)[1]) for it in items}  # noqa: E731
    assert numbers(train) == {k for k, ign in flags.items()
                              if k < 50 and not ign and k not in data.mgsm_overlap_templates()}
    assert numbers(evals) == {k for k, ign in flags.items() if k >= 50 and not ign}
    assert any(flags.values())      # Swahili has flagged templates: they are left out above
    assert len(gsm_symbolic_items("bn", "eval")) <= 2   # Bengali: almost nothing validated
    for it in train + evals:
        assert it.source == "gsm-symbolic" and it.solution
        assert "####" not in it.solution and "<<" not in it.solution
        assert normalize_number(it.answer) == it.answer
    assert load_items("gsm-symbolic", "sw") == evals


def test_symbolic_answer_is_the_final_line(tmp_path):
    lang = tmp_path / "xyz" / "symbolic"
    lang.mkdir(parents=True)
    good = lang / "0051.toml"
    good.write_text('question = "Q?"\nanswer = "2 * 3 = <<2*3=6>>6 apples.\\nSo 6 + 1 = 7\\n#### 7\\n"\n'
                    'id_orig = 12\n', encoding="utf-8")
    it = parse_symbolic_toml(good, "xyz")
    assert (it.answer, it.solution, it.origin) == ("7", "2 * 3 = 6 apples. So 6 + 1 = 7", 12)
    ignored = lang / "0052.toml"
    ignored.write_text('question = "Q?"\nanswer = "#### 7"\nignore = true\n', encoding="utf-8")
    assert parse_symbolic_toml(ignored) is None
    bad = lang / "0053.toml"
    bad.write_text('question = "Q?"\nanswer = "no final line"\n', encoding="utf-8")
    with pytest.raises(DataError, match="0053.toml: answer does not end with"):
        parse_symbolic_toml(bad)
    broken = lang / "0054.toml"
    broken.write_text('question = "Q?\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"0054.toml: .*line 1"):
        parse_symbolic_toml(broken)


@pytest.mark.parametrize("text, expected", [
    ("18", "18"), ("1,234", "1234"), ("18.0", "18"), ("18.", "18"), ("$5", "5"), ("-3", "-3"),
    ("2.50", "2.5"), ("৪২", "42"), ("౧౦౦", "100"), ("๑,๐๐๐", "1000"), ("２０", "20"),
    ("0.5", "0.5"), ("007", "7"), ("abc", None), ("", None), ("1.2.3", None),
])
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


def test_unknown_source_and_language():
    with pytest.raises(ValueError, match="unknown data source"):
        load_items("gsm8k", "sw")
    with pytest.raises(DataError, match="no language 'xx'"):
        gsm_symbolic_items("xx")
    with pytest.raises(ValueError, match="split must be"):
        gsm_symbolic_items("sw", "test")


# --------------------------------------------------------------------------- standard exemplars
def _exemplar_file() -> dict:
    import json
    return json.loads((find_mgsm_dir() / data.MGSM_EXEMPLARS_FILE).read_text(encoding="utf-8"))


@pytest.mark.parametrize("lang", data.MGSM_LANGS)
def test_standard_exemplars_are_the_files_in_order(lang):
    raw = _exemplar_file()
    items = data.load_mgsm_exemplars(lang)
    assert [it.prompt_question for it in items] == [e["q"] for e in raw["exemplars"][lang]]
    assert [it.prompt_answer for it in items] == [e["a"] for e in raw["exemplars"][lang]]
    assert [it.answer for it in items] == [str(n) for n in raw["number_answers"]]
    assert len(items) == 8 and all(it.lang == lang and it.source == "mgsm" for it in items)
    for it in items:   # the display texts lose only the leading word ("Swali: ")
        assert it.prompt_question.endswith(it.question) and len(it.question) > 20
        assert it.prompt_answer.endswith(it.solution) and it.answer in it.solution
    # the exemplars are not among the scored rows
    assert not {it.question for it in items} & {it.question for it in load_mgsm(lang)}


def test_missing_exemplar_file_says_where_it_looked(tmp_path):
    (tmp_path / "mgsm_sw.tsv").write_text("Swali moja?\t1\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        data.load_mgsm_exemplars("sw", tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and data.MGSM_EXEMPLARS_FILE in msg and str(tmp_path) in msg
    (tmp_path / data.MGSM_EXEMPLARS_FILE).write_text('{"exemplars": {}}', encoding="utf-8")
    with pytest.raises(DataError, match="not an MGSM exemplars file"):
        data.load_mgsm_exemplars("sw", tmp_path)


# --------------------------------------------------------------------------- MGSM overlap
def test_shipped_overlap_mapping_is_what_the_recipe_finds(real_mgsm):
    import json
    fresh = data.compute_mgsm_overlap()
    shipped = json.loads(data.OVERLAP_FILE.read_text(encoding="utf-8"))
    assert fresh == shipped
    mapping = data.mgsm_overlap()
    assert mapping[36] == 11                   # template 0036 is MGSM row 11 word for word
    en = load_mgsm("en")
    t36 = tomllib.loads((symbolic_root() / "eng" / "symbolic" / "0036.toml").read_text("utf-8"))
    assert t36["question"].strip() == en[11].question
    # independent check: the package's own GSM8K index (MGSM row i = GSM8K test i) agrees, and
    # every template whose problem is among the first 250 GSM8K test problems was found
    origins = {int(p.stem): tomllib.loads(p.read_text("utf-8")).get("id_orig")
               for p in (symbolic_root() / "eng" / "symbolic").glob("*.toml")}
    assert mapping == {t: o for t, o in origins.items() if o is not None and o < 250}
    assert len([t for t in mapping if t < 50]) >= 11
    # matches and non-matches are far apart: the threshold is not a close call
    assert min(o["score"] for o in shipped["overlaps"]) > 0.9 > 0.6 > shipped["best_non_match_score"]


def test_training_split_has_no_mgsm_item():
    overlap = data.mgsm_overlap_templates()
    assert 36 in overlap
    for lang in ("en", "sw"):
        numbers = {int(it.id.rsplit("-", 1)[1]) for it in gsm_symbolic_items(lang, "train")}
        assert numbers and not numbers & overlap and max(numbers) < 50


@pytest.mark.parametrize("front, expected", [
    ('gsm_symbolic_templates: "0000, 0003-0005, 0036"', {0, 3, 4, 5, 36}),
    ("gsm_symbolic_templates: [1, 2, '0007']", {1, 2, 7}),
    ("license: apache-2.0", None),
])
def test_card_states_its_templates_in_front_matter(tmp_path, front, expected):
    (tmp_path / "README.md").write_text(f"---\n{front}\n---\n# card\n", encoding="utf-8")
    assert data.card_templates(tmp_path) == expected


def test_card_without_statement_or_with_a_bad_one(tmp_path):
    assert data.card_templates(tmp_path) is None                       # no README
    (tmp_path / "README.md").write_text("# card\ngsm_symbolic_templates: 1\n", encoding="utf-8")
    assert data.card_templates(tmp_path) is None                       # not front matter
    (tmp_path / "README.md").write_text("---\ngsm_symbolic_templates: 1-x\n---\n", encoding="utf-8")
    with pytest.raises(ValueError, match="README.md: gsm_symbolic_templates: .*'1-x'"):
        data.card_templates(tmp_path)


def test_expert_recipes_card_front_matter_round_trips(tmp_path):
    from layerswap_core.demos import recipes as expert_data
    (tmp_path / "README.md").write_text(expert_data.card_front_matter() + "# expert\n", encoding="utf-8")
    trained = data.card_templates(tmp_path)
    assert trained == set(expert_data.TRAIN_TEMPLATES)
    assert len(trained) == 50 - len([t for t in data.mgsm_overlap_templates() if t < 50])
    assert not trained & data.mgsm_overlap_templates()


def test_an_unknown_gsm_symbolic_language_lists_the_codes_lang_takes():
    with pytest.raises(data.DataError) as e:
        gsm_symbolic_items("xx", "eval")
    listed = str(e.value).split("available: ")[1].split(", ")
    assert {"sw", "en", "bn", "afr"} <= set(listed) and not {"swh", "eng"} & set(listed)
    for code in ("sw", "afr"):                      # each listed code works
        assert gsm_symbolic_items(code, "eval")
