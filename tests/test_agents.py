"""The agent tools (workbench.agents): an MCP client on loopback lists them and runs check ->
suggest -> plan -> build -> quick evaluation on the tiny trio; served mode's rules hold for an
agent session as for a page visitor (references, saves by name in its own folder, quotas,
bounds), sessions are capped and closed when idle."""
from __future__ import annotations

import asyncio
import json
import shutil
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from layerswap_core.workbench import agents
from layerswap_core.workbench.served import LIMITS, REFUSED, Access, WorkbenchError

TOOLS = {"check_models", "delta_summary", "suggest_configuration", "layer_plan", "build_and_save",
         "quick_evaluate", "job_status", "cancel_job", "close_session"}


def refs(tiny) -> dict:
    return {role: str(tiny[role]) for role in ("base", "task", "lang")}


# --------------------------------------------------------------------------- over MCP
def launched_with_mcp(tiny, tmp_path_factory, lifespan=None):
    """The app (local mode, saves under a temporary output root) launched with its MCP server
    on a free loopback port (``lifespan(demo)``: app.py's ``main`` passes
    ``app_tabs.agents.cancel_on_disconnect``): yields (demo, the MCP URL)."""
    import app

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAYERSWAP_OUTPUT_DIR", str(tmp_path_factory.mktemp("outputs")))
        demo = app.build_demo(refs(tiny), served=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kw = {} if lifespan is None else {"app_kwargs": {"lifespan": lifespan(demo)}}
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                        quiet=True, mcp_server=True, **kw)
    assert demo.mcp_error is None, demo.mcp_error
    try:
        yield demo, f"http://127.0.0.1:{port}/gradio_api/mcp/"
    finally:
        demo.close()


@pytest.fixture(scope="module")
def mcp_url(tiny, tmp_path_factory):
    """The app with its MCP server (``launched_with_mcp``): its URL."""
    for _demo, url in launched_with_mcp(tiny, tmp_path_factory):
        yield url


