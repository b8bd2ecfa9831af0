"""Merge speed and memory on synthetic >= 1B-parameter checkpoints, against `cp -r`.

    python bench/merge_bench.py [--params 1.1e9] [--reps 2] [--keep DIR]

Writes three random bf16 Llama checkpoints (base; task and lang = base + noise) into a temporary
folder under /tmp with bench/synthetic.py (deleted afterwards unless --keep), then times, each
run in its own subprocess (peak RSS from os.wait4 of that child alone):
  copy        `cp -r` of the task checkpoint: the baseline
  layer_swap  `layerswap merge` defaults (b=5, u=2 of 32, scaled): single-source tensors only
  transition  layer swap with 2+2 blended transition layers (float32 blends of bf16 tensors)
  mergekit    the same layer swap as a mergekit passthrough config (only if mergekit-yaml is on PATH)
For our merges, both the whole command (Python + torch start-up included) and the merge call
alone are reported. Repetitions alternate copy/merge; medians are reported (shared machines).
Then, in-memory recomposition for the app (LiveModel on the embedded 30-layer SmolLM2, CPU):
the time of ``show`` for a sequence of new configs (target < 1 s each for layer swaps).
Targets: merge <= 1.3x the copy time, >= 2x faster than mergekit, peak RSS < 2 GB.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from layerswap_core.merge.executor import merge_to_folder
from layerswap_core.merge.config import MergeConfig
cfg = MergeConfig(**json.loads(sys.argv[1]))
t1 = time.perf_counter()
merge_to_folder(cfg, out=sys.argv[2])
print(json.dumps({"merge_s": time.perf_counter() - t1, "import_s": t1 - t0}))
"""


def run_measured(cmd: list[str]) -> dict:
    """Wall time, peak RSS (MiB, this child alone via os.wait4) and stdout of one child process."""
    subprocess.run(["sync"], check=False)
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    # Read the pipes fully before reaping the child (small outputs: no deadlock risk at this size).
    out = p.stdout.read().decode()
    err = p.stderr.read().decode()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}... failed ({p.returncode}):\n{err[-2000:]}")
    return {"wall_s": wall, "rss_mib": usage.ru_maxrss / 1024, "stdout": out}


RECOMPOSE = """
import json, time
import torch
from layerswap_core.merge.live import LiveModel
from layerswap_core.checkpoints.references import DEFAULT_BASE
from layerswap_core.merge.config import MergeConfig
t0 = time.perf_counter()
live = LiveModel.from_refs(DEFAULT_BASE, DEFAULT_BASE, DEFAULT_BASE, dtype=torch.float32)
out = {"load_s": time.perf_counter() - t0, "apply": []}
for label, cfg in [("default (first apply)", MergeConfig()), ("bottom 6", MergeConfig(bottom=6)),
                   ("top 4", MergeConfig(bottom=6, top=4)),
                   ("transitions 2/2", MergeConfig(bottom=6, top=4, transition_bottom=2, transition_top=2)),
                   ("weights 2:1", MergeConfig(bottom=6, top=4, transition_bottom=2, transition_top=2, w_task=2.0)),
                   ("partition A", MergeConfig(partition="A")), ("partition C", MergeConfig(partition="C")),
                   ("back to default", MergeConfig())]:
    t = time.perf_counter()
    res = live.show(cfg)
    out["apply"].append((label, res.rewritten, time.perf_counter() - t))
print(json.dumps(out))
"""

SETUP = """
import json, sys, time
from pathlib import Path
from bench.synthetic import llama_config_for, write_checkpoint
from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.merge.config import MergeConfig
root, params = Path(sys.argv[1]), float(sys.argv[2])
if not (root / "lang" / "config.json").exists():
    t0 = time.time()
    cfg = llama_config_for(params)
    write_checkpoint(root / "base", cfg, seed=0)
    write_checkpoint(root / "task", cfg, seed=1, like=root / "base", delta=0.01)
    write_checkpoint(root / "lang", cfg, seed=2, like=root / "base", delta=0.01)
    print(f"synthetic checkpoints written in {time.time() - t0:.0f} s", file=sys.stderr)
r = CheckpointReader(root / "task")
L = r.config()["num_hidden_layers"]
b, u, _, _ = MergeConfig().layer_counts(L)
print(json.dumps({"params": r.numel(), "bytes": r.nbytes(), "layers": L, "b": b, "u": u,
                  "hidden": r.config()["hidden_size"]}))
"""


