"""Stability of the key heads: is the top-k list a property of the model, or of one sample of prompts?

The paper ranks the heads once, on one prompt sample.  Here the ranking is redone on resampled and on partial sets,
from path patching's stored per-pair results (no forward pass):

1. **Per-pair values.**  v[p, l, h]: the path-patching value of head (l, h) on pair p in the table's ranking metric
   (:meth:`~engine.techniques.path_patching.PatchingTable.ranking_metric`: the relative effect, or the logit
   difference when the guard left out most pairs); a pair the guard leaves out of the effect is NaN and skipped.
2. **Top-k of a set of pairs.**  The k heads with the most negative mean over its pairs (as
   :meth:`~engine.techniques.path_patching.PatchingTable.top_heads`).
3. **Resamples.**  The set's pairs drawn with replacement ``RESAMPLES`` times (seeded, :mod:`engine.techniques.
   intervals`); ``in_top`` = the share of resamples whose top-k holds the head.  A head of the set's own top-k with
   ``in_top`` near 1 is a stable key head; one near the 1/2 mark is one draw of the sample.
4. **Subsets.**  The same for every operation, every template, and carry vs no carry (addition whose column sum
   carries, subtraction that borrows: :meth:`~engine.prompts.pairs.PromptPair.carry`): each subset's own top-k and
   its resampled ``in_top``, so a reader sees which key heads are shared and which belong to one format or case.
   ``overlap`` = how many of the subset's top-k are in the top-k of all pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.numerics.intervals import RESAMPLES, SEED
from engine.prompts.pairs import groups_with_carry

ALL = "*"


@dataclass(frozen=True)
class HeadStability:
    """One head in one group of pairs: its mean value, its rank there (1 = most negative) and ``in_top``."""

    group: str
    layer: int
    head: int
    n: int          # pairs of the group
    value: float    # mean over the group's pairs
    rank: int
    in_top: float   # share of resamples whose top-k holds the head


def top_frequency(v: np.ndarray, k: int, *, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """[N] share of resamples of the rows of ``v`` [P, N] (NaN = left out) whose k most negative column means
    include each column."""
    P, N = v.shape
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, P, (resamples, P))                                   # [B, P] one resample per row
    counts = np.bincount((idx + P * np.arange(resamples)[:, None]).ravel(),
                         minlength=resamples * P).reshape(resamples, P)          # [B, P] times each pair is drawn
    ok = ~np.isnan(v)
    sums = counts @ np.where(ok, v, 0.0)                         # [B, N]
    n = counts @ ok.astype(np.float64)                            # [B, N]
    means = np.where(n > 0, sums / np.maximum(n, 1), np.inf)      # a head no resampled pair measures: never top
    top = np.argsort(means, axis=1, kind="stable")[:, :k]         # [B, k]
    return np.bincount(top.ravel(), minlength=N) / resamples


def head_stability(table, k: int, *, resamples: int = RESAMPLES, seed: int = SEED) -> list[HeadStability]:
    """Every head's rank and ``in_top`` in every group of :func:`groups_with_carry`, from the table's per-pair
    values (module docstring); ``table``: a cached :class:`~engine.techniques.path_patching.PatchingTable`."""
    raw = table.per_pair
    if raw is None:
        raise ValueError("this path-patching result has no per-pair values: compute it again")
    L, H = table.n_layers, table.n_heads
    if not 1 <= k <= L * H:
        raise ValueError(f"k must be between 1 and the model's {L * H} heads, got {k}")
    heads, _ = raw.per_pair(table.ranking_metric())
    v = heads.reshape(heads.shape[0], L * H).double().numpy()  # [P, L * H]
    out = []
    for group, idx in groups_with_carry(raw.pairs).items():
        sub = v[idx]
        with np.errstate(invalid="ignore"):
            mean = np.nanmean(sub, 0) if len(idx) else np.full(L * H, np.nan)
        order = np.argsort(np.where(np.isnan(mean), np.inf, mean), kind="stable")
        rank = np.empty(L * H, dtype=int)
        rank[order] = np.arange(1, L * H + 1)
        freq = top_frequency(sub, k, resamples=resamples, seed=seed)
        out += [HeadStability(group, i // H, i % H, len(idx), float(mean[i]), int(rank[i]), float(freq[i]))
                for i in range(L * H)]
    return out


@dataclass(frozen=True)
class GroupSummary:
    """One group's top-k, how stable it is and how much of it the top-k of all pairs shares."""

    group: str
    n: int
    top: tuple[str, ...]    # "layer.head", most negative first
    mean_in_top: float      # mean ``in_top`` of the group's own top-k
    overlap: int            # of its top-k, in the top-k of all pairs


def summaries(rows: list[HeadStability], k: int) -> list[GroupSummary]:
    by: dict[str, list[HeadStability]] = {}
    for r in rows:
        by.setdefault(r.group, []).append(r)
    top_all = {(r.layer, r.head) for r in by[ALL] if r.rank <= k}
    out = []
    for group, rs in by.items():
        top = sorted((r for r in rs if r.rank <= k), key=lambda r: r.rank)
        out.append(GroupSummary(group, rs[0].n, tuple(f"{r.layer}.{r.head}" for r in top),
                                float(np.mean([r.in_top for r in top])) if top else float("nan"),
                                sum((r.layer, r.head) in top_all for r in top)))
    return out


# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine stability``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """Every head's rank and in-top-k share per group -> CSV; one summary line per group."""
    from engine.techniques.path_patching import cached_path_patching
    pairs = ctx.pairs
    L, H = ctx.model.facts.n_layers, ctx.model.facts.n_heads
    if args.k > L * H:
        raise ValueError(f"--k {args.k} exceeds the model's {L * H} heads")
    with ctx.progress("path patching") as bar:
        table, computed = cached_path_patching(ctx.model, pairs, cache=ctx.cache, progress=bar)
    rows = head_stability(table, args.k)
    ctx.write_csv(args.out, [r.__dict__ for r in rows])
    return {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs), "k": args.k,
            "ranked_by": table.ranking_metric(), "resamples": RESAMPLES,
            "groups": [s.__dict__ for s in summaries(rows, args.k)]}
