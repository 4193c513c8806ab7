"""Edge scores: every edge of MIB's residual graph ranked by exact edge patching, EAP or EAP-IG, and MIB's export.

The three rankings of an edge u -> v (Mueller et al. 2025, MIB's circuit-localization track; the graph and the
exact value in :mod:`engine.techniques.edges`, the estimates in :mod:`engine.techniques.eap`):

* ``exact``  -- exact edge patching: the answer logit at END with u's X_c difference reaching only v's input,
  minus the unpatched one (about two forward passes of the set per edge);
* ``eap``    -- its first-order estimate, one gradient at X_r (Syed et al. 2023);
* ``eap-ig`` -- the estimate with the gradient averaged over ``steps`` points between X_c and X_r on the inputs
  (Hanna et al. 2024; MIB's strongest edge method).

Each is the mean over the pairs of ``logit_p - logit_o`` (exact) or its estimate, one row per edge
(:class:`EdgeValue`), cached with the seconds it took and its forward-equivalents (counted from the code:
:func:`ranking_work`).

**MIB's export** (:func:`mib_edge_graph`): the JSON EAP-IG's ``Graph.from_json`` reads (``cfg``, ``nodes``,
``edges``), each edge with the ranking's own score; ``in_graph`` the top floor(x E) edges by |score| (MIB's
``apply_topn(absolute=True)``) for a chosen share x (none: every edge in, an importance-score file that MIB
thresholds itself), a node in the graph when an edge of the circuit touches it; node scores kept where given
(the exact path-patching ranking of :mod:`engine.techniques.faithfulness`).

**Edge circuits** (:func:`cached_edge_curves`, ``--faithfulness``): each ranking's top floor(x E) edges kept and
every other edge ablated as MIB does, f over the node circuits' sizes, beside random edges (each pair under one of
a few seeded random circuits of each size) and each ranking's CPR minus random's (``gap``)
(:mod:`engine.techniques.edge_faithfulness`).  ``resolution`` (``--resolution``) makes the circuits of edges or of
heads and MLPs at token roles instead (:mod:`engine.techniques.circuit_units`), their units scored from the edges'
EAP / EAP-IG split by role, or exactly -- each unit patched alone (:func:`cached_role_scores`, cached once per
ranking).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from engine.backends.base import ModelBackend
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair
from engine.techniques.attention import CIRCUIT_ROLES, ROLES_VERSION
from engine.techniques.circuit_units import RESOLUTIONS, check_ranking, units_of
from engine.techniques.eap import eap, eap_work
from engine.techniques.edge_faithfulness import cached_edge_faithfulness
from engine.techniques.edges import edge_graph, edge_patching, edge_patching_work, node_patching, node_patching_work
from engine.techniques.faithfulness import MIB_TASKS, component_names, kept_count, mib_folder

METHOD = "edge_scores"
RANKINGS: tuple[str, ...] = ("exact", "eap", "eap-ig")
#: EAP-IG's points between X_c and X_r by default (MIB's runs use 5 on the inputs)
STEPS = 5
#: what `edge-scores --faithfulness` prints of each ranking's areas (gap: CPR minus the random edges' CPR)
SCORE_FIELDS = ("ranking", "metric", "cpr", "cpr_low", "cpr_high", "cmd", "cmd_low", "cmd_high", "gap", "gap_low",
                "gap_high")


@dataclass(frozen=True)
class EdgeValue:
    """One edge's score under one ranking (``metric``): the mean answer-logit change over the pairs."""

    edge: str
    metric: str
    value: float


def scores(backend: ModelBackend, pairs: Sequence[PromptPair], ranking: str, *, steps: int = STEPS,
           progress: ProgressFn | None = None) -> np.ndarray:
    """Every edge's score under ``ranking`` in :func:`engine.techniques.edges.edge_graph`'s order.  # [E]"""
    if ranking == "exact":
        return edge_patching(backend, pairs, progress=progress).effects().numpy()
    if ranking in ("eap", "eap-ig"):
        return eap(backend, pairs, steps=0 if ranking == "eap" else steps, progress=progress).effects().numpy()
    raise ValueError(f"unknown edge ranking {ranking!r}: choose from {', '.join(RANKINGS)}")


