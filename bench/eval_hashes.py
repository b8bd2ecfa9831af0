"""Evaluation outputs before and after a change: generated texts and gold NLLs, entry by entry.

    python bench/eval_hashes.py --write FILE [--root CHECKOUT] [--n 3]
    python bench/eval_hashes.py --compare FILE [--root CHECKOUT] [--n 3]

Runs ``layerswap eval`` (the command, in a child process with ``PYTHONPATH`` set to the
checkout ``--root``, default this one: so an older commit's code runs with this script) on the
embedded SmolLM2 demo, for each of the four models (base, math expert, Swahili expert and the
default layer swap written once with ``layerswap merge``), over every offline task and language
the evaluation room offered before and after the round-three moves: MGSM (the TSVs in
../shared/data/mgsm) in Swahili, Bengali and English, direct and chain of thought, with and
without the chat template; GSM-Symbolic variants in Swahili, Bengali and English; both the lean
forward (the CLI's default) and transformers' own modules (``--transformers``). Each entry is
one (case, item, model): its generated text and its gold NLL (``repr`` of the float: bit for
bit). ``--write`` stores them as JSON; ``--compare`` runs again and reports each entry
identical or not (exit 1 on any difference, or on an entry missing on either side).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("embedded:smollm2-135m-instruct", "embedded:smollm2-math-en", "embedded:smollm2-swahili")
# (name, eval arguments): every task x language the CLI evaluates offline
CASES = [
    ("mgsm-sw-2shot", ["--data", "mgsm", "--lang", "sw", "--shots", "2"]),
    ("mgsm-bn-2shot", ["--data", "mgsm", "--lang", "bn", "--shots", "2"]),
    ("mgsm-en-2shot", ["--data", "mgsm", "--lang", "en", "--shots", "2"]),
    ("mgsm-sw-cot-1shot", ["--data", "mgsm", "--lang", "sw", "--shots", "1", "--cot"]),
    ("mgsm-sw-chat-1shot", ["--data", "mgsm", "--lang", "sw", "--shots", "1",
                            "--chat-template"]),
    ("mgsm-sw-2shot-transformers", ["--data", "mgsm", "--lang", "sw", "--shots", "2",
                                    "--transformers"]),
    ("gsm-symbolic-sw-2shot", ["--data", "gsm-symbolic", "--lang", "sw", "--shots", "2"]),
    ("gsm-symbolic-bn-2shot", ["--data", "gsm-symbolic", "--lang", "bn", "--shots", "2"]),
    ("gsm-symbolic-en-cot-1shot", ["--data", "gsm-symbolic", "--lang", "en", "--shots", "1",
                                   "--cot"]),
]


def cli(root: Path, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1",
           "LAYERSWAP_MGSM_DIR": str(ROOT.parent / "shared" / "data" / "mgsm")}
    p = subprocess.run([sys.executable, "-m", "layerswap_core", *args], cwd=root, env=env,
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"layerswap {' '.join(args[:3])}... failed:\n{p.stderr[-2000:]}")


def entries(root: Path, n: int, tokens: int) -> dict[str, dict]:
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        merged = Path(tmp) / "merged"
        cli(root, ["merge", "--task", MODELS[1], "--lang", MODELS[2], "--base", MODELS[0],
                   "--out", str(merged)])
        models = [*MODELS, str(merged)]
        labels = ["base", "task", "lang", "merged"]
        for name, args in CASES:
            t = time.perf_counter()
            res = Path(tmp) / f"{name}.json"
            cli(root, ["eval", *(a for m in models for a in ("--model", m)), *args, "--n", str(n),
                       "--max-new-tokens", str(tokens), "--out", str(res)])
            data = json.loads(res.read_text())
            for row in data["rows"]:
                for label, (_key, got) in zip(labels, row["models"].items()):
                    out[f"{name} | {row['id']} | {label}"] = {
                        "output": got.get("output"), "gold_nll": repr(got.get("gold_nll"))}
            print(f"{name}: {len(data['rows'])} items x {len(models)} models, "
                  f"{time.perf_counter() - t:.0f} s", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path)
    mode.add_argument("--compare", type=Path)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose code runs")
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    a = ap.parse_args(argv)
    got = entries(a.root.resolve(), a.n, a.tokens)
    if a.write:
        a.write.write_text(json.dumps({"root": str(a.root), "entries": got}, indent=1))
        print(f"{len(got)} entries written to {a.write}")
        return 0
    want = json.loads(a.compare.read_text())["entries"]
    differ = [k for k in want if k in got and got[k] != want[k]]
    missing = sorted(set(want) ^ set(got))
    for k in differ[:20]:
        print(f"DIFFERENT {k}:\n  before {want[k]}\n  now    {got[k]}")
    for k in missing[:20]:
        print(f"MISSING on one side: {k}")
    same = len(want) - len(differ) - len(set(want) - set(got))
    print(f"{same} of {len(want)} entries identical; {len(differ)} different; "
          f"{len(missing)} on one side only")
    return 1 if differ or missing else 0


if __name__ == "__main__":
    sys.exit(main())
