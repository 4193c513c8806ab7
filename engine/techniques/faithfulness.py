"""Circuit faithfulness curves: how much of the model's behaviour does the top x % of its components keep?

The paper validates its key heads one knockout at a time (Fig. 3).  The field now scores a circuit as a whole
(MIB, Mueller et al. 2025, "MIB: A Mechanistic Interpretability Benchmark", circuit localization track):

1. **Components.**  Every attention head and every MLP: N = L x H + L.
2. **Rankings.**  Order the components by a score, largest first:

   * ``exact``  -- |mean over pairs of the path-patching logit difference| (:mod:`engine.techniques.path_patching`:
     the component's END output from X_c, every other head frozen at X_r);
   * ``atp``    -- |mean of its attribution-patching estimate| (:func:`engine.techniques.attribution.path_atp`:
     the same quantity to first order, one backward pass);
   * ``random`` -- ``RANDOM_DRAWS`` random orders (seeded), pair i under order i mod ``RANDOM_DRAWS``
     (:func:`circuit_for`): every pair is read under one random circuit of each size, so the random ranking costs
     what one ranking costs, and its curve is the mean over the pairs like the others'.

3. **Circuits.**  For each size x of MIB's grid (``SIZES``: 0, 0.1 %, 0.2 %, 0.5 %, 1 %, 2 %, 5 %, 10 %, 20 %, 50 %,
   100 %), the circuit C keeps the top k = floor(x N) components ("no more than x", as MIB's submissions) and every
   other component is ablated, in every position, by one of ``ABLATIONS``:

   * ``counterfactual`` (the default; MIB's default "patching" ablation) -- its value on the pair's own X_c, the
     same prompt with the operation removed: the component keeps the operands but loses the operation;
   * ``mean`` -- its mean over the counterfactual prompts (:mod:`engine.techniques.knockout`: END-aligned means of
     X_c, per template), as the Fig. 3 knockouts: the component loses the operands too, so a circuit must carry
     them itself (a harsher test; on the bundled model f stays near 0 below 50 % kept with either ranking).
4. **Metric.**  m = the answer token's logit at END minus the mean logit over the vocabulary (a logit difference:
   unchanged when every logit shifts by a constant), averaged over the prompt pairs; and first-token accuracy.
5. **Faithfulness.**  f(x) = (m(C) - m(empty)) / (m(M) - m(empty)): M the whole model (nothing ablated), empty every
   component ablated.  f = 1: the circuit does what the model does; 0: no better than nothing.
6. **Scores.**  MIB's areas with x normalised to [0, 1] (trapezoids between the grid's points): CPR, the area under
   f (higher is better), and CMD, the area between f and 1, |1 - f| (lower is better).
7. **Intervals.**  Every f(x), CPR and CMD with a percentile bootstrap over the prompt pairs
   (:mod:`engine.numerics.intervals`: ``RESAMPLES`` resamples, seeded), from the stored per-pair readouts -- no
   forward pass again.  Resampling the pairs resamples the random ranking's orders with them.

Cost: one END-only readout per distinct circuit and pair it applies to, several circuits per pass
(:func:`engine.techniques.knockout.knockout_end` with its ``cells``); the x = 0 and x = 1 circuits are shared by
every ranking.

The circuit of one ranking can be written in MIB's submission format (:func:`mib_graph`): the JSON that EAP-IG's
``Graph.from_json`` reads (``EAP-IG/src/eap/graph.py`` in MIB's circuit-track repository): ``cfg``, ``nodes``
(``input``, ``a{layer}.h{head}``, ``m{layer}``, ``logits``: ``in_graph`` and ``score``) and ``edges`` (every edge of
the residual graph, ``parent->child`` with ``<q>``/``<k>``/``<v>`` into heads: ``in_graph`` and ``score``).  The lab
ranks nodes, so an edge is in the circuit when both of its nodes are, and its score is the smaller of its nodes'
scores (a threshold on the edges keeps exactly the edges between nodes above it).
"""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from engine.backends.base import ModelBackend
from engine.numerics.intervals import LEVEL, RESAMPLES, SEED, Interval
from engine.progress import ProgressFn
from engine.prompts.pairs import PromptPair
from engine.techniques.knockout import Knockout, MeanActivations, knockout_end, mean_activations

