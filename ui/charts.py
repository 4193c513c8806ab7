"""Altair chart builders shared by the pages (data in, chart out; no engine calls)."""

from __future__ import annotations

import altair as alt
import pandas as pd

HEAD_SELECTION = "cell"


def heatmap_frame(heads: list[list[float]], mlps: list[float]) -> pd.DataFrame:
    """The long table ``heatmap`` draws: one row per head, plus each layer's MLP as column "MLP"."""
    return pd.DataFrame([{"layer": layer, "head": h, "column": str(h), "value": v}
                         for layer, row in enumerate(heads) for h, v in enumerate(row)]
                        + [{"layer": layer, "head": -1, "column": "MLP", "value": v} for layer, v in enumerate(mlps)])


def heatmap(df: pd.DataFrame, metric: str) -> alt.Chart:
    """Layer x head heatmap with an MLP column; diverging colours centred at 0; click selects a cell.

    The colour range is set by the heads (MLP cells, often larger, saturate at the ends).

    ``df`` columns: layer, column (head number as text, or "MLP"), head (-1 for MLPs), value.
    """
    heads = df.loc[df["column"] != "MLP", "value"].abs()
    lim = float(heads.max() if len(heads) and heads.max() > 0 else df["value"].abs().max() or 1.0)
    sel = alt.selection_point(name=HEAD_SELECTION, fields=["layer", "head"], on="click", clear="dblclick")
    cols = [c for c in df["column"].unique() if c != "MLP"] + ["MLP"]
    return alt.Chart(df).mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=alt.X("column:N", sort=cols, title="head (and the layer's MLP)"),
        y=alt.Y("layer:O", sort="descending", title="layer"),
        color=alt.Color("value:Q", title=metric,
                        scale=alt.Scale(scheme="redblue", domain=[-lim, lim], domainMid=0, clamp=True)),
        opacity=alt.condition(sel, alt.value(1.0), alt.value(0.35)),
        tooltip=["layer", "column", alt.Tooltip("value:Q", format=".4f")],
    ).add_params(sel).properties(height=max(220, 26 * df["layer"].nunique()))


def token_bars(df: pd.DataFrame, x: str, y: str, title: str, fmt: str = ".3f") -> alt.Chart:
    """Bars in the order of the rows (e.g. tokens of a prompt)."""
    return alt.Chart(df).mark_bar().encode(
        x=alt.X(f"{x}:N", sort=None, title=None, axis=alt.Axis(labelAngle=-40)),
        y=alt.Y(f"{y}:Q", title=title),
        tooltip=[x, alt.Tooltip(f"{y}:Q", format=fmt)],
    ).properties(height=220)


def grouped_bars(df: pd.DataFrame, x: str, y: str, color: str, title: str) -> alt.Chart:
    return alt.Chart(df).mark_bar().encode(
        x=alt.X(f"{x}:N", sort=None, title=None, axis=alt.Axis(labelAngle=0)),
        xOffset=f"{color}:N",
        y=alt.Y(f"{y}:Q", title=title),
        color=alt.Color(f"{color}:N"),
        tooltip=[x, color, alt.Tooltip(f"{y}:Q", format=".4f")],
    ).properties(height=240)


def lines_with_band(df: pd.DataFrame, x: str, y: str, lo: str, hi: str, color: str, ytitle: str) -> alt.Chart:
    base = alt.Chart(df).encode(x=alt.X(f"{x}:O", title=x), color=alt.Color(f"{color}:N", title=None))
    band = base.mark_area(opacity=0.18).encode(y=alt.Y(f"{lo}:Q", title=ytitle), y2=f"{hi}:Q")
    line = base.mark_line(point=True).encode(y=f"{y}:Q", tooltip=[x, color, alt.Tooltip(f"{y}:Q", format=".3f")])
    return (band + line).properties(height=300)


def loss_curve(df: pd.DataFrame) -> alt.Chart:
    """Training loss per optimizer step (``df`` columns: step, loss)."""
    return alt.Chart(df).mark_line().encode(
        x=alt.X("step:Q", title="step"),
        y=alt.Y("loss:Q", title="answer-token loss", scale=alt.Scale(type="log")),
        tooltip=["step", alt.Tooltip("loss:Q", format=".4f")],
    ).properties(height=220)
