"""MLP projections: layer by layer, do the operands arrive and does the MLP write the answer?"""

from __future__ import annotations

import streamlit as st

from engine.findings.as_code import mlp_projections_code
from ui.as_code import code_view
from ui.circuit_panels import (
    highlight_answer,
    logit_lens_view,
    mlp_projections_view,
    top_numbers_sentence,
    typed_top_numbers,
)
from ui.session import analysed_pairs, current_prompt, prompt_caption, result_cache, setup_page, words_used

model, spec = setup_page(
    "MLP projections",
    "At the last position of each prompt, per layer: the cosine of the MLP's input with the unembedding "
    "vectors of the operands A and B (do they arrive?), and of the MLP's contribution (output minus input) "
    "with the answer C's unembedding vector and, as a baseline, with the other number tokens. Raw vectors, "
    "no final norm. The shaded band is ± one standard deviation over the prompt set.")

prompt_caption()
words_used("MLP", "MLP projection", "unembedding", "W_U[C]", "cosine", "residual stream", "logit lens", "rank",
           "END")
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

st.subheader("The numbers each layer's MLP pushes, on your prompt")
st.caption(f"Your prompt: `{current_prompt()}` (change it in the Prompt lab). Each row is one layer's MLP at the last "
           f"position; #1 is the number whose logit its output raises most (the MLP's output · that number's "
           f"unembedding vector), then #2 ...; the answer is highlighted where it is among them, and the last "
           f"column gives its rank at every layer.")
got = typed_top_numbers(model, current_prompt())
if got is not None:
    top, rep = got
    st.markdown(top_numbers_sentence(top, rep))
    wide = top[top["rank"] <= 5].pivot(index="layer", columns="rank", values="number")
    wide.columns = [f"#{c}" for c in wide.columns]
    if top["answer"].any():
        ranks = top[top["answer"]].set_index("layer")["rank"]
        wide["rank of the answer"] = ranks.reindex(wide.index)
    ranked = [c for c in wide.columns if c.startswith("#")]
    st.dataframe(highlight_answer(wide, ranked, int(top[top["answer"]]["number"].iloc[0]))
                 if top["answer"].any() else wide, width="stretch", height="content")  # every row, no empty one
    st.download_button("Top tokens (CSV)", top.to_csv(index=False).encode(), "top_number_tokens.csv", "text/csv")
code_view(mlp_projections_code(model, spec, current_prompt()))
