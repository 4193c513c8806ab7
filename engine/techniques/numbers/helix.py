"""The helix fit of a number's residual stream (Kantamneni & Tegmark, 2025), and its circle.

**3. Helix.**  For the same layers, positions and targets, an ordinary least-squares fit (no probe,
in-sample) of the P x d matrix X = x[l, pos] on the basis of the target number n:
helix = [cos(2πn/T), sin(2πn/T) for T in PERIODS] + [n, 1], linear = [n, 1],
means = one indicator column per distinct value of n (the best any function of n can do).
R²(basis) = 1 - ||X - B Ŵ||²_F / ||X - X̄||²_F with Ŵ = lstsq(B, X).  Rows: method ``helix``
(score = R²(helix), baseline = R²(linear)), ``means`` (score = R²(means), baseline = R²(means) of the
permuted labels) and ``pca`` (score = the share of X's variance in its top r principal directions, r = the
rank of the centred helix columns -- the most *any* r-dimensional subspace explains, which the helix of the same
dimension is measured against -- baseline = R²(helix)).  With few distinct values (operands 1..9) the helix
basis spans every function of n and R²(helix) = R²(means): the helix is only tested where n takes more values
than the basis has columns.
The circle: for one (layer, position, target), the period T* whose two columns explain the most of the
fit, ||B_T Ŵ_T - mean||²_F; the rows of X (centred) projected onto an orthonormal basis (QR) of the
fitted directions Ŵ_cos(T*), Ŵ_sin(T*).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.backends.base import ModelBackend
from engine.prompts.pairs import PromptPair
from engine.techniques.numbers.activations import METHOD, POSITIONS, TARGETS, VERSION, layer_residuals, target_values

PERIODS: tuple[int, ...] = (2, 5, 10, 100)


# ---------------------------------------------------------------------------------------------
# 3. helix fit
# ---------------------------------------------------------------------------------------------

def helix_basis(n: np.ndarray) -> np.ndarray:
    """[P, 2 len(PERIODS) + 2]: cos, sin of 2πn/T per period, then n and 1."""
    cols = [f(2 * np.pi * n / T) for T in PERIODS for f in (np.cos, np.sin)]
    return np.stack(cols + [n, np.ones_like(n)], 1)


def linear_basis(n: np.ndarray) -> np.ndarray:
    return np.stack([n, np.ones_like(n)], 1)


def means_basis(n: np.ndarray) -> np.ndarray:
    return (n[:, None] == np.unique(n)[None, :]).astype(float)


def fit_r2(B: np.ndarray, X: np.ndarray) -> float:
    """In-sample R² of the least-squares fit X ≈ B W over all of X's columns."""
    W = np.linalg.lstsq(B, X, rcond=None)[0]
    ss = float(((X - X.mean(0)) ** 2).sum())
    return float("nan") if ss == 0 else 1.0 - float(((X - B @ W) ** 2).sum()) / ss


def helix_rank(n: np.ndarray) -> int:
    """r: the rank of the helix basis' columns but the constant, centred -- the dimension the helix fit spans."""
    B = helix_basis(n)[:, :-1]
    return int(np.linalg.matrix_rank(B - B.mean(0)))


def pca_r2(X: np.ndarray, r: int) -> float:
    """The share of X's variance (centred) in its top r principal directions: in-sample R² of the best rank-r fit."""
    return top_share(np.linalg.svd(X - X.mean(0), compute_uv=False), r)


def top_share(s: np.ndarray, r: int) -> float:
    """The share of the top r of singular values ``s`` (descending) in the sum of their squares."""
    total = float((s ** 2).sum())
    return float("nan") if total == 0 else float((s[:r] ** 2).sum()) / total


def principal_directions(X: np.ndarray, r: int) -> np.ndarray:
    """[d, r]: the top r principal directions of X [P, d] (centred), orthonormal."""
    return np.linalg.svd(X - X.mean(0), full_matrices=False)[2][:r].T


# ---------------------------------------------------------------------------------------------
# 3'. the helix circle of one (layer, position, target)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CirclePoint:
    layer: int
    position: str
    target: str
    period: int       # T*: the period whose cos/sin columns explain most of the helix fit
    prompt: int       # index in the prompt set
    value: float      # the target number n
    x: float          # coordinates in the plane of the fitted cos / sin directions
    y: float


def circle(X: np.ndarray, n: np.ndarray) -> tuple[int, np.ndarray]:
    """(T*, [P, 2] coordinates) of the module docstring's circle for X [P, d] and numbers n [P]."""
    B = helix_basis(n)
    W = np.linalg.lstsq(B, X, rcond=None)[0]  # [2 |PERIODS| + 2, d]
    strength = []
    for j in range(len(PERIODS)):
        part = B[:, 2 * j:2 * j + 2] @ W[2 * j:2 * j + 2]  # [P, d]
        strength.append(float(((part - part.mean(0)) ** 2).sum()))
    j = int(np.argmax(strength))
    D = W[2 * j:2 * j + 2].T  # [d, 2]: the fitted cos and sin directions
    Q, R = np.linalg.qr(D)
    Xc = X - X.mean(0)
    coords = Xc @ Q
    if abs(R[1, 1]) < 1e-9 * max(abs(R[0, 0]), 1e-30):  # sin column is zero (T = 2): one direction only
        coords[:, 1] = 0.0
    return PERIODS[j], coords


def helix_circle(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, position: str,
                 target: str) -> list[CirclePoint]:
    if position not in POSITIONS or target not in TARGETS:
        raise ValueError(f"position must be one of {POSITIONS} and target one of {TARGETS}")
    X = layer_residuals(backend, pairs, [layer])[0, POSITIONS.index(position)]
    n = target_values(pairs)[target]
    T, xy = circle(X, n)
    return [CirclePoint(layer, position, target, T, i, float(n[i]), float(xy[i, 0]), float(xy[i, 1]))
            for i in range(len(pairs))]


def cached_helix_circle(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, position: str = "END",
                        target: str = "C", *, cache=None) -> tuple[list[CirclePoint], bool]:
    from engine.results import run_cached_rows
    params = {"version": VERSION, "dtype": backend.facts.dtype, "layer": layer, "position": position,
              "target": target, "periods": list(PERIODS)}
    rows, _, computed = run_cached_rows(backend, pairs, METHOD + "_circle", params,
                                        lambda: (helix_circle(backend, pairs, layer, position, target), None),
                                        CirclePoint, ("x", "y"), cache)
    return rows, computed
