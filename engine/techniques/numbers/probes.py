"""Held-out linear probes of A, B and C, and the rows of every layer, position and target (the probes' and
the helix fits' of :mod:`engine.techniques.numbers.helix`).

**1. Probes** (scikit-learn, features standardized per training fold: ``StandardScaler``), for every
layer, position and target y, ``FOLDS``-fold cross-validation with shuffled folds seeded by ``seed``;
the score is computed over the pooled held-out predictions (every prompt predicted once):

* ``logistic``: the L2 logistic regression of ``LogisticRegression(C=LOGREG_C)`` (multinomial; binary for two
  values) over the values of y, folds ``StratifiedKFold``, a layer's fits solved in one batch
  (:mod:`engine.numerics.logistic`: Newton-CG to 100x scikit-learn's default tolerance); only prompts whose value
  occurs at least k times are kept, k ≤ ``FOLDS`` folds (:func:`class_folds`: the k in ``MIN_FOLDS..FOLDS`` that
  keeps the most prompts, the larger k on a tie; the rest are dropped, ``n_prompts`` and ``folds`` say what was
  used); no k with two such values: no row.
  score = accuracy = #{i : ŷ_i = y_i} / n;
* ``ridge``: ``Ridge(alpha=RIDGE_ALPHA)`` on the scalar value, folds ``KFold``, all prompts;
  score = R² = 1 - Σ(y_i - ŷ_i)² / Σ(y_i - ȳ)² over the pooled held-out predictions;
* ``baseline``: the same estimator, folds and score with the labels permuted once
  (``numpy.random.default_rng(seed).permutation``) -- what a probe of this size reads from nothing;
* ``mod2``, ``mod5``, ``mod10``, ``mod100`` (C at END): the logistic probe of C mod T, StratifiedKFold (classes and
  k as for ``logistic``), score = Cohen's kappa of the pooled held-out predictions (chance = 0), baseline on
  permuted labels -- whether n mod T is linearly separable, the test a spectrum cannot replace.  A target with
  too few prompts per value has no logistic row; the other targets and rows are still computed.
* ``digit1``, ``digit10`` (per-digit circular probes, Levy & Geva 2025): the units (tens) digit
  d = ⌊n / 10^j⌋ mod 10 of a whole number n ≥ 0 as a point on the circle, (cos 2πd/10, sin 2πd/10); a
  two-output ``Ridge(alpha=RIDGE_ALPHA)`` (standardized features) predicts it, ``FOLDS``-fold ``KFold``,
  and the predicted digit is the angle rounded to the nearest tenth of a turn,
  d̂ = round(10 atan2(ŝ, ĉ) / 2π) mod 10; score = accuracy of d̂ over the pooled held-out predictions,
  baseline = the same on permuted digits.  A digit place with fewer than two digit values has no row (the
  tens place of numbers below 10).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.backends.base import ModelBackend
from engine.machinery.batching import batches
from engine.numerics import logistic
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair
from engine.techniques.numbers.activations import (
    METHOD,
    POSITIONS,
    TARGETS,
    VERSION,
    all_layers,
    check_layers,
    layer_residuals,
    residual_pass_work,
    target_values,
)
from engine.techniques.numbers.helix import (
    PERIODS,
    fit_r2,
    helix_basis,
    helix_rank,
    linear_basis,
    means_basis,
    top_share,
)

FOLDS = 5
MIN_FOLDS = 3  # the fewest folds (and prompts per value) a classification probe runs with
DIGIT_PLACES: tuple[int, ...] = (1, 10)
LOGREG_C = 1.0
RIDGE_ALPHA = 1.0
DECODE_THRESHOLD = 0.9


# ---------------------------------------------------------------------------------------------
# 1. probes
# ---------------------------------------------------------------------------------------------

def class_folds(y: np.ndarray) -> tuple[int, np.ndarray]:
    """(k, mask): the number of folds k in MIN_FOLDS..FOLDS and the prompts whose value occurs at least k times,
    for the k that keeps the most prompts (the larger k on a tie) among those that keep two values or more;
    ValueError when none does."""
    vals, counts = np.unique(y, return_counts=True)
    best = None
    for k in range(FOLDS, MIN_FOLDS - 1, -1):
        ok = vals[counts >= k]
        if len(ok) >= 2 and (best is None or np.isin(y, ok).sum() > best[1].sum()):
            best = (k, np.isin(y, ok))
    if best is None:
        raise ValueError(f"classifying needs at least {MIN_FOLDS} prompts per value for two values or more "
                         f"(here: {dict(zip(vals.tolist(), counts.tolist()))}): use more prompts per operation "
                         f"or add operations")
    return best


def shuffled(y: np.ndarray, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).permutation(y)


def logistic_predictions(X: np.ndarray, labels: np.ndarray, seed: int = 0, folds: int = FOLDS) -> np.ndarray:
    """Pooled held-out predictions [P] of the logistic probe of ``labels`` (StratifiedKFold folds)."""
    return logistic.cv_predictions([(X, labels, folds)], C=LOGREG_C, seed=seed)[0]


def logistic_accuracy(X: np.ndarray, y: np.ndarray, seed: int = 0, folds: int = FOLDS) -> float:
    """Held-out accuracy of the logistic probe (pooled over StratifiedKFold folds)."""
    return float((logistic_predictions(X, y, seed, folds) == y).mean())


def ridge_predictions(X: np.ndarray, Y: np.ndarray, seed: int = 0, folds: int = FOLDS) -> np.ndarray:
    """Pooled held-out predictions [P, m] of ``Ridge(alpha=RIDGE_ALPHA)`` on standardized X for the m columns of Y
    at once (one fit per fold: a multi-output ridge solves each column on its own, with the same folds)."""
    from sklearn.linear_model import Ridge
    from sklearn.model_selection import KFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    est = make_pipeline(StandardScaler(), Ridge(alpha=RIDGE_ALPHA))
    return cross_val_predict(est, X, Y, cv=KFold(folds, shuffle=True, random_state=seed)).reshape(len(X), -1)


def ridge_r2(X: np.ndarray, y: np.ndarray, seed: int = 0, folds: int = FOLDS) -> float:
    """Held-out R² of the scalar ridge probe (pooled over KFold folds)."""
    return r2(y, ridge_predictions(X, y[:, None], seed, folds)[:, 0])


def r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss = float(((y - y.mean()) ** 2).sum())
    return float("nan") if ss == 0 else 1.0 - float(((y - pred) ** 2).sum()) / ss


def digits(n: np.ndarray, place: int) -> np.ndarray | None:
    """The digit at ``place`` (1, 10, ...) of each whole number n ≥ 0; None when n is not such a number or the place
    has fewer than two digit values."""
    if not (np.all(n == np.round(n)) and np.all(n >= 0)):
        return None
    d = (n.astype(np.int64) // place) % 10
    return d if len(np.unique(d)) >= 2 else None


def circle_points(d: np.ndarray) -> np.ndarray:
    """[P, 2]: digit d as the point (cos 2πd/10, sin 2πd/10)."""
    angle = 2 * np.pi * d / 10
    return np.stack([np.cos(angle), np.sin(angle)], 1)


def circle_digits(pred: np.ndarray) -> np.ndarray:
    """The digit whose point is nearest in angle to each predicted point [P, 2]: round(10 atan2 / 2π) mod 10."""
    return np.mod(np.round(np.arctan2(pred[:, 1], pred[:, 0]) * 10 / (2 * np.pi)), 10)


def circular_accuracy(X: np.ndarray, d: np.ndarray, seed: int = 0, folds: int = FOLDS) -> float:
    """Held-out accuracy of the circular probe of digits ``d`` (module docstring, 1: ``digit1`` / ``digit10``)."""
    return float((circle_digits(ridge_predictions(X, circle_points(d), seed, folds)) == d).mean())


# ---------------------------------------------------------------------------------------------
# probes + helix, per layer / position / target: the CSV rows
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NumberRow:
    layer: int          # -1 = embedding
    position: str       # END, A, B
    target: str         # A, B, C
    method: str         # logistic (accuracy) | ridge (R²) | helix (R², baseline linear R²) | means (R²) |
    #                     mod2 / mod5 / mod10 / mod100 (Cohen's kappa of n mod T; C at END only) |
    #                     digit1 / digit10 (circular probe of a digit: accuracy) | pca (R² of the top r directions)
    score: float
    baseline: float     # probes and means: permuted labels; helix: the linear fit [n, 1]
    n_prompts: int
    n_classes: int
    folds: int = FOLDS  # cross-validation folds (logistic / mod T: also the fewest prompts per kept value)


def mod_kappa(labels: np.ndarray, pred: np.ndarray) -> float:
    """Cohen's kappa of held-out predictions ``pred`` of ``labels`` (chance = 0)."""
    from sklearn.metrics import cohen_kappa_score
    return float(cohen_kappa_score(labels, pred))