METHOD = "faithfulness"
#: MIB's circuit sizes (share of the components kept), with the whole model at the end
SIZES: tuple[float, ...] = (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
RANKINGS: tuple[str, ...] = ("exact", "atp", "random")
METRICS: tuple[str, ...] = ("logit", "accuracy")
RANDOM_DRAWS = 5
ABLATIONS: tuple[str, ...] = ("counterfactual", "mean")


# ---------------------------------------------------------------------------------------------
# components, rankings and circuits
# ---------------------------------------------------------------------------------------------

def component_names(n_layers: int, n_heads: int) -> list[str]:
    """The N components in the lab's order: heads ``a{layer}.h{head}`` layer by layer, then MLPs ``m{layer}``
    (MIB's node names)."""
    return [f"a{layer}.h{h}" for layer in range(n_layers) for h in range(n_heads)] + \
        [f"m{layer}" for layer in range(n_layers)]


def scores_of(head_values: torch.Tensor, mlp_values: torch.Tensor) -> np.ndarray:
    """[N] |mean over pairs| of per-pair values ([P, L, H] heads, [P, L] MLPs), in :func:`component_names` order."""
    h = torch.nan_to_num(head_values.float().nanmean(0)).abs().reshape(-1)  # [L * H]
    m = torch.nan_to_num(mlp_values.float().nanmean(0)).abs()              # [L]
    return torch.cat([h, m]).numpy().astype(np.float64)


def order_of(scores: np.ndarray) -> np.ndarray:
    """Component indices by score, largest first (ties in component order)."""
    return np.argsort(-scores, kind="stable")


def random_orders(n: int, draws: int, seed: int = SEED) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.permutation(n) for _ in range(draws)]


def kept_count(size: float, n: int) -> int:
    """Components a circuit of ``size`` keeps: floor(size x n), no more than the share (1e-9: 0.5 x 72 is 36)."""
    return min(n, int(math.floor(size * n + 1e-9)))


