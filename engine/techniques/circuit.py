"""The circuit as a diagram (the paper's Figure 1): operand and operator tokens -> key heads -> MLPs -> the answer.

Built from results the other techniques cache, so the diagram and the pages show the same numbers:

* **Key heads.**  The top-k heads of path patching (:meth:`~engine.techniques.path_patching.PatchingTable.
  top_heads`, the heatmap's ranking); each node's ``effect`` is its heatmap cell (the mean over the set in the
  table's ranking metric).
* **MLPs.**  The m MLPs with the most negative path-patching value (their heatmap column).
* **Answer edges.**  Key head -> answer and MLP -> answer, width |effect| (the component's END output patched
  from X_c, every other head frozen: its effect on the answer logit).
* **Token edges.**  Operand A / operand B / operator -> key head, width the head's mean END-row attention on
  tokens of that role (:func:`engine.techniques.attention.cached_role_attention`, Fig. 5), drawn when at least
  ``MIN_ATTENTION``.
* **Head -> head edges** (optional, ``senders``).  For each key head as a receiver (its query), the earlier key
  heads' head -> head path-patching effect (:mod:`engine.techniques.head_patching`), width |effect|, drawn when at
  least ``MIN_SHARE`` of the strongest such edge.

**An edge circuit** (:func:`edge_diagram`, issue 50): the top ``top`` edges of MIB's residual graph by |score|
under a ranking of :mod:`engine.techniques.edge_scores` (exact edge patching, EAP, EAP-IG: their cached scores),
drawn with the nodes they join -- the input (the token embeddings), heads, MLPs, the logits (the answer).  An
edge's weight is its score, ``via`` what the receiver reads (a head's q, k or v); a head's or MLP's ``effect`` is
the score of its own edge to the logits under the same ranking (its direct effect on the answer).

Layout: x is the layer (tokens at -1, the answer at L), nodes of one layer stacked.  The diagram is plain data
(:class:`Diagram`: nodes and edges with their numbers) with a JSON form that round-trips; ``views`` draws it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

from engine.backends.base import ModelBackend
from engine.progress import ProgressFn, Stages
from engine.prompts.pairs import PromptPair

MIN_ATTENTION = 0.10
MIN_SHARE = 0.10
TOKEN_ROLES = ("operand A", "operand B", "operator")


@dataclass(frozen=True)
class Node:
    id: str          # "A", "B", "op", "h3.1", "m5", "answer"
    kind: str        # "token" | "head" | "mlp" | "answer"
    layer: int       # -1 for tokens, L for the answer
    head: int = -1
    label: str = ""
    effect: float = 0.0  # heads / MLPs: the heatmap's value
    note: str = ""       # the user's note on a pinned head / MLP (plain text; engine.findings.notes)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    kind: str        # "attention" | "effect" | "head-head" | "edge" (an edge of MIB's graph: edge_diagram)
    weight: float    # attention share, or the (signed) effect / edge score
    via: str = ""    # "edge": the receiver's input the edge reaches -- "q", "k", "v" of a head; "" otherwise


@dataclass
class Diagram:
    model: str
    metric: str
    n_pairs: int
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"model": self.model, "metric": self.metric, "n_pairs": self.n_pairs,
                "nodes": [asdict(n) for n in self.nodes], "edges": [asdict(e) for e in self.edges]}

    @classmethod
    def from_json(cls, d: dict) -> "Diagram":
        return cls(d["model"], d["metric"], int(d["n_pairs"]), [Node(**n) for n in d["nodes"]],
                   [Edge(**e) for e in d["edges"]])

    def noted(self, labels: dict[str, str]) -> "Diagram":
        """The diagram with each pinned head's / MLP's note (``labels``: component ``1.3`` / ``1.mlp`` -> note)."""
        def name(n: Node) -> str:
            return f"{n.layer}.{n.head}" if n.kind == "head" else f"{n.layer}.mlp" if n.kind == "mlp" else ""
        return Diagram(self.model, self.metric, self.n_pairs,
                       [replace(n, note=labels.get(name(n), "")) for n in self.nodes], list(self.edges))

    def node(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.id == node_id)


def head_id(layer: int, head: int) -> str:
    return f"h{layer}.{head}"


def circuit_parts(backend: ModelBackend, pairs: Sequence[PromptPair], *, k: int = 5, senders: bool = False,
                  cache=None) -> list[tuple[str, object]]:
    """What :func:`circuit_diagram` still has to compute, in words, with each part's forward work
    (``engine.cost.Work``): path patching and the attention by role unless cached, and with ``senders`` one head ->
    head path patching per key head above layer 0 not cached (when path patching is not cached yet, its key heads
    are not known: counted at the top layer, the most).  A cached part is left out."""
    from engine.cost import NO_WORK, unless_cached
    from engine.results import NotCached, cache_only
    from engine.techniques.attention import cached_role_attention, end_rows_work
    from engine.techniques.head_patching import Receiver, cached_head_path_patching, head_path_patching_work
    from engine.techniques.path_patching import cached_path_patching, path_patching_work
    parts = [("the attention by token role", unless_cached(lambda: cached_role_attention(backend, pairs, cache=cache),
                                                           lambda: end_rows_work(backend, pairs)))]
    try:
        with cache_only():
            table, _ = cached_path_patching(backend, pairs, cache=cache)
        heads = [(layer, head) for layer, head, _ in table.top_heads(k)]
        named = True
    except NotCached:
        parts.append(("path patching", path_patching_work(backend, pairs)))
        heads = [(backend.facts.n_layers - 1, h % backend.facts.n_heads) for h in range(k)]
        named = False
    if senders:
        for layer, head in heads:
            if layer > 0:
                rec = Receiver(layer, head, "q")
                parts.append((f"{INTO}{layer}.{head}" if named else f"{INTO}each key head",
                              unless_cached(lambda r=rec: cached_head_path_patching(backend, pairs, r, cache=cache),
                                            lambda r=rec: head_path_patching_work(backend, pairs, r))))
    return [(name, w) for name, w in parts if w != NO_WORK]


#: how a head -> head part of :func:`circuit_parts` is named (its receiver follows)
INTO = "head → head path patching into "


def parts_text(parts: Sequence[tuple[str, object]]) -> str:
    """:func:`circuit_parts`' names in one phrase, the head -> head ones as one list ("…; head → head path patching
    into 1.3, 1.1 and 5.5")."""
    names = [name for name, _ in parts]
    into = list(dict.fromkeys(n[len(INTO):] for n in names if n.startswith(INTO)))  # "each key head" once
    rest = [n for n in names if not n.startswith(INTO)]
    if into:
        rest.append(INTO + (into[0] if len(into) == 1 else ", ".join(into[:-1]) + " and " + into[-1]))
    return "; ".join(rest)


