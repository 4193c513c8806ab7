"""Home page (the router's default page) of the arithmetic-circuits lab: pick a model, see its facts and its
arithmetic accuracy."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.findings.as_code import home_code
from engine.prompts.promptsets import PromptSetSpec, answer_token_stats, generate
from engine.prompts.templates import OPS, PAPER_OPS
from engine.techniques.accuracy import accuracy_cost, accuracy_report
from ui.as_code import code_view
from ui.circuit_panels import circuit_summary_view
from ui.nav import page_link
from ui.progress import USER_ERRORS, compute_or_button, run_with_progress
from ui.session import result_cache, setup_page, words_used
from views.charts import template_bars

model, summary_spec = setup_page(
    "Arithmetic-circuits lab",
    "Look inside a language model while it does arithmetic, after Zhang et al., ICML 2024, "
    "*Interpreting and Improving Large Language Models in Arithmetic Calculation*. "
    "The model is given a sum such as `3 + 5 =` and the same words with the operator blanked out (`3 @ 5 =`, "
    "the counterfactual). Giving one small part of the model at a time (an attention head) what it saw on the "
    "blanked-out prompt shows which few parts carry the calculation: without them, the model no longer answers 8. "
    "This page shows the chosen model and how well it does the arithmetic the other pages study (only the "
    "prompts it answers right are studied).")
c1, c2 = st.columns([3, 1])
c1.markdown("**New here?** The Story walks through the paper's argument on this model, one step per screen, each "
            "word explained beside it; the Prompt lab shows what the model answers to a prompt you type.")
with c2:
    page_link("pages/1_Story.py", "Start the Story", ":material/auto_stories:")
    page_link("pages/3_Prompt_lab.py", "Type a prompt", ":material/edit:")
words_used("prompt", "token", "counterfactual", "attention head", "MLP", "path patching", "knockout", "accuracy")

f = model.facts
st.subheader(f"Model: `{f.spec}`")
cols = st.columns(3) + st.columns(3)  # two rows of three: no value is cut off
cols[0].metric("Architecture", f.architecture)
cols[1].metric("Layers", f.n_layers)
cols[2].metric("Heads (KV)", f"{f.n_heads} ({f.n_kv_heads})")
cols[3].metric("d_model / d_head", f"{f.d_model} / {f.d_head}")
cols[4].metric("Parameters", f"{f.n_params / 1e6:.2f} M")
cols[5].metric("Device", f"{f.device} · {f.dtype}")
with st.expander("All model facts"):
    st.json(f.to_dict())

st.subheader("Circuit summary")
st.caption("The paper's argument on this model, for the prompt set chosen in the sidebar, from results already "
           "computed by the analysis pages (nothing is computed here). Each sentence links to its page. "
           "The shareable HTML report is built from the sidebar (**Build the report**) on every page.")
circuit_summary_view(model, summary_spec, result_cache())
words_used("key heads", "effect", "answer logit", "shuffled head labels", "bootstrap interval", "knockout",
           "attention", "operand", "operator", "MLP", "END", "logit lens", "faithfulness",
           label="Words used in the summary")

st.subheader("Arithmetic accuracy")
st.caption(
    "**First token**: the most likely next token is the answer's first token (the quantity the "
    "analysis uses). **Full answer**: greedy decoding writes the whole number and stops. Operands "
    "1..9, subtraction without negatives, exact divisions only; *word* templates are the paper's "
    "Figure 10 word problems; exponentiation is a skill the bundled model was never taught.")
with st.form("accuracy_form"):
    c1, c2, c3, c4 = st.columns([3, 2, 1, 1])
    ops = c1.multiselect("Operations", OPS, default=list(PAPER_OPS))
    fam = c2.selectbox("Templates", ("paper", "all", "word"),
                       help="paper (default, as in every CLI subcommand): Figure 8 (32 templates); "
                            "word: Figure 10 word problems (addition); "
                            "all: those plus the project's own (extended) and exponentiation")
    n = c3.number_input("Prompts per op", min_value=1, max_value=2000, value=100, step=50)
    seed = c4.number_input("Seed", min_value=0, max_value=10**9, value=0)
    asked = st.form_submit_button("Show accuracy")

if not ops:
    st.error("Pick at least one operation.")
    st.stop()
try:
    from engine.prompts.promptsets import parse_families
    spec = PromptSetSpec(ops=tuple(ops), n=int(n), seed=int(seed), families=parse_families(fam))
except USER_ERRORS as e:
    st.error(f"Cannot compute accuracy: {e}")
    st.stop()
cache = result_cache()


def score(cb):
    return accuracy_report(model, spec, cache=cache, progress=cb)


if asked:  # the form's own button: the user asked for these prompts
    rows, computed = run_with_progress("Scoring prompts", "compute accuracy", score, stop=True, on_demand=True)
else:
    rows, computed = compute_or_button(score, lambda: accuracy_cost(model, spec), model=model, stop=True,
                                       button="Show the accuracy", key="accuracy_go", text="Scoring prompts",
                                       failure="compute accuracy",
                                       note="Scoring these prompts takes a while on this model: press the button, "
                                            "or ask for fewer prompts above.")

df = pd.DataFrame([r.__dict__ for r in rows])
st.caption("Computed now and stored in the result cache." if computed else "Read from the result cache.")
stats = answer_token_stats(model.tokenizer, generate(model.tokenizer, spec)[0])  # tokenization only
st.markdown(f"First answer tokens of these {stats.n} prompts: {stats.summary()}. The prompts are balanced: picked "
            f"in turn for each first answer token, so that no token (the '1' of every sum from 10 to 18) takes more "
            f"than its share.")
if stats.warning:
    st.warning(stats.warning)
per_op = df[df.template == "*"].drop(columns="template").set_index("op")
st.dataframe(per_op.style.format({"first_token": "{:.1%}", "full_answer": "{:.1%}",
                                  "mean_p_answer": "{:.3f}"}), width="stretch",
             column_config={"op": "operation", "n": "prompts", "first_token": "first-token accuracy",
                            "full_answer": "full-answer accuracy", "mean_p_answer": "mean P(answer)"})
per_tpl = df[df.template != "*"]
chart = template_bars(per_tpl)
st.altair_chart(chart, width="stretch")
st.download_button("Download accuracy table (CSV)", df.to_csv(index=False).encode(),
                   file_name=f"accuracy_{f.fingerprint[:8]}.csv", mime="text/csv")
code_view(home_code(model, spec))
