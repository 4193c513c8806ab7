"""Shareable views in real Chromium: the address bar holds the app state (ui.url_state), so a link copied
in one browser context opens the same prompt, selection and knockouts in another (a new Streamlit
session); a link with a bad value says what it ignored and the page still renders."""

from __future__ import annotations

import os
import re
from urllib.parse import parse_qs, quote, urlsplit

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import WAIT, ask_all, click_at, goto, idle, shot, streamlit_server
from tests.e2e.test_teach_browser import _chips, _nav

pytestmark = pytest.mark.e2e
PROMPT = "What is 7 times 8?"
HEAD = (5, 3)  # the head clicked on the Path patching heatmap (the bundled model has 8 layers of 8 heads)


def _context(browser):
    return browser.new_context(viewport={"width": 1400, "height": 1000})


def _param(page, key: str, value: str | None) -> None:
    """Wait until the address bar's query parameter ``key`` is ``value`` (None: absent)."""
    page.wait_for_function("([k, v]) => new URLSearchParams(location.search).get(k) === v", arg=[key, value],
                           timeout=WAIT)


def _no_notes(page) -> None:
    alerts = page.locator("[data-testid='stAlertContentWarning']")
    texts = [alerts.nth(i).inner_text() for i in range(alerts.count())]
    assert not [t for t in texts if "Link parameter" in t or "The model changed" in t], texts


def test_a_copied_link_opens_the_same_view_in_a_new_browser_context(server, browser):
    ctx = _context(browser)
    page = ctx.new_page()
    try:
        # the prompt, on the Prompt lab
        goto(page, server, "Prompt_lab")
        page.get_by_text("Next token").first.wait_for(timeout=WAIT)
        idle(page)
        box = page.get_by_label("Prompt", exact=True)
        box.fill(PROMPT)
        box.press("Enter")
        page.get_by_text("7 * 8 = 56").first.wait_for(timeout=WAIT)
        idle(page)
        _param(page, "prompt", PROMPT)

        # a head, clicked on the Path patching heatmap
        _nav(page, "Path patching")
        ask_all(page)  # on a busy machine the page asks before computing
        page.get_by_text("Key heads").first.wait_for(timeout=WAIT)
        layer, head = HEAD
        cell = page.locator(f"[data-testid='stVegaLiteChart'] path[aria-label*='column: {head};']"
                            f"[aria-label*='layer: {layer};']").first
        cell.wait_for(timeout=WAIT)
        click_at(page, cell)
        page.locator("h3", has_text=f"Head {layer}.{head}").first.wait_for(timeout=WAIT)
        idle(page)
        _param(page, "head", f"{layer}.{head}")

        # the knockout set: the top-3 heads and an MLP, on the Knockout page
        _nav(page, "Knockout")
        page.get_by_text("Key heads vs random heads").first.wait_for(timeout=WAIT)
        page.get_by_role("button", name="Top-3 heads").click()
        page.locator("[data-testid='stMultiSelect']", has_text="Heads to knock out").locator(
            "[data-tag]").nth(2).wait_for(timeout=WAIT)
        idle(page)
        page.locator("[data-testid='stMultiSelect']", has_text="MLPs to knock out").click()
        page.get_by_role("option", name="1", exact=True).click()
        page.keyboard.press("Escape")
        page.locator("[data-testid='stMultiSelect']", has_text="MLPs to knock out").locator(
            "[data-tag]").first.wait_for(timeout=WAIT)
        idle(page)
        picks, mlps = _chips(page, "Heads to knock out"), _chips(page, "MLPs to knock out")
        assert len(picks) == 3 and mlps == ["1"], (picks, mlps)
        _param(page, "ko_mlp", "1")
        link = page.url
        shot(page, "share_link_source")
    finally:
        ctx.close()

    query = parse_qs(urlsplit(link).query)
    assert urlsplit(link).path.endswith("/Knockout"), link
    assert query["prompt"] == [PROMPT] and query["head"] == [f"{layer}.{head}"], query
    assert query["ko"] == [",".join(sorted(picks, key=lambda h: tuple(map(int, h.split(".")))))], query
    assert query["ko_mlp"] == ["1"] and "model" not in query, query

    # the link in a new browser context: a fresh session shows the same view
    ctx = _context(browser)
    page = ctx.new_page()
    try:
        page.goto(link)
        page.get_by_text("Key heads vs random heads").first.wait_for(timeout=WAIT)
        idle(page)
        assert page.locator("[data-testid='stException']").count() == 0
        _no_notes(page)
        assert _chips(page, "Heads to knock out") == picks
        assert _chips(page, "MLPs to knock out") == mlps
        page.get_by_text(f"Typed prompt: {PROMPT}").first.wait_for(timeout=WAIT)
        shot(page, "share_link_opened")
        _nav(page, "Path patching")
        page.locator("h3", has_text=f"Head {layer}.{head}").first.wait_for(timeout=WAIT)
        page.get_by_text(f"Typed prompt: {PROMPT}").first.wait_for(timeout=WAIT)
        _no_notes(page)
        _nav(page, "Prompt lab")
        assert page.get_by_label("Prompt", exact=True).input_value() == PROMPT
        page.get_by_text("7 * 8 = 56").first.wait_for(timeout=WAIT)
        assert parse_qs(urlsplit(page.url).query) == query  # the address bar still holds the same link
    finally:
        ctx.close()


