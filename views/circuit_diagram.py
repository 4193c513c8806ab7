"""The circuit diagram (engine.techniques.circuit.Diagram) drawn with Altair: x the layer, nodes of one layer
stacked, edge width by its number; and the same chart as SVG / PNG (vl-convert)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from views.charts import PALETTE, stretched

KIND_COLOR = {"token": "#7f7f7f", "head": "#d55e00", "mlp": "#0072b2", "answer": "#009e73"}
#: an edge's colour says what it is: a token's attention share, or a patching effect by its sign (orange: the answer's
#: logit drops when the sender's output comes from the counterfactual -- it carries the operation; blue: it rises)
EDGE_KINDS = {"attention": "attention share (token → head)",
              "lowers": "patching it lowers the answer logit",
              "raises": "patching it raises the answer logit"}
EDGE_COLOR = {EDGE_KINDS["attention"]: "#999999", EDGE_KINDS["lowers"]: "#d55e00", EDGE_KINDS["raises"]: "#0072b2"}
#: an edge's line: head -> head edges dashed, on a width scale of their own (named in the legend where drawn)
LINES = {"solid": "token → head, → answer", "dashed": "head → head (own width scale)"}
LINE_DASH = {LINES["solid"]: [1, 0], LINES["dashed"]: [6, 4]}
DIAGRAM_SELECTION = "diagram_node"
NODE_GAP_PX = 48      # vertical distance between two rows of nodes (a node's label sits above it)
NOTE_GAP_PX = 18      # more between rows when a note is drawn under a pinned node
NOTE_CHARS = 26       # a note drawn under its node is cut to this many characters (all of it in the tooltip)
PIN_COLOR = PALETTE[4]  # a pinned node's ring, as a pinned cell's outline on the heatmaps
NOTE_COLOR = "#8a4b00"  # its note: a darker orange, readable on white at 12 px
MIN_HEIGHT_PX = 300
#: an edge of MIB's graph into a head's query, key or value ends a little above, at or below the head: three
#: edges from one sender to one head are three lines, not one drawn thrice (vertical offset, in rows of nodes)
VIA_OFFSET = {"q": -0.18, "k": 0.0, "v": 0.18}
#: an edge that would run through a node it does not touch (within NEAR rows below its centre -- a dot's radius is a
#: quarter row -- or ABOVE rows above it, where its label is) bends round it, BEND rows below its centre
NEAR, ABOVE, BEND = 0.3, 0.6, 0.45
#: an MLP sits a little right of its layer's heads (it reads them, in a sequential block): an edge from a head to
#: its own layer's MLP is not drawn along the column through the other heads
MLP_SHIFT = 0.35


def columns(diagram) -> list[str]:
    """The diagram's columns, left to right: the tokens, each layer that holds a key head or an MLP, the answer."""
    layers = sorted({n.layer for n in diagram.nodes if n.kind in ("head", "mlp")})
    return ["tokens"] + [f"layer {layer}" for layer in layers] + ["answer"]


def column_of(node) -> str:
    return {"token": "tokens", "answer": "answer"}.get(node.kind, f"layer {node.layer}")


