"""Merge speed and memory on synthetic >= 1B-parameter checkpoints, against `cp -r`; like with like.

    python bench/merge_bench.py [--params 1.1e9] [--vocab 32000] [--shape NAME] [--reps 3]
                                [--keep DIR] [--vocab8b] [--no-live]

Writes three random bf16 Llama checkpoints (base; task and lang = base + noise) with
bench/synthetic.py into a temporary folder under /tmp (deleted afterwards unless --keep, which
reuses them), each with the same real-size tokenizer of its vocabulary (``--vocab``: 32,000 is
TinyLlama's and Llama-2's, a 2.7 MB tokenizer.json; 128,256 is Llama-3's, 11 MB), or with a
published model's exact shapes (``--shape``: llama-3.2-1b, its 128k x 2048 embeddings tied to the
LM head; tinyllama-1.1b; bench/synthetic.py ``SHAPES``), then times each contender in its own
child process (peak RSS from os.wait4 of that child alone):
  cp -r                  `cp -r` of the task checkpoint: the baseline
  ours --non-layer lang  the layer swap (b=5, u=2 of 32, scaled) taking the non-layer tensors from
                         the language expert: single-source tensors only, the same work as
  mergekit passthrough   the same swap as a mergekit passthrough config (mergekit takes non-layer
                         tensors from the first slice's model, the language expert): only if
                         mergekit-yaml is beside this Python or on PATH (requirements-dev.txt
                         pins it); the bench says so when it is not
  ours default           the default layer swap: MORE WORK than a passthrough (the embeddings,
                         final norm and LM head are blended in float32, Algorithm 1)
  ours default, 1 thread the default with its blended row blocks computed on one thread
                         (LAYERSWAP_MERGE_THREADS=1) instead of two (merge.apply.merge_workers;
                         one while the copies run beside them, in either case)
  ours transitions 2+2   the default with 2+2 blended transition layers
in two page-cache states: "warm" (the inputs read once before each run) and "cold" (the inputs'
pages dropped before each run with posix_fadvise(DONTNEED), after a sync). Contenders alternate
(the order rotates every repetition); min and median over the repetitions are printed, for the
whole command (Python start-up included) and, for ours, the merge call alone. Ours is the
`layerswap merge` command (its entry point, run in the child): on the CPU it imports no torch
(copies in the kernel, linear blends in numpy); the bench says if torch was imported. The
package's bytecode is compiled first (``compile_bytecode``), as installing it does: where
PYTHONDONTWRITEBYTECODE is set (this project's machines) every run would otherwise compile
layerswap's sources again, about 0.1 s of start-up a user's installed command never pays.
Targets (issue #30): default layer swap <= 1.3x cp -r and peak RSS <= 300 MiB; transitions 2+2
<= 2x cp -r. Then the Models check (``workbench.models.check_models``: what the Models tab
runs on a pick) of the trio, three times in one process (issue #51: < 1 s after the first), and
twice with the language expert's tokenizer.json re-serialised (other bytes, the same tokenizer:
the files are parsed and compared).

--vocab8b: the same on a synthetic with Llama-3-8B's vocabulary and width (128,256 x 4096,
untied head) and 2 decoder layers (bench/synthetic.py ``vocab8b_config``), warm cache only: the
peak memory of blending an 8B model's embeddings and head, and the time they add, projected to
a whole Llama-3-8B (16 GB) from the measured copy rate.
Then, unless --no-live, in-memory recomposition for the app (LiveModel on the embedded 30-layer
SmolLM2, CPU): the time of ``show`` for a sequence of new configs (target < 1 s each).
The load of the machine (/proc/loadavg) is printed before and after: the machine may be shared.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def mergekit_yaml() -> str | None:
    """``layerswap_core.testing.mergekit_yaml`` without its import: this process forks the
    contenders, and a child's peak RSS starts at its parent's (torch would add about 200 MiB)."""
    beside = Path(sys.executable).with_name("mergekit-yaml")
    return str(beside) if beside.exists() else shutil.which("mergekit-yaml")


# Ours is the `layerswap merge` command itself (its entry point, ``cli.main``), timed inside as
# the start-up (Python, and the modules the command imports) and the rest (the merge call).
CHILD = """
import atexit, json, sys, time
t0 = time.perf_counter()
from layerswap_core.cli import build_parser, run
build_parser("merge")   # the modules `layerswap merge` imports
t1 = time.perf_counter()
atexit.register(lambda: print(json.dumps({"merge_s": time.perf_counter() - t1, "import_s": t1 - t0,
                                          "torch": "torch" in sys.modules}), flush=True))
