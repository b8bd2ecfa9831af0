"""Train the cross-fitting's experts (issue #62), resumably, in the background.

    python bench/demo_folds.py [--runs /work/runs] [--parallel 2] [--only NAME ...]
    python bench/demo_folds.py --status          # steps done of each run, and the driver's PID
    python bench/demo_folds.py --dry-run         # the commands, nothing started

What it trains is ``layerswap_core.demos.folds.TRAININGS``: fold 2's math and Swahili experts
(fold 1's recipes on the other half of the templates) and the prose control (v2) of each fold,
each with the flags of the shipped expert it copies (its ``training_log.json``). Each run lives
in RUNS/<name>/: ``train.jsonl`` and ``eval.jsonl`` (written once from the recipe), ``command``
(the `layerswap train` line), ``train.log`` and ``out/`` (checkpoints every 4 steps with the
trainer's state; the finished expert in ``out/`` itself). Every run is started with
``--resume`` under ``nice -n 15`` and ``--threads 1``, at most ``--parallel`` at once, so
running this again after a kill goes on from each run's last checkpoint and skips finished
runs. The driver writes its PID to RUNS/demo_folds.pid and starts its runs in its own process
group: ``kill -- -$(cat RUNS/demo_folds.pid)`` stops everything (start it with ``setsid``).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PID_FILE = "demo_folds.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def steps_done(folder: Path) -> tuple[int, int | None]:
    """(last step saved with its state, the run's steps) of one run; finished runs give
    (steps, steps)."""
    from layerswap_core.training.trainer import find_resume_state
    out = folder / "out"
    log = out / "training_log.json"
    if log.is_file():
        steps = json.loads(log.read_text())["steps"]
        return steps, steps
    state = find_resume_state(out)
    step = int(state.parent.name.removeprefix("checkpoint-")) if state else 0
    return step, None


def command(training, folder: Path) -> list[str]:
    argv = training.command(folder)
    if "--threads" in argv:
        argv[argv.index("--threads") + 1] = "1"
    else:
        argv += ["--threads", "1"]
    return argv


def status(runs: Path, trainings) -> None:
    pid_file = runs / PID_FILE
    if pid_file.is_file():
        pid = int(pid_file.read_text().split()[0])
        print(f"driver {pid}: {'running' if _alive(pid) else 'not running'}")
    for t in trainings:
        folder = runs / t.name
        done, total = steps_done(folder)
        steps = t.config()["steps"]
        print(f"{t.name}: {'finished' if total else 'at'} step {done}/{steps}"
              + (f" ({folder / 'out'})" if total else ""))


def main(argv=None) -> int:
    from layerswap_core.demos.folds import TRAININGS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="/work/runs", help="where the runs live (outside any repo)")
    ap.add_argument("--parallel", type=int, default=2, help="runs at once (default: 2)")
    ap.add_argument("--only", nargs="*", help="these runs only (names of TRAININGS)")
    ap.add_argument("--status", action="store_true", help="print each run's progress and stop")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    args = ap.parse_args(argv)
    runs = Path(args.runs)
    trainings = [t for t in TRAININGS if not args.only or t.name in args.only]
    if args.status:
        status(runs, trainings)
        return 0
    if args.dry_run:
        for t in trainings:
            print(shlex.join(["nice", "-n", "15", *command(t, runs / t.name), "--resume"]))
        return 0
    runs.mkdir(parents=True, exist_ok=True)
    pid_file = runs / PID_FILE
    if pid_file.is_file():
        other = int(pid_file.read_text().split()[0])
        if other != os.getpid() and _alive(other):
            print(f"another driver is running (PID {other}, {pid_file})", file=sys.stderr)
            return 1
    pid_file.write_text(f"{os.getpid()}\n")
    layerswap = str(Path(sys.executable).with_name("layerswap"))
    todo = []
    for t in trainings:
        folder = runs / t.name
        if steps_done(folder)[1] is not None:
            print(f"{t.name}: finished", flush=True)
            continue
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        t.write_data(folder)
        print(f"{t.name}: data in {folder} ({time.time() - t0:.0f} s)", flush=True)
        todo.append((t, folder))
    running: list[tuple[str, subprocess.Popen]] = []
    failed = []
    while todo or running:
        while todo and len(running) < args.parallel:
            t, folder = todo.pop(0)
            argv = command(t, folder)
            (folder / "command").write_text(shlex.join(argv) + "\n")
            full = ["nice", "-n", "15", layerswap, *argv[1:], "--resume"]
            log = (folder / "train.log").open("a")
            log.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(full)}\n")
            log.flush()
            proc = subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "HF_HUB_OFFLINE": "1"})
            print(f"{t.name}: started (PID {proc.pid}) at step {steps_done(folder)[0]}",
                  flush=True)
            running.append((t.name, proc))
        time.sleep(10)
        for name, proc in list(running):
            if proc.poll() is not None:
                running.remove((name, proc))
                print(f"{name}: exit {proc.returncode}", flush=True)
                if proc.returncode:
                    failed.append(name)
    if pid_file.is_file() and pid_file.read_text().split()[0] == str(os.getpid()):
        pid_file.unlink()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
