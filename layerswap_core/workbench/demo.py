"""The demo result on the page: the shipped measurement of the trio in use in words and a chart,
and Reproduce as a job kind of the dispatcher.

The measure, its statistics and its sentences are the demo room's (``demos.reproduce``); the
trio's words and its result file are its record's (``demos.trios``). What stays here needs
the engines (the job kind) or the figures (the chart), which sit above that room.
"""
from __future__ import annotations

from ..demos.reproduce import headline, measured_demo_result, reproduce_demo_result, sweep_markdown
from ..demos.trios import DemoTrio, first, for_refs
from ..engines.jobs import register_kind
from ..demos.measure import template_means
from .figures import effects_chart, template_strip


def trio_in_use(refs: dict | None) -> DemoTrio:
    """The demo trio whose words, defaults and shipped result the page shows for these models
    (``demos.trios.for_refs``)."""
    return for_refs(refs)


def demo_story(trio: DemoTrio) -> str:
    """The Reproduce accordion's text: what the trio's shipped result shows, in its record's
    words."""
    res = measured_demo_result(trio=trio.key)
    shown = headline(res) if res else "No measured demo result is shipped with this install."
    return trio.reproduce_story.replace("{result}", shown)


def measured_markdown(trio: DemoTrio) -> str:
    """The Evaluate tab's account of the trio's shipped measurement."""
    res = measured_demo_result(trio=trio.key)
    if res is None:
        return "No measured demo result is shipped with this install."
    language = "" if trio == first() else f" --language {trio.key}"   # the bench's default
    return (f"**Measured** with `python bench/demo_result.py{language} --n {res['n']} "
            f"--n-validation {res['n_validation']}` on a 2-core CPU, {res['dtype']} (docs/demo.md "
            f"gives the times). " + headline(res) + "\n\n" + res["markdown"] + "\n\n"
            + sweep_markdown(res))


def result_chart(res: dict):
    """Each statistic with its 95% cluster-bootstrap interval, the primary one first."""
    return effects_chart(res["effects"], title=f"Question-specific NLL effects against the math "
                         f"expert ({res['n']} held-out variants, {res['n_templates']} templates)")


def template_chart(res: dict, key: str = "primary"):
    """The per-template picture of one statistic of a result (the primary by default): a dot
    per template with the mean and its interval, not only the pooled number."""
    spec = next(s for s in res["specs"] if s["key"] == key)
    row = next(e for e in res["effects"] if e["key"] == key)
    return template_strip(template_means(res["items"], spec), row,
                          title=f"The primary statistic per template: {row['lower']} of "
                          f"{row['n_templates']} templates below 0, sign test p = "
                          f"{row['sign_p']:.2g}" if key == "primary" else None)


def measured_template_chart(trio: DemoTrio):
    """``template_chart`` of the trio's shipped result; None when none is shipped."""
    res = measured_demo_result(trio=trio.key)
    return None if res is None else template_chart(res)


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
