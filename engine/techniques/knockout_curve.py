"""The knockout curve: do the key heads matter more than any heads? (Zhang et al. 2024, §4.1, Fig. 3)

Knock out (mean-ablate, :mod:`engine.techniques.knockout`) the top-k heads by path-patching effect and compare
the first-token accuracy with knocking out k random heads -- ``draws`` random k-sets per k, their mean, spread,
min and max -- for k = 0..K.  Every distinct knockout set is evaluated once, END-only, several per forward pass;
:func:`curve_cost` says what the curve costs before it runs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from engine.backends.base import ModelBackend
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair
from engine.techniques.knockout import (
    Knockout,
    MeanActivations,
    knockout_correct,
    mean_activations,
)


@dataclass(frozen=True)
class CurvePoint:
    k: int
    top_accuracy: float
    random_mean: float
    random_std: float
    random_min: float
    random_max: float


def curve_knockouts(n_layers: int, n_heads: int, ranked_heads: Sequence[tuple[int, int]], *, k_max: int,
                    draws: int, seed: int = 0) -> list[tuple[int, Knockout, list[Knockout]]]:
    """The knockout sets of the Fig. 3 curve: for k = 0..k_max, (k, top-k set, ``draws`` random k-sets).

    The random draws are the same for a given seed whatever the evaluation order."""
    if k_max < 0:
        raise ValueError("k_max must be >= 0")
    if k_max > n_layers * n_heads:
        raise ValueError(f"k_max={k_max} exceeds the model's {n_layers * n_heads} heads")
    if draws < 1:
        raise ValueError("draws must be >= 1")
    rng = random.Random(seed)
    every = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
    return [(k, Knockout(tuple(ranked_heads[:k])), [Knockout(tuple(rng.sample(every, k))) for _ in range(draws)])
            for k in range(k_max + 1)]


def knockout_curve(backend: ModelBackend, pairs: Sequence[PromptPair], ranked_heads: Sequence[tuple[int, int]],
                   means: MeanActivations, *, k_max: int, draws: int = 10, seed: int = 0,
                   progress: ProgressFn | None = None, sets_per_pass: int | None = None,
                   ks: Sequence[int] | None = None) -> list[CurvePoint]:
    """Fig. 3: accuracy after knocking out the top-k heads (effect rank) vs k random heads.

    Every distinct knockout set (k = 0 once, repeated draws once) is evaluated once, END-only, several
    per forward pass (:func:`knockout_correct`).
    """
    return curve_with_pairs(backend, pairs, ranked_heads, means, k_max=k_max, draws=draws, seed=seed,
                            progress=progress, sets_per_pass=sets_per_pass, ks=ks)[0]


def curve_with_pairs(backend: ModelBackend, pairs: Sequence[PromptPair], ranked_heads: Sequence[tuple[int, int]],
                     means: MeanActivations, *, k_max: int, draws: int = 10, seed: int = 0,
                     progress: ProgressFn | None = None, sets_per_pass: int | None = None,
                     ks: Sequence[int] | None = None) -> tuple[list[CurvePoint], torch.Tensor]:
    """:func:`knockout_curve`'s points and, per point, which prompts stay right: [points, 1 + draws, P] bool
    (row 0 the top-k set, then the random draws) -- the intervals' input."""
    L, H = backend.facts.n_layers, backend.facts.n_heads
    plan = [x for x in curve_knockouts(L, H, ranked_heads, k_max=k_max, draws=draws, seed=seed)
            if ks is None or x[0] in ks]  # ks: only these points (the same draws as the whole curve's)
    flat = [ko for _, top, rand in plan for ko in [top, *rand]]
    right = knockout_correct(backend, pairs, flat, means, sets_per_pass=sets_per_pass, progress=progress)
    right = right.view(len(plan), 1 + draws, len(pairs))
    out = []
    for (k, _, _), r in zip(plan, right):
        acc = [float(n) / len(pairs) for n in r.sum(1).tolist()]  # [1 + draws]: the top set, then the draws
        t = torch.tensor(acc[1:])
        out.append(CurvePoint(k, acc[0], float(t.mean()), float(t.std(unbiased=False)),
                              float(t.min()), float(t.max())))
    return out, right


