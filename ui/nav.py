"""The dashboard's pages: script, title, icon and URL path (the router in app.py and the screenshots use it),
in menu order; and which page shows each technique (the engine names techniques by their registry name and
knows no page)."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st


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
    PageDef("pages/4_Path_patching.py", "Path patching", ":material/grid_on:", "Path_patching"),
    PageDef("pages/5_MLP_projections.py", "MLP projections", ":material/show_chart:", "MLP_projections"),
    PageDef("pages/6_Knockout.py", "Knockout", ":material/content_cut:", "Knockout"),
    PageDef("pages/7_Transfer.py", "Transfer", ":material/compare_arrows:", "Transfer"),
    PageDef("pages/8_Position_patching.py", "Position patching", ":material/account_tree:", "Position_patching"),
    PageDef("pages/9_Improve.py", "Improve", ":material/tune:", "Improve"),
    PageDef("pages/10_Numbers.py", "Numbers", ":material/pin:", "Numbers"),
    PageDef("pages/11_Faithfulness.py", "Faithfulness", ":material/verified:", "Faithfulness"),
    PageDef("pages/12_Circuit.py", "Circuit", ":material/hub:", "Circuit"),
    PageDef("pages/13_Templates.py", "Your templates", ":material/edit_note:", "Templates"),
    PageDef("pages/14_Atlas.py", "Atlas", ":material/grid_view:", "Atlas"),
    PageDef("pages/15_Intervene.py", "Intervene", ":material/science:", "Intervene"),
    PageDef("pages/16_Workspaces.py", "Workspaces", ":material/bookmarks:", "Workspaces"),
    PageDef("pages/17_Compare.py", "Compare", ":material/difference:", "Compare"),
)

#: a second address of Home (the default page, at ``/``): the router sends ``/Home`` there, the link kept
HOME_ALIAS = "Home"

#: registry name (``engine.registry``; ``finetune``: the CLI's fine-tuning) -> URL path of the page that shows it
PAGE_OF: dict[str, str] = {
    "path-patching": "Path_patching", "attention": "Path_patching", "attribution": "Path_patching",
    "stability": "Path_patching", "carries": "Path_patching",
    "mlp-projections": "MLP_projections", "logit-lens": "MLP_projections",
    "knockout": "Knockout", "knockout-curve": "Knockout", "transfer": "Transfer",
    "faithfulness": "Faithfulness", "edge-scores": "Faithfulness", "circuit": "Circuit", "operand-grid": "Atlas",
    "heuristic-neurons": "Atlas", "helix-patch": "Numbers",
    "position-patching": "Position_patching", "numbers": "Numbers", "finetune": "Improve",
    "intervene": "Intervene",
}


def page_def(url_path: str) -> PageDef:
    return next(p for p in PAGES if p.url_path == url_path)


def page_of(technique: str) -> PageDef:
    """The page that shows the technique registered as ``technique``."""
    return page_def(PAGE_OF[technique])


def link_to(technique: str, label: str | None = None, where=None) -> None:
    """A link to the page that shows ``technique`` ("go to" hint), labelled with the page's title by default."""
    p = page_of(technique)
    page_link(p.script, label or p.title, p.icon, where)


ROUTED = "_routed"  # set by the router (app.py) while it runs a page


def page_link(script: str, label: str, icon: str | None = None, where=None) -> None:
    """``st.page_link`` to a page of the router; a page run on its own (no router: AppTest) names it instead."""
    where = where or st
    if st.session_state.get(ROUTED) is None:
        where.caption(f"{icon or ''} {label}".strip())
    else:
        where.page_link(script, label=label, icon=icon)