def layout(diagram) -> pd.DataFrame:
    """One row per node: id, kind, label, layer, effect, its column and its (x, y) position.  x is the column
    (:func:`columns`: only the layers that hold a node, so a 30-layer model's circuit is as wide as its few layers,
    and no head of layer 0 sits on the tokens; an MLP :data:`MLP_SHIFT` right of its layer's heads).  The heads
    and MLPs, in layer order, each take a row of their own, alternating above and below the middle (no two nodes
    share a place, and edges between layers do not run along one line); the tokens spread over the same height on
    the left (one token: level with the middle), the answer in the middle on the right."""
    cols = columns(diagram)
    middle = sorted((n for n in diagram.nodes if n.kind in ("head", "mlp")), key=lambda n: (n.layer, n.kind, n.head))
    y = {n.id: float((1 if i % 2 else -1) * ((i + 1) // 2)) for i, n in enumerate(middle)}
    lo, hi = min(y.values(), default=-1.0), max(y.values(), default=1.0)
    tokens = [n for n in diagram.nodes if n.kind == "token"]
    for i, n in enumerate(tokens):
        y[n.id] = ((hi + lo) / 2 if len(tokens) == 1 else hi - i * (hi - lo) / (len(tokens) - 1)) if hi > lo \
            else i - (len(tokens) - 1) / 2
    return pd.DataFrame([{"id": n.id, "kind": n.kind, "label": n.label, "layer": n.layer, "effect": n.effect,
                          "note": n.note, "shown_note": shown_note(n.note),
                          "column": column_of(n),
                          "x": float(cols.index(column_of(n))) + (MLP_SHIFT if n.kind == "mlp" else 0.0),
                          "y": y.get(n.id, 0.0)}
                         for n in diagram.nodes], columns=["id", "kind", "label", "layer", "effect", "note",
                                                           "shown_note", "column", "x", "y"])


def shown_note(note: str) -> str:
    """A note as drawn under its node: its first line, cut to :data:`NOTE_CHARS` characters with an ellipsis."""
    first = (note or "").strip().splitlines()[0] if (note or "").strip() else ""
    cut = len(first) > NOTE_CHARS or (note or "").strip() != first
    return first[:NOTE_CHARS - 1].rstrip() + "…" if cut else first


def edge_kind(e) -> str:
    """An edge's legend entry (:data:`EDGE_KINDS`): attention, or the sign of its patching effect."""
    return EDGE_KINDS["attention" if e.kind == "attention" else "lowers" if e.weight < 0 else "raises"]


def route(start: tuple[float, float], end: tuple[float, float], others: list[tuple[str, float, float]],
          depth: int = 4) -> list[tuple[float, float]]:
    """An edge's points from ``start`` to ``end`` (x, y): the straight line, or bent :data:`BEND` rows below the
    first node of ``others`` (id, x, y) it would run through -- within :data:`NEAR` rows below its centre or
    :data:`ABOVE` above it, its label -- and each part routed again (``depth`` times at most).  An edge drawn through
    a node it does not touch reads as two edges of that node."""
    (x, y), (x2, y2) = start, end = (float(start[0]), float(start[1])), (float(end[0]), float(end[1]))
    hits = [(abs(nx - x), nx, ny) for _, nx, ny in others
            if min(x, x2) < nx < max(x, x2) and -NEAR < y + (y2 - y) * (nx - x) / (x2 - x) - ny < ABOVE]
    if not hits or depth == 0:
        return [start, end]
    _, nx, ny = min(hits)
    bend = (nx, ny - BEND)
    return route(start, bend, others, depth - 1) + route(bend, end, others, depth - 1)[1:]


def diagram_chart(diagram) -> alt.Chart:
    """Edges (width: attention share, or |effect| relative to the strongest of their kind; colour: attention, or
    the effect's sign; head -> head edges dashed) under labelled nodes; a pinned node (its note) is ringed in orange
    with its note drawn under it (cut, :func:`shown_note`; whole in the tooltip); a click on a node selects it
    (selection ``DIAGRAM_SELECTION`` on ``id``)."""
    nodes = layout(diagram)
    noted = bool((nodes.note != "").any())
    pos = nodes.set_index("id")
    cols = columns(diagram)
    edges = []
    through = list(zip(nodes.id, nodes.x, nodes.y))
    for i, e in enumerate(diagram.edges):
        strongest = max(abs(x.weight) for x in diagram.edges if x.kind == e.kind) or 1.0
        row = {"edge": i, "source": e.source, "target": e.target, "kind": e.kind, "via": e.via or "-",
               "sign": edge_kind(e), "weight": e.weight, "width": 1 + 7 * abs(e.weight) / strongest,
               "line": LINES["dashed" if e.kind == "head-head" else "solid"]}
        points = route((pos.x[e.source], pos.y[e.source]),
                       (pos.x[e.target], pos.y[e.target] + VIA_OFFSET.get(e.via, 0.0)),
                       [n for n in through if n[0] not in (e.source, e.target)])
        edges += [row | {"order": k, "x": x, "y": y} for k, (x, y) in enumerate(points)]
    edf = pd.DataFrame(edges, columns=["edge", "source", "target", "kind", "via", "sign", "weight", "width", "line",
                                       "order", "x", "y"])
    names = "[" + ", ".join(repr(c) for c in cols) + "]"
    shown = [k for k in EDGE_COLOR if k in set(edf.sign)]  # the legend names the kinds of edge drawn, no other
    dashes = [k for k in LINE_DASH if k in set(edf.line)]
    xs = alt.X("x:Q", title=None, scale=alt.Scale(domain=[-0.5, len(cols) - 0.5], nice=False),
               axis=alt.Axis(values=list(range(len(cols))), labelExpr=f"{names}[datum.value]", labelOverlap=False,
                             grid=False, labelFontSize=12, labelFontWeight="bold", orient="top", ticks=False))
    lo, hi = (float(nodes.y.min()), float(nodes.y.max())) if len(nodes) else (0.0, 0.0)
    ys = alt.Y("y:Q", axis=None, scale=alt.Scale(domain=[lo - 0.6, hi + 0.6], nice=False))
    lines = alt.Chart(edf).mark_line(opacity=0.7).encode(
        x=xs, y=ys, detail="edge:N", order="order:Q", strokeWidth=alt.StrokeWidth("width:Q", legend=None, scale=None),
        strokeDash=alt.StrokeDash("line:N", title="line",
                                  scale=alt.Scale(domain=dashes, range=[LINE_DASH[k] for k in dashes]),
                                  # a legend only where head -> head edges are drawn beside the others
                                  legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0,
                                                    symbolStrokeColor="#555555", symbolStrokeWidth=2, symbolSize=900)
                                  if LINES["dashed"] in dashes else None),
        color=alt.Color("sign:N", title="edge", legend=alt.Legend(orient="bottom", direction="vertical", labelLimit=0),
                        scale=alt.Scale(domain=shown, range=[EDGE_COLOR[k] for k in shown])),
        tooltip=["source", "target", "kind"] + ([alt.Tooltip("via:N", title="into the receiver's")]
                                                 if any(e.via for e in diagram.edges) else [])
        + [alt.Tooltip("weight:Q", format=".3f")])
    sel = alt.selection_point(name=DIAGRAM_SELECTION, fields=["id"], on="click", clear="dblclick")
    dots = alt.Chart(nodes).mark_circle(size=420, opacity=1).encode(
        x=xs, y=ys, color=alt.Color("kind:N", title="node", scale=alt.Scale(domain=list(KIND_COLOR),
                                                                           range=list(KIND_COLOR.values())),
                                    legend=alt.Legend(orient="bottom", direction="vertical")),
        tooltip=["label", "kind", "layer", alt.Tooltip("effect:Q", format=".4f")]
        + ([alt.Tooltip("note:N", title="your note")] if noted else [])).add_params(sel)
    label = {"dy": -19, "fontSize": 12}
    # a white halo under each label, so that an edge running through it (into the answer) does not hide a letter
    halo = alt.Chart(nodes).mark_text(**label, color="white", stroke="white", strokeWidth=4).encode(
        x=xs, y=ys, text="label:N")
    text = alt.Chart(nodes).mark_text(**label).encode(x=xs, y=ys, text="label:N")
    layers = [lines, dots, halo, text]
    if noted:  # a ring round each pinned node and its note under it: plain text, as Vega draws any string
        pinned = alt.Chart(nodes[nodes.note != ""])
        note = {"dy": 21, "fontSize": 12, "fontStyle": "italic"}
        layers += [pinned.mark_circle(size=720, filled=False, stroke=PIN_COLOR, strokeWidth=3).encode(x=xs, y=ys),
                   # a white halo under the note, so that an edge crossing it does not hide a letter
                   pinned.mark_text(**note, color="white", stroke="white", strokeWidth=4).encode(
                       x=xs, y=ys, text="shown_note:N"),
                   pinned.mark_text(**note, color=NOTE_COLOR).encode(x=xs, y=ys, text="shown_note:N")]
    height = max(MIN_HEIGHT_PX, int((NODE_GAP_PX + (NOTE_GAP_PX if noted else 0)) * (hi - lo + 1.2)))
    return stretched(alt.layer(*layers).resolve_scale(color="independent").properties(height=height))


#: an exported diagram's width per column (no page to fit: its legends, side by side below, must fit too)
EXPORT_PX_PER_COLUMN = 140
EXPORT_MIN_WIDTH_PX = 720


def diagram_image(diagram, fmt: str) -> bytes:
    """The chart as ``svg`` (UTF-8) or ``png`` bytes, :data:`EXPORT_PX_PER_COLUMN` wide per column."""
    import vl_convert
    width = max(EXPORT_MIN_WIDTH_PX, EXPORT_PX_PER_COLUMN * len(columns(diagram)))
    spec = diagram_chart(diagram).properties(width=width).to_json()
    if fmt == "svg":
        return vl_convert.vegalite_to_svg(spec).encode()
    if fmt == "png":
        return vl_convert.vegalite_to_png(spec, scale=2)
    raise ValueError(f"unknown image format {fmt!r}: svg or png")
