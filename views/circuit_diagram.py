"""The circuit diagram (engine.techniques.circuit.Diagram) drawn with Altair: x the layer, nodes of one layer
stacked, edge width by its number; and the same chart as SVG / PNG (vl-convert)."""

from __future__ import annotations

import altair as alt
import pandas as pd

KIND_COLOR = {"token": "#7f7f7f", "head": "#d55e00", "mlp": "#0072b2", "answer": "#009e73"}
EDGE_COLOR = {"attention": "#999999", "effect": "#d55e00", "head-head": "#cc79a7"}
DIAGRAM_SELECTION = "diagram_node"


def layout(diagram) -> pd.DataFrame:
    """One row per node: id, kind, label, layer, effect and its (x, y) position.  x is the layer; the heads and
    MLPs, in layer order, take alternating rows above and below the middle (so edges between layers do not run
    along one line), the tokens spread over the same height on the left, the answer in the middle on the right."""
    middle = sorted((n for n in diagram.nodes if n.kind in ("head", "mlp")), key=lambda n: (n.layer, n.kind, n.head))
    y = {n.id: (1 if i % 2 else -1) * ((i + 1) // 2) for i, n in enumerate(middle)}
    lo, hi = min(y.values(), default=-1), max(y.values(), default=1)
    tokens = [n for n in diagram.nodes if n.kind == "token"]
    for i, n in enumerate(tokens):
        y[n.id] = hi - i * (hi - lo) / max(len(tokens) - 1, 1) if hi > lo else i - (len(tokens) - 1) / 2
    rows = [{"id": n.id, "kind": n.kind, "label": n.label, "layer": n.layer, "effect": n.effect,
             "x": float(n.layer), "y": float(y.get(n.id, 0.0))} for n in diagram.nodes]
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
