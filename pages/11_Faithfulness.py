"""Faithfulness: how much of the model does the circuit of its top components keep (MIB's CPR and CMD)?"""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from engine.cost import estimate
from engine.findings.as_code import faithfulness_code
from engine.findings.glossary import help_text
from engine.techniques.circuit_units import RANKINGS_AT, RESOLUTIONS
from engine.techniques.edge_faithfulness import RANDOM
from engine.techniques.edge_scores import (
    RANKINGS,
    STEPS,
    cached_curves_if_any,
    cached_edge_curves,
    cached_edge_scores,
    edge_curves_work,
    mib_edge_graph,
    ranking_work,
)
from engine.techniques.faithfulness import (
    ABLATIONS,
    RANDOM_DRAWS,
    SIZES,
    cached_faithfulness,
    faithfulness_work,
    mib_submission,
)
from engine.techniques.path_patching import cached_path_patching
from ui import url_state
from ui.as_code import code_view
from ui.progress import compute_or_button
from ui.session import analysed_pairs, prompt_caption, result_cache, setup_page, words_used
from views.circuit_charts import FAITH_SERIES, faithfulness_chart, resolutions_frame

model, spec = setup_page(
    "Faithfulness",
    "Keep the top x % of the heads and MLPs by a ranking, give the rest their values on the counterfactual prompt "
    "(or their mean over all counterfactual prompts), and measure how much of the model's answer logit (or "
    "accuracy) the circuit keeps: f = (circuit − nothing) / "
    "(model − nothing), over MIB's circuit sizes. CPR is the area under f (higher is better), CMD the area "
    "between f and 1 (lower is better); every number has a 95 % bootstrap interval over the prompt pairs.")

prompt_caption()
words_used("circuit", "faithfulness", "CPR", "CMD", "counterfactual", "knockout", "attribution patching", "edge",
           "EAP", "token role", "answer logit", "bootstrap interval")
cache = result_cache()
pairs, _ = analysed_pairs(model, spec, cache)
OUTSIDE = {"counterfactual": "the pair's own counterfactual", "mean": "mean over the counterfactuals"}
c1, c2, c3 = st.columns(3)
for key, options in (("faith_draws", range(2, 21)), ("faith_ablation", ABLATIONS)):
    url_state.check(key, options)
draws = c1.slider("Random orders (the random ranking)", 2, 20, **url_state.bound("faith_draws", RANDOM_DRAWS),
                  help="Prompt pair i is read under random order i mod this number: more orders mix more random "
                       "circuits into the random curve, at the same cost.")
ablation = c2.radio("Outside the circuit", ABLATIONS, horizontal=True,
                    **url_state.bound("faith_ablation", ABLATIONS[0]),
                    format_func=OUTSIDE.get,
                    help=help_text("circuit", "counterfactual", "knockout",
                                   lead="What a component left out of the circuit takes: its value on the same prompt "
                                        "with the operation removed (MIB's patching), or its mean over all "
                                        "counterfactual prompts (the knockouts' ablation, which also removes the "
                                        "operands)."))
metric = c3.radio("Metric", ["logit", "accuracy"], horizontal=True, **url_state.bound("faith_metric"),
                  format_func={"logit": "answer logit difference", "accuracy": "first-token accuracy"}.get,
                  help=help_text("faithfulness", "CPR", "CMD", "answer logit", "accuracy", "bootstrap interval"))
code_view(faithfulness_code(model, spec, draws, ablation))  # shown while the curves wait
table, _ = compute_or_button(
    lambda cb: cached_faithfulness(model, pairs, draws=draws, ablation=ablation, cache=cache, progress=cb),
    lambda: estimate(model, pairs, faithfulness_work(model, pairs, draws=draws, ablation=ablation, cache=cache)),
    model=model, ask=True, stop=True, button="Compute the curves", key="faithfulness_go", text="Evaluating circuits",
    failure="compute the faithfulness curves",
    note=f"The curves evaluate the circuits of 11 sizes for each of three rankings on the {len(pairs)} prompts (the "
         f"random ranking: each prompt under one of {draws} random orders): press the button to compute them (they "
         "are read from the cache once computed).")
if table.fallback:
    st.info(table.fallback, icon=":material/info:")