sys.argv = ["layerswap", *json.loads(sys.argv[1])]
run()   # the console script's own entry point, exit included
"""


def merge_args(cfg: dict, out) -> list[str]:
    """`layerswap merge` arguments of a MergeConfig's fields (``cfg``) into ``out``."""
    args = ["merge", "--out", str(out)]
    for key, value in cfg.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def run_measured(cmd: list[str]) -> dict:
    """Wall time, peak RSS (MiB, this child alone via os.wait4) and stdout of one child process."""
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


def files_of(folders) -> list[Path]:
    return [f for d in folders for f in sorted(Path(d).iterdir()) if f.is_file()]


def drop_cache(folders):
    """Drop the files' pages from the page cache (clean pages: synced first)."""
    subprocess.run(["sync"], check=False)
    for f in files_of(folders):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_cache(folders):
    """Read the files once (into the page cache), through one small buffer: a child forked after
    this starts with this process's resident memory in its peak RSS (64 MiB reads left the warm
    runs' peaks at a 79 MiB floor)."""
    subprocess.run(["sync"], check=False)
    buf = bytearray(1 << 20)
    for f in files_of(folders):
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, {platform.system()} {platform.release()}"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


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
from bench.synthetic import (llama_config_for, shape_config, vocab8b_config, write_checkpoint,
                             write_tokenizer)
from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.merge.config import MergeConfig
root, params, vocab, shape = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if not (root / "lang" / "config.json").exists():
    t0 = time.time()
    cfg = (shape_config(shape) if shape else vocab8b_config() if params == 0 else
           llama_config_for(params, vocab))
    write_checkpoint(root / "base", cfg, seed=0)
    write_checkpoint(root / "task", cfg, seed=1, like=root / "base", delta=0.01)
    write_checkpoint(root / "lang", cfg, seed=2, like=root / "base", delta=0.01)
    print(f"synthetic checkpoints written in {time.time() - t0:.0f} s", file=sys.stderr)
for role in ("base", "task", "lang"):   # a kept trio from before the tokenizers
    if not (root / role / "tokenizer.json").exists():
        write_tokenizer(root / role, CheckpointReader(root / role).config()["vocab_size"])
r = CheckpointReader(root / "task")
L = r.config()["num_hidden_layers"]
b, u, _, _ = MergeConfig().layer_counts(L)
print(json.dumps({"params": r.numel(), "bytes": r.nbytes(), "layers": L, "b": b, "u": u,
                  "tied": bool(r.config().get("tie_word_embeddings")),
                  "hidden": r.config()["hidden_size"], "vocab": r.config()["vocab_size"],
                  "tokenizer_bytes": (root / "task" / "tokenizer.json").stat().st_size}))
"""

# The Models tab's check in one process, as the app runs it on every pick: three times on the
# trio, then twice with a language expert whose tokenizer.json has other bytes (same content).
MODELS_CHECK = """
import json, sys, time
from layerswap_core.workbench.models import check_models
base, task, lang, resaved = sys.argv[1:5]
out = []
for refs in [(base, task, lang)] * 3 + [(base, task, resaved)] * 2:
    t = time.perf_counter()
    report = check_models(*refs)
    out.append([time.perf_counter() - t, report.problems])
