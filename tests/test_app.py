"""The launched app, driven through its API with gradio_client: every tab's main function."""
from __future__ import annotations

import socket
import zipfile

import pytest

NO_PARTITION = "none (bottom/top sliders)"
# the Configure tab's "More" controls: non-layer blend, no preset scaling, lambdas, TIES
MORE = ("blend (average, as in Algorithm 1)", False, 1.0, 1.0, 0.2, 1.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def app_url(tiny):
    import app

    demo = app.build_demo({role: str(tiny[role]) for role in ("base", "task", "lang")})
    port = free_port()
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                        quiet=True)
    yield f"http://127.0.0.1:{port}/"
    demo.close()


@pytest.fixture(scope="module")
def client(app_url, tiny):
    """One visitor (one session), with the tiny family picked."""
    from gradio_client import Client

    c = Client(app_url, verbose=False)
    out = pick(c, str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    assert out["models_md"].startswith("✔") and "8 layers" in out["models_md"]
    return c


def config(b=2, u=1, tb=0, tu=0, method="layer swap", partition=NO_PARTITION, rules=""):
    return (method, b, u, tb, tu, 1.0, 1.0, False, partition, rules, *MORE)


def named(event: str, out) -> dict:
    """An endpoint's outputs by name (app.OUTPUTS; the API leaves the session state out)."""
    import app

    names = [n for n in app.OUTPUTS[event] if n not in app.NOT_IN_API]
    out = out if isinstance(out, (list, tuple)) else (out,)
    assert len(out) == len(names)
    return dict(zip(names, out))


def pick(client, base, task, lang) -> dict:
    return named("pick_models", client.predict(base, task, lang, api_name="/pick_models"))


def test_models_tab_bounds_the_sliders(client, tiny):
    out = pick(client, str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    assert [row[0] for row in out["models_table"]["data"]] == ["base", "task expert",
                                                               "language expert"]
    assert all(out[s]["maximum"] == 8 for s in ("bottom", "top", "transition_bottom",
                                                  "transition_top"))
    assert "layers    source" in out["plan_text"] and "Compatible" in out["models_md"]
    assert out["status"].startswith("✔") and "not built yet" in out["status"]


def test_configure_plan_follows_sliders(client):
    one = named("plan", client.predict(*config(2, 1), api_name="/plan"))
    two = named("plan", client.predict(*config(3, 1, 1, 0), api_name="/plan"))
    assert one["config_md"].startswith("✔") and one["plan_text"] != two["plan_text"]
    assert one["diagram"] != two["diagram"] and one["plan_cells"] != two["plan_cells"]
    assert "0-2       lang" in two["plan_text"] and "blend" in two["plan_text"]
    assert "**Build makes**: layer swap: bottom 3, top 1" in two["build_label"]
    bad = named("plan", client.predict(*config(5, 4), api_name="/plan"))
    assert bad["config_md"].startswith("⚠") and "exceeds the model's 8 layers" in bad["config_md"]
    assert "not valid" in bad["build_label"] and "nothing built yet" in bad["saves_label"]


def test_build_download_and_save(client, tmp_path):
    out = named("build", client.predict(*config(2, 1), api_name="/build"))
    assert "Built in memory" in out["build_md"] and "bottom: 2" in out["config_yaml"]
    assert "built in memory (layer swap: bottom 2, top 1" in out["status"]
    assert "the built merge, layer swap: bottom 2, top 1" in out["saves_label"]
    assert "changed since build" not in out["saves_label"] + out["eval_label"]
    # the Configure tab moves on: Save and Zip still write the built merge, and say so
    moved = named("plan", client.predict(*config(3, 1), api_name="/plan"))
    assert "changed since build — rebuild or save the built one" in moved["saves_label"]
    assert "changed since build" in moved["eval_label"] and "changed" in moved["chat_label"]
    status, zip_path = client.predict(api_name="/download")
    assert "built merge (layer swap: bottom 2, top 1" in status
    with zipfile.ZipFile(zip_path) as z:
        assert sorted(z.namelist()) == ["README.md", "layerswap.yaml", "mergekit.yaml"]
        assert "bottom: 2" in z.read("layerswap.yaml").decode()
    out = tmp_path / "merged"
    status = client.predict(str(out), False, api_name="/save")
    assert status.startswith("✔") and (out / "config.json").exists()
    assert (out / "layerswap.yaml").exists() and list(out.glob("*.safetensors"))
    assert "bottom: 2" in (out / "layerswap.yaml").read_text()
    again = client.predict(str(out), False, api_name="/save")
    assert again.startswith("⚠") and "exists" in again


def test_deltas_and_suggestion(client):
    out = named("analyze", client.predict("fraction", False, False, *config(2, 1), api_name="/analyze"))
    assert out["deltas_md"].startswith("✔") and "Suggested configuration" in out["suggestion"]
    assert "What the deltas say:" in out["suggestion"] and "overlap" in out["suggestion"]
    assert out["heatmaps"] and out["plan_overlay"]
    status, *sliders, partition = client.predict(api_name="/apply_suggestion")
    assert status.startswith("✔") and isinstance(sliders[0]["value"], (int, float))


def test_evaluate_two_questions(client):
    client.predict(*config(2, 1), api_name="/build")
    status, summary, bars, table = client.predict(
        "mgsm", "sw", 2, 1, False, ["task expert", "merged"], 8, False, api_name="/evaluate")
    assert status.startswith("✔")
    assert [r[0] for r in summary["data"]] == ["task expert", "merged"]
    assert len(table["data"]) == 2 and "merged: output" in table["headers"]


def test_sweep(client):
    status, fig, table, _ = client.predict(*config(2, 1), "bottom / top", "0,2", "1",
                                           "gsm-symbolic", "sw", 2, "nll", api_name="/sweep")
    assert status.startswith("✔") and "best: bottom" in status
    assert sorted(r[:2] for r in table["data"]) == [[0, 1], [2, 1]]
    assert [r[2] for r in table["data"]] == sorted(r[2] for r in table["data"])   # best first
    best = table["data"][0]
    assert f"bottom {best[0]}, top {best[1]} (gold NLL {best[2]})" in status


def test_chat_streams_and_empty_message_is_readable(client):
    client.predict(*config(2, 1), api_name="/build")
    job = client.submit("Habari yako?", [], [], "task expert", 16, api_name="/chat")
    updates = list(job)
    status, message, merged, other = job.result()
    assert len(updates) >= 2 and status.startswith("✔")
    assert merged[-1]["role"] == "assistant" and other[-1]["role"] == "assistant"
    status, *_ = client.predict("   ", [], [], "task expert", 16, api_name="/chat")
    assert status.startswith("⚠") and "type a message" in status
    # sampling settings reach the model: a sampled answer streams too
    status, _, merged, _ = client.predict("Habari yako?", [], [], "base", 16, 0.9, 1.2,
                                          api_name="/chat")
    assert status.startswith("✔") and merged[-1]["role"] == "assistant"
    with pytest.raises(Exception, match="less than minimum"):  # the slider bounds hold over the API
        client.predict("Habari?", [], [], "base", 16, -1.0, 1.0, api_name="/chat")


@pytest.mark.parametrize("role, ref, words", [
    ("task", "/no/such/folder", "no such folder"),
    ("lang", "nobody/not-a-model", "offline"),
    ("task", "embedded:smollm2-135m-instruct", "30 layers"),   # incompatible with the 8-layer base
])
def test_bad_models_show_a_message_and_the_app_keeps_working(app_url, tiny, role, ref, words):
    from gradio_client import Client

    c = Client(app_url, verbose=False)
    refs = {r: str(tiny[r]) for r in ("base", "task", "lang")}
    refs[role] = ref
    out = pick(c, refs["base"], refs["task"], refs["lang"])
    status = out["models_md"]
    assert status.startswith("⚠") and words in status and "Traceback" not in status
    assert out["status"].startswith("⚠") and "No models in use" in out["status"]
    # no session was opened: the other tabs say what to do
    status, *_ = c.predict(*config(), api_name="/build")
    assert status.startswith("⚠") and "pick compatible models first" in status
    out = pick(c, str(tiny["base"]), str(tiny["task"]), str(tiny["lang"]))
    assert out["models_md"].startswith("✔")


# ------------------------------------------------------------------------- the page tells the truth
def test_a_failed_check_keeps_the_session(app_url, tiny, tmp_path):
    """Good check, build, then a failed check (a typo, incompatible models): the session in use
    and its build stay (the top line, the views, Save), the table lists the models tried."""
    from gradio_client import Client

    c = Client(app_url, verbose=False)
    good = [str(tiny[r]) for r in ("base", "task", "lang")]
    assert pick(c, *good)["models_md"].startswith("✔")
    built = named("build", c.predict(*config(3, 1), api_name="/build"))
    assert "Merged model: built in memory" in built["status"]
    for bad_task, words in (("embedded:smollm2-135m-instruct", "Not compatible"),
                            ("/no/such/folder", "no such folder")):
        out = pick(c, good[0], bad_task, good[2])
        assert out["models_md"].startswith("⚠") and words in out["models_md"]
        assert "Still in use, unchanged" in out["models_md"]
        assert [r[1] for r in out["models_table"]["data"]][1] == bad_task
        # the other outputs are left as they were (the API answers with bare updates)
        assert out["status"] == {"__type__": "update"} and out["build_md"] == {"__type__": "update"}
        plan = named("plan", c.predict(*config(3, 1), api_name="/plan"))
        assert plan["config_md"].startswith("✔")
        assert "the built merge, layer swap: bottom 3, top 1" in plan["saves_label"]
    status = c.predict(str(tmp_path / "kept"), False, api_name="/save")
    assert status.startswith("✔") and "bottom: 3" in (tmp_path / "kept" / "layerswap.yaml").read_text()
    chat_status, *_ = c.predict("Habari?", [], [], "task expert", 16, api_name="/chat")
    assert chat_status.startswith("✔ Done")


def test_without_a_session_every_tab_says_pick_models_first(app_url, tiny):
    from gradio_client import Client

    c = Client(app_url, verbose=False)
    out = pick(c, str(tiny["base"]), "/no/such/folder", str(tiny["lang"]))
    assert "No models in use" in out["status"] and "Still in use" not in out["models_md"]
    assert out["plan_text"] == "" and out["diagram"] is None and out["saves_label"] == ""
    for api, args in (("/build", config()), ("/evaluate", ("mgsm", "sw", 1, 0, False,
                                                           ["merged"], 8, False)),
                      ("/save", ("/tmp/never", False)), ("/download", ()),
                      ("/plan", config()), ("/apply_suggestion", ()),
                      ("/demo_result", (2,))):   # each on its own tab's line
        out = c.predict(*args, api_name=api)
        status = out if isinstance(out, str) else out[0]
        assert "pick compatible models first" in status, api
    status, *_ = c.predict("Habari?", [], [], "task expert", 16, api_name="/chat")
    assert "pick compatible models first" in status


def test_save_and_zip_before_a_build_say_build_first(app_url, tiny, tmp_path):
    from gradio_client import Client

    c = Client(app_url, verbose=False)
    pick(c, *[str(tiny[r]) for r in ("base", "task", "lang")])
    status = c.predict(str(tmp_path / "never"), False, api_name="/save")
    assert "build the merged model first" in status and not (tmp_path / "never").exists()
    status, zipped = c.predict(api_name="/download")
    assert "build the merged model first" in status and not isinstance(zipped, str)


def test_a_new_check_clears_the_old_analysis_and_build(app_url, tiny):
    from gradio_client import Client

    c = Client(app_url, verbose=False)
    good = [str(tiny[r]) for r in ("base", "task", "lang")]
    pick(c, *good)
    analyzed = named("analyze", c.predict("fraction", False, False, *config(), api_name="/analyze"))
    assert analyzed["heatmaps"] and "Suggested configuration" in analyzed["suggestion"]
    c.predict(*config(), api_name="/build")
    out = pick(c, *good)                                 # the same models, checked again
    assert out["heatmaps"] is None and out["overlap"] is None and out["plan_overlay"] is None
    assert out["suggestion"] == "" and out["deltas_md"] == "" and out["config_yaml"] == ""
    assert "not built yet" in out["status"]
    status, *_ = c.predict(api_name="/apply_suggestion")
    assert "analyze the deltas first" in status
    plan = named("plan", c.predict(*config(), api_name="/plan"))
    assert plan["plan_overlay"] == {"__type__": "update"}  # nothing analyzed: no overlay drawn


def test_a_build_replaces_build_first_messages(app_url, tiny):
    from gradio_client import Client

    c = Client(app_url, verbose=False)
    pick(c, *[str(tiny[r]) for r in ("base", "task", "lang")])
    chat_status, *_ = c.predict("Habari?", [], [], "task expert", 16, api_name="/chat")
    assert "build the merged model first" in chat_status
    out = named("build", c.predict(*config(), api_name="/build"))
    assert "Merged model: built in memory" in out["status"]
    assert out["chat_md"] == "" and out["eval_md"] == ""   # the old "build first" lines go
    chat_status, *_ = c.predict("Habari?", [], [], "task expert", 16, api_name="/chat")
    assert chat_status.startswith("✔ Done")


def test_configure_exposes_non_layer_and_baseline_knobs(client):
    """The non-layer source and the TIES/task-arithmetic knobs reach the plan (as Algorithm 1:
    non-layer parameters averaged by default)."""
    base = config(2, 1)
    blend = named("plan", client.predict(*base, api_name="/plan"))["plan_text"]
    task = named("plan", client.predict(*base[:10], "task expert", *base[11:],
                                        api_name="/plan"))["plan_text"]
    assert "non-layer blend" in blend and "non-layer blend" not in task and blend != task
    ties = config(method="TIES")
    ties = (*ties[:14], 0.5, 2.0)
    text = named("plan", client.predict(*ties, api_name="/plan"))["plan_text"]
    assert "ties d=0.5" in text
    bad = named("plan", client.predict(*ties[:14], 0, 2.0, api_name="/plan"))["config_md"]
    assert bad.startswith("⚠") and "ties_density" in bad


def test_a_question_reads_in_full():
    """The per-question table cuts long cells; a clicked row shows every field whole."""
    from app_tabs.evaluate import item_markdown

    raw = "Jibu: 3 + 4 = 7.\n" + "hatua " * 60 + "#### 7"
    text = item_markdown(["question", "gold", "merged ✓", "merged raw output"],
                             ["Amina ana maembe 3 " * 5, "7", "7 ✓", raw])
    assert "**gold**: 7 · **merged ✓**: 7 ✓" in text
    assert raw in text and ("Amina ana maembe 3 " * 5).strip() in text
    assert text.count("~~~text") == 2


def test_reproduce_the_demo_result(client):
    """The Evaluate tab's button: the demo table for the models picked (here the tiny trio)."""
    md, plot, per_template = client.predict(2, api_name="/demo_result")
    assert md.startswith("✔") and "**primary**" in md and "Holm p" in md
    assert "2 held-out variants of 2 templates" in md and "minus the math expert" in md
    assert "on 2 validation items" in md and "Sweep on 2 validation variants" in md
    assert "Deltas tab suggests" in md
    assert plot is not None and per_template is not None   # and the primary per template


def reproduce_running(tiny):
    """(session, worker thread, its outcome dict) once the tiny trio's Reproduce job runs."""
    import threading
    import time

    from app_tabs.demo import run_demo_result
    from layerswap_core.workbench import session as wb
    from layerswap_core.workbench import models as wb_models

    session, report = wb_models.open_session(str(tiny["base"]), str(tiny["task"]),
                                             str(tiny["lang"]))
    assert session is not None, report.problems
    out = {}

    def run():
        try:
            out["result"] = run_demo_result(session, 2, None)
        except Exception as e:  # noqa: BLE001 - the test looks at what came out
            out["error"] = e

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 60
    while not wb.running(session) and time.monotonic() < deadline:
        time.sleep(0.02)
    return session, worker, out


def test_reproduce_stops_when_cancelled(tiny):
    """The Reproduce button's job stops at its next step when its Cancel is pressed (the page's
    Cancel calls ``wb.cancel``), and the visitor's slot is free again afterwards."""
    from layerswap_core.progress import Cancelled
    from layerswap_core.workbench import session as wb

    session, worker, out = reproduce_running(tiny)
    assert wb.cancel(session)               # a job was running, and was asked to stop
    worker.join(120)
    assert not worker.is_alive() and "result" not in out
    assert isinstance(out.get("error"), Cancelled)
    assert not wb.dispatcher().running(session.id)


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_cancel_writes_its_note_before_it_asks_the_job_to_stop(tiny):
    """A Cancel button's first callback only writes the note; the job is asked to stop by the
    second one, which the page starts once the note is on screen, so the job's outcome always
    lands after the note (official CI once saw the note land last and stay there). Once the job
    has ended, a note left on screen is replaced."""
    import time

    from app_tabs.common import CANCELLING, PageBase
    from layerswap_core.progress import Cancelled
    from layerswap_core.workbench import session as wb

    page = object.__new__(PageBase)   # the callbacks only read the page's component keys
    page.session = "session"
    note, cancel = page.cancel_into("line")
    assert note({"session": None}).get("__type__") == "update"   # nothing runs: no note
    session, worker, out = reproduce_running(tiny)
    assert note({"session": session}) == {"line": CANCELLING}
    time.sleep(0.3)   # the tiny job takes seconds
    assert worker.is_alive() and wb.running(session)   # the note alone stops nothing
    assert cancel({"session": session, "line": CANCELLING}).get("__type__") == "update"
    worker.join(120)
    assert not worker.is_alive() and isinstance(out.get("error"), Cancelled)
    # the job ended on its own before the request: a note still showing is replaced ...
    assert "Nothing to cancel" in cancel({"session": session, "line": CANCELLING})["line"]
    # ... and the job's own outcome is left alone
    assert cancel({"session": session, "line": "✔ Done"}).get("__type__") == "update"


def test_each_tab_declares_its_outputs_and_views_once():
    """The page composes the tabs' declarations: no event defined by two tabs, and a new check
    of the models empties exactly the views the tabs declare (plus the lines naming the merge)."""
    import app
    from app_tabs.common import LABELS

    assert len(app.OUTPUTS) == sum(len(tab.OUTPUTS) for tab in app.TABS)
    views = [name for tab in app.TABS for name in tab.VIEWS]
    assert sorted(app.SESSION_VIEWS) == sorted([*views, *LABELS])
    assert app.OUTPUTS["pick_models"][-len(app.SESSION_VIEWS):] == app.SESSION_VIEWS


def test_the_page_empties_the_views_the_tabs_declare():
    """The page built from the tabs (each its own object, wired with the others' handles)
    registers every declared view, in the order of ``app.TABS``, and every line naming the
    merge: what a new session empties is what the API's ``pick_models`` names."""
    import gradio as gr

    import app
    from app_tabs.common import LABELS, PageBase
    from layerswap_core.workbench import session as wb
    from layerswap_core.workbench.served import Access

    page = PageBase(dict(wb.DEMO_REFS), Access.from_env(False))
    with gr.Blocks() as demo:
        app.compose(page, demo)
    assert page.session_views == app.SESSION_VIEWS
    assert set(page.label_lines) == set(LABELS)
    cleared = page.cleared()
    assert len(cleared) == len(app.SESSION_VIEWS)   # one empty value per view and line
    assert all(isinstance(c, gr.blocks.Block) for c in cleared)
