"""The Story page's steps: the paper's argument on the current model, one screen each.

Each step renders one chart (built by the shared ui chart functions) and one sentence whose number is
measured on this model: the circuit summary's sentence (``engine.techniques.summary.circuit_summary``) once the
step's result is in the cache.  A missing result is computed here with the usual progress bar.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.prompts.pairs import PromptError
from ui.nav import page_def, page_link
from ui.progress import USER_ERRORS, run_with_progress
from ui.session import analysed_pairs, current_prompt
from views.charts import display_token, heatmap, heatmap_frame, ranked_bars, token_bars

STEPS = ("The model answers", "A few key heads", "What the top head reads", "The MLPs write the answer",
         "Knock out the key heads", "Improve with precise SFT")


def sentence(text: str, where=None) -> None:
    """The step's one sentence (inline `code` kept), large; ``where``: a placeholder above the chart."""
    import html
    import re
    body = re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text, quote=False))
    (where or st).markdown(f"<p class='story-sentence'>{body}</p>", unsafe_allow_html=True)


def findings(model, pairs, cache, *steps: str) -> str:
    """The circuit summary's sentences for ``steps`` (cached results only, one read), joined; "" when none."""
    from engine.techniques.summary import circuit_summary
    try:
        found = {f.step: f for f in circuit_summary(model, pairs, cache)}
    except USER_ERRORS as e:
        st.error(f"Cannot read the cached results: {e}")
        return ""
    return " ".join(f.text for f in (found.get(s) for s in steps) if f is not None and f.computed)


def path_patching(model, pairs, cache):
    from engine.techniques.patching import cached_path_patching
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
    sentence(findings(model, pairs, cache, "key heads") or "Path patching found no result.")
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
    sentence(findings(model, pairs, cache, "attention"))
    row["label"] = [f"{i}:{display_token(t)}" for i, t in zip(row.position, row.token)]
    st.caption(f"Head {layer}.{head}: attention of the last token of `{current_prompt()}`")
    st.altair_chart(token_bars(row, "label", "weight", "attention"), width="stretch")


def step_mlps(model, spec, cache) -> None:
    from ui.circuit_views import logit_lens_view, mlp_projections_view
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
    sentence(findings(model, pairs, cache, "MLPs", "logit lens"), slot)


def step_knockout(model, spec, cache) -> None:
    from engine.techniques.ablation import KNOCKOUT_DRAWS, KNOCKOUT_K, cached_knockout_curve
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
    sentence(findings(model, pairs, cache, "knockout"))
    st.altair_chart(knockout_curve_chart(pd.DataFrame([p.__dict__ for p in pts])), width="stretch")


def step_improve(model, spec, cache) -> None:
    from engine.finetune.jobs import finished_jobs_of
    from ui.improve_views import comparison_chart, comparison_rows
    from ui.session import ModelChoice, loaded_model
    jobs = finished_jobs_of(model.facts.fingerprint)
    if not jobs:
        st.info("No fine-tuning job has finished on this model yet. On the **Improve** page, start precise SFT of "
                "the heatmap's top-k heads (a background job with a live loss curve); its base vs tuned comparison "
                "then appears here.")
        page_link(page_def("Improve").script, page_def("Improve").title, page_def("Improve").icon)
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


RENDER = (step_answers, step_heads, step_attention, step_mlps, step_knockout, step_improve)
