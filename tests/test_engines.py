"""Engines, jobs and the dispatcher on tiny real models: a bounded pool shared by visitors."""
from __future__ import annotations

import pickle
import threading
import time

import pytest

from layerswap_core.engines import jobs as J
from layerswap_core.engines.dispatch import Busy, Dispatcher, TooLong
from layerswap_core.engines.pool import Engine, EnginePool, QueueFull, Trio, fitting_engines
from layerswap_core.merge.config import MergeConfig
from layerswap_core.progress import Cancelled


@pytest.fixture(scope="module")
def trio(tiny):
    return Trio(str(tiny["task"]), str(tiny["lang"]), str(tiny["base"]))


@pytest.fixture(scope="module")
def items():
    from layerswap_core.evaluation.registry import load_items
    return load_items("gsm-symbolic", "sw", 3)


def swap(tiny, b, u):
    return MergeConfig(method="layer_swap", bottom=b, top=u, task=str(tiny["task"]),
                       lang=str(tiny["lang"]), base=str(tiny["base"])).to_dict()


def evaluate_job(trio, visitor, what, items, tokens=6):
    return J.Job("evaluate", trio, visitor, what, list(items),
                 {"shots": 0, "max_new_tokens": tokens, "exemplars": [], "with_nll": True})


def chat_job(trio, visitor, what, text="Habari?", tokens=12):
    return J.Job("chat", trio, visitor, what, [],
                 {"turns": [], "text": text, "max_new_tokens": tokens,
                  "deadline": time.monotonic() + 120})


def run_together(d: Dispatcher, jobs: dict) -> dict:
    """{visitor: result} of ``jobs`` ({visitor: job}) run at once on ``d``, one thread each;
    any job's error fails the test."""
    out, errors = {}, []

    def run(v):
        try:
            out[v] = d.run(jobs[v])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(v,)) for v in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    return out


def test_jobs_and_results_are_plain_data(trio, tiny, items, one_thread):
    job = evaluate_job(trio, "v1", {"merged": swap(tiny, 2, 1), "task": "task"}, items)
    assert pickle.loads(pickle.dumps(job)) == job
    res = Dispatcher(EnginePool(1)).run(job)
    again = pickle.loads(pickle.dumps(res))
    assert again == res and [s["model"] for s in res["summary"]] == ["merged", "task"]
    assert [r["id"] for r in res["rows"]] == [it.id for it in items]


def test_chunked_evaluation_equals_one_call(trio, tiny, items, one_thread):
    """Chunks of one model and two items give the rows and summary of one call over all items
    with the same batch size."""
    from layerswap_core.evaluation.runner import run_side_by_side
    from layerswap_core.merge.live import LiveModel

    job = evaluate_job(trio, "v", {"merged": swap(tiny, 2, 1), "lang": "lang"}, items)
    res = Dispatcher(EnginePool(1), chunk_items=2).run(job)
    live = LiveModel.from_refs(trio.task, trio.lang, trio.base)

    def shown(what):
        def get():
            live.show(J.shown(what))
            return live.model, live.tokenizer
        return get
    whole = run_side_by_side({k: shown(w) for k, w in job.what.items()}, items, shots=0,
                             max_new_tokens=6, batch_size=2, exemplars=[], device=None)
    assert res["rows"] == whole.rows
    assert res["summary"] == whole.summary


def test_an_nll_job_is_the_one_token_paths_nll_without_generating(trio, tiny, items,
                                                                   one_thread):
    """An "nll" job (teacher-forced, no generation) gives, float for float, the gold NLL an
    evaluation that generates one token per item reports (a sweep's NLL: ``test_sweeps``)."""
    d = Dispatcher(EnginePool(1), chunk_items=4)   # an evaluation of 3 items: one chunk
    config = swap(tiny, 0, 3)
    nll = J.Job("nll", trio, "v", config, list(items), {"shots": 0, "exemplars": [],
                                                        "batch_size": 4})
    per_item = d.run(nll)["nlls"]
    one_token = d.run(evaluate_job(trio, "v", {"merged": config}, items, tokens=1))
    assert per_item == [r["models"]["merged"]["gold_nll"] for r in one_token["rows"]]


