"""Knockout: mean-ablate heads or MLPs live and watch predictions and accuracy change."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from cache import CacheError
from engine.findings.as_code import knockout_code
from engine.findings.glossary import help_text
from engine.prompts.pairs import PromptError
from engine.techniques.knockout import Knockout, knockout_accuracies, mean_activations
from engine.techniques.knockout_curve import (
    cached_knockout_curve,
    curve_cost,
    prompt_knockout_curve,
    stored_curve_intervals,
    stored_knockout_curve,
)
from engine.techniques.promptlab import analyse_prompt
from ui import state, url_state
from ui.as_code import code_view
from ui.circuit_panels import patching_table
from ui.progress import compute_or_button
from ui.session import analysed_pairs, current_prompt, prompt_caption, result_cache, setup_page, words_used
from views.charts import display_token, fmt_prob, signed_change
from views.circuit_charts import knockout_curve_chart
from views.knockout import prompt_knockout_chart, prompt_knockout_sentence

model, spec = setup_page(
    "Knockout",
    "Knocked-out heads and MLPs have their output replaced by its mean over the counterfactual prompts "
    "(same template, aligned at the last token), so they carry no information about the operation. "
    "If the key heads found by path patching matter, knocking them out breaks the arithmetic while "
    "knocking out as many random heads does not.")

prompt_caption()
words_used("knockout", "counterfactual", "key heads", "END", "probability", "accuracy", "bootstrap interval")
L, H = model.facts.n_layers, model.facts.n_heads
cache = result_cache()
pairs, _ = analysed_pairs(model, spec, cache)
table, _ = patching_table(model, pairs, cache, text="Path patching (to rank the heads)", failure="prepare the knockout")

head_opts = [f"{layer}.{h}" for layer in range(L) for h in range(H)]
# the knockout set is the app's (ui.state), kept across pages; the widgets are bound to it
state.put(state.KO_HEADS, [h for h in state.ko_heads() if h in head_opts])
state.put(state.KO_MLPS, [m for m in state.ko_mlps() if m < L])
c1, c2, c3, c4 = st.columns([3, 2, 1, 1], vertical_alignment="bottom")
heads = c1.multiselect("Heads to knock out (layer.head)", head_opts, **state.bind("knockout_heads", state.KO_HEADS, []),
                       help="The knockout set: kept across pages; the Path patching page adds its selected head "
                            "with 'Add head to the knockout set'.")
mlps = c2.multiselect("MLPs to knock out (layer)", list(range(L)), **state.bind("knockout_mlps", state.KO_MLPS, []))
url_state.check("ko_k", range(1, L * H + 1))
k = int(c3.number_input("k", 1, L * H, **url_state.bound("ko_k"), help=help_text(
    "key heads", "knockout", lead="How many of the path-patching heatmap's top heads the button knocks out.")))
c4.button(f"Top-{k} heads", help=f"knock out the {k} heads with the most negative patching effect (the heatmap's "
          f"ranking); the chart below shows where your prompt breaks",
          on_click=lambda: state.set_knockout(heads=[f"{a}.{b}" for a, b, _ in table.top_heads(k)]))
ko = Knockout(tuple(tuple(int(x) for x in h.split(".")) for h in heads), tuple(mlps))
means = mean_activations(model, pairs)

left, right = st.columns(2)
before = None
with left:
    st.subheader("Typed prompt")
    try:
        before = analyse_prompt(model, current_prompt())
        after = analyse_prompt(model, current_prompt(), ko=ko, means=means)
        tbl = pd.DataFrame({"before": [f"{display_token(t.token)}  {fmt_prob(t.prob)}" for t in before.top5],
                            "after knockout": [f"{display_token(t.token)}  {fmt_prob(t.prob)}" for t in after.top5]},
                           index=range(1, len(before.top5) + 1))
        st.caption(f"`{current_prompt()}` — top-5 next tokens")
        st.table(tbl)
        if before.p_answer is not None:
            change = signed_change(after.p_answer - before.p_answer)
            st.metric("P(answer)", fmt_prob(after.p_answer), change, delta_color="normal" if change else "off",
                      help=help_text("probability"))
    except PromptError as e:
        st.error(f"Cannot analyse the typed prompt: {e}")
with right:
    st.subheader("Prompt set")
    base, acc = knockout_accuracies(model, pairs, [Knockout(), ko], means)  # one END-only pass for both
    change = signed_change((acc - base) * 100, "+.1f", "points")
    st.metric("Accuracy after knockout", f"{acc:.1%}", change, delta_color="normal" if change else "off",
              help=help_text("accuracy"))
    st.caption(f"{len(pairs)} prompts the model answers right without the knockout ({base:.0%}).")

st.subheader("Where your prompt breaks")
K = min(int(state.get("ko_kmax") or min(10, L * H)), L * H)
if before is not None and before.answer_id is not None:
    # one END-only pass: your prompt with the top-k heads knocked out, k = 0..K
    top_k = [(a, b) for a, b, _ in table.top_heads(K)]
    pdf = pd.DataFrame([p.__dict__ for p in prompt_knockout_curve(model, before.ids, before.answer_id, top_k, means,
                                                                  k_max=len(top_k))])
    st.markdown(prompt_knockout_sentence(pdf, current_prompt(), display_token(before.answer_token or "")))
    st.caption(f"Your prompt alone, with the heatmap's top-k heads knocked out for k = 0 .. {len(top_k)} (up to the "
               f"curve's 'Up to k heads' below); the label on each bar is the model's top token then. The accuracy "
               f"above is over the set: a set can lose many points while one prompt still holds.")
    st.altair_chart(prompt_knockout_chart(pdf), width="stretch")
else:
    st.info("Type an arithmetic prompt with an answer (e.g. `3 + 5 =`) in the Prompt lab to see from which k its "
            "answer breaks.")

st.subheader("Key heads vs random heads (Fig. 3)")
c1, c2 = st.columns(2)
url_state.check("ko_kmax", range(1, min(30, L * H) + 1))
k_max = c1.slider("Up to k heads", 1, min(30, L * H), **url_state.bound("ko_kmax", min(10, L * H)))
draws = c2.slider("Random draws per k", 2, 30, **url_state.bound("ko_draws"))
# before the curve: shown while the curve waits for its button
code_view(knockout_code(model, spec, heads, mlps, current_prompt(), k_max, draws))
ranked = [(a, b) for a, b, _ in table.top_heads(k_max)]
try:
    pts = stored_knockout_curve(model, pairs, ranked, k_max=k_max, draws=draws, cache=cache)
except CacheError as e:
    st.error(f"Cannot read the knockout curve from the cache: {e}")
    pts = None
if pts is None:
    pts, _ = compute_or_button(lambda cb: cached_knockout_curve(model, pairs, ranked, k_max=k_max, draws=draws,
                                                                cache=cache, progress=cb),
                               lambda: curve_cost(model, pairs, ranked, k_max=k_max, draws=draws), model=model,
                               ask=True, stop=True, button="Compute the curve", key="knockout_curve_go",
                               text="Knocking out", failure="compute the knockout curve",
                               note="The curve knocks out the top-k heads and k random heads for every k: press the "
                                    "button to compute it (it is read from the cache once computed).")
cdf = pd.DataFrame([p.__dict__ for p in pts])
bands = stored_curve_intervals(model, pairs, ranked, k_max=k_max, draws=draws, cache=cache)
if bands is not None:  # 95 % bootstrap intervals over the pairs, from the stored per-pair results
    cdf = cdf.assign(**bands)
    st.caption("Bands: 95 % bootstrap intervals over the prompt pairs (1000 resamples) of the top-k accuracy and of "
               "the random draws' mean accuracy.")
st.altair_chart(knockout_curve_chart(cdf), width="stretch")
st.download_button("Curve data (CSV)", cdf.to_csv(index=False).encode(), "knockout_curve.csv", "text/csv")
