"""The arithmetic-circuits lab: an ``st.navigation`` router over the pages in ``ui.nav.PAGES``.

The common set-up runs here once per run: the page config (wide layout) and the page list with
titles and icons; each page then draws the shared sidebar (model, prompt set, model facts, report)
and gets the model through ``ui.session.setup_page``.  The app state is mirrored into the address
bar (``ui.url_state``): a page's URL is a link that opens the same view in a fresh session.  Home is the
default page, at ``/``; ``/Home`` (``ui.nav.HOME_ALIAS``, a hidden page) sends the browser there.
"""

from __future__ import annotations

import streamlit as st

from ui import url_state
from ui.nav import HOME_ALIAS, PAGES, ROUTED

st.set_page_config(page_title="Arithmetic-circuits lab", page_icon="🧮", layout="wide")
# the default page is served at "/" but reserves its url_path, inferred from the file name ("Home") unless given
pages = [st.Page(p.script, title=p.title, icon=p.icon, url_path=p.url_path or "root", default=not p.url_path)
         for p in PAGES]
home = next(i for i, p in enumerate(PAGES) if not p.url_path)
alias = st.Page(PAGES[home].script, title=PAGES[home].title, url_path=HOME_ALIAS, visibility="hidden")
nav = st.navigation([*pages, alias], expanded=True)  # every page in the menu (past ten, Streamlit hides the rest)
if nav.url_path == HOME_ALIAS:  # /Home: Home at its own address, "/", with the link's parameters
    st.switch_page(pages[home], query_params={k: st.query_params.get_all(k) for k in st.query_params})
st.session_state[ROUTED] = True  # pages: page config done, st.page_link available
try:
    url_state.sync()  # a session's first run: the link -> the app state; then the app state -> the URL
    nav.run()
    url_state.to_url()  # what the page changed (a chart click); a page that stops writes it in st.stop
finally:
    st.session_state.pop(ROUTED, None)
