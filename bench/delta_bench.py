"""Delta analysis speed and memory on a synthetic >= 1B-parameter base + expert pair.

    python bench/delta_bench.py [--params 1.1e9] [--keep DIR]

Writes a random bf16 Llama checkpoint and an expert (same tensors + noise) into a temporary
folder under /tmp (deleted afterwards unless --keep) with bench/synthetic.py, then measures,
each in its own subprocess so that peak RSS is that run's alone (the parent never imports torch,
so the children's fork inherits nothing large):
  read      read every tensor of both checkpoints once (CheckpointReader.read): the baseline
  raw       read both checkpoints' files once with plain sequential reads (a stricter baseline)
  analyze   analysis.delta_stats(base, expert, cache=False)
alternating read/raw/analyze --reps times (medians reported: the machine may be shared), then
  cache     delta_stats after a cached run: the cache-hit time.
Prints wall times, peak RSS (resource.getrusage of each child) and the ratios. Targets: analysis
<= 1.5x the read time, peak RSS < 2 GB, cache hit < 100 ms.
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


def child(mode: str, base: str, expert: str) -> dict:
    """Runs inside the subprocess; returns timings as a dict (printed as JSON)."""
    from layerswap_core.analysis.deltas import delta_stats
    from layerswap_core.checkpoints.reading import CheckpointReader

    t0 = time.perf_counter()
    if mode == "read":  # the project's tensor reader: every tensor into fresh memory
        nbytes = 0
        for folder in (base, expert):
            r = CheckpointReader(folder)
            for n in r.names():
                nbytes += r.read(n).nbytes
        return {"seconds": time.perf_counter() - t0, "bytes": nbytes}
    if mode == "raw":  # plain sequential file reads into one reused 16 MiB buffer
        buf, nbytes = bytearray(16 << 20), 0
        for folder in (base, expert):
            for f in sorted(Path(folder).glob("*.safetensors")):
                with open(f, "rb", buffering=0) as fh:
                    while (n := fh.readinto(buf)) > 0:
                        nbytes += n
        return {"seconds": time.perf_counter() - t0, "bytes": nbytes}
    if mode == "analyze":
        st = delta_stats(base, expert, cache=False)
        return {"seconds": time.perf_counter() - t0, "tensors": len(st.tensors)}
    if mode == "cache":
        delta_stats(base, expert, cache=True)  # fill the cache
        t1 = time.perf_counter()
        st = delta_stats(base, expert, cache=True)
        assert st.from_cache
        return {"seconds": time.perf_counter() - t1, "fill_seconds": t1 - t0}
    raise SystemExit(f"unknown mode {mode}")


def run_child(mode: str, base: Path, expert: Path, env: dict) -> dict:
    """(result dict + peak RSS in bytes) of one measurement in a fresh process."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", mode, str(base), str(expert)],
                            stdout=subprocess.PIPE, env=env, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{mode} failed (exit {proc.returncode})")
    res = json.loads(out.strip().splitlines()[-1])
    res["peak_rss"] = usage.ru_maxrss * 1024  # Linux: kilobytes
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--params", type=float, default=1.1e9)
    p.add_argument("--keep", type=Path, help="keep (or reuse) the checkpoints in this folder")
    p.add_argument("--reps", type=int, default=3, help="alternating read/analyze repetitions")
    p.add_argument("--child", nargs=3, metavar=("MODE", "BASE", "EXPERT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(*a.child)))
        return

    work = a.keep or Path(tempfile.mkdtemp(prefix="delta_bench-", dir="/tmp"))
    base, expert = work / "base", work / "expert"
    synthetic = str(ROOT / "bench" / "synthetic.py")
    reads, raws, analyses = [], [], []
    try:
        if not (base / "config.json").exists() or not (expert / "config.json").exists():
            t = time.perf_counter()
            subprocess.run([sys.executable, synthetic, str(base), "--params", str(a.params)],
                           check=True, stdout=subprocess.DEVNULL)
            subprocess.run([sys.executable, synthetic, str(expert), "--like", str(base),
                            "--seed", "1", "--delta", "0.01"], check=True, stdout=subprocess.DEVNULL)
            print(f"wrote synthetic checkpoints in {time.perf_counter() - t:.0f} s: {work}")
        env = {**os.environ, "LAYERSWAP_CACHE": str(work / "cache")}
        shutil.rmtree(work / "cache", ignore_errors=True)
        for _ in range(a.reps):
            reads.append(run_child("read", base, expert, env))
            raws.append(run_child("raw", base, expert, env))
            analyses.append(run_child("analyze", base, expert, env))
        reads.append(run_child("read", base, expert, env))
        raws.append(run_child("raw", base, expert, env))
        cache = run_child("cache", base, expert, env)
    finally:
        if a.keep is None:
            shutil.rmtree(work, ignore_errors=True)

    gib = 2 ** 30
    read_s = statistics.median(r["seconds"] for r in reads)
    ana_s = statistics.median(r["seconds"] for r in analyses)
    ana_rss = max(r["peak_rss"] for r in analyses)
    read_rss = max(r["peak_rss"] for r in reads)
    nbytes = reads[0]["bytes"]
    print(f"model: {nbytes / 4 / 1e9:.2f} B parameters per checkpoint (bf16), "
          f"{nbytes / gib:.2f} GiB read per pass, {analyses[0]['tensors']} tensors, "
          f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.1f}")
    print("read both checkpoints once : " + ", ".join(f"{r['seconds']:.2f}" for r in reads)
          + f" s (median {read_s:.2f} s, {nbytes / gib / read_s:.2f} GiB/s), "
          f"peak RSS {read_rss / gib:.2f} GiB")
    print("delta analysis             : " + ", ".join(f"{r['seconds']:.2f}" for r in analyses)
          + f" s (median {ana_s:.2f} s), peak RSS {ana_rss / gib:.2f} GiB")
    raw_s = statistics.median(r["seconds"] for r in raws)
    print("raw file read, both        : " + ", ".join(f"{r['seconds']:.2f}" for r in raws)
          + f" s (median {raw_s:.2f} s, {raws[0]['bytes'] / gib / raw_s:.2f} GiB/s)")
    ratio = ana_s / read_s
    print(f"ratio analysis / read      : {ratio:.2f}x  (target <= 1.5x: "
          f"{'ok' if ratio <= 1.5 else 'MISSED'})")
    ratio_raw = ana_s / raw_s
    print(f"ratio analysis / raw read  : {ratio_raw:.2f}x  (target <= 1.5x: "
          f"{'ok' if ratio_raw <= 1.5 else 'MISSED'})")
    print(f"peak RSS of the analysis   : {ana_rss / gib:.2f} GiB  (target < 2 GiB: "
          f"{'ok' if ana_rss < 2 * gib else 'MISSED'})")
    print(f"cache hit                  : {cache['seconds'] * 1000:.1f} ms  (target < 100 ms: "
          f"{'ok' if cache['seconds'] < 0.1 else 'MISSED'}; cache filled in "
          f"{cache['fill_seconds']:.1f} s)")


if __name__ == "__main__":
    main()