def role_scores(backend: ModelBackend, pairs: Sequence[PromptPair], ranking: str, *, steps: int = STEPS,
                nodes: bool = False, progress: ProgressFn | None = None) -> np.ndarray:
    """Every edge's score under ``ranking`` split by token role, in :func:`engine.techniques.edges.edge_graph`'s
    order: exact edge patching at each role's positions (``edge_patching(by_role=True)``), or the EAP / EAP-IG
    estimate split by role (``eap(by_role=True)``).  # [E, R].  ``nodes`` (exact only): every head and MLP with its
    X_c output at each role (:func:`engine.techniques.edges.node_patching`), in ``component_names`` order.  # [N, R]"""
    if ranking == "exact":
        raw = node_patching(backend, pairs, progress=progress) if nodes else \
            edge_patching(backend, pairs, by_role=True, progress=progress)
        return raw.effects().numpy()
    if ranking not in ("eap", "eap-ig") or nodes:
        raise ValueError(f"edges are scored by token role with exact, eap or eap-ig, nodes with exact, not {ranking!r}")
    raw = eap(backend, pairs, steps=0 if ranking == "eap" else steps, by_role=True, progress=progress)
    return raw.effects().numpy()


def cached_role_scores(backend: ModelBackend, pairs: Sequence[PromptPair], ranking: str, *, steps: int = STEPS,
                       nodes: bool = False, cache=None, progress: ProgressFn | None = None
                       ) -> tuple[np.ndarray, dict, bool]:
    """:func:`role_scores` through the result cache, stored as one float64 array (``scores``: an edge's, or node's,
    row per role; SmolLM2: 616,055 values per ranking, one artifact rather than as many cache rows) beside
    {seconds, forward_equivalents}: ([E, R] or [N, R], those artifacts, computed)."""
    from engine.results import decode_array, encode_array, run_cached
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    params = {"dtype": backend.facts.dtype, "ranking": ranking, "steps": steps if ranking == "eap-ig" else 0,
              "by": {"roles": list(CIRCUIT_ROLES), "version": ROLES_VERSION}, "stored": "float64 array [unit, role]"}
    f = backend.facts
    shape = (len(component_names(f.n_layers, f.n_heads)) if nodes else len(edge_graph(backend).names),
             len(CIRCUIT_ROLES))
    resolution = "node-position" if nodes else "edge-position"

    def compute():
        t = time.perf_counter()
        s = role_scores(backend, pairs, ranking, steps=steps, nodes=nodes, progress=progress)  # [E or N, R]
        seconds = time.perf_counter() - t
        fe = ranking_work(backend, pairs, ranking, steps=steps, resolution=resolution).fe(backend, pairs)
        return [], {"seconds": seconds, "forward_equivalents": fe, "scores": encode_array(s, exact=True)}

    method = METHOD + ("_nodes_by_role" if nodes else "_by_role")
    _, art, computed = run_cached(backend, pairs, method, params, compute, cache=cache)
    s = decode_array(art.pop("scores"))
    if s.shape != shape:
        raise ValueError(f"{method}: stored scores of shape {s.shape}, the graph has {shape}")
    return s, art, computed


def ranking_work(backend: ModelBackend, pairs: Sequence[PromptPair], ranking: str, *, steps: int = STEPS,
                 resolution: str = "edge"):
    """The forward work of :func:`scores` (``engine.cost.Work``); at a position ``resolution``, of the scores its
    units are ranked by (:func:`role_scores`)."""
    if ranking == "exact":
        if resolution == "node-position":
            return node_patching_work(backend, pairs)
        return edge_patching_work(backend, pairs, by_role=resolution == "edge-position")
    return eap_work(backend, pairs, steps=0 if ranking == "eap" else steps)


