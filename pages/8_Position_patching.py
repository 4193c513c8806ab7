"""Position patching: where, layer by layer and position by position, the operation travels to the last token."""

from __future__ import annotations

import streamlit as st

from ui.circuit_panels import position_view
from ui.session import analysed_pairs, result_cache, setup_page

model, spec = setup_page(
    "Position patching",
    "Layer x position activation patching (Stolfo et al. 2023 style): each cell takes the residual stream "
    "entering one layer at one position from the counterfactual prompt (operator removed) and shows how much "
    "the answer's logit at the last token changes. Red where the operation's information sits: at the operator "
    "in early layers, at the last token once heads have moved it there. The logit lens of the answer is on the "
    "MLP projections page.")

cache = result_cache()
pairs, _ = analysed_pairs(model, spec, cache)
st.subheader("Layer x position patching")
position_view(model, pairs, cache)
