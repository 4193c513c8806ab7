"""Start the dashboard on a free port and drive it with Playwright in Debian's Chromium.

The ``browser`` fixture lives in ``tests/conftest.py`` (one Chromium for every browser test);
:func:`streamlit_server` is shared with ``tests/reliability``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import pytest

from tests.e2e.runs import charts_drawn, idle
from tests.helpers.shared import shared_folder

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_streamlit(env: Mapping[str, str], *, port: int | None = None, log: Path | None = None,
                    args: Sequence[str] = ("--server.address", "127.0.0.1"), own_session: bool = False
                    ) -> tuple[str, subprocess.Popen]:
    """Start ``python -m ui.serve app.py`` (``streamlit run``, see ui/serve.py; cwd = repo root, so
    ``.streamlit/config.toml`` applies) and wait until it answers its health check: (url, process).  Output goes
    to ``log`` (or a pipe read only on a failed start); ``own_session``: in a process group of its own (a server
    that outlives the process that started it)."""
    port = port or _free_port()
    out = open(log, "wb") if log is not None else subprocess.PIPE
    proc = subprocess.Popen(
        [sys.executable, "-m", "ui.serve", str(REPO / "app.py"), *args, "--server.port", str(port),
         "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=REPO, env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=own_session)
    if log is not None:
        out.close()  # the child holds its own copy
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200:
                break
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    else:
        proc.kill()
    if proc.poll() is not None:
        text = (log.read_bytes() if log is not None else proc.stdout.read()).decode(errors="replace")
        raise RuntimeError("streamlit did not start: " + text[-2000:])
    return url, proc


def stop_streamlit(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def streamlit_server(env: Mapping[str, str], *, port: int | None = None, log: Path | None = None,
                     args: Sequence[str] = ("--server.address", "127.0.0.1")) -> Iterator[tuple[str, subprocess.Popen]]:
    """:func:`start_streamlit` until the block ends; yields (url, process) and stops it afterwards."""
    url, proc = start_streamlit(env, port=port, log=log, args=args)
    try:
        yield url, proc
    finally:
        stop_streamlit(proc)


#: the shared dashboard's computation trace (cache/trace.py), summed up at the end of the run (compute_seconds)
TRACE = "trace.jsonl"


def compute_seconds(trace: Path) -> dict[str, tuple[int, float]]:
    """Per method, (results computed, seconds from compute-start to stored) in a computation trace; nested
    computations count in their own method and in the one that asked for them."""
    import json
    started: dict[str, dict] = {}
    out: dict[str, tuple[int, float]] = {}
    for line in trace.read_text().splitlines() if trace.exists() else ():
        e = json.loads(line)
        if e["event"] == "compute-start":
            started[e["run_id"]] = e
        elif e["event"] == "stored" and e["run_id"] in started:
            n, s = out.get(e["method"], (0, 0.0))
            out[e["method"]] = (n + 1, s + e["t"] - started.pop(e["run_id"])["t"])
    return out


def shared_server(shared: Path) -> str:
    """The url of this xdist worker's dashboard (started on first use; tests/conftest.py stops every one when the run
    ends). The workers' dashboards share one result cache (the cache is safe across processes, and a result another
    one is computing is waited for, not computed twice) and one computation trace; each has its own fine-tuning jobs.
    One dashboard per worker rather than one for the run: a Streamlit server computes under one Python interpreter's
    lock, and the browser walks of both workers waited on that one core while the other idled."""
    import json
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    info = shared / f"server-{worker}.json"
    if info.exists():
        return json.loads(info.read_text())["url"]
    env = dict(os.environ, ARITHLAB_CACHE=str(shared / "results.duckdb"), ARITHLAB_JOBS=str(shared / f"jobs-{worker}"),
               ARITHLAB_TRACE=str(shared / TRACE), HF_HUB_OFFLINE="1")
    url, proc = start_streamlit(env, log=shared / f"server-{worker}.log", own_session=True)
    info.write_text(json.dumps({"url": url, "pid": proc.pid}))
    return url


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The dashboard every browser test of the process opens: one per xdist worker, on the run's one fresh cache."""
    shared = shared_folder()
    if shared is not None:
        yield shared_server(shared)
        return
    tmp = tmp_path_factory.mktemp("e2e")
    env = dict(os.environ, ARITHLAB_CACHE=str(tmp / "results.duckdb"), ARITHLAB_JOBS=str(tmp / "jobs"),
               HF_HUB_OFFLINE="1")
    with streamlit_server(env, log=tmp / "server.log") as (url, _):  # a pipe nobody reads would fill up
        yield url


@pytest.fixture()
def page(browser):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    yield pg
    ctx.close()


def shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


#: how long a browser test waits for a page (ms): the first run of a page may compute on a busy machine
WAIT = 180_000


def goto(page, server: str, path: str) -> None:
    """Open the dashboard's page ``path`` and wait until Streamlit has drawn its frame."""
    page.goto(f"{server}/{path}")
    page.wait_for_selector("[data-testid='stAppViewContainer']", timeout=WAIT)


def click_at(page, locator, fx: float = 0.5, fy: float = 0.5) -> None:
    """Click ``locator`` at the fraction (fx, fy) of its box, with the mouse (a Vega mark takes no Playwright click).

    Streamlit scrolls its main area, not the window, and a button pressed on the way can leave a chart out of view:
    a click at an off-screen point lands on nothing (an MLP cell's box once had y = -1005). So: into view first."""
    locator.scroll_into_view_if_needed()
    b = locator.bounding_box()
    page.mouse.click(b["x"] + b["width"] * fx, b["y"] + b["height"] * fy)


#: the label a page gives a button that asks before a computation (ui.progress.compute_or_button)
ASKS = r"\(estimated: about "


def ask_all(page, *, skip: tuple[str, ...] = ("Build the report",), tries: int = 8) -> int:
    """Press each button that asks before a computation, one after the other (pressing one may show the next), but
    those whose label holds one of ``skip``; the number pressed.  Nothing to press at the first look: a second look
    once the page has been still a second (a page's first run can end before the run it asks for begins, late on a
    loaded machine: CI's Numbers page was left at "Fit the probes").  A disabled button waits for a choice on its
    page (a job running, a form) and is left; a click that times out is tried again, twice at most."""
    import re

    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    pressed, missed, settled = 0, {}, False
    for _ in range(tries):
        idle(page)
        ask = page.get_by_role("button", name=re.compile(ASKS))
        for text in skip:
            ask = ask.filter(has_not_text=text)
        ready = [b for b in ask.all() if b.is_visible() and b.is_enabled() and missed.get(b.inner_text(), 0) < 2]
        if not ready:
            if settled or pressed:
                break
            # nothing to press yet: a page's first run can end before the run it asks for begins (a rerun, late on
            # a loaded machine), so idle() returned between them; look again once the page has been still a second
            settled = True
            charts_drawn(page, timeout=5_000, quiet=1_000)
            continue
        label = ready[0].inner_text()
        try:
            ready[0].click(timeout=10_000)
        except PlaywrightTimeout:
            missed[label] = missed.get(label, 0) + 1
            continue
        idle(page)
        pressed += 1
    return pressed
