"""Paper: the paper's findings, one row each, its number beside the lab's on the current model and set."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.findings.as_code import paper_code
from engine.findings.checks import CAN_TEACH
from engine.results import NotCached, cache_only
from engine.techniques.accuracy import kept_pairs
from ui import state
from ui.as_code import code_view
from ui.nav import page_link, page_of
from ui.notes_panel import noted
from ui.progress import USER_ERRORS, compute_or_button
from ui.session import ModelChoice, analysed_pairs, loaded_model, result_cache, set_size_text, setup_page
from views.charts import heatmap, heatmap_frame, heatmap_limit

model, spec = setup_page(
    "Paper",
    "Zhang et al., ICML 2024, finding by finding: the paper's number, the lab's number on the sidebar's model "
    "and prompt set, and whether the finding holds here by the stated criterion. What is not cached yet is "
    "computed here (when it takes more than a few seconds, a button says how long first); a finding that cannot be "
    "computed on this model says why.")

second_spec = st.text_input("Second model for Fig. 12 (optional)",
                            placeholder="e.g. the path of a tuned model, or a .gguf file",
                            help="Compared on the same prompt set and one colour scale.",
                            **state.bind("paper_second_input", "paper_second", "")).strip()
second = None
if second_spec:
    choice = st.session_state.get("model_choice", ModelChoice())
    second = loaded_model(ModelChoice(second_spec, choice.device, choice.dtype, choice.backend, False))
    if second is None:
        st.stop()

cache = result_cache()
pairs, _ = analysed_pairs(model, spec, cache)


def compute(progress):
    from engine.findings.paper import reproduce
    return reproduce(model, spec, cache, second=second, progress=progress)


def cost():
    from engine.cost import estimate
    from engine.findings.paper import reproduce_work
    return estimate(model, pairs, reproduce_work(model, spec, cache, pairs))


rows = compute_or_button(compute, cost, model=model, stop=True, button="Check the paper's findings", key="paper_go",
                         text="The paper's findings", failure="check the paper's findings",
                         note="Each finding needs its own computation on this model and set (path patching, "
                              "knockouts, attention, the MLPs, the circuits' faithfulness, the other formats, "
                              "exponentiation, GSM8K): what is cached is reused, the rest waits for the button.")
# what to do where a finding has no number yet, in this dashboard's words (Table 3's note already says that
# fine-tuning can teach exponentiation: it is told where, inside the note's own parenthesis)
GO_TO = {"models": "type a second model above", "sft": "start precise and full SFT on the Improve page"}
df = pd.DataFrame([{"finding": r.figure, "verdict": r.verdict, "this model": r.lab or "–", "rests on": r.pairs or "–",
                    "paper": r.paper,
                    "claim": r.claim,
                    "how judged": r.note.replace(CAN_TEACH, f"{CAN_TEACH} on the Improve page")
                    + (f" ({GO_TO[r.key]})" if not r.lab and r.key in GO_TO else "")}
                   for r in rows])
counts = {v: sum(r.verdict == v for r in rows) for v in ("holds", "does not hold", "inconclusive", "not computed")}
n_computed = len(rows) - counts["not computed"]
st.markdown(f"**{counts['holds']} of {n_computed}** findings computed on `{model.facts.spec}` hold, "
            f"{counts['does not hold']} do not, {counts['inconclusive']} "
            f"{'is' if counts['inconclusive'] == 1 else 'are'} inconclusive "
            f"({counts['not computed']} not computed: see *how judged*).")
try:  # the set's size (the filter's pass is cached by now)
    with cache_only():
        kept, n_gen = kept_pairs(model, spec, cache=cache)
    st.caption(f"The set: {set_size_text(spec, len(kept), n_gen)}.")
except NotCached:
    pass
st.caption("Each number of *this model* is followed by its 95 % interval, a bootstrap over the prompt pairs "
           "(1000 resamples, seeded; no extra forward pass). A finding *holds* when the whole interval is on the "
           "finding's side of its criterion, *does not hold* when it is wholly on the other side, and is "
           "*inconclusive* when the interval straddles it: more prompts per operation narrow it.")
st.table(df.set_index("finding"))  # a static table: every cell's text wraps in full, every column on the page
st.download_button("Findings (CSV)", df.to_csv(index=False).encode(), "paper_findings.csv", "text/csv",
                   on_click="ignore")
code_view(paper_code(model, spec, second_spec or None))

st.subheader("Where each finding is shown")
for p in dict.fromkeys(page_of(r.technique) for r in rows):
    page_link(p.script, f"{p.title}: " + ", ".join(r.figure for r in rows if page_of(r.technique) == p), p.icon)

if second is not None:
    from engine.techniques.path_patching import cached_path_patching
    st.subheader("Fig. 12: two models on one colour scale")
    frames = []
    try:
        for m in (model, second):
            pairs, _ = kept_pairs(m, spec, cache=cache)
            heads, mlps = cached_path_patching(m, pairs, cache=cache)[0].heatmap("effect", "*")
            frames.append((m.facts.spec, noted(heatmap_frame(heads, mlps), m, cache)))  # each model's pins
    except USER_ERRORS as e:
        st.error(f"Cannot draw the two heatmaps: {e}")
        st.stop()
    lim = max(heatmap_limit(f) for _, f in frames)
    for col, (name, frame) in zip(st.columns(2), frames):
        col.caption(f"`{name}`: relative effect of each head and MLP")
        col.altair_chart(heatmap(frame, "effect", lim), width="stretch", key=f"paper_heatmap_{name}")
