"""Helix-subspace patching: does the model *use* the helix a number is fitted on (Kantamneni & Tegmark, 2025)?

A helix fit (:mod:`engine.techniques.numbers.helix`) shows that a number n *can* be read from the residual stream
along cos/sin directions; it does not show that the model reads it there.  Kantamneni & Tegmark test it
causally: move only the helix part of one prompt's activation to another number's, and see whether the answer
follows -- beside patching the whole activation, and a subspace of the same dimension found without the helix
(PCA).  What is computed, exactly, for one layer l (-1 = the embedding), one position (END, A, B) and one target
number t ∈ {A, B, C}, over the P kept prompt pairs (reference prompts only):

**Fit.**  X [P, d] = x[l, pos] (:func:`engine.techniques.numbers.residuals`), n [P] the target's values,
B(n) [P, 2|PERIODS| + 2] the helix basis (cos, sin of 2πn/T for T = 2, 5, 10, 100, then n and 1) and
Ŵ = lstsq(B(n), X) (in-sample, on all P prompts, as the helix rows of ``numbers``); r = the rank of the
centred helix columns, the dimension the fit spans.

**Donors.**  For prompt i, a donor j is a prompt whose value n_j ≠ n_i and for which prompt i's answer with its
target set to n_j -- C'_i = op_i(n_j, b_i) for A, op_i(a_i, n_j) for B, n_j for C -- is a whole number ≥ 0
whose first answer token (the answer-token rule on prompt i's text) differs from C_i's.  One donor per prompt,
drawn uniformly (``numpy.random.default_rng(seed)``); prompts with none are left out.

**Patches.**  The residual stream leaving layer l at prompt i's ``pos`` token only (one hook; every other
position and layer runs as it would), x_i ← x_i + δ_i with

* ``none``:   δ = 0 (the unpatched model, read from the residual pass's END logits: success 0, stays 1 on kept
  prompts);
* ``full``:   δ = x_j - x_i (the whole activation of the donor: activation patching, the reference);
* ``helix``:  δ = (B(n_j) - B(n_i)) Ŵ (x moved along the fitted helix from n_i to n_j, nothing else);
* ``pca``:    δ = P_r P_rᵀ (x_j - x_i), P_r [d, r] the top r principal directions of X (a subspace of the
  helix's dimension that explains the most variance, found without n);
* ``random``: δ = R Rᵀ (x_j - x_i), R [d, r] orthonormal (QR of a seeded Gaussian matrix): the control.

**Read-out** at END (a patch at END continues every position before END from the prompt's own keys and
values, computed once, where that is less work and reproduces the unpatched END logits:
:func:`engine.techniques.numbers.shifted_readouts`): success = fraction of prompts whose top next token is
C'_i's first token; stays = fraction still on C_i's; ld = logit[C'_i] - logit[C_i] (first tokens), recovered =
(mean ld_patch - mean ld_none) / (mean ld_full - mean ld_none) -- the share of the full patch's
logit-difference change the patch achieves.
Intervals: percentile bootstrap over the prompts (:mod:`engine.numerics.intervals`; success and recovered,
from the per-prompt results, no extra forward pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from engine.backends.base import ModelBackend
from engine.numerics import intervals
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptError, PromptPair, compute_answer
from engine.techniques.numbers import (
    PERIODS,
    POSITIONS,
    TARGETS,
    VERSION,
    cached_number_probes,
    check_layers,
    default_layer,
    helix_basis,
    helix_rank,
    positions,
    principal_directions,
    residual_pass,
    shifted_readouts,
    target_values,
    value_token,
)

METHOD = "helix_patch"
PATCHES: tuple[str, ...] = ("none", "full", "helix", "pca", "random")


@dataclass(frozen=True)
class HelixPatchRow:
    layer: int
    position: str
    target: str
    method: str           # none | full | helix | pca | random
    rank: int             # r: the dimension of the helix fit (and of the pca / random subspaces)
    n_prompts: int
    success: float        # top token becomes C''s first token
    success_low: float
    success_high: float
    stays: float          # top token stays C's first token
    logit_diff: float     # mean logit[C'] - logit[C]
    recovered: float      # (ld - ld_none) / (ld_full - ld_none), means over the prompts
    recovered_low: float
    recovered_high: float


def new_answer(pair: PromptPair, target: str, value: float) -> int | None:
    """C' of ``pair`` with ``target`` set to ``value`` (module docstring, donors); None when not a whole number ≥ 0."""
    if not all(float(v).is_integer() for v in (pair.a, pair.b, value)):
        return None
    a, b, v = int(pair.a), int(pair.b), int(value)
    try:
        c = v if target == "C" else compute_answer(pair.op, v, b) if target == "A" else compute_answer(pair.op, a, v)
    except PromptError:
        return None
    return c if c >= 0 else None


