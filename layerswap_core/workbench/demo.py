"""The demo result: base, math expert, language expert, layer swaps and a uniform soup on the
held-out GSM-Symbolic variants (``evaluation.variants``), with paired comparisons.

One live model shows every model in turn. The best layer swap of a small sweep is chosen on the
``validation`` variants (Swahili), never on the ``eval`` variants it is then measured on.
``bench/demo_result.py`` and the app's "Reproduce the demo result" button both call
``reproduce_demo_result``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..engines.jobs import register_kind
from ..progress import Progress, say

SWEEP = ((2, 1), (3, 1), (4, 2), (5, 2), (6, 2), (8, 2))   # (bottom, top) layer counts tried
DEMO_LANGS = ("sw", "en")
RESULT_FILE = "demo_result.json"   # the measured result, shipped beside the demo experts


def _configs(live, refs: dict) -> dict:
    from ..merge.config import MergeConfig

    common = dict(task=refs["task"], lang=refs["lang"], base=refs.get("base"))
    return {"layer swap (default)": MergeConfig.default_for(live.arch.num_layers, **common),
            "uniform soup": MergeConfig(method="soup", **common)}


def spread(items: list, n: int) -> list:
    """``n`` items evenly spaced over the list (all when ``n`` >= its length): the variant lists
    are in template order, so a spread sample covers every template, a prefix only the first."""
    if n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def best_of(sweep: list[dict]) -> dict:
    """The sweep's best row: highest validation accuracy, the smaller swap on ties."""
    return max(sweep, key=lambda r: (r["accuracy"], -r["bottom"] - r["top"]))


def suggestion(refs: dict) -> dict:
    """What the Deltas tab suggests for these experts (``analysis.suggest_config``) and its
    one-sentence story, to report beside the sweep's choice."""
    from ..analysis.deltas import delta_stats
    from ..analysis.suggest import delta_story, suggest_config

    task = delta_stats(refs["base"], refs["task"], label="math expert")
    lang = delta_stats(refs["base"], refs["lang"], label="language expert")
    s = suggest_config(task, lang, task.num_layers)
    return {**s.merge_config_kwargs(), "story": delta_story(task, lang)}


def reproduce_demo_result(refs: dict, n: int = 200, langs=DEMO_LANGS, n_validation: int = 66,
                          progress: Progress | None = None, max_new_tokens: int = 192,
                          dtype=None, live=None) -> dict:
    """The demo table as data: ``summaries`` (per model and language: n, correct, accuracy,
    95% interval), ``comparisons`` (each layer swap vs each expert, McNemar), the ``sweep`` on
    the validation set and the chosen configuration, ``markdown`` and ``seconds``. ``dtype``:
    the live model's (default: ``merge.live.live_dtype``, float32 for a small model on a CPU).
    ``live``: a ``LiveModel`` over these refs to use (an engine's); default: one made here."""
    from ..evaluation.demo_result import markdown_table, paired, score, score_models
    from ..evaluation.variants import variant_items
    from ..merge.config import MergeConfig
    from ..merge.live import LiveModel

    t0 = time.time()
    if live is None:
        live = LiveModel.from_refs(refs["task"], refs["lang"], refs.get("base"), dtype=dtype)
    configs = _configs(live, refs)

    def shown(what):
        def get():
            live.show(what)
            return live.model, live.tokenizer
        return get

    # the sweep, on validation variants in the first language
    val = spread(variant_items(langs[0], "validation"), n_validation)
    sweep = []
    for i, (b, u) in enumerate(SWEEP):
        if b + u >= live.arch.num_layers:
            continue
        say(progress, 0.3 * i / len(SWEEP), f"sweep on validation: bottom {b}, top {u}")
        cfg = MergeConfig(bottom=b, top=u, task=refs["task"], lang=refs["lang"],
                          base=refs.get("base"))
        live.show(cfg)
        s = score(f"b={b} u={u}", live.model, live.tokenizer, val, max_new_tokens=max_new_tokens,
                  progress=lambda f, m, i=i, b=b, u=u: say(   # Cancel between tokens
                      progress, 0.3 * (i + f) / len(SWEEP),
                      f"sweep on validation: bottom {b}, top {u}: {m}"))
        sweep.append({"bottom": b, "top": u, **s.summary()})
    best = best_of(sweep)
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
        items = spread(variant_items(lang, "eval"), n)
        scores = score_models(models, items, max_new_tokens=max_new_tokens, progress=lambda f, m, j=j:
                              say(progress, 0.3 + 0.7 * (j + f) / len(langs), m))
        summaries += [s.summary() for s in scores]
        for swap in ("layer swap (default)", "layer swap (best on validation)"):
            comparisons += paired(scores, swap, ["math expert", "language expert"])
    return {"summaries": summaries, "comparisons": comparisons, "sweep": sweep,
            "best": {"bottom": best["bottom"], "top": best["top"]},
            "suggestion": suggestion(refs) if refs.get("base") else None,
            "markdown": markdown_table(summaries, comparisons), "n": n, "langs": list(langs),
            "dtype": str(live.dtype).removeprefix("torch."), "max_new_tokens": max_new_tokens,
            "seconds": round(time.time() - t0, 1)}


def measured_demo_result(path: str | Path | None = None) -> dict | None:
    """The shipped measurement (``bench/demo_result.py --json``), with its markdown table
    rebuilt from the counts; None when none is shipped."""
    from ..evaluation.demo_result import markdown_table
    from ..checkpoints.embedded import ASSETS

    p = Path(path) if path else ASSETS / RESULT_FILE
    if not p.is_file():
        return None
    res = json.loads(p.read_text())
    res["markdown"] = markdown_table(res["summaries"], res["comparisons"])
    return res


def sweep_markdown(res: dict) -> str:
    """The sweep on the validation variants and the suggestion of the delta analysis, in words."""
    rows = " · ".join(f"b={r['bottom']} u={r['top']}: {r['correct']}/{r['n']}"
                      for r in res["sweep"])
    best = res["best"]
    text = (f"Sweep on the validation variants ({res['sweep'][0]['lang']}): {rows}; best "
            f"bottom {best['bottom']}, top {best['top']}.")
    s = res.get("suggestion")
    if s:
        text += (f" The Deltas tab suggests bottom {s['bottom']}, top {s['top']}, transitions "
                 f"{s['transition_bottom']}/{s['transition_top']}"
                 + (f", partition {s['partition']}" if s.get("partition") else "") + ".")
    return text


def measured_markdown() -> str:
    """The Evaluate tab's account of the shipped measurement."""
    res = measured_demo_result()
    if res is None:
        return "No measured demo result is shipped with this install."
    minutes = res["seconds"] / 60
    dtype = f" --dtype {res['dtype']}" if res.get("dtype") else ""
    return (f"**Measured** with `python bench/demo_result.py --n {res['n']}{dtype}` "
            f"({minutes:.0f} min on a 2-core CPU): accuracy on {res['n']} held-out variants per language, 95% "
            f"Wilson intervals, then exact McNemar tests of each swap against each expert.\n\n"
            + res["markdown"] + "\n\n" + sweep_markdown(res))


def _demo_result_job(engine, job, progress=None) -> dict:
    """The "demo_result" job kind: ``reproduce_demo_result`` on the job's engine (settings: n,
    n_validation, max_new_tokens)."""
    settings = {k: v for k, v in job.settings.items() if k != "work_items"}
    return reproduce_demo_result(job.trio.refs, live=engine.live, progress=progress, **settings)


register_kind("demo_result", _demo_result_job)
