"""Session-wide hooks: timings reported by tests are printed in pytest's terminal summary; one
Chromium (``browser``) serves every browser test (tests/e2e, tests/reliability); the bundled model
(``organism``, alias ``model``) is one fixture for every test module that opens it; each test carries its
folder's tier marker."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TIMINGS: list[str] = []
CHROMIUM = "/usr/bin/chromium"
TESTS = Path(__file__).resolve().parent
#: a test's tier is its folder (docs/testing.md); each folder's tests carry its marker, so `-m unit` picks a tier
TIERS = ("unit", "integration", "app", "e2e", "reliability")
#: the fast tier (`make test-fast`, the loop for every change): the model-free units and, on the bundled model, each
#: core technique against its plain reference, the charts' specs, the compute gate and one page end to end -- no
#: Chromium, no real model, no architecture matrix, nothing marked slow
FAST = ("unit/", "integration/test_techniques.py", "integration/test_patching.py", "integration/test_head_patching.py",
        "integration/test_position_patching.py", "integration/test_carries.py", "app/test_charts.py",
        "app/test_compute_gate.py", "app/test_operand_grid.py")
NOT_FAST = ("slow", "realmodel", "e2e", "matrix")


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.path)).resolve().relative_to(TESTS).parts
        if parts and parts[0] in TIERS:
            item.add_marker(parts[0])
        if "smollm2" in item.name.lower():  # a test named for the real SmolLM2 opens it (4 did without the marker)
            item.add_marker("realmodel")
        rel = "/".join(parts)
        if rel.startswith(FAST) and not any(item.get_closest_marker(m) for m in NOT_FAST):
            item.add_marker("fast")


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                                    "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


#: the interpreter's own __main__ (pytest's): a spawned process re-imports it
_MAIN = sys.modules["__main__"]


@pytest.fixture(autouse=True)
def _main_module_restored():
    """Streamlit's AppTest leaves the last page script it ran as ``sys.modules["__main__"]``; a process started with
    multiprocessing's "spawn" afterwards re-runs that script as its main module and dies before its target runs (the
    cache's cross-process tests then waited on an empty queue, in every full run). Each test ends with pytest's own
    __main__ back."""
    yield
    if sys.modules.get("__main__") is not _MAIN:
        sys.modules["__main__"] = _MAIN


@pytest.fixture(scope="module")
def organism():
    """The bundled model on the CPU through TransformerBridge, opened once per test module (a module's tests may
    leave memos on the backend; no test module sees another's)."""
    from engine.backends import open_model
    return open_model("organism", device="cpu")


@pytest.fixture(scope="module")
def model(organism):
    """The bundled model, under the name the technique-level tests use."""
    return organism


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if TIMINGS:
        terminalreporter.section("timings reported by tests")
        for line in TIMINGS:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session, exitstatus):
    _remember(exitstatus)
    # close the cache's process-wide DuckDB instance before interpreter teardown
    import gc

    from cache.connection import reset_engine
    reset_engine()
    gc.collect()


_EXIT_STATUS = {"value": 0}


def pytest_sessionstart(session):
    _EXIT_STATUS["value"] = 0


def _remember(exitstatus) -> None:
    _EXIT_STATUS["value"] = int(exitstatus)


def pytest_unconfigure(config):
    """Leave without interpreter teardown once pytest has reported everything.

    DuckDB's nanobind bindings print pages of "leaked instance" warnings when Python tears down
    after a long session (torch, Streamlit and DuckDB objects still referenced); they would bury
    pytest's closing line. The exit status is pytest's own.
    """
    import os
    import sys
    if os.environ.get("ARITHLAB_PYTEST_FAST_EXIT", "1") != "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS["value"])
