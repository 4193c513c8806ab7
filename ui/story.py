"""The Story page's screens: the paper's argument on the current model, one screen per step.

The screens are the model's answer, then one per distinct ``story`` title of
:data:`engine.findings.steps.STEPS`, in that table's order.  Each renders its chart and a sentence computed from
that chart's own data (the circuit summary's sentences, ``engine.findings.summary.circuit_summary``, read the same
cached results), saying what it is about: the typed prompt, or the mean over the prompt set.  A missing result goes
through the pages' one gate (``ui.progress.compute_or_button``): computed at once when the cost model estimates a
few seconds, else a button carrying its estimated cost.  A step with no chart of its own here gets its sentences and
a link to the page that shows it; a step with a chart, that chart as code (the snippet of the page that shows it).
Each screen lists the words it uses in plain words (:data:`WORDS`, ``engine.findings.glossary``); **Large fonts**
scales the charts' text with the page's (:func:`chart`).
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import streamlit as st

from engine.findings import as_code, glossary
from engine.findings import steps as argument
from engine.prompts.pairs import PromptError
from ui import state
from ui.as_code import code_view
from ui.nav import link_to
from ui.notes_panel import noted
from ui.progress import USER_ERRORS, compute_or_button
from ui.session import analysed_pairs, current_prompt
from views.charts import display_token, heatmap, heatmap_frame, ranked_bars, scaled, token_bars

ANSWERS = "The model answers"
LARGE = 1.35  # Large fonts: the page's text and every chart's text, this many times their size


def font_scale() -> float:
    """How much larger the Story's text is drawn: :data:`LARGE` with Large fonts on, else 1."""
    return LARGE if state.get("story_large", False) else 1.0


def chart(c, where=None, **kwargs) -> None:
    """Show the chart ``c`` at the page's width, its text scaled with Large fonts (:func:`views.charts.scaled`)."""
    (where or st).altair_chart(scaled(c, font_scale()), width="stretch", **kwargs)


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
    """The heatmap every step after the first builds on (``ui.circuit_panels.patching_table``: cached, computed
    now, or behind a button with its cost)."""
    from ui.circuit_panels import patching_table
    return patching_table(model, pairs, cache, key="story_patching")[0]


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
        chart(ranked_bars(pd.DataFrame([t.__dict__ for t in rep.top5])))
        code_view(as_code.prompt_lab_code(model, text))
        return
    p = rep.parsed
    verdict = "its top token" if rep.answer_rank == 1 else f"rank {rep.answer_rank}, so the model gets it wrong"
    cf = (f"; with the operator removed (`{p.cf_text}`) the answer keeps only P = {rep.p_answer_cf:.3g}"
          if rep.p_answer_cf is not None else "")
    sentence(f"On your prompt `{text}` the model gives the answer `{display_token(rep.answer_token or '')}` P = "
             f"{rep.p_answer:.3g} ({verdict}){cf}. Over the sidebar's set it answers {len(pairs)} of {n_gen} "
             f"prompts right; only those are analysed.")
    if spec.digit != "first":
        from engine.prompts.pairs import digit_words
        st.caption(f"Your prompt is read at its answer's first token; the set's steps that follow read the answer's "
                   f"{digit_words(spec.digit)} digit, the digits before it given to the model.")
    first_digit_note(model, spec, pairs)
    c1, c2 = st.columns(2)
    c1.caption(f"Next token after `{text}`")
    chart(ranked_bars(pd.DataFrame([t.__dict__ for t in rep.top5]), answer_id=rep.answer_id), c1)
    if rep.cf_top5:
        c2.caption(f"Next token after the counterfactual `{p.cf_text}`")
        chart(ranked_bars(pd.DataFrame([t.__dict__ for t in rep.cf_top5]), answer_id=rep.answer_id), c2)
    code_view(as_code.prompt_lab_code(model, text))


def tens_dominated(pairs) -> tuple[str, float, int, int, int] | None:
    """(operation, share, token id, how many answers start with it, the operation's pairs) of the operation whose
    commonest first answer token starts more than the sets' dominant share (40 %) of its answers, most of them
    answers of two digits or more -- the tens digit (the '1' of every sum from 10 to 18), where the units digit is
    another token; None when no operation is so."""
    from collections import Counter, defaultdict

    from engine.prompts.promptsets import DOMINANT_SHARE
    by_op = defaultdict(list)
    for p in pairs:
        by_op[p.op].append(p)
    found = []
    for op, ps in by_op.items():
        tid, k = Counter(p.answer_id for p in ps).most_common(1)[0]
        lead = [p for p in ps if p.answer_id == tid]
        if k / len(ps) > DOMINANT_SHARE and sum(abs(p.answer) >= 10 for p in lead) > len(lead) / 2:
            found.append((op, k / len(ps), tid, k, len(ps)))
    return max(found, key=lambda f: f[1]) if found else None


