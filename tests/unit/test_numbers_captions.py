"""The Numbers page's sentences say what its charts draw (the κ chart's periods drawn and missing, its clipped
points, and the helix fits drawn over one another): the ridge chart's axis clips negative R² at 0 and the
caption says so (with the count), a shuffled-label line above the probe is explained as one chance draw, only where
there is one; "C decodes from layer L on" only where no later layer falls below the threshold again."""

from __future__ import annotations

import pandas as pd

from engine.techniques.numbers import NumberRow, decode_words
from views.numbers import (
    circle_scatter,
    helix_caption,
    helix_lines,
    kappa_caption,
    kappa_lines,
    probe_lines,
    ridge_caption,
)


def rows(scores: list[tuple[float, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"layer": i, "position": "END", "target": "A", "method": "ridge", "score": s, "baseline": b,
                          "n_prompts": 8, "n_classes": 6} for i, (s, b) in enumerate(scores)]
                        + [{"layer": 0, "position": "END", "target": "A", "method": "logistic", "score": 0.1,
                            "baseline": 0.9, "n_prompts": 8, "n_classes": 2}])


def test_the_caption_counts_the_points_drawn_at_zero_and_explains_a_control_above_the_probe():
    text = ridge_caption(rows([(-2.3, 0.8), (-0.6, -0.1), (0.9, -0.2)]), 8)
    assert "drawn at 0: 4 of 6 points here" in text
    assert "above the probe at 1 of 3" in text and "with 8 prompts" in text and "chance" in text


def test_no_chance_sentence_where_the_control_is_not_drawn_above_the_probe():
    text = ridge_caption(rows([(0.9, -0.2), (-0.5, -1.0), (0.5, 0.1)]), 40)  # both below 0: both drawn at 0
    assert "drawn at 0: 3 of 6 points here" in text and "above the probe" not in text


def test_the_ridge_axis_says_negative_r2_is_drawn_at_zero():
    spec = probe_lines(rows([(-1.0, 0.5)]), "ridge").to_dict()
    y = spec["spec"]["layer"][0]["encoding"]["y"]
    assert y["scale"] == {"domain": [0, 1], "clamp": True} and "below 0 drawn at 0" in y["title"]


def logistic(scores: list[float]) -> list[NumberRow]:
    return [NumberRow(layer - 1, "END", "C", "logistic", s, 0.1, 40, 9) for layer, s in enumerate(scores)]


def test_decodes_from_a_layer_on_only_when_no_later_layer_falls_below_the_threshold():
    assert decode_words(logistic([0.1, 0.3, 0.95, 0.97, 0.99])) == "from layer 1 on"
    assert decode_words(logistic([0.95, 0.97])) == "from the embedding on"
    assert decode_words(logistic([0.1, 0.95, 0.5, 0.96, 0.4])) == "first at layer 0 (and at 1 of the 3 layers after it)"
    assert decode_words(logistic([0.1, 0.2])) is None


def mod_rows(periods: tuple[int, ...], kappas: list[float], n: int = 8) -> pd.DataFrame:
    """``mod T`` rows of the given periods (one row per layer and period) and the END / C helix rows of n prompts."""
    return pd.DataFrame([{"layer": i, "position": "END", "target": "C", "method": f"mod{t}", "score": k,
                          "baseline": 0.0, "n_prompts": n, "n_classes": 2}
                         for t in periods for i, k in enumerate(kappas)]
                        + [{"layer": i, "position": "END", "target": "C", "method": "helix", "score": 0.5,
                            "baseline": 0.1, "n_prompts": n, "n_classes": n} for i in range(len(kappas))])


def test_the_kappa_caption_names_the_periods_drawn_and_why_the_others_are_not():
    text = kappa_caption(mod_rows((2,), [0.3, -0.5, 0.7]))
    assert "for T = 2 —" in text and "No line for T = 5, 10, 100: too few prompts per class on these 8 prompts" in text
    assert "drawn at -0.2: 1 of 6 points here" in text
    full = kappa_caption(mod_rows((2, 5, 10, 100), [0.3, 0.5], n=400))
    assert "for T = 2, 5, 10, 100 —" in full and "No line" not in full and "drawn at" not in full


