"""Path patching heatmap: which heads carry the arithmetic; click a head to see where it looks."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.findings.as_code import path_patching_code
from engine.findings.glossary import help_text
from engine.numerics.intervals import SMALL_SET
from engine.prompts.pairs import CARRY_GROUPS, PromptError, counterfactual_words, digit_words
from engine.prompts.promptsets import DOMINANT_SHARE, answer_token_stats
from engine.techniques.attention import ROLE_DEFINITIONS, ROLES
from engine.techniques.path_patching import cached_path_patching
from engine.techniques.promptlab import typed_attention, typed_pair
from ui import state, url_state
from ui.as_code import code_view
from ui.circuit_panels import (
    attribution_view,
    carries_view,
    clicked_cell,
    head_to_head_section,
    mlp_layer_view,
    patching_table,
    role_attention_of,
    select_head,
    stability_view,
)
from ui.notes_panel import note_box, noted
from ui.progress import USER_ERRORS
from ui.session import (
    analysed_pairs,
    current_prompt,
    prompt_caption,
    result_cache,
    set_size_text,
    setup_page,
    words_used,
)
from views.charts import display_token, heatmap, heatmap_frame, token_bars


def intro(spec) -> str:
    """The page's text, in the words of the sidebar's counterfactual kind."""
    name, carries = counterfactual_words(spec.counterfactual if spec else None)
    return ("Each cell is one attention head (the last column is the layer's MLP). Its colour is the change of the "
            "answer token's logit when only that component's output at the last position comes from the "
            f"counterfactual prompt ({name}) and every other head is frozen: red = the answer logit drops, i.e. the "
            f"head carries {carries} (the colour range follows the heads; MLP cells saturate). Only prompts the "
            "model answers right are used. Click a cell to see that head's attention from the last token (an MLP "
            "cell: that layer's MLP view); its tooltip gives the cell's 95 % bootstrap interval over the prompt "
            "pairs.")


model, spec = setup_page("Path patching", intro)
prompt_caption()
words_used("path patching", "counterfactual", "attention head", "MLP", "END", "answer logit", "effect",
           "logit difference", "key heads", "bootstrap interval", "attention", "token role", "attribution patching")

c1, c2, c3 = st.columns([2, 2, 1])
metric = c1.selectbox("Metric", ("effect", "logit_diff"), **url_state.bound("pp_metric"), help=help_text(
    "effect", "logit difference", "answer logit",
    lead="effect: relative change (logit_p - logit_o) / logit_o, the paper's measure (pairs whose unpatched answer "
         "logit is below 1 are left out of it); logit_diff: logit_p - logit_o, every pair."))
cache = result_cache()
pairs, n_gen = analysed_pairs(model, spec, cache)
table, computed = patching_table(model, pairs, cache)
if table.fallback:  # the fast path did not reproduce this model: the textbook loop computed the heatmap
    st.info(table.fallback, icon=":material/info:")

TYPED = "typed"  # the typed prompt's own pair, patched alone
groups = (["*"] + sorted(g for g in table.groups() if g.startswith("op:"))
          + [g for g in CARRY_GROUPS if g in table.groups()] + [TYPED])
url_state.check("pp_group", groups)
group = c2.selectbox("Operation", groups, **url_state.bound("pp_group"),
                     format_func=lambda g: "all operations" if g == "*" else "the typed prompt alone" if g == TYPED
                     else CARRY_GROUPS[g] if g in CARRY_GROUPS else g[3:],
                     help="An operation's pairs; the sums that carry (differences that borrow) in some column, or "
                          "those with none; or the typed prompt (Prompt lab) and its counterfactual alone")
url_state.check("pp_k", range(1, table.n_layers * table.n_heads + 1))
k = c3.number_input("Top k", 1, table.n_layers * table.n_heads, **url_state.bound("pp_k"),
                    help=help_text("key heads"))
st.caption((set_size_text(spec, len(pairs), n_gen) if len(pairs) >= SMALL_SET else  # a small set: the note above
            f"{len(pairs)} of {n_gen} prompts answered right")
           + (f" · every interval on this page rests on these {len(pairs)} pairs · " if group == "*" else
              " · the heatmap and its intervals rest on the pairs chosen under Operation · ")
           + ("computed now, stored in the cache" if computed else "read from the cache"))
if group in CARRY_GROUPS:
    _, n_group = table.guard_counts(group)  # the group's pairs, as stored with its values
    st.caption(f"{CARRY_GROUPS[group].capitalize()}: {n_group} of the {len(pairs)} pairs"
               + " (an addition carries when some column's digits sum to 10 or more, a subtraction borrows when some "
                 "column's top digit is the smaller; multiplications and divisions are in neither); its heatmap, "
                 "intervals and key heads rest on those pairs alone"
               + (f" -- only {n_group}: {'one pair has no interval' if n_group == 1 else 'the intervals are wide'} "
                  f"and another sample of prompts could move the key heads (at least {SMALL_SET} are advised; more "
                  f"prompts per operation, or two-digit operands in the sidebar, give more)."
                  if n_group < SMALL_SET else "."))
shown, shown_group = table, group
if group == TYPED:  # the heatmap of one pair: the typed prompt and its counterfactual
    try:
        one = typed_pair(model.tokenizer, current_prompt(), spec.digit)
        shown, _ = cached_path_patching(model, [one], cache=cache)
    except USER_ERRORS as e:
        st.error(f"Cannot patch the typed prompt `{current_prompt()}`: {e}. Type an arithmetic prompt such as "
                 f"`3 + 5 =` in the Prompt lab, or pick an operation"
                 + (f" (or choose another 'Answer digit' in the sidebar: the set is read at the "
                    f"{digit_words(spec.digit)} one)." if spec.digit != "first" else "."))
        st.stop()
    shown_group = "*"
    forced = model.tokenizer.decode(one.forced_ids).strip()
    st.caption(f"The typed prompt `{current_prompt()}` against its counterfactual `{one.cf_text}`"
               + (f", read at the answer's {digit_words(spec.digit)} digit as the set is (`{forced}` written after "
                  f"both)" if one.forced else "") + ": one pair, so no mean -- a single prompt's circuit.")

stats = answer_token_stats(model.tokenizer, pairs if group != TYPED else [one], spec.digit)
which = "First answer" if stats.digit == "first" else f"{digit_words(stats.digit).capitalize()} answer-digit"
if group == TYPED:  # one prompt: its token, no shares (a share of one prompt warns of nothing)
    st.markdown(f"**{which} token of the typed prompt** (the token whose logit the heatmap measures): "
                f"`{stats.top_token}`")
else:
    with st.container(border=True):
        st.markdown(f"**{which} tokens of these {stats.n} prompts** (the token whose logit the heatmap measures): "
                    + stats.summary())
        if stats.warning:
            st.warning(stats.warning)
        st.caption(f"Largest share within one operation: `{stats.top_token}`, {stats.top_share:.0%} of the "
                   f"{stats.top_op} prompts (a warning above {DOMINANT_SHARE:.0%}). Sets are balanced by default: "
                   f"candidates are taken round-robin over their {which.lower()} token, so no token (e.g. the '1' of "
                   f"every sum from 10 to 18) holds more than its share.")

note = shown.effect_note(shown_group)
if metric == "effect" and shown.ranking_metric(shown_group) == "logit_diff":
    st.warning(f"{note} The heatmap shows logit_diff.")
    metric = "logit_diff"
elif metric == "effect" and note:
    st.info(note)

heads, mlps = shown.heatmap(metric, shown_group)
df = heatmap_frame(heads, mlps, shown.heatmap_intervals(metric, shown_group))
df = noted(df, model, cache)  # pinned cells outlined, the note in the tooltip
TABS = ["Heatmap", "Exact vs attribution", "Stability", "What each head carries"]
url_state.check("pp_tab", TABS)
tab_map, tab_atp, tab_stab, tab_carry = st.tabs(TABS, **url_state.bound("pp_tab"))
with tab_carry:
    st.caption(f"Does a key head carry operand A, operand B or the operator? The top {k} heads (the heatmap's ranking "
               f"under the sidebar's prompt set, {counterfactual_words(spec.counterfactual)[0]}) path-patched again "
               f"with counterfactuals that "
               f"change only A, or only B (the operator kept, the same length in tokens, the answer changed): a "
               f"head's most negative bar is what it carries; black rules are 95 % bootstrap intervals.")
    carries_view(model, spec, cache, int(k))
with tab_stab:
    st.caption(f"Is the top-{k} list a property of the model or of this sample of prompts? Each cell: the share of "
               f"1000 resamples of the pairs (drawn with replacement) whose top {k} by the heatmap's ranking holds "
               f"the head; the group's own top {k} outlined. Groups: every operation and template"
               + (", and additions / subtractions with and without a carry (borrow)"
                  if all(g in table.groups() for g in CARRY_GROUPS) else "")
               + ". From the stored per-pair results: no forward pass.")
    stability_view(table, int(k))
with tab_atp:
    st.caption("Attribution patching (AtP) estimates each sender's effect from one gradient instead of one patch: "
               "grad(answer logit) · (z_c − z_r), through the last position's MLPs and norms with every other head "
               "frozen (the same quantity as the heatmap), and for plain activation patching (nothing frozen). Each "
               "point is a sender: on the dashed line the estimate is exact. Click a head's point to select it.")
    select_head("atp_click", attribution_view(model, pairs, cache, metric))
with tab_map:
    left, right = st.columns([3, 2])
    with left:
        # keyed by the view: a new metric or operation starts with no cell outlined
        event = st.altair_chart(heatmap(df, metric), width="stretch", on_select="rerun",
                                key=f"heatmap_{metric}_{group}")
        if (df["note"] != "").any():
            st.caption("Outlined in orange: a head or MLP you pinned (its note in the cell's tooltip; click it to "
                       "change the note).")
        st.download_button("Heatmap data (CSV)", df.to_csv(index=False).encode(), "patching.csv", "text/csv")
        top = pd.DataFrame(shown.top_heads(int(k), metric, shown_group), columns=["layer", "head", metric])
        st.markdown("**Key heads** (most negative first)")
        st.dataframe(top, hide_index=True, width="stretch")
        if group == "*":  # the set's own pairs: the CLI and the notebook give the same numbers
            code_view(path_patching_code(model, spec, metric, int(k)))
    select_head("heatmap_click", clicked_cell(event))  # a click selects; the knockout set is not touched
    sel = state.selected()
    if sel is None or sel[0] >= table.n_layers or sel[1] >= table.n_heads:
        sel = (int(top.iloc[0]["layer"]), int(top.iloc[0]["head"]))
    layer, head = sel
    if head == state.MLP:
        with right:
            st.subheader(f"MLP {layer}")
            note_box(model, cache, f"{layer}.mlp", f"MLP {layer}")
            mlp_layer_view(model, pairs, cache, layer, current_prompt())
        st.stop()
    with right:
        st.subheader(f"Head {layer}.{head}")
        note_box(model, cache, f"{layer}.{head}", f"head {layer}.{head}")
        name = f"{layer}.{head}"
        if name in state.ko_heads():
            st.caption(f"Head {name} is in the knockout set ({', '.join(state.ko_heads())}).")
        else:
            st.button(f"Add head {name} to the knockout set", key="add_to_knockout",
                      on_click=state.add_knockout_head, args=(layer, head),
                      help="The Knockout page mean-ablates the heads of the knockout set.")
        try:
            digit = spec.digit if group == TYPED else "first"  # the typed heatmap's position, else the prompt's own
            row = pd.DataFrame([t.__dict__ for t in typed_attention(model, current_prompt(), layer, head, digit)])
            row["label"] = [f"{i}: {display_token(t)}" for i, t in zip(row.position, row.token)]
            written = one.forced_ids if group == TYPED else []  # the typed pair read above, at the set's digit
            st.caption(f"Your prompt `{current_prompt()}` (change it in the Prompt lab): the attention of its last "
                       f"token, token by token, coloured by the token's role"
                       + (f" -- with the answer's {'first digit' if len(written) == 1 else 'digits'} before the "
                          f"{digit_words(digit)} one (`{model.tokenizer.decode(written).strip()}`) written after it, "
                          f"as the heatmap reads it" if written else ""))
            st.altair_chart(token_bars(row, "label", "weight", "attention"), width="stretch")
        except PromptError as e:
            st.error(f"Cannot show the typed prompt's attention: {e}")
        roles, _ = role_attention_of(model, pairs, cache)
        rdf = pd.DataFrame([r.__dict__ for r in roles if r.layer == layer and r.head == head])
        rdf["role"] = pd.Categorical(rdf["role"], ROLES, ordered=True)
        st.caption("Mean attention of the last token by token role, over the prompt set")
        st.altair_chart(token_bars(rdf.sort_values("role"), "role", "value", "attention mass"), width="stretch")
        st.markdown("**Token roles**\n\n" + "\n".join(f"- **{r}**: {ROLE_DEFINITIONS[r]}" for r in ROLES))
        st.download_button("Attention by role (CSV)", rdf.to_csv(index=False).encode(), "attention_roles.csv",
                           "text/csv")
        st.subheader(f"What feeds head {layer}.{head}")
        head_to_head_section(model, pairs, cache, layer, head, metric)
