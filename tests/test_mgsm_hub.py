"""MGSM where users are: downloaded once from the Hub into the cache (a local folder stands in for
the Hub here: no network in tests), and GSM-Symbolic with a one-line hint on a fresh offline
machine."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerswap_core.evaluation import data, mgsm_hub, registry
from layerswap_core.evaluation.data import DataError, load_mgsm, load_mgsm_exemplars

EXEMPLARS = {
    "sw": {str(i + 1): {"q": f"Swali: Juma ana mipira {i + 2}. Ana mingapi?",
                        "a": f"Jibu la hatua kwa hatua: ... Jibu ni {i + 2}."} for i in range(8)},
    "en": {str(i + 1): {"q": f"Question: Roger has {i + 2} balls. How many?",
                        "a": f"Step-by-Step Answer: ... The answer is {i + 2}."} for i in range(8)},
}


def exemplars_py(exemplars: dict, answers: list[int]) -> str:
    """An exemplars.py written as MGSM's repository writes it: literals, non-ASCII as escapes,
    keys "1".."8" (here in shuffled order), each string split in two adjacent literals."""
    lines = ['"""Prompts for mgsm."""', "# pylint: disable=line-too-long", "import os",
             f"EXEMPLAR_NUMBER_ANSWERS = {answers!r}",
             "EXEMPLAR_EQUATION_SOLUTIONS = ['5 + 6 = 11.']", "LOOKUP = os.environ",
             "MGSM_EXEMPLARS = {"]
    for lang, items in exemplars.items():
        lines.append(f"    {lang!r}: {{")
        for key in sorted(items, key=lambda k: -int(k)):
            fields = ", ".join(f"{name!r}: {ascii(text[:9])}\n    {ascii(text[9:])}"
                               for name, text in items[key].items())
            lines.append(f"        {key!r}: {{{fields}}},")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def hub_copy(tmp_path) -> Path:
    """A folder laid out as juletxara/mgsm's snapshot: TSVs and exemplars.py."""
    d = tmp_path / "hub-snapshot"
    d.mkdir()
    (d / "mgsm_sw.tsv").write_text("Bata hutaga mayai 16.\t18\nSwali la pili?\t1,000\n", encoding="utf-8")
    (d / "mgsm_en.tsv").write_text("Janet's ducks lay 16 eggs.\t18\nSecond?\t1,000\n", encoding="utf-8")
    (d / "exemplars.py").write_text(exemplars_py(EXEMPLARS, [i + 2 for i in range(8)]), encoding="utf-8")
    return d


def test_download_builds_the_folder_the_loaders_read_and_keeps_it(hub_copy, tmp_path):
    dest = tmp_path / "cache" / "data" / "mgsm"
    said = []
    assert mgsm_hub.download_mgsm(dest, snapshot=lambda: hub_copy, progress=said.append) == dest
    assert "juletxara/mgsm" in said[0] and "CC BY-SA 4.0" in said[0]
    assert [it.answer for it in load_mgsm("sw", dest)] == ["18", "1000"]
    shots = load_mgsm_exemplars("sw", dest)
    assert [s.answer for s in shots] == [str(i + 2) for i in range(8)]           # keys in order
    assert shots[0].prompt_question == EXEMPLARS["sw"]["1"]["q"]                  # escapes read
    assert shots[0].question == "Juma ana mipira 2. Ana mingapi?"
    assert "CC BY-SA 4.0" in (dest / "LICENSE.txt").read_text()
    assert not list(dest.parent.glob(".mgsm.partial-*"))

    def no_network():
        raise AssertionError("a complete folder is not downloaded again")
    assert mgsm_hub.download_mgsm(dest, snapshot=no_network) == dest


def test_a_failed_download_is_one_line_and_leaves_nothing(tmp_path):
    dest = tmp_path / "mgsm"

    def offline():
        raise OSError("Temporary failure in name resolution\nmore lines")
    with pytest.raises(mgsm_hub.MgsmDownloadError) as err:
        mgsm_hub.download_mgsm(dest, snapshot=offline)
    assert "\n" not in str(err.value) and "juletxara/mgsm" in str(err.value)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "mgsm_sw.tsv").write_text("q\t1\n", encoding="utf-8")
    (broken / "exemplars.py").write_text("MGSM_EXEMPLARS = {'sw': {}}\n", encoding="utf-8")
    with pytest.raises(mgsm_hub.MgsmDownloadError, match="EXEMPLAR_NUMBER_ANSWERS"):
        mgsm_hub.download_mgsm(dest, snapshot=lambda: broken)
    assert not dest.exists() and not list(tmp_path.glob(".mgsm.partial-*"))


def test_exemplars_py_converts_to_the_shared_json_exactly():
    """The conversion of an exemplars.py written from the team's mgsm_exemplars.json gives back
    that file's exemplars and answers (all 11 languages, real non-ASCII text)."""
    try:
        folder = data.local_mgsm_dir()
    except DataError:
        folder = None
    if folder is None or not (folder / data.MGSM_EXEMPLARS_FILE).is_file():
        pytest.skip("no local MGSM folder with mgsm_exemplars.json")
    raw = json.loads((folder / data.MGSM_EXEMPLARS_FILE).read_text(encoding="utf-8"))
    as_py = {lang: {str(i + 1): ex for i, ex in enumerate(items)}
             for lang, items in raw["exemplars"].items()}
    got = mgsm_hub.exemplars_from_py(exemplars_py(as_py, raw["number_answers"]))
    assert got["exemplars"] == raw["exemplars"] and got["number_answers"] == raw["number_answers"]


