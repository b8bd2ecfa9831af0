"""Time-left estimates from the speed measured during the run (``progress.Rate``,
``progress.with_eta``), checked on the progress a real evaluation of a tiny model reports."""
from __future__ import annotations

import time

import pytest

from layerswap_core.progress import Rate, left_text, with_eta


@pytest.fixture(scope="module")
def evaluation_trace(tiny, tiny_lm, one_thread):
    """(times, fractions, messages, end): every progress report of a real side-by-side
    evaluation of two tiny models, with the monotonic time it came at and the time it ended."""
    from layerswap_core.evaluation import runner as ev
    from layerswap_core.evaluation.registry import load_items

    items = load_items("gsm-symbolic", "en", 12)
    trace = []
    ev.run_side_by_side({"base": tiny_lm, "task": str(tiny["task"])}, items, shots=0,
                        max_new_tokens=12, batch_size=1,
                        progress=lambda f, m: trace.append((time.monotonic(), f, m)))
    end = time.monotonic()
    times, fractions, messages = zip(*trace)
    return times, fractions, messages, end


def test_the_estimate_follows_the_measured_speed(evaluation_trace):
    """The fractions a real evaluation reports, replayed on a recorded clock (wall time on a
    shared CPU is not a test's business): at a steady speed the estimate is the true time
    left; when the work slows down fourfold the estimate follows within one window."""
    _, fractions, _, _ = evaluation_trace
    assert len(fractions) >= 10 and fractions[-1] > 0.8, fractions
    assert all(b >= a for a, b in zip(fractions, fractions[1:])), fractions

    steady = Rate(min_seconds=0.0, window=60.0)
    checked = 0
    for f in fractions:                       # 200 s for the whole run
        left = steady.update(f, 200.0 * f)
        if 0.3 <= f < 1.0 and left is not None:
            assert left == pytest.approx(200.0 * (1.0 - f), rel=1e-6), (f, left)
            checked += 1
    assert checked >= 2

    # the same run, four times slower after half of it: 100 s for the first half, 400 s after
    def at(f: float) -> float:
        return 200.0 * f if f <= 0.5 else 100.0 + 800.0 * (f - 0.5)

    slowed = Rate(min_seconds=0.0, window=60.0)
    late = []
    for f in fractions:
        left = slowed.update(f, at(f))
        if f < 1.0 and left is not None and at(f) - 100.0 > 60.0:   # one window after the change
            late.append((f, left, 800.0 * (1.0 - f)))
    assert late, fractions
    for f, left, true_left in late:
        assert left == pytest.approx(true_left, rel=1e-6), (f, left, true_left)


def test_messages_say_what_is_left_only_once_measured(evaluation_trace):
    times, fractions, messages, _ = evaluation_trace
    clock = iter(times)
    shown = []
    report = with_eta(lambda f, m: shown.append(m), clock=lambda: next(clock), min_seconds=0.0)
    for f, m in zip(fractions, messages):
        report(f, m)
    assert shown[0] == messages[0]                      # nothing measured yet: no estimate
    later = [s for s, f in zip(shown, fractions) if 0.2 < f < 1.0]
    assert later and all(" left" in s and s.startswith(m) for s, m in
                         zip(later, [m for m, f in zip(messages, fractions) if 0.2 < f < 1.0]))


def test_a_new_phase_starts_a_new_measurement():
    # a slow phase (0 -> 1 in 100 s), then a fast one from 0 again (half of it in 1 s)
    rate = Rate(min_seconds=0.0)
    for t in range(0, 101, 10):
        rate.update(t / 100, float(t))
    assert rate.update(0.0, 101.0) is None              # fallen: measured afresh
    assert rate.update(0.5, 102.0) == pytest.approx(1.0)
    assert rate.update(0.49, 103.0) == pytest.approx(2.0)   # a small step back: no restart