def first_digit_note(model, spec, pairs) -> None:
    """At the first answer digit, where one token starts most of an operation's answers and those answers have two
    digits (:func:`tens_dominated`), a sentence saying so and a button that tells the story at the units digit
    instead (the sidebar's Answer digit set to 'last')."""
    from engine.prompts.pairs import FIRST_DIGIT
    found = tens_dominated(pairs) if spec.digit == FIRST_DIGIT else None
    if found is None:
        return
    op, share, tid, k, n = found
    tok = display_token(str(model.tokenizer.convert_ids_to_tokens([tid])[0]))
    sentence(f"{share:.0%} of the set's {op} prompts the model answers right ({k} of {n}) start their answer with "
             f"`{tok}`, the tens digit: at the first "
             f"digit this story mostly tells how the model predicts `{tok}`. The arithmetic of a two-digit result -- "
             f"its units digit and whether a carry reached the tens -- happens one token later.")
    st.button("Tell the story at the units digit", key="story_units", on_click=state.use_digit, args=("last",),
              help="Sets the sidebar's Answer digit to 'last': the answer's earlier digits are given to the model "
                   "in both prompts, and every step reads the position that predicts the units digit.")


def step_heads(model, spec, cache) -> None:
    pairs, _ = analysed_pairs(model, spec, cache)
    table = path_patching(model, pairs, cache)
    sentence(findings(model, pairs, cache, HEADS) or "Path patching found no result.")
    heads, mlps = table.heatmap("effect", "*")
    st.caption(f"The mean over the {len(pairs)} prompt pairs of the set: one cell per head, the last column each "
               f"layer's MLP; red = the answer logit drops when that component sees the counterfactual.")
    chart(heatmap(noted(heatmap_frame(heads, mlps), model, cache), "effect"), key="story_heatmap")  # pins outlined
    code_view(as_code.path_patching_code(model, spec, "effect", 5))


def role_frame(roles, layer: int, head: int) -> pd.DataFrame:
    """Head (layer, head)'s mean END-row attention by token role (the set's chart): columns role, value."""
    from engine.techniques.attention import ROLES
    df = pd.DataFrame([{"role": r.role, "value": r.value} for r in roles if r.layer == layer and r.head == head])
    return df.assign(order=[ROLES.index(r) for r in df["role"]]).sort_values("order").drop(columns="order")


def set_attention_sentence(df: pd.DataFrame, layer: int, head: int, n: int) -> str:
    """The sentence of the set's chart (:func:`role_frame`), from its rows."""
    from engine.techniques.attention import role_shares
    mine = dict(zip(df["role"], df["value"]))
    on_problem, best = role_shares(mine)
    return (f"Over the {n} prompts of the set, head {layer}.{head} puts on average {on_problem:.0%} of its "
            f"last-token attention on the operands and the operator; most on {best}: {mine[best]:.0%}.")


def prompt_frame(model, text: str, layer: int, head: int) -> pd.DataFrame:
    """Head (layer, head)'s END-row attention on the typed prompt, token by token (the prompt's chart): columns
    position, token, weight, role and label."""
    from engine.techniques.promptlab import typed_attention
    row = pd.DataFrame([t.__dict__ for t in typed_attention(model, text, layer, head)])
    row["label"] = [f"{i}: {display_token(t)}" for i, t in zip(row.position, row.token)]
    return row


def prompt_attention_sentence(df: pd.DataFrame, layer: int, head: int, text: str) -> str:
    """The sentence of the typed prompt's chart (:func:`prompt_frame`), from its rows."""
    top = df.loc[df["weight"].idxmax()]
    role = f" ({top['role']})" if top["role"] != "other" else ""
    return (f"On your prompt `{text}`, head {layer}.{head} looks most at token {int(top['position'])} "
            f"`{display_token(str(top['token']))}`{role}: {top['weight']:.0%} of its last-token attention.")


def step_attention(model, spec, cache) -> None:
    from ui.circuit_panels import role_attention_of
    pairs, _ = analysed_pairs(model, spec, cache)
    table = path_patching(model, pairs, cache)
    layer, head, _ = table.top_heads(1)[0]
    out = role_attention_of(model, pairs, cache)
    text = current_prompt()
    left, right = st.columns(2)
    with left:
        rdf = role_frame(out[0], layer, head)
        sentence(set_attention_sentence(rdf, layer, head, len(pairs)))
        st.caption(f"Head {layer}.{head} (the top head of the heatmap): its last token's attention by token role, "
                   f"the mean over the {len(pairs)} prompts of the set")
        chart(token_bars(rdf, "role", "value", "attention (mean over the set)"))
    with right:
        try:
            row = prompt_frame(model, text, layer, head)
        except USER_ERRORS as e:
            st.error(f"Cannot show the top head's attention on your prompt `{text}`: {e}. Change it in the Prompt "
                     f"lab.")
            return
        sentence(prompt_attention_sentence(row, layer, head, text))
        st.caption(f"Head {layer}.{head}: the attention of the last token of your prompt `{text}`, token by token")
        chart(token_bars(row, "label", "weight", "attention (your prompt)"))
    code_view(as_code.attention_code(model, spec, layer, head, text))


def step_mlps(model, spec, cache) -> None:
    from ui.circuit_panels import logit_lens_view, mlp_projections_view
    pairs, _ = analysed_pairs(model, spec, cache)
    path_patching(model, pairs, cache)
    slot = st.empty()
    left, right = st.columns(2)
    with left:
        st.caption(f"MLP projections per layer, the mean over the {len(pairs)} prompt pairs of the set (the answer's "
                   f"series in the strongest colour)")
        mlp_projections_view(model, pairs, cache, scale=font_scale())
    with right:
        st.caption(f"Logit lens of the answer, over the {len(pairs)} prompt pairs of the set")
        logit_lens_view(model, pairs, cache, scale=font_scale())
    sentence(findings(model, pairs, cache, MLPS), slot)
    code_view(as_code.mlp_projections_code(model, spec, current_prompt()))


def step_knockout(model, spec, cache) -> None:
    from engine.cost import estimate
    from engine.techniques.knockout_curve import KNOCKOUT_DRAWS, KNOCKOUT_K, cached_knockout_curve, curve_work
    from views.circuit_charts import knockout_curve_chart
    pairs, _ = analysed_pairs(model, spec, cache)
    table = path_patching(model, pairs, cache)
    f = model.facts
    k_max = min(KNOCKOUT_K, f.n_layers * f.n_heads)
    ranked = [(a, b) for a, b, _ in table.top_heads(k_max)]
    draws = KNOCKOUT_DRAWS
    what = f"the knockout curve (k = 0 .. {k_max}, {draws} random draws per k)"
    out = compute_or_button(lambda cb: cached_knockout_curve(model, pairs, ranked, k_max=k_max, draws=draws,
                                                             cache=cache, progress=cb),
                            lambda: estimate(model, pairs, curve_work(model, pairs, ranked, k_max=k_max, draws=draws)),
                            model=model, button=f"Compute {what}", key="story_knockout", text="Knocking out",
                            failure="compute the knockout curve",
                            note=f"This step needs {what}, which takes a while on this model and set: press the button "
                                 f"to compute it (the result is cached: next time it shows at once).")
    if out is None:
        return
    pts, _ = out
    sentence(findings(model, pairs, cache, KNOCKOUT))
    st.caption(f"Accuracy over the {len(pairs)} prompts of the set after knocking out the top-k heads of the heatmap "
               f"vs k random heads ({KNOCKOUT_DRAWS} draws)")
    chart(knockout_curve_chart(pd.DataFrame([p.__dict__ for p in pts])))
    snippet = as_code.knockout_code(model, spec, [], [], current_prompt(), k_max, draws)
    code_view(replace(snippet, note="The curve of the top-k heads vs k random heads (`knockout-curve`; the notebook "
                                    "lines print it as 'curve', beside the set's accuracy with nothing knocked out)."))


def step_improve(model, spec, cache) -> None:
    from engine.finetune.jobs import finished_jobs_of, job_dir, request_args
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
    chart(comparison_chart(rows))
    code_view(as_code.improve_code(model, spec, request_args(job_dir(job.job_id)), tuned=job.out_dir))


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

#: the words each screen uses (its sentence, captions and charts), explained beside it from the glossary
WORDS: dict[str, tuple[str, ...]] = {
    ANSWERS: ("prompt", "token", "probability", "rank", "counterfactual", "operator", "accuracy"),
    HEADS: ("attention head", "layer", "MLP", "path patching", "counterfactual", "END", "answer logit", "effect",
            "key heads", "bootstrap interval", "shuffled head labels"),
    KNOCKOUT: ("knockout", "key heads", "accuracy", "attention head"),
    ATTENTION: ("attention head", "attention", "END", "token role", "operand", "operator", "attention sink", "prompt"),
    MLPS: ("MLP", "MLP projection", "residual stream", "unembedding", "W_U[C]", "cosine", "logit lens", "probability",
           "rank", "END"),
    IMPROVE: ("precise SFT", "key heads", "accuracy"),
}


def screen_words(title: str) -> tuple[str, ...]:
    """The glossary terms screen ``title`` uses: :data:`WORDS`, or those its steps' claims name."""
    return WORDS.get(title) or tuple(t.name for t in glossary.used_in(" ".join(
        f"{s.claim} {s.key}" for s in argument.STEPS if s.story == title)))


def screens() -> list[tuple[str, object]]:
    """(title, render) of every screen, in order: the model's answer, then the argument's steps."""
    titles = [ANSWERS, *dict.fromkeys(s.story for s in argument.STEPS if s.story)]
    return [(t, CHARTS.get(t) or step_told(t)) for t in titles]
