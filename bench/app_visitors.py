"""Many visitors on the served app: the server's memory per visitor, and a victim's wait.

    python bench/app_visitors.py [--visitors 1,4,12,24] [--victim] [--baseline ROOT]
                                 [--json OUT.json]

Launches ``app.py`` (served mode, the embedded demo) in its own process and drives it over HTTP
with ``gradio_client``, one client (one session) per scripted visitor:

* **visitors**: for each N, N visitors at once each pick the demo models, build their own layer
  swap (bottom = 1 + i mod 6, top = i mod 3) and evaluate one question (merged model, 0-shot,
  16 tokens). The server's peak anonymous memory (RssAnon, sampled every 50 ms) per step,
  divided by one checkpoint's size, and the wall time. Target: from 1 to 24 visitors, anonymous
  memory grows by less than one checkpoint.
* ``--victim``: two visitors start evaluations at the served caps (20 questions, 8 shots, 256
  tokens, 4 models); a third then picks and builds: its Build latency (target < 10 s).
* ``--crowd evaluations,reproduce,chats``: each on a fresh server, at the page's caps and the
  default job budget: (a) two visitors evaluate at the caps (20 questions, 8 shots, 256 tokens,
  4 models; where the server refuses that as over its budget, the most questions it accepts:
  what the page's sliders then allow), (b) one visitor reruns the demo result at its slider's
  maximum, (c) five visitors chat at once (256-token answers); while they run, a new visitor
  picks the demo models and builds a swap, then another, three in turn: their pick + build
  times (target <= 10 s each), with the machine's load average and how many of the heavy jobs
  were still running.
* ``--baseline ROOT``: one visitor's evaluation timed against another checkout's app (e.g. the
  code before this change) in the same run (target: within 10%).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from app_scale import Sampler, call  # noqa: E402


def start_server(root: Path, port: int, env_extra: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LAYERSWAP_SERVED": "1",
           "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(root), **(env_extra or {})}
    return subprocess.Popen([sys.executable, str(root / "app.py"), "--host", "127.0.0.1",
                             "--port", str(port)], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


_ADDRESSES = itertools.count(1)


def connect(url: str, tries: int = 600, address: str | None = None):
    """A new visitor: a gradio client (one page session) from its own client address
    (``address``, else a new one, sent as X-Forwarded-For as the Space's proxy does: the server
    budgets anonymous visitors per address, and every scripted visitor is a person)."""
    from gradio_client import Client

    n = next(_ADDRESSES)
    headers = {"x-forwarded-for": address or f"198.18.{n // 250}.{n % 250 + 1}"}
    for _ in range(tries):
        try:
            return Client(url, verbose=False, headers=headers)
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.5)
    raise RuntimeError(f"the app at {url} did not start")


def checkpoint_bytes() -> int:
    from layerswap_core.checkpoints.references import DEFAULT_BASE, resolve
    return sum(f.stat().st_size for f in Path(resolve(DEFAULT_BASE)).glob("*.safetensors"))


def status(out) -> str:
    return str(out[0] if isinstance(out, (list, tuple)) else out)[:200]


def visitor(url: str, i: int, times: dict) -> list[str]:
    """One scripted visitor: pick, build their own swap, evaluate one question."""
    client = connect(url)
    outs = []
    for step, api, values in (
            ("pick", "/pick_models", {}),
            ("build", "/build", {"Bottom layers b (language)": 1 + i % 6, "Top layers u (language)": i % 3}),
            ("evaluate", "/evaluate", {"Data": "gsm-symbolic", "Language": "sw", "Questions": 1,
                                       "Shots": 0, "Models": ["merged"],
                                       "Max new tokens": 16})):
        t = time.perf_counter()
        outs.append(status(call(client, api, values)))
        times.setdefault(step, []).append(time.perf_counter() - t)
    return outs


def run_visitors(url: str, pid: int, n: int, ckpt: int) -> dict:
    times: dict[str, list[float]] = {}
    with Sampler(pid) as s, ThreadPoolExecutor(n) as pool:
        t = time.perf_counter()
        outs = list(pool.map(lambda i: visitor(url, i, times), range(n)))
        wall = time.perf_counter() - t
    failed = [o for vis in outs for o in vis if o.startswith("⚠")]
    return {"visitors": n, "wall_s": round(wall, 1),
            "anon_gib": round(s.peak["RssAnon"] / 2**30, 2),
            "anon_x_checkpoint": round(s.peak["RssAnon"] / ckpt, 2),
            **{f"{k}_s_max": round(max(v), 2) for k, v in times.items()},
            "errors": failed[:3], "n_errors": len(failed)}


def victim(url: str) -> dict:
    """Two evaluations at the caps hold the engine; a third visitor's Build latency."""
    heavy = []
    for _ in range(2):
        c = connect(url)
        call(c, "/pick_models", {})
        call(c, "/build", {})
        info = c.view_api(return_format="dict", print_info=False)["named_endpoints"]["/evaluate"]
        values = {"Data": "mgsm", "Language": "sw", "Questions": 20, "Shots": 8,
                  "Max new tokens": 256}
        args = [next((values[k] for k in (p.get("label"), p.get("parameter_name")) if k in values),
                     p.get("parameter_default")) for p in info["parameters"]]
        heavy.append(c.submit(*args, api_name="/evaluate"))
    time.sleep(20)                       # both evaluations are generating
    v = connect(url)
    t = time.perf_counter()
    call(v, "/pick_models", {})
    pick = time.perf_counter() - t
    t = time.perf_counter()
    out = status(call(v, "/build", {"Bottom layers b (language)": 3, "Top layers u (language)": 1}))
    build = time.perf_counter() - t
    running = sum(not h.done() for h in heavy)
    said = [status(h.result()) if h.done() else str(h.status().code) for h in heavy]
    return {"victim_pick_s": round(pick, 2), "victim_build_s": round(build, 2),
            "build_status": out[:120], "evaluations_still_running": running,
            "evaluations": [s[:160] for s in said]}