def test_visitors_interleaved_on_one_engine_get_what_each_gets_alone(trio, tiny, items,
                                                                     one_thread):
    configs = {"v1": swap(tiny, 2, 1), "v2": swap(tiny, 0, 0), "v3": swap(tiny, 3, 2)}
    alone = {}
    for v, cfg in configs.items():
        alone[v] = Dispatcher(EnginePool(1), chunk_items=1).run(
            evaluate_job(trio, v, {"merged": cfg, "base": "base"}, items[:2]))
    pool = EnginePool(1)
    d = Dispatcher(pool, chunk_items=1)
    together = run_together(d, {v: evaluate_job(trio, v, {"merged": cfg, "base": "base"},
                                                 items[:2]) for v, cfg in configs.items()})
    assert together == alone
    assert pool.built == 1 and pool.peak == 1
    outputs = {v: [r["models"]["merged"]["output"] for r in res["rows"]]
               for v, res in alone.items()}
    assert len({tuple(o) for o in outputs.values()}) > 1   # the configurations differ


def _build_when_held(d, trio, what, built):
    """A progress callback for a job: the first time the job sets up its model (it holds the
    engine), another visitor asks for a Build of ``what``; the callback returns once that Build
    waits for the engine, so the job meets its next pause point with a Build waiting."""
    def build():
        built["res"] = d.run(J.Job("show", trio, "b", what))
        built["before_the_end"] = "end" not in built

    def progress(frac, msg):
        if ("setting up" in msg or "tensors" in msg) and "thread" not in built:
            built["thread"] = threading.Thread(target=build)
            built["thread"].start()
            deadline = time.monotonic() + 60
            while not d.pool.waiting and time.monotonic() < deadline:
                time.sleep(0.005)
    return progress


def test_a_build_goes_between_two_tokens_of_a_streaming_chat(trio, tiny, one_thread):
    """The Build waits for one step of the chat, not its whole answer; the chat shows its own
    model again and its tokens are those it gives alone."""
    job = chat_job(trio, "a", swap(tiny, 2, 1), tokens=24)
    alone = [r["content"] for r in Dispatcher(EnginePool(1)).stream(job)]
    d = Dispatcher(EnginePool(1, step=60))   # a new engine: the chat sets up its model
    built = {}
    seen = [r["content"] for r in d.stream(job, _build_when_held(d, trio, swap(tiny, 0, 3),
                                                                 built))]
    built["end"] = True
    built["thread"].join(60)
    assert seen == alone and len(alone) > 2
    assert built["res"]["rewritten"] > 0 and built["before_the_end"]
    assert d.pool.handovers == 1
    # the chat showed its own model again after the Build
    assert d.pool.engines[0].live.plan.config.layer_counts(8)[:2] == (2, 1)


def test_a_build_goes_between_two_steps_of_an_evaluation(trio, tiny, items, one_thread):
    """An evaluation lends its engine at its next decoding pass to a waiting Build (a more
    urgent job: at once, whatever its step), then shows its model again: the rows and NLLs are
    those of the evaluation alone."""
    job = evaluate_job(trio, "a", {"merged": swap(tiny, 2, 1)}, items[:2], tokens=24)
    alone = Dispatcher(EnginePool(1)).run(job)
    d = Dispatcher(EnginePool(1, step=60))
    built = {}
    res = d.run(job, _build_when_held(d, trio, swap(tiny, 0, 3), built))
    built["end"] = True
    built["thread"].join(60)
    assert res == alone
    assert built["before_the_end"] and d.pool.handovers == 1
    # the time lent out was taken off the job's measured speed, and nothing of it is kept
    assert d.pool.engines[0].lent == {} and d.pool.engines[0].tokens_per_second > 0


def test_equally_urgent_jobs_take_turns_of_one_step(trio, tiny, items, one_thread):
    """Two evaluations on one engine: with a step of 0 s each hands the engine to the other
    at every pause point; each still gets what it gets alone."""
    jobs = {v: evaluate_job(trio, v, {"merged": swap(tiny, b, u)}, items[:2], tokens=16)
            for v, b, u in (("v1", 2, 1), ("v2", 0, 3))}
    alone = {v: Dispatcher(EnginePool(1)).run(j) for v, j in jobs.items()}
    pool = EnginePool(1, step=0.0)
    assert run_together(Dispatcher(pool), jobs) == alone
    assert pool.handovers >= 2 and pool.built == 1


