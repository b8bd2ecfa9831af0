"""Jobs on the embedded demo trio against the clock (issue #61), marked ``timing``:

* the Sweep tab's estimate against the run it predicts (a 24-configuration sweep said "About
  27 s" and took 277 s): a gold-NLL sweep is estimated from the seconds per scored item
  measured on the visitor's models (the warm-up's scoring probe, then every sweep), so two
  sizes each come within 2x of their own run, and the estimate grows with the configurations;
* Cancel ends the job within 5 s in every phase: loading the model, setting it up, generating,
  scoring worked solutions, between sweep configurations, Reproduce's validation and its
  measure. Besides the pause points between steps, Cancel is checked before each decoder layer
  of a pass (``engines.dispatch.stopping_inside_passes``): one gold-NLL pass of up to 4,096
  tokens took 4-6.4 s on an idle core and 12-23 s at load 6, one layer of it a 30th of that;
  the hooks leave the NLLs bit for bit as they were."""
from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from layerswap_core.demos.reproduce import reproduce_demo_result
from layerswap_core.engines.jobs import register_kind
from layerswap_core.progress import Cancelled
from layerswap_core.evaluation.registry import load_items
from layerswap_core.workbench import demo  # noqa: F401  (registers the "demo_result" kind)
from layerswap_core.workbench import session as wb
from layerswap_core.workbench import configure as wb_configure
from layerswap_core.workbench import models as wb_models
from layerswap_core.workbench.sweep import sweep_grid, sweep_line, sweep_seconds

pytestmark = [pytest.mark.slow, pytest.mark.timing]

BASE, TASK, LANG = ("embedded:smollm2-135m-instruct", "embedded:smollm2-math-en",
                    "embedded:smollm2-swahili")


@pytest.fixture(scope="module")
def session():
    s, report = wb_models.open_session(BASE, TASK, LANG)
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
    config = wb_configure.make_config(session, "layer swap", 5, 2, 0, 0)
    t0 = time.perf_counter()
    res = sweep_grid(session, config, "bottom / top", xs, ys, "gsm-symbolic", "sw", n=n,
                     metric="nll")
    took = time.perf_counter() - t0
    assert sum(v is not None for row in res.scores for v in row) == cells
    assert took / 2 <= estimate <= 2 * took, (estimate, took)


def test_the_cancel_hooks_leave_the_nlls_bit_identical_and_go(session, one_thread):
    """A gold-NLL job (its passes checked for Cancel before each layer) gives the NLLs of the
    same passes run without the hooks, bit for bit, and leaves no hook on the model."""
    from layerswap_core.evaluation.registry import default_exemplars
    from layerswap_core.evaluation.runner import task_nll, task_record

    items = load_items("gsm-symbolic", "sw")[:6]
    hooked = wb.dispatcher().run(session.job("nll", "task", items, shots=2))["nlls"]
    task = task_record(items, default_exemplars(items, 2, cot=False))
    with wb.showing(session, "task") as (model, tok):
        assert not any(m._forward_pre_hooks for m in model.modules())
        plain = task_nll(task, model, tok, batch_size=16)
    assert [repr(x) for x in hooked] == [repr(x) for x in plain]


# --------------------------------------------------------------------------- Cancel, per phase
BOUND = 5.0   # seconds from Cancel to the job's end, in every phase (issue #61)


def cancel_in_phase(session, job, phase: str, delay: float = 0.0) -> dict:
    """Run ``job`` on the dispatcher, press Cancel once a progress message contains ``phase``
    (``delay`` 0: from that very progress call, so the Cancel lands in the phase whatever its
    length; else ``delay`` seconds later, from this thread: inside the phase's long steps),
    and return what happened: "error" (the job's exception), "took" (Cancel to the job's end,
    s), "last" (the last message before the Cancel), "messages"."""
    seen, out, messages = threading.Event(), {}, []

    def progress(fraction, message):
        messages.append(message)
        if phase in message and not seen.is_set():
            out["last"] = message
            if not delay:
                out["asked"] = time.monotonic()
                assert wb.cancel(session)
            seen.set()

    def run():
        try:
            out["result"] = wb.dispatcher().run(job, progress)
        except Exception as e:  # noqa: BLE001 - what the job ended with is the test's
            out["error"] = e
        out["ended"] = time.monotonic()

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 300
    while not seen.wait(0.05) and worker.is_alive() and time.monotonic() < deadline:
        pass
    assert seen.is_set(), f"the job never reached {phase!r}: {messages[-3:]}, {out}"
    if delay:
        time.sleep(delay)
        out["asked"] = time.monotonic()
        assert wb.cancel(session)
    worker.join(120)
    assert not worker.is_alive(), "the job did not end"
    out["took"] = out["ended"] - out["asked"]
    out["messages"] = messages
    print(f"{phase!r}: ended {out['took']:.2f} s after Cancel ({type(out.get('error')).__name__})")
    return out


