"""Number representations: how the residual stream holds A, B and the answer C, layer by layer.

The paper stops at "heads move the operands to END, MLPs write the answer".  Later work reads the
numbers themselves: linear probes of operands and result (Stolfo et al., 2023; Nikankin et al., 2025),
Fourier features of number tokens (Zhou et al., 2024: periods 2, 5, 10) and a generalized helix
(Kantamneni & Tegmark, 2025: cos/sin at periods 2, 5, 10, 100 plus a linear part).  What is computed,
exactly (``P`` prompt pairs, reference prompts only):

**Activations.**  x[l, pos, i] is the residual stream of prompt i at layer l: ``resid_post[l]`` for
l = 0..L-1 and ``resid_pre[0]`` (the embedding, positional part included) as layer -1, at three
positions: ``END`` (the last prompt token, where the answer's first token is predicted), ``A`` (the last
token of operand A) and ``B`` (the last token of operand B) -- the operand positions are the last
positions with the roles "operand A" / "operand B" of :func:`engine.techniques.attention.token_roles`.
Targets are the numbers A, B and C of each prompt (C = the answer, not its first token).
One forward pass per prompt set reads every layer at the three positions and the END logits; the probes, the
circle, helix patching and the causal check of the same prompt set and weights share it, and shifts at END share one
computation of the prompts' keys and values before END (:func:`remembered`: the last of each, in memory) -- made by
that same pass where the shifts will continue them (:func:`keeps_prefixes`).

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

**2. Fourier view.**  The numbers 0..99 when each is one token of its own under the answer-token rule,
else the digits 0..9 (else a ValueError: no number tokens).  E[n] is the number token's embedding
(``hook_embed``) and U[n] = W_U[:, token(n)] its unembedding, n = 0..N-1.  The DFT over the number
axis, F[k] = Σ_n E[n] e^{-2πikn/N} (a vector of d_model complex numbers, numpy.fft.fft along n), gives
magnitude(k) = ||F[k]||₂ for k = 1..N//2 (period N/k), and share(k) = magnitude(k)² / Σ_{k'=1..N//2}
magnitude(k')².  The three k with the largest magnitude are marked ``dominant``.  The control (space ``text
frequency``): the same spectrum of log(1 + count[n]), count[n] = how often n is written as a whole number in the
questions of GSM8K, SVAMP, AddSub and SingleEq (``../shared/data``) -- periods 2, 5, 10 appear in the frequency of
numbers in text itself, so a peak the embedding shares with it proves nothing.

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

**4. Causal check.**  At the layer l* where C first decodes at END (logistic score ≥ ``DECODE_THRESHOLD``;
the best layer when none reaches it; never the embedding), with μ_c the mean of x[l*, END] over the
prompts whose C = c (values kept as for the probe, :func:`class_folds`): for each prompt i (C_i = c), a target
c' drawn (seeded) among the kept values whose first answer token differs from c's, the END residual leaving layer l* is
replaced by x + (μ_c' - μ_c) (a hook on ``resid_post[l*]`` at END only), and the rest of the model runs.
success = fraction of prompts whose top next token is c's' first answer token; stays = fraction whose
top token is still C's first token.  Control (``random``): the same norm ||μ_c' - μ_c|| along a random
Gaussian direction (seeded).  relative_norm = mean ||μ_c' - μ_c|| / ||x[l*, END]||.  A probe can read
C from directions the model does not use; a shift that moves the answer shows a direction it does.  Whether the
model uses the *helix* (not only a class-mean direction) is :mod:`engine.techniques.helix_patch`.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from engine.backends import hooks
from engine.backends.base import ModelBackend
from engine.machinery.batching import batches, check_pairs, pad, pad_id
from engine.numerics import logistic
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptError, PromptPair, answer_tokens, prompt_set_hash
from engine.prompts.templates import TEMPLATES_BY_ID
from engine.techniques.attention import token_roles

METHOD = "numbers"
VERSION = 4  # bumped when a quantity of the docstring changes (part of every cache key below)
POSITIONS: tuple[str, ...] = ("END", "A", "B")
TARGETS: tuple[str, ...] = ("A", "B", "C")
ROLE_OF = {"A": "operand A", "B": "operand B"}
FOLDS = 5
MIN_FOLDS = 3  # the fewest folds (and prompts per value) a classification probe runs with
DIGIT_PLACES: tuple[int, ...] = (1, 10)
LOGREG_C = 1.0
RIDGE_ALPHA = 1.0
PERIODS: tuple[int, ...] = (2, 5, 10, 100)
DECODE_THRESHOLD = 0.9
CONTINUE_ROWS = 256  # rows one continuation call takes: shifts of a chunk share a call up to this
KEEP_PREFIX_BYTES = 512 * 2 ** 20  # larger prefixes (a big model on a GPU) are made per call, not kept
N_DOMINANT = 3


# ---------------------------------------------------------------------------------------------
# activations
# ---------------------------------------------------------------------------------------------

def positions(backend: ModelBackend, pair: PromptPair) -> dict[str, int]:
    """{"END": last token, "A": A's last token, "B": B's last token} of ``pair.ref_ids``."""
    roles = token_roles(backend, pair)
    out = {"END": len(pair.ref_ids) - 1}
    for name, role in ROLE_OF.items():
        at = [i for i, r in enumerate(roles) if r == role]
        if not at:
            raise ValueError(f"no {role} token in {pair.ref_text!r}: the operands must be written in digits")
        out[name] = at[-1]
    return out


def target_values(pairs: Sequence[PromptPair]) -> dict[str, np.ndarray]:
    """{"A": [P], "B": [P], "C": [P]} as float64."""
    return {"A": np.array([float(p.a) for p in pairs]), "B": np.array([float(p.b) for p in pairs]),
            "C": np.array([float(p.answer) for p in pairs])}


def all_layers(backend: ModelBackend) -> list[int]:
    return list(range(-1, backend.facts.n_layers))


def check_layers(layers: Sequence[int], n_layers: int) -> list[int]:
    bad = [x for x in layers if not -1 <= x < n_layers]
    if bad or not layers:
        raise ValueError(f"layers {bad or '(none)'} do not exist: give -1 (embedding) .. {n_layers - 1}")
    return sorted(set(int(x) for x in layers))


def resid_hook(layer: int) -> hooks.HookName:
    """The residual stream leaving ``layer`` (-1: the embedding, resid_pre[0])."""
    return hooks.resid_pre(0) if layer < 0 else hooks.resid_post(layer)


@torch.no_grad()
def residuals(backend: ModelBackend, pairs: Sequence[PromptPair], layers: Sequence[int], *, batch_size: int = 64,
              progress: ProgressFn | None = None, total: int | None = None) -> np.ndarray:
    """x[layer, position, prompt, d_model] (float64) for ``layers`` (-1 = resid_pre[0]) and POSITIONS."""
    return residuals_and_end_logits(backend, pairs, layers, batch_size=batch_size, progress=progress, total=total)[0]


@torch.no_grad()
def residuals_and_end_logits(backend: ModelBackend, pairs: Sequence[PromptPair], layers: Sequence[int], *,
                             batch_size: int = 64, progress: ProgressFn | None = None, total: int | None = None
                             ) -> tuple[np.ndarray, torch.Tensor]:
    """(:func:`residuals`, the next-token logits at END [P, vocab]) of one pass: the final norm and the unembedding
    run on END only."""
    check_pairs(pairs, backend.facts.vocab_size)
    layers = check_layers(layers, backend.facts.n_layers)
    names = [resid_hook(x) for x in layers]
    at = [positions(backend, p) for p in pairs]
    pos = torch.tensor([[a[n] for n in POSITIONS] for a in at])  # [P, 3]
    out = np.zeros((len(layers), len(POSITIONS), len(pairs), backend.facts.d_model))
    logits = torch.empty(len(pairs), backend.facts.vocab_size)
    chunks = batches(len(pairs), batch_size)
    for ci, idx in enumerate(chunks):
        ids, mask, end = pad([pairs[i].ref_ids for i in idx], pad_id(backend))
        lg, c = backend.run_with_cache_at(ids, mask, names, end[:, None])  # lg [b, 1, vocab]
        logits[list(idx)] = lg[:, 0].float().cpu()
        rows = torch.arange(len(idx))[:, None]
        for j, name in enumerate(names):
            act = c[name][rows, pos[list(idx)].to(c[name].device)]  # [b, 3, d_model]
            out[j][:, list(idx)] = act.double().cpu().numpy().transpose(1, 0, 2)
        if progress is not None:
            progress(ci + 1, total or len(chunks))
    return out, logits


_LAST_LOCK = threading.Lock()
_LAST: dict[str, tuple[tuple, object]] = {}  # kind -> (key, value): the last pass of each kind


def remembered(kind: str, backend: ModelBackend, pairs: Sequence[PromptPair], make, *, keep: bool = True):
    """``make()``, kept for the last (weights, dtype, prompt set) of ``kind``: the probes, the circle, helix
    patching and the causal check of one prompt set share one residual pass and one prefix (a page's first visit
    runs them one after the other).  ``keep`` False: made, not kept (and the last one of ``kind`` let go)."""
    key = (backend.facts.fingerprint, backend.facts.dtype, prompt_set_hash(pairs))
    with _LAST_LOCK:
        hit = _LAST.get(kind)
    if hit is not None and hit[0] == key:
        return hit[1]
    with _LAST_LOCK:
        _LAST.pop(kind, None)  # the last one is not needed while the new one is made
    value = make()
    if keep:
        with _LAST_LOCK:
            _LAST[kind] = (key, value)
    return value


def residual_pass(backend: ModelBackend, pairs: Sequence[PromptPair], *, progress: ProgressFn | None = None,
                  total: int | None = None) -> tuple[np.ndarray, torch.Tensor]:
    """:func:`residuals_and_end_logits` of every layer (-1 .. L-1: layer l at index l + 1), remembered for the last
    prompt set (:func:`remembered`); where shifts at END will continue the prompts' prefixes
    (:func:`keeps_prefixes`), the same pass keeps them (:func:`residuals_and_prefixes`)."""
    def make():
        if not keeps_prefixes(backend, pairs):
            return residuals_and_end_logits(backend, pairs, all_layers(backend), progress=progress, total=total)
        out, kept = residuals_and_prefixes(backend, pairs, all_layers(backend), progress=progress, total=total)
        remembered("prefixes", backend, pairs, lambda: kept)
        return out
    return remembered("residuals", backend, pairs, make)


def keeps_prefixes(backend: ModelBackend, pairs: Sequence[PromptPair]) -> bool:
    """Whether the residual pass keeps X_r's keys and values for the shifts at END: the backend continues prompts,
    every prompt has a token before END, the keys and values fit :data:`KEEP_PREFIX_BYTES`, and continuing them pays
    for a single shift (:func:`continuation_pays`)."""
    return (backend.continues and min(len(p.ref_ids) for p in pairs) >= 2
            and prefix_bytes(backend, pairs) <= KEEP_PREFIX_BYTES and continuation_pays(backend, pairs, 1))


@torch.no_grad()
def residuals_and_prefixes(backend: ModelBackend, pairs: Sequence[PromptPair], layers: Sequence[int], *,
                           progress: ProgressFn | None = None, total: int | None = None
                           ) -> tuple[tuple[np.ndarray, torch.Tensor], list["Prefix"]]:
    """(:func:`residuals_and_end_logits`, :func:`prefixes`) from one pass per chunk of equal-length prompts that
    keeps their keys and values (``prefix_with_cache_at``): the END logits are the full prompt's, and each chunk's
    unshifted continuation of END from its keys and values cropped before END is the check
    :func:`continued_readouts` holds against them."""
    from engine.machinery.batching import TOKENS_PER_PASS, length_chunks
    check_pairs(pairs, backend.facts.vocab_size)
    names = [resid_hook(x) for x in check_layers(layers, backend.facts.n_layers)]
    out = np.zeros((len(names), len(POSITIONS), len(pairs), backend.facts.d_model))
    logits = torch.empty(len(pairs), backend.facts.vocab_size)
    kept = []
    chunks = length_chunks(pairs, TOKENS_PER_PASS)
    for ci, idx in enumerate(chunks):
        idx = list(idx)
        ids = torch.tensor([pairs[i].ref_ids for i in idx])  # [n, T]: one length, no padding
        T = ids.shape[1]
        pos = torch.tensor([[positions(backend, pairs[i])[n] for n in POSITIONS] for i in idx])  # [n, 3]
        cache, lg, acts = backend.prefix_with_cache_at(ids, names, pos)
        logits[idx] = lg.float().cpu()
        for j, name in enumerate(names):
            out[j][:, idx] = acts[name].double().cpu().numpy().transpose(1, 0, 2)  # [n, 3, d] -> [3, n, d]
        clean = backend.continue_end_logits(cache, torch.arange(len(idx)), ids[:, T - 1:], start=T - 1)
        kept.append(Prefix(idx, cache, ids[:, T - 1:], clean.float().cpu()))
        if progress is not None:  # in the padded pass's units (its batches of 64), as the caller's total counts
            units = len(batches(len(pairs), 64))
            progress(-(-(ci + 1) * units // len(chunks)), total or units)
    return (out, logits), kept


def layer_residuals(backend: ModelBackend, pairs: Sequence[PromptPair], layers: Sequence[int], **kw) -> np.ndarray:
    """x[layer, position, prompt, d_model] of :func:`residuals`, read from :func:`residual_pass`."""
    layers = check_layers(layers, backend.facts.n_layers)
    return residual_pass(backend, pairs, **kw)[0][[x + 1 for x in layers]]


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
    """The probe and helix rows of the module docstring for ``layers`` (default: -1 .. L-1)."""
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
    # least-squares fits (more threads would only oversubscribe)
    jobs = Parallel(n_jobs=min(len(layers), os.cpu_count() or 1), return_as="generator", inner_max_num_threads=1)
    for j, rows in enumerate(jobs(delayed(layer_rows)(layer, X[j], values, seed) for j, layer in enumerate(layers))):
        out.extend(rows)
        if progress is not None:
            progress(n_batches + j + 1, total)
    return out


#: seconds one worker takes for one layer's probe fits, a + b x prompts: measured on this project's 2-core machine
#: (the bundled model, 160 prompts: 2.2 s; SmolLM2, 38 prompts: 1.6 s; under other engineers' load)
FIT_S, FIT_S_PER_PROMPT = 1.4, 0.005


def forget_residuals() -> None:
    """Let go of the remembered residual pass and prefixes (:func:`remembered`): the next use runs them."""
    with _LAST_LOCK:
        _LAST.clear()


def residual_pass_work(backend: ModelBackend, pairs: Sequence[PromptPair]):
    """The forward work of :func:`residual_pass` (``engine.cost.Work``): none when it is remembered for these pairs,
    else one END-only pass (its prefixes kept: one pass per chunk of one length and its END continued)."""
    from engine.cost import NO_WORK, Work, padded_passes
    key = (backend.facts.fingerprint, backend.facts.dtype, prompt_set_hash(pairs))
    with _LAST_LOCK:
        hit = _LAST.get("residuals")
    if hit is not None and hit[0] == key:
        return NO_WORK
    if not keeps_prefixes(backend, pairs):
        return padded_passes([p.ref_ids for p in pairs], 64)
    from engine.machinery.batching import TOKENS_PER_PASS, length_chunks
    w = NO_WORK
    for idx in length_chunks(pairs, TOKENS_PER_PASS):
        n, T = len(idx), len(pairs[idx[0]].ref_ids)
        w += Work(2, n * T + n, 2 * n)
    return w


def probes_cost(backend: ModelBackend, pairs: Sequence[PromptPair], *, layers: Sequence[int] | None = None):
    """The ``engine.cost.Cost`` of :func:`number_probes`: the residual pass (:func:`residual_pass_work`) and the fits,
    one layer per worker process (:data:`FIT_S` + :data:`FIT_S_PER_PROMPT` x prompts seconds each)."""
    from engine.cost import estimate
    n_layers = len(all_layers(backend) if layers is None else layers)
    workers = min(n_layers, os.cpu_count() or 1)
    fits = -(-n_layers // workers) * (FIT_S + FIT_S_PER_PROMPT * len(pairs))
    return estimate(backend, pairs, residual_pass_work(backend, pairs), other_s=fits)


def shifts_work(backend: ModelBackend, pairs: Sequence[PromptPair], n_shifts: int):
    """The forward work of :func:`shifted_readouts` of ``n_shifts`` shifts at END after :func:`residual_pass`
    (``engine.cost.Work``), at most: one END-only pass of the prompts per shift."""
    from engine.cost import padded_passes
    return padded_passes([p.ref_ids for p in pairs], 64) * n_shifts


def causal_check_work(backend: ModelBackend, pairs: Sequence[PromptPair]):
    """The forward work of :func:`causal_check` (``engine.cost.Work``): the residual pass and two shifts."""
    return residual_pass_work(backend, pairs) + shifts_work(backend, pairs, 2)


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


# ---------------------------------------------------------------------------------------------
# 2. Fourier view of the number tokens
# ---------------------------------------------------------------------------------------------

def number_range(backend: ModelBackend, prompt: str) -> tuple[list[int], list[int]]:
    """(numbers, their token ids): 0..99 when each is a single token of its own, else 0..9; ValueError if neither."""
    for upto in (99, 9):
        ids = []
        for n in range(upto + 1):
            try:
                t = answer_tokens(backend.tokenizer, prompt, n)
            except PromptError:
                break
            if len(t.answer_ids) != 1:
                break
            ids.append(t.answer_id)
        if len(ids) == upto + 1 and len(set(ids)) == len(ids):
            return list(range(upto + 1)), ids
    raise ValueError("this model's tokenizer has no single tokens for the digits 0-9: the Fourier view needs "
                     "number tokens (pick another model)")


@torch.no_grad()
def number_vectors(backend: ModelBackend, token_ids: Sequence[int]) -> dict[str, np.ndarray]:
    """{"embedding": E [N, d], "unembedding": U [N, d]} of the number tokens."""
    _, c = backend.run_with_cache(torch.tensor(list(token_ids))[:, None], None, [hooks.embed()])
    E = c[hooks.embed()][:, 0].double().cpu().numpy()
    W_U, _ = backend.unembed()
    U = W_U[:, list(token_ids)].T.double().cpu().numpy()
    return {"embedding": E, "unembedding": U}


@dataclass(frozen=True)
class SpectrumRow:
    space: str        # embedding | unembedding
    k: int            # frequency (cycles over the N numbers)
    period: float     # N / k
    dominant: bool    # among the N_DOMINANT largest magnitudes
    magnitude: float  # ||F[k]||₂
    share: float      # magnitude² / Σ_k' magnitude²  (k' = 1..N//2)


def spectrum(V: np.ndarray, space: str) -> list[SpectrumRow]:
    """The DFT magnitudes of V [N, d] along the number axis (module docstring, 2)."""
    N = V.shape[0]
    F = np.fft.fft(V, axis=0)  # [N, d]
    ks = np.arange(1, N // 2 + 1)
    mag = np.linalg.norm(F[ks], axis=1)
    energy = float((mag ** 2).sum())
    top = set(ks[np.argsort(-mag, kind="stable")[:N_DOMINANT]].tolist())
    return [SpectrumRow(space, int(k), N / int(k), int(k) in top, float(m), float(m * m / energy) if energy else 0.0)
            for k, m in zip(ks, mag)]


#: The math sets whose question texts give each number's frequency in text (the Fourier view's control).
FREQUENCY_SETS = ("gsm8k", "svamp", "addsub", "singleeq")
FREQUENCY_SPACE = "text frequency"
_WHOLE_NUMBER = re.compile(r"(?<![\d.,])\d+(?![\d]|[.,]\d)")


def number_frequencies(N: int, data_dir: Path | None = None) -> tuple[np.ndarray, int]:
    """How often each integer 0..N-1 is written as a whole number (not part of a longer number or a decimal) in the
    questions of :data:`FREQUENCY_SETS` (every ``*.normalized.jsonl`` split in ``../shared/data``); (counts [N],
    questions read).  ValueError when none can be read."""
    import json

    from engine.paths import default_data_dir
    root = data_dir or default_data_dir()
    counts = np.zeros(N)
    read = 0
    for name in FREQUENCY_SETS:
        for path in sorted((root / name).glob("*.normalized.jsonl")):
            with open(path, encoding="utf-8") as f:  # lines end at "\n" only (questions hold U+2028)
                for line in f:
                    if not line.strip():
                        continue
                    read += 1
                    for m in _WHOLE_NUMBER.findall(json.loads(line).get("question", "")):
                        if int(m) < N:
                            counts[int(m)] += 1
    if not read:
        raise ValueError(f"no question texts under {root} ({', '.join(FREQUENCY_SETS)}): the frequency baseline "
                         f"needs the math sets (set ARITHLAB_DATA)")
    return counts, read


def number_spectrum(backend: ModelBackend, pairs: Sequence[PromptPair]) -> list[SpectrumRow]:
    """The spectra of the number tokens' embeddings and unembeddings, and of log(1 + their frequency in text): a
    period the text's own frequencies have (numbers ending in 0 or 5 are written more often) shows in any vector
    that encodes frequency, so a spectral peak alone proves no Fourier feature."""
    if not pairs:
        raise ValueError("no prompt pairs")
    numbers, ids = number_range(backend, pairs[0].ref_text)
    vecs = number_vectors(backend, ids)
    counts, _ = number_frequencies(len(numbers))
    return (spectrum(vecs["embedding"], "embedding") + spectrum(vecs["unembedding"], "unembedding")
            + spectrum(np.log1p(counts)[:, None], FREQUENCY_SPACE))


def cached_number_spectrum(backend: ModelBackend, pairs: Sequence[PromptPair], *, cache=None
                           ) -> tuple[list[SpectrumRow], bool]:
    from engine.results import run_cached_rows
    params = {"version": VERSION, "dtype": backend.facts.dtype, "n_dominant": N_DOMINANT,
              "frequency": {"sets": list(FREQUENCY_SETS), "v": 1}}
    rows, _, computed = run_cached_rows(backend, pairs, METHOD + "_spectrum", params,
                                        lambda: (number_spectrum(backend, pairs), None), SpectrumRow,
                                        ("magnitude", "share"), cache)
    return rows, computed


def dominant_periods(rows: Sequence[SpectrumRow], space: str) -> list[float]:
    mine = sorted((r for r in rows if r.space == space and r.dominant), key=lambda r: -r.magnitude)
    return [round(r.period, 3) for r in mine]


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


# ---------------------------------------------------------------------------------------------
# 4. causal check
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CausalRow:
    layer: int
    method: str          # class-means (μ_c' - μ_c) | random (same norm, random direction)
    n_prompts: int
    success: float       # top token becomes C''s first token
    stays: float         # top token stays C's first token
    relative_norm: float  # mean ||shift|| / ||x[l*, END]||


def value_token(backend: ModelBackend, pair: PromptPair, value: float) -> int:
    """The first token of ``value`` as the answer of ``pair``'s prompt (the answer-token rule)."""
    tpl = TEMPLATES_BY_ID.get(pair.template)
    v = int(value) if float(value).is_integer() else value
    return answer_tokens(backend.tokenizer, pair.ref_text, v, getattr(tpl, "answer_sep", " ")).answer_id


