"""What each key head carries: path patching of the same key heads under counterfactuals that change one thing.

The paper's counterfactual X_c removes the operator, so path patching finds the heads whose END output matters for
the operation; Fig. 5 then reads *what* they carry off their attention.  Stolfo et al. (2023) ask it causally: a
counterfactual that changes only operand A (or only B) moves the answer through the heads that carry that operand.
Here:

1. **Key heads.**  The top-k heads of path patching with the paper's X_c (``operator-removed``), ranked as the
   heatmap ranks them (:meth:`~engine.techniques.path_patching.PatchingTable.top_heads`).
2. **Kinds.**  The same prompt set rebuilt with each counterfactual kind of :data:`engine.prompts.pairs.
   COUNTERFACTUALS` -- ``operand-a``: A replaced by another operand of the range (same length in tokens, the
   operator kept, the answer changed), ``operand-b`` likewise, ``operator-swapped`` (the paired operation's
   operator: + and -, * and /) -- filtered to the prompts the model answers right,
   and path-patched (each head's END output from that X_c, every other head frozen at X_r; cached per kind).
3. **Effect.**  Each key head's mean path-patching value under each kind, in the metric the key heads were ranked
   by, with its 95 % bootstrap interval over that kind's pairs (:func:`engine.numerics.intervals.mean_intervals`).
   The head *carries* the kind whose effect is the most negative; ``clear`` when that kind's interval lies wholly
   below every other kind's.

No extra forward pass beyond the kinds' path patching (cached and shared with the pages that show them).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from engine.backends.base import ModelBackend
from engine.numerics.intervals import mean_intervals
from engine.progress import ProgressFn, Stages
from engine.prompts.custom import none_right_message
from engine.prompts.pairs import CARRY, COUNTERFACTUALS, OPERATOR_REMOVED, PromptError

#: the kinds compared: every kind but ``carry`` (additions and subtractions only; path-patch it as the set's kind)
KINDS: tuple[str, ...] = tuple(k for k in COUNTERFACTUALS if k != CARRY)


@dataclass(frozen=True)
class Carried:
    """One key head under one counterfactual kind: its mean path-patching value and interval over n pairs."""

    layer: int
    head: int
    kind: str
    n: int
    value: float
    low: float
    high: float


@dataclass(frozen=True)
class HeadCarries:
    """What one key head carries: the kind with the most negative effect, and whether its interval settles it."""

    layer: int
    head: int
    kind: str
    clear: bool


def what_heads_carry(backend: ModelBackend, spec, *, k: int = 5, kinds: Sequence[str] = KINDS, cache=None,
                     progress: ProgressFn | None = None) -> tuple[list[Carried], str]:
    """Rows of every key head under every kind (module docstring), and the metric they are in."""
    from engine.techniques.accuracy import kept_pairs
    from engine.techniques.path_patching import cached_path_patching
    stages = Stages(progress, [1] * (len(kinds) + 1))
    base = replace(spec, counterfactual=OPERATOR_REMOVED)
    pairs, n_generated = kept_pairs(backend, base, cache=cache)
    if not pairs:
        raise PromptError(none_right_message(n_generated, custom=bool(spec.templates)))
    table, _ = cached_path_patching(backend, pairs, cache=cache, progress=stages.stage(0))
    stages.finish(0)
    metric = table.ranking_metric()
    top = [(a, b) for a, b, _ in table.top_heads(k)]
    rows: list[Carried] = []
    for i, kind in enumerate(kinds, 1):
        try:
            kp, _ = kept_pairs(backend, replace(spec, counterfactual=kind), cache=cache)
        except PromptError:  # no X_c of this kind for these templates (pow or a word with no swap): no column
            kp = []
        if not kp:  # the other kinds are still read off; the view shows the kinds it has
            stages.finish(i)
            continue
        t = table if kind == OPERATOR_REMOVED else \
            cached_path_patching(backend, kp, cache=cache, progress=stages.stage(i))[0]
        stages.finish(i)
        heads, _ = t.per_pair.per_pair(metric)                      # [P, L, H]
        x = np.stack([heads[:, a, b].double().numpy() for a, b in top], 1)  # [P, k]
        mean, low, high = mean_intervals(x)
        n = int(np.sum(~np.isnan(x[:, 0])))
        rows += [Carried(a, b, kind, n, float(mean[j]), float(low[j]), float(high[j])) for j, (a, b) in enumerate(top)]
    return rows, metric


def carries_work(backend: ModelBackend, spec, *, kinds: Sequence[str] = KINDS, cache=None):
    """The forward work of :func:`what_heads_carry` (``engine.cost.Work``) and the operator-removed set's pairs (the
    unit): per kind, the filter of its set and its path patching, each unless cached -- a set not filtered yet
    counted on as many of its prompts as the sidebar's set keeps of its own (all, when that is not known either)."""
    from engine.cost import NO_WORK, unless_cached
    from engine.prompts.promptsets import generate
    from engine.results import NotCached, cache_only
    from engine.techniques.accuracy import kept_pairs, scoring_work
    from engine.techniques.path_patching import cached_path_patching, path_patching_work
    try:
        with cache_only():
            mine, n_mine = kept_pairs(backend, spec, cache=cache)
        share = len(mine) / max(1, n_mine)
    except NotCached:
        share = 1.0
    w, unit = NO_WORK, None
    for kind in (OPERATOR_REMOVED, *(k for k in kinds if k != OPERATOR_REMOVED)):
        s = replace(spec, counterfactual=kind)
        try:
            gen, _ = generate(backend.tokenizer, s)
        except PromptError:
            continue
        try:
            with cache_only():
                kp, _ = kept_pairs(backend, s, cache=cache)
        except NotCached:
            w += scoring_work(backend, gen, full=False)
            kp = gen[:max(1, round(share * len(gen)))]
        unit = kp if unit is None else unit
        if kp:
            w += unless_cached(lambda p=kp: cached_path_patching(backend, p, cache=cache),
                               lambda p=kp: path_patching_work(backend, p))
    return w, unit or []


