"""Charts of the Numbers page (engine.techniques.numbers, helix_patch): probes, DFT spectrum, helix fit, circle,
helix-subspace patching, causal check.

Data in (DataFrames of the technique's rows), Altair chart out; no Streamlit, no engine calls."""

from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from engine.techniques.numbers import MIN_FOLDS, PERIODS
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


#: the κ chart's lowest value drawn (κ below it is drawn at it: the axis says so where any point is)
KAPPA_FLOOR = -0.2
#: the κ chart's colour legend: a title, so that a single line's label ("2") says what it is
PERIOD_LEGEND = alt.Legend(orient="bottom", direction="vertical", labelLimit=0, title="period T", symbolType="stroke",
                           symbolStrokeWidth=3, symbolOpacity=1)


def kappa_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The ``mod T`` rows long: one row per layer, period T and kind (probe | shuffled labels), NaN κ left out."""
    mods = df[df["method"].str.fullmatch(r"mod\d+")]
    long = pd.concat([
        pd.DataFrame({"layer": mods["layer"], "T": mods["method"].str[3:], "kind": "probe", "kappa": mods["score"],
                      "n_prompts": mods["n_prompts"]}),
        pd.DataFrame({"layer": mods["layer"], "T": mods["method"].str[3:], "kind": "shuffled labels",
                      "kappa": mods["baseline"], "n_prompts": mods["n_prompts"]})])
    return long[long["kappa"].notna()]


def drawn_periods(df: pd.DataFrame) -> list[int]:
    """The periods T the κ chart draws a line of: those with a ``mod T`` row of a finite κ, ascending."""
    return sorted({int(t) for t in kappa_frame(df)["T"]})


def kappa_lines(df: pd.DataFrame) -> alt.Chart:
    """Held-out Cohen's kappa of n mod T per layer (C at END), one line per period T, dashed = shuffled labels; κ
    below KAPPA_FLOOR drawn at it (the axis title says so where any point is)."""
    long = kappa_frame(df)
    title = "held-out Cohen's κ of C mod T"
    if (long["kappa"] < KAPPA_FLOOR).any():
        title += f" (below {KAPPA_FLOOR:g} drawn at {KAPPA_FLOOR:g})"
    return stretched(alt.Chart(long).mark_line(point=True).encode(
        x=layer_axis(),
        y=alt.Y("kappa:Q", title=title, scale=alt.Scale(domain=[KAPPA_FLOOR, 1], clamp=True)),
        color=alt.Color("T:N", title="period T", sort=[str(t) for t in drawn_periods(df)], legend=PERIOD_LEGEND),
        strokeDash=alt.StrokeDash("kind:N", legend=DASH_LEGEND),
        tooltip=["layer", "T", "kind", alt.Tooltip("kappa:Q", format=".3f"), "n_prompts"],
    ).properties(height=220))


def periods_words(periods: list[int]) -> str:
    return ", ".join(f"{t:g}" for t in periods)


def kappa_caption(df: pd.DataFrame) -> str:
    """The caption of :func:`kappa_lines`: the periods drawn, the periods of PERIODS without a line and why (no row:
    fewer than two values of C mod T with MIN_FOLDS prompts each, the probe's folds; rows of NaN κ only: κ
    undefined), and how many points the axis draws at KAPPA_FLOOR."""
    drawn = drawn_periods(df)
    with_rows = {int(m[3:]) for m in df.loc[df["method"].str.fullmatch(r"mod\d+"), "method"]}
    text = ("Is C mod T linearly separable at the last token? The held-out Cohen's κ of a logistic probe of C mod T "
            f"(0 = chance; dashed: shuffled labels) per layer, for T = {periods_words(drawn)} — the test a spectrum "
            "cannot replace.")
    no_rows = [t for t in PERIODS if t not in with_rows]
    if no_rows:
        helix = df[(df["method"] == "helix") & (df["position"] == "END") & (df["target"] == "C")]
        on = f"these {int(helix['n_prompts'].max())} prompts" if len(helix) else "this set"
        text += (f" No line for T = {periods_words(no_rows)}: too few prompts per class on {on} (the probe needs "
                 f"{MIN_FOLDS} prompts or more in each of at least two values of C mod T); more prompts per "
                 f"operation may draw them.")
    undefined = [t for t in PERIODS if t in with_rows and t not in drawn]
    if undefined:
        text += f" No line for T = {periods_words(undefined)}: κ is undefined at every layer."
    kappa = kappa_frame(df)["kappa"]
    clipped = int((kappa < KAPPA_FLOOR).sum())
    if clipped:
        text += f" κ below {KAPPA_FLOOR:g} is drawn at {KAPPA_FLOOR:g}: {clipped} of {len(kappa)} points here."
    return text


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


#: the helix chart's series, in legend order, each with its own dash (series that coincide stay visible)
HELIX_FITS = ("helix (periods 2, 5, 10, 100 + linear)", "linear (n, 1)", "PCA of the helix's dimension (any subspace)",
              "class means (any function of n)", "class means, shuffled labels")
HELIX_DASHES = ([1, 0], [8, 4], [2, 3], [12, 3, 2, 3], [4, 6])
#: two series whose R² differ by less than this at every layer are said to coincide (the chart cannot tell them apart)
SAME_R2 = 1e-3


def helix_frame(df: pd.DataFrame, position: str, target: str) -> pd.DataFrame:
    """R² per layer and fit (HELIX_FITS) of one position and target, long."""
    mine = df[(df["position"] == position) & (df["target"] == target)]
    helix = mine[mine["method"] == "helix"]
    means = mine[mine["method"] == "means"]
    pca = mine[mine["method"] == "pca"]
    return pd.concat([
        pd.DataFrame({"layer": helix["layer"], "fit": HELIX_FITS[0], "R2": helix["score"]}),
        pd.DataFrame({"layer": helix["layer"], "fit": HELIX_FITS[1], "R2": helix["baseline"]}),
        pd.DataFrame({"layer": pca["layer"], "fit": HELIX_FITS[2], "R2": pca["score"]}),
        pd.DataFrame({"layer": means["layer"], "fit": HELIX_FITS[3], "R2": means["score"]}),
        pd.DataFrame({"layer": means["layer"], "fit": HELIX_FITS[4], "R2": means["baseline"]}),
    ])


def helix_lines(df: pd.DataFrame, position: str, target: str) -> alt.Chart:
    """R² per layer of the helix, the linear [n, 1], the PCA (same dimension) and the class-means fits of one position
    and target; each fit its colour and dash, so that a line drawn over another still shows."""
    return stretched(alt.Chart(helix_frame(df, position, target)).mark_line(point=True).encode(
        x=layer_axis(),
        y=alt.Y("R2:Q", title="R² of the residual stream (in-sample)", scale=alt.Scale(domain=[0, 1], clamp=True)),
        color=alt.Color("fit:N", scale=alt.Scale(domain=list(HELIX_FITS), range=list(PALETTE[:5])),
                        legend=LINE_LEGEND),
        strokeDash=alt.StrokeDash("fit:N", scale=alt.Scale(domain=list(HELIX_FITS), range=list(HELIX_DASHES)),
                                  legend=LINE_LEGEND),
        tooltip=["layer", "fit", alt.Tooltip("R2:Q", format=".3f")],
    ).properties(height=260))


def coinciding_fits(df: pd.DataFrame, position: str, target: str) -> list[list[str]]:
    """Groups (legend order) of the helix chart's fits whose R² agree within SAME_R2 at every layer both draw."""
    wide = helix_frame(df, position, target).pivot_table(index="layer", columns="fit", values="R2", dropna=False)
    fits = [f for f in HELIX_FITS if f in wide and wide[f].notna().any()]
    groups: list[list[str]] = []
    for f in fits:
        for g in groups:
            a, b = wide[g[0]], wide[f]
            both = a.notna() & b.notna()
            if (a.notna() == b.notna()).all() and bool(((a[both] - b[both]).abs() < SAME_R2).all()):
                g.append(f)
                break
        else:
            groups.append([f])
    return [g for g in groups if len(g) > 1]


