"""Charts of the Numbers page (engine.techniques.numbers, helix_patch): probes, DFT spectrum, helix fit, circle,
helix-subspace patching, causal check.

Data in (DataFrames of the technique's rows), Altair chart out; no Streamlit, no engine calls."""

from __future__ import annotations

import altair as alt
import pandas as pd

from views.charts import LEGEND, LINE_LEGEND, PALETTE, layer_axis, stretched

POSITION_ORDER = ("END", "A", "B")
#: the width of one panel of a three-panel chart: the three fit the page's column (about 900 px on a laptop)
FACET_PX = 220
#: a dash legend draws line pieces (its default, a point, looks the same for solid and dashed)
#: (drawn only with a fill colour set too: Streamlit's theme leaves a bare stroke symbol invisible)
DASH_LEGEND = alt.Legend(orient="bottom", title=None, symbolType="stroke", symbolStrokeWidth=2, symbolSize=400,
                         symbolStrokeColor="#333", symbolFillColor="#333", symbolOpacity=1)
TARGET_COLORS = alt.Scale(domain=["A", "B", "C"], range=[PALETTE[1], PALETTE[2], PALETTE[0]])


def probe_frame(df: pd.DataFrame, method: str) -> pd.DataFrame:
    """The rows of one probe method, long: one row per layer, position, target and kind (probe | shuffled)."""
    mine = df[df["method"] == method]
    long = mine.melt(id_vars=["layer", "position", "target", "n_prompts", "n_classes"],
                     value_vars=["score", "baseline"], var_name="kind", value_name="value")
    long["kind"] = long["kind"].map({"score": "probe", "baseline": "shuffled labels"})
    return long


def probe_lines(df: pd.DataFrame, method: str = "logistic", threshold: float | None = None) -> alt.LayerChart:
    """Held-out score per layer (x; -1 = embedding), one panel per position, colour = target, dashed = shuffled."""
    long = probe_frame(df, method)
    title = "held-out R² (below 0 drawn at 0)" if method == "ridge" else "held-out accuracy"
    base = alt.Chart().mark_line(point=True).encode(
        x=layer_axis(),
        y=alt.Y("value:Q", title=title, scale=alt.Scale(domain=[0, 1], clamp=True)),
        color=alt.Color("target:N", scale=TARGET_COLORS, legend=LINE_LEGEND),
        strokeDash=alt.StrokeDash("kind:N", legend=DASH_LEGEND),
        tooltip=["layer", "position", "target", "kind", alt.Tooltip("value:Q", format=".3f"), "n_prompts",
                 "n_classes"])
    layers = [base]
    if threshold is not None:
        layers.append(alt.Chart().mark_rule(color="grey", strokeDash=[2, 2]).encode(y=alt.datum(threshold)))
    return alt.layer(*layers, data=long).properties(width=FACET_PX, height=220).facet(
        column=alt.Column("position:N", sort=list(POSITION_ORDER), title="position"))


def ridge_caption(df: pd.DataFrame, n_pairs: int) -> str:
    """The caption of the ridge chart (:func:`probe_lines`, ``ridge``): what the dashed line is, how many points its
    [0, 1] axis draws at 0, and -- where the dashed line is drawn above the probe -- why a shuffled control can."""
    mine = df[df["method"] == "ridge"]
    values = pd.concat([mine["score"], mine["baseline"]])
    text = (f"The number as a scalar: a ridge probe's held-out R² (dashed: the same probe, folds and score on one "
            f"random permutation of the labels). R² below 0 (held-out predictions worse than the mean) is drawn at "
            f"0: {int((values < 0).sum())} of {len(values)} points here.")
    above = int((mine["baseline"].clip(0, 1) > mine["score"].clip(0, 1)).sum())
    if above:
        text += (f" The shuffled labels score above the probe at {above} of {len(mine)} layer·position·target points: "
                 f"with {n_pairs} prompts one permutation can line up by chance with something the residual stream "
                 f"does hold (such as the prompt's wording) — one draw of chance, not a floor.")
    return text


def kappa_lines(df: pd.DataFrame) -> alt.Chart:
    """Held-out Cohen's kappa of n mod T per layer (C at END), one line per period T, dashed = shuffled labels."""
    mods = df[df["method"].str.startswith("mod")]
    long = pd.concat([
        pd.DataFrame({"layer": mods["layer"], "T": mods["method"].str[3:], "kind": "probe", "kappa": mods["score"],
                      "n_prompts": mods["n_prompts"]}),
        pd.DataFrame({"layer": mods["layer"], "T": mods["method"].str[3:], "kind": "shuffled labels",
                      "kappa": mods["baseline"], "n_prompts": mods["n_prompts"]})])
    return stretched(alt.Chart(long).mark_line(point=True).encode(
        x=layer_axis(),
        y=alt.Y("kappa:Q", title="held-out Cohen's κ of C mod T", scale=alt.Scale(domain=[-0.2, 1], clamp=True)),
        color=alt.Color("T:N", title="T", sort=["2", "5", "10", "100"], legend=LINE_LEGEND),
        strokeDash=alt.StrokeDash("kind:N", legend=DASH_LEGEND),
        tooltip=["layer", "T", "kind", alt.Tooltip("kappa:Q", format=".3f"), "n_prompts"],
    ).properties(height=220))


