"""Served mode's shared resources, against a small fake Hugging Face Hub on loopback: Hub
downloads bounded (size from the listing before any byte, timeouts, cancel, a capped cache with
least-recently-used eviction), save quotas and expiry, saves that belong to their visitor, push
with the visitor's own token, temporary files removed.

The fake Hub is the suite's one (``fake_hub.FakeHub``, which answers as the Hub does for
``huggingface_hub``, pushes included). Its repos here: ``fake/tiny`` and ``fake/tiny2`` (the tiny
task expert's files), ``fake/slow`` (the same, sent slowly), ``fake/hang`` (every request held
open), ``fake/huge`` (listed at 40 GiB) and, with the tiny files listed right but their weights
sent wrong, ``fake/corrupt`` (one byte changed), ``fake/short`` (the last kilobyte missing),
``fake/liar`` (listed a byte larger) and ``fake/flaky`` (connections broken off on demand).
These tests turn the Hub on (the suite runs with HF_HUB_OFFLINE=1) for themselves only.
"""
from __future__ import annotations

from dataclasses import replace
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.checkpoints import hub
from layerswap_core.workbench import saves
from layerswap_core.workbench import build as wb_build
from layerswap_core.workbench import configure as wb_configure
from layerswap_core.workbench import models as wb_models
from layerswap_core.workbench.served import REFUSED, Access, WorkbenchError, vet_reference
from fake_hub import FakeHub, pointed_at
from served_client import download, launch, pick, visitor

REPOS = ("fake/tiny", "fake/tiny2", "fake/slow", "fake/huge", "fake/corrupt", "fake/short",
         "fake/flaky", "fake/liar")
VISITOR_TOKEN, SERVER_TOKEN = "hf_visitor_alice_token", "hf_server_secret_token"
NO_PARTITION = "none (bottom/top sliders)"
MORE = ("blend (average, as in Algorithm 1)", False, 1.0, 1.0, 0.2, 1.0)
TIMEOUT = 2.0


def config(b=2, u=1):
    return ("layer swap", b, u, 0, 0, 1.0, 1.0, False, NO_PARTITION, "", *MORE)


@pytest.fixture(scope="module")
def fake_hub(tiny):
    """The fake Hub (``fake_hub.FakeHub``: every repo the tiny task expert's files, each doing
    to them what its name says), the Hub switched on (for this module only) and pointed at it,
    and a served download cache with a short timeout. Restored afterwards."""
    fh = FakeHub({repo: tiny["task"] for repo in REPOS}, slow={"fake/slow"},
                 corrupt={"fake/corrupt"}, short={"fake/short"}, liar={"fake/liar"},
                 flaky={"fake/flaky"}, huge={"fake/huge"}, hang={"fake/hang"},
                 push_token=VISITOR_TOKEN)
    cache_root = Path(tiny["task"]).parent.parent / "served-hub"
    with pointed_at(fh), pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_TOKEN", SERVER_TOKEN)     # the server's token: never sent for a visitor
        before = hub.set_served_cache(hub.HubCache(cache_root, hub.HubLimits(
            max_download=5 * hub.GB, cache_bytes=None, timeout=TIMEOUT, jobs=2)))
        try:
            yield fh
        finally:
            hub.set_served_cache(before)
    assert all(auth != f"Bearer {SERVER_TOKEN}" for _, _, auth in fh.requests)


@pytest.fixture(scope="module")
def served(tiny, fake_hub, tmp_path_factory):
    """The app in served mode on loopback, its model root the tiny family's folder."""
    import app

    root = tmp_path_factory.mktemp("served-resources")
    env = {"LAYERSWAP_SERVED": "1", "LAYERSWAP_OUTPUT_DIR": str(root / "outputs"),
           "LAYERSWAP_MODEL_DIRS": str(tiny["base"].parent)}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        demo = app.build_demo()
        access = Access.from_env(True)
    yield SimpleNamespace(url=launch(demo), demo=demo, out=root / "outputs",
                          access=access)
    demo.close()


def in_words(msg: str, fake_hub) -> None:
    """An error for the page: no internal URL, no exception class."""
    assert "http" not in msg and "127.0.0.1" not in msg and fake_hub.url not in msg
    assert not any(w in msg for w in ("Error:", "Exception", "Timeout(", "httpx", "Traceback"))


