"""What the page offers fits the server's job budget (issue #51, item 2): the Evaluate and Sweep
sliders' maxima follow the speed measured on the visitor's models, the estimate the page shows is
the dispatcher's, and the dispatcher admits a job at those maxima."""
from __future__ import annotations

import pytest

from layerswap_core.engines.dispatch import TooLong, _zero_duration
from layerswap_core.workbench import session as wb
from layerswap_core.workbench import models as wb_models
from layerswap_core.workbench.evaluate import (HEADROOM, evaluation_caps, evaluation_line,
                                               evaluation_seconds, session_roles)
from layerswap_core.workbench.served import LIMITS, LOCAL_LIMITS, Access
from layerswap_core.workbench.sweep import sweep_caps, sweep_line, sweep_seconds

# a measured speed on a 2-core CPU (issue #51: the page's own maxima were estimated ~54 min)
SLOW = 6.3


@pytest.fixture(scope="module")
def session(tiny):
    """A served visitor's session: the caps and the job budget are a shared server's."""
    refs = [str(tiny[r]) for r in ("base", "task", "lang")]
    s, report = wb_models.open_session(*refs, access=Access.from_env(True, trusted=refs))
    assert report.ok, report.problems
    return s


def test_local_mode_is_the_users_own(tiny, speed):
    """On one's own machine the sliders go to what the data and the model allow (no served
    caps, no job budget); the estimate is shown, without a server's allowance."""
    s, report = wb_models.open_session(str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    assert report.ok and not s.access.served
    speeds = wb.dispatcher().speeds
    speeds[s.trio] = SLOW
    try:
        assert evaluation_caps(s) == (LOCAL_LIMITS.eval_questions, LOCAL_LIMITS.new_tokens)
        assert sweep_caps(s) == LOCAL_LIMITS.sweep_items > LIMITS.sweep_items
        line = evaluation_line(s, LOCAL_LIMITS.eval_questions, 256, ["task expert"])
        assert line.startswith("About ") and "allows" not in line and "⚠" not in line, line
        job = s.job("evaluate", {"task": "task"}, [None] * 250, max_new_tokens=256)
        assert not job.budgeted and wb.dispatcher()._admit(job) == float("inf")   # no TooLong
        # a grid over the served cap is fine here; served, the line refuses it before Run
        assert sweep_line(s, "bottom / top", "0-5", "0-4", 4, "nll").startswith("30 configurations.")
    finally:
        speeds.pop(s.trio, None)
        wb.close_session(s)


@pytest.fixture
def speed(session):
    """Set the dispatcher's measured speed on the session's models for one test."""
    speeds = wb.dispatcher().speeds
    before = speeds.get(session.trio)

    def set_speed(tokens_per_second):
        speeds[session.trio] = tokens_per_second
    yield set_speed
    if before is None:
        speeds.pop(session.trio, None)
    else:
        speeds[session.trio] = before


def test_the_evaluate_maxima_fit_the_budget_at_the_measured_speed(session, speed):
    d = wb.dispatcher()
    roles = session_roles(session)
    speed(SLOW)
    at_limits = evaluation_seconds(session, LIMITS.eval_questions, LIMITS.new_tokens, roles)
    assert at_limits > d.job_seconds          # the server's limits alone: refused up front
    n, t = evaluation_caps(session)
    assert (n, t) < (LIMITS.eval_questions, LIMITS.new_tokens) and t % 8 == 0
    seconds = evaluation_seconds(session, n, t, roles)
    assert seconds <= HEADROOM * d.job_seconds
    job = session.job("evaluate", {r: r for r in roles}, [None] * n, max_new_tokens=t)
    d._admit(job)                              # admitted, not TooLong
    assert d._estimated(job).settings["estimate_seconds"] == seconds
    assert _zero_duration(d._estimated(job)) == int(seconds)   # what ZeroGPU is asked for
    # the line the page shows, at the maxima and at the limits
    line = evaluation_line(session, n, t, ["base", "task expert", "language expert", "merged"])
    assert line.startswith("About ") and f"{SLOW:.1f} tokens/s" in line, line
    over = evaluation_line(session, LIMITS.eval_questions, LIMITS.new_tokens, roles)
    assert over.startswith("⚠") and "over the 30 min" in over, over
    with pytest.raises(TooLong):
        d._admit(session.job("evaluate", {r: r for r in roles}, [None] * LIMITS.eval_questions,
                             max_new_tokens=LIMITS.new_tokens))
    speed(1000.0)                              # a fast server: the limits themselves
    assert evaluation_caps(session) == (LIMITS.eval_questions, LIMITS.new_tokens)


def test_the_sweep_maxima_fit_the_budget_at_the_measured_speed(session, speed):
    d = wb.dispatcher()
    speed(SLOW)
    n = sweep_caps(session)
    assert 1 <= n < LIMITS.sweep_items
    assert sweep_seconds(session, LIMITS.sweep_cells, n, "accuracy") <= HEADROOM * d.job_seconds
    assert sweep_seconds(session, LIMITS.sweep_cells, LIMITS.sweep_items, "accuracy") \
        > HEADROOM * d.job_seconds
    line = sweep_line(session, "bottom / top", "0-4", "0-4", n, "accuracy")
    assert line.startswith("25 configurations. About "), line
    assert sweep_line(session, "bottom / top", "0,x", "0", n, "nll").startswith("⚠ bottom")
    # a grid over the server's cap is refused by the line, before Run
    assert sweep_line(session, "bottom / top", "0-5", "0-4", n, "nll") == \
        f"⚠ 30 configurations: this server allows {LIMITS.sweep_cells} per sweep."
    speed(1000.0)
    assert sweep_caps(session) == LIMITS.sweep_items


def test_warm_up_measures_the_speed_of_new_models(session):
    thread = wb.warm_up(session)
    if thread is not None:
        thread.join(timeout=300)
    assert wb.measured_speed(session, wait=300) is not None
