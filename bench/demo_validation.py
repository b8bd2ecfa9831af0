"""A first look at a demo pair on the *validation* variants only (never the eval set): accuracy of
chosen models and layer swaps, per language, with the paired comparisons of each swap against
each expert. For choosing what to run ``bench/demo_result.py`` on, e.g. a new pair of experts,
when the full result would take hours on a CPU.

    python bench/demo_validation.py --base embedded:gemma3-270m --task MATH_DIR --lang SWAHILI_DIR \\
        [--n 66] [--langs sw,en] [--models task,lang,3-1,2-1,5-2,soup] [--json OUT.json]

``--models``: ``base``, ``task``, ``lang``, ``soup`` or ``B-U`` (a layer swap with B bottom and
U top layers from the language expert). Greedy, calculator on, float32, as the demo result.
The JSON keeps every output, and is rewritten after each model (a long run can be read early).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    import torch

    from layerswap_core.demos.measure import markdown_table, paired, score
    from layerswap_core.demos.variants import variant_items
    from layerswap_core.merge.config import MergeConfig
    from layerswap_core.merge.live import LiveModel
    from layerswap_core.demos.heldout import DEMO_BASE, DEMO_LANG, DEMO_TASK
    from layerswap_core.demos.reproduce import spread

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default=DEMO_BASE)
    p.add_argument("--task", default=DEMO_TASK)
    p.add_argument("--lang", default=DEMO_LANG)
    p.add_argument("--n", type=int, default=66)
    p.add_argument("--langs", default="sw,en")
    p.add_argument("--models", default="task,lang,3-1")
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)

    def config(m: str):
        if m in ("base", "task", "lang"):
            return m
        if m == "soup":
            return MergeConfig(method="soup", task=a.task, lang=a.lang, base=a.base)
        try:
            b, u = map(int, m.split("-"))
        except ValueError:
            p.error(f"--models: {m!r} is not base, task, lang, soup or B-U")
        return MergeConfig(bottom=b, top=u, task=a.task, lang=a.lang, base=a.base)

    names = {"task": "math expert", "lang": "language expert"}
    models = [(names.get(m, m if m in ("base", "soup") else f"swap b={m.replace('-', ' u=')}"),
               config(m)) for m in a.models.split(",")]
    live = LiveModel.from_refs(a.task, a.lang, a.base, dtype=torch.float32)
    t0 = time.time()
    scores, rows = [], []
    for lang in a.langs.split(","):
        items = spread(variant_items(lang, "validation"), a.n)
        for name, what in models:
            t = time.time()
            live.show(what)
            s = score(name, live.model, live.tokenizer, items, max_new_tokens=a.max_new_tokens)
            scores.append(s)
            rows.append({**s.summary(), "seconds": round(time.time() - t, 1),
                         "items": [it.id for it in items], "correct_items": s.correct,
                         "outputs": s.outputs})
            print(f"{lang} {name}: {rows[-1]['correct']}/{len(items)} ({rows[-1]['seconds']:.0f} s)",
                  file=sys.stderr, flush=True)
            if a.json:
                Path(a.json).write_text(json.dumps({"runs": rows}, indent=1))
    comparisons = []
    for lang in a.langs.split(","):
        here = [s for s in scores if s.lang == lang]
        experts = [n for n in ("math expert", "language expert") if any(s.model == n for s in here)]
        for s in here:
            if s.model.startswith("swap") and experts:
                comparisons += paired(here, s.model, experts)
    print(markdown_table([s.summary() for s in scores], comparisons))
    if a.json:
        Path(a.json).write_text(json.dumps({"runs": rows, "comparisons": comparisons,
                                            "refs": {"base": a.base, "task": a.task,
                                                     "lang": a.lang},
                                            "seconds": round(time.time() - t0, 1)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
