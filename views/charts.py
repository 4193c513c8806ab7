"""Altair chart builders shared by the pages (data in, chart out; no engine calls)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from engine.machinery.components import grid, site_name

HEAD_SELECTION = "cell"
#: Okabe-Ito, colour-blind safe; the first colour (vermillion) is the strongest and marks the main result
PALETTE = ("#D55E00", "#0072B2", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
LEGEND = alt.Legend(orient="bottom", direction="vertical", labelLimit=0, title=None)
#: lines over shaded bands: the legend shows each line's colour at full strength (not the pale band)
LINE_LEGEND = alt.Legend(orient="bottom", direction="vertical", labelLimit=0, title=None, symbolType="stroke",
                         symbolStrokeWidth=3, symbolOpacity=1)

def layer_axis(title: str = "layer (-1 = the embedding)", field: str = "layer") -> alt.X:
    """The x axis of a line over layers: a number line with integer ticks (a model of 30 layers keeps its ticks
    legible in a narrow panel; a line over layers is read as a curve, not as categories)."""
    return alt.X(f"{field}:Q", title=title, axis=alt.Axis(format="d", tickMinStep=1),
                 scale=alt.Scale(nice=False, zero=False))


#: the height of one category of a chart whose rows are categories (layers, tokens, templates): room for its label
ROW_PX = 22
#: token roles in the order the attention bars list them, and their colours (the problem's tokens strongest)
ROLE_ORDER = ("operand A", "operand B", "operator", "first token (attention sink)", "other")
ROLE_COLORS = ("#D55E00", "#0072B2", "#009E73", "#999999", "#CCCCCC")


def stretched(chart):
    """A single or layered chart that a page shows at its full width (``width="stretch"``) with its ``height`` kept
    for the plot: the width fits the page and the legend and axis titles go below the plot.  Without it Streamlit
    fits the whole chart, legend included, into ``height``, and a legend below the plot squeezes the plot to a line.
    Apply it to the outermost chart (facets and concatenations are laid out at their own size anyway)."""
    return chart.properties(autosize=alt.AutoSizeParams(type="fit-x", contains="padding"))


def display_token(token: str) -> str:
    """A tokenizer piece as a reader sees it: leading-space markers as ␣, newlines as ⏎."""
    return token.replace("Ġ", "␣").replace("▁", "␣").replace("Ċ", "⏎").replace("\n", "⏎")


def fmt_prob(p: float) -> str:
    """A probability as text: three decimals, or scientific notation when that would read 0.000."""
    return f"{p:.3f}" if p >= 0.0005 or p == 0 else f"{p:.1e}"


def percent(x: float) -> str:
    return f"{100 * x:.1f} %"


def heatmap_frame(heads: list[list[float]], mlps: list[float], intervals=None) -> pd.DataFrame:
    """The long table ``heatmap`` draws: one row per head, plus each layer's MLP as column "MLP"; ``intervals``
    ((heads, mlps) low, (heads, mlps) high) of the same shapes add the columns low and high."""
    df = pd.DataFrame([{"layer": layer, "head": h, "column": str(h), "value": v}
                       for layer, row in enumerate(heads) for h, v in enumerate(row)]
                      + [{"layer": layer, "head": -1, "column": "MLP", "value": v} for layer, v in enumerate(mlps)])
    if intervals is not None:
        for name, (h, m) in zip(("low", "high"), intervals):
            df[name] = [v for row in h for v in row] + list(m)
    return df


def component_frame(cells, n_layers: int, n_heads: int) -> pd.DataFrame:
    """:func:`heatmap_frame` of ``(component, layer, head, value)`` cells ("head" or "mlp"); missing ones nan."""
    return heatmap_frame(*grid(cells, n_layers, n_heads))


def heatmap_limit(df: pd.DataFrame) -> float:
    """Half the colour range of ``heatmap``: the heads' largest |value| (MLP cells, often larger, saturate)."""
    heads = df.loc[df["column"] != "MLP", "value"].abs()
    return float(heads.max() if len(heads) and heads.max() > 0 else df["value"].abs().max() or 1.0)