@dataclass
class CausalPlan:
    """Which prompts are moved where: prompt indices, their C' and token ids, and the shifts [n, d]."""

    idx: list[int]
    target: list[float]
    target_token: list[int]
    shift: np.ndarray   # [n, d] class-mean shift
    random: np.ndarray  # [n, d] same norms, random directions


def causal_plan(backend: ModelBackend, pairs: Sequence[PromptPair], X: np.ndarray, seed: int = 0) -> CausalPlan:
    """X [P, d]: the END residual at l*.  C' per prompt and the shifts (module docstring, 4)."""
    c = target_values(pairs)["C"]
    keep = class_folds(c)[1]
    vals = np.unique(c[keep])
    mu = {float(v): X[c == v].mean(0) for v in vals}
    tok = {float(v): value_token(backend, pairs[int(np.flatnonzero(c == v)[0])], float(v)) for v in vals}
    rng = np.random.default_rng(seed)
    idx, tgt, ttok, shift = [], [], [], []
    for i in np.flatnonzero(keep):
        ci = float(c[i])
        cand = [float(v) for v in vals if float(v) != ci and tok[float(v)] != pairs[i].answer_id]
        if not cand:
            continue
        cp = cand[int(rng.integers(len(cand)))]
        idx.append(int(i))
        tgt.append(cp)
        ttok.append(value_token(backend, pairs[i], cp))
        shift.append(mu[cp] - mu[ci])
    if not idx:
        raise ValueError("no prompt has another answer value with a different first token: the causal check "
                         "needs answers that start with different tokens (use more prompts per operation or add "
                         "operations)")
    S = np.stack(shift)
    G = rng.standard_normal(S.shape)
    G *= (np.linalg.norm(S, axis=1) / np.linalg.norm(G, axis=1))[:, None]
    return CausalPlan(idx, tgt, ttok, S, G)


