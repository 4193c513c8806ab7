"""Benchmark: Intervene's live update as a user sees it -- the dashboard in Chromium on the bundled model, warm, one
slider move at a time (the factor of "scale" on head 1.3, from -3 to 3 and back: the distribution changes at each).

Measured from the key press to (a) the P(answer) and answer-logit metrics showing their new values and (b) the
chart's bars redrawn, over ``--steps`` moves after two warm-up moves.  Each move is one forward pass (the typed
prompt's own pass is kept while it does not change: 1 forward-equivalent of the one prompt).  Target: < 300 ms.

    .venv/bin/python bench/intervene_page.py            # starts its own dashboard on a temporary cache
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from tests.e2e.conftest import streamlit_server
from tests.e2e.runs import idle, record

METRICS = "[...document.querySelectorAll('[data-testid=stMetricValue]')].map(m => m.innerText).join('|')"
BARS = ("[...document.querySelectorAll('[data-testid=stVegaLiteChart] g.mark-rect path, "
        "[data-testid=stVegaLiteChart] g.mark-text text')].map(p => (p.getAttribute('d') || '') + p.textContent)"
        ".join('|')")


def measure(url: str, steps: int) -> tuple[list[float], list[float]]:
    """(ms to the new metrics, ms to the redrawn chart) of each move after the warm-up."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium")
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        record(pg)  # idle reads the page's runs (tests/e2e/runs.py)
        pg.goto(url + "/Intervene?prompt=Q%3A+What+is+7+plus+8%3F+A%3A")
        pg.wait_for_selector("[data-testid='stAppViewContainer']")
        idle(pg)
        box = pg.locator("[data-testid='stMain'] [data-testid='stMultiSelect']").first
        box.click()
        pg.keyboard.type("1.3")
        pg.keyboard.press("Enter")
        pg.keyboard.press("Escape")
        idle(pg)
        pg.get_by_role("button", name="Remove 0.0").first.click()
        idle(pg)
        pg.get_by_text("scale", exact=True).click()
        idle(pg)
        slider = pg.get_by_role("slider").first
        numbers, charts = [], []
        for i in range(steps + 2):
            m0, c0 = pg.evaluate(f"() => [{METRICS}, {BARS}]")
            slider.focus()
            t0 = time.perf_counter()
            pg.keyboard.press("End" if i % 2 == 0 else "Home")
            pg.wait_for_function(f"(b) => ({METRICS}) !== b", arg=m0, timeout=20_000, polling="raf")
            t1 = time.perf_counter()
            pg.wait_for_function(f"(b) => ({BARS}) !== b", arg=c0, timeout=20_000, polling="raf")
            t2 = time.perf_counter()
            idle(pg)
            if i >= 2:
                numbers.append(1000 * (t1 - t0))
                charts.append(1000 * (t2 - t0))
        browser.close()
    return numbers, charts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=24)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, ARITHLAB_CACHE=str(Path(tmp) / "results.duckdb"), HF_HUB_OFFLINE="1")
        with streamlit_server(env, log=Path(tmp) / "server.log") as (url, _):
            numbers, charts = measure(url, args.steps)
    print("| what the user sees | median ms | p90 ms | max ms | moves | forward-equivalents per move |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, t in (("the new P(answer) and answer logit", numbers), ("the chart redrawn", charts)):
        w = sorted(t)
        print(f"| {name} | {statistics.median(w):.0f} | {w[int(0.9 * len(w))]:.0f} | {w[-1]:.0f} | {len(w)} | 1 |")


if __name__ == "__main__":
    main()
