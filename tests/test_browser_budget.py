"""The Evaluate and Sweep tabs in a real browser (headless Debian Chromium, Playwright): their
sliders' maxima are the caps that fit this server's job budget at the speed measured on the
visitor's models, and a line shows the estimate before anything is pressed, updated as the
sliders move (issue #51, item 2)."""
from __future__ import annotations

import pytest

from test_browser import _skip_reason, browser_page

pytestmark = pytest.mark.browser

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - CI installs it (requirements-dev.txt)
    sync_playwright = None

BUDGET = 20   # seconds per job: the tiny models' caps are then under the server's limits


@pytest.fixture
def tiny_page(tiny):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from app import serve_locally
    from layerswap_core.workbench import session as wb

    d = wb.dispatcher()
    before = d.job_seconds
    d.job_seconds = BUDGET
    # served mode: the caps and the budget are a shared server's (local mode has neither)
    demo, url = serve_locally({role: str(tiny[role]) for role in ("base", "task", "lang")},
                              served=True)
    yield url
    demo.close()
    d.job_seconds = before


def set_slider(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def test_the_sliders_offer_what_the_budget_runs_and_the_estimate_shows(tiny_page, tiny):
    from layerswap_core.workbench import models as wb_models
    from layerswap_core.workbench.evaluate import (evaluation_caps, evaluation_line,
                                                   session_roles)
    from layerswap_core.workbench.served import LIMITS, Access
    from layerswap_core.workbench.sweep import sweep_caps

    with browser_page() as page:
        page.goto(tiny_page)
        expect(page.locator("#models-status")).to_contain_text("Compatible", timeout=120_000)
        page.get_by_role("tab", name="Evaluate").click()
        line = page.locator("#eval-estimate")
        # the warm-up's measurement on these models, then the maxima that follow it
        expect(line).to_contain_text("tokens/s, measured on these models here",
                                     timeout=180_000)
        refs = [str(tiny[r]) for r in ("base", "task", "lang")]
        session, _ = wb_models.open_session(*refs, access=Access.from_env(True, trusted=refs))
        n, t = evaluation_caps(session)
        assert (n, t) < (LIMITS.eval_questions, LIMITS.new_tokens)   # the budget binds
        questions = page.locator("#n-items input[type=range]")
        tokens = page.locator("#eval-tokens input[type=range]")
        expect(questions).to_have_attribute("max", str(n), timeout=30_000)
        expect(tokens).to_have_attribute("max", str(t))
        # the line follows the sliders
        set_slider(page, "n-items", 1)
        set_slider(page, "eval-tokens", 8)
        expect(line).to_have_text(evaluation_line(session, 1, 8, session_roles(session)),
                                  timeout=30_000)
        # every slider at its maximum: the line says it fits, before Evaluate is pressed
        set_slider(page, "n-items", n)
        set_slider(page, "eval-tokens", t)
        want = evaluation_line(session, n, t, session_roles(session))
        assert want.startswith("About "), want
        expect(line).to_have_text(want, timeout=30_000)
        print(f"at the caps ({n} questions, {t} tokens): {want}")

        page.get_by_role("tab", name="Sweep").click()
        items = sweep_caps(session)
        sweep_n = page.locator("#sweep-n input[type=range]")
        if items > 1:
            expect(sweep_n).to_have_attribute("max", str(items), timeout=30_000)
        else:   # one item fits: the slider is held at it
            expect(sweep_n).to_be_disabled(timeout=30_000)
            expect(sweep_n).to_have_value("1")
        expect(page.locator("#sweep-estimate")).to_contain_text("configurations. About")
