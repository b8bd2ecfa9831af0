"""The screenshots in docs/ of the embedded demo: Deltas, Evaluate and Chat tabs.

    python bench/screenshots.py [--out docs/screenshots] [--tabs deltas,evaluate,chat]

Serves the app on the embedded demo (base SmolLM2-135M-Instruct, the shipped math and Swahili
experts), drives it with headless Debian Chromium through Playwright (as tests/test_browser.py
does): analyzes the deltas, builds the default layer swap, opens the Evaluate tab (the measured
demo result) and asks the merged model the first Swahili chat example. Offline; a few minutes
on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def shoot(url: str, out: Path, chat_tokens: int, tabs=("deltas", "evaluate", "chat")) -> list[Path]:
    from playwright.sync_api import expect, sync_playwright

    from app import open_chromium
    from layerswap_core.workbench import session as wb
    from layerswap_core.workbench.chat import chat_examples

    out.mkdir(parents=True, exist_ok=True)
    shots = []
    with sync_playwright() as pw:
        browser = open_chromium(pw)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        expect(page.locator("#models-status")).to_contain_text("Compatible", timeout=120_000)

        def snap(name):
            page.wait_for_timeout(1500)
            shots.append(out / f"{name}.png")
            page.screenshot(path=str(shots[-1]), full_page=True)

        if "deltas" in tabs:
            page.get_by_role("tab", name="Deltas").click()
            page.locator("#analyze").click()
            expect(page.locator("#deltas-status")).to_contain_text("ready", timeout=600_000)
            expect(page.locator("#heatmaps .plot-container")).to_be_visible(timeout=60_000)
            snap("deltas")
        if "chat" in tabs:   # the merged model is built first (Build tab)
            page.get_by_role("tab", name="Build").click()
            page.locator("#build-btn").click()
            expect(page.locator("#build-status")).to_contain_text("Built in memory",
                                                                  timeout=600_000)
        if "evaluate" in tabs:
            page.get_by_role("tab", name="Evaluate").click()
            expect(page.locator("#demo-story")).to_be_visible(timeout=30_000)
            snap("evaluate")
        if "chat" in tabs:
            page.get_by_role("tab", name="Chat").click()
            page.locator("#chat-tokens input[type=number]").fill(str(chat_tokens))
            _, examples = chat_examples(wb.DEMO_REFS["lang"])
            page.locator("#chat-input textarea").fill(examples[0])
            page.locator("#chat-send").click()
            expect(page.locator("#chat-status")).to_contain_text("Done", timeout=600_000)
            snap("chat")
        browser.close()
    return shots


def main(argv=None) -> int:
    import app
    from layerswap_core.workbench import session as wb

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    p.add_argument("--chat-tokens", type=int, default=192)
    p.add_argument("--tabs", default="deltas,evaluate,chat")
    a = p.parse_args(argv)
    demo, url = app.serve_locally(dict(wb.DEMO_REFS))
    try:
        for f in shoot(url, Path(a.out), a.chat_tokens,
                       tuple(a.tabs.split(","))):
            print(f"{f} ({f.stat().st_size / 1024:.0f} KiB)")
    finally:
        demo.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
