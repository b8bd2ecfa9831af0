"""The outer-layer controls of the cross-fitted Swahili result (issue #62; the rules:
``demos.control``, rule 1 and its amendment ``CONTROL_RULE_ID``, each declared in its own commit
before the control it adds was measured on the eval items; the output records both commits).

    python bench/demo_control_check.py --control CK --json checks/f1-ckN.json    # each step
    python bench/demo_result.py --fold 1 --rounds 2 --n-validation 33 --threads 1 \\
        --control CONTROL1 --resume W1.json --json fold1-control.json
    python bench/demo_result.py --fold 2 ... --no-seeds --control CONTROL2 --resume W2.json \\
        --json fold2-control.json
    python bench/demo_control.py scaled=fold1-control.json scaled=fold2-control.json \\
        unscaled=fold1-unscaled.json unscaled=fold2-unscaled.json \\
        --check 1:4=checks/f1-ck4.json --check 1:8=... --scaled-check 1=checks/f1-scaled.json \\
        [--json assets/experts/demo_control.json] [--docs docs/demo.md]

Prints each control's pair (S1 and S2 scaled, S3 and S4 unscaled) and its declared sentence;
``--docs`` rewrites the block between ``<!-- control-result -->`` and ``<!-- /control-result -->``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    from layerswap_core.demos.control import (CONTROL_RULE_ID, control_markdown,
                                              control_result)
    from layerswap_core.demos.measure import rule_commit

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from demo_result import publish   # the demo result's own writers

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", metavar="CONTROL=FILE",
                    help="each fold's result measured with a control (demo_result.py --control), "
                    "CONTROL 'scaled' (rule 1) or 'unscaled' (rule 2)")
    ap.add_argument("--check", action="append", default=[], metavar="FOLD:STEP=FILE",
                    help="a control check's JSON (demo_control_check.py --json), per step")
    ap.add_argument("--scaled-check", action="append", default=[], metavar="FOLD=FILE",
                    help="the scaled control's own check (reported, decides nothing)")
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--docs", type=Path)
    a = ap.parse_args(argv)
    results: dict[str, dict[int, dict]] = {}
    for spec in a.results:
        name, _, file = spec.partition("=")
        res = json.loads(Path(file).read_text())
        results.setdefault(name, {})[int(res.get("fold") or 1)] = res

    def read(file: str) -> dict:
        c = json.loads(Path(file).read_text())
        return {k: c[k] for k in ("raise", "passes", "n_items", "control")}

    checks: dict[int, dict[int, dict]] = {f: {} for f in next(iter(results.values()))}
    for spec in a.check:
        where, _, file = spec.partition("=")
        fold, _, step = where.partition(":")
        checks[int(fold)][int(step)] = read(file)
    scaled = {int(f): read(file) for f, _, file in (s.partition("=") for s in a.scaled_check)}
    rules = {"control-rule-1": rule_commit(rule="control-rule-1 (issue 62)", module="control"),
             "control-rule-2": rule_commit(rule=CONTROL_RULE_ID, module="control")}
    out = control_result(results, checks, scaled_checks=scaled, resamples=a.resamples,
                         rule_commits=rules)
    return publish(control_markdown(out), out, a.json, a.docs, "control-result")


if __name__ == "__main__":
    raise SystemExit(main())
