"""Jobs on the embedded demo trio against the clock (issue #61), marked ``timing``:

* the Sweep tab's estimate against the run it predicts (a 24-configuration sweep said "About
  27 s" and took 277 s): a gold-NLL sweep is estimated from the seconds per scored item
  measured on the visitor's models (the warm-up's scoring probe, then every sweep), so two
  sizes each come within 2x of their own run, and the estimate grows with the configurations;
* Cancel while scoring worked solutions ends the job within 5 s: NOT reliably met (an expected
  failure, not strict): pause points are now between every pass (it was one per batch of 16),
  but one pass of up to 4,096 tokens took 4-6.4 s on an idle core and 12-23 s at load 6."""
from __future__ import annotations

import threading
import time

import pytest

from layerswap_core.progress import Cancelled
from layerswap_core.evaluation.registry import load_items
from layerswap_core.workbench import session as wb
from layerswap_core.workbench.sweep import sweep_grid, sweep_line, sweep_seconds

pytestmark = [pytest.mark.slow, pytest.mark.timing]

BASE, TASK, LANG = ("embedded:smollm2-135m-instruct", "embedded:smollm2-math-en",
                    "embedded:smollm2-swahili")


@pytest.fixture(scope="module")
def session():
    s, report = wb.open_session(BASE, TASK, LANG)
    assert report.ok, report.problems
    thread = wb.warm_up(s)
    if thread is not None:
        thread.join(timeout=600)
    assert wb.dispatcher().item_seconds.get(s.trio), "the warm-up measured no scoring speed"
    yield s
    wb.close_session(s)


@pytest.mark.parametrize("xs, ys", [("2,4", "1,2"), ("1,2,4,5", "1,2")])   # 4 and 8 cells
def test_a_gold_nll_sweeps_estimate_is_within_2x_of_its_run(session, xs, ys, one_thread):
    cells, n = len(xs.split(",")) * len(ys.split(",")), 4
    estimate = sweep_seconds(session, cells, n, "nll")
    line = sweep_line(session, "bottom / top", xs, ys, n, "nll")
    assert line.startswith(f"{cells} configurations. About ") and "s per scored item" in line
    assert sweep_seconds(session, 2 * cells, n, "nll") > estimate   # grows with the grid
    config = wb.make_config(session, "layer swap", 5, 2, 0, 0)
    t0 = time.perf_counter()
    res = sweep_grid(session, config, "bottom / top", xs, ys, "gsm-symbolic", "sw", n=n,
                     metric="nll")
    took = time.perf_counter() - t0
    assert sum(v is not None for row in res.scores for v in row) == cells
    assert took / 2 <= estimate <= 2 * took, (estimate, took)


@pytest.mark.xfail(strict=False, reason="not reliably met: Cancel is seen between passes, and one "
                   "gold-NLL pass (up to 4,096 tokens: several rows, or one 8-shot row) took "
                   "4-6.4 s on an idle core (12-23 s at load 6); bounding it needs smaller or "
                   "chunked prompt passes (issue #61)")
def test_cancel_while_scoring_worked_solutions_ends_within_5_s(session, one_thread):
    items = load_items("gsm-symbolic", "sw")[:48]
    job = session.job("nll", "task", items, shots=2)       # Evaluate's default shots
    scoring, out = threading.Event(), {}

    def progress(fraction, message):
        if "scoring the worked solutions" in message:
            scoring.set()

    def run():
        try:
            out["result"] = wb.dispatcher().run(job, progress)
        except Exception as e:  # noqa: BLE001 - what the job ended with is the test's
            out["error"] = e
        out["ended"] = time.monotonic()

    worker = threading.Thread(target=run)
    worker.start()
    assert scoring.wait(300), "the job never reached its scoring"
    time.sleep(1.0)                                        # inside a scoring pass
    asked = time.monotonic()
    assert wb.cancel(session)
    worker.join(60)
    assert isinstance(out.get("error"), Cancelled), out
    assert out["ended"] - asked < 5.0, out["ended"] - asked
