"""ZeroGPU, emulated offline with the real ``spaces`` package, running the app's real jobs.

    python tests/zerogpu_harness.py BASE TASK LANG OUT.json

Run in a process of its own (``spaces`` patches torch in the process that imports it). What is
emulated, and nothing more: the device API (a loopback HTTP server answering ``POST /schedule``
with an idle GPU and 200 to ``/allow``, ``/release`` and ``/startup-report``) and, on a CPU-only
torch, the few CUDA calls the package makes (``torch.version.cuda``, ``torch._C._cuda_init``,
``torch.cuda._is_in_bad_fork`` made picklable, ``spaces.zero.torch.init``/``move`` on the CPU).
The fork, the pickling of the jobs and results, the worker and its reuse are the package's own
code. Engines in the worker are on the CPU (``LAYERSWAP_ZERO_DEVICE=cpu``).

Writes JSON: the outputs of a build, an evaluation and a chat through the ZeroGPU dispatcher;
the worker's pid for each call; whether the main process's preloaded engine kept its weights;
the device API calls seen.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CALLS: list[str] = []
SCHEDULE = {"idle": True, "nvidiaIndex": 0, "nvidiaUUID": "GPU-fake", "allowToken": "t"}


class DeviceAPI(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        CALLS.append(path)
        body = json.dumps(SCHEDULE).encode() if path == "/schedule" else b""
        self.send_response(200 if path in ("/schedule", "/allow", "/release", "/startup-report")
                           else 404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _not_in_bad_fork() -> bool:
    return False


def emulate() -> None:
    """Start the device API and import ``spaces`` as on a ZeroGPU Space, with CPU shims."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), DeviceAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ.update(SPACES_ZERO_GPU="true", LAYERSWAP_ZERO_DEVICE="cpu",
                      SPACES_ZERO_DEVICE_API_URL=f"http://127.0.0.1:{server.server_port}/")
    import torch

    if torch.version.cuda is None:
        torch.version.cuda = "12.4"
    torch._C._cuda_init = lambda: None
    torch.cuda._is_in_bad_fork = _not_in_bad_fork
    import spaces  # noqa: F401 - patches torch as on a Space
    import spaces.zero.torch as zero_torch

    zero_torch.init = lambda nvidia_uuid: None
    zero_torch.move = lambda callback=None: None


def weights_digest(model) -> str:
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().float().numpy().tobytes())
    return h.hexdigest()


def main(base: str, task: str, lang: str, out: str) -> None:
    emulate()
    from layerswap_core.engines import dispatch
    from layerswap_core.workbench import build as wb_build
    from layerswap_core.workbench import configure as wb_configure
    from layerswap_core.workbench import models as wb_models
    from layerswap_core.workbench import spaces as ws
    from layerswap_core.workbench.chat import chat_turn
    from layerswap_core.workbench.evaluate import evaluate_roles

    assert dispatch.default().placement == "zerogpu"
    line = ws.start({"base": base, "task": task, "lang": lang})     # preload in this process
    (main_engine,) = dispatch._ZERO_POOL.engines
    before = weights_digest(main_engine.live.model)
    session, report = wb_models.open_session(base, task, lang)
    assert report.ok, report.problems
    cfg = wb_configure.make_config(session, "layer swap", 2, 1)
    build = wb_build.build(session, cfg)
    evals = [evaluate_roles(session, "gsm-symbolic", "sw", 2, 0, False, ("base", "merged"), 8)
             for _ in range(2)]
    chat = list(chat_turn(session, "Habari?", [], "merged", max_new_tokens=12))[-1]
    pids = [dispatch.default().run(session.job("show", cfg.to_dict()))["pid"] for _ in range(2)]
    json.dump({"line": line, "changed": build.changed, "total": build.total,
               "evaluations": [e.raw.rows for e in evals],
               "summaries": [e.raw.summary for e in evals],
               "chat": chat.history[-1]["content"], "stopped": chat.stopped,
               "pids": pids, "main_pid": os.getpid(),
               "main_weights_unchanged": weights_digest(main_engine.live.model) == before,
               "calls": CALLS}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:5])
