"""Regenerate the gallery's screenshots (docs/dashboard.md): every page of the dashboard in Debian's Chromium.

    make screenshots                      # every page, bundled model -> docs/screenshots/<page>.png
    .venv/bin/python docs/screenshots.py --pages Position_patching
    .venv/bin/python docs/screenshots.py --pages heatmap        # the README's picture only

Starts the dashboard on a free local port with a fresh result cache (so the computations shown are
real), opens each page, presses each button that asks before a computation (but the report's), waits until
Streamlit has finished its run, and saves a full-page PNG; then the README's picture, docs/heatmap.png: Path
patching with head 1.3 clicked, its heatmap and the head's attention.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from tests.e2e.conftest import ask_all, streamlit_server  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
HERO = "heatmap"
WAIT_MS = 600_000
#: pressing a button scrolls Streamlit's own container: back to the top before a picture
TO_TOP = "() => document.querySelectorAll('*').forEach(e => { if (e.scrollTop) e.scrollTop = 0; })"
IDLE = ("() => { const a = document.querySelector('[data-testid=\"stApp\"]');"
        " return !!a && a.getAttribute('data-test-script-state') === 'notRunning'; }")


def page_paths() -> list[str]:
    """URL paths of every page of the router (ui.nav.PAGES): "" is Home."""
    from ui.nav import PAGES
    return [p.url_path for p in PAGES]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", default=None, help="comma list of page paths (default: every page)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "screenshots")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=2000)
    args = ap.parse_args()
    paths = page_paths() if args.pages is None else args.pages.split(",")
    with_hero = args.pages is None or HERO in paths  # "--pages heatmap": the README's picture only
    paths = [p for p in paths if p != HERO]
    args.out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, ARITHLAB_CACHE=str(Path(tmp) / "results.duckdb"),
                   ARITHLAB_JOBS=str(Path(tmp) / "jobs"), HF_HUB_OFFLINE="1")
        with streamlit_server(env) as (url, _), sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            # Streamlit scrolls inside its own container: a tall viewport shows the whole page
            page = browser.new_page(viewport={"width": args.width, "height": args.height})
            for path in paths:
                page.goto(f"{url}/{path}")
                page.wait_for_selector("[data-testid='stAppViewContainer']", timeout=WAIT_MS)
                page.wait_for_timeout(1500)  # let the run start before waiting for its end
                page.wait_for_function(IDLE, timeout=WAIT_MS)
                ask_all(page)
                page.wait_for_timeout(1000)  # charts draw after the run
                page.evaluate(TO_TOP)
                target = args.out / f"{path or 'Home'}.png"
                page.screenshot(path=str(target), full_page=True)
                print(target)
            if with_hero:
                hero(page, url, REPO / "docs" / f"{HERO}.png")
            browser.close()
    return 0


def hero(page, url: str, target: Path) -> None:
    """The README's picture: Path patching with head 1.3 clicked, from its heatmap to the head's attention."""
    page.set_viewport_size({"width": 1400, "height": 1400})
    page.goto(f"{url}/Path_patching?head=1.3")
    page.wait_for_selector("[data-testid='stAppViewContainer']", timeout=WAIT_MS)
    page.wait_for_timeout(1500)
    page.wait_for_function(IDLE, timeout=WAIT_MS)
    ask_all(page)
    page.wait_for_timeout(1000)
    page.evaluate(TO_TOP)
    charts = page.locator("[data-testid='stVegaLiteChart']")
    first, second = charts.nth(0).bounding_box(), charts.nth(1).bounding_box()
    top, left = max(0, first["y"] - 60), max(0, first["x"] - 30)
    page.screenshot(path=str(target), full_page=True,
                    clip={"x": left, "y": top, "width": second["x"] + second["width"] + 30 - left,
                          "height": second["y"] + second["height"] + 20 - top})
    print(target)


if __name__ == "__main__":
    raise SystemExit(main())
