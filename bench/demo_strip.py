"""Not a measure: the per-template picture of each shipped demo result, for the docs.

    python bench/demo_strip.py [--languages sw,bn] [--out docs/img] [--width 820] [--scale 1]

For each demo trio (``demos.trios``) with a shipped result file, the page's own figure (its
cross-fitted result's, both folds pooled, where it has one: ``workbench.demo.folds_template_chart``;
else ``workbench.demo.template_chart``: the primary statistic per template, the pooled mean with
its 95% cluster-bootstrap interval, the counts and the sign test, all from ``demos.measure``)
rendered by headless Debian Chromium through Playwright (plotly.js inlined, nothing fetched;
kaleido is not a dependency) to ``OUT/demo_strip_<language>.png`` (scale 1: about 100 dpi).
Offline; a few seconds a figure.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def render(fig, png: Path, width: int, scale: float) -> Path:
    """``fig`` as a PNG of ``width`` CSS pixels (its own height) through headless Chromium."""
    from playwright.sync_api import sync_playwright

    from app import open_chromium

    fig.update_layout(width=width)
    with tempfile.TemporaryDirectory() as tmp:
        html = Path(tmp) / "figure.html"
        fig.write_html(str(html), include_plotlyjs=True, full_html=True,
                       config={"staticPlot": True, "displayModeBar": False})
        with sync_playwright() as pw:
            browser = open_chromium(pw)
            page = browser.new_page(viewport={"width": width + 40, "height": 600},
                                    device_scale_factor=scale)
            page.goto(html.as_uri())
            page.locator(".plot-container").first.wait_for(timeout=60_000)
            png.parent.mkdir(parents=True, exist_ok=True)
            page.locator(".js-plotly-plot").first.screenshot(path=str(png))
            browser.close()
    return png


def main(argv=None) -> int:
    from layerswap_core.demos.reproduce import measured_demo_result
    from layerswap_core.demos.trios import DEMOS
    from layerswap_core.demos.crossfit import measured_crossfit
    from layerswap_core.workbench.demo import folds_template_chart, template_chart

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--languages", default=",".join(t.language for t in DEMOS.values()),
                   help="question languages of the demo trios to draw (default: all)")
    p.add_argument("--out", default=str(ROOT / "docs" / "img"))
    p.add_argument("--width", type=int, default=820, help="CSS pixels")
    p.add_argument("--scale", type=float, default=1.0, help="device pixels per CSS pixel")
    a = p.parse_args(argv)
    wanted = a.languages.split(",")
    for trio in DEMOS.values():
        if trio.language not in wanted:
            continue
        res = measured_demo_result(trio=trio.key)
        if res is None:
            print(f"{trio.key}: no shipped result, skipped")
            continue
        crossed = measured_crossfit(trio)
        if crossed:     # both folds pooled, a colour per fold
            out, folds = crossed
            fig = folds_template_chart(folds, title=(
                f"{trio.label}, the shipped cross-fitted result ({out['n']} held-out variants, "
                f"{out['n_templates']} templates): each fold's swap minus its math expert, "
                "question-specific, per template"))
        else:
            fig = template_chart(res, title=f"{trio.label}, the shipped result ({res['n']} "
                                 "held-out variants): the swap minus the math expert, "
                                 "question-specific, per template")
        png = render(fig, Path(a.out) / f"demo_strip_{trio.language}.png", a.width, a.scale)
        print(f"{png} ({png.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