@dataclass
class Donors:
    idx: list[int]          # prompts that have a donor
    donor: list[int]        # their donors j
    new_token: list[int]    # C''s first token per prompt


def donors(backend: ModelBackend, pairs: Sequence[PromptPair], target: str, seed: int = 0) -> Donors:
    n = target_values(pairs)[target]
    rng = np.random.default_rng(seed)
    tokens: dict[tuple[int, int], int | None] = {}

    def token(i: int, c: int) -> int | None:
        if (i, c) not in tokens:
            try:
                tokens[(i, c)] = value_token(backend, pairs[i], c)
            except PromptError:
                tokens[(i, c)] = None
        return tokens[(i, c)]

    out = Donors([], [], [])
    for i, p in enumerate(pairs):
        cand = []
        for j in np.flatnonzero(n != n[i]):
            c = new_answer(p, target, n[j])
            t = token(i, c) if c is not None else None
            if t is not None and t != p.answer_id:
                cand.append((int(j), t))
        if cand:
            j, t = cand[int(rng.integers(len(cand)))]
            out.idx.append(i)
            out.donor.append(j)
            out.new_token.append(t)
    if not out.idx:
        raise ValueError(f"no prompt has another value of {target} that gives an answer with a different first token: "
                         f"helix patching needs prompts with different values (use more prompts per operation)")
    return out


def shifts(X: np.ndarray, n: np.ndarray, d: Donors, seed: int = 0) -> tuple[int, dict[str, np.ndarray]]:
    """(r, {patch: δ [m, d_model]}) of the module docstring for the prompts ``d.idx``."""
    B = helix_basis(n)
    W = np.linalg.lstsq(B, X, rcond=None)[0]  # [2 |PERIODS| + 2, d_model]
    r = helix_rank(n)
    i, j = np.array(d.idx), np.array(d.donor)
    diff = X[j] - X[i]  # [m, d_model]
    P = principal_directions(X, r)  # [d_model, r]
    R = np.linalg.qr(np.random.default_rng(seed).standard_normal((X.shape[1], r)))[0]  # [d_model, r]
    return r, {"none": np.zeros_like(diff), "full": diff, "helix": (B[j] - B[i]) @ W,
               "pca": diff @ P @ P.T, "random": diff @ R @ R.T}


