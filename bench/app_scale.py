"""The app at the size users bring: memory and time of the real app path on a synthetic trio.

    python bench/app_scale.py [--params 1e9] [--dir DIR] [--keep] [--json OUT.json]

Writes a synthetic Llama-shaped trio (bf16, sharded; base, and task / lang = base + noise) with
bench/synthetic.py and the embedded SmolLM2 tokenizer (so prompts are real), launches ``app.py``
on it in its own process, and drives the endpoints with gradio_client as a visitor would:
open (pick_models), analyse deltas, build the default layer swap, rebuild with one more
transition layer, evaluate 4 questions side by side on all four roles, one chat turn.
While each step runs, the server's /proc/PID/status is sampled every 50 ms: anonymous resident
memory (RssAnon: what the process owns) and file-backed resident memory (RssFile: mapped
checkpoint pages, page cache the OS can reclaim) apart. Per step it prints wall time and the
peaks of both divided by one checkpoint's size. Then, in this process, the live model's opening
and its role switches against a `cat` of the same files (``measure_switching``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def rss(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0]) * 1024
    return out


class Sampler:
    """Peak RssAnon / RssFile of one process while a step runs (every 50 ms)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.peak = {"RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                now = rss(self.pid)
            except OSError:
                return
            for k in self.peak:
                self.peak[k] = max(self.peak[k], now.get(k, 0))
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def write_model(path: Path, params: float, *, seed: int = 0, like: Path | None = None,
                tokenizer: Path | None = None, label: str = "model") -> Path:
    """A synthetic Llama of about ``params`` parameters at ``path`` (kept if already there;
    ``like``: near that checkpoint) with the SmolLM2 tokenizer (from ``tokenizer``, a folder,
    else the embedded base), so prompts and chat are real text."""
    from synthetic import llama_config_for, write_checkpoint

    from layerswap_core.checkpoints.references import DEFAULT_BASE, resolve
    from layerswap_core.testing import copy_tokenizer

    if not (path / "config.json").exists():
        cfg = llama_config_for(params)
        cfg["vocab_size"] = 49152   # the SmolLM2 tokenizer's
        print(f"writing the synthetic {label} ({params / 1e9:.1f}B)...", flush=True)
        write_checkpoint(path, cfg, seed=seed, like=like, delta=0.01, tokenizer=False)
    copy_tokenizer(tokenizer or resolve(DEFAULT_BASE), path)
    return path


def write_trio(folder: Path, params: float, tokenizer: Path | None = None) -> dict[str, Path]:
    """A synthetic Llama trio (``write_model``): base, and task and language experts near it."""
    return {role: write_model(folder / role, params, seed=seed, tokenizer=tokenizer, label=role,
                              like=None if role == "base" else folder / "base")
            for role, seed in (("base", 0), ("task", 1), ("lang", 2))}


def call(client, api_name: str, values: dict):
    """Call an endpoint by its parameters' labels (or names); the others keep their defaults."""
    info = client.view_api(return_format="dict", print_info=False)["named_endpoints"][api_name]
    args = []
    for p in info["parameters"]:
        keys = {p.get("parameter_name"), p.get("label")}
        hit = next((values[k] for k in keys if k in values), None)
        if hit is None:
            hit = p.get("parameter_default")
        args.append(hit)
    return client.predict(*args, api_name=api_name)


def _cat_seconds(files) -> float:
    t = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def measure_switching(paths: dict[str, Path], repeat: int = 3) -> dict:
    """In this process (the server is gone): opening the live model (transformers builds it, then
    it reads the task expert into its own memory) and switching it lang -> base -> task,
    ``repeat`` times, seconds against a `cat` of the same files just before (the faster of two
    cats: the first brings the files into the page cache, so both read from memory). Medians,
    and the range of the ratios: other processes on a shared machine move single figures."""
    import statistics

    from layerswap_core.merge.live import LiveModel, ROLES

    files = {role: sorted(paths[role].glob("*.safetensors")) for role in ROLES}
    cat_s = min(_cat_seconds(files["task"]) for _ in range(2))
    t = time.perf_counter()
    live = LiveModel.from_refs(paths["task"], paths["lang"], paths["base"])
    open_s = time.perf_counter() - t
    read = live.opened
    out = {"open": {"seconds": round(open_s, 2), "read_tensors": read.rewritten,
                    "gib": round(read.nbytes / 2**30, 2), "read_s": round(read.seconds, 2),
                    "cat_s": round(cat_s, 2),
                    "read_ratio": round(read.seconds / max(cat_s, 1e-9), 1)}}
    runs: dict[str, list[tuple[float, float]]] = {}
    for _ in range(repeat):
        for role in ("lang", "base", "task"):
            cat_s = min(_cat_seconds(files[role]) for _ in range(2))
            shown = live.show(role)
            runs.setdefault(role, []).append((shown.seconds, cat_s))
            out[f"to {role}"] = {"tensors": shown.rewritten, "gib": round(shown.nbytes / 2**30, 2)}
    for role, pairs in runs.items():
        ratios = [s / max(c, 1e-9) for s, c in pairs]
        out[f"to {role}"].update(
            seconds=round(statistics.median(s for s, _ in pairs), 2),
            cat_s=round(statistics.median(c for _, c in pairs), 2),
            ratio=round(statistics.median(ratios), 1),
            ratio_range=f"{min(ratios):.1f}-{max(ratios):.1f}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=float, default=1e9)
    ap.add_argument("--dir", type=Path, help="where the trio is written (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the trio afterwards")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--port", type=int, default=7873)
    ap.add_argument("--switching-only", action="store_true",
                    help="only the live model's opening and role switches (no app)")
    a = ap.parse_args(argv)
    folder = a.dir or Path(tempfile.mkdtemp(prefix="layerswap-scale-", dir="/tmp"))
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    paths = write_trio(folder, a.params)
    print(f"trio ready in {time.perf_counter() - t0:.0f} s: {folder}", flush=True)
    if a.switching_only:
        print(json.dumps(measure_switching(paths), indent=1))
        return 0
    ckpt = sum(f.stat().st_size for f in paths["task"].glob("*.safetensors"))

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LAYERSWAP_SERVED": "0",
           "GRADIO_ANALYTICS_ENABLED": "False"}
    cmd = [sys.executable, str(ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(a.port),
           "--base", str(paths["base"]), "--task", str(paths["task"]), "--lang", str(paths["lang"])]
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    rows = []
    try:
        from gradio_client import Client

        url = f"http://127.0.0.1:{a.port}/"
        for _ in range(600):
            try:
                client = Client(url, verbose=False)
                break
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.5)
        else:
            raise RuntimeError("the app did not start")
        ref = {k: str(v) for k, v in paths.items()}
        steps = [
            ("open", "/pick_models", {"Base model": ref["base"], "Task expert (math)": ref["task"],
                                      "Language expert": ref["lang"]}),
            ("analyse", "/analyze", {}),
            ("build", "/build", {}),
            ("rebuild +1 transition", "/build", {"Transition t_b (blended)": 1}),
            ("evaluate 4 x 4 roles", "/evaluate", {"Data": "gsm-symbolic", "Language": "sw",
                                                   "Questions": 4, "Shots": 0,
                                                   "Max new tokens": 8}),
            ("chat (2 panes)", "/chat", {"param_1": "Juma ana maembe 12. Anampa dada yake 5.",
                                         "Max new tokens": 16}),
        ]
        for label, api, values in steps:
            with Sampler(server.pid) as s:
                t = time.perf_counter()
                out = call(client, api, values)
                wall = time.perf_counter() - t
            status = out[0] if isinstance(out, (list, tuple)) else out
            row = {"step": label, "wall_s": round(wall, 2),
                   "anon_x": round(s.peak["RssAnon"] / ckpt, 2),
                   "file_x": round(s.peak["RssFile"] / ckpt, 2),
                   "status": str(status)[:160]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    switching = measure_switching(paths)
    print(json.dumps(switching), flush=True)
    result = {"params": a.params, "checkpoint_bytes": ckpt, "steps": rows,
              "switching": switching, "date": time.strftime("%Y-%m-%d"),
              "machine": f"{os.cpu_count()} CPUs, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"}
    print(json.dumps(result, indent=1))
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    if not a.keep and a.dir is None:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