def logistic_problems(X: np.ndarray, values: dict[str, np.ndarray], seed: int
                      ) -> dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray, int]]:
    """(position, target, labels) -> (x, labels, folds): every logistic probe of one layer (X [3, P, d]) -- each
    classifiable target at each position, its shuffled labels (``y`` / ``shuffled``), and C mod T at END
    (``mod2`` ... and ``mod2 shuffled`` ...; none where n mod T = n, the probe of C itself serves)."""
    out = {}
    for pi, pos in enumerate(POSITIONS):
        for t in TARGETS:
            y = values[t]
            try:
                k, keep = class_folds(y)
                out[(pos, t, "y")] = (X[pi][keep], y[keep], k)
                out[(pos, t, "shuffled")] = (X[pi][keep], shuffled(y[keep], seed), k)
            except ValueError:
                pass
            if pos == "END" and t == "C" and np.all(y == np.round(y)):
                n = y.astype(int)
                for T in PERIODS:
                    labels = np.mod(n, T)
                    if np.array_equal(labels, n) and (pos, t, "y") in out:
                        continue
                    try:
                        k, keep = class_folds(labels)
                    except ValueError:
                        continue
                    out[(pos, t, f"mod{T}")] = (X[pi][keep], labels[keep], k)
                    out[(pos, t, f"mod{T} shuffled")] = (X[pi][keep], shuffled(labels[keep], seed), k)
    return out


