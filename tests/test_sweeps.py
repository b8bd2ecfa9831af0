"""Sweeps (``layerswap_core.sweeps``, ``layerswap sweep``) on the tiny 8-layer models: the grid,
the orders and the tensors they rewrite, the resumable results file, and the local and Ray
backends giving the same scores. One Ray runtime serves the whole test session."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from layerswap_core.merge.partition import ConfigError
from layerswap_core.sweeps.grid import expand, parse_grid
from layerswap_core.sweeps.order import chunks, snake
from layerswap_core.sweeps.runner import SweepStopped, prepare, run_sweep, sweep_request
from layerswap_core.sweeps.scoring import EvalSettings
from layerswap_core.sweeps.store import RESULTS_FILE, SweepStore

ROOT = Path(__file__).resolve().parents[1]
GRID = "bottom=1,2,3 top=0,1,2"
TINY_EVAL = EvalSettings(data="gsm-symbolic", langs=("sw",), n=2, shots=0, metric="nll")


def request(tiny, out, grid=GRID, **kw):
    kw.setdefault("eval", TINY_EVAL)
    return sweep_request(tiny["task"], tiny["lang"], parse_grid(grid), base=tiny["base"],
                         out=str(out), **kw)


def lines(out) -> list[dict]:
    return [json.loads(x) for x in (Path(out) / RESULTS_FILE).read_text().splitlines()]


def scores(records) -> dict:
    return {r["key"]: r["scores"] for r in records}


@pytest.fixture(scope="module")
def local_run(tiny, tmp_path_factory, one_thread):
    """The 3x3 grid scored once on the local backend, in snake order, on a fresh engine of this
    process's pool (the counted writes start from the task expert, as a new engine does)."""
    from layerswap_core.engines.dispatch import default

    default().pool.clear()
    out = tmp_path_factory.mktemp("local")
    return run_sweep(request(tiny, out, order="snake")), out


@pytest.fixture(scope="session")
def ray_runtime():
    ray = pytest.importorskip("ray")
    # "local": a new runtime, never one a `ray start` left its address for in /tmp/ray
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


# --------------------------------------------------------------------------- grid and order
def test_grid_reads_any_numeric_knob_and_refuses_the_rest():
    assert parse_grid("b=3-5 u=0,1,2") == {"bottom": [3, 4, 5], "top": [0, 1, 2]}
    assert parse_grid(["transition=0-4:2", "w_task=0.25,1"]) == \
        {"transition": [0, 2, 4], "w_task": [0.25, 1.0]}
    assert parse_grid("lambda_task=-1,0.5", "task_arithmetic") == {"lambda_task": [-1.0, 0.5]}
    for spec, method, message in [
            ("depth=1,2", "layer_swap", "'depth' is not a numeric merge field"),
            ("bottom=1", "soup", "not a numeric knob of method soup"),
            ("non_layer=1", "layer_swap", "not a numeric knob"),
            ("bottom=1.5", "layer_swap", "'1.5' is not a non-negative integer"),
            ("w_task=-1", "layer_swap", "w_task: must be a number from 0"),
            ("ties_density=0", "ties", "ties_density: must be a number in (0, 1]"),
            ("bottom", "layer_swap", "is not FIELD=VALUES"),
            ("b=1 bottom=2", "layer_swap", "given twice"),
            ("transition=1 transition_top=2", "layer_swap", "given twice")]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                           .replace("[", r"\[")):
            parse_grid(spec, method)


def test_impossible_cells_are_set_aside_with_the_reason():
    from layerswap_core.merge.config import MergeConfig

    cells, impossible = expand({"bottom": [4, 6], "top": [1, 3]}, MergeConfig(), 8, True)
    assert [c.values for c in cells] == [{"bottom": 4, "top": 1}, {"bottom": 4, "top": 3},
                                         {"bottom": 6, "top": 1}]
    assert [c.values for c, _ in impossible] == [{"bottom": 6, "top": 3}]
    assert "exceeds the model's 8 layers" in impossible[0][1]
    with pytest.raises(ConfigError, match="need"):   # a problem of every cell is an error
        expand({"bottom": [1]}, MergeConfig(magnitude_weights=True), 8, False)