def cached_edge_scores(backend: ModelBackend, pairs: Sequence[PromptPair], ranking: str, *, steps: int = STEPS,
                       cache=None, progress: ProgressFn | None = None) -> tuple[list[EdgeValue], dict, bool]:
    """:func:`scores` through the result cache: (rows, artifacts {seconds, forward_equivalents}, computed)."""
    from engine.results import run_cached_rows
    if ranking not in RANKINGS:
        raise ValueError(f"unknown edge ranking {ranking!r}: choose from {', '.join(RANKINGS)}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    params = {"dtype": backend.facts.dtype, "ranking": ranking, "steps": steps if ranking == "eap-ig" else 0}

    def compute():
        t = time.perf_counter()
        s = scores(backend, pairs, ranking, steps=steps, progress=progress)
        seconds = time.perf_counter() - t
        names = list(edge_graph(backend).names)
        fe = ranking_work(backend, pairs, ranking, steps=steps).fe(backend, pairs)
        return ([EdgeValue(n, ranking, float(v)) for n, v in zip(names, s)],
                {"seconds": seconds, "forward_equivalents": fe})

    return run_cached_rows(backend, pairs, METHOD, params, compute, EdgeValue, cache=cache)


# ---------------------------------------------------------------------------------------------
# MIB's submission format, with the lab's own edge scores
# ---------------------------------------------------------------------------------------------

def mib_edge_graph(edge_scores: dict[str, float], n_layers: int, n_heads: int, d_model: int, *,
                   parallel_attn_mlp: bool = False, size: float | None = None,
                   node_scores: Sequence[float] | None = None) -> dict:
    """One graph in MIB's JSON (module docstring): ``edge_scores`` {MIB edge name: score} of every edge;
    ``size`` None: every edge in, else the top floor(size E) by |score|; ``node_scores`` ([N],
    :func:`engine.techniques.faithfulness.component_names` order) kept beside them where given."""
    names = list(edge_scores)
    values = np.array([edge_scores[n] for n in names], dtype=np.float64)
    k = len(names) if size is None else kept_count(size, len(names))
    inside = set(np.argsort(-np.abs(values), kind="stable")[:k].tolist())
    edges = {n: {"score": float(values[i]), "in_graph": i in inside} for i, n in enumerate(names)}
    touched = {"input", "logits"}
    for i in inside:
        parent, child = names[i].split("->")
        touched |= {parent, child.split("<")[0]}
    nodes = {"input": {"in_graph": True}}
    for i, node in enumerate(component_names(n_layers, n_heads)):
        nodes[node] = {"in_graph": node in touched}
        if node_scores is not None:
            nodes[node]["score"] = float(node_scores[i])
    nodes["logits"] = {"in_graph": True}
    return {"cfg": {"n_layers": n_layers, "n_heads": n_heads, "parallel_attn_mlp": parallel_attn_mlp,
                    "d_model": d_model}, "nodes": nodes, "edges": edges}


def export_mib_edges(backend: ModelBackend, pairs: Sequence[PromptPair], rankings: dict[str, dict[str, dict]],
                     out_dir: Path, sizes: Sequence[float | None] = (None,),
                     node_scores: dict[str, Sequence[float]] | None = None) -> list[Path]:
    """Per MIB task among the pairs' operations, per ranking and size: ``{task}_{model}/edges-{ranking}/
    importances.json`` (every edge in) or ``.../size-{x}.json``.  ``rankings``: {ranking: {task: {edge:
    score}}} over that task's pairs; ``node_scores``: {task: [N]}.  The paths written."""
    f = backend.facts
    written = []
    for ranking, per_task in rankings.items():
        for task, edge_scores in per_task.items():
            for size in sizes:
                graph = mib_edge_graph(edge_scores, f.n_layers, f.n_heads, f.d_model,
                                       parallel_attn_mlp=backend.parallel_attn_mlp, size=size,
                                       node_scores=(node_scores or {}).get(task))
                name = "importances.json" if size is None else f"size-{size:g}.json"
                path = out_dir / mib_folder(task, f.spec) / f"edges-{ranking}" / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(graph))
                written.append(path)
    return written


def tasks_of(pairs: Sequence[PromptPair]) -> dict[str, list[int]]:
    """{MIB task: the indices of its pairs} among ``pairs`` (addition, subtraction)."""
    out: dict[str, list[int]] = {}
    for op, task in MIB_TASKS.items():
        idx = [i for i, p in enumerate(pairs) if p.op == op]
        if idx:
            out[task] = idx
    return out


# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine edge-scores``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def parse_sizes(text: str | None) -> list[float | None]:
    """``"0.01,0.05"`` -> [None, 0.01, 0.05] (None: the importance file); ValueError saying what to type."""
    if not text:
        return [None]
    try:
        sizes = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--mib-sizes {text!r}: write shares of the edges between 0 and 1, e.g. 0.01,0.05") from None
    if not sizes or any(not (0 < x <= 1) or math.isnan(x) for x in sizes):
        raise ValueError(f"--mib-sizes {text!r}: each share must lie in (0, 1], e.g. 0.01,0.05")
    return [None, *sizes]