def spectrum_bars(df: pd.DataFrame) -> alt.FacetChart:
    """|DFT| over the number axis per frequency (labelled by its period), dominant periods in the strong colour."""
    d = df.copy()
    d["period_label"] = d["period"].map(lambda p: f"{p:g}")
    n_k = max(int(d["k"].nunique()), 1)
    return alt.Chart(d).mark_bar(size=max(2.0, FACET_PX / (n_k + 1) - 1)).encode(
        x=alt.X("k:Q", title="frequency k (its period N/k in the tooltip)", axis=alt.Axis(format="d", tickMinStep=1),
                scale=alt.Scale(domain=[float(d["k"].min()) - 0.5, float(d["k"].max()) + 0.5], nice=False)),
        y=alt.Y("magnitude:Q", title="‖F[k]‖"),
        color=alt.condition("datum.dominant", alt.value(PALETTE[0]), alt.value("#bbbbbb")),
        tooltip=["space", "k", "period_label", alt.Tooltip("magnitude:Q", format=".3f"),
                 alt.Tooltip("share:Q", format=".1%"), "dominant"],
    ).properties(width=FACET_PX, height=200).facet(column=alt.Column("space:N", title=None)).resolve_scale(
        y="independent")


def helix_lines(df: pd.DataFrame, position: str, target: str) -> alt.Chart:
    """R² per layer of the helix, the linear [n, 1], the PCA (same dimension) and the class-means fits of one position
    and target."""
    mine = df[(df["position"] == position) & (df["target"] == target)]
    helix = mine[mine["method"] == "helix"]
    means = mine[mine["method"] == "means"]
    pca = mine[mine["method"] == "pca"]
    long = pd.concat([
        pd.DataFrame({"layer": helix["layer"], "fit": "helix (periods 2, 5, 10, 100 + linear)", "R2": helix["score"]}),
        pd.DataFrame({"layer": helix["layer"], "fit": "linear (n, 1)", "R2": helix["baseline"]}),
        pd.DataFrame({"layer": pca["layer"], "fit": "PCA of the helix's dimension (any subspace)", "R2": pca["score"]}),
        pd.DataFrame({"layer": means["layer"], "fit": "class means (any function of n)", "R2": means["score"]}),
        pd.DataFrame({"layer": means["layer"], "fit": "class means, shuffled labels", "R2": means["baseline"]}),
    ])
    return stretched(alt.Chart(long).mark_line(point=True).encode(
        x=layer_axis(),
        y=alt.Y("R2:Q", title="R² of the residual stream (in-sample)", scale=alt.Scale(domain=[0, 1], clamp=True)),
        color=alt.Color("fit:N", scale=alt.Scale(range=list(PALETTE[:5])), legend=LINE_LEGEND),
        tooltip=["layer", "fit", alt.Tooltip("R2:Q", format=".3f")],
    ).properties(height=260))


#: the circle's plot at its smallest (px) and a label's box: labels closer than that to a kept one are left out
CIRCLE_PX, LABEL_PX = (560, 300), (30, 18)


def uncrowded(means: pd.DataFrame) -> pd.Series:
    """Which class means get a label: in value order, each whose label would not touch an already labelled one (at
    the plot's smallest size, :data:`CIRCLE_PX`) -- a crowded value is read from its points' tooltips."""
    span = [(means[c].max() - means[c].min()) or 1.0 for c in ("x", "y")]
    px = [(means[c] - means[c].min()) / s * size for c, s, size in zip(("x", "y"), span, CIRCLE_PX)]
    kept: list[tuple[float, float]] = []
    out = []
    for x, y in zip(*px):
        free = all(abs(x - a) >= LABEL_PX[0] or abs(y - b) >= LABEL_PX[1] for a, b in kept)
        if free:
            kept.append((x, y))
        out.append(free)
    return pd.Series(out, index=means.index)


