"""The demo result on the page: the shipped measurement of the trio in use in words and a chart,
and Reproduce as a job kind of the dispatcher.

The measure, its statistics and its sentences are the demo room's (``demos.reproduce``); the
trio's words and its result file are its record's (``demos.trios``). What stays here needs
the engines (the job kind) or the figures (the chart), which sit above that room.
"""
from __future__ import annotations

from ..demos.reproduce import headline, measured_demo_result, reproduce_demo_result, sweep_markdown
from ..demos.crossfit import crossfit_headline, crossfit_markdown, measured_crossfit
from ..demos.trios import DemoTrio, first, for_refs
from ..engines.jobs import register_kind
from ..demos.measure import pooled_records, template_records
from .figures import effects_chart
from .figures_demo import template_strip

# The fewest templates a rerun's per-template picture is shown with: the fewest whose sign test
# can reach p < 0.05 (6 of 6 below 0: p = 0.031); a smaller rerun shows the shipped picture.
MIN_STRIP_TEMPLATES = 6


def trio_in_use(refs: dict | None) -> DemoTrio:
    """The demo trio whose words, defaults and shipped result the page shows for these models
    (``demos.trios.for_refs``)."""
    return for_refs(refs)


def demo_story(trio: DemoTrio) -> str:
    """The Reproduce accordion's text: what the trio's shipped result shows (its cross-fitted
    result where it has one), in its record's words."""
    crossed = measured_crossfit(trio)
    res = measured_demo_result(trio=trio.key)
    shown = (crossfit_headline(crossed[0]) if crossed else headline(res) if res else
             "No measured demo result is shipped with this install.")
    return trio.reproduce_story.replace("{result}", shown)


def measured_markdown(trio: DemoTrio) -> str:
    """The Evaluate tab's account of the trio's shipped measurement: the cross-fitted result
    where the trio has one, then its first fold's own."""
    res = measured_demo_result(trio=trio.key)
    if res is None:
        return "No measured demo result is shipped with this install."
    language = "" if trio == first() else f" --language {trio.key}"   # the bench's default
    rounds = f"--rounds {res['rounds']}" if res.get("rounds") else f"--n {res['n']}"
    own = (f"**Measured** with `python bench/demo_result.py{language} {rounds} "
           f"--n-validation {res['n_validation']}` on a 2-core CPU, {res['dtype']} (docs/demo.md "
           f"gives the times). " + headline(res) + "\n\n" + res["markdown"] + "\n\n"
           + sweep_markdown(res))
    crossed = measured_crossfit(trio)
    if crossed is None:
        return own
    others = "; ".join(f"fold {f}'s experts are `{m['task']}` and `{m['lang']}`"
                       for f, m in trio.folds.items())
    return (crossfit_markdown(crossed[0]) + f"\n\n**Fold 1 alone** (the trio above; {others}). "
            + own)


def result_chart(res: dict):
    """Each statistic with its 95% cluster-bootstrap interval, the primary one first."""
    return effects_chart(res["effects"], title=f"Question-specific NLL effects against the math "
                         f"expert ({res['n']} held-out variants, {res['n_templates']} templates)")


def _spec(res: dict, key: str) -> dict:
    return next(s for s in res["specs"] if s["key"] == key)


def template_chart(res: dict, key: str = "primary", title: str | None = None,
                   source: str = ""):
    """The per-template picture of one statistic of a result (the primary by default): a dot
    per template with the pooled mean and its interval (``figures_demo.template_strip`` of
    ``measure.template_records``, with the result's resamples and seed). The title: ``title``,
    else ``source`` (which result) and the statistic's label."""
    spec = _spec(res, key)
    return template_strip(template_records(res["items"], spec),
                          title=title or f"{source or 'Per template'}: {spec['label']}",
                          resamples=res.get("resamples", 10_000), seed=res.get("seed", 0))


def folds_template_chart(results: dict, key: str = "primary", title: str | None = None):
    """The cross-fitting's picture: each fold's result (fold -> result) by its own statistic
    ``key``, pooled with templates as the unit (``measure.pooled_records``, what
    ``pooled_primary`` pools), a colour per fold."""
    first_res = next(iter(results.values()))
    return template_strip(pooled_records({f: r["items"] for f, r in results.items()},
                                         {f: _spec(r, key) for f, r in results.items()}),
                          title=title or "Per template, both folds pooled: the swap vs the "
                          "math expert, question-specific",
                          resamples=first_res.get("resamples", 10_000),
                          seed=first_res.get("seed", 0))


def measured_template_chart(trio: DemoTrio, note: str = ""):
    """``template_chart`` of the trio's shipped result, labelled as such (``note`` after the
    label); both folds pooled where the trio has a cross-fitted result; None when none is
    shipped."""
    crossed = measured_crossfit(trio)
    if crossed is not None:
        out, folds = crossed
        return folds_template_chart(folds, title=(
            f"The shipped cross-fitted result ({out['n']} held-out variants{note}) per template: "
            "each fold's swap vs its math expert, question-specific"))
    res = measured_demo_result(trio=trio.key)
    return None if res is None else template_chart(res, source=(
        f"The shipped result ({res['n']} held-out variants{note}) per template"))


def rerun_template_chart(res: dict, trio: DemoTrio):
    """After Reproduce: the rerun's picture when it measured ``MIN_STRIP_TEMPLATES`` templates
    or more, else the shipped result's, saying why."""
    if res["n_templates"] >= MIN_STRIP_TEMPLATES:
        return template_chart(res, source=f"This rerun ({res['n']} held-out variants) per "
                              "template")
    return measured_template_chart(trio, note=(
        f"; this rerun's {res['n_templates']} templates are too few for the picture, under "
        f"{MIN_STRIP_TEMPLATES}"))


def measured_chart(trio: DemoTrio):
    """``result_chart`` of the trio's shipped result; None when none is shipped."""
    res = measured_demo_result(trio=trio.key)
    return None if res is None else result_chart(res)


def _demo_result_job(engine, job, progress=None) -> dict:
    """The "demo_result" job kind: ``reproduce_demo_result`` on the job's engine (settings: n,
    n_validation, lang: the question language of the trio in use)."""
    settings = {k: v for k, v in job.settings.items() if k in ("n", "n_validation", "lang")}
    return reproduce_demo_result(job.trio.refs, live=engine.live, progress=progress, **settings)


register_kind("demo_result", _demo_result_job)
