"""The batched logistic probes against scikit-learn's pipeline, fold by fold (engine.numerics.logistic)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from engine.numerics import logistic


def problem(rng, K: int, P: int, d: int, signal: float, constant: int = 0):
    y = np.concatenate([np.arange(K).repeat(5), rng.integers(0, K, P - 5 * K)])
    x = rng.normal(size=(P, d)) + signal * np.eye(K)[y] @ rng.normal(size=(K, d))
    x[:, :constant] = 2.5  # features that never change
    return x, y * 3 + 1, 5  # labels that are not 0..K-1


def sklearn_cv(x, labels, k, seed, C, tol):
    """Pooled held-out predictions and each fold's coefficients of StandardScaler + LogisticRegression."""
    proto = make_pipeline(StandardScaler(), LogisticRegression(C=C, solver="newton-cg", max_iter=10_000, tol=tol))
    pred, coefs = np.empty_like(labels), []
    for train, test in StratifiedKFold(k, shuffle=True, random_state=seed).split(x, labels):
        est = clone(proto).fit(x[train], labels[train])
        pred[test] = est.predict(x[test])
        coefs.append(est[-1].coef_)
    return pred, coefs


def test_predictions_equal_scikit_learns_fit_to_a_tight_tolerance():
    """Binary and multinomial, more features than rows, constant features, problems of different sizes in one call:
    every held-out prediction equals scikit-learn's with its tolerance at 1e-10 (and the fits are the same)."""
    rng = np.random.default_rng(0)
    problems = [problem(rng, 2, 60, 80, 0.3), problem(rng, 3, 75, 40, 0.5, constant=10),
                problem(rng, 9, 90, 120, 0.4), problem(rng, 9, 70, 120, 0.2), problem(rng, 12, 100, 30, 1.0)]
    stats = logistic.Stats()
    got = logistic.cv_predictions(problems, C=1.0, seed=3, stats=stats)
    assert stats.fits == 25 and stats.fallbacks == 0 and stats.batches >= 4  # K = 2, 3, 9 (two problems), 12
    for (x, y, k), mine in zip(problems, got):
        want, _ = sklearn_cv(x, y, k, 3, 1.0, 1e-10)
        assert mine.dtype == y.dtype and np.array_equal(mine, want)
        assert len(np.unique(mine)) > 1  # a probe that does something


def test_the_binary_problem_is_scikit_learns_binary_logistic_regression():
    """Two classes: scikit-learn fits one vector w with penalty ||w||² / 2C; the module's K = 2 columns with twice the
    penalty give w_1 - w_0 = w.  Checked on the coefficients themselves through a single fold."""
    rng = np.random.default_rng(1)
    x, y, _ = problem(rng, 2, 50, 20, 0.4)
    z = (x - x.mean(0)) / x.std(0)
    fit = logistic.Fit(0, np.arange(50), np.arange(0), (y == y.max()).astype(int), 2)
    F, V, w, Y = logistic.bases([torch.from_numpy(z)], [fit.y], 2)
    Om, ok = logistic.newton_cg(torch.cat([F, w], 2), w, Y, 2.0, logistic.Stats())
    coef = (V[0] @ Om[0, :-1]).numpy()                                  # [d, 2]
    ref = LogisticRegression(C=1.0, solver="newton-cg", tol=1e-12, max_iter=10_000).fit(z, fit.y)
    assert bool(ok[0])
    assert np.allclose(coef[:, 1] - coef[:, 0], ref.coef_[0], atol=1e-6)
    assert float(Om[0, -1, 1] - Om[0, -1, 0]) == pytest.approx(float(ref.intercept_[0]), abs=1e-6)


def test_a_fit_that_does_not_converge_is_fitted_by_scikit_learn(monkeypatch):
    rng = np.random.default_rng(2)
    x, y, k = problem(rng, 4, 60, 30, 0.5)
    monkeypatch.setattr(logistic, "MAX_NEWTON", 1)
    stats = logistic.Stats()
    got = logistic.cv_predictions([(x, y, k)], C=1.0, seed=0, stats=stats)[0]
    assert stats.fallbacks == k
    want, _ = sklearn_cv(x, y, k, 0, 1.0, 1e-4)  # the fallback: scikit-learn's own fit, its default tolerance
    assert np.array_equal(got, want)
