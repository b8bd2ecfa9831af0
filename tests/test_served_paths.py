"""No server paths reach a visitor (issue #64, Low): over a served session against the fake Hub
(``fake_hub.FakeHub``), every string the visitor is handed (the page's lines, the Zip, the
saved folder's recipe and card, the agent tools' JSON) names models as the visitor named them
(``owner/name@commit``, a folder by its name under a model root), never the served cache, the
output root or the working directory. Also: a pick answers the same whether or not a folder
of that name exists in the working directory; the served Hub reads do not follow a redirect
to another host; downloads that match their checksums but cannot be read are not kept."""
from __future__ import annotations

import json
import os
import re
import struct
import zipfile
from pathlib import Path

import pytest

from fake_hub import SHA, FakeHub, pointed_at
from layerswap_core.checkpoints import hub
from layerswap_core.workbench import agents
from layerswap_core.workbench import session as wb
from layerswap_core.workbench import build as wb_build
from layerswap_core.workbench import configure as wb_configure
from layerswap_core.workbench import models as wb_models
from layerswap_core.workbench.preflight import (awaiting_download, download_line,
                                                preflight_gate, preflight_markdown,
                                                preflight_models)
from layerswap_core.workbench.served import Access, WorkbenchError, readable_error

NO_PARTITION = "none (bottom/top sliders)"


def _bad_header(task: Path) -> dict[str, bytes]:
    """The tiny task expert with a weight file whose header is not JSON (its checksum listed
    right: the Hub lists what it serves)."""
    files = {p.name: p.read_bytes() for p in task.iterdir() if p.is_file()}
    files["model.safetensors"] = struct.pack("<Q", 16) + b"{not json at all" + b"\0" * 64
    return files


def _index_outside(task: Path) -> dict[str, bytes]:
    """The tiny task expert whose index names a shard outside its folder."""
    files = {p.name: p.read_bytes() for p in task.iterdir() if p.is_file()}
    from safetensors import safe_open
    with safe_open(str(task / "model.safetensors"), "np") as f:
        names = list(f.keys())
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {}, "weight_map": {n: "../../../etc/passwd" for n in names}}).encode()
    return files


@pytest.fixture(scope="module")
def fake_hub(tiny):
    fh = FakeHub({"fake/task": tiny["task"], "fake/lang": tiny["lang"],
                      "fake/elsewhere": tiny["task"],
                      "fake/badheader": _bad_header(tiny["task"]),
                      "fake/outside": _index_outside(tiny["task"])})
    with pointed_at(fh):
        yield fh


