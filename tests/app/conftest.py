"""AppTest helpers: every page runs against a fresh result cache in a temp dir."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import engine.cost

REPO = Path(__file__).resolve().parents[2]
#: the threshold the dashboard asks above (engine.cost.HEAVY_S), for the tests of the gate itself
REAL_HEAVY_S = engine.cost.HEAVY_S
#: the threshold in every other AppTest: they test a page's wiring, and whether a page asks depends on the
#: machine's load (its passes timed, its recent computations observed) -- two CI runs failed on pages that asked
#: on a busy machine and computed on a quiet one.  The gate is tested by test_compute_gate.py (REAL_HEAVY_S),
#: test_teaching.py (a threshold of 0) and, in Chromium on a cold cache, tests/e2e/test_cold_cache_browser.py.
APPTEST_HEAVY_S = 120.0


@pytest.fixture(autouse=True)
def _env(tmp_path_factory, monkeypatch):
    # one cache per test module: pages recompute once, later tests read from it
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path_factory.getbasetemp() / "apptest-cache.duckdb"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(engine.cost, "HEAVY_S", APPTEST_HEAVY_S)


@pytest.fixture()
def real_threshold(monkeypatch):
    """The dashboard's own threshold (REAL_HEAVY_S), for a test of the gate."""
    monkeypatch.setattr(engine.cost, "HEAVY_S", REAL_HEAVY_S)


def page(name: str, *, n: int = 12) -> AppTest:
    at = AppTest.from_file(str(REPO / "pages" / name), default_timeout=300)
    at.session_state["prompt_set"] = {"ops": ["add", "sub", "mul", "div"], "families": "paper (Fig. 8, 32 templates)",
                                      "n": n, "seed": 0}
    return at


#: the small set the router's tests start from (two operations, 8 prompts each)
SMALL_SET = {"ops": ["add", "mul"], "families": "paper (Fig. 8, 32 templates)", "n": 8, "seed": 0}


def app() -> AppTest:
    """The whole dashboard (the router, app.py) on :data:`SMALL_SET`, after its first run."""
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=300)
    at.session_state["prompt_set"] = dict(SMALL_SET)
    return at.run()


def go(at: AppTest, script: str) -> AppTest:
    """Switch the router to ``pages/<script>`` and run it: no exception, no st.error."""
    at.switch_page(f"pages/{script}").run()
    assert not at.exception, at.exception
    assert not errors(at), errors(at)
    return at


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def ask_all(at: AppTest, *, skip: tuple[str, ...] = ("Build the report",), tries: int = 6) -> AppTest:
    """Press each button that asks before a computation (its label ends "(estimated: about ...)"), but those whose
    label holds one of ``skip``: the views a page opens only when asked (``ask=True``), and with the threshold at
    :data:`REAL_HEAVY_S` (or 0) every computation estimated above it."""
    for _ in range(tries):
        asking = [b for b in at.button if "(estimated: about " in b.label and not any(t in b.label for t in skip)]
        if not asking:
            break
        asking[0].click().run()
    return at
