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

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def streamlit_server(env: Mapping[str, str], *, port: int | None = None, log: Path | None = None,
                     args: Sequence[str] = ("--server.address", "127.0.0.1")) -> Iterator[tuple[str, subprocess.Popen]]:
    """``python -m ui.serve app.py`` (``streamlit run``, see ui/serve.py; cwd = repo root, so
    ``.streamlit/config.toml`` applies) until it answers
    its health check; yields (url, process) and stops it afterwards.  Output goes to ``log`` (or a pipe
    read only on a failed start)."""
    port = port or _free_port()
    out = open(log, "wb") if log is not None else subprocess.PIPE
    proc = subprocess.Popen(
        [sys.executable, "-m", "ui.serve", str(REPO / "app.py"), *args, "--server.port", str(port),
         "--server.headless", "true", "--browser.gatherUsageStats", "false"],
        cwd=REPO, env=dict(env), stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
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
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if log is not None:
            out.close()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
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
