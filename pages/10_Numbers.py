"""Numbers: how the model holds A, B and the answer, layer by layer (probes, Fourier, helix, causal check)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.cost import estimate
from engine.findings.as_code import numbers_code
from engine.techniques.helix_patch import cached_helix_patch, helix_patch_work
from engine.techniques.numbers import (
    DECODE_THRESHOLD,
    FREQUENCY_SPACE,
    POSITIONS,
    TARGETS,
    cached_causal_check,
    cached_helix_circle,
    cached_number_probes,
    cached_number_spectrum,
    causal_check_work,
    causal_layer,
    decode_words,
    default_layer,
    dominant_periods,
    first_decode_layer,
    probes_cost,
    residual_pass_work,
)
from ui import url_state
from ui.as_code import code_view
from ui.progress import USER_ERRORS, compute_or_button, run_with_progress
from ui.session import analysed_pairs, result_cache, setup_page
from views.numbers import (
    causal_bars,
    circle_scatter,
    digit_lines,
    helix_caption,
    helix_lines,
    kappa_caption,
    kappa_lines,
    patch_bars,
    probe_lines,
    ridge_caption,
    spectrum_bars,
)

model, spec = setup_page(
    "Numbers",
    "How the residual stream holds the operands A, B and the answer C, layer by layer, at the last token (END) and "
    "at each operand's last token: held-out linear probes (dashed: the same probe on shuffled labels), the Fourier "
    "spectrum of the number tokens, per-digit circular probes, a helix fit (cos/sin at periods 2, 5, 10, 100 plus a "
    "line) against PCA of the same dimension, and two causal checks: patching only the helix subspace, and moving "
    "the last token's residual stream from C towards another answer.")

cache = result_cache()
pairs, _ = analysed_pairs(model, spec, cache)

st.subheader("Linear probes")
rows, computed = compute_or_button(lambda cb: cached_number_probes(model, pairs, cache=cache, progress=cb),
                                   lambda: probes_cost(model, pairs), model=model, stop=True,
                                   button="Fit the probes", key="numbers_probes", text="Number probes",
                                   failure="run the number probes",
                                   note="Every view of this page starts from the probes: one pass of the prompts, "
                                        "then held-out fits at every layer.")
df = pd.DataFrame([r.__dict__ for r in rows])
first, decodes = first_decode_layer(rows), decode_words(rows)
classified = sorted(df.loc[df["method"] == "logistic", "target"].unique())
st.caption(f"{len(pairs)} prompt pairs · " + ("computed now" if computed else "read from the cache") + " · "
           + (f"C decodes from the last token (accuracy ≥ {DECODE_THRESHOLD:.0%}) {decodes}"
              if decodes is not None else f"C never decodes from the last token at accuracy ≥ {DECODE_THRESHOLD:.0%}"
              if "C" in classified else "C has too few prompts per value to classify")
           + ". Classification keeps the values with at least 3 prompts (5 folds where 5 per value keep as many; "
             f"n_prompts, n_classes in the tooltip); the dotted line in the linear-probe panels is that "
             f"{DECODE_THRESHOLD:.0%} threshold.")
if len(classified) < 3:
    st.info(f"Too few prompts per value to classify {', '.join(sorted(set('ABC') - set(classified)))} (at least "
            "3 answered right for two values): the scalar, digit and helix views below use every prompt. Raise "
            "'Prompts per op' in the sidebar for the classification probes.")
if classified:  # a chart of the targets that could be classified; none: the note above says why there is none
    st.altair_chart(probe_lines(df, "logistic", DECODE_THRESHOLD), width="stretch")
st.caption(ridge_caption(df, len(pairs)))
st.altair_chart(probe_lines(df, "ridge"), width="stretch")
st.caption("Each digit on its own (Levy & Geva, 2025): a circular probe maps the residual stream to the digit's point "
           "on a circle (cos, sin of 2π·digit/10) and reads the digit back from the angle — held-out accuracy per "
           "layer for the units and tens digits (grey: shuffled digits; chance ≈ 1 / number of digit values).")
st.altair_chart(digit_lines(df), width="stretch")
st.download_button("Probe and helix rows (CSV)", df.to_csv(index=False).encode(), "numbers.csv", "text/csv")
code_view(numbers_code(model, spec))

if df["method"].str.startswith("mod").any():
    st.caption(kappa_caption(df))
    st.altair_chart(kappa_lines(df), width="stretch")

st.subheader("Fourier view of the number tokens")
sp = run_with_progress("Number-token spectrum", "compute the number tokens' spectrum",
                       lambda cb: cached_number_spectrum(model, pairs, cache=cache))
if sp is not None:
    sdf = pd.DataFrame([r.__dict__ for r in sp[0]])
    N = 2 * int(sdf["k"].max())
    st.caption(f"The DFT over the numbers 0..{N - 1} of their token embeddings and unembeddings: ‖F[k]‖ per frequency "
               f"k (period {N}/k). Dominant periods: embedding "
               f"{', '.join(f'{p:g}' for p in dominant_periods(sp[0], 'embedding'))}; unembedding "
               f"{', '.join(f'{p:g}' for p in dominant_periods(sp[0], 'unembedding'))}. Control: the same spectrum "
               f"of log(1 + how often each number is written in the GSM8K, SVAMP, AddSub and SingleEq questions) — "
               f"dominant periods {', '.join(f'{p:g}' for p in dominant_periods(sp[0], FREQUENCY_SPACE))}: a period "
               f"the text's own frequencies have proves no Fourier feature; the κ above tests separability.")
    st.altair_chart(spectrum_bars(sdf), width="stretch")

st.subheader("Helix fit")
st.caption("In-sample least squares of the residual stream on the target number's helix basis, against a line, "
           "against PCA of the same dimension (the most any subspace that size explains) and against one mean per "
           "value (the most any function of n can explain).")
c1, c2, c3 = st.columns(3)
layers = sorted(df["layer"].unique().tolist())
for key, options in (("num_pos", POSITIONS), ("num_target", TARGETS), ("num_layer", layers)):
    url_state.check(key, options)
position = c1.selectbox("Position", POSITIONS, **url_state.bound("num_pos", POSITIONS[0]))
target = c2.selectbox("Target", TARGETS, **url_state.bound("num_target"))
layer = c3.selectbox("Layer of the circle", layers, **url_state.bound("num_layer", default_layer(rows)))
st.altair_chart(helix_lines(df, position, target), width="stretch")
if helix_note := helix_caption(df, position, target):
    st.caption(helix_note)
circ = compute_or_button(lambda cb: cached_helix_circle(model, pairs, int(layer), position, target, cache=cache),
                         lambda: estimate(model, pairs, residual_pass_work(model, pairs)), model=model,
                         button="Fit the helix", key="numbers_circle", text="Helix circle", failure="fit the helix")
if circ is not None and circ[0]:
    cdf = pd.DataFrame([r.__dict__ for r in circ[0]])
    st.caption(f"Layer {layer}, position {position}, target {target}: each prompt projected onto the fitted cos/sin "
               f"directions of the strongest period, T = {int(cdf['period'].iloc[0])}; labels at the values' means "
               f"(one that would crowd another's is left out: hover its points).")
    st.altair_chart(circle_scatter(cdf), width="stretch")

st.subheader("Helix-subspace patching")
hp = compute_or_button(lambda cb: cached_helix_patch(model, pairs, int(layer), position, target, cache=cache,
                                                    progress=cb),
                       lambda: estimate(model, pairs, helix_patch_work(model, pairs)), model=model,
                       button="Patch the helix subspace", key="numbers_helix_patch", text="Helix-subspace patching",
                       failure="patch the helix subspace")
if hp is not None:
    hdf = pd.DataFrame([r.__dict__ for r in hp[0]])
    got = {r.method: r for r in hp[0]}
    st.caption(f"Layer {layer}, position {position}, target {target}, {got['helix'].n_prompts} prompts: each "
               f"prompt's residual stream at that token moved to a donor prompt's value of {target} — the whole "
               f"activation (full), only along the fitted helix (helix, {got['helix'].rank} dimensions), the top "
               f"{got['helix'].rank} principal directions (pca) or {got['helix'].rank} random ones (random). The "
               f"bars: the share of prompts whose top token becomes C' — full {got['full'].success:.0%}, helix "
               f"{got['helix'].success:.0%} [{got['helix'].success_low:.0%}, {got['helix'].success_high:.0%}], "
               f"PCA {got['pca'].success:.0%}, random {got['random'].success:.0%}. Not drawn (in the tooltips): "
               f"the helix moves logit[C'] − logit[C] by {got['helix'].recovered:.0%} "
               f"[{got['helix'].recovered_low:.0%}, {got['helix'].recovered_high:.0%}] of what the full patch "
               f"moves it, PCA {got['pca'].recovered:.0%}, random {got['random'].recovered:.0%}.")
    st.altair_chart(patch_bars(hdf), width="stretch")

st.subheader("Causal check")
try:
    at_layer = causal_layer(rows)
except USER_ERRORS:
    st.info("The causal check moves the last token's residual stream towards another answer's class mean, so it "
            "needs C probed at the last token: these prompts give too few per answer value (3 answered right each). "
            "Raise 'Prompts per op' in the sidebar.")
else:
    cc = compute_or_button(lambda cb: cached_causal_check(model, pairs, at_layer, cache=cache, progress=cb),
                           lambda: estimate(model, pairs, causal_check_work(model, pairs)), model=model,
                           button="Run the causal check", key="numbers_causal", text="Causal check",
                           failure="run the causal check")
    if cc is not None:
        cdf = pd.DataFrame([r.__dict__ for r in cc[0]])
        moved = cdf[cdf["method"] == "class-means"].iloc[0]
        why = "where C first decodes" if first == at_layer else "the best layer for C"
        st.caption(f"At layer {at_layer} ({why}), the last token's residual stream moved by the "
                   f"difference of the class means μ(C') − μ(C) (mean norm {moved['relative_norm']:.0%} of the "
                   f"residual), for {int(moved['n_prompts'])} prompts; the control moves it as far along a random "
                   f"direction. The probe's direction is one the model uses when the answer follows it.")
        st.altair_chart(causal_bars(cdf), width="stretch")
