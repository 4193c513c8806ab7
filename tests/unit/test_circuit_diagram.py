"""The circuit diagram's drawing (views/circuit_diagram.py): no two nodes in one place, one column per layer that
holds a node, edges coloured by what they are -- on a 30-layer model's circuit, where the old layout put a layer-0
head on the operand tokens and squeezed 31 layers into the page."""

from __future__ import annotations

import pytest

from engine.techniques.circuit import Diagram, Edge, Node
from views.circuit_diagram import EDGE_KINDS, LINES, columns, diagram_chart, diagram_image, edge_kind, layout


def _circuit() -> Diagram:
    d = Diagram("m", "effect", 12)
    d.nodes += [Node("A", "token", -1, label="operand A"), Node("B", "token", -1, label="operand B"),
                Node("op", "token", -1, label="operator")]
    for layer, head, eff in ((0, 7, -0.3), (20, 1, -0.2), (20, 4, 0.1), (27, 4, -0.05)):
        d.nodes.append(Node(f"h{layer}.{head}", "head", layer, head, f"{layer}.{head}", eff))
        d.edges.append(Edge(f"h{layer}.{head}", "answer", "effect", eff))
    d.edges += [Edge("B", "h0.7", "attention", 0.6), Edge("h0.7", "h20.1", "head-head", -0.02)]
    d.nodes += [Node("m23", "mlp", 23, label="MLP 23", effect=-0.4), Node("answer", "answer", 30, label="answer logit")]
    d.edges.append(Edge("m23", "answer", "effect", -0.4))
    return d


def test_every_node_has_its_own_place_and_columns_are_the_layers_used():
    d = _circuit()
    nodes = layout(d)
    assert columns(d) == ["tokens", "layer 0", "layer 20", "layer 23", "layer 27", "answer"]
    assert len({(x, y) for x, y in zip(nodes.x, nodes.y)}) == len(nodes)  # no node drawn on another
    by_id = nodes.set_index("id")
    assert by_id.x["h0.7"] == 1 and by_id.x["B"] == 0 and by_id.x["answer"] == 5
    assert by_id.x["h20.1"] == by_id.x["h20.4"] and by_id.y["h20.1"] != by_id.y["h20.4"]


def test_edges_say_what_they_are_by_colour_and_the_legend_names_it():
    d = _circuit()
    kinds = {(e.source, e.target): edge_kind(e) for e in d.edges}
    assert kinds[("B", "h0.7")] == EDGE_KINDS["attention"]
    assert kinds[("h0.7", "answer")] == kinds[("m23", "answer")] == EDGE_KINDS["lowers"]
    assert kinds[("h20.4", "answer")] == EDGE_KINDS["raises"]
    assert kinds[("h0.7", "h20.1")] == EDGE_KINDS["lowers"]  # head -> head: signed too (and dashed)
    spec = diagram_chart(d).to_dict()
    rules = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "line")
    assert rules["encoding"]["color"]["field"] == "sign"
    assert set(rules["encoding"]["color"]["scale"]["domain"]) == set(EDGE_KINDS.values())
    # the dashed line says what it is in a legend of its own, drawn only where head -> head edges are
    dash = rules["encoding"]["strokeDash"]
    assert dash["scale"] == {"domain": [LINES["solid"], LINES["dashed"]], "range": [[1, 0], [6, 4]]}
    assert dash["legend"]["orient"] == "bottom"
    svg = diagram_image(d, "svg").decode()
    assert LINES["dashed"] in svg and LINES["solid"] in svg and 'stroke-dasharray="6,4"' in svg
    plain = Diagram(d.model, d.metric, d.n_pairs, d.nodes, [e for e in d.edges if e.kind != "head-head"])
    rules = next(layer for layer in diagram_chart(plain).to_dict()["layer"] if layer["mark"]["type"] == "line")
    assert rules["encoding"]["strokeDash"]["legend"] is None
    assert LINES["dashed"] not in diagram_image(plain, "svg").decode()


def test_each_node_label_has_a_white_halo_under_it():
    spec = diagram_chart(_circuit()).to_dict()
    texts = [layer for layer in spec["layer"] if layer["mark"]["type"] == "text"]
    assert [t["encoding"]["text"]["field"] for t in texts] == ["label", "label"]
    assert texts[0]["mark"]["stroke"] == "white" and "stroke" not in texts[1]["mark"]


def test_a_pinned_node_is_ringed_with_its_note_under_it_cut_and_drawn_as_text():
    from views.circuit_diagram import NOTE_CHARS, PIN_COLOR, diagram_image, shown_note
    long = "operator mover: reads the operator token and writes it to END " * 3
    d = _circuit().noted({"0.7": "<b>operand</b> mover", "20.1": long})
    nodes = layout(d).set_index("id")
    assert nodes.shown_note["h0.7"] == "<b>operand</b> mover"
    assert nodes.shown_note["h20.1"] == long[:NOTE_CHARS - 1].rstrip() + "…"
    assert len(nodes.shown_note["h20.1"]) <= NOTE_CHARS
    assert nodes.note["h20.1"] == long and nodes.shown_note["h20.4"] == ""
    assert shown_note("first line\nsecond") == "first line…"  # a note of several lines: its first, marked as cut
    spec = diagram_chart(d).to_dict()
    marks = [layer["mark"] for layer in spec["layer"]]
    ring = next(m for m in marks if m["type"] == "circle" and m.get("filled") is False)
    assert ring["stroke"] == PIN_COLOR
    texts = [layer for layer in spec["layer"] if layer["mark"]["type"] == "text"]
    assert [t["encoding"]["text"]["field"] for t in texts] == ["label", "label", "shown_note", "shown_note"]
    dots = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "circle" and "filled" not in layer["mark"])
    assert any(t.get("title") == "your note" for t in dots["encoding"]["tooltip"])
    svg = diagram_image(d, "svg").decode()
    assert "&lt;b&gt;operand&lt;/b&gt; mover" in svg and "<b>" not in svg  # drawn as the characters typed
    assert long[:NOTE_CHARS - 1].rstrip() in svg


