"""Story: the paper's argument on the current model, one step per screen, with back / next."""

from __future__ import annotations

import streamlit as st

from ui import state
from ui.session import prompt_caption, result_cache, setup_page
from ui.story import screens

model, spec = setup_page(
    "Story",
    "The paper's argument on the model and prompt set of the sidebar, in order: one chart and one measured "
    "sentence per step. Results come from the cache; what is missing is computed here.")

large = st.toggle("Large fonts (presenting)", **state.bind("story_large_input", "story_large", False))
size = 1.35 if large else 1.0
st.markdown(f"<style>.story-sentence {{font-size: {1.25 * size}rem; line-height: 1.5;}}"
            + ("section.main p, section.main li, [data-testid='stMarkdownContainer'] p {font-size: 1.35rem;} "
               "h1 {font-size: 3rem !important;} h2 {font-size: 2.2rem !important;}" if large else "")
            + "</style>", unsafe_allow_html=True)
prompt_caption()

SCREENS = screens()
step = min(max(int(state.get("story_step", 0)), 0), len(SCREENS) - 1)
st.progress((step + 1) / len(SCREENS), text=f"Step {step + 1} of {len(SCREENS)}")
st.header(f"{step + 1} · {SCREENS[step][0]}")
back, _, nxt = st.columns([1, 4, 1])
back.button("← back", key="story_back", disabled=step == 0, on_click=state.put, args=("story_step", step - 1),
            width="stretch")
nxt.button("next →", key="story_next", disabled=step == len(SCREENS) - 1, type="primary",
           on_click=state.put, args=("story_step", step + 1), width="stretch")
SCREENS[step][1](model, spec, result_cache())
