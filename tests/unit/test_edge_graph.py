"""MIB's residual graph and its JSON, without a model (the graph from the block model's facts, the export's rules)."""

from __future__ import annotations

import math

import pytest

from engine.techniques.edge_scores import mib_edge_graph, parse_sizes
from engine.techniques.edges import Edge, Node, edge_graph, parse_edge
from engine.techniques.faithfulness import mib_edges


def test_graph_is_mibs():
    class Facts:
        n_layers, n_heads = 2, 2

    class B:
        facts, parallel_attn_mlp = Facts, False
    edges = edge_graph(B)
    names = [e.name for e in edges]
    # MIB: heads read earlier layers through q, k, v; a sequential MLP reads its own layer's heads; logits all
    assert "input->a0.h0<q>" in names and "a0.h1->a1.h0<v>" in names and "a0.h0->m0" in names
    assert "m1->logits" in names and "a1.h0->a1.h1<q>" not in names and "m0->a0.h0<k>" not in names
    assert len(edges) == len(set(names)) == 2 * 3 * 1 + 2 * 3 * 4 + 3 + 6 + 7  # heads l0, l1; m0, m1; logits
    B.parallel_attn_mlp = True
    assert "a0.h0->m0" not in [e.name for e in edge_graph(B)]
    assert parse_edge("a0.h1->a3.h2<q>", 8) == Edge(Node("head", 0, 1), Node("head", 3, 2), "q")
    with pytest.raises(ValueError):
        parse_edge("a0.h1->a3.h2<x>", 8)


def test_mib_graph_holds_the_scores_and_the_top_edges():
    names = [f"{p}->{c}" + (f"<{q}>" if q else "") for p, c, q in mib_edges(2, 2)]
    scores = {n: (-1) ** i * i / 10 for i, n in enumerate(names)}
    g = mib_edge_graph(scores, 2, 2, 16, size=0.1, node_scores=[0.5] * 6)
    assert g["cfg"] == {"n_layers": 2, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 16}
    assert {n: e["score"] for n, e in g["edges"].items()} == scores
    kept = [n for n, e in g["edges"].items() if e["in_graph"]]
    assert kept == names[-math.floor(0.1 * len(names)):]  # the largest |score|: the last ones
    assert g["nodes"]["a0.h0"]["score"] == 0.5 and g["nodes"]["logits"]["in_graph"]
    touched = {x.split("<")[0] for n in kept for x in n.split("->")}
    assert {n for n, v in g["nodes"].items() if v["in_graph"]} == touched | {"input", "logits"}
    assert all(e["in_graph"] for e in mib_edge_graph(scores, 2, 2, 16)["edges"].values())
    assert parse_sizes("0.01,0.05") == [None, 0.01, 0.05]
    with pytest.raises(ValueError):
        parse_sizes("2")


def test_the_graph_is_built_once_per_shape_and_its_plan_equals_the_per_edge_loop():
    """The graph is a pure function of the model's shape (one object per shape); the plan's per-receiver ablated
    senders, read from its grouped arrays, equal a plain loop over the edges (sorted names per receiver key)."""
    import numpy as np

    from engine.techniques.edge_faithfulness import plan_of
    from engine.techniques.edges import graph_of, receiver_key

    class Facts:
        n_layers, n_heads = 3, 2

    class B:
        facts, parallel_attn_mlp = Facts, False
    edges = edge_graph(B)
    assert edges is edge_graph(B) is graph_of(3, 2, False) and edges is not graph_of(3, 2, True)
    assert list(edges.names) == [e.name for e in edges]
    kept = np.random.default_rng(0).random((4, len(edges))) < [[0.0], [0.3], [0.9], [1.0]]  # [C, E]
    plan = plan_of(list(edges), kept)  # a plain list: grouped on the fly
    for c, row in enumerate(kept):
        want: dict[tuple, list[str]] = {}
        for e, k in zip(edges, row):
            if not k:
                want.setdefault(receiver_key(e), []).append(e.sender.name)
        assert plan.ablated[c] == {k: (tuple(sorted(v)),) for k, v in want.items()}  # one role: every position
        assert plan.senders[c] == {n for v in want.values() for n in v}
        for sender in ("input", "a0.h1", "m1", "a2.h0"):
            assert plan.needs_difference(c, sender) == any(sender in v for v in want.values())
    assert plan.ablated[3] == {} and not plan.senders[3]  # the model: nothing ablated
    # each distinct tuple of senders numbered once: a receiver's number reads back its senders; 0 is nothing ablated
    assert plan.keys[0] == ((),) and len(set(plan.keys)) == len(plan.keys)
    for c in range(4):
        for receiver, senders in plan.ablated[c].items():
            assert plan.keys[plan.key(c, receiver)] == senders and plan.key(c, receiver) > 0
    assert plan.key(3, ("logits",)) == 0 and plan.layer_keys(3, 1, 2) == {(h, x): 0 for h in range(2) for x in "qkv"}
    # per token role: a receiver's key holds each role's ablated senders; a sender kept at some role but ablated at
    # another still needs its difference
    by_role = np.random.default_rng(1).random((2, len(edges), 5)) < 0.5  # [C, E, R]
    plan = plan_of(list(edges), by_role)
    for c in range(2):
        for r in range(5):
            want = {}
            for e, k in zip(edges, by_role[c, :, r]):
                if not k:
                    want.setdefault(receiver_key(e), []).append(e.sender.name)
            for key, senders in want.items():
                assert plan.ablated[c][key][r] == tuple(sorted(senders))
        assert plan.senders[c] == {e.sender.name for e, k in zip(edges, by_role[c]) if not k.all()}
