"""Shared by the tests of hostile inputs: run one attack in a child Python process and measure
what it cost (seconds, growth of the peak resident memory) and how it was answered.

A child, not this process: before a fix, an attack takes gigabytes or never ends, and C code
(``json.dumps``, a regular expression) holds the GIL, so nothing in the same process could stop
it or even sample it. The child runs ``setup`` (imports, models: not measured), resets its peak
resident memory (``/proc/self/clear_refs``), then runs ``attack``; this process watches its
resident memory from outside and kills it past ``kill_mb`` of growth or ``kill_s`` seconds, so a
test of an unfixed attack fails in seconds without taking the machine's memory.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

_CHILD = """
import json, sys, time
def _kb(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
{setup}
open("/proc/self/clear_refs", "w").write("5")
_before = _kb("VmRSS")
print("START", _before, flush=True)
_t = time.monotonic()
try:
    _value = ({attack})
    _out = {{"refused": False, "message": repr(_value)[:20000]}}
except Exception as _e:
    _out = {{"refused": True, "type": type(_e).__name__, "message": str(_e)}}
_out["seconds"] = time.monotonic() - _t
_out["grown_mb"] = (_kb("VmHWM") - _before) / 1024
print("END", json.dumps(_out), flush=True)
"""


@dataclass
class Attack:
    refused: bool          # the attack raised (its message: the refusal)
    message: str
    seconds: float
    grown_mb: float        # the child's peak resident memory during the attack, over its start
    killed: str | None     # why this process stopped the child (None: it ended by itself)
    type: str = ""


def _rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def run_attack(setup: str, attack: str, *, kill_mb: float = 1000, kill_s: float = 20,
               setup_s: float = 120, env: dict | None = None) -> Attack:
    """``attack`` (an expression) after ``setup`` (statements) in a child Python; its cost and
    answer (``Attack``). The child is killed past ``kill_mb`` MB of growth or ``kill_s`` seconds
    of attack (``setup_s`` of setup)."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("measures memory through Linux's /proc")
    code = _CHILD.format(setup=textwrap.dedent(setup), attack=attack)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    started, before, killed = time.monotonic(), None, None
    while proc.poll() is None:
        time.sleep(0.02)
        start = next((ln for ln in lines if ln.startswith("START")), None)
        if start is None:
            if time.monotonic() - started > setup_s:
                killed = f"setup ran past {setup_s} s"
        else:
            if before is None:
                before, started = int(start.split()[1]), time.monotonic()
            rss = _rss_kb(proc.pid)
            if rss is not None and rss - before > kill_mb * 1024:
                killed = f"grew past {kill_mb} MB"
            elif time.monotonic() - started > kill_s:
                killed = f"ran past {kill_s} s"
        if killed:
            proc.kill()
            break
    proc.wait()
    reader.join(5)
    err = proc.stderr.read()
    end = next((ln for ln in lines if ln.startswith("END ")), None)
    if end is None:
        return Attack(False, err[-2000:], time.monotonic() - started, float("nan"),
                      killed or f"the child exited with {proc.returncode}")
    out = json.loads(end[4:])
    return Attack(out["refused"], out["message"], out["seconds"], out["grown_mb"], killed,
                  out.get("type", ""))


def assert_bounded(r: Attack, *, mb: float = 100, seconds: float = 5) -> None:
    """The attack ended by itself within ``seconds``, the process grown by less than ``mb``
    MB (the issue's acceptance)."""
    assert r.killed is None, f"{r.killed}: {r.message[-500:]}"
    cost = f"{r.seconds:.1f} s, grown {r.grown_mb:.0f} MB: {r.message[:500]}"
    assert r.seconds < seconds, cost
    assert r.grown_mb < mb, cost
    print(f"answered in {r.seconds:.2f} s, grown {r.grown_mb:.1f} MB: {r.message}")


def assert_refused(r: Attack, words: str, *, mb: float = 100, seconds: float = 5) -> None:
    """``assert_bounded``, and refused in one line (no traceback) naming ``words``."""
    assert_bounded(r, mb=mb, seconds=seconds)
    assert r.refused, f"not refused: {r.message}"
    assert "\n" not in r.message and "Traceback" not in r.message, r.message
    assert words.lower() in r.message.lower(), r.message
