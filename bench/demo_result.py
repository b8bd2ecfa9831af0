"""The demo result from scratch: base / math expert / language expert / layer swap (the app's
default, and the best of a small sweep chosen on the validation variants) / uniform soup, on the
held-out GSM-Symbolic eval variants (Swahili, English), with paired McNemar comparisons.

    python bench/demo_result.py [--n 200] [--langs sw,en] [--n-validation 66] [--json OUT.json]
                                [--dtype bfloat16] [--base REF --task REF --lang REF]

Prints the markdown table, then the JSON (per model and language: n, correct, accuracy, 95% CI;
paired p-values; the sweep). Cached models are used where present (embedded experts are built
once). One CPU thread by default (OMP_NUM_THREADS); expect minutes per 100 variants per model.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    import torch

    from layerswap_core.checkpoints.loading import cpu_has_bf16
    from layerswap_core.training.demo_experts import DEMO_BASE, DEMO_LANG, DEMO_TASK
    from layerswap_core.workbench.demo import reproduce_demo_result

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--langs", default="sw,en")
    p.add_argument("--n-validation", type=int, default=66)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--base", default=DEMO_BASE)
    p.add_argument("--task", default=DEMO_TASK)
    p.add_argument("--lang", default=DEMO_LANG)
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="the live model's dtype (default: float32 on a CPU; bfloat16 is about "
                        "2x faster on a CPU with bf16 instructions, several times slower on "
                        "one without)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    if a.dtype == "bfloat16" and cpu_has_bf16() is False:
        print("note: this CPU has no bfloat16 instructions: bf16 runs several times slower here "
              "than float32", file=sys.stderr)
    res = reproduce_demo_result({"base": a.base, "task": a.task, "lang": a.lang}, n=a.n,
                                langs=tuple(a.langs.split(",")), n_validation=a.n_validation,
                                max_new_tokens=a.max_new_tokens,
                                dtype=getattr(torch, a.dtype) if a.dtype else None,
                                progress=lambda f, m: print(f"[{f:4.0%}] {m}", file=sys.stderr))
    print(res["markdown"])
    out = json.dumps({k: v for k, v in res.items() if k != "markdown"}, indent=1)
    print(out)
    if a.json:
        Path(a.json).write_text(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