def make_checkpoints(root: Path, params: float) -> dict:
    """Write (or reuse) the three checkpoints in a child process: the parent stays small, so the
    measured children (forked from it) inherit no large resident memory."""
    p = subprocess.run([sys.executable, "-c", SETUP, str(root), str(params)], cwd=ROOT,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"writing the synthetic checkpoints failed:\n{p.stderr[-3000:]}")
    if p.stderr.strip():
        print(p.stderr.strip().splitlines()[-1], flush=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def mergekit_config(paths: dict[str, Path], num_layers: int, b: int, u: int) -> str:
    return (f"slices:\n"
            f"  - sources: [{{model: {paths['lang']}, layer_range: [0, {b}]}}]\n"
            f"  - sources: [{{model: {paths['task']}, layer_range: [{b}, {num_layers - u}]}}]\n"
            f"  - sources: [{{model: {paths['lang']}, layer_range: [{num_layers - u}, {num_layers}]}}]\n"
            f"merge_method: passthrough\nbase_model: {paths['task']}\ndtype: bfloat16\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=float, default=1.1e9)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="keep the checkpoints in this folder (reused if present)")
    ap.add_argument("--recompose-only", action="store_true", help="only the in-memory recomposition part")
    a = ap.parse_args()
    if not a.recompose_only:
        disk_merges(a)
    recompose()


def recompose():
    r = run_measured([sys.executable, "-c", RECOMPOSE])
    res = json.loads(r["stdout"].strip().splitlines()[-1])
    print(f"\nin-memory recomposition (embedded SmolLM2-135M, 30 layers, CPU float32): experts "
          f"loaded in {res['load_s']:.1f} s, peak RSS {r['rss_mib']:.0f} MiB")
    print(f"{'new config':<24}{'params rewritten':>18}{'apply s':>10}")
    for label, n, s in res["apply"]:
        print(f"{label:<24}{n:>18}{s:>10.3f}")
    worst = max(s for label, n, s in res["apply"][1:])
    print(f"target < 1 s per new config: {'met' if worst < 1 else 'NOT met'} (worst {worst:.3f} s)")


def disk_merges(a):
    root = a.keep or Path(tempfile.mkdtemp(prefix="layerswap-merge-bench-", dir="/tmp"))
    try:
        info = make_checkpoints(root, a.params)
        paths = {r: root / r for r in ("base", "task", "lang")}
        L, b, u = info["layers"], info["b"], info["u"]
        print(f"checkpoint: {info['params'] / 1e9:.2f} B parameters, {info['bytes'] / 2**30:.2f} GiB "
              f"bf16, {L} layers, hidden {info['hidden']}; layer swap b={b}, u={u}", flush=True)

        configs = {
            "layer_swap": {"task": str(paths["task"]), "lang": str(paths["lang"])},
            "transition": {"task": str(paths["task"]), "lang": str(paths["lang"]),
                           "transition_bottom": 2, "transition_top": 2},
        }
        if b + u + 4 > L:  # too shallow for transition layers (only with a small --params)
            del configs["transition"]
        results: dict[str, list[dict]] = {"copy": [], "mergekit": [], **{k: [] for k in configs}}
        out = root / "out"
        for rep in range(a.reps):
            shutil.rmtree(out, ignore_errors=True)
            results["copy"].append(run_measured(["cp", "-r", str(paths["task"]), str(out)]))
            for name, cfg in configs.items():
                shutil.rmtree(out, ignore_errors=True)
                r = run_measured([sys.executable, "-c", CHILD, json.dumps(cfg), str(out)])
                r.update(json.loads(r["stdout"].strip().splitlines()[-1]))
                results[name].append(r)
            print(f"rep {rep + 1}: copy {results['copy'][-1]['wall_s']:.2f} s, layer swap "
                  f"{results['layer_swap'][-1]['wall_s']:.2f} s (merge call "
                  f"{results['layer_swap'][-1]['merge_s']:.2f} s)", flush=True)
            if shutil.which("mergekit-yaml"):
                shutil.rmtree(out, ignore_errors=True)
                (root / "mergekit.yaml").write_text(mergekit_config(paths, L, b, u))
                results["mergekit"].append(run_measured(
                    ["mergekit-yaml", str(root / "mergekit.yaml"), str(out), "--lazy-unpickle"]))
        shutil.rmtree(out, ignore_errors=True)

        def med(name, key):
            vals = [r[key] for r in results[name] if key in r]
            return statistics.median(vals) if vals else None

        copy_s = med("copy", "wall_s")
        print(f"\n{'run':<26}{'wall s':>9}{'x copy':>9}{'peak RSS MiB':>15}")
        rows = [("cp -r (baseline)", "copy", "wall_s"),
                ("layer swap, command", "layer_swap", "wall_s"),
                ("layer swap, merge call", "layer_swap", "merge_s")]
        if "transition" in results:
            rows += [("transition 2+2, command", "transition", "wall_s"),
                     ("transition 2+2, merge call", "transition", "merge_s")]
        if results["mergekit"]:
            rows.append(("mergekit passthrough", "mergekit", "wall_s"))
        for label, name, key in rows:
            s = med(name, key)
            print(f"{label:<26}{s:>9.2f}{s / copy_s:>9.2f}{med(name, 'rss_mib'):>15.0f}")
        if results["mergekit"]:
            print(f"mergekit / our layer swap: {med('mergekit', 'wall_s') / med('layer_swap', 'wall_s'):.2f}x")
        else:
            print("mergekit: not installed (mergekit-yaml not on PATH), skipped")
        print(f"python + torch start-up in the merge command: {med('layer_swap', 'import_s'):.2f} s")
        met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
        ok_rss = max(med(n, "rss_mib") for n in configs) < 2048
        print(f"target layer swap <= 1.3x copy: merge call {met(med('layer_swap', 'merge_s') <= 1.3 * copy_s)}"
              f", whole command incl. start-up {met(med('layer_swap', 'wall_s') <= 1.3 * copy_s)}; "
              f"peak RSS < 2 GB: {met(ok_rss)}")
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