def pairs_per_kind(rows: Sequence[Carried]) -> dict[str, int]:
    """Pairs (answered right) under each counterfactual kind, in :data:`KINDS`' order; 0 for a kind with no column
    (the set has no X_c of that kind, or the model answers none of its prompts right)."""
    n = {r.kind: r.n for r in rows}
    return {kind: n.get(kind, 0) for kind in KINDS}


def carries(rows: Sequence[Carried]) -> list[HeadCarries]:
    """Per head (in the rows' order), the kind with the most negative mean; clear when its interval's upper end
    lies below every other kind's lower end."""
    by: dict[tuple[int, int], list[Carried]] = {}
    for r in rows:
        by.setdefault((r.layer, r.head), []).append(r)
    out = []
    for (layer, head), rs in by.items():
        best = min(rs, key=lambda r: r.value)
        clear = all(best.high < r.low for r in rs if r is not best)
        out.append(HeadCarries(layer, head, best.kind, clear))
    return out


# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine carries``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """The key heads x the counterfactual kinds -> CSV; what each head carries in the summary."""
    L, H = ctx.model.facts.n_layers, ctx.model.facts.n_heads
    if args.k > L * H:
        raise ValueError(f"--k {args.k} exceeds the model's {L * H} heads")
    with ctx.progress("path patching per counterfactual kind") as bar:
        rows, metric = what_heads_carry(ctx.model, ctx.spec(), k=args.k, cache=ctx.cache, progress=bar)
    ctx.write_csv(args.out, [r.__dict__ for r in rows])
    return {"out": str(args.out), "metric": metric, "kinds": list(KINDS),
            "pairs": pairs_per_kind(rows),
            "carries": [{"head": f"{c.layer}.{c.head}", "kind": c.kind, "clear": c.clear} for c in carries(rows)]}
