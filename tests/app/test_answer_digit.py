"""The sidebar's "Answer digit" and the link's ``digit=`` (issue 49), on the bundled model."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.app.conftest import REPO, SMALL_SET, errors, go


def _link(params: dict) -> AppTest:
    at = AppTest.from_file(str(REPO / "app.py"), default_timeout=300)
    at.session_state["prompt_set"] = {**SMALL_SET, "ops": ["add"]}
    at.query_params.update(params)
    return at.run()


def test_the_answer_digit_follows_the_link_and_the_sidebar():
    at = _link({"digit": "last"})
    assert not at.exception and not errors(at), errors(at)
    assert at.session_state["prompt_set"]["digit"] == "last" and at.query_params["digit"] == "last"
    go(at, "4_Path_patching.py")
    assert not at.exception and not errors(at), errors(at)
    assert at.sidebar.selectbox(key="ps_digit").value == "last"
    texts = " ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)
    assert "Last (units) answer-digit tokens" in texts or "last (units) digit" in texts, texts[:2000]
    at.sidebar.selectbox(key="ps_digit").set_value("first")
    next(b for b in at.button if b.label == "Use this set").click().run()
    assert not at.exception, at.exception
    assert "digit" not in at.query_params  # back at the first digit: the link as it was


def test_a_bad_digit_in_the_link_is_ignored_with_a_note():
    at = _link({"digit": "units"})
    assert not at.exception and not errors(at), errors(at)
    notes = [w.value for w in at.warning if "Link parameter" in w.value]
    assert [n for n in notes if n.startswith("Link parameter `digit=units` ignored")], notes
    assert "digit" not in at.query_params


def test_the_operand_range_follows_the_link_and_the_sidebar():
    at = _link({"operands": "10-99", "digit": "last"})
    assert not at.exception and not errors(at), errors(at)
    cur = at.session_state["prompt_set"]
    assert (cur["operand_lo"], cur["operand_hi"], cur["digit"]) == (10, 99, "last")
    assert at.query_params["operands"] == "10-99"
    assert at.sidebar.number_input(key="ps_operand_lo").value == 10
    at.sidebar.number_input(key="ps_operand_lo").set_value(1)
    at.sidebar.number_input(key="ps_operand_hi").set_value(9)
    next(b for b in at.button if b.label == "Use this set").click().run()
    assert not at.exception, at.exception
    assert "operands" not in at.query_params and at.query_params["digit"] == "last"


def test_a_bad_operand_range_in_the_link_is_ignored_with_a_note():
    at = _link({"operands": "9-1"})
    assert not at.exception and not errors(at), errors(at)
    notes = [w.value for w in at.warning if "Link parameter" in w.value]
    assert [n for n in notes if n.startswith("Link parameter `operands=9-1` ignored")], notes
    assert "operands" not in at.query_params