@dataclass(frozen=True)
class PromptPoint:
    """One prompt with the top-k heads knocked out."""

    k: int
    head: str          # the k-th head of the ranking, knocked out from this k on ("" at k = 0)
    p_answer: float    # the probability of the answer's first token
    top_token: str     # the most likely next token
    top_id: int
    answer_top1: bool  # the answer's first token is still the most likely one


@torch.no_grad()
def prompt_knockout_curve(backend: ModelBackend, ids: Sequence[int], answer_id: int,
                          ranked_heads: Sequence[tuple[int, int]], means: MeanActivations, *,
                          k_max: int) -> list[PromptPoint]:
    """One prompt (the typed prompt, ``ids``; its answer's first token ``answer_id``) with the top-k heads of
    ``ranked_heads`` knocked out, for k = 0..k_max: P(answer) and whether it is still the top token -- where
    the answer breaks, which the set's accuracy curve does not show.  The prompt takes the mean over all the
    counterfactual prompts, END-aligned (a typed prompt has no template: :func:`knockout.next_token_probs`).
    One END-only forward pass: row k carries the top-k set (per-row head masks)."""
    from engine.techniques.knockout import head_masks, knocked_out_rows
    L, H = backend.facts.n_layers, backend.facts.n_heads
    if not 0 <= k_max <= len(ranked_heads):
        raise ValueError(f"k_max={k_max}: the ranking has {len(ranked_heads)} heads")
    kos = [Knockout(tuple(ranked_heads[:k])).validate(L, H) for k in range(k_max + 1)]
    heads, mlps = head_masks(kos, L, H)  # [K + 1, L, H], [K + 1, L]
    n, end = len(kos), len(ids) - 1
    x = torch.tensor([list(ids)] * n)  # [K + 1, pos]
    with knocked_out_rows(backend, heads, mlps, means, [None] * n, [end] * n):
        probs = torch.softmax(backend.end_logits(x, None, torch.tensor([end] * n)).float(), -1)  # [K + 1, vocab]
    top = probs.argmax(-1).tolist()
    names = backend.tokenizer.convert_ids_to_tokens(top)
    return [PromptPoint(k, "" if k == 0 else f"{ranked_heads[k - 1][0]}.{ranked_heads[k - 1][1]}",
                        float(probs[k, answer_id]), str(names[k]), int(top[k]), top[k] == answer_id)
            for k in range(n)]


def _curve_params(backend: ModelBackend, ranked_heads: Sequence[tuple[int, int]], k_max: int, draws: int,
                  seed: int) -> dict:
    return {"ranked": [list(h) for h in ranked_heads[:k_max]], "k_max": k_max, "draws": draws, "seed": seed,
            "dtype": backend.facts.dtype, "ablation": "mean over X_c, per template, END-aligned",
            "per_pair": "correct"}


CURVE_METRICS = ("top_accuracy", "random_mean", "random_std", "random_min", "random_max")  # stored per k


def _curve_points(rows) -> list[CurvePoint]:
    from engine.results import decode_rows
    return sorted(decode_rows(CurvePoint, rows, CURVE_METRICS), key=lambda p: p.k)


def cached_knockout_curve(backend: ModelBackend, pairs: Sequence[PromptPair],
                          ranked_heads: Sequence[tuple[int, int]], *, k_max: int, draws: int = 10, seed: int = 0,
                          cache=None, progress: ProgressFn | None = None) -> tuple[list[CurvePoint], bool]:
    """:func:`knockout_curve` through the result cache: (points, computed)."""
    from engine.results import run_cached

    def compute():
        return _stored(*curve_with_pairs(backend, pairs, ranked_heads, mean_activations(backend, pairs),
                                         k_max=k_max, draws=draws, seed=seed, progress=progress))

    params = _curve_params(backend, ranked_heads, k_max, draws, seed)
    rows, _, computed = run_cached(backend, pairs, "knockout_curve", params, compute, cache)
    return _curve_points(rows), computed


