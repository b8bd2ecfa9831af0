"""The README's CLI block runs as written after `make install` (issue #50): each line in a
subprocess from the checkout, the command word and flags exactly as the README prints them.

The README's placeholders (B, T, L, merged, my-expert) become the tiny models and folders of
this test; the two lines that take minutes (eval of 50 items, train) run with --help appended
(the command answers from .venv) and their whole argument list is parsed by the command's own
parser (every flag and choice exists)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = ".venv/bin/layerswap"
SLOW = ("eval", "train")   # minutes, and MGSM or training data: parsed, not run


def readme_cli_lines() -> list[list[str]]:
    """The commands of the README's "CLI in brief" block, comments dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"\*\*The CLI in brief\*\*.*?```bash\n(.*?)```", text, re.S)
    assert block, "README.md has no bash block after **The CLI in brief**"
    return [shlex.split(line, comments=True) for line in block.group(1).splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_cli_block_runs_as_written(tiny, tmp_path):
    program = ROOT / PROGRAM
    if not program.exists():
        if os.environ.get("MAKELEVEL"):   # `make test` installs first: it must be there
            pytest.fail(f"{PROGRAM} is missing after `make install`")
        pytest.skip(f"no {PROGRAM}: `make install` (or `make test`) makes it")
    from layerswap_core.cli import build_parser

    lines = readme_cli_lines()
    assert {line[0] for line in lines} == {PROGRAM}, "every line starts with " + PROGRAM
    commands = [line[1] for line in lines]
    assert {"--help", "info", "merge", "eval"} <= set(commands), commands
    names = {"B": str(tiny["base"]), "T": str(tiny["task"]), "L": str(tiny["lang"]),
             "merged": str(tmp_path / "merged"), "my-expert": str(tmp_path / "my-expert")}
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for line in lines:
        args = [names.get(a, a) for a in line[1:]]
        if args[0] in SLOW:
            build_parser(args[0]).parse_args(args)   # every flag exists, every value is valid
            args = [*args, "--help"]
        done = subprocess.run([line[0], *args], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, f"{shlex.join(line)}: {done.stderr.strip()[-400:]}"
        assert done.stdout.strip(), shlex.join(line)
    assert (tmp_path / "merged" / "layerswap.yaml").exists()   # the merge line wrote its folder