def layer_rows(layer: int, X: np.ndarray, values: dict[str, np.ndarray], seed: int) -> list[NumberRow]:
    """Every row of one layer; X [3, P, d] (POSITIONS), the layer's logistic probes fitted in one batch.  A target
    with too few prompts per value has no logistic row (its other rows stay)."""
    problems = logistic_problems(X, values, seed)
    predicted = dict(zip(problems, logistic.cv_predictions(list(problems.values()), C=LOGREG_C, seed=seed)))
    out = []
    for pi, pos in enumerate(POSITIONS):
        x = X[pi]
        ridge = ridge_scores(x, {t: values[t] for t in TARGETS}, seed)
        spectrum = np.linalg.svd(x - x.mean(0), compute_uv=False)  # for every target's PCA row
        for t in TARGETS:
            y = values[t]
            if (pos, t, "y") in predicted:
                k, keep = class_folds(y)
                yk = y[keep]
                out.append(NumberRow(layer, pos, t, "logistic", float((predicted[(pos, t, "y")] == yk).mean()),
                                     float((predicted[(pos, t, "shuffled")] == shuffled(yk, seed)).mean()),
                                     int(keep.sum()), len(np.unique(yk)), k))
            if pos == "END" and t == "C" and np.all(y == np.round(y)):
                out.extend(mod_rows(layer, y.astype(int), seed, predicted))
            nv = len(np.unique(y))
            for method, score, baseline, n_classes in ridge[t]:
                out.append(NumberRow(layer, pos, t, method, score, baseline, len(y), n_classes))
            helix = fit_r2(helix_basis(y), x)
            out.append(NumberRow(layer, pos, t, "helix", helix, fit_r2(linear_basis(y), x), len(y), nv))
            out.append(NumberRow(layer, pos, t, "pca", top_share(spectrum, helix_rank(y)), helix, len(y), nv))
            out.append(NumberRow(layer, pos, t, "means", fit_r2(means_basis(y), x),
                                 fit_r2(means_basis(shuffled(y, seed)), x), len(y), nv))
    return out