# --------------------------------------------------------------------------- Hub downloads
@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_a_hanging_hub_errors_within_the_timeout_while_another_visitor_picks(served, tiny,
                                                                            fake_hub):
    a, b = visitor(served), visitor(served)
    t0 = time.monotonic()
    job = a.submit(str(tiny["base"]), "fake/hang", str(tiny["lang"]), api_name="/pick_models")
    time.sleep(0.3)
    out = pick(b, str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    assert out["models_md"].startswith("✔")            # the other visitor is not held up
    assert time.monotonic() - t0 < TIMEOUT + 8
    first = job.result()[1]               # models_md: pending (or already the timeout)
    assert first.startswith("⚠") and "fake/hang" in first
    assert "asking the Hub" in first or "did not answer" in first
    deadline = time.monotonic() + TIMEOUT + 10
    while True:
        msg = pick(a, str(tiny["base"]), "fake/hang", str(tiny["lang"]))["models_md"]
        if "did not answer" in msg or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert f"the Hub did not answer within {TIMEOUT:.0f} s" in msg
    assert time.monotonic() - t0 < TIMEOUT + 12
    in_words(msg, fake_hub)


def test_the_huge_repo_is_refused_before_any_byte(served, tiny, fake_hub):
    msg = pick(visitor(served), str(tiny["base"]), "fake/huge", str(tiny["lang"]))["models_md"]
    assert msg.startswith("⚠") and "fake/huge: 42.95 GB to download" in msg
    assert "at most 5.00 GB per model (LAYERSWAP_MAX_DOWNLOAD_GB)" in msg
    assert fake_hub.resolves("fake/huge") == []        # not one file asked for
    in_words(msg, fake_hub)


def test_locally_the_download_limit_applies_only_when_set(fake_hub, monkeypatch):
    from layerswap_core.checkpoints.references import ModelLoadError, resolve

    monkeypatch.setenv("LAYERSWAP_MAX_DOWNLOAD_GB", "5")
    monkeypatch.setenv("HF_TOKEN", "hf_local_user_token")     # locally: the user's own token
    with pytest.raises(ModelLoadError, match="fake/huge is 42.95 GB to download; the limit is 5 GB"):
        resolve("fake/huge")
    assert fake_hub.resolves("fake/huge") == []
    assert fake_hub.requests[-1] == ("GET", "/api/models/fake/huge",
                                     "Bearer hf_local_user_token")
    assert hub.HubLimits.from_env(served=False).max_download == 5 * hub.GB
    monkeypatch.delenv("LAYERSWAP_MAX_DOWNLOAD_GB")
    local = hub.HubLimits.from_env(served=False)
    assert local.max_download is None and local.cache_bytes is None


def test_a_model_downloads_in_the_background_and_is_then_picked(served, tiny, fake_hub):
    """A Hub model not here: the pick shows its pre-flight and downloads nothing; "Download
    and use" downloads it (through huggingface_hub) and uses it; a second visitor's pick
    takes it from the served cache."""
    c = visitor(served)
    out = pick(c, str(tiny["base"]), "fake/tiny", str(tiny["lang"]))
    assert out["models_md"].startswith("✔ **Compatible** (from their metadata")
    assert "**Download and use** fetches fake/tiny" in out["models_md"]
    assert hub.served_cache().cached("fake/tiny") is None
    out = download(c, str(tiny["base"]), "fake/tiny", str(tiny["lang"]))
    if not out["models_md"].startswith("✔"):           # still downloading: pick again
        assert "downloading in the background" in out["models_md"]
        hub.served_cache().wait("fake/tiny", 30)
        out = pick(c, str(tiny["base"]), "fake/tiny", str(tiny["lang"]))
    assert out["models_md"].startswith("✔"), out["models_md"]
    assert [r[1] for r in out["models_table"]["data"]][1] == "fake/tiny"
    folder = hub.served_cache().cached("fake/tiny")
    assert {p.name for p in folder.iterdir()} >= {"config.json", "model.safetensors"}
    n = len(fake_hub.resolves("fake/tiny"))
    assert pick(visitor(served), "", "fake/tiny", "fake/tiny")["models_md"].startswith("✔")
    assert len(fake_hub.resolves("fake/tiny")) == n     # the second visitor: from the cache
    msg = pick(c, "", "fake/nothere", "fake/tiny")["models_md"]
    assert "no public model of that name on the Hub" in msg
    in_words(msg, fake_hub)


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_a_download_is_cancelled_and_leaves_nothing(tmp_path, fake_hub):
    cache = hub.HubCache(tmp_path / "hub", hub.HubLimits(None, None, TIMEOUT, 2), fake_hub.url)
    with pytest.raises(hub.Pending, match="fake/slow"):
        cache.fetch("fake/slow", "v1", wait=0.5)
    assert cache.status("v1")[0].running
    t0 = time.monotonic()
    assert cache.cancel("v1") == ["fake/slow"]
    job = cache.wait("fake/slow", 10)
    assert job.state == "cancelled" and not job.thread.is_alive()
    assert time.monotonic() - t0 < 5                   # within a chunk, not at the file's end
    assert 0 < job.done < job.total
    assert cache.cached("fake/slow") is None
    assert [p.name for p in (tmp_path / "hub").iterdir()] == []   # no partial folder left


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_a_download_past_its_deadline_stops_and_leaves_nothing(tmp_path, fake_hub,
                                                                monkeypatch):
    """A Hub that answers every read in time but sends too slowly on the whole (here: any Hub,
    the deadline half a second) is stopped at its next chunk, in words."""
    monkeypatch.setattr(hub, "DOWNLOAD_SLACK_SECONDS", 0.5)
    monkeypatch.setattr(hub, "DOWNLOAD_MIN_RATE", 10 ** 12)
    cache = hub.HubCache(tmp_path / "hub", hub.HubLimits(None, None, TIMEOUT, 2), fake_hub.url)
    t0 = time.monotonic()
    with pytest.raises(hub.ModelLoadError,
                       match=r"fake/slow: the download ran past \d+ s \(the Hub sent under") as e:
        cache.fetch("fake/slow", "v1", wait=10)
    assert time.monotonic() - t0 < 5 and "\n" not in str(e.value)
    assert cache.cached("fake/slow") is None
    assert [p.name for p in (tmp_path / "hub").iterdir()] == []   # no partial folder left


def test_a_file_of_another_size_than_listed_is_refused_and_leaves_nothing(tmp_path, fake_hub):
    """The download goes through huggingface_hub, which checks each file against the Hub's own
    metadata; the served cache also checks it against the listing it sized the download by."""
    cache = hub.HubCache(tmp_path / "hub", hub.HubLimits(None, None, TIMEOUT, 2), fake_hub.url)
    with pytest.raises(hub.Pending):
        cache.fetch("fake/liar", "v1", wait=0)
    job = cache.wait("fake/liar", 30)
    assert job.state == "failed" and "another size than it listed" in job.error
    assert cache.cached("fake/liar") is None
    assert [p.name for p in (tmp_path / "hub").iterdir()] == []   # no partial folder left
    assert not any(a for m, p, a in fake_hub.requests if "/fake/liar/" in p)   # no token sent


def test_a_corrupted_or_truncated_file_is_refused_and_nothing_is_kept(tmp_path, fake_hub):
    for repo, words in (("fake/corrupt", "model.safetensors does not match the checksum"),
                        ("fake/short", "the Hub sent less than the size it listed")):
        root = tmp_path / repo.replace("/", "-")
        cache = hub.HubCache(root, hub.HubLimits(None, None, TIMEOUT, 2), fake_hub.url)
        with pytest.raises(hub.ModelLoadError, match=f"{repo}: {words}") as e:
            cache.fetch(repo, "v1", wait=30)
        in_words(str(e.value), fake_hub)
        assert cache.cached(repo) is None
        assert [p.name for p in root.iterdir()] == []   # no partial folder, no partial file


def test_an_interrupted_download_resumes_and_a_failed_one_restarts_cleanly(tmp_path, fake_hub):
    whole = fake_hub.repos["fake/tiny"]["model.safetensors"]
    limits = hub.HubLimits(None, None, TIMEOUT, 2)
    cache = hub.HubCache(tmp_path / "one", limits, fake_hub.url)
    fake_hub.reset()
    fake_hub.cuts[:] = ["half"]                  # the first GET breaks off after half the file
    path = cache.fetch("fake/flaky", "v1", wait=30)
    assert fake_hub.cuts == []
    [(repo, name, rng)] = [r for r in fake_hub.ranges if r[2]]   # one more GET, from what
    # had arrived
    assert (repo, name) == ("fake/flaky", "model.safetensors") and rng.endswith("-")
    assert 0 < int(rng.removeprefix("bytes=")[:-1]) <= len(whole) // 2
    assert (path / "model.safetensors").read_bytes() == whole          # resumed, not restarted
    assert {p.name for p in path.iterdir()} == set(fake_hub.repos["fake/tiny"])     # no notes, no .incomplete
    # a connection that breaks off before any byte, again and again: the download fails (after
    # huggingface_hub's retries) and leaves nothing; asked again, it starts afresh
    cache = hub.HubCache(tmp_path / "two", limits, fake_hub.url)
    fake_hub.cuts[:] = ["nothing"] * 20
    with pytest.raises(hub.ModelLoadError, match="fake/flaky: the connection to the Hub broke off"):
        cache.fetch("fake/flaky", "v1", wait=30)
    assert [p.name for p in (tmp_path / "two").iterdir()] == []
    fake_hub.cuts.clear()
    path = cache.fetch("fake/flaky", "v1", wait=30)
    assert (path / "model.safetensors").read_bytes() == whole


def test_the_cache_evicts_the_least_recently_used_model_nobody_holds(tmp_path, fake_hub):
    import fnmatch
    size = sum(len(b) for n, b in fake_hub.repos["fake/tiny"].items()
               if any(fnmatch.fnmatch(n, p) for p in hub.PATTERNS))
    cache = hub.HubCache(tmp_path / "hub", hub.HubLimits(None, int(size * 1.5), TIMEOUT, 2),
                         fake_hub.url)
    first = cache.fetch("fake/tiny", "v1", wait=30)
    assert first.is_dir()
    with pytest.raises(hub.ModelLoadError, match="full of models in use"):
        cache.fetch("fake/tiny2", "v2", wait=30)        # v1's session still uses fake/tiny
    cache.release("v1")                                  # v1's session ended
    second = cache.fetch("fake/tiny2", "v2", wait=30)
    assert second.is_dir() and not first.exists()        # fake/tiny went to make room


# --------------------------------------------------------------------------- saves
def served_session(tiny, out_root: Path, namespace: str):
    access = Access(served=True, output_root=out_root,
                    model_roots=(tiny["base"].parent, out_root)).for_visitor(namespace)
    session, report = wb_models.open_session(str(tiny["base"]), str(tiny["task"]),
                                             str(tiny["lang"]), access=access)
    assert session is not None, report.problems
    return session, access


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_quotas_refuse_before_anything_is_written(tiny, tmp_path, monkeypatch):
    out = tmp_path / "outputs"
    s, a = served_session(tiny, out, "session-a")
    cfg = wb_configure.default_config(s)
    n = s.checkpoint_bytes                       # what a save reserves (test below)
    monkeypatch.setenv("LAYERSWAP_MAX_SAVES_GB_PER_VISITOR", str(1.5 * n / 1e9))
    monkeypatch.setenv("LAYERSWAP_MAX_SAVES_GB", str(2.5 * n / 1e9))
    assert wb_build.save(s, cfg, "one") == out / "session-a" / "one"
    with pytest.raises(WorkbenchError, match="LAYERSWAP_MAX_SAVES_GB_PER_VISITOR"):
        wb_build.save(s, cfg, "two")
    assert not (out / "session-a" / "two").exists()
    assert wb_build.save(s, cfg, "one", overwrite=True).exists()   # replacing frees its own size
    b = a.for_visitor("session-b")
    wb_build.save(s, cfg, "one", access=b)
    time.sleep(0.05)
    # a third anonymous visitor at the total is refused in one line: nobody's unexpired save
    # is evicted for an anonymous one
    with pytest.raises(WorkbenchError, match=r"other visitors' saves are kept until they "
                                             r"expire: overwrite one of yours"):
        wb_build.save(s, cfg, "one", access=a.for_visitor("session-c"))
    assert (out / "session-a" / "one").exists() and (out / "session-b" / "one").exists()
    assert not (out / "session-c" / "one").exists()
    # a signed-in user at the total: the oldest anonymous save (a's) goes first ...
    wb_build.save(s, cfg, "one", access=a.for_visitor("hf-carol"))
    assert not (out / "session-a" / "one").exists() and (out / "session-b" / "one").exists()
    time.sleep(0.05)
    wb_build.save(s, cfg, "one", access=a.for_visitor("hf-dave"))
    assert not (out / "session-b" / "one").exists()
    # ... never another signed-in user's
    with pytest.raises(WorkbenchError, match=r"LAYERSWAP_MAX_SAVES_GB\): overwrite one of"):
        wb_build.save(s, cfg, "one", access=a.for_visitor("hf-erin"))
    assert (out / "hf-carol" / "one").exists() and (out / "hf-dave" / "one").exists()
    monkeypatch.setenv("LAYERSWAP_MAX_SAVES_GB", str(0.5 * n / 1e9))
    with pytest.raises(WorkbenchError, match=r"more than the .* MB this server keeps for all saves \(LAYERSWAP_MAX_SAVES_GB\)"):
        wb_build.save(s, cfg, "big", access=a.for_visitor("session-d"))
    assert not (out / "session-d" / "big").exists()
    # saves expire after LAYERSWAP_SAVES_HOURS
    monkeypatch.delenv("LAYERSWAP_MAX_SAVES_GB")
    monkeypatch.setenv("LAYERSWAP_SAVES_HOURS", "1")
    old = time.time() - 2 * 3600
    os.utime(out / "hf-carol" / "one", (old, old))
    wb_build.save(s, cfg, "fresh", access=a.for_visitor("session-e"))
    assert not (out / "hf-carol" / "one").exists() and (out / "hf-dave" / "one").exists()


def test_one_clients_tabs_and_agent_sessions_share_one_quota_and_one_heavy_job(
        tiny, tmp_path, monkeypatch):
    """Two sessions from one client address (two tabs, or a tab and an agent session): one
    save quota between them and one heavy job; a signed-in user keeps their user name; another
    address has its own. How a page request names its client: X-Forwarded-For's first hop
    behind a proxy (a private or loopback peer: the Space's proxy), the peer itself otherwise."""
    from app_tabs.common import PageBase
    from layerswap_core.engines.dispatch import Busy, Dispatcher

    def request(session, host, forwarded=None):
        headers = {"x-forwarded-for": forwarded} if forwarded else {}
        return SimpleNamespace(session_hash=session, client=SimpleNamespace(host=host),
                               headers=headers)

    out = tmp_path / "outputs"
    base = Access(served=True, output_root=out, model_roots=(tiny["base"].parent, out))
    page = SimpleNamespace(access=base)
    via_proxy = "203.0.113.7, 10.16.0.3"
    tab1 = PageBase.visitor(page, request("tab-1", "10.16.0.9", via_proxy))
    tab2 = PageBase.visitor(page, request("tab-2", "127.0.0.1", "203.0.113.7"))
    other = PageBase.visitor(page, request("tab-3", "10.16.0.9", "198.51.100.4"))
    direct = PageBase.visitor(page, request("tab-4", "203.0.113.9", "203.0.113.7"))
    signed = PageBase.visitor(page, request("tab-5", "10.16.0.9", via_proxy),
                              SimpleNamespace(username="alice"))
    assert tab1.namespace != tab2.namespace and tab1.person == tab2.person
    assert tab1.person.startswith("client-") and "203.0.113.7" not in tab1.person
    assert other.person != tab1.person
    assert direct.person not in (tab1.person, other.person)   # a direct client names no one
    assert signed.person == signed.namespace == "hf-alice"
    local = PageBase.visitor(SimpleNamespace(access=replace(base, served=False)),
                             request("tab-6", "127.0.0.1"))
    assert local.person == local.namespace          # locally each tab is its own, as before

    sessions = []
    for access in (tab1, tab2):
        session, report = wb_models.open_session(str(tiny["base"]), str(tiny["task"]),
                                                 str(tiny["lang"]), access=access)
        assert session is not None, report.problems
        sessions.append(session)
    s1, s2 = sessions
    cfg = wb_configure.default_config(s1)
    n = s1.checkpoint_bytes
    monkeypatch.setenv("LAYERSWAP_MAX_SAVES_GB_PER_VISITOR", str(1.5 * n / 1e9))
    assert wb_build.save(s1, cfg, "one").parent == out / tab1.namespace
    with pytest.raises(WorkbenchError, match=r"in your 2 tabs and agent sessions together\) .*"
                                             r"LAYERSWAP_MAX_SAVES_GB_PER_VISITOR"):
        wb_build.save(s2, cfg, "one")
    assert not (out / tab2.namespace / "one").exists()
    assert wb_build.save(s1, cfg, "one", access=other).parent == out / other.namespace
    # one heavy job for both tabs; another client's job runs beside it
    d = Dispatcher(max_waiting=4)
    with d.claim(s1.job("save")):
        with pytest.raises(Busy, match="another of yours"):
            with d.claim(s2.job("save")):
                pass
        third, _ = wb_models.open_session(str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]),
                                          access=other)
        with d.claim(third.job("save")):
            pass
    with d.claim(s2.job("save")):
        pass