def heatmap(df: pd.DataFrame, metric: str, lim: float | None = None) -> alt.Chart:
    """Layer x head heatmap with an MLP column; diverging colours centred at 0; click selects a cell
    (outlined in black; the other cells keep their colour).

    The colour range is symmetric, ``[-lim, lim]`` (default :func:`heatmap_limit`): give two heatmaps the
    same ``lim`` to compare them on one scale.  Each layer is a row of :data:`ROW_PX` pixels, so every layer's
    label is drawn however many layers the model has (the chart grows with them).

    ``df`` columns: layer, column (head number as text, or "MLP"), head (-1 for MLPs), value; optional low, high
    (the tooltip's interval) and note (:func:`with_notes`: a pinned cell is outlined in orange, its note in the
    tooltip).
    """
    lim = heatmap_limit(df) if lim is None else float(lim)
    sel = alt.selection_point(name=HEAD_SELECTION, fields=["layer", "head"], on="click", clear="dblclick",
                              empty=False)
    cols = [c for c in df["column"].unique() if c != "MLP"] + ["MLP"]
    x = alt.X("column:N", sort=cols, title="head (and the layer's MLP)",
              axis=alt.Axis(labelAngle=0, labelOverlap=False))
    y = alt.Y("layer:O", sort="descending", title="layer", axis=alt.Axis(labelOverlap=False))
    noted = "note" in df and bool((df["note"] != "").any())
    tooltip = (["layer", "column", alt.Tooltip("value:Q", format=".4f")]
               + [alt.Tooltip(f"{c}:Q", format=".4f", title=f"95 % interval, {c}") for c in ("low", "high") if c in df]
               + ([alt.Tooltip("note:N", title="note")] if noted else []))
    # a pinned cell (a note) is outlined in orange, its note in the tooltip (text, never markup); a click outlines
    # a cell in black, over the orange
    stroke, width = alt.condition(sel, alt.value("black"), alt.value("white")), \
        alt.condition(sel, alt.value(3), alt.value(0.5))
    if noted:
        pinned = alt.datum.note != ""
        stroke = alt.when(sel).then(alt.value("black")).when(pinned).then(alt.value(PALETTE[4])) \
            .otherwise(alt.value("white"))
        width = alt.when(sel).then(alt.value(3)).when(pinned).then(alt.value(2.5)).otherwise(alt.value(0.5))
    return stretched(alt.Chart(df).mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=x, y=y,
        color=alt.Color("value:Q", title=metric,
                        scale=alt.Scale(scheme="redblue", domain=[-lim, lim], domainMid=0, clamp=True)),
        stroke=stroke, strokeWidth=width,
        tooltip=tooltip,
    ).add_params(sel).properties(height=alt.Step(ROW_PX)))


def with_notes(df: pd.DataFrame, labels: dict[str, str]) -> pd.DataFrame:
    """``df`` (:func:`heatmap_frame`) with a ``note`` column: each pinned head's (``1.3``) or MLP's (``1.mlp``) note
    from ``labels`` (component -> note, :func:`engine.findings.notes.labels`), "" elsewhere."""
    return df.assign(note=[labels.get(site_name(layer, h), "") for layer, h in zip(df["layer"], df["head"])])


def token_bars(df: pd.DataFrame, x: str, y: str, title: str, fmt: str = ".3f") -> alt.Chart:
    """Horizontal bars, one row per category in the order of the rows (e.g. the tokens of a prompt), each label
    drawn in full on its own row and each bar's value printed on it.  With a ``role`` column (token roles: operand
    A, operand B, operator, ...) the bars are coloured by role, with a legend unless the rows are the roles
    themselves.  ``x`` names the category column, ``y`` the value column."""
    color = alt.value(PALETTE[1])
    if "role" in df:
        roles = [r for r in ROLE_ORDER if r in set(df["role"])] + sorted(set(df["role"]) - set(ROLE_ORDER))
        color = alt.Color("role:N", title="token role", sort=roles, legend=None if x == "role" else LEGEND,
                          scale=alt.Scale(domain=roles, range=[dict(zip(ROLE_ORDER, ROLE_COLORS)).get(r, PALETTE[4])
                                                               for r in roles]))
    top = float(df[y].max()) if len(df) else 0.0
    inside = alt.datum[y] > 0.75 * top  # a long bar carries its value inside its end, a short one beside it
    base = alt.Chart(df).encode(
        y=alt.Y(f"{x}:N", sort=None, title=None, axis=alt.Axis(labelLimit=0, labelOverlap=False)),
        x=alt.X(f"{y}:Q", title=title),
        tooltip=[x] + (["role"] if "role" in df else []) + [alt.Tooltip(f"{y}:Q", format=fmt)])
    bars = base.mark_bar().encode(color=color)
    beside = base.transform_filter(~inside).mark_text(align="left", dx=3).encode(
        text=alt.Text(f"{y}:Q", format=fmt))
    within = base.transform_filter(inside).mark_text(align="right", dx=-3, color="white", fontWeight="bold").encode(
        text=alt.Text(f"{y}:Q", format=fmt))
    return stretched((bars + beside + within).properties(height=alt.Step(ROW_PX)))


