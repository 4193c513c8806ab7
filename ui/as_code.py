"""Copy as code: a page's view as the CLI command and the notebook lines that reproduce its numbers, in one
expander (the snippets are written by ``engine.findings.as_code``)."""

from __future__ import annotations

import streamlit as st

from engine.findings.as_code import Snippet


def code_view(snippet: Snippet) -> None:
    """**This view as code**: the ``python -m engine`` line(s) (or why there is none), the notebook lines, and what
    they reproduce."""
    with st.expander("This view as code"):
        if snippet.note:
            st.caption(snippet.note)
        if snippet.cli is not None:
            st.code(snippet.cli, language="bash")
        st.code(snippet.py, language="python")
