"""Exact edge patching against a plain-transformers loop (one hooked model per edge), and MIB's graph."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.backends import open_model
from engine.machinery.batching import pad_id
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.edges import edge_graph, edge_patching
from tests.helpers.plain import Plain
from tests.helpers.plain_edges import PlainEdges, sample
from tests.integration.tiny_models import build_tiny

#: three architectures of the matrix: grouped-query RMSNorm (Qwen2), sandwich norms around attention and MLP
#: (Gemma 3: a head's contribution passes a norm of the sum), fused q|k|v with biases and LayerNorm (GPT-2)
MATRIX = ("qwen2", "gemma3_text", "gpt2")


def plain_of(backend, path) -> Plain:
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
    return Plain(hf, pad_id=pad_id(backend))


def check(backend, path, pairs, edges) -> float:
    raw = edge_patching(backend, pairs, edges, rows_per_pass=64)
    ref = PlainEdges(plain_of(backend, path), pairs)
    assert torch.allclose(raw.logit_o, ref.logit_o, atol=1e-4)
    worst = 0.0
    for i, e in enumerate(edges):
        worst = max(worst, float((raw.patched[i] - ref.patched(e.name)).abs().max()))
    # the patches move the logit: not every edge a no-op, some head receivers among them
    moved = (raw.patched - raw.logit_o[None]).abs().amax(1)
    assert float(moved.max()) > 1e-3
    assert any(float(moved[i]) > 1e-4 for i, e in enumerate(edges) if e.receiver.kind == "head")
    return worst


def test_exact_equals_plain_loop_on_bundled_model(organism):
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub"), n=2, seed=3))
    edges = sample(edge_graph(organism), heads=12, others=6)
    worst = check(organism, "models/organism", pairs, edges)
    assert worst < 1e-4, f"exact edge patching vs the plain loop: {worst:.2e}"


@pytest.mark.parametrize("arch", MATRIX)
def test_exact_equals_plain_loop_on_matrix(arch, tmp_path):
    path = build_tiny(arch, tmp_path / arch)
    backend = open_model(str(path), device="cpu")
    pairs, _ = generate(backend.tokenizer, PromptSetSpec(ops=("add", "mul"), n=2, seed=1))
    worst = check(backend, path, pairs, sample(edge_graph(backend), heads=9, others=5))
    assert worst < 1e-4, f"{arch}: exact edge patching vs the plain loop: {worst:.2e}"


def test_edges_and_nodes_at_token_roles_equal_plain_loop_on_bundled_model(organism):
    """The exact rankings at token positions: an edge's difference sent at one role's positions only, and a node's
    X_c output at one role's positions (a plain pre-hook on o_proj swapping the head's slice there, a plain post-hook
    on the MLP), every node and role, against hand-hooked plain models (1e-4); a node at a role is the node x
    position circuit with that unit alone ablated (another implementation: edge_circuits)."""
    from engine.techniques.attention import CIRCUIT_ROLES, circuit_roles
    from engine.techniques.circuit_units import units_of
    from engine.techniques.edge_faithfulness import edge_circuits
    from engine.techniques.edges import node_patching
    pairs, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub"), n=2, seed=3))
    R = len(CIRCUIT_ROLES)
    ref = PlainEdges(plain_of(organism, "models/organism"), pairs)
    at = circuit_roles(organism, pairs, max(len(p.ref_ids) for p in pairs))  # [P, T]
    masks = [(at == r).float()[..., None] for r in range(R)]

    edges = sample(edge_graph(organism), heads=4, others=3)
    raw = edge_patching(organism, pairs, edges, by_role=True, rows_per_pass=64)
    assert raw.patched.shape == (len(edges), R, len(pairs))
    worst = 0.0
    with torch.no_grad():
        for i, e in enumerate(edges):
            for r in range(R):
                worst = max(worst, float((raw.patched[i, r] - ref.forward(*ref.hooks_of(e.name, masks[r]))).abs()
                                         .max()))
    assert worst < 1e-4, f"edges at token roles vs the plain loop: {worst:.2e}"
    moved = (raw.patched - raw.logit_o).abs().amax(-1)  # [E, R]
    assert float(moved[:, CIRCUIT_ROLES.index("operator")].max()) > 1e-3  # the roles differ: not END alone

    nodes = node_patching(organism, pairs, rows_per_pass=64)
    worst = max(float((nodes.patched[n, r] - ref.node_patched(name, masks[r])).abs().max())
                for n, name in enumerate(nodes.nodes) for r in range(R))
    assert worst < 1e-4, f"nodes at token roles vs the plain loop: {worst:.2e}"
    effects = nodes.effects().numpy()  # [N, R]
    assert np.abs(effects[:, CIRCUIT_ROLES.index("END")]).max() > 1e-2
    units = units_of(organism, "node-position")
    pick = [int(np.argmax(np.abs(effects).reshape(-1))), units.names.index("m0@operator")]
    kept = np.ones((len(pick), len(units)), dtype=bool)
    kept[range(len(pick)), pick] = False
    alone = edge_circuits(organism, pairs, units.edges_kept(kept), rows_per_pass=64)
    for c, u in enumerate(pick):
        assert float((alone.logit[c] - nodes.patched.reshape(-1, len(pairs))[u]).abs().max()) < 1e-4, units.names[u]


def test_roles_that_cannot_reach_end_are_not_run_and_read_zero(organism):
    """"1 + 4 =" against "1 > 4 =": operand A and the first token precede the first token that differs, so their rows
    are not run (effect exactly 0); the plain loop, which runs them, finds them 0 too (1e-4) and the live roles
    equal to it (the work counted without their rows: test_edges_cost)."""
    from engine.techniques.attention import CIRCUIT_ROLES, circuit_roles
    from engine.techniques.edges import live_roles, node_patching
    spec = PromptSetSpec(ops=("add", "sub"), n=2, seed=3, templates=("add:{A} [+] {B} =", "sub:{A} [-] {B} ="))
    pairs, _ = generate(organism.tokenizer, spec)
    live = live_roles(organism, pairs)
    assert live == [r not in ("operand A", "other") for r in CIRCUIT_ROLES], live
    mixed, _ = generate(organism.tokenizer, PromptSetSpec(ops=("add", "sub"), n=2, seed=3))
    assert all(live_roles(organism, mixed))  # "The addition of 6 and 6 is": operand A follows the operator
    ref = PlainEdges(plain_of(organism, "models/organism"), pairs)
    at = circuit_roles(organism, pairs, max(len(p.ref_ids) for p in pairs))
    nodes = node_patching(organism, pairs, rows_per_pass=64)
    worst = max(float((nodes.patched[n, r] - ref.node_patched(name, (at == r).float()[..., None])).abs().max())
                for n, name in enumerate(nodes.nodes) for r in range(len(CIRCUIT_ROLES)))
    assert worst < 1e-4, f"nodes at token roles vs the plain loop: {worst:.2e}"
    dead = [r for r, ok in enumerate(live) if not ok]
    assert bool((nodes.patched[:, dead] == nodes.logit_o).all())  # not run: X_r's logit itself
    assert float((nodes.patched - nodes.logit_o).abs().max()) > 1e-3
    edges = sample(edge_graph(organism), heads=2, others=2)
    raw = edge_patching(organism, pairs, edges, by_role=True, rows_per_pass=64)
    assert bool((raw.patched[:, dead] == raw.logit_o).all())


@pytest.mark.parametrize("arch", (*MATRIX, "gpt_neox"))
def test_nodes_at_token_roles_equal_plain_loop_on_matrix(arch, tmp_path):
    """Every head and MLP at every token role (sandwich norms: a head's difference is taken after the norm of the
    attention's sum, position by position; fused q|k|v; a parallel block, GPT-NeoX: the MLP reads the block's
    input, not the heads of its layer), against the plain loop, 1e-4."""
    from engine.techniques.attention import CIRCUIT_ROLES, circuit_roles
    from engine.techniques.edges import node_patching
    path = build_tiny(arch, tmp_path / arch)
    backend = open_model(str(path), device="cpu")
    pairs, _ = generate(backend.tokenizer, PromptSetSpec(ops=("add", "mul"), n=2, seed=1))
    nodes = node_patching(backend, pairs, rows_per_pass=64)
    ref = PlainEdges(plain_of(backend, path), pairs)
    at = circuit_roles(backend, pairs, max(len(p.ref_ids) for p in pairs))
    worst = max(float((nodes.patched[n, r] - ref.node_patched(name, (at == r).float()[..., None])).abs().max())
                for n, name in enumerate(nodes.nodes) for r in range(len(CIRCUIT_ROLES)))
    assert worst < 1e-4, f"{arch}: nodes at token roles vs the plain loop: {worst:.2e}"
    assert float((nodes.patched - nodes.logit_o).abs().max()) > 1e-4  # the patches move the logit
