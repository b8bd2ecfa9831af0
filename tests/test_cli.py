import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from layerswap_core.cli import (CLI_MODULES, COMMANDS, NO_MODEL_COMMANDS, build_parser, main,
                                 summary_parser)


def _subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return set(action.choices)


def test_help_lists_the_subcommands_that_exist():
    res = subprocess.run([sys.executable, "-m", "layerswap_core", "--help"], capture_output=True,
                         text=True, check=True)
    for name in _subcommands():
        assert name in res.stdout
    assert {"info", "prepare"} <= _subcommands()


def test_console_script_installed():
    from pathlib import Path

    beside = Path(sys.executable).parent / "layerswap"  # the venv's bin, whether on PATH or not
    exe = str(beside) if beside.exists() else shutil.which("layerswap")
    assert exe, "pip install -e . should install the `layerswap` console script"
    res = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True)
    assert "layer swapping" in res.stdout


def test_every_cli_module_contributes_commands():
    import importlib
    for mod in CLI_MODULES:
        try:
            m = importlib.import_module(f"layerswap_core.cli.{mod}")
        except ModuleNotFoundError:
            continue
        assert hasattr(m, "add_cli"), f"layerswap_core.cli.{mod} has no add_cli"


def test_the_commands_table_names_each_groups_commands():
    """``COMMANDS`` (which group a command imports) is what each group's add_cli adds, in order."""
    import argparse
    import importlib

    for group, names in COMMANDS.items():
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(f"layerswap_core.cli.{group}").add_cli(sub)
        assert tuple(sub.choices) == tuple(names), group
    def commands(parser):
        return list(next(a for a in parser._actions if a.dest == "command").choices)
    assert commands(build_parser()) == [n for names in COMMANDS.values() for n in names]
    assert commands(build_parser("plan")) == ["merge", "plan"]
    assert commands(build_parser("no-such-command")) == commands(build_parser())
    assert commands(summary_parser()) == commands(build_parser())


def test_help_lists_every_command_without_importing_the_groups():
    """`layerswap --help` (and no command, or an unknown one) shows each command's one-line
    help, the same text as the full parser's, without importing a group (0.2-0.3 s for all)."""
    import os

    full = build_parser().format_help()
    assert summary_parser().format_help() == full
    code = ("import sys\nfrom layerswap_core.cli import main\ntry:\n    rc = main(sys.argv[1:])\n"
            "except SystemExit as e:\n    rc = e.code\n"
            "print([m for m in sys.modules if m.startswith('layerswap_core.cli.')], "
            "'torch' in sys.modules)\nsys.exit(rc)")
    for argv, rc in ((["--help"], 0), ([], 0), (["no-such-command"], 2)):
        res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert res.returncode == rc, (argv, res.stderr[-2000:])
        if rc == 0:
            assert res.stdout.splitlines()[-1] == "[] False", argv
            assert "merge a task expert and a language expert" in res.stdout
        else:
            assert "invalid choice: 'no-such-command'" in res.stderr


