"""The Atlas page (AppTest): the grid's strongest head by default, a typed neuron, a bad component as an
st.error in the page's words."""

from __future__ import annotations

import pytest

from tests.app.conftest import ask_all, errors, page

pytestmark = pytest.mark.app


def _spec(at) -> str:
    charts = [*at.get("arrow_vega_lite_chart"), *at.get("vega_lite_chart")]
    return charts[0].proto.spec


def _charts(at) -> int:
    return len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart"))


def test_the_operand_grid_page_draws_a_head_a_neuron_and_names_a_bad_component():
    at = page("14_Atlas.py").run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    text = " ".join(m.value for m in at.markdown)
    assert "head 1.1" in text and "`add.paper.0`: 81 operand pairs, the model answers 81 right" in text
    assert _charts(at) == 1 and _spec(at).count('"mark"') >= 6  # 3 panels
    # why the grid's 81 differ from the sidebar's set: said beside the count
    assert any("every operand pair of this one template" in c.value and "a balanced sample of" in c.value
               for c in at.caption)
    box = at.text_input(key="atlas_component_")
    box.input("6.mlp.5").run()
    assert not errors(at) and "neuron 6.mlp.5" in " ".join(m.value for m in at.markdown)
    assert '"act"' in _spec(at)  # the MLP's value and the activation
    assert any("neurons tagged" in m.value and "MLP 7" in m.value for m in at.markdown)
    at.text_input(key="atlas_component_").input("9.1").run()
    assert errors(at) == ["The model has layers 0-7, not 9."] and not at.exception


@pytest.mark.slow  # the textbook loop over the grid's 81 pairs: about 100 s on a busy 2-core machine, not the fast tier
def test_the_atlas_says_when_the_textbook_loop_computed_the_direct_effects(monkeypatch, tmp_path):
    """A direct-effect fast path whose self-check fails (forced here): the page shows the fallback's note beside the
    grid, and the grid is drawn."""
    from engine.machinery.shortcut import ShortcutMismatch
    from engine.techniques import operand_grid

    def miss(*a, **k):
        raise ShortcutMismatch("forced by the test")
    monkeypatch.setattr(operand_grid, "check_direct_reads", miss)
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "fresh.duckdb"))  # computed here, not read
    at = ask_all(page("14_Atlas.py").run())
    assert not at.exception and not errors(at), (at.exception, errors(at))
    notes = [i.value for i in at.info]
    assert any("direct effects" in n and "forced by the test" in n and "textbook loop" in n for n in notes), notes
    assert _charts(at) == 1


def test_the_atlas_pins_its_component_with_a_note_and_lists_a_pinned_neurons_note(monkeypatch, tmp_path):
    """The Atlas's component is pinned from the Atlas (kept per model, read by every page); a pinned neuron's note
    stands in its row of the heuristic neurons' table."""
    from cache import ResultCache
    from engine.backends import open_model
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "notes.duckdb"))  # pins of its own: no other test sees them
    at = ask_all(page("14_Atlas.py").run())
    assert not at.exception and not errors(at), (at.exception, errors(at))
    at.text_area(key="note_1.1").set_value("adds <b>A</b> to B").run()
    at.button(key="pin_1.1").click().run()
    assert not errors(at) and "adds <b>A</b> to B" in [t.value for t in at.text]  # shown as typed, not as HTML
    fp = open_model("organism").facts.fingerprint
    assert ResultCache(tmp_path / "notes.duckdb").labels(fp) == {"1.1": "adds <b>A</b> to B"}
    tags = at.dataframe[0].value
    first = f"{tags.layer[0]}.mlp.{tags.neuron[0]}"
    ResultCache(tmp_path / "notes.duckdb").pin(fp, first, "a units-digit neuron")
    at = ask_all(at.run())
    tags = at.dataframe[0].value
    assert list(tags.note) == ["a units-digit neuron"] + [""] * (len(tags) - 1)


def test_two_digit_operands_offer_the_units_digits_grid():
    """Operands 10..29 (sidebar): the Atlas offers the grid folded onto the units digits -- off for 20 values a side,
    on, the panels' axes are the units digits (10 a side) and the caption says each cell is the mean of 4 pairs;
    operands 1..9 offer no fold."""
    at = page("14_Atlas.py")
    at.session_state["prompt_set"] = {**at.session_state["prompt_set"], "ops": ["add"], "operand_lo": 10,
                                      "operand_hi": 29}
    ask_all(at.run())
    assert not at.exception and not errors(at), (at.exception, errors(at))
    assert "400 operand pairs" in " ".join(m.value for m in at.markdown)
    fold = at.toggle(key="atlas_units")
    assert fold.value is False
    fold.set_value(True).run()
    assert not at.exception and not errors(at), (at.exception, errors(at))
    spec = _spec(at)
    assert "A's units digit" in spec and "B's units digit" in spec
    assert any(c.value.startswith("Each cell: the mean over the 4 pairs whose A and B end in these two digits")
               for c in at.caption)
    plain = page("14_Atlas.py").run()
    assert not [t for t in plain.toggle if t.key == "atlas_units"]
