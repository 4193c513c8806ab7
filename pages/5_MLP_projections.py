"""MLP projections: layer by layer, do the operands arrive and does the MLP write the answer?"""

from __future__ import annotations

import streamlit as st

from ui.circuit_panels import logit_lens_view, mlp_projections_view, typed_top_numbers
from ui.session import analysed_pairs, current_prompt, prompt_caption, result_cache, setup_page

model, spec = setup_page(
    "MLP projections",
    "At the last position of each prompt, per layer: the cosine of the MLP's input with the unembedding "
    "vectors of the operands A and B (do they arrive?), and of the MLP's contribution (output minus input) "
    "with the answer C's unembedding vector and, as a baseline, with the other number tokens. Raw vectors, "
    "no final norm. The shaded band is ± one standard deviation over the prompt set.")

prompt_caption()
cache = result_cache()
pairs, _ = analysed_pairs(model, spec, cache)
df = mlp_projections_view(model, pairs, cache)
if df is not None:
    st.download_button("Projection data (CSV)", df.to_csv(index=False).encode(), "mlp_projections.csv", "text/csv")

st.subheader("Logit lens of the answer")
st.caption("The residual stream at the last token after each layer, read through the final norm and the "
           "unembedding: the answer's probability and its rank among all tokens. Where the MLPs above write the "
           "answer, the lens shows it appear.")
logit_lens_view(model, pairs, cache)

st.subheader("Top number tokens of each layer's MLP, on the typed prompt")
st.caption(f"Prompt: `{current_prompt()}` (change it in the Prompt lab). Score = MLP contribution · W_U[n].")
got = typed_top_numbers(model, current_prompt())
if got is not None:
    top, rep = got
    wide = top.pivot(index="layer", columns="rank", values="number")
    wide.columns = [f"#{c}" for c in wide.columns]
    st.dataframe(wide, width="stretch")
    if rep.parsed is not None:
        st.caption(f"Answer: {rep.parsed.answer}")
    st.download_button("Top tokens (CSV)", top.to_csv(index=False).encode(), "top_number_tokens.csv", "text/csv")