def over_mcp(url: str, script, headers: dict | None = None):
    """Run ``await script(call, tools)`` in one MCP client session (streamable HTTP, sending
    ``headers``): ``call(name, **args)`` returns (is_error, text)."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    async def main():
        async with streamablehttp_client(url, headers=headers) as (read, write, _):
            async with ClientSession(read, write) as client:
                await client.initialize()
                tools = (await client.list_tools()).tools

                async def call(name, **args):
                    res = await client.call_tool(name, args)
                    return res.isError, res.content[0].text
                return await script(call, tools)
    return asyncio.run(main())


def test_an_mcp_client_lists_the_tools_and_merges_the_tiny_trio(mcp_url, tiny):
    steps = {}

    async def script(call, tools):
        steps["tools"] = {t.name: t for t in tools}
        err, text = await call("check_models", **refs(tiny))
        assert not err, text
        steps["check"] = json.loads(text)
        sid = steps["check"]["session"]
        err, text = await call("suggest_configuration", session=sid)
        assert not err, text
        steps["suggest"] = json.loads(text)
        config = steps["suggest"]["config"]
        err, text = await call("layer_plan", session=sid, config=config)
        assert not err, text
        steps["plan"] = json.loads(text)
        err, text = await call("build_and_save", session=sid, config=config, folder="agent-merge")
        assert not err, text
        steps["build"] = json.loads(text)
        err, text = await call("quick_evaluate", session=sid, questions=1, max_new_tokens=8)
        assert not err, text
        steps["eval"] = json.loads(text)
        steps["status"] = json.loads((await call("job_status", session=sid))[1])
        # errors: one line each, the session still usable
        steps["errors"] = [await call("layer_plan", session=sid, config={"bottom": 99}),
                           await call("layer_plan", session=sid, config={"task": "/etc"}),
                           await call("quick_evaluate", session=sid, questions=10_000),
                           await call("job_status", session="no-such-session")]
        steps["closed"] = await call("close_session", session=sid)
        steps["after"] = await call("job_status", session=sid)

    over_mcp(mcp_url, script)
    tools = steps["tools"]
    assert set(tools) == TOOLS                 # the page's own endpoints are not tools
    for tool in tools.values():
        assert tool.description and "Returns: JSON" in tool.description, tool.name
        props = tool.inputSchema["properties"]
        assert all(p.get("description") for p in props.values()), tool.name
    assert tools["quick_evaluate"].inputSchema["properties"]["questions"]["type"] == "integer"
    assert "ties_density" in tools["build_and_save"].inputSchema["properties"]["config"][
        "description"]                          # the fields, from their one declaration

    check = steps["check"]
    assert check["compatible"] and check["layers"] == 8 and len(check["session"]) == 32
    assert [m["role"] for m in check["models"]] == ["base", "task expert", "language expert"]
    # the tiny trio's language expert changed layers 0, 1 and 7
    sug = steps["suggest"]["config"]
    assert (sug["bottom"], sug["top"]) == (2, 1), steps["suggest"]
    sources = [row["source"] for row in steps["plan"]["layers"]]
    assert sources[:2] == ["lang", "lang"] and sources[-1] == "lang" and set(sources[2:7]) == {"task"}
    build = steps["build"]
    saved = Path(build["saved_to"])
    assert saved.name == "agent-merge" and (saved / "layerswap.yaml").is_file()
    assert "bottom: 2" in build["config_yaml"] and 0 < build["tensors_recomputed"] < build["tensors"]
    summary = steps["eval"]["summary"]
    assert [s["model"] for s in summary] == ["task expert", "merged"]
    assert all(s["n"] == 1 for s in summary) and len(steps["eval"]["items"]) == 1
    assert steps["status"]["running"] == [] and steps["status"]["built"].startswith("layer swap")
    assert steps["status"]["last"]["tool"] == "quick_evaluate"
    assert steps["status"]["last"]["outcome"] == "done"

    words = ["exceeds the model's 8 layers", "leave out task", "number of questions must be "
             "between 1 and", "unknown or expired session"]
    for (err, text), want in zip(steps["errors"], words):
        assert err and want in text and "\n" not in text.strip(), text
    assert not steps["closed"][0]
    assert steps["after"][0] and "unknown or expired session" in steps["after"][1]


@pytest.mark.slow
def test_an_mcp_client_merges_the_embedded_demo(mcp_url):
    """check -> suggest -> build and save -> quick evaluation on the embedded SmolLM2 trio, the
    tools' defaults."""
    steps = {}

    async def script(call, tools):
        for name, args in (("check_models", {}), ("suggest_configuration", {}),
                           ("build_and_save", {"folder": "demo-merge"}),
                           ("quick_evaluate", {"questions": 1, "max_new_tokens": 8})):
            if name != "check_models":
                args = {"session": steps["check_models"]["session"], **args}
            if name == "build_and_save":
                args["config"] = steps["suggest_configuration"]["config"]
            err, text = await call(name, **args)
            assert not err, (name, text)
            steps[name] = json.loads(text)
        await call("close_session", session=steps["check_models"]["session"])

    over_mcp(mcp_url, script)
    check = steps["check_models"]
    assert check["layers"] == 30 and check["models"][0]["model"] == "embedded:smollm2-135m-instruct"
    config = steps["suggest_configuration"]["config"]
    assert steps["build_and_save"]["built"].startswith(
        f"layer swap: bottom {config['bottom']}, top {config['top']}")
    assert Path(steps["build_and_save"]["saved_to"], "layerswap.yaml").is_file()
    assert [s["model"] for s in steps["quick_evaluate"]["summary"]] == ["task expert", "merged"]


# --------------------------------------------------------------------------- served rules
@pytest.fixture
def served_tools(tiny, tmp_path):
    """AgentTools in served mode: the model root is the tiny family's folder; saves under
    ``tmp_path/outputs``; a victim model outside every root."""
    victim = tmp_path / "outside" / "victim"
    shutil.copytree(tiny["base"], victim)
    out = tmp_path / "outputs"
    access = Access(True, out, (tiny["base"].parent, out))
    tools = agents.AgentTools(access)
    yield tools, victim, out
    for sid in list(tools.sessions):
        tools.close_session(sid)


def opened(tools, tiny) -> str:
    return json.loads(tools.check_models(**refs(tiny)))["session"]


