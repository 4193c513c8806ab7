"""Knockout (engine/techniques/knockout.py): mean ablation, accuracy under knockout and the top next tokens, each
checked against a plain Hugging Face computation on the bundled model."""

from __future__ import annotations

import pytest
import torch

from engine.techniques.knockout import Knockout, knockout_accuracy, mean_activations, parse_heads, top_next_tokens
from engine.techniques.knockout_curve import knockout_curve


def test_mean_ablation_equals_plain_o_proj_hook(model, plain, pairs):
    """Knocking out head (l, h) through hook_z == replacing o_proj's input slice in plain HF."""
    means = mean_activations(model, pairs)
    layer, head = 2, 3
    d_head = model.facts.d_head
    p = pairs[0]
    ids = torch.tensor([p.ref_ids])
    with torch.no_grad():
        from engine.techniques.knockout import knocked_out
        with knocked_out(model, Knockout(((layer, head),)), means, [p.template], [len(p.ref_ids) - 1]):
            ours = model.logits(ids)[0, -1]
        mean_z = means.z[means.index(p.template), layer, :, head]  # [T, d_head], offset 0 = END
        n = len(p.ref_ids)
        repl = mean_z[:n].flip(0)  # positions 0..n-1

        def pre_hook(mod, args):
            x = args[0].clone()
            x[0, :, head * d_head:(head + 1) * d_head] = repl
            return (x,)

        h = plain.model.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre_hook)
        try:
            theirs = plain(ids).logits[0, -1]
        finally:
            h.remove()
    assert torch.allclose(ours, theirs, atol=1e-4)
    # and the model is restored after the with block
    assert torch.allclose(model.logits(ids)[0, -1], plain(ids).logits[0, -1], atol=1e-4)


def test_knockout_accuracy_and_curve(model, pairs):
    means = mean_activations(model, pairs)
    base = knockout_accuracy(model, pairs, Knockout(), means)
    assert base == 1.0  # the pairs are the correctly answered ones
    every = tuple((layer, h) for layer in range(model.facts.n_layers) for h in range(model.facts.n_heads))
    assert knockout_accuracy(model, pairs, Knockout(every), means) < 0.5
    pts = knockout_curve(model, pairs, list(every[:3]), means, k_max=2, draws=3)
    assert [p.k for p in pts] == [0, 1, 2] and pts[0].top_accuracy == 1.0
    assert all(p.random_min <= p.random_mean <= p.random_max for p in pts)
    with pytest.raises(ValueError):
        knockout_curve(model, pairs, [], means, k_max=10_000)
    with pytest.raises(ValueError):
        Knockout(((99, 0),)).validate(model.facts.n_layers, model.facts.n_heads)
    assert parse_heads("3.1, 5.0") == ((3, 1), (5, 0))
    with pytest.raises(ValueError):
        parse_heads("3-1")


def test_top_next_tokens(model, pairs):
    p = pairs[0]
    top = top_next_tokens(model, p.ref_ids)
    assert top[0].token_id == p.answer_id and len(top) == 5
    assert top == sorted(top, key=lambda t: -t.prob)
    with torch.no_grad():
        probs = torch.softmax(model.logits(torch.tensor([p.ref_ids]))[0, -1].float(), -1)
    assert [t.token_id for t in top] == probs.topk(5).indices.tolist()
    assert all(abs(t.prob - float(probs[t.token_id])) < 1e-6 for t in top)
