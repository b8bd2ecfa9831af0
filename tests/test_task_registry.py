"""The task registry and the language table: a toy task and a toy language, one record each,
run through every way in (``layerswap eval``, the Evaluate tab's job, a sweep) on the tiny
models, with nothing else taught about them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from layerswap_core.evaluation import languages, registry
from layerswap_core.evaluation.data import DataError, Item
from layerswap_core.evaluation.languages import Language, register_language
from layerswap_core.evaluation.registry import TaskSpec, register_task

ROOT = Path(__file__).resolve().parents[1]
GOLDS = ("7", "7", "8")   # the toy extractor always answers 7: two of three are right
PROMPTS: list[str] = []   # every prompt the toy task built, in order


def _toy_items(lang, *, data_dir=None, hub=False):
    if lang != "tq":
        raise DataError(f"the toy task has no language {lang!r}")
    return [Item(f"toy-{i}", "toy", "tq", f"toy question {i}", g) for i, g in enumerate(GOLDS)]


def _toy_task(items, exemplars, *, cot=False, chat_template=False, max_new_tokens=None,
              with_nll=True):
    from layerswap_core.evaluation.tasks import Extraction, Task

    def prompt(item, tokenizer):
        PROMPTS.append(item.question)
        return f"Q: {item.question}\nA:"

    return Task("toy", list(items), prompt, lambda out: Extraction(out.strip() or None, "7"),
                lambda answer, gold: answer == gold, max_new_tokens=max_new_tokens or 2)


@pytest.fixture
def toy():
    """The toy task and the toy language registered (one row each), removed afterwards."""
    register_language(Language("tq", "Toyish", "Latin"))
    register_task(TaskSpec("toy", "Toy", _toy_items, lambda: ("tq",),
                           lambda items, shots, **kw: list(items[:shots]), task=_toy_task))
    PROMPTS.clear()
    yield
    registry.TASKS.pop("toy")
    languages.LANGUAGES.pop("tq")


def test_the_registries_list_todays_tasks_and_languages():
    from layerswap_core.demos import variants  # noqa: F401  (registers demo-variants, as the entry points do)

    assert registry.choices("eval") == ["mgsm", "gsm-symbolic"]
    assert registry.choices("sweep") == ["mgsm", "gsm-symbolic", "demo-variants"]
    assert registry.source_choices("eval", first="gsm-symbolic") == [
        ("GSM-Symbolic", "gsm-symbolic"), ("MGSM", "mgsm")]
    assert languages.choices() == ["sw", "bn", "te", "th", "ja", "zh", "ru", "fr", "de", "es",
                                   "en"]
    assert languages.mgsm_lang("swh") == "sw" and languages.symbolic_lang("bn") == "ben"
    with pytest.raises(ValueError, match="unknown data source 'toy'"):
        registry.load_items("toy", "tq")


def test_no_module_but_the_registry_branches_on_a_task_name():
    found = subprocess.run(["grep", "-rn", "source == ", "layerswap_core"], cwd=ROOT,
                           capture_output=True, text=True).stdout.splitlines()
    assert found and all(line.startswith("layerswap_core/evaluation/registry.py:")
                         for line in found)


def test_a_registered_task_and_language_are_offered_everywhere(toy):
    assert ("Toy", "toy") in registry.source_choices("eval")
    assert "toy" in registry.choices("sweep") and "tq" in languages.choices()
    assert [it.answer for it in registry.load_items("toy", "tq", 2)] == ["7", "7"]
    with pytest.raises(DataError, match="no language 'sw'"):
        registry.load_items("toy", "sw")


def _check_toy_rows(rows, summary, models):
    assert [r["question"] for r in rows] == ["toy question 0", "toy question 1", "toy question 2"]
    assert [r["gold"] for r in rows] == list(GOLDS)
    for m in models:
        assert [r["models"][m]["answer"] for r in rows] == ["7", "7", "7"]
        assert [r["models"][m]["correct"] for r in rows] == [True, True, False]
    assert [(s["model"], s["n"], round(s["accuracy"], 4)) for s in summary] == \
        [(m, 3, 0.6667) for m in models]


def test_the_cli_evaluates_a_registered_task(toy, tiny, tmp_path, capsys):
    from layerswap_core.cli import main

    out = tmp_path / "toy.json"
    assert main(["eval", "--data", "toy", "--lang", "tq", "--model", str(tiny["task"]),
                 "--shots", "0", "--device", "cpu", "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    _check_toy_rows(saved["rows"], saved["summary"], [saved["summary"][0]["model"]])
    assert saved["config"]["data"] == "Toy" and saved["config"]["max_new_tokens"] == 2
    assert PROMPTS == ["toy question 0", "toy question 1", "toy question 2"]
    assert "Toy tq: n=3" in capsys.readouterr().out


def test_the_evaluate_tab_runs_a_registered_task_as_an_engine_job(toy, tiny):
    from layerswap_core.workbench import models as wb_models
    from layerswap_core.workbench.evaluate import evaluate_roles, evaluation_note

    s, report = wb_models.open_session(str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    assert report.ok, report.problems
    res = evaluate_roles(s, "toy", "tq", n=3, shots=0, roles=("task", "lang"), max_new_tokens=2)
    assert len(res.raw.models) == 2
    _check_toy_rows(res.raw.rows, res.raw.summary, res.raw.models)
    assert evaluation_note(res).startswith("Evaluated Toy tq: 3 items, 0-shot")
    assert sorted(set(PROMPTS)) == ["toy question 0", "toy question 1", "toy question 2"]


def test_a_sweep_scores_a_registered_task(toy, tiny, tmp_path, one_thread):
    from layerswap_core.sweeps.grid import parse_grid
    from layerswap_core.sweeps.runner import run_sweep, sweep_request
    from layerswap_core.sweeps.scoring import EvalSettings

    settings = EvalSettings(data="toy", langs=("tq",), n=3, shots=0, metric="accuracy",
                            max_new_tokens=2).check()
    outcome = run_sweep(sweep_request(tiny["task"], tiny["lang"], parse_grid("bottom=1,2 top=0"),
                                      base=tiny["base"], out=str(tmp_path), eval=settings))
    records = outcome.records()
    assert len(records) == 2
    for r in records:
        assert r["scores"]["tq"]["n"] == 3 and r["scores"]["tq"]["correct"] == 2
        assert round(r["scores"]["tq"]["accuracy"], 4) == 0.6667


def test_the_demo_room_registers_its_task_and_the_entry_points_import_it():
    """The evaluation registry has no demo task of its own (nothing below the demo room imports
    it); a fresh interpreter gets ``demo-variants`` from the entry points that look tasks up by
    name (the CLI's eval and sweep, the sweeps' scoring, the workbench) and ``layerswap
    demo-data``'s recipes from ``demos.recipes``."""
    code = ("import sys\n"
            "from layerswap_core.evaluation import registry\n"
            "from layerswap_core.training import recipes\n"
            "assert 'demo-variants' not in registry.TASKS and not recipes.RECIPES\n"
            "assert not any(m.startswith('layerswap_core.demos') for m in sys.modules)\n"
            "import layerswap_core.cli.evaluate, layerswap_core.cli.sweep\n"
            "import layerswap_core.sweeps.scoring\n"
            "assert 'demo-variants' in registry.TASKS\n"
            "import layerswap_core.cli.data\n"
            "assert {'math-variants', 'swahili-reading', 'bengali-reading'} <= set(recipes.RECIPES)\n")
    subprocess.run([sys.executable, "-c", code], check=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
