"""The Story page's screens: the paper's argument on the current model, one screen per step.

The screens are the model's answer, then one per distinct ``story`` title of
:data:`engine.findings.steps.STEPS`, in that table's order.  Each renders one chart and the circuit summary's
sentences of its steps (``engine.findings.summary.circuit_summary``), measured on this model, once their
results are in the cache; a missing result is computed here with the usual progress bar.  A step with no
chart of its own here gets its sentences and a link to the page that shows it.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.findings import steps as argument
from engine.prompts.pairs import PromptError
from ui.nav import link_to
from ui.progress import USER_ERRORS, run_with_progress
from ui.session import analysed_pairs, current_prompt
from views.charts import display_token, heatmap, heatmap_frame, ranked_bars, token_bars

ANSWERS = "The model answers"


def sentence(text: str, where=None) -> None:
    """The step's one sentence (inline `code` kept), large; ``where``: a placeholder above the chart."""
    import html
    import re
    body = re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text, quote=False))
    (where or st).markdown(f"<p class='story-sentence'>{body}</p>", unsafe_allow_html=True)


def findings(model, pairs, cache, title: str) -> str:
    """The circuit summary's sentences of the steps told on screen ``title`` (cached results only, one read),
    joined; "" when none."""
    from engine.findings.summary import circuit_summary
    try:
        found = {f.step: f for f in circuit_summary(model, pairs, cache)}
    except USER_ERRORS as e:
        st.error(f"Cannot read the cached results: {e}")
        return ""
    keys = [s.key for s in argument.STEPS if s.story == title]
    return " ".join(f.text for f in (found.get(k) for k in keys) if f is not None and f.computed)


def path_patching(model, pairs, cache):
    from engine.techniques.path_patching import cached_path_patching
    table, _ = run_with_progress("Path patching, batch", "run path patching",
                                 lambda cb: cached_path_patching(model, pairs, cache=cache, progress=cb), stop=True)
    return table


def step_answers(model, spec, cache) -> None:
    from engine.techniques.promptlab import analyse_prompt
    text = current_prompt()
    try:
        rep = analyse_prompt(model, text)
    except PromptError as e:
        st.error(f"Cannot analyse the typed prompt `{text}`: {e}. Type another one in the Prompt lab.")
        return
    pairs, n_gen = analysed_pairs(model, spec, cache)
    if rep.parsed is None or rep.p_answer is None:
        st.warning(f"`{text}` has no counterfactual ({rep.parse_error}): type an arithmetic prompt such as "
                   f"`3 + 5 =` in the Prompt lab.")
        st.altair_chart(ranked_bars(pd.DataFrame([t.__dict__ for t in rep.top5])), width="stretch")
        return
    p = rep.parsed
    verdict = "its top token" if rep.answer_rank == 1 else f"rank {rep.answer_rank}, so the model gets it wrong"
    cf = (f"; with the operator removed (`{p.cf_text}`) the answer keeps only P = {rep.p_answer_cf:.3g}"
          if rep.p_answer_cf is not None else "")
    sentence(f"On `{text}` the model gives the answer `{display_token(rep.answer_token or '')}` P = "
             f"{rep.p_answer:.3g} ({verdict}){cf}. Over the sidebar's set it answers {len(pairs)} of {n_gen} "
             f"prompts right; only those are analysed.")
    c1, c2 = st.columns(2)
    c1.caption(f"Next token after `{text}`")
    c1.altair_chart(ranked_bars(pd.DataFrame([t.__dict__ for t in rep.top5])), width="stretch")
    if rep.cf_top5:
        c2.caption(f"Next token after the counterfactual `{p.cf_text}`")
        c2.altair_chart(ranked_bars(pd.DataFrame([t.__dict__ for t in rep.cf_top5])), width="stretch")


def step_heads(model, spec, cache) -> None:
    pairs, _ = analysed_pairs(model, spec, cache)
    table = path_patching(model, pairs, cache)
    sentence(findings(model, pairs, cache, HEADS) or "Path patching found no result.")
    heads, mlps = table.heatmap("effect", "*")
    st.altair_chart(heatmap(heatmap_frame(heads, mlps), "effect"), width="stretch", key="story_heatmap")


