"""engine.numerics.intervals: the verdict read off an interval, and the bootstrap against plain numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.numerics.intervals import Interval, all_hold, interval, mean_intervals, number_text, share_texts


def test_a_criterion_holds_fails_or_is_inconclusive_by_where_the_interval_lies():
    assert Interval(0.6, 0.55, 0.7).above(0.5) is True
    assert Interval(0.4, 0.3, 0.5).above(0.5) is False  # at the threshold is not above it
    assert Interval(0.52, 0.45, 0.6).above(0.5) is None
    assert Interval(-0.6, -0.7, -0.55).below(-0.5) is True
    assert Interval(-0.52, -0.6, -0.45).below(-0.5) is None
    assert Interval(0.1, math.nan, math.nan).above(0.0) is None  # one pair: no interval, no verdict
    assert all_hold(True, True) is True and all_hold(True, None) is None and all_hold(None, False) is False
    assert Interval(0.25, 0.2, 0.3).scaled(-100) == Interval(-25.0, -30.0, -20.0)
    assert Interval(0.25, 0.2, 0.3).scaled(100).text("{:.0f}", " %") == "25 % [20, 30]"


def test_a_value_that_rounds_to_zero_prints_without_a_minus_sign():
    """-0.001 at two decimals is 0.00, not -0.00 (the Faithfulness page's "-0.00 [-0.00, 0.00]"); a signed format
    prints it as it prints 0 (+0.00); values that do not round to zero keep their sign."""
    assert Interval(-0.001, -0.004, 0.002).text() == "0.00 [0.00, 0.00]"
    assert Interval(-0.0, -0.0, 0.0).text() == "0.00 [0.00, 0.00]"
    assert Interval(-0.001, -0.02, 0.004).text("{:+.2f}") == "+0.00 [-0.02, +0.00]"
    assert Interval(-0.002, -0.004, 0.01).scaled(100).text("{:+.0f}", " %") == "+0 % [+0, +1]"
    assert Interval(-0.001, math.nan, math.nan).text() == "0.00 (one pair: no interval)"
    assert number_text("{:.0%}", -0.001) == "0%" and number_text("{:.3g}", -1e-9) == "-1e-09"
    assert number_text("{:.2f}", -0.005001) == "-0.01" and number_text("{:.2f}", 0.0) == "0.00"


def test_shares_add_up_to_100_where_rounding_allows_and_equal_counts_print_equal_shares():
    # the Path patching page's line on SmolLM2: 3 of 8 and five 1s printed 38 % + 5 x 12 % = 98 %; a largest-remainder
    # fix then printed the five equal counts as 13 % twice and 12 % three times
    assert sum(round(100 * c / 8) for c in [3, 1, 1, 1, 1, 1]) == 98  # what rounding each alone printed
    assert share_texts([3, 1, 1, 1, 1, 1]) == ["37.5 %"] + ["12.5 %"] * 5
    assert share_texts([2, 1, 1]) == ["50 %", "25 %", "25 %"]  # whole percents where they add up to 100
    assert share_texts([1, 1, 1]) == ["33.3 %"] * 3  # no rounding adds up: one decimal, equal
    assert share_texts([5]) == ["100 %"] and share_texts([]) == [] and share_texts([0, 0]) == []
    rng = np.random.default_rng(0)
    for _ in range(200):
        counts = [int(c) for c in rng.integers(0, 50, size=int(rng.integers(1, 12)))]
        if sum(counts):
            got = share_texts(counts)
            values = [float(t.removesuffix(" %")) for t in got]
            assert all(abs(v - 100 * c / sum(counts)) <= 0.5 for v, c in zip(values, counts))
            assert all(got[i] == got[j] for i in range(len(counts)) for j in range(len(counts))
                       if counts[i] == counts[j])
            assert abs(sum(values) - 100) < 0.05 * len(counts) + 1e-9


def test_the_bootstrap_matches_a_plain_percentile_bootstrap():
    rng = np.random.default_rng(1)
    x = rng.normal(0.3, 1.0, size=200)
    got = interval(lambda idx: x[idx].mean(), len(x))
    boots = [x[rng.integers(0, len(x), len(x))].mean() for _ in range(20000)]
    assert got.value == pytest.approx(x.mean())
    assert (got.low, got.high) == pytest.approx(tuple(np.percentile(boots, [2.5, 97.5])), abs=0.02)
    # many cells at once: the same resamples for every cell, each cell as the one-number bootstrap gives
    m = np.stack([x, 2 * x, x + 1], 1)
    mean, lo, hi = mean_intervals(m)
    assert np.allclose(mean, [x.mean(), 2 * x.mean(), x.mean() + 1])
    assert np.allclose(lo, [got.low, 2 * got.low, got.low + 1], atol=1e-9)
    assert np.allclose(hi, [got.high, 2 * got.high, got.high + 1], atol=1e-9)


def test_fewer_than_two_pairs_have_no_interval():
    one = interval(lambda idx: 0.5, 1)
    assert one.value == 0.5 and math.isnan(one.low)
    with pytest.raises(ValueError):
        interval(lambda idx: 0.0, 0)


def test_knockout_curve_intervals_bracket_each_points_accuracy():
    from engine.techniques.knockout_curve import curve_intervals
    rng = np.random.default_rng(0)
    right = rng.random((4, 1 + 3, 50)) < np.array([0.9, 0.6, 0.3, 0.1])[:, None, None]  # [points, 1 + draws, P]
    iv = curve_intervals(right)
    top, rand = right[:, 0].mean(1), right[:, 1:].mean((1, 2))
    assert np.all(iv["top_low"] <= top) and np.all(top <= iv["top_high"])
    assert np.all(iv["random_low"] <= rand) and np.all(rand <= iv["random_high"])
    assert np.all(iv["top_high"] - iv["top_low"] > 0.05)  # 50 pairs: a real width, not a point
