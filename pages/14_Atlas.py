"""Atlas: one component (head, MLP or neuron) over every operand pair of one template, and the heuristic neurons."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.cost import cost_of
from engine.findings.as_code import atlas_code
from engine.findings.notes import labels as note_labels
from engine.prompts.pairs import ANY_CARRY, CARRY_SETS, PromptError
from engine.prompts.promptsets import sample_words
from engine.techniques.heuristic_neurons import (
    TAG_R2,
    heuristic_neurons,
    heuristic_neurons_work,
    neuron_circuit,
    neuron_circuit_work,
)
from engine.techniques.operand_grid import (
    grid_template,
    grid_templates,
    operand_grid,
    operand_grid_work,
    parse_component,
    units_rows,
)
from ui import state, url_state
from ui.as_code import code_view
from ui.notes_panel import note_box
from ui.progress import compute_or_button
from ui.session import result_cache, setup_page
from views.operand_grid import grid_chart

model, spec = setup_page(
    "Atlas",
    "The arithmetic atlas. One component over the operand grid: every (A, B) of the prompt set's operands (the "
    "sidebar's 'Operands from' / 'to': 1 to 9 unless changed) filled into one template, with the sidebar's "
    "counterfactual, answer digit and carry. A head shows its END-row attention "
    "on A and on B, its path-patching value and its direct effect on the answer's logit (the head's output removed "
    "from the last residual stream only) per pair; an MLP its value and direct effect, a neuron (LAYER.mlp.N) its "
    "activation at END too. Cells whose column sum carries (or borrows) are outlined; pairs the model answers wrong "
    "are crossed.")
cache = result_cache()
f = model.facts
sel = state.selected()
default = (f"{sel[0]}.mlp" if sel[1] == state.MLP else f"{sel[0]}.{sel[1]}") if sel else ""
c1, c2 = st.columns(2)
text = c1.text_input("Component", value=default, key=f"atlas_component_{default}",
                     placeholder="the grid's top head", help="LAYER.HEAD (1.3), LAYER.mlp (6.mlp) or "
                     "LAYER.mlp.NEURON (6.mlp.120). A click on the Path patching heatmap picks it.")
try:
    first = grid_template(spec)
    ids = [t.id for t in grid_templates(spec)]
    url_state.check("atlas_template", ids)
    template = c2.selectbox("Template", ids, **url_state.bound("atlas_template", first.id))
    comp = parse_component(text, f.n_layers, f.n_heads, f.d_mlp) if text.strip() else None
except PromptError as e:
    st.error(f"{str(e)[:1].upper()}{str(e)[1:]}.")
    st.stop()
neurons = [comp] if comp is not None and comp.kind == "neuron" else []
code_view(atlas_code(model, spec, text.strip(), template))  # shown while the grid waits
grid = compute_or_button(lambda cb: operand_grid(model, spec, template=template, component=comp, neurons=neurons,
                                                 cache=cache, progress=cb),
                         lambda: cost_of(model, operand_grid_work(model, spec, template=template,
                                                               component=comp, neurons=neurons, cache=cache)),
                         model=model, stop=True, button="Compute the operand grid", key="atlas",
                         text="Computing the operand grid", failure="compute the operand grid",
                         note="The grid runs every operand pair of the template through the model: the answers, the "
                              "attention, the direct effects and path patching of the candidate heads.")
if grid.fallback:  # the direct effects' fast path did not reproduce this model: the textbook loop computed them
    st.info(grid.fallback, icon=":material/info:")
picked = comp is None
comp = comp or grid.top_head()  # none typed: the grid's strongest head among attribution patching's candidates
rows = grid.rows(comp)
right = sum(r["right"] for r in rows)
st.markdown(f"**{comp.kind} {comp.name}** on `{template}`: {len(rows)} operand pairs, the model answers {right} "
            f"right; path-patching metric `{grid.metric}`.")
st.caption("The grid is every operand pair of this one template"
           + (f" {CARRY_SETS[spec.carry]} (the sidebar's Carry / borrow)" if spec.carry != ANY_CARRY else "")
           + f", answered right or not; the sidebar's prompt set "
           f"({sample_words(spec)}) spans all its templates and keeps only the prompts the model answers right — so "
           f"the two counts differ. The other pages analyse that set.")
if picked:
    st.caption(f"None typed: of the {len(grid.candidates)} heads attribution patching (a first-order estimate) ranks "
               f"first over the grid, the one with the most negative exact path-patching mean. Every value shown is "
               f"exact; the estimate only chose which heads to compute.")
note_box(model, cache, comp.name, f"{comp.kind} {comp.name}")  # its note, kept per model: shown on every page
folded = False
if not spec.decimals and spec.operand_hi >= 10:  # two-digit operands: the units digits' grid
    folded = st.toggle("Fold onto the units digits", value=spec.operand_hi - spec.operand_lo + 1 > 20,
                       key="atlas_units", help="One cell per pair of units digits of A and B, the mean over every "
                                               "tens digit: where the units column carries, the sum's units digit "
                                               "comes with a carry into the tens.")
shown = units_rows(rows, grid.op) if folded else rows
if folded:
    sizes = sorted({r["n"] for r in shown})
    st.caption(f"Each cell: the mean over the {sizes[0]}" + (f"–{sizes[-1]}" if len(sizes) > 1 else "")
               + " pairs whose A and B end in these two digits (every tens digit of the range); outlined where the "
                 "units column carries into the tens (borrows from them); crossed where fewer than half of its pairs "
                 "are answered right (the tooltip gives the share).")
st.altair_chart(grid_chart(shown, folded), width="content")
st.download_button("Grid (CSV)", pd.DataFrame(shown).to_csv(index=False).encode(),
                   f"grid_{'units_' if folded else ''}{comp.name}.csv", "text/csv")

st.subheader("Heuristic neurons")
st.caption(f"The neurons of one MLP that react most to the operation (mean |activation on X_r − on X_c| at END over "
           f"the grid), each tagged with the heuristic that best predicts its activation over the grid — fitted on "
           f"half the pairs, R² on the other half; tagged at R² ≥ {TAG_R2} (Nikankin et al. 2025's bag of heuristics).")
c1, c2 = st.columns(2)
url_state.check("atlas_layer", (None, *range(f.n_layers)))
layer = c1.number_input("MLP layer (empty: the grid's strongest MLP)", 0, f.n_layers - 1, value=None,
                        **url_state.bound("atlas_layer"))
top = c2.number_input("Neurons", 1, 200, **url_state.bound("atlas_top"))
layer = None if layer is None else int(layer)
out = compute_or_button(lambda cb: heuristic_neurons(model, spec, layer=layer, top=int(top), template=template,
                                                     cache=cache, progress=cb),
                        lambda: cost_of(model, heuristic_neurons_work(model, spec, layer=layer, top=int(top),
                                                                   template=template, cache=cache)),
                        model=model, button="Tag the neurons", key="atlas_neurons", text="Tagging the neurons",
                        failure="tag the neurons")
if out is not None:
    tags, used = out
    tagged = [t for t in tags if t.tagged]
    st.markdown(f"MLP {used}: **{len(tagged)} of {len(tags)}** neurons tagged" + (
        " — " + ", ".join(f"{t.layer}.mlp.{t.neuron} {t.tag} (R² {t.r2:.2f})" for t in tagged[:6]) if tagged
        else f" (no heuristic predicts any of them held out at R² ≥ {TAG_R2})") + ". Type one as the component "
        f"above (e.g. `{(tagged or tags)[0].layer}.mlp.{(tagged or tags)[0].neuron}`) to see its grid.")
    notes = note_labels(model.facts.fingerprint, cache)  # a pinned neuron's note in its row (plain text)
    st.dataframe(pd.DataFrame([{**t.__dict__, "note": notes.get(f"{t.layer}.mlp.{t.neuron}", "")} for t in tags]),
                 hide_index=True, width="stretch")
    if tagged:
        c = compute_or_button(lambda cb: neuron_circuit(model, spec, tags, template=template, cache=cache),
                              lambda: cost_of(model, neuron_circuit_work(model, spec, tags, template=template,
                                                                      cache=cache)),
                              model=model, button="Check the tagged neurons as a circuit", key="atlas_circuit",
                              text="Checking the tagged neurons as a circuit", failure="check the tagged neurons")
        if c is not None:
            faith = (f"faithfulness {c.faithfulness.text()}" if c.measurable else
                     f"faithfulness not measurable here: the whole layer's neurons at their mean change m by only "
                     f"{c.layer_effect.text()} (m(M) − m(∅), its interval reaches 0), so "
                     f"f = {c.faithfulness.value:.2f} divides by about nothing")
            st.markdown(
                f"**The {len(c.neurons)} tagged neurons as a circuit** ({c.n_pairs} pairs answered right): "
                f"{faith} — the other neurons of MLP {c.layer} at their mean over the "
                f"counterfactuals at END, f = (m(C) − m(∅)) / (m(M) − m(∅)), m = answer logit − mean logit; "
                f"steering {c.steering.scaled(100).text('{:.0f}', ' %')} of {c.n_steer} pairs — the tagged neurons "
                f"set to their mean for another answer make the model predict that answer's first token.")
