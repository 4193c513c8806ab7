"""The dashboard's pages: script, title, icon and URL path (the router in app.py and the screenshots use it).

The core pages are listed here; a technique with a page of its own adds it through its registry entry."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from engine.registry import TECHNIQUES


@dataclass(frozen=True)
class PageDef:
    script: str    # relative to the repository root
    title: str     # shown in the sidebar and the browser tab
    icon: str      # Material icon (drawn with Streamlit's own font: no emoji font needed)
    url_path: str  # "" = the default page (Home)


PAGES = (
    PageDef("pages/0_Home.py", "Home", ":material/home:", ""),
    PageDef("pages/1_Story.py", "Story", ":material/auto_stories:", "Story"),
    PageDef("pages/2_Paper.py", "Paper", ":material/fact_check:", "Paper"),
    PageDef("pages/3_Prompt_lab.py", "Prompt lab", ":material/edit:", "Prompt_lab"),
    PageDef("pages/4_Patching_heatmap.py", "Path patching", ":material/grid_on:", "Patching_heatmap"),
    PageDef("pages/5_MLP_projections.py", "MLP projections", ":material/show_chart:", "MLP_projections"),
    PageDef("pages/6_Knockout.py", "Knockout", ":material/content_cut:", "Knockout"),
    PageDef("pages/7_Transfer.py", "Transfer", ":material/compare_arrows:", "Transfer"),
    PageDef("pages/8_Information_flow.py", "Information flow", ":material/account_tree:", "Information_flow"),
    PageDef("pages/9_Improve.py", "Improve", ":material/tune:", "Improve"),
    # a technique with a page of its own declares it in engine.registry (page_script, title, icon, page)
    *(PageDef(t.page_script, t.title, t.icon, t.page) for t in TECHNIQUES if t.page_script),
)


def page_def(url_path: str) -> PageDef:
    return next(p for p in PAGES if p.url_path == url_path)


ROUTED = "_routed"  # set by the router (app.py) while it runs a page


def page_link(script: str, label: str, icon: str | None = None, where=None) -> None:
    """``st.page_link`` to a page of the router; a page run on its own (no router: AppTest) names it instead."""
    where = where or st
    if st.session_state.get(ROUTED) is None:
        where.caption(f"{icon or ''} {label}".strip())
    else:
        where.page_link(script, label=label, icon=icon)