def circle_scatter(df: pd.DataFrame) -> alt.LayerChart:
    """Prompts in the plane of the fitted cos/sin directions of the strongest period; labels at the class means
    (those that do not crowd another's, :func:`uncrowded`)."""
    means = df.groupby("value", as_index=False)[["x", "y"]].mean()
    means["label"] = means["value"].map(lambda v: f"{v:g}")
    color = alt.Color("value:Q", scale=alt.Scale(scheme="viridis"), title="n")
    points = alt.Chart(df).mark_circle(size=40, opacity=0.6).encode(
        x=alt.X("x:Q", title="fitted cos direction", scale=alt.Scale(zero=False)),
        y=alt.Y("y:Q", title="fitted sin direction", scale=alt.Scale(zero=False)), color=color,
        tooltip=["prompt", "value", alt.Tooltip("x:Q", format=".2f"), alt.Tooltip("y:Q", format=".2f")])
    path = alt.Chart(means).mark_line(color="grey", opacity=0.5).encode(x="x:Q", y="y:Q", order="value:Q")
    labels = alt.Chart(means[uncrowded(means)]).mark_text(fontSize=14, fontWeight="bold", dy=-10).encode(
        x="x:Q", y="y:Q", text="label:N", color=color)
    return stretched(alt.layer(path, points, labels).properties(height=360))


def causal_bars(df: pd.DataFrame) -> alt.Chart:
    """Success (top token becomes C') and stays (still C) of the class-mean shift and the random control."""
    long = df.melt(id_vars=["method", "layer", "n_prompts"], value_vars=["success", "stays"], var_name="outcome",
                   value_name="rate")
    long["outcome"] = long["outcome"].map({"success": "top token becomes C'", "stays": "top token stays C"})
    return stretched(alt.Chart(long).mark_bar().encode(
        x=alt.X("rate:Q", title="fraction of prompts", scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("method:N", title=None),
        color=alt.Color("outcome:N", scale=alt.Scale(range=[PALETTE[0], PALETTE[1]]), legend=LEGEND),
        yOffset="outcome:N",
        tooltip=["method", "outcome", alt.Tooltip("rate:Q", format=".1%"), "n_prompts", "layer"],
    ).properties(height=140))


def digit_lines(df: pd.DataFrame) -> alt.FacetChart:
    """Held-out accuracy of the per-digit circular probes per layer: one panel per position, colour = target, dash =
    units / tens digit (shuffled labels in grey)."""
    mine = df[df["method"].isin(["digit1", "digit10"])]
    long = pd.concat([
        pd.DataFrame({"layer": mine["layer"], "position": mine["position"], "target": mine["target"],
                      "digit": mine["method"].map({"digit1": "units", "digit10": "tens"}), "kind": "probe",
                      "accuracy": mine["score"], "n_prompts": mine["n_prompts"]}),
        pd.DataFrame({"layer": mine["layer"], "position": mine["position"], "target": "shuffled",
                      "digit": mine["method"].map({"digit1": "units", "digit10": "tens"}), "kind": "shuffled labels",
                      "accuracy": mine["baseline"], "n_prompts": mine["n_prompts"]})])
    long["line"] = long["target"] + " " + long["digit"]
    colors = alt.Scale(domain=["A", "B", "C", "shuffled"], range=[PALETTE[1], PALETTE[2], PALETTE[0], "#bbbbbb"])
    return alt.Chart(long).mark_line(point=True).encode(
        x=layer_axis(),
        y=alt.Y("mean(accuracy):Q", title="held-out digit accuracy", scale=alt.Scale(domain=[0, 1], clamp=True)),
        color=alt.Color("target:N", scale=colors, legend=LINE_LEGEND),
        strokeDash=alt.StrokeDash("digit:N", sort=["units", "tens"], legend=DASH_LEGEND),
        detail="line:N",
        tooltip=["layer", "position", "target", "digit", "kind", alt.Tooltip("mean(accuracy):Q", format=".3f"),
                 "n_prompts"],
    ).properties(width=FACET_PX, height=220).facet(column=alt.Column("position:N", sort=list(POSITION_ORDER),
                                                                title="position"))


def patch_bars(df: pd.DataFrame) -> alt.LayerChart:
    """Helix-subspace patching: the share of prompts whose answer becomes C' per patch, with its 95 % interval."""
    order = ["none", "full", "helix", "pca", "random"]
    bars = alt.Chart(df).mark_bar(color=PALETTE[0]).encode(
        x=alt.X("success:Q", title="fraction of prompts whose top token becomes C' (95 % interval)",
                scale=alt.Scale(domain=[0, 1])),
        y=alt.Y("method:N", sort=order, title=None),
        tooltip=["method", alt.Tooltip("success:Q", format=".1%"), alt.Tooltip("success_low:Q", format=".1%"),
                 alt.Tooltip("success_high:Q", format=".1%"), alt.Tooltip("stays:Q", format=".1%"),
                 alt.Tooltip("recovered:Q", format=".2f"), "rank", "n_prompts"])
    rules = alt.Chart(df).mark_rule(color="black").encode(
        x="success_low:Q", x2="success_high:Q", y=alt.Y("method:N", sort=order))
    return stretched(alt.layer(bars, rules).properties(height=170))