title = {"logit": "answer logit difference", "accuracy": "accuracy"}[metric]
fdf = pd.DataFrame([p.__dict__ for p in table.points if p.metric == metric])
st.altair_chart(faithfulness_chart(fdf, title), width="stretch")
sdf = pd.DataFrame([{"ranking": FAITH_SERIES[s.ranking], "CPR": s.cpr_interval.text(),
                     "CMD": s.cmd_interval.text(), "CPR − random": s.gap_interval.text("{:+.2f}")}
                    for s in table.scores if s.metric == metric])
st.dataframe(sdf, hide_index=True, width="stretch")
st.download_button("Curve data (CSV)", pd.DataFrame([p.__dict__ for p in table.points]).to_csv(index=False).encode(),
                   "faithfulness.csv", "text/csv")

st.subheader("Export to MIB")
pp, _ = cached_path_patching(model, pairs, cache=cache)
files = mib_submission(model, pairs, pp)
if not files:
    st.info("MIB's arithmetic tasks are addition and subtraction: add one of them to the operations in the "
            "sidebar to export the circuit.")
for name, graph in files.items():
    st.download_button(f"{name} (exact ranking's importance scores)", json.dumps(graph).encode(),
                       name.replace("/", "__"), "application/json", key=f"mib_{name}")
st.caption("MIB's submission format: one folder per task and model holding the node and edge scores that "
           "EAP-IG's Graph.from_json reads (EAP-IG/src/eap/graph.py in MIB's circuit-track repository).")

st.subheader("Edges (MIB's residual graph)")
st.caption("An edge joins a sender (the input, a head, an MLP) to what a receiver reads (a head's query, key or value, "
           "an MLP's input, the logits). Exact edge patching sends the sender's counterfactual value to that receiver "
           "alone; EAP estimates it with one gradient, EAP-IG with the gradient averaged between the counterfactual "
           "and the prompt. Scores: the mean change of the answer logit over the prompt pairs.")
names = {"eap": "EAP (one gradient)", "eap-ig": f"EAP-IG ({STEPS} steps)", "exact": "exact edge patching",
         RANDOM: f"random edges ({RANDOM_DRAWS} draws)"}
ranking = st.radio("Edge ranking", RANKINGS[1:] + RANKINGS[:1], horizontal=True, format_func=names.get,
                   key="faith_edge_ranking")
got = compute_or_button(
    lambda cb: cached_edge_scores(model, pairs, ranking, cache=cache, progress=cb),
    lambda: estimate(model, pairs, ranking_work(model, pairs, ranking)),
    model=model, ask=True, button=f"Score every edge ({names[ranking]})", key=f"edges_{ranking}",
    text="Scoring edges", failure="score the edges",
    note="Every edge of the model's graph is scored on the prompts of the set; exact edge patching runs about two "
         "passes of the set per edge.")
if got is not None:
    rows, art, _ = got
    edf = pd.DataFrame([{"edge": r.edge, "score": r.value} for r in rows])
    edf = edf.reindex(edf["score"].abs().sort_values(ascending=False).index)
    st.dataframe(edf.head(25), hide_index=True, width="stretch")
    st.caption(f"{len(edf)} edges; the 25 with the largest |score| shown. Computed in {art.get('seconds', 0):.1f} s, "
               f"{art.get('forward_equivalents', 0):.0f} forward-equivalents (counted from the code).")
    f = model.facts
    graph = mib_edge_graph({r.edge: r.value for r in rows}, f.n_layers, f.n_heads, f.d_model,
                           parallel_attn_mlp=model.parallel_attn_mlp)
    st.download_button(f"Edge scores in MIB's format ({names[ranking]})", json.dumps(graph).encode(),
                       f"edges-{ranking}.json", "application/json", key=f"mib_edges_{ranking}")

st.markdown("**Circuits of the top edges, and of edges or components at token positions**")
resolution = st.radio("Circuits made of", list(RESOLUTIONS), horizontal=True, format_func=RESOLUTIONS.get,
                      key="faith_resolution",
                      help="Edges: an edge is kept or ablated at every position. Edge × position: each edge at each "
                           "token role (operand A, operator, operand B, END, other) is its own unit, so a circuit "
                           "can keep an edge at END and drop it at the operands. Node × position: each head and MLP "
                           "at each role (the node circuits above keep a component at every position).")
sent = {"counterfactual": "the sender's value on the pair's own counterfactual",
        "mean": "the sender's mean over the counterfactual prompts of the pair's template"}[ablation]
unit = {"edge": "edges", "edge-position": "edge × position units (each edge at each of the 5 token roles)",
        "node-position": "node × position units (each head and MLP at each of the 5 token roles)"}[resolution]