def ridge_scores(x: np.ndarray, ys: dict[str, np.ndarray], seed: int) -> dict[str, list[tuple[str, float, float, int]]]:
    """Per target: (method, score, shuffled-label score, values) of the ridge probe of y and the circular probe of
    each digit place with two digit values or more -- every target's columns in one multi-output ridge (each column
    solved on its own, the same KFold folds; the labels permuted once, the same permutation for every column)."""
    perm = np.random.default_rng(seed).permutation(len(x))  # = shuffled(): the same permutation for y and digits
    cols, parts = [], []
    for t, y in ys.items():
        parts.append((t, "ridge", None, sum(c.shape[1] for c in cols)))
        cols += [y[:, None], y[perm][:, None]]
        for place in DIGIT_PLACES:
            d = digits(y, place)
            if d is not None:
                parts.append((t, f"digit{place}", d, sum(c.shape[1] for c in cols)))
                cols += [circle_points(d), circle_points(d[perm])]
    pred = ridge_predictions(x, np.concatenate(cols, 1), seed)  # [P, per target: 2 + 4 per digit place]
    out: dict[str, list[tuple[str, float, float, int]]] = {t: [] for t in ys}
    for t, method, d, at in parts:
        y = ys[t]
        if d is None:
            out[t].append((method, r2(y, pred[:, at]), r2(y[perm], pred[:, at + 1]), len(np.unique(y))))
        else:
            out[t].append((method, float((circle_digits(pred[:, at:at + 2]) == d).mean()),
                           float((circle_digits(pred[:, at + 2:at + 4]) == d[perm]).mean()), len(np.unique(d))))
    return out


def mod_rows(layer: int, n: np.ndarray, seed: int, predicted: dict[tuple[str, str, str], np.ndarray]
             ) -> list[NumberRow]:
    """``mod T`` rows (method ``mod2`` ...): is n mod T linearly separable at END, held out -- Cohen's kappa of the
    logistic probe of n mod T for T in PERIODS (``predicted``, :func:`logistic_problems`), beside the same probe on
    shuffled labels; classes and folds by :func:`class_folds`, no row below two classes.  Where every n < T the
    probe of n itself is the probe of n mod T."""
    out = []
    for T in PERIODS:
        labels = np.mod(n, T)
        name = "y" if np.array_equal(labels, n) else f"mod{T}"
        if ("END", "C", name) not in predicted:
            continue
        k, keep = class_folds(labels)
        lk = labels[keep]
        out.append(NumberRow(layer, "END", "C", f"mod{T}", mod_kappa(lk, predicted[("END", "C", name)]),
                             mod_kappa(shuffled(lk, seed), predicted[("END", "C", "shuffled" if name == "y" else
                                                                      f"mod{T} shuffled")]),
                             int(keep.sum()), len(np.unique(lk)), k))
    return out


def number_probes(backend: ModelBackend, pairs: Sequence[PromptPair], *, layers: Sequence[int] | None = None,
                  seed: int = 0, progress: ProgressFn | None = None) -> list[NumberRow]:
    """The probe rows of the module docstring and the helix rows of :mod:`.helix` for ``layers`` (default:
    -1 .. L-1)."""
    layers = check_layers(all_layers(backend) if layers is None else layers, backend.facts.n_layers)
    values = target_values(pairs)
    if len(pairs) < FOLDS:  # the user error before any forward pass
        raise ValueError(f"the probes need at least {FOLDS} prompt pairs (here {len(pairs)}), and {MIN_FOLDS} "
                         f"prompts per value to classify: use more prompts per operation or add operations")
    n_batches = len(batches(len(pairs), 64))
    total = n_batches + len(layers)
    X = layer_residuals(backend, pairs, layers, progress=progress, total=total)
    from joblib import Parallel, delayed
    out = []
    # one process per core, one layer per task: each fits a batch of logistic probes and many small ridge and
    # least-squares fits (more threads would only oversubscribe); one core: the fits in this process, one by one
    jobs = Parallel(n_jobs=fit_workers(len(layers)), return_as="generator", inner_max_num_threads=1)
    for j, rows in enumerate(jobs(delayed(layer_rows)(layer, X[j], values, seed) for j, layer in enumerate(layers))):
        out.extend(rows)
        if progress is not None:
            progress(n_batches + j + 1, total)
    return out


