"""An agent's job stops when its MCP client goes (issue 64): a tool call whose request ends before
its answer (the client disconnected, or cancelled the request) cancels its session's job
(``app_tabs.agents.cancel_on_disconnect``: the ``mcp`` package cancels the call's handler when
its request ends; gradio alone would run the tool on to its end)."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from layerswap_core.workbench import session as wb
from test_agents import launched_with_mcp, over_mcp, refs


@pytest.fixture(scope="module")
def mcp_app(tiny, tmp_path_factory):
    """The app with its MCP server, launched as app.py's ``main`` launches it (the disconnect
    watch in its lifespan)."""
    from app_tabs.agents import cancel_on_disconnect

    yield from launched_with_mcp(tiny, tmp_path_factory, cancel_on_disconnect)


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_an_agents_evaluation_stops_when_its_client_goes(mcp_app, tiny):
    demo, url = mcp_app
    tools = demo.agent_tools

    async def opened(call, _):
        error, text = await call("check_models", **refs(tiny))
        assert not error, text
        return json.loads(text)["session"]
    session = over_mcp(url, opened)

    async def evaluate_then_leave(call, _):
        # a long evaluation (three models, the longest prompts and answers), left after 3 s
        task = asyncio.ensure_future(call(
            "quick_evaluate", session=session, models=["base", "task", "lang"],
            questions=20, shots=8, max_new_tokens=256, chain_of_thought=True))
        await asyncio.sleep(3.0)
        assert not task.done()
        # the evaluation is running as the client leaves (checked before it leaves: once it
        # has left, the job may stop before this thread looks again)
        entry = tools.sessions[session]
        assert entry.running, entry.last
        assert wb.dispatcher().visitors.get(entry.session.id) is not None
        return task
    task = over_mcp(url, evaluate_then_leave)   # the client's session closes with its task
    t0 = time.monotonic()
    assert task.cancelled() or task.done()
    entry = tools.sessions[session]
    visitor = wb.dispatcher().visitors.get(entry.session.id)
    assert visitor is not None
    # the request's end reaches the session at once: its job is asked to stop
    while not visitor.cancel.is_set() and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    asked = time.monotonic() - t0
    assert visitor.cancel.is_set() and asked < 2.0, asked
    # and it stops at its next step (a pass of 8-shot prompts: seconds on a loaded machine),
    # long before its end
    while entry.running and time.monotonic() - t0 < 60:
        time.sleep(0.1)
    assert not entry.running, [r.as_dict() for r in entry.running]
    assert entry.last["tool"] == "quick_evaluate" and entry.last["outcome"] == "Cancelled.", \
        entry.last
    print(f"cancel asked {asked:.2f} s, job stopped {time.monotonic() - t0:.1f} s after the "
          "client left")
