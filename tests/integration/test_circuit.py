"""The circuit diagram (engine.techniques.circuit) on the bundled model: it names the heatmap's top heads and MLPs
with the heatmap's numbers, its token edges are the heads' attention shares, its JSON round-trips, it draws as SVG
and PNG; the CLI writes it."""

from __future__ import annotations

import json

import pytest

from engine.backends import open_model
from engine.prompts.promptsets import PromptSetSpec
from engine.techniques.accuracy import kept_pairs
from engine.techniques.attention import role_attention
from engine.techniques.circuit import Diagram, circuit_diagram, head_id
from engine.techniques.path_patching import cached_path_patching
from tests.helpers.cli import run_cli
from views.circuit_diagram import diagram_image


@pytest.fixture(scope="module")
def setup():
    m = open_model("organism", device="cpu")
    pairs, _ = kept_pairs(m, PromptSetSpec(ops=("add", "sub", "mul", "div"), n=12, seed=0))
    return m, pairs


def test_diagram_matches_the_heatmap_and_attention(setup):
    m, pairs = setup
    d = circuit_diagram(m, pairs, k=4, mlps=2)
    table, _ = cached_path_patching(m, pairs)
    metric = table.ranking_metric()
    heads, mlps = table.heatmap(metric)
    top = table.top_heads(4, metric)
    assert [n.label for n in d.nodes if n.kind == "head"] == [f"{a}.{b}" for a, b, _ in top]
    for layer, head, _ in top:
        assert d.node(head_id(layer, head)).effect == pytest.approx(heads[layer][head])
    want_mlps = sorted(range(len(mlps)), key=lambda i: mlps[i])[:2]
    assert sorted(n.layer for n in d.nodes if n.kind == "mlp") == sorted(want_mlps)
    att = {(r.layer, r.head, r.role): r.value for r in role_attention(m, pairs)}
    for e in d.edges:
        if e.kind == "attention":
            h = d.node(e.target)
            role = {"A": "operand A", "B": "operand B", "op": "operator"}[e.source]
            assert e.weight == pytest.approx(att[(h.layer, h.head, role)], abs=1e-6) and e.weight >= 0.1
        if e.kind == "effect":
            assert e.target == "answer" and e.weight == pytest.approx(d.node(e.source).effect)
    assert Diagram.from_json(json.loads(json.dumps(d.to_json()))) == d
    assert diagram_image(d, "svg").startswith(b"<svg") and diagram_image(d, "png")[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="between 1 and"):
        circuit_diagram(m, pairs, k=0)


def test_cli_writes_the_json(tmp_path):
    out = tmp_path / "c.json"
    r = run_cli("circuit", "--model", "organism", "--op", "add,mul", "--n", "8", "--k", "3", "--mlps", "1",
                "--out", str(out), cache=tmp_path / "c.duckdb")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    d = Diagram.from_json(json.loads(out.read_text()))
    assert len(res["heads"]) == 3 and len(res["mlps"]) == 1 and len(d.nodes) == 3 + 3 + 1 + 1