def fit_workers(n_layers: int) -> int:
    """Processes that fit the probes: one per core the lab may use (``joblib.cpu_count``: the process's CPU affinity,
    a container's CPU quota and ``LOKY_MAX_CPU_COUNT``, whichever is least), at most one per layer."""
    from joblib import cpu_count
    return max(1, min(n_layers, cpu_count()))


#: seconds one worker takes for one layer's probe fits, a + b x prompts: measured on this project's 2-core machine
#: (the bundled model, 160 prompts: 2.2 s; SmolLM2, 38 prompts: 1.6 s; under other engineers' load)
FIT_S, FIT_S_PER_PROMPT = 1.4, 0.005


def probes_cost(backend: ModelBackend, pairs: Sequence[PromptPair], *, layers: Sequence[int] | None = None):
    """The ``engine.cost.Cost`` of :func:`number_probes`: the residual pass (:func:`residual_pass_work`) and the fits,
    one layer per worker process (:data:`FIT_S` + :data:`FIT_S_PER_PROMPT` x prompts seconds each)."""
    from engine.cost import estimate
    n_layers = len(all_layers(backend) if layers is None else layers)
    workers = fit_workers(n_layers)
    fits = -(-n_layers // workers) * (FIT_S + FIT_S_PER_PROMPT * len(pairs))
    return estimate(backend, pairs, residual_pass_work(backend, pairs), other_s=fits)


def layers_param(layers: Sequence[int] | None) -> str | list[int]:
    return "all" if layers is None else sorted(set(int(x) for x in layers))


def cached_number_probes(backend: ModelBackend, pairs: Sequence[PromptPair], *, layers: Sequence[int] | None = None,
                         seed: int = 0, cache=None, progress: ProgressFn | None = None
                         ) -> tuple[list[NumberRow], bool]:
    """:func:`number_probes` through the result cache: (rows, computed)."""
    from engine.results import run_cached_rows
    params = {"version": VERSION, "dtype": backend.facts.dtype, "layers": layers_param(layers), "seed": seed,
              "folds": [MIN_FOLDS, FOLDS], "logreg_C": LOGREG_C, "ridge_alpha": RIDGE_ALPHA, "periods": list(PERIODS)}
    rows, _, computed = run_cached_rows(
        backend, pairs, METHOD, params,
        lambda: (number_probes(backend, pairs, layers=layers, seed=seed, progress=progress), None),
        NumberRow, ("score", "baseline"), cache)
    return rows, computed


def default_layer(rows: Sequence[NumberRow]) -> int:
    """The layer the helix views start at: where C first decodes at END, else the last layer probed."""
    first = first_decode_layer(rows)
    return first if first is not None else max(r.layer for r in rows)


def first_decode_layer(rows: Sequence[NumberRow], target: str = "C", position: str = "END",
                       threshold: float = DECODE_THRESHOLD) -> int | None:
    """The first layer whose logistic probe of ``target`` at ``position`` scores ≥ ``threshold``."""
    mine = sorted((r for r in rows if r.method == "logistic" and r.target == target and r.position == position),
                  key=lambda r: r.layer)
    return next((r.layer for r in mine if r.score >= threshold), None)


def decode_words(rows: Sequence[NumberRow], target: str = "C", position: str = "END",
                 threshold: float = DECODE_THRESHOLD) -> str | None:
    """Where ``target`` decodes at ``position`` (:func:`first_decode_layer`), in words true of every later layer:
    "from layer L on" only when none falls below ``threshold`` again, else the first layer and how many of the later
    ones keep it; None when no layer decodes it."""
    first = first_decode_layer(rows, target, position, threshold)
    if first is None:
        return None
    later = [r for r in rows if r.method == "logistic" and r.target == target and r.position == position
             and r.layer > first]
    kept = sum(r.score >= threshold for r in later)
    where = "the embedding" if first < 0 else f"layer {first}"
    if kept == len(later):
        return f"from {where} on"
    return f"first at {where} (and at {kept} of the {len(later)} layers after it)"
