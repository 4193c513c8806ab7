"""The Numbers page's sentences say what its charts draw: the ridge chart's axis clips negative R² at 0 and the
caption says so (with the count), a shuffled-label line above the probe is explained as one chance draw, only where
there is one; "C decodes from layer L on" only where no later layer falls below the threshold again."""

from __future__ import annotations

import pandas as pd

from engine.techniques.numbers import NumberRow, decode_words
from views.numbers import probe_lines, ridge_caption


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
