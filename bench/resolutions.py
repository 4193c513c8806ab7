"""Benchmark: is there a small circuit?  Faithfulness at every resolution, per model, with intervals and costs.

For each model, on the addition and subtraction pairs it answers right (``--n`` generated per operation, seed 11):
circuits of

* **nodes**   -- heads and MLPs, ranked by exact path patching, AtP and random (the Faithfulness page's curves);
* **edges**   -- MIB's residual graph, ranked by EAP, EAP-IG (``--steps``) and random edges (``--rankings`` adds
  ``exact``: each edge patched alone, at the position resolutions each edge or node at each role);
* **edge x position** -- each edge at each token role (operand A, operator, operand B, END, other), EAP / EAP-IG
  by role and random units;
* **node x position** -- each head and MLP at each token role, likewise;

every unit outside the circuit given its counterfactual value (``--ablation mean``: its mean over the
counterfactuals).  One table per model: per resolution and ranking, f of its top 5 % (95 % bootstrap interval over
the pairs), the smallest share with f >= 0.8, CPR and CPR minus random's with intervals, the seconds and the
forward-equivalents of the curves (counted from the code; the rankings' own scores are cached and not timed here).
Where ``exact`` is among ``--rankings``, each resolution's table is followed by the rankings' agreement with it over
every unit (Spearman's and Pearson's correlation, the overlap of the top 1 % and 5 % by |score|) and what each
ranking's scores cost when they were computed (seconds, forward-equivalents).
Results are cached (``--cache``): a rerun prints at once (``--cached``: only what the cache holds).

    .venv/bin/python bench/resolutions.py                           # bundled model, Gemma 3 (SmolLM2: --models)
    .venv/bin/python bench/resolutions.py --models organism --n 10
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
from scipy.stats import pearsonr

from bench.edges import spec_of, top_overlap
from cache import ResultCache
from engine.backends import open_model
from engine.prompts.promptsets import PromptSetSpec
from engine.results import NotCached, cache_only
from engine.techniques.accuracy import kept_pairs
from engine.techniques.attribution import spearman
from engine.techniques.circuit_units import RANKINGS_AT, RESOLUTIONS
from engine.techniques.edge_scores import cached_edge_curves, cached_edge_scores, unit_scores
from engine.techniques.edges import edge_graph
from engine.techniques.faithfulness import FAITHFUL, cached_faithfulness, point_at, smallest_faithful

NAMES = {"exact": "exact", "atp": "AtP", "eap": "EAP", "eap-ig": "EAP-IG", "random": "random"}


def rows_of(resolution: str, table, seconds: float, fe: float | None, share: float) -> list[str]:
    out = []
    for s in (s for s in table.scores if s.metric == "logit"):
        at = point_at(table.points, s.ranking, "logit", share)
        small = smallest_faithful(table.points, s.ranking)
        smallest = ("none below 100 %" if small is None else
                    f"{small.size:.1%} (k = {small.k:,}): {small.f:.2f} [{small.low:.2f}, {small.high:.2f}]")
        f_at = "—" if at is None else f"{at.f:.2f} [{at.low:.2f}, {at.high:.2f}]"
        gap = "—" if s.ranking == "random" else s.gap_interval.text("{:+.2f}")
        cost = f"{seconds:.0f} s, {fe:,.0f} FE" if fe is not None else f"{seconds:.0f} s"
        out.append(f"| {resolution} | {NAMES[s.ranking]} | {f_at} | {smallest} | {s.cpr_interval.text()} | {gap} "
                   f"| {cost} |")
    return out


def scored(model, pairs, ranking: str, resolution: str, steps: int, cache) -> tuple[np.ndarray, float, float]:
    """One ranking's cached scores of every unit of ``resolution`` (# [U]), with the seconds and forward-equivalents
    they took when computed."""
    with cache_only():
        if resolution == "edge":
            rows, art, _ = cached_edge_scores(model, pairs, ranking, steps=steps, cache=cache)
            value = {x.edge: x.value for x in rows}
            s = np.array([value[n] for n in edge_graph(model).names], dtype=np.float64)
        else:
            s, art, _ = unit_scores(model, pairs, ranking, resolution, steps=steps, cache=cache)
    return s, float(art.get("seconds", 0.0)), float(art.get("forward_equivalents", 0.0))


def agreement_rows(model, pairs, resolution: str, rankings: list[str], steps: int, cache) -> list[str]:
    """Each ranking against exact patching at ``resolution``, over every unit: its cost, Spearman, Pearson and the
    overlap of the top 1 % and 5 %."""
    exact, *_ = scored(model, pairs, "exact", resolution, steps, cache)
    out = [f"| ranking of the {len(exact):,} {RESOLUTIONS[resolution]} units | seconds | FE | Spearman vs exact | "
           "Pearson vs exact | top 1 % | top 5 % |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rankings:
        s, seconds, fe = scored(model, pairs, r, resolution, steps, cache)
        agree = "| — | — | — | — |" if r == "exact" else (
            f"| {spearman(exact, s):.2f} | {pearsonr(exact, s).statistic:.2f} | "
            "{:,} / {:,} | {:,} / {:,} |".format(*top_overlap(exact, s, 0.01), *top_overlap(exact, s, 0.05)))
        out.append(f"| {NAMES[r]} | {seconds:.0f} | {fe:,.0f} {agree}")
    return out


def bench(name: str, n: int, ablation: str, steps: int, resolutions: list[str], cache, cached: bool = False,
          ranked: tuple[str, ...] = ("eap", "eap-ig")) -> str:
    model = open_model(spec_of(name), device="cpu")
    spec = PromptSetSpec(ops=("add", "sub"), n=n, seed=11)
    pairs, generated = kept_pairs(model, spec, cache=cache)
    lines = [f"### {name}: {len(pairs)} of {generated} pairs kept (addition, subtraction), {ablation} ablation", "",
             f"| resolution | ranking | f, top 5 % | smallest share with f ≥ {FAITHFUL} | CPR | CPR − random | "
             "curves |", "|---|---|---|---|---|---|---|"]
    agreement: list[list[str]] = []  # the rankings against exact, per resolution
    if "node" in resolutions:
        t = time.perf_counter()
        table, computed = cached_faithfulness(model, pairs, ablation=ablation, cache=cache)
        lines += rows_of("node", table, time.perf_counter() - t if computed else 0.0, None, 0.05)
    for resolution in (r for r in RESOLUTIONS if r in resolutions):
        rankings = [r for r in ranked if r in RANKINGS_AT[resolution]]
        try:
            with cache_only() if cached else nullcontext():
                table, art, _ = cached_edge_curves(model, pairs, rankings, steps=steps, ablation=ablation,
                                                   resolution=resolution, cache=cache)
        except NotCached:
            lines.append(f"| {RESOLUTIONS[resolution]} | — | not computed | | | | |")
            continue
        lines += rows_of(RESOLUTIONS[resolution], table, float(art.get("seconds", 0.0)),
                         float(art.get("forward_equivalents", 0.0)), 0.05)
        print(lines[-1], flush=True)  # a long run shows where it is
        if "exact" in rankings:
            agreement.append(agreement_rows(model, pairs, resolution, rankings, steps, cache))
    for rows in agreement:
        lines += ["", *rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="organism,gemma3")
    ap.add_argument("--n", type=int, default=10, help="prompts generated per operation (addition, subtraction)")
    ap.add_argument("--ablation", choices=("counterfactual", "mean"), default="counterfactual")
    ap.add_argument("--steps", type=int, default=5, help="EAP-IG's points (default 5, MIB's)")
    ap.add_argument("--resolutions", default="node,edge,edge-position,node-position")
    ap.add_argument("--cache", type=Path, default=Path(".cache/bench-resolutions.duckdb"))
    ap.add_argument("--cached", action="store_true", help="print what the cache holds, compute no circuit")
    ap.add_argument("--rankings", default="eap,eap-ig", help="the edge rankings (default eap,eap-ig)")
    a = ap.parse_args()
    cache = ResultCache(a.cache)
    for name in a.models.split(","):
        print(bench(name, a.n, a.ablation, a.steps, a.resolutions.split(","), cache, a.cached,
                    tuple(a.rankings.split(","))), flush=True)
        print(flush=True)


if __name__ == "__main__":
    main()
