"""Faithfulness curves' arithmetic (areas, circuit sizes, the knockout of a circuit) and the MIB export's format,
each against a plain reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.techniques import faithfulness as F


def test_areas_are_mibs_trapezoids():
    sizes = F.SIZES
    one = np.ones(len(sizes))
    cpr, cmd = F.areas(one, sizes)
    assert cpr == pytest.approx(1.0) and cmd == pytest.approx(0.0)
    f = np.array([0, 0, 0, 0, 0, 0, 0, 0, 0.2, 0.5, 1.0])
    # MIB's print_results.area_under_curve, written out: x normalised by the last size, trapezoid per interval
    want = sum((sizes[i + 1] - sizes[i]) / sizes[-1] * (f[i] + f[i + 1]) / 2 for i in range(len(sizes) - 1))
    want_cmd = sum((sizes[i + 1] - sizes[i]) / sizes[-1] * (abs(1 - f[i]) + abs(1 - f[i + 1])) / 2
                   for i in range(len(sizes) - 1))
    got = F.areas(f, sizes)
    assert got[0] == pytest.approx(want) and got[1] == pytest.approx(want_cmd)
    over = np.where(np.arange(len(sizes)) == 9, 1.5, f)  # a curve above 1 counts |1 - f| in CMD
    assert F.areas(over, sizes)[1] > F.areas(np.minimum(over, 1.0), sizes)[1] - 1e-12


def test_kept_counts_never_exceed_the_share():
    for n in (72, 300, 1000, 7):
        for x in F.SIZES:
            k = F.kept_count(x, n)
            assert k <= x * n + 1e-9 and (k + 1) > x * n - 1e-9
    assert F.kept_count(0.5, 72) == 36 and F.kept_count(1.0, 72) == 72 and F.kept_count(0.001, 72) == 0


def test_circuit_knockout_ablates_exactly_the_components_outside():
    L, H = 3, 4
    scores = np.array([0.1 * i for i in range(L * H + L)])
    order = F.order_of(scores)
    ko = F.circuit_knockout(order, 5, L, H)
    names = F.component_names(L, H)
    kept = {names[i] for i in order[:5]}
    ablated = {f"a{a}.h{b}" for a, b in ko.heads} | {f"m{m}" for m in ko.mlps}
    assert kept | ablated == set(names) and not kept & ablated
    assert kept == {"m2", "m1", "m0", "a2.h3", "a2.h2"}  # the largest scores: MLPs come last in the order


def test_curves_average_random_draws_and_normalise_by_model_and_empty():
    sizes = (0.0, 0.5, 1.0)
    circuits, _ = F.plan({"exact": [np.arange(6)], "random": [np.arange(6), np.arange(6)[::-1]]}, 2, 2, sizes)
    # model 10, empty 2; exact at 0.5: 6; random draws at 0.5: 4 and 8 -> f = 0.5 and (0.25 + 0.75) / 2
    at = {(c.ranking, c.draw, c.size): i for i, c in enumerate(circuits)}
    v = np.zeros((len(circuits), 3))
    v[0], v[1] = 10.0, 2.0
    for key, val in {("exact", 0, 0.0): 2, ("exact", 0, 0.5): 6, ("exact", 0, 1.0): 10, ("random", 0, 0.0): 2,
                     ("random", 0, 0.5): 4, ("random", 0, 1.0): 10, ("random", 1, 0.0): 2, ("random", 1, 0.5): 8,
                     ("random", 1, 1.0): 10}.items():
        v[at[key]] = val
    f = F.curves(v, circuits, sizes, np.arange(3)[None])
    assert f["exact"][0].tolist() == pytest.approx([0.0, 0.5, 1.0])
    assert f["random"][0].tolist() == pytest.approx([0.0, 0.5, 1.0])


def _eap_ig_edges(n_layers: int, n_heads: int, parallel: bool) -> set[str]:
    """The edges EAP-IG's Graph.from_model makes (EAP-IG/src/eap/graph.py, MIB's circuit-track repository), by
    its index arithmetic: a forward node i feeds a backward node when i < prev_index(child)."""
    fwd = ["input"] + [n for layer in range(n_layers) for n in
                       [f"a{layer}.h{h}" for h in range(n_heads)] + [f"m{layer}"]]

    def prev_index(kind: str, layer: int) -> int:
        if kind == "logits":
            return len(fwd)
        base = 1 + layer * (n_heads + 1)
        return base if kind == "a" or parallel else base + n_heads
    out = set()
    for layer in range(n_layers):
        for h in range(n_heads):
            out |= {f"{p}->a{layer}.h{h}<{q}>" for p in fwd[:prev_index("a", layer)] for q in "qkv"}
        out |= {f"{p}->m{layer}" for p in fwd[:prev_index("m", layer)]}
    return out | {f"{p}->logits" for p in fwd}


def _validate_like_from_json(d: dict) -> None:
    """What EAP-IG's Graph.from_json requires of a submission (its asserts and lookups)."""
    assert all(k in d for k in ("cfg", "nodes", "edges")), "Bad input JSON format - Missing keys"
    cfg = d["cfg"]
    assert {"n_layers", "n_heads", "parallel_attn_mlp", "d_model"} <= set(cfg)
    L, H = cfg["n_layers"], cfg["n_heads"]
    nodes = {"input", "logits"} | {f"a{a}.h{h}" for a in range(L) for h in range(H)} | {f"m{a}" for a in range(L)}
    assert set(d["nodes"]) == nodes
    for name, nd in d["nodes"].items():
        assert isinstance(nd["in_graph"], bool)
        if name != "logits" and "score" in nd:
            assert isinstance(nd["score"], float) and math.isfinite(nd["score"])
    assert set(d["edges"]) == _eap_ig_edges(L, H, cfg["parallel_attn_mlp"])
    for e in d["edges"].values():
        assert isinstance(e["score"], float) and math.isfinite(e["score"]) and isinstance(e["in_graph"], bool)


@pytest.mark.parametrize("parallel", [False, True])
def test_mib_graph_has_eap_igs_nodes_and_edges(parallel):
    L, H = 3, 2
    scores = [float(i % 5) for i in range(L * H + L)]
    g = F.mib_graph(scores, L, H, 16, parallel_attn_mlp=parallel, size=0.5)
    _validate_like_from_json(g)
    n_in = sum(g["nodes"][n]["in_graph"] for n in F.component_names(L, H))
    assert n_in == F.kept_count(0.5, L * H + L)
    for name, e in g["edges"].items():  # an edge is in when both its nodes are
        parent, child = name.split("->")
        child = child.split("<")[0]
        assert e["in_graph"] == (g["nodes"][parent]["in_graph"] and g["nodes"][child]["in_graph"])
    every = F.mib_graph(scores, L, H, 16, parallel_attn_mlp=parallel)
    assert all(nd["in_graph"] for nd in every["nodes"].values())


def test_mib_folder_names_split_at_one_underscore():
    assert F.mib_folder("arithmetic-addition", "models/organism") == "arithmetic-addition_organism"
    name = F.mib_folder("arithmetic-subtraction", "/x/SmolLM2_135M Instruct.Q4_1.gguf")
    assert name.count("_") == 1 and name.startswith("arithmetic-subtraction_")
