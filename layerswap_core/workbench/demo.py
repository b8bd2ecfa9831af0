"""The demo result: base, math expert, language expert, layer swaps and a uniform soup on the
held-out GSM-Symbolic variants (``evaluation.variants``), with paired comparisons.

One live model shows every model in turn. The best layer swap of a small sweep is chosen on the
``validation`` variants (Swahili), never on the ``eval`` variants it is then measured on.
``bench/demo_result.py`` and the app's "Reproduce the demo result" button both call
``reproduce_demo_result``.
"""
from __future__ import annotations

import time

from ..progress import Progress, say

SWEEP = ((2, 1), (3, 1), (4, 2), (5, 2), (6, 2), (8, 2))   # (bottom, top) layer counts tried
DEMO_LANGS = ("sw", "en")


def _configs(live, refs: dict) -> dict:
    from ..merge.config import MergeConfig

    common = dict(task=refs["task"], lang=refs["lang"], base=refs.get("base"))
    return {"layer swap (default)": MergeConfig.default_for(live.arch.num_layers, **common),
            "uniform soup": MergeConfig(method="soup", **common)}


def reproduce_demo_result(refs: dict, n: int = 200, langs=DEMO_LANGS, n_validation: int = 60,
                          progress: Progress | None = None, max_new_tokens: int = 192) -> dict:
    """The demo table as data: ``summaries`` (per model and language: n, correct, accuracy,
    95% interval), ``comparisons`` (each layer swap vs each expert, McNemar), the ``sweep`` on
    the validation set and the chosen configuration, ``markdown`` and ``seconds``."""
    from ..evaluation.demo_result import markdown_table, paired, score, score_models
    from ..evaluation.variants import variant_items
    from ..merge.config import MergeConfig
    from ..merge.live import LiveModel

    t0 = time.time()
    live = LiveModel.from_refs(refs["task"], refs["lang"], refs.get("base"))
    configs = _configs(live, refs)

    def shown(what):
        def get():
            live.show(what)
            return live.model, live.tokenizer
        return get

    # the sweep, on validation variants in the first language
    val = variant_items(langs[0], "validation")[:n_validation]
    sweep = []
    for i, (b, u) in enumerate(SWEEP):
        if b + u >= live.arch.num_layers:
            continue
        say(progress, 0.3 * i / len(SWEEP), f"sweep on validation: bottom {b}, top {u}")
        cfg = MergeConfig(bottom=b, top=u, task=refs["task"], lang=refs["lang"],
                          base=refs.get("base"))
        live.show(cfg)
        s = score(f"b={b} u={u}", live.model, live.tokenizer, val, max_new_tokens=max_new_tokens)
        sweep.append({"bottom": b, "top": u, **s.summary()})
    best = max(sweep, key=lambda r: (r["accuracy"], -r["bottom"] - r["top"]))
    configs["layer swap (best on validation)"] = MergeConfig(
        bottom=best["bottom"], top=best["top"], task=refs["task"], lang=refs["lang"],
        base=refs.get("base"))
    models = {"base": shown("base"), "math expert": shown("task"),
              "language expert": shown("lang"),
              **{name: shown(cfg) for name, cfg in configs.items()}}
    if not refs.get("base"):
        models.pop("base")
    summaries, comparisons = [], []
    for j, lang in enumerate(langs):
        items = variant_items(lang, "eval")[:n]
        scores = score_models(models, items, max_new_tokens=max_new_tokens, progress=lambda f, m, j=j:
                              say(progress, 0.3 + 0.7 * (j + f) / len(langs), m))
        summaries += [s.summary() for s in scores]
        for swap in ("layer swap (default)", "layer swap (best on validation)"):
            comparisons += paired(scores, swap, ["math expert", "language expert"])
    return {"summaries": summaries, "comparisons": comparisons, "sweep": sweep,
            "best": {"bottom": best["bottom"], "top": best["top"]},
            "markdown": markdown_table(summaries, comparisons), "n": n, "langs": list(langs),
            "seconds": round(time.time() - t0, 1)}
