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


def test_the_merge_bench_forks_its_contenders_from_a_small_process():
    """A forked contender's peak RSS starts at its parent's: the merge bench's own process must
    not import torch (a run that did reported 287 MiB for `cp -r`), and it still finds mergekit
    the way the tests do."""
    code = ("import sys; sys.argv = ['merge_bench']; sys.path.insert(0, 'bench'); "
            "import merge_bench; from layerswap_core import testing; "
            "print(merge_bench.mergekit_yaml() == testing.mergekit_yaml())")
    probe = ("import sys; sys.argv = ['merge_bench']; sys.path.insert(0, 'bench'); "
             "import merge_bench; print('torch' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = [subprocess.run([sys.executable, "-c", c], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300) for c in (probe, code)]
    assert [r.stdout.strip() for r in run] == ["False", "True"], [r.stderr[-500:] for r in run]