@pytest.fixture
def served(tiny, fake_hub, tmp_path, monkeypatch):
    """A served access from the environment (its output root, the model root holding the tiny
    family), a fresh served Hub cache, the working directory a folder of its own."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("LAYERSWAP_OUTPUT_DIR", str(tmp_path / "outputs"))
    monkeypatch.setenv("LAYERSWAP_MODEL_DIRS", str(tiny["base"].parent))
    cache = hub.HubCache(tmp_path / "served-hub", hub.HubLimits(None, None, 5.0, 2))
    before = hub.set_served_cache(cache)
    try:
        yield Access.from_env(True).for_visitor("visitor-a"), cache, tmp_path
    finally:
        for job in list(cache.jobs.values()):
            if job.thread is not None:
                job.thread.join(30)
        hub.set_served_cache(before)


def _no_server_path(texts: list[str], *folders) -> None:
    forms = {f for folder in folders for f in (str(folder), os.path.realpath(folder))}
    for text in texts:
        for form in forms:
            assert form not in text, f"{form} in: {text[:2000]}"


def test_no_server_path_reaches_a_visitor(served, tiny, fake_hub):
    access, cache, tmp = served
    out_root = tmp / "outputs"
    said: list[str] = []
    texts: list[str] = [access.describe()]

    def progress(fraction, message):
        said.append(str(message))

    base, task, lang = str(tiny["base"]), "fake/task", "fake/lang"
    pf, missing = preflight_gate(base, task, lang, access)
    texts += [preflight_markdown(pf, access), download_line(pf, missing), *missing]
    # "Download and use": the pick downloads them into the served cache and checks them
    session, report = wb_models.open_session(base, task, lang, progress, access, visitor="page-a")
    assert session is not None, report.problems
    assert cache.cached(task) is not None
    assert awaiting_download([base, task, lang], access) == []
    texts.append(preflight_markdown(preflight_models(base, task, lang, access), access))
    texts += [report.markdown(), *report.problems, *(c for row in report.rows for c in row),
              wb.banner(session)]
    assert session.recipe == {"base": "base", "task": f"fake/task@{SHA}",
                              "lang": f"fake/lang@{SHA}"}
    config = wb_configure.make_config(session, "layer swap", 2, 1, partition=NO_PARTITION)
    texts += [config.to_yaml(), *wb_configure.plan_view(session, config)[1:]]
    result = wb_build.build(session, config, progress)
    texts.append(result.markdown())
    texts.append(wb.banner(session))
    saved = wb_build.save(session, config, "mine", progress=progress, access=access)
    texts.append(saved.name)                      # the page: "Saved as `mine`"
    files = {p.name: p.read_text() for p in saved.iterdir()
             if p.suffix in (".json", ".yaml", ".md", ".txt", ".jinja")}
    assert f"task: fake/task@{SHA}" in files["layerswap.yaml"]
    assert f"`fake/lang@{SHA}`" in files["README.md"] and "`base`" in files["README.md"]
    texts += files.values()
    (tmp / "zip").mkdir()
    zipped = wb_build.export_zip(session, config, str(tmp / "zip"))
    with zipfile.ZipFile(zipped) as z:
        members = {n: z.read(n).decode() for n in z.namelist()}
    assert f"model: fake/task@{SHA}" in members["mergekit.yaml"]
    texts += members.values()
    for push in (lambda: wb_build.push_to_hub(session, config, "alice/merged"),   # no sign-in
                 lambda: wb_build.save(session, config, "../x", access=access),
                 lambda: wb_build.save(session, config, "mine", access=access)):
        with pytest.raises(ValueError) as e:
            push()
        texts.append(readable_error(e.value))
    # a corrupt Hub model: one line, in the visitor's words
    with pytest.raises(WorkbenchError) as e:
        wb_models.open_session(base, "fake/badheader", lang, access=access)
    corrupt = readable_error(e.value)
    assert "fake/badheader" in corrupt and "cannot be read as a model" in corrupt, corrupt
    texts += [corrupt, *(c for row in e.value.rows for c in row)]
    # the agent tools, over the same server
    tools = agents.AgentTools(access)
    opened = json.loads(tools.check_models(base, task, lang))
    token = opened["session"]
    texts.append(json.dumps(opened))
    texts.append(tools.layer_plan(token, {"bottom": 2, "top": 1}))
    built = json.loads(tools.build_and_save(token, {"bottom": 2, "top": 1}, "agent-save"))
    assert built["saved_to"] == "agent-save"
    assert f"lang: fake/lang@{SHA}" in built["config_yaml"]
    texts += [json.dumps(built), tools.job_status(token), tools.close_session(token)]
    texts += said
    _no_server_path(texts, cache.root, out_root, Path.cwd(), tmp)


def test_a_full_disk_and_an_unwritable_cache_are_said_in_words(tmp_path):
    from layerswap_core.checkpoints.references import ModelLoadError, check_free_space

    blocked = tmp_path / "file"
    blocked.write_text("x")
    with pytest.raises(ModelLoadError) as e:
        check_free_space(blocked / "cache", 10, "downloading a/b", shown="the server's cache")
    assert str(tmp_path) not in str(e.value)
    with pytest.raises(ModelLoadError) as e:
        check_free_space(tmp_path, 10 ** 18, "downloading a/b", shown="the server's cache")
    assert str(tmp_path) not in str(e.value) and "the server's cache has only" in str(e.value)


def test_a_pick_says_nothing_of_the_servers_working_directory(served, tiny, fake_hub):
    """Served, a pick of ``fake/task`` answers in the same words whether or not a folder
    ``fake/task`` (a model, even) lies in the app's working directory: it is a Hub id."""
    access, cache, _ = served
    base, lang = str(tiny["base"]), str(tiny["lang"])

    def answer() -> str:
        gate = preflight_gate(base, "fake/task", lang, access)
        assert gate is not None
        pf, missing = gate
        text = preflight_markdown(pf, access) + "\n" + download_line(pf, missing)
        # the server's free memory is quoted as it is now, and it moves between two answers
        return re.sub(r"has [\d.]+ GB of memory available now", "has N GB of memory available now",
                      text)

    without = answer()
    assert "**Download and use** fetches fake/task " in without
    here = Path.cwd() / "fake" / "task"
    here.parent.mkdir()
    for p in tiny["task"].iterdir():
        if p.is_file():
            here.mkdir(exist_ok=True)
            (here / p.name).write_bytes(p.read_bytes())
    assert answer() == without
    assert awaiting_download(["fake/task"], access) == ["fake/task"]
    assert cache.jobs == {}                       # and nothing downloaded meanwhile


