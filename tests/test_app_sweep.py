"""One sweep path: the app's Sweep tab runs the CLI's sweep (``sweeps.runner.run_sweep``: its
grid, impossible cells, order and scoring), each configuration a job of the dispatcher, and
gets the CLI's scores on the tiny models."""
from __future__ import annotations

import re

import pytest

from layerswap_core.sweeps.runner import run_sweep, sweep_request
from layerswap_core.sweeps.scoring import EvalSettings
from layerswap_core.workbench import configure as wb_configure
from layerswap_core.workbench import models as wb_models
from layerswap_core.workbench.sweep import sweep_grid


@pytest.fixture(scope="module")
def session(tiny):
    s, report = wb_models.open_session(str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    assert report.ok, report.problems
    return s


def test_the_sweep_tab_gets_the_clis_scores(session, tiny, tmp_path, one_thread):
    seen, fractions = [], []
    config = wb_configure.make_config(session, "layer swap", 2, 1, 0, 0)
    res = sweep_grid(session, config, "bottom / top", "0,2", "1,7", "gsm-symbolic", "sw", n=2,
                     metric="nll", progress=lambda f, m: (seen.append(m), fractions.append(f)))
    # one bar over the whole sweep: it never goes back (it restarted at 0 per configuration)
    # and moves before the last configuration ends
    assert all(b >= a - 1e-9 for a, b in zip(fractions, fractions[1:])), fractions
    assert any(0.3 < f < 0.9 for f in fractions), fractions
    assert res.xs == [0, 2] and res.ys == [1, 7] and res.scores[1][1] is None   # 2 + 7 > 8
    # each configuration is one dispatcher job that names itself on the bar
    names = {m for m in (re.match(r"configuration \d of 3 \(([^)]*)\)", s) for s in seen) if m}
    assert {m[1] for m in names} == {"bottom 0, top 1", "bottom 2, top 1", "bottom 0, top 7"}
    assert seen[-1].endswith(": 6 of 6 items scored")

    settings = EvalSettings(data="gsm-symbolic", langs=("sw",), n=2, shots=0, metric="nll")
    cli = run_sweep(sweep_request(tiny["task"], tiny["lang"], {"top": [1, 7], "bottom": [0, 2]},
                                  base=tiny["base"], out=str(tmp_path), eval=settings))
    assert len(cli.impossible) == 1
    got = {(r["point"]["bottom"], r["point"]["top"]): r["scores"]["sw"]["nll"]
           for r in cli.records()}
    assert {(x, y): res.scores[iy][ix] for iy, y in enumerate(res.ys)
            for ix, x in enumerate(res.xs) if res.scores[iy][ix] is not None} == \
        pytest.approx(got, rel=1e-6)
    assert [r[2] for r in res.rows] == sorted(round(v, 4) for v in got.values())
