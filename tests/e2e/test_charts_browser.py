"""Every chart of every page, read from what Chromium draws: on the bundled model and on SmolLM2.

Each page of the menu is opened, each of its tabs clicked and each of its "Compute ..." buttons pressed, and every
chart then shown is read from Vega's SVG (``tests/e2e/chart_reader.py``): on every categorical axis (tokens, layers,
heads, templates) one drawn label per category, none hidden by overlap and none on top of another; no text cut at
the chart's edge or truncated; no chart past the page's right edge; no chart that draws axes and no data.  The
Path patching page is read with a head selected, so its END-row attention bars are among the charts.
"""

from __future__ import annotations

import time
import urllib.parse

import pytest

from tests.conftest import TIMINGS
from tests.e2e.chart_reader import chart_problems, read_charts
from tests.e2e.conftest import ask_all, idle, shot
from tests.e2e.runs import charts_drawn

pytestmark = pytest.mark.e2e
WAIT = 600_000
#: buttons pressed on every page (a page's work behind a button: its charts are drawn after it)
PRESS = "Compute"
NEXT = "next →"  # the Story's next step
#: asking buttons left unpressed: the report (no chart on the page) and the Paper's findings (a table) --
#: and the edge circuits' curves (two rankings of every edge, then nine circuits of each, layer by layer: in the last
#: full run the walk's dashboard had not finished them 8 of 9 steps and many minutes in); their chart is
#: faithfulness_chart, read here on the node circuits' curves, and tests/app/test_edges_page.py computes the section
SKIP = ("Build the report", "Check the paper's findings", "edge circuits")
#: on a real model, also the Faithfulness page's edge work: every edge of SmolLM2's graph (123,211) scored, and the
#: circuits of its top edges run, takes minutes; their charts are read on the bundled model (6,637 edges)
EDGES = ("Score every edge", "circuits' curves")  # the edge section: every edge of a real model, minutes


def _idle(page) -> None:
    idle(page, WAIT)
    charts_drawn(page)  # Vega draws after the run ends


def _read(page, where: str, problems: list[str], seen: list[int]) -> None:
    for chart in read_charts(page):
        seen[0] += 1
        problems += [f"{where}, chart {chart['i']}: {p}" for p in chart_problems(chart)]


def _press_compute_buttons(page, skip: tuple[str, ...], limit: int = 6) -> None:
    """Press each button that asks before a computation, and each "Compute ..." button, once (pressing one may show
    another: a page's next panel), but those whose label holds one of ``skip``."""
    ask_all(page, skip=skip)
    pressed: set[str] = set()
    for _ in range(limit):
        buttons = [b for b in page.get_by_role("button").all() if b.is_visible()
                   and b.inner_text().strip().startswith(PRESS) and b.inner_text() not in pressed
                   and not any(s in b.inner_text() for s in skip)]
        if not buttons:
            return
        pressed.add(buttons[0].inner_text())
        buttons[0].click()
        _idle(page)
        ask_all(page, skip=skip)


def walk(page, base: str, query: str, name: str, skip: tuple[str, ...] = SKIP) -> tuple[list[str], int]:
    """Open every page with ``query``, press its compute buttons (but ``skip``), click every tab; the problems of
    every chart."""
    from ui.nav import PAGES
    problems: list[str] = []
    seen = [0]
    times = []
    for p in PAGES:
        t0 = time.time()
        page.goto(f"{base}/{p.url_path}?{query}")
        page.wait_for_selector("[data-testid='stAppViewContainer']", timeout=WAIT)
        _idle(page)
        title = p.title
        _press_compute_buttons(page, skip)
        _read(page, f"{name} / {title}", problems, seen)
        step = 1
        while (nxt := page.get_by_role("button", name=NEXT)).count() and nxt.first.is_enabled():
            nxt.first.click()  # the Story: every step's chart
            _idle(page)
            step += 1
            _press_compute_buttons(page, skip)
            _read(page, f"{name} / {title} / step {step}", problems, seen)
        tabs = page.locator("[data-testid='stTabs'] button[role='tab']")
        for t in range(1, tabs.count()):
            tab = tabs.nth(t)
            label = tab.inner_text()
            tab.click()
            _idle(page)
            _press_compute_buttons(page, skip)
            _read(page, f"{name} / {title} / {label}", problems, seen)
        shot(page, f"charts_{name}_{p.url_path or 'Home'}")
        times.append(f"{title} {time.time() - t0:.0f}s")
    TIMINGS.append(f"e2e: every chart, {name}, cold cache: " + ", ".join(times))
    return problems, seen[0]


@pytest.mark.parametrize("model", ["organism", "smollm2"])
def test_every_chart_draws_every_label(server, browser, model):
    query = {"head": "1.3", "n": "12"} if model == "organism" else {}  # 48 prompts: labels, not numbers, are read
    if model == "smollm2":
        from tests.helpers.smollm2 import smollm2_gguf_path
        query = {"model": str(smollm2_gguf_path()), "n": "12"}
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    try:
        problems, seen = walk(page, server, urllib.parse.urlencode(query), model,
                              SKIP if model == "organism" else (*SKIP, *EDGES))
    finally:
        ctx.close()
    assert seen >= 15, f"only {seen} charts were read"
    assert not problems, f"{len(problems)} defects in {seen} charts:\n" + "\n".join(problems)
