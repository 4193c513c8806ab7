"""Circuit: the paper's Figure 1 for this model -- operand and operator tokens -> key heads -> MLPs -> the answer."""

from __future__ import annotations

import functools
import json

import pandas as pd
import streamlit as st

from engine.cost import estimate
from engine.findings.as_code import circuit_code
from engine.findings.notes import labels as note_labels
from engine.techniques.circuit import (
    MAX_DRAWN_EDGES,
    circuit_diagram,
    circuit_parts,
    edge_diagram,
    edge_diagram_work,
    parts_text,
    parts_work,
)
from ui import state, url_state
from ui.as_code import code_view
from ui.nav import link_to
from ui.progress import compute_or_button
from ui.session import analysed_pairs, prompt_caption, result_cache, setup_page
from views.circuit_diagram import DIAGRAM_SELECTION, diagram_chart, diagram_image

model, spec = setup_page(
    "Circuit",
    "The circuit as the paper draws it (Figure 1), from the results the other pages compute: the key heads "
    "(path patching's top k, node effect = their heatmap cell), the operand and operator tokens they attend to "
    "(edge width = END-row attention share, Fig. 5), the MLPs that most lower the answer logit when patched, and "
    "each component's effect on the answer (edge width = |effect| relative to the strongest edge of its kind: the "
    "dashed head → head edges have a scale of their own, so a thick dashed edge may be a weak one: its tooltip "
    "gives the number). Edge colour: grey = attention; orange = patching the sender lowers the answer logit (it "
    "carries the operation), blue = patching it raises the answer logit; dashed = head → head. Columns are the "
    "layers that hold a node; a layer's MLP sits a third of a column right of its heads (it reads them). Click a "
    "node for its numbers and its page. "
    "Or draw, instead, the strongest edges of MIB's graph under an edge ranking (Draw, below).")

prompt_caption()
cache = result_cache()
pairs, _ = analysed_pairs(model, spec, cache)
L, H = model.facts.n_layers, model.facts.n_heads
#: an edge ranking's name on the page (the Faithfulness page's)
RANKING_NAMES = {"eap": "EAP (one gradient)", "eap-ig": "EAP-IG", "exact": "exact edge patching"}
by_edges = st.radio("Draw", [False, True], horizontal=True, **url_state.bound("circ_edges"), format_func=lambda e: (
    "the strongest edges of MIB's graph (a ranking's top edges)" if e else
    "the paper's circuit (key heads, the tokens they read, MLPs)"),
    help="MIB's graph: the input, every head through its query, key and value, every MLP, the logits. Its edges are "
         "scored on the Faithfulness page (Edges); the diagram draws the top ones by |score| and the nodes they join.")
c1, c2, c3 = st.columns(3)
k, mlps, senders, ranking, top = 5, 3, False, "eap", 20
if by_edges:
    ranking = c1.radio("Edge ranking", list(RANKING_NAMES), format_func=RANKING_NAMES.get,
                       **url_state.bound("circ_ranking"))
    top = c2.number_input("Edges drawn", 1, MAX_DRAWN_EDGES, **url_state.bound("circ_top"),
                          help=f"The top edges by |score| (at most {MAX_DRAWN_EDGES}: more is a tangle).")
    d = compute_or_button(lambda cb: edge_diagram(model, pairs, ranking, top=int(top), cache=cache, progress=cb),
                          lambda: estimate(model, pairs, edge_diagram_work(model, pairs, ranking, cache=cache)),
                          model=model, ask=True, stop=True, button=f"Score every edge ({RANKING_NAMES[ranking]})",
                          key=f"circuit_edges_{ranking}", text="Scoring edges", failure="score the edges",
                          note="Every edge of the model's graph is scored on the prompts of the set (the Faithfulness "
                               "page's edge scores, shared with it); exact edge patching runs about two passes of "
                               "the set per edge.")
