"""The demo room (``layerswap_core.demos``): a demo trio is one record. A toy record registered
here reaches the Models tab's trio buttons, Reproduce (the trio in use, its question language,
its words and result file) and ``bench/demo_result.py --language``; and no per-trio literal
(the demo's model names, result files, button labels) is left in the rooms below the demo room
or in the workbench. Fast: no model is loaded."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from layerswap_core.demos import measure, trios
from layerswap_core.demos.reproduce import measured_demo_result
from layerswap_core.workbench import demo as wb_demo
from layerswap_core.workbench import session as wb

ROOT = Path(__file__).resolve().parents[1]
TOY = trios.DemoTrio(
    key="toy", label="Toy demo (Telugu)", language="te", base="embedded:toy-base",
    task="embedded:toy-math", lang="embedded:toy-telugu", recipes={"lang": "toy-reading"},
    result_file="toy_demo_result.json", chat_expectations="Toy chat words.",
    eval_note="Toy evaluate note.", reproduce_story="**Toy story.** {result}")


@pytest.fixture
def toy():
    trios.register_demo(TOY)
    try:
        yield TOY
    finally:
        trios.unregister_demo(TOY.key)


def _bench():
    spec = importlib.util.spec_from_file_location("bench_demo_result",
                                                  ROOT / "bench" / "demo_result.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _choices(parser, dest: str):
    return next(a.choices for a in parser._actions if a.dest == dest)


def test_the_shipped_trios_are_records():
    assert list(trios.choices()) == ["sw", "bn"]
    assert wb.DEMO_REFS == trios.demo("sw").refs == trios.first().refs
    for trio in trios.DEMOS.values():
        assert trio.result_path.is_file(), trio.result_file
        assert measured_demo_result(trio=trio.key) is not None
        assert trio.defaults == {"eval_lang": trio.language, "sweep_lang": trio.language}
        assert trios.for_refs(trio.refs) is trio
    bn = trios.demo("bn")
    assert "Gemma-3-270M" in bn.label and bn.language_name == "Bengali"
    assert "Bengali" in bn.chat_expectations and "270M" in bn.eval_note
    assert "Bengali" in wb_demo.demo_story(bn) and "--language bn" in wb_demo.measured_markdown(bn)


def test_a_toy_trio_reaches_the_buttons_reproduce_and_the_bench(toy):
    # the Models tab's buttons are built from this
    assert wb.demo_trio_choices()["toy"] == "Toy demo (Telugu)"
    assert wb.demo_trio_refs("toy") == toy.refs
    assert toy.task in wb.demo_experts() and toy.lang in wb.demo_experts()
    # Reproduce: the toy's models are the trio in use; the measure takes its question language
    in_use = wb_demo.trio_in_use(toy.refs)
    assert in_use is toy and in_use.language == "te"
    assert "te" in measure.measured_languages()
    assert measure.questions("te") == {"te": "Telugu question", "en": "English question"}
    assert measured_demo_result(trio="toy") is None     # no result file shipped for it
    assert wb_demo.demo_story(toy).startswith("**Toy story.** No measured demo result")
    # bench/demo_result.py --language
    assert "toy" in _choices(_bench().build_parser(), "language")


def test_without_the_toy_nothing_of_it_stays(toy):
    trios.unregister_demo("toy")
    assert "toy" not in wb.demo_trio_choices()
    assert "toy" not in _choices(_bench().build_parser(), "language")
    with pytest.raises(ValueError):
        measure.questions("te")


def test_other_models_show_the_trio_of_their_language():
    assert trios.for_refs({"task": "my/math", "lang": "my/bengali-lora"}) is trios.demo("bn")
    assert trios.for_refs({"task": "my/math", "lang": "my/expert"}) is trios.first()
    assert trios.for_refs(None) is trios.first()


def _per_trio_literals() -> set[str]:
    """The words particular to each registered demo trio: its experts' names, its result file
    and its button label (the bases are generic embedded models)."""
    out = set()
    for trio in trios.DEMOS.values():
        out |= {ref.removeprefix("embedded:") for ref in trio.experts()}
        out |= {trio.result_file, trio.label}
    return out


def _demo_data_literals() -> set[str]:
    """The names of the demo's data: the recipes its trios and the cross-fitting's trainings
    were trained on, and the files its variants ship in."""
    from layerswap_core.demos import folds, variants

    out = {name for trio in trios.DEMOS.values() for name in trio.recipes.values()}
    out |= {t.recipe for t in folds.TRAININGS}
    out |= {f["result_file"] for trio in trios.DEMOS.values() for f in trio.folds.values()}
    out |= {trio.crossfit_file for trio in trios.DEMOS.values() if trio.crossfit_file}
    return out | {variants.VARIANTS_FILE.name, folds.FOLD2_FILE.name}


def test_no_per_trio_literal_below_the_demo_room_or_in_the_workbench():
    literals = _per_trio_literals()
    assert {"smollm2-swahili", "gemma3-bengali", "demo_result.json", "demo_result_bn.json",
            "Swahili demo (SmolLM2-135M)"} <= literals
    data = _demo_data_literals()
    assert {"math-variants", "swahili-reading", "english-prose-control",
            "bengali-reading", "demo_variants.json.gz", "fold2_variants.json.gz"} <= data
    found = []
    for room in ("checkpoints", "evaluation", "training", "workbench"):
        for path in sorted((ROOT / "layerswap_core" / room).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            found += [f"{path.relative_to(ROOT)}: {word!r}" for word in literals | data
                      if word in text]
    assert found == []


def test_the_cross_fitting_driver_runs_each_training_with_its_shipped_experts_flags(tmp_path,
                                                                                   capsys):
    """``bench/demo_folds.py``: every run of ``demos.folds.TRAININGS`` under ``nice -n 15``,
    one thread and ``--resume``, its command the shipped expert's configuration on the run's
    files (parsed back by the CLI); no run started (``--dry-run``)."""
    import argparse
    import shlex
    from dataclasses import asdict

    from layerswap_core.cli import train as cli_train
    from layerswap_core.demos.folds import TRAININGS

    spec = importlib.util.spec_from_file_location("demo_folds", ROOT / "bench" / "demo_folds.py")
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    assert driver.main(["--dry-run", "--runs", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(TRAININGS) and not list(tmp_path.iterdir())
    parser = argparse.ArgumentParser()
    cli_train.add_cli(parser.add_subparsers())
    for t, line in zip(TRAININGS, lines):
        argv = shlex.split(line)
        assert argv[:4] == ["nice", "-n", "15", "layerswap"] and argv[-1] == "--resume"
        cfg = asdict(cli_train.config_from_args(parser.parse_args(argv[4:-1])).validate())
        folder = tmp_path / t.name
        want = {**t.config(), "data": str(folder / "train.jsonl"),
                "eval_data": str(folder / "eval.jsonl"), "output": str(folder / "out"),
                "threads": 1}
        assert cfg == want, t.name
    assert {t.fold for t in TRAININGS} == {1, 2}