def cli(args, ctx) -> dict:
    """Every edge's (every unit's, at a position ``--resolution``) score under the chosen rankings -> CSV (one row per
    edge or unit); the circuits' curves with ``--faithfulness``; MIB files (edges) with ``--mib-dir``."""
    sizes = parse_sizes(args.mib_sizes)  # before the model opens: bad input costs nothing
    resolution = getattr(args, "resolution", "edge")
    rankings = list(RANKINGS) if args.ranking == "all" else [args.ranking]
    for r in rankings:
        check_ranking(resolution, r)
    pairs, model = ctx.pairs, ctx.model
    tasks = tasks_of(pairs)
    if args.mib_dir is not None and not tasks:
        raise ValueError("no addition or subtraction prompts in the set: MIB's arithmetic tasks are those two "
                         "(add --ops add,sub)")
    table: dict[str, dict[str, float]] = {}
    info = {}
    units = None if resolution == "edge" else units_of(model, resolution)
    for r in rankings:
        with ctx.progress(f"{'edges' if units is None else RESOLUTIONS[resolution]}: {r}") as bar:
            if units is None:
                rows, art, computed = cached_edge_scores(model, pairs, r, steps=args.steps, cache=ctx.cache,
                                                         progress=bar)
                got = [(row.edge, row.value) for row in rows]
            else:  # the units the circuits are made of, scored as their circuits rank them
                s, art, computed = unit_scores(model, pairs, r, resolution, steps=args.steps, cache=ctx.cache,
                                               progress=bar)
                got = list(zip(units.names, s.tolist()))
        for name, value in got:
            table.setdefault(name, {})[r] = value
        info[r] = {"cached": not computed, "seconds": round(float(art.get("seconds", float("nan"))), 2),
                   "forward_equivalents": round(float(art.get("forward_equivalents", float("nan"))), 1)}
    ctx.write_csv(args.out, [{"edge" if units is None else "unit": e, **v} for e, v in table.items()])
    res = {"out": str(args.out), "n_pairs": len(pairs), "edges": len(edge_graph(model)), "rankings": info}
    if units is not None:
        res |= {"resolution": resolution, "units": len(units)}
    if getattr(args, "faithfulness", None) is not None:
        res["faithfulness"] = _faithfulness(model, pairs, rankings, resolution, args, ctx)
    if args.mib_dir is not None:
        per = {r: {task: _task_scores(model, [pairs[i] for i in idx], r, args.steps, ctx)
                   for task, idx in tasks.items()} for r in rankings}
        nodes = {task: _node_scores(model, [pairs[i] for i in idx], ctx) for task, idx in tasks.items()}
        res["mib"] = [str(p) for p in export_mib_edges(model, pairs, per, args.mib_dir, sizes, nodes)]
    return res


def graph_scores(backend: ModelBackend, pairs: Sequence[PromptPair], rankings: Sequence[str], *,
                 steps: int = STEPS, resolution: str = "edge", cache=None, progress: ProgressFn | None = None
                 ) -> dict[str, np.ndarray]:
    """{ranking: [U]} every unit's cached score (``resolution``: :mod:`engine.techniques.circuit_units`; the edges
    by default, in :func:`engine.techniques.edges.edge_graph`'s order)."""
    if resolution != "edge":
        return {r: unit_scores(backend, pairs, r, resolution, steps=steps, cache=cache, progress=progress)[0]
                for r in rankings}
    names = list(edge_graph(backend).names)
    out = {}
    for r in rankings:
        rows, _, _ = cached_edge_scores(backend, pairs, r, steps=steps, cache=cache, progress=progress)
        value = {x.edge: x.value for x in rows}
        out[r] = np.array([value[n] for n in names], dtype=np.float64)
    return out


def unit_scores(backend: ModelBackend, pairs: Sequence[PromptPair], ranking: str, resolution: str, *,
                steps: int = STEPS, cache=None, progress: ProgressFn | None = None) -> tuple[np.ndarray, dict, bool]:
    """Every unit's cached score at a position ``resolution`` under ``ranking``, in the units' order: (scores [U],
    the scores' artifacts {seconds, forward_equivalents}, computed).  A node at a role ranked exactly is patched as a
    whole (:func:`engine.techniques.edges.node_patching`), not summed over its edges."""
    units = units_of(backend, resolution)
    check_ranking(resolution, ranking)
    if ranking == "exact" and resolution == "node-position":
        s, art, computed = cached_role_scores(backend, pairs, ranking, nodes=True, cache=cache, progress=progress)
        return s.reshape(-1), art, computed  # [N * R]: node-major, then role
    s, art, computed = cached_role_scores(backend, pairs, ranking, steps=steps, cache=cache, progress=progress)
    return units.scores(s), art, computed