def circuit_knockout(order: np.ndarray, k: int, n_layers: int, n_heads: int) -> Knockout:
    """The knockout that keeps the first ``k`` components of ``order`` and ablates the rest."""
    keep = set(order[:k].tolist())
    nh = n_layers * n_heads
    heads = tuple((i // n_heads, i % n_heads) for i in range(nh) if i not in keep)
    mlps = tuple(i - nh for i in range(nh, nh + n_layers) if i not in keep)
    return Knockout(heads, mlps)


@dataclass(frozen=True)
class Circuit:
    """One evaluated circuit: ``ranking`` (draw ``draw`` of it), size x, k components kept."""

    ranking: str
    draw: int
    size: float
    k: int


def plan(orders: dict[str, list[np.ndarray]], n_layers: int, n_heads: int, sizes: Sequence[float] = SIZES
         ) -> tuple[list[Circuit], list[Knockout]]:
    """Every (ranking, draw, size) circuit and its knockout set; the whole model and the empty circuit first."""
    n = n_layers * n_heads + n_layers
    circuits = [Circuit("model", 0, 1.0, n), Circuit("empty", 0, 0.0, 0)]
    kos = [Knockout(), circuit_knockout(np.arange(n), 0, n_layers, n_heads)]
    for name, draws in orders.items():
        for d, order in enumerate(draws):
            for x in sizes:
                k = kept_count(x, n)
                circuits.append(Circuit(name, d, x, k))
                kos.append(circuit_knockout(order, k, n_layers, n_heads))
    return circuits, kos


# ---------------------------------------------------------------------------------------------
# curves, areas and their intervals
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FaithPoint:
    """f at one size of one ranking's curve, with its bootstrap interval."""

    ranking: str
    metric: str
    size: float
    k: int
    f: float
    low: float
    high: float


@dataclass(frozen=True)
class FaithScore:
    """CPR (area under f) and CMD (area between f and 1) of one ranking, with their intervals."""

    ranking: str
    metric: str
    cpr: float
    cpr_low: float
    cpr_high: float
    cmd: float
    cmd_low: float
    cmd_high: float
    gap: float       # CPR minus the random ranking's CPR, on the same resamples (random: 0)
    gap_low: float
    gap_high: float

    @property
    def cpr_interval(self) -> Interval:
        return Interval(self.cpr, self.cpr_low, self.cpr_high)

    @property
    def cmd_interval(self) -> Interval:
        return Interval(self.cmd, self.cmd_low, self.cmd_high)

    @property
    def gap_interval(self) -> Interval:
        return Interval(self.gap, self.gap_low, self.gap_high)


def areas(f: np.ndarray, sizes: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(CPR, CMD) of curves ``f`` [..., len(sizes)]: trapezoids over the sizes normalised by the last (MIB)."""
    x = np.asarray(sizes, dtype=np.float64) / sizes[-1]
    return np.trapezoid(f, x, axis=-1), np.trapezoid(np.abs(1.0 - f), x, axis=-1)


def resample_indices(n: int, resamples: int = RESAMPLES, seed: int = SEED) -> np.ndarray:
    """[resamples + 1, n] pair indices: row 0 every pair once, then resamples with replacement (seeded)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([np.arange(n)[None], rng.integers(0, n, size=(resamples, n))])


def curves(values: np.ndarray, circuits: Sequence[Circuit], sizes: Sequence[float], idx: np.ndarray
           ) -> dict[str, np.ndarray]:
    """Per ranking, f [R, len(sizes)] on each row of ``idx`` (the pairs of one resample); several draws of a
    ranking: their mean.

    values: [S, P] one metric per circuit and pair, in the order of ``circuits``."""
    means = values[:, idx].mean(-1)                       # [S, R]: the metric's mean over each resample's pairs
    full, empty = means[0], means[1]                      # the model, the empty circuit
    denom = np.where(full - empty == 0, np.nan, full - empty)
    f = (means - empty) / denom                            # [S, R]
    at = {(c.ranking, c.draw, c.size): i for i, c in enumerate(circuits)}
    out = {}
    for name in dict.fromkeys(c.ranking for c in circuits[2:]):
        draws = sorted({c.draw for c in circuits if c.ranking == name})
        per_draw = np.stack([np.stack([f[at[(name, d, x)]] for x in sizes], -1) for d in draws])  # [D, R, X]
        out[name] = per_draw.mean(0)
    return out


def summarize(right: np.ndarray, margin: np.ndarray, circuits: Sequence[Circuit], sizes: Sequence[float] = SIZES,
              *, resamples: int = RESAMPLES, seed: int = SEED) -> tuple[list[FaithPoint], list[FaithScore]]:
    """Curves and areas of every ranking and metric, each with its percentile bootstrap interval over the pairs."""
    idx = resample_indices(right.shape[1], resamples, seed)
    q = [(1 - LEVEL) / 2 * 100, (1 + LEVEL) / 2 * 100]

    def iv(a: np.ndarray) -> tuple[float, float, float]:  # a: [R, ...] row 0 on all pairs -> value, low, high
        with warnings.catch_warnings():  # a quantity with no value on any resample (no random ranking: its gap) is NaN
            warnings.filterwarnings("ignore", "All-NaN slice", RuntimeWarning)
            lo, hi = np.nanpercentile(a[1:], q, axis=0) if right.shape[1] > 1 else (a[0] * np.nan,) * 2
        return a[0], lo, hi

    points, scores = [], []
    ks = {(c.ranking, c.size): c.k for c in circuits}
    for metric, values in (("logit", margin.astype(np.float64)), ("accuracy", right.astype(np.float64))):
        fs = curves(values, circuits, sizes, idx)  # ranking -> f [R, X]
        base = areas(fs["random"], sizes)[0] if "random" in fs else None
        for name, f in fs.items():
            v, lo, hi = iv(f)
            points += [FaithPoint(name, metric, float(x), ks[(name, x)], float(v[i]), float(lo[i]), float(hi[i]))
                       for i, x in enumerate(sizes)]
            cpr, cmd = areas(f, sizes)  # [R] each
            gap = cpr - base if base is not None else cpr * np.nan
            scores.append(FaithScore(name, metric, *map(float, iv(cpr)), *map(float, iv(cmd)), *map(float, iv(gap))))
    return points, scores


# ---------------------------------------------------------------------------------------------
# the computation and its cached result
# ---------------------------------------------------------------------------------------------

@dataclass
class FaithRaw:
    """Per-pair END readouts of every circuit (S circuits, P pairs) and the rankings' orders and scores."""

    circuits: list[Circuit]
    right: np.ndarray    # [S, P] bool
    margin: np.ndarray   # [S, P] float32
    scores: dict[str, np.ndarray]  # ranking -> [N] component scores (exact, atp)
    orders: dict[str, list[np.ndarray]]
    n_layers: int
    n_heads: int


def faithfulness(backend: ModelBackend, pairs: Sequence[PromptPair], scores: dict[str, np.ndarray],
                 means: MeanActivations | None, *, draws: int = RANDOM_DRAWS, seed: int = SEED,
                 sizes: Sequence[float] = SIZES, progress: ProgressFn | None = None) -> FaithRaw:
    """Evaluate every circuit of every ranking (``scores``: ranking -> [N]; plus ``draws`` random orders, pair i
    under order i mod ``draws``); the components outside a circuit take their mean over X_c (``means``) or,
    ``means`` None, their value on the pair's own X_c.  The random ranking's rows: one per size, each pair's
    readout under its own order's circuit."""
    L, H = backend.facts.n_layers, backend.facts.n_heads
    n = L * H + L
    orders = {name: [order_of(s)] for name, s in scores.items()}
    orders["random"] = random_orders(n, draws, seed)
    circuits, kos = plan(orders, L, H, sizes)
    draw = np.arange(len(pairs)) % draws  # [P]: the random order each pair is read under
    cells = np.stack([draw == c.draw if c.ranking == "random" else np.ones(len(pairs), bool) for c in circuits])
    out = knockout_end(backend, pairs, kos, means, cells=torch.from_numpy(cells), progress=progress)
    keep = [i for i, c in enumerate(circuits) if c.ranking != "random" or c.draw == 0]  # one random row per size
    right, margin = out.right.numpy(), out.margin.numpy()
    for i in keep:
        if circuits[i].ranking == "random":  # each pair's readout under its own order's circuit of this size
            row_of = {c.draw: j for j, c in enumerate(circuits) if c.ranking == "random" and c.size == circuits[i].size}
            pick = np.array([row_of[d] for d in draw])  # [P]
            right[i], margin[i] = right[pick, np.arange(len(pairs))], margin[pick, np.arange(len(pairs))]
    return FaithRaw([circuits[i] for i in keep], right[keep], margin[keep], dict(scores), orders, L, H)


def circuit_for(raw: FaithRaw, circuit: Circuit, pair: int) -> Knockout:
    """The knockout that ``circuit`` of ``raw`` applies to pair number ``pair`` (a random circuit: the pair's own
    order, ``pair`` mod the number of orders)."""
    L, H = raw.n_layers, raw.n_heads
    if circuit.ranking == "model":
        return Knockout()
    if circuit.ranking == "empty":
        return circuit_knockout(np.arange(L * H + L), 0, L, H)
    draws = raw.orders[circuit.ranking]
    return circuit_knockout(draws[pair % len(draws)], circuit.k, L, H)


@dataclass
class FaithTable:
    """A cached faithfulness result: the curves and areas with intervals, and what they were computed from."""

    n_layers: int
    n_heads: int
    n_pairs: int
    points: list[FaithPoint]
    scores: list[FaithScore]
    component_scores: dict[str, list[float]]  # ranking -> [N] (exact, atp)
    fallback: str | None = None

    def score(self, ranking: str, metric: str = "logit") -> FaithScore:
        return next(s for s in self.scores if s.ranking == ranking and s.metric == metric)

    def curve(self, ranking: str, metric: str = "logit") -> list[FaithPoint]:
        return [p for p in self.points if p.ranking == ranking and p.metric == metric]


def ranking_scores(backend: ModelBackend, pairs: Sequence[PromptPair], *, cache=None,
                   progress: ProgressFn | None = None) -> tuple[dict[str, np.ndarray], str | None]:
    """The exact (cached path patching) and AtP scores of every component, and AtP's fallback note if any."""
    from engine.techniques.attribution import path_atp
    from engine.techniques.path_patching import cached_path_patching
    table, _ = cached_path_patching(backend, pairs, cache=cache, progress=progress)
    atp = path_atp(backend, pairs, progress=progress)
    return ({"exact": scores_of(*table.per_pair.per_pair("logit_diff")),
             "atp": scores_of(*atp.per_pair("logit_diff"))}, atp.fallback)


def faithfulness_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, draws: int = RANDOM_DRAWS,
                      ablation: str = ABLATIONS[0], seed: int = SEED, cache=None, with_ranking: bool = True):
    """The forward work of :func:`cached_faithfulness` (``engine.cost.Work``): the rankings (path patching unless
    cached or ``with_ranking`` is False: counted by the caller; path AtP), the means (mean ablation) and every
    circuit's END readout -- the same plan, with stand-in orders for the two rankings (their sets differ, not their
    number)."""
    from engine.cost import unless_cached
    from engine.techniques.attribution import path_atp_work
    from engine.techniques.knockout import knockout_end_work, mean_activations_work
    from engine.techniques.path_patching import cached_path_patching, path_patching_work
    L, H = backend.facts.n_layers, backend.facts.n_heads
    n = L * H + L
    stand_in = random_orders(n, 2, seed + 1)
    circuits, kos = plan({"exact": stand_in[:1], "atp": stand_in[1:], "random": random_orders(n, draws, seed)}, L, H)
    draw = np.arange(len(pairs)) % draws
    cells = np.stack([draw == c.draw if c.ranking == "random" else np.ones(len(pairs), bool) for c in circuits])
    mean = ablation == "mean"
    w = path_atp_work(backend, pairs)
    if with_ranking:
        w += unless_cached(lambda: cached_path_patching(backend, pairs, cache=cache),
                           lambda: path_patching_work(backend, pairs))
    if mean:
        w += mean_activations_work(backend, pairs)
    return w + knockout_end_work(backend, pairs, kos, mean=mean, cells=torch.from_numpy(cells))


def cached_faithfulness(backend: ModelBackend, pairs: Sequence[PromptPair], *, draws: int = RANDOM_DRAWS,
                        ablation: str = ABLATIONS[0], seed: int = SEED, cache=None,
                        progress: ProgressFn | None = None) -> tuple[FaithTable, bool]:
    """:func:`faithfulness` of the exact, AtP and random rankings through the result cache: (table, computed)."""
    from engine.results import decode_rows, encode_array, encode_rows, run_cached
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}: choose from {', '.join(ABLATIONS)}")
    f = backend.facts
    params = {"sizes": list(SIZES), "draws": draws, "seed": seed, "dtype": f.dtype,
              "rankings": "exact |mean logit_diff| (path patching), atp |mean| (path AtP), "
                          "random (pair i under order i mod draws)",
              "ablation": {"counterfactual": "the pair's own X_c, every position",
                           "mean": "mean over X_c, per template, END-aligned"}[ablation],
              "metric": "answer logit - mean logit; accuracy",
              "resamples": RESAMPLES, "level": LEVEL}

    def compute():
        scores, fallback = ranking_scores(backend, pairs, cache=cache, progress=progress)
        means = mean_activations(backend, pairs) if ablation == "mean" else None
        raw = faithfulness(backend, pairs, scores, means, draws=draws, seed=seed, progress=progress)
        pts, sc = summarize(raw.right, raw.margin, raw.circuits)
        return encode_rows(pts, FAITH_POINT) + encode_rows(sc, FAITH_SCORE), {
            "n_layers": f.n_layers, "n_heads": f.n_heads, "n_pairs": len(pairs), "fallback": fallback or "",
            "component_scores": {k: [float(v) for v in s] for k, s in scores.items()},
            "right": encode_array(raw.right.astype(np.float32)), "margin": encode_array(raw.margin),
            "circuits": [c.__dict__ for c in raw.circuits]}

    rows, art, computed = run_cached(backend, pairs, METHOD, params, compute, cache)
    point_rows = [r for r in rows if r.metric in FAITH_POINT]
    score_rows = [r for r in rows if r.metric in FAITH_SCORE]
    return FaithTable(int(art["n_layers"]), int(art["n_heads"]), int(art["n_pairs"]),
                      decode_rows(FaithPoint, point_rows, FAITH_POINT),
                      decode_rows(FaithScore, score_rows, FAITH_SCORE),
                      {k: list(v) for k, v in art["component_scores"].items()}, art.get("fallback") or None), computed


FAITH_POINT = ("k", "f", "low", "high")
FAITH_SCORE = ("cpr", "cpr_low", "cpr_high", "cmd", "cmd_low", "cmd_high", "gap", "gap_low", "gap_high")


# ---------------------------------------------------------------------------------------------
# MIB's submission format
# ---------------------------------------------------------------------------------------------

def mib_graph(scores: Sequence[float], n_layers: int, n_heads: int, d_model: int, *,
              parallel_attn_mlp: bool = False, size: float | None = None) -> dict:
    """One circuit in MIB's JSON format (module docstring): node scores ``scores`` ([N], :func:`component_names`
    order); ``size`` None: every node in the graph (an importance-score submission), else the top floor(size N).
    ``input`` has no score (MIB: an unscored node stays in the graph); ``logits`` is always in."""
    names = component_names(n_layers, n_heads)
    keep = set(order_of(np.asarray(scores, dtype=np.float64))[:len(names) if size is None
                                                              else kept_count(size, len(names))].tolist())
    score = {name: float(scores[i]) for i, name in enumerate(names)} | {"input": math.inf, "logits": math.inf}
    inside = {name: i in keep for i, name in enumerate(names)} | {"input": True, "logits": True}
    nodes = {"input": {"in_graph": True}} | {name: {"in_graph": inside[name], "score": score[name]} for name in names}
    nodes["logits"] = {"in_graph": True}
    edges = {}
    for parent, child, qkv in mib_edges(n_layers, n_heads, parallel_attn_mlp):
        s = min(score[parent], score[child])
        edges[f"{parent}->{child}" + (f"<{qkv}>" if qkv else "")] = {
            "score": 0.0 if math.isinf(s) else s, "in_graph": inside[parent] and inside[child]}
    return {"cfg": {"n_layers": n_layers, "n_heads": n_heads, "parallel_attn_mlp": parallel_attn_mlp,
                    "d_model": d_model}, "nodes": nodes, "edges": edges}


def mib_edges(n_layers: int, n_heads: int, parallel_attn_mlp: bool = False) -> list[tuple[str, str, str | None]]:
    """Every edge of the residual graph: (parent, child, q/k/v or None).

    A head reads (q, k and v) every earlier node: the input and the heads and MLPs of earlier layers; an MLP
    reads those and, in a sequential block, its own layer's heads (a parallel block's MLP reads the block input);
    the logits read every node."""
    upstream = ["input"]
    out: list[tuple[str, str, str | None]] = []
    for layer in range(n_layers):
        heads = [f"a{layer}.h{h}" for h in range(n_heads)]
        out += [(p, a, qkv) for p in upstream for a in heads for qkv in "qkv"]
        mlp_reads = upstream if parallel_attn_mlp else upstream + heads
        out += [(p, f"m{layer}", None) for p in mlp_reads]
        upstream = upstream + heads + [f"m{layer}"]
    out += [(p, "logits", None) for p in upstream]
    return out


#: the lab's operations that are MIB tasks, and the task's folder name in a submission
MIB_TASKS = {"add": "arithmetic-addition", "sub": "arithmetic-subtraction"}


def mib_folder(task: str, model_name: str) -> str:
    """A submission folder: ``{task}_{model}`` (MIB splits it at the underscore, so the model name has none)."""
    name = re.sub(r"\.gguf$", "", Path(model_name.rstrip("/")).name.lower())
    slug = re.sub(r"[^a-z0-9.\-]+", "-", name).strip("-") or "model"
    return f"{task}_{slug}"


def mib_submission(backend: ModelBackend, pairs: Sequence[PromptPair], table) -> dict[str, dict]:
    """The exact ranking's importance scores per MIB task among the pairs' operations: {``{task}_{model}/
    importances.json``: graph} (one graph with every node in and its score; MIB thresholds it).
    ``table``: the path-patching table of ``pairs`` (its per-pair logit differences)."""
    f = backend.facts
    heads, mlps = table.per_pair.per_pair("logit_diff")  # [P, L, H], [P, L]
    out = {}
    for op, task in MIB_TASKS.items():
        idx = [i for i, p in enumerate(pairs) if p.op == op]
        if idx:
            out[f"{mib_folder(task, f.spec)}/importances.json"] = mib_graph(
                scores_of(heads[idx], mlps[idx]), f.n_layers, f.n_heads, f.d_model,
                parallel_attn_mlp=backend.parallel_attn_mlp)
    return out


def export_mib(backend: ModelBackend, pairs: Sequence[PromptPair], table, out_dir: Path) -> list[Path]:
    """:func:`mib_submission` written under ``out_dir``: the paths written."""
    written = []
    for rel, graph in mib_submission(backend, pairs, table).items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(graph))
        written.append(path)
    return written


