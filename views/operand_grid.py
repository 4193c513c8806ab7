"""The operand grid (engine.techniques.operand_grid) drawn with Altair: A across, B down, one panel per quantity;
carries outlined, wrong answers crossed."""

from __future__ import annotations

import altair as alt
import pandas as pd

#: quantity -> (title, colour scheme, diverging around 0)
QUANTITIES = {
    "attn_a": ("END-row attention on A", "blues", False),
    "attn_b": ("END-row attention on B", "blues", False),
    "effect": ("path-patching value", "redblue", True),
    "direct": ("direct effect on the answer logit", "redblue", True),
    "act": ("neuron activation at END", "redblue", True),
}


#: the axes' titles: the operands, or (a grid folded onto the units digits, ``units_rows``) their units digits
AXES = {False: ("A", "B"), True: ("A's units digit", "B's units digit")}


def grid_panel(rows: list[dict], quantity: str, units: bool = False) -> alt.LayerChart:
    """One A x B heatmap of ``quantity``; cells whose column sum carries (or borrows) outlined in black, pairs the
    model answers wrong crossed (``units``: rows folded onto the units digits -- a cell outlined where the units
    column carries, crossed where fewer than half of its pairs are answered right)."""
    df = pd.DataFrame(rows)
    title, scheme, diverging = QUANTITIES[quantity]
    lim = float(df[quantity].abs().max() or 1.0)
    scale = (alt.Scale(scheme=scheme, domain=[-lim, lim], domainMid=0) if diverging
             else alt.Scale(scheme=scheme, domain=[0, max(lim, 1e-9)]))
    n = max(df["a"].nunique(), df["b"].nunique())
    side = max(180, min(420, 22 * n))
    x_title, y_title = AXES[units]
    base = alt.Chart(df).encode(x=alt.X("a:O", title=x_title), y=alt.Y("b:O", title=y_title))
    facts = [c for c in ("a", "b", "answer", "n", "right", "right_share", "carry") if c in df.columns]
    cells = base.mark_rect().encode(
        color=alt.Color(f"{quantity}:Q", title=None, scale=scale,
                        legend=alt.Legend(orient="bottom", direction="horizontal", gradientLength=side * 0.8)),
        stroke=alt.condition("datum.carry", alt.value("black"), alt.value("white")),
        strokeWidth=alt.condition("datum.carry", alt.value(1.5), alt.value(0.3)),
        tooltip=facts + [alt.Tooltip(f"{quantity}:Q", format=".4f")])
    wrong = base.transform_filter("!datum.right").mark_text(text="×", fontSize=12, color="#333333")
    return (cells + wrong).properties(title=title, width=side, height=side)


def grid_charts(rows: list[dict], units: bool = False) -> list[alt.LayerChart]:
    """The panels a component has: attention on A and B (heads), the path-patching value, the activation (neurons)."""
    keys = rows[0].keys() if rows else ()
    return [grid_panel(rows, q, units) for q in QUANTITIES if q in keys]


def grid_chart(rows: list[dict], units: bool = False) -> alt.ConcatChart:
    """:func:`grid_charts` two to a row in one chart, each panel with its own colour scale and legend."""
    return alt.concat(*grid_charts(rows, units), columns=2).resolve_scale(color="independent")
