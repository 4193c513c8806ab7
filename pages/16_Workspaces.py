"""Workspaces: save the current view by name, reopen or delete one, export or import it as one JSON file."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from cache import CacheError
from engine.findings.as_code import workspaces_code
from engine.findings.workspace import WorkspaceError, delete, read_file, saved
from ui.as_code import code_view
from ui.session import result_cache, setup_page
from ui.workspaces import REOPENED, current, reopen, save_box

model, spec = setup_page(
    "Workspaces",
    "A workspace is the whole view -- the model, the prompt set, a written template, the counterfactual kind, the "
    "typed prompt, the selected head, the knockout set, each page's choices -- and the model's pins and notes, "
    "saved under a name. Reopen it here, or hand it to a colleague as one file: their lab opens the same view.")
if st.session_state.get(REOPENED):
    st.success(st.session_state.pop(REOPENED))
cache = result_cache()
if cache is None:
    st.error("Workspaces are kept in the result cache, which is off here: nothing can be saved.")
    st.stop()

st.subheader("Save")
save_box(model, cache)

st.subheader("Saved workspaces")
try:
    kept = saved(cache)
except CacheError as e:
    st.error(f"Cannot read the saved workspaces: {e}")
    kept = []
if not kept:
    st.info("No workspace saved yet: name the current view above and press Save.")
else:
    st.dataframe(pd.DataFrame([{"name": w.name, "model": w.model_spec, "saved": w.saved_at, "pins": len(w.pins),
                                "view": " ".join(f"{k}={v}" for k, v in w.state.items())} for w in kept]),
                 hide_index=True, width="stretch")
    names = [w.name for w in kept]
    c1, c2, c3, c4 = st.columns([3, 1, 1, 1], vertical_alignment="bottom")
    pick = c1.selectbox("Workspace", names, key="workspace_pick")
    ws = kept[names.index(pick)]
    if c2.button("Reopen", key="workspace_reopen", width="stretch"):
        try:
            reopen(ws, model, cache, "Reopened")
            st.rerun()
        except (WorkspaceError, CacheError) as e:
            st.error(f"Cannot reopen '{pick}': {e}.")
    if c3.button("Delete", key="workspace_delete", width="stretch"):
        try:
            delete(pick, cache)
            st.rerun()
        except CacheError as e:
            st.error(f"Cannot delete '{pick}': {e}.")
    c4.download_button("Export", ws.dumps().encode(), f"{pick}.workspace.json", "application/json",
                       key="workspace_export", width="stretch")
code_view(workspaces_code())

st.subheader("Open a workspace file")
st.download_button("Export the current view", current("current view", model, cache).dumps().encode(),
                   "current.workspace.json", "application/json", key="workspace_export_current")
up = st.file_uploader("A workspace file (.json) exported by this lab", type=["json"], key="workspace_file")
if up is not None:
    try:
        ws = read_file(up.getvalue())
        reopen(ws, model, cache, "Opened the file's")
        st.rerun()
    except (WorkspaceError, CacheError) as e:
        st.error(f"Cannot open {up.name}: {e}.")
