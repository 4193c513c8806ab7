"""END-row attention and attention by token role (engine/techniques/attention.py) against plain Hugging Face
attentions on the bundled model."""

from __future__ import annotations

import torch

from engine.techniques.attention import FIRST_TOKEN, ROLES, prompt_attention, role_attention, token_roles


def test_prompt_attention_equals_plain_attentions(model, plain, pairs):
    p = pairs[1]
    with torch.no_grad():
        att = plain(torch.tensor([p.ref_ids]), output_attentions=True).attentions  # L x [1, H, q, k]
    for layer, head in ((0, 0), (3, 5)):
        ours = torch.tensor([t.weight for t in prompt_attention(model, p.ref_ids, layer, head)])
        assert torch.allclose(ours, att[layer][0, head, -1], atol=1e-5)
        assert abs(float(ours.sum()) - 1) < 1e-4


def test_role_attention_sums_to_one_and_roles_are_found(model, pairs):
    vals = role_attention(model, pairs)
    by_head: dict[tuple[int, int], float] = {}
    for v in vals:
        by_head[(v.layer, v.head)] = by_head.get((v.layer, v.head), 0.0) + v.value
    assert all(abs(s - 1) < 1e-4 for s in by_head.values())
    for p in pairs:
        roles = token_roles(model, p)
        assert roles[0] == FIRST_TOKEN and "operator" in roles and "operand A" in roles and "operand B" in roles
        assert set(roles) <= set(ROLES)