def test_snake_order_and_chunks():
    idx = [(i, j) for i in range(3) for j in range(3)]
    assert [idx[k] for k in snake(idx)] == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0),
                                            (2, 0), (2, 1), (2, 2)]
    cube = [(i, j, k) for i in range(2) for j in range(2) for k in range(2)]
    path = [cube[k] for k in snake(cube)]
    assert all(sum(abs(a - b) for a, b in zip(p, q)) == 1 for p, q in zip(path, path[1:]))
    assert chunks(list(range(9)), 2) == [[0, 1, 2, 3, 4], [5, 6, 7, 8]]
    assert chunks([1], 4) == [[1]]


def test_snake_order_rewrites_the_expected_number_of_tensors(local_run, tiny, tmp_path):
    """Counted writes (each configuration's ``LiveModel.show``) equal the plan-diff count, and
    both equal the count from the layout: moving b or u by one rewrites one layer's tensors."""
    from layerswap_core.checkpoints.architectures import get_architecture
    from layerswap_core.checkpoints.reading import CheckpointReader

    reader = CheckpointReader(tiny["task"])
    arch = get_architecture(reader.config())
    per_layer = sum(arch.classify(n).layer == 0 for n in reader.names())
    non_layer = sum(arch.classify(n).layer is None for n in reader.names())
    first = per_layer + non_layer       # b=1, u=0 after the task expert: layer 0, blends
    snake_cost = first + 8 * per_layer
    row_major_cost = first + 6 * per_layer + 2 * 3 * per_layer   # each new row undoes u=2
    outcome, _ = local_run
    assert [tuple(r["point"].values()) for r in outcome.results.values()] == \
        [(1, 0), (1, 1), (1, 2), (2, 2), (2, 1), (2, 0), (3, 0), (3, 1), (3, 2)]
    assert sum(r["rewritten"] for r in outcome.records()) == snake_cost
    assert outcome.order.costs["snake"] == snake_cost
    assert outcome.order.costs["row-major"] == row_major_cost
    assert outcome.order.costs["reloading"] == 9 * len(reader.names())
    auto = prepare(request(tiny, tmp_path))[2]       # auto: the cheaper of snake and nearest
    assert auto.name in ("snake", "nearest") and auto.costs[auto.name] <= snake_cost


def test_items_of_each_source_and_metric():
    from layerswap_core.sweeps.scoring import load_eval_items

    got = load_eval_items(EvalSettings("demo-variants", ("sw", "en"), 2, 1, "nll"))
    assert [len(v[0]) for v in got.values()] == [2, 2] and len(got["sw"][1]) == 1
    assert [i.id for i in got["sw"][0]] == [i.id for i in got["en"][0]]   # paired variants
    assert all(i.id.startswith("variant-validation-") for i in got["sw"][0])
    mgsm = load_eval_items(EvalSettings("mgsm", ("sw",), 3, 2, "accuracy"))["sw"]
    assert len(mgsm[0]) == 3 and len(mgsm[1]) == 2 and mgsm[0][0].source == "mgsm"
    with pytest.raises(ValueError, match="metric: one of accuracy, nll"):
        EvalSettings(metric="f1").check()


# --------------------------------------------------------------------------- resumable
def test_killed_sweep_reruns_without_rescoring(local_run, tiny, tmp_path):
    """--limit 2, then a run killed after 2 more (and a line cut short), then a rerun: each
    configuration is scored once, with the scores of an uninterrupted sweep."""
    first = run_sweep(request(tiny, tmp_path), limit=2)
    assert first.scored == 2 and not first.complete
    done = [r["key"] for r in lines(tmp_path)]

    def killed_after_two(record):
        done.append(record["key"])
        if len(done) == 4:
            raise KeyboardInterrupt   # as a kill would: nothing after it is written

    with pytest.raises(KeyboardInterrupt):
        run_sweep(request(tiny, tmp_path), on_result=killed_after_two)
    assert [r["key"] for r in lines(tmp_path)] == done
    with open(tmp_path / RESULTS_FILE, "a") as f:   # a line cut short by the kill
        f.write('{"key": "half a li')
    again = []
    outcome = run_sweep(request(tiny, tmp_path), on_result=lambda r: again.append(r["key"]))
    assert outcome.scored == 5 and outcome.reused == 4 and outcome.complete
    assert not set(again) & set(done)
    keys = [r["key"] for r in lines(tmp_path)]
    assert len(keys) == len(set(keys)) == 9
    assert scores(lines(tmp_path)) == scores(local_run[0].records())

    def stop(record):
        raise SweepStopped

    assert run_sweep(request(tiny, tmp_path), on_result=stop).scored == 0   # nothing left
    assert len(SweepStore(tmp_path).open()) == 9
    assert "bottom" in (tmp_path / "sweep.yaml").read_text()
    # other items or other settings are other keys: everything is scored again
    more = prepare(request(tiny, tmp_path, eval=EvalSettings(data="gsm-symbolic", n=3,
                                                             metric="nll")))[4]
    assert not set(more) & set(keys)


