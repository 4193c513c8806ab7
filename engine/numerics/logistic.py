"""Cross-validated logistic probes, many at once: scikit-learn's L2 logistic regression, fitted in batches.

A probe of :mod:`engine.techniques.numbers` is ``StandardScaler`` + ``LogisticRegression(C)`` scored by
``cross_val_predict`` over ``StratifiedKFold(k, shuffle=True, random_state=seed)``; a page fits a few thousand of
them (every layer, position and target, each against shuffled labels, each fold).  One at a time they cost most of
the Numbers page.  Here every fit is the same convex problem, solved for a whole batch together:

**Problem.**  For one training fold: Z [n, d] the standardised features (the fold's mean and population standard
deviation, a constant feature divided by 1, as ``StandardScaler``), labels y_i in 0..K-1 (the fold's classes in
sorted order), and

    K >= 3 (multinomial):  minimise  sum_i [logsumexp_k(z_i w_k + c_k) - (z_i w_{y_i} + c_{y_i})] + 1/(2C) ||W||²_F
    K == 2 (binary):       minimise  sum_i [log(1 + exp(s_i)) - [y_i = 1] s_i] + 1/(2C) ||w||²,  s_i = z_i w + c

the intercepts unpenalised -- the objective scikit-learn's ``LogisticRegression(C)`` minimises (1.9: the same
divided by n).  It is strictly convex in W, so its minimiser is unique, and W lies in the row space of Z:
with Z Z^T = U S² U^T (its eigenvectors, the eigenvalues above ``RANK_RTOL`` x the largest; those below are
rounding noise of a constant feature, their columns set to 0), W = V Ω with V = Z^T U S^-1, so the fit is solved
in the n coordinates F = U S, with ||W|| = ||Ω||.  The intercepts are one more coordinate, a column of ones
(orthogonal to F's columns: Z's columns are centred).  The binary problem is the multinomial one with K = 2
columns and twice the penalty (its minimiser has w_1 = -w_0 = w / 2, so 1/C ||w_0||² + 1/C ||w_1||² =
1/(2C) ||w||²).

**Solver.**  Newton's method, step length by backtracking (Armijo, 1e-4), for every fit of a batch at once
(``torch``, float64; a fit stops when max |gradient| <= ``GTOL`` x n, 100 times tighter than scikit-learn's
default, and leaves the working set).  The Newton system is solved by conjugate gradients to a relative residual
min(0.5, sqrt(max|g|)) (scikit-learn's rule), preconditioned by the Hessian with every row's class Hessian
diag(p_i) - p_i p_i^T replaced by their mean A: as F's columns are orthogonal, that is diag(σ²) ⊗ A + penalty,
inverted through A's eigenvectors.  A batch holds fits with one number of classes and of features, padded with
rows of weight 0; a fit that has not converged in ``MAX_NEWTON`` steps is fitted again by scikit-learn
(``fallbacks`` counts them).

**Prediction.**  A held-out row z (standardised with the training fold's statistics) goes to the class with the
largest z W + c, the first one on a tie (scikit-learn's ``predict``).  Pooled over the folds, every prompt is
predicted once.  Equal to ``cross_val_predict`` of the scikit-learn pipeline at tolerance 1e-10
(``tests/unit/test_logistic.py``); at scikit-learn's default tolerance its own predictions differ from those on up
to 16 % of a random model's prompts (near ties), which this tolerance avoids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

RANK_RTOL = 1e-12   # eigenvalues of Z Z^T below this x the largest are rounding noise (a constant feature)
GTOL = 1e-6         # stop at max |gradient| <= GTOL x n (the sum objective)
MAX_NEWTON = 100
MAX_CG = 500
BATCH_ENTRIES = 2 ** 25  # at most this many training entries (fits x rows x features) in one batch


@dataclass
class Fit:
    """One training fold of one problem: which problem, its rows, and their class codes."""
    problem: int
    train: np.ndarray     # indices into the problem's rows
    test: np.ndarray
    y: np.ndarray         # [n] class codes 0..K-1 of the training rows
    K: int


@dataclass
class Stats:
    fits: int = 0
    batches: int = 0
    newton_steps: int = 0
    products: int = 0       # batched Hessian products
    live_products: int = 0  # of those, fits still iterating
    fallbacks: int = 0


def folds_of(problems: Sequence[tuple[np.ndarray, np.ndarray, int]], seed: int) -> tuple[list[Fit], list[np.ndarray]]:
    """Every training fold of every problem (x [P, d], labels [P], k folds) and each problem's classes."""
    from sklearn.model_selection import StratifiedKFold
    fits, classes = [], []
    for j, (x, labels, k) in enumerate(problems):
        values, codes = np.unique(labels, return_inverse=True)
        classes.append(values)
        for train, test in StratifiedKFold(k, shuffle=True, random_state=seed).split(x, labels):
            fits.append(Fit(j, train, test, codes[train], len(values)))
    return fits, classes