# ---------------------------------------------------------------------------------------------
# its sentence of the circuit summary (cached results only) and the command line
# ---------------------------------------------------------------------------------------------

#: the faithfulness a circuit must keep to count as "doing what the model does" in the summaries (MIB's papers
#: read f >= 0.8 as a faithful circuit)
FAITHFUL = 0.8


def point_at(points: Sequence[FaithPoint], ranking: str, metric: str, size: float) -> FaithPoint | None:
    """``ranking``'s point of ``metric`` at circuit size ``size`` (None: not on its curve)."""
    return next((p for p in points if p.ranking == ranking and p.metric == metric and abs(p.size - size) < 1e-12),
                None)


def smallest_faithful(points: Sequence[FaithPoint], ranking: str, metric: str = "logit", level: float = FAITHFUL
                      ) -> FaithPoint | None:
    """The smallest circuit of ``ranking``'s curve whose f reaches ``level`` (its point; None: none does, the whole
    model aside -- f = 1 there by definition)."""
    curve = sorted((p for p in points if p.ranking == ranking and p.metric == metric and p.size < 1.0),
                   key=lambda p: p.size)
    return next((p for p in curve if p.f >= level), None)


def verdict_text(table: FaithTable) -> tuple[str, bool | None]:
    """The Paper row's number and whether the exact ranking's circuits beat random ones (CPR gap interval > 0)."""
    ex, atp, rnd = (table.score(r) for r in RANKINGS)
    lab = (f"CPR exact {ex.cpr_interval.text()}, AtP {atp.cpr_interval.text()}, random {rnd.cpr_interval.text()} "
           f"(exact - random {ex.gap_interval.text('{:+.2f}')}); CMD exact {ex.cmd_interval.text()}")
    return lab, ex.gap_interval.above(0.0)