def test_served_agents_reach_only_what_a_visitor_may(served_tools, tiny, monkeypatch):
    tools, victim, out = served_tools
    for ref in ("/etc", str(victim), "../..", str(tiny["task"]) + "/../../outside/victim"):
        with pytest.raises(WorkbenchError, match=REFUSED[:30]):
            tools.check_models(str(tiny["base"]), ref, str(tiny["lang"]))
    assert not tools.sessions
    one, two = opened(tools, tiny), opened(tools, tiny)
    for name in ("../x", "/tmp/x", "a/b", "..", "x" * 101):
        with pytest.raises(WorkbenchError):
            tools.build_and_save(one, folder=name)
    assert not out.exists() or not any(out.rglob("layerswap.yaml"))
    # saved_to: the save's name (no server path, #64), picked again by that name
    assert json.loads(tools.build_and_save(one, folder="mine"))["saved_to"] == "mine"
    [saved] = out.glob("*/mine")
    assert saved.parent.parent == out and saved.parent.name.startswith("session-")
    # another agent session can neither pick it nor write beside it; its owner can pick it
    for ref in (str(saved), "mine"):
        with pytest.raises(WorkbenchError, match=REFUSED[:30]):
            tools.check_models("", ref, ref, session=two)
    assert json.loads(tools.build_and_save(two, folder="mine"))["saved_to"] == "mine"
    [theirs] = set(out.glob("*/mine")) - {saved}
    for ref in (str(saved), "mine"):
        again = json.loads(tools.check_models(str(tiny["base"]), ref, str(tiny["lang"]),
                                              session=one))
        assert again["session"] == one and again["compatible"], again
    # the save quota of a visitor
    monkeypatch.setenv("LAYERSWAP_MAX_SAVES_GB_PER_VISITOR", "0.001")
    with pytest.raises(WorkbenchError, match="each visitor may keep"):
        tools.build_and_save(one, folder="second")
    assert not (saved.parent / "second").exists()
    # bounds and caps, before any work
    with pytest.raises(WorkbenchError, match="between 1 and 20"):
        tools.quick_evaluate(one, models=["task"], questions=LIMITS.eval_questions + 1)
    with pytest.raises(WorkbenchError, match="at most 2000 characters"):
        tools.layer_plan(one, config="partition: custom\n" + "#" * 2001)
    with pytest.raises(WorkbenchError, match="models: choose from"):
        tools.quick_evaluate(one, models=["/etc/passwd"])
    with pytest.raises(WorkbenchError, match="build the merged model first"):
        tools.quick_evaluate(opened(tools, tiny))
    # closing removes an anonymous session's saves, as a page that closes does
    tools.close_session(one)
    assert not saved.exists() and theirs.exists()