# --------------------------------------------------------------------------- Ray
def test_ray_gives_the_local_scores_and_loses_nothing_to_a_killed_worker(
        ray_runtime, local_run, tiny, tmp_path):
    """Two actors on the 3x3 grid; after the first result the other actor is killed
    (``ray.kill``) in the middle of its configuration. Every configuration is scored once,
    with the local backend's scores (float32, bit for bit)."""
    killed = []

    def kill_the_other(record):
        if killed:
            return
        me = record["worker"].split(" ")[0]
        other = next(a for a in ray_runtime.util.list_named_actors()
                     if a.startswith("layerswap-sweep-") and a != me)
        ray_runtime.kill(ray_runtime.get_actor(other))
        killed.append(other)

    outcome = run_sweep(request(tiny, tmp_path, backend="ray", backend_options={"workers": 2}),
                        on_result=kill_the_other)
    assert outcome.complete and outcome.scored == 9
    keys = [r["key"] for r in lines(tmp_path)]
    assert len(keys) == len(set(keys)) == 9
    assert scores(lines(tmp_path)) == scores(local_run[0].records())
    workers = {r["worker"].split(" ")[0] for r in lines(tmp_path)}
    assert all(w.startswith("layerswap-sweep-") for w in workers)
    by_killed = [r for r in lines(tmp_path) if r["worker"].startswith(killed[0])]
    assert len(by_killed) < 4      # its run was 4 configurations: the rest were done elsewhere
    assert not [a for a in ray_runtime.util.list_named_actors() if "layerswap-sweep" in a]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timing   # measures time or races a job (docs/development.md)
