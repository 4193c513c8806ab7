"""Knockout: mean-ablate heads or MLPs live and watch predictions and accuracy change."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from cache import CacheError
from engine.ablation import Knockout, cached_knockout_curve, knockout_accuracy, mean_activations
from engine.patching import cached_path_patching
from engine.promptlab import analyse_prompt
from engine.prompts import PromptError
from ui.charts import lines_with_band
from ui.session import analysed_pairs, current_prompt, progress_bar, result_cache, setup_page

model, spec = setup_page(
    "Knockout",
    "Knocked-out heads and MLPs have their output replaced by its mean over the counterfactual prompts "
    "(same template, aligned at the last token), so they carry no information about the operation. "
    "If the key heads found by path patching matter, knocking them out breaks the arithmetic while "
    "knocking out as many random heads does not.")

L, H = model.facts.n_layers, model.facts.n_heads
cache = result_cache()
pairs, _ = analysed_pairs(model, spec, cache)
try:
    table, _ = cached_path_patching(model, pairs, cache=cache)
except (PromptError, CacheError, ValueError) as e:
    st.error(f"Cannot prepare the knockout: {e}")
    st.stop()

head_opts = [f"{layer}.{h}" for layer in range(L) for h in range(H)]
if "knockout_heads" not in st.session_state:
    st.session_state["knockout_heads"] = []
c1, c2, c3 = st.columns([3, 2, 1])
heads = c1.multiselect("Heads to knock out (layer.head)", head_opts, key="knockout_heads",
                       help="Cells clicked on the Path patching page are added here.")
mlps = c2.multiselect("MLPs to knock out (layer)", list(range(L)), key="knockout_mlps")
c3.button("Top-3 heads", help="knock out the three heads with the most negative patching effect",
          on_click=lambda: st.session_state.update(knockout_heads=[f"{a}.{b}" for a, b, _ in table.top_heads(3)]))
ko = Knockout(tuple(tuple(int(x) for x in h.split(".")) for h in heads), tuple(mlps))
means = mean_activations(model, pairs)

left, right = st.columns(2)
with left:
    st.subheader("Typed prompt")
    try:
        before = analyse_prompt(model, current_prompt())
        after = analyse_prompt(model, current_prompt(), ko=ko, means=means)
        tbl = pd.DataFrame({"before": [f"{t.token}  {t.prob:.3f}" for t in before.top5],
                            "after knockout": [f"{t.token}  {t.prob:.3f}" for t in after.top5]},
                           index=range(1, len(before.top5) + 1))
        st.caption(f"`{current_prompt()}` — top-5 next tokens")
        st.table(tbl)
        if before.p_answer is not None:
            st.metric("P(answer)", f"{after.p_answer:.3f}", f"{after.p_answer - before.p_answer:+.3f}")
    except PromptError as e:
        st.error(f"Cannot analyse the typed prompt: {e}")
with right:
    st.subheader("Prompt set")
    base = knockout_accuracy(model, pairs, Knockout(), means)
    acc = knockout_accuracy(model, pairs, ko, means)
    st.metric("Accuracy after knockout", f"{acc:.1%}", f"{(acc - base) * 100:+.1f} points")
    st.caption(f"{len(pairs)} prompts the model answers right without the knockout ({base:.0%}).")

st.subheader("Key heads vs random heads (Fig. 3)")
c1, c2 = st.columns(2)
k_max = c1.slider("Up to k heads", 1, min(30, L * H), min(10, L * H))
draws = c2.slider("Random draws per k", 2, 30, 10)
bar, cb = progress_bar("Knocking out")
try:
    pts, _ = cached_knockout_curve(model, pairs, [(a, b) for a, b, _ in table.top_heads(k_max)], k_max=k_max,
                                   draws=draws, cache=cache, progress=cb)
except (CacheError, ValueError) as e:
    st.error(f"Cannot compute the knockout curve: {e}")
    st.stop()
bar.empty()
cdf = pd.DataFrame([p.__dict__ for p in pts])
long = pd.concat([
    pd.DataFrame({"k": cdf.k, "series": "top-k by effect", "acc": cdf.top_accuracy, "lo": cdf.top_accuracy,
                  "hi": cdf.top_accuracy}),
    pd.DataFrame({"k": cdf.k, "series": "k random heads (mean ± sd)", "acc": cdf.random_mean,
                  "lo": cdf.random_mean - cdf.random_std, "hi": cdf.random_mean + cdf.random_std}),
])
st.altair_chart(lines_with_band(long, "k", "acc", "lo", "hi", "series", "accuracy")
                .encode(y=alt.Y("acc:Q", scale=alt.Scale(domain=[0, 1]))), width="stretch")
st.download_button("Curve data (CSV)", cdf.to_csv(index=False).encode(), "knockout_curve.csv", "text/csv")