def parts_work(parts: Sequence[tuple[str, object]]):
    """The forward work of :func:`circuit_parts`' parts, summed (``engine.cost.Work``)."""
    from engine.cost import NO_WORK
    return sum((w for _, w in parts), NO_WORK)


def circuit_work(backend: ModelBackend, pairs: Sequence[PromptPair], *, k: int = 5, senders: bool = False,
                 cache=None):
    """The forward work of :func:`circuit_diagram` (``engine.cost.Work``): its parts not cached
    (:func:`circuit_parts`)."""
    return parts_work(circuit_parts(backend, pairs, k=k, senders=senders, cache=cache))


def circuit_diagram(backend: ModelBackend, pairs: Sequence[PromptPair], *, k: int = 5, mlps: int = 3,
                    senders: bool = False, cache=None, progress: ProgressFn | None = None) -> Diagram:
    """The diagram of ``pairs`` (module docstring); missing results are computed (and cached) with progress."""
    from engine.techniques.attention import cached_role_attention
    from engine.techniques.head_patching import Receiver, cached_head_path_patching
    from engine.techniques.path_patching import cached_path_patching
    f = backend.facts
    if not 1 <= k <= f.n_layers * f.n_heads:
        raise ValueError(f"k must be between 1 and the model's {f.n_layers * f.n_heads} heads, got {k}")
    if not 0 <= mlps <= f.n_layers:
        raise ValueError(f"mlps must be between 0 and the model's {f.n_layers} layers, got {mlps}")
    stages = Stages(progress, [3, 1] + ([k] if senders else []))
    table, _ = cached_path_patching(backend, pairs, cache=cache, progress=stages.stage(0))
    stages.finish(0)
    metric = table.ranking_metric()
    heads = table.top_heads(k, metric)
    _, mlp_values = table.heatmap(metric)
    top_mlps = sorted((v, layer) for layer, v in enumerate(mlp_values) if v == v)[:mlps]
    roles, _ = cached_role_attention(backend, pairs, cache=cache, progress=stages.stage(1))
    stages.finish(1)
    att = {(r.layer, r.head, r.role): r.value for r in roles}

    d = Diagram(f.spec, metric, len(pairs))
    d.nodes += [Node("A", "token", -1, label="operand A"), Node("B", "token", -1, label="operand B"),
                Node("op", "token", -1, label="operator")]
    for layer, head, value in heads:
        d.nodes.append(Node(head_id(layer, head), "head", layer, head, f"{layer}.{head}", float(value)))
        for tid, role in zip(("A", "B", "op"), TOKEN_ROLES):
            share = att.get((layer, head, role), 0.0)
            if share >= MIN_ATTENTION:
                d.edges.append(Edge(tid, head_id(layer, head), "attention", float(share)))
        d.edges.append(Edge(head_id(layer, head), "answer", "effect", float(value)))
    for value, layer in sorted(top_mlps, key=lambda t: t[1]):
        d.nodes.append(Node(f"m{layer}", "mlp", layer, label=f"MLP {layer}", effect=float(value)))
        d.edges.append(Edge(f"m{layer}", "answer", "effect", float(value)))
    d.nodes.append(Node("answer", "answer", f.n_layers, label="answer logit"))
    if senders:
        key = {(layer, head) for layer, head, _ in heads}
        found: list[Edge] = []
        for layer, head, _ in sorted(heads):
            if layer == 0 or not any(a < layer for a, _ in key):
                continue
            vals, _ = cached_head_path_patching(backend, pairs, Receiver(layer, head, "q"), cache=cache,
                                                progress=stages.stage(2))
            found += [Edge(head_id(v.layer, v.head), head_id(layer, head), "head-head", float(v.value))
                      for v in vals if v.component == "head" and v.metric == metric and v.group == "*"
                      and (v.layer, v.head) in key
                      and v.value == v.value]
        stages.finish(2)
        strongest = max((abs(e.weight) for e in found), default=0.0)
        d.edges += [e for e in found if strongest and abs(e.weight) >= MIN_SHARE * strongest]
    return d


