"""Exact edge patching against a plain-transformers loop (one hooked model per edge), and MIB's graph."""

from __future__ import annotations

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
