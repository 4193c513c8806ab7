"""Position patching: where, layer by layer and position by position, the operation travels to the last token."""

from __future__ import annotations

import streamlit as st

from engine.findings.as_code import position_patching_code
from engine.prompts.pairs import counterfactual_words
from ui.as_code import code_view
from ui.circuit_panels import position_view
from ui.session import analysed_pairs, result_cache, setup_page, words_used


def intro(spec) -> str:
    """The page's text, in the words of the sidebar's counterfactual kind."""
    name, carries = counterfactual_words(spec.counterfactual if spec else None)
    return ("Layer x position activation patching (Stolfo et al. 2023 style): each cell takes the residual stream "
            f"entering one layer at one position from the counterfactual prompt ({name}) and shows how much the "
            f"answer's logit at the last token changes. Red where the information about {carries} sits: at the "
            "tokens that differ in early layers, at the last token once heads have moved it there. The logit lens "
            "of the answer is on the MLP projections page.")


model, spec = setup_page("Position patching", intro)

words_used("residual stream", "layer", "counterfactual", "answer logit", "logit difference", "END", "logit lens")
cache = result_cache()
pairs, _ = analysed_pairs(model, spec, cache)
st.subheader("Layer x position patching")
group, metric = position_view(model, pairs, cache)
code_view(position_patching_code(model, spec, group, metric))
