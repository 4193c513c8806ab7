"""Operand grid: one component (head, MLP or neuron) over every operand pair of one template."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from engine.prompts.pairs import PromptError
from engine.techniques.operand_grid import grid_template, grid_templates, operand_grid, parse_component
from ui import state
from ui.progress import run_with_progress
from ui.session import result_cache, setup_page
from views.operand_grid import grid_chart

model, spec = setup_page(
    "Operand grid",
    "One component over the operand grid: every (A, B) of the sidebar's operand range filled into one template, "
    "with the sidebar's counterfactual. A head shows its END-row attention on A and on B and its path-patching "
    "value per pair, an MLP its value, a neuron (LAYER.mlp.N) its activation at END too. Cells whose column sum "
    "carries (or borrows) are outlined; pairs the model answers wrong are crossed.")
cache = result_cache()
f = model.facts
sel = state.selected()
default = (f"{sel[0]}.mlp" if sel[1] == state.MLP else f"{sel[0]}.{sel[1]}") if sel else ""
c1, c2 = st.columns(2)
text = c1.text_input("Component", value=default, key=f"atlas_component_{default}",
                     placeholder="the top head of the grid", help="LAYER.HEAD (1.3), LAYER.mlp (6.mlp) or "
                     "LAYER.mlp.NEURON (6.mlp.120). A click on the Path patching heatmap picks it.")
try:
    first = grid_template(spec)
    ids = [t.id for t in grid_templates(spec)]
    template = c2.selectbox("Template", ids, index=ids.index(first.id), key="atlas_template")
    comp = parse_component(text, f.n_layers, f.n_heads, f.d_mlp) if text.strip() else None
except PromptError as e:
    st.error(f"{str(e)[:1].upper()}{str(e)[1:]}.")
    st.stop()
grid = run_with_progress("Computing the operand grid", "compute the operand grid",
                         lambda cb: operand_grid(model, spec, template=template,
                                                 neurons=[comp] if comp is not None and comp.kind == "neuron" else (),
                                                 cache=cache, progress=cb), key="atlas", stop=True)
comp = comp or grid.top_head()  # none typed: the grid's own strongest head
rows = grid.rows(comp)
right = sum(r["right"] for r in rows)
st.markdown(f"**{comp.kind} {comp.name}** on `{template}`: {len(rows)} operand pairs, the model answers {right} "
            f"right; path-patching metric `{grid.metric}`.")
st.altair_chart(grid_chart(rows), width="content")
st.download_button("Grid (CSV)", pd.DataFrame(rows).to_csv(index=False).encode(), f"grid_{comp.name}.csv",
                   "text/csv")