def test_the_kappa_legend_has_a_title_and_the_axis_says_what_it_clips():
    enc = kappa_lines(mod_rows((2,), [0.3, -0.5])).to_dict()["encoding"]
    assert enc["color"]["legend"]["title"] == "period T" and enc["color"]["sort"] == ["2"]
    assert "below -0.2 drawn at -0.2" in enc["y"]["title"]
    assert "drawn at" not in kappa_lines(mod_rows((2,), [0.3, 0.1])).to_dict()["encoding"]["y"]["title"]


def helix_rows(helix: list[float], linear: list[float], pca: list[float], means: list[float],
               shuffled: list[float], n: int, values: int) -> pd.DataFrame:
    out = []
    for i in range(len(helix)):
        for method, score, baseline in (("helix", helix[i], linear[i]), ("pca", pca[i], helix[i]),
                                        ("means", means[i], shuffled[i])):
            out.append({"layer": i, "position": "END", "target": "C", "method": method, "score": score,
                        "baseline": baseline, "n_prompts": n, "n_classes": values})
    return pd.DataFrame(out)


def test_the_helix_caption_names_the_lines_drawn_over_another_and_why_r2_is_one():
    ones = [1.0, 1.0, 1.0]
    text = helix_caption(helix_rows(ones, [0.2, 0.1, 0.3], ones, ones, ones, n=8, values=8), "END", "C")
    assert ("PCA of the helix's dimension, class means and shuffled-label class means: R² 1.00 at every layer, "
            "drawn over the helix line") in text
    assert "Each of the 8 prompts has its own value of C" in text and "10 coefficients" in text
    text = helix_caption(helix_rows([0.4, 0.6, 0.7], [0.2, 0.1, 0.3], [0.9, 0.95, 0.97], [0.5, 0.6, 0.8],
                                    [0.1, 0.1, 0.1], n=400, values=38), "END", "C")
    assert text == ("C takes 38 distinct values here, more than the helix basis's 10 columns: the gap between the "
                    "helix and the class means is what a helix does not explain.")


def test_the_helix_equals_the_class_means_only_where_the_values_are_no_more_than_its_columns():
    # the page said "with few distinct values the helix already spans every function of n" whatever their number:
    # on the bundled model's 12-per-operation set C takes more values than the basis has columns, and the helix lay
    # well below the class means
    few = helix_caption(helix_rows([0.8, 0.9], [0.2, 0.1], [0.9, 0.95], [0.8, 0.9], [0.1, 0.1], n=40, values=9),
                        "END", "C")
    assert "C takes 9 distinct values here and the helix basis has 10 columns: it spans every function of C" in few
    many = helix_caption(helix_rows([0.3, 0.5], [0.2, 0.1], [0.9, 0.95], [0.7, 0.84], [0.1, 0.1], n=48, values=17),
                         "END", "C")
    assert "17 distinct values" in many and "spans every function" not in many


def test_every_helix_fit_has_its_own_dash():
    enc = helix_lines(helix_rows([1.0], [0.2], [1.0], [1.0], [1.0], 8, 8), "END", "C").to_dict()["encoding"]
    dashes = enc["strokeDash"]["scale"]["range"]
    assert enc["strokeDash"]["field"] == "fit" and len({tuple(d) for d in dashes}) == len(dashes) == 5


def test_the_circle_scatters_labels_are_dark_whatever_the_points_colour():
    # viridis ends in yellow (#fde725): labels coloured by value could not be read on white at the largest values
    df = pd.DataFrame([{"prompt": f"p{v}{i}", "value": v, "x": float(v) + i / 10, "y": float(-v)}
                       for v in range(1, 10) for i in range(2)])
    layers = circle_scatter(df).to_dict()["layer"]
    text = [lay for lay in layers if lay["mark"]["type"] == "text"]
    assert len(text) == 1 and text[0]["mark"]["color"] == "#222222" and "color" not in text[0]["encoding"]
    points = [lay for lay in layers if lay["mark"]["type"] == "circle"]
    assert points[0]["encoding"]["color"]["field"] == "value"  # the points keep the value's colour