def _stored(points: list[CurvePoint], right: torch.Tensor):
    from engine.results import encode_array, encode_rows
    return encode_rows(points, CURVE_METRICS), {"correct": encode_array(right.float()),
                                                "ks": [p.k for p in points]}


def cached_knockout_points(backend: ModelBackend, pairs: Sequence[PromptPair],
                           ranked_heads: Sequence[tuple[int, int]], ks: Sequence[int], *, k_max: int,
                           draws: int = 10, seed: int = 0, cache=None,
                           progress: ProgressFn | None = None) -> tuple[list[CurvePoint], np.ndarray]:
    """The points at ``ks`` of :func:`cached_knockout_curve`'s curve (same arguments, same draws) and which
    prompts stay right at each ([points, 1 + draws, P]: the top set, then the random draws): read from the
    stored curve when the cache holds it, else only those points' knockout sets are evaluated."""
    from engine.results import decode_array, run_cached, stored
    params = _curve_params(backend, ranked_heads, k_max, draws, seed)
    whole = stored(backend, pairs, "knockout_curve", params, cache)
    if whole is not None:
        by_k = {p.k: p for p in _curve_points(whole[0])}
        keep = [i for i, k in enumerate(whole[1]["ks"]) if k in ks]  # the rows of "correct", in stored order
        return [by_k[whole[1]["ks"][i]] for i in keep], decode_array(whole[1]["correct"])[keep]

    def compute():
        return _stored(*curve_with_pairs(backend, pairs, ranked_heads, mean_activations(backend, pairs),
                                         k_max=k_max, draws=draws, seed=seed, progress=progress, ks=ks))

    rows, art, _ = run_cached(backend, pairs, "knockout_points", {**params, "ks": sorted(set(ks))}, compute, cache)
    return _curve_points(rows), decode_array(art["correct"])


def stored_knockout_curve(backend: ModelBackend, pairs: Sequence[PromptPair],
                          ranked_heads: Sequence[tuple[int, int]], *, k_max: int, draws: int = 10, seed: int = 0,
                          cache=None) -> list[CurvePoint] | None:
    """The curve of :func:`cached_knockout_curve` if the cache holds it, else None (no forward pass)."""
    from engine.results import stored
    hit = stored(backend, pairs, "knockout_curve", _curve_params(backend, ranked_heads, k_max, draws, seed), cache)
    return None if hit is None else _curve_points(hit[0])


def curve_intervals(right: np.ndarray) -> dict[str, np.ndarray]:
    """95 % bootstrap intervals over the pairs of each point's accuracies: ``right`` [points, 1 + draws, P] (the
    top set, then the random draws) -> {"top_low", "top_high", "random_low", "random_high"}: [points] each (the
    random draws' mean accuracy, its draws fixed, the pairs resampled)."""
    from engine.numerics.intervals import mean_intervals
    per_pair = np.stack([right[:, 0], right[:, 1:].mean(1)], -1).transpose(1, 0, 2)  # [P, points, 2]
    _, low, high = mean_intervals(per_pair.astype(np.float64))
    return {"top_low": low[:, 0], "top_high": high[:, 0], "random_low": low[:, 1], "random_high": high[:, 1]}


def stored_curve_intervals(backend: ModelBackend, pairs: Sequence[PromptPair],
                           ranked_heads: Sequence[tuple[int, int]], *, k_max: int, draws: int = 10, seed: int = 0,
                           cache=None) -> dict[str, np.ndarray] | None:
    """:func:`curve_intervals` of the curve the cache holds (points in k order), else None (no forward pass)."""
    from engine.results import decode_array, stored
    hit = stored(backend, pairs, "knockout_curve", _curve_params(backend, ranked_heads, k_max, draws, seed), cache)
    if hit is None or "correct" not in hit[1]:
        return None
    order = np.argsort(hit[1]["ks"], kind="stable")
    return curve_intervals(decode_array(hit[1]["correct"])[order])


