"""Your templates: write a phrasing of your own, check it on the model, and run every page on it."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import streamlit as st

from engine.findings.as_code import templates_code
from engine.prompts.custom import (
    EXAMPLE,
    forget_template,
    guess_operator,
    mark_operator,
    none_right_message,
    parse_param,
    parse_template,
    save_template,
    saved_templates,
    template_words,
    unknown_words,
)
from engine.prompts.pairs import PromptError
from engine.prompts.promptsets import generate_set
from engine.prompts.templates import OPS
from engine.techniques.accuracy import kept_pairs, kept_pairs_cost
from ui import state
from ui.as_code import code_view
from ui.nav import link_to, page_link
from ui.progress import run_with_progress
from ui.session import result_cache, setup_page

NO_OPERATOR = "(none: operand counterfactuals only)"

model, spec = setup_page(
    "Your templates",
    "Write a phrasing of your own: {A} and {B} where the operands go, ending where the answer starts, and the word "
    "that names the operation marked (pick it below, or write it in [ ]). The lab builds its prompt pairs with the "
    "sidebar's counterfactual, keeps the prompts the model answers right, and every page runs on it.")
cache = result_cache()


def _error(e: Exception) -> None:
    text = str(e)
    st.error(text[:1].upper() + text[1:] + ("" if text.endswith(".") else "."))


st.subheader("Write a template")
text = st.text_input("Template", key="tpl_text", value=EXAMPLE,
                     help=f"e.g. '{EXAMPLE}'. Word pools of the paper's Figure 10 may be used: {{NAME}}, {{OBJECT}}, "
                          "{EVENT}, {MONTH}. An optional {C} at the end marks where the answer goes.")
c1, c2 = st.columns(2)
op = c1.selectbox("Operation", OPS, key="tpl_op", help="What the template asks: its answer is A op B.")
words = template_words(text or "")
guess = guess_operator(text or "")
marked = "[" in (text or "")
options = [NO_OPERATOR] + words
word = c2.selectbox("Operator word", options, index=options.index(guess) if guess in options else 0,
                    key=f"tpl_operator_{text}", disabled=marked,
                    help="The word or sign the paper's counterfactual replaces by a neutral one (none, nothing ... "
                         "or @, # ...). Written in [ ] in the template, it is taken from there.")
written = wspec = None
try:
    marked_text = text if marked or word == NO_OPERATOR else mark_operator(text, word)
    written = parse_template(marked_text, op)
    wspec = replace(spec, ops=(op,), templates=(written.as_param(),))
except PromptError as e:
    _error(e)

if written is not None and wspec is not None:
    st.markdown(f"Template: **`{written.text}`** ({op}), counterfactual: {spec.counterfactual.replace('-', ' ')} "
                "(sidebar)")
    unknown = unknown_words(model.tokenizer, written)
    if unknown:
        st.warning(f"This model's tokenizer does not know {', '.join(repr(w) for w in unknown)}: it reads each as "
                   "its unknown token. Use words it knows, or expect few right answers.")
    try:
        gen = generate_set(model.tokenizer, wspec)
    except PromptError as e:
        _error(e)
        gen = None
    if gen is not None:
        st.caption(f"{len(gen.pairs)} prompt pairs of {gen.candidates} candidates (sidebar: {spec.n} per "
                   f"operation, seed {spec.seed}); {len(gen.dropped)} dropped (no counterfactual of the same length "
                   "in tokens). The first five:")
        st.dataframe(pd.DataFrame([{"X_r": p.ref_text, "X_c": p.cf_text, "answer": p.answer,
                                    "tokens": len(p.ref_ids)} for p in gen.pairs[:5]]), width="stretch",
                     hide_index=True)
        code_view(templates_code(model, wspec))
        in_use = (st.session_state.get("prompt_set") or {}).get("template") == written.as_param()
        if st.button(f"Check the answers and use it on every page ({kept_pairs_cost(model, wspec).label()})",
                     type="primary", disabled=in_use, key="tpl_use"):
            out = run_with_progress("Checking which prompts the model answers right", "check the template",
                                    lambda cb: kept_pairs(model, wspec, cache=cache, progress=cb))
            if out is not None:
                kept, n_generated = out
                if not kept:
                    _error(PromptError(none_right_message(n_generated, custom=True)))
                else:
                    if cache is not None:
                        save_template(cache, written)
                    state.use_template(written.as_param())
                    st.session_state["tpl_flash"] = (f"The model answers {len(kept)} of {n_generated} prompts right: "
                                                     "every page now runs on them.")
                    st.rerun()
        if in_use:
            st.success(st.session_state.pop("tpl_flash", None) or "In use on every page (sidebar: Templates).")
            c1, c2, c3 = st.columns(3)
            link_to("path-patching", where=c1)
            link_to("knockout", where=c2)
            page_link("pages/2_Paper.py", "Paper", ":material/fact_check:", where=c3)

st.subheader("Saved templates")
saved = saved_templates(cache) if cache is not None else []
if not saved:
    st.caption("None yet: a template is saved in the result cache when it is used.")
for w in saved:
    c1, c2, c3 = st.columns([6, 1, 1])
    c1.markdown(f"`{w.text}` ({w.op})")
    c2.button("Use", key=f"tpl_use_{w.as_param()}", on_click=state.use_template, args=(w.as_param(),))
    if c3.button("Forget", key=f"tpl_forget_{w.as_param()}"):
        forget_template(cache, parse_param(w.as_param()))
        st.rerun()