def helix_patch(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, position: str = "END",
                target: str = "C", *, seed: int = 0, progress: ProgressFn | None = None) -> list[HelixPatchRow]:
    """The rows of the module docstring, one per patch."""
    if position not in POSITIONS or target not in TARGETS:
        raise ValueError(f"position must be one of {POSITIONS} and target one of {TARGETS}")
    layer = check_layers([layer], backend.facts.n_layers)[0]
    d = donors(backend, pairs, target, seed)
    X, lg = residual_pass(backend, pairs)
    X = X[layer + 1, POSITIONS.index(position)]  # [P, d_model]
    r, delta = shifts(X, target_values(pairs)[target], d, seed)
    moved = [pairs[i] for i in d.idx]
    at = None if position == "END" else [positions(backend, p)[position] for p in moved]
    tokens = np.array([[t, p.answer_id] for t, p in zip(d.new_token, moved)])  # [m, 2]: C', C
    clean = lg[d.idx]  # [m, vocab]: the unpatched model, from the residual pass itself
    runs = [(clean.argmax(-1).numpy(), clean.gather(1, torch.as_tensor(tokens)).double().numpy())]
    runs += shifted_readouts(backend, pairs, layer, at, [delta[name] for name in PATCHES[1:]], tokens, lg, d.idx)
    hits, ld = {}, {}
    for name, (top, logit) in zip(PATCHES, runs):
        hits[name] = np.stack([top == tokens[:, 0], top == tokens[:, 1]], 1).astype(float)  # [m, 2]
        ld[name] = logit[:, 0] - logit[:, 1]  # [m]
    if progress is not None:
        progress(len(PATCHES), len(PATCHES))

    def recovered(name: str) -> intervals.Interval:
        def stat(idx: np.ndarray) -> float:
            base = ld["none"][idx].mean()
            span = ld["full"][idx].mean() - base
            return float((ld[name][idx].mean() - base) / span) if span else float("nan")
        return intervals.interval(stat, len(moved))

    out = []
    for name in PATCHES:
        s = intervals.interval(lambda idx, h=hits[name]: float(h[idx, 0].mean()), len(moved))
        rec = recovered(name)
        out.append(HelixPatchRow(layer, position, target, name, r, len(moved), s.value, s.low, s.high,
                                 float(hits[name][:, 1].mean()), float(ld[name].mean()), rec.value, rec.low,
                                 rec.high))
    return out


def helix_patch_work(backend: ModelBackend, pairs: Sequence[PromptPair]):
    """The forward work of :func:`helix_patch` (``engine.cost.Work``), at most: the residual pass and one END-only
    pass per patch but ``none`` (every prompt counted as moved)."""
    from engine.techniques.numbers import residual_pass_work, shifts_work
    return residual_pass_work(backend, pairs) + shifts_work(backend, pairs, len(PATCHES) - 1)


def cached_helix_patch(backend: ModelBackend, pairs: Sequence[PromptPair], layer: int, position: str = "END",
                       target: str = "C", *, seed: int = 0, cache=None, progress: ProgressFn | None = None
                       ) -> tuple[list[HelixPatchRow], bool]:
    """:func:`helix_patch` through the result cache: (rows, computed)."""
    from engine.results import run_cached_rows
    params = {"version": VERSION, "dtype": backend.facts.dtype, "layer": layer, "position": position,
              "target": target, "seed": seed, "periods": list(PERIODS), "resamples": intervals.RESAMPLES}
    rows, _, computed = run_cached_rows(
        backend, pairs, METHOD, params,
        lambda: (helix_patch(backend, pairs, layer, position, target, seed=seed, progress=progress), None),
        HelixPatchRow, ("success", "success_low", "success_high", "stays", "logit_diff", "recovered",
                        "recovered_low", "recovered_high"), cache)
    return rows, computed


def cli(args, ctx) -> dict:
    """One row per patch -> CSV; prints each patch's success with its interval and the share recovered."""
    layer = args.layer
    if layer is None:
        with ctx.progress("number probes") as bar:
            probes, _ = cached_number_probes(ctx.model, ctx.pairs, cache=ctx.cache, progress=bar)
        layer = default_layer(probes)
    with ctx.progress("helix-subspace patching") as bar:
        rows, computed = cached_helix_patch(ctx.model, ctx.pairs, layer, args.position, args.target,
                                            cache=ctx.cache, progress=bar)
    ctx.write_csv(args.out, [r.__dict__ for r in rows])
    return {"out": str(args.out), "cached": not computed, "n_pairs": len(ctx.pairs), "layer": layer,
            "position": args.position, "target": args.target, "rank": rows[0].rank, "n_prompts": rows[0].n_prompts,
            "patches": {r.method: {"success": [round(r.success, 4), round(r.success_low, 4), round(r.success_high, 4)],
                                   "recovered": [round(r.recovered, 4), round(r.recovered_low, 4),
                                                 round(r.recovered_high, 4)]} for r in rows}}