def short(fit: str) -> str:
    """A fit's name in a sentence: "helix", "linear", "class means", "shuffled-label class means", ..."""
    return "shuffled-label class means" if fit == HELIX_FITS[4] else fit.split(" (")[0]


def helix_caption(df: pd.DataFrame, position: str, target: str) -> str:
    """What the helix chart's reader cannot see: the fits drawn over one another (with their R² where it is the same
    at every layer), and why an R² of 1 is by construction where it is: one prompt per value (class means) or as many
    helix coefficients as prompts."""
    parts = []
    wide = helix_frame(df, position, target).pivot_table(index="layer", columns="fit", values="R2")
    for g in coinciding_fits(df, position, target):
        vals = wide[g[0]].dropna().to_numpy()
        same = (f"R² {vals[0]:.2f} at every layer" if np.ptp(vals) < SAME_R2
                else f"the {short(g[0])}'s R² at every layer")
        names = [short(f) for f in g[1:]]
        names = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        parts.append(f"{names}: {same}, drawn over the {short(g[0])} line")
    notes = [f"Lines drawn over one another — {'; '.join(parts)}."] if parts else []
    mine = df[(df["position"] == position) & (df["target"] == target) & (df["method"] == "helix")]
    if len(mine):
        p, nv = int(mine["n_prompts"].max()), int(mine["n_classes"].max())
        coefs = 2 * len(PERIODS) + 2
        if nv == p:
            notes.append(f"Each of the {p} prompts has its own value of {target}, so one mean per value fits every "
                         f"prompt exactly: the class means' R² of 1 is by construction, shuffled labels too.")
        helix = mine["score"].dropna()
        if nv <= coefs:
            notes.append(f"{target} takes {nv} distinct values here and the helix basis has {coefs} columns: it spans "
                         f"every function of {target}, so its R² equals the class means' by construction.")
        else:
            notes.append(f"{target} takes {nv} distinct values here, more than the helix basis's {coefs} columns: "
                         f"the gap between the helix and the class means is what a helix does not explain.")
        if coefs >= p and len(helix) and bool((helix > 1 - SAME_R2).all()):
            notes.append(f"The helix fits {coefs} coefficients per residual dimension to {p} prompts: with as many "
                         f"parameters as points or more, its in-sample R² of 1 says nothing about a helix.")
    return " ".join(notes)


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
    # labels in one dark colour: viridis ends in a yellow a reader cannot read on white (the number is the label)
    labels = alt.Chart(means[uncrowded(means)]).mark_text(fontSize=14, fontWeight="bold", dy=-10,
                                                          color="#222222").encode(x="x:Q", y="y:Q", text="label:N")
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