#: the most edges an edge circuit's diagram draws: beyond it the picture is a tangle no one reads (the share of the
#: graph a circuit keeps is the Faithfulness page's business; the diagram shows its strongest edges)
MAX_DRAWN_EDGES = 60


def diagram_node(n, effect: float = 0.0) -> Node:
    """The diagram's node for a node of MIB's graph (:class:`engine.techniques.edges.Node`)."""
    if n.kind == "head":
        return Node(head_id(n.layer, n.head), "head", n.layer, n.head, f"{n.layer}.{n.head}", effect)
    if n.kind == "mlp":
        return Node(f"m{n.layer}", "mlp", n.layer, label=f"MLP {n.layer}", effect=effect)
    if n.kind == "input":
        return Node("input", "token", -1, label="input (embeddings)")
    return Node("answer", "answer", n.layer, label="answer logit")


def edge_diagram_work(backend: ModelBackend, pairs: Sequence[PromptPair], ranking: str, *, cache=None):
    """The forward work of :func:`edge_diagram`: the ranking's scores unless cached (``engine.cost.Work``)."""
    from engine.cost import unless_cached
    from engine.techniques.edge_scores import cached_edge_scores, ranking_work
    return unless_cached(lambda: cached_edge_scores(backend, pairs, ranking, cache=cache),
                         lambda: ranking_work(backend, pairs, ranking))


def edge_diagram(backend: ModelBackend, pairs: Sequence[PromptPair], ranking: str, *, top: int = 20, cache=None,
                 progress: ProgressFn | None = None) -> Diagram:
    """The top ``top`` edges of MIB's graph by |score| under ``ranking`` and the nodes they join (module docstring);
    the scores computed (and cached) with progress when missing."""
    from engine.techniques.edge_scores import cached_edge_scores
    from engine.techniques.edges import parse_edge
    if not 1 <= top <= MAX_DRAWN_EDGES:
        raise ValueError(f"the diagram draws 1 to {MAX_DRAWN_EDGES} edges, got {top}")
    L = backend.facts.n_layers
    rows, _, _ = cached_edge_scores(backend, pairs, ranking, cache=cache, progress=progress)
    score = {r.edge: r.value for r in rows}
    order = sorted(range(len(rows)), key=lambda i: -abs(rows[i].value))[:top]  # stable: ties in graph order
    d = Diagram(backend.facts.spec, f"{ranking} edge score", len(pairs))
    nodes: dict[str, Node] = {}
    for i in order:
        e = parse_edge(rows[i].edge, L)
        ends = [diagram_node(n, score.get(f"{n.name}->logits", 0.0) if n.kind in ("head", "mlp") else 0.0)
                for n in (e.sender, e.receiver)]
        for node in ends:
            nodes.setdefault(node.id, node)
        d.edges.append(Edge(ends[0].id, ends[1].id, "edge", float(rows[i].value), e.qkv or ""))
    d.nodes += sorted(nodes.values(), key=lambda n: (n.layer, n.kind != "head", n.head))
    return d


# ---------------------------------------------------------------------------------------------
# the command line (``python -m engine circuit``, registered in engine.registry)
# ---------------------------------------------------------------------------------------------

def cli(args, ctx) -> dict:
    """The circuit diagram as JSON (nodes, edges, effects); the Circuit page draws it and exports SVG / PNG."""
    import json
    pairs = ctx.pairs
    with ctx.progress("circuit") as bar:
        if args.edges:
            d = edge_diagram(ctx.model, pairs, args.edges, top=args.top, cache=ctx.cache, progress=bar)
        else:
            d = circuit_diagram(ctx.model, pairs, k=args.k, mlps=args.mlps, senders=args.senders, cache=ctx.cache,
                                progress=bar)
    labels = ctx.cache.labels(ctx.model.facts.fingerprint) if ctx.cache is not None else {}
    d = d.noted(labels)  # each pinned node's note beside its label
    args.out.write_text(json.dumps(d.to_json(), indent=1))
    return {"out": str(args.out), "n_pairs": len(pairs), "metric": d.metric, "nodes": len(d.nodes),
            "edges": len(d.edges), "heads": [n.label for n in d.nodes if n.kind == "head"],
            "mlps": [n.label for n in d.nodes if n.kind == "mlp"]}
