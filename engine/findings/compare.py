"""Compare two path-patching runs: which heads differ between A and B, and is the difference real?

A and B are two cached path-patching results (:func:`engine.techniques.path_patching.cached_path_patching`) with
their per-pair values: two counterfactual kinds of one prompt set, two templates, two models of one shape, a base
model and its tuned copy.  For each cell (a head, or a layer's MLP) of one metric:

    diff = mean_A - mean_B     # over each run's own pairs (NaN pairs -- the effect's guard -- left out)

with its 95 % percentile bootstrap interval: each of 1000 resamples draws A's pairs and B's pairs independently
(with replacement; unpaired, so it holds whether or not the two runs share their prompts) and takes the
difference of the resampled means.  A cell **differs** when its interval excludes 0.  Beside it, the top-k heads
of each run (most negative first) and their overlap.  Two models of different shapes have no common cells: they
are compared by rank only (their top-k lists), ``cells`` empty.

Beside the heatmaps, the paper's findings on A and on B (:func:`compare_findings`): each checked step of the
argument (:func:`engine.findings.paper.reproduce`, every number with its own interval) run on each, row by row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.numerics.intervals import LEVEL, RESAMPLES, SEED


@dataclass(frozen=True)
class CellDiff:
    component: str   # "head" | "mlp"
    layer: int
    head: int        # -1 for an MLP
    a: float
    b: float
    diff: float      # a - b
    low: float       # the difference's 95 % bootstrap interval
    high: float

    @property
    def differs(self) -> bool:
        """The interval excludes 0."""
        return bool(self.low > 0 or self.high < 0)


@dataclass
class Comparison:
    metric: str
    n_a: int
    n_b: int
    k: int
    top_a: list[tuple[int, int, float]]   # (layer, head, value), most negative first
    top_b: list[tuple[int, int, float]]
    cells: list[CellDiff] = field(default_factory=list)  # empty: different shapes, compared by rank only

    @property
    def overlap(self) -> int:
        """How many heads the two top-k lists share."""
        return len({(a, b) for a, b, _ in self.top_a} & {(a, b) for a, b, _ in self.top_b})

    def differing(self) -> list[CellDiff]:
        """The cells whose interval excludes 0, largest |difference| first."""
        return sorted((c for c in self.cells if c.differs), key=lambda c: -abs(c.diff))


def _cells(table, metric: str) -> np.ndarray:
    """[P, L, H + 1] per-pair values of every head and MLP (the last column: the MLP)."""
    import torch
    heads, mlps = table.per_pair.per_pair(metric)
    return torch.cat([heads, mlps[:, :, None]], 2).double().numpy()


def diff_intervals(xa: np.ndarray, xb: np.ndarray, *, resamples: int = RESAMPLES, seed: int = SEED
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean_a - mean_b, low, high) per cell of ``xa`` [Pa, ...] and ``xb`` [Pb, ...] (NaN: a pair left out): the
    unpaired percentile bootstrap described above, every cell from the same resamples."""
    rng = np.random.default_rng(seed)
    diff = np.nanmean(xa, 0) - np.nanmean(xb, 0)
    if len(xa) < 2 or len(xb) < 2:
        nan = np.full(diff.shape, np.nan)
        return diff, nan, nan.copy()
    draws = []
    for start in range(0, resamples, 100):  # 100 resamples at a time: [100, P, cells] in memory
        r = min(100, resamples - start)
        ia = rng.integers(0, len(xa), (r, len(xa)))
        ib = rng.integers(0, len(xb), (r, len(xb)))
        with np.errstate(all="ignore"):
            draws.append(np.nanmean(xa[ia], 1) - np.nanmean(xb[ib], 1))
    d = np.concatenate(draws)  # [resamples, ...]
    tail = (1 - LEVEL) / 2 * 100
    with np.errstate(all="ignore"):
        low, high = np.nanpercentile(d, tail, 0), np.nanpercentile(d, 100 - tail, 0)
    return diff, low, high


def compare_tables(a, b, *, metric: str = "logit_diff", k: int = 5) -> Comparison:
    """A vs B (two ``PatchingTable``s with their per-pair results): every common cell's difference with its interval,
    and the top-k heads of each; tables of different shapes: the top-k lists only."""
    if a.per_pair is None or b.per_pair is None:
        raise ValueError("a run has no per-pair results stored: compute its path patching again")
    top_a, top_b = a.top_heads(k, metric), b.top_heads(k, metric)
    out = Comparison(metric, len(a.per_pair.pairs), len(b.per_pair.pairs), k, top_a, top_b)
    if (a.n_layers, a.n_heads) != (b.n_layers, b.n_heads):
        return out
    xa, xb = _cells(a, metric), _cells(b, metric)
    diff, low, high = diff_intervals(xa, xb)
    ma, mb = np.nanmean(xa, 0), np.nanmean(xb, 0)
    H = a.n_heads
    for layer in range(a.n_layers):
        for h in range(H + 1):
            out.cells.append(CellDiff("head" if h < H else "mlp", layer, h if h < H else -1, float(ma[layer, h]),
                                      float(mb[layer, h]), float(diff[layer, h]), float(low[layer, h]),
                                      float(high[layer, h])))
    return out


def compare_findings(model_a, spec_a, model_b, spec_b, cache, *, progress=None) -> list[tuple[Any, Any]]:
    """The paper's findings on A (``model_a`` on ``spec_a``) and on B, row by row: [(A's PaperFinding, B's)], in
    :func:`engine.findings.paper.checked_steps`' order (Fig. 12 needs a second model: not computed on either)."""
    from engine.findings.paper import reproduce
    from engine.progress import Stages
    stages = Stages(progress, [1, 1])
    rows = []
    for i, (model, spec) in enumerate(((model_a, spec_a), (model_b, spec_b))):
        rows.append(reproduce(model, spec, cache, progress=stages.stage(i)))
        stages.finish(i)
    a, b = rows
    assert [r.key for r in a] == [r.key for r in b]  # one table of steps: the same rows in the same order
    return list(zip(a, b))


def compare_findings_cost(model_a, spec_a, pairs_a, model_b, spec_b, pairs_b, cache):
    """The estimated cost of :func:`compare_findings` (``pairs_a`` / ``pairs_b``: each set's kept pairs): the two
    reproductions' seconds added, their forward passes counted in passes of A's set where B has A's model and set
    size (else the sum is only a count of passes, each of its own set)."""
    from engine.cost import Cost, estimate
    from engine.findings.paper import reproduce_work
    ca = estimate(model_a, pairs_a, reproduce_work(model_a, spec_a, cache, pairs_a))
    cb = estimate(model_b, pairs_b, reproduce_work(model_b, spec_b, cache, pairs_b))
    return Cost(ca.forward_equivalents + cb.forward_equivalents, ca.seconds + cb.seconds)
