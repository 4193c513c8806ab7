"""Heuristic tags (engine.techniques.heuristic_neurons) on synthetic activations over an operand grid: each planted
heuristic is found with a high held-out R², the held-out R² equals scikit-learn's, and noise is not tagged."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression
from sklearn.metrics import r2_score

from engine.techniques.heuristic_neurons import TAG_R2, held_out_r2, heuristics, tag_neuron

A, B = (g.ravel().astype(float) for g in np.meshgrid(np.arange(1, 10), np.arange(1, 10), indexing="ij"))
C = A + B
RNG = np.random.default_rng(1)


@pytest.mark.parametrize("y, tags", [
    (((C >= 6) & (C <= 11)).astype(float), {"result range"}),
    (((A >= 3) & (A <= 5)).astype(float) * 2.0, {"operand A range"}),
    ((C >= 10).astype(float), {"result tens digit", "result range"}),
    ((A == B).astype(float), {"identical operands"}),
    (np.mod(C, 5) * 1.0, {"result mod 5", "result mod 10", "result value"}),
    (0.3 * A - 0.7 * B, {"linear"}),
])
def test_a_planted_heuristic_is_found_held_out(y, tags):
    tag, r2 = tag_neuron(A, B, C, y + RNG.normal(0, 0.01, len(y)))
    assert tag in tags and r2 > 0.95, (tag, r2)


def test_noise_is_not_tagged():
    tag, r2 = tag_neuron(A, B, C, RNG.normal(0, 1, len(C)))
    assert r2 < TAG_R2, (tag, r2)


def test_held_out_r2_equals_scikit_learns():
    y = np.sin(C) + RNG.normal(0, 0.1, len(C))
    order = np.random.default_rng(0).permutation(81)  # every class of every one-hot heuristic on both halves
    fit, test = np.sort(order[:40]), np.sort(order[40:])
    for name, features in heuristics(A, B, C).items():
        X = features(fit, y[fit])
        ref = r2_score(y[test], LinearRegression().fit(X[fit], y[fit]).predict(X[test]))
        assert held_out_r2(X, y, fit, test) == pytest.approx(ref, abs=1e-8), name
