"""Compare: two path-patching runs side by side (A: the sidebar's set; B: the same set with another counterfactual
kind, other templates, another answer digit or another carry; or the same set on another model)."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import streamlit as st

from engine.findings.as_code import compare_code
from engine.findings.compare import compare_tables
from engine.prompts.pairs import CARRY_SETS, COUNTERFACTUAL_WORDS, PromptError, digit_words
from engine.prompts.promptsets import parse_families
from engine.techniques.accuracy import kept_pairs, kept_pairs_cost
from ui.as_code import code_view
from ui.circuit_panels import patching_table
from ui.compare_panels import findings_side_by_side
from ui.notes_panel import noted
from ui.progress import compute_or_button
from ui.session import (
    DIGIT_CHOICES,
    ModelChoice,
    analysed_pairs,
    result_cache,
    second_model,
    setup_page,
    words_used,
)
from ui.state import FAMILY_CHOICES
from views.charts import component_frame, heatmap, heatmap_frame, heatmap_limit

model, spec = setup_page(
    "Compare",
    "Two path-patching runs side by side: A is the sidebar's prompt set, B the same set with another counterfactual "
    "kind, other templates, another answer digit or the other carry (with a carry / borrow vs without), or the same "
    "set on another model. Both heatmaps share one "
    "colour scale; the third is their difference A - B per head and MLP, each with a 95 % bootstrap interval (A's "
    "and B's pairs resampled independently, 1000 times): a cell outlined in orange differs, its interval excludes "
    "0. Two models of different shapes have no common cell: their top-k heads are compared by rank.")
words_used("path patching", "counterfactual", "logit difference", "effect", "key heads", "bootstrap interval")
FEW_PAIRS = 10  # fewer pairs in A or B: the percentile bootstrap's intervals are too narrow to trust
AXES = {"counterfactual": "the counterfactual kind", "families": "the templates", "digit": "the answer digit",
        "carry": "the carry", "model": "the model"}
axis = st.radio("B differs from A in", list(AXES), format_func=AXES.get, key="cmp_axis", horizontal=True)
kinds = list(COUNTERFACTUAL_WORDS)
a_kind = spec.counterfactual
c1, c2, c3 = st.columns([2, 1, 1])
model_b = model
if axis == "counterfactual":
    b_kind = c1.selectbox("B: the counterfactual kind", [k for k in kinds if k != a_kind], key="cmp_kind",
                          format_func=lambda k: COUNTERFACTUAL_WORDS[k][0],
                          help=f"A is the sidebar's kind: {COUNTERFACTUAL_WORDS[a_kind][0]}.")
    a_name, b_name = COUNTERFACTUAL_WORDS[a_kind][0], COUNTERFACTUAL_WORDS[b_kind][0]
    change = {"counterfactual": b_kind}
elif axis == "families":
    a_fams = "your template" if spec.templates else next(
        (label for label, text in FAMILY_CHOICES.items() if parse_families(text) == spec.families),
        ", ".join(spec.families))
    b_label = c1.selectbox("B: the templates", [label for label in FAMILY_CHOICES if label != a_fams],
                           key="cmp_families", help=f"A is the sidebar's: {a_fams}.")
    a_name, b_name = a_fams, b_label
    change = {"families": parse_families(FAMILY_CHOICES[b_label]), "templates": ()}
elif axis == "model":
    b_spec = c1.text_input("B: the model (a folder, a .gguf file, a Hugging Face name, organism; a tuned copy: its "
                           "folder under .cache/tuned/)", "", key="cmp_model",
                           help="Loaded like the sidebar's model (its device, dtype and backend), on the same set.")
    if not b_spec.strip():
        st.info("Type B's model above: the same prompt set is run on it.")
        st.stop()
    choice = st.session_state.get("model_choice", ModelChoice())
    model_b, problem = second_model(ModelChoice(b_spec.strip(), choice.device, choice.dtype, choice.backend, False))
    if model_b is None:
        st.error(f"{problem}. Type another model for B.")
        st.stop()
    a_name, b_name, change = f"the sidebar's model ({choice.spec})", f"{b_spec.strip()}", {}
elif axis == "carry":
    b_carry = c1.selectbox("B: the carry", [c for c in CARRY_SETS if c != spec.carry], key="cmp_carry",
                           format_func=lambda c: CARRY_SETS[c],
                           help=f"A is the sidebar's: {CARRY_SETS[spec.carry]} (its 'Carry / borrow' box).")
    a_name, b_name = f"prompts {CARRY_SETS[spec.carry]}", f"prompts {CARRY_SETS[b_carry]}"
    change = {"carry": b_carry}
else:
    b_digit = c1.selectbox("B: the answer digit", [d for d in DIGIT_CHOICES if d != spec.digit], key="cmp_digit",
                           format_func=digit_words, help=f"A is the sidebar's: the {digit_words(spec.digit)} digit.")
    a_name, b_name = f"the {digit_words(spec.digit)} digit", f"the {digit_words(b_digit)} digit"
    change = {"digit": b_digit}
metric = c2.selectbox("Metric", ("logit_diff", "effect"), key="cmp_metric",
                      help="logit_diff: the answer logit's change (every pair); effect: the relative change")
k = int(c3.number_input("Top k", 1, model.facts.n_layers * model.facts.n_heads, 5, key="cmp_k"))
cache = result_cache()
pairs_a, _ = analysed_pairs(model, spec, cache)
table_a, _ = patching_table(model, pairs_a, cache)
try:
    spec_b = replace(spec, **change)  # the set checks its kind and digit (PromptError)
except PromptError as e:
    st.error(f"B cannot use {b_name} on this set: {e}. Pick another {AXES[axis].split(' ', 1)[1]} for B, or other "
             f"operations in the sidebar.")
    st.stop()
try:
    pairs_b, _ = compute_or_button(lambda cb: kept_pairs(model_b, spec_b, cache=cache, progress=cb),
                                   lambda: kept_pairs_cost(model_b, spec_b), model=model_b, stop=True,
                                   button="Check which of B's prompts the model answers right", key="cmp_filter",
                                   text="Checking B's prompts", failure="build B's prompt set")
except PromptError as e:
    st.error(f"B cannot use {b_name} on this set: {e}. Pick another {AXES[axis].split(' ', 1)[1]} for B.")
    st.stop()
if not pairs_b:
    st.error(f"B's model answers none of B's prompts right: pick another {AXES[axis].split(' ', 1)[1]} for B.")
    st.stop()
table_b, _ = patching_table(model_b, pairs_b, cache, key="cmp_patching_go", text="Path patching B, batch")
cmp = compare_tables(table_a, table_b, metric=metric, k=k)  # the one engine call

fa = noted(heatmap_frame(*table_a.heatmap(metric)), model, cache)  # each model's pins outlined
fb = noted(heatmap_frame(*table_b.heatmap(metric)), model_b, cache)
lim = max(heatmap_limit(fa), heatmap_limit(fb))  # one scale for A and B
if not cmp.cells:
    st.caption(f"A has {table_a.n_layers} layers x {table_a.n_heads} heads, B {table_b.n_layers} x "
               f"{table_b.n_heads}: no cell of one is a cell of the other, so there is no difference heatmap; the "
               f"two are compared by their top {k} heads (by rank). Both heatmaps on one colour scale, ±{lim:.3f}.")
elif model_b is not model:
    st.caption("Two models of one shape are compared cell by cell: that reads the same heads where B is a tuned "
               "copy of A; two unrelated models share no heads, read their top-k lists.")
left, right = st.columns(2)
left.markdown(f"**A: {a_name}** ({cmp.n_a} pairs)")
left.altair_chart(heatmap(fa, metric, lim), width="stretch", key="cmp_a")
right.markdown(f"**B: {b_name}** ({cmp.n_b} pairs)")
right.altair_chart(heatmap(fb, metric, lim), width="stretch", key="cmp_b")



def ranked_by_caption() -> None:
    """Which metric the top-k lists rank by, and what the rest of the lab ranks by (the Path patching and Paper
    pages, the 'key heads' row of the findings below: ``PatchingTable.ranking_metric``), so that two orders of the
    same heads on one page are explained."""
    ra, rb = table_a.ranking_metric(), table_b.ranking_metric()
    text = f"Ranked by {metric} (the Metric box above), most negative first, each value the head's mean {metric}."
    if metric != ra or metric != rb:
        lab = ra if ra == rb else f"{ra} on A, {rb} on B"
        text += (f" The Path patching and Paper pages, and the 'key heads' row (Fig. 2 / 15) of the paper's findings "
                 f"below, rank by {lab} (the relative effect, or logit_diff where the effect's guard leaves out more "
                 f"than half the pairs): their top heads can come in another order. Pick "
                 f"{ra if ra == rb else 'that metric'} in the Metric box to read their ranking here.")
    else:
        text += " The same ranking as the Path patching and Paper pages and the 'key heads' row of the findings below."
    st.caption(text)


if not cmp.cells:
    st.subheader(f"Top {k} heads of each model")
    st.dataframe(pd.DataFrame({"rank": range(1, len(cmp.top_a) + 1),
                               "A": [f"{a}.{b} ({v:+.3f})" for a, b, v in cmp.top_a],
                               "B": [f"{a}.{b} ({v:+.3f})" for a, b, v in cmp.top_b]}), hide_index=True)
    ranked_by_caption()
    shown = findings_side_by_side(model, spec, pairs_a, model_b, spec_b, pairs_b, cache, a_name, b_name)
    code_view(compare_code(model, spec, spec_b, metric, k, model_b, findings=shown))
    st.stop()
cells = [(c.component, c.layer, c.head, c.diff) for c in cmp.cells]
fd = component_frame(cells, model.facts.n_layers, model.facts.n_heads)
by = {(c.layer, c.head): c for c in cmp.cells}
fd["low"] = [by[(layer, h)].low for layer, h in zip(fd["layer"], fd["head"])]
fd["high"] = [by[(layer, h)].high for layer, h in zip(fd["layer"], fd["head"])]
fd["note"] = ["the interval excludes 0" if by[(layer, h)].differs else "" for layer, h in zip(fd["layer"], fd["head"])]
st.markdown(f"**A - B** ({metric}): {len(cmp.differing())} of {len(cmp.cells)} cells differ (outlined)")
if min(cmp.n_a, cmp.n_b) < FEW_PAIRS:
    st.warning(f"A has {cmp.n_a} pairs and B {cmp.n_b}: on so few, a percentile bootstrap resamples almost the same "
               f"values and its intervals come out too narrow -- read 'differs' as a hint, and add prompts (at least "
               f"{FEW_PAIRS} pairs each) before trusting it.")
st.altair_chart(heatmap(fd, f"A - B, {metric}"), width="stretch", key="cmp_diff")
st.download_button("Difference data (CSV)", fd.to_csv(index=False).encode(), "compare.csv", "text/csv")

st.subheader(f"Top {k} heads: {cmp.overlap} of {k} shared")
st.dataframe(pd.DataFrame({"A": [f"{a}.{b} ({v:+.3f})" for a, b, v in cmp.top_a],
                           "B": [f"{a}.{b} ({v:+.3f})" for a, b, v in cmp.top_b]}), hide_index=True)
ranked_by_caption()
shown = findings_side_by_side(model, spec, pairs_a, model_b, spec_b, pairs_b, cache, a_name, b_name)
code_view(compare_code(model, spec, spec_b, metric, k, None if model_b is model else model_b, findings=shown))
