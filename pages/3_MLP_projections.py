"""MLP projections: layer by layer, do the operands arrive and does the MLP write the answer?"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from cache import CacheError
from engine.promptlab import analyse_prompt
from engine.projections import cached_mlp_projections, top_number_tokens
from engine.prompts import PromptError
from ui.charts import lines_with_band
from ui.circuit_views import logit_lens_view
from ui.session import analysed_pairs, current_prompt, progress_bar, result_cache, setup_page

model, spec = setup_page(
    "MLP projections",
    "At the last position of each prompt, per layer: the cosine of the MLP's input with the unembedding "
    "vectors of the operands A and B (do they arrive?), and of the MLP's contribution (output minus input) "
    "with the answer C's unembedding vector and, as a baseline, with the other number tokens. Raw vectors, "
    "no final norm. The shaded band is ± one standard deviation over the prompt set.")

cache = result_cache()
pairs, _ = analysed_pairs(model, spec, cache)
try:
    bar, cb = progress_bar("Projecting")
    vals, computed = cached_mlp_projections(model, pairs, cache=cache, progress=cb)
    bar.empty()
except (PromptError, CacheError, ValueError) as e:
    st.error(f"Cannot compute the projections: {e}")
    st.stop()

labels = {"cos_in_A": "cos(MLP in, W_U[A])", "cos_in_B": "cos(MLP in, W_U[B])",
          "cos_out_C": "cos(MLP contribution, W_U[C])", "cos_out_other": "cos(MLP contribution, other numbers)"}
df = pd.DataFrame([v.__dict__ for v in vals])
df["series"] = df["metric"].map(labels)
df["lo"], df["hi"] = df["value"] - df["std"], df["value"] + df["std"]
st.caption(f"{len(pairs)} prompt pairs · " + ("computed now" if computed else "read from the cache"))
st.altair_chart(lines_with_band(df, "layer", "value", "lo", "hi", "series", "cosine"), width="stretch")
st.download_button("Projection data (CSV)", df.to_csv(index=False).encode(), "mlp_projections.csv", "text/csv")

st.subheader("Logit lens of the answer")
st.caption("The residual stream at the last token after each layer, read through the final norm and the "
           "unembedding: the answer's probability and its rank among all tokens. Where the MLPs above write the "
           "answer, the lens shows it appear.")
logit_lens_view(model, pairs, cache)

st.subheader("Top number tokens of each layer's MLP, on the typed prompt")
st.caption(f"Prompt: `{current_prompt()}` (change it in the Prompt lab). Score = MLP contribution · W_U[n].")
try:
    rep = analyse_prompt(model, current_prompt())
    top = pd.DataFrame([t.__dict__ for t in top_number_tokens(model, rep.text, rep.ids)])
    wide = top.pivot(index="layer", columns="rank", values="number")
    wide.columns = [f"#{c}" for c in wide.columns]
    st.dataframe(wide, width="stretch")
    if rep.parsed is not None:
        st.caption(f"Answer: {rep.parsed.answer}")
    st.download_button("Top tokens (CSV)", top.to_csv(index=False).encode(), "top_number_tokens.csv", "text/csv")
except PromptError as e:
    st.error(f"Cannot analyse the typed prompt: {e}")