def test_agent_sessions_are_capped_and_closed_when_idle(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(agents, "LIMITS", replace(LIMITS, agent_sessions=2,
                                                  agent_idle_seconds=60))
    tools = agents.AgentTools(Access(True, tmp_path / "out", (tiny["base"].parent,)))
    first, second = opened(tools, tiny), opened(tools, tiny)
    with pytest.raises(WorkbenchError, match="2 agent sessions open"):
        opened(tools, tiny)
    saved = Path(json.loads(tools.build_and_save(first, folder="x"))["saved_to"])
    tools.sessions[first].used, tools.sessions[second].used = 0.0, 100.0
    tools.sessions[second].running.append(agents.Running("quick_evaluate"))
    assert tools.expire(now=50.0) == []
    assert tools.expire(now=1000.0) == [first]       # a session at work stays open
    assert not saved.exists()
    with pytest.raises(WorkbenchError, match="unknown or expired session"):
        tools.job_status(first)
    assert json.loads(tools.job_status(second))["running"][0]["tool"] == "quick_evaluate"
    assert opened(tools, tiny)                      # room again
    tools.sessions[second].running.clear()
    for sid in list(tools.sessions):
        tools.close_session(sid)


def test_agent_sessions_are_capped_per_client_and_share_its_quota(tiny, tmp_path, monkeypatch):
    """One client address (``agents.CLIENT``, set by the app per call) opens at most
    LAYERSWAP_MAX_AGENT_SESSIONS_PER_CLIENT sessions; another address still gets one; a
    client's sessions share one save quota."""
    monkeypatch.setattr(agents, "LIMITS", replace(LIMITS, agent_sessions_per_client=2))
    tools = agents.AgentTools(Access(True, tmp_path / "out", (tiny["base"].parent,)))
    token = agents.CLIENT.set("client-a")
    try:
        first, second = opened(tools, tiny), opened(tools, tiny)
        with pytest.raises(WorkbenchError, match="your address has 2 agent sessions open.*"
                                                 "LAYERSWAP_MAX_AGENT_SESSIONS_PER_CLIENT"):
            opened(tools, tiny)
        assert len(tools.sessions) == 2
        assert json.loads(tools.build_and_save(first, folder="x"))["saved_to"] == "x"   # a name
        (saved,) = [p for p in (tmp_path / "out").rglob("x") if p.is_dir()]
        monkeypatch.setenv("LAYERSWAP_MAX_SAVES_GB_PER_VISITOR",
                           str(1.5 * sum(f.stat().st_size for f in saved.iterdir()) / 1e9))
        with pytest.raises(WorkbenchError, match="in your 2 tabs and agent sessions together"):
            tools.build_and_save(second, folder="y")
    finally:
        agents.CLIENT.reset(token)
    token = agents.CLIENT.set("client-b")
    try:
        assert opened(tools, tiny)                 # another address: its own sessions
    finally:
        agents.CLIENT.reset(token)
    tools.close_session(first)
    token = agents.CLIENT.set("client-a")
    try:
        assert opened(tools, tiny)                 # room again for client a
    finally:
        agents.CLIENT.reset(token)
    for sid in list(tools.sessions):
        tools.close_session(sid)


@pytest.mark.timing
def test_layer_plan_answers_while_both_heavy_slots_are_held(tiny, tmp_path, monkeypatch):
    """Instant tools (layer_plan, job_status) are outside the page's heavy slots: with both
    held by delta analyses that do not end, an MCP client's layer_plan answers within seconds;
    the tools see the caller's address (X-Forwarded-For behind gradio's MCP loopback)."""
    import threading
    import time

    import app
    from gradio_client import Client
    from layerswap_core.workbench import saves

    release, entered = threading.Event(), []
    seen = []

    def held(session, progress=None):
        entered.append(session)
        release.wait(120)
        raise WorkbenchError("released")
    monkeypatch.setattr(agents, "analyze_deltas", held)
    real_room = agents.AgentTools._room

    def room(self, client):
        seen.append(client)
        return real_room(self, client)
    monkeypatch.setattr(agents.AgentTools, "_room", room)
    monkeypatch.setenv("LAYERSWAP_OUTPUT_DIR", str(tmp_path / "outputs"))
    demo = app.build_demo(refs(tiny), served=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                        quiet=True, mcp_server=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        api = Client(url, verbose=False, headers={"x-forwarded-for": "203.0.113.5"})
        sid = json.loads(api.predict(*refs(tiny).values(), "", api_name="/check_models"))
        sid = sid["session"]
        assert seen[-1] == saves.person(None, "203.0.113.5")

        async def check(call, tools):             # queued: through gradio's MCP loopback
            return await call("check_models", **refs(tiny))
        err, text = over_mcp(url + "gradio_api/mcp/", check, {"X-Forwarded-For": "198.51.100.8"})
        assert not err, text
        assert seen[-1] == saves.person(None, "198.51.100.8")
        jobs = [api.submit(sid, api_name="/delta_summary") for _ in range(2)]
        deadline = time.monotonic() + 120
        while len(entered) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(entered) == 2            # both heavy slots held

        async def script(call, tools):
            t0 = time.monotonic()
            err, text = await call("layer_plan", session=sid)
            return time.monotonic() - t0, err, text
        seconds, err, text = over_mcp(url + "gradio_api/mcp/", script)
        assert not err, text
        assert json.loads(text)["layers"] and seconds < 10, seconds
        print(f"layer_plan with both heavy slots held: {seconds:.2f} s")
    finally:
        release.set()
        for job in locals().get("jobs", []):
            try:
                job.result(timeout=60)
            except Exception:  # noqa: BLE001 - "released"
                pass
        demo.close()


# --------------------------------------------------------------------------- hostile inputs
def alias_bomb(levels: int = 9) -> str:
    """The YAML 'billion laughs': each level a list of nine aliases of the one before (9^9
    strings once expanded, from under 500 characters)."""
    lines = ["l0: &l0 [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_a_yaml_alias_bomb_is_refused_before_it_expands(tiny, tmp_path):
    from bounded import assert_refused, run_attack

    bomb = alias_bomb()
    assert 440 < len(bomb) < 520
    setup = f"""
        from pathlib import Path
        from layerswap_core.workbench import agents
        from layerswap_core.workbench.served import Access
        tools = agents.AgentTools(Access(True, Path({str(tmp_path / 'out')!r}),
                                         (Path({str(tiny['base'].parent)!r}),)))
        sid = json.loads(tools.check_models({str(tiny['base'])!r}, {str(tiny['task'])!r},
                                            {str(tiny['lang'])!r}))["session"]
        bomb = {bomb!r}
    """
    for tool in ("layer_plan", "build_and_save"):
        assert_refused(run_attack(setup, f"tools.{tool}(sid, config=bomb)"), "alias")