def test_a_paused_job_cancelled_while_it_waits_leaves_the_engine_to_the_other(trio, tiny,
                                                                              items, one_thread):
    """Cancel pressed while a job has lent its engine: it stops without taking the engine back
    from the job that holds it, and the engine is free afterwards."""
    d = Dispatcher(EnginePool(1, step=60))
    job = evaluate_job(trio, "a", {"merged": swap(tiny, 2, 1)}, items[:2], tokens=24)
    built = {}
    wait_build = _build_when_held(d, trio, swap(tiny, 0, 3), built)

    def progress(frac, msg):
        wait_build(frac, msg)
        if msg.startswith("paused"):
            d.cancel("a")
    with pytest.raises(Cancelled):
        d.run(job, progress)
    built["thread"].join(60)
    assert built["res"]["rewritten"] > 0
    assert not d.pool.engines[0].busy and d.pool.engines[0].paused == 0
    assert d.run(J.Job("show", trio, "c", swap(tiny, 1, 1)))["rewritten"] > 0


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_the_pool_never_exceeds_its_bound_and_evicts_the_least_recent(trio, one_thread):
    made = []

    def factory(t, progress):
        made.append(t)
        return Engine(t, progress)
    pool = EnginePool(2, factory=factory)
    trios = [Trio(trio.task, trio.lang, trio.base, dtype=d)
             for d in ("float32", "bfloat16", "float16")]
    held, worst, lock = [0], [0], threading.Lock()

    def use(t):
        with pool.checkout(t):
            with lock:
                held[0] += 1
                worst[0] = max(worst[0], held[0], len(pool.engines))
            time.sleep(0.05)
            with lock:
                held[0] -= 1
    threads = [threading.Thread(target=use, args=(trios[i % 3],)) for i in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert worst[0] <= 2 and pool.peak <= 2 and len(pool.engines) <= 2
    assert pool.evicted >= 1 and len(made) == pool.built >= 3
    with pool.checkout(trios[0]):
        pass
    with pool.checkout(trios[1]):
        pass
    before = list(pool.engines)
    with pool.checkout(trios[2]):     # the least recently used (float32) makes room
        pass
    assert {e.trio.dtype for e in pool.engines} == {"bfloat16", "float16"}
    assert [e for e in before if e in pool.engines] == [e for e in before
                                                        if e.trio.dtype == "bfloat16"]


def test_visitors_on_one_trio_share_one_engine(trio, one_thread):
    """However many jobs on the same models at once, one engine (memory does not grow with
    visitors); they take turns on it."""
    pool = EnginePool(4)
    d = Dispatcher(pool)
    threads = [threading.Thread(target=d.run, args=(J.Job("show", trio, f"v{i}", role),))
               for i, role in enumerate(("base", "task", "lang", "base", "task", "lang"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert pool.built == 1 and pool.peak == 1 and len(pool.engines) == 1


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_a_short_job_waits_ahead_of_long_chunks(trio, one_thread):
    """While one job holds the engine and two long chunks wait, a Build (short) gets the engine
    next: it waits for at most the chunk that holds it, not for every chunk queued before it."""
    pool = EnginePool(1)
    order, started = [], threading.Event()

    def hold():
        with pool.checkout(trio, "holder"):
            started.set()
            while len(pool.waiting) < 3:      # two long chunks and the build are waiting
                time.sleep(0.01)

    def wait(name, short):
        with pool.checkout(trio, name, short=short):
            order.append(name)

    holder = threading.Thread(target=hold)
    holder.start()
    assert started.wait(120)
    waiters = [threading.Thread(target=wait, args=(name, short)) for name, short in
               (("chunk-1", False), ("chunk-2", False), ("build", True))]
    for t in waiters:
        t.start()
        time.sleep(0.05)                      # in this order
    for t in (holder, *waiters):
        t.join(120)
    assert order == ["build", "chunk-1", "chunk-2"]


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_equally_urgent_jobs_of_several_visitors_take_turns(trio, one_thread):
    """Round robin between visitors, not first come first served: visitor A queues 5 chat
    steps, then B one; B's is served second, not sixth (A's many tabs cannot starve B)."""
    pool = EnginePool(1)
    order, started, release = [], threading.Event(), threading.Event()

    def hold():
        with pool.checkout(trio, "holder"):
            started.set()
            release.wait(120)

    def wait(name):
        with pool.checkout(trio, name[0], priority=1):
            order.append(name)

    holder = threading.Thread(target=hold)
    holder.start()
    assert started.wait(120)
    waiters = []
    for name in ("A1", "A2", "A3", "A4", "A5", "B1"):
        waiters.append(threading.Thread(target=wait, args=(name,)))
        waiters[-1].start()
        deadline = time.monotonic() + 60
        while len(pool.waiting) < len(waiters) and time.monotonic() < deadline:
            time.sleep(0.01)                  # queued in this order
    assert [t.visitor for t in pool.waiting] == ["A", "B", "A", "A", "A", "A"]
    release.set()
    for t in (holder, *waiters):
        t.join(120)
    assert order == ["A1", "B1", "A2", "A3", "A4", "A5"]


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_queue_and_per_visitor_limits_refuse_with_clear_messages(trio, tiny, one_thread):
    pool = EnginePool(1, max_waiting=1)
    d = Dispatcher(pool)
    stream = d.stream(chat_job(trio, "a", "task", tokens=40))
    next(stream)                                   # "a" holds the engine, chatting
    with pytest.raises(Busy, match="you already have a job running"):
        d.run(evaluate_job(trio, "a", {"task": "task"}, []))
    stream.close()
    with pool.checkout(trio, "a"):      # held with no pause point: the next Build waits
        waiting = threading.Thread(target=lambda: d.run(J.Job("show", trio, "b", "lang")))
        waiting.start()
        time.sleep(0.3)
        with pytest.raises(QueueFull, match=r"queue is full \(1 jobs waiting\)"):
            d.run(J.Job("show", trio, "c", "base"))
    waiting.join(60)
    assert not waiting.is_alive()


def test_one_heavy_job_per_person_and_closing_a_page_stops_only_its_jobs(trio, one_thread):
    """A signed-in person's second page cannot start a second heavy job (a light one can, and
    so can another person); closing that second page leaves the first page's job running;
    closing the first page stops it at its next step, and nothing is kept for either."""
    from dataclasses import replace

    d = Dispatcher(EnginePool(1))
    first = replace(chat_job(trio, "page-1", "task", tokens=200), person="hf-alice")
    stream = d.stream(first)
    next(stream)                                   # page 1 chats
    second = replace(evaluate_job(trio, "page-2", {"task": "task"}, []), person="hf-alice")
    with pytest.raises(Busy, match="another of yours"):
        d.run(second)
    with d.claim(replace(second, kind="show")), d.claim(replace(second, person="hf-bob")):
        pass
    d.leave("page-2")
    next(stream)                                   # page 1 goes on
    d.leave("page-1")
    with pytest.raises(Cancelled):
        next(stream)
    assert d.visitors == {} and d.heavy == {}


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_a_visitor_who_leaves_is_cancelled_and_forgotten(trio, one_thread):
    pool = EnginePool(1)
    d = Dispatcher(pool)
    positions, outcome = [], {}

    def wait_for_engine():
        try:
            d.run(J.Job("show", trio, "gone", "lang"), progress=lambda f, m: positions.append(m))
        except Cancelled as e:
            outcome["cancelled"] = e
    with pool.checkout(trio):                      # someone else's job holds the engine
        thread = threading.Thread(target=wait_for_engine)
        thread.start()
        time.sleep(0.5)
        assert d.running("gone") and "number 1 in the queue" in " ".join(positions)
        d.leave("gone")
        thread.join(10)
        assert "cancelled" in outcome and not pool.waiting
    assert "gone" not in d.visitors


def test_a_job_over_the_time_budget_is_refused_before_it_starts(trio, items):
    d = Dispatcher(EnginePool(1), job_seconds=30)
    with pytest.raises(TooLong, match="would take about .* min per job"):
        d.run(evaluate_job(trio, "v", {"task": "task"}, items * 10, tokens=256))


def test_engines_fit_the_free_memory_with_a_margin():
    eight_b = 8_030_000_000 * 2          # an 8B trio's engine in bf16
    assert fitting_engines(eight_b, 70 << 30) == 3      # a 70 GiB ZeroGPU slice
    assert fitting_engines(eight_b, 16 << 30) == 1      # never none
    assert fitting_engines(135_000_000 * 4, 16 << 30) == 8   # capped


# --------------------------------------------------------------------------- ZeroGPU
def test_zerogpu_emulation_runs_the_apps_jobs_like_the_cpu(tiny, tmp_path, one_thread):
    """The real ``spaces`` package, its device API emulated on loopback (tests/zerogpu_harness.py,
    a process of its own): the app's build, evaluation and chat pickle to a forked worker and
    back, the main process's preloaded weights stay as they were, a second call reuses the
    worker, and every output equals the CPU path's, token for token."""
    import importlib.util
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from layerswap_core.workbench import session as wb
    from layerswap_core.workbench import build as wb_build
    from layerswap_core.workbench import configure as wb_configure
    from layerswap_core.workbench import models as wb_models
    from layerswap_core.workbench.chat import chat_turn
    from layerswap_core.workbench.evaluate import evaluate_roles

    if importlib.util.find_spec("spaces") is None:
        pytest.skip("the spaces package is not installed (requirements-dev.txt)")
    refs = [str(tiny[r]) for r in ("base", "task", "lang")]
    out = tmp_path / "zerogpu.json"
    harness = Path(__file__).with_name("zerogpu_harness.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(harness.parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])])}
    run = subprocess.run([sys.executable, str(harness), *refs, str(out)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    zero = json.loads(out.read_text())

    wb.dispatcher().pool.clear()   # a fresh engine here too: the count of rewritten tensors
    session, _ = wb_models.open_session(*refs)   # depends on what an engine showed before
    build = wb_build.build(session, wb_configure.make_config(session, "layer swap", 2, 1))
    cpu = evaluate_roles(session, "gsm-symbolic", "sw", 2, 0, False, ("base", "merged"), 8)
    chat = list(chat_turn(session, "Habari?", [], "merged", max_new_tokens=12))[-1]

    assert "on ZeroGPU" in zero["line"]
    assert (zero["changed"], zero["total"]) == (build.changed, build.total)
    assert zero["evaluations"][0] == zero["evaluations"][1] == cpu.raw.rows
    assert zero["summaries"][0] == cpu.raw.summary
    assert zero["chat"] == chat.history[-1]["content"] and zero["chat"].strip()
    assert zero["main_weights_unchanged"]
    assert len(set(zero["pids"])) == 1 and zero["main_pid"] not in zero["pids"]
    # one worker for the calls, one for the stream: each allowed once, then reused
    assert zero["calls"].count("/allow") == 2 and zero["calls"].count("/schedule") >= 6
    assert zero["calls"].count("/release") == zero["calls"].count("/schedule")


def test_a_chunked_evaluations_progress_counts_the_whole_job(trio, tiny, one_thread):
    """2 models x 4 items in chunks of 2: every line names the model of the job ("model 2 of
    2", never "1 of 1") and counts items across the job; the bar never steps back; no job
    kind shows."""
    from layerswap_core.evaluation.registry import load_items

    items = load_items("gsm-symbolic", "sw", 4)
    seen = []
    Dispatcher(EnginePool(1), chunk_items=2).run(
        evaluate_job(trio, "p", {"base": "base", "task expert": "task"}, items, tokens=4),
        progress=lambda f, m: seen.append((f, m)))
    fractions, messages = zip(*seen)
    assert all(b >= a - 1e-9 for a, b in zip(fractions, fractions[1:])), fractions
    assert "model 1 of 2 (base): 0 of 8 items answered" in messages
    assert any(m.startswith("model 1 of 2 (base): setting up the model") for m in messages)
    # the set-up ends when answering starts (the bar sat at "setting up (100%)" meanwhile)
    up = max(i for i, m in enumerate(messages) if m.startswith("model 1 of 2 (base): setting up"))
    assert messages[up + 1].startswith("model 1 of 2 (base): answering")
    assert "model 2 of 2 (task expert): 6 of 8 items answered" in messages
    assert messages[-1] == "model 2 of 2 (task expert): 8 of 8 items answered"
    assert not [m for m in messages if "of 1 " in m or "evaluate" in m or "starting" in m]