def test_a_save_reserves_all_it_writes_and_little_more(tiny, tmp_path, monkeypatch):
    """The reservation covers every file of the saved folder (tensors, headers and their
    padding, tokenizer, config, card), not only the task model's weight files, in the layouts
    a save can take: one shard, and many shards (a small shard cap)."""
    from layerswap_core.checkpoints.compatibility import open_models
    from layerswap_core.merge.executor import CARD_ROOM, merge_to_folder, most_output_bytes
    from layerswap_core.checkpoints.cache import folder_bytes

    s, _ = served_session(tiny, tmp_path / "outputs", "session-a")
    with CheckpointReader(s.paths["task"]) as reader:
        weights = reader.nbytes()
    saved = wb_build.save(s, wb_configure.default_config(s), "one")
    written = folder_bytes(saved)
    side = sum(f.stat().st_size for f in saved.iterdir() if f.suffix != ".safetensors")
    assert side > 0.05 * written                  # the tiny models' tokenizer: not negligible
    assert weights < written <= s.checkpoint_bytes
    shards = len(list(saved.glob("*.safetensors")))
    assert s.checkpoint_bytes - written <= CARD_ROOM + 2 * (shards + 1) * ((2 << 20) + 264) \
        + 256 * len(s.param_names)
    inputs = open_models({r: s.paths[r] for r in ("task", "lang", "base")})
    cap = weights // 40
    small = merge_to_folder(wb_configure.default_config(s), s.paths["task"], s.paths["lang"],
                            s.paths["base"], tmp_path / "sharded", shard_size=cap)
    assert len(list(small.glob("*.safetensors"))) >= 4
    assert folder_bytes(small) <= most_output_bytes(inputs, shard_size=cap)
    # another output dtype than the task model's (float32) changes every tensor's bytes; the
    # save reserves for the dtype it writes, as closely as for the model's own
    half = wb_build.save(s, replace(wb_configure.default_config(s), dtype="bfloat16"), "half")
    with CheckpointReader(half) as reader:
        assert {reader.dtype(n) for n in reader.names()} == {"BF16"}
    assert folder_bytes(half) <= s.save_bytes["bfloat16"] <= s.checkpoint_bytes - 0.45 * weights
    assert s.save_bytes["bfloat16"] - folder_bytes(half) <= s.checkpoint_bytes - written + 4096


