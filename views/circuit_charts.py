"""Altair charts of the views beyond path patching (data in, chart out; no engine calls)."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

from engine.numerics.intervals import Interval
from engine.techniques.faithfulness import FAITHFUL, point_at, smallest_faithful
from views.charts import HEAD_SELECTION, ROW_PX, layer_axis, stretched


def exact_vs_estimate(df: pd.DataFrame, exact: str, estimate: str, metric: str) -> alt.Chart:
    """One point per sender: exact effect (x) vs its attribution estimate (y), with the y = x line.

    ``df`` columns: name, component, layer, head, ``exact``, ``estimate``.  Clicking a head's point
    selects it like a heatmap cell (selection ``HEAD_SELECTION`` on layer and head)."""
    lo = float(min(df[exact].min(), df[estimate].min(), 0.0))
    hi = float(max(df[exact].max(), df[estimate].max(), 0.0))
    sel = alt.selection_point(name=HEAD_SELECTION, fields=["layer", "head"], on="click", clear="dblclick")
    line = alt.Chart(pd.DataFrame({"x": [lo, hi], "y": [lo, hi]})).mark_line(
        strokeDash=[4, 4], color="#888").encode(x="x:Q", y="y:Q")
    points = alt.Chart(df).mark_point(filled=True, size=70).encode(
        x=alt.X(f"{exact}:Q", title=f"exact ({metric})", scale=alt.Scale(domain=[lo, hi])),
        y=alt.Y(f"{estimate}:Q", title=f"attribution estimate ({metric})", scale=alt.Scale(domain=[lo, hi])),
        color=alt.Color("component:N", title=None, scale=alt.Scale(domain=["head", "mlp"],
                                                                    range=["#0072B2", "#E69F00"])),
        shape=alt.Shape("component:N", title=None),
        tooltip=["name", alt.Tooltip(f"{exact}:Q", format=".4f"), alt.Tooltip(f"{estimate}:Q", format=".4f")],
        opacity=alt.condition(sel, alt.value(1.0), alt.value(0.4)),
    ).add_params(sel)
    return (line + points).properties(height=380)


def position_heatmap(df: pd.DataFrame, metric: str) -> alt.Chart:
    """Layer x position heatmap (positions left to right ending at END), token labels on the x axis.

    ``df`` columns: layer, rel (0 = END), token, value."""
    df = df.assign(position=[t if t.startswith("END") else (f"{t} ({-r})" if r else f"{t} (last)")
                             for t, r in zip(df["token"], df["rel"])])
    order = [p for _, p in sorted({(-r, p) for r, p in zip(df["rel"], df["position"])})]
    lim = float(df["value"].abs().max() or 1.0)
    return stretched(alt.Chart(df).mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=alt.X("position:N", sort=order, title="position (token, and how many positions before the last one)",
                axis=alt.Axis(labelAngle=-45, labelLimit=0, labelOverlap=False)),
        y=alt.Y("layer:O", sort="descending", title="layer", axis=alt.Axis(labelOverlap=False)),
        color=alt.Color("value:Q", title=metric,
                        scale=alt.Scale(scheme="redblue", domain=[-lim, lim], domainMid=0, clamp=True)),
        tooltip=["layer", "token", alt.Tooltip("rel:Q", title="positions before the last one"),
                 alt.Tooltip("value:Q", format=".4f")],
    ).properties(height=alt.Step(ROW_PX)))


def lens_lines(df: pd.DataFrame) -> alt.Chart:
    """Answer probability (left) and median rank (right, log scale) per layer; layer -1 = embedding.

    ``df`` columns: layer, mean_prob, median_rank, top1."""
    base = alt.Chart(df).encode(x=layer_axis("after layer (-1 = the embedding)"))
    # (a line's own colour does not reach its points: each point mark is given it)
    prob = base.mark_line(point=alt.OverlayMarkDef(color="#D55E00"), color="#D55E00", strokeWidth=3).encode(
        y=alt.Y("mean_prob:Q", title="mean P(answer), solid", scale=alt.Scale(domain=[0, 1]),
                axis=alt.Axis(titleColor="#D55E00")),
        tooltip=["layer", alt.Tooltip("mean_prob:Q", format=".3f"), alt.Tooltip("top1:Q", format=".0%"),
                 alt.Tooltip("median_rank:Q", format=".0f")])
    top = float(df["median_rank"].max()) if len(df) else 1.0
    decades = [10 ** k for k in range(int(math.ceil(math.log10(max(top, 1.0)))) + 1)]  # 1, 10, 100 ... (no 2, 3, 20)
    rank = base.mark_line(point=alt.OverlayMarkDef(color="#0072B2"), color="#0072B2", strokeDash=[5, 3]).encode(
        y=alt.Y("median_rank:Q", title="median rank of the answer, dashed (log scale)", scale=alt.Scale(type="log"),
                axis=alt.Axis(titleColor="#0072B2", values=decades, format=",d")))
    return stretched(alt.layer(prob, rank).resolve_scale(y="independent").properties(height=280))


TOP_K_SERIES, RANDOM_SERIES = "top-k key heads (by effect)", "k random heads (mean ± sd)"
RANDOM_MEAN_SERIES = "k random heads (mean of draws)"


def knockout_curve_chart(cdf: pd.DataFrame) -> alt.Chart:
    """Fig. 3: accuracy after knocking out the top-k heads (the main result, strongest colour) vs k random
    heads; accuracy in percent.  ``cdf`` columns: k, top_accuracy, random_mean, random_std; with top_low, top_high,
    random_low, random_high (95 % bootstrap intervals over the pairs) the bands are those intervals, else the top
    line has none and the random band is ± sd over the draws."""
    from views.charts import lines_with_band
    if "top_low" in cdf:
        long = pd.concat([
            pd.DataFrame({"k": cdf.k, "series": TOP_K_SERIES, "acc": cdf.top_accuracy, "lo": cdf.top_low,
                          "hi": cdf.top_high}),
            pd.DataFrame({"k": cdf.k, "series": RANDOM_MEAN_SERIES, "acc": cdf.random_mean, "lo": cdf.random_low,
                          "hi": cdf.random_high})])
    else:
        long = pd.concat([
            pd.DataFrame({"k": cdf.k, "series": TOP_K_SERIES, "acc": cdf.top_accuracy, "lo": cdf.top_accuracy,
                          "hi": cdf.top_accuracy}),
            pd.DataFrame({"k": cdf.k, "series": RANDOM_SERIES, "acc": cdf.random_mean,
                          "lo": cdf.random_mean - cdf.random_std, "hi": cdf.random_mean + cdf.random_std}),
        ])
    return stretched(lines_with_band(long, "k", "acc", "lo", "hi", "series", "first-token accuracy", main=TOP_K_SERIES,
                                     yfmt=".1%").encode(
        y=alt.Y("acc:Q", scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format="%"))))


FAITH_SERIES = {"exact": "exact path patching", "atp": "attribution patching (AtP)",
                "random": "random (one order per pair)"}


def faithfulness_chart(fdf: pd.DataFrame, metric_title: str, *, series: dict[str, str] = FAITH_SERIES,
                       xtitle: str = "components kept (share of heads and MLPs)") -> alt.Chart:
    """MIB's faithfulness curves: f(x) of each ranking's circuits (the exact ranking strongest) over the circuit
    sizes, each with its 95 % bootstrap band; f = 1 is the whole model, 0 nothing.  ``fdf`` columns: ranking,
    size, f, low, high (one metric); ``series``: each ranking's name (edge circuits: their rankings')."""
    from views.charts import lines_with_band
    long = fdf.assign(series=fdf.ranking.map(series).fillna(fdf.ranking),
                      kept=[f"{100 * s:g} %" for s in fdf["size"]])
    chart = lines_with_band(long, "kept", "f", "low", "high", "series", f"faithfulness f ({metric_title})",
                            main=series.get("exact", FAITH_SERIES["exact"]), yfmt=".2f",
                            xsort=list(dict.fromkeys(long.kept)), xtitle=xtitle)
    one = alt.Chart(pd.DataFrame({"f": [1.0]})).mark_rule(strokeDash=[4, 4], color="#888").encode(y="f:Q")
    return stretched(chart + one)


def resolutions_frame(tables: dict[str, tuple[object | None, dict[str, str]]], metric: str, share: float = 0.05,
                      level: float = FAITHFUL) -> pd.DataFrame:
    """One row per resolution and ranking of the faithfulness tables ``tables`` ({resolution label: (FaithTable or
    None: not computed, its rankings' names)}): f of the top ``share`` with its interval, the smallest share whose
    f reaches ``level``, CPR and CPR minus random's."""
    rows = []
    for label, (table, series) in tables.items():
        if table is None:
            rows.append({"resolution": label, "ranking": "—", "f, top 5 %": "not computed yet",
                         f"smallest circuit with f ≥ {level:g}": "—", "CPR": "—", "CPR − random": "—"})
            continue
        for s in (s for s in table.scores if s.metric == metric):
            at = point_at(table.points, s.ranking, metric, share)
            small = smallest_faithful(table.points, s.ranking, metric, level)
            rows.append({"resolution": label, "ranking": series.get(s.ranking, s.ranking),
                         "f, top 5 %": "—" if at is None else Interval(at.f, at.low, at.high).text(),
                         f"smallest circuit with f ≥ {level:g}": "none below the whole model" if small is None else
                         f"{small.size:.1%} ({small.k:,} units): {small.f:.2f}",
                         "CPR": s.cpr_interval.text(),
                         "CPR − random": "—" if s.ranking == "random" else s.gap_interval.text("{:+.2f}")})
    return pd.DataFrame(rows)


def stability_chart(sdf: pd.DataFrame, k: int) -> alt.Chart:
    """Layer x head grid of one group: the share of resampled prompt sets whose top-k holds each head (0 .. 1),
    the group's own top-k outlined.  ``sdf`` columns: layer, head, in_top, rank, value."""
    base = alt.Chart(sdf.assign(top=sdf["rank"] <= k)).encode(
        x=alt.X("head:O", title="head", axis=alt.Axis(labelOverlap=False)),
        y=alt.Y("layer:O", title="layer", sort="descending", axis=alt.Axis(labelOverlap=False)))
    cells = base.mark_rect().encode(
        color=alt.Color("in_top:Q", title=f"in top-{k}", scale=alt.Scale(domain=[0, 1], scheme="blues")),
        tooltip=["layer", "head", alt.Tooltip("in_top:Q", format=".0%", title=f"in top-{k} of resamples"),
                 alt.Tooltip("rank:Q", title="rank (all of the group's pairs)"), alt.Tooltip("value:Q", format=".3f")])
    outline = base.transform_filter(alt.datum.top).mark_rect(fill=None, stroke="#d55e00", strokeWidth=2)
    return stretched((cells + outline).properties(height=alt.Step(ROW_PX)))


def carries_chart(cdf: pd.DataFrame, metric: str) -> alt.Chart:
    """What each key head carries: per head, its mean path-patching value under each counterfactual kind (bars side
    by side) with the 95 % interval (a rule).  ``cdf`` columns: layer, head, kind, value, low, high."""
    df = cdf.assign(name=[f"{a}.{b}" for a, b in zip(cdf["layer"], cdf["head"])])
    order = list(dict.fromkeys(df.name))
    kinds = list(dict.fromkeys(df.kind))
    color = alt.Color("kind:N", title="X_c changes", sort=kinds, legend=alt.Legend(orient="bottom"))
    base = alt.Chart(df).encode(x=alt.X("name:N", sort=order, title="key head (layer.head)",
                                        axis=alt.Axis(labelAngle=0, labelOverlap=False)),
                                xOffset=alt.XOffset("kind:N", sort=kinds), color=color)
    bars = base.mark_bar().encode(
        y=alt.Y("value:Q", title=f"mean {metric}"),
        tooltip=["name", "kind", alt.Tooltip("value:Q", format=".4f"), alt.Tooltip("low:Q", format=".4f"),
                 alt.Tooltip("high:Q", format=".4f"), "n"])
    # black, as the page says (the base's colour encoding would otherwise paint each rule its bar's colour)
    rules = base.mark_rule(strokeWidth=1.5).encode(y="low:Q", y2="high:Q", color=alt.value("black"))
    return stretched((bars + rules).properties(height=300))


def carries_heatmap(cdf: pd.DataFrame, metric: str) -> alt.FacetChart:
    """What every head carries: one layer x head heatmap per counterfactual kind (the kind above it), on one
    diverging scale centred at 0 -- the most negative cell of a head is the kind it carries.  A cell whose 95 %
    interval excludes 0 is outlined in black; the interval and the pairs are in its tooltip.  ``cdf`` columns:
    layer, head, kind, n, value, low, high."""
    kinds = list(dict.fromkeys(cdf.kind))
    lim = float(cdf["value"].abs().max()) if len(cdf) and cdf["value"].abs().max() > 0 else 1.0
    df = cdf.assign(name=[f"{a}.{b}" for a, b in zip(cdf["layer"], cdf["head"])],
                    settled=(cdf["high"] < 0) | (cdf["low"] > 0))
    n_heads = int(df["head"].max()) + 1 if len(df) else 1
    settled = alt.datum.settled
    return alt.Chart(df).mark_rect().encode(
        x=alt.X("head:O", title="head", axis=alt.Axis(labelAngle=0, labelOverlap=False)),
        y=alt.Y("layer:O", sort="descending", title="layer", axis=alt.Axis(labelOverlap=False)),
        color=alt.Color("value:Q", title=f"mean {metric}",
                        scale=alt.Scale(scheme="redblue", domain=[-lim, lim], domainMid=0, clamp=True)),
        stroke=alt.condition(settled, alt.value("black"), alt.value("white")),
        strokeWidth=alt.condition(settled, alt.value(1.5), alt.value(0.5)),
        tooltip=[alt.Tooltip("name:N", title="head"), alt.Tooltip("kind:N", title="X_c changes"),
                 alt.Tooltip("value:Q", format=".4f"),
                 alt.Tooltip("low:Q", format=".4f", title="95 % interval, low"),
                 alt.Tooltip("high:Q", format=".4f", title="95 % interval, high"), alt.Tooltip("n:Q", title="pairs")],
    ).properties(width=max(150, 20 * n_heads), height=alt.Step(ROW_PX)).facet(
        column=alt.Column("kind:N", sort=kinds, title="X_c changes", header=alt.Header(labelFontSize=12)))
