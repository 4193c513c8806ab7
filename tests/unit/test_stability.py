"""Top-k stability (engine.techniques.stability) against plain loops, and the schoolbook carry of a pair."""

from __future__ import annotations

import numpy as np
import pytest

from engine.prompts.pairs import column_carry
from engine.techniques.stability import top_frequency


@pytest.mark.parametrize("op,a,b,want", [
    ("add", 5, 7, True), ("add", 3, 4, False), ("add", 15, 24, False), ("add", 19, 1, True),
    ("add", 50, 50, True), ("add", 40, 50, False),
    ("add", 55, 50, True), ("sub", 12, 5, True), ("sub", 15, 3, False), ("sub", 30, 12, True),
    ("add", 4.5, 2.5, True), ("add", 4.5, 2.4, False), ("sub", 3.5, 1.7, True), ("sub", 3.5, 1.2, False),
    ("mul", 3, 4, None), ("div", 8, 2, None)])
def test_carry_is_schoolbook(op, a, b, want):
    assert column_carry(op, a, b) is want


def test_top_frequency_equals_a_plain_resampling_loop():
    rng = np.random.default_rng(1)
    v = rng.normal(size=(30, 12))
    v[:, 3] -= 2.0                  # a clear key head: always in the top 2
    v[4, 7] = np.nan               # a pair left out of one head's mean
    k, B = 2, 300
    got = top_frequency(v, k, resamples=B, seed=5)
    r = np.random.default_rng(5)
    counts = np.zeros(12)
    for _ in range(B):
        idx = r.integers(0, 30, 30)
        counts[np.argsort(np.nanmean(v[idx], 0), kind="stable")[:k]] += 1
    assert np.allclose(got, counts / B)
    assert got[3] == 1.0 and got.sum() == pytest.approx(k)