def curve_work(backend: ModelBackend, pairs: Sequence[PromptPair], ranked_heads: Sequence[tuple[int, int]], *,
               k_max: int, draws: int, seed: int = 0):
    """The forward work of :func:`cached_knockout_curve` (``engine.cost.Work``): the means over X_c and every
    distinct knockout set of the curve, END-only, several per pass (:func:`knockout.knockout_end_work`)."""
    from engine.techniques.knockout import knockout_end_work, mean_activations_work
    f = backend.facts
    plan = curve_knockouts(f.n_layers, f.n_heads, ranked_heads, k_max=k_max, draws=draws, seed=seed)
    return (mean_activations_work(backend, pairs)
            + knockout_end_work(backend, pairs, [ko for _, top, rand in plan for ko in [top, *rand]]))


def curve_cost(backend: ModelBackend, pairs: Sequence[PromptPair], ranked_heads: Sequence[tuple[int, int]], *,
               k_max: int, draws: int, seed: int = 0):
    """What the curve costs before it runs (``engine.cost.Cost``): :func:`curve_work` in passes of ``pairs``."""
    from engine.cost import estimate
    return estimate(backend, pairs, curve_work(backend, pairs, ranked_heads, k_max=k_max, draws=draws, seed=seed))

# ---------------------------------------------------------------------------------------------
# its sentence of the circuit summary (cached results only; registered in engine.registry)
# ---------------------------------------------------------------------------------------------

#: the Knockout page's defaults: its curve is the one the circuit summary and the Paper page quote
KNOCKOUT_K, KNOCKOUT_DRAWS = 10, 10


def finding(model, pairs, cache, table) -> str | None:
    """Fig. 3: accuracy after knocking out the top-3 heads vs 3 random heads (the Knockout page's curve)."""
    f = model.facts
    k_max = min(KNOCKOUT_K, f.n_layers * f.n_heads)
    ranked = [(layer, h) for layer, h, _ in table.top_heads(k_max)]
    pts = stored_knockout_curve(model, pairs, ranked, k_max=k_max, draws=KNOCKOUT_DRAWS, cache=cache)
    if not pts:
        return None
    at = next((p for p in pts if p.k == 3), pts[-1])
    return (f"Knocking out the top {at.k} heads leaves {at.top_accuracy:.0%} first-token accuracy "
            f"(from {pts[0].top_accuracy:.0%}), {at.k} random heads {at.random_mean:.0%} "
            f"(mean of {KNOCKOUT_DRAWS} draws): a gap of {100 * (at.random_mean - at.top_accuracy):.0f} points.")

# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine knockout-curve``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """Fig. 3's curve -> CSV: top-k heads (path-patching rank) vs k random heads, k = 0 .. --k-max."""
    from engine.techniques.path_patching import cached_path_patching
    model = ctx.model
    n_heads = model.facts.n_layers * model.facts.n_heads
    if args.k_max > n_heads:
        raise ValueError(f"--k-max {args.k_max} exceeds the model's {n_heads} heads")
    pairs = ctx.pairs
    with ctx.progress("path patching") as bar:
        table, _ = cached_path_patching(model, pairs, cache=ctx.cache, progress=bar)
    ranked = [(layer, h) for layer, h, _ in table.top_heads(args.k_max)]
    with ctx.progress("knockout sets") as bar:
        pts, computed = cached_knockout_curve(model, pairs, ranked, k_max=args.k_max, draws=args.draws,
                                              seed=args.seed, cache=ctx.cache, progress=bar)
    points = [p.__dict__ for p in pts]
    ctx.write_csv(args.out, points)
    return {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs),
            "answer_tokens": ctx.answer_tokens(pairs), "ranked_by": table.ranking_metric(),
            "effect_note": table.effect_note(), "ranked_heads": [f"{a}.{b}" for a, b in ranked], "points": points}
