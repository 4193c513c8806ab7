"""The pin-and-note box beside a selected component (Path patching, the Atlas): pin it with a note, change the note,
unpin it.

Notes are plain text (``engine.findings.notes``): shown with ``st.text`` / in tooltips, never as Markdown or HTML."""

from __future__ import annotations

import streamlit as st

from cache import MAX_NOTE_CHARS, CacheError, NoteError


def noted(df, model, cache):
    """A heatmap's frame (``views.charts.heatmap_frame``) with ``model``'s pins: each pinned cell outlined, its note
    in the tooltip (``views.charts.with_notes``) -- on every heatmap of a model's heads, as on Path patching's."""
    from engine.findings.notes import labels
    from views.charts import with_notes
    return with_notes(df, labels(model.facts.fingerprint, cache))


def note_box(model, cache, component: str, title: str) -> None:
    """Pin / note / unpin ``component`` (``1.3``, ``1.mlp``) of ``model`` in ``cache``; ``title``: the page's name."""
    from engine.findings.notes import pin, pins, unpin
    if cache is None:
        st.caption("Pins and notes are kept in the result cache, which is off: no pins here.")
        return
    try:
        kept = {p.component: p for p in pins(model, cache)}
    except CacheError as e:
        st.error(f"Cannot read the pins from the cache: {e}")
        return
    mine = kept.get(component)
    with st.container(border=True):
        if mine is not None:
            st.markdown(f"**Pinned: {title}.** Your note:")
            st.text(mine.note or "(no note)")  # plain text: never Markdown or HTML
        note = st.text_area(f"Note on {title} (plain text, at most {MAX_NOTE_CHARS:,} characters)",
                            value=mine.note if mine else "", key=f"note_{component}", height=80,
                            help="Kept for this model (by its weights) in the result cache; shown on the Path "
                                 "patching heatmap (the cell outlined, the note in its tooltip), under the node on "
                                 "the Circuit diagram, on the Atlas, in the report and the circuit JSON.")
        c1, c2 = st.columns(2)
        if c1.button("Pin with this note" if mine is None else "Save the note", key=f"pin_{component}"):
            try:
                pin(model, component, note, cache)
                st.rerun()
            except (NoteError, CacheError) as e:
                st.error(f"Cannot pin {title}: {e}")
        if mine is not None and c2.button("Unpin", key=f"unpin_{component}"):
            try:
                unpin(model, component, cache)
                st.rerun()
            except (NoteError, CacheError) as e:
                st.error(f"Cannot unpin {title}: {e}")
