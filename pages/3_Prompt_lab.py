"""Prompt lab: type a prompt; see its tokens, the model's top-5 next tokens, the parsed operation and its
counterfactual."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.findings.as_code import prompt_lab_code
from engine.prompts.pairs import PromptError
from engine.techniques.promptlab import analyse_prompt
from ui.as_code import code_view
from ui.session import prompt_input, result_cache, setup_page, use_typed_template
from views.charts import display_token, fmt_prob, ranked_bars

model, _ = setup_page(
    "Prompt lab",
    "Type any arithmetic prompt. The lab finds its operands and operator, builds the counterfactual "
    "prompt (the operator replaced by a neutral word or symbol, e.g. `3 @ 5 =`), and shows what the model "
    "predicts next. The prompt typed here is the one the other pages analyse.")

text = prompt_input()
try:
    rep = analyse_prompt(model, text)
except PromptError as e:
    st.error(f"{e}")
    st.stop()

for note in rep.notes:
    st.info(note)

st.subheader("Tokens")
st.caption("What the model reads (after the answer-token rule: whitespace-only tokens before the answer "
           "belong to the prompt). The last token is END, where the answer is produced.")
# all text: the transposed frame mixes tokens and ids in each column, which Arrow cannot serialise
st.dataframe(pd.DataFrame({"position": range(len(rep.tokens)), "token": [display_token(t) for t in rep.tokens],
                           "raw": rep.tokens, "id": rep.ids}).set_index(
    "position").T.astype(str), width="stretch")

c1, c2 = st.columns(2)
with c1:
    st.subheader("Next token")
    top = pd.DataFrame([t.__dict__ for t in rep.top5])
    st.caption("Most likely first; ␣ = a leading space, ⏎ = a newline (hover a bar for the raw token and its id).")
    st.altair_chart(ranked_bars(top, answer_id=rep.answer_id if rep.parsed is not None else None), width="stretch")
    st.download_button("Top-5 (CSV)", top.to_csv(index=False).encode(), "top5.csv", "text/csv")
with c2:
    st.subheader("Operation")
    if rep.parsed is None:
        st.warning(f"No counterfactual for this prompt: {rep.parse_error}")
    else:
        p = rep.parsed
        st.markdown(f"**{p.a} {'+-*/^'['add sub mul div pow'.split().index(p.op)]} {p.b} = {p.answer}** "
                    f"(operator `{p.operator}`)")
        st.metric("P(answer token)", fmt_prob(rep.p_answer), help=f"answer token `{rep.answer_token}`")
        st.markdown(f"Rank of the answer token: **{rep.answer_rank}**" + (" — the model gets it right"
                    if rep.answer_rank == 1 else " — the model gets it wrong"))
        st.markdown(f"Counterfactual: `{p.cf_text}`")
        if st.button("Analyse its template on every page", key="lab_template",
                     help="Its operands become {A} and {B} and its operator is marked: every operand pair of the "
                          "prompt set's range (1 to 9) fills it, and every page runs on the prompts the model "
                          "answers right."):
            use_typed_template(text, result_cache())
            st.rerun()
        if rep.p_answer_cf is not None:
            st.metric("P(answer) on the counterfactual", fmt_prob(rep.p_answer_cf))
code_view(prompt_lab_code(model, text))
