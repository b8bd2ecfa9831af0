"""Bengali on the page, in headless Debian Chromium (issue #52): one click picks the Gemma-3-270M
trio, the Chat tab shows the Bengali examples, a Bengali message gets a reply in Bengali script,
and Bengali glyphs render (a fresh Debian has no Bengali font: .ci/run installs fonts-beng).
The screenshot goes to $LAYERSWAP_BENGALI_SCREENSHOT (docs/bengali_chat.png) or the tmp dir."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from test_browser import _skip_reason, browser_page
from test_gemma_experts import needs_gemma

pytestmark = [pytest.mark.browser, needs_gemma]

GREETING = "আপনি কেমন আছেন?"   # "How are you?"
BENGALI = "[\u0980-\u09ff]"

# Two different Bengali letters drawn on a canvas: with no Bengali font both are the same box.
GLYPHS_DIFFER = """() => {
    const draw = (t) => { const c = document.createElement('canvas'); c.width = 64; c.height = 64;
        const x = c.getContext('2d'); x.font = '40px sans-serif'; x.fillText(t, 4, 48);
        return Array.from(x.getImageData(0, 0, 64, 64).data).join(','); };
    return draw('\u0995') !== draw('\u0996');
}"""


@pytest.fixture(scope="module")
def served_demo():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from app import serve_locally
    from layerswap_core.workbench import session as wb

    demo, url = serve_locally(dict(wb.DEMO_REFS))
    yield url
    demo.close()


def test_the_bengali_trio_in_one_click_and_a_bengali_chat(served_demo, tmp_path):
    from playwright.sync_api import expect

    from layerswap_core.workbench import session as wb

    shot = Path(os.environ.get("LAYERSWAP_BENGALI_SCREENSHOT") or tmp_path / "bengali.png")
    trio = wb.demo_trio_refs("bn")
    with browser_page() as page:
        page.goto(served_demo)
        status = page.locator("#models-status")
        expect(status).to_contain_text("Compatible", timeout=120_000)   # the Swahili demo
        assert page.evaluate(GLYPHS_DIFFER), "Bengali renders as boxes: no Bengali font"
        page.locator("#trio-bn").click()
        expect(page.locator("#models-table")).to_contain_text("gemma3-bengali",
                                                             timeout=300_000)
        expect(status).to_contain_text("Compatible", timeout=300_000)
        assert page.locator("#lang-ref input").input_value() == trio["lang"]
        # every demo text and default follows the trio in use (issue #61)
        page.get_by_role("tab", name="Evaluate").click()
        expect(page.locator("#eval-expectations")).to_contain_text("270M", timeout=60_000)
        assert "135M" not in page.locator("#eval-expectations").inner_text()
        assert page.locator("#eval-lang input").input_value() in ("bn", "Bengali")
        expect(page.locator("#demo-story")).to_contain_text("Bengali")
        assert "Swahili" not in page.locator("#demo-story").inner_text()
        page.get_by_role("tab", name="Chat").click()
        expect(page.locator("#chat-expectations")).to_contain_text("Bengali")
        assert "Swahili" not in page.locator("#chat-expectations").inner_text()
        page.get_by_role("tab", name="Build").click()
        page.locator("#build-btn").click()
        expect(page.locator("#build-status")).to_contain_text("Built in memory",
                                                              timeout=300_000)
        page.get_by_role("tab", name="Chat").click()
        expect(page.locator("#chat-examples-bn")).to_be_visible()
        expect(page.locator("#chat-examples-sw")).to_be_hidden()
        page.locator("#chat-tokens input[type=number]").fill("16")
        page.locator("#chat-input textarea").fill(GREETING)
        page.locator("#chat-send").click()
        expect(page.locator("#chat-status")).to_contain_text("Done", timeout=300_000)
        answer = page.locator("#chat-merged .message.bot").last
        expect(answer).to_contain_text(re.compile(BENGALI))
        print(f"\nmerged model's reply to {GREETING!r}: {answer.inner_text().strip()!r}")
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=False)
    assert shot.stat().st_size > 20_000
