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
* ``--baseline ROOT``: one visitor's evaluation timed against another checkout's app (e.g. the
  code before this change) in the same run (target: within 10%).
"""
from __future__ import annotations

import argparse
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


def connect(url: str, tries: int = 600):
    from gradio_client import Client

    for _ in range(tries):
        try:
            return Client(url, verbose=False)
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
    ap.add_argument("--baseline", type=Path, help="another checkout to time one evaluation on")
    ap.add_argument("--port", type=int, default=7881)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    ckpt = checkpoint_bytes()
    result = {"checkpoint_gib": round(ckpt / 2**30, 3), "steps": [],
              "machine": f"{os.cpu_count()} CPUs", "date": time.strftime("%Y-%m-%d %H:%M")}
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