st.caption(f"Keep the top x % of the {unit} by a ranking and ablate the rest as MIB does: on an ablated edge "
           f"{sent} replaces its value in the ablated run (a head's query, key and value each get their own; at a "
           "token role, at that role's positions only; a component ablated at a role: every edge out of it there), "
           "so an ablation upstream reaches later receivers through the kept edges (\"Outside the circuit\" above). "
           "f as above, on the metric chosen above; x is a share of this resolution's own units. Beside the chosen "
           f"rankings, random units: prompt pair i is read under random draw i mod {RANDOM_DRAWS} of each size, the "
           "baseline a ranking has to beat. At the position resolutions EAP and EAP-IG are split by token role; "
           "exact patches each unit alone: an edge's counterfactual difference sent at one role's positions only "
           "(up to five times the cost of exact edge patching), a component's counterfactual output at one role's "
           "positions (a node's score, not a sum over its edges).")
allowed = list(RANKINGS_AT[resolution])
suffix = "" if resolution == "edge" else f"_{resolution}"

def series_at(res: str) -> dict[str, str]:
    """The rankings' names at a resolution (exact patches its own units; its random baseline draws edges or units)."""
    exact = {"edge": names["exact"], "edge-position": "exact (each edge at each role)",
             "node-position": "exact (each component at each role)"}[res]
    return {**names, "exact": exact, RANDOM: f"random {'edges' if res == 'edge' else 'units'} ({RANDOM_DRAWS} draws)"}


chosen = st.multiselect("Rankings", allowed, default=[r for r in allowed if r != "exact"],
                        format_func=series_at(resolution).get, key="faith_edge_curves" + suffix)
xtitle = {"edge": "edges kept (share of the graph's edges)", "edge-position": "edge × position units kept (share)",
          "node-position": "node × position units kept (share)"}[resolution]
order = [r for r in RANKINGS if r in chosen]
if not chosen:
    st.info("Choose at least one ranking to draw the curve of its circuits.")
else:
    curves = compute_or_button(
        lambda cb: cached_edge_curves(model, pairs, order, ablation=ablation, resolution=resolution, cache=cache,
                                      progress=cb),
        lambda: estimate(model, pairs, edge_curves_work(model, pairs, order, ablation=ablation,
                                                        resolution=resolution, cache=cache)),
        model=model, ask=True, button=f"Compute the {RESOLUTIONS[resolution]} circuits' curves",
        key="edge_curves_" + "_".join([*order, ablation]) + suffix,
        text="Evaluating circuits", failure="compute the circuits' curves",
        note=f"Every unit is scored by each chosen ranking (read from the cache once scored), then its circuits of "
             f"{len(SIZES)} sizes are run on the {len(pairs)} prompts, layer by layer.")
    if curves is not None:
        etable, eart, _ = curves
        cdf = pd.DataFrame([p.__dict__ for p in etable.points if p.metric == metric])
        st.altair_chart(faithfulness_chart(cdf, title, series=series_at(resolution), xtitle=xtitle), width="stretch")
        st.dataframe(pd.DataFrame([{"ranking": series_at(resolution)[s.ranking], "CPR": s.cpr_interval.text(),
                                    "CMD": s.cmd_interval.text(), "CPR − random": s.gap_interval.text("{:+.2f}")}
                                   for s in etable.scores if s.metric == metric]),
                     hide_index=True, width="stretch")
        st.caption(f"Circuits run in {eart.get('seconds', 0):.1f} s, {eart.get('forward_equivalents', 0):.0f} "
                   "forward-equivalents (counted from the code).")

st.markdown("**Every resolution side by side**")
tables = {"node": (table, FAITH_SERIES)}
for res in RESOLUTIONS:
    ranked = [r for r in (order or allowed) if r in RANKINGS_AT[res]] or [r for r in RANKINGS_AT[res] if r != "exact"]
    tables[RESOLUTIONS[res]] = (cached_curves_if_any(model, pairs, ranked, ablation=ablation, resolution=res,
                                                     cache=cache), series_at(res))
st.dataframe(resolutions_frame(tables, metric), hide_index=True, width="stretch")
st.caption(f"Read from the cache: the node curves at the top of the page and each resolution's curves above for "
           f"the rankings chosen there, with {OUTSIDE[ablation]} outside the circuit; a resolution not computed yet "
           "says so (choose it above and press its button). f of the top 5 % of each resolution's own units, with its "
           "95 % interval; the smallest circuit whose f reaches 0.8 (MIB's faithful circuit), the whole model aside.")
