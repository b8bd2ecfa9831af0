"""A graded look at the demo's Swahili side: teacher-forced NLL of each validation variant's
Swahili worked solution after its Swahili question (the demo's prompt), per model, with paired
sign tests of each merge against each expert (item by item: which model makes the gold
solution more likely).

    python bench/demo_swap_nll.py [--n 40] [--swaps 5/2,2/1,5/0] [--threads 2] [--json OUT]
                                  [--base REF --task REF --lang REF]

Accuracy is 0-2% for every demo model in Swahili, so it cannot tell the models apart; the NLL of
the gold solution can. Validation variants only (``spread`` over the templates), never the eval
set. float32 (a CPU without bf16 instructions runs bf16 several times slower).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def sign_test(a: list[float], b: list[float]) -> dict:
    """Items where ``a`` is lower / higher than ``b``, and the exact two-sided sign-test p."""
    from layerswap_core.demos.measure import sign_test_p

    lower = sum(x < y for x, y in zip(a, b))
    higher = sum(x > y for x, y in zip(a, b))
    return {"lower": lower, "higher": higher, "p": sign_test_p(lower, higher)}


def main(argv=None) -> int:
    import torch

    from layerswap_core.inference.prompts import render_chat
    from layerswap_core.evaluation.runner import gold_nll
    from layerswap_core.demos.variants import variant_items
    from layerswap_core.merge.config import MergeConfig
    from layerswap_core.merge.live import LiveModel
    from layerswap_core.demos.heldout import DEMO_BASE, DEMO_LANG, DEMO_TASK
    from layerswap_core.demos.reproduce import spread

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=40, help="validation variants (spread over templates)")
    p.add_argument("--swaps", default="5/2,2/1,5/0", help="bottom/top layer counts to compare")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--base", default=DEMO_BASE)
    p.add_argument("--task", default=DEMO_TASK)
    p.add_argument("--lang", default=DEMO_LANG)
    p.add_argument("--json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    t0 = time.time()
    refs = dict(task=a.task, lang=a.lang, base=a.base)
    live = LiveModel.from_refs(**refs, dtype=torch.float32)
    items = spread(variant_items("sw", "validation"), a.n)
    prompts = [render_chat(live.tokenizer, it.question) for it in items]
    targets = [f"{it.solution}\n#### {it.answer}" for it in items]
    models = {"base": "base", "math expert": "task", "language expert": "lang"}
    for s in a.swaps.split(","):
        b, u = (int(x) for x in s.split("/"))
        models[f"layer swap b={b} u={u}"] = MergeConfig(bottom=b, top=u, **refs)
    models["uniform soup"] = MergeConfig(method="soup", **refs)
    nll = {}
    for name, what in models.items():
        live.show(what)
        nll[name] = gold_nll(live.model, live.tokenizer, prompts, targets)
        print(f"[{time.time() - t0:5.0f} s] {name}: mean {statistics.mean(nll[name]):.4f} "
              "nats/token", file=sys.stderr, flush=True)
    merges = [m for m in models if m not in ("base", "math expert", "language expert")]
    rows = [{"model": m, "vs": e, **sign_test(nll[m], nll[e]),
             "mean_difference": statistics.mean(nll[m]) - statistics.mean(nll[e])}
            for m in merges for e in ("math expert", "language expert")]
    print(f"| model | mean NLL, Swahili solution after Swahili question ({len(items)} "
          "validation variants) |\n|---|---:|")
    for name, v in nll.items():
        print(f"| {name} | {statistics.mean(v):.4f} |")
    print("\n| paired (sign test) | items lower | items higher | mean difference | p |\n"
          "|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} vs {r['vs']} | {r['lower']} | {r['higher']} | "
              f"{r['mean_difference']:+.4f} | {r['p']:.3g} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"n": len(items), "ids": [it.id for it in items],
                                            "nll": nll, "paired": rows,
                                            "seconds": round(time.time() - t0, 1)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
