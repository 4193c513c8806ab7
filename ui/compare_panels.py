"""The Compare page's second view: the paper's findings on A and on B, row by row (one engine call behind the
pages' gate: it asks first, with the cost of both reproductions)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ui.progress import compute_or_button


def findings_side_by_side(model_a, spec_a, pairs_a, model_b, spec_b, pairs_b, cache, a_name: str,
                          b_name: str) -> bool:
    """The paper's rows on A and on B (``engine.findings.compare.compare_findings``), each number with its interval
    and verdict, and whether the two verdicts agree; True when they are shown."""
    from engine.findings.compare import compare_findings, compare_findings_cost
    st.subheader("The paper's findings on A and on B")
    rows = compute_or_button(
        lambda cb: compare_findings(model_a, spec_a, model_b, spec_b, cache, progress=cb),
        lambda: compare_findings_cost(model_a, spec_a, pairs_a, model_b, spec_b, pairs_b, cache),
        model=model_a, ask=True, button="Check the paper's findings on A and B", key="cmp_paper",
        text="The paper's findings on A and B", failure="check the paper's findings on A and B",
        note="Each finding of the Paper page on A and on B (path patching, knockouts, attention, the MLPs, the "
             "circuits' faithfulness, the other formats, exponentiation, GSM8K): what is cached is reused.")
    if rows is None:
        return False
    same = sum(a.verdict == b.verdict for a, b in rows if "not computed" not in (a.verdict, b.verdict))
    both = sum("not computed" not in (a.verdict, b.verdict) for a, b in rows)
    st.markdown(f"**{same} of {both}** findings computed on both have the same verdict on A ({a_name}) and B "
                f"({b_name}).")
    st.caption("Each number is followed by its 95 % bootstrap interval over that run's own pairs; a verdict holds or "
               "fails only when the whole interval is on one side of the finding's criterion (the Paper page's "
               "rule). A and B's intervals are independent: a different verdict with overlapping intervals is not "
               "a difference the data settle.")
    st.table(pd.DataFrame([{"finding": a.figure, "claim": a.claim, "paper": a.paper,
                            "A": a.lab or "–", "A's verdict": a.verdict, "B": b.lab or "–", "B's verdict": b.verdict,
                            "same verdict": "–" if "not computed" in (a.verdict, b.verdict)
                            else "yes" if a.verdict == b.verdict else "no"} for a, b in rows]).set_index("finding"))
    return True
