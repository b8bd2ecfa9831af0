"""Every bench script starts and explains itself (``--help``): the benches are not run in CI
(they measure speed and memory on purpose-built checkpoints), but a renamed function or a
broken import in one of them shows up here, not months later."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.name for p in (ROOT / "bench").glob("*.py"))


def test_there_are_bench_scripts():
    assert "merge_bench.py" in SCRIPTS and len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS)
def test_bench_script_help(script):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--help"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout
