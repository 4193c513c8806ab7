"""Page panels (Streamlit): each renders one engine result (cached) as one chart, drawn by ``views/``.

Used by the Path patching page (exact vs attribution, head -> head), the Position patching page (layer x
position), the MLP projections page (projections, logit lens), Home (the circuit summary) and the sidebar
(the report).  Every engine call is guarded: a problem is an ``st.error`` saying
what to do, never a traceback.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.prompts.pairs import CARRY_GROUPS, groups_of
from engine.techniques.attribution import KINDS, agreement, cached_attribution
from engine.techniques.carries import KINDS as CF_KINDS
from engine.techniques.carries import carries, pairs_per_kind, what_heads_carry
from engine.techniques.head_patching import Receiver, cached_head_path_patching
from engine.techniques.logit_lens import cached_logit_lens, top1_words
from engine.techniques.position_patching import cached_layer_position_patching
from engine.techniques.stability import ALL, head_stability, summaries
from ui import url_state
from ui.nav import link_to, page_link, page_of
from ui.notes_panel import noted
from ui.progress import USER_ERRORS, compute_or_button, run_with_progress
from views.charts import HEAD_SELECTION, component_frame, display_token, heatmap, scaled
from views.circuit_charts import (
    carries_chart,
    carries_heatmap,
    exact_vs_estimate,
    lens_lines,
    position_heatmap,
    stability_chart,
)

KIND_NAMES = dict(KINDS)


def attribution_view(model, pairs, cache, metric: str) -> tuple[int, int] | None:
    """Exact vs attribution patching: scatter, agreement, misses; returns the clicked head, if any."""
    total = st.toggle("Also activation patching (nothing frozen; one forward pass per sender)", value=True,
                      help="Exact activation patching of each head's END output costs one forward pass per "
                           "sender; its AtP estimate one forward + one backward pass.")
    from engine.cost import estimate
    from engine.techniques.attribution import attribution_work
    out = compute_or_button(lambda cb: cached_attribution(model, pairs, cache=cache, total=total, progress=cb),
                            lambda: estimate(model, pairs, attribution_work(model, pairs, total=total)), model=model,
                            button="Compute exact vs attribution", key=f"atp_go_{total}", ask=True,
                            text="Exact and attribution patching, step", failure="run attribution patching",
                            note="Exact path patching freezes every other head at X_r; exact activation patching "
                                 "(nothing frozen) adds one forward pass of the set per sender; AtP estimates both "
                                 "from one forward and one backward pass." if total else
                                 "Exact path patching (every other head frozen at X_r) beside its AtP estimate: one "
                                 "forward and one backward pass.")
    if out is None:
        return None
    table, computed = out
    rows = table.rows[metric]
    pairs_of_kinds = [("exact", "atp")] + ([("exact_total", "atp_total")] if total else [])
    choice = st.radio("Compare", pairs_of_kinds, horizontal=True,
                      format_func=lambda p: f"{KIND_NAMES[p[1]]} vs {KIND_NAMES[p[0]]}")
    exact, est = choice
    df = pd.DataFrame([{"name": r.name, "component": r.component, "layer": r.layer, "head": r.head,
                        exact: r.values[exact], est: r.values[est]} for r in rows])
    ag = agreement(rows, exact, est)
    secs = table.seconds
    st.caption(f"{len(pairs)} prompt pairs · heads: Spearman {ag.spearman:.3f}, top-5 overlap {ag.overlap[5]}/5, "
               f"top-10 overlap {ag.overlap[10]}/10, largest |error| {ag.max_abs_error:.3f} · "
               f"time: exact {secs.get(exact, float('nan')):.2f} s, AtP {secs.get(est, float('nan')):.2f} s"
               + (" (when computed)" if not computed else ""))
    event = st.altair_chart(exact_vs_estimate(df, exact, est, metric), width="stretch", on_select="rerun",
                            key=f"atp_scatter_{exact}")
    miss = pd.DataFrame({
        "k": [k for k in (5, 10) for _ in range(max(len(ag.missed[k]), len(ag.invented[k]), 1))],
        "missed by AtP (in the exact top-k)": [x for k in (5, 10) for x in _pad(ag.missed[k], ag.invented[k])],
        "invented by AtP (not in the exact top-k)": [x for k in (5, 10) for x in _pad(ag.invented[k], ag.missed[k])],
    })
    st.markdown("**Where the estimate ranks differently** (most negative effect first)")
    st.dataframe(miss, hide_index=True, width="stretch")
    st.download_button("Exact vs attribution (CSV)", df.to_csv(index=False).encode(), "attribution.csv", "text/csv")
    return clicked_head(event)


def patching_table(model, pairs, cache, *, key: str = "patching_go", text: str = "Path patching, batch",
                   failure: str = "run path patching"):
    """Path patching of ``pairs``, the heatmap by which every page ranks the heads: read from the cache, else computed
    now, or behind a button with its cost (the page stops until it is pressed); (table, computed).  One ``key`` on
    every page: what path patching took on one page corrects its estimate on the others."""
    from engine.cost import estimate
    from engine.techniques.path_patching import cached_path_patching, path_patching_work
    return compute_or_button(lambda cb: cached_path_patching(model, pairs, cache=cache, progress=cb),
                             lambda: estimate(model, pairs, path_patching_work(model, pairs)), model=model,
                             button="Run path patching", key=key, text=text, failure=failure, stop=True,
                             note="Path patching ranks the heads by how much each carries the operation to the "
                                  "answer; this page builds on it. Its result is kept: every page reads it at once.")


def role_attention_of(model, pairs, cache):
    """The END-row attention by token role over ``pairs`` (cached, else computed now, or behind a button with its
    cost: the page stops until it is pressed); (rows, computed)."""
    from engine.cost import estimate
    from engine.techniques.attention import cached_role_attention, end_rows_work
    return compute_or_button(lambda cb: cached_role_attention(model, pairs, cache=cache, progress=cb),
                             lambda: estimate(model, pairs, end_rows_work(model, pairs)), model=model,
                             button="Compute the attention by token role", key="roles_go",
                             text="Attention by token role", failure="compute the attention by token role",
                             stop=True)


def carries_view(model, spec, cache, k: int) -> None:
    """What each head carries: the top-k heads -- or every head, at the same cost -- path-patched under each
    counterfactual kind (on demand: each kind is one path patching of its own set, cached)."""
    from engine.cost import cost_of
    from engine.techniques.carries import carries_work
    n_all = model.facts.n_layers * model.facts.n_heads
    every = st.toggle(f"Every head ({n_all}), not only the top {k}", key="carries_every",
                      help="The same path patchings give every head's value: every head costs what the top k cost.")
    out = compute_or_button(lambda cb: what_heads_carry(model, spec, k=n_all if every else k, cache=cache, progress=cb),
                            lambda: cost_of(model, carries_work(model, spec, cache=cache)),
                            model=model, button=f"Compute (path patching of the set under {len(CF_KINDS) - 1} more "
                                                f"counterfactual kinds)", key="carries_go", ask=True,
                            text="Path patching per counterfactual kind", failure="compare the counterfactual kinds")
    if out is None:
        return
    rows, metric = out
    cdf = pd.DataFrame([r.__dict__ for r in rows])
    if every:
        st.altair_chart(carries_heatmap(cdf, metric))
        st.caption(f"Every head's mean {metric} under each kind of counterfactual, one heatmap per kind on one colour "
                   f"scale: a head carries the kind of its most negative (reddest) cell. Outlined in black: a cell "
                   f"whose 95 % bootstrap interval excludes 0 (its interval is in its tooltip).")
    else:
        st.altair_chart(carries_chart(cdf, metric), width="stretch")
    st.caption("Pairs per kind (answered right): " + ", ".join(
        f"{kind} {n}" if n else f"{kind} none (no counterfactual of this kind for these templates, or none answered "
                                f"right)" for kind, n in pairs_per_kind(rows).items()))
    found = carries(rows)
    shown = [c for c in found if c.clear] if every else found
    if every:
        st.markdown(f"**{len(shown)} of {len(found)} heads** carry one kind clearly (its interval lies wholly below "
                    f"every other kind's), in the heatmap's ranking:")
    st.dataframe(pd.DataFrame([{"head": f"{c.layer}.{c.head}", "carries (most negative effect)": c.kind,
                                "settled by the intervals": "yes" if c.clear else "no (intervals overlap)"}
                               for c in shown], columns=["head", "carries (most negative effect)",
                                                         "settled by the intervals"]),
                 hide_index=True, width="stretch")
    st.download_button("What each head carries (CSV)", cdf.to_csv(index=False).encode(), "carries.csv", "text/csv")


def stability_view(table, k: int) -> None:
    """Top-k stability of the heatmap's ranking: per group (all pairs, an operation, a template, carry or not),
    how often each head is in the top-k of resampled pairs, and a table of every group's top-k."""
    try:
        rows = head_stability(table, k)
    except ValueError as e:
        st.error(f"Cannot measure the stability of the top {k}: {e}.")
        return
    sums = summaries(rows, k)
    names = [s.group for s in sums]
    label = {ALL: "all pairs", **CARRY_GROUPS}
    n_of = {s.group: s.n for s in sums}
    group = st.selectbox("Pairs", names, format_func=lambda g: f"{label.get(g, g)} ({n_of[g]} pairs)",
                         key="stability_group")
    sdf = pd.DataFrame([r.__dict__ for r in rows if r.group == group])
    st.altair_chart(stability_chart(sdf, k), width="stretch")
    st.dataframe(pd.DataFrame([{"pairs": label.get(s.group, s.group), "n": s.n, f"top {k}": ", ".join(s.top),
                                # one pair resampled is that pair every time: its 100 % would read as stable
                                f"mean share of resamples in the top {k}": f"{s.mean_in_top:.0%}" if s.n > 1
                                else "— (1 pair: nothing to resample)",
                                f"shared with all pairs' top {k}": f"{s.overlap} of {len(s.top)}"} for s in sums]),
                 hide_index=True, width="stretch")
    st.download_button("Stability (CSV)", pd.DataFrame([r.__dict__ for r in rows]).to_csv(index=False).encode(),
                       "stability.csv", "text/csv")


def _pad(a: list[str], b: list[str]) -> list[str]:
    n = max(len(a), len(b), 1)
    return a + ["—"] * (n - len(a))


def clicked_head(event) -> tuple[int, int] | None:
    """The (layer, head) a chart click selected, or None (MLP points / nothing clicked)."""
    cell = clicked_cell(event)
    return cell if cell is not None and cell[1] >= 0 else None


def clicked_cell(event) -> tuple[int, int] | None:
    """The (layer, head) of a clicked heatmap cell -- ``head == -1`` for the layer's MLP -- or None."""
    picked = (event.selection.get(HEAD_SELECTION) or []) if event else []
    picked = [p for p in picked if "layer" in p and "head" in p]
    return (int(picked[0]["layer"]), int(picked[0]["head"])) if picked else None


def select_head(source: str, clicked: tuple[int, int] | None) -> bool:
    """Make a chart click the selected head (``selected_head``) when it is new for that chart.

    Streamlit keeps a chart's last selection across reruns, so each chart's last click is remembered
    and only a *new* click selects: the most recent click of any chart wins."""
    last = f"_last_click_{source}"
    if clicked is None:
        st.session_state[last] = None
        return False
    if st.session_state.get(last) == clicked:
        return False
    st.session_state[last] = clicked
    st.session_state["selected_head"] = clicked
    return True


def head_to_head_section(model, pairs, cache, layer: int, head: int, metric: str) -> None:
    """Which earlier heads feed head (layer, head) through its query (or key / value) at END.

    Read from the cache when computed before; otherwise a button starts it, with its cost."""
    if layer == 0:
        st.info(f"Head {layer}.{head} is in layer 0: no earlier head can feed it. Click a head in a later layer.")
        return
    inp = st.radio("Receiver input", ("q", "k", "v"), horizontal=True, key="h2h_input",
                   format_func={"q": "query", "k": "key", "v": "value"}.get,
                   help="Only this input of the receiver is recomputed from the patched residual stream; the "
                        "other two and every other head stay at the reference run.")
    from engine.cost import estimate
    from engine.techniques.head_patching import head_path_patching_work
    rec = Receiver(layer, head, inp)
    out = compute_or_button(lambda cb: cached_head_path_patching(model, pairs, rec, cache=cache, progress=cb),
                            lambda: estimate(model, pairs, head_path_patching_work(model, pairs, rec)), model=model,
                            button=f"Compute which heads feed {rec} ({layer * (model.facts.n_heads + 1)} senders)",
                            key=f"h2h_go_{rec}", text=f"Head -> head into {rec}, batch", ask=True,
                            failure="run head -> head path patching")
    if out is None:
        return
    vals, _ = out
    df = component_frame([(v.component, v.layer, v.head, v.value) for v in vals
                          if v.metric == metric and v.group == "*"], layer, model.facts.n_heads)
    word = {"q": "query", "k": "key", "v": "value"}[inp]
    st.caption(f"Senders below layer {layer}: the answer logit's change carried only through head {layer}.{head}'s "
               f"{word} at the last position (every other head frozen). Red = the receiver reads the operation from "
               f"this sender.")
    st.altair_chart(heatmap(noted(df, model, cache), metric), width="stretch", key=f"h2h_{rec}")  # pins outlined
    st.download_button("Head -> head data (CSV)", df.to_csv(index=False).encode(),
                       f"head_to_head_{layer}_{head}_{inp}.csv", "text/csv")


def position_view(model, pairs, cache) -> tuple[str, str]:
    """Layer x position activation patching heatmap of one group (a template first: its few prompts, token
    labels); each group is computed when it is chosen.  Returns the chosen (group, metric)."""
    tok = model.tokenizer
    groups = sorted(groups_of(pairs), key=lambda g: (not g.startswith("template:"), not g.startswith("op:"), g))
    c1, c2 = st.columns([3, 2])
    url_state.check("pos_group", groups)
    group = c1.selectbox("Prompts", groups, **url_state.bound("pos_group", groups[0]),
                         format_func=lambda g: (f"all prompts ({len(pairs)})" if g == "*" else
                                                f"{g.replace(':', ': ', 1)} ({len(groups_of(pairs)[g])})"),
                         help="each group is patched on its own prompts when chosen (a template: a few seconds; "
                              "all prompts: the whole set)")
    metric = c2.radio("Metric", ("logit_diff", "restored"), horizontal=True, **url_state.bound("pos_metric"),
                      help="logit_diff: patched minus original answer logit; restored: that change as a "
                           "fraction of the counterfactual's own change (1 = as if the operation were gone)")
    from engine.cost import estimate
    from engine.techniques.position_patching import group_pairs, position_patching_work
    mine = list(pairs) if group == "*" else group_pairs(pairs, group)
    out = compute_or_button(lambda cb: cached_layer_position_patching(
                                model, pairs, cache=cache, progress=cb, group=group,
                                tokens=lambda ids: [display_token(t) for t in tok.convert_ids_to_tokens(list(ids))]),
                            lambda: estimate(model, mine, position_patching_work(model, mine)), model=model,
                            button="Compute layer x position patching", key=f"lp_go_{group}",
                            text="Layer x position patching, batch", failure="run layer x position patching",
                            note="Each cell runs the prompts once: a template's few prompts cost seconds, all prompts "
                                 "the whole set once per cell.")
    if out is None:
        return group, metric
    cells, computed = out
    df = pd.DataFrame([{"layer": c.layer, "rel": c.rel, "token": c.token, "value": getattr(c, metric)}
                       for c in cells])
    st.caption(f"{len(groups_of(pairs)[group])} of {len(pairs)} prompt pairs · "
               + ("computed now" if computed else "read from the cache")
               + (" · a template's positions carry its first prompt's tokens" if group.startswith("template:")
                  else " · mixed templates: positions are counted from the last token"))
    st.altair_chart(position_heatmap(df, metric), width="stretch")
    st.download_button("Layer x position data (CSV)", df.to_csv(index=False).encode(), "layer_position.csv", "text/csv")
    return group, metric


def logit_lens_view(model, pairs, cache, scale: float = 1.0) -> None:
    """The answer's probability and rank at END after each layer (``scale``: its text, :func:`views.charts.scaled`)."""
    from engine.cost import estimate
    from engine.techniques.logit_lens import logit_lens_work
    out = compute_or_button(lambda cb: cached_logit_lens(model, pairs, cache=cache, progress=cb),
                            lambda: estimate(model, pairs, logit_lens_work(model, pairs)), model=model,
                            button="Compute the logit lens", key="lens_go", text="Logit lens, batch",
                            failure="run the logit lens")
    if out is None:
        return
    rows, computed = out
    groups = sorted({r.group for r in rows}, key=lambda g: (g != "*", g))
    url_state.check("lens_group", groups)
    group = st.selectbox("Prompts", groups, **url_state.bound("lens_group"),
                         format_func=lambda g: "all operations" if g == "*" else g[3:])
    mine = [r for r in rows if r.group == group]
    df = pd.DataFrame([r.__dict__ for r in mine])
    st.caption(f"{len(pairs)} prompt pairs · " + ("computed now" if computed else "read from the cache") + " · "
               + top1_words(mine))
    st.altair_chart(scaled(lens_lines(df), scale), width="stretch")
    st.download_button("Logit lens (CSV)", df.to_csv(index=False).encode(), "logit_lens.csv", "text/csv")


def circuit_summary_view(model, spec, cache) -> None:
    """Home: the circuit summary of the sidebar's prompt set, from cached results only, with page links."""
    from engine.findings.summary import circuit_summary
    from engine.results import NotCached, cache_only
    from engine.techniques.accuracy import kept_pairs
    try:
        with cache_only():
            pairs, _ = kept_pairs(model, spec, cache=cache)
        findings = circuit_summary(model, pairs, cache) if pairs else []
    except NotCached:
        findings = []
    except USER_ERRORS as e:
        st.error(f"Cannot read the cached results for the summary: {e}")
        return
    if not findings or not findings[0].computed:
        st.info("No path-patching result for this model and prompt set yet: open **Path patching** to compute it; "
                "the summary then appears here.")
        link_to("path-patching")
        return
    for f in findings:
        c1, c2 = st.columns([5, 1])
        step = f.step[:1].upper() + f.step[1:]
        if f.computed:
            c1.markdown(f"**{step}.** {f.text}")
        else:
            c1.markdown(f"**{step}.** _not computed yet for this set: open the page to compute it._")
        page = page_of(f.technique)
        page_link(page.script, page.title, where=c2)


def _report_cost(model, spec, cache, key: str) -> str:
    """" (estimated: ...)" of building the report, or "" where the set cannot be built (pressing the button says
    why).  Counting it reads the cache and tokenizes the set (about 0.4 s): kept for the session until the cache file
    changes, so the sidebar of every page does not pay it on every rerun."""
    from engine.cost import cost_of
    from engine.findings.report import report_work
    def stat(p) -> tuple[int, int] | None:
        try:
            s = p.stat()
            return s.st_mtime_ns, s.st_size
        except OSError:
            return None
    stamp = None if cache is None else (stat(cache.path), stat(cache.path.with_name(cache.path.name + ".wal")))
    memo = st.session_state.get("_report_cost")
    if memo is not None and memo[0] == (key, stamp):
        return memo[1]
    try:
        text = f" ({cost_of(model, report_work(model, spec, cache)).label()})"
    except USER_ERRORS:
        text = ""
    st.session_state["_report_cost"] = ((key, stamp), text)
    return text


