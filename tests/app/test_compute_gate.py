"""ui/progress.py's ``compute_or_button``, the one gate of a page computation: cached -> shown at once (nothing
computed); cheap -> computed now; heavy -> a button that carries the cost model's label, and nothing computed
until it is pressed."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.usefixtures("real_threshold")  # the gate at the dashboard's own threshold


def gate_page():
    """A page that gates one cached computation whose estimated seconds are in ``st.session_state["secs"]``."""
    from types import SimpleNamespace

    import streamlit as st

    from cache import ResultCache
    from engine.cost import Cost
    from engine.results import run_cached
    from ui.progress import compute_or_button

    model = SimpleNamespace(facts=SimpleNamespace(fingerprint="gate-test-model"))
    cache = ResultCache()

    import time

    import ui.progress
    ui.progress.OVERRUN = st.session_state.get("overrun", 1.5)
    steps = st.session_state.get("steps", 0)  # a computation of this many steps of 0.05 s, each reported

    def compute(progress):
        def work():
            for i in range(steps):
                time.sleep(0.05)
                if progress is not None:
                    progress(i + 1, steps)
            st.session_state["computed"] = st.session_state.get("computed", 0) + 1
            return [], {"answer": 42}
        return run_cached(model, [], "gate_test", {"secs": st.session_state["secs"]}, work, cache)[1]["answer"]

    costs_asked = st.session_state.setdefault("costs_asked", [])

    def cost():
        costs_asked.append(1)
        return Cost(60.0, st.session_state["secs"])

    got = compute_or_button(compute, cost, button="Compute it", key="gate", text="Computing", failure="compute it",
                            note="Press the button to compute it.", ask=st.session_state.get("ask", False))
    st.markdown(f"result: {got}")


def _page(tmp_path, monkeypatch, secs: float, ask: bool = False) -> AppTest:
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "gate.duckdb"))
    at = AppTest.from_function(gate_page, default_timeout=60)
    at.session_state["secs"] = secs
    at.session_state["ask"] = ask
    return at.run()


def test_heavy_work_waits_for_its_button_and_the_button_states_the_cost(tmp_path, monkeypatch):
    at = _page(tmp_path, monkeypatch, 40.0)
    assert not at.exception
    assert at.markdown[-1].value == "result: None"
    assert "computed" not in at.session_state
    [button] = at.button
    assert button.label == "Compute it (estimated: about 40 s, 60 forward passes of the set)"
    assert [i.value for i in at.info] == ["Press the button to compute it."]
    button.click().run()
    assert at.markdown[-1].value == "result: 42" and at.session_state["computed"] == 1
    assert not [b for b in at.button if b.label.startswith("Compute it")]  # the button goes once pressed
    at.run()  # a rerun reads the cache: no computation, no button, no cost estimated
    asked = len(at.session_state["costs_asked"])
    at.run()
    assert at.markdown[-1].value == "result: 42" and at.session_state["computed"] == 1
    assert len(at.session_state["costs_asked"]) == asked
    assert not [b for b in at.button if b.label.startswith("Compute it")]


def test_cheap_work_is_computed_at_once(tmp_path, monkeypatch):
    at = _page(tmp_path, monkeypatch, 2.0)
    assert not at.exception
    assert at.markdown[-1].value == "result: 42" and at.session_state["computed"] == 1
    assert not [b for b in at.button if b.label.startswith("Compute it")]
    assert not at.info


def test_a_view_opened_on_purpose_asks_whatever_its_cost(tmp_path, monkeypatch):
    at = _page(tmp_path, monkeypatch, 2.0, ask=True)
    assert at.markdown[-1].value == "result: None" and "computed" not in at.session_state
    [button] = at.button
    assert button.label == "Compute it (estimated: about 2 s, 60 forward passes of the set)"
    button.click().run()
    assert at.markdown[-1].value == "result: 42" and at.session_state["computed"] == 1


def test_a_page_run_stops_computing_unasked_once_it_has_spent_the_threshold(tmp_path, monkeypatch):
    from ui.progress import UNASKED
    at = _page(tmp_path, monkeypatch, 2.0)
    assert at.session_state["computed"] == 1
    at.session_state["secs"] = 3.0  # another computation of the same run, cheap on its own ...
    at.session_state[UNASKED] = 9.0  # ... after 9 s computed unasked: together past HEAVY_S
    at.run()
    assert at.markdown[-1].value == "result: None" and [b.label for b in at.button] == [
        "Compute it (estimated: about 3 s, 60 forward passes of the set)"]


def test_an_unasked_computation_that_overruns_is_stopped_and_asked_for(tmp_path, monkeypatch):
    """Estimated cheap (2 s) but slower on a busy machine: stopped once the page has spent OVERRUN x HEAVY_S (here
    0.03 x 10 s), nothing stored, and the button shows the duration its progress projected."""
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "gate.duckdb"))
    at = AppTest.from_function(gate_page, default_timeout=60)
    at.session_state["secs"], at.session_state["steps"], at.session_state["overrun"] = 2.0, 100, 0.03
    at.run()
    assert not at.exception
    assert at.markdown[-1].value == "result: None" and "computed" not in at.session_state
    [button] = [b for b in at.button if b.label.startswith("Compute it")]
    assert button.label.startswith("Compute it (estimated: about ")
    assert any("stopped after" in i.value for i in at.info)
    at.session_state["overrun"] = 1.5
    button.click().run()  # asked: no limit
    assert at.markdown[-1].value == "result: 42" and at.session_state["computed"] == 1
