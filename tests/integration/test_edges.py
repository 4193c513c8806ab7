"""Exact edge patching against a plain-transformers loop (one hooked model per edge), and MIB's graph."""

from __future__ import annotations

import pytest
import torch

from engine.backends import open_model
from engine.machinery.batching import pad_id
from engine.prompts.promptsets import PromptSetSpec, generate
from engine.techniques.edges import Edge, Node, edge_graph, edge_patching, parse_edge
from tests.helpers.plain import Plain
from tests.helpers.plain_edges import PlainEdges
from tests.integration.tiny_models import build_tiny

#: three architectures of the matrix: grouped-query RMSNorm (Qwen2), sandwich norms around attention and MLP
#: (Gemma 3: a head's contribution passes a norm of the sum), fused q|k|v with biases and LayerNorm (GPT-2)
MATRIX = ("qwen2", "gemma3_text", "gpt2")


def sample(edges: list[Edge], heads: int, others: int) -> list[Edge]:
    """Some edges of every kind: into heads (q, k and v), into MLPs, into the logits, from the input."""
    into_heads = [e for e in edges if e.receiver.kind == "head"]
    rest = [e for e in edges if e.receiver.kind != "head"]
    step_h, step_o = max(1, len(into_heads) // heads), max(1, len(rest) // others)
    return into_heads[::step_h][:heads] + rest[::step_o][:others]


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
