"""Intervene: patch, scale, zero, mean-ablate chosen components or add a number's direction on the typed prompt."""

from __future__ import annotations

import streamlit as st

from engine.findings.as_code import intervene_code
from engine.prompts.pairs import PromptError
from engine.techniques.intervene import Intervention, intervene, number_token, parse_targets
from engine.techniques.knockout import mean_activations
from engine.techniques.numbers.directions import number_direction
from engine.techniques.promptlab import check_typed_text, typed_pair
from ui.as_code import code_view
from ui.session import (
    analysed_pairs,
    current_prompt,
    prompt_caption,
    result_cache,
    setup_page,
    words_used,
)
from views.charts import display_token, fmt_prob, signed_change
from views.intervene import distribution_frame, live_spec

#: the directions of a number, by the name the page gives them (a set's: the command's --direction, a space for "-")
DIRECTIONS = {"unembedding": "its unembedding", "class mean": "its class mean (the set)",
              "probe": "its probe (the set)"}
ACTIONS = {"patch from another prompt": "patch", "scale": "scale", "zero": "zero",
           "mean (the knockouts' mean ablation)": "mean", "add a number's direction": "add"}

model, spec = setup_page(
    "Intervene",
    "Change chosen components of the typed prompt's forward pass and see the next-token distribution before and "
    "after: set them to their value on another prompt (patch), scale them, zero them, replace them by their mean "
    "over the counterfactual prompts, or add a number's direction at a chosen strength: its unembedding, or its "
    "class mean over the sidebar set's prompts that answer it (the Numbers page's causal-check direction), or its "
    "logistic probe's direction (the Numbers page's probe of the answer, fitted on the set).")
prompt_caption()
words_used("counterfactual", "END", "probability", "knockout", "path patching")


@st.fragment  # a control's change reruns only this panel (one forward pass), not the sidebar and the page around it
def panel() -> None:
    """The controls, the one engine call and its chart: the live part of the page."""
    f = model.facts
    L, H = f.n_layers, f.n_heads
    opts = ([f"{layer}.{h}" for layer in range(L) for h in range(H)] + [f"{layer}.mlp" for layer in range(L)]
            + [f"{layer}.resid" for layer in range(L)])
    c1, c2 = st.columns([3, 2])
    chosen = c1.multiselect("Components (layer.head, layer.mlp, layer.resid: the residual stream leaving the layer)",
                            opts, default=[opts[0]], key="iv_components")
    action = ACTIONS[c2.radio("Action", list(ACTIONS), key="iv_action", horizontal=False)]
    c3, c4, c5 = st.columns(3)
    positions = c3.radio("Where", ["end", "all"], key="iv_positions", format_func=lambda p: {
        "end": "the last token only (END)", "all": "every position"}[p], disabled=action == "mean",
                         help="Mean ablation is the knockouts': every position.")
    freeze = c4.checkbox("Hold the other heads fixed", key="iv_freeze",
                         help="Every other head keeps its output on the typed prompt (path patching's frozen heads): "
                              "patching one head at END from the counterfactual then gives path patching's number for "
                              "that head.")
    text = current_prompt()
    source_text, factor, number, strength, direction_layer, kind = None, 0.0, None, 0.0, None, "unembedding"
    if action == "patch":
        source_text = c5.text_input("Take the values from (empty: the typed prompt's counterfactual)", key="iv_source")
    elif action == "scale":
        factor = c5.slider("Factor", -3.0, 3.0, 0.0, 0.1, key="iv_factor")
    elif action == "add":
        kind = c5.radio("Direction", list(DIRECTIONS), key="iv_direction", horizontal=True,
                        format_func=DIRECTIONS.get,
                        help="Its unembedding: the column of W_U of the number's first answer token. Its class mean: "
                             "the mean residual stream at END, leaving the chosen layer, of the sidebar set's prompts "
                             "that answer the number, minus the mean over every prompt of the set (made unit): the "
                             "direction the Numbers page's causal check moves along. Its probe: the Numbers page's "
                             "logistic probe of the answer at that layer, fitted on the set's prompts, and the "
                             "direction that raises its logit of the number fastest.")
        if kind != "unembedding":
            first = next((int(o.split(".")[0]) for o in chosen if not o.split(".")[1].isdigit()), 0) if chosen else 0
            direction_layer = int(c5.selectbox("Its layer (the residual stream leaving it)", list(range(L)),
                                               index=min(first, L - 1), key="iv_direction_layer"))
        number = int(c5.number_input("Number", 0, 10_000, 7, key="iv_number"))
        strength = c5.slider("Strength (1: as long as the component's own output at END)", -5.0, 5.0, 1.0, 0.1,
                             key="iv_strength")

    if not chosen:
        st.error("Choose at least one component above.")
        return
    try:
        targets = parse_targets(",".join(chosen), L, H, f.d_mlp)
        typed = check_typed_text(model.tokenizer, text)
        source = ()
        if action == "patch":
            source = tuple(check_typed_text(model.tokenizer, source_text).ids if source_text
                           else typed_pair(model.tokenizer, text).cf_ids)
        token, vector = None, ()
        if action == "add" and direction_layer is not None:
            set_pairs, _ = analysed_pairs(model, spec, result_cache())
            d, n_class = number_direction(model, set_pairs, direction_layer, number, kind.replace(" ", "-"))
            vector = tuple(float(v) for v in d)
        elif action == "add":
            token = number_token(model.tokenizer, text, number)
        iv = Intervention(action, targets, "all" if action == "mean" else positions, factor, strength, source, token,
                          freeze, vector).check()
    except (PromptError, ValueError) as e:
        st.error(f"Cannot intervene: {e}.")
        return
    means = None
    if action == "mean":
        pairs, _ = analysed_pairs(model, spec, result_cache())
        means = mean_activations(model, pairs)
    watch = typed.answer.answer_id if typed.answer is not None else None
    res = intervene(model, typed.ids, iv, watch=watch, means=means, k=5)  # the one engine call

    if res.watched is not None:
        change = signed_change(res.after.watched_prob - res.before.watched_prob)
        m1, m2 = st.columns(2)
        m1.metric(f"P(answer `{display_token(res.watched)}`)", fmt_prob(res.after.watched_prob), change,
                  delta_color="normal" if change else "off")
        m2.metric("Answer logit", f"{res.after.watched_logit:.3f}",
                  f"{res.after.watched_logit - res.before.watched_logit:+.3f}", delta_color="off")
    st.vega_lite_chart(distribution_frame(res.before.top, res.after.top), live_spec(), width="stretch")
    if vector and kind == "class mean":
        st.caption(f"Direction: {number}'s class mean at END leaving layer {direction_layer}, over the {n_class} of "
                   f"the set's {len(set_pairs)} prompts that answer {number}, minus the mean of all {len(set_pairs)}.")
    elif vector:
        st.caption(f"Direction: the logistic probe of the answer at END leaving layer {direction_layer}, fitted on the "
                   f"set's prompts whose answer it has twice or more ({n_class} of {len(set_pairs)} answer {number}): "
                   f"the way that raises its logit of {number} against the others' mean fastest.")
    st.caption(f"{res.forward_passes} forward pass(es) for this view (the typed prompt's and the other prompt's own "
               f"passes are kept while they do not change). Exact: the model's own softmax at END, no estimate.")

    code_view(intervene_code(model, spec, text, ",".join(t.name for t in targets), action, positions, factor, number,
                             strength, source_text, freeze, direction_layer, kind.replace(" ", "-")))


panel()