def _args(client, api: str, values: dict) -> list:
    """The endpoint's arguments: ``values`` by label, label start or parameter name."""
    info = client.view_api(return_format="dict", print_info=False)["named_endpoints"][api]
    out = []
    for p in info["parameters"]:
        names = [str(p.get("label") or ""), str(p.get("parameter_name") or "")]
        hit = next((v for k, v in values.items() if any(n == k or (n and n.startswith(k))
                                                         for n in names)), None)
        out.append(p.get("parameter_default") if hit is None else hit)
    return out


def _refused(job, wait: float = 8.0) -> str | None:
    """The one-line refusal of a submitted job that ended within ``wait`` s (None: running)."""
    t = time.monotonic()
    while time.monotonic() - t < wait:
        if job.done():
            out = status(job.result())
            return out if "⚠" in out else None
        time.sleep(0.5)
    return None


def _ready(url: str, build: bool = True):
    c = connect(url)
    call(c, "/pick_models", {})
    if build:
        call(c, "/build", {})
    return c


def start_evaluations(url: str, n: int = 2) -> tuple[list, dict]:
    """``n`` visitors evaluating at the caps (fewer questions where the budget refuses them)."""
    jobs, asked = [], {}
    for _ in range(n):
        c = _ready(url)
        for q in (20, 16, 12, 10, 8, 6, 5, 4, 3, 2, 1):
            values = {"Data": "mgsm", "Language": "sw", "Questions": q, "Shots": 8,
                      "Max new tokens": 256}
            job = c.submit(*_args(c, "/evaluate", values), api_name="/evaluate")
            said = _refused(job)
            if said is None:
                jobs.append(job)
                asked.setdefault("questions", []).append(q)
                break
            asked.setdefault("refused", []).append(f"{q}: {said[:100]}")
    return jobs, asked


def start_reproduce(url: str) -> tuple[list, dict]:
    from layerswap_core.workbench.served import LIMITS

    c = _ready(url, build=False)
    n = LIMITS.eval_questions
    job = c.submit(*_args(c, "/demo_result", {"Held-out variants": n}), api_name="/demo_result")
    said = _refused(job, 3.0)
    return ([] if said else [job]), {"variants": n, **({"refused": said} if said else {})}


def start_chats(url: str, n: int = 5) -> tuple[list, dict]:
    clients = [_ready(url) for _ in range(n)]
    jobs = [c.submit(*_args(c, "/chat", {"param_1": "Andika hadithi ndefu kuhusu simba na "
                                                    f"sungura namba {i}.", "Max new tokens": 256}),
                     api_name="/chat") for i, c in enumerate(clients)]
    return jobs, {"chats": n, "max_new_tokens": 256}


SCENARIOS = {"evaluations": start_evaluations, "reproduce": start_reproduce, "chats": start_chats}