def ranked_bars(df: pd.DataFrame, title: str = "probability", answer_id: int | None = None) -> alt.Chart:
    """Next-token bars, most likely first, each with its probability printed; tokens readable (␣ ⏎), the raw
    piece and its id on hover.  ``df`` columns: token, token_id, prob.  ``answer_id``: the answer's token, drawn in
    the strongest colour with a legend (the other tokens in one colour)."""
    df = df.assign(shown=[display_token(t) for t in df["token"]], label=[fmt_prob(p) for p in df["prob"]])
    df = df.sort_values("prob", ascending=False, kind="stable")
    df["shown"] = [f"{t}" if (df["shown"] == t).sum() == 1 else f"{t} #{i}"
                  for t, i in zip(df["shown"], df["token_id"])]
    color = alt.value(PALETTE[1])
    if answer_id is not None:
        drawn = bool((df["token_id"].astype(int) == int(answer_id)).any())
        # the legend names what is drawn: where the answer is not among the bars, it says so instead of a swatch
        kinds = ["the answer", "another token"] if drawn else ["another token (the answer is not among these)"]
        df["kind"] = [kinds[0] if int(i) == int(answer_id) else kinds[-1] for i in df["token_id"]]
        colours = [PALETTE[0], PALETTE[1]][-len(kinds):]
        color = alt.Color("kind:N", sort=kinds, scale=alt.Scale(domain=kinds, range=colours),
                          legend=alt.Legend(orient="top", title=None, labelLimit=0))
    x = alt.X("shown:N", sort=list(df["shown"]), title=None, axis=alt.Axis(labelAngle=0, labelLimit=0,
                                                                          labelOverlap=False))
    base = alt.Chart(df).encode(x=x, tooltip=[alt.Tooltip("token:N", title="raw token"),
                                               alt.Tooltip("token_id:Q", title="id"),
                                               alt.Tooltip("prob:Q", format=".3g")])
    bars = base.mark_bar().encode(y=alt.Y("prob:Q", title=title, scale=alt.Scale(domain=[0, 1])), color=color)
    text = base.mark_text(dy=-7, fontSize=13).encode(y="prob:Q", text="label:N")
    return stretched((bars + text).properties(height=240))


#: a template's accuracy is printed inside its bar's end from this share on (outside it, it would leave the chart)
INSIDE_FROM = 0.85


def template_bars(df: pd.DataFrame) -> alt.Chart:
    """First-token accuracy per template, every template name shown in full (one row each, no label
    dropped or cut) and each bar's value printed beside it -- a template at 0 % says "0%", not an empty row.
    ``df`` columns: op, template, n, first_token, full_answer."""
    base = alt.Chart(df).encode(
        x=alt.X("first_token:Q", title="first-token accuracy", scale=alt.Scale(domain=[0, 1]),
                axis=alt.Axis(format="%")),
        y=alt.Y("template:N", sort=None, title=None, axis=alt.Axis(labelLimit=0, labelOverlap=False)),
        tooltip=["op", "template", "n", alt.Tooltip("first_token:Q", format=".1%"),
                 alt.Tooltip("full_answer:Q", format=".1%")])
    bars = base.mark_bar().encode(
        color=alt.Color("op:N", title="operation", scale=alt.Scale(range=list(PALETTE)), legend=LEGEND))
    value = {"text": alt.Text("first_token:Q", format=".0%")}
    outside = base.mark_text(align="left", dx=4, fontSize=11).encode(**value).transform_filter(
        alt.datum.first_token < INSIDE_FROM)
    inside = base.mark_text(align="right", dx=-4, fontSize=11, color="white").encode(**value).transform_filter(
        alt.datum.first_token >= INSIDE_FROM)
    return stretched(alt.layer(bars, outside, inside).properties(height=22 * len(df) + 20))


def grouped_bars(df: pd.DataFrame, x: str, y: str, color: str, title: str) -> alt.Chart:
    return alt.Chart(df).mark_bar().encode(
        x=alt.X(f"{x}:N", sort=None, title=None, axis=alt.Axis(labelAngle=0)),
        xOffset=f"{color}:N",
        y=alt.Y(f"{y}:Q", title=title),
        color=alt.Color(f"{color}:N"),
        tooltip=[x, color, alt.Tooltip(f"{y}:Q", format=".4f")],
    ).properties(height=240)