print(json.dumps(out))
"""


def make_checkpoints(root: Path, params: float, vocab: int = 32000, shape: str = "") -> dict:
    """Write (or reuse) the three checkpoints in a child process: the parent stays small, so the
    measured children (forked from it) inherit no large resident memory. params 0: the
    8B-vocabulary synthetic (``vocab8b_config``); ``shape``: a published model's
    (``synthetic.SHAPES``)."""
    p = subprocess.run([sys.executable, "-c", SETUP, str(root), str(params), str(vocab), shape],
                       cwd=ROOT,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"writing the synthetic checkpoints failed:\n{p.stderr[-3000:]}")
    if p.stderr.strip():
        print(p.stderr.strip().splitlines()[-1], flush=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def compile_bytecode() -> None:
    """layerswap's modules compiled to bytecode (``__pycache__``, git-ignored), as installing the
    package does (pip compiles at install; a run writes them unless PYTHONDONTWRITEBYTECODE)."""
    import compileall
    ok = compileall.compile_dir(ROOT / "layerswap_core", quiet=1)
    print(f"bytecode of layerswap_core: {'compiled' if ok else 'NOT all compiled'} (as an install "
          f"does; PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', 'unset')} here)",
          flush=True)


def mergekit_config(paths: dict[str, Path], num_layers: int, b: int, u: int) -> str:
    return (f"slices:\n"
            f"  - sources: [{{model: {paths['lang']}, layer_range: [0, {b}]}}]\n"
            f"  - sources: [{{model: {paths['task']}, layer_range: [{b}, {num_layers - u}]}}]\n"
            f"  - sources: [{{model: {paths['lang']}, layer_range: [{num_layers - u}, {num_layers}]}}]\n"
            f"merge_method: passthrough\nbase_model: {paths['task']}\ndtype: bfloat16\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=float, default=1.1e9)
    ap.add_argument("--vocab", type=int, default=32000,
                    help="the synthetic's vocabulary and tokenizer (128256: Llama-3's)")
    ap.add_argument("--shape", default="",
                    help="a published model's exact shapes instead of --params/--vocab: a name "
                         "of bench/synthetic.py's SHAPES (read there: this process imports no torch)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="keep the checkpoints in this folder (reused if present)")
    ap.add_argument("--vocab8b", action="store_true",
                    help="also the 128k x 4096 synthetic (Llama-3-8B's vocabulary and width)")
    ap.add_argument("--no-live", action="store_true", help="skip the in-memory recomposition part")
    ap.add_argument("--states", default="warm,cold",
                    help="page-cache states to measure, of warm,cold (default both)")
    ap.add_argument("--no-mergekit", action="store_true", help="leave mergekit out (faster)")
    ap.add_argument("--live-only", action="store_true", help="only the in-memory recomposition part")
    a = ap.parse_args()
    print(f"machine: {machine()}\ndate: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"load average before: {loadavg()}", flush=True)
    if not a.live_only:
        root = a.keep or Path(tempfile.mkdtemp(prefix="layerswap-merge-bench-", dir="/tmp"))
        try:
            mergekit = None if a.no_mergekit else mergekit_yaml()
            if not mergekit and not a.no_mergekit:
                print("mergekit: not installed (no mergekit-yaml beside this Python nor on PATH): its "
                      "row is skipped; `make install` installs it (requirements-dev.txt)")
            compile_bytecode()
            name = (f"synthetic-{a.shape}" if a.shape else
                    "synthetic" if a.vocab == 32000 else f"synthetic-vocab{a.vocab}")
            disk_merges(root / name, a.params, a.reps, tuple(a.states.split(",")), mergekit,
                        vocab=a.vocab, shape=a.shape)
            if a.vocab8b:
                report_8b(disk_merges(root / "vocab8b", 0, max(2, a.reps - 1), ("warm",),
                                      mergekit, transitions=False))
        finally:
            if not a.keep:
                shutil.rmtree(root, ignore_errors=True)
    if not a.no_live:
        recompose()
    print(f"load average after: {loadavg()}")


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


def disk_merges(root: Path, params: float, reps: int, states, mergekit, transitions=True,
                vocab: int = 32000, shape: str = "") -> dict:
    info = make_checkpoints(root, params, vocab, shape)
    paths = {r: root / r for r in ("base", "task", "lang")}
    L, b, u = info["layers"], info["b"], info["u"]
    print(f"\ncheckpoint{' ' + shape + ' shape' if shape else ''}: {info['params'] / 1e9:.2f} B "
          f"parameters, {info['bytes'] / 2**30:.2f} GiB bf16, {L} layers, hidden {info['hidden']}, "
          f"vocab {info['vocab']} ({'tied' if info['tied'] else 'untied'} head; tokenizer.json "
          f"{info['tokenizer_bytes'] / 1e6:.1f} MB, the same file in all three); layer swap b={b}, "
          f"u={u}", flush=True)
    task, lang = str(paths["task"]), str(paths["lang"])
    out = root / "out"
    ours = lambda cfg: [sys.executable, "-c", CHILD, json.dumps(merge_args(cfg, out))]  # noqa: E731
    contenders = {"cp -r (baseline)": ["cp", "-r", task, str(out)],
                  "ours --non-layer lang": ours({"task": task, "lang": lang, "non_layer": "lang"})}
    if mergekit:
        (root / "mergekit.yaml").write_text(mergekit_config(paths, L, b, u))
        contenders["mergekit passthrough"] = [mergekit, str(root / "mergekit.yaml"), str(out),
                                              "--lazy-unpickle"]
    contenders["ours default (more work)"] = ours({"task": task, "lang": lang})
    # the same on one thread (row blocks computed by the writer's thread alone)
    contenders["ours default, 1 thread"] = ["env", "LAYERSWAP_MERGE_THREADS=1", *ours(
        {"task": task, "lang": lang})]
    if transitions and b + u + 4 <= L:
        contenders["ours transitions 2+2"] = ours({"task": task, "lang": lang,
                                                   "transition_bottom": 2, "transition_top": 2})
    inputs = [paths["task"], paths["lang"]]
    results = {(state, name): [] for state in states for name in contenders}
    names = list(contenders)
    for state in states:
        for rep in range(reps):
            order = names[rep % len(names):] + names[:rep % len(names)]  # alternate
            for name in order:
                shutil.rmtree(out, ignore_errors=True)
                (drop_cache if state == "cold" else warm_cache)(inputs)
                r = run_measured(contenders[name])
                last = (r["stdout"].strip().splitlines() or [""])[-1]
                if last.startswith("{"):   # ours: the child's own figures
                    r.update(json.loads(last))
                results[(state, name)].append(r)
            print(f"{state} rep {rep + 1}: " + ", ".join(
                f"{n.split(' (')[0]} {results[(state, n)][-1]['wall_s']:.2f} s" for n in names),
                flush=True)
    shutil.rmtree(out, ignore_errors=True)

    def stat(state, name, key, how=statistics.median):
        vals = [r[key] for r in results[(state, name)] if key in r]
        return how(vals) if vals else None

    summary = {"info": info, "copy_bytes": info["bytes"]}
    for state in states:
        copy_s = stat(state, "cp -r (baseline)", "wall_s")
        print(f"\n{state} page cache ({reps} runs each, alternated; x cp = median / median cp -r; "
              f"paired = median of each rep's ratio to that rep's cp -r)")
        print(f"{'contender':<28}{'min s':>8}{'median s':>10}{'x cp':>7}{'paired':>8}"
              f"{'merge call s':>14}{'x cp':>7}{'peak RSS MiB':>14}")
        copies = [r["wall_s"] for r in results[(state, "cp -r (baseline)")]]
        for name in names:
            med, lo = stat(state, name, "wall_s"), stat(state, name, "wall_s", min)
            paired = statistics.median(r["wall_s"] / c for r, c in zip(results[(state, name)], copies))
            call = stat(state, name, "merge_s")
            call_txt = f"{call:>14.2f}{call / copy_s:>7.2f}" if call is not None else f"{'':>21}"
            print(f"{name:<28}{lo:>8.2f}{med:>10.2f}{med / copy_s:>7.2f}{paired:>8.2f}{call_txt}"
                  f"{stat(state, name, 'rss_mib', max):>14.0f}")
            summary[(state, name)] = {"wall": med, "call": call, "paired": paired,
                                      "rss": stat(state, name, "rss_mib", max)}
        if mergekit:
            print(f"like with like: mergekit passthrough / ours --non-layer lang = "
                  f"{stat(state, 'mergekit passthrough', 'wall_s') / stat(state, 'ours --non-layer lang', 'wall_s'):.2f}x")
        summary[(state, "copy")] = copy_s
        met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
        d = summary[(state, "ours default (more work)")]
        print(f"target default <= 1.3x cp -r: whole command {met(d['wall'] <= 1.3 * copy_s)} "
              f"({d['wall'] / copy_s:.2f}x; paired {d['paired']:.2f}x), merge call "
              f"{met(d['call'] <= 1.3 * copy_s)} "
              f"({d['call'] / copy_s:.2f}x); peak RSS <= 300 MiB: {met(d['rss'] <= 300)} "
              f"({d['rss']:.0f} MiB)")
        if (state, "ours transitions 2+2") in summary:
            t = summary[(state, "ours transitions 2+2")]
            print(f"target transitions 2+2 <= 2x cp -r: whole command {met(t['wall'] <= 2 * copy_s)} "
                  f"({t['wall'] / copy_s:.2f}x), merge call {met(t['call'] <= 2 * copy_s)} "
                  f"({t['call'] / copy_s:.2f}x)")
    torch_used = sorted({n for (state, n), runs in results.items() for r in runs if r.get("torch")})
    print(f"start-up of `layerswap merge` (Python and the modules it imports; median): "
          f"{stat(states[0], 'ours --non-layer lang', 'import_s'):.2f} s; torch imported by: "
          f"{', '.join(torch_used) or 'none of ours'}")
    models_check(paths, root / "lang-resaved")
    return summary


def models_check(paths: dict[str, Path], resaved: Path):
    """The Models tab's check (``MODELS_CHECK``) on the trio, and with a re-serialised tokenizer:
    a copy of the language expert (its weights hard-linked) whose tokenizer.json is the same
    JSON written with other indentation."""
    if not resaved.exists():
        resaved.mkdir()
        for f in paths["lang"].iterdir():
            if f.name != "tokenizer.json":
                os.link(f, resaved / f.name)
        tok = json.loads((paths["lang"] / "tokenizer.json").read_text(encoding="utf-8"))
        (resaved / "tokenizer.json").write_text(json.dumps(tok, indent=1, ensure_ascii=False),
                                                encoding="utf-8")
    args = [str(paths["base"]), str(paths["task"]), str(paths["lang"]), str(resaved)]
    r = run_measured([sys.executable, "-c", MODELS_CHECK, *args])
    runs = json.loads(r["stdout"].strip().splitlines()[-1])
    if any(problems for _, problems in runs):
        raise RuntimeError(f"the Models check found problems: {runs}")
    same, resaved_runs = [s for s, _ in runs[:3]], [s for s, _ in runs[3:]]
    print(f"Models check (workbench check_models, one process; peak RSS {r['rss_mib']:.0f} MiB): "
          f"{', '.join(f'{s:.3f}' for s in same)} s (first, again, again); "
          f"target < 1 s after the first: {'met' if max(same[1:]) < 1 else 'NOT met'}; with the "
          f"language expert's tokenizer.json re-serialised (parsed, same tokenizer): "
          f"{', '.join(f'{s:.3f}' for s in resaved_runs)} s")


def report_8b(summary: dict):
    """What the 8B vocabulary costs, and a projection to a whole Llama-3-8B (16.06 GB bf16)."""
    lang, default = summary[("warm", "ours --non-layer lang")], summary[("warm", "ours default (more work)")]
    copy_s, nbytes = summary[("warm", "copy")], summary["copy_bytes"]
    blend_s = default["call"] - lang["call"]
    rate = nbytes / copy_s
    size_8b = 16.06e9
    print(f"\n8B-vocabulary projection: blending the 128k x 4096 embeddings and LM head costs "
          f"{blend_s:.2f} s over the passthrough (merge calls, warm) at a peak RSS of "
          f"{default['rss']:.0f} MiB (passthrough {lang['rss']:.0f} MiB).")
    copy_s = size_8b / rate
    print(f"Llama-3-8B (16.06 GB bf16) at this machine's measured cp -r rate ({rate / 1e9:.2f} GB/s): "
          f"cp -r ~{copy_s:.1f} s; our default layer swap ~{max(copy_s, blend_s):.1f}-"
          f"{copy_s + blend_s:.1f} s (the blend runs beside the copies: about the longer of the two "
          f"where the cores are free, at worst their sum), peak RSS ~{default['rss']:.0f} MiB "
          "(row blocks: independent of the vocabulary)")


if __name__ == "__main__":
    main()
