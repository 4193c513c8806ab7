"""The difference intervals of the Compare page (engine/findings/compare.py) on synthetic per-pair values:
no model needed."""

from __future__ import annotations

import numpy as np

from engine.findings.compare import CellDiff, diff_intervals


def test_a_real_difference_is_found_and_its_interval_holds_the_truth():
    rng = np.random.default_rng(1)
    xa, xb = rng.normal(1.0, 1.0, (200, 3, 4)), rng.normal(0.0, 1.0, (150, 3, 4))
    xb[:, 0, 0] += 1.0  # one cell with no difference
    diff, low, high = diff_intervals(xa, xb)
    assert np.allclose(diff, xa.mean(0) - xb.mean(0))
    assert (low < diff).all() and (diff < high).all()
    differs = (low > 0) | (high < 0)
    assert differs.sum() == 11 and not differs[0, 0]


def test_no_difference_is_covered_about_95_percent_of_the_time():
    covered = 0
    for seed in range(200):
        rng = np.random.default_rng(100 + seed)
        xa, xb = rng.normal(0.0, 1.0, (40, 1)), rng.normal(0.0, 2.0, (30, 1))
        _, low, high = diff_intervals(xa, xb, resamples=400, seed=seed)
        covered += bool(low[0] <= 0 <= high[0])
    assert 175 <= covered <= 197  # 95 % of 200 is 190; a percentile bootstrap of small samples runs a little short


def test_pairs_left_out_and_tiny_runs():
    xa = np.array([[1.0], [np.nan], [3.0], [2.0]])
    xb = np.array([[0.0], [1.0]])
    diff, low, high = diff_intervals(xa, xb)
    assert diff[0] == 1.5 and low[0] <= 1.5 <= high[0]
    d, lo, hi = diff_intervals(xa, xb[:1])
    assert d[0] == 2.0 and np.isnan(lo[0]) and np.isnan(hi[0])
    assert not CellDiff("head", 0, 0, 1, 1, 0.0, float("nan"), float("nan")).differs