def crowd(name: str, port: int, root: Path = ROOT, newcomers: int = 3) -> dict:
    """One scenario on a fresh server (the app of checkout ``root``): the heavy visitors start,
    then a newcomer's pick + build."""
    server = start_server(root, port)
    url = f"http://127.0.0.1:{port}/"
    try:
        connect(url)
        jobs, asked = SCENARIOS[name](url)
        time.sleep(10 if name == "chats" else 20)     # the jobs are generating
        running_before = sum(not j.done() for j in jobs)
        load = os.getloadavg()[0]
        rows = []
        for k in range(newcomers):   # new visitors one after another, while the jobs run
            v = connect(url)
            t = time.perf_counter()
            call(v, "/pick_models", {})
            pick = time.perf_counter() - t
            t = time.perf_counter()
            out = status(call(v, "/build", {"Bottom layers b (language)": 1 + k % 5,
                                            "Top layers u (language)": 1}))
            rows.append((pick, time.perf_counter() - t, out))
            time.sleep(5)
        total = [p + b for p, b, _ in rows]
        return {"scenario": name, **asked, "heavy_running_at_start": running_before,
                "heavy_running_after": sum(not j.done() for j in jobs),
                "newcomer_pick_s": [round(p, 2) for p, _, _ in rows],
                "newcomer_build_s": [round(b, 2) for _, b, _ in rows],
                "newcomer_pick_build_s_max": round(max(total), 2),
                "build_status": rows[-1][2][:100],
                "load_1min": round(load, 2), "load_1min_after": round(os.getloadavg()[0], 2)}
    finally:
        server.terminate()
        server.wait(timeout=60)


def one_evaluation(root: Path, port: int) -> float:
    server = start_server(root, port)
    try:
        client = connect(f"http://127.0.0.1:{port}/")
        call(client, "/pick_models", {})
        call(client, "/build", {})
        t = time.perf_counter()
        call(client, "/evaluate", {"Data": "gsm-symbolic", "Language": "sw", "Questions": 4,
                                   "Shots": 0, "Models": ["merged"], "Max new tokens": 32})
        return time.perf_counter() - t
    finally:
        server.terminate()
        server.wait(timeout=60)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--visitors", default="1,4,12,24")
    ap.add_argument("--victim", action="store_true")
    ap.add_argument("--crowd", default="", help="scenarios: evaluations,reproduce,chats")
    ap.add_argument("--server-root", type=Path, default=ROOT,
                    help="the checkout whose app the crowd scenarios run (e.g. an older one)")
    ap.add_argument("--baseline", type=Path, help="another checkout to time one evaluation on")
    ap.add_argument("--port", type=int, default=7881)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    ckpt = checkpoint_bytes()
    result = {"checkpoint_gib": round(ckpt / 2**30, 3), "steps": [],
              "machine": f"{os.cpu_count()} CPUs", "date": time.strftime("%Y-%m-%d %H:%M")}
    for i, name in enumerate(x for x in a.crowd.split(",") if x.strip()):
        row = crowd(name.strip(), a.port + 10 + i, a.server_root.resolve())
        result.setdefault("crowd", []).append(row)
        print(json.dumps(row), flush=True)
    if not a.visitors.strip() and not a.victim and not a.baseline:
        print(json.dumps(result, indent=1))
        if a.json:
            a.json.write_text(json.dumps(result, indent=1))
        return 0
    server = start_server(ROOT, a.port)
    url = f"http://127.0.0.1:{a.port}/"
    try:
        connect(url)
        for n in [int(x) for x in a.visitors.split(",") if x.strip()]:
            row = run_visitors(url, server.pid, n, ckpt)
            result["steps"].append(row)
            print(json.dumps(row), flush=True)
        if a.victim:
            result["victim"] = victim(url)
            print(json.dumps(result["victim"]), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    if result["steps"]:
        first, last = result["steps"][0], result["steps"][-1]
        result["anon_growth_x_checkpoint"] = round(last["anon_x_checkpoint"]
                                                   - first["anon_x_checkpoint"], 2)
    if a.baseline:
        mine = one_evaluation(ROOT, a.port + 1)
        theirs = one_evaluation(a.baseline.resolve(), a.port + 2)
        result["one_evaluation"] = {"this_s": round(mine, 1), "baseline_s": round(theirs, 1),
                                    "ratio": round(mine / theirs, 2)}
        print(json.dumps(result["one_evaluation"]), flush=True)
    print(json.dumps(result, indent=1))
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    threading.stack_size(8 << 20)
    sys.exit(main())