def assert_cancelled(out: dict) -> None:
    assert isinstance(out.get("error"), Cancelled), {k: out.get(k) for k in ("error", "result")}
    assert out["took"] < BOUND, out["took"]


def test_cancel_while_loading_the_model_ends_within_5_s(session, one_thread):
    """A trio no engine holds yet (bfloat16 here): the job loads a live model, and Cancel
    while the task expert loads leaves no engine behind."""
    trio = replace(session.trio, dtype="bfloat16")
    items = load_items("gsm-symbolic", "sw")[:4]
    job = replace(session.job("nll", "task", items, shots=0), trio=trio)
    pool = wb.dispatcher().pool
    out = cancel_in_phase(session, job, "loading the task expert")
    assert_cancelled(out)
    assert not any(e.trio == trio for e in pool.engines)


def test_cancel_while_setting_up_the_model_ends_within_5_s(session, one_thread):
    items = load_items("gsm-symbolic", "sw")[:4]
    wb.dispatcher().run(session.job("nll", "lang", items[:1], shots=0))   # another model shown
    config = wb_configure.make_config(session, "layer swap", 5, 2, 0, 0).to_dict()
    out = cancel_in_phase(session, session.job("nll", config, items, shots=0),
                          "setting up the model")
    assert_cancelled(out)


def test_cancel_while_generating_ends_within_5_s(session, one_thread):
    items = load_items("gsm-symbolic", "sw")[:16]
    job = session.job("evaluate", {"task expert": "task"}, items, shots=2, max_new_tokens=128,
                      with_nll=False)
    out = cancel_in_phase(session, job, "answering", delay=1.0)
    assert_cancelled(out)


def test_cancel_while_scoring_worked_solutions_ends_within_5_s(session, one_thread):
    """Evaluate's gold-NLL phase: Cancel is checked before each decoder layer of a pass
    (``engines.dispatch.stopping_inside_passes``), not only between passes (one pass of up to
    4,096 tokens took 4-6.4 s on an idle core and 12-23 s at load 6)."""
    items = load_items("gsm-symbolic", "sw")[:48]
    job = session.job("nll", "task", items, shots=2)       # Evaluate's default shots
    out = cancel_in_phase(session, job, "scoring the worked solutions", delay=1.0)
    assert_cancelled(out)


def test_cancel_between_sweep_configurations_ends_within_5_s(session, one_thread):
    """Cancel as a configuration's job ends: the next configuration never starts."""
    config = wb_configure.make_config(session, "layer swap", 5, 2, 0, 0)
    seen, out = [], {}

    def progress(fraction, message):
        seen.append(message)
        if "configuration 1 of 4" in message and "4 of 16 items scored" in message \
                and "asked" not in out:
            out["asked"] = time.monotonic()
            assert wb.cancel(session)

    with pytest.raises(Cancelled):
        try:
            sweep_grid(session, config, "bottom / top", "2,4", "1,2", "gsm-symbolic", "sw",
                       n=4, metric="nll", progress=progress)
        finally:
            out["took"] = time.monotonic() - out.get("asked", time.monotonic())
    assert "asked" in out, seen[-3:]
    assert not any("configuration 2 of 4" in m for m in seen), seen
    print(f"between configurations: ended {out['took']:.2f} s after Cancel")
    assert out["took"] < BOUND, out["took"]


def _short_reproduce(engine, job, progress=None) -> dict:
    """Reproduce with the validation cut to its no-swap row: the measure is reached soon."""
    return reproduce_demo_result(job.trio.refs, live=engine.live, progress=progress, n=2,
                                 n_validation=2, validation_swaps=((0, 0),))


register_kind("test_short_reproduce", _short_reproduce)


def test_cancel_during_reproduces_validation_ends_within_5_s(session, one_thread):
    job = session.job("demo_result", n=2, n_validation=2, max_new_tokens=8, lang="sw")
    out = cancel_in_phase(session, job, "validation: ", delay=1.0)
    assert_cancelled(out)
    assert out["messages"][-1].startswith("validation: "), out["messages"][-1]


def test_cancel_during_reproduces_measure_ends_within_5_s(session, one_thread):
    job = session.job("test_short_reproduce")
    out = cancel_in_phase(session, job, "math expert, after", delay=1.0)
    assert_cancelled(out)
    assert not out["messages"][-1].startswith("validation: "), out["messages"][-1]
