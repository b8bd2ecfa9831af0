"""Issue #62's check of an outer-layer control expert, before it is scaled to the language
expert's norms: swapped into the math expert (the app's default swap), its outer layers may
raise the math expert's English held-out NLL (English worked solutions of the fold's
validation variants) by no more than the language expert's outer layers do
(``demos.heldout.control_check``).

    python bench/demo_control_check.py --control /work/runs/fold1-control-v2/out \\
        [--fold 1] [--task REF --lang REF] [--limit N] [--threads 1] [--json OUT]

Fold 2: ``--fold 2 --task <fold 2's math expert> --lang <fold 2's Swahili expert>``. Exit 0
when the control passes, 1 when it does not.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    from layerswap_core.demos.heldout import DEMO_LANG, DEMO_TASK, control_check

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--control", required=True, help="the control expert (adapter folder or ref)")
    ap.add_argument("--task", default=DEMO_TASK)
    ap.add_argument("--lang", default=DEMO_LANG)
    ap.add_argument("--fold", type=int, default=1, choices=(1, 2))
    ap.add_argument("--limit", type=int, help="the first N validation items (by id)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="write the per-item values and statistics here")
    args = ap.parse_args(argv)
    t0 = time.time()
    res = control_check(args.control, task=args.task, lang=args.lang, fold=args.fold,
                        limit=args.limit, threads=args.threads,
                        progress=lambda m: print(m, file=sys.stderr, flush=True))
    res["seconds"] = round(time.time() - t0, 1)
    for who, st in res["raise"].items():
        print(f"{who}: {st['mean']:+.4f} [{st['ci_low']:+.4f}, {st['ci_high']:+.4f}], "
              f"{st['higher']}/{st['n_templates']} templates higher, sign p = {st['sign_p']:.2g}")
    print(f"swap {res['swap']}, {res['n_items']} items, {res['seconds']:.0f} s: the control "
          + ("passes" if res["passes"] else "does NOT pass")
          + " (its raise of the math expert's English NLL is "
          + ("at most" if res["passes"] else "more than") + " the language expert's)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0 if res["passes"] else 1


if __name__ == "__main__":
    sys.exit(main())