def step_attention(model, spec, cache) -> None:
    from engine.techniques.attention import cached_role_attention, prompt_attention
    from engine.techniques.promptlab import analyse_prompt
    pairs, _ = analysed_pairs(model, spec, cache)
    table = path_patching(model, pairs, cache)
    layer, head, _ = table.top_heads(1)[0]
    if run_with_progress("Attention by token role", "show the top head's attention",
                         lambda cb: cached_role_attention(model, pairs, cache=cache, progress=cb)) is None:
        return
    try:
        rep = analyse_prompt(model, current_prompt())
        row = pd.DataFrame([t.__dict__ for t in prompt_attention(model, rep.ids, layer, head)])
    except USER_ERRORS as e:
        st.error(f"Cannot show the top head's attention: {e}")
        return
    sentence(findings(model, pairs, cache, ATTENTION))
    row["label"] = [f"{i}:{display_token(t)}" for i, t in zip(row.position, row.token)]
    st.caption(f"Head {layer}.{head}: attention of the last token of `{current_prompt()}`")
    st.altair_chart(token_bars(row, "label", "weight", "attention"), width="stretch")


def step_mlps(model, spec, cache) -> None:
    from ui.circuit_panels import logit_lens_view, mlp_projections_view
    pairs, _ = analysed_pairs(model, spec, cache)
    path_patching(model, pairs, cache)
    slot = st.empty()
    left, right = st.columns(2)
    with left:
        st.caption("MLP projections per layer (the answer's series in the strongest colour)")
        mlp_projections_view(model, pairs, cache)
    with right:
        st.caption("Logit lens of the answer")
        logit_lens_view(model, pairs, cache)
    sentence(findings(model, pairs, cache, MLPS), slot)


def step_knockout(model, spec, cache) -> None:
    from engine.techniques.knockout_curve import KNOCKOUT_DRAWS, KNOCKOUT_K, cached_knockout_curve
    from views.circuit_charts import knockout_curve_chart
    pairs, _ = analysed_pairs(model, spec, cache)
    table = path_patching(model, pairs, cache)
    f = model.facts
    k_max = min(KNOCKOUT_K, f.n_layers * f.n_heads)
    ranked = [(a, b) for a, b, _ in table.top_heads(k_max)]
    out = run_with_progress("Knocking out", "compute the knockout curve",
                            lambda cb: cached_knockout_curve(model, pairs, ranked, k_max=k_max, draws=KNOCKOUT_DRAWS,
                                                             cache=cache, progress=cb), key="story_knockout")
    if out is None:
        return
    pts, _ = out
    sentence(findings(model, pairs, cache, KNOCKOUT))
    st.altair_chart(knockout_curve_chart(pd.DataFrame([p.__dict__ for p in pts])), width="stretch")


def step_improve(model, spec, cache) -> None:
    from engine.finetune.jobs import finished_jobs_of
    from ui.improve_panels import comparison_chart, comparison_rows
    from ui.session import ModelChoice, loaded_model
    jobs = finished_jobs_of(model.facts.fingerprint)
    if not jobs:
        st.info("No fine-tuning job has finished on this model yet. On the **Improve** page, start precise SFT of "
                "the heatmap's top-k heads (a background job with a live loss curve); its base vs tuned comparison "
                "then appears here.")
        link_to("finetune")
        return
    job, record = jobs[0]
    choice = st.session_state.get("model_choice", ModelChoice())
    tuned = loaded_model(ModelChoice(job.out_dir, choice.device, choice.dtype, choice.backend, False))
    if tuned is None:
        return
    rows = comparison_rows(model, tuned, cache)
    if rows is None:
        return
    r = record["result"]
    sentence(f"{r['method']} fine-tuning (job `{job.job_id}`, {r['steps']} steps, {r['trainable_params']:,} of "
             f"{r['total_params']:,} parameters): " + "; ".join(
                 f"{x.task} {100 * x.base:.1f} % → {100 * x.tuned:.1f} % ({x.delta:+.1f} points)" for x in rows) + ".")
    st.altair_chart(comparison_chart(rows), width="stretch")


def step_told(title: str):
    """A screen with no chart of its own: its steps' sentences (when cached) and a link to each one's page."""
    def render(model, spec, cache) -> None:
        pairs, _ = analysed_pairs(model, spec, cache)
        told = [s for s in argument.STEPS if s.story == title]
        text = findings(model, pairs, cache, title)
        sentence(text or "Not computed yet for this prompt set: open the page below to compute it.")
        for s in told:
            link_to(s.technique, f"{s.figure}: {s.claim}" if s.figure else s.claim)
    return render


HEADS, KNOCKOUT, ATTENTION, MLPS, IMPROVE = (
    argument.step(k).story for k in ("key heads", "knockout", "attention", "MLPs", "sft"))
CHARTS = {ANSWERS: step_answers, HEADS: step_heads, KNOCKOUT: step_knockout, ATTENTION: step_attention,
          MLPS: step_mlps, IMPROVE: step_improve}


def screens() -> list[tuple[str, object]]:
    """(title, render) of every screen, in order: the model's answer, then the argument's steps."""
    titles = [ANSWERS, *dict.fromkeys(s.story for s in argument.STEPS if s.story)]
    return [(t, CHARTS.get(t) or step_told(t)) for t in titles]