def report_section(model, spec, cache) -> None:
    """Build the shareable HTML report of the sidebar's prompt set (computing what is missing), then offer it."""
    from engine.findings.report import build_report, phases
    from views.report import render_html
    key = f"report:{model.facts.fingerprint}:{sorted(spec.to_params().items())}"
    cost = _report_cost(model, spec, cache, key)
    if st.button(f"Build the report of this prompt set{cost}", key="report_build",
                 help="Accuracy, path patching, the top heads' attention, MLP projections, logit lens and the "
                      "knockout curve, with the model fingerprint, the prompt-set definition and the versions, "
                      f"as one HTML file that opens offline ({len(phases())} steps; cached results are reused)."):
        html = run_with_progress("Building the report, step", "build the report",
                                 lambda cb: render_html(build_report(model, spec, cache, progress=cb)), on_demand=True)
        if html is None:
            return
        st.session_state[key] = html
    if key in st.session_state:
        st.download_button("Download report (HTML)", st.session_state[key].encode(), "arithmetic_circuits_report.html",
                           "text/html", key="report_download")


PROJECTION_LABELS = {"cos_in_A": "cos(MLP in, W_U[A])", "cos_in_B": "cos(MLP in, W_U[B])",
                     "cos_out_C": "cos(MLP contribution, W_U[C])",
                     "cos_out_other": "cos(MLP contribution, other numbers)"}
#: the main result of the MLP projections: the MLPs write the answer
PROJECTION_MAIN = PROJECTION_LABELS["cos_out_C"]


def projections(model, pairs, cache, failure: str):
    """The MLP projections of ``pairs`` (cached, else computed or behind a button with their cost): (values,
    computed), or None."""
    from engine.cost import estimate
    from engine.techniques.mlp_projections import cached_mlp_projections, projections_work
    return compute_or_button(lambda cb: cached_mlp_projections(model, pairs, cache=cache, progress=cb),
                             lambda: estimate(model, pairs, projections_work(model, pairs)), model=model,
                             button="Compute the MLP projections", key="projections_go", text="Projecting",
                             failure=failure)


def mlp_projections_view(model, pairs, cache, scale: float = 1.0) -> pd.DataFrame | None:
    """Per layer, the MLP projections (mean ± sd over the set) as lines; returns their frame (None after an
    ``st.error``).  The answer series is the strongest colour; ``scale``: its text (:func:`views.charts.scaled`)."""
    from views.charts import lines_with_band, stretched
    out = projections(model, pairs, cache, "compute the projections")
    if out is None:
        return None
    vals, computed = out
    df = pd.DataFrame([v.__dict__ for v in vals])
    df["series"] = df["metric"].map(PROJECTION_LABELS)
    df["lo"], df["hi"] = df["value"] - df["std"], df["value"] + df["std"]
    st.caption(f"{len(pairs)} prompt pairs · " + ("computed now" if computed else "read from the cache"))
    lines = lines_with_band(df, "layer", "value", "lo", "hi", "series", "cosine", main=PROJECTION_MAIN)
    st.altair_chart(scaled(stretched(lines), scale), width="stretch")  # stretched: the legend below keeps the plot
    return df


def typed_top_numbers(model, text: str) -> tuple[pd.DataFrame, object] | None:
    """The typed prompt's top number tokens of every layer's MLP (long frame) and its prompt report;
    None after an ``st.error``."""
    from engine.techniques.mlp_projections import top_number_tokens
    from engine.techniques.promptlab import analyse_prompt
    try:
        rep = analyse_prompt(model, text)
        answer = rep.answer_id if rep.parsed is not None else None
        return pd.DataFrame([t.__dict__ for t in top_number_tokens(model, rep.text, rep.ids, answer_id=answer)]), rep
    except USER_ERRORS as e:
        st.error(f"Cannot analyse the typed prompt `{text}`: {e}. Change it in the Prompt lab.")
        return None