def test_every_commands_help_imports_neither_torch_nor_transformers():
    """`layerswap COMMAND --help` (and an argument error) builds only the parser: no group module
    imports torch or transformers at import time (2-3 s); the command imports them when it runs.
    One interpreter, commands in ``COMMANDS`` order, checked after each: the first command whose
    parser imported one is named."""
    import os

    code = ("import contextlib, io, sys\nfrom layerswap_core.cli import HELP, main\n"
            "for name in HELP:\n"
            "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "        try:\n            main([name, '--help'])\n"
            "        except SystemExit:\n            pass\n"
            "    assert 'usage: layerswap ' + name in out.getvalue(), name\n"
            "    heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
            "    if heavy:\n        print(name, *heavy)\n        break\n"
            "else:\n    print('none')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines()[-1] == "none", "imported by --help of: " + res.stdout


def test_merge_command_runs_without_torch_and_writes_the_same_model(tiny, tmp_path):
    """`layerswap merge` on the CPU (copies, and linear blends in numpy) never imports torch,
    transformers nor pydantic (2.3 s and 0.15 s of imports), and writes the bytes that
    ``merge_to_folder`` writes for the same config."""
    import os

    from layerswap_core.merge.config import MergeConfig
    from layerswap_core.merge.executor import merge_to_folder

    code = ("import sys; from layerswap_core.cli import main; rc = main(sys.argv[1:]); "
            "print(*(m in sys.modules for m in ('torch', 'transformers', 'pydantic'))); "
            "sys.exit(rc)")
    flags = ["--task", str(tiny["task"]), "--lang", str(tiny["lang"]), "--bottom", "2", "--top",
             "1", "--transition-bottom", "1", "--w-task", "0.7", "--w-lang", "0.3"]
    res = subprocess.run([sys.executable, "-c", code, "merge", *flags, "--out",
                          str(tmp_path / "cli")], capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines()[-1] == "False False False"
    here = merge_to_folder(MergeConfig(bottom=2, top=1, transition_bottom=1, w_task=0.7,
                                       w_lang=0.3), tiny["task"], tiny["lang"], out=tmp_path / "here")
    shards = sorted(p.name for p in here.glob("*.safetensors"))
    assert shards == sorted(p.name for p in (tmp_path / "cli").glob("*.safetensors"))
    for f in shards:
        assert (here / f).read_bytes() == (tmp_path / "cli" / f).read_bytes(), f


def test_info_and_readable_errors(tiny, capsys, tmp_path):
    assert main(["info", str(tiny["base"])]) == 0
    assert "8 layers" in capsys.readouterr().out
    assert main(["info", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert "no such folder" in err and "Traceback" not in err
    # the command itself (``cli.run``, which freezes the objects before exiting): same status
    res = subprocess.run([sys.executable, "-m", "layerswap_core", "info", str(tmp_path / "nope")],
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "no such folder" in res.stderr


def test_python_api_names_resolve_and_never_shadow_submodules():
    import importlib
    import pkgutil

    import layerswap_core
    submodules = {m.name for m in pkgutil.iter_modules(layerswap_core.__path__)}
    assert not submodules & set(layerswap_core.__all__), "an API name hides a submodule"
    for name in layerswap_core.__all__:
        assert getattr(layerswap_core, name) is not None, name
    assert importlib.import_module("layerswap_core.training.config").TrainConfig is layerswap_core.TrainConfig


def _fails_readably(argv, capsys, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (line,) = [ln for ln in err.splitlines() if f"layerswap {argv[0]}: error: " in ln]  # one line
    for needle in needles:
        assert needle in line, err
    return line


def test_info_names_an_invalid_config_json(tiny, capsys, tmp_path):
    d = Path(shutil.copytree(tiny["base"], tmp_path / "m"))
    (d / "config.json").write_text("{not json")
    _fails_readably(["info", str(d)], capsys, str(d / "config.json"), "not valid JSON")


def test_eval_on_a_truncated_checkpoint_is_one_line(tiny, capsys, tmp_path):
    d = Path(shutil.copytree(tiny["base"], tmp_path / "m"))
    f = d / "model.safetensors"
    f.write_bytes(f.read_bytes()[:5000])
    _fails_readably(["eval", "--model", str(d), "--data", "gsm-symbolic", "--lang", "sw", "--n", "1",
                     "--device", "cpu"], capsys, str(f))


def test_allow_bin_on_every_command_that_loads_models(tiny, capsys, tmp_path, monkeypatch):
    import torch

    from layerswap_core.checkpoints import references
    from layerswap_core.checkpoints.reading import CheckpointReader

    monkeypatch.setenv("LAYERSWAP_CACHE", str(tmp_path / "cache"))
    parser = build_parser()
    for name, command in next(a for a in parser._actions if a.dest == "command").choices.items():
        assert ("--allow-bin" in command._option_string_actions) == (name not in NO_MODEL_COMMANDS), name
    d = tmp_path / "binonly"
    d.mkdir()
    for f in tiny["base"].iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, d / f.name)
    ref = CheckpointReader(tiny["base"])
    torch.save({n: ref.get(n) for n in ref.names()}, d / "pytorch_model.bin")
    _fails_readably(["info", str(d)], capsys, "--allow-bin")
    assert main(["info", "--allow-bin", str(d)]) == 0
    assert "8 layers" in capsys.readouterr().out
    with pytest.raises(references.ModelLoadError, match="--allow-bin"):   # the command's choice
        references.resolve(str(d))                     # does not outlive it (a context variable)
    _fails_readably(["plan", "--task", str(d), "--lang", str(tiny["lang"])], capsys, "--allow-bin")


def test_demo_data_writes_a_recipe_as_chat_jsonl(tmp_path, capsys):
    """`layerswap demo-data` (the recipes' command line, out of the library): the held-out math
    split as chat JSONL; a missing source is one line and exit code 2."""
    import json

    from layerswap_core.demos import recipes

    out = tmp_path / "math_eval.jsonl"
    assert main(["demo-data", "math", "--split", "eval", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert rows == recipes.math_examples("eval")
    assert [m["role"] for m in rows[0]["messages"]] == ["user", "assistant"]
    assert f"{len(rows)} examples" in capsys.readouterr().out
    if not (recipes.FREEDICT_DIR / "freedict-swh-eng.index").exists():
        assert main(["demo-data", "swahili", "--out", str(tmp_path / "s.jsonl")]) == 2
        err = capsys.readouterr().err
        assert "apt-get install" in err and len(err.strip().splitlines()) == 1


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_the_progress_bar_appears_after_its_delay_with_the_latest_state(capsys):
    """The bar (and tqdm's import) waits DELAY_S: a command that ends sooner shows none; one
    that runs longer shows where it is, including what was said before the bar appeared."""
    import time

    from layerswap_core.cli.progress import DELAY_S, progress_bar

    with progress_bar() as progress:
        progress(0.5, "quick")
    assert capsys.readouterr().err == ""

    with progress_bar("merge") as progress:
        progress(0.25, "checking the models")   # before the bar exists
        time.sleep(DELAY_S + 0.4)
        shown = capsys.readouterr().err
        progress(0.75, "model.layers.3.mlp")
    err = capsys.readouterr().err
    assert "25%" in shown and "merge: checking the models" in shown
    assert "75%" in err and "merge: model.layers.3.mlp" in err


def test_train_names_a_missing_data_file_before_loading_the_model(tmp_path, capsys):
    """The data files are looked for first: no model is loaded (or converted) for a typo."""
    rc = main(["train", "--model", str(tmp_path / "no-model"), "--data", str(tmp_path / "x.jsonl"),
               "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.endswith("x.jsonl: no such data file") and "\n" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("typed, meant", [("swahili", "sw"), ("Bengali", "bn"), ("swa", "sw")])
def test_a_language_named_otherwise_gets_a_did_you_mean(typed, meant):
    from layerswap_core.evaluation.data import DataError, gsm_symbolic_items, load_mgsm
    for load in (gsm_symbolic_items, load_mgsm):
        with pytest.raises(DataError, match=f"did you mean {meant}\\?"):
            load(typed)


def test_docs_cli_lists_every_command():
    """docs/cli.md's overview block has a line for every subcommand the parser knows."""
    import argparse
    import re

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text(encoding="utf-8")
    block = text.split("```bash", 1)[1].split("```", 1)[0]
    listed = set(re.findall(r"^layerswap ([a-z-]+)", block, flags=re.M))
    assert listed == set(sub.choices), (set(sub.choices) - listed, listed - set(sub.choices))