def test_a_link_opened_first_on_a_freshly_started_dashboard(browser, tmp_path):
    """The first session of a new server process opens a link to a page (not Home): Streamlit would run that
    page without the router (a pages/ folder makes it a 'pages directory' app until st.navigation runs) --
    no link read, the folder's own page list; ui.session reruns it under the router."""
    env = dict(os.environ, ARITHLAB_CACHE=str(tmp_path / "results.duckdb"), ARITHLAB_JOBS=str(tmp_path / "jobs"),
               HF_HUB_OFFLINE="1")
    with streamlit_server(env, log=tmp_path / "server.log") as (url, _):
        ctx = _context(browser)
        page = ctx.new_page()
        try:
            page.goto(f"{url}/Knockout?ops=add&n=8&prompt={quote(PROMPT)}&ko=2.1,0.3&ko_mlp=1")
            page.get_by_text("Key heads vs random heads").first.wait_for(timeout=WAIT)
            idle(page)
            assert page.locator("[data-testid='stException']").count() == 0
            nav = page.get_by_test_id("stSidebarNav").inner_text().splitlines()
            assert "Path patching" in nav and "app" not in nav, nav  # the router's page list
            assert _chips(page, "Heads to knock out") == ["0.3", "2.1"]
            assert _chips(page, "MLPs to knock out") == ["1"]
            page.get_by_text(f"Typed prompt: {PROMPT}").first.wait_for(timeout=WAIT)
            _no_notes(page)
            _param(page, "ko", "0.3,2.1")  # written back in the link's canonical order
        finally:
            ctx.close()


def test_a_bad_link_says_what_it_ignored_and_the_page_renders(server, page):
    goto(page, server, f"Path_patching?head=99.99&ko=1.1,abc&prompt={quote(PROMPT)}")
    ask_all(page)  # on a busy machine the page asks before computing
    page.get_by_text("Key heads").first.wait_for(timeout=WAIT)
    idle(page)
    assert page.locator("[data-testid='stException']").count() == 0
    for text in ("Link parameter head=99.99 ignored", "Link parameter ko=1.1,abc ignored"):
        page.locator("[data-testid='stAlertContentWarning']", has_text=text).first.wait_for(timeout=WAIT)
    # the page shows its default (the top head), the prompt from the link, and the link without the bad values
    page.locator("h3", has_text="Head ").first.wait_for(timeout=WAIT)
    page.get_by_text(f"Typed prompt: {PROMPT}").first.wait_for(timeout=WAIT)
    _param(page, "head", None)
    _param(page, "ko", None)
    _param(page, "prompt", PROMPT)
    shot(page, "share_link_bad")


