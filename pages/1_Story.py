"""Story: the paper's argument on the current model, one step per screen, with back / next."""

from __future__ import annotations

import streamlit as st

from ui import state, url_state
from ui.session import prompt_caption, result_cache, setup_page, words_used
from ui.story import font_scale, screen_words, screens

model, spec = setup_page(
    "Story",
    "The paper's argument on the model and prompt set of the sidebar, in order: one chart and one measured "
    "sentence per step, each saying whether it is about your prompt or the mean over the set. Results come from "
    "the cache; what is missing is computed here, or waits for a button with its cost when it takes a while.")

st.toggle("Large fonts (presenting)", **url_state.bound("large"),
          help="Larger text, in the charts too, for a projector; the link keeps it (and the step).")
size = font_scale()
st.markdown(f"<style>.story-sentence {{font-size: {1.25 * size}rem; line-height: 1.5;}}"
            + ("section.main p, section.main li, [data-testid='stMarkdownContainer'] p {font-size: 1.35rem;} "
               "h1 {font-size: 3rem !important;} h2 {font-size: 2.2rem !important;}" if size > 1 else "")
            + "</style>", unsafe_allow_html=True)
prompt_caption()

SCREENS = screens()
n = len(SCREENS)
if not url_state.from_link("step"):  # the page's own step (back / next) stays within the story
    state.put("story_step", min(max(int(state.get("story_step", 1)), 1), n))
url_state.check("step", range(1, n + 1))  # a link's step the story lacks: a note, and step 1
step = int(state.get("story_step", 1))
title, render = SCREENS[step - 1]
st.progress(step / n, text=f"Step {step} of {n}")
st.header(f"{step} · {title}")
back, _, nxt = st.columns([1, 4, 1])
back.button("← back", key="story_back", disabled=step == 1, on_click=state.put, args=("story_step", step - 1),
            width="stretch")
nxt.button("next →", key="story_next", disabled=step == n, type="primary", on_click=state.put,
           args=("story_step", step + 1), width="stretch")
if screen_words(title):
    words_used(*screen_words(title))
render(model, spec, result_cache())