def test_a_diagram_without_notes_draws_no_ring_and_no_note_line():
    spec = diagram_chart(_circuit()).to_dict()
    assert len(spec["layer"]) == 4  # edges, nodes, the labels' halo, the labels


def test_an_edge_circuit_draws_q_k_v_apart_and_its_input_in_the_middle():
    """An edge circuit (engine.techniques.circuit.edge_diagram): the input is the one token node, drawn level with
    the middle; one sender's edges into a head's query, key and value end above, at and below the head (three lines,
    not one), and the tooltip names the input each reaches."""
    from views.circuit_diagram import VIA_OFFSET
    d = Diagram("m", "eap edge score", 4)
    d.nodes += [Node("input", "token", -1, label="input (embeddings)"),
                Node("h0.1", "head", 0, 1, "0.1", -0.2), Node("h2.0", "head", 2, 0, "2.0", 0.1),
                Node("m1", "mlp", 1, label="MLP 1", effect=-0.4), Node("answer", "answer", 4, label="answer logit")]
    d.edges += [Edge("input", "h2.0", "edge", -0.5, q) for q in ("q", "k", "v")]
    d.edges += [Edge("h0.1", "m1", "edge", 0.3), Edge("m1", "answer", "edge", -0.4)]
    nodes = layout(d).set_index("id")
    assert nodes.y["input"] == (nodes.y.max() + nodes.y.min()) / 2
    spec = diagram_chart(d).to_dict()
    rules = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "line")
    rows = spec["datasets"][rules["data"]["name"]]
    last = {r["edge"]: r for r in rows}  # each edge's points in order: its last is where it ends
    ends = {r["via"]: r["y"] for r in last.values() if r["target"] == "h2.0"}
    assert ends == {q: nodes.y["h2.0"] + VIA_OFFSET[q] for q in ("q", "k", "v")}
    assert any(t.get("field") == "via" for t in rules["encoding"]["tooltip"])
    assert {r["sign"] for r in rows} == {EDGE_KINDS["lowers"], EDGE_KINDS["raises"]}
    assert rules["encoding"]["color"]["scale"]["domain"] == [EDGE_KINDS["lowers"], EDGE_KINDS["raises"]]  # no
    # attention edge is drawn, so the legend names none
    from views.circuit_diagram import MLP_SHIFT
    assert nodes.x["m1"] == columns(d).index("layer 1") + MLP_SHIFT  # right of layer 1's heads: h0.1 -> m1 is
    assert nodes.x["h0.1"] == columns(d).index("layer 0")             # not drawn through them


def test_an_edge_that_would_run_through_another_node_bends_round_it():
    """Gemma 3's circuit drew operand A -> head 12.0 straight through head 9.0: it read as two edges of 9.0."""
    from views.circuit_diagram import BEND, route
    others = [("h9.0", 2.0, 0.0), ("h10.0", 3.0, 5.0)]
    assert route((0.0, 2.0), (4.0, -2.0), others) == [(0.0, 2.0), (2.0, -BEND), (4.0, -2.0)]
    assert route((4.0, -2.0), (0.0, 2.0), others) == [(4.0, -2.0), (2.0, -BEND), (0.0, 2.0)]  # right to left
    assert route((0.0, 2.0), (4.0, 1.0), others) == [(0.0, 2.0), (4.0, 1.0)]  # passes 1.5 rows above: straight
    assert route((2.0, 0.0), (2.0, 3.0), others) == [(2.0, 0.0), (2.0, 3.0)]  # a vertical edge: nothing between
    # the bent part would run through 10.0's label (0.375 rows above its centre): it bends again, below 10.0
    label = others + [("h10.0", 3.0, -1.6)]
    got = [c for point in route((0.0, 2.0), (4.0, -2.0), label) for c in point]
    assert got == pytest.approx([0.0, 2.0, 2.0, -BEND, 3.0, -1.6 - BEND, 4.0, -2.0])
    d = Diagram("m", "effect", 2)
    d.nodes += [Node("A", "token", -1, label="operand A"), Node("B", "token", -1, label="operand B"),
                Node("h7.0", "head", 7, 0, "7.0", -0.1), Node("h9.0", "head", 9, 0, "9.0", -0.2),
                Node("h12.0", "head", 12, 0, "12.0", -0.3), Node("answer", "answer", 17, label="answer logit")]
    d.edges += [Edge("B", "h9.0", "attention", 0.5), Edge("A", "h7.0", "attention", 0.4)]
    nodes = layout(d).set_index("id")
    # the layout puts B, 7.0 and 9.0 on one line: B -> 9.0 bends below 7.0; A -> 7.0 has nothing between
    assert (nodes.x["B"], nodes.y["B"]) == (0, -1) and (nodes.x["h7.0"], nodes.y["h7.0"]) == (1, 0)
    assert (nodes.x["h9.0"], nodes.y["h9.0"]) == (2, 1)
    spec = diagram_chart(d).to_dict()
    lines = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "line")
    assert lines["encoding"]["detail"]["field"] == "edge" and lines["encoding"]["order"]["field"] == "order"
    rows = spec["datasets"][lines["data"]["name"]]
    assert [(r["x"], r["y"]) for r in rows if r["target"] == "h9.0"] == [(0, -1), (1, -BEND), (2, 1)]
    assert [(r["x"], r["y"]) for r in rows if r["target"] == "h7.0"] == [(0, 1), (1, 0)]