def lines_with_band(df: pd.DataFrame, x: str, y: str, lo: str, hi: str, color: str, ytitle: str,
                    main: str | None = None, yfmt: str = ".3f", xsort: list | None = None,
                    xtitle: str | None = None) -> alt.Chart:
    """Lines with a shaded band, colour-blind-safe colours; ``main`` (the main result's series) gets the
    strongest colour and a thicker line.  The legend sits below the chart, its labels never cut.  ``xsort``:
    the x categories' order (default: sorted); ``xtitle``: the x axis title (default: ``x``).  An integer ``x``
    with no ``xsort`` (layers, k) is a number line (:func:`layer_axis`)."""
    series = list(dict.fromkeys(df[color]))
    if main in series:
        series = [main] + [s_ for s_ in series if s_ != main]
    palette = list(PALETTE) if main in series else list(PALETTE[1:]) + [PALETTE[0]]
    scale = alt.Scale(domain=series, range=palette[:len(series)])
    numeric = xsort is None and pd.api.types.is_integer_dtype(df[x])
    xenc = (layer_axis(xtitle or x, x) if numeric else
            alt.X(f"{x}:O", title=xtitle or x, sort=xsort or "ascending", axis=alt.Axis(labelOverlap=False)))
    base = alt.Chart(df).encode(x=xenc, color=alt.Color(f"{color}:N", scale=scale, legend=LINE_LEGEND))
    band = base.mark_area(opacity=0.15).encode(y=alt.Y(f"{lo}:Q", title=ytitle), y2=f"{hi}:Q")
    width = alt.condition(alt.datum[color] == main, alt.value(4), alt.value(2)) if main else alt.value(2)
    line = base.mark_line(point=True).encode(y=f"{y}:Q", strokeWidth=width,
                                             tooltip=[x, color, alt.Tooltip(f"{y}:Q", format=yfmt)])
    return (band + line).properties(height=320)


def loss_curve(df: pd.DataFrame) -> alt.Chart:
    """Training loss per optimizer step (``df`` columns: step, loss)."""
    return alt.Chart(df).mark_line().encode(
        x=alt.X("step:Q", title="step"),
        y=alt.Y("loss:Q", title="answer-token loss", scale=alt.Scale(type="log")),
        tooltip=["step", alt.Tooltip("loss:Q", format=".4f")],
    ).properties(height=220)


#: the text sizes (px) of Streamlit's chart theme: axis and legend labels, their titles, a chart's title, text marks
TEXT_PX = {"label": 12, "title": 14, "chart": 16, "text": 12}
_SIZES = ("fontSize", "labelFontSize", "titleFontSize")


def scaled(chart, factor: float):
    """``chart`` with all its text ``factor`` times as large -- axis labels and titles, legends, headers, the
    chart's title and text marks, the sizes a builder set itself included (the Story's Large fonts) -- and its
    height too (a number, or the step of a row), so that larger labels keep their room; ``factor`` 1 gives
    ``chart`` itself.  Apply it to the outermost chart, as the last step before showing it."""
    if factor == 1:
        return chart

    def grow(node, key=""):
        if isinstance(node, dict):
            return {k: (round(v * factor, 1) if (k in _SIZES or key == "height" and k == "step" or k == "height")
                        and isinstance(v, (int, float)) and not isinstance(v, bool)
                        else v if k in ("data", "datasets") else grow(v, k)) for k, v in node.items()}
        return [grow(v, key) for v in node] if isinstance(node, list) else node

    spec = grow(chart.to_dict())
    px = {k: round(v * factor, 1) for k, v in TEXT_PX.items()}
    config = spec.setdefault("config", {})
    for part in ("axis", "legend", "header"):
        config.setdefault(part, {}).setdefault("labelFontSize", px["label"])
        config[part].setdefault("titleFontSize", px["title"])
    config.setdefault("title", {}).setdefault("fontSize", px["chart"])
    config.setdefault("text", {}).setdefault("fontSize", px["text"])
    return type(chart).from_dict(spec)


def signed_change(change: float, fmt: str = "+.3f", unit: str = "") -> str | None:
    """A change as a metric's delta (``+0.123``, ``-4.0 points``), or None when it reads zero at that precision:
    a metric then shows no arrow (no green "↑ +0.0" for nothing)."""
    text = f"{change:{fmt}}"
    return None if float(text) == 0 else text + (f" {unit}" if unit else "")