def finding(model, pairs, cache, table) -> str | None:
    """The faithfulness scores, when the cache holds them."""
    from engine.results import NotCached, cache_only
    try:
        with cache_only():
            t, _ = cached_faithfulness(model, pairs, cache=cache)
    except NotCached:
        return None
    ex, rnd = t.score("exact"), t.score("random")
    return (f"Circuits of the top path-patching components keep CPR {ex.cpr:.2f} of the model's answer logit "
            f"(random circuits of the same sizes {rnd.cpr:.2f}; MIB's area under the faithfulness curve).")


def cli(args, ctx) -> dict:
    """The faithfulness curves of the exact, AtP and random rankings -> CSV (and MIB submission files)."""
    from engine.techniques.path_patching import cached_path_patching
    model, pairs = ctx.model, ctx.pairs
    if args.mib_dir is not None and not any(p.op in MIB_TASKS for p in pairs):
        raise ValueError("no addition or subtraction prompts in the set: MIB's arithmetic tasks are those two "
                         "(--ops add,sub)")
    with ctx.progress("faithfulness") as bar:
        table, computed = cached_faithfulness(model, pairs, draws=args.draws, ablation=args.ablation,
                                              cache=ctx.cache, progress=bar)
    ctx.write_csv(args.out, [p.__dict__ for p in table.points])
    res = {"out": str(args.out), "cached": not computed, "n_pairs": len(pairs), "ablation": args.ablation,
           "components": len(table.component_scores["exact"]),
           "scores": [{k: v for k, v in s.__dict__.items()} for s in table.scores]}
    if table.fallback:
        res["atp_note"] = table.fallback
    if args.mib_dir is not None:
        pp, _ = cached_path_patching(model, pairs, cache=ctx.cache)
        res["mib"] = [str(p) for p in export_mib(model, pairs, pp, args.mib_dir)]
    return res