def test_locally_no_quota_applies(tiny, tmp_path, monkeypatch):
    s, _ = served_session(tiny, tmp_path / "o", "session-a")
    monkeypatch.setenv("LAYERSWAP_MAX_SAVES_GB_PER_VISITOR", "0.000001")
    local = Access()
    assert wb_build.save(s, wb_configure.default_config(s), str(tmp_path / "mine"),
                         access=local).is_dir()


def test_a_visitor_cannot_overwrite_list_or_pick_anothers_save(served, tiny):
    a, b = visitor(served), visitor(served)
    for c in (a, b):
        assert pick(c, str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))[
            "models_md"].startswith("✔")
        assert c.predict(*config(), api_name="/build")[0].startswith("✔")
    saved = a.predict("secret", False, api_name="/save")
    assert saved.startswith("✔ Saved as `secret`: "), saved   # by its name, not a path
    ns_a = saves.visitor_namespace(None, a.session_hash)
    ns_b = saves.visitor_namespace(None, b.session_hash)
    path_a, path_b = (served.access.for_visitor(ns).saves_root / "secret" for ns in (ns_a, ns_b))
    recipe = (path_a / "layerswap.yaml").read_text()
    saved_b = b.predict("secret", True, api_name="/save")   # the same name
    assert saved_b.startswith("✔") and (path_b / "layerswap.yaml").is_file()
    assert (path_a / "layerswap.yaml").read_text() == recipe            # A's save untouched
    assert saves.own_saves(served.access.for_visitor(ns_b)) == [str(path_b)]   # listed: own
    assert str(path_a) not in json.dumps(saves.own_saves(served.access.for_visitor(ns_b)))
    out = pick(b, "", str(path_a), str(path_a))
    assert out["models_md"].startswith(f"⚠ task expert: {REFUSED}; language expert: {REFUSED}")
    with pytest.raises(WorkbenchError, match="not available"):
        vet_reference(str(path_a), served.access.for_visitor(ns_b))
    assert pick(a, "", str(path_a), str(path_a))["models_md"].startswith("✔")   # its owner can


