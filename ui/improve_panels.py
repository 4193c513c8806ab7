"""Base vs tuned panels shared by the Improve and Story pages (one engine call each, errors as st.error)."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from ui.progress import USER_ERRORS  # FinetuneError is a ValueError


def comparison_rows(model, tuned, cache):
    """Base vs tuned accuracy per task (``engine.finetune.skill_demo.compare``), or None after an ``st.error``."""
    from engine.finetune.skill_demo import compare
    try:
        return compare(model, tuned, cache=cache)
    except USER_ERRORS as e:
        st.error(f"Cannot compare the models: {e}")
        return None


def comparison_table(rows) -> None:
    st.table(pd.DataFrame([{"task": x.task, "n": x.n, "base %": f"{100 * x.base:.1f}",
                            "tuned %": f"{100 * x.tuned:.1f}", "Δ (points)": f"{x.delta:+.1f}"} for x in rows])
             .set_index("task"))


def comparison_chart(rows) -> alt.Chart:
    """Base vs tuned accuracy per task, side by side, each bar labelled with its percentage."""
    from views.charts import PALETTE
    df = pd.DataFrame([{"task": x.task, "model": m, "accuracy": acc, "n": x.n}
                       for x in rows for m, acc in (("base", x.base), ("tuned", x.tuned))])
    base = alt.Chart(df).encode(
        y=alt.Y("task:N", title=None, axis=alt.Axis(labelLimit=0)), yOffset="model:N",
        x=alt.X("accuracy:Q", title="accuracy", scale=alt.Scale(domain=[0, 1.1]), axis=alt.Axis(format="%")),
        color=alt.Color("model:N", scale=alt.Scale(domain=["tuned", "base"], range=[PALETTE[0], PALETTE[1]]),
                        legend=alt.Legend(orient="bottom", title=None)),
        tooltip=["task", "model", "n", alt.Tooltip("accuracy:Q", format=".1%")])
    return (base.mark_bar() + base.mark_text(align="left", dx=4).encode(text=alt.Text("accuracy:Q", format=".1%"))
            ).properties(height=70 * df["task"].nunique())
