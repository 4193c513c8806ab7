"""The chart rules of issue 12, on the chart specs themselves (no browser): sorted bars with printed values,
readable tokens, the main result in the strongest colour, legends and labels never cut, one shared scale."""

from __future__ import annotations

import re

import pandas as pd

from views.charts import (
    PALETTE,
    display_token,
    fmt_prob,
    heatmap,
    heatmap_frame,
    lines_with_band,
    ranked_bars,
    template_bars,
)


def _data(chart) -> list[dict]:
    spec = chart.to_dict()
    return next(iter(spec["datasets"].values()))


def test_ranked_bars_most_likely_first_with_values_and_readable_tokens():
    df = pd.DataFrame({"token": ["Ġis", "8", "Ċ", "Ġ8"], "token_id": [318, 23, 198, 807],
                       "prob": [0.2, 0.7, 3e-5, 0.1]})
    chart = ranked_bars(df)
    rows = _data(chart)
    assert [r["prob"] for r in rows] == [0.7, 0.2, 0.1, 3e-5]
    assert [r["shown"] for r in rows] == ["8", "␣is", "␣8", "⏎"]
    assert [r["label"] for r in rows] == ["0.700", "0.200", "0.100", "3.0e-05"]
    spec = chart.to_dict()
    assert spec["layer"][0]["encoding"]["x"]["sort"] == ["8", "␣is", "␣8", "⏎"]
    assert spec["layer"][1]["mark"]["type"] == "text" and spec["layer"][1]["encoding"]["text"]["field"] == "label"
    tips = {t["field"] for t in spec["layer"][0]["encoding"]["tooltip"]}
    assert {"token", "token_id"} <= tips  # the raw piece and its id on hover


def test_tokens_and_probabilities_as_text():
    assert display_token("Ġis") == "␣is" and display_token("▁7") == "␣7" and display_token("Ċ") == "⏎"
    assert fmt_prob(0.5) == "0.500" and fmt_prob(0.00004) == "4.0e-05" and fmt_prob(0.0) == "0.000"


def test_main_series_gets_the_strongest_colour_and_the_legend_is_never_cut():
    df = pd.DataFrame({"k": [1, 2, 1, 2], "acc": [.9, .8, .5, .2], "lo": [.9, .8, .5, .2], "hi": [.9, .8, .5, .2],
                       "series": ["random", "random", "top-k", "top-k"]})
    spec = lines_with_band(df, "k", "acc", "lo", "hi", "series", "accuracy", main="top-k").to_dict()
    color = spec["layer"][1]["encoding"]["color"]
    assert color["scale"]["domain"][0] == "top-k" and color["scale"]["range"][0] == PALETTE[0]
    assert color["legend"]["labelLimit"] == 0 and color["legend"]["orient"] == "bottom"


def test_every_template_name_is_shown():
    df = pd.DataFrame({"op": ["add"] * 40, "template": [f"add.paper.{i}" for i in range(40)], "n": 10,
                       "first_token": 1.0, "full_answer": 1.0})
    spec = template_bars(df).to_dict()
    axis = spec["layer"][0]["encoding"]["y"]["axis"]
    assert axis["labelLimit"] == 0 and axis["labelOverlap"] is False
    assert spec["height"] >= 20 * 40  # a row per template: no label is dropped for lack of room


def test_a_template_at_zero_accuracy_says_0_percent_and_a_full_bar_keeps_its_value_inside():
    """SmolLM2's Home chart drew add.paper.4 (0 %) as an empty row, the same as a template with no data."""
    import vl_convert

    df = pd.DataFrame({"op": ["add"] * 3, "template": ["add.paper.0", "add.paper.1", "add.paper.2"], "n": 10,
                       "first_token": [0.0, 0.4, 1.0], "full_answer": [0.0, 0.4, 1.0]})
    svg = vl_convert.vegalite_to_svg(template_bars(df).properties(width=400).to_json())
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    assert {"0%", "40%", "100%"} <= set(texts), texts
    spec = template_bars(df).to_dict()
    inside = [layer for layer in spec["layer"] if layer["mark"].get("color") == "white"]
    assert inside and inside[0]["mark"]["align"] == "right"  # 100 %: printed inside the bar, not past the chart


def test_two_heatmaps_on_one_symmetric_scale():
    a = heatmap_frame([[0.1, -0.2]], [0.0])
    b = heatmap_frame([[0.5, -0.05]], [0.0])
    doms = [heatmap(df, "effect", lim=0.5).to_dict()["encoding"]["color"]["scale"]["domain"] for df in (a, b)]
    assert doms == [[-0.5, 0.5], [-0.5, 0.5]]