def cached_edge_curves(backend: ModelBackend, pairs: Sequence[PromptPair], rankings: Sequence[str], *,
                       steps: int = STEPS, ablation: str = "counterfactual", resolution: str = "edge", cache=None,
                       progress: ProgressFn | None = None):
    """The rankings' edge-circuit faithfulness (:func:`engine.techniques.edge_faithfulness.cached_edge_faithfulness`,
    their scores from this module's cache; ``ablation``: counterfactual or mean; ``resolution``: what a circuit is
    made of, :data:`engine.techniques.circuit_units.RESOLUTIONS`): (table, artifacts, computed)."""
    bad = [r for r in rankings if r not in RANKINGS]
    if bad or not rankings:
        raise ValueError(f"unknown edge ranking {bad}: choose from {', '.join(RANKINGS)}")
    for r in rankings:
        check_ranking(resolution, r)
    return cached_edge_faithfulness(
        backend, pairs, list(rankings),
        lambda: graph_scores(backend, pairs, rankings, steps=steps, resolution=resolution, cache=cache,
                             progress=progress),
        steps=steps if "eap-ig" in rankings else 0, ablation=ablation, resolution=resolution, cache=cache,
        progress=progress)


def cached_curves_if_any(backend: ModelBackend, pairs: Sequence[PromptPair], rankings: Sequence[str], *,
                         steps: int = STEPS, ablation: str = "counterfactual", resolution: str = "edge", cache=None):
    """:func:`cached_edge_curves`'s table when the cache holds it, else None (computes nothing)."""
    from engine.results import NotCached, cache_only
    try:
        with cache_only():
            return cached_edge_curves(backend, pairs, rankings, steps=steps, ablation=ablation,
                                      resolution=resolution, cache=cache)[0]
    except NotCached:
        return None


def edge_curves_work(backend: ModelBackend, pairs: Sequence[PromptPair], rankings: Sequence[str], *,
                     steps: int = STEPS, ablation: str = "counterfactual", resolution: str = "edge", cache=None):
    """The forward work of :func:`cached_edge_curves` (``engine.cost.Work``): nothing when cached; else the rankings'
    scores not yet cached and the circuits' passes -- exact when every ranking's scores are cached (the circuits
    are known), else counted on stand-in scores (a seeded random ranking per missing one: an estimate, the number
    of distinct corrections depends on which edges are kept)."""
    from engine.cost import NO_WORK
    from engine.results import NotCached, cache_only
    from engine.techniques.edge_faithfulness import edge_faithfulness_work
    try:
        with cache_only():
            cached_edge_curves(backend, pairs, rankings, steps=steps, ablation=ablation, resolution=resolution,
                               cache=cache)
        return NO_WORK
    except NotCached:
        pass
    units = units_of(backend, resolution)
    w, scores = NO_WORK, {}
    for i, r in enumerate(rankings):
        try:
            with cache_only():
                scores |= graph_scores(backend, pairs, [r], steps=steps, resolution=resolution, cache=cache)
        except NotCached:
            w += ranking_work(backend, pairs, r, steps=steps, resolution=resolution)
            scores[r] = np.random.default_rng(i).random(len(units))
    return w + edge_faithfulness_work(backend, pairs, scores, ablation=ablation,
                                      units=None if resolution == "edge" else units)


def _faithfulness(model, pairs, rankings: list[str], resolution: str, args, ctx) -> dict:
    """The rankings' edge-circuit faithfulness curves -> CSV, the areas into the summary."""
    with ctx.progress("edges: faithfulness") as bar:
        table, art, computed = cached_edge_curves(model, pairs, rankings, steps=args.steps, ablation=args.ablation,
                                                  resolution=resolution, cache=ctx.cache, progress=bar)
    ctx.write_csv(args.faithfulness, [p.__dict__ for p in table.points])
    return {"out": str(args.faithfulness), "cached": not computed, "resolution": resolution,
            "seconds": round(float(art.get("seconds", float("nan"))), 2),
            "forward_equivalents": round(float(art.get("forward_equivalents", float("nan"))), 1),
            "scores": [{k: v for k, v in s.__dict__.items() if k in SCORE_FIELDS} for s in table.scores]}


def _node_scores(model, pairs, ctx) -> list[float]:
    """The nodes' exact path-patching scores (the Faithfulness page's node ranking), kept beside the edges'."""
    from engine.techniques.faithfulness import scores_of
    from engine.techniques.path_patching import cached_path_patching
    table, _ = cached_path_patching(model, pairs, cache=ctx.cache)
    return scores_of(*table.per_pair.per_pair("logit_diff")).tolist()


def _task_scores(model, pairs, ranking: str, steps: int, ctx) -> dict[str, float]:
    with ctx.progress(f"edges: {ranking} (MIB task)") as bar:
        rows, _, _ = cached_edge_scores(model, pairs, ranking, steps=steps, cache=ctx.cache, progress=bar)
    return {r.edge: r.value for r in rows}
