"""MLP projections on the number tokens' unembedding (engine/techniques/mlp_projections.py) against plain Hugging
Face hidden states on the bundled model."""

from __future__ import annotations

import torch

from engine.techniques.mlp_projections import METRICS, mlp_projections, number_token, top_number_tokens


def test_mlp_projections_equal_plain_hidden_states(model, plain, pairs):
    vals = {(v.layer, v.metric): v.value for v in mlp_projections(model, pairs[:5])}
    assert {m for _, m in vals} == set(METRICS)
    W_U = plain.lm_head.weight.detach()  # [vocab, d]
    layer = 4
    cos_a, cos_c = [], []
    for p in pairs[:5]:
        captured = {}
        block = plain.model.layers[layer]
        h1 = block.post_attention_layernorm.register_forward_pre_hook(
            lambda m, a, captured=captured: captured.__setitem__("in", a[0][0, -1].detach()))
        h2 = block.mlp.register_forward_hook(
            lambda m, a, o, captured=captured: captured.__setitem__("out", o[0, -1].detach()))
        try:
            with torch.no_grad():
                plain(torch.tensor([p.ref_ids]))
        finally:
            h1.remove()
            h2.remove()
        wa = W_U[number_token(model, p.ref_text, p.a)]
        cos_a.append(torch.nn.functional.cosine_similarity(captured["in"], wa, dim=0))
        cos_c.append(torch.nn.functional.cosine_similarity(captured["out"], W_U[p.answer_id], dim=0))
    assert abs(vals[(layer, "cos_in_A")] - float(torch.stack(cos_a).mean())) < 1e-4
    assert abs(vals[(layer, "cos_out_C")] - float(torch.stack(cos_c).mean())) < 1e-4


def test_top_number_tokens(model, pairs):
    p = pairs[0]
    top = top_number_tokens(model, p.ref_text, p.ref_ids, k=3)
    assert len(top) == 3 * model.facts.n_layers
    assert all(t.token.strip("Ġ▁").isdigit() for t in top)


def test_top_number_tokens_mark_the_answer_with_its_rank(model, plain, pairs):
    """With the answer's token given, every layer lists it with its rank among the number tokens, counted from a
    plain ranking of that MLP's output . W_U[n] (a layer whose top k misses it lists it after them)."""
    from engine.techniques.mlp_projections import number_tokens
    p = pairs[0]
    top = top_number_tokens(model, p.ref_text, p.ref_ids, k=2, answer_id=p.answer_id)
    nums = sorted(number_tokens(model, p.ref_text))
    W_U = plain.lm_head.weight.detach()[nums]  # [N, d]
    for layer in range(model.facts.n_layers):
        captured = {}
        h = plain.model.layers[layer].mlp.register_forward_hook(
            lambda m, a, o, captured=captured: captured.__setitem__("out", o[0, -1].detach()))
        try:
            with torch.no_grad():
                plain(torch.tensor([p.ref_ids]))
        finally:
            h.remove()
        scores = W_U @ captured["out"]  # [N]
        rank = int((scores > scores[nums.index(p.answer_id)]).sum()) + 1
        mine = [t for t in top if t.layer == layer]
        answer = [t for t in mine if t.answer]
        assert len(answer) == 1 and answer[0].rank == rank and answer[0].number == p.answer, (layer, mine)
        assert len(mine) == 2 + (rank > 2)