def cv_predictions(problems: Sequence[tuple[np.ndarray, np.ndarray, int]], *, C: float, seed: int = 0,
                   stats: Stats | None = None) -> list[np.ndarray]:
    """Pooled held-out predictions [P] (in the labels' own values) of the logistic probe of each problem
    (x [P, d], labels [P], k folds): the module docstring's method, every fit batched."""
    fits, classes = folds_of(problems, seed)
    xs = [torch.as_tensor(np.asarray(p[0], dtype=np.float64)) for p in problems]
    out = [np.empty(len(p[1]), dtype=c.dtype) for p, c in zip(problems, classes)]
    stats = stats if stats is not None else Stats()
    by_k: dict[tuple[int, int], list[Fit]] = {}  # a batch: one number of classes and of features
    for f in fits:
        by_k.setdefault((f.K, xs[f.problem].shape[1]), []).append(f)
    for (K, d), group in by_k.items():
        n = max(len(f.y) for f in group)
        per_batch = max(1, BATCH_ENTRIES // (n * d))
        for s in range(0, len(group), per_batch):
            batch = group[s:s + per_batch]
            for f, pred in zip(batch, predict_batch(xs, batch, K, C, stats)):
                out[f.problem][f.test] = classes[f.problem][pred]
    stats.fits += len(fits)
    return out


def standardised(x: torch.Tensor, train: np.ndarray) -> torch.Tensor:
    """x [P, d] scaled by its training rows' mean and population standard deviation, a constant feature by 1 --
    ``StandardScaler`` (its test for a constant: var <= n eps var + (n eps mean)²)."""
    t = x[train]
    mean, var = t.mean(0), t.var(0, unbiased=False)
    n, eps = len(train), torch.finfo(torch.float64).eps
    scale = torch.where(var <= n * eps * var + (n * mean * eps) ** 2, torch.ones_like(var), var.sqrt())
    return (x - mean) / scale


def predict_batch(xs: Sequence[torch.Tensor], batch: Sequence[Fit], K: int, C: float, stats: Stats
                  ) -> list[np.ndarray]:
    """The held-out class codes of each fit of ``batch`` (all with K classes; xs: every problem's rows)."""
    Z = [standardised(xs[f.problem], f.train) for f in batch]     # [P, d] each
    F, V, w, Y = bases([z[f.train] for z, f in zip(Z, batch)], [f.y for f in batch], K)
    lam = (2.0 if K == 2 else 1.0) / C
    Om, ok = newton_cg(torch.cat([F, w], 2), w, Y, lam, stats)  # a column of ones (0 on padding): the intercepts
    Om, c = Om[:, :-1], Om[:, -1:]
    stats.batches += 1
    preds = []
    for b, (z, f) in enumerate(zip(Z, batch)):
        if bool(ok[b]):
            preds.append((z[f.test] @ (V[b] @ Om[b]) + c[b]).argmax(-1).numpy())  # scores [n_test, K]
        else:
            stats.fallbacks += 1
            preds.append(sklearn_fit(z[f.train].numpy(), f.y, C).predict(z[f.test].numpy()))
    return preds


def sklearn_fit(z: np.ndarray, y: np.ndarray, C: float):
    from sklearn.linear_model import LogisticRegression
    return LogisticRegression(C=C, solver="newton-cg", max_iter=1000).fit(z, y)


def bases(Zs: Sequence[torch.Tensor], ys: Sequence[np.ndarray], K: int) -> tuple[torch.Tensor, ...]:
    """F [B, n, n] (= U S, the directions dropped as zero columns), V [B, d, n] (= Z^T U S^-1, W = V Ω), row
    weights [B, n, 1] (0 on padding), one-hot Y [B, n, K] of standardised training rows Zs [n_b, d] and codes ys."""
    n = max(len(y) for y in ys)
    Z = torch.zeros(len(Zs), n, Zs[0].shape[1], dtype=torch.float64)
    w = torch.zeros(len(Zs), n, 1, dtype=torch.float64)
    Y = torch.zeros(len(Zs), n, K, dtype=torch.float64)
    for b, (z, y) in enumerate(zip(Zs, ys)):
        m = len(y)
        Z[b, :m] = z
        w[b, :m] = 1.0
        Y[b, torch.arange(m), torch.from_numpy(y)] = 1.0
    evals, U = torch.linalg.eigh(Z @ Z.transpose(1, 2))               # Z Z^T = U S² U^T: [B, n], [B, n, n]
    keep = evals > RANK_RTOL * evals[:, -1:]                           # the rest: rounding noise, columns of 0
    S = torch.where(keep, evals.clamp_min(0).sqrt(), torch.zeros_like(evals))
    inv = torch.where(keep, 1 / S.clamp_min(1e-300), torch.zeros_like(S))
    return U * S[:, None, :], Z.transpose(1, 2) @ (U * inv[:, None, :]), w, Y  # V = Z^T U S^-1: [B, d, n]


def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per fit <a, b>: [B, ...] x [B, ...] -> [B]."""
    return (a * b).flatten(1).sum(1)


def col(x: torch.Tensor) -> torch.Tensor:
    return x[:, None, None]


def objective(F: torch.Tensor, w: torch.Tensor, Y: torch.Tensor, pen: torch.Tensor, Om: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(each fit's objective [B], its class probabilities [B, n, K]) at Ω [B, r + 1, K]."""
    s = F @ Om
    lse = torch.logsumexp(s, -1, keepdim=True)
    return (w * (lse - (Y * s).sum(-1, keepdim=True))).sum((1, 2)) + 0.5 * dot(pen * Om, Om), torch.exp(s - lse)


def newton_cg(F: torch.Tensor, w: torch.Tensor, Y: torch.Tensor, lam: float, stats: Stats
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(Ω [B, r + 1, K], converged [B]) minimising each fit's objective in the coordinates F [B, n, r + 1] (the last
    column ones: its row of Ω is the intercepts, unpenalised).  Only the fits still iterating are computed: a fit
    leaves the working set when it converges."""
    B, n, r1 = F.shape
    pen = torch.full((1, r1, 1), lam, dtype=F.dtype)
    pen[:, -1] = 0.0
    out = torch.zeros(B, r1, Y.shape[2], dtype=F.dtype)
    ok = torch.zeros(B, dtype=torch.bool)
    ids = torch.arange(B)                                            # the working set's fits
    tol = GTOL * w.sum((1, 2))
    Om = out.clone()
    f, P = objective(F, w, Y, pen, Om)
    for _ in range(MAX_NEWTON):
        D = w * (P - Y)                                              # [b, n, K]
        g = F.transpose(1, 2) @ D + pen * Om                         # [b, r + 1, K]
        gmax = g.abs().flatten(1).amax(1)
        done = gmax <= tol
        out[ids[done]], ok[ids[done]] = Om[done], True
        if done.all():
            break
        keep = ~done
        ids, F, w, Y, Om, f, P, g, gmax, tol = (t[keep] for t in (ids, F, w, Y, Om, f, P, g, gmax, tol))
        stats.newton_steps += 1
        step = newton_direction(F, w * P, P, g, gmax, pen, stats)
        Om, f, P, moved = backtrack(F, w, Y, pen, Om, f, P, g, step)
        if not moved.any():  # no step lowers any objective: rounding has the last word
            break
    return out, ok


def newton_direction(F: torch.Tensor, Pw: torch.Tensor, P: torch.Tensor, g: torch.Tensor, gmax: torch.Tensor,
                     pen: torch.Tensor, stats: Stats) -> torch.Tensor:
    """The Newton step -H^-1 g of each fit by conjugate gradients to a relative residual min(0.5, sqrt(max|g|))
    (scikit-learn's rule), preconditioned by H with every row's class Hessian replaced by their mean; a fit leaves the
    working set when it gets there."""
    Ft = F.transpose(1, 2)
    # preconditioner: H with every row's class Hessian diag(p) - p p^T replaced by their mean A = Q Λ Q^T -- F's
    # columns are orthogonal (the ones too: Z's columns are centred), so then H = diag(σ²) ⊗ A + pen ⊗ I
    sig2 = (F ** 2).sum(1)                                           # [b, r + 1]
    A = (torch.diag_embed(Pw.sum(1)) - Pw.transpose(1, 2) @ P) / (sig2[:, -1:, None])  # [b, K, K], mean over rows
    lam_A, Q = torch.linalg.eigh(A)                                  # [b, K], [b, K, K]
    den = sig2[:, :, None] * lam_A[:, None, :] + pen                 # [b, r + 1, K]
    inv_den = torch.where(den > 1e-12 * den.flatten(1).amax(1)[:, None, None], 1 / den, torch.zeros_like(den))

    def precondition(v: torch.Tensor) -> torch.Tensor:
        return ((v @ Q) * inv_den) @ Q.transpose(1, 2)

    def hvp(v: torch.Tensor) -> torch.Tensor:  # H v of each fit
        ds = F @ v                                                   # [b, n, K]
        return Ft @ (Pw * (ds - (P * ds).sum(-1, keepdim=True))) + pen * v

    out = torch.zeros_like(g)
    ids = torch.arange(len(g))
    x, res = torch.zeros_like(g), -g
    z = precondition(res)
    d, rz = z, dot(res, z)
    stop = torch.clamp(torch.sqrt(gmax), max=0.5) ** 2 * dot(res, res)
    for _ in range(MAX_CG):
        live = dot(res, res) > stop
        if int(live.sum()) < 0.75 * len(live):  # shrink the working set (a finished fit's x stays where it is)
            out[ids[~live]] = x[~live]
            if not live.any():
                return out
            ids, F, Ft, Pw, P, Q, inv_den, x, res, d, rz, stop, live = (
                t[live] for t in (ids, F, Ft, Pw, P, Q, inv_den, x, res, d, rz, stop, live))
        h = hvp(d)
        stats.products += 1
        stats.live_products += int(live.sum())
        alpha = torch.where(live, rz / dot(d, h).clamp_min(1e-30), torch.zeros_like(rz))
        x, res = x + col(alpha) * d, res - col(alpha) * h
        z = precondition(res)
        rz_new = dot(res, z)
        d, rz = torch.where(col(live), z + col(rz_new / rz.clamp_min(1e-30)) * d, d), torch.where(live, rz_new, rz)
    out[ids] = x
    return out


def backtrack(F: torch.Tensor, w: torch.Tensor, Y: torch.Tensor, pen: torch.Tensor, Om: torch.Tensor,
              f: torch.Tensor, P: torch.Tensor, g: torch.Tensor, step: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each fit moved along its step, halved until the objective falls by 1e-4 x the slope (Armijo): (Ω, objective,
    probabilities, moved [b])."""
    slope = dot(g, step)
    t = torch.ones(len(f), dtype=F.dtype)
    moved = torch.zeros(len(f), dtype=torch.bool)
    for _ in range(40):
        Om_t = Om + col(t) * step
        f_t, P_t = objective(F, w, Y, pen, Om_t)
        take = (f_t <= f + 1e-4 * t * slope) & ~moved
        Om, f, P = torch.where(col(take), Om_t, Om), torch.where(take, f_t, f), torch.where(col(take), P_t, P)
        moved = moved | take
        if moved.all():
            break
        t = torch.where(moved, t, t / 2)
    return Om, f, P, moved