def test_a_signed_in_visitor_keeps_one_folder():
    assert saves.visitor_namespace("alice", "s1") == saves.visitor_namespace("alice", "s2") \
        == "hf-alice"
    assert saves.visitor_namespace(None, "s1") != saves.visitor_namespace(None, "s2")
    assert "s1" not in saves.visitor_namespace(None, "s1")
    for bad in ("../x", "a/b", ".x", "a b"):
        with pytest.raises(WorkbenchError):
            saves.visitor_namespace(bad, "s1")


# --------------------------------------------------------------------------- push
def test_push_uses_the_visitors_token_and_needs_sign_in(tiny, tmp_path, fake_hub):
    s, _ = served_session(tiny, tmp_path / "o", "hf-alice")
    cfg = wb_configure.default_config(s)
    with pytest.raises(WorkbenchError, match="sign in with Hugging Face"):
        wb_build.push_to_hub(s, cfg, "alice/merged")
    with pytest.raises(WorkbenchError, match="only to your own namespace: alice/merged"):
        wb_build.push_to_hub(s, cfg, "bob/merged", visitor_token=VISITOR_TOKEN, visitor="alice")
    before = len(fake_hub.requests)
    url = wb_build.push_to_hub(s, cfg, "merged", visitor_token=VISITOR_TOKEN, visitor="alice")
    assert url.endswith("alice/merged")
    pushed = fake_hub.pushed["alice/merged"]
    assert "layerswap.yaml" in pushed and any(p.endswith(".safetensors") for p in pushed)
    sent = [auth for m, _, auth in fake_hub.requests[before:] if m == "POST"]
    assert sent and set(sent) == {f"Bearer {VISITOR_TOKEN}"}       # never the server's token