def test_attention_bars_one_row_per_token_coloured_by_role():
    """The END-row attention bars: every token its own row (a step of ROW_PX, so every label is drawn), bars
    coloured by the token's role with a legend, the roles those of the engine."""
    from engine.techniques.attention import ROLES
    from views.charts import ROLE_ORDER, ROW_PX, token_bars
    assert set(ROLE_ORDER) == set(ROLES)
    df = pd.DataFrame({"label": ["0: <bos>", "5: 3", "7: 5"], "weight": [0.01, 0.02, 0.97],
                       "role": ["first token (attention sink)", "operand A", "operand B"]})
    spec = token_bars(df, "label", "weight", "attention").to_dict()
    assert spec["height"] == {"step": ROW_PX}
    bars = spec["layer"][0]["encoding"]
    assert bars["y"]["field"] == "label" and bars["y"]["axis"]["labelOverlap"] is False
    assert bars["color"]["field"] == "role" and bars["color"]["scale"]["domain"] == [
        "operand A", "operand B", "first token (attention sink)"]
    by_role = token_bars(df.rename(columns={"label": "role_name"}).assign(role=df["role"]), "role", "weight",
                         "attention").to_dict()
    assert by_role["layer"][0]["encoding"]["color"]["legend"] is None  # the rows are the roles: no legend


def test_ranked_bars_mark_the_answer():
    df = pd.DataFrame({"token": ["8", "7", "9"], "token_id": [23, 22, 24], "prob": [0.9, 0.06, 0.04]})
    spec = ranked_bars(df, answer_id=23).to_dict()
    rows = next(iter(spec["datasets"].values()))
    assert [r["kind"] for r in rows] == ["the answer", "another token", "another token"]
    assert spec["layer"][0]["encoding"]["color"]["scale"]["range"][0] == PALETTE[0]
    # the answer not among the bars (the Story's counterfactual, SmolLM2): no swatch for a bar that is not drawn
    spec = ranked_bars(df, answer_id=99).to_dict()
    color = spec["layer"][0]["encoding"]["color"]
    assert color["scale"] == {"domain": ["another token (the answer is not among these)"], "range": [PALETTE[1]]}


def test_the_logit_lens_rank_axis_ticks_only_powers_of_ten():
    """A log axis with 2, 3, 20, 30, 200 and 300 beside 1, 10, 100 drew its labels nearly on top of each other
    (Gemma 3's lens, a rank of ~900 at the embedding)."""
    from views.circuit_charts import lens_lines
    df = pd.DataFrame({"layer": [-1, 0, 1], "mean_prob": [0.0, 0.1, 0.6], "median_rank": [912.0, 35.0, 1.0],
                       "top1": [0.0, 0.0, 0.7]})
    spec = lens_lines(df).to_dict()
    axis = spec["layer"][1]["encoding"]["y"]["axis"]
    assert axis["values"] == [1, 10, 100, 1000] and axis["format"] == ",d"
    one = lens_lines(df.assign(median_rank=1.0)).to_dict()  # every rank 1: one tick, not an empty axis
    assert one["layer"][1]["encoding"]["y"]["axis"]["values"] == [1]


def test_drawn_colours_are_the_ones_the_page_names():
    """Two charts drew a colour their words did not say: the carries chart's interval rules took their bar's colour
    ("black rules are 95 % bootstrap intervals"), and the logit lens's orange line had blue points."""
    import vl_convert

    from views.circuit_charts import carries_chart, lens_lines
    cdf = pd.DataFrame({"layer": [1, 1], "head": [3, 3], "kind": ["operand-a", "operand-b"], "value": [-0.2, 0.1],
                        "low": [-0.3, 0.0], "high": [-0.1, 0.2], "n": [8, 8]})
    svg = vl_convert.vegalite_to_svg(carries_chart(cdf, "effect").properties(width=300).to_json())
    rule_marks = re.findall(r'aria-roledescription="rule mark"[^>]*stroke="([^"]+)"', svg)
    assert len(rule_marks) == 2 and set(rule_marks) == {"black"}, rule_marks
    df = pd.DataFrame({"layer": [-1, 0, 1], "mean_prob": [0.0, 0.1, 0.6], "median_rank": [912.0, 35.0, 1.0],
                       "top1": [0.0, 0.0, 0.7]})
    svg = vl_convert.vegalite_to_svg(lens_lines(df).properties(width=300).to_json())
    points = re.findall(r'aria-roledescription="point"[^>]*fill="([^"]+)"', svg)
    assert points and set(points) == {"#D55E00", "#0072B2"}, points
