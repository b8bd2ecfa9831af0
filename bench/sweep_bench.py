"""Sweep cost on a synthetic 1.1B trio: tensors rewritten per order, seconds per configuration,
and Ray with 2 workers against the local backend with 1, on this machine.

    python bench/sweep_bench.py [--params 1.1e9] [--timed "bottom=3,4,5 top=0,1,2"] [--n 1]
                                [--keep DIR] [--reuse DIR] [--json OUT]

1. Writes a random bf16 Llama trio with bench/synthetic.py (base; task and lang = base + noise;
   the vocabulary widened to the embedded SmolLM2 tokenizer's, whose files are copied in so that
   the items can be tokenised). Deleted afterwards unless --keep; --reuse DIR skips writing.
2. Counts, on the full 9x9 (b, u) grid (b, u in 0..8), the tensors a live model rewrites in
   snake order, nearest-neighbour order and row-major order, and by reloading (every tensor for
   every configuration): plan differences only, no tensors read.
3. Shows the 81 configurations on one engine (live model, no evaluation), in snake and in
   row-major order: seconds per configuration and tensors rewritten (counted by the engine),
   against reloading (the time to open a fresh engine, which every configuration would pay).
4. Times a sweep of the ``--timed`` grid with a tiny evaluation per configuration (``--n``
   GSM-Symbolic Swahili items, gold NLL, 0 shots): a reduced grid (default 2 configurations),
   as one gold-NLL forward pass of a 1.1B bf16 model takes tens of seconds on this AVX2-only
   2-core CPU:
   a. local backend, 1 worker (torch on every core), snake order;
   b. Ray (a local runtime started here, 2 CPUs) with 2 workers of 1 CPU each, the same grid:
      wall time and its ratio to (a), with /proc/loadavg before and after each run.
Everything runs on the CPU: nothing here ran on a GPU or on more than one node.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ")[0]


def order_costs(refs) -> dict:
    from layerswap_core.merge.config import MergeConfig
    from layerswap_core.merge.executor import open_inputs
    from layerswap_core.merge.live import role_plan
    from layerswap_core.merge.plan import build_plan
    from layerswap_core.sweeps.grid import expand, parse_grid
    from layerswap_core.sweeps.order import choose_order, plan_codes

    inputs = open_inputs(refs["task"], refs["lang"], refs["base"])
    grid = parse_grid("bottom=0-8 top=0-8")
    cells, impossible = expand(grid, MergeConfig(), inputs.arch.num_layers, True)
    plans = [build_plan(c.config, inputs.names, inputs.arch) for c in cells]
    codes, start = plan_codes(plans, role_plan("task", list(inputs.names), inputs.arch))
    rep = choose_order(codes, [c.index for c in cells], "auto", start)
    return {"grid": "bottom=0-8 top=0-8", "configurations": len(cells),
            "impossible": len(impossible), "layers": inputs.arch.num_layers,
            "tensors_per_model": rep.tensors, "chosen": rep.name, **rep.costs}


def timed_sweep(refs, grid: str, n: int, out: Path, **kw) -> dict:
    from layerswap_core.sweeps.grid import parse_grid
    from layerswap_core.sweeps.runner import run_sweep, sweep_request
    from layerswap_core.sweeps.scoring import EvalSettings

    stamps = []
    req = sweep_request(refs["task"], refs["lang"], parse_grid(grid), base=refs["base"],
                        eval=EvalSettings("gsm-symbolic", ("sw",), n, 0, "nll"), out=str(out),
                        order="snake", **kw)
    before = loadavg()
    t0 = time.perf_counter()
    outcome = run_sweep(req, on_result=lambda r: stamps.append(time.perf_counter()))
    wall = time.perf_counter() - t0
    recs = outcome.records()
    per = sorted(r["seconds"] for r in recs)
    return {"backend": kw.get("backend", "local"),
            "workers": kw.get("backend_options", {}).get("workers", 1),
            "configurations": len(recs), "wall_s": round(wall, 1),
            "first_result_s": round(stamps[0] - t0, 1),
            "after_first_s": round(stamps[-1] - stamps[0], 1),
            "median_config_s": per[len(per) // 2], "first_config_s": recs[0]["seconds"],
            "tensors_rewritten": sum(r["rewritten"] for r in recs),
            "planned_rewrites": outcome.order.workers_cost,
            "scores": {r["key"]: r["scores"]["sw"]["nll"] for r in recs},
            "load_before": before, "load_after": loadavg()}


def show_timing(refs) -> dict:
    """Every cell of the 9x9 grid shown on one engine, in snake and row-major order."""
    from layerswap_core.merge.config import MergeConfig
    from layerswap_core.sweeps.grid import expand, parse_grid
    from layerswap_core.sweeps.order import snake
    from layerswap_core.engines.pool import Engine
    from layerswap_core.sweeps.scoring import trio_for

    t0 = time.perf_counter()
    engine = Engine(trio_for({k: str(v) for k, v in refs.items()}, "cpu")).live
    out = {"open_engine_s": round(time.perf_counter() - t0, 1), "load_before": loadavg()}
    cells, _ = expand(parse_grid("bottom=0-8 top=0-8"), MergeConfig(), engine.arch.num_layers,
                      True)
    for name, order in (("snake", snake([c.index for c in cells])),
                        ("row-major", list(range(len(cells))))):
        engine.show("task")
        t0, rewritten = time.perf_counter(), 0
        for k in order:
            rewritten += engine.show(cells[k].config).rewritten
        seconds = time.perf_counter() - t0
        out[name] = {"tensors_rewritten": rewritten, "seconds": round(seconds, 1),
                     "per_config_s": round(seconds / len(order), 3)}
    out["load_after"] = loadavg()
    del engine
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params", type=float, default=1.1e9)
    p.add_argument("--timed", default="bottom=3,4 top=0")
    p.add_argument("--n", type=int, default=1, help="items scored per configuration")
    p.add_argument("--keep", type=Path, help="write the trio here and keep it")
    p.add_argument("--reuse", type=Path, help="a trio written before with --keep")
    p.add_argument("--no-ray", action="store_true")
    p.add_argument("--local-from", type=Path,
                   help="take the local run from this earlier --json (time the Ray run only)")
    p.add_argument("--skip-shows", action="store_true", help="skip steps 2 and 3")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tmp = None
    if a.reuse:
        refs = {r: a.reuse / r for r in ("base", "task", "lang")}
    else:
        root = a.keep or Path(tempfile.mkdtemp(prefix="sweep_bench_", dir="/tmp"))
        tmp = None if a.keep else root
        t0 = time.perf_counter()
        from app_scale import write_trio   # the synthetic trio every scale bench uses
        refs = write_trio(root, a.params)
        print(f"wrote the trio in {time.perf_counter() - t0:.0f} s under {root}", flush=True)
    try:
        report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  "cpus": os.cpu_count(), "params": a.params, "timed_grid": a.timed, "n": a.n}
        def save():   # after every stage: a run cut short keeps what it measured
            if a.json:
                a.json.write_text(json.dumps(report, indent=1))

        if not a.skip_shows:
            report["orders"] = order_costs(refs)
            print(json.dumps(report["orders"]), flush=True)
            report["shows"] = show_timing(refs)
            save()
            print(json.dumps(report["shows"]), flush=True)
        with tempfile.TemporaryDirectory(dir="/tmp") as d:
            if a.local_from:
                report["local"] = json.loads(a.local_from.read_text())["local"]
                report["local"]["from"] = str(a.local_from)
            else:
                report["local"] = timed_sweep(refs, a.timed, a.n, Path(d) / "local")
            save()
            print(json.dumps({k: v for k, v in report["local"].items() if k != "scores"}),
                  flush=True)
            if not a.no_ray:
                import ray
                ray.init(address="local", num_cpus=2, include_dashboard=False,
                         log_to_driver=False)
                try:
                    report["ray"] = timed_sweep(refs, a.timed, a.n, Path(d) / "ray",
                                                backend="ray", backend_options=dict(workers=2, cpus_per_worker=1))
                finally:
                    ray.shutdown()
                r, loc = report["ray"], report["local"]
                report["same_scores"] = {k: str(v) for k, v in r["scores"].items()} == \
                    {k: str(v) for k, v in loc["scores"].items()}
                report["ray_over_local_wall"] = round(r["wall_s"] / loc["wall_s"], 2)
                print(json.dumps({k: v for k, v in r.items() if k != "scores"}), flush=True)
                print(f"Ray 2 workers / local 1 worker, wall time: {report['ray_over_local_wall']}"
                      f" (same scores: {report['same_scores']})", flush=True)
        save()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
