"""A chat template's render stops when its job is cancelled (issue 64: "Cancel reaches a running
render"): the render counts its steps (``inference.prompts``) and, inside a dispatcher job,
looks at the job's Cancel every few hundred of them (``progress.cancel_check``), so a prompt
rendered many times (a long chat fitted to the context, an evaluation's items) never outlasts a
Cancel by more than a step. The bounds on one render are lifted here (two minutes, no step cap):
what stops it is the Cancel alone."""
from __future__ import annotations

import shutil
import threading
import time

import pytest

from layerswap_core.inference import prompts
from layerswap_core.progress import Cancelled, pausing
from layerswap_core.workbench import chat as wb_chat
from layerswap_core.workbench import session as wb
from layerswap_core.workbench import models as wb_models

NESTED_LOOPS = ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
                "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")


@pytest.fixture
def unbounded(monkeypatch):
    """One render may run two minutes and any number of steps: only a Cancel stops it early."""
    monkeypatch.setattr(prompts, "RENDER_SECONDS", 120.0)
    monkeypatch.setattr(prompts, "RENDER_STEPS", 10 ** 12)


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_a_render_under_a_cancelled_jobs_hook_stops_within_a_second(unbounded):
    cancelled = threading.Event()

    def hook():   # a dispatcher's pause hook, as ``Dispatcher._pauser`` makes it
        pass
    hook.cancelled = cancelled.is_set
    timer = threading.Timer(0.5, cancelled.set)
    t0 = time.monotonic()
    timer.start()
    with pausing(hook), pytest.raises(Cancelled):
        prompts.render_template(NESTED_LOOPS, messages=[{"role": "user", "content": "hi"}])
    assert time.monotonic() - t0 < 2.0
    # without a job (a script, the CLI) nothing is looked at: the bounds alone stop a render
    assert prompts.render_template("{{ messages[0]['content'] }}",
                                   messages=[{"role": "user", "content": "hi"}]) == "hi"


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_cancel_stops_a_chat_whose_template_is_rendering(tiny, tmp_path, unbounded):
    """A Chat on an expert whose chat template nests two ``range(100000)`` loops: the render
    holds the engine until Cancel, which ends the chat within 5 s (the engine free again)."""
    from transformers import AutoTokenizer

    task = tmp_path / "task"
    shutil.copytree(tiny["task"], task)
    tok = AutoTokenizer.from_pretrained(task)
    tok.chat_template = NESTED_LOOPS
    tok.save_pretrained(task)
    s, report = wb_models.open_session(str(tiny["base"]), str(task), str(tiny["lang"]))
    assert report.ok, report.problems
    try:
        with wb.showing(s, "task"):   # the engine loaded first: the chat's render starts at once
            pass
        outcome: dict = {}

        def chat():
            try:
                for reply in wb_chat.chat_turn(s, "hi", [], role="task", max_new_tokens=4):
                    outcome["answer"] = reply
            except Cancelled:
                outcome["cancelled"] = time.monotonic()
            except Exception as e:  # noqa: BLE001 - the test reports it
                outcome["error"] = repr(e)

        thread = threading.Thread(target=chat, daemon=True)
        thread.start()
        time.sleep(3.0)
        assert thread.is_alive() and not outcome, outcome   # still rendering
        t0 = time.monotonic()
        assert wb.cancel(s)
        thread.join(30)
        assert "cancelled" in outcome, outcome
        assert outcome["cancelled"] - t0 < 5.0
        assert not wb.running(s)
    finally:
        wb.close_session(s)
