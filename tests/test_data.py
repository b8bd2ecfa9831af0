"""MGSM TSV and GSM-Symbolic loaders: real files, malformed rows, splits, language codes."""
from __future__ import annotations

import tomllib

import pytest

from layerswap_core import data
from layerswap_core.data import (DataError, find_mgsm_dir, gsm_symbolic_items, load_items,
                                 load_mgsm, normalize_number, parse_symbolic_toml, read_mgsm_tsv,
                                 symbolic_root)


def test_mgsm_tsv_loads_all_rows_and_normalises_answers():
    items = load_mgsm("sw")
    assert len(items) == 250
    assert items[0].question.startswith("Bata wa Janet hutaga mayai 16")
    assert items[0].answer == "18" and items[0].source == "mgsm" and items[0].lang == "sw"
    assert items[0].origin == 0 and items[249].origin == 249
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
    assert numbers(train) == {k for k, ign in flags.items() if k < 50 and not ign}
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