else:
    url_state.check("circ_k", range(1, L * H + 1))
    url_state.check("circ_mlps", range(0, L + 1))
    k = c1.number_input("Key heads", 1, L * H, **url_state.bound("circ_k", min(5, L * H)))
    mlps = c2.number_input("MLPs", 0, L, **url_state.bound("circ_mlps", min(3, L)))
    senders = c3.toggle("Head → head edges", **url_state.bound("circ_hh"),
                        help="Which key heads feed which (head → head path patching into each key head's query): one "
                             "path patching per key head, computed once and cached.")
    # what is not cached yet, probed once (on a miss only): the estimate and the box beside the button both read it
    todo = functools.cache(lambda: circuit_parts(model, pairs, k=int(k), senders=senders, cache=cache))
    d = compute_or_button(lambda cb: circuit_diagram(model, pairs, k=int(k), mlps=int(mlps), senders=senders,
                                                     cache=cache, progress=cb),
                          lambda: estimate(model, pairs, parts_work(todo())),
                          model=model, stop=True, button="Build the circuit", key="circuit",
                          text="Building the circuit", failure="build the circuit diagram",
                          note=lambda: "Still to compute for this diagram: " + parts_text(todo()) + ".")
d = d.noted(note_labels(model.facts.fingerprint, cache))  # each pinned head's / MLP's note (Path patching's pins)
if by_edges:
    st.caption(f"The {len(d.edges)} edges of the largest |{RANKING_NAMES[ranking]} score| among the graph's, and the "
               f"{len(d.nodes)} nodes they join. Width: |score| relative to the strongest drawn; orange: sending the "
               "sender's counterfactual value along the edge lowers the answer logit, blue: raises it. An edge into a "
               "head ends above it (query), at it (key) or below it (value). A head's or MLP's number is its own edge "
               "to the logits (its direct effect).")
event = st.altair_chart(diagram_chart(d), width="stretch", on_select="rerun",
                        key=f"circuit_edges_{ranking}_{top}" if by_edges else f"circuit_{k}_{mlps}_{senders}")
noted = [n for n in d.nodes if n.note]
if noted:
    st.markdown("**Your notes** on the circuit's components (pinned on the Path patching page or the Atlas): each "
                "pinned node is ringed in orange with its note under it, cut to its first words (whole here and in "
                "the node's tooltip)")
    st.dataframe(pd.DataFrame({"component": [n.label for n in noted], "note": [n.note for n in noted]}),
                 hide_index=True, width="stretch")  # plain text, never Markdown or HTML
picked = (event.selection.get(DIAGRAM_SELECTION) or [{}])[0].get("id") if event and event.selection else None
if picked:
    n = d.node(picked)
    ins = [e for e in d.edges if e.target == picked]
    outs = [e for e in d.edges if e.source == picked]
    what = (f"its edge to the logits, mean {d.metric} {n.effect:+.4f}" if by_edges
            else f"mean {d.metric} {n.effect:+.4f}")
    st.markdown(f"**{n.label}** ({n.kind}" + (f", layer {n.layer}" if n.kind in ("head", "mlp") else "") + ")"
                + (f": {what} over {d.n_pairs} pairs" if n.kind in ("head", "mlp") else ""))
    via = {"q": " (its query)", "k": " (its key)", "v": " (its value)", "": ""}
    def number(e) -> str:
        return f"{e.weight:.3f}" if e.kind == "attention" else f"{e.weight:+.4f}"
    st.caption(" · ".join([f"from {e.source}{via[e.via]}: {e.kind} {number(e)}" for e in ins]
                          + [f"to {e.target}{via[e.via]}: {e.kind} {number(e)}" for e in outs]))
    if n.kind == "head":
        state.select(n.layer, n.head)
        link_to("path-patching", f"Head {n.label} on the Path patching page")
    elif n.kind == "mlp":
        state.select(n.layer, state.MLP)
        link_to("mlp-projections", f"MLP {n.layer} on the MLP projections page")
    elif by_edges and n.kind == "token":
        link_to("faithfulness", "Every edge's score (Faithfulness page, Edges)")
    elif n.kind == "token":
        link_to("attention", "Attention by token role (Path patching page)")
    else:
        link_to("logit-lens", "How the answer forms layer by layer (MLP projections page)")
c1, c2, c3 = st.columns(3)
c1.download_button("Diagram (JSON)", json.dumps(d.to_json(), indent=1).encode(), "circuit.json", "application/json")
c2.download_button("Diagram (SVG)", diagram_image(d, "svg"), "circuit.svg", "image/svg+xml")
c3.download_button("Diagram (PNG)", diagram_image(d, "png"), "circuit.png", "image/png")
code_view(circuit_code(model, spec, int(k), int(mlps), senders, ranking if by_edges else None, int(top)))
