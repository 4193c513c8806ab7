"""Workspaces on the dashboard: the current view saved by name, reopened, deleted, exported and imported as a file.

The view is the app state as the link holds it (:func:`ui.url_state.url_params`); reopening one empties the
session and sets the address bar to the workspace's link, so the next run reads it as a fresh session reads a
link (``url_state.sync``).  The engine side (the file format, its checks, the model found by fingerprint or path,
the pins imported without replacing a kept note) is :mod:`engine.findings.workspace`."""

from __future__ import annotations

import streamlit as st

from cache import CacheError, NoteError
from ui import url_state

REOPENED = "workspace_reopened"  # the message shown after a reopen (set after the session was emptied)


def current(name: str, model, cache):
    """The current view as a workspace called ``name``."""
    from engine.findings.workspace import make
    return make(name, model.facts.spec, model.facts.fingerprint, url_state.url_params(), cache)


def reopen(ws, model, cache, how: str) -> None:
    """Open ``ws`` (found by the loaded model's fingerprint or by its path; WorkspaceError otherwise, nothing
    changed): its pins added to the store, then the session emptied and the link set to its view."""
    from engine.findings.workspace import import_pins, model_of
    spec = model_of(ws, model.facts.spec, model.facts.fingerprint)
    added, kept = import_pins(ws, cache)
    params = {k: v for k, v in ws.state.items() if k in url_state.KEYS or k in url_state.CHOICE}
    params.pop(url_state.MODEL, None)
    if spec != "organism":
        params[url_state.MODEL] = spec
    for key in list(st.session_state.keys()):  # a fresh session's state ...
        del st.session_state[key]
    st.query_params.from_dict(params)  # ... reading the workspace's link, as a fresh session reads one
    st.session_state[url_state.READ] = True
    url_state.from_url()
    pins = f"; {added} pin(s) added" + (f", {kept} already kept left as they were" if kept else "") if ws.pins else ""
    st.session_state[REOPENED] = f"{how} workspace '{ws.name}' (model {spec}){pins}. Every page shows its view."


def save_box(model, cache) -> None:
    """Save the current view under a name."""
    from engine.findings.workspace import save
    c1, c2 = st.columns([3, 1], vertical_alignment="bottom")
    name = c1.text_input("Save the current view as", key="workspace_name", max_chars=80,
                         placeholder="e.g. SmolLM2 operand A heads")
    if c2.button("Save", key="workspace_save", width="stretch"):
        try:
            save(current(name, model, cache), cache)
            st.session_state["workspace_pick"] = name.strip()  # the list's choice (Reopen, Export): the one just saved
            st.success(f"Saved as '{name.strip()}'.")
        except (NoteError, CacheError) as e:
            st.error(f"Cannot save the workspace: {e}.")
