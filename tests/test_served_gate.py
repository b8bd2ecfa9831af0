"""The agents' and the API's way to Hub models is the page's gate (issue 64): nothing downloads
before a compatible pre-flight (``workbench.preflight``: metadata only) and an explicit download
step (the page's "Download and use", its ``/download_models`` endpoint, an agent's
``check_models(download=true)``), against the fake Hub (``fake_hub.FakeHub``)."""
from __future__ import annotations

import json
import time

import pytest

from fake_hub import FakeHub, pointed_at
from layerswap_core.checkpoints import hub
from layerswap_core.workbench import agents
from layerswap_core.workbench.preflight import download_gate
from layerswap_core.workbench.served import Access
from test_preflight import _other_vocab


@pytest.fixture(scope="module")
def fake_hub(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("gate-repos")
    fh = FakeHub({"fake/task": tiny["task"], "fake/lang": tiny["lang"],
                  "fake/other-vocab": _other_vocab(tiny["task"], root / "other-vocab"),
                  "fake/slow": tiny["lang"]}, slow={"fake/slow"})
    with pointed_at(fh):
        yield fh


@pytest.fixture
def served(tiny, tmp_path):
    """Served agent tools (the tiny family's folder the model root) over a fresh served Hub
    cache; every session closed and every download ended afterwards."""
    cache = hub.HubCache(tmp_path / "served-hub", hub.HubLimits(None, None, 5.0, 2))
    before = hub.set_served_cache(cache)
    access = Access(True, tmp_path / "out", (tiny["base"].parent,))
    tools = agents.AgentTools(access)
    try:
        yield tools, cache, access
    finally:
        for sid in list(tools.sessions):
            tools.close_session(sid)
        for job in list(cache.jobs.values()):
            if job.thread is not None:
                job.thread.join(30)
        hub.set_served_cache(before)


def test_an_agent_downloads_nothing_before_a_compatible_preflight_and_download(
        served, fake_hub, tiny):
    tools, cache, _ = served
    base = str(tiny["base"])

    def check(task, lang, **kw):
        return json.loads(tools.check_models(base, task, lang, **kw))

    fake_hub.reset()
    # an incompatible trio: refused from the metadata, download=true or not
    for download in (False, True):
        out = check("fake/task", "fake/other-vocab", download=download)
        assert out["session"] is None and not out["compatible"], out
        assert out["problems"][0].startswith("different vocabulary sizes"), out
    assert not cache.jobs and not fake_hub.weight_bytes_fetched() and not tools.sessions
    # a compatible one without download=true: its pre-flight, what it would fetch, no session
    out = check("fake/task", "fake/lang")
    assert out["session"] is None and out["compatible"] and not out["models"], out
    listed = sum(len(b) for r in ("fake/task", "fake/lang") for b in fake_hub.repos[r].values())
    assert out["download"] == {"models": ["fake/task", "fake/lang"],
                               "gb": round(listed / 10 ** 9, 3)}, out
    assert any(line.startswith("download: ") for line in out["preflight"]), out
    assert not cache.jobs and not fake_hub.weight_bytes_fetched() and not tools.sessions
    # download=true: fetched (these small ones within the call's wait), then checked and opened
    out = check("fake/task", "fake/lang", download=True)
    for _ in range(60):
        if "downloading" not in out:
            break
        time.sleep(0.5)
        out = check("fake/task", "fake/lang", session=out["session"], download=True)
    assert out["session"] in tools.sessions and out["compatible"] and out["layers"] == 8, out
    assert fake_hub.weight_bytes_fetched()
    assert cache.cached("fake/task") is not None and cache.cached("fake/lang") is not None


def test_an_agents_download_is_a_session_it_can_cancel(served, fake_hub, tiny):
    """A download still running when check_models answers: a session to ask again with, and
    cancel_job stops the download (nothing kept)."""
    tools, cache, _ = served
    out = json.loads(tools.check_models(str(tiny["base"]), "fake/task", "fake/slow",
                                        download=True))
    assert out["compatible"] and out["downloading"] and out["session"] in tools.sessions, out
    assert "downloading" in json.loads(tools.check_models(
        str(tiny["base"]), "fake/task", "fake/slow", session=out["session"],
        download=True)), "asked again while it runs: still downloading"
    with pytest.raises(agents.WorkbenchError, match="still downloading"):
        tools.layer_plan(out["session"])
    assert json.loads(tools.cancel_job(out["session"]))["cancelled"]
    cache.jobs["fake/slow"].thread.join(30)
    assert cache.cached("fake/slow") is None


def test_the_pages_download_step_meets_the_same_gate(served, fake_hub, tiny):
    """``/download_models`` (the page's "Download and use", callable over the API without the
    pick before it) runs the pre-flight first: an incompatible trio is refused there."""
    _, cache, access = served
    base = str(tiny["base"])
    fake_hub.reset()
    refused = download_gate(base, "fake/task", "fake/other-vocab", access)
    assert refused is not None and refused.refusal.startswith("different vocabulary sizes")
    assert download_gate(base, "fake/task", "fake/lang", access) is None
    assert download_gate(base, str(tiny["task"]), str(tiny["lang"]), access) is None
    assert not cache.jobs and not fake_hub.weight_bytes_fetched()