@pytest.fixture
def fresh_machine(tmp_path, monkeypatch):
    """No ../shared beside the checkout or the working directory, nothing cached, offline."""
    monkeypatch.setattr(data, "_repo_root", lambda: tmp_path / "checkout")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(data.MGSM_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path


def test_fresh_offline_machine_defaults_to_gsm_symbolic_and_says_how_to_get_mgsm(fresh_machine, hub_copy):
    from layerswap_core.workbench.evaluate import data_default

    source, note = data_default()
    assert source == "gsm-symbolic"
    assert data.MGSM_ENV in note and "juletxara/mgsm" in note and "\n" not in note
    assert "<" not in note                      # nothing a page could take for an HTML tag
    with pytest.raises(DataError) as err:
        registry.load_items("mgsm", "sw", 2)
    assert data.MGSM_ENV in str(err.value) and "online" in str(err.value)
    assert len(registry.load_items("gsm-symbolic", "sw", 2)) == 2     # the default works
    # once downloaded (here from the stand-in), the cached copy is found offline
    mgsm_hub.download_mgsm(snapshot=lambda: hub_copy)
    assert data.find_mgsm_dir() == fresh_machine / "cache" / "data" / "mgsm"
    assert data_default() == ("mgsm", "")
    assert [it.answer for it in registry.load_items("mgsm", "en")] == ["18", "1000"]


@pytest.fixture
def hub_listening(monkeypatch):
    """HF_ENDPOINT on the suite's fake Hub (``fake_hub.FakeHub``, no repositories): a Hub that
    answers."""
    from fake_hub import FakeHub

    fh = FakeHub({})
    monkeypatch.setenv("HF_ENDPOINT", fh.url)
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)
    yield
    fh.close()


@pytest.fixture
def hub_unreachable(monkeypatch):
    """HF_ENDPOINT on a closed port of this machine: the network is not there."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    monkeypatch.delenv("https_proxy", raising=False)


def test_online_fresh_machine_keeps_mgsm_the_default(fresh_machine, hub_listening, monkeypatch):
    from layerswap_core.workbench.evaluate import data_default

    monkeypatch.delenv("HF_HUB_OFFLINE")      # as `make run` starts the app
    assert data_default() == ("mgsm", "")     # downloaded on first use


def test_make_run_leaves_the_hub_on_and_make_test_turns_it_off():
    """`make run` must not forbid MGSM's download (issue #50); the tests stay offline."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    def recipe(target):
        return subprocess.run(["make", "-n", "-o", ".venv/.installed", target], cwd=root,
                              capture_output=True, text=True, check=True).stdout
    assert "app.py" in recipe("run") and "HF_HUB_OFFLINE" not in recipe("run")
    assert "HF_HUB_OFFLINE=1" in recipe("test")


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_no_network_without_hf_hub_offline_falls_back_and_says_what_to_do(fresh_machine,
                                                                            hub_unreachable,
                                                                            monkeypatch):
    """`make run` on a machine without the network: GSM-Symbolic is the default, the page
    says the Hub cannot be reached and what to do, and asking for MGSM answers at once."""
    import time
    from layerswap_core.workbench.evaluate import data_default

    monkeypatch.delenv("HF_HUB_OFFLINE")
    source, note = data_default()
    assert source == "gsm-symbolic"
    assert "cannot be reached" in note and "once online" in note and data.MGSM_ENV in note
    assert "HF_HUB_OFFLINE" not in note     # nothing forbids the download: it is not there
    t0 = time.monotonic()
    with pytest.raises(DataError, match="cannot be reached"):
        registry.load_items("mgsm", "sw", 2)
    assert time.monotonic() - t0 < 10
    assert len(registry.load_items("gsm-symbolic", "sw", 2)) == 2


def test_hf_hub_offline_says_it_forbids_the_download(fresh_machine):
    assert "HF_HUB_OFFLINE=1 forbids downloading it" in data.mgsm_help()
    assert "make run leaves it unset" in data.mgsm_help()


def test_page_text_shows_angle_brackets():
    from layerswap_core.workbench.served import as_text

    assert as_text("a folder of mgsm_<lang>.tsv & more") == "a folder of mgsm_&lt;lang&gt;.tsv &amp; more"


def test_hub_option_reads_the_downloaded_copy_and_says_when_offline(fresh_machine, hub_copy):
    with pytest.raises(DataError, match="Hub is offline"):
        registry.load_items("mgsm", "sw", 1, hub=True)
    mgsm_hub.download_mgsm(snapshot=lambda: hub_copy)
    assert [it.answer for it in registry.load_items("mgsm", "sw", hub=True)] == ["18", "1000"]
    assert len(data.load_mgsm_exemplars_hub("en")) == 8


def test_the_cli_names_a_missing_model_first_and_offers_gsm_symbolic(fresh_machine, tiny, capsys):
    """`layerswap eval` without MGSM: a mistyped model is said before the data, and the MGSM
    refusal offers what is installed (--data gsm-symbolic), in the CLI's words."""
    from layerswap_core.cli import main

    assert main(["eval", "--model", "/no/such/model", "--data", "mgsm", "--n", "1"]) == 2
    err = capsys.readouterr().err
    assert "/no/such/model" in err and "MGSM" not in err
    assert main(["eval", "--model", str(tiny["base"]), "--data", "mgsm", "--n", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--data gsm-symbolic" in err and "choose MGSM" not in err