def test_home_opens_at_slash_home_and_at_the_root(server, page):
    """``/Home`` was "Page not found": it now opens Home, at its own address ``/``, with the link's parameters."""
    for path, query in ((f"Home?prompt={quote(PROMPT)}", {"prompt": [PROMPT]}), ("", {})):
        goto(page, server, path)
        page.get_by_text("Circuit summary").first.wait_for(timeout=WAIT)
        idle(page)
        assert page.locator("h1", has_text="Arithmetic-circuits lab").count() == 1, path
        assert page.get_by_text("Page not found").count() == 0, path
        assert page.locator("[data-testid='stException']").count() == 0, path
        # the link's prompt is the app state's: the address bar would drop it at its default
        assert urlsplit(page.url).path == "/" and parse_qs(urlsplit(page.url).query) == query, page.url


def test_a_class_link_keeps_the_story_step_large_fonts_and_a_pages_control(server, browser):
    """A teacher's link: the Story's step and Large fonts and the Knockout page's k travel in the address bar and
    reopen in a fresh browser context; at the large size the Story's charts draw their text larger, every label
    drawn and nothing cut (tests/e2e/chart_reader.py)."""
    from tests.e2e.chart_reader import chart_problems, read_charts
    ctx = _context(browser)
    page = ctx.new_page()
    try:
        goto(page, server, "Story?ops=add&n=8")  # a small set: its path patching takes a second
        page.locator("h2", has_text=re.compile(r"^1 · ")).first.wait_for(timeout=WAIT)
        idle(page)
        page.get_by_role("button", name="next →").click()
        page.locator("h2", has_text=re.compile(r"^2 · ")).first.wait_for(timeout=WAIT)
        idle(page)
        page.get_by_text("Large fonts (presenting)").click()
        _param(page, "large", "1")
        idle(page)
        _param(page, "step", "2")
        _nav(page, "Knockout")
        page.get_by_text("Where your prompt breaks").first.wait_for(timeout=WAIT)
        box = page.get_by_label("k", exact=True)
        box.fill("5")
        box.press("Enter")
        page.get_by_role("button", name="Top-5 heads").wait_for(timeout=WAIT)
        idle(page)
        _param(page, "ko_k", "5")
        link = page.url
    finally:
        ctx.close()
    assert {k: v for k, v in parse_qs(urlsplit(link).query).items() if k in ("step", "large", "ko_k")} == {
        "step": ["2"], "large": ["1"], "ko_k": ["5"]}, link

    ctx = _context(browser)
    page = ctx.new_page()
    try:
        page.goto(link)
        page.get_by_role("button", name="Top-5 heads").wait_for(timeout=WAIT)
        idle(page)
        # the box shows the link's k, polled for 20 s (read once after the run ended, it gave '1' once under a full
        # run's load, cause not established); a box that never shows 5 fails here
        expect(page.get_by_label("k", exact=True)).to_have_value("5", timeout=20_000)
        _no_notes(page)
        _nav(page, "Story")
        page.locator("h2", has_text=re.compile(r"^2 · ")).first.wait_for(timeout=WAIT)
        page.locator("[data-testid='stVegaLiteChart'] svg.marks").first.wait_for(timeout=WAIT)
        idle(page)
        size = page.evaluate("() => parseFloat(getComputedStyle(document.querySelector('h1')).fontSize)")
        assert size >= 47, size  # Large fonts: 3rem
        labels = page.evaluate("() => [...document.querySelectorAll('[data-testid=\"stVegaLiteChart\"] "
                               "g.role-axis-label text')].map(t => parseFloat(getComputedStyle(t).fontSize))")
        assert labels and min(labels) >= 16, labels  # the charts' text scaled too (12 px at the normal size)
        problems = [p for chart in read_charts(page) for p in chart_problems(chart)]
        assert not problems, problems
        shot(page, "share_link_story_large")
    finally:
        ctx.close()