def test_cli_against_a_ray_head_in_another_process(ray_runtime, local_run, tiny, tmp_path):
    """`layerswap sweep --backend ray --address` against `ray start --head` (a two-process
    cluster on this machine); the score is the local one, found under the same key."""
    ray_bin = Path(sys.executable).parent / "ray"
    port = _free_port()
    # Ray 2.60 clusters started with `ray start` ask for a token; every process says so
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "token"}
    head = subprocess.Popen([str(ray_bin), "start", "--head", f"--port={port}", "--num-cpus=1",
                             "--include-dashboard=false", "--block"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(1)
        out = tmp_path / "sweep"
        res = subprocess.run(
            [sys.executable, "-m", "layerswap_core", "sweep", "--task", str(tiny["task"]),
             "--lang", str(tiny["lang"]), "--base", str(tiny["base"]),
             "--grid", "b=1,2", "u=0", "--limit", "1",
             "--metric", "nll", "--n", "2", "--langs", "sw", "--out", str(out),
             "--backend", "ray", "--address", f"127.0.0.1:{port}", "--workers", "1"],
            env=env, capture_output=True, text=True, timeout=240)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "best in sw (lowest gold NLL): bottom " in res.stdout
        got = lines(out)
        assert len(got) == 1 and all(r["worker"].startswith("layerswap-sweep-") for r in got)
        local = scores(local_run[0].records())
        assert all(local[r["key"]] == r["scores"] for r in got)
        assert (out / "heatmap.html").is_file() and (out / "sweep.yaml").is_file()
    finally:   # `ray start --block` stops its processes on SIGTERM; the group is ours anyway
        head.terminate()
        try:
            head.wait(timeout=60)
        finally:
            try:
                os.killpg(head.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_cli_errors_are_one_line(tiny, tmp_path, capsys):
    from layerswap_core.cli import main

    base = ["sweep", "--task", str(tiny["task"]), "--lang", str(tiny["lang"]),
            "--out", str(tmp_path), "--n", "1"]
    for extra, message in [(["--grid", "depth=1"], "'depth' is not a numeric merge field"),
                           (["--grid", "b=9", "u=0"], "no configuration of the grid fits"),
                           (["--grid", "b=1", "--metric", "nll", "--data", "mgsm"],
                            "gold NLL needs worked solutions")]:
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_nll_without_generating_is_the_one_token_paths_nll(tiny_lm, one_thread):
    """A cell's gold NLL, teacher-forced without generating (``runner.task_nll``), is float for
    float what the side-by-side evaluation reported after generating one token (the path
    before), per language and with its interval; one shot, so the prompts share a prefix."""
    from layerswap_core.evaluation.runner import run_side_by_side
    from layerswap_core.sweeps.scoring import load_eval_items, nll_interval, score_model

    model, tok = tiny_lm
    settings = EvalSettings(data="gsm-symbolic", langs=("sw", "en"), n=3, shots=1, metric="nll",
                            batch_size=4)
    eval_items = load_eval_items(settings)
    got = score_model(model, tok, eval_items, settings)
    for lang, (items, exemplars) in eval_items.items():
        old = run_side_by_side({"merged": (model, tok)}, items, exemplars=exemplars,
                               batch_size=4, with_nll=True, max_new_tokens=1)
        per_item = [r["models"]["merged"]["gold_nll"] for r in old.rows]
        assert got[lang] == {"n": 3, "nll": old.summary[0]["mean_gold_nll"],
                             "ci_low": nll_interval(per_item)[0],
                             "ci_high": nll_interval(per_item)[1]}
    assert got["sw"]["nll"] != got["en"]["nll"]   # the languages' own prompts and solutions


def test_when_every_configuration_ties_none_is_called_best():
    """Four configurations all at accuracy 0: the CLI says no configuration is better, the
    app's sweep result has no best; one better configuration is named."""
    from layerswap_core.sweeps import report
    from layerswap_core.workbench.sweep import SweepResult

    def record(b, acc):
        return {"point": {"bottom": b}, "scores": {"sw": {"accuracy": acc, "correct": 0, "n": 4,
                                                          "ci_low": 0.0, "ci_high": 0.49}}}
    zeros = [record(b, 0.0) for b in range(4)]
    assert report.best(zeros, "sw", "accuracy") is None
    assert report.best_lines(zeros, ["sw"], "accuracy") == [
        "no configuration is better in sw: all 4 score 0.0%"]
    one = zeros[:3] + [record(3, 0.25)]
    assert report.best_lines(one, ["sw"], "accuracy")[0].startswith("best in sw (highest accuracy): bottom 3")
    res = SweepResult(("bottom", "top"), [0, 1], [0, 1], [[0.0, 0.0], [0.0, 0.0]], "accuracy",
                      None, [[0, 0, 0.0], [1, 0, 0.0], [0, 1, 0.0], [1, 1, 0.0]])
    assert res.tied and res.best is None
    res.rows[3][2] = 0.25
    res.rows.sort(key=lambda r: -r[2])
    assert not res.tied and res.best == [1, 1, 0.25]


def test_backends_are_records_with_their_own_options(tiny, tmp_path):
    """A backend is one record in one mapping, its options checked against its own dataclass;
    a toy backend registered here scores a sweep with no change elsewhere."""
    from dataclasses import dataclass

    from layerswap_core.sweeps import backends
    from layerswap_core.sweeps.scoring import SweepWorker

    assert {"local", "ray"} <= set(backends.BACKENDS)
    with pytest.raises(ValueError, match="backend local: no option workers"):
        run_sweep(request(tiny, tmp_path / "a", backend_options={"workers": 2}))
    with pytest.raises(ValueError, match="backend: one of"):
        run_sweep(request(tiny, tmp_path / "b", backend="nowhere"))

    @dataclass(frozen=True)
    class Toy:
        tag: str = "toy"

    seen = []

    def run(jobs, worker_args, handle, options, *, checkout=None, progress=None):
        worker = SweepWorker(**worker_args)
        for job in jobs:
            seen.append(options.tag)
            handle(worker.run(job))

    backends.register_backend(backends.Backend("toy", "a test's own", Toy, run))
    try:
        out = run_sweep(request(tiny, tmp_path / "c", backend="toy",
                                backend_options={"tag": "mine"}))
    finally:
        backends.BACKENDS.pop("toy")
    assert out.complete and seen == ["mine"] * len(out.records())
