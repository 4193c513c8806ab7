"""The circuit diagram (engine.techniques.circuit.Diagram) drawn with Altair: x the layer, nodes of one layer
stacked, edge width by its number; and the same chart as SVG / PNG (vl-convert)."""

from __future__ import annotations

import altair as alt
import pandas as pd

KIND_COLOR = {"token": "#7f7f7f", "head": "#d55e00", "mlp": "#0072b2", "answer": "#009e73"}
EDGE_COLOR = {"attention": "#999999", "effect": "#d55e00", "head-head": "#cc79a7"}
DIAGRAM_SELECTION = "diagram_node"


def layout(diagram) -> pd.DataFrame:
    """One row per node: id, kind, label, layer, effect and its (x, y) position."""
    rows = []
    by_layer: dict[int, list] = {}
    for n in diagram.nodes:
        by_layer.setdefault(n.layer, []).append(n)
    for layer, nodes in by_layer.items():
        for i, n in enumerate(nodes):
            rows.append({"id": n.id, "kind": n.kind, "label": n.label, "layer": n.layer, "effect": n.effect,
                         "x": float(layer), "y": i - (len(nodes) - 1) / 2})
    return pd.DataFrame(rows)


def diagram_chart(diagram) -> alt.Chart:
    """Edges (width: attention share, or |effect| relative to the strongest of their kind) under labelled nodes;
    a click on a node selects it (selection ``DIAGRAM_SELECTION`` on ``id``)."""
    nodes = layout(diagram)
    pos = nodes.set_index("id")
    edges = []
    for e in diagram.edges:
        strongest = max(abs(x.weight) for x in diagram.edges if x.kind == e.kind) or 1.0
        edges.append({"source": e.source, "target": e.target, "kind": e.kind, "weight": e.weight,
                      "width": 1 + 7 * abs(e.weight) / strongest, "x": pos.x[e.source], "y": pos.y[e.source],
                      "x2": pos.x[e.target], "y2": pos.y[e.target]})
    edf = pd.DataFrame(edges, columns=["source", "target", "kind", "weight", "width", "x", "y", "x2", "y2"])
    xs = alt.X("x:Q", title="layer (tokens left, answer right)", axis=alt.Axis(tickMinStep=1, format="d"))
    ys = alt.Y("y:Q", axis=None)
    lines = alt.Chart(edf).mark_rule(opacity=0.6).encode(
        x=xs, y=ys, x2="x2:Q", y2="y2:Q", strokeWidth=alt.StrokeWidth("width:Q", legend=None, scale=None),
        color=alt.Color("kind:N", title="edge", scale=alt.Scale(domain=list(EDGE_COLOR),
                                                                range=list(EDGE_COLOR.values()))),
        tooltip=["source", "target", "kind", alt.Tooltip("weight:Q", format=".3f")])
    sel = alt.selection_point(name=DIAGRAM_SELECTION, fields=["id"], on="click", clear="dblclick")
    dots = alt.Chart(nodes).mark_circle(size=500, opacity=1).encode(
        x=xs, y=ys, color=alt.Color("kind:N", title="node", scale=alt.Scale(domain=list(KIND_COLOR),
                                                                           range=list(KIND_COLOR.values()))),
        tooltip=["label", "kind", "layer", alt.Tooltip("effect:Q", format=".4f")]).add_params(sel)
    text = alt.Chart(nodes).mark_text(dy=-18, fontSize=12).encode(x=xs, y=ys, text="label:N")
    return (lines + dots + text).resolve_scale(color="independent").properties(height=360)


def diagram_image(diagram, fmt: str) -> bytes:
    """The chart as ``svg`` (UTF-8) or ``png`` bytes."""
    import vl_convert
    spec = diagram_chart(diagram).to_json()
    if fmt == "svg":
        return vl_convert.vegalite_to_svg(spec).encode()
    if fmt == "png":
        return vl_convert.vegalite_to_png(spec, scale=2)
    raise ValueError(f"unknown image format {fmt!r}: svg or png")
