"""Circuits at token positions (edges or nodes kept per token role) against a plain-transformers loop and against
the node knockouts; the units, their scores and their expansion to edges."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.backends.base import WorkMeter
from engine.cost import metered
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.attention import CIRCUIT_ROLES, circuit_roles
from engine.techniques.circuit_units import check_ranking, units_of
from engine.techniques.eap import eap
from engine.techniques.edge_faithfulness import edge_circuits, edge_faithfulness, edge_faithfulness_work, top_edges
from engine.techniques.edges import edge_graph
from engine.techniques.faithfulness import component_names, kept_count
from engine.techniques.knockout import Knockout, forget_means, knockout_end, mean_activations
from tests.helpers.plain_edges import edge_circuit
from tests.integration.test_edges import plain_of

R = len(CIRCUIT_ROLES)


@pytest.fixture(scope="module")
def bundled(organism):
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub"), n=2, seed=3))
    return organism, pairs, edge_graph(organism)


def test_circuit_roles_label_the_prompts_positions(organism):
    """The roles on the bundled model's tokens: digits of A and B, the operator's tokens (where X_c differs), END
    the last position whatever it holds, the BOS token "other"."""
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add",), n=6, seed=3))
    for p in pairs:
        toks = organism.tokenizer.convert_ids_to_tokens(p.ref_ids)
        roles = [CIRCUIT_ROLES[i] for i in circuit_roles(organism, [p], len(toks))[0]]
        assert roles[-1] == "END" and roles[0] == "other"
        assert [t for t, r in zip(toks, roles) if r == "operand A"] == [str(p.a)]
        assert [t for t, r in zip(toks, roles) if r == "operand B"] == [str(p.b)]
        assert [i for i, r in enumerate(roles) if r == "operator"] == \
            [i for i, (x, y) in enumerate(zip(p.ref_ids, p.cf_ids)) if x != y]


def test_edge_position_circuits_equal_plain_loop_on_bundled_model(bundled):
    """Each edge kept or ablated at each token role: equal to the plain loop ablating it by hand at exactly those
    positions (1e-4), counterfactual and mean ablation; keeping an edge at every role is the edge circuit."""
    backend, pairs, edges = bundled
    E = len(edges)
    units = units_of(backend, "edge-position")
    rng = np.random.default_rng(4)
    by_role = eap(backend, pairs, edges, by_role=True).effects().numpy()  # [E, R]
    kept = np.stack([rng.random(E * R) < 0.5, top_edges(units.scores(by_role), kept_count(0.05, E * R))])
    out = edge_circuits(backend, pairs, units.edges_kept(kept), rows_per_pass=64)
    names = [e.name for e in edges]
    plain = plain_of(backend, "models/organism")
    at = circuit_roles(backend, pairs, max(len(p.ref_ids) for p in pairs))
    worst = 0.0
    for i, row in enumerate(kept):
        logit, margin = edge_circuit(plain, pairs, names, {u for u, k in zip(units.names, row) if k},
                                     roles=CIRCUIT_ROLES, role_at=at)
        worst = max(worst, float((logit - out.logit[i]).abs().max()), float((margin - out.margin[i]).abs().max()))
    assert worst < 1e-4, f"edge x position circuits vs the plain loop: {worst:.2e}"
    assert float((out.logit[1] - out.logit_o).abs().max()) > 1e-2  # the top 5 % is not the model
    half = kept[0].reshape(E, R)[:, 0]
    whole = edge_circuits(backend, pairs, np.repeat(half[:, None], R, 1)[None], rows_per_pass=64)
    assert torch.equal(whole.logit, edge_circuits(backend, pairs, half[None], rows_per_pass=64).logit)
    means = mean_activations(backend, pairs)
    m_out = edge_circuits(backend, pairs, units.edges_kept(kept[:1]), rows_per_pass=64, means=means)
    logit, _ = edge_circuit(plain, pairs, names, {u for u, k in zip(units.names, kept[0]) if k}, mean_over=pairs,
                            roles=CIRCUIT_ROLES, role_at=at)
    assert float((logit - m_out.logit[0]).abs().max()) < 1e-4


@pytest.mark.parametrize("ablation", ["counterfactual", "mean"])
def test_node_position_circuit_at_every_role_is_the_node_knockout(bundled, ablation):
    """A node x position circuit that keeps a component at every role or at none is a node circuit: equal to the
    knockouts' END readout with the others ablated (another implementation: knockout_end), 1e-4."""
    backend, pairs, _ = bundled
    L, H = backend.facts.n_layers, backend.facts.n_heads
    units = units_of(backend, "node-position")
    N = len(component_names(L, H))
    keep = np.random.default_rng(7).random(N) < 0.4  # [N]
    kept = np.repeat(keep[:, None], R, 1).reshape(1, -1)
    means = mean_activations(backend, pairs) if ablation == "mean" else None
    out = edge_circuits(backend, pairs, units.edges_kept(kept), rows_per_pass=64, means=means)
    ko = Knockout(tuple((i // H, i % H) for i in range(L * H) if not keep[i]),
                  tuple(i - L * H for i in range(L * H, N) if not keep[i]))
    ref = knockout_end(backend, pairs, [ko], means)
    assert float((out.margin[0] - ref.margin[0]).abs().max()) < 1e-4


def test_node_position_circuits_differ_by_role_as_the_plain_loop(bundled):
    """Keeping the top heads at END only: the plain loop with their out-edges ablated at every other role."""
    backend, pairs, edges = bundled
    units = units_of(backend, "node-position")
    scores = units.scores(eap(backend, pairs, edges, by_role=True).effects().numpy())
    kept = top_edges(scores, kept_count(0.1, len(units)))[None]
    out = edge_circuits(backend, pairs, units.edges_kept(kept), rows_per_pass=64)
    at = circuit_roles(backend, pairs, max(len(p.ref_ids) for p in pairs))
    names = [e.name for e in edges]
    node_kept = {u for u, k in zip(units.names, kept[0]) if k}
    kept_edges = {f"{e.name}@{r}" for e in edges for r in CIRCUIT_ROLES
                  if e.sender.name == "input" or f"{e.sender.name}@{r}" in node_kept}
    logit, _ = edge_circuit(plain_of(backend, "models/organism"), pairs, names, kept_edges, roles=CIRCUIT_ROLES,
                            role_at=at)
    assert float((logit - out.logit[0]).abs().max()) < 1e-4


def test_position_faithfulness_counts_its_work(bundled):
    """The curves of edge x position circuits (EAP by role, and the random units): the counted work is the
    meter's."""
    backend, pairs, edges = bundled
    units = units_of(backend, "edge-position")
    scores = {"eap": units.scores(eap(backend, pairs, edges, by_role=True).effects().numpy())}
    sizes = (0.0, 0.05, 1.0)
    forget_means()
    w = edge_faithfulness_work(backend, pairs, scores, sizes=sizes, rows_per_pass=64, units=units)
    backend.meter = WorkMeter()
    circuits, _, margin = edge_faithfulness(backend, pairs, scores, sizes=sizes, rows_per_pass=64, units=units)
    got = metered(backend.meter)
    assert (got.calls, got.body, got.unembed) == (w.calls, w.body, w.unembed)
    assert [c.k for c in circuits if c.ranking == "eap"] == [0, kept_count(0.05, len(units)), len(units)]


def test_units_and_their_rankings(bundled):
    backend, _, edges = bundled
    E = len(edges)
    L, H = backend.facts.n_layers, backend.facts.n_heads
    assert len(units_of(backend, "edge")) == E
    assert len(units_of(backend, "edge-position")) == E * R
    node = units_of(backend, "node-position")
    assert len(node) == (L * H + L) * R and node.names[0] == f"a0.h0@{CIRCUIT_ROLES[0]}"
    by_role = np.random.default_rng(0).random((E, R))
    s = node.scores(by_role)  # a node's score at a role: the sum over its out-edges
    out_of = [i for i, e in enumerate(edges) if e.sender.name == "m0"]
    assert np.isclose(s[node.names.index("m0@END")], by_role[out_of, CIRCUIT_ROLES.index("END")].sum())
    none_but = np.zeros(len(node), bool)
    none_but[node.names.index("m0@END")] = True
    kept = node.edges_kept(none_but[None])[0]  # [E, R]
    assert kept[out_of, CIRCUIT_ROLES.index("END")].all() and kept[[e.sender.name == "input" for e in edges]].all()
    assert kept.sum() == len(out_of) + R * sum(e.sender.name == "input" for e in edges)
    for resolution in ("edge", "edge-position", "node-position"):
        check_ranking(resolution, "exact")
    with pytest.raises(ValueError, match="ranked by exact, eap, eap-ig, not 'atp'"):
        check_ranking("node-position", "atp")
    with pytest.raises(ValueError, match="unknown resolution"):
        units_of(backend, "heads")
    with pytest.raises(ValueError, match="5 token roles"):  # refused before any pass
        edge_circuits(backend, [], np.ones((1, E, 3), dtype=bool))


def test_edge_position_circuit_equals_plain_loop_with_sandwich_norms(tmp_path):
    """Gemma 3 (a norm after the attention: a head's difference is taken with the layer's other heads as they are,
    position by position): an edge x position circuit against the plain loop, 1e-4."""
    from engine.backends import open_model
    from tests.integration.tiny_models import build_tiny
    path = build_tiny("gemma3_text", tmp_path / "gemma3_text")
    backend = open_model(str(path), device="cpu")
    pairs, _ = generate(backend.tokenizer, PromptSetSpec(ops=("add", "mul"), n=2, seed=1))
    units = units_of(backend, "edge-position")
    kept = np.random.default_rng(2).random((1, len(units))) < 0.5
    out = edge_circuits(backend, pairs, units.edges_kept(kept), rows_per_pass=64)
    assert float((out.logit[0] - out.logit_o).abs().max()) > 1e-3
    at = circuit_roles(backend, pairs, max(len(p.ref_ids) for p in pairs))
    logit, margin = edge_circuit(plain_of(backend, path), pairs, [e.name for e in edge_graph(backend)],
                                 {u for u, k in zip(units.names, kept[0]) if k}, roles=CIRCUIT_ROLES, role_at=at)
    worst = max(float((logit - out.logit[0]).abs().max()), float((margin - out.margin[0]).abs().max()))
    assert worst < 1e-4, f"gemma3_text: edge x position circuit vs the plain loop: {worst:.2e}"
