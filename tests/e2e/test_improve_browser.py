"""The Improve page in real Chromium: start a precise-SFT job, reload the page mid-run, see base vs tuned."""

from __future__ import annotations

import time

import pytest

from tests.conftest import TIMINGS
from tests.e2e.conftest import idle, shot

pytestmark = pytest.mark.e2e
WAIT = 300_000


def test_job_survives_reload_and_ends_in_the_comparison(server, page):
    page.goto(f"{server}/Improve")
    page.get_by_text("1 · Train").first.wait_for(timeout=WAIT)
    idle(page, WAIT)
    page.get_by_role("spinbutton", name="Max steps (0 = no limit)").fill("40")
    page.get_by_role("textbox", name="Save as").fill("e2e-precise")
    t0 = time.time()
    page.get_by_role("button", name="Start fine-tuning").click()
    page.get_by_text("2 · Progress").first.wait_for(timeout=WAIT)
    assert "job=" in page.url  # the job id is in the address: a reload finds it again
    page.reload()
    page.get_by_text("2 · Progress").first.wait_for(timeout=WAIT)
    page.get_by_text("3 · Base vs tuned").first.wait_for(timeout=WAIT)
    page.get_by_text("skill (held-out)").first.wait_for(timeout=WAIT)
    idle(page, WAIT)
    elapsed = time.time() - t0
    assert page.locator("[data-testid='stException']").count() == 0
    body = page.locator("[data-testid='stMain']").inner_text()
    assert "skill (held-out)" in body and "control facts" in body, body[-3000:]
    assert "finished · step 40/40" in body
    line = f"e2e: Improve page, 40-step precise SFT job (with a reload) to the base-vs-tuned view: {elapsed:.1f}s"
    print(line)
    TIMINGS.append(line)
    shot(page, "improve_compare")
    # the Story's last step shows this job's comparison
    page.get_by_test_id("stSidebarNav").get_by_role("link", name="Story", exact=True).click()
    idle(page, WAIT)
    for _ in range(5):
        page.get_by_role("button", name="next →").click()
        idle(page, WAIT)
    page.get_by_text("6 · Improve with precise SFT").first.wait_for(timeout=WAIT)
    page.locator(".story-sentence", has_text="skill (held-out)").first.wait_for(timeout=WAIT)
    assert page.locator("[data-testid='stException']").count() == 0
    shot(page, "story_improve")
    # one click loads the tuned model on every page, the sidebar's box included
    page.get_by_test_id("stSidebarNav").get_by_role("link", name="Improve", exact=True).click()
    page.get_by_text("3 · Base vs tuned").first.wait_for(timeout=WAIT)
    page.get_by_role("button", name="Use the tuned model in every page").click()
    page.wait_for_function("() => { const i = "
                           "[...document.querySelectorAll('section[data-testid=\"stSidebar\"] input')]"
                           ".find(e => e.getAttribute('aria-label') === 'Model'); "
                           "return i && i.value.endsWith('e2e-precise'); }", timeout=WAIT)
    idle(page, WAIT)
    assert page.locator("[data-testid='stException']").count() == 0