def mlp_layer_view(model, pairs, cache, layer: int, text: str) -> None:
    """One layer's MLP (a heatmap click on its cell): its projections over the set and its top number tokens
    on the typed prompt."""
    import altair as alt

    from views.charts import PALETTE
    out = projections(model, pairs, cache, "compute the MLP projections")
    if out is None:
        return
    vals, _ = out
    df = pd.DataFrame([{"series": PROJECTION_LABELS[v.metric], "value": v.value, "sd": v.std}
                       for v in vals if v.layer == layer])
    st.caption(f"MLP {layer} at the last position, mean over {len(pairs)} prompt pairs (MLP projections page: "
               f"every layer)")
    order = list(PROJECTION_LABELS.values())
    chart = alt.Chart(df).mark_bar().encode(
        y=alt.Y("series:N", sort=order, title=None, axis=alt.Axis(labelLimit=0)),
        x=alt.X("value:Q", title="cosine"),
        color=alt.Color("series:N", legend=None, scale=alt.Scale(
            domain=[PROJECTION_MAIN] + [s for s in order if s != PROJECTION_MAIN], range=list(PALETTE[:4]))),
        tooltip=["series", alt.Tooltip("value:Q", format=".3f"), alt.Tooltip("sd:Q", format=".3f")])
    labels = chart.mark_text(align="left", dx=4).encode(text=alt.Text("value:Q", format=".3f"))
    st.altair_chart((chart + labels).properties(height=170), width="stretch")
    got = typed_top_numbers(model, text)
    if got is None:
        return
    top, rep = got
    mine = top[top.layer == layer]
    st.caption(f"The numbers MLP {layer} pushes most on your prompt `{text}`: score = how much its output at the last "
               f"position raises each number's logit (the MLP's output · the number's unembedding vector).")
    st.markdown(top_numbers_sentence(top, rep, layer))
    st.dataframe(highlight_answer(mine[["rank", "number", "score", "answer"]], ["rank", "number"]), hide_index=True,
                 width="stretch")


ANSWER_STYLE = "background-color: #FBE3D6; font-weight: bold"  # the answer's cells in a table of ranked numbers


def highlight_answer(df: pd.DataFrame, columns: list[str], answer: int | None = None):
    """``df`` styled with the answer's cells of ``columns`` highlighted: the cells equal to ``answer``, or (no
    ``answer``) those of the rows whose ``answer`` column is true."""
    if answer is not None:
        return df.style.map(lambda v: ANSWER_STYLE if v == answer else "", subset=columns)
    marked = df["answer"].to_numpy()
    return df.style.apply(lambda col: [ANSWER_STYLE if m else "" for m in marked], axis=0, subset=columns)


def top_numbers_sentence(top: pd.DataFrame, rep, layer: int | None = None) -> str:
    """What the ranked numbers say about the answer, from the frame itself (``top``: rows of
    ``top_number_tokens`` with the answer marked; ``layer``: one MLP, or every layer)."""
    if rep.parsed is None or not top["answer"].any():
        return ("Your prompt has no answer the lab can read (no arithmetic problem found), so no number is marked "
                "as the answer.")
    ans = top[top["answer"]]
    word = ans["token"].iloc[0]
    first = f"the answer's first token `{word}`" if str(rep.parsed.answer) != word.strip("▁Ġ ") else \
        f"the answer {rep.parsed.answer}"
    if layer is not None:
        rank = int(ans[ans.layer == layer]["rank"].iloc[0])
        above = top[(top.layer == layer) & (top["rank"] < rank)]["number"].tolist()
        if rank == 1:
            return f"MLP {layer} pushes {first} more than any other number."
        return (f"MLP {layer} ranks {first} {rank}{_ordinal(rank)}: it pushes {', '.join(map(str, above))} more. "
                f"One MLP's push is only part of the answer: the model's output is the sum of every layer's "
                f"writes (the logit lens shows where the sum settles).")
    tops = sorted(int(x) for x in ans[ans["rank"] == 1]["layer"])
    return (f"{first[0].upper()}{first[1:]} (highlighted) is the top number of the MLPs of layer"
            f"{'s' if len(tops) != 1 else ''} {', '.join(map(str, tops))}." if tops else
            f"No single MLP ranks {first} (highlighted) first: each pushes other numbers more, and the answer comes "
            f"from the sum of their writes.")


def _ordinal(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
