"""Issue 12's acceptance test in real Chromium: one app state across pages, readable top-5 bars, an MLP
click, a model change that clears the picks with a note, and the Story page walked on the bundled model.

Pages are opened through the sidebar's navigation (one browser session: a full page load would start a
new Streamlit session with a fresh state)."""

from __future__ import annotations

import re

import pytest

from tests.e2e.conftest import WAIT, ask_all, click_at, goto, idle, shot

pytestmark = pytest.mark.e2e
PROMPT = "What is 7 times 8?"


def _nav(page, title: str) -> None:
    page.get_by_test_id("stSidebarNav").get_by_role("link", name=title, exact=True).click()
    idle(page)
    errors = page.locator("[data-testid='stException']")
    assert errors.count() == 0, (title, errors.first.inner_text())


def _bar_values(page, chart) -> list[tuple[float, str]]:
    """(x, text) of the printed values of a bar chart (Vega's SVG text marks), left to right."""
    return page.evaluate(
        "(el) => [...el.querySelectorAll('g.mark-text.role-mark text')].map(t => "
        "[t.getBoundingClientRect().x, t.textContent]).sort((a, b) => a[0] - b[0])", chart.element_handle())


def _chips(page, label: str) -> list[str]:
    box = page.locator("[data-testid='stMultiSelect']", has_text=label).first
    return sorted(t.get_attribute("aria-label") for t in box.locator("[data-tag]").all())


def test_prompt_state_bars_mlp_click_picks_and_model_change(server, page):
    goto(page, server, "Prompt_lab")
    page.get_by_text("Next token").first.wait_for(timeout=WAIT)
    idle(page)
    box = page.get_by_label("Prompt", exact=True)
    box.fill(PROMPT)
    box.press("Enter")
    page.get_by_text("7 * 8 = 56").first.wait_for(timeout=WAIT)
    idle(page)
    # top-5 bars: most likely first, each value printed on its bar
    chart = page.locator("[data-testid='stVegaLiteChart']").first
    chart.locator("g.mark-text.role-mark text").first.wait_for(timeout=60_000)
    shown = _bar_values(page, chart)
    values = [float(v) for _, v in shown]
    assert len(values) == 5 and values == sorted(values, reverse=True), shown
    shot(page, "teach_prompt_lab")

    # every analysis page analyses the typed prompt
    for title in ("Path patching", "MLP projections", "Knockout", "Story"):
        _nav(page, title)
        page.get_by_text(f"Typed prompt: {PROMPT}").first.wait_for(timeout=WAIT)
        # the sidebar's model box keeps showing the loaded model on every page (it was empty on every other one)
        assert page.get_by_label("Model", exact=True).input_value() == "organism", title
    _nav(page, "Prompt lab")
    assert page.get_by_label("Prompt", exact=True).input_value() == PROMPT

    # knockout picks survive leaving the page
    _nav(page, "Knockout")
    page.get_by_role("button", name="Top-3 heads").click()
    page.locator("[data-testid='stMultiSelect']", has_text="Heads to knock out").locator(
        "[data-tag]").nth(2).wait_for(timeout=WAIT)
    idle(page)
    picks = _chips(page, "Heads to knock out")
    assert len(picks) == 3, picks
    _nav(page, "Path patching")
    # a click on an MLP cell shows that layer's MLP view
    ask_all(page)  # on a busy machine the page asks before computing
    page.get_by_text("Key heads").first.wait_for(timeout=WAIT)
    cell = page.locator("[data-testid='stVegaLiteChart'] path[aria-label*='column: MLP']").first
    cell.wait_for(timeout=WAIT)
    layer = re.search(r"layer: (\d+)", cell.get_attribute("aria-label")).group(1)
    click_at(page, cell)
    page.locator("h3", has_text=f"MLP {layer}").first.wait_for(timeout=WAIT)
    page.get_by_text(f"The numbers MLP {layer} pushes most on your prompt").first.wait_for(timeout=WAIT)
    idle(page)
    shot(page, "teach_mlp_click")
    _nav(page, "Knockout")
    page.get_by_text("Key heads vs random heads").first.wait_for(timeout=WAIT)
    assert _chips(page, "Heads to knock out") == picks

    # another model: the picks are cleared, with a note
    from engine.models.spec import ORGANISM_DIR
    page.get_by_label("Model", exact=True).fill(str(ORGANISM_DIR))
    page.get_by_role("button", name="Load model").click()
    page.get_by_text("The model changed from").first.wait_for(timeout=WAIT)
    idle(page)
    assert _chips(page, "Heads to knock out") == []
    shot(page, "teach_model_changed")


def test_story_walks_every_step(server, page):
    goto(page, server, "Story")
    for i in range(1, 7):
        page.locator("h2", has_text=re.compile(rf"^{i} · ")).first.wait_for(timeout=WAIT)
        idle(page)
        # a step whose work is heavy waits for its button, the estimate on it (the knockout curve of this set)
        main = page.get_by_test_id("stMain")
        for _ in range(3):
            go = main.get_by_role("button", name=re.compile(r"\(estimated: about "))
            if not go.count():
                break
            go.first.click()
            idle(page)
        # the step's sentence (or the note that no job has finished): waited for, since the browser may still
        # be drawing the run's last elements when Streamlit reports the run finished
        page.locator(".story-sentence, [data-testid='stAlertContentInfo']").first.wait_for(timeout=30_000)
        assert page.locator("[data-testid='stException']").count() == 0, i
        assert page.locator("[data-testid='stAlertContentError']").count() == 0, i
        if i < 6:  # the last step has a chart once a fine-tuning job has finished on this model
            page.locator("[data-testid='stVegaLiteChart']").first.wait_for(timeout=WAIT)
            shot(page, f"teach_story_{i}")
            page.get_by_role("button", name="next →").click()
    page.get_by_text("Large fonts (presenting)").click()
    idle(page)
    size = page.evaluate("() => parseFloat(getComputedStyle(document.querySelector('h1')).fontSize)")
    assert size >= 47, size  # 3rem
    shot(page, "teach_story_last")
