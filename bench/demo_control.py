"""The outer-layer control of the cross-fitted Swahili result (issue #62; the rule:
``demos.control``, ``CONTROL_RULE_ID``, declared in its own commit before any control was
measured on the eval items, which the output records).

    python bench/demo_control_check.py --control CK --json checks/f1-ckN.json    # each step
    python bench/demo_result.py --fold 1 --rounds 2 --n-validation 33 --threads 1 \\
        --control CONTROL1 --resume W1.json --json fold1-control.json
    python bench/demo_result.py --fold 2 ... --no-seeds --control CONTROL2 --resume W2.json \\
        --json fold2-control.json
    python bench/demo_control.py fold1-control.json fold2-control.json \\
        --check 1:4=checks/f1-ck4.json --check 1:8=... \\
        [--json assets/experts/demo_control.json] [--docs docs/demo.md]

Prints S1 and S2 and the declared sentence; ``--docs`` rewrites the block between
``<!-- control-result -->`` and ``<!-- /control-result -->``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

START, END = "<!-- control-result -->", "<!-- /control-result -->"


def main(argv=None) -> int:
    from layerswap_core.demos.control import (CONTROL_RULE_ID, control_markdown,
                                              control_result)
    from layerswap_core.demos.measure import rule_commit

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path,
                    help="each fold's result measured with its control (demo_result.py --control)")
    ap.add_argument("--check", action="append", default=[], metavar="FOLD:STEP=FILE",
                    help="a control check's JSON (demo_control_check.py --json), per step")
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--docs", type=Path)
    a = ap.parse_args(argv)
    results = {}
    for path in a.results:
        res = json.loads(path.read_text())
        results[int(res.get("fold") or 1)] = res
    checks: dict[int, dict[int, dict]] = {f: {} for f in results}
    for spec in a.check:
        where, _, file = spec.partition("=")
        fold, _, step = where.partition(":")
        c = json.loads(Path(file).read_text())
        checks[int(fold)][int(step)] = {"raise": c["raise"], "passes": c["passes"],
                                        "n_items": c["n_items"], "control": c["control"]}
    out = control_result(results, checks, resamples=a.resamples,
                         rule_commit=rule_commit(rule=CONTROL_RULE_ID, module="control"))
    text = control_markdown(out)
    print(text)
    if a.json:
        tmp = a.json.with_name(a.json.name + ".tmp")
        tmp.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
        tmp.replace(a.json)
    if a.docs:
        doc = a.docs.read_text()
        if START not in doc or END not in doc:
            raise SystemExit(f"{a.docs}: no {START} ... {END} block to rewrite")
        head, rest = doc.split(START, 1)
        a.docs.write_text(head + START + "\n" + text + "\n" + END + rest.split(END, 1)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