def test_the_served_hub_reads_do_not_follow_a_redirect_to_another_host(served, fake_hub, tiny):
    """fake/elsewhere's files answer 302 to another fake Hub (another port): the pre-flight's
    range reads and the download refuse in one line, and the other host is never asked."""
    access, cache, _ = served
    other = FakeHub({"fake/task": tiny["task"]})
    fake_hub.redirects["fake/elsewhere"] = f"{other.url}/fake/task/resolve/{SHA}"
    try:
        pf = preflight_models("", "fake/elsewhere", "fake/lang", access)
        assert pf.problems == [f"task fake/elsewhere: {hub.OTHER_HOST}"], pf.problems
        with pytest.raises(hub.ModelLoadError) as e:
            cache.fetch("fake/elsewhere", "visitor-a", wait=20)
        assert str(e.value) == f"fake/elsewhere: {hub.OTHER_HOST}"
        assert cache.cached("fake/elsewhere") is None
        assert other.auths == []                       # not one request reached it
        assert not list(cache.root.glob(".partial-*"))
        # the Hub's own file hosts stay allowed, other hosts and ports do not
        ok = hub.same_host_allowed
        assert ok("https://huggingface.co", "https://cas-bridge.xethub.hf.co/x")
        assert ok("https://huggingface.co", "https://cdn-lfs.huggingface.co/x")
        assert not ok("https://huggingface.co", "http://cdn-lfs.huggingface.co/x")
        assert not ok("https://huggingface.co", "https://evil.example/x")
        assert not ok("http://127.0.0.1:1", "http://127.0.0.1:2/x")
        assert not ok("https://mirror.example", "https://cdn-lfs.huggingface.co/x")
    finally:
        fake_hub.redirects.clear()
        other.close()


def test_unreadable_downloads_are_not_kept(served, fake_hub, tiny):
    """Files that match the checksums the Hub listed but are no model (a weight file whose
    header is not JSON, an index naming a file outside the folder) and a listed commit id
    that is a path: refused in one line, nothing left in the served cache or beside it. A
    snapshot already cached that a check then cannot read is removed after that check."""
    import shutil

    access, cache, tmp = served
    fake_hub.shas["fake/task"] = "../../escaped"
    try:
        for repo, why in (("fake/badheader", "cannot be read as a model"),
                          ("fake/outside", "cannot be read as a model"),
                          ("fake/task", "a commit id that is not one")):
            with pytest.raises(hub.ModelLoadError, match=why) as e:
                cache.fetch(repo, "visitor-a", wait=20)
            assert str(tmp) not in str(e.value), str(e.value)
            assert cache.cached(repo) is None
        assert sorted(p.name for p in cache.root.iterdir()) == []   # no partial, no repo folder
        assert not (tmp / "escaped").exists() and not (cache.root.parent / "escaped").exists()
    finally:
        fake_hub.shas.clear()
    # cached before (an older server, a disk error): the failed check removes it
    snapshot = cache.repo_dir("fake/badheader") / SHA
    snapshot.mkdir(parents=True)
    for name, data in fake_hub.repos["fake/badheader"].items():
        (snapshot / name).write_bytes(data)
    with pytest.raises(WorkbenchError, match="fake/badheader"):
        wb_models.open_session(str(tiny["base"]), "fake/badheader", str(tiny["lang"]),
                               access=access)
    assert not snapshot.exists() and cache.cached("fake/badheader") is None
    shutil.rmtree(cache.repo_dir("fake/badheader"))
