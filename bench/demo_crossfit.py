"""The cross-fitted demo result (issue #62): both folds' results pooled by the declared rule
(``demos.crossfit``; the rule: ``demos.measure`` RULE_ID, declared in its own commit before
fold 2 was evaluated, which the output records).

    python bench/demo_result.py --fold 1 --rounds 2 --json fold1.json [--resume w1.json]
    python bench/demo_result.py --fold 2 --rounds 2 --task embedded:smollm2-math-en-fold2 \\
        --lang embedded:smollm2-swahili-fold2 --no-seeds \\
        --control embedded:smollm2-english-prose-control-fold2 --json fold2.json
    python bench/demo_crossfit.py fold1.json fold2.json \\
        [--json assets/experts/demo_crossfit.json] [--docs docs/demo.md]

Prints the pooled statistics and the declared sentence; ``--docs`` rewrites the block between
``<!-- crossfit-result -->`` and ``<!-- /crossfit-result -->``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    from layerswap_core.demos.crossfit import crossfit_markdown, crossfit_result
    from layerswap_core.demos.measure import rule_commit

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from demo_result import publish   # the demo result's own writers

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+", type=Path, help="each fold's result (demo_result.py "
                    "--fold N --rounds 2 --json)")
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--docs", type=Path)
    a = ap.parse_args(argv)
    results = {}
    for path in a.results:
        res = json.loads(path.read_text())
        results[int(res.get("fold") or 1)] = res
    out = crossfit_result(results, rule_commit=rule_commit(), resamples=a.resamples)
    return publish(crossfit_markdown(out), out, a.json, a.docs, "crossfit-result")


if __name__ == "__main__":
    raise SystemExit(main())