# --------------------------------------------------------------------------- temporary files
def test_temp_folders_go_after_the_download_and_at_the_end_of_the_visit(served, tiny):
    root = saves.temp_root()
    before = set(root.glob("layerswap-*"))
    c = visitor(served)
    assert pick(c, str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))[
        "models_md"].startswith("✔")
    assert c.predict(*config(), api_name="/build")[0].startswith("✔")   # Zip: the built merge
    for _ in range(3):
        status, zipped = c.predict(api_name="/download")
        assert status.startswith("✔") and Path(zipped).name == "layerswap-merge.zip"
    assert set(root.glob("layerswap-*")) - before == set()    # ours: gone once handed over
    ns = saves.visitor_namespace(None, c.session_hash)
    copies = [p for p in saves._TEMP.get(ns, ()) if p.name == "layerswap-merge.zip"]
    assert copies and all(p.exists() for p in copies)        # the web server's copy, for now
    saved = c.predict("mine", False, api_name="/save")
    assert saved.startswith("✔")
    mine = served.access.for_visitor(ns).saves_root / "mine"
    assert mine.is_dir()
    saves.end_visit(ns, served.access.for_visitor(ns))       # the page closed
    assert not any(p.exists() for p in copies)
    assert not mine.exists()                                 # anonymous: nobody can reach it
