"""A template you write, in real Chromium: typed in the editor ("{A} apples and {B} pears make", the operator
picked), checked on the model and used; Path patching, Knockout and Paper run on it; it survives page changes and
a copied link opens it in a new browser context; five malformed templates each get a message."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from tests.app.test_templates import MALFORMED as APP_MALFORMED
from tests.e2e.conftest import WAIT, ask_all, goto, idle, shot
from tests.e2e.test_teach_browser import _nav

pytestmark = pytest.mark.e2e
TEMPLATE = "{A} apples and {B} pears make"
MARKED = "{A} apples [and] {B} pears make"
LABEL = f"yours: {MARKED} (add)"
MALFORMED = {text: message for text, message in APP_MALFORMED.items() if "[ ]" not in message}  # five


def _type(page, text: str) -> None:
    box = page.get_by_label("Template", exact=True)
    box.fill(text)
    box.press("Enter")
    idle(page)


def _error_text(page) -> str:
    alerts = page.locator("[data-testid='stMain'] [data-testid='stAlertContentError']")
    return " | ".join(alerts.nth(i).inner_text() for i in range(alerts.count()))


def _sidebar_has_template(page) -> None:
    """The sidebar's Templates box shows the written template (the combobox's value)."""
    page.wait_for_function(
        "(label) => [...document.querySelectorAll(\"[data-testid='stSidebar'] input[aria-label='Templates']\")]"
        ".some(i => i.value === label)", arg=LABEL, timeout=WAIT)


def test_a_written_template_runs_on_every_page_and_travels_in_a_link(server, browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    try:
        goto(page, server, "Templates")
        page.get_by_text("Write a template").first.wait_for(timeout=WAIT)
        idle(page)
        for text, message in MALFORMED.items():
            _type(page, text)
            page.locator("[data-testid='stMain'] [data-testid='stAlertContentError']", has_text=message).first.wait_for(
                timeout=WAIT)
            assert len(_error_text(page).split(" | ")) == 1, (text, _error_text(page))
            assert page.locator("[data-testid='stException']").count() == 0

        _type(page, TEMPLATE)
        page.locator("[data-testid='stMain'] [data-testid='stAlertContentError']",
                     has_text="Mark the word").first.wait_for(timeout=WAIT)
        page.locator("[data-testid='stSelectbox']", has_text="Operator word").click()
        page.get_by_role("option", name="and", exact=True).click()
        idle(page)
        assert not _error_text(page)
        use = page.get_by_role("button", name="Check the answers and use it on every page")
        use.wait_for(timeout=WAIT)
        assert MARKED in page.locator("[data-testid='stMain']").inner_text()
        use.click()
        page.get_by_text("every page now runs on them").first.wait_for(timeout=WAIT)
        idle(page)
        _sidebar_has_template(page)
        shot(page, "templates_editor")

        for title, marker in (("Path patching", "Key heads"), ("Knockout", "Key heads vs random heads")):
            _nav(page, title)
            ask_all(page)  # on a busy machine the page asks before computing
            page.get_by_text(marker).first.wait_for(timeout=WAIT)
            idle(page)
            _sidebar_has_template(page)
            assert not _error_text(page), (title, _error_text(page))
        _nav(page, "Paper")
        page.get_by_role("button", name="Findings (CSV)").wait_for(timeout=WAIT * 3)
        idle(page)
        _sidebar_has_template(page)
        shot(page, "templates_paper")
        link = page.url
    finally:
        ctx.close()

    query = parse_qs(urlsplit(link).query)
    assert query["tpl"] == [f"add:{MARKED}"] and "ops" not in query, query
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    try:
        page.goto(link.replace("/Paper", "/Path_patching"))
        ask_all(page)  # on a busy machine the page asks before computing
        page.get_by_text("Key heads").first.wait_for(timeout=WAIT)
        idle(page)
        _sidebar_has_template(page)
        warnings = page.locator("[data-testid='stAlertContentWarning']")
        assert not [warnings.nth(i).inner_text() for i in range(warnings.count())
                    if "Link parameter" in warnings.nth(i).inner_text()]
    finally:
        ctx.close()
