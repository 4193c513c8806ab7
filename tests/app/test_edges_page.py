"""The Faithfulness page's edge section: asked before it computes, then every edge scored and exportable."""

from __future__ import annotations

import pytest

from tests.app.conftest import errors, page


@pytest.fixture(scope="module")
def own_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("edges-page") / "results.duckdb"


@pytest.fixture(autouse=True)
def _own_cache(_env, own_cache, monkeypatch):
    """A cache of this file's own: 'nothing computed unasked' is its claim, and another test of the worker may have
    cached the same set's curves or edges (a fresh-clone run failed so: no 'faithfulness_go' to press)."""
    monkeypatch.setenv("ARITHLAB_CACHE", str(own_cache))


def test_edges_on_demand_top_edges_and_mib_file():
    at = page("11_Faithfulness.py", n=2).run()
    next(b for b in at.button if b.key == "faithfulness_go").click().run()
    assert not errors(at)
    edge_button = [b for b in at.button if b.key == "edges_eap"]
    assert edge_button and "Score every edge" in edge_button[0].label  # nothing computed unasked
    edge_button[0].click().run()
    assert not errors(at)
    top = at.dataframe[-2].value  # the last: every resolution side by side
    assert list(top.columns) == ["edge", "score"] and len(top) == 25
    assert list(top["score"].abs()) == sorted(top["score"].abs(), reverse=True)
    assert any("Edge scores in MIB's format" in str(b.proto.label) for b in at.get("download_button"))


def test_edge_circuit_curves_on_demand():
    at = page("11_Faithfulness.py", n=2).run()
    for b in [b for b in at.button if b.key == "faithfulness_go"]:  # the node curves: cached by the test above
        b.click().run()
    at.multiselect(key="faith_edge_curves").set_value(["eap"]).run()
    button = [b for b in at.button if b.key == "edge_curves_eap_counterfactual"]
    assert button and "Compute the edge circuits' curves" in button[0].label  # nothing computed unasked
    button[0].click().run()
    assert not errors(at)
    table = at.dataframe[-2].value  # the last: every resolution side by side
    assert list(table.columns) == ["ranking", "CPR", "CMD", "CPR − random"]
    assert list(table["ranking"]) == ["EAP (one gradient)", "random edges (5 draws)"]
    gap = dict(zip(table["ranking"], table["CPR − random"]))
    assert gap["random edges (5 draws)"].startswith("+0.00") and gap["EAP (one gradient)"][0] in "+-", gap
    assert any("forward-equivalents" in c.value for c in at.caption)
    assert any("the sender's value on the pair's own counterfactual replaces" in c.value for c in at.caption)
    # mean ablation: the edges' curves too, asked for again, and the caption says what an ablated edge sends
    at.radio(key="faith_ablation").set_value("mean").run()
    for b in [b for b in at.button if b.key == "faithfulness_go"]:
        b.click().run()
    button = [b for b in at.button if b.key == "edge_curves_eap_mean"]
    assert button and "Compute the edge circuits' curves" in button[0].label
    button[0].click().run()
    assert not errors(at)
    assert list(at.dataframe[-2].value["ranking"]) == ["EAP (one gradient)", "random edges (5 draws)"]
    assert any("mean over the counterfactual prompts of the pair's template replaces" in c.value for c in at.caption)


def test_position_resolutions_and_the_side_by_side_table():
    """Edge x position circuits: asked before they compute, ranked by EAP by role beside random units; the table of
    every resolution reads what the cache holds (node and edge x position here, the rest "not computed yet")."""
    at = page("11_Faithfulness.py", n=2).run()
    for b in [b for b in at.button if b.key == "faithfulness_go"]:
        b.click().run()
    at.radio(key="faith_resolution").set_value("edge-position").run()
    box = at.multiselect(key="faith_edge_curves_edge-position")
    assert box.options == ["exact (each edge at each role)", "EAP (one gradient)", "EAP-IG (5 steps)"]
    assert box.value == ["eap", "eap-ig"]  # exact (up to five times exact edge patching) only when chosen
    at.multiselect(key="faith_edge_curves_edge-position").set_value(["eap"]).run()
    button = [b for b in at.button if b.key == "edge_curves_eap_counterfactual_edge-position"]
    assert button and "Compute the edge × position circuits' curves" in button[0].label  # nothing computed unasked
    side = at.dataframe[-1].value
    assert "not computed yet" in set(side[side["resolution"] == "edge × position"]["f, top 5 %"])
    button[0].click().run()
    assert not errors(at)
    assert list(at.dataframe[-2].value["ranking"]) == ["EAP (one gradient)", "random units (5 draws)"]
    assert any("edge × position units (each edge at each of the 5 token roles)" in c.value for c in at.caption)
    side = at.dataframe[-1].value
    assert list(side.columns) == ["resolution", "ranking", "f, top 5 %", "smallest circuit with f ≥ 0.8", "CPR",
                                  "CPR − random"]
    rows = {(r, k): f for r, k, f in zip(side["resolution"], side["ranking"], side["f, top 5 %"])}
    assert ("node", "exact path patching") in rows and ("edge × position", "EAP (one gradient)") in rows
    assert rows[("node × position", "—")] == "not computed yet"
    assert rows[("edge × position", "EAP (one gradient)")][0] in "-0123456789"


def test_node_position_circuits_ranked_exactly():
    """Heads and MLPs at token roles ranked by their own patches (exact), asked before they compute, named for what
    they are, beside random units; the side-by-side table reads them."""
    at = page("11_Faithfulness.py", n=2).run()
    for b in [b for b in at.button if b.key == "faithfulness_go"]:
        b.click().run()
    at.radio(key="faith_resolution").set_value("node-position").run()
    box = at.multiselect(key="faith_edge_curves_node-position")
    assert box.options[0] == "exact (each component at each role)" and box.value == ["eap", "eap-ig"]
    box.set_value(["exact"]).run()
    button = [b for b in at.button if b.key == "edge_curves_exact_counterfactual_node-position"]
    assert button and "Compute the node × position circuits' curves" in button[0].label  # nothing computed unasked
    button[0].click().run()
    assert not errors(at)
    assert list(at.dataframe[-2].value["ranking"]) == ["exact (each component at each role)",
                                                        "random units (5 draws)"]
    side = at.dataframe[-1].value
    rows = {(r, k): f for r, k, f in zip(side["resolution"], side["ranking"], side["f, top 5 %"])}
    assert rows[("node × position", "exact (each component at each role)")][0] in "-0123456789", rows
