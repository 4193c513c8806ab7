"""Edge faithfulness (MIB's edge ablation) against a plain-transformers loop, every ablated edge added by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.backends import open_model
from engine.backends.base import WorkMeter
from engine.cost import metered
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.eap import eap
from engine.techniques.edge_faithfulness import (
    RANDOM,
    edge_circuits,
    edge_circuits_work,
    edge_faithfulness,
    edge_faithfulness_work,
    random_circuit,
    random_runs,
    top_edges,
    top_edges_of_sizes,
)
from engine.techniques.edges import edge_graph
from engine.techniques.faithfulness import kept_count
from engine.techniques.knockout import forget_means, mean_activations
from tests.helpers.plain_edges import edge_circuit
from tests.integration.test_edges import plain_of
from tests.integration.tiny_models import build_tiny


def circuits(backend, pairs) -> tuple[list, np.ndarray]:
    """The edges and four circuits: none kept, all kept, a random half, the top 5 % by EAP."""
    edges = edge_graph(backend)
    E = len(edges)
    half = np.random.default_rng(0).random(E) < 0.5
    top = top_edges(eap(backend, pairs, edges, steps=0).effects().numpy(), kept_count(0.05, E))
    return edges, np.stack([np.zeros(E, bool), np.ones(E, bool), half, top])


def worst_against_plain(backend, path, pairs, edges, kept, out, mean_over=None) -> float:
    plain = plain_of(backend, path)
    names = [e.name for e in edges]
    worst = 0.0
    for i, row in enumerate(kept):
        logit, margin = edge_circuit(plain, pairs, names, {n for n, k in zip(names, row) if k}, mean_over=mean_over)
        worst = max(worst, float((logit - out.logit[i]).abs().max()), float((margin - out.margin[i]).abs().max()))
    return worst


def test_edge_circuits_equal_plain_loop_on_bundled_model(organism):
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub"), n=2, seed=3))
    edges, kept = circuits(organism, pairs)
    out = edge_circuits(organism, pairs, kept, rows_per_pass=64)
    # the empty circuit is the X_c run, the full one X_r (no norm after the bundled model's attention)
    assert float((out.logit[0] - out.logit_c).abs().max()) < 1e-4
    assert float((out.logit[1] - out.logit_o).abs().max()) < 1e-4
    # the half and the top 5 % are neither
    for i in (2, 3):
        assert float((out.logit[i] - out.logit_o).abs().max()) > 1e-2
        assert float((out.logit[i] - out.logit_c).abs().max()) > 1e-2
    worst = worst_against_plain(organism, "models/organism", pairs, edges, kept, out)
    assert worst < 1e-4, f"edge circuits vs the plain loop: {worst:.2e}"


def test_mean_ablated_edge_circuits_equal_plain_loop_on_bundled_model(organism):
    """Mean ablation: an ablated edge sends its sender's mean over the whole set's X_c (the pair's template,
    END-aligned) -- a subset of the pairs run, as the random ranking's draws are, with the whole set's means."""
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub"), n=6, seed=3))
    some = [p for p in pairs if sum(q.template == p.template for q in pairs) > 1][::2]  # their means are not theirs
    edges, kept = circuits(organism, some)
    out = edge_circuits(organism, some, kept, rows_per_pass=64, means=mean_activations(organism, pairs))
    assert float((out.logit[1] - out.logit_o).abs().max()) < 1e-4  # the full circuit is X_r whatever the values
    cf = edge_circuits(organism, some, kept[:1], rows_per_pass=64)
    assert float((out.logit[0] - cf.logit[0]).abs().max()) > 1e-2  # the means are not X_c's values
    worst = worst_against_plain(organism, "models/organism", some, edges, kept, out, mean_over=pairs)
    assert worst < 1e-4, f"mean-ablated edge circuits vs the plain loop: {worst:.2e}"


def test_edge_circuit_equals_plain_loop_with_sandwich_norms(tmp_path):
    """Gemma 3: a norm after the attention (a head's difference taken with the layer's other heads as they are)."""
    path = build_tiny("gemma3_text", tmp_path / "gemma3_text")
    backend = open_model(str(path), device="cpu")
    pairs, _ = generate(backend.tokenizer, PromptSetSpec(ops=("add", "mul"), n=2, seed=1))
    edges = edge_graph(backend)
    kept = (np.random.default_rng(1).random(len(edges)) < 0.5)[None]
    out = edge_circuits(backend, pairs, kept, rows_per_pass=64)
    assert float((out.logit[0] - out.logit_o).abs().max()) > 1e-3
    worst = worst_against_plain(backend, path, pairs, edges, kept, out)
    assert worst < 1e-4, f"gemma3_text: edge circuit vs the plain loop: {worst:.2e}"


def test_parallel_block_empty_circuit_is_counterfactual(tmp_path):
    """GPT-NeoX (the MLP reads the block input: its correction goes through the block model's MLP branch): the
    empty circuit is the X_c run, the full one X_r (no plain loop for parallel blocks yet)."""
    backend = open_model(str(build_tiny("gpt_neox", tmp_path / "gpt_neox")), device="cpu")
    assert backend.parallel_attn_mlp
    pairs, _ = generate(backend.tokenizer, PromptSetSpec(ops=("add",), n=3, seed=1))
    E = len(edge_graph(backend))
    out = edge_circuits(backend, pairs, np.stack([np.zeros(E, bool), np.ones(E, bool)]))
    assert float((out.logit_o - out.logit_c).abs().max()) > 1e-2
    assert float((out.logit[0] - out.logit_c).abs().max()) < 1e-4
    assert float((out.logit[1] - out.logit_o).abs().max()) < 1e-4


def test_each_layer_runs_its_block_alone_and_falls_back_to_whole_passes_when_that_misses(organism, monkeypatch):
    """The passes run block l alone on each circuit's stream (checked: the blocks chained alone on X_r's stream give
    X_r's); a backend whose block run alone misses the model falls back to passes from the input, says so, and
    gives the same numbers (the plain loop, 1e-4) -- with more work (each pass l + 1 blocks long)."""
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub"), n=2, seed=3))
    edges, kept = circuits(organism, pairs)
    organism.meter = WorkMeter()
    fast = edge_circuits(organism, pairs, kept[2:], rows_per_pass=64)
    fast_work = metered(organism.meter)
    assert fast.note is None and organism.runs_one_block
    real = type(organism).block_activations

    def off(self, calls, layer, resid_pre, names, **kw):  # a block model that is wrong from layer 3 on
        got = real(self, calls, layer, resid_pre, names, **kw)
        return {n: v * 1.01 for n, v in got.items()} if layer >= 3 else got
    monkeypatch.setattr(type(organism), "block_activations", off)
    organism.meter = WorkMeter()
    slow = edge_circuits(organism, pairs, kept[2:], rows_per_pass=64)
    slow_work = metered(organism.meter)
    assert slow.note is not None and "block 3 run alone misses the model's stream" in slow.note
    assert float((slow.logit - fast.logit).abs().max()) < 1e-4
    assert worst_against_plain(organism, "models/organism", pairs, edges, kept[2:], slow) < 1e-4
    assert slow_work.fe(organism, pairs) > 1.5 * fast_work.fe(organism, pairs)


@pytest.mark.parametrize("arch", ["organism", "gemma3_text"])
def test_edge_circuits_work(arch, organism, tmp_path):
    backend = organism if arch == "organism" else open_model(str(build_tiny(arch, tmp_path / arch)), device="cpu")
    pairs, _ = generate(backend.tokenizer, PromptSetSpec(ops=("add",), n=3, seed=2))
    E = len(edge_graph(backend))
    rng = np.random.default_rng(2)
    kept = np.stack([np.zeros(E, bool), rng.random(E) < 0.9, rng.random(E) < 0.1])
    w = edge_circuits_work(backend, pairs, kept, rows_per_pass=16)
    backend.meter = WorkMeter()
    edge_circuits(backend, pairs, kept, rows_per_pass=16)
    got = metered(backend.meter)
    assert (got.calls, got.body, got.unembed, got.layers, got.attention) == \
        (w.calls, w.body, w.unembed, w.layers, w.attention)
    assert got.attention > 0  # (B) to (D) stop in the attention


def test_top_edges():
    keep = top_edges(np.array([0.1, -3.0, 2.0, 0.0]), 2)
    assert keep.tolist() == [False, True, True, False]
    assert not top_edges(np.ones(3), 0).any() and torch.tensor(top_edges(np.ones(3), 3)).all()
    # every size from one sort: the circuits a sort per size gives, ties (|-1| = |1|, the zeros) in graph order
    s = np.random.default_rng(0).integers(-3, 4, 200).astype(float)
    ks = [0, 1, 7, 50, 51, 199, 200]
    assert np.array_equal(top_edges_of_sizes(s, ks), np.stack([
        np.isin(np.arange(200), sorted(range(200), key=lambda i: (-abs(s[i]), i))[:k]) for k in ks]))


def test_random_ranking_reads_each_pair_under_its_draw_as_the_plain_loop(organism):
    """The random edge ranking: pair i is read under draw i mod 5's circuit of each size -- each pair's margin equals
    the plain loop run on that pair with that circuit's edges kept (1e-4); the draws differ; the rankings' rows and
    the counted work (the meter) include the draws' runs."""
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub"), n=3, seed=5))
    assert len(pairs) == 6  # pairs 0 and 5 share draw 0
    edges = edge_graph(organism)
    names, E = [e.name for e in edges], len(edges)
    sizes = (0.0, 0.05, 0.5, 1.0)
    scores = {"eap": eap(organism, pairs, edges, steps=0).effects().numpy()}
    organism.meter = WorkMeter()
    circuits, right, margin = edge_faithfulness(organism, pairs, scores, sizes=sizes, rows_per_pass=64)
    got = metered(organism.meter)
    w = edge_faithfulness_work(organism, pairs, scores, sizes=sizes, rows_per_pass=64)
    assert (got.calls, got.body, got.unembed) == (w.calls, w.body, w.unembed)
    rows = {(c.ranking, c.size): i for i, c in enumerate(circuits)}
    assert [c.k for c in circuits if c.ranking == RANDOM] == [0, int(0.05 * E), E // 2, E]
    assert not (random_circuit(E, 0.05, 0) == random_circuit(E, 0.05, 1)).all()
    assert (random_circuit(E, 0.05, 0) == random_circuit(E, 0.05, 5)).all()
    plain = plain_of(organism, "models/organism")
    worst = 0.0
    for d in range(5):  # each draw's pairs by hand, with the draw's circuit of 5 % of the edges
        group = [j for j in range(len(pairs)) if j % 5 == d]
        kept = random_circuit(E, 0.05, group[0])
        assert kept.sum() == int(np.floor(0.05 * E + 1e-9))
        _, m = edge_circuit(plain, [pairs[j] for j in group], names, {n for n, k in zip(names, kept) if k})
        worst = max(worst, float(np.abs(m.numpy() - margin[rows[(RANDOM, 0.05)], group]).max()))
    assert worst < 1e-4, f"random edge circuits vs the plain loop: {worst:.2e}"
    # the random ranking's empty and full circuits are the shared ones
    for x, other in ((0.0, "empty"), (1.0, "model")):
        assert np.abs(margin[rows[(RANDOM, x)]] - margin[rows[(other, x)]]).max() < 1e-4


def test_mean_ablation_in_edge_faithfulness_counts_its_means_pass(organism):
    """``ablation="mean"``: the counted work (the meter) includes the means' pass over X_c; the full circuit is the
    model either way, the empty one is not X_c's; an unknown ablation is refused."""
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub"), n=3, seed=5))
    scores = {"eap": eap(organism, pairs, edge_graph(organism), steps=0).effects().numpy()}
    sizes = (0.0, 0.5, 1.0)
    forget_means()  # the means' pass is memoised: counted (and run) only the first time
    w = edge_faithfulness_work(organism, pairs, scores, sizes=sizes, rows_per_pass=64, ablation="mean")
    organism.meter = WorkMeter()
    circuits, _, margin = edge_faithfulness(organism, pairs, scores, sizes=sizes, rows_per_pass=64, ablation="mean")
    got = metered(organism.meter)
    assert (got.calls, got.body, got.unembed) == (w.calls, w.body, w.unembed)
    assert w.calls > edge_faithfulness_work(organism, pairs, scores, sizes=sizes, rows_per_pass=64).calls
    _, _, cf_margin = edge_faithfulness(organism, pairs, scores, sizes=sizes, rows_per_pass=64)
    rows = {(c.ranking, c.size): i for i, c in enumerate(circuits)}
    assert np.abs(margin[rows[("model", 1.0)]] - cf_margin[rows[("model", 1.0)]]).max() < 1e-4
    assert np.abs(margin[rows[("empty", 0.0)]] - cf_margin[rows[("empty", 0.0)]]).max() > 1e-2
    with pytest.raises(ValueError, match="unknown ablation"):
        edge_faithfulness(organism, pairs, scores, sizes=sizes, ablation="zero")


def test_random_runs_read_each_pair_under_its_own_draw():
    """Fewer pairs than draws, and more: each run's pairs are those of one draw, its circuits that draw's."""
    runs = random_runs(100, 3, 5, 0, (0.1, 0.5))
    assert [g.tolist() for g, _ in runs] == [[0], [1], [2]]
    runs = random_runs(100, 7, 5, 0, (0.1, 0.5))
    assert [g.tolist() for g, _ in runs] == [[0, 5], [1, 6], [2], [3], [4]]
    for g, kept in runs:
        for j in g:
            assert (kept[0] == random_circuit(100, 0.1, int(j), 5, 0)).all()
            assert (kept[1] == random_circuit(100, 0.5, int(j), 5, 0)).all()
        assert kept.sum(1).tolist() == [10, 50]
    assert not (runs[0][1] == runs[1][1]).all()