def test_edge_diagram_draws_a_rankings_top_edges_and_the_nodes_they_join():
    """The top edges of MIB's graph by |EAP score| with the nodes they join: each edge's weight and receiver input
    are its row's, a head's or MLP's effect is its own edge to the logits, the input and the logits are the token
    and answer nodes; the JSON round-trips (and a diagram written before ``via`` existed still loads)."""
    from engine.techniques.circuit import MAX_DRAWN_EDGES, edge_diagram
    from engine.techniques.edge_scores import cached_edge_scores
    from engine.techniques.edges import parse_edge
    m = open_model("organism", device="cpu")
    pairs, _ = kept_pairs(m, PromptSetSpec(ops=("add", "sub"), n=2, seed=0))
    rows, _, _ = cached_edge_scores(m, pairs, "eap")
    score = {r.edge: r.value for r in rows}
    d = edge_diagram(m, pairs, "eap", top=30)
    top = sorted(rows, key=lambda r: -abs(r.value))[:30]
    ids = {"input": "input", "logits": "answer"}
    for e, r in zip(d.edges, top):
        want = parse_edge(r.edge, m.facts.n_layers)
        name = {n.name: ids.get(n.name, head_id(n.layer, n.head) if n.kind == "head" else f"m{n.layer}")
                for n in (want.sender, want.receiver)}
        assert (e.source, e.target, e.via, e.kind) == (name[want.sender.name], name[want.receiver.name],
                                                       want.qkv or "", "edge")
        assert e.weight == r.value
    assert {n.id for n in d.nodes} == {e.source for e in d.edges} | {e.target for e in d.edges}
    for n in d.nodes:
        if n.kind == "head":
            assert n.effect == score[f"a{n.layer}.h{n.head}->logits"]
        elif n.kind == "mlp":
            assert n.effect == score[f"m{n.layer}->logits"]
    assert any(e.via in ("q", "k", "v") for e in d.edges)
    assert Diagram.from_json(json.loads(json.dumps(d.to_json()))) == d
    old = d.to_json()
    for e in old["edges"]:
        del e["via"]
    assert [e.via for e in Diagram.from_json(old).edges] == [""] * len(d.edges)
    assert diagram_image(d, "svg").startswith(b"<svg")
    for bad in (0, MAX_DRAWN_EDGES + 1):
        with pytest.raises(ValueError, match=f"1 to {MAX_DRAWN_EDGES} edges"):
            edge_diagram(m, pairs, "eap", top=bad)


def test_cli_draws_the_top_edges_or_says_why_not(tmp_path):
    out = tmp_path / "e.json"
    r = run_cli("circuit", "--model", "organism", "--op", "add,sub", "--n", "2", "--edges", "eap", "--top", "6",
                "--out", str(out), cache=tmp_path / "c.duckdb")
    assert r.returncode == 0, r.stderr
    d = Diagram.from_json(json.loads(out.read_text()))
    assert json.loads(r.stdout)["edges"] == len(d.edges) == 6 and all(e.kind == "edge" for e in d.edges)
    r = run_cli("circuit", "--model", "organism", "--op", "add,sub", "--n", "2", "--edges", "eap", "--top", "61",
                "--out", str(out), cache=tmp_path / "c.duckdb")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "1 to 60 edges" in r.stderr


def test_what_the_diagram_still_needs_names_only_the_parts_not_cached(setup, tmp_path):
    """The Circuit page's box beside its button named path patching and the attention when both were cached
    (SmolLM2, head -> head on): it lists what is left, and the estimate counts the same parts."""
    from cache import ResultCache
    from engine.cost import NO_WORK
    from engine.techniques.attention import cached_role_attention
    from engine.techniques.circuit import circuit_parts, circuit_work
    from engine.techniques.head_patching import Receiver, cached_head_path_patching
    m, pairs = setup
    cache = ResultCache(tmp_path / "c.duckdb")
    cold = circuit_parts(m, pairs, k=2, senders=True, cache=cache)
    assert [name for name, _ in cold] == ["the attention by token role", "path patching",
                                          "head → head path patching into each key head",
                                          "head → head path patching into each key head"]
    assert circuit_work(m, pairs, k=2, senders=True, cache=cache) == sum((w for _, w in cold), NO_WORK)
    table, _ = cached_path_patching(m, pairs, cache=cache)
    cached_role_attention(m, pairs, cache=cache)
    (l1, h1, _), (l2, h2, _) = table.top_heads(2)
    assert [name for name, _ in circuit_parts(m, pairs, k=2, senders=False, cache=cache)] == []
    assert circuit_work(m, pairs, k=2, senders=False, cache=cache) == NO_WORK
    cached_head_path_patching(m, pairs, Receiver(l1, h1, "q"), cache=cache)
    left = circuit_parts(m, pairs, k=2, senders=True, cache=cache)
    assert [name for name, _ in left] == ([f"head → head path patching into {l2}.{h2}"] if l2 > 0 else [])
    from engine.techniques.circuit import parts_text
    assert parts_text(cold) == ("the attention by token role; path patching; "
                                "head → head path patching into each key head")
    assert parts_text([("path patching", 0), ("head → head path patching into 1.3", 0),
                       ("head → head path patching into 1.1", 0), ("head → head path patching into 5.5", 0)]) == \
        "path patching; head → head path patching into 1.3, 1.1 and 5.5"