@torch.no_grad()
def shifted_readout(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, at: Sequence[int] | None,
                    shift: np.ndarray, tokens: np.ndarray | None = None, batch_size: int = 64
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Each prompt run with ``shift[i]`` [d] added to the residual stream leaving ``layer`` (-1: the embedding) at
    position ``at[i]`` (None: its END): (top next token at END [P], END logits of ``tokens[i]`` [P, m])."""
    top, picked = [], []
    for idx in batches(len(pairs), batch_size):
        ids, mask, end = pad([pairs[i].ref_ids for i in idx], pad_id(backend))
        where = end if at is None else torch.tensor([at[i] for i in idx])
        delta = torch.tensor(shift[list(idx)])

        def add(act: torch.Tensor, where=where, delta=delta) -> torch.Tensor:  # [b, pos, d_model]
            act = act.clone()
            rows = torch.arange(act.shape[0], device=act.device)
            act[rows, where.to(act.device)] += delta.to(act.device, act.dtype)
            return act

        with backend.hooks([(resid_hook(layer), add)]):
            logits = backend.end_logits(ids, mask, end)  # [b, vocab]
        top.append(logits.argmax(-1).cpu().numpy())
        if tokens is not None:
            want = torch.as_tensor(tokens[list(idx)], device=logits.device)  # [b, m]
            picked.append(logits.gather(1, want).double().cpu().numpy())
    return np.concatenate(top), (np.concatenate(picked) if tokens is not None else np.zeros((len(pairs), 0)))


def shifted_readouts(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, at: Sequence[int] | None,
                     shifts: Sequence[np.ndarray], tokens: np.ndarray | None = None,
                     end_logits: torch.Tensor | None = None, idx: Sequence[int] | None = None
                     ) -> list[tuple[np.ndarray, np.ndarray]]:
    """:func:`shifted_readout` of each of ``shifts`` for the prompts ``idx`` of ``pairs`` (default all; ``at``,
    ``shift`` and ``tokens`` have one row per prompt of ``idx``).  At END (``at`` None) with the unshifted END
    logits of every pair ``end_logits`` [P, vocab] at hand, X_r's keys and values before END are computed once per
    prompt set (:func:`prefixes`) and each shift continues them with END alone (:func:`continued_readouts`) where
    that is less work; else full passes."""
    idx = list(range(len(pairs))) if idx is None else list(idx)
    if at is None and end_logits is not None and continuation_pays(backend, pairs, len(shifts)):
        done = continued_readouts(backend, pairs, layer, shifts, tokens, end_logits, idx)
        if done is not None:
            return done
    moved = [pairs[i] for i in idx]
    return [shifted_readout(backend, moved, layer, at, s, tokens) for s in shifts]


def continuation_pays(backend: ModelBackend, pairs: Sequence[PromptPair], n_shifts: int) -> bool:
    """Whether the prefixes + their continuations (per chunk: the check, then the shifts ``CONTINUE_ROWS`` rows a
    call) cost fewer token positions (a call's fixed cost counted, :func:`engine.machinery.batching.call_tokens`)
    than one padded pass per shift."""
    if not backend.continues:
        return False
    from engine.machinery.batching import TOKENS_PER_PASS, call_tokens, length_chunks
    call = call_tokens(backend.facts)
    width = max(len(p.ref_ids) for p in pairs)
    full = n_shifts * (len(pairs) * width + len(batches(len(pairs), 64)) * call)
    chunks = length_chunks(pairs, TOKENS_PER_PASS)
    calls = sum(1 + -(-n_shifts // max(1, CONTINUE_ROWS // len(c))) for c in chunks)  # the check, then the shifts
    cont = sum(len(p.ref_ids) for p in pairs) + len(chunks) * call + calls * call + (n_shifts + 1) * len(pairs)
    return cont < full


@dataclass
class Prefix:
    """One chunk of equal-length prompts: their indices, the keys and values of every position before END (the
    backend's opaque cache), END's token [n, 1] and the unshifted continuation's END logits [n, vocab]."""

    idx: list[int]
    cache: object
    end_ids: torch.Tensor
    clean: torch.Tensor


@torch.no_grad()
def prefixes(backend: ModelBackend, pairs: Sequence[PromptPair]) -> list[Prefix] | None:
    """X_r's prefixes of every prompt, per chunk of equal length (None: a prompt of one token), remembered for the
    last prompt set (:func:`remembered`)."""
    from engine.machinery.batching import TOKENS_PER_PASS, length_chunks

    def make() -> list[Prefix] | None:
        out = []
        for idx in length_chunks(pairs, TOKENS_PER_PASS):
            ids = torch.tensor([pairs[i].ref_ids for i in idx])  # [n, T]: one length, no padding
            T = ids.shape[1]
            if T < 2:
                return None
            cache = backend.prefix(ids[:, :T - 1])
            clean = backend.continue_end_logits(cache, torch.arange(len(idx)), ids[:, T - 1:], start=T - 1)
            out.append(Prefix(list(idx), cache, ids[:, T - 1:], clean.float().cpu()))
        return out

    return remembered("prefixes", backend, pairs, make, keep=prefix_bytes(backend, pairs) <= KEEP_PREFIX_BYTES)


def prefix_bytes(backend: ModelBackend, pairs: Sequence[PromptPair]) -> int:
    """The keys and values :func:`prefixes` holds: 2 x layers x prefix tokens x KV heads x d_head x the dtype's size."""
    f = backend.facts
    try:
        size = torch.empty((), dtype=getattr(torch, f.dtype)).element_size()
    except (AttributeError, TypeError):
        size = 4
    return 2 * f.n_layers * sum(len(p.ref_ids) - 1 for p in pairs) * f.n_kv_heads * f.d_head * size


@torch.no_grad()
def continued_readouts(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, shifts: Sequence[np.ndarray],
                       tokens: np.ndarray | None, end_logits: torch.Tensor, idx: Sequence[int] | None = None
                       ) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """:func:`shifted_readouts` at END from X_r's prefixes (:func:`prefixes`): the unshifted continuation must
    reproduce ``end_logits`` [P, vocab] (else None: the caller runs full passes); then each shift continues the
    prompts ``idx`` (default all) with END alone, ``shift[j]`` added to the residual of prompt ``idx[j]``."""
    from engine.machinery.shortcut import ShortcutMismatch, check_reproduces, logit_scale
    idx = list(range(len(pairs))) if idx is None else list(idx)
    chunks = prefixes(backend, pairs)
    if chunks is None:
        return None
    row_of = {i: j for j, i in enumerate(idx)}  # prompt -> its row in shifts / tokens
    m = 0 if tokens is None else tokens.shape[1]
    out = [(np.zeros(len(idx), dtype=np.int64), np.zeros((len(idx), m))) for _ in shifts]
    for c in chunks:
        want = end_logits[c.idx]
        try:
            check_reproduces("continuing the prompts' END token from their own keys and values", c.clean, want,
                             logit_scale(want)[:, None].expand_as(want), backend.facts.dtype)
        except ShortcutMismatch:
            return None
        mine = [r for r, i in enumerate(c.idx) if i in row_of]  # rows of the chunk that are shifted
        if not mine:
            continue
        rows, to = torch.tensor(mine), [row_of[c.idx[r]] for r in mine]
        T = len(pairs[c.idx[0]].ref_ids)
        per_call = max(1, CONTINUE_ROWS // len(mine))  # shifts continued together: one call, their rows stacked
        for g in range(0, len(shifts), per_call):
            group = list(range(g, min(g + per_call, len(shifts))))
            delta = torch.cat([torch.tensor(shifts[k][to]) for k in group])  # [len(group) * n, d_model]

            def add(act: torch.Tensor, delta=delta) -> torch.Tensor:  # [len(group) * n, 1, d_model]: END alone
                act = act.clone()
                act[:, 0] += delta.to(act.device, act.dtype)
                return act

            with backend.hooks([(resid_hook(layer), add)]):
                lg = backend.continue_end_logits(c.cache, rows.repeat(len(group)), c.end_ids[rows].repeat(
                    len(group), 1), start=T - 1)  # [len(group) * n, vocab]
            for j, k in enumerate(group):
                part = lg[j * len(mine):(j + 1) * len(mine)]
                top, picked = out[k]
                top[to] = part.argmax(-1).cpu().numpy()
                if tokens is not None:
                    picked[to] = part.gather(1, torch.as_tensor(tokens[to], device=part.device)).double().cpu().numpy()
    return out


def shifted_top_tokens(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, shift: np.ndarray,
                       batch_size: int = 64) -> np.ndarray:
    """Top next token at END of each prompt with ``shift[i]`` added to resid_post[layer] at its END. [P]"""
    return shifted_readout(backend, pairs, layer, None, shift, batch_size=batch_size)[0]


def causal_check(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, *, seed: int = 0,
                 progress: ProgressFn | None = None) -> list[CausalRow]:
    """The causal check of the module docstring at ``layer`` (≥ 0)."""
    hooks.validate_layer(layer, backend.facts.n_layers)
    X, lg = residual_pass(backend, pairs)
    X = X[layer + 1, POSITIONS.index("END")]  # [P, d]
    plan = causal_plan(backend, pairs, X, seed)
    moved = [pairs[i] for i in plan.idx]
    clean = np.array([p.answer_id for p in moved])
    want = np.array(plan.target_token)
    rel = float((np.linalg.norm(plan.shift, axis=1) / np.linalg.norm(X[plan.idx], axis=1)).mean())
    runs = shifted_readouts(backend, pairs, layer, None, [plan.shift, plan.random], end_logits=lg, idx=plan.idx)
    out = [CausalRow(layer, name, len(moved), float((top == want).mean()), float((top == clean).mean()), rel)
           for name, (top, _) in zip(("class-means", "random"), runs)]
    if progress is not None:
        progress(2, 2)
    return out


def causal_layer(rows: Sequence[NumberRow]) -> int:
    """l*: the first layer ≥ 0 where C decodes at END, else the best such layer."""
    mine = [r for r in rows if r.method == "logistic" and r.target == "C" and r.position == "END" and r.layer >= 0]
    if not mine:
        raise ValueError("the causal check needs the probe of C at END on at least one layer >= 0")
    first = first_decode_layer(mine)
    return first if first is not None else max(mine, key=lambda r: (r.score, -r.layer)).layer


def cached_causal_check(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, *, seed: int = 0,
                        cache=None, progress: ProgressFn | None = None) -> tuple[list[CausalRow], bool]:
    from engine.results import run_cached_rows
    params = {"version": VERSION, "dtype": backend.facts.dtype, "layer": layer, "seed": seed,
              "folds": [MIN_FOLDS, FOLDS]}
    rows, _, computed = run_cached_rows(backend, pairs, METHOD + "_causal", params,
                                        lambda: (causal_check(backend, pairs, layer, seed=seed, progress=progress),
                                                 None),
                                        CausalRow, ("success", "stays", "relative_norm"), cache)
    return rows, computed


# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine numbers``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def parse_layers(text: str | None, n_layers: int) -> list[int] | None:
    """--layers: None / "all" -> None (every layer), else a comma list such as -1,0,5."""
    if text is None or text.strip() == "all":
        return None
    try:
        layers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--layers {text!r} is not a comma list of layer numbers, e.g. -1,0,5") from None
    return check_layers(layers, n_layers)


def cli(args, ctx) -> dict:
    """Probe + helix rows -> CSV (``--spectrum-out``: the DFT rows); prints l*, the causal check, the periods."""
    model, pairs = ctx.model, ctx.pairs
    layers = parse_layers(args.layers, model.facts.n_layers)
    with ctx.progress("number probes") as bar:
        rows, computed = cached_number_probes(model, pairs, layers=layers, cache=ctx.cache,
                                              progress=bar)
    ctx.write_csv(args.out, [r.__dict__ for r in rows])
    res: dict = {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs),
                 "answer_tokens": ctx.answer_tokens(pairs), "decode_threshold": DECODE_THRESHOLD}
    res["first_layer_C_decodes_at_END"] = first_decode_layer(rows)
    res["first_layer_A_decodes_at_A"] = first_decode_layer(rows, "A", "A")
    res["first_layer_B_decodes_at_B"] = first_decode_layer(rows, "B", "B")
    last = max(r.layer for r in rows)
    res["last_layer"] = {f"{r.target}@{r.position}": {"accuracy": round(r.score, 4), "shuffled": round(r.baseline, 4),
                                                      "n_prompts": r.n_prompts, "n_classes": r.n_classes}
                         for r in rows if r.layer == last and r.method == "logistic"}
    spec, _ = cached_number_spectrum(model, pairs, cache=ctx.cache)
    if args.spectrum_out is not None:
        ctx.write_csv(args.spectrum_out, [r.__dict__ for r in spec])
        res["spectrum_out"] = str(args.spectrum_out)
    res["number_tokens"] = max(r.k for r in spec) * 2 if spec else 0
    res["dominant_periods"] = {s: dominant_periods(spec, s) for s in ("embedding", "unembedding")}
    if not args.no_causal:
        try:
            layer = causal_layer(rows)
        except ValueError as e:  # C has too few prompts per value: the other results stand
            res["causal_check"] = str(e)
            return res
        with ctx.progress("causal check") as bar:
            causal, _ = cached_causal_check(model, pairs, layer, cache=ctx.cache, progress=bar)
        res["causal_check"] = [r.__dict__ for r in causal]
    return res


# ---------------------------------------------------------------------------------------------
# its sentence of the circuit summary (cached results only; registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def finding(model, pairs, cache, table) -> str | None:
    """Where C decodes from the END residual (the probe), and whether the model uses that direction."""
    from engine.results import NotCached
    try:
        rows, _ = cached_number_probes(model, pairs, cache=cache)
    except NotCached:
        return None
    first = first_decode_layer(rows)
    end_c = {r.layer: r for r in rows if r.method == "logistic" and r.target == "C" and r.position == "END"}
    if not end_c:  # a small set: no value of C occurs MIN_FOLDS times for two values (the probe was not fitted)
        return (f"A linear probe of C was not fitted on these {len(pairs)} prompts: it needs at least {MIN_FOLDS} "
                f"prompts for each of two answers or more; use more prompts per operation.")
    if first is None:
        best = max(end_c.values(), key=lambda r: r.score)
        return (f"A linear probe never reads C from the last token's residual stream at accuracy "
                f"{DECODE_THRESHOLD:.0%} (best: {best.score:.0%} after layer {best.layer}, "
                f"shuffled {best.baseline:.0%}).")
    r = end_c[first]
    text = (f"A linear probe reads C from the last token's residual stream from "
            f"{'the embedding' if first < 0 else f'layer {first}'} on (held-out accuracy {r.score:.0%}, "
            f"shuffled labels {r.baseline:.0%}, {r.n_classes} values).")
    try:
        causal, _ = cached_causal_check(model, pairs, causal_layer(rows), seed=0, cache=cache)
    except (NotCached, ValueError):
        return text
    moved = next(c for c in causal if c.method == "class-means")
    rand = next(c for c in causal if c.method == "random")
    return text + (f" Moving it there by the difference of the class means turns the answer into the new value for "
                   f"{moved.success:.0%} of the prompts (a random direction of the same norm: {rand.success:.0%}).")