@pytest.mark.parametrize("seconds,words", [(3, "a few seconds left"), (12, "about 10 s left"),
                                           (42, "about 40 s left"),
                                           (150, "about 2 min left"), (3 * 3600 + 600,
                                                                      "about 3 h 10 min left")])
def test_left_text(seconds, words):
    assert left_text(seconds) == words


def test_a_download_says_its_time_left_from_its_bytes_per_second():
    from layerswap_core.checkpoints.hub import Download

    now = [0.0]
    d = Download("owner/model", state="downloading", total=10 ** 9,
                 rate=Rate(clock=lambda: now[0]))
    assert "left" not in d.line()                        # nothing measured yet
    for t, done in ((4.0, 10 ** 8), (8.0, 2 * 10 ** 8)):  # 25 MB/s: 800 MB in 32 s
        now[0], d.done = t, done
        line = d.line()
    assert "20%" in line and "about 30 s left" in line, line


# --------------------------------------------------------------------------- the job's count
def test_the_tally_counts_models_and_items_across_the_job():
    from layerswap_core.progress import Tally

    whole = Tally(2, 4)                               # the CLI: one run, 2 models x 4 items
    assert whole.text(0, "base", 3) == "model 1 of 2 (base): 3 of 8 items answered"
    assert whole.text(1, "task expert", 1, "setting up the model") == (
        "model 2 of 2 (task expert): setting up the model · 5 of 8 items answered")
    assert whole.fraction(1, 2) == pytest.approx(6 / 8)
    # the dispatcher's chunk of model 2, items 3-4: counted in the job, the bar within the chunk
    chunk = Tally(2, 4, first_unit=1, first_item=2, part_units=1, part_items=2)
    assert chunk.text(0, "task expert", 1) == "model 2 of 2 (task expert): 7 of 8 items answered"
    assert chunk.fraction(0, 1) == pytest.approx(0.5)
    cell = Tally(6, 4, unit="configuration", verb="scored", first_unit=2, part_units=1,
                 name="bottom 3, top 2")
    assert cell.text(0, "merged", 4) == "configuration 3 of 6 (bottom 3, top 2): 12 of 24 items scored"
    assert cell.text(0, "merged", 2.9999999).endswith(" 11 of 24 items scored")   # float counts


def test_the_estimate_counts_down_between_reports():
    """At a measured 10 s per 10%, the estimate after 50% is 50 s; with no report for 12 s it
    has counted down to 40 s; once it runs out the line says how long the step has run."""
    from layerswap_core.progress import Eta

    now = [0.0]
    shown = []
    eta = Eta(lambda f, m: shown.append((f, m)), clock=lambda: now[0], min_seconds=0.0)
    eta.tick()
    assert shown == []                                # nothing reported yet: nothing to repeat
    for t in range(0, 51, 10):
        now[0] = float(t)
        eta(t / 100, "model 1 of 2 (base): 3 of 8 items answered")
    assert shown[-1] == (0.5, "model 1 of 2 (base): 3 of 8 items answered · about 50 s left")
    now[0] = 62.0
    eta.tick()
    assert shown[-1] == (0.5, "model 1 of 2 (base): 3 of 8 items answered · about 40 s left")
    now[0] = 95.0
    eta.tick()
    assert shown[-1][1].endswith("· a few seconds left")
    now[0] = 130.0
    eta.tick()
    assert shown[-1][1].endswith("· still working (80 s on this step)")


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_the_ticking_thread_ends_with_its_job():
    import gc
    import threading

    from layerswap_core.progress import with_eta

    shown = []
    eta = with_eta(lambda f, m: shown.append(m), tick=0.05, min_seconds=0.0)
    eta(0.1, "a")
    time.sleep(0.1)
    eta(0.2, "b")
    time.sleep(0.5)
    ticks = [m for m in shown if m.startswith("b")]
    assert len(ticks) >= 2, shown                     # repeated between reports
    del eta
    gc.collect()
    time.sleep(0.3)
    assert not [t for t in threading.enumerate() if t.name == "layerswap-eta"]
